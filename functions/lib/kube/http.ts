/**
 * The HTTP port under {@link KubeApiClient}: the request and response shapes, the two transport
 * interfaces, their errors and bounds. Kept apart from `./transport.ts` (the
 * `@kubernetes/client-node` implementations) so a module that only needs the port, the
 * forwarder's plain transport (`./plain.ts`) above all, does not load client-node's module
 * graph (≈ 14 MB of RSS).
 *
 * @module
 */

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

/**
 * `Accept` for a list of metadata only (`PartialObjectMetadataList`), JSON as the fallback: the
 * forwarder's drift lists of every object an App deployed, whose bodies it never needs.
 */
export const METADATA_LIST_ACCEPT = 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json';

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
   * @param accept - Request `Accept` ({@link METADATA_ONLY_ACCEPT} for metadata-only events);
   *   default `application/json`. A transport that cannot set it sends whole objects.
   */
  stream(
    path: string,
    query: Record<string, string | number | boolean | undefined>,
    onLine: (type: string, object: unknown) => void,
    signal?: AbortSignal,
    accept?: string,
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
 * Sockets one keep-alive agent holds open to its API server at most (in use and idle alike):
 * 16. Requests beyond it wait in the agent's queue for a free socket, so a burst of stages never
 * opens more connections than this per cluster and identity.
 */
export const KEEP_ALIVE_MAX_SOCKETS = 16;

/**
 * How long an idle kept-alive connection stays open, ms: 30 000, below the API server's own
 * idle limit for HTTP/1.1 connections (90 s), so the client closes first and a request never
 * goes out on a connection the server is closing.
 */
export const KEEP_ALIVE_IDLE_MS = 30_000;

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
 * Error codes of a connection dropped before the whole answer came; nothing else counts (an
 * answer with any status resolves, never rejects, and has its own handling above the
 * transport):
 * - `ECONNRESET`: node:http's `socket hang up` (closed before the answer) and `aborted` (closed
 *   in the middle of it), or a TCP reset;
 * - `EPIPE`: the request was written to a socket the server had already closed;
 * - `ERR_STREAM_PREMATURE_CLOSE`: `Premature close`, node-fetch's (client-node's fetch) and
 *   node's streams' word for a chunked answer cut off;
 * - `UND_ERR_SOCKET`, `UND_ERR_CLOSED`: undici's (Node's `fetch`) socket closed under a request.
 *
 * A refused connection (`ECONNREFUSED`), a TLS or DNS failure and a request timeout are not
 * drops: the first two do not pass in milliseconds, the last has already used the bound.
 */
export const DROPPED_CONNECTION_CODES: ReadonlySet<string> = new Set([
  'ECONNRESET',
  'EPIPE',
  'ERR_STREAM_PREMATURE_CLOSE',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
]);

/**
 * Whether `error` (or an error in its `cause` chain, five deep at most: node-fetch and undici
 * wrap the socket's error) is a dropped connection: its `code` is one of
 * {@link DROPPED_CONNECTION_CODES}. An error carrying a numeric `statusCode` is an answer, never a
 * drop. Pure.
 */
export function isDroppedConnection(error: unknown): boolean {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current !== null && typeof current === 'object'; depth++) {
    const { code, statusCode, cause } = current as { code?: unknown; statusCode?: unknown; cause?: unknown };
    if (typeof statusCode === 'number') return false;
    if (typeof code === 'string' && DROPPED_CONNECTION_CODES.has(code)) return true;
    current = cause;
  }
  return false;
}

/**
 * Whether sending `request` again after its connection dropped is safe, i.e. cannot apply a
 * change twice or apply a stale one. The first attempt may have reached the API server and been
 * applied with its answer lost, so the rule per verb is:
 * - `GET` (a read, a list): always; reading twice changes nothing.
 * - `PUT` and `PATCH` with a non-empty `metadata.resourceVersion` in the body (status writes,
 *   finalizer changes, Lease renewals, Event count bumps): yes. The resourceVersion is an
 *   optimistic-concurrency precondition: if the first attempt was applied the object's version
 *   has moved, so the replay is refused with 409 and nothing is written twice; the caller's
 *   usual 409 handling (re-read, re-plan) then finds its own change in place.
 * - `PUT` or `PATCH` without one, or with `"0"` (which the API server reads as no precondition):
 *   no (an unconditional write replayed late may overwrite a newer change; a JSON patch's `add`
 *   to a list would append twice).
 * - `POST`: no (a create replayed is `AlreadyExists`, reported as a conflict or as "existed
 *   before" although this client made it; a TokenRequest would mint a second token).
 * - `DELETE`: no (a replay answers 404 for what this client just deleted: "was already gone").
 *
 * Broader than client-go, whose `rest.Request` retries only `GET` on a reset or an EOF
 * (`IsConnectionReset`/`IsProbableEOF`, "We are not automatically retrying write operations, as
 * they are not idempotent") and leaves a failed write to the controller's requeue: here a failed
 * write becomes the object's `ReconcileFailed` status, and the resourceVersion makes these
 * writes idempotent. Pure.
 */
export function isReplaySafe(request: Pick<RestRequest, 'method' | 'body'>): boolean {
  if (request.method === 'GET') return true;
  if (request.method !== 'PUT' && request.method !== 'PATCH') return false;
  const metadata = (request.body as { metadata?: { resourceVersion?: unknown } } | undefined)?.metadata;
  const rv = metadata?.resourceVersion;
  return typeof rv === 'string' && rv !== '' && rv !== '0';
}

/** Attempts of a {@link isReplaySafe} request whose connection keeps dropping: 3 (the first and two more). */
export const DROPPED_CONNECTION_ATTEMPTS = 3;

/**
 * Backoff before the first repeat of a dropped request, ms: 100, doubled before each later one,
 * each drawn between half and all of it (jitter, so requests dropped together do not return
 * together): 50–100 ms, then 100–200 ms.
 */
export const DROPPED_CONNECTION_BACKOFF_MS = 100;

/** A replay-safe request's connection dropped on every one of its attempts. */
export class DroppedConnectionError extends Error {
  override readonly name = 'DroppedConnectionError';
  /**
   * @param request - the request (method and path are named; query and body never are).
   * @param attempts - how many times it was sent.
   * @param cause - the last attempt's error.
   */
  constructor(request: Pick<RestRequest, 'method' | 'path'>, attempts: number, cause: unknown) {
    const reason = cause instanceof Error ? cause.message : String(cause);
    super(`the API server dropped the connection ${attempts} times (${request.method} ${request.path}): ${reason}`, {
      cause,
    });
  }
}

/** Options of {@link sendRepeatingDrops}; tests fix the waits. */
export interface RepeatOptions {
  /** Stops repeating (the last error rejects) once aborted: the request's bound has passed. */
  signal?: AbortSignal;
  /** Attempts at most; default {@link DROPPED_CONNECTION_ATTEMPTS}. */
  attempts?: number;
  /** Waits `ms`; default a timer. */
  sleep?: (ms: number) => Promise<void>;
  /** Uniform in [0, 1); default `Math.random`. */
  random?: () => number;
}

/**
 * Runs `exchange` (one attempt of `request`) and, when its connection dropped
 * ({@link isDroppedConnection}) and the request is {@link isReplaySafe}, runs it again after a
 * short jittered backoff ({@link DROPPED_CONNECTION_BACKOFF_MS}), {@link DROPPED_CONNECTION_ATTEMPTS}
 * attempts at most. A 429 or 5xx answer resolves and is returned as it is: no status is
 * repeated here, so this never doubles a caller's own status handling.
 *
 * @throws DroppedConnectionError when every attempt dropped (the last drop as `cause`).
 * @throws the attempt's own error when it is not a drop, the request is not replay-safe, or
 *   `options.signal` aborted.
 */
export async function sendRepeatingDrops(
  request: RestRequest,
  exchange: () => Promise<RestResponse>,
  options: RepeatOptions = {},
): Promise<RestResponse> {
  const attempts = options.attempts ?? DROPPED_CONNECTION_ATTEMPTS;
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  const random = options.random ?? Math.random;
  for (let attempt = 1; ; attempt++) {
    try {
      return await exchange();
    } catch (error) {
      if (!isDroppedConnection(error) || !isReplaySafe(request) || options.signal?.aborted) throw error;
      if (attempt >= attempts) throw new DroppedConnectionError(request, attempt, error);
      const ceiling = DROPPED_CONNECTION_BACKOFF_MS * 2 ** (attempt - 1);
      await sleep(Math.round(ceiling * (0.5 + random() / 2)));
      if (options.signal?.aborted) throw error;
    }
  }
}
