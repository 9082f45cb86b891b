/**
 * Content keys for artifacts in object storage, and the canonical render-input hash.
 *
 * Pure: no I/O, no clock. Hashing uses `node:crypto` as a computation only.
 *
 * Layout (all keys are valid {@link ObjectStore} keys):
 *
 * | what | key | hex is |
 * |---|---|---|
 * | fetched content (deterministic tarball) | `artifacts/fetch/sha256/<hex>.tgz` | sha256 of the *uncompressed* tar stream ({@link PackedDir.sha256}) |
 * | rendered manifest | `artifacts/template/sha256/<hex>.yaml` | sha256 of the manifest bytes |
 * | render cache entry | `cache/render/sha256/<hex>.json` | {@link renderInputHash} of the render's inputs |
 * | package repository index: versions per refName | `artifacts/index/sha256/<hex>.json` | repository index digest (`repoIndexDigest`, `../packaging/repo-index.ts`) |
 * | package repository index: the manifest kapp deploys | `artifacts/index/sha256/<hex>.yaml` | the same index digest |
 * | package repository index lookup record | `cache/index/sha256/<hex>.json` | an index digest, or a pinned source's digest (`repoIndexSourceDigest`) |
 *
 * Renders are stored by the digest of their output and found through the render cache
 * (input hash → manifest key), so two different inputs that render to the same manifest
 * share one artifact and a deploy that sees an unchanged manifest key is a no-op.
 *
 * These keys are shared by the whole fleet, so only content without any Secret input uses
 * them; content made from Secrets is sealed per cluster under `private/` keys (`./sealed.ts`,
 * `docs/secret-material.md`).
 *
 * @see fluxcd/pkg `artifact/storage` (content-addressed artifact paths).
 */
import { createHash } from 'node:crypto';
import { RENDER_TOOLS } from '../../../layers/tools.js';

/** Lowercase hex sha256: exactly 64 characters of `[0-9a-f]`. */
export const SHA256_HEX_PATTERN = /^[0-9a-f]{64}$/;

/** Matches a fetch artifact key; group 1 is the hex digest. */
export const FETCH_KEY_PATTERN = /^artifacts\/fetch\/sha256\/([0-9a-f]{64})\.tgz$/;
/** Matches a rendered-manifest key; group 1 is the hex digest. */
export const TEMPLATE_KEY_PATTERN = /^artifacts\/template\/sha256\/([0-9a-f]{64})\.yaml$/;
/** Matches a package repository index key; group 1 is the hex digest. */
export const INDEX_KEY_PATTERN = /^artifacts\/index\/sha256\/([0-9a-f]{64})\.json$/;
/** Matches a package repository index manifest key; group 1 is the index digest. */
export const INDEX_MANIFEST_KEY_PATTERN = /^artifacts\/index\/sha256\/([0-9a-f]{64})\.yaml$/;
/** Matches a package repository index lookup record key; group 1 is the looked-up digest. */
export const INDEX_RECORD_KEY_PATTERN = /^cache\/index\/sha256\/([0-9a-f]{64})\.json$/;
/** Matches a render cache key; group 1 is the render-input hash. */
export const RENDER_CACHE_KEY_PATTERN = /^cache\/render\/sha256\/([0-9a-f]{64})\.json$/;
/**
 * Matches a private fetch artifact key (sealed per cluster, `./sealed.ts`). Kept here, with the
 * shared key patterns, so the event schema checks keys without loading the encryption code.
 */
export const PRIVATE_FETCH_KEY_PATTERN = /^private\/[0-9a-f]{32}\/[0-9a-f]{32}\/fetch\/[0-9a-f]{64}\.tgz$/;
/** Matches a private rendered-manifest key (see {@link PRIVATE_FETCH_KEY_PATTERN}). */
export const PRIVATE_TEMPLATE_KEY_PATTERN = /^private\/[0-9a-f]{32}\/[0-9a-f]{32}\/template\/[0-9a-f]{64}\.yaml$/;

/** Kind of artifact a key names, as returned by {@link parseArtifactKey}. */
export type ArtifactKind = 'fetch' | 'template' | 'index' | 'index-manifest' | 'index-record' | 'render-cache';

/** True when `s` is a lowercase 64-character hex sha256. */
export function isSha256Hex(s: unknown): s is string {
  return typeof s === 'string' && SHA256_HEX_PATTERN.test(s);
}

function requireHex(hex: string, what: string): string {
  if (!isSha256Hex(hex)) {
    throw new TypeError(`invalid ${what} digest: expected 64 lowercase hex characters`);
  }
  return hex;
}

/**
 * Key of a fetched tarball: `artifacts/fetch/sha256/<hex>.tgz`.
 * @param sha256 hex digest of the uncompressed tar stream (see `packDir`).
 * @throws TypeError when `sha256` is not 64 lowercase hex characters.
 */
export function fetchArtifactKey(sha256: string): string {
  return `artifacts/fetch/sha256/${requireHex(sha256, 'fetch')}.tgz`;
}

/**
 * Key of a rendered manifest: `artifacts/template/sha256/<hex>.yaml`.
 * @param sha256 hex digest of the manifest bytes ({@link sha256Hex}).
 * @throws TypeError when `sha256` is not 64 lowercase hex characters.
 */
export function templateArtifactKey(sha256: string): string {
  return `artifacts/template/sha256/${requireHex(sha256, 'template')}.yaml`;
}

/**
 * Key of a package repository index's versions document: `artifacts/index/sha256/<hex>.json`,
 * `{ <refName>: [<version>...] }` (read with `readRepositoryVersions`, `../packaging/repo-index.ts`).
 * @param indexDigest hex digest of the index (`repoIndexDigest`: the fetched tree's digest and
 *   the template recipe), so a repository's content is indexed once for the whole fleet.
 * @throws TypeError when the digest is not 64 lowercase hex characters.
 */
export function repoIndexKey(indexDigest: string): string {
  return `artifacts/index/sha256/${requireHex(indexDigest, 'index')}.json`;
}

/**
 * Key of a package repository index's manifest (the Package/PackageMetadata documents and the
 * rebase-rule kapp Config that `kapp deploy <name>.pkgr` applies): `artifacts/index/sha256/<hex>.yaml`.
 * @param indexDigest as for {@link repoIndexKey}.
 * @throws TypeError when the digest is not 64 lowercase hex characters.
 */
export function repoIndexManifestKey(indexDigest: string): string {
  return `artifacts/index/sha256/${requireHex(indexDigest, 'index')}.yaml`;
}

/**
 * Key of a package repository index lookup record: `cache/index/sha256/<hex>.json`. The body
 * (owned by `../packaging/repo-index.ts`) names the index digest and the status parts of the run
 * that built it.
 * @param digest an index digest, or a pinned source's digest (`repoIndexSourceDigest`).
 * @throws TypeError when the digest is not 64 lowercase hex characters.
 */
export function repoIndexRecordKey(digest: string): string {
  return `cache/index/sha256/${requireHex(digest, 'index lookup')}.json`;
}

/**
 * Key of a render cache entry: `cache/render/sha256/<hex>.json`. The entry's body (owned by
 * the template stage) names the manifest key rendered from these inputs.
 * @param inputHash result of {@link renderInputHash}.
 * @throws TypeError when `inputHash` is not 64 lowercase hex characters.
 */
export function renderCacheKey(inputHash: string): string {
  return `cache/render/sha256/${requireHex(inputHash, 'render input')}.json`;
}

/**
 * Key of a shared pinned-fetch record: `cache/fetch/sha256/<hex>.json`. The record's body (owned
 * by the fetch stage) names the fetch artifact made from sources pinned to that identity (a
 * private fetch keeps its record sealed instead, `./sealed.ts` kind `fetch-cache`).
 * @param identity result of `pinnedFetchIdentity` (`../fetch/pinned.ts`).
 * @throws TypeError when `identity` is not 64 lowercase hex characters.
 */
export function fetchCacheKey(identity: string): string {
  return `cache/fetch/sha256/${requireHex(identity, 'pinned fetch')}.json`;
}

/**
 * Splits an artifact key into its kind and hex digest.
 * @returns `undefined` when `key` matches none of the layouts above (never throws).
 */
export function parseArtifactKey(key: string): { kind: ArtifactKind; sha256: string } | undefined {
  const table: [ArtifactKind, RegExp][] = [
    ['fetch', FETCH_KEY_PATTERN],
    ['template', TEMPLATE_KEY_PATTERN],
    ['index', INDEX_KEY_PATTERN],
    ['index-manifest', INDEX_MANIFEST_KEY_PATTERN],
    ['index-record', INDEX_RECORD_KEY_PATTERN],
    ['render-cache', RENDER_CACHE_KEY_PATTERN],
  ];
  for (const [kind, re] of table) {
    const m = re.exec(key);
    if (m?.[1]) return { kind, sha256: m[1] };
  }
  return undefined;
}

/** Lowercase hex sha256 of `data` (strings are hashed as UTF-8). */
export function sha256Hex(data: Uint8Array | string): string {
  return createHash('sha256').update(data).digest('hex');
}

/**
 * Canonical JSON: object keys sorted (by UTF-16 code unit, as RFC 8785 JCS), no whitespace,
 * numbers and strings serialized as `JSON.stringify` does. Object properties whose value is
 * `undefined` are omitted (as `JSON.stringify` does); everything else must be plain JSON.
 * Equal values give byte-identical output regardless of key insertion order.
 *
 * @throws TypeError for values JSON cannot represent faithfully: `undefined` at the top or in
 *   an array, functions, symbols, bigints, non-finite numbers, non-plain objects (Date, Map,
 *   class instances) and cycles. The message names the path, e.g. `template.ytt.paths[2]`.
 */
export function canonicalJson(value: unknown): string {
  return canon(value, '(root)', new Set());
}

function canon(v: unknown, path: string, seen: Set<object>): string {
  if (v === null) return 'null';
  switch (typeof v) {
    case 'string':
    case 'boolean':
      return JSON.stringify(v);
    case 'number':
      if (!Number.isFinite(v)) throw new TypeError(`canonical json: ${path}: non-finite number`);
      return JSON.stringify(v);
    case 'object':
      break;
    default:
      throw new TypeError(`canonical json: ${path}: unsupported ${typeof v}`);
  }
  const obj = v as object;
  if (seen.has(obj)) throw new TypeError(`canonical json: ${path}: cycle`);
  seen.add(obj);
  try {
    if (Array.isArray(obj)) {
      const parts = obj.map((item, i) => {
        if (item === undefined) throw new TypeError(`canonical json: ${path}[${i}]: undefined in array`);
        return canon(item, `${path}[${i}]`, seen);
      });
      return `[${parts.join(',')}]`;
    }
    const proto = Object.getPrototypeOf(obj);
    if (proto !== Object.prototype && proto !== null) {
      throw new TypeError(`canonical json: ${path}: not a plain object`);
    }
    const rec = obj as Record<string, unknown>;
    const parts: string[] = [];
    for (const k of Object.keys(rec).sort()) {
      const item = rec[k];
      if (item === undefined) continue;
      const childPath = path === '(root)' ? k : `${path}.${k}`;
      parts.push(`${JSON.stringify(k)}:${canon(item, childPath, seen)}`);
    }
    return `{${parts.join(',')}}`;
  } finally {
    seen.delete(obj);
  }
}

/**
 * Everything a render depends on. Digests are lowercase hex sha256 (or `sha256:<hex>`);
 * map keys are caller-chosen stable names (e.g. `fetch`, `secret/ns/name`).
 */
export interface RenderInputs {
  /** Digests of the fetched inputs, e.g. `{ fetch: '<hex of the fetch tarball>' }`. */
  readonly inputs: Readonly<Record<string, string>>;
  /** The App's `spec.template` (plain JSON), exactly as the template stage interprets it. */
  readonly template: unknown;
  /** Digests of values sources (inline values, Secret/ConfigMap data, downward API values). */
  readonly values: Readonly<Record<string, string>>;
  /** Versions of every tool the render runs, e.g. `{ ytt: '0.55.3', kbld: '0.46.0' }` ({@link renderToolVersions}). */
  readonly tools: Readonly<Record<string, string>>;
}

/**
 * The tool versions of a render's {@link RenderInputs.tools}: the version of every tool the
 * template function may run ({@link RENDER_TOOLS} of the tool table `layers/tools.ts`), `''` for
 * one missing from `versions`. Taken from the table so that no template tool can be left out of
 * the key, and a tool upgrade always re-renders.
 *
 * @param versions - the function's tool versions, without `v`, keyed by binary
 *   (`KAPP_LAMBDA_TOOL_VERSIONS`).
 * @returns e.g. `{ ytt: '0.55.3', kbld: '0.46.0', helm: '3.22.0', sops: '3.13.3', cue: '0.17.1', kustomize: '5.8.2' }`.
 */
export function renderToolVersions(versions: Readonly<Record<string, string>>): Record<string, string> {
  return Object.fromEntries(RENDER_TOOLS.map((bin) => [bin, versions[bin] ?? '']));
}

/**
 * Render-input hash: lowercase hex sha256 over {@link canonicalJson} of
 * `{ v: 2, inputs, template, values, tools }`. The same inputs anywhere in the fleet give the
 * same hash, so a render runs once; the leading `v` lets the recipe change without
 * colliding with old cache entries (v2: shared entries written before private artifacts
 * existed may name renders that held Secrets, so they are not read again).
 *
 * Values are hashed by digest, never by content, so secret values never enter the hash input.
 *
 * @throws TypeError when `template` is not plain JSON (see {@link canonicalJson}).
 */
export function renderInputHash(r: RenderInputs): string {
  return sha256Hex(canonicalJson({ v: 2, inputs: r.inputs, template: r.template, values: r.values, tools: r.tools }));
}

/**
 * Where the fleet's in-flight markers live (`./single-flight.ts`): `inflight/<cache key>`. A
 * prefix of its own so a bucket lifecycle rule can expire markers a crashed runner left.
 */
export const INFLIGHT_PREFIX = 'inflight/';

/**
 * Key of the in-flight marker of a shared cache key: `inflight/<cacheKey>`, e.g.
 * `inflight/cache/render/sha256/<hex>.json` while one runner renders for that input hash.
 * @param cacheKey a shared cache record key ({@link fetchCacheKey}, {@link renderCacheKey}).
 * @throws TypeError for a private key (`private/…`): content made from Secrets is never shared,
 *   so it never waits on another runner.
 */
export function inflightKey(cacheKey: string): string {
  if (cacheKey.startsWith('private/')) throw new TypeError('private content takes no fleet in-flight marker');
  return `${INFLIGHT_PREFIX}${cacheKey}`;
}
