/**
 * The fleet page on AWS Lambda behind a Function URL (issue 28 item 5; `infra/aws/fleet-page.ts`
 * deploys it with `AuthType: AWS_IAM`): `GET /` the page, `GET /api/fleet` the fleet view of the
 * artifact bucket (`KAPP_LAMBDA_BUCKET`; `KAPP_LAMBDA_S3_ENDPOINT` for an S3-compatible server),
 * answered by `fleetResponse` (`../lib/fleet/http.ts`) as `npm start` and `npm run fleet -- serve`
 * answer them; any other path 404. It reads the bucket through `readOnlyStore` (its role may
 * only read `state/fleet/`, `state/rollouts/`, `state/rollout-policies/` and `receipts/` anyway).
 *
 * A view that cannot be built answers 503 with a fixed text; the error (its name and message, and
 * its cause's: never a stack, never a credential) goes to the function's log. Receipts read are
 * kept for the life of the execution environment (`FleetViewCache`: a receipt never changes).
 * The AWS SDK is the Node managed runtime's (`layers/bundle.ts`). Runs as-is on a Node managed
 * runtime (handler `index.handler`) or as its own bootstrap (`node index.mjs` under the Runtime
 * Interface Emulator: `test/integration/fleet-page-lambda.test.ts`).
 *
 * @module
 */
import { S3Client } from '@aws-sdk/client-s3';
import pino from 'pino';
import { lambdaBootstrap } from '../lib/entry/runtime-api.js';
import { fleetResponse } from '../lib/fleet/http.js';
import { FleetViewSource } from '../lib/fleet/view.js';
import { errorText, type Logger } from '../lib/log.js';
import type { ObjectStore } from '../lib/store/port.js';
import { readOnlyStore } from '../lib/store/read-only.js';
import { S3Store } from '../lib/store/s3.js';

/** What the handler reads of a Function URL event (payload format 2.0). */
export interface FunctionUrlEvent {
  /** The path, without the query (`/`, `/api/fleet`). */
  rawPath?: string;
  requestContext?: { http?: { method?: string } };
}

/** A Function URL response (payload format 2.0): the body as UTF-8 text. */
export interface FunctionUrlResult {
  statusCode: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * The handler over `store` (`undefined`: not configured, every view answers 503 and logs why).
 *
 * @param opts.log - where a view's failure is logged (one `error` line per failed request).
 * @param opts.maxAgeMs - how long a warm instance reuses a view, ms; default
 *   `FleetViewSource.DEFAULT_MAX_AGE_MS` (each open page polls every second).
 */
export function makeFleetPageHandler(opts: {
  store: ObjectStore | undefined;
  log: Logger;
  maxAgeMs?: number;
}): (event: FunctionUrlEvent) => Promise<FunctionUrlResult> {
  const store = opts.store && readOnlyStore(opts.store);
  const views = store && new FleetViewSource(store, opts.maxAgeMs !== undefined ? { maxAgeMs: opts.maxAgeMs } : {});
  const view = () => {
    if (!views) return Promise.reject(new Error('KAPP_LAMBDA_BUCKET is not set: no store to read'));
    return views.view();
  };
  const onError = (err: unknown) => {
    const cause = err instanceof Error && err.cause !== undefined ? { cause: errorText(err.cause) } : {};
    opts.log.error({ error: errorText(err), ...cause }, 'fleet page: cannot read the store');
  };
  return async (event) => {
    const r = await fleetResponse(event.requestContext?.http?.method ?? 'GET', event.rawPath ?? '/', view, onError);
    if (!r) return { statusCode: 404, headers: { 'content-type': 'text/plain; charset=utf-8' }, body: 'not found\n' };
    return { statusCode: r.status, headers: r.headers, body: r.body };
  };
}

/** The artifact bucket of `env` as a store, or `undefined` without `KAPP_LAMBDA_BUCKET`. */
export function storeFromEnv(env: Readonly<Record<string, string | undefined>>): ObjectStore | undefined {
  if (!env.KAPP_LAMBDA_BUCKET) return undefined;
  const endpoint = env.KAPP_LAMBDA_S3_ENDPOINT;
  const client = new S3Client(endpoint ? { endpoint, forcePathStyle: true } : {});
  return new S3Store({ client, bucket: env.KAPP_LAMBDA_BUCKET });
}

/** Function URL handler: `(FunctionUrlEvent) => FunctionUrlResult`. */
export const handler: (event: FunctionUrlEvent) => Promise<FunctionUrlResult> = makeFleetPageHandler({
  store: storeFromEnv(process.env),
  log: pino(
    { base: { function: 'fleet-page' }, timestamp: pino.stdTimeFunctions.isoTime },
    pino.destination({ fd: 1, sync: true }),
  ),
});

// Run as `node index.mjs` (a custom runtime, the Runtime Interface Emulator): its own bootstrap.
lambdaBootstrap({
  moduleUrl: import.meta.url,
  argv1: process.argv[1],
  runtimeApi: process.env.AWS_LAMBDA_RUNTIME_API,
}).start(handler);
