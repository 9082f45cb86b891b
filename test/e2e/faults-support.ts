/**
 * Shared pieces of the fault e2e tests (`faults*.test.ts`, issue 7, item 9): finding and
 * watching real processes through /proc (the kapp runs of an App, the API server of one
 * cluster), and an App whose kapp deploy waits on a Deployment for a while.
 *
 * Not a test file (vitest only collects `*.test.ts`).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, closeSync, mkdirSync, openSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { appManifest, kubeconfigPath } from './support.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));

/** argv of a live process, `undefined` when it is gone (or a zombie). */
export function argvOf(pid: string): string[] | undefined {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return raw ? raw.split('\0').filter((a, i, all) => a !== '' || i < all.length - 1) : undefined;
  } catch {
    return undefined;
  }
}

/** Live `kapp` processes (argv[0] is the kapp binary), by App (`--prev-app <name>-ctrl`). */
export function kappProcesses(): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const argv = argvOf(pid);
    if (!argv || path.basename(argv[0] ?? '') !== 'kapp') continue;
    for (const a of argv) {
      const m = /^(?:--prev-app=)?(.+)-ctrl$/.exec(a);
      if (m) out.set(m[1]!, [...(out.get(m[1]!) ?? []), Number(pid)]);
    }
  }
  return out;
}

/**
 * Samples /proc every 100 ms; `max` is the most kapp processes seen at once per App. It sees
 * every kapp of the machine, keyed by kapp app name only: a test names its Apps with its run's
 * random id, or another test run on the same machine (two clones' suites at once) counts as a
 * second kapp of its App.
 */
export function kappSampler() {
  const max = new Map<string, number>();
  const seen = new Map<string, Set<number>>();
  let samples = 0;
  const timer = setInterval(() => {
    samples++;
    for (const [app, pids] of kappProcesses()) {
      max.set(app, Math.max(max.get(app) ?? 0, pids.length));
      const s = seen.get(app) ?? new Set<number>();
      for (const p of pids) s.add(p);
      seen.set(app, s);
    }
  }, 100);
  return {
    max,
    seen,
    get samples() {
      return samples;
    },
    stop: () => clearInterval(timer),
  };
}

/**
 * The kube-apiserver of one cluster: a process whose argv[0] is `kube-apiserver` and whose argv
 * names both the cluster's work directory (the kubeconfig's directory) and its port.
 * @throws Error unless exactly one matches (never signal a guess: other clusters may run).
 */
export function apiServerPidOf(cluster: { kubeconfigPath: string; server: string }): number {
  const workdir = path.dirname(cluster.kubeconfigPath);
  const port = new URL(cluster.server).port;
  const found: number[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const argv = argvOf(pid);
    if (!argv || path.basename(argv[0] ?? '') !== 'kube-apiserver') continue;
    const joined = argv.join(' ');
    if (joined.includes(`${workdir}/`) && new RegExp(`[=:]${port}(\\s|$)`).test(joined)) found.push(Number(pid));
  }
  if (found.length !== 1) throw new Error(`expected one kube-apiserver for ${workdir} port ${port}, found ${found}`);
  return found[0]!;
}

/** Process state letter from /proc/<pid>/stat (`T` when stopped). */
export function procState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
}

/** A Deployment kapp waits on for about `minReadySeconds` (kwok Pods turn Ready at once). */
function slowDeployment(name: string, minReadySeconds: number): string {
  return [
    'apiVersion: apps/v1',
    'kind: Deployment',
    'metadata:',
    `  name: ${name}-slow`,
    'spec:',
    '  replicas: 1',
    `  minReadySeconds: ${minReadySeconds}`,
    `  selector: {matchLabels: {app: ${name}}}`,
    '  template:',
    `    metadata: {labels: {app: ${name}}}`,
    '    spec:',
    '      containers: [{name: c, image: registry.invalid/slow}]',
  ].join('\n');
}

/** An App deploying one Deployment that kapp waits on for about `minReadySeconds`. */
export function slowApp(ns: string, name: string, minReadySeconds: number): object {
  return appManifest(ns, name, {
    fetch: [{ inline: { paths: { 'deployment.yml': slowDeployment(name, minReadySeconds) } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: { rawOptions: ['--wait-timeout=180s'] } }],
  });
}

/** A `scripts/start.ts` runtime (forwarder and pipeline) in its own process group, logging to `logFile`. */
export interface ChildRuntime {
  proc: ChildProcess;
  exited: Promise<void>;
  logFile: string;
}

/**
 * Starts `npx tsx scripts/start.ts` serving only namespace `ns` (so it holds a Lease of its own
 * scope and runs alongside the other files), with its object store in `storeDir` and its
 * `TMPDIR` beside it (`storeDir` must be inside a directory the test removes).
 */
export function startChildRuntime(ns: string, storeDir: string, logFile: string): ChildRuntime {
  const fd = openSync(logFile, 'a');
  // Its scratch and staged tools go beside the store, inside the test's own directory: a
  // SIGKILLed runtime cannot remove them, the test's afterAll does.
  const tmp = path.join(path.dirname(storeDir), 'tmp');
  mkdirSync(tmp, { recursive: true });
  // Tool runs under other uids must traverse it (the runtime checks; `mkdtemp` made it 0700).
  chmodSync(path.dirname(storeDir), 0o711);
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    KUBECONFIG: kubeconfigPath,
    KAPP_LAMBDA_NAMESPACES: ns,
    KAPP_LAMBDA_STORE: storeDir,
    TMPDIR: tmp,
  };
  delete env.KAPP_LAMBDA_CONTEXTS;
  const proc = spawn('npx', ['tsx', 'scripts/start.ts'], { cwd: REPO, env, detached: true, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  return { proc, exited, logFile };
}

/** A child runtime's log so far ('' before it exists). */
export function childLog(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

/** SIGKILLs the whole process group of a child runtime and waits for it to exit. */
export async function killGroup(child: ChildRuntime): Promise<void> {
  if (child.proc.exitCode !== null || child.proc.signalCode !== null) return;
  try {
    process.kill(-(child.proc.pid ?? 0), 'SIGKILL');
  } catch {
    // already gone
  }
  await child.exited;
}
