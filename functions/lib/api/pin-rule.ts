/**
 * The pin rules of a fetch source, on their own without imports: whether the spec alone fixes the
 * bytes a `spec.fetch[]` entry fetches ({@link sourcePinned}), and whether the fleet's source poll
 * follows it ({@link sourceTracked}). Shared by the fetch cache (`../fetch/pinned.ts`, which may
 * reuse a pinned source's artifact without contacting it), the source poll
 * (`../fetch/source-resolve.ts`, which polls exactly the tracked sources) and the forwarder
 * (`events/forwarder/quiet.ts`, where an App whose sources are pinned or tracked may stay quiet at
 * its sync period), whose bundle must stay small.
 *
 * @module
 */

const COMMIT_ID = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/i;
const DIGEST = /@sha256:[0-9a-f]{64}$/;
const SHA256_HEX = /^[0-9a-f]{64}$/i;
/** A git URL with a credential: a password (`scheme://user:pass@`) or any user of http(s) (a token). */
const GIT_URL_USER = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)@/;

function rec(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/**
 * Whether a fetch entry's source is pinned by its spec: git at a full commit id (40 or 64 hex
 * digits) without `refSelection`; image or imgpkgBundle by `@sha256:<64 hex>` digest without
 * `tagSelection`; http with `sha256`. Never helmChart by its spec alone (a chart version is a
 * mutable tag: the source poll resolves it to a digest, `../fetch/helm-index.ts`, and the fetch
 * cache keys the pinned fetch by that) nor inline (its callers decide about inline content). Reads the entry loosely: never throws.
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

/** Whether a git URL carries a credential (see {@link GIT_URL_USER}): the poll record stores and logs its URL. */
export function gitUrlHasCredential(url: string): boolean {
  const m = GIT_URL_USER.exec(url);
  if (!m) return false;
  return (m[2] ?? '').includes(':') || /^https?$/i.test(m[1] ?? '');
}

/** Whether `url` names an image by tag (or by name, tag `latest`), not by digest. */
function byTag(url: unknown): url is string {
  return typeof url === 'string' && url !== '' && !url.includes('@') && !/\s/.test(url) && !url.startsWith('-');
}

/** An absolute http(s) URL without a user (a credential) or a query (often a signed URL's token): the poll record stores and logs it. */
function plainHttpUrl(url: unknown): url is string {
  return typeof url === 'string' && /^https?:\/\/[^/?#@\s]+(?:\/[^?#\s]*)?$/i.test(url);
}

/**
 * A full chart version (`MAJOR.MINOR.PATCH`, optional `v`, prerelease and build): helm matches
 * it exactly. Anything else is a constraint (`^1.2`, `1.2`, `>=1 <2`), which helm resolves
 * against the index on its own (the poll does not).
 */
const CHART_VERSION = /^v?[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$/;

/**
 * Whether a helmChart entry is polled: a `name`, a repository without `secretRef` whose URL
 * is plain http(s) (`index.yaml` resolved) or `oci://` with a full `version` (one registry
 * `HEAD`; without a version helm lists the tags, which the poll does not), and no version or a
 * full one (see {@link CHART_VERSION}).
 */
function chartTracked(chart: Record<string, unknown>): boolean {
  const repo = rec(chart.repository);
  const url = repo?.url;
  const version = chart.version;
  if (typeof chart.name !== 'string' || chart.name === '' || !repo || repo.secretRef != null) return false;
  if (version != null && version !== '' && (typeof version !== 'string' || !CHART_VERSION.test(version))) return false;
  if (typeof url === 'string' && /^oci:\/\//i.test(url))
    return typeof version === 'string' && version !== '' && plainHttpUrl(`https://${url.slice(6)}`);
  return plainHttpUrl(url);
}

/**
 * Whether a selection (`tagSelection`, `refSelection`) names the `semver` strategy vendir
 * resolves. Whether its constraints parse is the poll's to check (`polledSourceOf`): a bad one
 * fails the App's fetch, and a failed App is never quiet.
 */
function semverSelection(selection: unknown): boolean {
  return rec(rec(selection)?.semver) !== undefined;
}

/**
 * Whether a fetch entry's source is one the fleet's source poll follows: unpinned, public and
 * resolvable by one request or one tag list. git by branch or tag `ref` (not a commit id)
 * without `refSelection`, or by `refSelection` (`semver`) without `ref` (vendir lets a `ref`
 * win), in both cases without `secretRef` or a credential in its URL; image or imgpkgBundle by
 * tag, or by `tagSelection` (`semver`), without `secretRef`; http without `sha256` or
 * `secretRef` at a URL without a user or query (one GET, the body's sha256); helmChart from a
 * repository without `secretRef` (see {@link chartTracked}). Never inline, or a pinned source
 * ({@link sourcePinned}: nothing to poll). An image reference the registry client cannot parse,
 * or a selection whose constraints do not parse, passes here and is left out by the poll
 * (`polledSourceOf`); its fetch fails, and a failed App is never quiet. Reads the entry
 * loosely: never throws.
 *
 * @param entry - one `spec.fetch[]` entry, or a PackageRepository's `spec.fetch` (validated or as watched)
 */
export function sourceTracked(entry: unknown): boolean {
  const e = rec(entry);
  const bundle = rec(e?.imgpkgBundle);
  const image = bundle ?? rec(e?.image);
  if (image) {
    const url = bundle ? bundle.image : image.url;
    return byTag(url) && image.secretRef == null && (image.tagSelection == null || semverSelection(image.tagSelection));
  }
  const http = rec(e?.http);
  if (http) return plainHttpUrl(http.url) && http.secretRef == null && (http.sha256 == null || http.sha256 === '');
  const chart = rec(e?.helmChart);
  if (chart) return chartTracked(chart);
  const git = rec(e?.git);
  if (!git || typeof git.url !== 'string' || git.url === '') return false;
  if (git.secretRef != null || gitUrlHasCredential(git.url)) return false;
  const byRef = typeof git.ref === 'string' && git.ref !== '';
  if (git.refSelection != null) return !byRef && semverSelection(git.refSelection);
  return byRef && !COMMIT_ID.test(git.ref as string);
}
