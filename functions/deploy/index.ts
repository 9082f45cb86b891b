/**
 * The deploy function on AWS Lambda (SQS FIFO event source mapping with
 * `ReportBatchItemFailures`): for a template → deploy hand-off it runs `kapp deploy` with the
 * App's own ServiceAccount (short-lived TokenRequest token) or kubeconfig Secret and writes
 * `status.deploy`/`status.inspect`; for a delete hand-off it runs `kapp delete` and removes
 * the finalizer. It sends nothing on. Configuration: see `functions/lib/entry/config.ts`.
 *
 * Tools: `kapp` from the deploy layer in `/opt/bin`. Clusters: the DeployView (the only
 * function that mints ServiceAccount tokens).
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
const config = parseLambdaEnv('deploy', process.env);
const clients = createAwsClients(config);

/** SQS handler: `(SqsEvent) => { batchItemFailures }` (see `makeSqsHandler`). */
export const handler = makeSqsHandler('deploy', () => createLambdaDeps(config, clients));

bootstrap.start(handler);
