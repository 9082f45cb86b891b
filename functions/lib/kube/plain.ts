/**
 * Plain transports under {@link KubeApiClient}: `node:https` with the kubeconfig's client
 * certificate or bearer token, no `@kubernetes/client-node`. For the forwarder, a long-lived
 * process whose resident memory is its cost: client-node's module graph (its generated API
 * classes and models, node-fetch with whatwg-url's Unicode tables, openid-client, ws, tar) is
 * ≈ 14 MB of RSS that a forwarder reading with a ServiceAccount token never uses.
 *
 * A transport speaks one {@link PlainConnection} (`./kubeconfig-auth.ts`: the in-cluster
 * ServiceAccount or a kubeconfig context, and how its credentials become headers): URL building,
 * TLS, an `http://` `proxy-url` (a CONNECT tunnel), requests and watches. Also what the Lambda
 * functions read kubeconfigs with (the operator's file, an App's restricted kubeconfig:
 * `./kubeconfig-plain.ts`), so their bundles carry no client-node either.
 *
 * @module
 */

import http from 'node:http';
import https from 'node:https';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { KubeApiClient } from './client.js';
import {
  KEEP_ALIVE_IDLE_MS,
  KEEP_ALIVE_MAX_SOCKETS,
  parseBody,
  REST_REQUEST_TIMEOUT_MS,
  type RestRequest,
  type RestResponse,
  RestTimeoutError,
  type RestTransport,
  sendRepeatingDrops,
  WatchHttpError,
  type WatchTransport,
} from './http.js';
import { bearerOf, fixedHeadersOf, type PlainConnection } from './kubeconfig-auth.js';
import type { ApiServerInfo } from './port.js';
import { rateLimited } from './rate-limit.js';

/** Shared by the REST and watch transports of one connection: URL building, TLS options, headers. */
class Endpoint {
  readonly #base: URL;
  readonly #bearer: () => Promise<string | undefined>;
  readonly #fixed: Record<string, string | string[]>;
  readonly tls: https.AgentOptions;
  readonly secure: boolean;
  readonly #proxy: URL | undefined;

  constructor(conn: PlainConnection) {
    this.#base = new URL(conn.server);
    this.secure = this.#base.protocol === 'https:';
    this.#bearer = bearerOf(conn);
    this.#fixed = fixedHeadersOf(conn);
    this.#proxy = conn.proxyUrl ? new URL(conn.proxyUrl) : undefined;
    this.tls = {
      ...(conn.ca ? { ca: conn.ca } : {}),
      ...(conn.cert ? { cert: conn.cert } : {}),
      ...(conn.key ? { key: conn.key } : {}),
      ...(conn.insecureSkipTlsVerify ? { rejectUnauthorized: false } : {}),
      ...(conn.tlsServerName ? { servername: conn.tlsServerName } : {}),
    };
  }

  url(apiPath: string, query: Record<string, string | number | boolean | undefined> | undefined): URL {
    const url = new URL(this.#base.href);
    url.pathname = `${this.#base.pathname.replace(/\/$/, '')}${apiPath}`;
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v));
    return url;
  }

  async headers(accept: string): Promise<Record<string, string | string[]>> {
    const token = await this.#bearer();
    return {
      Accept: accept,
      'User-Agent': 'kapp-lambda',
      ...this.#fixed,
      ...(token ? { Authorization: `Bearer ${token}` } : {}),
    };
  }

  /** @param tunnelTimeoutMs - bound of a proxy's answer to `CONNECT` (when the server is behind `proxy-url`). */
  agent(options: http.AgentOptions, tunnelTimeoutMs: number = REST_REQUEST_TIMEOUT_MS): http.Agent {
    if (!this.secure) return new http.Agent(options);
    const agent = new https.Agent({ ...options, ...this.tls });
    if (this.#proxy) tunnelThrough(agent, this.#proxy, tunnelTimeoutMs);
    return agent;
  }

  request(url: URL, options: http.RequestOptions, onResponse: (res: http.IncomingMessage) => void): http.ClientRequest {
    return (this.secure ? https : http).request(url, options, onResponse);
  }
}

/**
 * Makes every connection of `agent` a `CONNECT` tunnel through the http proxy at `proxy`, TLS to
 * the server inside it (what client-go and client-node do for an https server behind `proxy-url`).
 * A proxy silent for `timeoutMs` has its connection closed: the request's own bound rejects the
 * request but cannot reach a socket it was never given, so a proxy that accepts and never
 * answers (an App's `proxy-url` when the URL policy is off) kept one descriptor per request.
 */
function tunnelThrough(agent: https.Agent, proxy: URL, timeoutMs: number): void {
  const auth = proxy.username
    ? {
        'Proxy-Authorization': `Basic ${Buffer.from(`${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`).toString('base64')}`,
      }
    : {};
  const create = (
    options: tls.ConnectionOptions & { host?: string; port?: number },
    done: (error: Error | null, socket?: Duplex) => void,
  ): undefined => {
    const target = `${options.host?.includes(':') ? `[${options.host}]` : options.host}:${options.port ?? 443}`;
    const req = http.request({
      host: proxy.hostname,
      port: proxy.port || 80,
      method: 'CONNECT',
      path: target,
      headers: { Host: target, ...auth },
    });
    req.once('connect', (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        done(new Error(`proxy ${proxy.host} answered ${res.statusCode} to CONNECT ${target}`));
        return;
      }
      done(null, tls.connect({ ...options, socket }));
    });
    req.once('error', (error) => done(error));
    req.setTimeout(timeoutMs, () =>
      req.destroy(new Error(`proxy ${proxy.host} did not answer CONNECT ${target} within ${timeoutMs} ms`)),
    );
    req.end();
    return undefined;
  };
  (agent as unknown as { createConnection: typeof create }).createConnection = create;
}

/**
 * Most bytes of one answer's body a transport to a server an App names keeps: 32 MiB. Such a
 * server (`cluster.kubeconfigSecretRef`) is the tenant's, and the function that reads it serves
 * every tenant of the fleet: without a bound one endless answer fills the instance's memory
 * (400 MiB sent cost 1.2 GiB of heap) and fails the other tenants' records of the batch.
 * Discovery answers are well under 1 MiB; an App's own resources read as the App stay far below.
 */
export const APP_SERVER_MAX_BODY_BYTES = 32 * 1024 * 1024;

/** An answer's body was longer than its transport keeps ({@link PlainRestTransport}'s `maxBodyBytes`). */
export class RestBodyTooLargeError extends Error {
  override readonly name = 'RestBodyTooLargeError';
  /**
   * @param request - the request (method and path are named; query and body never are).
   * @param maxBodyBytes - the bound that was passed.
   */
  constructor(request: Pick<RestRequest, 'method' | 'path'>, maxBodyBytes: number) {
    super(`the API server's answer is longer than ${maxBodyBytes} bytes (${request.method} ${request.path})`);
  }
}

/**
 * {@link RestTransport} over `node:https` with one keep-alive agent
 * ({@link KEEP_ALIVE_MAX_SOCKETS} sockets, {@link KEEP_ALIVE_IDLE_MS} idle), as
 * `ClientNodeRestTransport` behaves: every status resolves, a replay-safe request whose
 * connection dropped is sent again ({@link sendRepeatingDrops}), each request is bounded by
 * `timeoutMs` (its repeats included).
 */
export class PlainRestTransport implements RestTransport {
  readonly #endpoint: Endpoint;
  readonly #agent: http.Agent;
  readonly #timeoutMs: number;
  readonly #maxBodyBytes: number;

  /**
   * @param conn - the API server and credentials.
   * @param timeoutMs - bound of each request; default {@link REST_REQUEST_TIMEOUT_MS}.
   * @param maxBodyBytes - most bytes of one answer's body kept; a longer answer is cut off and
   *   the request rejects with {@link RestBodyTooLargeError}. Default: no bound (the operator's
   *   own API servers); a server an App names gets {@link APP_SERVER_MAX_BODY_BYTES}.
   * @throws TypeError when `conn.server` is not a URL.
   */
  constructor(
    conn: PlainConnection,
    timeoutMs: number = REST_REQUEST_TIMEOUT_MS,
    maxBodyBytes: number = Number.POSITIVE_INFINITY,
  ) {
    this.#endpoint = new Endpoint(conn);
    this.#agent = this.#endpoint.agent(
      {
        keepAlive: true,
        maxSockets: KEEP_ALIVE_MAX_SOCKETS,
        maxFreeSockets: KEEP_ALIVE_MAX_SOCKETS,
        timeout: KEEP_ALIVE_IDLE_MS,
        scheduling: 'lifo',
      },
      timeoutMs,
    );
    this.#timeoutMs = timeoutMs;
    this.#maxBodyBytes = maxBodyBytes;
  }

  /**
   * {@inheritDoc RestTransport.send}
   *
   * A request whose connection dropped (`socket hang up`, an answer cut off: `aborted`) is sent
   * again when that is safe, as {@link sendRepeatingDrops} rules per verb (a read always; a PUT
   * or PATCH carrying its resourceVersion), within what is left of the bound.
   * @throws RestTimeoutError when no complete answer came within the bound (not repeated).
   * @throws RestBodyTooLargeError when the answer's body exceeds the transport's bound.
   * @throws DroppedConnectionError when every attempt of a replay-safe request dropped.
   */
  async send(request: RestRequest): Promise<RestResponse> {
    const deadline = Date.now() + this.#timeoutMs;
    // No attempt starts once the bound has passed, by the clock rather than by a timer (a timer
    // due at the same moment as the backoff's may fire after it on a busy event loop): a hostile
    // server dropping the connection just before the bound gets no request the client gave up on.
    const attempt = () => {
      const leftMs = deadline - Date.now();
      if (leftMs <= 0) return Promise.reject(new RestTimeoutError(request, this.#timeoutMs));
      return this.#exchange(request, leftMs);
    };
    return await sendRepeatingDrops(request, attempt, { signal: AbortSignal.timeout(this.#timeoutMs) });
  }

  /** Closes the kept connections. */
  close(): void {
    this.#agent.destroy();
  }

  /** One attempt, bounded by `leftMs` (what is left of the request's bound). */
  async #exchange(request: RestRequest, leftMs: number): Promise<RestResponse> {
    const body = request.body === undefined ? undefined : JSON.stringify(request.body);
    const headers = await this.#endpoint.headers(request.accept ?? 'application/json');
    if (body !== undefined) {
      headers['Content-Type'] = request.contentType ?? 'application/json';
      headers['Content-Length'] = String(Buffer.byteLength(body));
    }
    return new Promise<RestResponse>((resolve, reject) => {
      // Why this attempt was cut off by us (its bound, its answer's size), if it was: the socket
      // closing then may surface first as the response's `aborted`, which must not read as a
      // drop (and be repeated).
      let ended: Error | undefined;
      const end = (error: Error): void => {
        ended = error;
        req.destroy(error);
      };
      const fail = (error: Error): void => {
        clearTimeout(timer);
        reject(ended ?? error);
      };
      const req = this.#endpoint.request(
        this.#endpoint.url(request.path, request.query),
        { method: request.method, headers, agent: this.#agent },
        (res) => {
          const chunks: Buffer[] = [];
          let size = 0;
          res.on('data', (c: Buffer) => {
            size += c.length;
            if (size > this.#maxBodyBytes) {
              clearTimeout(timer);
              end(new RestBodyTooLargeError(request, this.#maxBodyBytes));
              return;
            }
            chunks.push(c);
          });
          res.on('error', fail);
          res.on('end', () => {
            clearTimeout(timer);
            resolve({ statusCode: res.statusCode ?? 0, body: parseBody(Buffer.concat(chunks).toString('utf8')) });
          });
        },
      );
      const timer = setTimeout(() => end(new RestTimeoutError(request, this.#timeoutMs)), Math.max(0, leftMs));
      req.on('error', fail);
      req.end(body);
    });
  }
}

/**
 * {@link WatchTransport} over `node:https`: one long GET per watch, newline-delimited JSON
 * events. Watches use an agent of their own without keep-alive or a socket limit (a watch holds
 * its connection for its whole life; a forwarder watching per namespace holds many).
 */
export class PlainWatchTransport implements WatchTransport {
  readonly #endpoint: Endpoint;
  readonly #agent: http.Agent;

  /**
   * @param conn - the API server and credentials.
   * @throws TypeError when `conn.server` is not a URL.
   */
  constructor(conn: PlainConnection) {
    this.#endpoint = new Endpoint(conn);
    this.#agent = this.#endpoint.agent({ keepAlive: false });
  }

  /**
   * {@inheritDoc WatchTransport.stream}
   * @throws Error when a line is not JSON (the stream is closed first).
   */
  async stream(
    apiPath: string,
    query: Record<string, string | number | boolean | undefined>,
    onLine: (type: string, object: unknown) => void,
    signal?: AbortSignal,
    accept = 'application/json',
  ): Promise<void> {
    const headers = await this.#endpoint.headers(accept);
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        resolve();
        return;
      }
      let settled = false;
      const finish = (error?: unknown): void => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener('abort', onAbort);
        req.destroy();
        if (error === undefined || signal?.aborted) resolve();
        else reject(error);
      };
      const onAbort = (): void => finish();
      const req = this.#endpoint.request(
        this.#endpoint.url(apiPath, { ...query, watch: true }),
        { method: 'GET', headers, agent: this.#agent },
        (res) => {
          if (res.statusCode !== 200) {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (c: string) => {
              if (text.length < 4096) text += c;
            });
            res.on('end', () => {
              const status = parseBody(text) as { message?: unknown } | string | undefined;
              const message =
                typeof status === 'object' && typeof status?.message === 'string'
                  ? status.message
                  : `watch answered ${res.statusCode}`;
              finish(new WatchHttpError(res.statusCode ?? 0, message));
            });
            return;
          }
          let buffered = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => {
            buffered += chunk;
            let nl = buffered.indexOf('\n');
            while (nl >= 0 && !settled) {
              const line = buffered.slice(0, nl).trim();
              buffered = buffered.slice(nl + 1);
              nl = buffered.indexOf('\n');
              if (line === '') continue;
              try {
                const event = JSON.parse(line) as { type?: unknown; object?: unknown };
                onLine(String(event.type), event.object);
              } catch (error) {
                finish(error ?? new Error('watch handler failed'));
              }
            }
          });
          res.on('end', () => finish());
          res.on('error', (error) => finish(error));
        },
      );
      req.on('error', (error) => finish(error));
      signal?.addEventListener('abort', onAbort, { once: true });
      req.end();
    });
  }
}

/** {@link ApiServerInfo} of a connection (the CA as base64, as a kubeconfig's `certificate-authority-data`). */
export function apiServerInfoOfConnection(conn: PlainConnection): ApiServerInfo {
  return {
    server: conn.server,
    ...(conn.ca ? { caData: Buffer.from(conn.ca).toString('base64') } : {}),
    ...(conn.tlsServerName ? { tlsServerName: conn.tlsServerName } : {}),
    ...(conn.insecureSkipTlsVerify ? { insecureSkipTlsVerify: true } : {}),
  };
}

/**
 * A {@link KubeApiClient} over the plain transports of `conn`.
 *
 * @param clusterId - when given, its requests wait on that cluster's client-side limit
 *   (`./rate-limit.ts`, shared by every client of the id in the process); absent: no limit
 *   (tools and tests that are not a runtime).
 */
export function plainClient(conn: PlainConnection, clusterId?: string): KubeApiClient {
  const transports = { rest: new PlainRestTransport(conn), watch: new PlainWatchTransport(conn) };
  return new KubeApiClient({
    ...(clusterId === undefined ? transports : rateLimited(clusterId, transports)),
    apiServer: apiServerInfoOfConnection(conn),
  });
}
