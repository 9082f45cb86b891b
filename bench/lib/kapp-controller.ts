/**
 * Upstream kapp-controller (carvel.dev/kapp-controller v0.53.1, built from its Go module by
 * `layers/gobuild.ts`) run out of cluster against a local control plane, for the side-by-side
 * scenarios. As its Deployment does (`config/config/deployment.yml`), two processes of the same
 * binary: the controller and `--sidecarexec` (vendir, ytt, kbld, sops, helm and cue run there,
 * over the RPC socket `KAPPCTRL_SIDECAREXEC_SOCK`; kapp runs in the controller).
 *
 * What it needs out of cluster (read from `cmd/controller/*.go` and `pkg/**`):
 * - API access: controller-runtime's `config.GetConfigOrDie()` takes `KUBECONFIG` before the
 *   in-cluster config; the admin kubeconfig of the local cluster is given to the controller only
 *   (the sidecar, like upstream's, gets no credentials);
 * - `KAPPCTRL_SYSTEM_NAMESPACE` (required; where `kapp-controller-config` would live);
 * - `KAPPCTRL_MEM_TMP_DIR` (temp dirs and the vendir cache), `KAPPCTRL_SIDECAREXEC_SOCK`;
 * - for kapp's ServiceAccount kubeconfig (`pkg/kubeconfig/service_accounts.go`): the CA from
 *   `KAPPCTRL_KUBERNETES_CA_DATA` (PEM) instead of the pod's
 *   `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt`, and `KUBERNETES_SERVICE_HOST` /
 *   `KUBERNETES_SERVICE_PORT`, which kapp substitutes for `${KAPP_KUBERNETES_SERVICE_HOST_PORT}`;
 * - the tools on `PATH` (our pinned builds) and git (Debian) for vendir;
 * - flags `-start-api-server=false` (no aggregated API; our CRDs serve Package and
 *   PackageMetadata), `-metrics-bind-address=0` (no listener), `-namespace` (its cache and
 *   watches are limited to the benchmark namespace, so it never touches Apps of other runs).
 * The sidecar's CA-bundle update (`/etc/pki/tls/certs/ca-bundle.crt.orig`) finds no file and
 * logs an error, then carries on, as upstream does without a CA config.
 *
 * @module
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream, existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { binDir, binPath, buildComponent } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { loadKubeConfig } from './kube.js';

/** The tools kapp-controller runs (and those they run), from our cached builds. */
const TOOL_COMPONENTS = ['vendir', 'imgpkg', 'ytt', 'kbld', 'kapp', 'helm', 'sops', 'age', 'cue'];

/** Builds kapp-controller unless cached. @returns the binary's path. */
export async function ensureKappController(log: (m: string) => void): Promise<string> {
  const c = component('kapp-controller');
  await buildComponent(c, log);
  return binPath(c, 'kapp-controller');
}

/** Options of {@link startKappController}. */
export interface KappControllerOptions {
  kubeconfigPath: string;
  /** The one namespace it watches (`-namespace`) and its system namespace. */
  namespace: string;
  /** `-concurrency`. */
  concurrency: number;
  log: (m: string) => void;
  /** Give up waiting for the controllers' workers after this long. Default 60 000 ms. */
  startTimeoutMs?: number;
  /**
   * Controllers (controller-runtime names: `app`, `pkgi`, `pkgr`) whose workers must run
   * before the start counts as done. Default `['app']`.
   */
  controllers?: readonly string[];
}

/** A running kapp-controller (controller + sidecarexec). */
export interface KappController {
  /** Version it logged at start. */
  version: string;
  /** Milliseconds from spawning the sidecar to the awaited controllers' workers running. */
  startMs: number;
  /** CPU seconds (user + system, own and reaped children) of both processes so far. */
  cpuSeconds(): number;
  /** Resident set size of both processes now, bytes. */
  rssBytes(): number;
  /**
   * App reconciles that ran kapp so far: the App controller's `"Completed deploy"` log lines
   * (upstream `pkg/app/app_reconcile.go` logs one per reconcile that deploys; not the
   * "Reconcile noop" of an event before the App's timer is due).
   */
  deploys(): number;
  /** Stops both processes and removes the work directory. */
  stop(): Promise<void>;
}

let clkTck = 100;

/** utime+stime+cutime+cstime of a process, seconds (0 when it is gone). */
export function procCpuSeconds(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const f = (i: number) => Number(rest[i - 3]);
    return (f(14) + f(15) + f(16) + f(17)) / clkTck;
  } catch {
    return 0;
  }
}

/** VmRSS of a process, bytes (0 when it is gone). */
export function procRssBytes(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/**
 * Counts the complete lines holding `needle` over one or more streams of text chunks (a
 * process's stdout and stderr): each stream keeps its unfinished last line until the chunk
 * that ends it, so a line split across chunks counts once and a line still being written
 * not at all.
 */
export function lineCounter(needle: string): { readonly count: number; stream(): { push(chunk: string): void } } {
  let count = 0;
  return {
    get count() {
      return count;
    },
    stream() {
      let partial = '';
      return {
        push(chunk: string) {
          const lines = (partial + chunk).split('\n');
          partial = lines.pop() ?? '';
          for (const l of lines) if (l.includes(needle)) count++;
        },
      };
    },
  };
}

/** Reads the kernel's clock tick (`getconf CLK_TCK`) once; keeps 100 when that fails. */
export async function initClockTick(): Promise<void> {
  const out = await new Promise<string>((resolve) => {
    const c = spawn('getconf', ['CLK_TCK'], { stdio: ['ignore', 'pipe', 'ignore'] });
    let s = '';
    c.stdout.on('data', (d: Buffer) => {
      s += d.toString();
    });
    c.on('error', () => resolve(''));
    c.on('close', () => resolve(s));
  });
  const n = Number(out.trim());
  if (n > 0) clkTck = n;
}

function waitExit(child: ChildProcess, ms: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      child.kill('SIGKILL');
      resolve();
    }, ms);
    child.once('exit', () => {
      clearTimeout(t);
      resolve();
    });
  });
}

/**
 * Starts the sidecar, then the controller, and waits until the workers of `opts.controllers`
 * (default the App controller's) run.
 * @throws Error (with the tail of its log) when a process exits early or start-up times out.
 */
export async function startKappController(bin: string, opts: KappControllerOptions): Promise<KappController> {
  const t0 = performance.now();
  const work = await mkdtemp(path.join(tmpdir(), 'bench-kc-'));
  const mem = path.join(work, 'mem');
  const home = path.join(work, 'home');
  await mkdir(mem, { recursive: true });
  await mkdir(home, { recursive: true });
  const sock = path.join(work, 'sidecarexec.sock');
  const kc = loadKubeConfig(opts.kubeconfigPath);
  const cluster = kc.getCurrentCluster();
  if (!cluster?.caData) throw new Error('kapp-controller: the kubeconfig must embed the CA');
  const url = new URL(cluster.server);
  const toolPath = TOOL_COMPONENTS.map((n) => binDir(component(n)));
  const base: NodeJS.ProcessEnv = {
    PATH: [...toolPath, '/usr/local/bin', '/usr/bin', '/bin'].join(':'),
    HOME: home,
    LANG: 'C',
    KAPPCTRL_MEM_TMP_DIR: mem,
    KAPPCTRL_SIDECAREXEC_SOCK: sock,
    KAPPCTRL_SYSTEM_NAMESPACE: opts.namespace,
    KUBERNETES_SERVICE_HOST: url.hostname,
    KUBERNETES_SERVICE_PORT: url.port || '443',
  };
  const logFile = path.join(work, 'kapp-controller.log');
  const out = createWriteStream(logFile);
  let text = '';
  const completedDeploys = lineCounter('"Completed deploy"');
  const capture = (name: string) => {
    // one line buffer per stream, so a chunk boundary inside a line of one does not count twice
    const lines = completedDeploys.stream();
    return (d: Buffer) => {
      out.write(d);
      const s = d.toString();
      text = (text + s).slice(-200_000);
      lines.push(s);
      void name;
    };
  };
  const tail = () =>
    text
      .trim()
      .split('\n')
      .slice(-15)
      .map((l) => l.slice(0, 400))
      .join('\n');

  const sidecar = spawn(bin, ['--sidecarexec'], { env: base, stdio: ['ignore', 'pipe', 'pipe'] });
  sidecar.stdout?.on('data', capture('sidecar'));
  sidecar.stderr?.on('data', capture('sidecar'));
  let controller: ChildProcess | undefined;
  const stop = async () => {
    if (controller) {
      controller.kill('SIGTERM');
      await waitExit(controller, 5000);
    }
    sidecar.kill('SIGTERM');
    await waitExit(sidecar, 5000);
    out.end();
    await rm(work, { recursive: true, force: true });
  };
  try {
    const deadline = Date.now() + (opts.startTimeoutMs ?? 60_000);
    while (!existsSync(sock)) {
      if (sidecar.exitCode !== null) throw new Error(`sidecarexec exited ${sidecar.exitCode}`);
      if (Date.now() > deadline) throw new Error('sidecarexec did not open its socket');
      await new Promise((r) => setTimeout(r, 50));
    }
    controller = spawn(
      bin,
      [
        `-concurrency=${opts.concurrency}`,
        `-namespace=${opts.namespace}`,
        '-start-api-server=false',
        '-metrics-bind-address=0',
      ],
      {
        env: {
          ...base,
          KUBECONFIG: opts.kubeconfigPath,
          KAPPCTRL_KUBERNETES_CA_DATA: Buffer.from(cluster.caData, 'base64').toString('utf8'),
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    controller.stdout?.on('data', capture('controller'));
    controller.stderr?.on('data', capture('controller'));
    const started = (name: string) =>
      new RegExp(
        `"Starting workers"[^\\n]*"controller":"${name}"|"controller":"${name}"[^\\n]*"Starting workers"`,
      ).test(text);
    const controllers = opts.controllers ?? ['app'];
    for (;;) {
      if (controllers.every(started)) break;
      if (controller.exitCode !== null) throw new Error(`controller exited ${controller.exitCode}`);
      if (Date.now() > deadline) {
        throw new Error(`workers of ${controllers.filter((c) => !started(c)).join(', ')} did not start in time`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    const version = /"kapp-controller","version":"([^"]+)"/.exec(text)?.[1] ?? 'unknown';
    const pids = [sidecar.pid, controller.pid];
    opts.log(`kapp-controller ${version} running (-concurrency=${opts.concurrency}, -namespace=${opts.namespace})`);
    return {
      version,
      startMs: performance.now() - t0,
      cpuSeconds: () => pids.reduce<number>((a, p) => a + procCpuSeconds(p), 0),
      rssBytes: () => pids.reduce<number>((a, p) => a + procRssBytes(p), 0),
      deploys: () => completedDeploys.count,
      stop,
    };
  } catch (err) {
    const detail = tail();
    await stop();
    throw new Error(`start kapp-controller: ${(err as Error).message}\n${detail}`, { cause: err });
  }
}
