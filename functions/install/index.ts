/**
 * The install function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for a PackageInstall object event it runs the PackageInstall's
 * reconcile in one invocation (`runInstall`, `functions/lib/pipeline/install/install.ts`): the Package
 * selected through the repository resolver, the App generated from it written (with its
 * placeholder Secrets), the App's status mirrored, or on deletion the App deleted and the
 * finalizer removed. It sends nothing on: the App it writes reaches the fetch function through
 * the forwarder, as any App does. Configuration: see `functions/lib/entry/config.ts`; its queue
 * is `KAPP_LAMBDA_QUEUE_URL_INSTALL` (the forwarder sends PackageInstall events to it).
 *
 * Tools: none (`STAGE_TOOLS.install` is empty; upstream's PackageInstall reconciler runs none),
 * so its layer carries only the hardening addon.
 *
 * Clusters: the InstallView only (see `FUNCTION_ACCESS` in `functions/lib/entry/lambda.ts`): no
 * tokens and no runtime identity; the App is deployed with its own ServiceAccount by the deploy
 * function.
 *
 * Its bundle holds this function's stage only (`../lib/pipeline/routes/install.ts`, imported on
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
  'install',
  import.meta.url,
  process.argv[1],
  process.env,
  () => import('../lib/pipeline/routes/install.js'),
);
