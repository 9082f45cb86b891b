/**
 * Routing of events to stage handlers, and the embedded runtime's driver.
 *
 * {@link dispatchEvent} is what every function entry calls: it runs the stage an event is
 * for and returns the next stage's event (or none). On Lambda each stage is its own
 * function and the returned event goes to the next stage's queue; in the embedded runtime
 * {@link EmbeddedPipeline} runs the stages of one object back to back on a
 * {@link KeyedQueue}, so one object has at most one run at a time, events that arrive
 * meanwhile coalesce into one follow-up, and a crashed stage is retried from that stage.
 */
import {
  deleteEvent,
  deployEvent,
  EVENT_TYPES,
  type KappEvent,
  objectRefOf,
  orderingKey,
  strongerReason,
  templateEvent,
} from '../../../events/schema.js';
import { SecretMask } from '../reconcile/secret-mask.js';
import { runDelete, runDeploy } from './deploy.js';
import type { PipelineDeps, StageOutput } from './deps.js';
import { type IndexRepoDeps, runIndexRepo } from './index-repo.js';
import { KeyedQueue, RetryFrom } from './keyed-queue.js';
import { handleAppEvent } from './reconcile.js';
import { DEFAULT_MAX_ATTEMPTS, endRunAfterRetries } from './retry-bound.js';
import { type ClusterInfoSource, runTemplate } from './template.js';

/** Dependencies of {@link dispatchEvent} (the index-repo ports are optional). */
export interface DispatchDeps extends IndexRepoDeps {
  /** Live cluster values for templates that need them. */
  clusterInfo: ClusterInfoSource;
}

function nextEvent(out: StageOutput, deps: PipelineDeps): KappEvent | undefined {
  const opts = { time: deps.now() };
  if (out.template) return templateEvent(out.template, opts);
  if (out.deploy) return deployEvent(out.deploy, opts);
  if (out.delete) return deleteEvent({ object: out.delete.ref, run: out.delete.run }, opts);
  return undefined;
}

/**
 * Runs the stage `event` is for.
 *
 * @returns the next stage's event, or `undefined` when the run ended (success, failure with
 *   status written, no-op, stale, gone).
 * @throws on infrastructure failures (API, store, crashed code): deliver the same event again.
 */
export async function dispatchEvent(event: KappEvent, deps: DispatchDeps): Promise<KappEvent | undefined> {
  switch (event.type) {
    case EVENT_TYPES.object:
      if (event.data.kind === 'PackageRepository') {
        await runIndexRepo(event, deps);
        return undefined;
      }
      if (event.data.kind !== 'App') {
        deps.log.warn({ kind: event.data.kind, subject: event.subject }, 'no handler for this kind yet; event dropped');
        return undefined;
      }
      return nextEvent(await handleAppEvent(event, deps), deps);
    case EVENT_TYPES.template:
      return nextEvent(await runTemplate(event.data, deps, deps.clusterInfo), deps);
    case EVENT_TYPES.deploy:
      await runDeploy(event.data, deps);
      return undefined;
    case EVENT_TYPES.delete:
      await runDelete({ clusterId: event.data.object.clusterId, ref: event.data.object, run: event.data.run }, deps);
      return undefined;
    default:
      deps.log.warn({ type: event.type }, 'no handler for this event type; event dropped');
      return undefined;
  }
}

/** Which attempt of a run a stage event is (see `retry-bound.ts`). */
export interface AttemptInfo {
  /** 1-based attempt of this run (embedded: the queue's count; Lambda: `ApproximateReceiveCount`). */
  attempt: number;
  /** Attempts allowed; the one numbered `maxAttempts` (or later) is the last. */
  maxAttempts: number;
}

/**
 * {@link dispatchEvent} with a fresh {@link SecretMask} for the run and the retry bound: when the
 * stage throws on its last attempt, the run ends with a final failed status
 * (`endRunAfterRetries`) instead of another retry.
 *
 * @param dispatch - the stage runner; default {@link dispatchEvent} (tests replace it).
 * @returns `next`: the next stage's event, if any; `ended`: true when the run was ended by the
 *   retry bound (the event must be acknowledged).
 * @throws what the stage threw, before the last attempt, or when the final status could not be
 *   written either.
 */
export async function dispatchWithRetryBound(
  event: KappEvent,
  deps: DispatchDeps,
  attempt: AttemptInfo,
  dispatch: (event: KappEvent, deps: DispatchDeps) => Promise<KappEvent | undefined> = dispatchEvent,
): Promise<{ next?: KappEvent; ended?: true }> {
  const secretMask = new SecretMask();
  try {
    return { next: await dispatch(event, { ...deps, secretMask }) };
  } catch (err) {
    if (attempt.attempt < attempt.maxAttempts) throw err;
    if (await endRunAfterRetries(event, err, deps, secretMask, attempt.attempt)) return { ended: true };
    throw err;
  }
}

/**
 * Coalesces two events for one object into the one that runs: a newer object event replaces
 * anything waiting (it starts a new run from the latest object), keeping the stronger reason
 * (`strongerReason`, the same rank as the forwarder's outbox: a pending `ref-changed` must
 * still force the run); a stage event waiting for retry is replaced by any object event.
 */
export function coalesceEvents(pending: KappEvent, next: KappEvent): KappEvent {
  if (pending.type === EVENT_TYPES.object && next.type === EVENT_TYPES.object) {
    const reason = strongerReason(pending.data.reason, next.data.reason);
    if (reason !== next.data.reason) return { ...next, data: { ...next.data, reason } };
  }
  return next;
}

/** Options of {@link EmbeddedPipeline}. */
export interface EmbeddedPipelineOptions {
  /** Objects reconciled at once. Default 4 (packaged kapp-controller's `-concurrency`). */
  concurrency?: number;
  /** First retry delay after a crash, ms. Default 500. */
  baseRetryMs?: number;
  /** Retry delay cap, ms. Default 30 000. */
  maxRetryMs?: number;
  /**
   * Attempts of a run before it ends with a final failed status (`retry-bound.ts`). Default
   * {@link DEFAULT_MAX_ATTEMPTS}.
   */
  maxAttempts?: number;
}

/**
 * The embedded default's transport and driver: accepts forwarder events (it implements the
 * forwarder's `Transport`) and runs each object's stages in process.
 */
export class EmbeddedPipeline {
  private readonly queue: KeyedQueue<KappEvent>;
  private readonly maxAttempts: number;

  constructor(
    private readonly deps: DispatchDeps,
    opts: EmbeddedPipelineOptions = {},
  ) {
    this.maxAttempts = opts.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    this.queue = new KeyedQueue<KappEvent>((_key, item, attempt) => this.run(item, attempt), {
      concurrency: opts.concurrency ?? 4,
      baseRetryMs: opts.baseRetryMs,
      maxRetryMs: opts.maxRetryMs,
      coalesce: coalesceEvents,
      onError: (key, err, attempt) =>
        deps.log.error(
          { object: key, attempt, error: err instanceof Error ? err.message : String(err) },
          'stage crashed; retrying',
        ),
    });
  }

  /** Accepts a batch of events (the forwarder's `Transport.send`). Never rejects. */
  async send(events: readonly KappEvent[]): Promise<void> {
    for (const e of events) this.queue.add(orderingKey(objectRefOf(e)), e);
  }

  /** Resolves when no object runs or waits (crash retries included). */
  async idle(): Promise<void> {
    await this.queue.idle();
  }

  /** Stops accepting events; running stages finish. */
  close(): void {
    this.queue.close();
  }

  /** Objects running now and waiting. */
  get stats(): { running: number; waiting: number } {
    return { running: this.queue.running, waiting: this.queue.waiting };
  }

  private async run(first: KappEvent, attempt: number): Promise<void> {
    let ev: KappEvent | undefined = first;
    while (ev) {
      const current: KappEvent = ev;
      try {
        ev = (await dispatchWithRetryBound(current, this.deps, { attempt, maxAttempts: this.maxAttempts })).next;
      } catch (err) {
        throw new RetryFrom(current, err);
      }
    }
  }
}
