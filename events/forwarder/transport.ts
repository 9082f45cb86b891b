/**
 * The forwarder's outbound port: where coalesced events go (SQS FIFO in the cloud, the
 * in-process keyed queue in the embedded runtime, an array in tests).
 *
 * @module
 */
import type { CloudEvent } from './event.js';

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
   * @param events - One batch, 1..`batchSize` events, in emission order; at most one event per
   *   object (kind, namespace, name, uid).
   * @throws any error to have the whole batch retried.
   */
  send(events: CloudEvent[]): Promise<void>;
}
