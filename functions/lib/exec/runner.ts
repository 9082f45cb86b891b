/**
 * THE command runner (style.md §4): every CLI kapp-lambda runs goes through {@link CommandRunner}.
 *
 * - argv arrays only, never a shell; the binary must be on an allow-list of names and is resolved
 *   to an absolute path by an injected `resolveBin` (kapp-controller's sidecar allow-list,
 *   `cmd/controller/sidecarexec.go`);
 * - a minimal environment (`PATH`, plus `HOME`, `TMPDIR` and the XDG directories of the run's
 *   own private directory, removed afterwards) plus what the caller passes explicitly; nothing is
 *   inherited from the parent process (no `KUBECONFIG`, no `AWS_*`);
 * - with a uid pool (root only), each run under its own unprivileged uid (`./sandbox.ts`),
 *   taken back only once nothing runs under it (`./uid-leases.ts`);
 * - timeout and `AbortSignal` cancellation kill the whole process group;
 * - output is bounded per stream, keeping the tail;
 * - a non-zero exit is a result, not a rejection. Error texts follow Go's `os/exec` and
 *   kapp-controller's `pkg/exec/cmd_runner.go` (`exit status 1`, `signal: killed`,
 *   `Already canceled`, `Process was canceled`) so that `attachError` in
 *   `../reconcile/status.ts` reproduces upstream status strings exactly.
 *
 * @module
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { StringDecoder } from 'node:string_decoder';
import { allowedStages, runBins, stageTools, TOOLS } from '../../../layers/tools.js';
import type { PipelineStage } from '../api/functions.js';
import type { ToolMetricsSink, ToolRunOutcome } from './metrics.js';
import type { OrphanSweeper } from './orphans.js';
import { handOver, makeRunDirs, type RunDirs, removeRunDirs, type UidPool } from './sandbox.js';
import { UidLeases } from './uid-leases.js';

/** Which output stream a chunk came from. */
export type OutputStream = 'stdout' | 'stderr';

/** One command to run. */
export interface RunRequest {
  /** Binary name (not a path); must be on the runner's allow-list. */
  cmd: string;
  /** Arguments after the binary. */
  args: readonly string[];
  /** Written to the process's stdin, which is then closed. Without it stdin is `/dev/null`. */
  stdin?: string | Uint8Array;
  /** Working directory; defaults to the runner's temp directory. */
  cwd?: string;
  /**
   * Extra environment variables, merged over the runner's minimal environment. This is the only
   * way a tool gets credentials (e.g. `KUBECONFIG` for kapp).
   */
  env?: Readonly<Record<string, string>>;
  /** Kill the process group after this many milliseconds; defaults to the runner's default. */
  timeoutMs?: number;
  /** Kill the process group when aborted. An already-aborted signal runs nothing. */
  signal?: AbortSignal;
  /**
   * When `signal` aborts: send SIGTERM to the process group first and SIGKILL only this many
   * milliseconds later, if it is still running (a tool that stops cleanly on SIGTERM, e.g. kapp
   * between two API calls). Default 0: SIGKILL at once. A timeout always kills at once.
   */
  killGraceMs?: number;
  /** Per-stream bound in bytes; the tail is kept. Defaults to the runner's default. */
  maxOutputBytes?: number;
  /** Called with each decoded output chunk as it arrives (progress streaming). Must not throw. */
  onOutput?: (chunk: string, stream: OutputStream) => void;
  /**
   * Directories the run may write besides its own private ones (a stage's scratch directory,
   * vendir's cache). With uid isolation they are handed to the run's uid before it starts
   * (see `handOver` in `./sandbox.ts`); without it they are simply used.
   */
  writable?: readonly string[];
}

/** The outcome of a run. */
export interface RunResult {
  /** Decoded stdout (its tail when truncated). */
  stdout: string;
  /** Decoded stderr (its tail when truncated). */
  stderr: string;
  /** Exit code; -1 when killed by a signal, timed out, canceled or not started. */
  exitCode: number;
  /** Set iff the run did not exit with 0. */
  error?: CommandError;
  /** Wall time from spawn to exit, milliseconds (0 when not started). */
  durationMs: number;
  /** Whether a stream exceeded `maxOutputBytes` and lost its head. */
  truncated: { stdout: boolean; stderr: boolean };
}

/** The port: runs one command. */
export interface CommandRunner {
  /**
   * Runs a command to completion.
   *
   * @returns The result; resolves for every process outcome (non-zero exit, signal, timeout,
   *   cancellation, spawn failure).
   * @throws {CommandNotAllowedError} (rejects) when `cmd` is not on the allow-list or is a path.
   */
  run(req: RunRequest): Promise<RunResult>;
}

// ---------------------------------------------------------------------------------------------
// Errors

/** Base of every error in {@link RunResult.error}; `exitCode` is -1 unless the process exited. */
export class CommandError extends Error {
  /** The allow-listed tool name. */
  readonly cmd: string;
  /** The process exit code, or -1. */
  readonly exitCode: number;

  /**
   * @param message - Error text.
   * @param cmd - Tool name.
   * @param exitCode - Exit code or -1.
   * @param options - `cause`.
   */
  constructor(message: string, cmd: string, exitCode: number, options?: ErrorOptions) {
    super(message, options);
    this.name = 'CommandError';
    this.cmd = cmd;
    this.exitCode = exitCode;
  }
}

/**
 * The process exited non-zero (`exit status <n>`) or was killed by a signal from outside
 * (`signal: killed`, exit code -1), like Go's `*exec.ExitError`.
 */
export class CommandExitError extends CommandError {
  /** The terminating signal, when there was one. */
  readonly signal: NodeJS.Signals | undefined;

  /**
   * @param cmd - Tool name.
   * @param exitCode - Exit code, or -1 for a signal.
   * @param signal - Terminating signal.
   */
  constructor(cmd: string, exitCode: number, signal?: NodeJS.Signals) {
    super(signal ? `signal: ${goSignalText(signal)}` : `exit status ${exitCode}`, cmd, signal ? -1 : exitCode);
    this.name = 'CommandExitError';
    this.signal = signal;
  }
}

/** The process ran longer than `timeoutMs` and its group was killed. */
export class CommandTimeoutError extends CommandError {
  /** The limit that was exceeded, milliseconds. */
  readonly timeoutMs: number;

  /**
   * @param cmd - Tool name.
   * @param timeoutMs - The limit.
   */
  constructor(cmd: string, timeoutMs: number) {
    super(`Process timed out after ${timeoutMs}ms`, cmd, -1);
    this.name = 'CommandTimeoutError';
    this.timeoutMs = timeoutMs;
  }
}

/**
 * The run was canceled through its `AbortSignal`: `Already canceled` when the signal was aborted
 * before start (nothing ran), `Process was canceled` when the process was killed
 * (kapp-controller `pkg/exec/cmd_runner.go` `RunWithCancel`). `cause` is the signal's reason.
 */
export class CommandCanceledError extends CommandError {
  /** Whether the process had started. */
  readonly started: boolean;

  /**
   * @param cmd - Tool name.
   * @param started - Whether the process had started.
   * @param reason - `signal.reason`.
   */
  constructor(cmd: string, started: boolean, reason: unknown) {
    super(started ? 'Process was canceled' : 'Already canceled', cmd, -1, { cause: reason });
    this.name = 'CommandCanceledError';
    this.started = started;
  }
}

/** The binary could not be resolved or started (`cause` is the underlying error). */
export class CommandStartError extends CommandError {
  /**
   * @param cmd - Tool name.
   * @param cause - Why it did not start.
   */
  constructor(cmd: string, cause: unknown) {
    const detail = cause instanceof Error ? ((cause as NodeJS.ErrnoException).code ?? cause.message) : String(cause);
    super(`failed to start ${cmd}: ${detail}`, cmd, -1, { cause });
    this.name = 'CommandStartError';
  }
}

/** Programming error: the command is not on the allow-list (the only reason `run` rejects). */
export class CommandNotAllowedError extends Error {
  /** The rejected command. */
  readonly cmd: string;

  /**
   * @param cmd - The rejected command.
   * @param allow - The allow-list, for the message.
   */
  constructor(cmd: string, allow: readonly string[]) {
    super(`command ${JSON.stringify(cmd)} is not allowed (allowed: ${allow.join(', ')})`);
    this.name = 'CommandNotAllowedError';
    this.cmd = cmd;
  }
}

/** Go's `syscall.Signal.String()` texts for the common signals. */
const GO_SIGNAL_TEXT: Readonly<Partial<Record<NodeJS.Signals, string>>> = {
  SIGKILL: 'killed',
  SIGTERM: 'terminated',
  SIGINT: 'interrupt',
  SIGHUP: 'hangup',
  SIGQUIT: 'quit',
  SIGABRT: 'aborted',
  SIGSEGV: 'segmentation fault',
  SIGPIPE: 'broken pipe',
  SIGBUS: 'bus error',
  SIGFPE: 'floating point exception',
  SIGILL: 'illegal instruction',
};

function goSignalText(signal: NodeJS.Signals): string {
  return GO_SIGNAL_TEXT[signal] ?? signal;
}

// ---------------------------------------------------------------------------------------------
// Defaults and options

/**
 * Carvel tools and their helpers kapp-lambda runs (the union of the per-stage lists, in the order
 * of `layers/tools.ts`), plus `git` for the fleet's source poll (`git ls-remote`,
 * `../fetch/git-ls-remote.ts`): the system's git, which the embedded runtime resolves from
 * {@link DEFAULT_SYSTEM_PATH} (vendir runs it from `PATH` too); on Lambda the fetch and index-repo
 * layers carry it (`layers/git.ts`). Today `vendir`, `imgpkg`, `ytt`, `kbld`, `kapp`, `helm`,
 * `sops`, `age`, `cue`, `kustomize`, `git`.
 */
export const TOOL_NAMES: readonly string[] = TOOLS.filter((t) => allowedStages(t).length > 0).flatMap(runBins);

/**
 * Tools each function may run (its allow-list on Lambda, and what its layer must carry), from the
 * tool table `layers/tools.ts`. Fetch and template never get kapp, the only tool that talks to the
 * cluster (kapp-controller's sidecar allow-list: vendir, ytt, kbld, sops, helm, cue; kustomize is
 * kapp-lambda's own template step).
 * `index-repo` runs a PackageRepository's whole reconcile in one invocation, as upstream's
 * in-memory App does: vendir (imgpkg for bundles and images; no helm: a repository has no
 * `helmChart` source), the fixed ytt + kbld pipeline, and kapp as the ServiceAccount `kapp-lambda-pkgr`.
 * `install` runs no tool: it selects a Package and writes an App, which the App pipeline renders
 * and deploys (upstream's PackageInstall reconciler runs none either). `git` is index-repo's for
 * the source poll's `git ls-remote`; vendir runs the layer's git from `PATH` in fetch and
 * index-repo without it being on the list.
 */
export const STAGE_TOOLS: Readonly<Record<PipelineStage, readonly string[]>> = {
  fetch: stageTools('fetch'),
  template: stageTools('template'),
  deploy: stageTools('deploy'),
  'index-repo': stageTools('index-repo'),
  install: stageTools('install'),
};

/** System directories appended to `PATH` (vendir runs `git` and `imgpkg` from `PATH`). */
export const DEFAULT_SYSTEM_PATH = '/usr/local/bin:/usr/bin:/bin';

/**
 * Default per-stream output bound: 64 MiB. Large because template stdout is data (the manifest
 * stream for kapp); status fields are bounded separately to 1 MiB (`truncateTail`).
 */
export const DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

/** Default timeout: 15 minutes, the longest an AWS Lambda invocation can run. */
export const DEFAULT_TIMEOUT_MS = 15 * 60 * 1000;

/** Configuration of {@link createCommandRunner}. */
export interface CommandRunnerOptions {
  /** Binary names that may run. */
  allow: readonly string[];
  /**
   * Maps an allowed name to an absolute path, e.g. `dirBinResolver('/opt/bin')` on Lambda or
   * `cacheBinResolver(root)` for the embedded runtime. May throw for an unknown name (the run
   * then fails with {@link CommandStartError}).
   */
  resolveBin: (name: string) => string;
  /**
   * The full base environment. Defaults to {@link minimalEnv} of these options: `PATH` (the
   * directories of the allowed tools, then {@link DEFAULT_SYSTEM_PATH}), `HOME` and `TMPDIR`.
   */
  baseEnv?: Readonly<Record<string, string>>;
  /** `HOME` of {@link minimalEnv}; each run overrides it with its own private `HOME`. */
  home?: string;
  /** Where each run's private directories are made; defaults to the OS temp directory. */
  tmpDir?: string;
  /** Defaults to {@link DEFAULT_TIMEOUT_MS}; 0 disables the timeout. */
  defaultTimeoutMs?: number;
  /** Defaults to {@link DEFAULT_MAX_OUTPUT_BYTES}. */
  defaultMaxOutputBytes?: number;
  /** Receives one sample per run. */
  metrics?: ToolMetricsSink;
  /** Monotonic milliseconds for durations; defaults to `performance.now`. */
  now?: () => number;
  /**
   * Run each tool under its own uid from this pool (requires root; see `./sandbox.ts`).
   * Default: none, every run keeps the runtime's uid. The embedded runtime turns it on when
   * it is root; `tmpDir` must then be traversable by other users and the binaries executable
   * by them (`ensureTraversable`, `stageBinaries`).
   */
  uidPool?: UidPool;
  /**
   * Told when a run's uid is quarantined: processes still ran under it after the run's end kept
   * killing them for `DEFAULT_EVICT_BUDGET_MS` (`./uid-leases.ts`), so it is never leased again;
   * `left` are their pids. The embedded runtime logs it and counts it. Default none.
   */
  onUidQuarantined?: (uid: number, left: readonly number[]) => void;
  /**
   * Absolute path of the tool launcher (`layers/native/launch.c`, `kl-launch`): each tool is
   * started through it so that it is killed when this process dies (`PR_SET_PDEATHSIG`), and a
   * runtime killed mid-deploy leaves no kapp running. Default: none (tools are started
   * directly and outlive a SIGKILLed runtime).
   */
  launcher?: string;
  /**
   * Absolute path of the egress connector (`layers/native/connect.c`, `kl-connect`), whose
   * directory goes on `PATH` ahead of {@link DEFAULT_SYSTEM_PATH}: where it is also installed as
   * `ssh` (the embedded runtime), vendir's git starts that wrapper, which sends ssh through the
   * egress proxy while one is in the environment (`../fetch/egress-proxy.ts`). Its directory
   * comes first on `PATH`. Default: none.
   */
  connector?: string;
  /**
   * The process's {@link OrphanSweeper} (`./orphans.ts`): each run is reported to it, and once
   * no run is in flight it kills what the runs left outside their process groups, before `run`
   * resolves. Needs this process to be the child subreaper. Default none: the Lambda entry sets
   * it (tools share the function's uid there); the embedded runtime does not, since the control
   * plane and test servers it may share a process with would be adopted too.
   */
  orphans?: OrphanSweeper;
}

/**
 * The minimal environment tools start from: `PATH`, `HOME`, `TMPDIR`, `GIT_CEILING_DIRECTORIES`
 * (the temp root). `PATH` lists the
 * connector's directory (its `ssh` wrapper) and the directories of the allowed tools (so vendir
 * finds imgpkg and helm) before {@link DEFAULT_SYSTEM_PATH}.
 *
 * @param opts - Allow-list, resolver, home and temp dir.
 * @returns A new environment object.
 */
export function minimalEnv(
  opts: Pick<CommandRunnerOptions, 'allow' | 'resolveBin' | 'home' | 'tmpDir' | 'connector'>,
): Record<string, string> {
  // The connector's directory first: its `ssh` must come before a tool directory that is a
  // system one (the system's git resolves to /usr/bin, where the real ssh is too).
  const dirs: string[] = opts.connector ? [path.dirname(opts.connector)] : [];
  for (const name of opts.allow) {
    try {
      const dir = path.dirname(opts.resolveBin(name));
      if (!dirs.includes(dir)) dirs.push(dir);
    } catch {
      // An unresolvable tool simply contributes no PATH entry; running it fails at start.
    }
  }
  const tmp = opts.tmpDir ?? tmpdir();
  return {
    PATH: [...dirs, DEFAULT_SYSTEM_PATH].join(':'),
    HOME: opts.home ?? tmp,
    TMPDIR: tmp,
    // Every run's directories are below the temp root: git looking for a repository from a
    // run's HOME (`git ls-remote` outside vendir's own clone) stops before the root, so a
    // `.git` planted there (Lambda's /tmp outlives invocations, and its tools share one uid)
    // never lends its config (`core.sshCommand`, hooks) to a later run.
    GIT_CEILING_DIRECTORIES: tmp,
  };
}

/**
 * A resolver for tools installed flat in one directory (Lambda layers: `/opt/bin`).
 *
 * @param dir - Absolute directory.
 * @returns `name => dir/name`.
 * @throws {Error} (from the resolver) for a name containing a path separator.
 */
export function dirBinResolver(dir: string): (name: string) => string {
  return (name) => {
    if (name.includes('/') || name === '' || name === '.' || name === '..')
      throw new Error(`invalid tool name ${name}`);
    return path.join(dir, name);
  };
}

// ---------------------------------------------------------------------------------------------
// Bounded output

/** Collects a stream's bytes, keeping at most `max` of the newest. */
class TailBuffer {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;

  constructor(private readonly max: number) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size > this.max && this.chunks.length > 1 && this.size - (this.chunks[0]?.length ?? 0) >= this.max) {
      this.size -= this.chunks.shift()?.length ?? 0;
      this.truncated = true;
    }
  }

  text(): string {
    let buf = Buffer.concat(this.chunks, this.size);
    if (buf.length > this.max) {
      let start = buf.length - this.max;
      while (start < buf.length && ((buf[start] ?? 0) & 0xc0) === 0x80) start++;
      buf = buf.subarray(start);
      this.truncated = true;
    }
    return buf.toString('utf8');
  }
}

// ---------------------------------------------------------------------------------------------
// The runner

/**
 * How long a run waits, after its tool exited (and its group and strays were killed), for the
 * output pipes to close, ms: 3,000. Only a process that left the tool's group holds them open
 * longer; the run then ends with the output read so far.
 */
export const CLOSE_GRACE_MS = 3_000;

function killGroup(pid: number | undefined, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

const LAUNCH_ERRNO: Readonly<Record<string, string>> = {
  'No such file or directory': 'ENOENT',
  'Permission denied': 'EACCES',
  'Exec format error': 'ENOEXEC',
};

/** The launcher's own failure (`kl-launch: <path>: <strerror>`) as an errno-coded error. */
function launchFailure(stderr: string): NodeJS.ErrnoException | undefined {
  const m = /^kl-launch: .*: ([^\n]+)\n?$/.exec(stderr);
  if (!m?.[1]) return undefined;
  return Object.assign(new Error(m[1]), { code: LAUNCH_ERRNO[m[1]] ?? m[1] });
}

/**
 * Creates the real {@link CommandRunner} on Node's `child_process.spawn`: no shell, detached
 * into its own process group (so a timeout or abort kills the tool and everything it started),
 * explicit environment, bounded output.
 *
 * After the process exits, any process it left in its group is killed too, so stray
 * grandchildren cannot hold the output pipes open.
 *
 * @param opts - Allow-list, binary resolver, environment, defaults, metrics.
 * @returns The runner.
 */
export function createCommandRunner(opts: CommandRunnerOptions): CommandRunner {
  const allow = new Set(opts.allow);
  const tmp = opts.tmpDir ?? tmpdir();
  const cfg: RunnerConfig = {
    opts,
    baseEnv: opts.baseEnv ?? minimalEnv(opts),
    now: opts.now ?? (() => performance.now()),
    defaultTimeout: opts.defaultTimeoutMs ?? DEFAULT_TIMEOUT_MS,
    defaultMax: opts.defaultMaxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
    record: (cmd, durationMs, exitCode, outcome) => {
      opts.metrics?.record({ tool: cmd, durationMs, exitCode, outcome });
    },
  };
  const leases = opts.uidPool
    ? new UidLeases(opts.uidPool, opts.onUidQuarantined ? { onQuarantine: opts.onUidQuarantined } : {})
    : undefined;
  /**
   * Ends a run's hold: kills what still runs under its uid before its directories go (a process
   * left behind could otherwise write them again), then frees the uid.
   */
  const endRun = async (uid: number | undefined, dirs: RunDirs | undefined): Promise<void> => {
    const cleanup = async () => {
      if (dirs) await removeRunDirs(dirs);
    };
    if (uid === undefined || !leases) await cleanup();
    else await leases.release(uid, cleanup);
  };
  const { record } = cfg;

  return {
    async run(req: RunRequest): Promise<RunResult> {
      if (!allow.has(req.cmd) || req.cmd.includes('/')) throw new CommandNotAllowedError(req.cmd, opts.allow);
      const empty = { stdout: '', stderr: '', truncated: { stdout: false, stderr: false } };

      if (req.signal?.aborted) {
        record(req.cmd, 0, -1, 'canceled');
        return {
          ...empty,
          exitCode: -1,
          durationMs: 0,
          error: new CommandCanceledError(req.cmd, false, req.signal.reason),
        };
      }

      let bin: string;
      try {
        bin = opts.resolveBin(req.cmd);
      } catch (cause) {
        record(req.cmd, 0, -1, 'start-failed');
        return { ...empty, exitCode: -1, durationMs: 0, error: new CommandStartError(req.cmd, cause) };
      }

      let uid: number | undefined;
      let dirs: RunDirs | undefined;
      try {
        uid = await leases?.acquire();
        dirs = await makeRunDirs(tmp, uid);
        if (uid !== undefined) for (const w of req.writable ?? []) await handOver(w, uid);
      } catch (cause) {
        await endRun(uid, dirs);
        record(req.cmd, 0, -1, 'start-failed');
        return { ...empty, exitCode: -1, durationMs: 0, error: new CommandStartError(req.cmd, cause) };
      }
      try {
        return await spawnRun(cfg, req, bin, dirs, uid);
      } finally {
        // Before the directories go: a process left behind could otherwise write them again.
        await opts.orphans?.sweep();
        await endRun(uid, dirs);
      }
    },
  };
}

/** What {@link createCommandRunner} settled from its options, shared by its runs. */
interface RunnerConfig {
  opts: CommandRunnerOptions;
  /** The base environment of every run ({@link minimalEnv} by default). */
  baseEnv: Readonly<Record<string, string>>;
  /** Monotonic milliseconds. */
  now: () => number;
  /** Timeout of a run that sets none, ms (0: none). */
  defaultTimeout: number;
  /** Output bound per stream of a run that sets none, bytes. */
  defaultMax: number;
  /** Records one run's metric sample. */
  record: (cmd: string, durationMs: number, exitCode: number, outcome: ToolRunOutcome) => void;
}

/** One spawned run's state, shared by the child's event handlers. */
interface SpawnState {
  /** The run's promise has resolved. */
  settled: boolean;
  /** What killed the tool's group, if this run did. */
  killedBy?: 'timeout' | 'canceled';
  /** The spawn's own error (the binary could not be started). */
  startError?: unknown;
  /** How the tool exited, once it did. */
  exit?: { code: number | null; signal: NodeJS.Signals | null };
  /** The timers to clear when the run ends: its timeout, the pipes' close grace, the cancel grace. */
  timers: { timeout?: NodeJS.Timeout; close?: NodeJS.Timeout; grace?: NodeJS.Timeout };
}

/**
 * Spawns one run (through the launcher when set) detached in its own group, and resolves with
 * its result once the pipes close (or {@link CLOSE_GRACE_MS} after the tool exited): the
 * timeout and the abort signal kill the group, the output is bounded and streamed to
 * `req.onOutput`, and the run's metric is recorded.
 */
function spawnRun(
  cfg: RunnerConfig,
  req: RunRequest,
  bin: string,
  dirs: RunDirs,
  uid: number | undefined,
): Promise<RunResult> {
  const { opts, now } = cfg;
  const max = req.maxOutputBytes ?? cfg.defaultMax;
  const timeoutMs = req.timeoutMs ?? cfg.defaultTimeout;
  const out = new TailBuffer(max);
  const err = new TailBuffer(max);
  const started = now();

  return new Promise<RunResult>((resolve) => {
    const s: SpawnState = { settled: false, timers: {} };
    const [file, argv] = opts.launcher
      ? [opts.launcher, [String(process.pid), bin, ...req.args]]
      : [bin, [...req.args]];
    const child = spawn(file, argv, {
      cwd: req.cwd ?? dirs.env.HOME,
      env: { ...cfg.baseEnv, ...dirs.env, ...req.env },
      ...(uid === undefined ? {} : { uid, gid: uid }),
      stdio: [req.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
      detached: true,
      shell: false,
      windowsHide: true,
    });
    const reportEnd = reportingEnd(opts, child.pid);
    const onAbort = armKills(child, req, timeoutMs, s);
    const flushOutput = pipeOutput(child, req, out, err);

    const finish = () => {
      if (s.settled) return;
      s.settled = true;
      reportEnd();
      for (const t of [s.timers.timeout, s.timers.close, s.timers.grace]) if (t) clearTimeout(t);
      req.signal?.removeEventListener('abort', onAbort);
      flushOutput();
      const durationMs = s.exit || s.killedBy ? now() - started : 0;
      const stdout = out.text();
      const stderr = err.text();
      const truncated = { stdout: out.truncated, stderr: err.truncated };
      const end = endOf(opts, req, s, err, timeoutMs);
      const result: RunResult = { stdout, stderr, exitCode: end.exitCode, durationMs, truncated };
      if (end.error) result.error = end.error;
      cfg.record(req.cmd, durationMs, result.exitCode, end.outcome);
      resolve(result);
    };

    child.on('error', (e) => {
      s.startError = e;
      // 'close' does not follow a failed spawn on every Node version; finish once streams end.
      if (child.pid === undefined) setImmediate(finish);
    });
    child.on('exit', (code, signal) => {
      s.exit = { code, signal };
      // Reap whatever the tool left behind in its group so the pipes close, and (with a
      // sweeper) what left the group, which may hold the pipes too.
      killGroup(child.pid);
      reportEnd();
      // A process outside the group (and beyond the sweeper's reach: the embedded runtime, or
      // a sweep that gave up) may still hold the pipes: the run ends anyway, a moment after
      // the tool, with the output read so far.
      void (opts.orphans?.sweep() ?? Promise.resolve()).then(() => {
        if (s.settled) return;
        s.timers.close = setTimeout(() => {
          child.stdout?.destroy();
          child.stderr?.destroy();
          finish();
        }, CLOSE_GRACE_MS);
      });
    });
    child.on('close', finish);
  });
}

/**
 * Arms the run's kills: its timeout (SIGKILL to the group) and, through the returned listener
 * of `req.signal`, its cancellation (SIGTERM first when `req.killGraceMs` is set). Whichever
 * comes first before the tool exits is the run's `killedBy`.
 */
function armKills(child: ChildProcess, req: RunRequest, timeoutMs: number, s: SpawnState): () => void {
  const onAbort = () => {
    if (s.killedBy === undefined && s.exit === undefined) {
      s.killedBy = 'canceled';
      const grace = req.killGraceMs ?? 0;
      if (grace > 0) {
        killGroup(child.pid, 'SIGTERM');
        s.timers.grace = setTimeout(() => killGroup(child.pid), grace);
      } else {
        killGroup(child.pid);
      }
    }
  };
  if (timeoutMs > 0) {
    s.timers.timeout = setTimeout(() => {
      if (s.killedBy === undefined && s.exit === undefined) {
        s.killedBy = 'timeout';
        killGroup(child.pid);
      }
    }, timeoutMs);
  }
  req.signal?.addEventListener('abort', onAbort, { once: true });
  return onAbort;
}

/**
 * Reports the run's session to the orphan sweeper as started, and returns the report of its
 * end. Reported once: once the launcher is reaped its pid is free, and a second report could
 * take a later run that reuses it off the sweeper's list of runs in flight.
 */
function reportingEnd(opts: CommandRunnerOptions, session: number | undefined): () => void {
  if (session !== undefined) opts.orphans?.started(session);
  let reportedEnd = session === undefined;
  return () => {
    if (reportedEnd || session === undefined) return;
    reportedEnd = true;
    opts.orphans?.ended(session);
  };
}

/**
 * Collects the child's output into the bounded buffers, streams it decoded to `req.onOutput`,
 * and writes `req.stdin`.
 * @returns the flush of the decoders' last characters, for the run's end.
 */
function pipeOutput(child: ChildProcess, req: RunRequest, out: TailBuffer, err: TailBuffer): () => void {
  const decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
  const onData = (stream: OutputStream, buf: TailBuffer) => (chunk: Buffer) => {
    buf.push(chunk);
    if (req.onOutput) {
      const text = decoders[stream].write(chunk);
      if (text !== '') req.onOutput(text, stream);
    }
  };
  child.stdout?.on('data', onData('stdout', out));
  child.stderr?.on('data', onData('stderr', err));

  if (child.stdin) {
    // The tool may exit without reading its input (EPIPE); its exit status tells the story.
    child.stdin.on('error', () => {});
    child.stdin.end(req.stdin);
  }
  return () => {
    if (!req.onOutput) return;
    for (const stream of ['stdout', 'stderr'] as const) {
      const rest = decoders[stream].end();
      if (rest !== '') req.onOutput(rest, stream);
    }
  };
}

/** How a run ended: its exit code, its error (Go `os/exec` texts) and its metric outcome. */
function endOf(
  opts: CommandRunnerOptions,
  req: RunRequest,
  s: SpawnState,
  err: TailBuffer,
  timeoutMs: number,
): { exitCode: number; error?: CommandError; outcome: ToolRunOutcome } {
  const { exit } = s;
  if (s.startError !== undefined && exit === undefined) {
    return { exitCode: -1, error: new CommandStartError(req.cmd, s.startError), outcome: 'start-failed' };
  }
  if (s.killedBy === 'timeout') {
    return { exitCode: -1, error: new CommandTimeoutError(req.cmd, timeoutMs), outcome: 'timeout' };
  }
  if (s.killedBy === 'canceled') {
    return { exitCode: -1, error: new CommandCanceledError(req.cmd, true, req.signal?.reason), outcome: 'canceled' };
  }
  if (exit?.signal) return { exitCode: -1, error: new CommandExitError(req.cmd, -1, exit.signal), outcome: 'signal' };
  if (opts.launcher && (exit?.code === 127 || exit?.code === 125) && launchFailure(err.text())) {
    return { exitCode: -1, error: new CommandStartError(req.cmd, launchFailure(err.text())), outcome: 'start-failed' };
  }
  if (exit && exit.code !== 0) {
    const exitCode = exit.code ?? -1;
    return { exitCode, error: new CommandExitError(req.cmd, exitCode), outcome: 'exit' };
  }
  return { exitCode: 0, outcome: 'ok' };
}
