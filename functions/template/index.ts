/**
 * The template function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for a fetch → template hand-off it renders the fetched
 * artifact with ytt/kbld/helm/cue/sops (render cache in S3) and queues the deploy stage.
 * Configuration: see `functions/lib/entry/config.ts`; it needs `KAPP_LAMBDA_QUEUE_URL_DEPLOY`.
 *
 * Tools: the template layer's binaries in `/opt/bin`. Clusters: only the FetchView (plus
 * discovery for helm's `--kube-version`/`--api-versions` and the downward API), never deploy
 * credentials.
 *
 * Runs as-is on a Node managed runtime (handler `index.handler`) or as its own bootstrap
 * (`node index.mjs` on a custom runtime or under the Runtime Interface Emulator).
 *
 * @module
 */
import {
  createAwsClients,
  createLambdaDeps,
  lambdaBootstrap,
  makeSqsHandler,
  parseLambdaEnv,
} from '../lib/entry/index.js';

const bootstrap = lambdaBootstrap({
  moduleUrl: import.meta.url,
  argv1: process.argv[1],
  runtimeApi: process.env.AWS_LAMBDA_RUNTIME_API,
});
const config = parseLambdaEnv('template', process.env);
const clients = createAwsClients(config);

/** SQS handler: `(SqsEvent) => { batchItemFailures }` (see `makeSqsHandler`). */
export const handler = makeSqsHandler('template', () => createLambdaDeps(config, clients));

bootstrap.start(handler);
