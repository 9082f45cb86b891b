/**
 * Plain transports under {@link KubeApiClient}: `node:https` with the kubeconfig's client
 * certificate or bearer token, no `@kubernetes/client-node`. For the forwarder, a long-lived
 * process whose resident memory is its cost: client-node's module graph (its generated API
 * classes and models, node-fetch with whatwg-url's Unicode tables, openid-client, ws, tar) is
 * ≈ 14 MB of RSS that a forwarder reading with a ServiceAccount token never uses.
 *
 * What it serves ({@link plainConnectionOf}): the in-cluster ServiceAccount (client-go's
 * `rest.InClusterConfig`: `KUBERNETES_SERVICE_HOST`/`_PORT`, the mounted token re-read as it
 * rotates, the mounted CA) and kubeconfig users with a client certificate and key, a `token` or
 * a `tokenFile`, an `exec` credential plugin's token (EKS, GKE), basic auth (`username` and
 * `password`), impersonation (`as`, `as-groups`, `as-user-extra`), or an `auth-provider`'s stored
 * token (`id-token` of `oidc`, `access-token` of the others; never refreshed), through an
 * `http://` `proxy-url` (CONNECT). Other proxies are reported as unsupported. Also what the Lambda functions read kubeconfigs with (the operator's
 * file, an App's restricted kubeconfig: `./kubeconfig-plain.ts`), so their bundles carry no
 * client-node either.
 *
 * @module
 */

import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
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
import type { ApiServerInfo } from './port.js';

/** How to reach and authenticate to one API server (the subset of a kubeconfig {@link PlainRestTransport} speaks). */
export interface PlainConnection {
  /** `https://host:port[/prefix]` (or `http://` for a local insecure server). */
  server: string;
  /** PEM CA bundle; Node's default CAs when absent. */
  ca?: string;
  /** PEM client certificate (with {@link key}). */
  cert?: string;
  /** PEM client key. */
  key?: string;
  /** Static bearer token. */
  token?: string;
  /** File holding the bearer token, re-read at most every {@link TOKEN_FILE_REFRESH_MS} (a projected token rotates). */
  tokenFile?: string;
  /** Exec credential plugin giving the bearer token, run again as its token expires. */
  exec?: ExecPlugin;
  /**
   * Bearer token asked for per request (per watch for a watch), so a short-lived token is
   * replaced as it expires (the fleet registry's EKS and ServiceAccount tokens); wins over the
   * other token sources.
   */
  bearer?: () => Promise<string>;
  /** `insecure-skip-tls-verify`. */
  insecureSkipTlsVerify?: boolean;
  /** `tls-server-name`: the name the server's certificate is checked against. */
  tlsServerName?: string;
  /** Basic auth (`username`/`password`), sent when no bearer token is. */
  basic?: { username: string; password: string };
  /**
   * `proxy-url` of an `http://` proxy: every connection to the (https) server is a `CONNECT`
   * tunnel through it (the functions' egress proxy in cloud mode, as kapp is given it).
   */
  proxyUrl?: string;
  /** Impersonation (`as`, `as-groups`, `as-user-extra`): client-go's `Impersonate-*` headers. */
  impersonate?: { user?: string; groups?: string[]; extra?: Record<string, string[]> };
}

/** A token file is read again after this long, ms: 60 000 (client-go's `cachingTokenSource` period). */
export const TOKEN_FILE_REFRESH_MS = 60_000;

/** The in-cluster ServiceAccount mount. */
export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/**
 * A kubeconfig `exec` credential plugin (client.authentication.k8s.io): the command run for an
 * `ExecCredential` whose `status.token` is the bearer token (an EKS or GKE kubeconfig).
 */
export interface ExecPlugin {
  command: string;
  args: string[];
  /** Added to the process's environment. */
  env: Record<string, string>;
  /** The `apiVersion` of the `ExecCredential` the plugin is asked for. */
  apiVersion: string;
}

/** A token from an exec plugin without an expiry is asked for again after this long, ms: 10 minutes. */
export const EXEC_TOKEN_DEFAULT_LIFE_MS = 10 * 60_000;

/** Runs an {@link ExecPlugin}; the token and when to ask again (a minute before its expiry). */
async function runExecPlugin(plugin: ExecPlugin): Promise<{ token: string; renewAt: number }> {
  const { execFile } = await import('node:child_process');
  const stdout = await new Promise<string>((resolve, reject) => {
    execFile(
      plugin.command,
      plugin.args,
      {
        env: {
          ...process.env,
          ...plugin.env,
          KUBERNETES_EXEC_INFO: JSON.stringify({
            apiVersion: plugin.apiVersion,
            kind: 'ExecCredential',
            spec: { interactive: false },
          }),
        },
        timeout: 60_000,
        maxBuffer: 1 << 20,
      },
      (error, out) =>
        error ? reject(new Error(`kubeconfig exec plugin ${plugin.command} failed`, { cause: error })) : resolve(out),
    );
  });
  let status: { token?: unknown; expirationTimestamp?: unknown } | undefined;
  try {
    status = (JSON.parse(stdout) as { status?: typeof status }).status;
  } catch {
    throw new Error(`kubeconfig exec plugin ${plugin.command}: output is not an ExecCredential`);
  }
  if (typeof status?.token !== 'string' || status.token === '') {
    throw new Error(`kubeconfig exec plugin ${plugin.command}: ExecCredential without status.token`);
  }
  const expires = typeof status.expirationTimestamp === 'string' ? Date.parse(status.expirationTimestamp) : Number.NaN;
  return {
    token: status.token,
    renewAt: Number.isNaN(expires) ? Date.now() + EXEC_TOKEN_DEFAULT_LIFE_MS : expires - 60_000,
  };
}

/** `Authorization` header value source of a connection: static, from a file, from an exec plugin, or none. */
function bearerOf(conn: PlainConnection): () => Promise<string | undefined> {
  if (conn.bearer) return conn.bearer;
  if (conn.token) {
    const token = conn.token;
    return async () => token;
  }
  const plugin = conn.exec;
  if (plugin) {
    let cached: Promise<{ token: string; renewAt: number }> | undefined;
    return async () => {
      const current = cached ? await cached.catch(() => undefined) : undefined;
      if (!current || Date.now() >= current.renewAt) {
        cached = runExecPlugin(plugin);
        return (await cached).token;
      }
      return current.token;
    };
  }
  const file = conn.tokenFile;
  if (!file) return async () => undefined;
  let cached: { token: string; readAt: number } | undefined;
  return async () => {
    const now = Date.now();
    if (!cached || now - cached.readAt >= TOKEN_FILE_REFRESH_MS) {
      cached = { token: readFileSync(file, 'utf8').trim(), readAt: now };
    }
    return cached.token;
  };
}

/** Headers of a connection that never change: basic auth (a bearer token replaces it) and impersonation. */
function fixedHeadersOf(conn: PlainConnection): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  if (conn.basic) {
    out.Authorization = `Basic ${Buffer.from(`${conn.basic.username}:${conn.basic.password}`).toString('base64')}`;
  }
  const imp = conn.impersonate;
  if (imp?.user) out['Impersonate-User'] = imp.user;
  if (imp?.groups?.length) out['Impersonate-Group'] = imp.groups;
  for (const [k, v] of Object.entries(imp?.extra ?? {})) out[`Impersonate-Extra-${encodeURIComponent(k)}`] = v;
  return out;
}

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
    return await sendRepeatingDrops(request, () => this.#exchange(request, deadline - Date.now()));
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
  ): Promise<void> {
    const headers = await this.#endpoint.headers('application/json');
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

/** A {@link KubeApiClient} over the plain transports of `conn`. */
export function plainClient(conn: PlainConnection): KubeApiClient {
  return new KubeApiClient({
    rest: new PlainRestTransport(conn),
    watch: new PlainWatchTransport(conn),
    apiServer: apiServerInfoOfConnection(conn),
  });
}

/**
 * The in-cluster connection (client-go's `InClusterConfig`): `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`,
 * the ServiceAccount token file (re-read as it rotates) and CA of {@link SERVICE_ACCOUNT_DIR}.
 *
 * @throws Error when the variables are unset or the CA cannot be read (not running in a Pod).
 */
export function inClusterConnection(
  env: NodeJS.ProcessEnv = process.env,
  dir: string = SERVICE_ACCOUNT_DIR,
): PlainConnection {
  const host = env.KUBERNETES_SERVICE_HOST?.trim();
  const port = env.KUBERNETES_SERVICE_PORT?.trim();
  if (!host || !port)
    throw new Error('not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset');
  const tokenFile = path.join(dir, 'token');
  readFileSync(tokenFile); // fail at start, not on the first request
  return {
    server: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    ca: readFileSync(path.join(dir, 'ca.crt'), 'utf8'),
    tokenFile,
  };
}

/** A kubeconfig document or one of its mappings. */
export type Yaml = Record<string, unknown>;
const obj = (x: unknown): Yaml => (x !== null && typeof x === 'object' && !Array.isArray(x) ? (x as Yaml) : {});
const str = (x: unknown): string | undefined => (typeof x === 'string' && x !== '' ? x : undefined);

/** The named entry of a kubeconfig list (`clusters`, `users`, `contexts`): its `field` mapping (`cluster`, ...). */
export function named(doc: Yaml, list: string, name: string | undefined, field: string): Yaml | undefined {
  const entries = doc[list];
  if (!Array.isArray(entries) || name === undefined) return undefined;
  const hit = entries.map(obj).find((e) => e.name === name);
  return hit ? obj(hit[field]) : undefined;
}

/** What {@link plainConnectionOf} decided for a kubeconfig context. */
export type PlainConnectionResult = { connection: PlainConnection } | { unsupported: string };

/** Where a kubeconfig document came from, for {@link plainConnectionOfDocument}. */
export interface KubeconfigOrigin {
  /** Prefix of every error, naming the kubeconfig (e.g. `loading kubeconfig <path>`); never its contents. */
  what: string;
  /** The context; default the document's `current-context`. */
  context?: string;
  /**
   * Folder relative file paths and exec commands are resolved against (the kubeconfig's, as
   * client-go does). Absent for a kubeconfig that is not a file (an App's): then a file path or
   * an exec plugin is reported as unsupported, never read or run.
   */
  dir?: string;
}

/**
 * Parses a kubeconfig's text (YAML or JSON) into its document.
 *
 * @throws Error `<what>: not a valid kubeconfig` (the parser's error is not attached: it may
 *   quote the text, which holds credentials).
 */
export function parseKubeconfigText(text: string, what: string, parse: (text: string) => unknown): Yaml {
  let doc: unknown;
  try {
    doc = parse(text);
  } catch {
    throw new Error(`${what}: not a valid kubeconfig`);
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new Error(`${what}: not a valid kubeconfig`);
  return doc as Yaml;
}

/**
 * The text of a kubeconfig file, with the `what` its errors start with.
 *
 * @throws Error `loading kubeconfig <path>` when the file cannot be read (the fs error as `cause`).
 */
export function readKubeconfigText(kubeconfigPath: string): { text: string; what: string } {
  const what = `loading kubeconfig ${kubeconfigPath}`;
  try {
    return { text: readFileSync(kubeconfigPath, 'utf8'), what };
  } catch (cause) {
    throw new Error(what, { cause });
  }
}

/**
 * The plain connection of a kubeconfig file's context, or why there is none (a feature only
 * client-node implements): {@link plainConnectionOfDocument} of the file, relative paths against
 * its folder.
 *
 * @param kubeconfigPath - the kubeconfig file (YAML or JSON).
 * @param context - the context; default the file's `current-context`.
 * @throws Error `loading kubeconfig <path>` when the file cannot be read (the fs error as cause)
 *   or is not a kubeconfig, or what {@link plainConnectionOfDocument} throws.
 */
export async function plainConnectionOf(kubeconfigPath: string, context?: string): Promise<PlainConnectionResult> {
  const { text, what } = readKubeconfigText(kubeconfigPath);
  // Only here, so the in-cluster path never loads a YAML parser.
  const { parse } = await import('yaml');
  return plainConnectionOfDocument(parseKubeconfigText(text, what, parse), {
    what,
    ...(context === undefined ? {} : { context }),
    dir: path.dirname(kubeconfigPath),
  });
}

/** The bearer token an `auth-provider` stored (client-go's oidc `id-token`, gcp/azure `access-token`). */
function authProviderToken(provider: Yaml): PlainConnectionResult | string {
  const field = str(provider.name) === 'oidc' ? 'id-token' : 'access-token';
  const token = str(obj(provider.config)[field]);
  return token ?? { unsupported: `user auth-provider without config ${field}` };
}

/**
 * The plain connection of a context of a parsed kubeconfig, or why there is none:
 * `cluster proxy-url`, a file path or exec plugin without {@link KubeconfigOrigin.dir}, an
 * `auth-provider` without its stored token (the name of the missing field only).
 *
 * @throws Error `<what>: no context "<name>"` / `<what>: context "<name>" has no cluster`, or
 *   `reading <field> <file> of context "<name>"` (the fs error as cause): names and paths only,
 *   never contents.
 */
export function plainConnectionOfDocument(doc: Yaml, origin: KubeconfigOrigin): PlainConnectionResult {
  const { what, dir } = origin;
  const name = origin.context ?? str(doc['current-context']);
  const ctx = named(doc, 'contexts', name, 'context');
  if (!ctx) throw new Error(`${what}: no context ${JSON.stringify(name ?? '')}`);
  const cluster = named(doc, 'clusters', str(ctx.cluster), 'cluster');
  const server = str(cluster?.server);
  if (!cluster || !server) {
    throw new Error(`${what}: context ${JSON.stringify(name)} has no cluster`);
  }
  const user = named(doc, 'users', str(ctx.user), 'user') ?? {};
  const proxyUrl = str(cluster['proxy-url']);
  if (cluster['proxy-url'] !== undefined && !(proxyUrl?.startsWith('http://') && server.startsWith('https://'))) {
    return { unsupported: 'cluster proxy-url other than an http:// proxy to an https server' };
  }
  if (dir === undefined) {
    const files: [Yaml, string, string][] = [
      [cluster, 'certificate-authority', 'cluster'],
      [user, 'client-certificate', 'user'],
      [user, 'client-key', 'user'],
      [user, 'tokenFile', 'user'],
      [user, 'exec', 'user'],
    ];
    const hit = files.find(([o, f]) => o[f] !== undefined);
    if (hit) return { unsupported: `${hit[2]} ${hit[1]}` };
  }
  const base = dir ?? '.';
  const execConf = user.exec === undefined ? undefined : obj(user.exec);
  const execCommand = str(execConf?.command);
  if (execConf && !execCommand) return { unsupported: 'user exec without a command' };
  const pem = (data: unknown, file: unknown, field: string): string | undefined => {
    const d = str(data);
    if (d) return Buffer.from(d, 'base64').toString('utf8');
    const f = str(file);
    if (!f) return undefined;
    const resolved = path.resolve(base, f);
    try {
      return readFileSync(resolved, 'utf8');
    } catch (cause) {
      throw new Error(`reading ${field} ${resolved} of context ${JSON.stringify(name)}`, { cause });
    }
  };
  let token = str(user.token);
  if (!token && user['auth-provider'] !== undefined) {
    const stored = authProviderToken(obj(user['auth-provider']));
    if (typeof stored !== 'string') return stored;
    token = stored;
  }
  const ca = pem(cluster['certificate-authority-data'], cluster['certificate-authority'], 'certificate-authority');
  const cert = pem(user['client-certificate-data'], user['client-certificate'], 'client-certificate');
  const key = pem(user['client-key-data'], user['client-key'], 'client-key');
  const tokenFile = str(user.tokenFile);
  const tlsServerName = str(cluster['tls-server-name']);
  const username = str(user.username);
  const groups = Array.isArray(user['as-groups']) ? user['as-groups'].map(String) : [];
  const extra = Object.fromEntries(
    Object.entries(obj(user['as-user-extra'])).map(([k, v]) => [k, Array.isArray(v) ? v.map(String) : []]),
  );
  const impersonate = {
    ...(str(user.as) ? { user: str(user.as) } : {}),
    ...(groups.length ? { groups } : {}),
    ...(Object.keys(extra).length ? { extra } : {}),
  };
  return {
    connection: {
      server,
      ...(ca ? { ca } : {}),
      ...(cert ? { cert } : {}),
      ...(key ? { key } : {}),
      ...(token ? { token } : tokenFile ? { tokenFile: path.resolve(base, tokenFile) } : {}),
      ...(execConf && execCommand && !token && !tokenFile
        ? {
            exec: {
              // client-go: a command with a path separator is relative to the kubeconfig's folder
              command: execCommand.includes('/') ? path.resolve(base, execCommand) : execCommand,
              args: Array.isArray(execConf.args) ? execConf.args.map(String) : [],
              env: Object.fromEntries(
                (Array.isArray(execConf.env) ? execConf.env : [])
                  .map(obj)
                  .filter((e) => typeof e.name === 'string')
                  .map((e) => [String(e.name), String(e.value ?? '')]),
              ),
              apiVersion: str(execConf.apiVersion) ?? 'client.authentication.k8s.io/v1beta1',
            },
          }
        : {}),
      ...(username ? { basic: { username, password: typeof user.password === 'string' ? user.password : '' } } : {}),
      ...(Object.keys(impersonate).length ? { impersonate } : {}),
      ...(proxyUrl ? { proxyUrl } : {}),
      ...(cluster['insecure-skip-tls-verify'] === true ? { insecureSkipTlsVerify: true } : {}),
      ...(tlsServerName ? { tlsServerName } : {}),
    },
  };
}
