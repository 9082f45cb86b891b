/**
 * A stand-in for Lambda's SQS event source mapping, for functions hosted under the Runtime
 * Interface Emulator (`./lambda.ts`): it receives from one FIFO queue, hands the batch to the
 * function as an SQS event (the record shape Lambda builds), and settles the batch as the
 * mapping does with `ReportBatchItemFailures` (`infra/aws/stack.ts`):
 *
 * - at most `batchSize` records per invocation (`STAGE_SIZING`), one invocation at a time
 *   (the emulator runs one; a deployed mapping runs up to `maxConcurrency`, and a FIFO group
 *   is never processed by two at once either way);
 * - a 200 answer with `batchItemFailures`: every other record is deleted, the named ones are
 *   left to come back when their visibility timeout ends;
 * - any other answer (a function error, a crash: RIE's `Runtime.ExitError`, a failed init, no
 *   answer at all): nothing is deleted, the whole batch comes back;
 * - dead-lettering is the queue's own: moto's server honours the `RedrivePolicy`
 *   (`maxReceiveCount`) and moves a message to the dead-letter queue on the receive after its
 *   last allowed one, as SQS does, so the poller does nothing of its own there.
 *
 * One difference, for a short test: the queues' visibility timeout is seconds, not the
 * function timeout plus a minute as deployed (`VISIBILITY_MARGIN_SECONDS`), so that a crashed
 * record comes back soon. So that a long invocation still never sees its records delivered a
 * second time, the poller keeps the batch invisible while the invocation runs (a
 * `ChangeMessageVisibility` every half timeout), which the deployed timeout guarantees by its
 * length.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import {
  ChangeMessageVisibilityBatchCommand,
  DeleteMessageBatchCommand,
  type Message,
  ReceiveMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';

/** One message attribute of an SQS record, as Lambda's mapping builds it (lower-case keys). */
export interface SqsEventMessageAttribute {
  stringValue?: string;
  binaryValue?: string;
  stringListValues: string[];
  binaryListValues: string[];
  dataType: string;
}

/** One record of an SQS event, as Lambda's mapping builds it. */
export interface SqsEventRecord {
  messageId: string;
  receiptHandle: string;
  body: string;
  attributes: Record<string, string>;
  /** The sender's message attributes (a postponed copy's `kapp-lambda-postponed`). */
  messageAttributes: Record<string, SqsEventMessageAttribute>;
  md5OfBody: string;
  eventSource: 'aws:sqs';
  eventSourceARN: string;
  awsRegion: string;
}

/** The function as the poller sees it: one invocation with an SQS event. */
export type InvokeFunction = (event: { Records: SqsEventRecord[] }) => Promise<{ status: number; body: unknown }>;

/** Settings of one mapping. */
export interface EventSourceMappingOptions {
  /** A name for errors and the record of invocations (the function's stage). */
  readonly name: string;
  readonly client: SQSClient;
  readonly queueUrl: string;
  readonly queueArn: string;
  readonly region: string;
  /** Records per invocation (1..10 for FIFO). */
  readonly batchSize: number;
  /** The queue's `VisibilityTimeout`, seconds: how long a batch stays invisible per extension. */
  readonly visibilityTimeoutSeconds: number;
  readonly invoke: InvokeFunction;
}

/** One invocation the mapping made. */
export interface Invocation {
  /** Message ids of the batch, in order. */
  readonly messageIds: readonly string[];
  /** `MessageGroupId` of each record. */
  readonly groupIds: readonly string[];
  /** `ApproximateReceiveCount` of each record. */
  readonly receiveCounts: readonly number[];
  /** `ok`: settled by `batchItemFailures`; `error`: the whole batch failed. */
  readonly outcome: 'ok' | 'error';
  /** Records the function reported failed (every record for `error`). */
  readonly failed: readonly string[];
  /** Round trip of the invoke, ms. */
  readonly ms: number;
  /** HTTP status and body of the answer (`status` 0 when RIE did not answer). */
  readonly status: number;
  readonly body: unknown;
}

/** The Lambda record of one received message. */
export function sqsEventRecord(m: Message, queueArn: string, region: string): SqsEventRecord {
  const body = m.Body ?? '';
  return {
    messageId: m.MessageId ?? '',
    receiptHandle: m.ReceiptHandle ?? '',
    body,
    attributes: { ...(m.Attributes ?? {}) } as Record<string, string>,
    messageAttributes: Object.fromEntries(
      Object.entries(m.MessageAttributes ?? {}).map(([name, a]) => [
        name,
        {
          ...(a.StringValue === undefined ? {} : { stringValue: a.StringValue }),
          ...(a.BinaryValue === undefined ? {} : { binaryValue: Buffer.from(a.BinaryValue).toString('base64') }),
          stringListValues: a.StringListValues ?? [],
          binaryListValues: (a.BinaryListValues ?? []).map((b) => Buffer.from(b).toString('base64')),
          dataType: a.DataType ?? 'String',
        },
      ]),
    ),
    md5OfBody: createHash('md5').update(body).digest('hex'),
    eventSource: 'aws:sqs',
    eventSourceARN: queueArn,
    awsRegion: region,
  };
}

/** The failed message ids of a function's answer; `undefined` unless it is a batch response. */
function batchFailures(status: number, body: unknown): string[] | undefined {
  if (status !== 200 || typeof body !== 'object' || body === null) return undefined;
  const failures = (body as { batchItemFailures?: unknown }).batchItemFailures;
  if (!Array.isArray(failures)) return undefined;
  return failures.map((f) => String((f as { itemIdentifier?: unknown }).itemIdentifier));
}

/** A running mapping: {@link EventSourceMapping.start} until {@link EventSourceMapping.stop}. */
export class EventSourceMapping {
  /** Every invocation so far, in order. */
  readonly invocations: Invocation[] = [];
  private running = false;
  private loop: Promise<void> | undefined;
  private lastError: unknown;

  constructor(private readonly opts: EventSourceMappingOptions) {}

  /** Starts polling (idempotent). */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = this.run();
  }

  /** Stops after the current receive or invocation; resolves when the loop ended. */
  async stop(): Promise<void> {
    this.running = false;
    await this.loop;
  }

  /** The last error of a receive or settle call, for a test's failure message. */
  get error(): unknown {
    return this.lastError;
  }

  private async run(): Promise<void> {
    const o = this.opts;
    while (this.running) {
      let messages: Message[] = [];
      try {
        const r = await o.client.send(
          new ReceiveMessageCommand({
            QueueUrl: o.queueUrl,
            MaxNumberOfMessages: o.batchSize,
            WaitTimeSeconds: 1,
            MessageSystemAttributeNames: ['All'],
            MessageAttributeNames: ['All'],
          }),
        );
        messages = r.Messages ?? [];
      } catch (err) {
        this.lastError = err;
        await new Promise((r) => setTimeout(r, 500));
        continue;
      }
      if (messages.length > 0) await this.handle(messages);
    }
  }

  private async handle(messages: Message[]): Promise<void> {
    const o = this.opts;
    const records = messages.map((m) => sqsEventRecord(m, o.queueArn, o.region));
    const entries = messages.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle ?? '' }));
    const keepInvisible = setInterval(
      () => {
        o.client
          .send(
            new ChangeMessageVisibilityBatchCommand({
              QueueUrl: o.queueUrl,
              Entries: entries.map((e) => ({ ...e, VisibilityTimeout: o.visibilityTimeoutSeconds })),
            }),
          )
          .catch((err: unknown) => {
            this.lastError = err;
          });
      },
      (o.visibilityTimeoutSeconds * 1000) / 2,
    );
    const t0 = performance.now();
    let status = 0;
    let body: unknown;
    try {
      ({ status, body } = await o.invoke({ Records: records }));
    } catch (err) {
      body = String(err);
    } finally {
      clearInterval(keepInvisible);
    }
    const ms = performance.now() - t0;
    const failures = batchFailures(status, body);
    const ids = records.map((r) => r.messageId);
    const failed = failures ?? ids;
    this.invocations.push({
      messageIds: ids,
      groupIds: records.map((r) => r.attributes.MessageGroupId ?? ''),
      receiveCounts: records.map((r) => Number(r.attributes.ApproximateReceiveCount)),
      outcome: failures ? 'ok' : 'error',
      failed,
      ms,
      status,
      body,
    });
    const done = entries.filter((_, i) => !failed.includes(ids[i] ?? ''));
    if (done.length === 0) return;
    try {
      await o.client.send(new DeleteMessageBatchCommand({ QueueUrl: o.queueUrl, Entries: done }));
    } catch (err) {
      this.lastError = err;
    }
  }
}
