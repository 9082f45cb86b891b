/**
 * The deploy function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for a template → deploy hand-off it runs `kapp deploy` with the
 * App's own ServiceAccount (short-lived TokenRequest token) or kubeconfig Secret and writes
 * `status.deploy`/`status.inspect`; for a delete hand-off it runs `kapp delete` and removes
 * the finalizer. It sends its own continuation past the function deadline (deploy queue) and
 * the run lease's follow-up (fetch queue). Configuration: see `functions/lib/entry/config.ts`.
 *
 * Tools: `kapp` from the deploy layer in `/opt/bin`. Clusters: the DeployView (the only
 * function that mints ServiceAccount tokens).
 *
 * Its bundle holds this function's stage only (`../lib/pipeline/routes/deploy.ts`, imported on
 * the first record); the AWS SDK is the Node managed runtime's (`layers/bundle.ts`).
 *
 * Runs as-is on a Node managed runtime (handler `index.handler`) or as its own bootstrap
 * (`node index.mjs` on a custom runtime or under the Runtime Interface Emulator).
 *
 * @module
 */
import { lambdaEntry } from '../lib/entry/main.js';

/** SQS handler: `(SqsEvent) => { batchItemFailures }` (see `makeStageHandler`). */
export const handler = lambdaEntry(
  'deploy',
  import.meta.url,
  process.argv[1],
  process.env,
  () => import('../lib/pipeline/routes/deploy.js'),
);
