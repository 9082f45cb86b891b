/**
 * The pin rule of a fetch source, on its own without imports: whether the spec alone fixes the
 * bytes a `spec.fetch[]` entry fetches. Shared by the fetch cache (`../fetch/pinned.ts`, which may reuse
 * a pinned source's artifact without contacting it) and the forwarder (`events/forwarder/quiet.ts`,
 * where an App whose sources cannot move may stay quiet at its sync period), whose bundle must
 * stay small.
 *
 * @module
 */

const COMMIT_ID = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/i;
const DIGEST = /@sha256:[0-9a-f]{64}$/;
const SHA256_HEX = /^[0-9a-f]{64}$/i;

function rec(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/**
 * Whether a fetch entry's source is pinned by its spec: git at a full commit id (40 or 64 hex
 * digits) without `refSelection`; image or imgpkgBundle by `@sha256:<64 hex>` digest without
 * `tagSelection`; http with `sha256`. Never helmChart (a chart version is a mutable tag) nor
 * inline (its callers decide about inline content). Reads the entry loosely: never throws.
 *
 * @param entry - one `spec.fetch[]` entry (validated or as watched)
 */
export function sourcePinned(entry: unknown): boolean {
  const e = rec(entry);
  const git = rec(e?.git);
  if (git) return typeof git.ref === 'string' && COMMIT_ID.test(git.ref) && git.refSelection == null;
  const http = rec(e?.http);
  if (http) return typeof http.sha256 === 'string' && SHA256_HEX.test(http.sha256);
  const image = rec(e?.image);
  if (image) return typeof image.url === 'string' && DIGEST.test(image.url) && image.tagSelection == null;
  const bundle = rec(e?.imgpkgBundle);
  if (bundle) return typeof bundle.image === 'string' && DIGEST.test(bundle.image) && bundle.tagSelection == null;
  return false;
}
