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
