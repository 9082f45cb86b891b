/**
 * `npm run demo`: the main job on the embedded default, from a clone alone. Starts a local
 * control plane and the git, HTTP and registry servers, publishes the project's own examples to
 * them (`examples/sources/`, `./demo-examples.ts`: a ytt app as a git repository, a zip and an
 * imgpkg bundle, a Helm chart, a package and its repository bundle), applies the examples
 * (examples/: Apps, that PackageRepository and a PackageInstall of its package), runs
 * forwarder + functions in this process until every App, the repository and the install reached
 * a final condition for their generation, prints them as `kubectl get apps`,
 * `kubectl get packagemetadatas,packages` and `kubectl get packageinstalls` show them, and exits
 * 0 only when all reconciled.
 *
 * The runtime's JSON log (every line, info and up) goes to `demo.log` in the cache directory,
 * kept after the demo ends for a look at what ran; stderr carries the demo's own `[demo +Ns]`
 * lines and the runtime's errors only, so a first run reads as steps, not 70 lines of JSON.
 *
 * Options (environment): `DEMO_TIMEOUT_SECONDS` (default 300), `KAPP_LAMBDA_CACHE`.
 */
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { startEmbedded } from '../functions/embedded/runtime.js';
import { cacheRoot } from '../layers/gobuild.js';
import { kubectl } from '../test/harness/kube.js';
import { publishExamples } from './demo-examples.js';
import { APP_EXAMPLES, EXAMPLES, INSTALL_EXAMPLE, renderExample, startLocalEnvironment } from './local-env.js';

/** An App, PackageRepository or PackageInstall as `kubectl get -o json` returns it (the fields read here). */
interface AppRow {
  metadata: { name: string; namespace: string; generation?: number };
  status?: {
    observedGeneration?: number;
    conditions?: { type: string; message?: string }[];
    friendlyDescription?: string;
    usefulErrorMessage?: string;
    fetch?: StagePart;
    template?: StagePart;
    deploy?: StagePart;
  };
}

/** The fields of `status.fetch`/`template`/`deploy` the failure report reads. */
interface StagePart {
  updatedAt?: string;
  finished?: boolean;
  exitCode?: number;
}

/** Which stages of the last run left a part in status, e.g. `fetch 0 @12:00:01, template -, deploy -`. */
function stagesOf(a: AppRow): string {
  return (['fetch', 'template', 'deploy'] as const)
    .map((k) => {
      const p = a.status?.[k];
      if (!p) return `${k} -`;
      const state = p.finished === false ? 'running' : `exit ${p.exitCode ?? '?'}`;
      return `${k} ${state} @${p.updatedAt ?? '?'}`;
    })
    .join(', ');
}

const started = Date.now();
const say = (m: string) => process.stderr.write(`[demo +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
const timeoutMs = Number(process.env.DEMO_TIMEOUT_SECONDS ?? 300) * 1000;
// The pinned AWS SDK works on Node 20; its notice about future releases is noise here.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
const logPath = path.join(cacheRoot(), 'demo.log');
await mkdir(cacheRoot(), { recursive: true });
// Synchronous destinations: the demo ends with process.exit, which must not drop the last lines.
const log = pino(
  { base: undefined, timestamp: pino.stdTimeFunctions.isoTime },
  pino.multistream([
    { level: 'info', stream: pino.destination({ dest: logPath, sync: true, append: false }) },
    { level: 'error', stream: pino.destination({ dest: 2, sync: true }) },
  ]),
);
say(`the runtime's log: ${logPath} (its errors here too)`);

say('starting local control plane and the git, HTTP and registry servers');
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
  say('publishing examples/sources: git repository, zip, helm chart, app bundle, package and repository bundles');
  const placeholders = await publishExamples(env.servers);
  for (const file of EXAMPLES) {
    say(`kubectl apply -f examples/${file}`);
    await kubectl(kc, ['apply', '-f', '-'], { input: await renderExample(file, placeholders) });
  }
  say('waiting for every App, the PackageRepository and the PackageInstall to reconcile');
  let apps: AppRow[] = [];
  let repos: AppRow[] = [];
  let installs: AppRow[] = [];
  let installApplied = false;
  const final = (a: AppRow) =>
    a.status?.observedGeneration === a.metadata.generation &&
    a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed');
  const deadline = Date.now() + timeoutMs;
  const list = async (resource: string) =>
    (JSON.parse((await kubectl(kc, ['get', resource, '-A', '-o', 'json'])).stdout) as { items: AppRow[] }).items;
  while (Date.now() < deadline) {
    [apps, repos, installs] = await Promise.all([list('apps'), list('packagerepositories'), list('packageinstalls')]);
    const all = [...apps, ...repos, ...installs];
    if (!installApplied && repos.length === 1 && repos.every(final)) {
      say(`kubectl apply -f examples/${INSTALL_EXAMPLE}`);
      await kubectl(kc, ['apply', '-f', '-'], { input: await renderExample(INSTALL_EXAMPLE, placeholders) });
      installApplied = true;
      continue;
    }
    // The PackageInstall's App (same name) is one more App.
    if (all.length === APP_EXAMPLES.length + 3 && all.every(final)) break;
    await new Promise((r) => setTimeout(r, 2000));
  }
  for (const args of [
    ['get', 'apps', '-A'],
    ['get', 'packagerepositories', '-A'],
    ['get', 'packagemetadatas,packages', '-A'],
    ['get', 'packageinstalls', '-A'],
  ]) {
    process.stdout.write(`\n$ kubectl ${args.join(' ')}\n${(await kubectl(kc, args)).stdout}`);
  }
  process.stdout.write('\n');
  const succeeded = (a: AppRow) => a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded');
  const all = [...apps, ...repos, ...installs];
  const ok = all.filter(succeeded);
  for (const a of all.filter((x) => !ok.includes(x))) {
    process.stdout.write(
      `${a.metadata.namespace}/${a.metadata.name}: ${a.status?.friendlyDescription ?? 'not reconciled'}\n${a.status?.usefulErrorMessage ?? ''}\n` +
        `  status parts: ${stagesOf(a)}\n`,
    );
  }
  // What holds an object that did not finish: a stage still running (and since when), or nothing.
  for (const f of runtime.pipeline.inFlight()) {
    const secs = Math.round((Date.now() - f.startedAt) / 1000);
    process.stdout.write(`in flight: ${f.object} ${f.stage} (attempt ${f.attempt}) for ${secs} s\n`);
  }
  const m = runtime.toolMetrics.snapshot();
  process.stdout.write(
    `tool runs: ${Object.entries(m)
      .map(([tool, s]) => `${tool} ${s.count} (${Math.round(s.totalMs)} ms)`)
      .join(', ')}\n`,
  );
  exitCode =
    apps.length === APP_EXAMPLES.length + 1 && repos.length === 1 && installs.length === 1 && ok.length === all.length
      ? 0
      : 1;
  say(
    exitCode === 0
      ? `all ${apps.length} Apps, the PackageRepository and the PackageInstall reconciled`
      : `${all.length - ok.length} of ${all.length} Apps/PackageRepositories/PackageInstalls did not reconcile (expected ${APP_EXAMPLES.length + 1} + 1 + 1); the runtime's log: ${logPath}`,
  );
} catch (err) {
  say(`demo failed: ${(err as Error).message} (the runtime's log: ${logPath})`);
} finally {
  await shutdown();
  say('stopped and removed the control plane, the servers and the demo store (npm start keeps one running)');
}
process.exit(exitCode);
