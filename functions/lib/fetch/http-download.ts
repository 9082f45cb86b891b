/**
 * Downloads an http fetch source the way vendir v0.44 does (`pkg/vendir/fetch/http/sync.go`):
 * one GET, basic auth from the `secretRef` (keys `username`/`password` only), Go's redirect
 * rules (at most 10, `Authorization` kept only for the same host or a subdomain), `200 OK`
 * required, optional sha256 check, with vendir's error texts. The body is bounded.
 *
 * {@link HttpDownloader} is the port; {@link createHttpDownloader} is the real one (Node's
 * `fetch`, or `trustingFetch` over `node:http(s)` for a cluster's CA bundle or proxy and while
 * the URL policy pins each connection's address). The fetch stage uses it so that archives are unpacked by the project's own safe
 * extractor (`./archive.ts`) instead of vendir's.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { LookupFunction } from 'node:net';
import type { ControllerProxy } from '../reconcile/controller-config.js';
import { trustingFetch } from './cluster-trust.js';
import { type StallRule, stallNote, watchStall } from './stall.js';
import { UrlPolicyError } from './url-policy.js';

/** Go's default `http.Client` redirect limit. */
export const MAX_REDIRECTS = 10;
/** Default cap on a downloaded body: 512 MiB. */
export const DEFAULT_MAX_DOWNLOAD_BYTES = 512 * 1024 * 1024;

/** One download. */
export interface HttpDownloadRequest {
  /** The source URL (`spec.fetch[].http.url`). */
  url: string;
  /** Basic auth from the `secretRef`, already decoded. */
  basicAuth?: { username: string; password: string };
  /** Refuse bodies larger than this. Default {@link DEFAULT_MAX_DOWNLOAD_BYTES}. */
  maxBytes?: number;
  /**
   * Hash the body without keeping it (the result's `body` is empty): the source poll's http
   * resolution (`./http-digest.ts`) needs only the sha256 and may meet bodies as large as the
   * fetch stage's bound, which it must not hold in memory.
   */
  hashOnly?: boolean;
  /** Aborts the download. */
  signal?: AbortSignal;
  /**
   * Called with every URL before it is requested, the first and each redirect target, so a
   * redirect cannot lead past the URL policy. Its error (e.g. `UrlPolicyError`) propagates as is
   * and no request is sent to that URL.
   */
  checkUrl?: (url: string) => Promise<void>;
  /**
   * The DNS lookup of the connection to each URL (the first and each redirect target): the URL
   * policy's `pinnedLookup` while it is enforced, so the request connects to an address checked
   * in the resolution it connects with, not one a later DNS answer names (rebinding past
   * `checkUrl`). When it returns a lookup the request goes over {@link trustingFetch}; its
   * `UrlPolicyError` propagates as is and nothing is sent.
   */
  lookupFor?: (url: URL) => LookupFunction | undefined;
  /**
   * The cluster's `kapp-controller-config` `caCerts`: trusted besides the system roots (the
   * request then goes over {@link trustingFetch}, not the downloader's `fetch`).
   */
  caCerts?: string;
  /** The cluster's proxy keys (as `caCerts`: over {@link trustingFetch}). */
  proxy?: ControllerProxy;
  /**
   * The progress rule (`./stall.ts`): a download (from its first request, redirects included)
   * that brings fewer than `minBytes` of body in a window of `windowMs` is cut, with the
   * {@link HttpDownloadError} `fetch from <host> made no progress (...)`. Absent: none (the
   * signal's deadline only).
   */
  stall?: StallRule;
}

/** A completed download. */
export interface HttpDownload {
  /** The body (empty when the request was {@link HttpDownloadRequest.hashOnly}). */
  body: Buffer;
  /** Lowercase hex sha256 of the body. */
  sha256: string;
}

/** A failed download; `message` is vendir's text after `Downloading URL: `. */
export class HttpDownloadError extends Error {
  override readonly name = 'HttpDownloadError';
}

/** The port: fetches one URL. */
export interface HttpDownloader {
  /**
   * @throws {HttpDownloadError} for every failure (network, status, redirects, size), with
   *   vendir's wording, e.g. `Expected 200 OK, but was '404 Not Found'`.
   */
  download(req: HttpDownloadRequest): Promise<HttpDownload>;
}

/** Go's `isDomainOrSubdomain`: `sub` equals `parent` or ends with `.parent`. */
export function isDomainOrSubdomain(sub: string, parent: string): boolean {
  return sub === parent || sub.endsWith(`.${parent}`);
}

/** The URL with its password replaced by `***`, as Go's `url.Error` prints it. */
export function redactUrl(url: string): string {
  return url.replace(/^([A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#:@]*:)[^/?#@]*@/, '$1***@');
}

function basic(username: string, password: string): string {
  return `Basic ${Buffer.from(`${username}:${password}`, 'utf8').toString('base64')}`;
}

/**
 * Node's codes for a certificate chain ending at a root it does not trust: Go reports each as
 * `x509: certificate signed by unknown authority` (which the fetch stage's CA hint keys on).
 */
const UNKNOWN_AUTHORITY_CODES = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
]);

function causeText(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  if (cause?.code && UNKNOWN_AUTHORITY_CODES.has(cause.code)) {
    return 'tls: failed to verify certificate: x509: certificate signed by unknown authority';
  }
  if (cause?.code && cause.message) return cause.message;
  return err instanceof Error ? err.message : String(err);
}

/**
 * The real {@link HttpDownloader}, on Node's `fetch` (or {@link trustingFetch}, see
 * {@link HttpDownloadRequest.lookupFor}) with manual redirects.
 *
 * Differences from Go's client: Node's TLS trust store (its bundled CAs plus
 * `NODE_EXTRA_CA_CERTS`, plus the request's `caCerts`), not the system one; the proxy is the
 * request's `proxy` (the cluster's `kapp-controller-config`), never the process environment
 * (the URL policy is applied to each hop by `checkUrl` and to each connection by `lookupFor`
 * here, while the tools go through the egress proxy, `./egress-proxy.ts`). An untrusted
 * certificate reads as Go's `x509: certificate signed by unknown authority`.
 *
 * @param fetchImpl - the `fetch` to use (default: the global one)
 */
export function createHttpDownloader(fetchImpl: typeof fetch = fetch): HttpDownloader {
  return {
    async download(req) {
      const maxBytes = req.maxBytes ?? DEFAULT_MAX_DOWNLOAD_BYTES;
      let current: URL;
      try {
        current = new URL(req.url);
      } catch {
        throw new HttpDownloadError(`Building request: parse ${JSON.stringify(req.url)}: invalid URI for request`);
      }
      const initialHost = current.hostname;
      // The stall cut aborts the request in flight; its note names the host it was reading from.
      let reading = current.host;
      const cut = new AbortController();
      const rule = req.stall;
      const watch = rule
        ? watchStall(rule, () => cut.abort(new HttpDownloadError(stallNote(reading, rule))))
        : undefined;
      const signal = req.signal ? AbortSignal.any([req.signal, cut.signal]) : cut.signal;
      try {
        return await downloadHops();
      } catch (err) {
        throw cut.signal.aborted ? cut.signal.reason : err;
      } finally {
        watch?.stop();
      }

      async function downloadHops(): Promise<HttpDownload> {
        for (let hop = 0; ; hop++) {
          const scheme = current.protocol.slice(0, -1);
          const shown = redactUrl(current.href);
          if (scheme !== 'http' && scheme !== 'https') {
            throw new HttpDownloadError(
              `Initiating URL download: Get ${JSON.stringify(shown)}: unsupported protocol scheme ${JSON.stringify(scheme)}`,
            );
          }
          const headers: Record<string, string> = {};
          // Go: the explicit basic auth travels only to the same host or a subdomain; URL
          // userinfo applies when no Authorization header is set.
          if (req.basicAuth && isDomainOrSubdomain(current.hostname, initialHost)) {
            headers.authorization = basic(req.basicAuth.username, req.basicAuth.password);
          } else if (current.username || current.password) {
            headers.authorization = basic(decodeURIComponent(current.username), decodeURIComponent(current.password));
          }
          const target = new URL(current.href);
          target.username = '';
          target.password = '';
          await req.checkUrl?.(target.href);
          reading = target.host;
          let res: Response;
          try {
            const pinned = req.lookupFor?.(target);
            const f =
              req.caCerts || req.proxy || pinned
                ? trustingFetch({
                    caCerts: req.caCerts,
                    proxy: req.proxy,
                    ...(req.lookupFor ? { lookupFor: req.lookupFor } : {}),
                  })
                : fetchImpl;
            res = await f(target, { method: 'GET', headers, redirect: 'manual', signal });
          } catch (err) {
            if (err instanceof UrlPolicyError || cut.signal.aborted) throw err;
            throw new HttpDownloadError(`Initiating URL download: Get ${JSON.stringify(shown)}: ${causeText(err)}`);
          }
          const location = res.headers.get('location');
          if ([301, 302, 303, 307, 308].includes(res.status) && location) {
            await res.body?.cancel().catch(() => undefined);
            if (hop + 1 > MAX_REDIRECTS) {
              throw new HttpDownloadError(
                `Initiating URL download: Get ${JSON.stringify(redactUrl(new URL(location, current).href))}: stopped after ${MAX_REDIRECTS} redirects`,
              );
            }
            try {
              current = new URL(location, current);
            } catch {
              throw new HttpDownloadError(
                `Initiating URL download: Get ${JSON.stringify(shown)}: failed to parse Location header ${JSON.stringify(location)}`,
              );
            }
            continue;
          }
          if (res.status !== 200) {
            await res.body?.cancel().catch(() => undefined);
            const status = `${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
            throw new HttpDownloadError(`Expected 200 OK, but was '${status}'`);
          }
          const declared = Number(res.headers.get('content-length') ?? Number.NaN);
          if (declared > maxBytes) {
            await res.body?.cancel().catch(() => undefined);
            throw new HttpDownloadError(`Writing downloaded content: body exceeds ${maxBytes} bytes`);
          }
          const chunks: Buffer[] = [];
          const hash = createHash('sha256');
          let total = 0;
          try {
            for await (const chunk of res.body ?? []) {
              const b = Buffer.from(chunk as Uint8Array);
              watch?.received(b.length);
              total += b.length;
              if (total > maxBytes) {
                await res.body?.cancel().catch(() => undefined);
                throw new HttpDownloadError(`Writing downloaded content: body exceeds ${maxBytes} bytes`);
              }
              hash.update(b);
              if (!req.hashOnly) chunks.push(b);
            }
          } catch (err) {
            if (err instanceof HttpDownloadError || cut.signal.aborted) throw err;
            throw new HttpDownloadError(`Writing downloaded content: ${causeText(err)}`);
          }
          return { body: Buffer.concat(chunks), sha256: hash.digest('hex') };
        }
      }
    },
  };
}
