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
  deployEvent,
  EVENT_TYPES,
  type KappEvent,
  type ObjectEvent,
  objectRefOf,
  orderingKey,
  templateEvent,
} from '../../../events/schema.js';
import type { DeleteStageData } from './delete-event.js';
import { deleteEvent, isDeleteEvent } from './delete-event.js';
import { runDelete, runDeploy } from './deploy.js';
import type { PipelineDeps } from './deps.js';
import type { StageOutput } from './fetch.js';
import { KeyedQueue, RetryFrom } from './keyed-queue.js';
import { handleAppEvent } from './reconcile.js';
import { type ClusterInfoSource, runTemplate } from './template.js';

/** Any event a stage function consumes. */
export type StageEvent = KappEvent | ReturnType<typeof deleteEvent>;

/** Dependencies of {@link dispatchEvent}. */
export interface DispatchDeps extends PipelineDeps {
  /** Live cluster values for templates that need them. */
  clusterInfo: ClusterInfoSource;
}

function nextEvent(out: StageOutput, deps: PipelineDeps): StageEvent | undefined {
  const opts = { time: deps.now() };
  if (out.template) return templateEvent(out.template, opts);
  if (out.deploy) return deployEvent(out.deploy, opts);
  if (out.delete) {
    const data: DeleteStageData = { object: out.delete.ref, run: out.delete.run };
    return deleteEvent(data, opts);
  }
  return undefined;
}

/**
 * Runs the stage `event` is for.
 *
 * @returns the next stage's event, or `undefined` when the run ended (success, failure with
 *   status written, no-op, stale, gone).
 * @throws on infrastructure failures (API, store, crashed code): deliver the same event again.
 */
export async function dispatchEvent(event: StageEvent, deps: DispatchDeps): Promise<StageEvent | undefined> {
  if (isDeleteEvent(event)) {
    await runDelete({ clusterId: event.data.object.clusterId, ref: event.data.object, run: event.data.run }, deps);
    return undefined;
  }
  switch (event.type) {
    case EVENT_TYPES.object:
      if (event.data.kind !== 'App') {
        deps.log.warn({ kind: event.data.kind, subject: event.subject }, 'no handler for this kind yet; event dropped');
        return undefined;
      }
      return nextEvent(await handleAppEvent(event as ObjectEvent, deps), deps);
    case EVENT_TYPES.template:
      return nextEvent(await runTemplate(event.data, deps, deps.clusterInfo), deps);
    case EVENT_TYPES.deploy:
      await runDeploy(event.data, deps);
      return undefined;
    default:
      deps.log.warn({ type: event.type }, 'no handler for this event type; event dropped');
      return undefined;
  }
}

const RANK: Record<string, number> = { resync: 0, modified: 1, 'ref-changed': 2, added: 3, deleted: 4 };

/**
 * Coalesces two events for one object into the one that runs: a newer object event replaces
 * anything waiting (it starts a new run from the latest object), keeping the stronger reason
 * (a pending `ref-changed` must still force the run); a stage event waiting for retry is
 * replaced by any object event.
 */
export function coalesceEvents(pending: StageEvent, next: StageEvent): StageEvent {
  if (pending.type === EVENT_TYPES.object && next.type === EVENT_TYPES.object) {
    const p = pending as ObjectEvent;
    const n = next as ObjectEvent;
    if ((RANK[p.data.reason] ?? 0) > (RANK[n.data.reason] ?? 0)) {
      return { ...n, data: { ...n.data, reason: p.data.reason } };
    }
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
}

/**
 * The embedded default's transport and driver: accepts forwarder events (it implements the
 * forwarder's `Transport`) and runs each object's stages in process.
 */
export class EmbeddedPipeline {
  private readonly queue: KeyedQueue<StageEvent>;

  constructor(
    private readonly deps: DispatchDeps,
    opts: EmbeddedPipelineOptions = {},
  ) {
    this.queue = new KeyedQueue<StageEvent>((_key, item) => this.run(item), {
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
  async send(events: readonly StageEvent[]): Promise<void> {
    for (const e of events) this.queue.add(orderingKey(objectOf(e)), e);
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

  private async run(first: StageEvent): Promise<void> {
    let ev: StageEvent | undefined = first;
    while (ev) {
      const current: StageEvent = ev;
      try {
        ev = await dispatchEvent(current, this.deps);
      } catch (err) {
        throw new RetryFrom(current, err);
      }
    }
  }
}

function objectOf(e: StageEvent) {
  if (isDeleteEvent(e)) return e.data.object;
  return objectRefOf(e as KappEvent);
}
