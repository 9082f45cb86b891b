/**
 * The template function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for a fetch → template hand-off it renders the fetched
 * artifact with ytt/kbld/helm/cue/sops/kustomize (render cache in S3) and queues the deploy stage.
 * Configuration: see `functions/lib/entry/config.ts`; it needs `KAPP_LAMBDA_QUEUE_URL_DEPLOY`
 * and `KAPP_LAMBDA_QUEUE_URL_FETCH` (the run lease's follow-up).
 *
 * Tools: the template layer's binaries in `/opt/bin`. Clusters: only the FetchView (plus
 * discovery for helm's `--kube-version`/`--api-versions` and the downward API), never deploy
 * credentials.
 *
 * Its bundle holds this function's stage only (`../lib/pipeline/routes/template.ts`, imported on
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
  'template',
  import.meta.url,
  process.argv[1],
  process.env,
  () => import('../lib/pipeline/routes/template.js'),
);
