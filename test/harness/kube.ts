/**
 * Small Kubernetes helpers for the test harness: the locally built `kubectl` run with argv
 * arrays, a kubeconfig for a bearer token, and `@kubernetes/client-node` clients.
 *
 * Error messages carry the kubectl argv and its stderr, never a token or kubeconfig contents
 * (tokens only ever travel in a 0600 kubeconfig file, never on argv).
 */
import { spawn } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { stringify } from 'yaml';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { inProcessGet } from './kube-get.js';

/** Absolute path of the locally built kubectl (`~/.cache/kapp-lambda/bin/kubernetes-…/kubectl`). */
export function kubectlPath(): string {
  return binPath(component('kubernetes'), 'kubectl');
}

/** Outcome of one kubectl run. */
export interface KubectlResult {
  /** Full standard output. */
  readonly stdout: string;
  /** Full standard error. */
  readonly stderr: string;
  /** Process exit code (-1 when killed by a signal or the timeout). */
  readonly code: number;
}

/** Options of {@link kubectl}. */
export interface KubectlOptions {
  /** Text written to kubectl's standard input (e.g. a manifest for `apply -f -`). */
  readonly input?: string;
  /** When false, a non-zero exit resolves instead of throwing. Default true. */
  readonly check?: boolean;
  /** Kill kubectl after this many milliseconds. Default 60 000. */
  readonly timeoutMs?: number;
  /** kubectl binary; default {@link kubectlPath}. */
  readonly kubectl?: string;
}

/**
 * Runs the local kubectl with `--kubeconfig <kubeconfigPath>` followed by `args`, no shell. A
 * plain `get … -o json` of a common resource is answered in process, as kubectl would print it
 * (`kube-get.ts`: the suite polls objects hundreds of times, and it is CPU-bound on 2 cores).
 * @returns stdout, stderr and the exit code.
 * @throws Error `kubectl <args> exited <code>: <stderr>` when `check` is not false and the exit
 *   code is not 0, or when the binary cannot be started.
 */
export async function kubectl(
  kubeconfigPath: string,
  args: readonly string[],
  opts: KubectlOptions = {},
): Promise<KubectlResult> {
  const argv = ['--kubeconfig', kubeconfigPath, ...args];
  const bin = opts.kubectl ?? kubectlPath();
  const res =
    (opts.kubectl === undefined && opts.input === undefined ? await inProcessGet(kubeconfigPath, args) : undefined) ??
    (await new Promise<KubectlResult>((resolve, reject) => {
      const child = spawn(bin, argv, {
        stdio: ['pipe', 'pipe', 'pipe'],
        // Discovery cache next to the kubeconfig: clusters come and go on reused ports.
        env: {
          PATH: process.env.PATH ?? '/usr/bin:/bin',
          HOME: process.env.HOME ?? '/tmp',
          KUBECACHEDIR: path.join(path.dirname(kubeconfigPath), '.kubectl-cache'),
        },
      });
      let stdout = '';
      let stderr = '';
      const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
      child.stdout.on('data', (d: Buffer) => {
        stdout += d.toString();
      });
      child.stderr.on('data', (d: Buffer) => {
        stderr += d.toString();
      });
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new Error(`start kubectl ${args.join(' ')}`, { cause: err }));
      });
      child.on('close', (code) => {
        clearTimeout(timer);
        resolve({ stdout, stderr, code: code ?? -1 });
      });
      child.stdin.on('error', () => {});
      child.stdin.end(opts.input ?? '');
    }));
  if (res.code !== 0 && opts.check !== false) {
    throw new Error(`kubectl ${args.join(' ')} exited ${res.code}: ${res.stderr.trim().slice(-2000)}`);
  }
  return res;
}

/**
 * Loads a kubeconfig file into a client-node {@link KubeConfig}.
 * @throws Error when the file cannot be read or parsed.
 */
export function loadKubeConfig(kubeconfigPath: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  return kc;
}

/**
 * Writes a kubeconfig (mode 0600) that reaches the same API server as `adminKubeconfigPath`
 * (server URL and CA copied from its current context) but authenticates with `token` only.
 * Used to act as a ServiceAccount without putting the token on any argv.
 * @returns `outPath`.
 * @throws Error when the admin kubeconfig has no current cluster.
 */
export async function writeTokenKubeconfig(
  adminKubeconfigPath: string,
  token: string,
  outPath: string,
): Promise<string> {
  const admin = loadKubeConfig(adminKubeconfigPath);
  const cluster = admin.getCurrentCluster();
  if (!cluster) throw new Error(`kubeconfig ${adminKubeconfigPath} has no current cluster`);
  let caData = cluster.caData;
  if (!caData && cluster.caFile) caData = (await readFile(cluster.caFile)).toString('base64');
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster: { server: cluster.server, 'certificate-authority-data': caData } }],
    users: [{ name: 'u', user: { token } }],
    contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'c',
  };
  await writeFile(outPath, stringify(doc), { mode: 0o600 });
  return outPath;
}

/**
 * A namespace with a ServiceAccount bound to a namespace-scoped all-verbs Role, as
 * kapp-controller's `examples/rbac/default-ns.yml` does for `default`: what test and
 * benchmark Apps deploy with. Returns the objects (Namespace, ServiceAccount, Role,
 * RoleBinding) to apply.
 */
export function tenantManifests(ns: string, serviceAccount: string): Record<string, unknown>[] {
  return [
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } },
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: serviceAccount, namespace: ns } },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: `${serviceAccount}-role`, namespace: ns },
      rules: [{ apiGroups: ['*'], resources: ['*'], verbs: ['*'] }],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: `${serviceAccount}-role-binding`, namespace: ns },
      subjects: [{ kind: 'ServiceAccount', name: serviceAccount, namespace: ns }],
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: `${serviceAccount}-role` },
    },
  ];
}
