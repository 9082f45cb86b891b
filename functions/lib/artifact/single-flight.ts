/**
 * Fleet single-flight: the same fetch or render requested by many runners at once (a rollout to
 * every cluster of a fleet) runs its tool once; the others wait for the artifact.
 *
 * The content caches (`./keys.ts`) only help once an artifact exists: twenty clusters that ask
 * for the same pinned fetch at the same moment would all miss and all run vendir. Here the first
 * runner to miss takes an in-flight marker next to the cache record, `inflight/<cache key>`
 * ({@link inflightKey}), created only if absent (`ObjectStore.putIfMatch` with no version: S3
 * `If-None-Match: *`). The marker is `{ holder, expiresAt, failed? }`:
 *
 * - `holder` runs the tool and renews `expiresAt` ({@link DEFAULT_FLIGHT_TTL_MS} from now) every
 *   third of the TTL while it runs, by compare-and-swap on the marker's version;
 * - the others poll the cache ({@link FLIGHT_POLL_FIRST_MS} doubling to {@link FLIGHT_POLL_MAX_MS})
 *   and use the artifact as soon as its record appears (a cache hit, no tool);
 * - a marker past `expiresAt` (its holder crashed or froze) is taken over by compare-and-swap: one
 *   of the waiters becomes the holder and runs the tool;
 * - on success the holder stores the artifact and its record, then deletes the marker;
 * - when the holder's run ends without a shared artifact (the tool failed, the App was deleted
 *   under it, the render held a Secret and was sealed for its cluster only, an infrastructure
 *   error) it marks the marker `failed`, and the runners that waited for it run the tool
 *   themselves, in parallel, as they would have without single-flight. They do not take on the
 *   holder's error: it may be the holder's own (its App deleted, its function deadline, its
 *   disk), and its message belongs to the holder's App status; a failure that is the input's own
 *   (a ytt syntax error) fails every waiter the same way on its own run. A `failed` marker is
 *   free for the next runner that comes, which takes it over.
 *
 * Waiting is bounded: by the abort signal (the App deleted or canceled: the wait ends as the
 * tool would have been killed), by the function deadline (Lambda: {@link FlightDeadlineError},
 * retryable, so the event comes back and a later invocation finds the artifact rather than
 * writing a failure), and by `maxWaitMs` and half the time left before the deadline (then the
 * waiter runs the tool itself). A holder's
 * marker stays live only while the holder renews it, so a wait never outlasts the holder's run
 * by more than the TTL.
 *
 * Only shared content takes a marker: content made from Secrets (`private/…` keys) is sealed per
 * cluster and never shared (docs/decisions.md D5), so {@link inflightKey} refuses it and the stages never ask.
 *
 * @module
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleepFor } from 'node:timers/promises';
import type { Logger } from '../log.js';
import type { ObjectStore } from '../store/port.js';
import { inflightKey } from './keys.js';

/**
 * Life of an in-flight marker without renewal, ms: 30 s. The holder renews it every 10 s while
 * its tool runs, so a crashed holder keeps the fleet waiting at most this long before one waiter
 * takes over.
 */
export const DEFAULT_FLIGHT_TTL_MS = 30_000;
/** First poll of the cache by a waiter, ms after it found the marker: 100. */
export const FLIGHT_POLL_FIRST_MS = 100;
/** Longest pause between a waiter's polls, ms: 2000 (the poll period doubles up to it). */
export const FLIGHT_POLL_MAX_MS = 2_000;
/** Compare-and-swap conflicts in a row on the marker before a runner runs the tool itself. */
const CLAIM_ATTEMPTS = 20;

/** An in-flight marker as stored. */
export interface FlightMarker {
  /** Who runs the tool: a per-attempt id (`<label>/<uuid>`). */
  holder: string;
  /** RFC 3339 time the holder's claim ends unless renewed. */
  expiresAt: string;
  /** The holder's run ended without a shared artifact: its waiters run the tool themselves. */
  failed?: boolean;
}

/** The function deadline came while a runner waited for another's artifact: retry the event later. */
export class FlightDeadlineError extends Error {
  override readonly name = 'FlightDeadlineError';
  /** @param key - the cache key waited for. */
  constructor(readonly key: string) {
    super(`the function deadline came while waiting for another runner to make ${key}`);
  }
}

/**
 * Slack, ms, allowed beyond now + TTL on a marker's `expiresAt` (clock skew between runners): 5 s.
 * A holder never writes an expiry further than its TTL from its now; one beyond it was not
 * written by a runner of this code (a run of another cluster keeping the fleet waiting), and
 * the marker reads as expired.
 */
export const FLIGHT_EXPIRY_SLACK_MS = 5_000;

/** Reads a stored marker; anything that is not one reads as absent (and is overwritten). */
export function parseFlightMarker(body: Buffer | undefined): FlightMarker | undefined {
  if (!body) return undefined;
  try {
    const raw = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
    if (
      typeof raw.holder !== 'string' ||
      typeof raw.expiresAt !== 'string' ||
      Number.isNaN(Date.parse(raw.expiresAt))
    ) {
      return undefined;
    }
    return { holder: raw.holder, expiresAt: raw.expiresAt, ...(raw.failed === true ? { failed: true } : {}) };
  } catch {
    return undefined;
  }
}

/** Options of {@link singleFlight}. */
export interface FlightOptions {
  /** The fleet's object store (where the cache records and the markers live). */
  store: ObjectStore;
  /** The shared cache record key the artifact is found by; the marker is {@link inflightKey} of it. */
  key: string;
  /** Names this runner in the marker (e.g. the run id); a random suffix makes each call distinct. */
  label: string;
  /** Wall clock (expiry of markers, the wait budget). */
  now: () => Date;
  log: Logger;
  /** Default {@link DEFAULT_FLIGHT_TTL_MS}. */
  ttlMs?: number;
  /** Longest wait for another runner, ms, after which this one runs the tool itself. */
  maxWaitMs: number;
  /** Ends a wait with `aborted` (the App deleted or canceled). */
  signal?: AbortSignal;
  /** The function deadline: ends a wait with {@link FlightDeadlineError}. */
  deadline?: AbortSignal;
  /**
   * When `deadline` fires, ms since the epoch: a wait then lasts at most half the time left at
   * its start (and `maxWaitMs`), so a runner whose holder never delivers still has the other
   * half to run the tool itself. Absent: only `maxWaitMs` bounds the wait.
   */
  deadlineAt?: number;
  /**
   * Wraps each store step of the marker (the stages pass `infraStep`, so a store failure names
   * what was being done). Default: runs the step as it is.
   */
  step?: <S>(action: string, fn: () => Promise<S>) => Promise<S>;
  /** Pause between polls; default an abortable timer. Resolves early (never rejects) on abort. */
  sleep?: (ms: number, signal: AbortSignal | undefined) => Promise<void>;
}

/** What a runner's own run of the tool produced. */
export interface FlightRun<R> {
  /** The caller's result (status, tool counts, artifact key). */
  result: R;
  /** The artifact and its cache record are stored where `find` sees them (shared, successful). */
  shared: boolean;
}

/** How {@link singleFlight} ended. */
export type FlightOutcome<T, R> =
  /** The artifact was found (made by another runner); no tool ran here. */
  | { kind: 'found'; value: T; waited: boolean }
  /**
   * This runner ran the tool: as the fleet's holder (`leader`), or on its own (`solo`: the holder
   * failed, the wait budget ran out, or the marker kept changing under it).
   */
  | { kind: 'ran'; result: R; role: 'leader' | 'solo' }
  /** The abort signal fired while waiting: neither the tool nor the artifact. */
  | { kind: 'aborted' };

/** How long a wait that starts at `start` (ms since the epoch) may last: see {@link FlightOptions.deadlineAt}. */
function waitBudgetAt(opts: FlightOptions, start: number): number {
  if (opts.deadlineAt === undefined) return opts.maxWaitMs;
  return Math.min(opts.maxWaitMs, Math.max(0, Math.floor((opts.deadlineAt - start) / 2)));
}

async function defaultSleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  await sleepFor(ms, undefined, signal ? { signal } : {}).catch(() => undefined);
}

/**
 * Finds the artifact of `opts.key`, or makes it once for the whole fleet (see the module
 * comment): claims the in-flight marker and calls `run`, or waits for the runner that holds it
 * and calls `find` until the artifact appears.
 *
 * @param find - the cache lookup: the value when the artifact and its record exist, else `undefined`.
 * @param run - runs the tool and stores the artifact and record (before it resolves); `shared`
 *   says whether `find` will now see them.
 * @throws FlightDeadlineError when the deadline fires while waiting; what `run` throws (after
 *   the marker is marked failed); what `opts.step` throws for a failed marker read or claim.
 */
export async function singleFlight<T, R>(
  opts: FlightOptions,
  find: () => Promise<T | undefined>,
  run: () => Promise<FlightRun<R>>,
): Promise<FlightOutcome<T, R>> {
  const { store, log } = opts;
  const marker = inflightKey(opts.key);
  const me = `${opts.label}/${randomUUID()}`;
  const ttlMs = opts.ttlMs ?? DEFAULT_FLIGHT_TTL_MS;
  const step = opts.step ?? (<S>(_action: string, fn: () => Promise<S>) => fn());
  const sleep = opts.sleep ?? defaultSleep;
  const nowMs = () => opts.now().getTime();
  const body = (failed?: boolean) =>
    JSON.stringify({ holder: me, expiresAt: new Date(nowMs() + ttlMs).toISOString(), ...(failed ? { failed } : {}) });
  const waitSignal =
    opts.signal && opts.deadline ? AbortSignal.any([opts.signal, opts.deadline]) : (opts.signal ?? opts.deadline);
  const solo = async (why: string): Promise<FlightOutcome<T, R>> => {
    log.info({ key: opts.key, why }, 'running the tool without waiting for the fleet');
    return { kind: 'ran', result: (await run()).result, role: 'solo' };
  };

  /** Rewrites the marker while it is still ours; false when it is not (taken over, or gone). */
  const rewrite = async (failed?: boolean): Promise<boolean> => {
    const got = await store.getVersioned(marker);
    if (parseFlightMarker(got?.body)?.holder !== me || !got) return false;
    return (await store.putIfMatch(marker, body(failed), got.etag)) === 'written';
  };
  const lead = async (): Promise<FlightOutcome<T, R>> => {
    const timer = setInterval(() => {
      rewrite().then(
        (ours) => ours || log.warn({ key: opts.key }, 'in-flight marker taken over while the tool ran'),
        (err: unknown) => log.warn({ key: opts.key, error: String(err) }, 'in-flight marker renewal failed'),
      );
    }, ttlMs / 3);
    timer.unref?.();
    let done: FlightRun<R> | undefined;
    try {
      done = await run();
    } finally {
      clearInterval(timer);
      // Best effort: a marker left behind expires (its TTL, then the bucket's lifecycle rule).
      const release = done?.shared ? store.delete(marker) : rewrite(true);
      await Promise.resolve(release).catch((err: unknown) =>
        log.warn({ key: opts.key, error: String(err) }, 'in-flight marker not released'),
      );
    }
    return { kind: 'ran', result: done.result, role: 'leader' };
  };

  let waitingOn: string | undefined;
  let waitStart: number | undefined;
  let waitBudget: number | undefined;
  let delay = FLIGHT_POLL_FIRST_MS;
  /** The marker is ours now: lead, unless the artifact landed meanwhile. */
  const claimedIt = async (taken?: FlightMarker): Promise<FlightOutcome<T, R>> => {
    if (taken && !taken.failed)
      log.warn({ key: opts.key, holder: taken.holder }, 'in-flight marker had expired; taken over');
    // The artifact may have landed between the caller's lookup (or the last poll) and the claim.
    const hit = await find().catch(async (err: unknown) => {
      await rewrite(true).catch(() => undefined);
      throw err;
    });
    if (hit === undefined) return await lead();
    await store.delete(marker).catch(() => undefined);
    return { kind: 'found', value: hit, waited: waitStart !== undefined };
  };
  // Mostly no other runner makes this artifact now and there is no marker: one conditional
  // create claims it without reading it first (a marker there, live, failed or expired, makes
  // it a conflict, and the loop reads it as before).
  const created = await step('taking the in-flight marker', () => store.putIfMatch(marker, body(), undefined));
  if (created === 'written') return await claimedIt();
  for (let conflicts = 0; ; ) {
    const got = await step('reading the in-flight marker', () => store.getVersioned(marker));
    const cur = parseFlightMarker(got?.body);
    if (cur?.failed && cur.holder === waitingOn) return await solo('the runner it waited for failed');
    const expiry = cur ? Date.parse(cur.expiresAt) : 0;
    // An expiry further than one TTL away (plus clock slack) is not a holder's: expired too.
    if (!cur || cur.failed || expiry <= nowMs() || expiry > nowMs() + ttlMs + FLIGHT_EXPIRY_SLACK_MS) {
      const claimed = await step('taking the in-flight marker', () => store.putIfMatch(marker, body(), got?.etag));
      if (claimed === 'written') return await claimedIt(cur);
      if (++conflicts >= CLAIM_ATTEMPTS) return await solo('the in-flight marker kept changing');
      continue;
    }
    // Another runner holds a live marker: wait for its artifact.
    conflicts = 0;
    waitingOn = cur.holder;
    waitStart ??= nowMs();
    waitBudget ??= waitBudgetAt(opts, waitStart);
    if (nowMs() - waitStart >= waitBudget) return await solo('waited its longest for another runner');
    await sleep(delay, waitSignal);
    if (opts.deadline?.aborted) throw new FlightDeadlineError(opts.key);
    if (opts.signal?.aborted) return { kind: 'aborted' };
    delay = Math.min(delay * 2, FLIGHT_POLL_MAX_MS);
    const hit = await find();
    if (hit !== undefined) return { kind: 'found', value: hit, waited: true };
  }
}
