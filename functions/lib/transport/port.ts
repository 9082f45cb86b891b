/**
 * The stage functions' outbound port: where the next stage's event goes. On Lambda an
 * {@link EventSender} is the SQS FIFO adapter (`./sqs.ts`); tests use `./memory.ts`. The
 * embedded runtime does not need one: {@link EmbeddedPipeline} runs the next stage in process.
 *
 * Pure: no I/O here, only the contract and the event → destination rules.
 *
 * @module
 */
import {
  type KappEvent,
  MAX_EVENT_BYTES,
  type ObjectIdentity,
  objectRefOf,
  serializeEvent,
  targetFunction,
} from '../../../events/schema.js';
import { isDeleteEvent } from '../pipeline/delete-event.js';
import type { StageEvent } from '../pipeline/runtime.js';

/** The functions of the App pipeline, each with its own queue. */
export const PIPELINE_STAGES = ['fetch', 'template', 'deploy'] as const;
/** One of {@link PIPELINE_STAGES}. */
export type PipelineStage = (typeof PIPELINE_STAGES)[number];

/**
 * Delivers one event to a stage's queue.
 *
 * Contract: resolve only once the event is durably accepted; reject otherwise (the caller
 * then fails the record it was processing, so the transport redelivers that record and the
 * stage runs again — every stage is idempotent). Events of one object (same
 * {@link objectOfEvent}) must be delivered to the consumer in the order sent.
 */
export interface EventSender {
  /**
   * @param stage - the function that consumes `event` (see {@link destinationOf}).
   * @param event - a validated stage event (builders in `events/schema.ts`, `deleteEvent`).
   * @throws TransportError when the event was not accepted.
   */
  send(stage: PipelineStage, event: StageEvent): Promise<void>;
}

/** The event was not accepted by the transport; `cause` holds the SDK or network error. */
export class TransportError extends Error {
  override readonly name = 'TransportError';
}

/** The object an event is about (cluster, kind, namespace, name): its ordering identity. */
export function objectOfEvent(event: StageEvent): ObjectIdentity {
  return isDeleteEvent(event) ? event.data.object : objectRefOf(event as KappEvent);
}

/**
 * The pipeline function that consumes `event`: `targetFunction` of `events/schema.ts`, and
 * `deploy` for the delete hand-off (only the deploy function holds the credentials
 * `kapp delete` needs).
 *
 * @returns the stage, or `undefined` for events outside the App pipeline (`install`,
 *   `index-repo`), which no pipeline queue carries.
 */
export function destinationOf(event: StageEvent): PipelineStage | undefined {
  if (isDeleteEvent(event)) return 'deploy';
  const target = targetFunction(event as KappEvent);
  return (PIPELINE_STAGES as readonly string[]).includes(target) ? (target as PipelineStage) : undefined;
}

/**
 * The structured-mode CloudEvents JSON body of any stage event.
 *
 * @throws EventValidationError (from `serializeEvent`) when the body would exceed
 *   {@link MAX_EVENT_BYTES} (256 KiB, the SQS message limit).
 */
export function serializeStageEvent(event: StageEvent): string {
  // serializeEvent only stringifies and bounds the size, which holds for the delete hand-off too.
  return serializeEvent(event as KappEvent);
}
