/**
 * Two cloud-mode holes closed, against the SQS-compatible server (moto) rather than a fake:
 *
 * - the sender check trusts a record's `SenderId` only once the record's receipt handle is proven
 *   an in-flight message of the function's own queue (`SqsRecordProver`): a handle the invoker
 *   made up, one of another queue, or one of a message already deleted is refused, a real one taken;
 * - deduplication ids keyed with the cluster's event key (`dedupId`): another cluster's forwarder
 *   that sends the victim's next event id first, in the victim's group, no longer has the real
 *   event dropped, while the cluster's own copies still are.
 */
import { randomBytes } from 'node:crypto';
import { DeleteMessageCommand, ReceiveMessageCommand, SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type KappEvent, objectEvent, orderingKey, serializeEvent } from '../../events/schema.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { senderCheckOf } from '../../functions/lib/entry/lambda.js';
import { senderPrincipal } from '../../functions/lib/entry/sender.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryEventSender, SqsEventSender, SqsRecordProver } from '../../functions/lib/transport/index.js';
import { createFifoQueue, sqsClient } from '../harness/servers.js';

const { sqs } = inject('servers');
const suffix = randomBytes(4).toString('hex');
let client: SQSClient;

const ref = (name: string, resourceVersion: string) => ({
  clusterId: 'proof-it',
  kind: 'App' as const,
  apiVersion: 'kappctrl.k14s.io/v1alpha1' as const,
  namespace: 'default',
  name,
  uid: `uid-${name}`,
  generation: 1,
  resourceVersion,
});

/** Receives up to 10 messages (their system attributes too) as Lambda's mapping hands them on. */
async function receive(url: string, arn: string): Promise<SqsRecord[]> {
  const r = await client.send(
    new ReceiveMessageCommand({
      QueueUrl: url,
      MaxNumberOfMessages: 10,
      WaitTimeSeconds: 1,
      MessageSystemAttributeNames: ['All'],
    }),
  );
  return (r.Messages ?? []).map((m) => ({
    messageId: m.MessageId ?? '',
    receiptHandle: m.ReceiptHandle ?? '',
    body: m.Body ?? '',
    attributes: { ...m.Attributes },
    eventSourceARN: arn,
  }));
}

beforeAll(() => {
  client = sqsClient(sqs);
});
afterAll(() => client?.destroy());

describe('records proven by receipt handle on the real queue', () => {
  it('takes a record the queue delivered; refuses a made-up, a foreign and a spent handle', async () => {
    const own = await createFifoQueue(sqs, `proof-own-${suffix}`);
    const other = await createFifoQueue(sqs, `proof-other-${suffix}`);
    const event = objectEvent(ref('real', '7'), 'modified', { time: new Date() });
    const sender = new SqsEventSender({ client, queueUrls: { fetch: own.url, install: other.url } });
    await sender.send('fetch', event);
    await sender.send(
      'install',
      objectEvent(
        { ...ref('pi', '8'), kind: 'PackageInstall', apiVersion: 'packaging.carvel.dev/v1alpha1' },
        'modified',
        { time: new Date() },
      ),
    );
    const [real] = await receive(own.url, own.arn);
    const [foreign] = await receive(other.url, other.arn);
    expect(real?.attributes?.SenderId).toBeTruthy();
    // A message received and deleted: its handle was real once.
    await sender.send('fetch', objectEvent(ref('spent', '9'), 'modified', { time: new Date() }));
    const [spent] = await receive(own.url, own.arn);
    await client.send(new DeleteMessageCommand({ QueueUrl: own.url, ReceiptHandle: spent?.receiptHandle }));

    const log = memoryLogger();
    const seen: KappEvent[] = [];
    // The forwarder of proof-it is whoever moto says sent the real message.
    const checkSender = senderCheckOf(
      { stage: 'fetch', senderCheck: { functionSenders: [] } },
      { forwarderOf: async () => ({ roleId: senderPrincipal(real?.attributes?.SenderId ?? '') }) },
    );
    const deps: EntryDeps = {
      pipeline: { marker: 'pipeline-deps' } as unknown as DispatchDeps,
      sender: new MemoryEventSender(),
      log,
      dispatch: async (e) => {
        seen.push(e);
        return undefined;
      },
      ...(checkSender ? { checkSender } : {}),
      prover: new SqsRecordProver(client, own.url),
    };
    const forgedBody = serializeEvent(objectEvent(ref('victim', '10'), 'modified', { time: new Date() }));
    const records: SqsRecord[] = [
      real as SqsRecord,
      { ...(real as SqsRecord), messageId: 'made-up', receiptHandle: 'AQEBmadeUpByTheInvoker==', body: forgedBody },
      { ...(foreign as SqsRecord), messageId: 'foreign', body: forgedBody, eventSourceARN: own.arn },
      { ...(spent as SqsRecord), messageId: 'spent' },
    ];
    const res = await makeSqsHandler('fetch', () => deps)(
      { Records: records },
      { getRemainingTimeInMillis: () => 30_000 },
    );
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([event]);
    expect(log.records.filter((r) => r.obj.outcome === 'refused').map((r) => [r.obj.messageId, r.obj.reason])).toEqual([
      ['made-up', "the queue refused the record's receipt handle"],
      ['foreign', "the queue refused the record's receipt handle"],
      ['spent', "the queue refused the record's receipt handle"],
    ]);
    // The proof kept the real message hidden (its visibility set from now), so nothing is redelivered.
    expect(await receive(own.url, own.arn)).toEqual([]);
  }, 15_000);
});

describe('deduplication ids under the cluster event key on the real queue', () => {
  it("another cluster's forwarder no longer spends the victim's next event; the cluster's own copies are still dropped", async () => {
    const queue = await createFifoQueue(sqs, `dedup-key-${suffix}`);
    const next = objectEvent(ref('ledger', '981240'), 'modified', { time: new Date() });
    // The attacker: the victim's group and its predictable event id, sent first.
    await client.send(
      new SendMessageCommand({
        QueueUrl: queue.url,
        MessageBody: '{"spent":true}',
        MessageGroupId: orderingKey(ref('ledger', '981240')),
        MessageDeduplicationId: next.id,
      }),
    );
    const key = randomBytes(32);
    const victim = () => new SqsEventSender({ client, queueUrls: { fetch: queue.url }, dedupKeyOf: () => key });
    await victim().send('fetch', next);
    await victim().send('fetch', next); // a restarted forwarder's copy
    const bodies: string[] = [];
    for (;;) {
      const got = await receive(queue.url, queue.arn);
      if (got.length === 0) break;
      for (const m of got) {
        bodies.push(m.body);
        await client.send(new DeleteMessageCommand({ QueueUrl: queue.url, ReceiptHandle: m.receiptHandle }));
      }
    }
    expect(bodies).toEqual(['{"spent":true}', serializeEvent(next)]);
  }, 15_000);
});
