/**
 * Branch or tag → commit resolution for `git` sources without a clone: `git ls-remote` through
 * the project's command runner (allow-listed binary, minimal environment, private `HOME`), for
 * the fleet's source poll (`../pipeline/source-poll.ts`).
 *
 * argv only: `git -c credential.helper= ls-remote -- <url> <patterns...>`. The URL and the ref
 * are checked first as for vendir's git (`gitUrlError`, `gitRefError` of `../argv-values.ts`: no
 * leading `-`, no remote helpers, `check-ref-format` rules), and `--` ends git's options before
 * them. Runs with `GIT_SAFETY_ENV` (`./git-env.ts`): a redirect of the remote is not followed. The URL policy is the caller's (it checks the source before this runs).
 *
 * Which ref wins (vendir checks out `ref` after fetching every branch and tag, so git's own
 * precedence applies): a full `refs/...` name; else `refs/tags/<ref>` (an annotated tag's peeled
 * `^{}` commit); else `refs/heads/<ref>`; `origin/<branch>` names `refs/heads/<branch>`.
 *
 * @module
 */
import { gitRefError, gitUrlError } from '../argv-values.js';
import type { CommandRunner } from '../exec/runner.js';
import { GIT_SAFETY_ENV } from './git-env.js';

/** How long one `git ls-remote` may run: 60 s. */
export const LS_REMOTE_TIMEOUT_MS = 60_000;
/** Output bound of `git ls-remote`: 4 MiB (a ref per line). */
const LS_REMOTE_MAX_OUTPUT = 4 * 1024 * 1024;
const COMMIT = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/;

/** The remote could not be listed or has no such ref; `message` says which (no credentials). */
export class GitResolveError extends Error {
  override readonly name = 'GitResolveError';
}

/** The full ref names `ref` may stand for, most preferred first. */
export function refCandidates(ref: string): string[] {
  if (ref.startsWith('refs/')) return [ref];
  if (ref.startsWith('origin/')) return [`refs/heads/${ref.slice('origin/'.length)}`];
  return [`refs/tags/${ref}`, `refs/heads/${ref}`];
}

/**
 * The commit `ref` names in `git ls-remote` output (`<sha>\t<refname>` lines), or `undefined`.
 * Annotated tags resolve to their peeled commit (`<refname>^{}`).
 */
export function commitFromLsRemote(output: string, ref: string): string | undefined {
  const refs = new Map<string, string>();
  for (const line of output.split('\n')) {
    const [sha, name] = line.trim().split('\t');
    if (sha && name && COMMIT.test(sha)) refs.set(name, sha);
  }
  for (const candidate of refCandidates(ref)) {
    const sha = refs.get(`${candidate}^{}`) ?? refs.get(candidate);
    if (sha) return sha;
  }
  return undefined;
}

/**
 * Resolves `ref` of the git repository `url` to a commit id.
 *
 * @param signal - aborts the run
 * @returns the commit id (40 or 64 lowercase hex digits).
 * @throws GitResolveError for a refused URL or ref, a failed `git ls-remote` (its last stderr
 *   line), or a ref the remote does not have; CommandNotAllowedError when the runner does not
 *   allow `git` (the Lambda layers do not ship it).
 */
export async function resolveGitRef(
  runner: CommandRunner,
  url: string,
  ref: string,
  signal?: AbortSignal,
): Promise<string> {
  const urlProblem = gitUrlError(url);
  if (urlProblem) throw new GitResolveError(`git url is refused: ${urlProblem}`);
  const refProblem = gitRefError(ref);
  if (refProblem) throw new GitResolveError(`git ref is refused: ${refProblem}`);
  const patterns = refCandidates(ref).flatMap((r) => (r.startsWith('refs/tags/') ? [r, `${r}^{}`] : [r]));
  const stdout = await lsRemote(runner, url, [], patterns, signal);
  const commit = commitFromLsRemote(stdout, ref);
  if (!commit) throw new GitResolveError(`git remote has no ref ${JSON.stringify(ref)}`);
  return commit;
}

/**
 * `git -c credential.helper= ls-remote <options> -- <url> <patterns>` through `runner`, for a URL
 * already checked (`gitUrlError`) by the caller.
 * @param options - `ls-remote` options, before `--` (e.g. `--tags`)
 * @returns its stdout (at most 4 MiB)
 * @throws GitResolveError with git's last stderr line (a URL password masked); CommandNotAllowedError
 */
export async function lsRemote(
  runner: CommandRunner,
  url: string,
  options: readonly string[],
  patterns: readonly string[],
  signal?: AbortSignal,
): Promise<string> {
  const run = await runner.run({
    cmd: 'git',
    args: ['-c', 'credential.helper=', 'ls-remote', ...options, '--', url, ...patterns],
    env: { GIT_TERMINAL_PROMPT: '0', GIT_ASKPASS: '/bin/false', SSH_ASKPASS: '/bin/false', ...GIT_SAFETY_ENV },
    timeoutMs: LS_REMOTE_TIMEOUT_MS,
    maxOutputBytes: LS_REMOTE_MAX_OUTPUT,
    ...(signal ? { signal } : {}),
  });
  if (run.error) {
    // A URL's password (`https://user:pass@host`) never reaches the message.
    const last = (run.stderr.trim().split('\n').pop() ?? '').replace(/(:\/\/[^/\s:@]*:)[^/\s@]*@/g, '$1***@');
    throw new GitResolveError(`git ls-remote failed: ${last || run.error.message}`);
  }
  return run.stdout;
}
