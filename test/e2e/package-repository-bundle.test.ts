/**
 * e2e: a real package repository as an imgpkg bundle, and a repository whose source cannot be
 * reached (reference §3.12, §3.5, §3.6).
 *
 * The kadras-packages repository (../shared/fixtures/kadras-packages/repo: 8 packages, 14
 * versions, two with semver build metadata) is pushed with the real imgpkg to the local registry
 * with an `.imgpkg/images.yml` that relocates every package bundle it references to the local
 * registry, as `imgpkg copy` would. The PackageRepository reconciles and its Packages carry the
 * relocated digest refs of images.yml, which only the pipeline's kbld step
 * (`kbld -f - -f .imgpkg/images.yml --build=false`) can have written.
 */
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments, stringify } from 'yaml';
import { Finalizer } from '../../functions/lib/api/index.js';
import { fixturePath, type PushedBundle, pushBundle, readTree } from '../harness/fixtures.js';
import { freePort } from '../harness/servers.js';
import {
  expectRepoSucceeded,
  listObjects,
  type PackagingObject,
  PKG,
  PKGM,
  PKGR_STATUS_KEYS,
  type RepoObject,
  repositoryManifest,
  waitRepo,
} from './packaging-support.js';
import { apply, getObject, RFC3339, SEE_USEFUL, servers, suffix, useE2ERuntime } from './support.js';

const id = suffix();
const NS = { bundle: `e2e-pkgr-bundle-${id}`, unreachable: `e2e-pkgr-unreach-${id}` };
const KADRAS = fixturePath('kadras-packages', 'repo');

const rt = useE2ERuntime(Object.values(NS));

/** One Package of the fixture as its author wrote it. */
interface FixturePackage {
  name: string;
  refName: string;
  version: string;
  image: string;
}

/** The fixture's Packages (one per file, except `metadata.yml`) and PackageMetadata names. */
async function readFixture(): Promise<{ packages: FixturePackage[]; metadatas: string[] }> {
  const packages: FixturePackage[] = [];
  const metadatas: string[] = [];
  for (const dir of await readdir(path.join(KADRAS, 'packages'))) {
    for (const file of await readdir(path.join(KADRAS, 'packages', dir))) {
      const text = await readFile(path.join(KADRAS, 'packages', dir, file), 'utf8');
      for (const doc of parseAllDocuments(text)) {
        const o = doc.toJS() as {
          kind: string;
          metadata: { name: string };
          spec: {
            refName: string;
            version: string;
            template?: { spec: { fetch: { imgpkgBundle: { image: string } }[] } };
          };
        };
        if (o.kind === 'PackageMetadata') metadatas.push(o.metadata.name);
        else
          packages.push({
            name: o.metadata.name,
            refName: o.spec.refName,
            version: o.spec.version,
            image: o.spec.template?.spec.fetch[0]?.imgpkgBundle.image ?? '',
          });
      }
    }
  }
  return { packages, metadatas };
}

/**
 * The ImagesLock of the bundle after `imgpkg copy` to `<host>/<repo>`: every referenced image
 * by its new location (same digest), keyed by `kbld.carvel.dev/id` = the ref the Package holds.
 */
function relocatedImagesLock(images: string[], host: string, repo: string): { lock: string; map: Map<string, string> } {
  const map = new Map(images.map((image) => [image, `${host}/${repo}@${image.slice(image.indexOf('@') + 1)}`]));
  const lock = stringify({
    apiVersion: 'imgpkg.carvel.dev/v1alpha1',
    kind: 'ImagesLock',
    images: [...map].map(([orig, image]) => ({ image, annotations: { 'kbld.carvel.dev/id': orig } })),
  });
  return { lock: `---\n${lock}`, map };
}

let fixture: Awaited<ReturnType<typeof readFixture>>;
let bundle: PushedBundle;
let relocated: Map<string, string>;

beforeAll(async () => {
  fixture = await readFixture();
  const registry = servers().registry;
  const { lock, map } = relocatedImagesLock(
    [...new Set(fixture.packages.map((p) => p.image))],
    registry.host,
    `e2e-${id}/kadras-packages`,
  );
  relocated = map;
  // the repository content as `kctrl package repository release` builds it: `packages/` plus
  // the ImagesLock (pkgrepo-build.yml is kctrl's build input, not bundle content)
  const tree = await readTree(KADRAS);
  const content = Object.fromEntries(Object.entries(tree).filter(([p]) => p.startsWith('packages/')));
  bundle = await pushBundle(registry, `e2e-${id}/kadras-packages:v1`, { ...content, '.imgpkg/images.yml': lock });
});

describe.concurrent('PackageRepository from an imgpkg bundle and from an unreachable source', () => {
  it('the kadras bundle reconciles; Packages hold the relocated digest refs of .imgpkg/images.yml', async () => {
    const ns = NS.bundle;
    const name = 'kadras';
    await apply(repositoryManifest(ns, name, { imgpkgBundle: { image: bundle.ref } }));
    const repo = await waitRepo(rt, ns, name);
    expectRepoSucceeded(repo);
    // vendir's lock records the bundle it fetched by digest
    expect(repo.status?.fetch?.stdout).toContain(bundle.digestRef);

    const metadatas = await listObjects(PKGM, ns);
    expect(metadatas.map((m) => m.metadata.name).sort()).toEqual([...fixture.metadatas].sort());
    const packages = await listObjects(PKG, ns);
    expect(packages).toHaveLength(fixture.packages.length);
    const byIdentity = new Map(packages.map((p) => [`${p.spec.refName}.${p.spec.version}`, p]));
    for (const want of fixture.packages) {
      const got = byIdentity.get(want.name);
      expect(got, `Package ${want.name}`).toBeDefined();
      // build metadata survives in spec; the object name encodes `+` as `--`
      expect(got?.spec.version).toBe(want.version);
      expect(got?.metadata.name).toBe(want.name.replace('+', '--'));
      const template = got?.spec.template as { spec: { fetch: { imgpkgBundle: { image: string } }[] } } | undefined;
      const image = template?.spec.fetch[0]?.imgpkgBundle.image;
      expect(image).toBe(relocated.get(want.image));
      expect(image).not.toBe(want.image);
    }
    // a Package with build metadata, read by its encoded name
    const crossplane = await getObject<PackagingObject>(PKG, ns, 'crossplane.packages.kadras.io.2.2.0--kadras.2');
    expect(crossplane?.spec.version).toBe('2.2.0+kadras.2');
  });

  it('an unreachable bundle registry fails the fetch with vendir stderr and upstream status', async () => {
    const ns = NS.unreachable;
    const name = 'unreachable';
    const port = await freePort(); // closed: nothing listens there
    const image = `127.0.0.1:${port}/nothing/repo:v1`;
    await apply(repositoryManifest(ns, name, { imgpkgBundle: { image } }));
    // retried once by the failure backoff (§3.3)
    const repo = await waitRepo(
      rt,
      ns,
      name,
      (r) =>
        r.status?.observedGeneration === r.metadata.generation &&
        (r.status.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false) &&
        (r.status.consecutiveReconcileFailures ?? 0) >= 2,
      'ReconcileFailed with consecutiveReconcileFailures >= 2',
    );
    const s = repo.status ?? {};
    for (const key of Object.keys(s)) expect(PKGR_STATUS_KEYS.has(key), `unexpected status key ${key}`).toBe(true);
    const message = `Fetching resources: ${SEE_USEFUL}`;
    expect(s.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
    expect(s.friendlyDescription).toBe(`Reconcile failed: ${message}`);
    expect(s.observedGeneration).toBe(1);
    expect(s).not.toHaveProperty('consecutiveReconcileSuccesses');
    expect(s.usefulErrorMessage?.startsWith("vendir: Error: Syncing directory '0':")).toBe(true);
    expect(s.usefulErrorMessage).toContain(`127.0.0.1:${port}`);
    expect(s.fetch?.exitCode).toBe(1);
    expect(s.fetch?.error).toBe(message);
    expect(s.fetch?.stderr).toBe(s.usefulErrorMessage);
    expect(s.fetch?.startedAt).toMatch(RFC3339);
    expect(s.fetch?.updatedAt).toMatch(RFC3339);
    expect(s).not.toHaveProperty('template');
    expect(s).not.toHaveProperty('deploy');
    // the finalizer comes with the first deploy only (§3.2): nothing blocks deleting it
    expect(repo.metadata.finalizers ?? []).not.toContain(Finalizer.PackageRepository);
    expect(await listObjects(PKG, ns)).toEqual([]);
    expect(await getObject<RepoObject>('configmap', ns, `${name}.pkgr`)).toBeUndefined();
  });
});
