/**
 * Clock and timer port of the forwarder. Everything in `events/forwarder/` that reads the time
 * or waits goes through a {@link Clock}, so unit tests drive it with fake timers and no test
 * sleeps for real.
 *
 * @module
 */

/** Opaque handle of a timer started by {@link Clock.setTimeout}. */
export type TimerHandle = unknown;

/** Wall-clock time and one-shot timers. */
export interface Clock {
  /** Current time in milliseconds since the Unix epoch (as `Date.now()`). */
  now(): number;
  /**
   * Calls `fn` once after `ms` milliseconds (clamped by the caller to at most 2^31-1).
   * Timers must not keep a process alive on their own (`unref` for Node's timers).
   */
  setTimeout(fn: () => void, ms: number): TimerHandle;
  /** Cancels a timer; a handle that already fired or was cleared is ignored. */
  clearTimeout(handle: TimerHandle): void;
}

/** Longest delay Node's `setTimeout` accepts (about 24.8 days); longer ones fire at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The process clock: `Date.now()` and the global timers, looked up at call time (so vitest's
 * fake timers, installed after import, take effect). Timers are `unref`ed.
 */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, Math.min(Math.max(0, ms), MAX_TIMER_MS));
    (t as { unref?: () => void }).unref?.();
    return t;
  },
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

/**
 * Resolves after `ms` milliseconds on `clock`, or as soon as `signal` aborts (never rejects).
 *
 * @param clock - Timer source.
 * @param ms - Delay in milliseconds; ≤ 0 resolves on the next timer tick.
 * @param signal - Cuts the wait short when aborted.
 */
export function sleep(clock: Clock, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clock.clearTimeout(handle);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const handle = clock.setTimeout(done, Math.min(Math.max(0, ms), MAX_TIMER_MS));
    signal?.addEventListener('abort', done, { once: true });
  });
}
