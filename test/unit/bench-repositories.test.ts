/**
 * The generated repositories of the benchmark's repositories scenario (`bench/scenarios/
 * repositories.ts`): upstream's three sizes are each one PackageRepository with the `packages/
 * <refName>/` layout, whose Packages and PackageMetadatas the repository template accepts
 * (schemas and `filterRepositoryResources`), and content above the object-size bound is split
 * by refName into several repositories, each under the bound, nothing lost or doubled.
 */
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { MAX_REPOSITORY_BYTES, REPOSITORY_SIZES, repositorySet } from '../../bench/scenarios/repositories.js';
import { parsePackageRepository } from '../../functions/lib/api/parse.js';
import { filterRepositoryResources } from '../../functions/lib/packaging/repo-template.js';

/** The inline paths of a generated PackageRepository (read with the project's schema). */
function pathsOf(manifest: object): Record<string, string> {
  const parsed = parsePackageRepository(manifest);
  if (!parsed.success) throw new Error(parsed.error.message);
  return parsed.data.spec.fetch.inline?.paths ?? {};
}

/** The refName directories of a set of paths. */
const refNamesOf = (paths: Record<string, string>) => new Set(Object.keys(paths).map((f) => f.split('/')[1]));

describe('bench repositories: generated content', () => {
  it("keeps upstream's sizes and thresholds (50 × 1, 50 × 2, 100 × 5)", () => {
    expect(
      REPOSITORY_SIZES.map((s) => [s.packages, s.refNames, s.versions, s.deployThresholdS, s.deleteThresholdS]),
    ).toEqual([
      [50, 50, 1, 5, 7],
      [100, 50, 2, 7, 8],
      [500, 100, 5, 22.5, 25],
    ]);
  });

  it('writes each size as one repository under the object-size bound, packages/<refName>/ layout', {
    timeout: 60_000,
  }, () => {
    for (const size of REPOSITORY_SIZES) {
      const set = repositorySet('bench-ns', size);
      expect(set.manifests).toHaveLength(1);
      expect(set.bytes[0]).toBeLessThanOrEqual(MAX_REPOSITORY_BYTES);
      expect(set.manifests[0]?.metadata).toEqual({ name: `repo-${size.packages}`, namespace: 'bench-ns' });
      const paths = Object.keys(pathsOf(set.manifests[0]!));
      expect(paths).toHaveLength(size.refNames * (size.versions + 1));
      expect(paths.filter((p) => !/^packages\/pkg\d+\.test\.carvel\.dev\/(metadata|0\.\d+\.0)\.yml$/.test(p))).toEqual(
        [],
      );
    }
  });

  it('generates Packages and PackageMetadatas the repository template accepts', { timeout: 30_000 }, () => {
    const size = REPOSITORY_SIZES[1]!;
    const paths = pathsOf(repositorySet('bench-ns', size).manifests[0]!);
    const { versions, manifest } = filterRepositoryResources(Object.values(paths).join('---\n'));
    expect(Object.keys(versions)).toHaveLength(size.refNames);
    expect(Object.values(versions).every((v) => v.join() === '0.0.0,0.1.0')).toBe(true);
    const kinds = manifest.split('---\n').map((d) => (parse(d) as { kind: string }).kind);
    expect(kinds.filter((k) => k === 'Package')).toHaveLength(size.packages);
    expect(kinds.filter((k) => k === 'PackageMetadata')).toHaveLength(size.refNames);
  });

  it('splits content above the bound by refName, every file exactly once', () => {
    const size = REPOSITORY_SIZES[1]!;
    const maxBytes = 20_000;
    const set = repositorySet('bench-ns', size, maxBytes);
    expect(set.manifests.length).toBeGreaterThan(1);
    expect(set.bytes.every((b) => b <= maxBytes)).toBe(true);
    expect(set.manifests.map((m) => m.metadata.name)).toEqual(set.manifests.map((_, n) => `repo-100-${n + 1}`));
    const all = set.manifests.map(pathsOf);
    const files = all.flatMap((p) => Object.keys(p));
    expect(new Set(files).size).toBe(files.length);
    expect(files).toHaveLength(size.refNames * (size.versions + 1));
    // the refNames of different repositories are disjoint: no refName is spread over two
    const counts = all.map((p) => refNamesOf(p).size);
    expect(counts.reduce((a, b) => a + b, 0)).toBe(size.refNames);
  });
});
