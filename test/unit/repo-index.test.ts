/**
 * The fleet-wide repository index (`functions/lib/packaging/repo-index.ts`): what its digests
 * cover, the typed versions reader, lookup records, and the per-repository annotation re-applied
 * to a stored manifest. Against the memory store (the object store port's fake).
 */
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { repoIndexKey, repoIndexManifestKey, repoIndexRecordKey } from '../../functions/lib/artifact/keys.js';
import {
  findRepoIndex,
  RepoIndexFormatError,
  type RepoIndexRecipe,
  readRepositoryVersions,
  repoIndexDigest,
  repoIndexSourceDigest,
  storeRepoIndex,
  withRepositoryRef,
} from '../../functions/lib/packaging/repo-index.js';
import { REBASE_CONFIG } from '../../functions/lib/packaging/repo-template.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';

const TREE = 'a'.repeat(64);
const RECIPE: RepoIndexRecipe = { bundle: true, tools: { ytt: '0.55.3', kbld: '0.46.0' } };
const D = repoIndexDigest(TREE, RECIPE);

const MANIFEST = `---
apiVersion: data.packaging.carvel.dev/v1alpha1
kind: PackageMetadata
metadata:
  name: a.example.com
  annotations:
    kapp.k14s.io/disable-wait: ""
    packaging.carvel.dev/package-repository-ref: ns/repo
spec:
  displayName: A
---
apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: a.example.com.1.0.0--kadras.2
  annotations:
    packaging.carvel.dev/package-repository-ref: ns/repo
    kbld.k14s.io/images: |
      - origins: []
spec:
  refName: a.example.com
  version: 1.0.0+kadras.2
${REBASE_CONFIG.trimStart()}`;

describe('repository index digests', () => {
  it.each<[string, string]>([
    ['another tree', repoIndexDigest('b'.repeat(64), RECIPE)],
    ['not a bundle (no kbld)', repoIndexDigest(TREE, { ...RECIPE, bundle: false })],
    ['another ytt', repoIndexDigest(TREE, { ...RECIPE, tools: { ...RECIPE.tools, ytt: '0.56.0' } })],
    ['another kbld', repoIndexDigest(TREE, { ...RECIPE, tools: { ...RECIPE.tools, kbld: '0.47.0' } })],
    ['a source digest of the same hex (another hash domain)', repoIndexSourceDigest(TREE, RECIPE)],
  ])('%s gives another digest', (_name, other) => {
    expect(other).toMatch(/^[0-9a-f]{64}$/);
    expect(other).not.toBe(D);
  });

  it('the same tree and recipe give the same digest', () => {
    expect(repoIndexDigest(TREE, { tools: { kbld: '0.46.0', ytt: '0.55.3' }, bundle: true })).toBe(D);
  });
});

describe('storing and reading an index', () => {
  const write = {
    index: D,
    manifest: MANIFEST,
    versions: { 'a.example.com': ['1.0.0+kadras.2'] },
    ref: 'ns/repo',
    fetchStdout: 'apiVersion: vendir.k14s.io/v1alpha1\nkind: LockConfig\n',
    templateStderr: 'resolve | final: x -> y\n',
  };

  it('a fetched tree: manifest, versions and the index record; no source record', async () => {
    const store = new MemoryStore();
    await storeRepoIndex(store, write);
    expect((await store.list('')).sort()).toEqual(
      [repoIndexKey(D), repoIndexManifestKey(D), repoIndexRecordKey(D)].sort(),
    );
    expect(await readRepositoryVersions(store, D)).toEqual(write.versions);
    expect(await findRepoIndex(store, D)).toEqual({
      index: D,
      ref: 'ns/repo',
      templateStderr: write.templateStderr,
      manifest: MANIFEST,
    });
  });

  it("a pinned source: its record also carries vendir's lock config", async () => {
    const store = new MemoryStore();
    const source = repoIndexSourceDigest('f'.repeat(64), RECIPE);
    await storeRepoIndex(store, { ...write, source });
    expect(await findRepoIndex(store, source)).toEqual({
      index: D,
      ref: 'ns/repo',
      fetchStdout: write.fetchStdout,
      templateStderr: write.templateStderr,
      manifest: MANIFEST,
    });
  });

  it('a record whose manifest is gone is a miss', async () => {
    const store = new MemoryStore();
    await storeRepoIndex(store, write);
    await store.delete(repoIndexManifestKey(D));
    expect(await findRepoIndex(store, D)).toBeUndefined();
    expect(await findRepoIndex(store, 'c'.repeat(64))).toBeUndefined();
  });

  it.each([
    ['not JSON', '{'],
    ['a list where versions belong', '{"a.example.com":"1.0.0"}'],
  ])('refuses a versions document that is %s', async (_name, body) => {
    const store = new MemoryStore();
    await store.put(repoIndexKey(D), body);
    await expect(readRepositoryVersions(store, D)).rejects.toThrow(RepoIndexFormatError);
  });

  it('refuses a record naming no digest', async () => {
    const store = new MemoryStore();
    await store.put(repoIndexRecordKey(D), '{"index":"../x","ref":"ns/repo","templateStderr":""}');
    await expect(findRepoIndex(store, D)).rejects.toThrow(RepoIndexFormatError);
  });
});

describe('withRepositoryRef', () => {
  it('rendered for the same repository: the stored bytes', () => {
    expect(withRepositoryRef({ manifest: MANIFEST, ref: 'ns/repo' }, 'ns/repo')).toBe(MANIFEST);
  });

  it("another repository: only the Packages' and PackageMetadatas' package-repository-ref changes", () => {
    const out = withRepositoryRef({ manifest: MANIFEST, ref: 'ns/repo' }, 'other/mirror');
    const expected = parseAllDocuments(MANIFEST.replaceAll('ref: ns/repo', 'ref: other/mirror')).map((d) => d.toJS());
    expect(parseAllDocuments(out).map((d) => d.toJS())).toEqual(expected);
    // The rebase-rule kapp Config (whose overlay text names the annotation) is untouched.
    expect(parseAllDocuments(out).at(-1)?.toJS()).toEqual(parseAllDocuments(REBASE_CONFIG).at(-1)?.toJS());
  });
});
