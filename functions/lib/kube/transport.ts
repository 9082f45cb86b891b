/**
 * HTTP transports under {@link KubeApiClient}: the narrow seam between our client logic
 * (paths, preconditions, retries, error mapping) and `@kubernetes/client-node`, which
 * does configuration, authentication and TLS. Unit tests replace these two interfaces;
 * integration tests use the client-node implementations against a real API server.
 *
 * @module
 */

import { type Configuration, HttpMethod, type KubeConfig, type RequestContext, Watch } from '@kubernetes/client-node';

/** One JSON request to the API server. */
export interface RestRequest {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  /** Absolute API path, e.g. `/api/v1/namespaces/default/secrets/x`. */
  path: string;
  /** Query parameters; `undefined` values are left out. */
  query?: Record<string, string | number | boolean | undefined>;
  /** Serialized as JSON. */
  body?: unknown;
  /** Request `Content-Type`; default `application/json`. */
  contentType?: string;
  /**
   * Request `Accept`; default `application/json`. {@link METADATA_ONLY_ACCEPT} asks the API server
   * for the object's metadata only (a response of any write included).
   */
  accept?: string;
}

/**
 * `Accept` for a response holding only the object's metadata (`PartialObjectMetadata`, as
 * client-go's metadata client asks), with plain JSON as the fallback a server without it
 * answers: for reads and writes that need nothing else of an object that may be large (a
 * PackageRepository holding ~1 MB inline).
 */
export const METADATA_ONLY_ACCEPT = 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json';

/** The raw answer: any status code, body parsed as JSON when it is JSON. */
export interface RestResponse {
  statusCode: number;
  /** Parsed JSON body; the raw text when it is not JSON; `undefined` when empty. */
  body: unknown;
}

/**
 * Sends JSON requests. Resolves for every HTTP status (the caller maps non-2xx);
 * rejects only when no response was received (connection refused, TLS, DNS, …).
 */
export interface RestTransport {
  send(request: RestRequest): Promise<RestResponse>;
}

/** Thrown by {@link WatchTransport.stream} when the watch request is not answered with 200. */
export class WatchHttpError extends Error {
  /** HTTP status code of the refused watch request. */
  readonly statusCode: number;
  constructor(statusCode: number, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'WatchHttpError';
    this.statusCode = statusCode;
  }
}

/** Streams a watch (`?watch=true`) as decoded `{ type, object }` lines. */
export interface WatchTransport {
  /**
   * Opens the watch and calls `onLine` per event line, in order.
   * Resolves when the server closes the stream or `signal` aborts.
   *
   * @throws WatchHttpError when the response status is not 200.
   * @throws Error when `onLine` throws (the stream is closed first) or on a transport error.
   */
  stream(
    path: string,
    query: Record<string, string | number | boolean | undefined>,
    onLine: (type: string, object: unknown) => void,
    signal?: AbortSignal,
  ): Promise<void>;
}

/**
 * Bound of one API request (sending it and reading the whole answer), ms: 120 000. The API
 * server ends a non-watch request itself after its `--request-timeout` (60 s by default), so this
 * only fires when no answer can come (a stalled connection, a server gone mid-request). Without
 * it such a request never settled: the stage waiting on it never ended, and in the embedded
 * runtime its object stayed `Reconciling` with every later event queued behind it.
 */
export const REST_REQUEST_TIMEOUT_MS = 120_000;

/** A request got no (complete) answer within its bound ({@link REST_REQUEST_TIMEOUT_MS}). */
export class RestTimeoutError extends Error {
  override readonly name = 'RestTimeoutError';
  /**
   * @param request - the request (method and path are named; query and body never are).
   * @param timeoutMs - the bound that passed.
   */
  constructor(request: Pick<RestRequest, 'method' | 'path'>, timeoutMs: number) {
    super(`no answer from the API server within ${timeoutMs} ms (${request.method} ${request.path})`);
  }
}

/**
 * {@link RestTransport} over client-node's generated HTTP layer: the same request
 * context, authentication (`KubeConfig.applySecurityAuthentication`: client certs,
 * tokens, exec plugins, CA) and fetch library as client-node's own `*Api` classes, but
 * without their model (de)serialization, so objects stay exactly as the server sent them.
 * Construct it with `kubeConfig.makeApiClient(ClientNodeRestTransport)`.
 */
export class ClientNodeRestTransport implements RestTransport {
  readonly #configuration: Configuration;
  readonly #bearer: (() => Promise<string>) | undefined;
  readonly #timeoutMs: number;

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
   * @throws RestTimeoutError when no complete answer came within the bound (the request itself
   *   is left to end on its own; nothing of it is used).
   */
  async send(request: RestRequest): Promise<RestResponse> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new RestTimeoutError(request, this.#timeoutMs)), this.#timeoutMs);
    });
    try {
      return await Promise.race([this.#exchange(request), deadline]);
    } finally {
      clearTimeout(timer);
    }
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
    if (this.#bearer) context.setHeaderParam('Authorization', `Bearer ${await this.#bearer()}`);
    const response = await config.httpApi.send(context).toPromise();
    const text = await response.body.text();
    return { statusCode: response.httpStatusCode, body: parseBody(text) };
  }
}

/** Parses a JSON body; returns the text when it is not JSON and `undefined` when empty. */
export function parseBody(text: string): unknown {
  if (text === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
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
