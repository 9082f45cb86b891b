/**
 * The fetch function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for an App object event it decides whether to reconcile, runs
 * vendir, stores the fetched tarball in S3 and queues the template stage (or, for an App
 * being deleted, the deploy function's delete hand-off). Configuration: see
 * `functions/lib/entry/config.ts`; it needs `KAPP_LAMBDA_QUEUE_URL_TEMPLATE`,
 * `KAPP_LAMBDA_QUEUE_URL_DEPLOY` and `KAPP_LAMBDA_QUEUE_URL_FETCH` (the run lease's follow-up).
 *
 * Tools: the fetch layer puts `vendir`, `imgpkg` and `helm` in `/opt/bin`. vendir also runs
 * `git` from `PATH` for `git` sources, and the Lambda Node runtimes (Amazon Linux 2023) ship
 * no git binary: the fetch layer needs one (with `git-remote-https` and its libraries, e.g.
 * `/opt/bin/git` plus `/opt/lib`), which cannot be built from the Go module proxy. Until it
 * has one, Apps with `git` fetch sources fail here with vendir's "executable file not found"
 * error in `status.fetch`; other source types are unaffected.
 *
 * Clusters: fetch gets only the FetchView of each cluster (see `stageClusterRegistry` and
 * `kubeconfigClusterRegistry` in `functions/lib/entry/lambda.ts`), never deploy credentials.
 *
 * Its bundle holds this function's stage only (`../lib/pipeline/routes/fetch.ts`, imported on
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
  'fetch',
  import.meta.url,
  process.argv[1],
  process.env,
  () => import('../lib/pipeline/routes/fetch.js'),
);
