/**
 * Entry of the forwarder program (`npm run forwarder`; the container runs its esbuild bundle,
 * `infra/forwarder/Containerfile`). Reads its settings from the environment
 * (`parseForwarderProgramEnv`, tables in `config.ts`), talks to the cluster with the in-cluster
 * ServiceAccount (or `KUBECONFIG` when set; `kube.ts`: plain `node:https`) and to SQS with the AWS SDK's default credential
 * chain (IRSA or EKS Pod Identity in a cluster; no keys in configuration), and runs
 * {@link startForwarderProgram} until SIGTERM or SIGINT.
 *
 * Exit codes: 0 after a clean stop (outbox drained or not: what was dropped is re-derived by the
 * next leader), 1 when the stop overran its bound, 2 on invalid settings or a failed start.
 *
 * @module
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { SQSClient } from '@aws-sdk/client-sqs';
import pino from 'pino';
import { leaseViewOf, watchViewOf } from '../../functions/lib/kube/views.js';
import { SqsEventSender } from '../../functions/lib/transport/sqs.js';
import { parseForwarderProgramEnv } from './config.js';
import { forwarderKube } from './kube.js';
import { startForwarderProgram } from './program.js';
import { transportToStages } from './transport.js';

/** Extra time after `FORWARDER_SHUTDOWN_TIMEOUT_SECONDS` for the Lease release and the HTTP close. */
const STOP_GRACE_MS = 5000;

const log = pino({
  base: { component: 'kapp-lambda-forwarder' },
  timestamp: pino.stdTimeFunctions.isoTime,
  level: process.env.FORWARDER_LOG_LEVEL?.trim() || 'info',
});

async function main(): Promise<void> {
  let settings: ReturnType<typeof parseForwarderProgramEnv>;
  try {
    settings = parseForwarderProgramEnv(process.env);
  } catch (e) {
    log.error({ error: (e as Error).message }, 'invalid settings');
    process.exit(2);
  }
  log.level = settings.logLevel;
  const kube = await forwarderKube({
    clusterId: settings.forwarder.clusterId,
    ...(settings.kubeconfig ? { kubeconfig: settings.kubeconfig } : {}),
  });
  const sqs = new SQSClient({
    region: settings.region,
    ...(settings.sqsEndpoint ? { endpoint: settings.sqsEndpoint } : {}),
  });
  // Deduplication ids keyed with the cluster's event key (`dedupId`): no other cluster's forwarder
  // can predict one of this cluster's and spend it first.
  const { eventKey } = settings;
  const clusterId = settings.forwarder.clusterId;
  const transport = transportToStages(
    new SqsEventSender({
      client: sqs,
      queueUrls: settings.queueUrls,
      ...(eventKey ? { dedupKeyOf: (id: string) => (id === clusterId ? eventKey : undefined) } : {}),
    }),
  );
  if (!eventKey)
    log.warn(
      'FORWARDER_EVENT_KEY is not set: the events go in unkeyed message groups with their event ids as deduplication ids, which another sender can name; a fleet whose registry document of this cluster has an event key refuses them',
    );
  const identity = `${process.env.HOSTNAME?.trim() || hostname()}_${randomBytes(4).toString('hex')}`;
  const view = watchViewOf(kube);
  const program = await startForwarderProgram(settings, {
    watcher: view,
    configReader: view,
    lease: leaseViewOf(kube),
    transport,
    identity,
    logger: log,
  });
  log.info(
    {
      clusterId: settings.forwarder.clusterId,
      kinds: settings.forwarder.kinds,
      lease: `${settings.lease.namespace}/${settings.lease.name}`,
      identity,
      source: settings.kubeconfig ? 'kubeconfig' : 'in-cluster',
    },
    'forwarder program started',
  );
  let signalled = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (signalled) return;
    signalled = true;
    log.info({ signal }, 'stopping');
    const bound = setTimeout(() => {
      log.error({ ms: settings.shutdownTimeoutMs + STOP_GRACE_MS }, 'stop overran its bound; exiting');
      process.exit(1);
    }, settings.shutdownTimeoutMs + STOP_GRACE_MS);
    bound.unref();
    void program.stop().then(() => {
      sqs.destroy();
      clearTimeout(bound);
      process.exit(0);
    });
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}

main().catch((e: unknown) => {
  log.error({ error: e instanceof Error ? e.message : String(e) }, 'forwarder failed to start');
  process.exit(2);
});
