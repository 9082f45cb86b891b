/**
 * A local Kubernetes cluster for integration tests and the demo: etcd, kube-apiserver,
 * kube-controller-manager and kube-scheduler built from Go modules (`layers/manifest.ts`),
 * run by kwokctl's binary runtime on 127.0.0.1, plus kwok fake Nodes so Deployments get Pods
 * that turn Running/Ready (kapp's wait rules finish as on a real cluster).
 *
 * Each cluster owns a fresh work directory (`KWOK_WORKDIR`) and ports picked here, so several
 * clusters (even from several processes) run at once. Nothing is downloaded: every binary
 * kwokctl could fetch is given as a local path, and downloads go to a dead proxy.
 *
 * Teardown: {@link Cluster.stop}; also a synchronous kill on process exit and a detached
 * reaper process (`scripts/cluster.ts reap`) that cleans up when the owning process dies by
 * any signal, SIGKILL included (for `detached` clusters only while they start).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { stringify } from 'yaml';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';

/** Absolute paths of the binaries a cluster runs. */
export interface ClusterBinaries {
  readonly kwokctl: string;
  readonly kwok: string;
  readonly etcd: string;
  readonly kubeApiserver: string;
  readonly kubeControllerManager: string;
  readonly kubeScheduler: string;
  readonly kubectl: string;
}

/**
 * The locally built binaries from the Go build cache (`npm run setup` builds them).
 * Does not check that they exist; {@link startCluster} does.
 */
export function clusterBinaries(): ClusterBinaries {
  const k8s = component('kubernetes');
  const kwok = component('kwok');
  return {
    kwokctl: binPath(kwok, 'kwokctl'),
    kwok: binPath(kwok, 'kwok'),
    etcd: binPath(component('etcd'), 'etcd'),
    kubeApiserver: binPath(k8s, 'kube-apiserver'),
    kubeControllerManager: binPath(k8s, 'kube-controller-manager'),
    kubeScheduler: binPath(k8s, 'kube-scheduler'),
    kubectl: binPath(k8s, 'kubectl'),
  };
}

/** Options of {@link startCluster}. */
export interface ClusterOptions {
  /** Cluster name (`[a-z0-9-]`, at most 40 chars). Default `kl-<8 random hex>`. */
  readonly name?: string;
  /**
   * Work directory for kwokctl (`KWOK_WORKDIR`); must not exist or be empty. Default: a new
   * `kapp-lambda-cluster-*` directory under `baseDir`.
   */
  readonly workdir?: string;
  /** Parent of the default work directory. Default `os.tmpdir()`. */
  readonly baseDir?: string;
  /** Number of kwok fake Nodes (`kwok-node-0` …), each 32 CPU, 256Gi, 110 pods. Default 1. */
  readonly nodes?: number;
  /**
   * Keep the cluster running after this process exits (for `scripts/cluster.ts up`): exit
   * hook and reaper guard only the start-up. Stop it with {@link stopClusterAt}. Default false.
   */
  readonly detached?: boolean;
  /** Give up after this many milliseconds (the cluster is then torn down). Default 120 000. */
  readonly timeoutMs?: number;
  /** Progress lines (no secrets). Default: none. */
  readonly log?: (line: string) => void;
  /** Binary overrides; default {@link clusterBinaries}. */
  readonly binaries?: ClusterBinaries;
}

/** Milliseconds spent in each phase of {@link startCluster}. */
export interface ClusterTimings {
  /** `kwokctl create cluster` (PKI, config, start of every component, API served). */
  readonly kwokctlMs: number;
  /** From API served to `/readyz` ok, Nodes Ready and the `default` ServiceAccount present. */
  readonly readyMs: number;
  /** Whole call. */
  readonly totalMs: number;
}

/** A running cluster. */
export interface Cluster {
  /** kwokctl cluster name; the kubeconfig context is `kwok-<name>`. */
  readonly name: string;
  /** kwokctl work directory (`KWOK_WORKDIR`); removed by {@link Cluster.stop}. */
  readonly workdir: string;
  /**
   * Self-contained admin kubeconfig (certificates embedded, mode 0600, context `kwok-<name>`,
   * user in `system:masters`). Its contents are credentials: never log them.
   */
  readonly kubeconfigPath: string;
  /** API server URL, `https://127.0.0.1:<port>`. */
  readonly server: string;
  /** The kubectl tests should use (the locally built one). */
  readonly kubectlPath: string;
  /** Names of the kwok fake Nodes. */
  readonly nodeNames: readonly string[];
  /** Start-up timings. */
  readonly timings: ClusterTimings;
  /** Stops every component and removes the work directory. Idempotent; never throws. */
  stop(): Promise<void>;
}

const KUBE_VERSION = component('kubernetes').version;
const ETCD_VERSION = component('etcd').version;
const STATE_FILE = 'kapp-lambda-cluster.json';

/** What {@link startCluster} records in `<workdir>/kapp-lambda-cluster.json`. */
interface ClusterState {
  name: string;
  kubeconfigPath: string;
  server: string;
  ownerPid: number;
  detached: boolean;
}

/** Clusters of this process to kill synchronously on exit, by work directory. */
const active = new Map<string, { name: string }>();
let exitHookInstalled = false;

/** Ports handed out by this process, so two clusters started together never share one. */
const handedOut = new Set<number>();

/**
 * Starts a cluster and waits until it is usable: API `/readyz` ok, RBAC on
 * (`--authorization-mode=Node,RBAC`), admission on, every Node Ready and the `default`
 * ServiceAccount of namespace `default` created (Pods can be admitted).
 * @returns the running cluster; call {@link Cluster.stop} when done.
 * @throws Error when a binary is missing (run `npm run setup`), or kwokctl or a readiness
 *   check fails or times out; the message names the phase and carries the tails of kwokctl's
 *   output and the component logs. The half-started cluster is torn down first.
 */
export async function startCluster(opts: ClusterOptions = {}): Promise<Cluster> {
  const started = Date.now();
  const log = opts.log ?? (() => {});
  const bins = opts.binaries ?? clusterBinaries();
  for (const [k, p] of Object.entries(bins)) {
    if (!existsSync(p)) throw new Error(`start cluster: ${k} binary missing at ${p} (run \`npm run setup\`)`);
  }
  const name = opts.name ?? `kl-${randomBytes(4).toString('hex')}`;
  if (!/^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$/.test(name)) throw new Error(`start cluster: bad name ${name}`);
  const workdir = opts.workdir
    ? await ensureEmptyDir(opts.workdir)
    : await mkdtemp(path.join(opts.baseDir ?? tmpdir(), 'kapp-lambda-cluster-'));
  const deadline = started + (opts.timeoutMs ?? 120_000);
  const detached = opts.detached ?? false;
  const clusterDir = path.join(workdir, 'clusters', name);
  const kubeconfigPath = path.join(workdir, 'kubeconfig.yaml');

  // Guarded while starting even when detached (Ctrl-C during `cluster.ts up` leaves nothing).
  active.set(workdir, { name });
  installExitHook();
  const reaper = spawnReaper(workdir);
  const release = () => {
    active.delete(workdir);
    if (reaper?.stdin && !reaper.stdin.writableEnded) reaper.stdin.end('stop\n');
  };
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      await teardown(workdir).catch(() => {});
      release();
    })();
    return stopping;
  };

  try {
    let kwokctlMs = 0;
    let ports: Ports | undefined;
    for (let attempt = 1; ; attempt++) {
      ports = await pickPorts();
      const t0 = Date.now();
      log(`cluster ${name}: kwokctl create (api 127.0.0.1:${ports.apiserver})`);
      try {
        await kwokctlCreate(workdir, name, bins, ports, Math.max(deadline - Date.now(), 5_000));
        kwokctlMs = Date.now() - t0;
        break;
      } catch (err) {
        // A port taken between the pick and the bind is the one retryable failure.
        const logs = await componentLogTails(clusterDir);
        if (attempt >= 2 || !/address already in use/i.test(logs) || Date.now() > deadline) {
          throw new Error(`start cluster ${name}: kwokctl create: ${(err as Error).message}\n${logs}`, {
            cause: err,
          });
        }
        log(`cluster ${name}: port clash, retrying with new ports`);
        await teardown(workdir, { keepWorkdir: true });
        await rm(path.join(workdir, 'clusters'), { recursive: true, force: true });
      }
    }
    const server = `https://127.0.0.1:${ports.apiserver}`;
    await writeKubeconfig(clusterDir, name, server, kubeconfigPath);
    const state: ClusterState = { name, kubeconfigPath, server, ownerPid: process.pid, detached };
    await writeFile(path.join(workdir, STATE_FILE), `${JSON.stringify(state, null, 2)}\n`);

    const t1 = Date.now();
    const nodeNames = Array.from({ length: opts.nodes ?? 1 }, (_, i) => `kwok-node-${i}`);
    await waitReady(kubeconfigPath, bins.kubectl, nodeNames, deadline, (m) => log(`cluster ${name}: ${m}`));
    const readyMs = Date.now() - t1;
    const timings = { kwokctlMs, readyMs, totalMs: Date.now() - started };
    log(`cluster ${name}: ready in ${timings.totalMs}ms (kwokctl ${kwokctlMs}ms, nodes/SA ${readyMs}ms)`);
    if (detached) release();
    return { name, workdir, kubeconfigPath, server, kubectlPath: bins.kubectl, nodeNames, timings, stop };
  } catch (err) {
    const logs = existsSync(clusterDir) ? await componentLogTails(clusterDir) : '';
    await stop();
    if ((err as Error).message.startsWith(`start cluster ${name}`)) throw err;
    throw new Error(`start cluster ${name}: ${(err as Error).message}\n${logs}`, { cause: err });
  }
}

/**
 * Stops a cluster started elsewhere (e.g. `scripts/cluster.ts up`) from its work directory:
 * SIGKILL to kwokctl and each component, then removes the directory.
 * @returns false when `workdir` holds no cluster state (nothing to stop).
 */
export async function stopClusterAt(workdir: string): Promise<boolean> {
  const state = readState(workdir);
  if (!state) return false;
  await teardown(workdir);
  return true;
}

/**
 * Reads the state a cluster wrote into its work directory.
 * @returns name, kubeconfig path and server URL, or undefined when there is no cluster there.
 */
export function readClusterState(
  workdir: string,
): { name: string; kubeconfigPath: string; server: string } | undefined {
  const s = readState(workdir);
  return s ? { name: s.name, kubeconfigPath: s.kubeconfigPath, server: s.server } : undefined;
}

/**
 * Body of the reaper process (`scripts/cluster.ts reap <workdir>`): waits until standard
 * input closes; unless the owner wrote `stop` first (it already tore down), kills the
 * cluster's components and removes `workdir`. Resolves when done.
 */
export async function reapWhenOwnerGoes(workdir: string, input: NodeJS.ReadableStream): Promise<void> {
  let text = '';
  input.on('data', (d: Buffer | string) => {
    text += d.toString();
  });
  await new Promise<void>((resolve) => {
    input.on('end', resolve);
    input.on('close', resolve);
    input.on('error', () => resolve());
  });
  if (text.includes('stop')) return;
  killComponentsSync(workdir);
  rmSync(workdir, { recursive: true, force: true });
}

// ---------------------------------------------------------------------------------------------

interface Ports {
  apiserver: number;
  etcd: number;
  etcdPeer: number;
  kwokController: number;
  controllerManager: number;
  scheduler: number;
}

async function ensureEmptyDir(dir: string): Promise<string> {
  await mkdir(dir, { recursive: true });
  const entries = await readdir(dir);
  if (entries.length) throw new Error(`start cluster: work directory ${dir} is not empty`);
  return path.resolve(dir);
}

/**
 * Picks six free loopback ports at random in 20000–32000: below the kernel's ephemeral range
 * (outgoing connections never take them) and away from kwokctl's own allocator (which counts
 * down from 32766). Each is checked by binding 127.0.0.1 and the wildcard address.
 */
async function pickPorts(): Promise<Ports> {
  const out: number[] = [];
  while (out.length < 6) {
    const p = 20_000 + Math.floor(Math.random() * 12_000);
    if (handedOut.has(p) || out.includes(p)) continue;
    if ((await canBind(p, '127.0.0.1')) && (await canBind(p, '0.0.0.0'))) out.push(p);
  }
  for (const p of out) handedOut.add(p);
  const [apiserver, etcd, etcdPeer, kwokController, controllerManager, scheduler] = out as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  return { apiserver, etcd, etcdPeer, kwokController, controllerManager, scheduler };
}

function canBind(port: number, host: string): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once('error', () => resolve(false));
    srv.listen({ port, host, exclusive: true }, () => srv.close(() => resolve(true)));
  });
}

/** Environment for kwokctl: its own work dir, our kubectl first on PATH, no way to download. */
function kwokctlEnv(workdir: string, bins: ClusterBinaries): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    PATH: [path.dirname(bins.kubectl), process.env.PATH ?? '/usr/bin:/bin'].join(path.delimiter),
    HOME: process.env.HOME ?? workdir,
    KWOK_WORKDIR: workdir,
    // kwokctl falls back to `kubectl` on PATH and to release URLs for anything not given; any
    // download attempt fails at once on this dead proxy (loopback is never proxied by Go).
    HTTPS_PROXY: 'http://127.0.0.1:9',
    HTTP_PROXY: 'http://127.0.0.1:9',
    NO_PROXY: '127.0.0.1,localhost,::1',
  };
  return env;
}

async function kwokctlCreate(
  workdir: string,
  name: string,
  bins: ClusterBinaries,
  ports: Ports,
  timeoutMs: number,
): Promise<void> {
  const configPath = path.join(workdir, 'kwokctl.yaml');
  const config = {
    apiVersion: 'config.kwok.x-k8s.io/v1alpha1',
    kind: 'KwokctlConfiguration',
    options: {
      runtime: 'binary',
      bindAddress: '127.0.0.1',
      kubeVersion: KUBE_VERSION,
      etcdVersion: ETCD_VERSION.replace(/^v/, ''),
      securePort: true,
      kubeAuthorization: true,
      kubeAdmission: true,
      quietPull: true,
      cacheDir: path.join(workdir, 'cache'),
      kubeApiserverPort: ports.apiserver,
      etcdPort: ports.etcd,
      etcdPeerPort: ports.etcdPeer,
      kwokControllerPort: ports.kwokController,
      kubeControllerManagerPort: ports.controllerManager,
      kubeSchedulerPort: ports.scheduler,
      etcdBinary: bins.etcd,
      kubeApiserverBinary: bins.kubeApiserver,
      kubeControllerManagerBinary: bins.kubeControllerManager,
      kubeSchedulerBinary: bins.kubeScheduler,
      kwokControllerBinary: bins.kwok,
      kubectlBinary: bins.kubectl,
      // Anything else kwokctl might fetch points nowhere instead of at a release URL.
      kubeBinaryPrefix: path.join(workdir, 'no-download'),
      etcdBinaryPrefix: path.join(workdir, 'no-download'),
      kwokBinaryPrefix: path.join(workdir, 'no-download'),
    },
    // One instance of each: no leader election, so a paused API server (the fault e2e pauses it
    // for 20 s, beyond their 10 s renew deadline) does not make them exit and leave the shared
    // cluster without Deployments and scheduling for the test files after it.
    componentsPatches: ['kube-controller-manager', 'kube-scheduler'].map((component) => ({
      name: component,
      extraArgs: [{ key: 'leader-elect', value: 'false' }],
    })),
  };
  await writeFile(configPath, stringify(config));
  const argv = [
    '--name',
    name,
    '--config',
    configPath,
    'create',
    'cluster',
    '--runtime',
    'binary',
    // Never touch ~/.kube/config: the harness writes its own kubeconfig.
    '--kubeconfig',
    '',
    '--timeout',
    `${Math.ceil(timeoutMs / 1000)}s`,
  ];
  await runQuiet(bins.kwokctl, argv, kwokctlEnv(workdir, bins), timeoutMs + 5_000);
}

interface ExecResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command without a shell, output captured (stdin from `input`, else empty). */
function exec(
  bin: string,
  argv: readonly string[],
  opts: { env: NodeJS.ProcessEnv; timeoutMs: number; input?: string },
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, argv, { env: opts.env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs);
    child.stdout.on('data', (d: Buffer) => {
      stdout = (stdout + d.toString()).slice(-64_000);
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-16_000);
    });
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`start ${path.basename(bin)}`, { cause: err }));
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(opts.input ?? '');
  });
}

/** Like {@link exec}; rejects with the command and its output tail on a non-zero exit. */
async function runQuiet(bin: string, argv: readonly string[], env: NodeJS.ProcessEnv, timeoutMs: number) {
  const r = await exec(bin, argv, { env, timeoutMs });
  if (r.code !== 0) {
    throw new Error(`${path.basename(bin)} ${argv.join(' ')} exited ${r.code}:\n${(r.stdout + r.stderr).trim()}`);
  }
  return r.stdout;
}

/**
 * The local kubectl against `kubeconfigPath`, discovery cache beside it. Kept here rather
 * than in `./kube.ts` so the reaper process does not load `@kubernetes/client-node`.
 */
function kubectlAt(kubeconfigPath: string, kubectlBin: string) {
  const env = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? '/tmp',
    KUBECACHEDIR: path.join(path.dirname(kubeconfigPath), '.kubectl-cache'),
  };
  return (args: readonly string[], opts: { input?: string; timeoutMs?: number } = {}) =>
    exec(kubectlBin, ['--kubeconfig', kubeconfigPath, ...args], {
      env,
      timeoutMs: opts.timeoutMs ?? 60_000,
      input: opts.input,
    });
}

/** Writes a kubeconfig with the admin certificate, key and CA embedded. */
async function writeKubeconfig(clusterDir: string, name: string, server: string, out: string): Promise<void> {
  const pki = path.join(clusterDir, 'pki');
  const b64 = async (f: string) => (await readFile(path.join(pki, f))).toString('base64');
  const ctx = `kwok-${name}`;
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: ctx, cluster: { server, 'certificate-authority-data': await b64('ca.crt') } }],
    users: [
      {
        name: ctx,
        user: { 'client-certificate-data': await b64('admin.crt'), 'client-key-data': await b64('admin.key') },
      },
    ],
    contexts: [{ name: ctx, context: { cluster: ctx, user: ctx } }],
    'current-context': ctx,
  };
  await writeFile(out, stringify(doc), { mode: 0o600 });
}

/** A kwok-managed fake Node, sized for any test workload. */
function fakeNode(name: string): object {
  const resources = { cpu: '32', memory: '256Gi', pods: '110', 'ephemeral-storage': '1Ti' };
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name,
      annotations: { 'node.alpha.kubernetes.io/ttl': '0', 'kwok.x-k8s.io/node': 'fake' },
      labels: {
        'kubernetes.io/arch': 'amd64',
        'kubernetes.io/os': 'linux',
        'kubernetes.io/hostname': name,
        'kubernetes.io/role': 'agent',
        'node-role.kubernetes.io/agent': '',
        type: 'kwok',
      },
    },
    spec: {},
    status: {
      allocatable: resources,
      capacity: resources,
      nodeInfo: {
        architecture: 'amd64',
        operatingSystem: 'linux',
        osImage: 'kwok',
        kernelVersion: 'kwok',
        containerRuntimeVersion: 'kwok',
        kubeletVersion: 'fake',
        kubeProxyVersion: 'fake',
        machineID: name,
        systemUUID: name,
        bootID: name,
      },
      phase: 'Running',
    },
  };
}

async function waitReady(
  kubeconfigPath: string,
  kubectlBin: string,
  nodeNames: string[],
  deadline: number,
  log: (line: string) => void,
) {
  const t0 = Date.now();
  const left = () => `${Math.max(1, Math.ceil((deadline - Date.now()) / 1000))}s`;
  const run = kubectlAt(kubeconfigPath, kubectlBin);
  const k = async (args: string[]) => {
    const r = await run(args, { timeoutMs: deadline - Date.now() + 5_000 });
    if (r.code !== 0) throw new Error(`kubectl ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
  };
  // kwokctl returns once /version is served; RBAC bootstrap and CRD informers finish by
  // /readyz. Nodes are created meanwhile (a raw POST: no OpenAPI download as `apply` does).
  const readyz = (async () => {
    for (;;) {
      const r = await run(['get', '--raw', '/readyz'], { timeoutMs: 10_000 });
      if (r.code === 0 && r.stdout.trim() === 'ok') break;
      if (Date.now() > deadline) throw new Error(`wait for /readyz: ${r.stdout}${r.stderr}`.trim());
      await new Promise((res) => setTimeout(res, 100));
    }
    log(`/readyz ok after ${Date.now() - t0}ms`);
  })();
  const nodes = Promise.all(
    nodeNames.map(async (n) => {
      for (;;) {
        const r = await run(['create', '--raw', '/api/v1/nodes', '-f', '-'], {
          input: JSON.stringify(fakeNode(n)),
          timeoutMs: 10_000,
        });
        if (r.code === 0 || /AlreadyExists|already exists/.test(r.stderr)) return;
        if (Date.now() > deadline) throw new Error(`create node ${n}: ${r.stderr.trim()}`);
        await new Promise((res) => setTimeout(res, 100));
      }
    }),
  );
  await Promise.all([readyz, nodes]);
  if (nodeNames.length) {
    log(`nodes created after ${Date.now() - t0}ms`);
    await k(['wait', '--for=condition=Ready', '--timeout', left(), ...nodeNames.map((n) => `node/${n}`)]);
    log(`nodes ready after ${Date.now() - t0}ms`);
  }
  // The ServiceAccount admission plugin rejects Pods until the `default` SA exists.
  await k(['wait', '--for=create', '--timeout', left(), '-n', 'default', 'serviceaccount/default']);
  log(`default ServiceAccount after ${Date.now() - t0}ms`);
}

/** Tail of kwokctl's component logs, for error messages. */
async function componentLogTails(clusterDir: string): Promise<string> {
  const dir = path.join(clusterDir, 'logs');
  let files: string[];
  try {
    files = await readdir(dir);
  } catch {
    return '';
  }
  const parts: string[] = [];
  for (const f of files.sort()) {
    const p = path.join(dir, f);
    if (!(await stat(p)).isFile()) continue;
    const lines = (await readFile(p, 'utf8')).trim().split('\n').slice(-8);
    parts.push(`--- ${f}\n${lines.join('\n')}`);
  }
  return parts.join('\n');
}

/**
 * Stops a cluster's processes and removes its work directory. The cluster is throw-away, so
 * there is no graceful shutdown (kube-apiserver alone takes seconds on SIGTERM): SIGKILL,
 * then wait (at most 5 s) until every process is gone.
 */
async function teardown(workdir: string, opts: { keepWorkdir?: boolean } = {}): Promise<void> {
  const until = Date.now() + 5_000;
  for (;;) {
    const pids = componentPids(workdir).filter(isAlive);
    if (!pids.length || Date.now() > until) break;
    for (const pid of pids) signal(pid, 'SIGKILL');
    await new Promise((res) => setTimeout(res, 20));
  }
  if (!opts.keepWorkdir) await rm(workdir, { recursive: true, force: true, maxRetries: 3 });
}

/**
 * Pids of every process (other than this one) whose command line names a path under
 * `workdir`: kwokctl (`--config <workdir>/kwokctl.yaml`) and each component it forked
 * (`<workdir>/clusters/<name>/bin/...`). Read from /proc rather than kwokctl's pid files, so
 * a component started by a kwokctl that was itself interrupted is found too, and a reused pid
 * is never touched. The reaper (`reap <workdir>`, no trailing slash) does not match.
 */
function componentPids(workdir: string): number[] {
  const needle = `${workdir}/`;
  const out: number[] = [];
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return out;
  }
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    const pid = Number(e);
    if (pid === process.pid) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(needle)) out.push(pid);
    } catch {
      // gone already
    }
  }
  return out;
}

function isAlive(pid: number): boolean {
  try {
    // A zombie still has /proc/<pid>; its state letter is Z.
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // gone already
  }
}

/**
 * SIGKILLs every process of the cluster under `workdir`; synchronous, for exit paths. Scans
 * again after each round in case an interrupted kwokctl forked one more component.
 */
function killComponentsSync(workdir: string): void {
  for (let round = 0; round < 5; round++) {
    const pids = componentPids(workdir);
    if (!pids.length) return;
    for (const pid of pids) signal(pid, 'SIGKILL');
  }
}

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const workdir of active.keys()) {
      killComponentsSync(workdir);
      try {
        rmSync(workdir, { recursive: true, force: true });
      } catch {
        // best effort
      }
    }
  });
}

/**
 * Starts `scripts/cluster.ts reap <workdir>` detached, holding the write end of its stdin.
 * The pipe closes when this process ends in any way, and the reaper then cleans up.
 */
function spawnReaper(workdir: string): ChildProcess | undefined {
  const script = fileURLToPath(new URL('../../scripts/cluster.ts', import.meta.url));
  let loader: string;
  try {
    loader = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
  } catch {
    return undefined;
  }
  const child = spawn(process.execPath, ['--import', loader, script, 'reap', workdir], {
    detached: true,
    stdio: ['pipe', 'ignore', 'ignore'],
  });
  child.on('error', () => {});
  child.stdin?.on('error', () => {});
  child.unref();
  (child.stdin as unknown as { unref?: () => void } | null)?.unref?.();
  return child;
}

function readState(workdir: string): ClusterState | undefined {
  try {
    return JSON.parse(readFileSync(path.join(workdir, STATE_FILE), 'utf8')) as ClusterState;
  } catch {
    return undefined;
  }
}
