/**
 * Pinned-source detection and a stable identity for a fetch entry's content, so the fetch function
 * can skip re-fetching a source whose content cannot change and whose artifact already exists.
 *
 * Not an upstream feature as such: upstream's vendir cache (`VENDIR_CACHE_DIR`, keyed by App UID,
 * not set here: see `vendirSyncCommand`) reuses images referenced by digest. This widens the same
 * idea to every source whose content is fixed by the spec alone, and keys it by content rather
 * than by object, so the whole fleet shares one artifact.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { AppFetch } from '../api/fetch.js';
import { sourcePinned } from '../api/pin-rule.js';
import { canonicalJson, sha256Hex } from '../artifact/keys.js';
import { chartVersionOf } from './helm-index.js';
import { type FetchSourceKind, fetchSourceKind } from './vendir.js';

/** Result of {@link fetchSourceIdentity}. */
export interface FetchSourceIdentity {
  /** The entry's source. */
  source: FetchSourceKind;
  /**
   * `true` when the spec alone fixes the fetched bytes, so an artifact stored under `cacheKey` may
   * be reused without contacting the source:
   * - git: `ref` is a full commit id (40 or 64 hex digits) and there is no `refSelection`;
   * - image / imgpkgBundle: the reference has an `@sha256:<64 hex>` digest and no `tagSelection`;
   * - http: `sha256` is set (vendir verifies the download against it).
   *
   * - helmChart: only with the source poll's `resolved` value (`<version>@sha256:<digest>`,
   *   `./helm-index.ts`) for an entry at that version, which then joins the key: by its spec
   *   alone a chart version is a mutable tag in both HTTP chart repositories and OCI registries,
   *   and vendir has no digest field for charts.
   *
   * Never pinned: inline (cheap, and `pathsFrom` depends on cluster objects, not on the spec).
   */
  pinned: boolean;
  /** Why the entry is or is not pinned (for logs and receipts). */
  reason: string;
  /**
   * `sha256:<hex>` over the entry's content-defining fields (source kind, locations, the pin,
   * `subPath`, `lfsSkipSmudge`); excludes credentials (`secretRef`), TLS settings, clone depth,
   * `forceHTTPBasicAuth` and the entry's `path`, none of which change the fetched files.
   * Meaningful for reuse only when `pinned`.
   */
  cacheKey: string;
}

/**
 * Decides whether a fetch entry is pinned and computes its content identity.
 *
 * @param entry - one `spec.fetch[]` entry
 * @param resolved - what the source poll resolved the entry to (`../pipeline/source-poll.ts`,
 *   the entry being its pinned fetch); read for helmChart only (the other kinds carry their pin
 *   in the entry)
 * @returns identity, or `undefined` for an entry without a source
 */
export function fetchSourceIdentity(entry: AppFetch, resolved?: string): FetchSourceIdentity | undefined {
  const source = fetchSourceKind(entry);
  if (!source) return undefined;
  let pinned = false;
  let reason: string;
  let content: Record<string, unknown>;
  switch (source) {
    case 'git': {
      const g = entry.git!;
      pinned = sourcePinned(entry);
      reason = pinned ? 'git ref is a commit id' : 'git ref is a branch, tag or selection';
      content = {
        url: g.url,
        ref: g.ref,
        refSelection: g.refSelection,
        subPath: g.subPath || undefined,
        lfsSkipSmudge: g.lfsSkipSmudge || undefined,
      };
      break;
    }
    case 'image': {
      const i = entry.image!;
      pinned = sourcePinned(entry);
      reason = pinned ? 'image is referenced by digest' : 'image is referenced by tag or selection';
      content = { url: i.url, tagSelection: i.tagSelection, subPath: i.subPath || undefined };
      break;
    }
    case 'imgpkgBundle': {
      const b = entry.imgpkgBundle!;
      pinned = sourcePinned(entry);
      reason = pinned ? 'bundle is referenced by digest' : 'bundle is referenced by tag or selection';
      content = { image: b.image, tagSelection: b.tagSelection };
      break;
    }
    case 'http': {
      const h = entry.http!;
      pinned = sourcePinned(entry);
      reason = pinned ? 'http download has a sha256' : 'http download has no sha256';
      // vendir names a non-archive download after the URL's base name, so the URL stays in the key.
      content = { url: h.url, sha256: h.sha256?.toLowerCase(), subPath: h.subPath || undefined };
      break;
    }
    case 'helmChart': {
      const c = entry.helmChart!;
      // The poll's value names the version it pinned: anything else is not this entry's pin.
      const digest =
        resolved !== undefined && c.version && chartVersionOf(resolved) === c.version ? resolved : undefined;
      pinned = digest !== undefined;
      reason = pinned ? 'helm chart version resolved to a digest' : 'helm chart versions are mutable';
      content = { name: c.name, version: c.version, repository: c.repository?.url, ...(digest ? { digest } : {}) };
      break;
    }
    case 'inline': {
      reason = 'inline sources are not cached';
      content = { paths: entry.inline!.paths, pathsFrom: entry.inline!.pathsFrom };
      break;
    }
  }
  const cacheKey = `sha256:${createHash('sha256')
    .update(canonicalJson({ v: 1, source, ...content }))
    .digest('hex')}`;
  return { source, pinned, reason, cacheKey };
}

/**
 * Identity of a whole `spec.fetch` when every entry is pinned, else `undefined`. Covers the
 * directory each entry lands in and the vendir version (a vendir upgrade may lay files out
 * differently). Inline entries without `pathsFrom` are pinned by their content.
 *
 * @param configDigest - `fetchConfigDigest` of the cluster's `kapp-controller-config` (its CA
 *   bundle, proxy and skipped hosts decide what the fetch could reach); `''` adds nothing, so
 *   an unconfigured cluster's identities are unchanged.
 * @param resolved - entry → the source poll's `resolved` value for it (the fetch stage's
 *   tracked entries), see {@link fetchSourceIdentity}
 */
export function pinnedFetchIdentity(
  fetch: readonly AppFetch[],
  vendirVersion: string,
  credentials: Readonly<Record<string, string>> = {},
  configDigest = '',
  resolved: ReadonlyMap<AppFetch, string> = new Map(),
): string | undefined {
  if (fetch.length === 0) return undefined;
  const parts: unknown[] = [];
  for (const [i, entry] of fetch.entries()) {
    if (entry.inline) {
      if (entry.inline.pathsFrom?.length) return undefined;
      parts.push({ i, path: entry.path ?? null, inline: { ...(entry.inline.paths ?? {}) } });
      continue;
    }
    const id = fetchSourceIdentity(entry, resolved.get(entry));
    if (!id?.pinned) return undefined;
    // The credentials are part of the identity: an App may reuse a private artifact only
    // with the same credentials that fetched it (upstream re-fetches with each App's own).
    const secret = fetchSecretName(entry);
    parts.push({ i, path: entry.path ?? null, id: id.cacheKey, cred: secret ? (credentials[secret] ?? '-') : null });
  }
  return sha256Hex(canonicalJson({ v: 1, vendir: vendirVersion, parts, ...(configDigest ? { configDigest } : {}) }));
}

/**
 * The Secret holding a fetch entry's credentials, if it names one: that of the source vendir is
 * given ({@link fetchSourceKind}'s order), so an entry naming two sources is counted, cached and
 * fetched with the same Secret (`none` for an inline entry: its Secrets are its content).
 */
export function fetchSecretName(entry: AppFetch): string | undefined {
  switch (fetchSourceKind(entry)) {
    case 'image':
      return entry.image?.secretRef?.name || undefined;
    case 'http':
      return entry.http?.secretRef?.name || undefined;
    case 'git':
      return entry.git?.secretRef?.name || undefined;
    case 'helmChart':
      return entry.helmChart?.repository?.secretRef?.name || undefined;
    case 'imgpkgBundle':
      return entry.imgpkgBundle?.secretRef?.name || undefined;
    default:
      return undefined;
  }
}
