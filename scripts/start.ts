/**
 * `npm start`: the embedded default. Runs the forwarder and the functions in this process
 * against the current kubeconfig (`$KUBECONFIG`, else `~/.kube/config`; its current context
 * is the one cluster served), in a Pod against the cluster it runs in (no kubeconfig and
 * `KUBERNETES_SERVICE_HOST` set: the ServiceAccount's token and CA, from
 * `KAPP_LAMBDA_SERVICEACCOUNT_DIR` or the usual mount; `kubeSourceOf` of `./start-settings.ts`
 * has the order), or, when there is none, against a local control plane it
 * starts (with the CRDs applied). Logs one JSON line per stage run on stderr. Ctrl-C stops.
 *
 * Environment: `KUBECONFIG`, `KAPP_LAMBDA_CONTEXTS` (comma-separated contexts to serve,
 * default the current one), `KAPP_LAMBDA_NAMESPACES` (default all), `KAPP_LAMBDA_CONCURRENCY`
 * (default 4), `KAPP_LAMBDA_STORE` (local object store directory, default
 * `~/.cache/kapp-lambda/store`), `KAPP_LAMBDA_CACHE`, `KAPP_LAMBDA_LEASE_NAMESPACE` (namespace
 * of the leader-election Lease, default `kapp-lambda`; it must exist:
 * `kubectl create namespace kapp-lambda`), `KAPP_LAMBDA_LEADER_ELECTION=off` (act without a
 * Lease; only when nothing else serves the cluster), `KAPP_LAMBDA_METRICS_ADDRESS` (where
 * `GET /metrics` serves kapp-controller's reconcile series, default `127.0.0.1:8080`; `off`: no
 * server), `KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE` (or `--controller-config-namespace`: where
 * each cluster's `kapp-controller-config` is read, default `kapp-lambda`; see `start-settings.ts`),
 * `KAPP_LAMBDA_SHARED_TOOL_UID=allow` (serve the cluster it runs in as a non-root user, whose
 * tools then share its uid and token: refused otherwise, `inClusterToolIsolation`).
 *
 * Takes no arguments but `-h`/`--help` and `--controller-config-namespace` (`./start-args.ts`:
 * the usage and exit codes; anything else is a usage error, exit 2).
 *
 * Several `npm start` against one cluster are safe: per cluster, only the holder of the Lease
 * forwards events and runs stages; the others wait and take over within ~15 s when it goes
 * away (at once when it stops with Ctrl-C, which releases the Lease).
 */
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import path from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import pino from 'pino';
import {
  DEFAULT_METRICS_ADDRESS,
  type MetricsServer,
  startMetricsServer,
} from '../functions/embedded/metrics-server.js';
import { startEmbedded } from '../functions/embedded/runtime.js';
import { canSwitchUid } from '../functions/lib/exec/sandbox.js';
import { parseUrlPolicy, type UrlPolicy, UrlPolicyChecker } from '../functions/lib/fetch/url-policy.js';
import { FleetViewSource } from '../functions/lib/fleet/view.js';
import { inClusterConnection, type PlainConnection } from '../functions/lib/kube/kubeconfig-auth.js';
import { IN_CLUSTER_ID } from '../functions/lib/kube/registry.js';
import { errorText } from '../functions/lib/log.js';
import { cacheRoot } from '../layers/gobuild.js';
import { startCluster } from '../test/harness/cluster.js';
import { applyCrds } from './local-env.js';
import { startCommandLine } from './start-args.js';
import {
  inClusterToolIsolation,
  kubeSourceOf,
  readStartSettings,
  type StartSettings,
  startBanner,
} from './start-settings.js';

const cliExit = startCommandLine(
  process.argv.slice(2),
  { out: (t) => process.stdout.write(t), err: (t) => process.stderr.write(t) },
  process.env,
);
if (cliExit !== undefined) process.exit(cliExit);

// The pinned AWS SDK works on Node 20; its notice about future releases is noise here.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
const log = pino({ base: undefined, timestamp: pino.stdTimeFunctions.isoTime }, pino.destination(2));
const say = (m: string) => process.stderr.write(`[start] ${m}\n`);
const list = (v: string | undefined) =>
  v
    ?.split(',')
    .map((s) => s.trim())
    .filter(Boolean);

// Checked by `startCommandLine` above: reading them again cannot fail.
const settings: StartSettings = readStartSettings(process.argv.slice(2), process.env);

const source = kubeSourceOf(process.env, homedir(), existsSync);
let kubeconfigPath: string | undefined;
let inCluster: PlainConnection | undefined;
let contexts = list(process.env.KAPP_LAMBDA_CONTEXTS);
let stopCluster: (() => Promise<void>) | undefined;
if (source.kind === 'kubeconfig') {
  kubeconfigPath = source.path;
  if (!contexts) {
    const kc = new KubeConfig();
    kc.loadFromFile(source.path);
    contexts = [kc.getCurrentContext()];
  }
  say(`using kubeconfig ${source.path}, contexts ${contexts.join(', ')}`);
} else if (source.kind === 'in-cluster') {
  try {
    inCluster = inClusterConnection(process.env, source.serviceAccountDir);
  } catch (err) {
    say(`in-cluster configuration (${source.serviceAccountDir}): ${(err as Error).message}`);
    process.exit(1);
  }
  say(
    `in a cluster: serving ${inCluster.server} as ${IN_CLUSTER_ID} with the ServiceAccount of ${source.serviceAccountDir}`,
  );
  const isolation = inClusterToolIsolation(source, canSwitchUid(), process.env);
  if (isolation) say(isolation.message);
  if (isolation?.exit) process.exit(1);
} else {
  say('no kubeconfig found: starting a local control plane');
  const cluster = await startCluster({ log: say }).catch((err: Error) => {
    say(`cannot start a local control plane: ${err.message}`);
    process.exit(1);
  });
  await applyCrds(cluster.kubeconfigPath);
  kubeconfigPath = cluster.kubeconfigPath;
  stopCluster = () => cluster.stop();
  say(`local control plane ready; kubectl --kubeconfig ${cluster.kubeconfigPath} get apps -A`);
}

const tmpRoot = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-'));
let urlPolicy: UrlPolicy;
try {
  urlPolicy = parseUrlPolicy(process.env.KAPP_LAMBDA_URL_POLICY, process.env.KAPP_LAMBDA_URL_ALLOW, 'off');
  new UrlPolicyChecker(urlPolicy);
} catch (err) {
  say(`KAPP_LAMBDA_URL_POLICY / KAPP_LAMBDA_URL_ALLOW: ${(err as Error).message}`);
  process.exit(2);
}
const runtime = startEmbedded({
  config: {
    urlPolicy,
    ...(settings.controllerConfigNamespace ? { controllerConfigNamespace: settings.controllerConfigNamespace } : {}),
    ...(settings.maxInlineBytes !== undefined ? { maxInlineBytes: settings.maxInlineBytes } : {}),
    ...(settings.fetchStall ? { fetchStall: settings.fetchStall } : {}),
  },
  ...(inCluster ? { inCluster } : { kubeconfigPath, contexts }),
  namespaces: list(process.env.KAPP_LAMBDA_NAMESPACES),
  concurrency: Number(process.env.KAPP_LAMBDA_CONCURRENCY ?? 4),
  cacheRoot: cacheRoot(),
  storeDir: process.env.KAPP_LAMBDA_STORE ?? path.join(cacheRoot(), 'store'),
  tmpRoot,
  log,
  leaderElection:
    process.env.KAPP_LAMBDA_LEADER_ELECTION === 'off'
      ? false
      : { namespace: process.env.KAPP_LAMBDA_LEASE_NAMESPACE || undefined },
});
say(startBanner(process.env.KAPP_LAMBDA_LEADER_ELECTION !== 'off'));

const metricsAddress = process.env.KAPP_LAMBDA_METRICS_ADDRESS || DEFAULT_METRICS_ADDRESS;
let metricsServer: MetricsServer | undefined;
if (metricsAddress !== 'off') {
  try {
    const fleetViews = new FleetViewSource(runtime.store, { clusters: () => runtime.registry.clusterIds() });
    metricsServer = await startMetricsServer(runtime.metrics.registry, metricsAddress, {
      fleet: () => fleetViews.view(),
      onFleetError: (err) => log.warn({ error: errorText(err) }, 'fleet page: cannot read the store'),
    });
    const base = `http://${metricsAddress.replace(/:\d+$/, '')}:${metricsServer.address.port}`;
    say(`metrics: curl ${base}/metrics; the fleet: open ${base}/`);
  } catch (err) {
    say(`KAPP_LAMBDA_METRICS_ADDRESS: ${(err as Error).message} (metrics not served)`);
  }
}

// The forwarder's and the elector's timers are unref'ed (they never keep a process alive on
// their own), so a runtime waiting for the Lease of a crashed holder would otherwise exit 0.
const keepAlive = setInterval(() => undefined, 60_000);

let stopping: Promise<void> | undefined;
const stop = (code: number) => {
  // Idempotent, and the handlers stay installed: a second signal (tsx relays SIGINT again when
  // the child is slow to confirm) must not fall through to a default exit mid-cleanup.
  stopping ??= (async () => {
    say('stopping');
    clearInterval(keepAlive);
    await metricsServer?.close();
    await runtime.stop().catch(() => undefined);
    await stopCluster?.().catch(() => undefined);
    await rm(tmpRoot, { recursive: true, force: true });
    process.exit(code);
  })();
  return stopping;
};
process.on('SIGINT', () => void stop(130));
process.on('SIGTERM', () => void stop(143));
