/**
 * What a stage's Lambda entry file runs at init, kept light: the configuration, the hardening
 * and the artifact key are checked at once (a bad setup fails the init), and the Runtime API
 * loop starts; the composition root (`./lambda.ts`: the Kubernetes client, the pipeline's ports)
 * is imported on the first invocation, the AWS SDK on the first command sent, and the function's stage
 * (`../pipeline/routes/<stage>.ts`) on the first record that runs one. An entry file imports
 * only this module and its own route, so its bundle holds no other function's stage.
 *
 * @module
 */

import type { PipelineStage } from '../api/functions.js';
import { becomeSubreaper, hardenProcess } from '../exec/harden.js';
import { createOrphanSweeper } from '../exec/orphans.js';
import type { Logger } from '../log.js';
import type { FunctionRoute } from '../pipeline/routes/route.js';
import { RolloutReports } from '../rollout/access.js';
import type { ObjectStore } from '../store/port.js';
import { artifactKeyringFromEnv, usesArtifactKey } from './artifact-key.js';
import { parseLambdaEnv } from './config.js';
import { POLL_MEMBER_STAGES } from './dispatch.js';
import {
  CollectingRequeuer,
  type DispatchedStageHandler,
  dispatchedHandler,
  hasSourcePollRecords,
  RunCredentialHolder,
} from './dispatched.js';
import { lambdaBootstrap } from './runtime-api.js';
import { makeStageHandler, type SqsHandler } from './stage-handler.js';

/**
 * Everything a stage's Lambda entry file does, in order: install the bootstrap (when the
 * bundle is its own process), read the configuration once from `env`, harden the process,
 * become the child subreaper of its tools (`../exec/orphans.ts`), read the artifact key, build the SQS handler, and start the Runtime API loop when the bundle
 * is the main module. With `KAPP_LAMBDA_DISPATCHED=true` (docs/decisions.md D15) the handler is
 * {@link dispatchedHandler} over the stage handler instead: it takes only its dispatcher's batches
 * of one cluster (index-repo: a batch with `poll` runs the source poll in that cluster), the AWS clients sign with the batch's run credentials
 * ({@link RunCredentialHolder}), the sealed store opens that cluster's artifacts only with the keys
 * the batch carries (the root key is not read), the registry is narrowed to that cluster, and the
 * records the deadline held back are returned as `requeue` ({@link CollectingRequeuer}); fetch's
 * and index-repo's answers carry `pollMember` ({@link hasSourcePollRecords} of the stage's store). On the first invocation the handler imports the composition root and
 * removes the scratch a process ended mid-run left in the tmp root (`removeLeftoverScratch`) and
 * creates the AWS clients and the stage's ports (`createLambdaDeps`); on the first record (or
 * poll) it loads the stage with `loadRoute`. Entry files pass `import.meta.url`,
 * `process.argv[1]`, `process.env` and a loader of their route (a dynamic import of
 * `functions/lib/pipeline/routes/<stage>.ts`):
 * they stay the only readers of the environment.
 *
 * @throws ConfigError (via the bootstrap's fatal handler when main) for a bad configuration.
 */
export function lambdaEntry(
  stage: PipelineStage,
  moduleUrl: string,
  argv1: string | undefined,
  env: Readonly<Record<string, string | undefined>>,
  loadRoute: () => Promise<{ route: FunctionRoute }>,
): SqsHandler | DispatchedStageHandler {
  const bootstrap = lambdaBootstrap({ moduleUrl, argv1, runtimeApi: env.AWS_LAMBDA_RUNTIME_API });
  const config = parseLambdaEnv(stage, env);
  // Before any tool can run: the tools share this function's uid on Lambda, and this
  // process's environment holds the role's AWS credentials.
  hardenProcess(config.hardenAddon);
  // What a tool leaves behind outside its process group comes back to this process, which
  // kills it before the run ends: it cannot live on into the next invocation (another App's).
  let giveUp = (left: number[]) => {
    process.stderr.write(`${JSON.stringify({ level: 'error', msg: 'orphan sweep gave up', left })}\n`);
  };
  const orphans = createOrphanSweeper({
    reap: becomeSubreaper(config.hardenAddon),
    onGiveUp: (left) => giveUp(left),
  });
  // Behind the dispatcher (D15) each batch brings its cluster's run credentials and keys, and the
  // root key is never read (the configuration refuses its variable); else the root key is read
  // from its secret now (the cold start), not on the first private artifact.
  const holder = config.dispatched ? new RunCredentialHolder() : undefined;
  const requeued = holder ? new CollectingRequeuer() : undefined;
  // Behind the dispatcher an install run reports the fleet's rollouts; it never writes their records.
  const rolloutReports = holder && stage === 'install' ? new RolloutReports() : undefined;
  const rootKeyring =
    !holder && usesArtifactKey(stage)
      ? artifactKeyringFromEnv(stage, env, async () =>
          (await import('./secrets-client.js')).createSecretsManagerClient(config),
        )
      : undefined;
  rootKeyring?.warm();
  const keyring = holder?.keyring ?? rootKeyring;
  const write = (level: string) => (obj: object, msg: string) =>
    process.stderr.write(`${JSON.stringify({ level, function: stage, ...obj, msg })}\n`);
  let log: Pick<Logger, 'error' | 'warn'> = { error: write('error'), warn: write('warn') };
  // The stage's store (in `cluster` sharing, its cluster's domain): where `pollMember` is listed.
  let store: ObjectStore | undefined;
  const handler = makeStageHandler(
    stage,
    async () => {
      const { lazyAwsClients, createLambdaDeps, removeLeftoverScratch } = await import('./lambda.js');
      // Before the first record: what a process ended mid-run left in /tmp (another App's files).
      const removed = await removeLeftoverScratch(config.tmpDir);
      const deps = createLambdaDeps(config, lazyAwsClients(config, holder?.credentials), {
        orphans,
        ...(keyring ? { keyring } : {}),
        ...(holder && requeued ? { tenant: holder, requeuer: requeued } : {}),
        ...(rolloutReports ? { rolloutReports } : {}),
      });
      if (removed.length > 0) deps.log.warn({ removed }, 'removed scratch directories an earlier process left');
      giveUp = (left) => deps.log.error({ left }, 'orphan sweep gave up: processes a tool left behind still run');
      log = deps.log;
      store = deps.pipeline.store;
      return deps;
    },
    async () => (await loadRoute()).route,
  );
  const entry = holder
    ? dispatchedHandler(handler, holder, {
        ...(requeued ? { requeued } : {}),
        ...(rolloutReports ? { rolloutReports } : {}),
        log: { error: (obj, msg) => log.error(obj, msg), warn: (obj, msg) => log.warn(obj, msg) },
        // Only in `cluster` sharing does the dispatcher keep members from the answers; in `fleet` it
        // reads the fleet's records itself, and the listing would be one S3 request for nothing.
        ...(config.sharing === 'cluster' && POLL_MEMBER_STAGES.includes(stage)
          ? {
              pollMember: async () => {
                if (!store) throw new Error('the stage has no store yet');
                return await hasSourcePollRecords(store);
              },
            }
          : {}),
      })
    : handler;
  bootstrap.start(entry);
  return entry;
}
