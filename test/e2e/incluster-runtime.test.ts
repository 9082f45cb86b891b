/**
 * The in-cluster runtime (`release/kapp-lambda-runtime-<version>.yml`) reconciles with only what
 * a Pod gets: `npx tsx scripts/start.ts` in a child process whose environment has no
 * `KUBECONFIG` (and `HOME` has no `~/.kube/config`), only `KUBERNETES_SERVICE_HOST`/`_PORT` and a
 * ServiceAccount directory (`KAPP_LAMBDA_SERVICEACCOUNT_DIR`) holding a TokenRequest token of the
 * release's `kapp-lambda-runtime` ServiceAccount, the API server's CA and the namespace. The
 * ServiceAccount and its bindings are applied from the generated release, with the roles of the
 * main release they bind to, and nothing else: an inline App reconciled and the runtime holding
 * its Lease prove that RBAC suffices.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, closeSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { LEASE_ACQUIRED_MESSAGE } from '../../events/forwarder/leader.js';
import { leaseNameFor } from '../../events/forwarder/leadership.js';
import {
  packageVersion,
  RELEASE_DIR,
  RELEASE_NAMESPACE,
  type ReleaseDocument,
  RUNTIME_NAME,
  releaseFileName,
  runtimeReleaseFileName,
} from '../../scripts/release.js';
import { loadKubeConfig } from '../harness/kube.js';
import {
  apply,
  applyCrds,
  createTenant,
  deleteNamespaces,
  getApp,
  inlineConfigMapApp,
  k,
  kubeconfigPath,
  succeededAt,
  suffix,
  waitFor,
} from './support.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
const ns = `incluster-${suffix()}`;
const work = await mkdtemp(path.join(tmpdir(), 'incluster-'));
let child: ChildProcess | undefined;
let exited: Promise<void> | undefined;

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) {
    try {
      process.kill(-(child.pid ?? 0), 'SIGKILL');
    } catch {
      // already gone
    }
    await exited;
  }
  await deleteNamespaces([ns]);
  await rm(work, { recursive: true, force: true });
});

/** The documents of a committed release file. */
async function releaseDocs(file: string): Promise<ReleaseDocument[]> {
  const text = await readFile(path.join(RELEASE_DIR, file), 'utf8');
  return parseAllDocuments(text).map((d) => d.toJS() as ReleaseDocument);
}

describe('in-cluster runtime', () => {
  it('reconciles an App with only in-cluster configuration and the release RBAC', async () => {
    const version = await packageVersion();
    const main = await releaseDocs(releaseFileName(version));
    const runtime = await releaseDocs(runtimeReleaseFileName(version));
    // The roles the runtime's bindings name, from the main release; the runtime's own account
    // and bindings. No Deployment: this process is its Pod.
    const roles = main.filter((d) => d.kind === 'ClusterRole' || d.kind === 'Role');
    const account = runtime.filter((d) => ['ServiceAccount', 'ClusterRoleBinding', 'RoleBinding'].includes(d.kind));
    expect(account.filter((d) => d.kind !== 'ServiceAccount').length).toBeGreaterThan(0);
    await apply({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: RELEASE_NAMESPACE } }, ...roles, ...account);
    await applyCrds();
    await createTenant(ns);

    // What the kubelet mounts: a TokenRequest token, the cluster CA, the namespace.
    const token = (
      await k(['create', 'token', RUNTIME_NAME, '-n', RELEASE_NAMESPACE, '--duration', '1h'])
    ).stdout.trim();
    const cluster = loadKubeConfig(kubeconfigPath).getCurrentCluster();
    if (!cluster) throw new Error('the shared kubeconfig has no current cluster');
    const ca = cluster.caData ? Buffer.from(cluster.caData, 'base64') : readFileSync(cluster.caFile ?? '');
    const server = new URL(cluster.server);
    const saDir = path.join(work, 'serviceaccount');
    mkdirSync(saDir);
    await writeFile(path.join(saDir, 'token'), token);
    await writeFile(path.join(saDir, 'ca.crt'), ca);
    await writeFile(path.join(saDir, 'namespace'), RELEASE_NAMESPACE);

    const home = path.join(work, 'home');
    const tmp = path.join(work, 'tmp');
    mkdirSync(home);
    mkdirSync(tmp);
    // Tool runs under other uids must traverse the scratch (the runtime checks).
    chmodSync(work, 0o711);
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      // No ~/.kube/config there; the tool cache stays the one setup built.
      HOME: home,
      KAPP_LAMBDA_CACHE:
        process.env.KAPP_LAMBDA_CACHE ||
        path.join(process.env.XDG_CACHE_HOME ?? path.join(process.env.HOME ?? '', '.cache'), 'kapp-lambda'),
      KUBERNETES_SERVICE_HOST: server.hostname.replace(/^\[|\]$/g, ''),
      KUBERNETES_SERVICE_PORT: server.port || '443',
      KAPP_LAMBDA_SERVICEACCOUNT_DIR: saDir,
      KAPP_LAMBDA_NAMESPACES: ns,
      KAPP_LAMBDA_STORE: path.join(work, 'store'),
      KAPP_LAMBDA_METRICS_ADDRESS: 'off',
      TMPDIR: tmp,
    };
    const logFile = path.join(work, 'runtime.log');
    const fd = openSync(logFile, 'a');
    child = spawn('npx', ['tsx', 'scripts/start.ts'], { cwd: REPO, env, detached: true, stdio: ['ignore', fd, fd] });
    closeSync(fd);
    exited = new Promise<void>((resolve) => child?.once('exit', () => resolve()));
    const log = () => readFileSync(logFile, 'utf8');

    await apply(inlineConfigMapApp(ns, 'hello', 'in a pod'));
    const app = await waitFor(
      'the App reconciled by the in-cluster runtime',
      async () => {
        const a = await getApp(ns, 'hello');
        return a && succeededAt(1)(a) ? a : undefined;
      },
      { timeoutMs: 50_000, describe: () => `runtime log:\n${log()}` },
    );
    expect(app.status?.conditions?.map((c) => c.type)).toEqual(['ReconcileSucceeded']);
    expect(log()).toContain(
      `[start] in a cluster: serving ${cluster.server} as in-cluster with the ServiceAccount of ${saDir}`,
    );
    const cm = await k(['get', 'configmap', 'hello-config', '-n', ns, '-o', 'jsonpath={.data.greeting}']);
    expect(cm.stdout).toBe('in a pod');

    // It took the Lease of its scope, under the identity it logged.
    const acquired = log()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { msg?: string; identity?: string; lease?: string })
      .find((l) => l.msg === LEASE_ACQUIRED_MESSAGE);
    expect(acquired?.identity).toMatch(/_[0-9a-f]{8}$/);
    const lease = await k([
      'get',
      'lease',
      leaseNameFor([ns]),
      '-n',
      RELEASE_NAMESPACE,
      '-o',
      'jsonpath={.spec.holderIdentity}',
    ]);
    expect(lease.stdout).toBe(acquired?.identity);
  }, 60_000);
});
