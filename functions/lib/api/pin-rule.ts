/**
 * The pin rule of a fetch source, on its own without imports: whether the spec alone fixes the
 * bytes a `spec.fetch[]` entry fetches. Shared by the fetch cache (`../fetch/pinned.ts`, which may reuse
 * a pinned source's artifact without contacting it) and the forwarder (`events/forwarder/quiet.ts`,
 * where an App whose sources cannot move may stay quiet at its sync period), whose bundle must
 * stay small. Beside it, the rule of which PackageRepository sources the fleet source poll tracks
 * ({@link repositorySourceTracked}), shared the same way by the poll (`../fetch/source-resolve.ts`)
 * and the forwarder.
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

/**
 * Whether a git URL carries a credential: a password (`scheme://user:pass@`), or any user of an
 * http(s) URL (`https://<token>@host`, the usual form of an access token).
 */
export function gitUrlHasCredential(url: string): boolean {
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)@/.exec(url);
  if (!m) return false;
  return (m[2] ?? '').includes(':') || /^https?$/i.test(m[1] ?? '');
}

/**
 * Whether the fleet source poll tracks a PackageRepository's `spec.fetch` (D9,
 * `../pipeline/repo/source-poll.ts`): an `imgpkgBundle` or `image` by tag (no `@` digest), or a
 * `git` ref that is not a full commit id, each without a Secret, without `tagSelection` /
 * `refSelection` (vendir picks among many) and, for git, without credentials in the URL (the
 * poll record stores and logs its URL). A moved tag or branch then pokes the repository, so the
 * forwarder may keep it quiet at its sync period. Pinned sources are {@link sourcePinned}'s;
 * http and inline are never tracked. The poll also parses the image reference
 * (`../fetch/source-resolve.ts` `polledSourceOf`); one it cannot parse vendir refuses too, so
 * that repository fails and is never quiet. Reads the fetch loosely: never throws.
 *
 * @param fetch - a PackageRepository's `spec.fetch` (validated or as watched)
 */
export function repositorySourceTracked(fetch: unknown): boolean {
  const f = rec(fetch);
  const bundle = rec(f?.imgpkgBundle);
  const image = bundle ?? rec(f?.image);
  if (image) {
    const url = bundle ? bundle.image : image.url;
    return (
      typeof url === 'string' &&
      url !== '' &&
      !url.includes('@') &&
      image.secretRef == null &&
      image.tagSelection == null
    );
  }
  const git = rec(f?.git);
  return (
    typeof git?.url === 'string' &&
    git.url !== '' &&
    typeof git.ref === 'string' &&
    git.ref !== '' &&
    git.secretRef == null &&
    git.refSelection == null &&
    !gitUrlHasCredential(git.url) &&
    !COMMIT_ID.test(git.ref)
  );
}
