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

/**
 * Doublings of the no-answer re-ask ({@link resyncRetryDelay}) before it stops growing: at the
 * default `resyncRetryMs` of 5 min the cap is 80 min, the longest an SQS message of a stage can
 * keep being redelivered (index-repo: a visibility timeout of 900 s + 60 s, 5 receives), so a
 * re-ask at the cap never joins a message SQS is still retrying (`test/unit/forwarder-parts.test.ts`
 * holds it against `infra/aws/stages.ts`).
 */
export const RESYNC_RETRY_DOUBLINGS = 4;

/**
 * The wait before asking again about a status that did not answer an ask: `baseMs · 2^retries`,
 * at most `baseMs · 2^RESYNC_RETRY_DOUBLINGS`, no jitter (the asks of many objects are already
 * spread by their due times).
 *
 * Why it grows: an ask that gets no answer is either lost (a dead-lettered message, a dropped
 * send: asking again is the only way back) or still being retried by the transport (SQS
 * redelivers a failing message after its visibility timeout, up to `maxReceiveCount` times, and
 * holds the object's FIFO message group meanwhile). The forwarder cannot tell the two apart, and
 * a fixed re-ask every `baseMs` piled one more message per period behind a message SQS was
 * still retrying (index-repo: 16 in the 80 min of its 5 receives, each then retried as long),
 * a backlog that grew for as long as the run kept crashing. Doubling keeps the first re-ask as
 * soon as before (a lost event comes back after `baseMs`) and bounds the pile to
 * {@link RESYNC_RETRY_DOUBLINGS} messages. kapp-controller has no such case: its queue is in
 * process, and it neither loses a request nor redelivers one.
 *
 * @param retries - Re-asks of this status so far (0 for the wait after the first ask).
 * @param baseMs - `resyncRetryMs`, ms.
 * @returns ms.
 */
export function resyncRetryDelay(retries: number, baseMs: number): number {
  return backoffDelay(retries, () => 0, {
    initialMs: baseMs,
    maxMs: baseMs * 2 ** RESYNC_RETRY_DOUBLINGS,
    factor: 2,
    jitter: 0,
  });
}
