/**
 * A counting HTTP proxy in front of the local registry: every request that reaches the
 * registry through it is recorded (method, path, when), so a scenario can count the registry
 * requests of a fleet (tag resolutions, manifest and blob fetches) without reading the
 * registry's log. Clients use `proxy.host` in image refs; pushes made straight to the
 * registry's own host are not counted.
 *
 * @module
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

/** One request seen by the proxy. */
export interface RegistryRequest {
  /** `performance.now()` when it arrived, ms. */
  at: number;
  method: string;
  path: string;
}

/** What a registry request is, from its path (Docker Registry HTTP API v2). */
export interface RegistryRequestKind {
  /** `ping` (`/v2/`), `manifest`, `blob`, `tags` or `other`. */
  kind: 'ping' | 'manifest' | 'blob' | 'tags' | 'other';
  /** Repository name inside the registry (`''` for ping and other). */
  repo: string;
  /** For manifests: the tag or digest asked for. */
  reference?: string;
}

/** Classifies a registry request path (query string ignored). */
export function classifyRegistryPath(p: string): RegistryRequestKind {
  const pathname = p.split('?')[0]!;
  if (pathname === '/v2/' || pathname === '/v2') return { kind: 'ping', repo: '' };
  const m = /^\/v2\/(.+)\/(manifests|blobs|tags)\/(.+)$/.exec(pathname);
  if (!m) return { kind: 'other', repo: '' };
  const [, repo, what, ref] = m as unknown as [string, string, string, string];
  if (what === 'manifests') return { kind: 'manifest', repo, reference: ref };
  if (what === 'tags') return { kind: 'tags', repo };
  return { kind: 'blob', repo };
}

/** Counts of one repository's requests. */
export interface RegistryCounts {
  all: number;
  /** Manifest requests by tag (a tag resolution: the source poll's `HEAD`, or a client's first `GET`). */
  manifestByTag: number;
  /** Of those, `HEAD`s. */
  manifestByTagHead: number;
  manifestByDigest: number;
  blobs: number;
  /** `GET /v2/` pings and anything else not tied to a repository are not in `all`. */
}

/**
 * Counts the requests for repository `repo` made in `[from, to]` (ms, `performance.now()`).
 * Pings (`/v2/`) carry no repository and are counted by the caller if wanted.
 */
export function countRegistryRequests(
  requests: readonly RegistryRequest[],
  repo: string,
  from = Number.NEGATIVE_INFINITY,
  to = Number.POSITIVE_INFINITY,
): RegistryCounts {
  const c: RegistryCounts = { all: 0, manifestByTag: 0, manifestByTagHead: 0, manifestByDigest: 0, blobs: 0 };
  for (const r of requests) {
    if (r.at < from || r.at > to) continue;
    const k = classifyRegistryPath(r.path);
    if (k.repo !== repo) continue;
    c.all++;
    if (k.kind === 'blob') c.blobs++;
    if (k.kind === 'manifest') {
      if (k.reference?.startsWith('sha256:')) c.manifestByDigest++;
      else {
        c.manifestByTag++;
        if (r.method === 'HEAD') c.manifestByTagHead++;
      }
    }
  }
  return c;
}

/** A running counting proxy. */
export interface RegistryProxy {
  /** `127.0.0.1:<port>`: use it in image refs instead of the registry's host. */
  host: string;
  /** Every request so far, in arrival order. */
  requests: RegistryRequest[];
  stop(): Promise<void>;
}

/**
 * Starts the proxy on a free loopback port, forwarding every request to `target`
 * (`host:port`, plain HTTP) with its method, path, headers and body, and the answer back.
 * @throws Error when it cannot listen.
 */
export async function startRegistryProxy(target: string): Promise<RegistryProxy> {
  const [hostname, port] = [
    target.slice(0, target.lastIndexOf(':')),
    Number(target.slice(target.lastIndexOf(':') + 1)),
  ];
  const requests: RegistryRequest[] = [];
  const server = http.createServer((req, res) => {
    requests.push({ at: performance.now(), method: req.method ?? 'GET', path: req.url ?? '/' });
    const up = http.request(
      { hostname, port, method: req.method, path: req.url, headers: { ...req.headers, host: target } },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    up.on('error', (e) => {
      if (!res.headersSent) res.writeHead(502);
      res.end(e.message);
    });
    req.pipe(up);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port: own } = server.address() as AddressInfo;
  return {
    host: `127.0.0.1:${own}`,
    requests,
    stop: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
