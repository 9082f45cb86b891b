/**
 * The lock behind {@link LocalDirStore}'s compare-and-swap: mutual exclusion on one path for
 * every writer of this process and of other processes sharing the directory.
 *
 * Why not the former lock (a lock file polled every 5 ms, given up after 10 s): in the upgrade
 * bench, 20 embedded runtimes in one process joined one source poll record at once while the
 * libuv threadpool (4 threads) was busy with artifact writes and their fsyncs. Each waiter's
 * poll put an `open` and a `stat` on that threadpool, in the queue before the holder's own read,
 * write, fsync and rename; holders became slow, waiters passed the 10 s bound and their
 * conditional put threw (`lock … is busy`), so members were lost. Now:
 *
 * - **Within a process**, writers of one path queue in arrival order on a promise chain: no
 *   polling, no filesystem call while waiting, no bound (each holder's turn is bounded by its
 *   own I/O).
 * - **Across processes**, the queue's head takes the lock file `lockPath` with `O_EXCL`, writing
 *   a random token. It waits for another process's lock with jittered exponential backoff (2 ms
 *   doubling up to 100 ms), without a bound while that lock is alive: its holder refreshes the
 *   file's mtime every `staleMs / 5`. A lock not refreshed for `staleMs` was left by a dead
 *   writer and is broken: renamed to a unique name (atomic, so of several breakers one takes
 *   it), checked to be the stale one (a fresh file taken by mistake is linked back), then
 *   removed.
 * - A holder removes the lock only while it still holds its token (a lock broken under a
 *   frozen holder and taken by another writer is left to that writer).
 *
 * Mirrors the usual lock-file practice (e.g. npm's `proper-lockfile`: exclusive create, mtime
 * refresh, staleness), without its dependencies and with the in-process queue it lacks.
 *
 * @module
 */
import { randomBytes } from 'node:crypto';
import { link, lstat, open, readFile, rename, unlink, utimes } from 'node:fs/promises';
import { resolve } from 'node:path';

/** Default age after which an unrefreshed lock file is a dead writer's, ms: 15 s. */
export const DEFAULT_LOCK_STALE_MS = 15_000;
/** First and largest wait between two attempts at another process's lock file, ms. */
const BACKOFF_FIRST_MS = 2;
const BACKOFF_MAX_MS = 100;

/** Options of {@link withFileLock}. */
export interface FileLockOptions<T = unknown> {
  /**
   * Age of an unrefreshed lock file after which it is broken, ms; the holder refreshes it five
   * times per period. Default {@link DEFAULT_LOCK_STALE_MS}.
   */
  readonly staleMs?: number;
  /**
   * Called when this writer's turn in the process's queue comes, before it takes the lock file:
   * a value other than `undefined` is returned instead of running `fn` (e.g. a compare-and-swap
   * whose version a writer ahead in the queue replaced answers 'conflict' without any I/O).
   */
  readonly skip?: () => T | undefined;
}

/** Tail of the in-process queue of each lock path (absolute). */
const queues = new Map<string, Promise<void>>();

function code(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Runs `fn` holding the lock `lockPath` (see the module comment), unless `opts.skip` answers
 * first; the lock file's directory must exist. Waits as long as live holders keep the lock.
 * @returns what `fn` returns.
 * @throws what `fn` throws; the filesystem error of a failed lock operation (not `EEXIST`).
 */
export async function withFileLock<T>(
  lockPath: string,
  fn: () => Promise<T>,
  opts: FileLockOptions<T> = {},
): Promise<T> {
  const path = resolve(lockPath);
  const prev = queues.get(path) ?? Promise.resolve();
  let leave!: () => void;
  const tail = prev.then(() => new Promise<void>((r) => (leave = r)));
  queues.set(path, tail);
  try {
    await prev;
    const skipped = opts.skip?.();
    if (skipped !== undefined) return skipped;
    const release = await acquire(path, opts.staleMs ?? DEFAULT_LOCK_STALE_MS);
    try {
      return await fn();
    } finally {
      await release();
    }
  } finally {
    // `leave` is set once `prev` settled, which the `await prev` above waited for.
    leave();
    if (queues.get(path) === tail) queues.delete(path);
  }
}

/** Takes the lock file (waiting for a live holder, breaking a stale one); resolves to its release. */
async function acquire(path: string, staleMs: number): Promise<() => Promise<void>> {
  const token = randomBytes(16).toString('hex');
  for (let attempt = 0; ; attempt++) {
    const fh = await open(path, 'wx', 0o600).catch((e) => {
      if (code(e) === 'EEXIST') return undefined;
      throw e;
    });
    if (fh) {
      try {
        await fh.writeFile(token);
        await fh.close();
      } catch (e) {
        // Not left behind tokenless (no release would remove it before it went stale).
        await fh.close().catch(() => undefined);
        await unlink(path).catch(() => undefined);
        throw e;
      }
      return holding(path, token, staleMs);
    }
    const st = await lstat(path).catch((e) => {
      if (code(e) === 'ENOENT') return undefined;
      throw e;
    });
    if (!st) continue; // released meanwhile
    if (Date.now() - st.mtimeMs > staleMs) {
      await breakStale(path, staleMs);
      continue;
    }
    const cap = Math.min(BACKOFF_FIRST_MS * 2 ** Math.min(attempt, 10), BACKOFF_MAX_MS);
    await sleep(cap / 2 + Math.random() * (cap / 2));
  }
}

/** Refreshes the held lock until released; the release removes it if still ours. */
function holding(path: string, token: string, staleMs: number): () => Promise<void> {
  const timer = setInterval(
    () => {
      const now = new Date();
      utimes(path, now, now).catch(() => undefined);
    },
    Math.max(1, Math.floor(staleMs / 5)),
  );
  timer.unref();
  return async () => {
    clearInterval(timer);
    const cur = await readFile(path, 'utf8').catch(() => undefined);
    if (cur === token) await unlink(path).catch(() => undefined);
  };
}

/**
 * Removes the stale lock at `path`: moves whatever is there aside (one breaker wins the rename),
 * removes it if it is stale, and otherwise (a writer took a fresh lock since it was judged stale)
 * links it back.
 */
async function breakStale(path: string, staleMs: number): Promise<void> {
  const grave = `${path}.~stale-${randomBytes(8).toString('hex')}`;
  try {
    await rename(path, grave);
  } catch (e) {
    if (code(e) === 'ENOENT') return; // another breaker or the holder got there first
    throw e;
  }
  try {
    const st = await lstat(grave);
    if (Date.now() - st.mtimeMs <= staleMs) {
      await link(grave, path).catch((e) => {
        // EEXIST: another writer locked in between; the holder whose file this was no longer
        // holds the lock path and leaves it alone on release.
        if (code(e) !== 'EEXIST') throw e;
      });
    }
  } finally {
    await unlink(grave).catch(() => undefined);
  }
}
