/**
 * The source poll's resolution of an `http` fetch source without `sha256`: one GET of the URL
 * through the fetch stage's own downloader (`./http-download.ts`: vendir's redirect rules, the
 * URL policy on every hop and connection, the same size bound), the body hashed as it streams
 * and never kept. The resolved value is the body's lowercase hex sha256, which the poll then
 * writes into the entry's `http.sha256` (`pinnedFetchOf` of `./source-resolve.ts`): the entry is
 * pinned (`sourcePinned`), and every App on the URL shares one fetch (`./pinned.ts`).
 *
 * Why not a `HEAD` with `ETag`/`Last-Modified`: the pin must be the body's sha256, which the
 * fetch stage checks the download against, and no validator gives it. A `HEAD` could only say
 * "unchanged since the last GET", which needs the record to keep validator → hash (the poll
 * record holds one `resolved` string), and a server that sends no validator, or only a weak
 * one, would need the GET anyway. One GET per period for the fleet replaces one per App per
 * sync period, which is the saving this resolver is for.
 *
 * @module
 */
import { createHttpDownloader, DEFAULT_MAX_DOWNLOAD_BYTES, type HttpDownloader } from './http-download.js';
import type { ResolveImageOptions } from './registry-digest.js';
import type { StallRule } from './stall.js';

/** Options of {@link resolveHttpDigest}: the URL policy's guards and the deadline, as a registry resolution's. */
export interface ResolveHttpOptions extends Pick<ResolveImageOptions, 'checkUrl' | 'lookupFor' | 'signal'> {
  /** The download port. Default {@link createHttpDownloader}. */
  downloader?: HttpDownloader;
  /**
   * Largest body hashed, bytes: default {@link DEFAULT_MAX_DOWNLOAD_BYTES}, the fetch stage's own
   * bound, so that whatever the fetch can download the poll can resolve (a smaller bound would
   * leave such an App tracked by the quiet rule but never resolved, hence never poked).
   */
  maxBytes?: number;
  /**
   * The fetch's progress rule (`./stall.ts`), as the fetch stage's own download of the source
   * applies it: a body trickling under it is cut (HttpDownloadError naming the host and the rule)
   * instead of holding the resolution, and the stage run waiting on it, to the deadline.
   */
  stall?: StallRule;
}

/**
 * The lowercase hex sha256 of the body `url` answers now (one GET, anonymous).
 * @throws HttpDownloadError (network, status other than 200, redirects, size, with vendir's
 *   wording), UrlPolicyError from `checkUrl`/`lookupFor`, the signal's error at the deadline
 */
export async function resolveHttpDigest(url: string, opts: ResolveHttpOptions = {}): Promise<string> {
  const downloader = opts.downloader ?? createHttpDownloader();
  const got = await downloader.download({
    url,
    hashOnly: true,
    maxBytes: opts.maxBytes ?? DEFAULT_MAX_DOWNLOAD_BYTES,
    ...(opts.signal ? { signal: opts.signal } : {}),
    ...(opts.stall ? { stall: opts.stall } : {}),
    ...(opts.checkUrl ? { checkUrl: opts.checkUrl } : {}),
    ...(opts.lookupFor ? { lookupFor: opts.lookupFor } : {}),
  });
  return got.sha256;
}
