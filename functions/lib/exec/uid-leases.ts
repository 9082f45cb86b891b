/**
 * The root runtime's tool uids (`./sandbox.ts`), leased one per run in flight and taken back
 * only once nothing runs under them.
 *
 * A process a tool leaves behind (a daemonized child, a `sleep` forked by a helm plugin, a
 * process that left its group with `setsid`) keeps the run's uid. Were that uid handed to the
 * next run as is, the process could read that run's files and `/proc/<pid>/environ`, kapp's
 * kubeconfig included. So when a run ends, one scan of `/proc` finds every process under its
 * uid (real, effective, saved or file-system uid), kills it (SIGKILL) and scans again, until none
 * is left; only then does the uid go back to the pool. A uid that still has processes after
 * {@link DEFAULT_EVICT_BUDGET_MS} is quarantined instead: never leased again by this table, and
 * reported (`onQuarantine`), so a run never waits long on another's leftovers.
 *
 * Two runtimes on one host (tests run several) would otherwise lease the same uids and kill each
 * other's tools: a leased uid is also held host-wide ({@link UidLock}), and a table skips a uid
 * another process holds. The first lease of each uid by a table scans too, so a runtime
 * restarted on a host takes nothing its predecessor's leftovers still run under.
 *
 * kapp-controller has no counterpart: its tools share the sidecar's one uid.
 *
 * @module
 */
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { scanProc } from './orphans.js';
import type { UidPool } from './sandbox.js';

/** What the pool reads of one process in `/proc/<pid>/status`. */
export interface ProcCreds {
  pid: number;
  /** One letter: `R`, `S`, `D`, `Z` (zombie), `T`, ... */
  state: string;
  /** Threads still running: a zombie leader whose other threads run has more than one. */
  threads: number;
  /** Real, effective, saved and file-system uid. */
  uids: number[];
}

/**
 * Parses a `/proc/<pid>/status` text. The kernel escapes the command name (`Name:`), so a
 * process cannot forge a `Uid:` line with its name.
 *
 * @returns the fields, or undefined for text without `State:`, `Threads:` and `Uid:` lines
 */
export function parseProcStatus(pid: number, text: string): ProcCreds | undefined {
  let state: string | undefined;
  let threads: number | undefined;
  let uids: number[] | undefined;
  for (const line of text.split('\n')) {
    const [key, value = ''] = line.split(':\t');
    if (key === 'State') state = value.charAt(0);
    else if (key === 'Threads') threads = Number.parseInt(value, 10);
    else if (key === 'Uid') uids = value.split('\t').map((n) => Number.parseInt(n, 10));
  }
  if (!state || threads === undefined || !Number.isInteger(threads) || !uids?.length) return undefined;
  if (!uids.every(Number.isInteger)) return undefined;
  return { pid, state, threads, uids };
}

/**
 * Every process `/proc` lists now (one read of each `status`, {@link scanProc}); a process that
 * ends while it is read is skipped.
 *
 * @throws the file system error when `procRoot` cannot be listed
 */
export async function listProcessCreds(procRoot = '/proc'): Promise<ProcCreds[]> {
  return scanProc('status', parseProcStatus, procRoot);
}

/**
 * Whether a process runs under `uid`: any of its uids is `uid` (a setuid binary it started keeps
 * the real one), and it is not a zombie whose every thread has exited (which runs nothing and
 * holds nothing; a parent that never reaps would keep it listed forever).
 */
export function runsUnder(p: ProcCreds, uid: number): boolean {
  return p.uids.includes(uid) && !(p.state === 'Z' && p.threads <= 1);
}

/** A host-wide hold of one uid, so that two runtimes on one host never lease the same one. */
export interface UidLock {
  /** Resolves with the hold's release, or undefined when another holder has `uid`. */
  tryLock(uid: number): Promise<(() => void) | undefined>;
}

/**
 * A {@link UidLock} on Linux abstract unix sockets (`\0<prefix><uid>`): the kernel gives a name to
 * one socket at a time and frees it when its process dies, so a crashed runtime holds nothing.
 * A tool can bind such a name too; it then holds that uid only while it runs, since the run's end
 * kills it.
 *
 * @param prefix - default `kapp-lambda/tool-uid/`
 */
export function abstractSocketUidLock(prefix = 'kapp-lambda/tool-uid/'): UidLock {
  return {
    tryLock: (uid) =>
      new Promise((resolve, reject) => {
        const server = createServer();
        server.once('error', (err: NodeJS.ErrnoException) => {
          if (err.code === 'EADDRINUSE') resolve(undefined);
          else reject(new Error(`lock tool uid ${uid}`, { cause: err }));
        });
        server.listen({ path: `\0${prefix}${uid}` }, () => {
          server.unref();
          resolve(() => server.close());
        });
      }),
  };
}

/** How long a run's end keeps killing what runs under its uid before quarantining it, ms: 5,000. */
export const DEFAULT_EVICT_BUDGET_MS = 5_000;

/** Options of {@link UidLeases}; every default is the real one. */
export interface UidLeasesOptions {
  /** Default {@link listProcessCreds}. */
  list?: () => Promise<ProcCreds[]>;
  /** Default `process.kill(pid, 'SIGKILL')`; may throw (the process is gone). */
  kill?: (pid: number) => void;
  /** Default {@link abstractSocketUidLock}. */
  lock?: UidLock;
  /** Default {@link DEFAULT_EVICT_BUDGET_MS}. */
  budgetMs?: number;
  /** Pause between a kill and the next scan, ms; default 20 (a killed process needs a moment). */
  pauseMs?: number;
  /** How often a run waiting while every free uid is held elsewhere tries again, ms; default 250. */
  retryMs?: number;
  /** Monotonic ms; default `performance.now`. */
  now?: () => number;
  /** Told when a uid is quarantined, with the pids still running under it: the runtime logs it. */
  onQuarantine?: (uid: number, left: readonly number[]) => void;
}

/**
 * Hands out uids of a {@link UidPool} to runs in flight; a waiting run gets the next free one.
 * A uid goes back only through {@link release}, which first kills everything under it.
 */
export class UidLeases {
  private readonly free: number[];
  private readonly waiters: ((uid: number | undefined) => void)[] = [];
  private readonly held = new Map<number, () => void>();
  private readonly scanned = new Set<number>();
  private readonly jailed = new Set<number>();
  private readonly list: () => Promise<ProcCreds[]>;
  private readonly kill: (pid: number) => void;
  private readonly lock: UidLock;
  private readonly now: () => number;

  /**
   * @param pool - the uids to lease
   * @param opts - the ports and bounds
   */
  constructor(
    pool: UidPool,
    private readonly opts: UidLeasesOptions = {},
  ) {
    this.free = Array.from({ length: pool.size }, (_, i) => pool.first + i);
    this.list = opts.list ?? (() => listProcessCreds());
    this.kill = opts.kill ?? ((pid) => process.kill(pid, 'SIGKILL'));
    this.lock = opts.lock ?? abstractSocketUidLock();
    this.now = opts.now ?? (() => performance.now());
  }

  /** The uids quarantined so far, ascending: never leased again by this table. */
  get quarantined(): number[] {
    return [...this.jailed].sort((a, b) => a - b);
  }

  /**
   * Resolves with a uid no other run holds, here or in another process, until {@link release};
   * nothing runs under it.
   *
   * @throws Error (rejects) when the host-wide lock fails for another reason than a holder
   */
  async acquire(): Promise<number> {
    let handed: number | undefined;
    for (;;) {
      const elsewhere: number[] = [];
      for (let uid = handed ?? this.free.shift(); uid !== undefined; uid = this.free.shift()) {
        handed = undefined;
        let unlock: (() => void) | undefined;
        try {
          unlock = await this.lock.tryLock(uid);
        } catch (err) {
          this.free.unshift(uid, ...elsewhere);
          throw err;
        }
        if (!unlock) {
          elsewhere.push(uid);
          continue;
        }
        this.held.set(uid, unlock);
        if (!this.scanned.has(uid)) {
          this.scanned.add(uid);
          if (!(await this.evict(uid))) continue;
        }
        this.free.push(...elsewhere);
        return uid;
      }
      this.free.push(...elsewhere);
      handed = await new Promise<number | undefined>((resolve) => {
        this.waiters.push(resolve);
        if (elsewhere.length > 0) {
          setTimeout(() => {
            const i = this.waiters.indexOf(resolve);
            if (i >= 0) this.waiters.splice(i, 1);
            resolve(undefined);
          }, this.opts.retryMs ?? 250);
        }
      });
    }
  }

  /**
   * Kills (SIGKILL) every process under `uid`, scan after scan, runs `cleanup` (the run's
   * directories go once nothing can write them again), then returns the uid to the pool (or
   * straight to the oldest waiter). When processes remain after the budget, the uid is
   * quarantined instead (kept held, so no runtime on the host leases it either) and
   * `onQuarantine` is told. Never throws but for `cleanup`'s error.
   *
   * @returns whether the uid went back to the pool
   */
  async release(uid: number, cleanup?: () => Promise<void>): Promise<boolean> {
    this.scanned.add(uid);
    const clean = await this.evict(uid);
    await cleanup?.();
    if (!clean) return false;
    this.held.get(uid)?.();
    this.held.delete(uid);
    const next = this.waiters.shift();
    if (next) next(uid);
    else this.free.push(uid);
    return true;
  }

  /** Kills what runs under `uid` until nothing does (true) or the budget is spent (quarantined). */
  private async evict(uid: number): Promise<boolean> {
    const deadline = this.now() + (this.opts.budgetMs ?? DEFAULT_EVICT_BUDGET_MS);
    for (;;) {
      let left: number[];
      try {
        left = (await this.list()).filter((p) => runsUnder(p, uid)).map((p) => p.pid);
      } catch {
        // Nothing can be told about the uid: it is not handed out again.
        left = [];
        this.quarantine(uid, left);
        return false;
      }
      if (left.length === 0) return true;
      if (this.now() >= deadline) {
        this.quarantine(uid, left);
        return false;
      }
      for (const pid of left) {
        try {
          this.kill(pid);
        } catch {
          // Gone already.
        }
      }
      await sleep(this.opts.pauseMs ?? 20);
    }
  }

  private quarantine(uid: number, left: readonly number[]): void {
    this.jailed.add(uid);
    this.opts.onQuarantine?.(uid, left);
  }
}
