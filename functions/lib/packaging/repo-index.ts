/**
 * The fleet-wide index of a package repository (docs/decisions.md D7, indexed once for the fleet): the
 * validated package set a PackageRepository deploys, stored once in object storage and reused by
 * every cluster whose repository resolves to the same content.
 *
 * Not an upstream feature: kapp-controller fetches and templates every repository in every
 * cluster. The stored manifest is exactly what `templateRepository` (`./repo-template.ts`)
 * rendered, so a cluster deploying it applies the same objects as one that rendered them.
 *
 * **What the key covers.** The rendered manifest depends on the fetched tree, on whether the fetch
 * was an `imgpkgBundle` (kbld runs with `.imgpkg/images.yml`), on the ytt and kbld versions and on
 * the fixed pipeline's own text (clean-up overlay, rebase Config), all in {@link repoIndexDigest}.
 * It depends on the repository's name and namespace in one place only: the clean-up overlay writes
 * `packaging.carvel.dev/package-repository-ref: <ns>/<name>` on every Package and PackageMetadata
 * (the rebase rule's kapp Config is the same for every repository). That annotation is left out
 * of the key and re-applied in code ({@link withRepositoryRef}), so repositories of any name in
 * any namespace of any cluster share one index.
 *
 * **Objects** (keys in `../artifact/keys.ts`), for an index digest `D`:
 * - `artifacts/index/sha256/D.yaml` — the manifest kapp deploys;
 * - `artifacts/index/sha256/D.json` — `{ <refName>: [<version>...] }` ({@link readRepositoryVersions});
 * - `cache/index/sha256/D.json` — the lookup record after a fetch ({@link RepoIndexRecord});
 * - `cache/index/sha256/S.json` — the lookup record of a pinned source `S`
 *   ({@link repoIndexSourceDigest}), found before any fetch.
 * The manifest and versions are written before the records, so a record names a complete index.
 *
 * Only repositories fetched without a Secret use the index: content made from Secrets is sealed
 * per cluster (`../artifact/sealed.ts`) and never shared.
 *
 * @module
 */
import { parseAllDocuments } from 'yaml';
import * as z from 'zod';
import { canonicalJson, repoIndexKey, repoIndexManifestKey, repoIndexRecordKey, sha256Hex } from '../artifact/keys.js';
import type { ObjectStore } from '../store/port.js';
import { CLEAN_UP_OVERLAY, REBASE_CONFIG } from './repo-template.js';

/**
 * Version of the index recipe: bump when the template pipeline's code (not only its overlay
 * texts, which are hashed) changes what it renders, so old indexes are not read again.
 */
export const REPO_INDEX_RECIPE_VERSION = 2;

/** The annotation the clean-up overlay writes with `<namespace>/<name>` of the repository. */
export const PACKAGE_REPOSITORY_REF_ANNOTATION = 'packaging.carvel.dev/package-repository-ref';

/** Everything besides the fetched content that decides the rendered index. */
export interface RepoIndexRecipe {
  /** The fetch was an `imgpkgBundle` (kbld resolves with `.imgpkg/images.yml`). */
  bundle: boolean;
  /** Versions of the tools of the pipeline (`''` when unknown). */
  tools: { ytt: string; kbld: string };
}

/** sha256 of the fixed pipeline's overlay texts: editing them makes new indexes. */
const PIPELINE_TEXT = sha256Hex(`${CLEAN_UP_OVERLAY}\n${REBASE_CONFIG}`);

function recipeJson(recipe: RepoIndexRecipe) {
  return { v: REPO_INDEX_RECIPE_VERSION, pipeline: PIPELINE_TEXT, bundle: recipe.bundle, tools: recipe.tools };
}

/**
 * The index digest of a fetched tree: lowercase hex sha256 over the tree's digest (the fetch
 * artifact's, `../artifact/tarball.ts` `packDir`) and the {@link RepoIndexRecipe}.
 */
export function repoIndexDigest(fetchSha256: string, recipe: RepoIndexRecipe): string {
  return sha256Hex(canonicalJson({ ...recipeJson(recipe), fetch: fetchSha256 }));
}

/**
 * The lookup digest of a pinned source: lowercase hex sha256 over its identity
 * (`pinnedFetchIdentity` of `../fetch/pinned.ts`: a git commit id, an image or bundle `@sha256`
 * digest, an http `sha256`, or inline paths, with the vendir version) and the recipe. A
 * different hash domain from {@link repoIndexDigest} (`source` instead of `fetch`).
 */
export function repoIndexSourceDigest(pinnedIdentity: string, recipe: RepoIndexRecipe): string {
  return sha256Hex(canonicalJson({ ...recipeJson(recipe), source: pinnedIdentity }));
}

/** Per refName, the versions (exact `spec.version` strings) a repository index holds. */
export type RepoVersions = Record<string, string[]>;

const RepoVersionsSchema = z.record(z.string(), z.array(z.string()));

/** A stored index document does not have the expected shape (a foreign or corrupt object). */
export class RepoIndexFormatError extends Error {
  override readonly name = 'RepoIndexFormatError';
}

/**
 * Reads the versions a repository index holds: `{ <refName>: [<version>...] }`, each list in
 * semver order ascending (`sortVersions` of `./repo-template.ts`). For PackageInstall resolution
 * and upgrades, which need the versions without the manifest.
 *
 * @param indexDigest - hex index digest ({@link repoIndexDigest})
 * @returns the versions, or `undefined` when no such index is stored
 * @throws RepoIndexFormatError when the document is not that shape; TypeError for a bad digest;
 *   StoreError from the store
 */
export async function readRepositoryVersions(
  store: ObjectStore,
  indexDigest: string,
): Promise<RepoVersions | undefined> {
  const key = repoIndexKey(indexDigest);
  const body = await store.get(key);
  if (!body) return undefined;
  return parseJson(key, body, RepoVersionsSchema);
}

/** Body of a lookup record (`cache/index/sha256/<hex>.json`). */
export interface RepoIndexRecord {
  /** Hex digest of the index it names ({@link repoIndexDigest}). */
  index: string;
  /** `<namespace>/<name>` the stored manifest's {@link PACKAGE_REPOSITORY_REF_ANNOTATION} holds. */
  ref: string;
  /**
   * vendir's lock config of the fetch that built the index (`status.fetch.stdout`, secrets
   * redacted); only in a pinned source's record, where a hit skips the fetch.
   */
  fetchStdout?: string;
  /** The template pipeline's stderr (`status.template.stderr`: kbld's resolution lines). */
  templateStderr: string;
}

const RecordSchema = z.object({
  index: z.string().regex(/^[0-9a-f]{64}$/),
  ref: z.string(),
  fetchStdout: z.string().optional(),
  templateStderr: z.string(),
});

/** An index found through a lookup record: the record and the stored manifest. */
export interface RepoIndexHit extends RepoIndexRecord {
  manifest: string;
}

/**
 * Finds an index through the lookup record of `digest` (an index or a pinned source digest).
 * @returns the record and its manifest; `undefined` when there is no record or its manifest is gone
 * @throws RepoIndexFormatError for a malformed record; StoreError from the store
 */
export async function findRepoIndex(store: ObjectStore, digest: string): Promise<RepoIndexHit | undefined> {
  const key = repoIndexRecordKey(digest);
  const body = await store.get(key);
  if (!body) return undefined;
  const record = parseJson(key, body, RecordSchema);
  const manifest = await store.get(repoIndexManifestKey(record.index));
  return manifest ? { ...record, manifest: manifest.toString('utf8') } : undefined;
}

/** What {@link storeRepoIndex} writes. */
export interface RepoIndexWrite {
  /** Hex index digest ({@link repoIndexDigest}). */
  index: string;
  /** The rendered manifest, as `templateRepository` returned it. */
  manifest: string;
  /** Per refName, the versions the manifest's Packages hold. */
  versions: RepoVersions;
  /** `<namespace>/<name>` of the repository the manifest was rendered for. */
  ref: string;
  /** vendir's lock config (redacted), recorded for `source`. */
  fetchStdout: string;
  /** The template pipeline's stderr (redacted). */
  templateStderr: string;
  /** The pinned source's digest ({@link repoIndexSourceDigest}), when the source is pinned. */
  source?: string;
}

/**
 * Stores an index: the manifest and versions (create-only: same digest, same bytes), then the
 * lookup record of the index digest and, for a pinned source, the source's record (replaced:
 * last writer wins, every writer names the same index).
 * @throws StoreError from the store
 */
export async function storeRepoIndex(store: ObjectStore, w: RepoIndexWrite): Promise<void> {
  await store.putIfAbsent(repoIndexManifestKey(w.index), w.manifest);
  await store.putIfAbsent(repoIndexKey(w.index), canonicalJson(w.versions));
  const record: RepoIndexRecord = { index: w.index, ref: w.ref, templateStderr: w.templateStderr };
  await store.put(repoIndexRecordKey(w.index), canonicalJson(record));
  if (w.source) await store.put(repoIndexRecordKey(w.source), canonicalJson({ ...record, fetchStdout: w.fetchStdout }));
}

/**
 * Records a pinned source for an index found by its fetched tree (built from another source, a
 * tag or a branch with the same content), so the source's next run skips the fetch too.
 * @param fetchStdout - vendir's lock config of this run's fetch (secrets redacted by the caller)
 * @throws StoreError from the store
 */
export async function storeSourceRecord(
  store: ObjectStore,
  source: string,
  hit: RepoIndexRecord,
  fetchStdout: string,
): Promise<void> {
  const record: RepoIndexRecord = { index: hit.index, ref: hit.ref, templateStderr: hit.templateStderr, fetchStdout };
  await store.put(repoIndexRecordKey(source), canonicalJson(record));
}

/**
 * The stored manifest for the repository `ref` (`<namespace>/<name>`): every Package and
 * PackageMetadata document gets `ref` in {@link PACKAGE_REPOSITORY_REF_ANNOTATION}, as the
 * clean-up overlay would have written it; other documents (the rebase-rule kapp Config) and all
 * other fields are kept as they are. Returns `hit.manifest` unchanged when it was rendered for
 * `ref` (no parse).
 */
export function withRepositoryRef(hit: Pick<RepoIndexHit, 'manifest' | 'ref'>, ref: string): string {
  if (hit.ref === ref) return hit.manifest;
  const docs = parseAllDocuments(hit.manifest);
  if (!Array.isArray(docs)) return hit.manifest;
  return docs
    .map((doc) => {
      const kind = doc.get('kind');
      if (kind === 'Package' || kind === 'PackageMetadata') {
        doc.setIn(['metadata', 'annotations', PACKAGE_REPOSITORY_REF_ANNOTATION], ref);
      }
      doc.directives.docStart = true;
      return doc.toString();
    })
    .join('');
}

function parseJson<T>(key: string, body: Buffer, schema: z.ZodType<T>): T {
  let value: unknown;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw new RepoIndexFormatError(`malformed repository index object ${key}: ${(err as Error).message}`);
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success)
    throw new RepoIndexFormatError(`malformed repository index object ${key}: ${parsed.error.message}`);
  return parsed.data;
}

// ---------------------------------------------------------------------------------------
// What each repository last deployed (event-driven upgrades in a cluster, docs/decisions.md D8)

/**
 * The per-repository pointer: what one PackageRepository of one cluster deployed last, so its next
 * reconcile can tell which versions it added or removed. Kept in the object store, not in status
 * (status keeps upstream's shape), at {@link repoPointerKey}.
 *
 * - `uid`: the repository's `metadata.uid` (a repository deleted and created again starts afresh);
 * - `index`: the index digest deployed ({@link repoIndexDigest}), whose versions document
 *   ({@link readRepositoryVersions}) lists its versions; or, for a repository fetched with a
 *   Secret (never indexed for the fleet), `versions` itself.
 */
export interface RepoPointer {
  uid: string;
  index?: string;
  versions?: RepoVersions;
}

const PointerSchema = z.object({
  uid: z.string(),
  index: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .optional(),
  versions: RepoVersionsSchema.optional(),
});

/** A cluster id, namespace or name as a key part: DNS-1123 characters, no `..`. */
const KEY_PART = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

/**
 * Key of a repository's pointer: `state/package-repositories/<clusterId>/<namespace>/<name>.json`.
 * Per cluster, never shared: only that cluster's index-repo runs read or write it.
 * @throws TypeError when a part is not a DNS-1123 name (or holds `..`).
 */
export function repoPointerKey(clusterId: string, namespace: string, name: string): string {
  for (const part of [clusterId, namespace, name]) {
    if (!KEY_PART.test(part) || part.includes('..'))
      throw new TypeError(`invalid repository key part ${JSON.stringify(part)}`);
  }
  return `state/package-repositories/${clusterId}/${namespace}/${name}.json`;
}

/**
 * The versions a repository deployed last, per {@link RepoPointer}: `undefined` when it never
 * deployed (no pointer, another uid, or its index is gone from the store), which counts every
 * version it now holds as added.
 * @throws RepoIndexFormatError for a malformed pointer or versions document; StoreError from the store
 */
export async function readPreviousVersions(
  store: ObjectStore,
  key: string,
  uid: string,
): Promise<RepoVersions | undefined> {
  const body = await store.get(key);
  if (!body) return undefined;
  const pointer = parseJson(key, body, PointerSchema);
  if (pointer.uid !== uid) return undefined;
  if (pointer.index) return readRepositoryVersions(store, pointer.index);
  return pointer.versions;
}

/**
 * Records what a repository deployed (replaced: one writer per repository, the leader of its cluster).
 * @throws StoreError from the store
 */
export async function writeRepoPointer(store: ObjectStore, key: string, pointer: RepoPointer): Promise<void> {
  await store.put(key, canonicalJson(pointer));
}

/** One refName whose versions changed: `versions` are those added or removed, ascending as stored. */
export interface RepoVersionChange {
  refName: string;
  versions: string[];
}

/**
 * The refNames whose versions differ between two versions documents, sorted by refName; each with
 * the versions in one and not the other (added then removed). Pure. `previous` `undefined` is
 * the empty document (a first deploy adds everything).
 */
export function diffRepoVersions(previous: RepoVersions | undefined, next: RepoVersions): RepoVersionChange[] {
  const before = previous ?? {};
  const out: RepoVersionChange[] = [];
  for (const refName of [...new Set([...Object.keys(before), ...Object.keys(next)])].sort()) {
    const a = new Set(before[refName] ?? []);
    const b = new Set(next[refName] ?? []);
    const added = [...b].filter((v) => !a.has(v));
    const removed = [...a].filter((v) => !b.has(v));
    if (added.length + removed.length > 0) out.push({ refName, versions: [...added, ...removed] });
  }
  return out;
}
