/**
 * Lambda's Invoke API for functions in tenant isolation mode (`TenancyConfig: PER_TENANT`), on
 * this machine: a loopback HTTP server that a dispatcher's `@aws-sdk/client-lambda` is pointed at
 * (`KAPP_LAMBDA_LAMBDA_ENDPOINT`). It takes `POST /2015-03-31/functions/<name>/invocations` with
 * the `X-Amz-Tenant-Id` header (`InvokeCommand`'s `TenantId`) and runs it in the execution
 * environment of that (function, tenant): a Runtime Interface Emulator of its own
 * (`./lambda.ts` {@link startRie}, working in `<cwd>/<tenant id>`), started cold on the tenant's first invoke and never handed to
 * another tenant, as Lambda keeps an environment to one tenant for its life.
 *
 * What it answers, as Lambda does:
 * - no tenant id, for a function registered here (all are tenant-isolated): 400
 *   `InvalidParameterValueException` (Lambda's troubleshooting page: "invoking a
 *   tenant-isolated function without a tenant ID"), nothing run;
 * - an unknown function: 404 `ResourceNotFoundException`;
 * - else the function's answer, with `X-Amz-Function-Error: Unhandled` when the function failed
 *   (RIE answers a handler's error or a crash as an `errorType`/`errorMessage` payload, or not
 *   200), which the SDK reads as `FunctionError`.
 *
 * One difference: Lambda starts another environment of the same tenant for a concurrent invoke;
 * here an environment's invokes run one after the other (an emulator serves one at a time).
 * Only `RequestResponse` invokes are served (the dispatcher's).
 *
 * @module
 */
import { once } from 'node:events';
import { mkdir } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import path from 'node:path';
import { type Rie, type RieOptions, startRie } from './lambda.js';
import { LOOPBACK } from './servers/process.js';

/** One execution environment the router started. */
export interface TenantEnvironment {
  readonly functionName: string;
  readonly tenantId: string;
  readonly rie: Rie;
}

/** One invoke the router took (refused ones included). */
export interface TenantInvoke {
  readonly functionName: string;
  /** `undefined` when the request had no `X-Amz-Tenant-Id`. */
  readonly tenantId: string | undefined;
  /** HTTP status of the router's answer. */
  readonly status: number;
  /** `X-Amz-Function-Error` of the answer, when the function failed. */
  readonly functionError?: string;
}

/**
 * One invoke the router ran, with its bodies as they went (for a test that reads what a stage
 * function was given and answered). The request holds the run session's credentials a
 * dispatcher sends: never log it.
 */
export interface TenantInvokeBody {
  readonly functionName: string;
  readonly tenantId: string;
  readonly request: string;
  /** The function's answer (RIE's body), as the router passed it on. */
  readonly response: string;
  /** When the router took the invoke and when the answer came, ms on this process's `performance.now()` clock. */
  readonly startedAt: number;
  readonly endedAt: number;
}

/** A running router: its endpoint, the environments it started and the invokes it took. */
export interface TenantRouter {
  /** `http://127.0.0.1:<port>`: the Lambda endpoint to give the SDK. */
  readonly endpoint: string;
  /** Every environment started, in the order of their tenants' first invokes. */
  readonly environments: readonly TenantEnvironment[];
  /** Every invoke, in the order they ended. */
  readonly invokes: readonly TenantInvoke[];
  /** Closes the server and stops every environment. */
  stop(): Promise<void>;
}

/** A Lambda REST error answer: `X-Amzn-ErrorType` and `{ Type, message }`, as the SDK parses them. */
function lambdaError(res: ServerResponse, status: number, type: string, message: string): void {
  res.writeHead(status, { 'content-type': 'application/json', 'x-amzn-errortype': type });
  res.end(JSON.stringify({ Type: 'User', message }));
}

/** Whether RIE's answer is a failed invocation (an error payload, or RIE's own failure status). */
function failed(status: number, body: string): boolean {
  if (status !== 200) return true;
  try {
    const v = JSON.parse(body) as { errorType?: unknown; errorMessage?: unknown } | null;
    return typeof v === 'object' && v !== null && ('errorType' in v || 'errorMessage' in v);
  } catch {
    return false;
  }
}

/**
 * Starts the router on a free loopback port. `functions` maps each function name to how its
 * environments start ({@link RieOptions}; each environment works in `<cwd>/<tenant id>`, and
 * `tenantEnv(tenant)` is laid over its `env`, e.g. its own `/tmp`). `onInvoke` is told of each
 * invoke that ran, before its answer is sent (it must not throw).
 */
export async function startTenantRouter(
  functions: ReadonlyMap<string, RieOptions>,
  tenantEnv: (functionName: string, tenantId: string) => Record<string, string> = () => ({}),
  onInvoke?: (invoke: TenantInvokeBody) => void,
): Promise<TenantRouter> {
  const environments: TenantEnvironment[] = [];
  const invokes: TenantInvoke[] = [];
  /** Per (function, tenant): its environment and the tail of its invokes (one at a time). */
  const started = new Map<string, { rie: Promise<Rie>; tail: Promise<unknown> }>();

  const environment = (functionName: string, tenantId: string, opts: RieOptions) => {
    const key = `${functionName}\0${tenantId}`;
    let env = started.get(key);
    if (!env) {
      const cwd = path.join(opts.cwd, tenantId);
      const rie = mkdir(cwd, { recursive: true })
        .then(() => startRie({ ...opts, cwd, env: { ...opts.env, ...tenantEnv(functionName, tenantId) } }))
        .then((r) => {
          environments.push({ functionName, tenantId, rie: r });
          return r;
        });
      env = { rie, tail: rie };
      started.set(key, env);
    }
    return env;
  };

  const serve = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const startedAt = performance.now();
    const m = /^\/2015-03-31\/functions\/([^/]+)\/invocations$/.exec(req.url?.split('?')[0] ?? '');
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method !== 'POST' || !m) {
      lambdaError(res, 404, 'UnknownOperationException', `${req.method} ${req.url}: not an Invoke`);
      return;
    }
    const functionName = decodeURIComponent(m[1] ?? '');
    const tenantHeader = req.headers['x-amz-tenant-id'];
    const tenantId = typeof tenantHeader === 'string' && tenantHeader !== '' ? tenantHeader : undefined;
    const record = (status: number, functionError?: string) =>
      invokes.push({ functionName, tenantId, status, ...(functionError ? { functionError } : {}) });
    const opts = functions.get(functionName);
    if (!opts) {
      record(404);
      lambdaError(res, 404, 'ResourceNotFoundException', `Function not found: ${functionName}`);
      return;
    }
    if (tenantId === undefined) {
      record(400);
      lambdaError(
        res,
        400,
        'InvalidParameterValueException',
        `${functionName} has tenant isolation enabled: the invoke needs a tenant ID (X-Amz-Tenant-Id)`,
      );
      return;
    }
    const env = environment(functionName, tenantId, opts);
    const run = env.tail.then(async () => {
      const rie = await env.rie;
      const answer = await fetch(rie.invokeUrl, { method: 'POST', body: Buffer.concat(chunks) });
      return { status: answer.status, body: await answer.text() };
    });
    env.tail = run.catch(() => undefined);
    let status: number;
    let body: string;
    try {
      ({ status, body } = await run);
    } catch (err) {
      record(502, 'Unhandled');
      lambdaError(res, 502, 'ServiceException', `${functionName} (${tenantId}): ${String(err)}`);
      return;
    }
    const functionError = failed(status, body) ? 'Unhandled' : undefined;
    record(200, functionError);
    onInvoke?.({
      functionName,
      tenantId,
      request: Buffer.concat(chunks).toString('utf8'),
      response: body,
      startedAt,
      endedAt: performance.now(),
    });
    res.writeHead(200, {
      'content-type': 'application/json',
      'x-amz-executed-version': '$LATEST',
      ...(functionError ? { 'x-amz-function-error': functionError } : {}),
    });
    res.end(body);
  };

  const server: Server = createServer((req, res) => {
    serve(req, res).catch((err: unknown) => {
      if (!res.headersSent) lambdaError(res, 500, 'ServiceException', String(err));
      else res.destroy();
    });
  });
  server.listen(0, LOOPBACK);
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  return {
    endpoint: `http://${LOOPBACK}:${port}`,
    environments,
    invokes,
    stop: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      const ries = await Promise.allSettled([...started.values()].map((e) => e.rie));
      await Promise.all(ries.flatMap((r) => (r.status === 'fulfilled' ? [r.value.proc.stop()] : [])));
    },
  };
}
