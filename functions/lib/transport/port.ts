/**
 * The stage functions' outbound port: where the next stage's event goes. On Lambda an
 * {@link EventSender} is the SQS FIFO adapter (`./sqs.ts`); tests use `./memory.ts`. The
 * embedded runtime does not need one: `EmbeddedPipeline` runs the next stage in process.
 *
 * Pure: no I/O here, only the contract. Which function an event is for, the object it is
 * about and its body are the event contract's (`targetFunction`, `objectRefOf`,
 * `serializeEvent` in `events/schema.ts`).
 *
 * @module
 */
import type { KappEvent } from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';

/**
 * Delivers one event to a stage's queue.
 *
 * Contract: resolve only once the event is durably accepted; reject otherwise (the caller
 * then fails the record it was processing, so the transport redelivers that record and the
 * stage runs again — every stage is idempotent). Events of one object (same `objectRefOf`
 * identity) must be delivered to the consumer in the order sent.
 */
export interface EventSender {
  /**
   * @param stage - the function that consumes `event` (its `targetFunction`).
   * @param event - a validated event (built by the builders of `events/schema.ts`).
   * @throws TransportError when the event was not accepted.
   */
  send(stage: PipelineStage, event: KappEvent): Promise<void>;
}

/** The event was not accepted by the transport; `cause` holds the SDK or network error. */
export class TransportError extends Error {
  override readonly name = 'TransportError';
}
