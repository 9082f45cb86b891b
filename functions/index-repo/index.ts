/**
 * The index-repo function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for a PackageRepository object event it runs the repository's
 * whole reconcile in one invocation (`runIndexRepo`, `functions/lib/pipeline/repo/index-repo.ts`):
 * vendir into directory `0`, the fixed ytt + kbld pipeline, `kapp deploy` of `<name>.pkgr`
 * (or `kapp delete` for a repository being deleted) and the status. It sends nothing on.
 * Configuration: see `functions/lib/entry/config.ts`; its queue is
 * `KAPP_LAMBDA_QUEUE_URL_INDEX_REPO` (the forwarder sends to it).
 *
 * Tools: the index-repo layer puts `vendir`, `imgpkg`, `ytt`, `kbld` and `kapp` in `/opt/bin`.
 * As for the fetch function, a `git` repository needs a git binary in the layer, which cannot be
 * built from the Go module proxy (see `functions/fetch/index.ts`).
 *
 * Clusters: the DeployView, with which it requests a token of the ServiceAccount
 * `kapp-lambda-pkgr` in the runtime's namespace for kapp (upstream deploys a repository's
 * packages as the controller's ServiceAccount; `infra/rbac/package-repository-kapp.yml`), and
 * the InstallView for the placeholder Secret (see `FUNCTION_ACCESS` in
 * `functions/lib/entry/lambda.ts`). Its own identity never reaches a tool.
 *
 * Source poll: invoked directly (not through SQS) with `{"type":"dev.kapp-lambda.source.poll.v1"}`
 * by an EventBridge Scheduler schedule (e.g. `rate(1 minute)`, the poll period), it resolves the
 * fleet's polled PackageRepository sources whose record is stale and reconciles the repositories
 * behind (`functions/lib/pipeline/source-poll.ts`).
 *
 * Its bundle holds this function's stage only (`../lib/pipeline/routes/index-repo.ts`, imported on
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
  'index-repo',
  import.meta.url,
  process.argv[1],
  process.env,
  () => import('../lib/pipeline/routes/index-repo.js'),
);
