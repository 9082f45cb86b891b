/**
 * Transport port ({@link EventSender}) and its adapters: SQS FIFO for Lambda, memory for tests.
 *
 * @module
 */
export { MemoryEventSender, type SentEvent } from './memory.js';
export { type EventSender, TransportError } from './port.js';
export { SqsEventSender, type SqsEventSenderOptions, type SqsSendClient, sendMessageInput } from './sqs.js';
