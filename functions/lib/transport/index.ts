/**
 * Transport port ({@link EventSender}) and its adapters: SQS FIFO for Lambda, memory for tests.
 *
 * @module
 */
export { MemoryEventSender, MemoryMessageRequeuer, type SentEvent } from './memory.js';
export {
  type EventSender,
  type MessageDeleter,
  type MessageRequeuer,
  POSTPONED_ATTRIBUTE,
  type RecordProver,
  type RequeuedMessage,
  sendAll,
  TransportError,
} from './port.js';
export {
  messageGroupId,
  postponedDedupId,
  requeueEntry,
  SQS_BATCH_ENTRIES,
  SqsEventSender,
  type SqsEventSenderOptions,
  SqsMessageDeleter,
  SqsMessageRequeuer,
  SqsRecordProver,
  type SqsSendClient,
  sendMessageBatches,
  sendMessageInput,
} from './sqs.js';
