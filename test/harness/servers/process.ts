/**
 * Process plumbing shared by the test servers: free loopback ports, temp dirs, child
 * processes started from argv arrays, readiness polling, and cleanup that also happens when
 * the parent dies without running its own teardown.
 *
 * Cleanup has two layers:
 * - a `process.on('exit')` hook that kills every live server process group and removes every
 *   temp dir synchronously (normal exit, uncaught error, `process.exit`);
 * - a small "reaper" child (one per parent process) that holds the read end of a pipe from
 *   the parent. When the parent dies for any reason, SIGKILL included, the pipe closes and the
 *   reaper kills the registered process groups and removes the registered dirs.
 */

import { type ChildProcess, spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';

/** Loopback address every test server binds to (never 0.0.0.0). */
export const LOOPBACK = '127.0.0.1';

/** Source of the reaper, run as `node -e`; plain CommonJS so it needs no build step. */
const REAPER_SOURCE = `
process.title = 'kapp-lambda-reaper';
const { rmSync } = require('node:fs');
const pids = new Set();
const dirs = new Set();
for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(s, () => {});
const kill = (pid, sig) => { try { process.kill(-pid, sig); } catch {} try { process.kill(pid, sig); } catch {} };
let buf = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf('\\n')) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    const sp = line.indexOf(' ');
    const op = line.slice(0, sp);
    const arg = line.slice(sp + 1);
    if (op === '+pid') pids.add(Number(arg));
    else if (op === '-pid') pids.delete(Number(arg));
    else if (op === '+dir') dirs.add(arg);
    else if (op === '-dir') dirs.delete(arg);
  }
});
process.stdin.on('end', () => {
  for (const p of pids) kill(p, 'SIGTERM');
  setTimeout(() => {
    for (const p of pids) kill(p, 'SIGKILL');
    for (const d of dirs) { try { rmSync(d, { recursive: true, force: true }); } catch {} }
    process.exit(0);
  }, pids.size ? 1500 : 0);
});
`;

const livePids = new Set<number>();
const liveDirs = new Set<string>();
let reaper: ChildProcess | undefined;
let exitHookInstalled = false;

function reaperSend(line: string): void {
  if (!reaper) {
    reaper = spawn(process.execPath, ['-e', REAPER_SOURCE], { stdio: ['pipe', 'ignore', 'ignore'], detached: true });
    reaper.on('error', () => {});
    reaper.stdin?.on('error', () => {});
    reaper.unref();
    (reaper.stdin as unknown as net.Socket | null)?.unref();
  }
  reaper.stdin?.write(`${line}\n`);
}

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const pid of livePids) killGroup(pid, 'SIGKILL');
    for (const dir of liveDirs) {
      try {
        rmSync(dir, { recursive: true, force: true });
      } catch {
        // best effort at exit; the reaper retries
      }
    }
  });
}

function killGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

/**
 * Registers a directory for removal when the parent process exits or dies.
 * {@link removeTempDir} removes it earlier and unregisters it.
 */
export function trackDir(dir: string): void {
  installExitHook();
  liveDirs.add(dir);
  reaperSend(`+dir ${dir}`);
}

/**
 * Creates a fresh directory under the OS temp dir (`<tmp>/kapp-lambda-<prefix>-XXXXXX`) that
 * is removed at parent exit at the latest.
 * @param prefix short name of what the dir holds, e.g. `s3`.
 * @returns absolute path of the new empty directory.
 */
export async function makeTempDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), `kapp-lambda-${prefix}-`));
  trackDir(dir);
  return dir;
}

/** Removes a directory made by {@link makeTempDir} (or passed to {@link trackDir}) now. */
export async function removeTempDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
  liveDirs.delete(dir);
  reaperSend(`-dir ${dir}`);
}

/**
 * Finds a TCP port that is free on 127.0.0.1 right now, by binding port 0 and closing it.
 * Another process may take it before the caller binds; {@link startProcess} callers retry.
 */
export async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, LOOPBACK, () => {
      const addr = srv.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      srv.close(() => (port ? resolve(port) : reject(new Error('listen on 127.0.0.1:0 gave no port'))));
    });
  });
}

/**
 * Polls `probe` every `intervalMs` until it returns true.
 * @throws Error naming `what` after `timeoutMs`, or the error `abort()` returns when it
 *   returns one (e.g. the server process exited).
 */
export async function waitUntil(
  what: string,
  probe: () => Promise<boolean>,
  opts: { timeoutMs?: number; intervalMs?: number; abort?: () => Error | undefined } = {},
): Promise<void> {
  const deadline = Date.now() + (opts.timeoutMs ?? 30_000);
  for (;;) {
    const aborted = opts.abort?.();
    if (aborted) throw aborted;
    if (await probe().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${opts.timeoutMs ?? 30_000} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? 100));
  }
}

/**
 * True when an HTTP GET of `url` gets any response with a status accepted by `ok`
 * (default: any status), within one second.
 */
export async function httpAnswers(url: string, ok: (status: number) => boolean = () => true): Promise<boolean> {
  const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
  await res.arrayBuffer();
  return ok(res.status);
}

/** A server child process started by {@link startProcess}. */
export interface ServerProcess {
  /** Process id; also the id of its own process group. */
  readonly pid: number;
  /** Last 64 KiB of its combined stdout and stderr. */
  output(): string;
  /** Exit code or signal once it exited, else undefined. */
  exited(): { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** SIGTERM to its process group, SIGKILL after `graceMs` (default 3000); resolves once it exited. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Spawns a long-running server from an argv array (no shell) in its own process group, with
 * stdin closed and output captured, and waits until `ready()` is true.
 * @param argv binary path and arguments.
 * @param opts.ready readiness probe, polled every 100 ms.
 * @param opts.timeoutMs how long to wait for readiness (default 30000).
 * @throws Error with the tail of the server's output when it exits before it is ready or
 *   does not become ready in time; the process is killed in both cases.
 */
export async function startProcess(
  name: string,
  argv: readonly string[],
  opts: { env?: NodeJS.ProcessEnv; cwd?: string; ready: () => Promise<boolean>; timeoutMs?: number },
): Promise<ServerProcess> {
  const [cmd, ...args] = argv;
  if (!cmd) throw new Error(`start ${name}: empty argv`);
  installExitHook();
  const child = spawn(cmd, args, {
    cwd: opts.cwd,
    env: opts.env ?? process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let out = '';
  const append = (d: Buffer) => {
    out = (out + d.toString()).slice(-64 * 1024);
  };
  child.stdout?.on('data', append);
  child.stderr?.on('data', append);
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  let spawnError: Error | undefined;
  const exitedPromise = new Promise<void>((resolve) => {
    child.on('exit', (code, signal) => {
      exit = { code, signal };
      resolve();
    });
    child.on('error', (e) => {
      spawnError = e;
      exit = { code: null, signal: null };
      resolve();
    });
  });
  const pid = child.pid;
  if (pid === undefined) {
    await exitedPromise;
    throw new Error(`start ${name}: spawn ${cmd} failed`, { cause: spawnError });
  }
  livePids.add(pid);
  reaperSend(`+pid ${pid}`);
  // the parent must not wait for servers to exit on its own
  child.unref();
  (child.stdout as net.Socket | null)?.unref();
  (child.stderr as net.Socket | null)?.unref();

  const proc: ServerProcess = {
    pid,
    output: () => out,
    exited: () => exit,
    async stop(graceMs = 3000) {
      if (!exit) {
        killGroup(pid, 'SIGTERM');
        const timer = setTimeout(() => killGroup(pid, 'SIGKILL'), graceMs);
        await exitedPromise;
        clearTimeout(timer);
      }
      // reap anything the server forked that outlived it
      killGroup(pid, 'SIGKILL');
      livePids.delete(pid);
      reaperSend(`-pid ${pid}`);
    },
  };
  try {
    await waitUntil(name, opts.ready, {
      timeoutMs: opts.timeoutMs,
      abort: () =>
        exit
          ? new Error(
              `${name} exited (${exit.code ?? exit.signal}) before it was ready: ${out.trim().split('\n').slice(-20).join('\n')}`,
              { cause: spawnError },
            )
          : undefined,
    });
  } catch (e) {
    await proc.stop(500);
    throw new Error(`start ${name}: ${(e as Error).message}`, { cause: e });
  }
  return proc;
}

/**
 * Starts a server on a fresh free port, retrying with another port (up to `attempts`, default
 * 3) when the start fails, e.g. because another process took the port meanwhile.
 * @throws the last start error.
 */
export async function withFreePort<T>(start: (port: number) => Promise<T>, attempts = 3): Promise<T> {
  let last: unknown;
  for (let i = 0; i < attempts; i++) {
    try {
      return await start(await freePort());
    } catch (e) {
      last = e;
    }
  }
  throw last;
}

/** A Node HTTP server on 127.0.0.1 serving a temp directory. */
export interface LoopbackHttpService {
  /** `http://127.0.0.1:<port>`, no trailing slash. */
  readonly baseUrl: string;
  /** The served directory. */
  readonly root: string;
  /** Closes the server and its connections, then removes `root`; idempotent. */
  stop(): Promise<void>;
}

/**
 * Listens with `handler` on a free 127.0.0.1 port, serving the temp dir `root`.
 * @param what - name for the error message, e.g. `git server`.
 * @throws Error `start <what>: listen on 127.0.0.1` (root removed) when it cannot listen.
 */
export async function startLoopbackHttp(
  what: string,
  root: string,
  handler: http.RequestListener,
): Promise<LoopbackHttpService> {
  const server = http.createServer(handler);
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, LOOPBACK, () => resolve());
    });
  } catch (e) {
    await removeTempDir(root);
    throw new Error(`start ${what}: listen on 127.0.0.1`, { cause: e });
  }
  server.unref();
  const { port } = server.address() as AddressInfo;
  let stopped: Promise<void> | undefined;
  return {
    baseUrl: `http://${LOOPBACK}:${port}`,
    root,
    stop() {
      stopped ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }).then(() => removeTempDir(root));
      return stopped;
    },
  };
}
