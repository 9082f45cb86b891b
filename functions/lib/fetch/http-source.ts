/**
 * The fetch stage's handling of `http` sources: download (vendir's rules, `./http-download.ts`),
 * verify `sha256`, unpack with the safe extractor (`./archive.ts`) into a directory outside
 * vendir's, and hand vendir that directory as a `directory` source. vendir then copies it,
 * applies `newRootPath` and checks symlinks as for any source; its lock config says
 * `directory: {}` for that entry, which {@link restoreHttpLock} turns back into upstream's
 * `http: {}` (vendir records nothing else for http), so `status.fetch.stdout` is unchanged.
 *
 * Why not "verify, then let vendir download again": the server could answer the second
 * request with another archive, and any difference between this parser and Go's would be a
 * way around the check. Unpacking here means the bytes checked are the bytes written, by code
 * that never writes outside its directory.
 *
 * @module
 */
import { join } from 'node:path';
import type { AppFetch } from '../api/fetch.js';
import type { RefObjects } from '../api/refs.js';
import { GENERIC_ERROR_DETAIL, resultFromError, type StageResult } from '../reconcile/result.js';
import { isVendirArchiveError, type UnpackLimits, UnsafeArchiveError, unpackHttpContent } from './archive.js';
import { createHttpDownloader, HttpDownloadError, type HttpDownloader } from './http-download.js';
import { DEFAULT_STALL_RULE, type StallRule } from './stall.js';
import { type UrlPolicyChecker, UrlPolicyError } from './url-policy.js';
import { FETCH_RUN_ERROR_PREFIX, fetchDirectoryName } from './vendir.js';

/** Input of {@link prepareHttpSources}. */
export interface PrepareHttpInput {
  /** `spec.fetch`. */
  fetch: readonly AppFetch[];
  /** The Secrets the entries reference (`http.secretRef`). */
  refs: RefObjects;
  /** Empty scratch directory, not inside vendir's working directory; entry i goes to `<root>/<i>`. */
  root: string;
  /** The cluster's `kapp-controller-config` CA bundle and proxy for every download. */
  trust?: import('./cluster-trust.js').TrustOptions;
  /** The download port. Default {@link createHttpDownloader}. */
  downloader?: HttpDownloader;
  /**
   * The URL policy, checked on every hop of every download (redirects included); while it is
   * enforced each connection goes to an address it checked (`pinnedLookup`), not to a later
   * DNS answer.
   */
  urlPolicy?: UrlPolicyChecker;
  /** Abort a download after this long, ms. Default 10 minutes. */
  timeoutMs?: number;
  /**
   * Cut a download that makes no progress (`./stall.ts`). Default {@link DEFAULT_STALL_RULE}
   * (4 KiB in 60 s).
   */
  stall?: StallRule;
  /** Aborts the downloads early (the App was deleted or canceled meanwhile). */
  signal?: AbortSignal;
  /** Bounds of the download and of the unpacked content. */
  limits?: UnpackLimits & { maxDownloadBytes?: number };
}

/** Prepared directories, or the failed fetch result to report. */
export type PrepareHttpOutcome =
  | {
      /** `spec.fetch` index → absolute directory holding that entry's content. */
      dirs: Map<number, string>;
      /** vendir directory path (`"<i>"` or `path`) → the source URL, for {@link restoreHttpLock}. */
      urls: Map<string, string>;
    }
  | { result: StageResult };

/**
 * go-cli-ui's `MultiLineError` for a one-line error: a new line, indented two more spaces,
 * before each `: ` followed by a capital letter (the container-piece rule is not mirrored).
 */
function multiLine(chain: string): string {
  return chain
    .replace(/: ([A-Z])/g, ':\n$1')
    .split('\n')
    .map((line, i) => '  '.repeat(i) + line)
    .join('\n');
}

/** A failure vendir would have reported itself: same stderr shape, same status error. */
function vendirFailure(chain: string): StageResult {
  return {
    stdout: '',
    stderr: `vendir: Error: ${multiLine(chain)}\n`,
    exitCode: 1,
    error: FETCH_RUN_ERROR_PREFIX + GENERIC_ERROR_DETAIL,
    finished: true,
  };
}

/** A refused archive: the status error itself names the entry. */
function unsafeFailure(chain: string): StageResult {
  return { stdout: '', stderr: chain, exitCode: -1, error: FETCH_RUN_ERROR_PREFIX + chain, finished: true };
}

/** vendir's `addAuth`: only `username` and `password` keys; basic auth when `username` is set. */
function basicAuthFrom(
  refs: RefObjects,
  name: string,
): { auth?: { username: string; password: string }; error?: string } {
  const secret = refs.secret(name);
  const data = secret?.data ?? {};
  for (const key of Object.keys(data)) {
    if (key !== 'username' && key !== 'password') {
      return { error: `Unknown secret field '${key}' in secret '${name}'` };
    }
  }
  if (data.username === undefined) return {};
  return { auth: { username: data.username.toString('utf8'), password: data.password?.toString('utf8') ?? '' } };
}

/**
 * Downloads and unpacks every `http` entry of `spec.fetch` into `<root>/<i>`, in order,
 * stopping at the first failure.
 *
 * Failures vendir itself reports (download errors, `sha256` mismatch, unknown Secret keys, a
 * corrupt archive) keep vendir's shape: stderr `vendir: Error: Syncing directory '<dir>': ...`
 * and status error `Fetching resources: Error (see .status.usefulErrorMessage for details)`.
 * A refused archive is reported in the status error itself, e.g.
 * `Fetching resources: Syncing directory '0': Syncing directory '.' with HTTP contents:
 * Unpacking archive: archive entry "../../x" escapes the fetch directory`.
 *
 * @throws only on local I/O failures (the scratch directory cannot be written)
 */
export async function prepareHttpSources(input: PrepareHttpInput): Promise<PrepareHttpOutcome> {
  const dirs = new Map<number, string>();
  const urls = new Map<string, string>();
  const downloader = input.downloader ?? createHttpDownloader();
  for (const [i, entry] of input.fetch.entries()) {
    const http = entry.http;
    // Only entries vendir would treat as http (upstream's switch order puts inline and image first).
    if (!http || entry.inline || entry.image) continue;
    const dirName = fetchDirectoryName(entry, i);
    const chain = (detail: string) =>
      `Syncing directory '${dirName}': Syncing directory '.' with HTTP contents: ${detail}`;
    const url = http.url ?? '';
    if (url === '') return { result: vendirFailure(chain('Expected non-empty URL')) };
    let auth: { username: string; password: string } | undefined;
    if (http.secretRef) {
      const a = basicAuthFrom(input.refs, http.secretRef.name ?? '');
      if (a.error) return { result: vendirFailure(chain(`Downloading URL: Adding auth to request: ${a.error}`)) };
      auth = a.auth;
    }
    let body: Buffer;
    try {
      const got = await downloader.download({
        url,
        basicAuth: auth,
        maxBytes: input.limits?.maxDownloadBytes,
        stall: input.stall ?? DEFAULT_STALL_RULE,
        ...(input.trust?.caCerts ? { caCerts: input.trust.caCerts } : {}),
        ...(input.trust?.proxy ? { proxy: input.trust.proxy } : {}),
        signal: input.signal
          ? AbortSignal.any([AbortSignal.timeout(input.timeoutMs ?? 10 * 60_000), input.signal])
          : AbortSignal.timeout(input.timeoutMs ?? 10 * 60_000),
        ...input.urlPolicy?.requestGuards(),
      });
      if (http.sha256 && http.sha256 !== got.sha256) {
        return {
          result: vendirFailure(
            chain(`Downloading URL: Expected digest to match 'sha256:${http.sha256}', but was 'sha256:${got.sha256}'`),
          ),
        };
      }
      body = got.body;
    } catch (err) {
      if (err instanceof HttpDownloadError) return { result: vendirFailure(chain(`Downloading URL: ${err.message}`)) };
      if (err instanceof UrlPolicyError) return { result: resultFromError(err, FETCH_RUN_ERROR_PREFIX) };
      throw err;
    }
    const dir = join(input.root, String(i));
    try {
      await unpackHttpContent(body, dir, url, input.limits);
    } catch (err) {
      if (err instanceof UnsafeArchiveError)
        return { result: unsafeFailure(chain(`Unpacking archive: ${err.message}`)) };
      if (isVendirArchiveError(err)) return { result: vendirFailure(chain(`Unpacking archive: ${err.message}`)) };
      throw err;
    }
    dirs.set(i, dir);
    urls.set(dirName, url);
  }
  return { dirs, urls };
}

/**
 * Turns vendir's output for prepared entries back into what upstream prints: each lock entry
 * `directory: {}` becomes `http: {}` (kapp-controller never writes `directory` sources, so
 * every one is a prepared http entry), and a `Fetching: <dir> + . (directory)` line names the
 * URL as vendir's http source does.
 *
 * @param stdout - vendir's stdout
 * @param urls - vendir directory path → source URL (from {@link prepareHttpSources})
 */
export function restoreHttpLock(stdout: string, urls: ReadonlyMap<string, string>): string {
  return stdout
    .replace(/^(\s*-?\s*)directory: \{\}$/gm, '$1http: {}')
    .replace(/^Fetching: (.*) \+ (.*) \(directory\)$/gm, (line, dir: string, sub: string) => {
      const url = urls.get(dir);
      return url === undefined ? line : `Fetching: ${dir} + ${sub} (http from ${url})`;
    });
}
