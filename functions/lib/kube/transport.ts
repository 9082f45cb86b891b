/**
 * HTTP transports under {@link KubeApiClient}: the narrow seam between our client logic
 * (paths, preconditions, retries, error mapping) and `@kubernetes/client-node`, which
 * does configuration, authentication and TLS. Unit tests replace these two interfaces;
 * integration tests use the client-node implementations against a real API server.
 *
 * @module
 */

import { createHash } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import { type Configuration, HttpMethod, type KubeConfig, type RequestContext, Watch } from '@kubernetes/client-node';
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

export * from './http.js';

/** The TLS material of an agent: what makes two agents interchangeable. */
const TLS_OPTION_KEYS = ['ca', 'cert', 'key', 'pfx', 'passphrase', 'rejectUnauthorized', 'servername'] as const;

/** Digest of the TLS material in `options` (kept in memory only: it covers a private key). */
function tlsDigest(options: Record<string, unknown>): string {
  const hash = createHash('sha256');
  for (const key of TLS_OPTION_KEYS) {
    const value = options[key];
    const text = Buffer.isBuffer(value) ? value.toString('base64') : JSON.stringify(value ?? null);
    hash.update(`${key}\u0000${text}\u0000`);
  }
  return hash.digest('hex');
}

/**
 * One keep-alive agent per API server and identity, in place of the agent client-node makes per
 * request. `KubeConfig.applySecurityAuthentication` builds a new `https.Agent` (keep-alive off)
 * for every request, so each request paid a TCP and TLS handshake (32 ms against 3.8 ms over a
 * kept connection, measured on the 2-core machine). This keeps the first agent's TLS material
 * and serves every later request whose material is the same from one agent with keep-alive on,
 * at most {@link KEEP_ALIVE_MAX_SOCKETS} sockets and {@link KEEP_ALIVE_IDLE_MS} of idle time per
 * socket; when the material changes (a rotated client certificate) the old agent is destroyed
 * and a new one made. Agents of another kind (client-node's proxy agents for a kubeconfig
 * `proxy-url`) are left as client-node made them.
 */
export class KeepAliveAgents {
  #current: { digest: string; agent: http.Agent } | undefined;

  /**
   * The agent to send a request with, given the one client-node made for it.
   *
   * @param made - the agent `applySecurityAuthentication` set on the request context.
   * @returns the kept agent for `made`'s TLS material, or `made` itself when it is not a plain
   *   `https.Agent` / `http.Agent` (or is absent).
   */
  agentFor(made: unknown): unknown {
    if (!(made instanceof http.Agent)) return made;
    const plainHttps = made.constructor === https.Agent;
    if (!plainHttps && made.constructor !== http.Agent) return made;
    const options = (made as http.Agent & { options: Record<string, unknown> }).options;
    const digest = tlsDigest(options);
    if (this.#current?.digest === digest) return this.#current.agent;
    this.#current?.agent.destroy();
    const kept: https.AgentOptions = {
      keepAlive: true,
      maxSockets: KEEP_ALIVE_MAX_SOCKETS,
      maxFreeSockets: KEEP_ALIVE_MAX_SOCKETS,
      timeout: KEEP_ALIVE_IDLE_MS,
      scheduling: 'lifo',
    };
    for (const key of TLS_OPTION_KEYS) if (options[key] !== undefined) Object.assign(kept, { [key]: options[key] });
    const agent = plainHttps ? new https.Agent(kept) : new http.Agent(kept);
    this.#current = { digest, agent };
    return agent;
  }

  /** Closes every connection of the kept agent (idle ones at once, busy ones as they end). */
  close(): void {
    this.#current?.agent.destroy();
    this.#current = undefined;
  }
}

/**
 * {@link RestTransport} over client-node's generated HTTP layer: the same request
 * context, authentication (`KubeConfig.applySecurityAuthentication`: client certs,
 * tokens, exec plugins, CA) and fetch library as client-node's own `*Api` classes, but
 * without their model (de)serialization, so objects stay exactly as the server sent them,
 * and over one keep-alive connection pool per instance ({@link KeepAliveAgents}) instead of a
 * new connection per request. Construct it with `kubeConfig.makeApiClient(ClientNodeRestTransport)`
 * once per cluster and identity, and keep it.
 */
export class ClientNodeRestTransport implements RestTransport {
  readonly #configuration: Configuration;
  readonly #bearer: (() => Promise<string>) | undefined;
  readonly #timeoutMs: number;
  readonly #agents = new KeepAliveAgents();

  /**
   * @param configuration as passed by `KubeConfig.makeApiClient`.
   * @param bearer - when given, each request's `Authorization: Bearer <token>` comes from it
   *   (asked per request, so a short-lived token is replaced as it expires; the cluster
   *   registry's tokens), after the kubeconfig's own authentication.
   * @param timeoutMs - bound of each request; default {@link REST_REQUEST_TIMEOUT_MS}.
   */
  constructor(
    configuration: Configuration,
    bearer?: () => Promise<string>,
    timeoutMs: number = REST_REQUEST_TIMEOUT_MS,
  ) {
    this.#configuration = configuration;
    this.#bearer = bearer;
    this.#timeoutMs = timeoutMs;
  }

  /**
   * {@inheritDoc RestTransport.send}
   *
   * A request whose connection dropped (a kept connection the server closed while idle, an
   * answer cut off: node-fetch's `Premature close`) is sent again when that is safe, as
   * {@link sendRepeatingDrops} rules per verb (a read always; a PUT or PATCH carrying its
   * resourceVersion), within the same bound.
   * @throws RestTimeoutError when no complete answer came within the bound (the request itself
   *   is left to end on its own; nothing of it is used, and it is not repeated).
   * @throws DroppedConnectionError when every attempt of a replay-safe request dropped.
   */
  async send(request: RestRequest): Promise<RestResponse> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const expired = new AbortController();
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        expired.abort();
        reject(new RestTimeoutError(request, this.#timeoutMs));
      }, this.#timeoutMs);
    });
    try {
      return await Promise.race([
        sendRepeatingDrops(request, () => this.#exchange(request), { signal: expired.signal }),
        deadline,
      ]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Closes the kept connections (a transport dropped from a cache; idle sockets would else linger until their idle bound). */
  close(): void {
    this.#agents.close();
  }

  async #exchange(request: RestRequest): Promise<RestResponse> {
    const config = this.#configuration;
    const context: RequestContext = config.baseServer.makeRequestContext(request.path, HttpMethod[request.method]);
    for (const [key, value] of Object.entries(request.query ?? {})) {
      if (value !== undefined) context.setQueryParam(key, String(value));
    }
    context.setHeaderParam('Accept', request.accept ?? 'application/json');
    if (request.body !== undefined) {
      context.setHeaderParam('Content-Type', request.contentType ?? 'application/json');
      context.setBody(JSON.stringify(request.body));
    }
    await config.authMethods.default?.applySecurityAuthentication(context);
    context.setAgent(this.#agents.agentFor(context.getAgent()) as http.Agent);
    if (this.#bearer) context.setHeaderParam('Authorization', `Bearer ${await this.#bearer()}`);
    const response = await config.httpApi.send(context).toPromise();
    const text = await response.body.text();
    return { statusCode: response.httpStatusCode, body: parseBody(text) };
  }
}

/**
 * {@link WatchTransport} over client-node's `Watch` (newline-delimited JSON over one
 * long GET). `Watch` reports a non-200 answer as an error carrying `statusCode` only.
 */
export class ClientNodeWatchTransport implements WatchTransport {
  readonly #watch: Watch;

  /** @param kubeConfig a KubeConfig whose current context is the cluster to watch. */
  constructor(kubeConfig: KubeConfig) {
    this.#watch = new Watch(kubeConfig);
  }

  /** {@inheritDoc WatchTransport.stream} */
  stream(
    path: string,
    query: Record<string, string | number | boolean | undefined>,
    onLine: (type: string, object: unknown) => void,
    signal?: AbortSignal,
  ): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        resolve();
        return;
      }
      let controller: AbortController | undefined;
      let settled = false;
      const finish = (error?: unknown): void => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener('abort', onAbort);
        controller?.abort();
        if (error === undefined || signal?.aborted) resolve();
        else reject(error);
      };
      const onAbort = (): void => finish();
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#watch
        .watch(
          path,
          query,
          (type: string, object: unknown) => {
            if (settled) return;
            try {
              onLine(type, object);
            } catch (error) {
              finish(error ?? new Error('watch handler failed'));
            }
          },
          (error: unknown) => finish(toWatchError(error)),
        )
        .then(
          (c) => {
            controller = c;
            if (settled) c.abort();
          },
          (error: unknown) => finish(toWatchError(error) ?? error),
        );
    });
  }
}

function toWatchError(error: unknown): unknown {
  if (error === null || error === undefined) return undefined;
  const statusCode = (error as { statusCode?: unknown }).statusCode;
  if (typeof statusCode === 'number') {
    return new WatchHttpError(statusCode, (error as Error).message ?? String(statusCode), {
      cause: error,
    });
  }
  return error;
}
