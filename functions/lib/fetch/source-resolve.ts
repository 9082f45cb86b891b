/**
 * The PackageRepository and App sources the fleet polls (a tag or a branch, public), how each is pinned
 * once resolved, and the resolution itself: one registry `HEAD` (`./registry-digest.ts`) or one
 * `git ls-remote` (`./git-ls-remote.ts`), under the URL policy. The poll records and the fan-out
 * are the pipeline's (`../pipeline/source-poll.ts`).
 *
 * @module
 */
import type { AppFetch, PackageRepositoryFetch } from '../api/index.js';
import { sourceTracked } from '../api/pin-rule.js';
import type { CommandRunner } from '../exec/runner.js';
import { resolveGitRef } from './git-ls-remote.js';
import { parseImageTagRef, pinImageRef, resolveImageDigest } from './registry-digest.js';
import { type UrlPolicy, UrlPolicyChecker } from './url-policy.js';

/** A fetch the poll may follow: a PackageRepository's `spec.fetch` or one App `spec.fetch[]` entry. */
export type PolledFetch = PackageRepositoryFetch | AppFetch;

/** A source the fleet polls: what is resolved, and how. */
export interface PolledSource {
  /** `image` / `imgpkgBundle` (registry HEAD) or `git` (ls-remote). */
  kind: 'image' | 'imgpkgBundle' | 'git';
  /** The image reference with its tag, or the git URL. */
  url: string;
  /** The tag (images) or git ref. */
  ref: string;
}

/**
 * The source of a repository's fetch or an App's `spec.fetch[]` entry that the fleet polls, or
 * `undefined`: exactly the entries of {@link sourceTracked} (the rule the forwarder's quiet rule
 * reads too) whose image reference parses. Left out: pinned sources (nothing to poll),
 * selections (`tagSelection`, `refSelection`: vendir picks among many tags), sources with a
 * Secret (their content is sealed per cluster, never shared) or with credentials in the git URL
 * (the poll record stores and logs its URL), http, helmChart and inline.
 */
export function polledSourceOf(fetch: PolledFetch): PolledSource | undefined {
  if (!sourceTracked(fetch)) return undefined;
  if (fetch.imgpkgBundle ?? fetch.image) {
    const url = fetch.imgpkgBundle ? fetch.imgpkgBundle.image : fetch.image?.url;
    const parsed = url ? parseImageTagRef(url) : undefined;
    if (!url || !parsed) return undefined;
    return { kind: fetch.imgpkgBundle ? 'imgpkgBundle' : 'image', url, ref: parsed.tag };
  }
  return fetch.git?.url && fetch.git.ref ? { kind: 'git', url: fetch.git.url, ref: fetch.git.ref } : undefined;
}

/** `fetch` pinned to `resolved`: the image by digest, the git ref as the commit. */
export function pinnedFetchOf<F extends PolledFetch>(fetch: F, resolved: string): F {
  if (fetch.imgpkgBundle)
    return {
      ...fetch,
      imgpkgBundle: { ...fetch.imgpkgBundle, image: pinImageRef(fetch.imgpkgBundle.image ?? '', resolved) },
    };
  if (fetch.image) return { ...fetch, image: { ...fetch.image, url: pinImageRef(fetch.image.url ?? '', resolved) } };
  if (fetch.git) return { ...fetch, git: { ...fetch.git, ref: resolved } };
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
 * Resolves a source now: one registry `HEAD` (anonymous, token flow if challenged) or one
 * `git ls-remote`, every URL under the runtime's URL policy, within `timeoutMs`.
 * @param deps - the command runner (git), the URL policy in force (none: off), and the
 *   deadline in ms (default {@link RESOLVE_TIMEOUT_MS})
 * @throws RegistryResolveError, GitResolveError, UrlPolicyError, CommandNotAllowedError; the
 *   signal's `TimeoutError` when the deadline passes while a body is read
 */
export async function resolveSource(
  source: PolledSource,
  deps: { runner: CommandRunner; urlPolicy?: UrlPolicy; timeoutMs?: number },
): Promise<string> {
  const policy = deps.urlPolicy ? new UrlPolicyChecker(deps.urlPolicy) : undefined;
  const signal = AbortSignal.timeout(deps.timeoutMs ?? RESOLVE_TIMEOUT_MS);
  if (source.kind === 'git') {
    // The poll timer resolves records without a repository run's policy check: check here.
    await policy?.checkFetch([{ git: { url: source.url, ref: source.ref } }]);
    return await resolveGitRef(deps.runner, source.url, source.ref, signal);
  }
  return await resolveImageDigest(source.url, {
    signal,
    ...policy?.requestGuards(),
  });
}
