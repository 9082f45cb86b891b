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
import type { FunctionName, KappEvent } from '../../../events/schema.js';

/**
 * The functions that have their own queue (and, on Lambda, their own SQS-triggered function,
 * `functions/<name>/index.ts`): the App pipeline's fetch, template and deploy, `index-repo`
 * (PackageRepository) and `install` (PackageInstall). THE list: the Lambda configuration (queue
 * variables), the layers, the forwarder's routing and the SQS handler all derive from it, so a new
 * function is added here, with its tools and its layer (the tool table `layers/tools.ts`, its
 * `ToolStage`, and `STAGE_TOOLS`), its cluster access (`FUNCTION_ACCESS`) and its entry file.
 */
export const PIPELINE_STAGES = ['fetch', 'template', 'deploy', 'index-repo', 'install'] as const;
/** One of {@link PIPELINE_STAGES}. */
export type PipelineStage = (typeof PIPELINE_STAGES)[number];

/**
 * Whether a function (`targetFunction` of an event) is one of the {@link PIPELINE_STAGES}, i.e.
 * has a queue (every {@link FunctionName} has one now; the guard keeps the two lists honest).
 */
export function isPipelineStage(fn: FunctionName): fn is PipelineStage {
  return (PIPELINE_STAGES as readonly string[]).includes(fn);
}

/**
 * The variable holding a function's queue URL: `KAPP_LAMBDA_QUEUE_URL_` + the function's name
 * in upper case with `-` as `_` (`index-repo` → `KAPP_LAMBDA_QUEUE_URL_INDEX_REPO`: a hyphen is
 * not a valid name for a shell or CloudFormation variable). The functions
 * (`functions/lib/entry/config.ts`) and the forwarder program (`events/forwarder/config.ts`)
 * read the same names.
 */
export function queueUrlEnv(stage: PipelineStage): string {
  return `KAPP_LAMBDA_QUEUE_URL_${stage.toUpperCase().replaceAll('-', '_')}`;
}

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
