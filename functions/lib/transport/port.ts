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
  /**
   * Delivers several events to one stage's queue in as few requests as the transport allows
   * (SQS: `SendMessageBatch`, 10 messages a request), in order. Optional: {@link sendAll} falls
   * back to one {@link send} per event.
   *
   * Contract: as `send`, for every event; on a rejection some events may already be queued, so
   * the caller resends the whole list (the FIFO queue's deduplication by event id drops the
   * copies within its 5-minute window; the stages are idempotent beyond it).
   *
   * @throws TransportError when any event was not accepted.
   */
  sendMany?(stage: PipelineStage, events: readonly KappEvent[]): Promise<void>;
}

/**
 * Sends `events` in order, each to its stage ({@link EventSender.sendMany} for each run of
 * consecutive events with the same stage, else one {@link EventSender.send} each). Why runs and
 * not a grouping by stage: events of one object may go to two stages, and their order holds only
 * if they leave in the order given.
 *
 * @param sender - the transport.
 * @param events - events with their stage, in the order they must be delivered.
 * @throws TransportError (or what `sender` throws) at the first run not accepted; the runs
 *   after it are not sent.
 */
export async function sendAll(
  sender: EventSender,
  events: readonly { readonly stage: PipelineStage; readonly event: KappEvent }[],
): Promise<void> {
  let i = 0;
  while (i < events.length) {
    const stage = events[i]?.stage as PipelineStage;
    let j = i;
    while (j < events.length && events[j]?.stage === stage) j++;
    const run = events.slice(i, j).map((e) => e.event);
    if (sender.sendMany && run.length > 1) await sender.sendMany(stage, run);
    else for (const event of run) await sender.send(stage, event);
    i = j;
  }
}

/**
 * Acknowledges received messages of the function's own queue before the invocation returns
 * (SQS: `DeleteMessageBatch` with the records' receipt handles). Why early: a message in flight
 * holds its FIFO message group until it is deleted, so the records of an App that succeeded
 * beside a slow record of another App would otherwise hold that App's next events until the
 * whole invocation returned.
 *
 * Contract: resolve once every message is deleted; reject otherwise. A rejection is harmless
 * (the event source mapping deletes every record not reported failed when the invocation
 * returns), so callers only log it.
 */
export interface MessageDeleter {
  /**
   * @param receiptHandles - the handles of this receive of the messages (the records'
   *   `receiptHandle`), any number (the adapter splits them into requests).
   * @throws TransportError when a message was not deleted.
   */
  delete(receiptHandles: readonly string[]): Promise<void>;
}

/**
 * Proves that records handed to the function are messages of its own queue, received for it now
 * (SQS: `ChangeMessageVisibilityBatch` with the records' receipt handles on the queue URL the
 * function is configured with). Why: the sender check trusts `SenderId`, which SQS sets, but a
 * record's fields reach the function from whoever invoked it; a direct `lambda:Invoke` can hand
 * it an SQS-shaped event with any `SenderId`, `MessageGroupId` or `eventSourceARN`. A receipt
 * handle is issued by the queue to a receiver of that queue's message and is accepted back only
 * while that message is in flight, so one the queue accepts was not made up by the invoker.
 *
 * Contract: resolve with one answer per handle, in order: true when the queue accepted it; false
 * when the queue refused it as the sender's fault (an unknown, expired or foreign handle); reject
 * when the queue could not answer for some handle (network, throttling, a server error), so the
 * caller fails those records rather than refusing them.
 */
export interface RecordProver {
  /**
   * @param receiptHandles - the records' receipt handles, any number (the adapter splits them
   *   into requests).
   * @param visibilitySeconds - the visibility timeout each proven message is given from now,
   *   seconds (the proof is a visibility change): at least the time the invocation has left.
   * @returns whether each handle is proven, by position.
   * @throws TransportError when the queue did not answer for every handle.
   */
  prove(receiptHandles: readonly string[], visibilitySeconds: number): Promise<readonly boolean[]>;
}

/**
 * SQS message attribute carrying how many times a message was postponed
 * ({@link MessageRequeuer}): a Number, absent on a message never postponed. Set only by the
 * function that owns the queue (the record proof and the sender check vouch for it).
 */
export const POSTPONED_ATTRIBUTE = 'kapp-lambda-postponed';

/** One received record to send back to the function's own queue ({@link MessageRequeuer}). */
export interface RequeuedMessage {
  /** The SQS message id of the record as received (names the copy's deduplication id). */
  readonly messageId: string;
  /** The record's body, unchanged (the event as received). */
  readonly body: string;
  /** The record's `MessageGroupId`, kept so the copy stays in its object's group. */
  readonly messageGroupId: string;
  /** How many times the copy has now been postponed, this time included (1 on the first postponement). */
  readonly postponements: number;
}

/**
 * Sends copies of received records back to the function's own queue, so that a record the
 * function cannot run now (past the function deadline; over its cluster's fair share) runs
 * later without spending one of its deliveries: a record returned through `batchItemFailures`
 * counts a receive and, after `maxReceiveCount`, goes to the dead-letter queue with no status.
 * The caller acknowledges the original (does not report it failed) once the copy is accepted.
 *
 * Contract: resolve once every copy is durably accepted, reject otherwise (the caller then
 * reports the originals failed, which returns them the usual way). A copy's deduplication id
 * is derived from `messageId` and `postponements`, so a repeated requeue of the same record
 * within SQS's 5-minute window is dropped as a copy. Each copy carries
 * {@link POSTPONED_ATTRIBUTE} = `postponements`.
 */
export interface MessageRequeuer {
  /**
   * @param messages - the records to send back, any number (the adapter splits them into requests).
   * @throws TransportError when a copy was not accepted.
   */
  requeue(messages: readonly RequeuedMessage[]): Promise<void>;
}

/** The event was not accepted by the transport; `cause` holds the SDK or network error. */
export class TransportError extends Error {
  override readonly name = 'TransportError';
}
