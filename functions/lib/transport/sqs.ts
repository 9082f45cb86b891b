/**
 * {@link EventSender} over SQS FIFO queues, one queue per stage function.
 *
 * - `MessageGroupId` = `orderingKey(object)`: the events of one object are delivered one at
 *   a time and in order (kapp-controller's UniqueReconciler, across the fleet: the key
 *   includes the cluster id), while different objects proceed in parallel.
 * - `MessageDeduplicationId` = the CloudEvents `id`: builders derive ids from content, so a
 *   stage that is retried and emits the same hand-off again is deduplicated by SQS within its
 *   5-minute window (beyond it, the next stage's fencing and no-op checks absorb duplicates).
 * - `MessageBody` = the structured-mode CloudEvents JSON (`serializeEvent`).
 *
 * @module
 */
import type { SendMessageCommand, SendMessageCommandInput } from '@aws-sdk/client-sqs';
import { type KappEvent, objectRefOf, orderingKey, serializeEvent } from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import { type EventSender, TransportError } from './port.js';

/**
 * The part of `SQSClient` this adapter uses (an `SQSClient` satisfies it; unit tests pass a
 * recording fake).
 */
export interface SqsSendClient {
  /** Sends one command; resolves with the SDK output, rejects with the SDK error. */
  send(command: SendMessageCommand): Promise<unknown>;
}

/** Options of {@link SqsEventSender}. */
export interface SqsEventSenderOptions {
  /** The SQS client, created once per process by the entry file. */
  readonly client: SqsSendClient;
  /** Queue URL of each stage this function sends to (FIFO queues: the URL ends in `.fifo`). */
  readonly queueUrls: Readonly<Partial<Record<PipelineStage, string>>>;
}

/**
 * The `SendMessage` input for `event` on `queueUrl` (pure; the adapter's whole mapping).
 *
 * @throws EventValidationError when the body exceeds 256 KiB.
 */
export function sendMessageInput(queueUrl: string, event: KappEvent): SendMessageCommandInput {
  return {
    QueueUrl: queueUrl,
    MessageBody: serializeEvent(event),
    MessageGroupId: orderingKey(objectRefOf(event)),
    MessageDeduplicationId: event.id,
  };
}

/** Sends each event to its stage's FIFO queue with one `SendMessage` call. */
export class SqsEventSender implements EventSender {
  readonly #client: SqsSendClient;
  readonly #queueUrls: Readonly<Partial<Record<PipelineStage, string>>>;

  constructor(opts: SqsEventSenderOptions) {
    this.#client = opts.client;
    this.#queueUrls = { ...opts.queueUrls };
  }

  /**
   * {@inheritDoc EventSender.send}
   * @throws TransportError `no queue configured for the <stage> function` when this sender
   *   has no URL for `stage`, or `failed to send event to the <stage> queue` with the SDK
   *   error as `cause`.
   */
  async send(stage: PipelineStage, event: KappEvent): Promise<void> {
    const url = this.#queueUrls[stage];
    if (!url) throw new TransportError(`no queue configured for the ${stage} function`);
    const input = sendMessageInput(url, event);
    try {
      // The SDK is loaded on the first send, not when this module is imported (a cold start).
      const { SendMessageCommand } = await import('@aws-sdk/client-sqs');
      await this.#client.send(new SendMessageCommand(input));
    } catch (cause) {
      throw new TransportError(`failed to send event to the ${stage} queue`, { cause });
    }
  }
}
