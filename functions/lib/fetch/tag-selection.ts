/**
 * Tag selections resolved without vendir, for the fleet's source poll
 * (`../pipeline/source-poll.ts`): `image.tagSelection` / `imgpkgBundle.tagSelection` (vendir
 * lists the repository's tags, `imgpkg.Tags`, and pulls `<url>:<highest matching tag>`) and
 * `git.refSelection` (vendir fetches every tag and checks out the highest matching one). The
 * choice is vendir's `HighestConstrainedVersion` through the project's port
 * (`../packaging/versions.ts`, over carvel's blang fork): one leading `v` ignored, tags that are not
 * semver skipped, prereleases dropped unless `prereleases` keeps them, the highest left wins.
 *
 * One resolution: the registry's tag list (`GET /v2/<name>/tags/list`, following `Link`
 * pages, with the request and token flow of `./registry-digest.ts`) then one manifest `HEAD` of
 * the chosen tag; or one `git ls-remote --tags` (`./git-ls-remote.ts`). At most
 * {@link MAX_SELECTION_TAGS} tags are read.
 *
 * @module
 */
import type { VersionSelection } from '../api/common.js';
import { gitUrlError } from '../argv-values.js';
import type { CommandRunner } from '../exec/runner.js';
import { SemverError } from '../packaging/semver.js';
import { highestConstrainedVersion, parseRange, type VersionSelectionSemver } from '../packaging/versions.js';
import { commitFromLsRemote, GitResolveError, lsRemote } from './git-ls-remote.js';
import {
  type ImageTagRef,
  parseImageTagRef,
  RegistryResolveError,
  type ResolveImageOptions,
  readBounded,
  registryRequest,
  registryUrl,
  resolveImageDigest,
} from './registry-digest.js';

/** Most tags a selection reads (registry pages or `ls-remote` lines): 10,000; past it the resolution fails. */
export const MAX_SELECTION_TAGS = 10_000;
/** Most tag-list pages followed: 100. */
const MAX_TAG_PAGES = 100;
/** Largest tag-list page read: 4 MiB. */
const MAX_TAG_PAGE_BYTES = 4 * 1024 * 1024;

/**
 * The `semver` selection of a `tagSelection` or `refSelection` as the poll keys and applies it:
 * `constraints` (absent when empty) and `prereleases` (absent: none kept; `{}`: all kept, also
 * for an empty `identifiers`; else the identifiers), or `undefined` when the selection has no
 * `semver` (vendir then refuses it) or its constraints do not parse (vendir's fetch reports the
 * error: the poll must not hide it behind a fallback).
 */
export function semverSelectionOf(selection: VersionSelection | undefined): VersionSelectionSemver | undefined {
  const semver = selection?.semver;
  if (!semver || typeof semver !== 'object') return undefined;
  const constraints = typeof semver.constraints === 'string' ? semver.constraints : '';
  if (constraints !== '') {
    try {
      parseRange(constraints);
    } catch (err) {
      if (err instanceof SemverError) return undefined;
      throw err;
    }
  }
  const ids = semver.prereleases?.identifiers ?? [];
  return {
    ...(constraints !== '' ? { constraints } : {}),
    ...(semver.prereleases ? { prereleases: ids.length > 0 ? { identifiers: [...ids] } : {} } : {}),
  };
}

/** How a selection reads in logs and `ref-changed` causes: `semver <constraints>` (`*`: any). */
export function describeSelection(selection: VersionSelectionSemver): string {
  const pre = selection.prereleases
    ? ` prereleases${selection.prereleases.identifiers ? `=${selection.prereleases.identifiers.join(',')}` : ''}`
    : '';
  return `semver ${selection.constraints ?? '*'}${pre}`;
}

/**
 * The repository of an image URL written for a `tagSelection` (vendir appends `:<tag>` to it),
 * or `undefined` when it already names a tag or digest or does not parse (vendir's pull then
 * fails, and the App reports it).
 */
export function selectionRepositoryOf(url: string): ImageTagRef | undefined {
  if (url.lastIndexOf(':') > url.lastIndexOf('/')) return undefined;
  return parseImageTagRef(url);
}

/** A selection chose no tag, or the tags could not be listed; `message` says why (vendir's words for the choice). */
export class SelectionResolveError extends Error {
  override readonly name = 'SelectionResolveError';
}

/**
 * vendir's choice among `tags` (`HighestConstrainedVersion`).
 * @param prefix - before the error's message: vendir's image and bundle fetch say
 *   `Determining tag selection: `, its git fetch nothing
 * @throws SelectionResolveError with vendir's message (`Expected to find at least one version…`)
 */
export function selectTag(tags: readonly string[], selection: VersionSelectionSemver, prefix = ''): string {
  try {
    return highestConstrainedVersion(tags, selection);
  } catch (err) {
    throw new SelectionResolveError(`${prefix}${(err as Error).message}`, { cause: err });
  }
}

/**
 * Every tag of `url`'s repository (`GET /v2/<name>/tags/list`, following `Link: <…>; rel="next"`
 * on the same origin), in the registry's order.
 * @throws RegistryResolveError (refused, malformed, more than {@link MAX_SELECTION_TAGS} tags or
 *   {@link MAX_TAG_PAGES} pages, a `Link` to another origin); what `opts.checkUrl` throws
 */
export async function listImageTags(url: string, opts: ResolveImageOptions = {}): Promise<string[]> {
  const ref = selectionRepositoryOf(url);
  if (!ref) throw new RegistryResolveError('not an image repository without tag or digest');
  const session = opts.session ?? {};
  const first = registryUrl(ref, 'tags/list');
  const tags: string[] = [];
  let next: URL | undefined = first;
  for (let page = 0; next; page++) {
    if (page >= MAX_TAG_PAGES) throw new RegistryResolveError(`tag list exceeds ${MAX_TAG_PAGES} pages`);
    const res = await registryRequest(next, ref, 'GET', 'application/json', { ...opts, session });
    if (res.status !== 200) {
      await res.body?.cancel().catch(() => undefined);
      throw new RegistryResolveError(`GET tags ${ref.repository} answered ${res.status}`);
    }
    const link = /<([^>]+)>\s*;\s*rel="?next"?/i.exec(res.headers.get('link') ?? '')?.[1];
    let body: { tags?: unknown };
    try {
      body = JSON.parse((await readBounded(res, MAX_TAG_PAGE_BYTES, 'tag list')).toString('utf8'));
    } catch (err) {
      if (err instanceof RegistryResolveError) throw err;
      throw new RegistryResolveError('tag list is not JSON');
    }
    for (const t of Array.isArray(body?.tags) ? body.tags : []) if (typeof t === 'string') tags.push(t);
    if (tags.length > MAX_SELECTION_TAGS) throw new RegistryResolveError(`more than ${MAX_SELECTION_TAGS} tags`);
    next = link ? new URL(link, next) : undefined;
    if (next && next.origin !== first.origin) throw new RegistryResolveError('tag list links to another origin');
  }
  return tags;
}

/**
 * Resolves an image `tagSelection`: the highest matching tag of `url`'s repository, then its
 * manifest digest (one token exchange for both).
 * @returns `<tag>@sha256:<hex>`: what the fetch is pinned to (`<url>:<tag>@<digest>`: imgpkg pulls
 *   the digest, and vendir's lock keeps the tag, as upstream's lock of the selection does)
 * @throws SelectionResolveError, RegistryResolveError, what `opts.checkUrl` throws
 */
export async function resolveImageSelection(
  url: string,
  selection: VersionSelectionSemver,
  opts: ResolveImageOptions = {},
): Promise<string> {
  const session = opts.session ?? {};
  const tag = selectTag(await listImageTags(url, { ...opts, session }), selection, 'Determining tag selection: ');
  return `${tag}@${await resolveImageDigest(`${url}:${tag}`, { ...opts, session })}`;
}

/**
 * Resolves a git `refSelection`: the highest matching tag of `git ls-remote --tags`, to its commit
 * (an annotated tag's peeled `^{}` commit), as vendir checks the tag out.
 * @returns the commit id
 * @throws SelectionResolveError (no tag matches, more than {@link MAX_SELECTION_TAGS} tags),
 *   GitResolveError (refused URL, failed `ls-remote`), CommandNotAllowedError
 */
export async function resolveGitSelection(
  runner: CommandRunner,
  url: string,
  selection: VersionSelectionSemver,
  signal?: AbortSignal,
): Promise<string> {
  const urlProblem = gitUrlError(url);
  if (urlProblem) throw new GitResolveError(`git url is refused: ${urlProblem}`);
  const out = await lsRemote(runner, url, ['--tags'], [], signal);
  const tags = new Set<string>();
  for (const line of out.split('\n')) {
    const name = line.trim().split('\t')[1];
    if (name?.startsWith('refs/tags/')) tags.add(name.slice('refs/tags/'.length).replace(/\^\{\}$/, ''));
  }
  if (tags.size > MAX_SELECTION_TAGS) throw new SelectionResolveError(`more than ${MAX_SELECTION_TAGS} tags`);
  const tag = selectTag([...tags], selection);
  const commit = commitFromLsRemote(out, `refs/tags/${tag}`);
  if (!commit) throw new GitResolveError(`git remote has no commit for tag ${JSON.stringify(tag)}`);
  return commit;
}
