/**
 * Transport port ({@link EventSender}) and its adapters: SQS FIFO for Lambda, memory for tests.
 *
 * @module
 */
export { MemoryEventSender, type SentEvent } from './memory.js';
export { type EventSender, type MessageDeleter, type RecordProver, sendAll, TransportError } from './port.js';
export {
  SQS_BATCH_ENTRIES,
  SqsEventSender,
  type SqsEventSenderOptions,
  SqsMessageDeleter,
  SqsRecordProver,
  type SqsSendClient,
  sendMessageBatches,
  sendMessageInput,
} from './sqs.js';
