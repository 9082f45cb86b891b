/**
 * The sender check trusts a record's `SenderId` only once the record is proven a message of the
 * function's own queue (`EntryDeps.prover`, `SqsRecordProver`: ChangeMessageVisibilityBatch by
 * receipt handle on the configured queue URL). A direct `lambda:Invoke` hands the function an
 * SQS-shaped event of its own making: its records are refused before anything of them is read,
 * with no other effect and nothing of them logged but the message id and why. SQS is faked at the
 * client port; the stage, the sender and the logger at theirs.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { ChangeMessageVisibilityBatchCommand } from '@aws-sdk/client-sqs';
import { describe, expect, it } from 'vitest';
import { type KappEvent, type ObjectRef, objectEvent } from '../../events/schema.js';
import { createAwsClients } from '../../functions/lib/entry/aws-clients.js';
import { parseLambdaEnv } from '../../functions/lib/entry/config.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { createLambdaDeps, senderCheckOf } from '../../functions/lib/entry/lambda.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import {
  MemoryEventSender,
  SqsRecordProver,
  type SqsSendClient,
  sendMessageInput,
} from '../../functions/lib/transport/index.js';

const OWN_QUEUE = 'https://sqs.eu-west-1.amazonaws.com/111122223333/kapp-fetch.fifo';
const FORWARDER = 'AROAPRODFORWARDER0001';
const ref: ObjectRef = {
  clusterId: 'prod-eu-1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'default',
  name: 'simple-app',
  uid: 'uid-simple-app',
  generation: 3,
  resourceVersion: '48213',
};
const event = objectEvent(ref, 'modified', { time: '2025-01-02T03:04:05.000Z' });

type Entry = { Id: string; ReceiptHandle: string; VisibilityTimeout: number };

/**
 * SQS at the client port: a handle in `inFlight` is one the queue issued for a message now in
 * flight; any other is refused as SQS refuses it (`ReceiptHandleIsInvalid`, the sender's fault).
 */
function fakeSqs(inFlight: readonly string[], answer?: (entries: Entry[]) => unknown) {
  const calls: { QueueUrl: string; Entries: Entry[] }[] = [];
  const client: SqsSendClient = {
    async send(command) {
      const input = (command as ChangeMessageVisibilityBatchCommand).input as { QueueUrl: string; Entries: Entry[] };
      calls.push(input);
      if (answer) return answer(input.Entries);
      return {
        Successful: input.Entries.filter((e) => inFlight.includes(e.ReceiptHandle)).map((e) => ({ Id: e.Id })),
        Failed: input.Entries.filter((e) => !inFlight.includes(e.ReceiptHandle)).map((e) => ({
          Id: e.Id,
          SenderFault: true,
          Code: 'ReceiptHandleIsInvalid',
          Message: `The input receipt handle "${e.ReceiptHandle}" is not a valid receipt handle.`,
        })),
      };
    },
  };
  return { client, calls };
}

function setup(sqs: ReturnType<typeof fakeSqs> | undefined) {
  const log = memoryLogger();
  const seen: KappEvent[] = [];
  const sender = new MemoryEventSender();
  const checkSender = senderCheckOf(
    { stage: 'fetch', senderCheck: { functionSenders: [] } },
    { forwarderOf: async () => ({ roleId: FORWARDER }) },
  );
  const deps: EntryDeps = {
    pipeline: { marker: 'pipeline-deps' } as unknown as DispatchDeps,
    sender,
    log,
    dispatch: async (e) => {
      seen.push(e);
      return undefined;
    },
    ...(checkSender ? { checkSender } : {}),
    ...(sqs ? { prover: new SqsRecordProver(sqs.client, OWN_QUEUE) } : {}),
  };
  return { handler: makeSqsHandler('fetch', () => deps), log, seen, sender };
}

/** `event` as a record: the forwarder's SenderId and group, and the receipt handle given. */
function record(messageId: string, receiptHandle: string | undefined): SqsRecord {
  const input = sendMessageInput(OWN_QUEUE, event);
  return {
    messageId,
    ...(receiptHandle === undefined ? {} : { receiptHandle }),
    body: input.MessageBody ?? '',
    attributes: { MessageGroupId: input.MessageGroupId, ApproximateReceiveCount: '1', SenderId: `${FORWARDER}:s` },
    eventSourceARN: 'arn:aws:sqs:eu-west-1:111122223333:kapp-fetch.fifo',
  };
}

const refusals = (log: ReturnType<typeof memoryLogger>) =>
  log.records
    .filter((r) => r.obj.outcome === 'refused')
    .map((r) => ({ messageId: r.obj.messageId, reason: r.obj.reason }));

describe('records proven messages of the function queue before the sender check trusts them', () => {
  it('refuses a record whose receipt handle the queue did not issue, with no other effect', async () => {
    const sqs = fakeSqs(['AQEB-real-handle']);
    const { handler, log, seen, sender } = setup(sqs);
    const res = await handler(
      { Records: [record('forged', 'AQEB-forged-by-invoker')] },
      { getRemainingTimeInMillis: () => 120_000 },
    );
    // Acknowledged (never valid by redelivery), not run, nothing sent.
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([]);
    expect(sender.sent).toEqual([]);
    expect(sqs.calls).toEqual([
      {
        QueueUrl: OWN_QUEUE,
        Entries: [{ Id: '0', ReceiptHandle: 'AQEB-forged-by-invoker', VisibilityTimeout: 180 }],
      },
    ]);
    expect(refusals(log)).toEqual([{ messageId: 'forged', reason: "the queue refused the record's receipt handle" }]);
    // One line, without the handle, the body or the invoker's SenderId.
    expect(log.records).toHaveLength(1);
    const logged = JSON.stringify(log.records);
    for (const secretish of ['AQEB-forged-by-invoker', FORWARDER, event.id, 'simple-app']) {
      expect(logged).not.toContain(secretish);
    }
  });

  it('takes a record whose receipt handle is in flight on the queue, and refuses its forged neighbours', async () => {
    const sqs = fakeSqs(['AQEB-real-handle']);
    const { handler, log, seen } = setup(sqs);
    const res = await handler(
      {
        Records: [
          record('real', 'AQEB-real-handle'),
          record('no-handle', undefined),
          record('forged', 'AQEB-forged-by-invoker'),
        ],
      },
      { getRemainingTimeInMillis: () => 60_500 },
    );
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([event]);
    // The record without a handle is not asked about; the visibility is the time left (rounded
    // up) plus the queue's 60 s margin.
    expect(sqs.calls).toEqual([
      {
        QueueUrl: OWN_QUEUE,
        Entries: [
          { Id: '0', ReceiptHandle: 'AQEB-real-handle', VisibilityTimeout: 121 },
          { Id: '1', ReceiptHandle: 'AQEB-forged-by-invoker', VisibilityTimeout: 121 },
        ],
      },
    ]);
    expect(refusals(log)).toEqual([
      { messageId: 'no-handle', reason: 'the record has no receipt handle' },
      { messageId: 'forged', reason: "the queue refused the record's receipt handle" },
    ]);
  });

  it('refuses every record that shares a receipt handle, even a real one (a forged body beside it)', async () => {
    const sqs = fakeSqs(['AQEB-real-handle']);
    const { handler, log, seen } = setup(sqs);
    const res = await handler({ Records: [record('real', 'AQEB-real-handle'), record('copy', 'AQEB-real-handle')] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([]);
    expect(sqs.calls).toEqual([]);
    expect(refusals(log).map((r) => r.reason)).toEqual([
      'the record shares its receipt handle with another record',
      'the record shares its receipt handle with another record',
    ]);
  });

  it('fails the whole batch (retried) when the queue cannot answer, running nothing', async () => {
    const down = fakeSqs([], () => {
      throw new Error('connect ECONNREFUSED');
    });
    const serverSide = fakeSqs([], (entries) => ({
      Successful: [],
      Failed: entries.map((e) => ({ Id: e.Id, SenderFault: false, Code: 'InternalError', Message: 'try again' })),
    }));
    for (const sqs of [down, serverSide]) {
      const { handler, log, seen } = setup(sqs);
      const res = await handler({ Records: [record('a', 'AQEB-a'), record('b', 'AQEB-b')] });
      expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'a' }, { itemIdentifier: 'b' }] });
      expect(seen).toEqual([]);
      expect(log.records.map((r) => r.obj.outcome)).toEqual(['failed']);
    }
  });

  it('asks in batches of 10 (SQS limit) and keeps each answer with its record', async () => {
    const handles = Array.from({ length: 12 }, (_, i) => `AQEB-${i}`);
    const sqs = fakeSqs(handles.filter((_, i) => i % 5 === 0));
    const proven = await new SqsRecordProver(sqs.client, OWN_QUEUE).prove(handles, 99_999);
    expect(proven).toEqual(handles.map((_, i) => i % 5 === 0));
    expect(sqs.calls.map((c) => c.Entries.map((e) => e.Id))).toEqual([
      ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'],
      ['10', '11'],
    ]);
    // Never past SQS's 12-hour limit.
    expect(sqs.calls[0]?.Entries[0]?.VisibilityTimeout).toBe(43_200);
  });

  it('without a prover (no sender check, the embedded runtime) records run as delivered', async () => {
    const { handler, seen } = setup(undefined);
    await handler({ Records: [record('any', undefined)] });
    expect(seen).toEqual([event]);
  });
});

describe('the Lambda composition root', () => {
  it('requires the own queue URL with the sender check, and then proves records on it', async () => {
    const root = await mkdtemp(join(tmpdir(), 'kapp-lambda-proof-'));
    const env = {
      AWS_REGION: 'eu-west-1',
      KAPP_LAMBDA_BUCKET: 'kapp-lambda-artifacts',
      KAPP_LAMBDA_CLUSTER_REGISTRY: pathToFileURL(root).href,
      KAPP_LAMBDA_TOOL_VERSIONS: '{"vendir":"0.44.0"}',
      KAPP_LAMBDA_QUEUE_URL_FETCH: OWN_QUEUE,
      KAPP_LAMBDA_QUEUE_URL_DEPLOY: 'https://sqs.eu-west-1.amazonaws.com/111122223333/kapp-deploy.fifo',
      KAPP_LAMBDA_SENDER_CHECK: 'registry',
    };
    // The template function is the one that does not send to its own queue.
    const template = 'https://sqs.eu-west-1.amazonaws.com/111122223333/kapp-template.fifo';
    try {
      expect(() => parseLambdaEnv('template', env)).toThrow(
        "KAPP_LAMBDA_QUEUE_URL_TEMPLATE: required with KAPP_LAMBDA_SENDER_CHECK=registry (each record is proven a message of the function's own queue before its SenderId is trusted)",
      );
      const config = parseLambdaEnv('template', { ...env, KAPP_LAMBDA_QUEUE_URL_TEMPLATE: template });
      const clients = createAwsClients(config);
      const deps = createLambdaDeps(config, clients, { log: memoryLogger() });
      expect(deps.checkSender).toBeTypeOf('function');
      expect(deps.prover).toBeInstanceOf(SqsRecordProver);
      clients.s3.destroy();
      clients.sqs.destroy();
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
