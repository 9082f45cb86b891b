/**
 * A cluster's `kapp-controller-config` `caCerts` and proxy keys for one fetch (reference §1.3).
 * kapp-controller appends `caCerts` to its sidecar's system bundle and sets the proxy variables
 * in the sidecar's environment, so every fetch tool sees them; here they are per run (a function
 * serves many clusters): the tools get a bundle file of this run (`SSL_CERT_FILE` for the Go
 * tools vendir, imgpkg and helm; `GIT_SSL_CAINFO` for git) and the proxy variables, and the
 * fetch stage's own downloads (http sources) get the same trust and proxy
 * (`./http-download.ts`). Nothing of one cluster's configuration reaches another cluster's run.
 *
 * Under an enforced URL policy the cluster's proxy is not used at all (tools: the egress proxy
 * is their only proxy; downloads: direct), since its address is the tenant admin's choice and
 * would be reached without the policy's check; its CA bundle is still used.
 *
 * @module
 */
import { readFile, writeFile } from 'node:fs/promises';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { isIP, type LookupFunction } from 'node:net';
import path from 'node:path';
import { Readable } from 'node:stream';
import { rootCertificates, connect as tlsConnect } from 'node:tls';
import type { ControllerProxy } from '../reconcile/controller-config.js';
import { UrlPolicyError } from './url-policy.js';

/** Where Go looks for the system roots on Linux (`crypto/x509/root_linux.go`), in order. */
export const SYSTEM_CA_FILES: readonly string[] = [
  '/etc/ssl/certs/ca-certificates.crt',
  '/etc/pki/tls/certs/ca-bundle.crt',
  '/etc/ssl/ca-bundle.pem',
  '/etc/pki/tls/cacert.pem',
  '/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem',
  '/etc/ssl/cert.pem',
];

/**
 * The system roots (the first of {@link SYSTEM_CA_FILES} that exists, else Node's bundled
 * Mozilla roots) followed by `caCerts`, as upstream's `ApplyCACerts` appends to the system bundle.
 */
export async function caBundle(caCerts: string): Promise<string> {
  let system: string | undefined;
  for (const f of SYSTEM_CA_FILES) {
    system = await readFile(f, 'utf8').catch(() => undefined);
    if (system) break;
  }
  const base = system ?? rootCertificates.join('\n');
  return `${base.trimEnd()}\n${caCerts.trim()}\n`;
}

/**
 * Writes the run's bundle to `dir/ca-bundle.crt` and returns the variables that make the fetch
 * tools trust it: `SSL_CERT_FILE` (Go replaces its system roots with this file) and
 * `GIT_SSL_CAINFO` (git's curl).
 *
 * @param dir - a scratch directory the tools may read
 */
export async function trustEnv(dir: string, caCerts: string): Promise<Record<string, string>> {
  const file = path.join(dir, 'ca-bundle.crt');
  await writeFile(file, await caBundle(caCerts), { mode: 0o644 });
  return { SSL_CERT_FILE: file, GIT_SSL_CAINFO: file };
}

/**
 * The proxy variables upstream sets in the sidecar (`http_proxy`/`HTTP_PROXY`, the https and
 * no_proxy equivalents), for the keys that are set.
 */
export function proxyEnv(proxy: ControllerProxy | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  const pairs: [string | undefined, string][] = [
    [proxy?.httpProxy, 'http_proxy'],
    [proxy?.httpsProxy, 'https_proxy'],
    [proxy?.noProxy, 'no_proxy'],
  ];
  for (const [v, name] of pairs) {
    if (!v) continue;
    out[name] = v;
    out[name.toUpperCase()] = v;
  }
  return out;
}

/**
 * The proxy (if any) a request to `url` goes through, with Go's `httpproxy` rules: `https_proxy`
 * for https, `http_proxy` for http; none when the host matches `no_proxy` (`*`, an exact host
 * and its subdomains, `.domain` for subdomains only, `host:port`, or a CIDR literal match of an IP)
 * or is `localhost` / a loopback IP (Go never proxies those).
 */
export function proxyFor(url: URL, proxy: ControllerProxy | undefined): URL | undefined {
  const raw = url.protocol === 'https:' ? proxy?.httpsProxy : url.protocol === 'http:' ? proxy?.httpProxy : undefined;
  if (!raw) return undefined;
  const host = url.hostname.replace(/^\[|\]$/g, '').toLowerCase();
  if (host === 'localhost' || /^127\./.test(host) || host === '::1') return undefined;
  const port = url.port || (url.protocol === 'https:' ? '443' : '80');
  for (const entry of (proxy?.noProxy ?? '').split(',')) {
    const e = entry.trim().toLowerCase();
    if (!e) continue;
    if (e === '*') return undefined;
    const [h, p] = e.startsWith('[') ? [e.slice(1, e.indexOf(']')), e.split(']:')[1]] : e.split(':');
    if (p && p !== port) continue;
    // Go: `.example` matches subdomains only; `example` (or `*.example`) the name and subdomains.
    const subOnly = (h ?? '').startsWith('.');
    const name = (h ?? '').replace(/^\*?\./, '');
    if ((!subOnly && host === name) || host.endsWith(`.${name}`)) return undefined;
    if (name.includes('/') && inCidr(host, name)) return undefined;
  }
  try {
    return new URL(raw.includes('://') ? raw : `http://${raw}`);
  } catch {
    return undefined;
  }
}

function inCidr(ip: string, cidr: string): boolean {
  const [base, bits] = cidr.split('/');
  const v4 = (s: string) => {
    const parts = s.split('.').map(Number);
    if (parts.length !== 4 || parts.some((n) => !Number.isInteger(n) || n < 0 || n > 255)) return undefined;
    return parts.reduce((a, n) => a * 256 + n, 0);
  };
  const a = v4(ip);
  const b = v4(base ?? '');
  const n = Number(bits);
  if (a === undefined || b === undefined || !Number.isInteger(n) || n < 0 || n > 32) return false;
  const size = 2 ** (32 - n);
  return Math.floor(a / size) === Math.floor(b / size);
}

/** What {@link trustingFetch} needs: the cluster's CA bundle and proxy, and the URL policy's lookup. */
export interface TrustOptions {
  /** Extra roots (PEM), trusted with the system's. */
  caCerts?: string;
  /** The proxy keys. */
  proxy?: ControllerProxy;
  /**
   * The DNS lookup of each connection, by the URL it connects to (the server's, or the proxy's
   * when one is used): the URL policy's `pinnedLookup` (`./url-policy.ts`) while it is
   * enforced, so the connection goes to an address the policy checked in that same resolution.
   * `undefined` (or a result of `undefined`): the system lookup.
   */
  lookupFor?: (url: URL) => LookupFunction | undefined;
}

/**
 * A `fetch` (`GET` or `HEAD` without a request body; `redirect: 'manual'` semantics: a 3xx is
 * returned as is) over `node:http`/`node:https` that trusts Node's roots plus `caCerts`, goes
 * through the proxy {@link proxyFor} picks (absolute-form requests for http, a `CONNECT` tunnel
 * for https) and resolves each connection's host with `lookupFor` when given. Node's own `fetch`
 * takes none of these without undici's agents, which are not a dependency. A failure rejects
 * with `TypeError('fetch failed')` whose `cause` is the socket or TLS error, as Node's `fetch`
 * does; a {@link UrlPolicyError} from the lookup rejects as is, so callers report the policy's
 * message.
 */
export function trustingFetch(opts: TrustOptions): typeof fetch {
  const ca = opts.caCerts ? [...rootCertificates, opts.caCerts] : undefined;
  return (async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const headers: Record<string, string> = {};
    new Headers(init?.headers).forEach((v, k) => {
      headers[k] = v;
    });
    const signal = init?.signal ?? undefined;
    const method = (init?.method ?? 'GET').toUpperCase();
    if (method !== 'GET' && method !== 'HEAD') throw new TypeError(`trustingFetch: method ${method} is not supported`);
    const via = proxyFor(url, opts.proxy);
    const lookup = opts.lookupFor?.(withoutUserinfo(via ?? url));
    try {
      return await requestOnce(url, { method, headers, via, ca, signal, lookup });
    } catch (err) {
      if (signal?.aborted) throw signal.reason ?? err;
      if (err instanceof UrlPolicyError) throw err;
      throw new TypeError('fetch failed', { cause: err });
    }
  }) as typeof fetch;
}

/** `url` without user and password (a refusal names the URL it judged). */
function withoutUserinfo(url: URL): URL {
  const out = new URL(url.href);
  out.username = '';
  out.password = '';
  return out;
}

/**
 * The TLS name options of a connection to `host`: SNI (`servername`) for a DNS name only (RFC 6066
 * forbids an address there, and Node warns DEP0123); the certificate is checked against `host`
 * either way (Node verifies against `servername`, else `host`).
 */
function tlsName(host: string): { servername?: string } {
  return isIP(host) ? {} : { servername: host };
}

/** One request of {@link trustingFetch}: `lookup` resolves the host it connects to (`via` or `url`'s). */
async function requestOnce(
  url: URL,
  o: {
    method: string;
    headers: Record<string, string>;
    via: URL | undefined;
    ca: string[] | undefined;
    signal: AbortSignal | undefined;
    lookup: LookupFunction | undefined;
  },
): Promise<Response> {
  const { headers, via, ca, signal } = o;
  const https = url.protocol === 'https:';
  const port = Number(url.port || (https ? 443 : 80));
  const host = url.hostname.replace(/^\[|\]$/g, '');
  const proxyAuth =
    via && (via.username || via.password)
      ? `Basic ${Buffer.from(`${decodeURIComponent(via.username)}:${decodeURIComponent(via.password)}`).toString('base64')}`
      : undefined;
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    const common = {
      method: o.method,
      headers: { ...headers, host: url.host },
      signal,
      agent: false as const,
      ...(o.lookup ? { lookup: o.lookup } : {}),
    };
    if (!via) {
      const req = (https ? httpsRequest : httpRequest)(
        { ...common, host, port, path: `${url.pathname}${url.search}`, ...tlsName(host), ...(ca ? { ca } : {}) },
        resolve,
      );
      req.once('error', reject).end();
      return;
    }
    const proxyPort = Number(via.port || 80);
    if (!https) {
      const req = httpRequest(
        {
          ...common,
          host: via.hostname,
          port: proxyPort,
          path: url.href.replace(/^(http:\/\/)[^@/]*@/, '$1'),
          headers: { ...common.headers, ...(proxyAuth ? { 'proxy-authorization': proxyAuth } : {}) },
        },
        resolve,
      );
      req.once('error', reject).end();
      return;
    }
    const connectReq = httpRequest({
      host: via.hostname,
      port: proxyPort,
      method: 'CONNECT',
      path: `${url.host.includes(':') ? url.host : `${url.host}:${port}`}`,
      headers: { host: `${host}:${port}`, ...(proxyAuth ? { 'proxy-authorization': proxyAuth } : {}) },
      signal,
      agent: false,
      ...(o.lookup ? { lookup: o.lookup } : {}),
    });
    connectReq.once('error', reject);
    connectReq.once('connect', (answer, socket) => {
      if (answer.statusCode !== 200) {
        socket.destroy();
        reject(new Error(`proxyconnect tcp: ${answer.statusCode} ${answer.statusMessage ?? ''}`.trim()));
        return;
      }
      const req = httpsRequest(
        {
          ...common,
          // No agent: an agent (even `agent: false`'s fresh one) opens its own connection and
          // ignores `createConnection`, so the request went to the host directly, not the tunnel.
          agent: undefined,
          host,
          port,
          path: `${url.pathname}${url.search}`,
          createConnection: () => tlsConnect({ socket, host, ...tlsName(host), ...(ca ? { ca } : {}) }),
        },
        resolve,
      );
      req.once('error', reject).end();
    });
    connectReq.end();
  });
  const outHeaders = new Headers();
  for (const [k, v] of Object.entries(res.headers)) {
    if (v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [v]) outHeaders.append(k, one);
  }
  const status = res.statusCode ?? 502;
  const nullBody = status === 204 || status === 304 || o.method === 'HEAD';
  if (nullBody) res.resume();
  return new Response(nullBody ? null : (Readable.toWeb(res) as ReadableStream<Uint8Array>), {
    status,
    statusText: res.statusMessage ?? '',
    headers: outHeaders,
  });
}
