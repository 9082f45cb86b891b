/**
 * Kills what a tool run leaves behind outside its own process group.
 *
 * The runner starts each tool in a new session and kills that process group when the tool
 * exits (`./runner.ts`), but a process can leave both (`setsid`, then a double fork) and keep
 * running. On Lambda every tool shares the function's uid, and an execution environment runs
 * one invocation after another: such a process, frozen with the sandbox and thawed with the next
 * invocation, could read the next App's run directories or fetched files (docs/decisions.md D2). The
 * runtime makes itself the child subreaper (`becomeSubreaper`, `./harden.ts`), so those processes
 * are re-parented to it, and this sweeper kills and reaps them once no tool run is in flight.
 *
 * What it never touches: the runtime's own children that share its session (an exec credential
 * plugin), and any process in the session of a tool run still in flight. kapp-controller has no
 * counterpart: its tools run in a sidecar container that lives as long as the controller.
 *
 * @module
 */

import { closeSync, openSync, readdirSync, readSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

/** The fields of `/proc/<pid>/stat` the sweeper reads. */
export interface ProcStat {
  pid: number;
  /** One letter: `R`, `S`, `D`, `Z` (zombie), `T`, ... */
  state: string;
  ppid: number;
  /** Session id: the pid of the process that called `setsid` (a tool run's launcher). */
  session: number;
}

/**
 * Parses one `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may hold
 * spaces and parentheses itself, so the fields are read after its last `)`.
 *
 * @returns the fields, or undefined for text that is not a stat line
 */
export function parseProcStat(text: string): ProcStat | undefined {
  const close = text.lastIndexOf(')');
  if (close < 0) return undefined;
  const pid = Number.parseInt(text, 10);
  // After ") ": state ppid pgrp session ...
  const [state, ppid, , session] = text.slice(close + 2).split(' ');
  if (!state || !Number.isInteger(pid) || ppid === undefined || session === undefined) return undefined;
  return { pid, state, ppid: Number(ppid), session: Number(session) };
}

/** Every process `/proc` lists now; a process that ends while it is read is skipped. */
export function listProcesses(procRoot = '/proc'): ProcStat[] {
  return scanProc('stat', (_pid, text) => parseProcStat(text), procRoot);
}

/** Bytes read of a `/proc/<pid>/stat` or `status` file (about 0.3 and 1.5 KiB). */
const PROC_FILE_READ_BYTES = 8192;

/**
 * `file` of every process `/proc` lists now, parsed; a process that ends while it is read (or
 * that `parse` refuses) is skipped. Synchronous reads into one buffer: the scan runs at every tool
 * run's end, and asynchronous reads (a thread-pool hop and a promise per process) cost about three
 * times the CPU (16 ms against 5 ms a scan at 70 processes). The event loop is held for those few
 * milliseconds.
 *
 * @throws the file system error when `procRoot` cannot be listed
 */
export function scanProc<T>(
  file: 'stat' | 'status',
  parse: (pid: number, text: string) => T | undefined,
  procRoot = '/proc',
): T[] {
  const buf = Buffer.allocUnsafe(PROC_FILE_READ_BYTES);
  const out: T[] = [];
  for (const name of readdirSync(procRoot)) {
    if (!/^\d+$/.test(name)) continue;
    let n: number;
    try {
      const fd = openSync(`${procRoot}/${name}/${file}`, 'r');
      try {
        n = readSync(fd, buf, 0, buf.length, 0);
      } finally {
        closeSync(fd);
      }
    } catch {
      continue; // Gone between the listing and the read.
    }
    const parsed = parse(Number(name), buf.toString('utf8', 0, n));
    if (parsed !== undefined) out.push(parsed);
  }
  return out;
}

/**
 * Tracks the tool runs in flight and kills what they leave behind. One per process: every
 * runner of the process reports its runs to the same sweeper.
 */
export interface OrphanSweeper {
  /** A tool run started; `session` is its launcher's pid (the runner starts it detached). */
  started(session: number): void;
  /** That run's process exited. */
  ended(session: number): void;
  /**
   * When no run is in flight: kills (SIGKILL) every child of this process outside its own
   * session and outside the session of any run started meanwhile, with everything below it (a
   * chain of any depth dies in one pass), and reaps those children, pass after pass (a process
   * forked between a pass's listing and its kills is re-parented here for the next one) until a
   * pass finds none or the time budget is spent. A zombie is killed too: a process whose main
   * thread exited shows `Z` while its other threads run. Resolves with the pids it killed or
   * reaped; does nothing while a run is in flight. Never throws.
   */
  sweep(): Promise<number[]>;
}

/** Options of {@link createOrphanSweeper}. */
export interface OrphanSweeperOptions {
  /** Reaps one adopted child without blocking (`becomeSubreaper`'s result). */
  reap: (pid: number) => number;
  /** Default `process.pid`. */
  self?: number;
  /** Default {@link listProcesses}. */
  list?: () => ProcStat[];
  /** Default `process.kill`. */
  kill?: (pid: number) => void;
  /** Time budget of one sweep, ms; default 10,000 (a fork loop is outrun within it). */
  budgetMs?: number;
  /** Pause between passes, ms; default 20 (a killed process needs a moment to become a zombie). */
  pauseMs?: number;
  /** Monotonic ms; default `performance.now`. */
  now?: () => number;
  /** Told when the budget ran out with processes left (their pids): the runtime logs it. */
  onGiveUp?: (left: number[]) => void;
}

/**
 * Creates the process's {@link OrphanSweeper}. The process must be the child subreaper
 * (`becomeSubreaper`), or what a tool leaves behind goes to init and is out of reach.
 */
export function createOrphanSweeper(opts: OrphanSweeperOptions): OrphanSweeper {
  const self = opts.self ?? process.pid;
  const list = opts.list ?? (() => listProcesses());
  const kill = opts.kill ?? ((pid: number) => process.kill(pid, 'SIGKILL'));
  const budgetMs = opts.budgetMs ?? 10_000;
  const pauseMs = opts.pauseMs ?? 20;
  const now = opts.now ?? (() => performance.now());
  const inFlight = new Set<number>();
  let ownSession: number | undefined;
  let running: Promise<number[]> | undefined;

  /** The stray children of this process and every process below them, in one listing. */
  const strays = (): { roots: number[]; all: number[] } => {
    const procs = list();
    ownSession ??= procs.find((p) => p.pid === self)?.session;
    const children = new Map<number, number[]>();
    for (const p of procs) {
      const kids = children.get(p.ppid);
      if (kids) kids.push(p.pid);
      else children.set(p.ppid, [p.pid]);
    }
    const roots = procs
      .filter((p) => p.ppid === self && p.session !== ownSession && !inFlight.has(p.session) && !inFlight.has(p.pid))
      .map((p) => p.pid);
    const all: number[] = [];
    const seen = new Set<number>([self]);
    const queue = [...roots];
    for (let pid = queue.shift(); pid !== undefined; pid = queue.shift()) {
      if (seen.has(pid)) continue;
      seen.add(pid);
      all.push(pid);
      queue.push(...(children.get(pid) ?? []));
    }
    return { roots, all };
  };

  const run = async (): Promise<number[]> => {
    const done = new Set<number>();
    const deadline = now() + budgetMs;
    let left: number[] = [];
    while (inFlight.size === 0) {
      let found: { roots: number[]; all: number[] };
      try {
        found = strays();
      } catch {
        break;
      }
      left = found.all;
      if (found.roots.length === 0) break;
      if (now() >= deadline) {
        opts.onGiveUp?.(left);
        break;
      }
      for (const pid of found.all) {
        try {
          kill(pid);
        } catch {
          // Already gone.
        }
        done.add(pid);
      }
      // Only this process's own children can be reaped here; the rest are re-parented to it.
      for (const pid of found.roots) opts.reap(pid);
      await sleep(pauseMs);
    }
    return [...done];
  };

  return {
    started: (session) => {
      inFlight.add(session);
    },
    ended: (session) => {
      inFlight.delete(session);
    },
    sweep: () => {
      if (inFlight.size > 0) return Promise.resolve([]);
      running ??= run().finally(() => {
        running = undefined;
      });
      return running;
    },
  };
}
