/**
 * The forwarder's outbound port: where coalesced events go (SQS FIFO in the cloud, the
 * in-process keyed queue in the embedded runtime, an array in tests).
 *
 * @module
 */

import { isPipelineStage, type PipelineStage } from '../../functions/lib/api/functions.js';
import { type EventSender, sendAll } from '../../functions/lib/transport/port.js';
import { type KappEvent, targetFunction } from '../schema.js';

/**
 * Delivers events. The forwarder calls `send` with at most one batch outstanding (its
 * back-pressure: while a batch is in flight, newer events for the same object merge into the
 * one waiting behind it instead of queueing up).
 *
 * Contract: resolve only when every event of the batch is accepted (durably queued); reject
 * otherwise. A rejected batch is retried whole, with exponential backoff, until it is accepted
 * or the forwarder stops, so delivery is at least once and the receiver must be idempotent.
 */
export interface Transport {
  /**
   * @param events - One batch, 1..`batchSize` events, in emission order; at most one object
   *   event per object (kind, namespace, name, uid), and at most one health event per App
   *   (`dev.kapp-lambda.health.v1`, to the fetch function).
   * @throws any error to have the whole batch retried.
   */
  send(events: KappEvent[]): Promise<void>;
}

/** Options of {@link transportToStages}. */
export interface StageTransportOptions {
  /**
   * Called for an event no pipeline queue carries (none today: every `targetFunction` has a
   * queue; kept so a kind added to the contract before its function cannot block the batch);
   * the event is then skipped. Default: ignore.
   */
  onUnrouted?: (event: KappEvent) => void;
}

/**
 * A {@link Transport} over the stage functions' {@link EventSender} (SQS FIFO on Lambda): each
 * event goes to the queue of its entry function (`targetFunction`: App → `fetch`,
 * PackageRepository → `index-repo`, PackageInstall → `install`), in order, so per-object order
 * holds: each run of consecutive events for one queue in as few requests as the sender allows
 * (`sendAll`: SQS `SendMessageBatch`, 10 a request), so the events of a cluster that fall due
 * together (a restart's relist, a fleet upgrade) cost a tenth of the queue requests. The first
 * rejected request rejects the batch, which the forwarder then retries whole (at least once;
 * the queue's deduplication by event id drops copies, and the functions are idempotent).
 *
 * @param sender - The stage transport.
 * @param options - What to do with events no pipeline queue carries.
 */
export function transportToStages(sender: EventSender, options: StageTransportOptions = {}): Transport {
  return {
    async send(events) {
      const routed: { stage: PipelineStage; event: KappEvent }[] = [];
      for (const event of events) {
        const stage = targetFunction(event);
        if (isPipelineStage(stage)) routed.push({ stage, event });
        else options.onUnrouted?.(event);
      }
      await sendAll(sender, routed);
    },
  };
}
