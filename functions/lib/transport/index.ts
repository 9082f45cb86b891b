/**
 * Transport port ({@link EventSender}) and its adapters: SQS FIFO for Lambda, memory for tests.
 *
 * @module
 */
export { MemoryEventSender, type SentEvent } from './memory.js';
export {
  destinationOf,
  type EventSender,
  objectOfEvent,
  PIPELINE_STAGES,
  type PipelineStage,
  serializeStageEvent,
  TransportError,
} from './port.js';
export { SqsEventSender, type SqsEventSenderOptions, type SqsSendClient, sendMessageInput } from './sqs.js';
