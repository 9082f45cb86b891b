/**
 * Kubernetes Events for reconciles (`ReconcileStarted`, `ReconcileSucceeded`, `ReconcileFailed`,
 * `DeleteFailed`) on Apps, PackageInstalls and PackageRepositories: what Flux and Argo CD users
 * read with `kubectl describe` / `kubectl get events`; kapp-controller writes none.
 *
 * Bounded so that a crash loop cannot flood the API server or etcd:
 *
 * - **aggregated**: an Event's name is the object's name and a digest of (uid, reason, message),
 *   so a repeat adds to the `count` of one Event instead of creating another (client-go's
 *   aggregation, done on the server's copy so that every process adds to the same Event);
 * - **repeats suppressed**: the same (uid, reason, message) is written at most once per
 *   `repeatIntervalMs` (default 10 min) by a process; a periodic resync therefore costs no API
 *   request per sync, while any change of outcome or message is written at once;
 * - **rate-bounded per object**: distinct Events of one object draw from a token bucket of
 *   `burst` (25) refilled one per `refillMs` (5 min): client-go's `EventSourceObjectSpamFilter`
 *   defaults, so messages that change every time (a crash loop with varying text) stop at 25 and
 *   then trickle;
 * - **bounded and redacted** messages: the caller passes text already through the run's
 *   `SecretMask.redact` (exact Secret values and credential shapes); it is cut here to
 *   {@link MAX_EVENT_MESSAGE_CHARS}.
 *
 * A failed write is logged and dropped: an Event never fails, retries or delays a reconcile
 * beyond {@link EVENT_WRITE_WAIT_MS}.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { EventWriter } from '../kube/port.js';
import type { Logger } from '../log.js';

/** Reasons written, with their Event type. */
export const EVENT_REASONS = Object.freeze({
  ReconcileStarted: 'Normal',
  ReconcileSucceeded: 'Normal',
  ReconcileFailed: 'Warning',
  DeleteFailed: 'Warning',
  /** Ours: the forwarder saw a hand edit or deletion of what the App deployed; this run reverts it. */
  DriftDetected: 'Normal',
  /** Ours: what the App deployed became healthy (`kapp-lambda.carvel.dev/Healthy` True). */
  Healthy: 'Normal',
  /** Ours: a workload the App deployed failed after its reconcile (`Healthy` False). */
  Unhealthy: 'Warning',
  /** Ours: a workload the App deployed is rolling out again (`Healthy` Unknown). */
  HealthProgressing: 'Normal',
} as const);

/** A reason of {@link EVENT_REASONS}. */
export type EventReason = keyof typeof EVENT_REASONS;

/** Longest message written, characters (events.k8s.io/v1's note limit is 1 kB). */
export const MAX_EVENT_MESSAGE_CHARS = 1024;

/** Longest a reconcile waits for its Event write, ms (the write goes on in the background). */
export const EVENT_WRITE_WAIT_MS = 5000;

/** `source.component` of every Event. */
export const EVENT_COMPONENT = 'kapp-lambda';

/** The object an Event is about. */
export interface EventObject {
  apiVersion: string;
  kind: string;
  namespace: string;
  name: string;
  uid: string;
}

/** Options of {@link ReconcileEventRecorder}. */
export interface EventRecorderOptions {
  /** Same (uid, reason, message) written at most once per this, ms. Default 600 000. */
  repeatIntervalMs?: number;
  /** Distinct Events per object at once. Default 25. */
  burst?: number;
  /** One more distinct Event per object after this, ms. Default 300 000. */
  refillMs?: number;
  /** Keys remembered (oldest forgotten first). Default 10 000. */
  maxKeys?: number;
  /** Clock, ms. Default `Date.now`. */
  now?: () => number;
}

/** The Event's name: `<object name>.<16 hex of sha256(uid, reason, message)>`, at most 253 characters. */
export function eventName(object: EventObject, reason: string, message: string): string {
  const digest = createHash('sha256').update(`${object.uid}\0${reason}\0${message}`).digest('hex').slice(0, 16);
  return `${object.name.slice(0, 253 - 17)}.${digest}`;
}

/** Cuts a message to {@link MAX_EVENT_MESSAGE_CHARS} (the head: where the stage names the failure). */
export function boundedEventMessage(message: string): string {
  const chars = [...message];
  if (chars.length <= MAX_EVENT_MESSAGE_CHARS) return message;
  return `${chars.slice(0, MAX_EVENT_MESSAGE_CHARS - 15).join('')} ...[truncated]`;
}

/** A Map that forgets its oldest entries beyond `max`. */
function remember<K, V>(map: Map<K, V>, key: K, value: V, max: number): void {
  map.delete(key);
  map.set(key, value);
  while (map.size > max) map.delete(map.keys().next().value as K);
}

/** Writes reconcile Events, deduplicated and rate-bounded (see the module comment). One per process. */
export class ReconcileEventRecorder {
  readonly #repeatMs: number;
  readonly #burst: number;
  readonly #refillMs: number;
  readonly #maxKeys: number;
  readonly #now: () => number;
  /** Event name → when this process last wrote it. */
  readonly #written = new Map<string, number>();
  /** Object uid → its bucket. */
  readonly #buckets = new Map<string, { tokens: number; at: number }>();

  /** See {@link EventRecorderOptions}. */
  constructor(options: EventRecorderOptions = {}) {
    this.#repeatMs = options.repeatIntervalMs ?? 600_000;
    this.#burst = options.burst ?? 25;
    this.#refillMs = options.refillMs ?? 300_000;
    this.#maxKeys = options.maxKeys ?? 10_000;
    this.#now = options.now ?? Date.now;
  }

  /** Takes a token of the object's bucket; false when it is empty. */
  #take(uid: string, now: number): boolean {
    const b = this.#buckets.get(uid) ?? { tokens: this.#burst, at: now };
    const refilled = Math.floor((now - b.at) / this.#refillMs);
    const bucket =
      refilled > 0 ? { tokens: Math.min(this.#burst, b.tokens + refilled), at: b.at + refilled * this.#refillMs } : b;
    if (bucket.tokens >= this.#burst) bucket.at = now;
    const ok = bucket.tokens > 0;
    if (ok) bucket.tokens -= 1;
    remember(this.#buckets, uid, bucket, this.#maxKeys);
    return ok;
  }

  /**
   * Records one Event about `object` through `writer`, unless suppressed. Never rejects, and
   * resolves within {@link EVENT_WRITE_WAIT_MS}.
   *
   * @param writer - the cluster's writer; absent: nothing is written.
   * @param message - already redacted; bounded here.
   * @returns what happened: `written`, `suppressed` (a repeat, or the bucket is empty), `failed`
   *   (logged), `slow` (still being written), or `skipped` (no writer).
   */
  async record(
    writer: EventWriter | undefined,
    object: EventObject,
    reason: EventReason,
    message: string,
    log: Logger,
  ): Promise<'written' | 'suppressed' | 'failed' | 'slow' | 'skipped'> {
    if (!writer) return 'skipped';
    const text = boundedEventMessage(message);
    const name = eventName(object, reason, text);
    const now = this.#now();
    const last = this.#written.get(name);
    if (last !== undefined && now - last < this.#repeatMs) return 'suppressed';
    if (last === undefined && !this.#take(object.uid, now)) return 'suppressed';
    remember(this.#written, name, now, this.#maxKeys);
    const write = writer
      .writeEvent({
        name,
        involvedObject: object,
        type: EVENT_REASONS[reason],
        reason,
        message: text,
        component: EVENT_COMPONENT,
        at: new Date(now),
      })
      .then(
        () => 'written' as const,
        (err: unknown) => {
          // Written again on its next occurrence.
          this.#written.delete(name);
          log.warn(
            { object: `${object.kind}/${object.namespace}/${object.name}`, reason, err: (err as Error).message },
            'event not written',
          );
          return 'failed' as const;
        },
      );
    let timer: NodeJS.Timeout | undefined;
    const slow = new Promise<'slow'>((resolve) => {
      timer = setTimeout(() => resolve('slow'), EVENT_WRITE_WAIT_MS);
      timer.unref();
    });
    try {
      return await Promise.race([write, slow]);
    } finally {
      clearTimeout(timer);
    }
  }
}
