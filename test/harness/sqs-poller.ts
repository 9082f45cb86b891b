/**
 * A stand-in for Lambda's SQS event source mapping, for functions hosted under the Runtime
 * Interface Emulator (`./lambda.ts`): it receives from one FIFO queue, hands the batch to the
 * function as an SQS event (the record shape Lambda builds), and settles the batch as the
 * mapping does with `ReportBatchItemFailures` (`infra/aws/stack.ts`):
 *
 * - at most `batchSize` records per invocation (`STAGE_SIZING`), and up to `maxConcurrency`
 *   invocations at once (default 1), each on a free one of the function's instances (an
 *   emulator serves one invocation at a time, as one of Lambda's execution environments does:
 *   `startRieInstances` in `./lambda.ts` starts several);
 * - a FIFO group is never in two invocations at once: a group with a message in flight
 *   delivers nothing more until that message is deleted or visible again. SQS guarantees it and
 *   so does moto's server (5.2.1 `receive_message` skips a group among its pending messages),
 *   so the poller does not hold records back itself; it receives one batch at a time (never two
 *   receives racing in moto's threads) and records an error ({@link EventSourceMapping.error})
 *   should a batch ever hold a group another in-flight batch holds;
 * - message attributes are received (`MessageAttributeNames: ['All']`) and passed in Lambda's
 *   record shape ({@link SqsMessageAttribute});
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

/**
 * One message attribute of a record, as Lambda's mapping writes it (camel case; the list
 * fields always present and empty, SQS does not implement them; a binary value base64).
 */
export interface SqsMessageAttribute {
  stringValue?: string;
  binaryValue?: string;
  stringListValues: string[];
  binaryListValues: string[];
  /** `String`, `Number` or `Binary`, with an optional `.<custom>` suffix. */
  dataType: string;
}

/** One record of an SQS event, as Lambda's mapping builds it. */
export interface SqsEventRecord {
  messageId: string;
  receiptHandle: string;
  body: string;
  attributes: Record<string, string>;
  messageAttributes: Record<string, SqsMessageAttribute>;
  md5OfBody: string;
  eventSource: 'aws:sqs';
  eventSourceARN: string;
  awsRegion: string;
}

/**
 * The function as the poller sees it: one invocation with an SQS event. One such target
 * serves one invocation at a time (an emulator instance, `invokeRie`).
 */
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
  /**
   * The function, or its instances (one per execution environment, e.g. `startRieInstances`):
   * each is given one batch at a time.
   */
  readonly invoke: InvokeFunction | readonly InvokeFunction[];
  /**
   * Batches in flight at once, as the mapping's `ScalingConfig.MaximumConcurrency` (default 1:
   * one invocation at a time).
   * @throws RangeError (from the constructor) when below 1 or above the number of instances.
   */
  readonly maxConcurrency?: number;
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
  /** When the invoke was sent and when its answer came, ms on this process's `performance.now()` clock. */
  readonly startedAt: number;
  readonly endedAt: number;
  /** Index of the instance that served it (in `invoke`'s order; 0 for a single function). */
  readonly instance: number;
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
      Object.entries(m.MessageAttributes ?? {}).map(([name, a]): [string, SqsMessageAttribute] => [
        name,
        {
          ...(a.StringValue !== undefined ? { stringValue: a.StringValue } : {}),
          ...(a.BinaryValue !== undefined ? { binaryValue: Buffer.from(a.BinaryValue).toString('base64') } : {}),
          stringListValues: [],
          binaryListValues: [],
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
  /** Every invocation so far, in the order they ended. */
  readonly invocations: Invocation[] = [];
  private readonly targets: readonly InvokeFunction[];
  private readonly maxConcurrency: number;
  /** Message groups of the batches in flight, with how many of their records each holds. */
  private readonly groupsInFlight = new Map<string, number>();
  private running = false;
  private loop: Promise<void> | undefined;
  private lastError: unknown;

  /** @throws RangeError when `maxConcurrency` is below 1 or above the number of instances. */
  constructor(private readonly opts: EventSourceMappingOptions) {
    this.targets = typeof opts.invoke === 'function' ? [opts.invoke] : [...opts.invoke];
    this.maxConcurrency = opts.maxConcurrency ?? 1;
    if (
      !Number.isInteger(this.maxConcurrency) ||
      this.maxConcurrency < 1 ||
      this.maxConcurrency > this.targets.length
    ) {
      throw new RangeError(
        `${opts.name}: maxConcurrency ${this.maxConcurrency} needs 1..${this.targets.length} (one instance per batch in flight)`,
      );
    }
  }

  /** Starts polling (idempotent). */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = this.run();
  }

  /** Stops after the current receive and the invocations in flight; resolves when they ended. */
  async stop(): Promise<void> {
    this.running = false;
    await this.loop;
  }

  /** The last error of a receive or settle call (or a group delivered twice), for a test's failure message. */
  get error(): unknown {
    return this.lastError;
  }

  private async run(): Promise<void> {
    const o = this.opts;
    const free = this.targets.map((_, i) => i);
    const inFlight = new Set<Promise<void>>();
    while (this.running) {
      if (inFlight.size >= this.maxConcurrency) {
        await Promise.race(inFlight);
        continue;
      }
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
      if (messages.length === 0) continue;
      const instance = free.shift() ?? 0;
      const handled: Promise<void> = this.handle(messages, instance)
        .catch((err: unknown) => {
          this.lastError = err;
        })
        .finally(() => {
          inFlight.delete(handled);
          free.push(instance);
        });
      inFlight.add(handled);
    }
    await Promise.all(inFlight);
  }

  /** Counts `groups` in flight (`by` 1) or out of it (`by` -1); notes a group already in flight. */
  private holdGroups(groups: readonly string[], by: 1 | -1): void {
    if (by === 1) {
      const held = [...new Set(groups)].filter((g) => g && this.groupsInFlight.has(g));
      if (held.length > 0) {
        this.lastError = new Error(
          `${this.opts.name}: the queue delivered group(s) ${held.join(', ')} while in flight`,
        );
      }
    }
    for (const g of groups) {
      const n = (this.groupsInFlight.get(g) ?? 0) + by;
      if (n > 0) this.groupsInFlight.set(g, n);
      else this.groupsInFlight.delete(g);
    }
  }

  private async handle(messages: Message[], instance: number): Promise<void> {
    const o = this.opts;
    const invoke = this.targets[instance];
    if (!invoke) throw new Error(`${o.name}: no instance ${instance}`);
    const records = messages.map((m) => sqsEventRecord(m, o.queueArn, o.region));
    const groupIds = records.map((r) => r.attributes.MessageGroupId ?? '');
    this.holdGroups(groupIds, 1);
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
    const startedAt = performance.now();
    let status = 0;
    let body: unknown;
    try {
      ({ status, body } = await invoke({ Records: records }));
    } catch (err) {
      body = String(err);
    } finally {
      clearInterval(keepInvisible);
    }
    const endedAt = performance.now();
    const failures = batchFailures(status, body);
    const ids = records.map((r) => r.messageId);
    const failed = failures ?? ids;
    this.invocations.push({
      messageIds: ids,
      groupIds,
      receiveCounts: records.map((r) => Number(r.attributes.ApproximateReceiveCount)),
      outcome: failures ? 'ok' : 'error',
      failed,
      ms: endedAt - startedAt,
      startedAt,
      endedAt,
      instance,
      status,
      body,
    });
    const done = entries.filter((_, i) => !failed.includes(ids[i] ?? ''));
    try {
      if (done.length > 0) await o.client.send(new DeleteMessageBatchCommand({ QueueUrl: o.queueUrl, Entries: done }));
    } catch (err) {
      this.lastError = err;
    } finally {
      this.holdGroups(groupIds, -1);
    }
  }
}
