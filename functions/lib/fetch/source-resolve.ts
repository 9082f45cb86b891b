/**
 * The PackageRepository and App sources the fleet polls (a tag, a branch, a tag selection, an
 * http URL without `sha256` or a helm chart version, public), how each is pinned once resolved,
 * and the resolution itself: one registry `HEAD` (`./registry-digest.ts`), one `git ls-remote`
 * (`./git-ls-remote.ts`), for a selection the tag list and the chosen tag's `HEAD` or one `git
 * ls-remote --tags` (`./tag-selection.ts`), one GET hashed (`./http-digest.ts`) or one chart
 * repository index GET (`./helm-index.ts`), under the URL policy. The poll records and the
 * fan-out are the pipeline's (`../pipeline/source-poll.ts`).
 *
 * @module
 */
import type { AppFetch, PackageRepositoryFetch } from '../api/index.js';
import { sourceTracked } from '../api/pin-rule.js';
import type { CommandRunner } from '../exec/runner.js';
import type { VersionSelectionSemver } from '../packaging/versions.js';
import { resolveGitRef } from './git-ls-remote.js';
import { chartVersionOf, resolveHelmChart } from './helm-index.js';
import { resolveHttpDigest } from './http-digest.js';
import { parseImageTagRef, pinImageRef, resolveImageDigest } from './registry-digest.js';
import type { StallRule } from './stall.js';
import {
  describeSelection,
  resolveGitSelection,
  resolveImageSelection,
  selectionRepositoryOf,
  semverSelectionOf,
} from './tag-selection.js';
import { type UrlPolicy, UrlPolicyChecker } from './url-policy.js';

/** A fetch the poll may follow: a PackageRepository's `spec.fetch` or one App `spec.fetch[]` entry. */
export type PolledFetch = PackageRepositoryFetch | AppFetch;

/** A source the fleet polls: what is resolved, and how. */
export interface PolledSource {
  /**
   * `image` / `imgpkgBundle` (registry HEAD, or a tag list for a selection), `git` (ls-remote),
   * `http` (GET, body hashed) or `helmChart` (the repository's `index.yaml`, or a registry HEAD
   * for `oci://`).
   */
  kind: 'image' | 'imgpkgBundle' | 'git' | 'http' | 'helmChart';
  /**
   * The image reference with its tag (a selection: the repository, as written), the git or http
   * URL, or the chart repository URL.
   */
  url: string;
  /**
   * The tag (images), git ref, chart name (helmChart) or `''` (http); for a selection its
   * description (`semver >=1.0.0`, for logs and causes).
   */
  ref: string;
  /**
   * A `tagSelection` or `refSelection`, normalized (`semverSelectionOf`): part of the record key,
   * so two selections on one repository are two records. Absent for a tag or ref.
   */
  selection?: VersionSelectionSemver;
  /** helmChart only: the chart `version` asked for; absent: helm's latest stable. */
  version?: string;
}

/**
 * The source of a repository's fetch or an App's `spec.fetch[]` entry that the fleet polls, or
 * `undefined`: exactly the entries of {@link sourceTracked} (the rule the forwarder's quiet rule
 * reads too) whose image reference parses and whose selection parses (`semverSelectionOf`; an
 * image URL for a `tagSelection` without tag or digest). Those left out are fetched as written,
 * so vendir reports what is wrong with them. Left out by the rule: pinned sources (nothing to
 * poll), sources with a Secret (their content is sealed per cluster, never shared) or with
 * credentials in the git URL (the poll record stores and logs its URL), a helm chart from
 * `oci://` without a version (`./helm-index.ts`), and inline.
 */
export function polledSourceOf(fetch: PolledFetch): PolledSource | undefined {
  if (!sourceTracked(fetch)) return undefined;
  if (fetch.http?.url) return { kind: 'http', url: fetch.http.url, ref: '' };
  const chart = 'helmChart' in fetch ? fetch.helmChart : undefined;
  if (chart?.name && chart.repository?.url)
    return {
      kind: 'helmChart',
      url: chart.repository.url,
      ref: chart.name,
      ...(chart.version ? { version: chart.version } : {}),
    };
  if (fetch.imgpkgBundle ?? fetch.image) {
    const url = fetch.imgpkgBundle ? fetch.imgpkgBundle.image : fetch.image?.url;
    const kind = fetch.imgpkgBundle ? 'imgpkgBundle' : 'image';
    const tagSelection = fetch.imgpkgBundle ? fetch.imgpkgBundle.tagSelection : fetch.image?.tagSelection;
    if (tagSelection) {
      const selection = semverSelectionOf(tagSelection);
      if (!url || !selection || !selectionRepositoryOf(url)) return undefined;
      return { kind, url, ref: describeSelection(selection), selection };
    }
    const parsed = url ? parseImageTagRef(url) : undefined;
    if (!url || !parsed) return undefined;
    return { kind, url, ref: parsed.tag };
  }
  if (fetch.git?.url && fetch.git.refSelection) {
    const selection = semverSelectionOf(fetch.git.refSelection);
    return selection ? { kind: 'git', url: fetch.git.url, ref: describeSelection(selection), selection } : undefined;
  }
  return fetch.git?.url && fetch.git.ref ? { kind: 'git', url: fetch.git.url, ref: fetch.git.ref } : undefined;
}

/**
 * `fetch` pinned to `resolved`: the image by digest, the git ref as the commit, the http
 * download with `sha256`, the chart at the resolved version (`<version>@…`; the fetch cache keys
 * it by the whole value, `./pinned.ts`). A selection is removed: an image selection's `resolved`
 * is `<tag>@<digest>`, pinned as `<url>:<tag>@<digest>` (imgpkg pulls the digest; vendir's lock,
 * `status.fetch.stdout`, keeps the tag as upstream's lock of the selection does), a git
 * selection's the commit (vendir's lock names the tag through `git describe`, as upstream's).
 * An http body that changed since the poll fails the hash check; the fetch stage then fetches
 * the entry as written, unshared (`../pipeline/app/fetch.ts`).
 */
export function pinnedFetchOf<F extends PolledFetch>(fetch: F, resolved: string): F {
  if (fetch.imgpkgBundle) {
    const { tagSelection, ...bundle } = fetch.imgpkgBundle;
    const image = tagSelection ? `${bundle.image ?? ''}:${resolved}` : pinImageRef(bundle.image ?? '', resolved);
    return { ...fetch, imgpkgBundle: { ...bundle, image } };
  }
  if (fetch.image) {
    const { tagSelection, ...image } = fetch.image;
    const url = tagSelection ? `${image.url ?? ''}:${resolved}` : pinImageRef(image.url ?? '', resolved);
    return { ...fetch, image: { ...image, url } };
  }
  if (fetch.git) {
    const { refSelection: _, ...git } = fetch.git;
    return { ...fetch, git: { ...git, ref: resolved } };
  }
  if (fetch.http) return { ...fetch, http: { ...fetch.http, sha256: resolved } };
  if ('helmChart' in fetch && fetch.helmChart)
    return { ...fetch, helmChart: { ...fetch.helmChart, version: chartVersionOf(resolved) } };
  return fetch;
}

/**
 * How long one resolution may take in all (every request, redirect and token exchange, or the
 * `git ls-remote`): 30 s. Without it a registry that accepts the connection and never answers
 * held the poll for undici's 300 s header timeout per request, and the fleet's poll (one
 * source after the other) never reached the sources behind it.
 */
export const RESOLVE_TIMEOUT_MS = 30_000;

/**
 * Resolves a source now: one registry `HEAD` (anonymous, token flow if challenged), one
 * `git ls-remote`, a selection's tag list and `HEAD` or `git ls-remote --tags`
 * (`./tag-selection.ts`), one GET of an http source hashed (`./http-digest.ts`: the body's hex
 * sha256) or of a chart repository's `index.yaml` (`./helm-index.ts`:
 * `<version>@sha256:<digest>`), every URL under the runtime's URL policy, within `timeoutMs`.
 * @returns the digest or commit; for an image selection `<tag>@<digest>` (see {@link pinnedFetchOf})
 * @param deps - the command runner (git), the URL policy in force (none: off), the
 *   deadline in ms (default {@link RESOLVE_TIMEOUT_MS}), and the fetch's progress rule an http
 *   source's GET is held to (`./stall.ts`; none: only the deadline; a tarpit URL otherwise held
 *   every fetch of it the whole deadline before the stage fetched by tag)
 * @throws RegistryResolveError, GitResolveError, SelectionResolveError (no tag matches: vendir's
 *   message), HttpDownloadError, HelmIndexError, UrlPolicyError, CommandNotAllowedError; the
 *   signal's `TimeoutError` when the deadline passes while a body is read
 */
export async function resolveSource(
  source: PolledSource,
  deps: { runner: CommandRunner; urlPolicy?: UrlPolicy; timeoutMs?: number; stall?: StallRule },
): Promise<string> {
  const policy = deps.urlPolicy ? new UrlPolicyChecker(deps.urlPolicy) : undefined;
  const signal = AbortSignal.timeout(deps.timeoutMs ?? RESOLVE_TIMEOUT_MS);
  if (source.kind === 'git') {
    // The poll timer resolves records without a repository run's policy check: check here.
    await policy?.checkFetch([{ git: { url: source.url, ...(source.selection ? {} : { ref: source.ref }) } }]);
    if (source.selection) return await resolveGitSelection(deps.runner, source.url, source.selection, signal);
    return await resolveGitRef(deps.runner, source.url, source.ref, signal);
  }
  const opts = { signal, ...policy?.requestGuards() };
  if (source.kind === 'http')
    return await resolveHttpDigest(source.url, { ...opts, ...(deps.stall ? { stall: deps.stall } : {}) });
  if (source.kind === 'helmChart') {
    const chart = { repository: source.url, name: source.ref, ...(source.version ? { version: source.version } : {}) };
    return await resolveHelmChart(chart, opts);
  }
  if (source.selection) return await resolveImageSelection(source.url, source.selection, opts);
  return await resolveImageDigest(source.url, opts);
}
