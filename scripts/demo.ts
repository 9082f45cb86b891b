/**
 * `npm run demo`: the main job on the embedded default. Starts a local control plane and the
 * fixture servers, applies the example Apps (examples/), runs forwarder + functions in this
 * process until every App reached a final condition for its generation, prints the Apps as
 * `kubectl get apps` shows them, and exits 0 only when every App reconciled.
 *
 * Options (environment): `DEMO_TIMEOUT_SECONDS` (default 300), `KAPP_LAMBDA_CACHE`.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { startEmbedded } from '../functions/embedded/runtime.js';
import { cacheRoot } from '../layers/gobuild.js';
import { kubectl } from '../test/harness/kube.js';
import { examplePlaceholders, renderExample, startLocalEnvironment } from './local-env.js';

const EXAMPLES = [
  'rbac.yml',
  'inline-app.yml',
  'simple-app-git.yml',
  'simple-app-http.yml',
  'simple-app-bundle.yml',
  'podinfo-helm.yml',
];

interface AppRow {
  metadata: { name: string; namespace: string; generation?: number };
  status?: {
    observedGeneration?: number;
    conditions?: { type: string; message?: string }[];
    friendlyDescription?: string;
    usefulErrorMessage?: string;
  };
}

const started = Date.now();
const say = (m: string) => process.stderr.write(`[demo +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
const timeoutMs = Number(process.env.DEMO_TIMEOUT_SECONDS ?? 300) * 1000;
// The pinned AWS SDK works on Node 20; its notice about future releases is noise here.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
const log = pino({ base: undefined, timestamp: pino.stdTimeFunctions.isoTime }, pino.destination(2));

say('starting local control plane and fixture servers (first run builds them; see README)');
const env = await startLocalEnvironment(say);
const tmpRoot = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-demo-'));
let exitCode = 1;
const runtime = startEmbedded({
  kubeconfigPath: env.cluster.kubeconfigPath,
  cacheRoot: cacheRoot(),
  storeDir: path.join(tmpRoot, 'store'),
  tmpRoot: path.join(tmpRoot, 'work'),
  log,
});
const shutdown = async () => {
  await runtime.stop().catch(() => undefined);
  await env.stop();
  await rm(tmpRoot, { recursive: true, force: true });
};
process.once('SIGINT', () => void shutdown().then(() => process.exit(130)));
process.once('SIGTERM', () => void shutdown().then(() => process.exit(143)));

try {
  const kc = env.cluster.kubeconfigPath;
  const placeholders = examplePlaceholders(env.servers);
  for (const file of EXAMPLES) {
    say(`kubectl apply -f examples/${file}`);
    await kubectl(kc, ['apply', '-f', '-'], { input: await renderExample(file, placeholders) });
  }
  say('waiting for every App to reconcile');
  let apps: AppRow[] = [];
  const final = (a: AppRow) =>
    a.status?.observedGeneration === a.metadata.generation &&
    a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed');
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    apps = (JSON.parse((await kubectl(kc, ['get', 'apps', '-A', '-o', 'json'])).stdout) as { items: AppRow[] }).items;
    if (apps.length > 0 && apps.every(final)) break;
    await new Promise((r) => setTimeout(r, 2000));
  }
  process.stdout.write(`\n$ kubectl get apps -A\n${(await kubectl(kc, ['get', 'apps', '-A'])).stdout}\n`);
  const ok = apps.filter((a) => a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded'));
  for (const a of apps.filter((x) => !ok.includes(x))) {
    process.stdout.write(
      `${a.metadata.namespace}/${a.metadata.name}: ${a.status?.friendlyDescription ?? 'not reconciled'}\n${a.status?.usefulErrorMessage ?? ''}\n`,
    );
  }
  const m = runtime.toolMetrics.snapshot();
  process.stdout.write(
    `tool runs: ${Object.entries(m)
      .map(([tool, s]) => `${tool} ${s.count} (${Math.round(s.totalMs)} ms)`)
      .join(', ')}\n`,
  );
  exitCode = ok.length === apps.length && apps.length === EXAMPLES.length - 1 ? 0 : 1;
  say(exitCode === 0 ? `all ${apps.length} Apps reconciled` : `${apps.length - ok.length} App(s) did not reconcile`);
} catch (err) {
  say(`demo failed: ${(err as Error).message}`);
} finally {
  await shutdown();
}
process.exit(exitCode);
