/**
 * Exponential backoff with jitter for the forwarder's retries (list, watch, transport sends).
 *
 * A pure function rather than a retry library: the forwarder's loops retry forever (a watch
 * must come back however long the API server is away), wait on the injected {@link Clock} so
 * unit tests use fake timers, and reset the attempt counter on progress, which a
 * `retries: n` wrapper such as p-retry does not model (style.md §14: backoff is a pure,
 * tested function; nothing sleeps inside a handler).
 *
 * @module
 */

/** Backoff parameters. Milliseconds. */
export interface BackoffOptions {
  /** Delay of the first retry before jitter. Default 500. */
  initialMs?: number;
  /** Cap of the delay before jitter. Default 30 000. */
  maxMs?: number;
  /** Growth per attempt. Default 2. */
  factor?: number;
  /**
   * Fraction of the delay that is randomized, in `[0, 1]`: the delay is drawn uniformly from
   * `[d·(1-jitter), d]`. Default 0.5 (so many forwarders that lost the same API server do
   * not come back in lock step).
   */
  jitter?: number;
}

/** Defaults of {@link BackoffOptions}. */
export const DEFAULT_BACKOFF: Required<BackoffOptions> = Object.freeze({
  initialMs: 500,
  maxMs: 30_000,
  factor: 2,
  jitter: 0.5,
});

/**
 * The delay before retry number `attempt` (0 for the first retry):
 * `min(maxMs, initialMs · factor^attempt)`, of which the `jitter` fraction is randomized
 * downwards.
 *
 * @param attempt - Failures so far minus one (≥ 0; negative counts as 0).
 * @param random - Uniform source on `[0, 1)`.
 * @param options - Overrides of {@link DEFAULT_BACKOFF}.
 * @returns Whole milliseconds, in `[base·(1-jitter), base]`.
 */
export function backoffDelay(attempt: number, random: () => number, options: BackoffOptions = {}): number {
  const o = { ...DEFAULT_BACKOFF, ...options };
  const n = Math.max(0, Math.floor(attempt));
  // factor^n overflows to Infinity for large n; min() brings it back to the cap.
  const base = Math.min(o.maxMs, o.initialMs * o.factor ** n);
  const jitter = Math.min(1, Math.max(0, o.jitter));
  return Math.floor(base * (1 - jitter * random()));
}
