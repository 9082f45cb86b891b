/**
 * Coalescing, batching and delivery of the forwarder's events, with back-pressure.
 *
 * - **Coalescing.** The first event for an object (kind, namespace, name, uid) opens a window
 *   of `windowMs`; later events for it within the window, and while it waits for the transport,
 *   merge into that one event: the latest resourceVersion and generation win, and the reason
 *   with the highest rank wins (`REASON_RANK` of `events/schema.ts`, shared with the embedded
 *   runtime's coalescer: `deleted` > `added` > `ref-changed` > `modified` > `resync`), since a
 *   reference to the latest state is all a function needs.
 * - **New objects wait for no window.** An `added` event is ready at once, and so is every
 *   event queued before it (events leave in the order they were queued, so a `deleted` for a
 *   name's old uid still goes before the `added` of its new one): nothing can have been written
 *   to an object the functions have not seen yet that a window would save a run for, so a new
 *   object's first reconcile starts without waiting (kapp-controller's informer hands a new
 *   object to its reconciler at once). Later events of the object open a window as usual, and
 *   those arriving while the batch is in flight merge as always.
 * - **Batching and back-pressure.** Ready events go out in batches of up to `batchSize`, one
 *   batch at a time. While a batch is in flight (or being retried), newer events wait and keep
 *   merging, so memory is bounded by the number of objects, whatever the event rate, and the
 *   transport is never called concurrently.
 * - **No loss.** A failed batch is retried whole, with exponential backoff and jitter, until it
 *   is accepted or {@link Outbox.close} is called; per object, events are sent in order.
 * - **Other events** ({@link Outbox.enqueueEvent}: an App's health) wait under a key of their own,
 *   never merged with an object event (a health verdict must not turn a drift `ref-changed` into
 *   something else, nor the other way round): a newer one for the same key replaces the waiting
 *   one, and it travels in the same batches, so the transport still sees one batch at a time.
 *
 * @module
 */

import { type KappEvent, type ObjectEvent, type ObjectEventData, objectEvent, strongerReason } from '../schema.js';
import { type BackoffOptions, backoffDelay } from './backoff.js';
import { type Clock, MAX_TIMER_MS, type TimerHandle } from './clock.js';
import type { ForwarderLogger } from './log.js';
import type { Transport } from './transport.js';

/**
 * Merges a waiting event with a newer one for the same object: the newer reference
 * (resourceVersion, generation) and the higher-ranked reason (`strongerReason` of
 * `events/schema.ts`).
 *
 * @param pending - The event waiting to be sent.
 * @param next - The newer event (same kind, namespace, name and uid).
 * @returns A new object; inputs are not changed.
 */
export function mergeEvents(pending: ObjectEventData, next: ObjectEventData): ObjectEventData {
  return { ...next, reason: strongerReason(pending.reason, next.reason) };
}

/**
 * The forwarder's default envelope builder ({@link OutboxOptions.build}): `objectEvent` of
 * `events/schema.ts` with `time` from `now` and the id derived from the content and `cause`
 * but not the time (`objectEventId`), so a change announced again by another replica or after
 * a restart is dropped by the FIFO queue's deduplication.
 *
 * @param data - The reference and reason.
 * @param now - Emission time, ms since the epoch.
 * @param cause - What caused the event beyond the object's state (`EventOptions.cause`).
 * @throws EventValidationError when `data` does not make a valid event (e.g. a kind that is
 *   not App, PackageInstall or PackageRepository, or a clusterId that is not a DNS label).
 */
export function toCloudEvent(data: ObjectEventData, now: number, cause?: string): ObjectEvent {
  const { reason, ...ref } = data;
  return objectEvent(ref, reason, { time: new Date(now), ...(cause ? { cause } : {}) });
}

/** Options of {@link Outbox}. */
export interface OutboxOptions {
  /** Where batches go. */
  transport: Transport;
  /**
   * Builds the envelope; called once per event when its batch is formed (retries reuse it).
   * An event it throws for is logged and dropped. `cause` is the latest cause enqueued for
   * the object (see {@link Outbox.enqueue}).
   */
  build: (data: ObjectEventData, now: number, cause?: string) => ObjectEvent;
  /** Time and timers. */
  clock: Clock;
  /** Uniform `[0, 1)` source for the retry jitter. */
  random: () => number;
  /** Coalescing window in ms; 0 sends on the next timer tick. */
  windowMs: number;
  /** Largest batch handed to the transport (≥ 1). */
  batchSize: number;
  /** Retry backoff of failed sends. */
  backoff?: BackoffOptions;
  /** Logger for send failures. */
  logger: ForwarderLogger;
  /** Called after each accepted batch (for counters). */
  onSent?: (events: readonly ObjectEventData[]) => void;
  /** Called for an event whose envelope cannot be built (it is dropped). */
  onInvalid?: (data: ObjectEventData, err: unknown) => void;
  /** Called after each failed send attempt (for counters). */
  onSendError?: (err: unknown, attempt: number) => void;
}

interface Pending {
  /** An object event's reference; absent for an {@link Outbox.enqueueEvent} entry. */
  data?: ObjectEventData;
  /** Builds an {@link Outbox.enqueueEvent} entry's envelope. */
  make?: (now: number) => KappEvent;
  readyAt: number;
  cause: string | undefined;
}

/** See the module comment. */
export class Outbox {
  /** Insertion order is readyAt order (fixed windows), so the head is the next to be ready. */
  private readonly pending = new Map<string, Pending>();
  private inFlight = false;
  private timer: TimerHandle | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  /** Ready time of the last event queued (the latest of all: windows are fixed). */
  private tailReadyAt = Number.NEGATIVE_INFINITY;
  private retryTimer: TimerHandle | undefined;
  private closed = false;
  private idleWaiters: Array<() => void> = [];

  constructor(private readonly opts: OutboxOptions) {}

  /** Events waiting (not counting a batch in flight). */
  get size(): number {
    return this.pending.size;
  }

  /** Whether a batch is being sent or retried. */
  get busy(): boolean {
    return this.inFlight;
  }

  /**
   * Queues one event, merging it into a waiting one for the same object.
   *
   * @param cause - What caused it beyond the object's state (part of the event id, see
   *   `toCloudEvent`); on a merge the latest cause given wins, like the resourceVersion.
   */
  enqueue(data: ObjectEventData, cause?: string): void {
    if (this.closed) return;
    const key = `${data.apiVersion}\u0000${data.kind}\u0000${data.namespace}\u0000${data.name}\u0000${data.uid}`;
    const now = this.opts.clock.now();
    const p = this.pending.get(key);
    if (p?.data) {
      p.data = mergeEvents(p.data, data);
      p.cause = cause ?? p.cause;
      if (data.reason === 'added') this.readyThrough(key, now);
      return;
    }
    if (data.reason === 'added') {
      // Ready times never decrease along the queue: when the last one is ready, all are.
      if (this.tailReadyAt > now) this.readyThrough(undefined, now);
      this.pending.set(key, { data, readyAt: now, cause });
      this.tailReadyAt = now;
      this.arm(now);
      return;
    }
    const readyAt = now + this.opts.windowMs;
    this.pending.set(key, { data, readyAt, cause });
    this.tailReadyAt = readyAt;
    this.arm(readyAt);
  }

  /**
   * Queues an event that is not an object event (an App's health) under `key`, which no object
   * event uses (prefix it, e.g. `health\u0000<subject>`): a waiting one of the same key is
   * replaced (the latest verdict is all that matters), never merged. It is ready after the
   * coalescing window, as a changed object's event is.
   *
   * @param make - Builds the envelope when its batch is formed; a throw drops it (logged).
   */
  enqueueEvent(key: string, make: (now: number) => KappEvent): void {
    if (this.closed) return;
    const p = this.pending.get(key);
    if (p) {
      p.make = make;
      return;
    }
    const readyAt = this.opts.clock.now() + this.opts.windowMs;
    this.pending.set(key, { make, readyAt, cause: undefined });
    this.tailReadyAt = readyAt;
    this.arm(readyAt);
  }

  /**
   * Makes every event queued up to and including `key` (all of them when `key` is undefined)
   * ready at `now`.
   */
  private readyThrough(key: string | undefined, now: number): void {
    for (const [k, p] of this.pending) {
      p.readyAt = Math.min(p.readyAt, now);
      if (k === key) break;
    }
    if (key === undefined) this.tailReadyAt = Math.min(this.tailReadyAt, now);
    this.arm(now);
  }

  /** Ends every coalescing window now (used when draining before a stop). */
  flushNow(): void {
    const now = this.opts.clock.now();
    for (const p of this.pending.values()) p.readyAt = Math.min(p.readyAt, now);
    this.arm(now);
  }

  /** Resolves once nothing is waiting and no batch is in flight. */
  idle(): Promise<void> {
    if (this.pending.size === 0 && !this.inFlight) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /**
   * Stops sending: timers are cleared, waiting events are dropped (a restarted forwarder
   * re-derives them from the objects), a batch in flight finishes but is not retried.
   * Pending {@link idle} promises resolve.
   */
  close(): void {
    this.closed = true;
    if (this.timer !== undefined) this.opts.clock.clearTimeout(this.timer);
    if (this.retryTimer !== undefined) this.opts.clock.clearTimeout(this.retryTimer);
    this.timer = undefined;
    this.retryTimer = undefined;
    this.pending.clear();
    this.notifyIdle(true);
  }

  private arm(at: number): void {
    if (this.closed || this.inFlight) return;
    if (this.timer !== undefined && this.timerAt <= at) return;
    if (this.timer !== undefined) this.opts.clock.clearTimeout(this.timer);
    this.timerAt = at;
    const delay = Math.min(MAX_TIMER_MS, Math.max(0, at - this.opts.clock.now()));
    this.timer = this.opts.clock.setTimeout(() => {
      this.timer = undefined;
      this.timerAt = Number.POSITIVE_INFINITY;
      this.pump();
    }, delay);
  }

  private pump(): void {
    if (this.closed || this.inFlight) return;
    const now = this.opts.clock.now();
    const batch: Pending[] = [];
    for (const [key, p] of this.pending) {
      if (p.readyAt > now || batch.length >= this.opts.batchSize) break;
      batch.push(p);
      this.pending.delete(key);
    }
    if (batch.length === 0) {
      const head = this.pending.values().next();
      if (head.done) this.notifyIdle(false);
      else this.arm(head.value.readyAt);
      return;
    }
    const events: KappEvent[] = [];
    const valid: ObjectEventData[] = [];
    for (const { data: d, make, cause } of batch) {
      if (!d) {
        try {
          if (make) events.push(make(now));
        } catch (err) {
          this.opts.logger.warn({ err }, 'dropping an event that does not validate');
        }
        continue;
      }
      try {
        events.push(this.opts.build(d, now, cause));
        valid.push(d);
      } catch (err) {
        // A bad record fails only itself (style.md §9); retrying cannot fix it.
        this.opts.logger.warn(
          { err, kind: d.kind, namespace: d.namespace, name: d.name, reason: d.reason },
          'dropping an event that does not validate',
        );
        this.opts.onInvalid?.(d, err);
      }
    }
    if (events.length === 0) {
      this.pump();
      return;
    }
    this.inFlight = true;
    void this.deliver(valid, events, 0);
  }

  private async deliver(batch: ObjectEventData[], events: KappEvent[], attempt: number): Promise<void> {
    try {
      await this.opts.transport.send(events);
    } catch (err) {
      this.opts.onSendError?.(err, attempt);
      if (this.closed) {
        this.inFlight = false;
        this.notifyIdle(true);
        return;
      }
      const delay = backoffDelay(attempt, this.opts.random, this.opts.backoff);
      this.opts.logger.warn(
        { err, events: events.length, attempt: attempt + 1, retryInMs: delay },
        'send events failed; retrying the batch',
      );
      this.retryTimer = this.opts.clock.setTimeout(() => {
        this.retryTimer = undefined;
        if (this.closed) {
          this.inFlight = false;
          this.notifyIdle(true);
          return;
        }
        void this.deliver(batch, events, attempt + 1);
      }, delay);
      return;
    }
    this.opts.onSent?.(batch);
    this.inFlight = false;
    this.pump();
  }

  private notifyIdle(force: boolean): void {
    if (!force && (this.pending.size > 0 || this.inFlight)) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }
}
