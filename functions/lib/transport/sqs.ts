/**
 * {@link EventSender} over SQS FIFO queues, one queue per stage function.
 *
 * - `MessageGroupId` = {@link messageGroupId}: the object's ordering key under the HMAC key of its
 *   cluster. The events of one object are delivered one at a time and in order (kapp-controller's
 *   UniqueReconciler, across the fleet: the group includes the cluster id), while different
 *   objects proceed in parallel; the key keeps other clusters' senders out of the group.
 * - `MessageDeduplicationId` = {@link dedupId}: the CloudEvents `id` under the HMAC key of the
 *   event's cluster. Builders derive ids from content, so a stage that is retried and emits the
 *   same hand-off again, or a forwarder that announces a change again after a restart, is
 *   deduplicated by SQS within its 5-minute window (beyond it, the next stage's fencing and no-op
 *   checks absorb duplicates). The key keeps that while making the id unpredictable to anyone
 *   but the cluster's own senders (see {@link dedupId}).
 * - `MessageBody` = the structured-mode CloudEvents JSON (`serializeEvent`).
 * - Several events for one queue ({@link SqsEventSender.sendMany}: a forwarder's batch, a
 *   source poll's pokes) go out as `SendMessageBatch` requests of up to
 *   {@link SQS_BATCH_ENTRIES} messages and {@link MAX_EVENT_BYTES} of bodies: SQS bills a
 *   request, not a message, so 10 events due together cost one request instead of ten. Within a
 *   batch, FIFO order holds per message group, as for messages sent one by one.
 *
 * @module
 */
import { createHash, createHmac } from 'node:crypto';
import type {
  ChangeMessageVisibilityBatchCommand,
  ChangeMessageVisibilityBatchResult,
  DeleteMessageBatchCommand,
  DeleteMessageBatchResult,
  SendMessageBatchCommand,
  SendMessageBatchRequestEntry,
  SendMessageBatchResult,
  SendMessageCommand,
  SendMessageCommandInput,
} from '@aws-sdk/client-sqs';
import {
  type KappEvent,
  MAX_EVENT_BYTES,
  type ObjectIdentity,
  objectRefOf,
  orderingKey,
  serializeEvent,
  subjectOf,
} from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import {
  type EventSender,
  type MessageDeleter,
  type MessageRequeuer,
  POSTPONED_ATTRIBUTE,
  type RecordProver,
  type RequeuedMessage,
  TransportError,
} from './port.js';

/**
 * The part of `SQSClient` this adapter uses (an `SQSClient` satisfies it; unit tests pass a
 * recording fake).
 */
export interface SqsSendClient {
  /**
   * Sends one command; resolves with the SDK output (a `SendMessageBatchResult` for a batch),
   * rejects with the SDK error. `DeleteMessageBatch` is the function's early acknowledgement of its
   * own records ({@link SqsMessageDeleter}); `ChangeMessageVisibilityBatch` its proof that records
   * are its queue's ({@link SqsRecordProver}); a `SendMessageBatch` to its own queue the copies of
   * the records it postponed ({@link SqsMessageRequeuer}).
   */
  send(
    command:
      | SendMessageCommand
      | SendMessageBatchCommand
      | DeleteMessageBatchCommand
      | ChangeMessageVisibilityBatchCommand,
  ): Promise<unknown>;
}

/** Options of {@link SqsEventSender}. */
export interface SqsEventSenderOptions {
  /** The SQS client, created once per process by the entry file. */
  readonly client: SqsSendClient;
  /** Queue URL of each stage this function sends to (FIFO queues: the URL ends in `.fifo`). */
  readonly queueUrls: Readonly<Partial<Record<PipelineStage, string>>>;
  /**
   * The event key of a cluster ({@link dedupId}): the functions' from the cluster's registry
   * document (`eventKey`), a forwarder's its own cluster's (its Secret). A rejection fails the
   * send (`TransportError`). Default: none for every cluster (the event id is the deduplication
   * id: the local and emulator setups).
   */
  readonly dedupKeyOf?: (clusterId: string) => Promise<Uint8Array | undefined> | Uint8Array | undefined;
}

/**
 * The `MessageDeduplicationId` of an event: 64 hex chars of HMAC-SHA256 under its cluster's event
 * key `key` of `kapp-lambda/dedup/v1`, a NUL and the event id; the event id itself when there is
 * no key.
 *
 * Why a key: the entry queues deduplicate per message group (`deduplicationScope:
 * MESSAGE_GROUP`), SQS lets any sender choose both the group and the id, and event ids are
 * derived from content a tenant can learn (uid, resourceVersion, reason). A forwarder of another
 * cluster could send first, in the victim object's group, a message with the id of that object's
 * next event: the functions refuse the message (the sender check), but SQS would drop the real
 * event as its copy for 5 minutes. Under a key only the cluster's senders hold (the functions
 * from its registry document, its forwarder from the Secret join writes), the same event still
 * gets the same id from any of them, before or after a restart, so copies are still dropped,
 * while no other sender can compute one. Why not a group bound to the sender: SQS does not bind
 * `MessageGroupId` to the sender either, so a group is as choosable as an id, and the stage
 * functions' hand-offs and follow-ups must share the object's group with its forwarder's events.
 * The event id, and so the event contract, is unchanged.
 */
export function dedupId(key: Uint8Array | undefined, eventId: string): string {
  if (key === undefined) return eventId;
  return createHmac('sha256', key).update(`kapp-lambda/dedup/v1\0${eventId}`).digest('hex');
}

/**
 * The `MessageGroupId` of an object's events: `<cluster id>/` and 64 hex chars of HMAC-SHA256
 * under its cluster's event key `key` of `kapp-lambda/group/v1`, a NUL and the object's subject
 * (`subjectOf`); its ordering key (`orderingKey`) when there is no key. At most 128 characters (a
 * cluster id has at most 63), as SQS requires.
 *
 * Why a key, as for {@link dedupId}: SQS lets any sender choose the group, and a FIFO queue
 * delivers a group's messages one at a time, so a sender that can name another cluster's object's
 * group (the plain ordering key is `<cluster>/<Kind>/<ns>/<name>`, all guessable) could keep that
 * object's events waiting behind its own messages, each refused only when its turn comes. Under the
 * cluster's key only the cluster's senders (its forwarder and the functions) can compute the group;
 * every one of them computes the same group for the same object, so an object's events stay in
 * order across senders, and the cluster id in front keeps groups readable per cluster.
 */
export function messageGroupId(key: Uint8Array | undefined, ref: ObjectIdentity): string {
  if (key === undefined) return orderingKey(ref);
  const mac = createHmac('sha256', key)
    .update(`kapp-lambda/group/v1\0${subjectOf(ref)}`)
    .digest('hex');
  return `${ref.clusterId}/${mac}`;
}

/**
 * The `SendMessage` input for `event` on `queueUrl` (pure; the adapter's whole mapping).
 *
 * @param key - the event's cluster's event key ({@link dedupId}, {@link messageGroupId}); none:
 *   the event id and the object's ordering key.
 * @throws EventValidationError when the body exceeds 256 KiB.
 */
export function sendMessageInput(queueUrl: string, event: KappEvent, key?: Uint8Array): SendMessageCommandInput {
  return {
    QueueUrl: queueUrl,
    MessageBody: serializeEvent(event),
    MessageGroupId: messageGroupId(key, objectRefOf(event)),
    MessageDeduplicationId: dedupId(key, event.id),
  };
}

/** Most messages of one `SendMessageBatch` request: 10 (SQS's limit). */
export const SQS_BATCH_ENTRIES = 10;

/**
 * Splits request entries into the lists of successive batch requests, in order: each at most
 * {@link SQS_BATCH_ENTRIES} entries and, with `bytesOf`, at most {@link MAX_EVENT_BYTES} in all
 * (SQS's limit on a batch's total payload). One entry alone may exceed the byte limit; the caller
 * refuses those first.
 */
function batchesOf<T>(entries: readonly T[], bytesOf: (entry: T) => number = () => 0): T[][] {
  const batches: T[][] = [];
  let current: T[] = [];
  let bytes = 0;
  for (const entry of entries) {
    const size = bytesOf(entry);
    if (current.length >= SQS_BATCH_ENTRIES || (current.length > 0 && bytes + size > MAX_EVENT_BYTES)) {
      batches.push(current);
      current = [];
      bytes = 0;
    }
    current.push(entry);
    bytes += size;
  }
  if (current.length > 0) batches.push(current);
  return batches;
}

/**
 * The bytes of a `SendMessageBatch` entry that count toward SQS's payload limit: its body and its
 * message attributes (name, type and value of each).
 */
function bodyBytes(entry: SendMessageBatchRequestEntry): number {
  let bytes = Buffer.byteLength(entry.MessageBody ?? '');
  for (const [name, value] of Object.entries(entry.MessageAttributes ?? {})) {
    bytes += Buffer.byteLength(`${name}${value.DataType ?? ''}${value.StringValue ?? ''}`);
  }
  return bytes;
}

/**
 * Splits events bound for one queue into `SendMessageBatch` entry lists, in order: each at most
 * {@link SQS_BATCH_ENTRIES} entries and {@link MAX_EVENT_BYTES} of bodies (SQS's limit on a
 * batch's total payload). Entry ids are the event's position in `events` (unique per request,
 * as SQS requires, and they name the event in a failure).
 *
 * @param keyOf - each event's cluster's event key ({@link dedupId}); default none.
 * @throws EventValidationError when one event's body alone exceeds {@link MAX_EVENT_BYTES}.
 */
export function sendMessageBatches(
  queueUrl: string,
  events: readonly KappEvent[],
  keyOf: (event: KappEvent) => Uint8Array | undefined = () => undefined,
): SendMessageBatchRequestEntry[][] {
  const entries = events.map((event, i): SendMessageBatchRequestEntry => {
    const { MessageBody, MessageGroupId, MessageDeduplicationId } = sendMessageInput(queueUrl, event, keyOf(event));
    return { Id: String(i), MessageBody, MessageGroupId, MessageDeduplicationId };
  });
  return batchesOf(entries, bodyBytes);
}

/**
 * Sends `entries` to `queueUrl` as `SendMessageBatch` requests ({@link batchesOf}), in order.
 *
 * @param what - what the entries are, for errors (`events to the fetch queue`).
 * @throws TransportError `failed to send <what>` with the SDK error as `cause`, or `failed to
 *   send <n> of <m> <what>: <code>: <message>` when SQS refused some entries of a request (the
 *   requests after it are not sent).
 */
async function sendEntries(
  client: SqsSendClient,
  queueUrl: string,
  entries: readonly SendMessageBatchRequestEntry[],
  what: string,
): Promise<void> {
  const { SendMessageBatchCommand } = await import('@aws-sdk/client-sqs');
  for (const batch of batchesOf(entries, bodyBytes)) {
    let result: SendMessageBatchResult | undefined;
    try {
      result = (await client.send(
        new SendMessageBatchCommand({ QueueUrl: queueUrl, Entries: batch }),
      )) as SendMessageBatchResult;
    } catch (cause) {
      throw new TransportError(`failed to send ${what}`, { cause });
    }
    const failed = result?.Failed ?? [];
    if (failed.length > 0) {
      const first = failed[0];
      throw new TransportError(
        `failed to send ${failed.length} of ${batch.length} ${what}: ${first?.Code ?? 'unknown'}: ${first?.Message ?? ''}`.trimEnd(),
      );
    }
  }
}

/** Sends events to their stage's FIFO queue: `SendMessage` for one, `SendMessageBatch` for several. */
export class SqsEventSender implements EventSender {
  readonly #client: SqsSendClient;
  readonly #queueUrls: Readonly<Partial<Record<PipelineStage, string>>>;
  readonly #dedupKeyOf: SqsEventSenderOptions['dedupKeyOf'];

  constructor(opts: SqsEventSenderOptions) {
    this.#client = opts.client;
    this.#queueUrls = { ...opts.queueUrls };
    this.#dedupKeyOf = opts.dedupKeyOf;
  }

  /** The event key of each cluster `events` name ({@link SqsEventSenderOptions.dedupKeyOf}). */
  async #keys(
    stage: PipelineStage,
    events: readonly KappEvent[],
  ): Promise<(event: KappEvent) => Uint8Array | undefined> {
    const keyOf = this.#dedupKeyOf;
    if (!keyOf) return () => undefined;
    const keys = new Map<string, Uint8Array | undefined>();
    try {
      for (const event of events) {
        const { clusterId } = objectRefOf(event);
        if (!keys.has(clusterId)) keys.set(clusterId, await keyOf(clusterId));
      }
    } catch (cause) {
      throw new TransportError(`failed to read the event key of a cluster to send to the ${stage} queue`, { cause });
    }
    return (event) => keys.get(objectRefOf(event).clusterId);
  }

  /**
   * {@inheritDoc EventSender.send}
   * @throws TransportError `no queue configured for the <stage> function` when this sender
   *   has no URL for `stage`, `failed to read the event key of a cluster to send to the <stage>
   *   queue` when `dedupKeyOf` rejects, or `failed to send event to the <stage> queue` with the
   *   SDK error as `cause`.
   */
  async send(stage: PipelineStage, event: KappEvent): Promise<void> {
    const url = this.#queueUrls[stage];
    if (!url) throw new TransportError(`no queue configured for the ${stage} function`);
    const input = sendMessageInput(url, event, (await this.#keys(stage, [event]))(event));
    try {
      // The SDK is loaded on the first send, not when this module is imported (a cold start).
      const { SendMessageCommand } = await import('@aws-sdk/client-sqs');
      await this.#client.send(new SendMessageCommand(input));
    } catch (cause) {
      throw new TransportError(`failed to send event to the ${stage} queue`, { cause });
    }
  }

  /**
   * {@inheritDoc EventSender.sendMany}
   * @throws TransportError `no queue configured for the <stage> function`; `failed to read the
   *   event key of a cluster to send to the <stage> queue` (none sent); `failed to send
   *   events to the <stage> queue` with the SDK error as `cause`; or `failed to send <n> of <m>
   *   events to the <stage> queue: <code>: <message>` when SQS refused some entries of a batch
   *   (the batches after it are not sent). EventValidationError before any request when an
   *   event's body exceeds 256 KiB.
   */
  async sendMany(stage: PipelineStage, events: readonly KappEvent[]): Promise<void> {
    const url = this.#queueUrls[stage];
    if (!url) throw new TransportError(`no queue configured for the ${stage} function`);
    const batches = sendMessageBatches(url, events, await this.#keys(stage, events));
    await sendEntries(this.#client, url, batches.flat(), `events to the ${stage} queue`);
  }
}

/**
 * {@link MessageDeleter} of one function's own FIFO queue: `DeleteMessageBatch` requests of up to
 * {@link SQS_BATCH_ENTRIES} receipt handles (the function role's `sqs:DeleteMessage`, which its
 * event source mapping's consume grant carries). The mapping deletes the same records again
 * when the invocation returns; that its second delete fails nothing is not yet shown on AWS
 * (`docs/lambda-runtime.md`, "FIFO ordering").
 */
export class SqsMessageDeleter implements MessageDeleter {
  readonly #client: SqsSendClient;
  readonly #queueUrl: string;

  /**
   * @param client - the function's SQS client.
   * @param queueUrl - the URL of the queue the function's records come from.
   */
  constructor(client: SqsSendClient, queueUrl: string) {
    this.#client = client;
    this.#queueUrl = queueUrl;
  }

  /**
   * {@inheritDoc MessageDeleter.delete}
   * @throws TransportError `failed to delete messages of the function's queue` with the SDK
   *   error as `cause`, or `failed to delete <n> of <m> messages of the function's queue:
   *   <code>: <message>` when SQS refused some entries.
   */
  async delete(receiptHandles: readonly string[]): Promise<void> {
    const { DeleteMessageBatchCommand } = await import('@aws-sdk/client-sqs');
    const all = receiptHandles.map((handle, i) => ({ Id: String(i), ReceiptHandle: handle }));
    for (const entries of batchesOf(all)) {
      let result: DeleteMessageBatchResult | undefined;
      try {
        result = (await this.#client.send(
          new DeleteMessageBatchCommand({ QueueUrl: this.#queueUrl, Entries: entries }),
        )) as DeleteMessageBatchResult;
      } catch (cause) {
        throw new TransportError("failed to delete messages of the function's queue", { cause });
      }
      const failed = result?.Failed ?? [];
      if (failed.length > 0) {
        const first = failed[0];
        throw new TransportError(
          `failed to delete ${failed.length} of ${entries.length} messages of the function's queue: ${first?.Code ?? 'unknown'}: ${first?.Message ?? ''}`.trimEnd(),
        );
      }
    }
  }
}

/** Longest visibility timeout SQS accepts, seconds (12 hours). */
export const SQS_MAX_VISIBILITY_SECONDS = 43_200;

/**
 * {@link RecordProver} of one function's own FIFO queue: `ChangeMessageVisibilityBatch` requests
 * of up to {@link SQS_BATCH_ENTRIES} receipt handles on the queue URL the function is configured
 * with (the function role's `sqs:ChangeMessageVisibility`, which its event source mapping's
 * consume grant carries). SQS answers a handle it did not issue for a message of that queue now
 * in flight with a failed entry whose `SenderFault` is true (`ReceiptHandleIsInvalid`,
 * `MessageNotInflight`): that record is not proven. The visibility given is the time the
 * invocation has left plus a margin, as the queue's own (the function timeout plus 60 s), so a
 * proven message is not delivered again while it runs.
 */
export class SqsRecordProver implements RecordProver {
  readonly #client: SqsSendClient;
  readonly #queueUrl: string;

  /**
   * @param client - the function's SQS client.
   * @param queueUrl - the URL of the function's own queue (never one a record names).
   */
  constructor(client: SqsSendClient, queueUrl: string) {
    this.#client = client;
    this.#queueUrl = queueUrl;
  }

  /**
   * {@inheritDoc RecordProver.prove}
   * @throws TransportError `failed to prove records of the function's queue` with the SDK error as
   *   `cause`, or `failed to prove <n> of <m> records of the function's queue: <code>: <message>`
   *   when SQS failed some entries on its side (`SenderFault` false) or left some unanswered.
   */
  async prove(receiptHandles: readonly string[], visibilitySeconds: number): Promise<readonly boolean[]> {
    const { ChangeMessageVisibilityBatchCommand } = await import('@aws-sdk/client-sqs');
    const visibility = Math.max(0, Math.min(SQS_MAX_VISIBILITY_SECONDS, Math.ceil(visibilitySeconds)));
    const proven: boolean[] = [];
    const all = receiptHandles.map((handle, i) => ({
      Id: String(i),
      ReceiptHandle: handle,
      VisibilityTimeout: visibility,
    }));
    for (const entries of batchesOf(all)) {
      let result: ChangeMessageVisibilityBatchResult | undefined;
      try {
        result = (await this.#client.send(
          new ChangeMessageVisibilityBatchCommand({ QueueUrl: this.#queueUrl, Entries: entries }),
        )) as ChangeMessageVisibilityBatchResult;
      } catch (cause) {
        throw new TransportError("failed to prove records of the function's queue", { cause });
      }
      const ok = new Set((result?.Successful ?? []).map((e) => e.Id));
      const refused = new Set((result?.Failed ?? []).filter((e) => e.SenderFault === true).map((e) => e.Id));
      const unanswered = entries.filter((e) => !ok.has(e.Id) && !refused.has(e.Id));
      if (unanswered.length > 0) {
        const first = (result?.Failed ?? []).find((e) => e.SenderFault !== true);
        throw new TransportError(
          `failed to prove ${unanswered.length} of ${entries.length} records of the function's queue: ${first?.Code ?? 'unanswered'}: ${first?.Message ?? ''}`.trimEnd(),
        );
      }
      for (const e of entries) proven.push(ok.has(e.Id) && !refused.has(e.Id));
    }
    return proven;
  }
}

/**
 * The `MessageDeduplicationId` of a postponed record's copy ({@link SqsMessageRequeuer}): 64 hex
 * chars of SHA-256 of `kapp-lambda/postponed/v1`, a NUL, the record's message id, a NUL and its
 * postponements. Why these: a record received again before its copy was acknowledged (a requeue
 * that SQS accepted but answered too late, the invocation then returning the record the usual way)
 * carries the same message id and attribute, so its second copy is dropped within SQS's 5-minute
 * window; the copy's own later postponement has a new message id. The prefix keeps these ids
 * apart from the events' ({@link dedupId}) in the queue's deduplication scope.
 */
export function postponedDedupId(messageId: string, postponements: number): string {
  return createHash('sha256').update(`kapp-lambda/postponed/v1\0${messageId}\0${postponements}`).digest('hex');
}

/**
 * The `SendMessageBatch` entry of a postponed record's copy: its body and message group as
 * received, {@link postponedDedupId}, and {@link POSTPONED_ATTRIBUTE} = its postponements.
 */
export function requeueEntry(message: RequeuedMessage, id: string): SendMessageBatchRequestEntry {
  return {
    Id: id,
    MessageBody: message.body,
    MessageGroupId: message.messageGroupId,
    MessageDeduplicationId: postponedDedupId(message.messageId, message.postponements),
    MessageAttributes: {
      [POSTPONED_ATTRIBUTE]: { DataType: 'Number', StringValue: String(message.postponements) },
    },
  };
}

/**
 * {@link MessageRequeuer} of one function's own FIFO queue: `SendMessageBatch` requests
 * ({@link requeueEntry}, up to {@link SQS_BATCH_ENTRIES} messages and {@link MAX_EVENT_BYTES} of
 * bodies each) on the queue URL the function is configured with, under the function role's
 * `sqs:SendMessage` on its own queue (`infra/aws/stack.ts`). The copy's `SenderId` is then the
 * function's own role, which the receiving sender check accepts for any event of that queue
 * (`../entry/sender.ts`).
 */
export class SqsMessageRequeuer implements MessageRequeuer {
  readonly #client: SqsSendClient;
  readonly #queueUrl: string;

  /**
   * @param client - the function's SQS client.
   * @param queueUrl - the URL of the function's own queue.
   */
  constructor(client: SqsSendClient, queueUrl: string) {
    this.#client = client;
    this.#queueUrl = queueUrl;
  }

  /**
   * {@inheritDoc MessageRequeuer.requeue}
   * @throws TransportError `failed to send postponed messages to the function's queue` with the
   *   SDK error as `cause`, or `failed to send <n> of <m> postponed messages to the function's
   *   queue: <code>: <message>` when SQS refused some entries (the requests after it are not sent).
   */
  async requeue(messages: readonly RequeuedMessage[]): Promise<void> {
    const entries = messages.map((m, i) => requeueEntry(m, String(i)));
    await sendEntries(this.#client, this.#queueUrl, entries, "postponed messages to the function's queue");
  }
}
