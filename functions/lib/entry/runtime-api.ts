/**
 * A minimal client of the Lambda Runtime API, so a function bundle can be its own bootstrap
 * on a custom runtime (`provided.al2023` with Node from a layer) or under the Runtime
 * Interface Emulator, while the same bundle also runs on a Node managed runtime (which
 * imports the module and calls the exported `handler`; {@link isMainModule} is then false and
 * no loop starts). `aws-lambda-ric` would do this but needs Node 22.
 *
 * The loop makes the three calls of the API, one invocation at a time:
 *
 * - `GET /2018-06-01/runtime/invocation/next` (long poll) → the event and its request id;
 * - `POST /2018-06-01/runtime/invocation/<id>/response` with the handler's JSON result;
 * - `POST /2018-06-01/runtime/invocation/<id>/error` with `{ errorMessage, errorType }` when
 *   the handler rejects.
 *
 * Plain `node:http` rather than `fetch`: undici's 300 s headers timeout would break the
 * long poll of `next` whenever the function is idle (the emulator does not freeze it).
 *
 * @see https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html
 * @module
 */
import { realpathSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { pathToFileURL } from 'node:url';

/** API version prefix of every Runtime API path. */
export const RUNTIME_API_VERSION = '2018-06-01';

/** Largest response body the Runtime API accepts for a synchronous invocation: 6 MiB. */
export const MAX_RESPONSE_BYTES = 6 * 1024 * 1024;

/** One invocation, as `next` returns it. */
export interface Invocation {
  /** `Lambda-Runtime-Aws-Request-Id`. */
  requestId: string;
  /** `Lambda-Runtime-Deadline-Ms`: epoch milliseconds after which Lambda stops the invocation. */
  deadlineMs: number;
  /** `Lambda-Runtime-Invoked-Function-Arn`, `''` when absent. */
  invokedFunctionArn: string;
  /** `Lambda-Runtime-Trace-Id`, `''` when absent. */
  traceId: string;
  /** The event, parsed from JSON. */
  event: unknown;
}

/** The context passed to the handler, shaped like the Node runtime's (the fields used here). */
export interface InvocationContext {
  /** Request id of the invocation. */
  awsRequestId: string;
  /** ARN the function was invoked with. */
  invokedFunctionArn: string;
  /** Milliseconds left before the deadline. */
  getRemainingTimeInMillis(): number;
}

/** A failed Runtime API call (transport error or unexpected status); `cause` holds the error. */
export class RuntimeApiError extends Error {
  override readonly name = 'RuntimeApiError';
}

interface RawResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** The three calls of the Runtime API, over one keep-alive connection. */
export class RuntimeApiClient {
  readonly #host: string;
  readonly #port: number;
  readonly #agent = new Agent({ keepAlive: true, maxSockets: 1 });

  /**
   * @param endpoint - `host:port` of the API (`AWS_LAMBDA_RUNTIME_API`, read by the entry file).
   * @throws RuntimeApiError when `endpoint` is not `host:port`.
   */
  constructor(endpoint: string) {
    const m = /^([^:/\s]+|\[[0-9a-fA-F:]+\]):(\d{1,5})$/.exec(endpoint);
    if (!m?.[1] || !m[2]) throw new RuntimeApiError(`invalid Runtime API endpoint ${JSON.stringify(endpoint)}`);
    this.#host = m[1].replace(/^\[|\]$/g, '');
    this.#port = Number(m[2]);
  }

  #call(
    method: 'GET' | 'POST',
    path: string,
    body?: string,
    headers: Record<string, string> = {},
  ): Promise<RawResponse> {
    return new Promise((resolve, reject) => {
      const req = request(
        {
          host: this.#host,
          port: this.#port,
          method,
          path: `/${RUNTIME_API_VERSION}${path}`,
          agent: this.#agent,
          headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              body: Buffer.concat(chunks).toString('utf8'),
            }),
          );
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  }

  async #post(path: string, body: string, headers?: Record<string, string>): Promise<void> {
    let res: RawResponse;
    try {
      res = await this.#call('POST', path, body, headers);
    } catch (cause) {
      throw new RuntimeApiError(`failed to post ${path}`, { cause });
    }
    if (res.status !== 202) throw new RuntimeApiError(`failed to post ${path}: status ${res.status}`);
  }

  /**
   * Waits for the next invocation (`GET /runtime/invocation/next`).
   * @throws RuntimeApiError on a transport error, a non-200 status, or a body that is not JSON.
   */
  async next(): Promise<Invocation> {
    let res: RawResponse;
    try {
      res = await this.#call('GET', '/runtime/invocation/next');
    } catch (cause) {
      throw new RuntimeApiError('failed to get the next invocation', { cause });
    }
    if (res.status !== 200) throw new RuntimeApiError(`failed to get the next invocation: status ${res.status}`);
    const header = (name: string) => {
      const v = res.headers[name];
      return Array.isArray(v) ? (v[0] ?? '') : (v ?? '');
    };
    const requestId = header('lambda-runtime-aws-request-id');
    if (!requestId) throw new RuntimeApiError('failed to get the next invocation: no request id');
    let event: unknown;
    try {
      event = res.body === '' ? null : JSON.parse(res.body);
    } catch (cause) {
      throw new RuntimeApiError('failed to get the next invocation: event is not JSON', { cause });
    }
    return {
      requestId,
      deadlineMs: Number(header('lambda-runtime-deadline-ms')) || 0,
      invokedFunctionArn: header('lambda-runtime-invoked-function-arn'),
      traceId: header('lambda-runtime-trace-id'),
      event,
    };
  }

  /**
   * Reports the invocation's result (`POST /runtime/invocation/<id>/response`).
   * @throws RuntimeApiError when the API does not answer 202.
   */
  async respond(requestId: string, result: unknown): Promise<void> {
    await this.#post(`/runtime/invocation/${encodeURIComponent(requestId)}/response`, JSON.stringify(result ?? null));
  }

  /**
   * Reports a failed invocation (`POST /runtime/invocation/<id>/error`).
   * @throws RuntimeApiError when the API does not answer 202.
   */
  async error(requestId: string, err: unknown): Promise<void> {
    const body = errorBody(err);
    await this.#post(`/runtime/invocation/${encodeURIComponent(requestId)}/error`, JSON.stringify(body), {
      'lambda-runtime-function-error-type': body.errorType,
    });
  }

  /** Closes the keep-alive connection. */
  close(): void {
    this.#agent.destroy();
  }
}

/**
 * The error document Lambda expects: `{ errorType, errorMessage }` (no stack: it names files
 * of the bundle and adds nothing for the caller).
 */
export function errorBody(err: unknown): { errorType: string; errorMessage: string } {
  if (err instanceof Error) return { errorType: err.name || 'Error', errorMessage: err.message };
  return { errorType: 'Error', errorMessage: typeof err === 'string' ? err : 'non-Error thrown' };
}

/** Options of {@link runRuntimeLoop}. */
export interface RuntimeLoopOptions {
  /** Wall clock, epoch ms. Default `Date.now`. */
  now?: () => number;
  /** Stops the loop after the current invocation when aborted. */
  signal?: AbortSignal;
}

/**
 * Serves invocations one after another until `signal` aborts or the API fails.
 *
 * A handler that rejects, or whose result cannot be serialized within
 * {@link MAX_RESPONSE_BYTES}, is reported with `error`; the loop continues.
 *
 * @throws RuntimeApiError when a Runtime API call fails (the process should then exit:
 *   Lambda starts a new one).
 */
export async function runRuntimeLoop<E, R>(
  client: RuntimeApiClient,
  handler: (event: E, context: InvocationContext) => Promise<R>,
  opts: RuntimeLoopOptions = {},
): Promise<void> {
  const now = opts.now ?? Date.now;
  while (!opts.signal?.aborted) {
    const inv = await client.next();
    const context: InvocationContext = {
      awsRequestId: inv.requestId,
      invokedFunctionArn: inv.invokedFunctionArn,
      getRemainingTimeInMillis: () => Math.max(0, inv.deadlineMs - now()),
    };
    let result: unknown;
    try {
      result = await handler(inv.event as E, context);
      const size = Buffer.byteLength(JSON.stringify(result ?? null));
      if (size > MAX_RESPONSE_BYTES) throw new RangeError(`response is ${size} bytes, over ${MAX_RESPONSE_BYTES}`);
    } catch (err) {
      await client.error(inv.requestId, err);
      continue;
    }
    await client.respond(inv.requestId, result);
  }
}

/**
 * Whether the module at `moduleUrl` is the program node was started with, i.e. the bundle is
 * the runtime's bootstrap (`node fetch.mjs`) rather than imported by a managed runtime.
 *
 * @param moduleUrl - the module's `import.meta.url`.
 * @param argv1 - `process.argv[1]`, the script node was started with.
 */
export function isMainModule(moduleUrl: string, argv1: string | undefined): boolean {
  if (!argv1) return false;
  try {
    return pathToFileURL(realpathSync(argv1)).href === moduleUrl;
  } catch {
    return false;
  }
}

/** How a bootstrap that could not start reports itself: one JSON line on stderr. */
function fatal(message: string, err?: unknown): void {
  const line =
    err === undefined ? { level: 'fatal', msg: message } : { level: 'fatal', msg: message, error: errorBody(err) };
  process.stderr.write(`${JSON.stringify(line)}\n`);
}

/** What {@link lambdaBootstrap} returns. */
export interface Bootstrap {
  /** Whether this process is the bootstrap (see {@link isMainModule}). */
  readonly isMain: boolean;
  /**
   * Serves invocations with `handler` when {@link Bootstrap.isMain}; does nothing when a
   * managed runtime imported the module (it calls the exported `handler` itself). Exits the
   * process with status 1 when the loop fails (Lambda and the emulator start a fresh one).
   */
  start<E, R>(handler: (event: E, context: InvocationContext) => Promise<R>): void;
}

/**
 * Call first in an entry file. When the module is the bootstrap, it also makes any uncaught
 * error — above all one thrown while the entry initializes, such as an invalid configuration —
 * print one JSON line (`{"level":"fatal","msg":…,"error":{errorType,errorMessage}}`) on stderr
 * and exit 1, instead of node's default report, which quotes the offending source line (a
 * whole minified bundle). Lambda then reports `Runtime.ExitError` with that line in the log.
 *
 * @param opts.moduleUrl - the entry module's `import.meta.url`.
 * @param opts.argv1 - `process.argv[1]`.
 * @param opts.runtimeApi - `AWS_LAMBDA_RUNTIME_API` (`host:port`), read by the entry file.
 */
export function lambdaBootstrap(opts: {
  moduleUrl: string;
  argv1: string | undefined;
  runtimeApi: string | undefined;
}): Bootstrap {
  const isMain = isMainModule(opts.moduleUrl, opts.argv1);
  if (isMain) {
    process.setUncaughtExceptionCaptureCallback((err) => {
      fatal('function failed', err);
      process.exit(1);
    });
  }
  return {
    isMain,
    start(handler) {
      if (!isMain) return;
      if (!opts.runtimeApi) {
        fatal('AWS_LAMBDA_RUNTIME_API is not set: run under Lambda or the Runtime Interface Emulator');
        process.exit(1);
      }
      const client = new RuntimeApiClient(opts.runtimeApi);
      runRuntimeLoop(client, handler).catch((err: unknown) => {
        fatal('runtime loop failed', err);
        process.exit(1);
      });
    },
  };
}
