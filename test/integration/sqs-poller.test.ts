/**
 * The harness's stand-in for Lambda's SQS event source mapping (`../harness/sqs-poller.ts`) at
 * `maxConcurrency` 2 over two emulator instances of one function (`startRieInstances`), against
 * moto's server (the integration setup's): the function is a bare Runtime API client that hands
 * each batch to this file and answers only when the test releases it, so what runs at once is
 * seen directly, not inferred from durations.
 *
 * - records of two message groups are in two invocations at the same time, on the two
 *   instances, with their message attributes in Lambda's record shape;
 * - two records of one group are never: while the first is held (longer than the queue's
 *   visibility timeout, which the poller extends), the second is not delivered; it comes after.
 */
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { createServer, type ServerResponse } from 'node:http';
import path from 'node:path';
import { SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, afterEach, beforeAll, expect, inject, it } from 'vitest';
import { POSTPONED_ATTRIBUTE } from '../../functions/lib/transport/port.js';
import { waitFor } from '../e2e/support.js';
import { invokeRie, type Rie, startRieInstances } from '../harness/lambda.js';
import { LOOPBACK, makeTempDir, removeTempDir } from '../harness/servers/process.js';
import { createFifoQueue, sqsClient } from '../harness/servers/sqs.js';
import { EventSourceMapping, type SqsEventRecord } from '../harness/sqs-poller.js';

const { sqs: moto } = inject('servers');
const id = randomBytes(3).toString('hex');
/** The queues' visibility timeout, seconds: shorter than the hold of the one-group case. */
const VISIBILITY_SECONDS = 4;

/**
 * The function: takes the next invocation from the Runtime API, posts its records to the
 * test's gate (`GATE_URL`), which answers when the test releases the batch, then answers the
 * invocation with an empty `batchItemFailures`.
 */
const FUNCTION_SOURCE = `
const api = process.env.AWS_LAMBDA_RUNTIME_API;
for (;;) {
  const next = await fetch('http://' + api + '/2018-06-01/runtime/invocation/next');
  const requestId = next.headers.get('lambda-runtime-aws-request-id');
  const event = await next.json();
  await (await fetch(process.env.GATE_URL, { method: 'POST', body: JSON.stringify(event.Records) })).text();
  await fetch('http://' + api + '/2018-06-01/runtime/invocation/' + requestId + '/response', {
    method: 'POST',
    body: JSON.stringify({ batchItemFailures: [] }),
  });
}
`;

/** A batch the function holds until {@link release}. */
interface Held {
  readonly records: SqsEventRecord[];
  readonly res: ServerResponse;
}

const held: Held[] = [];
const gate = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => held.push({ records: JSON.parse(Buffer.concat(chunks).toString('utf8')), res }));
});
const release = (h: Held | undefined) => h?.res.end('released');
const groupsHeld = () => held.filter((h) => !h.res.writableEnded).flatMap((h) => h.records.map(groupOf));
const groupOf = (r: SqsEventRecord) => r.attributes.MessageGroupId ?? '';

let tmp: string;
let client: SQSClient;
let instances: Rie[] = [];
const mappings: EventSourceMapping[] = [];

beforeAll(async () => {
  tmp = await makeTempDir('sqs-poller-it');
  const bundle = path.join(tmp, 'function.mjs');
  await writeFile(bundle, FUNCTION_SOURCE);
  await new Promise<void>((resolve) => gate.listen(0, LOOPBACK, resolve));
  const addr = gate.address();
  const gateUrl = `http://${LOOPBACK}:${typeof addr === 'object' && addr ? addr.port : 0}/`;
  instances = await startRieInstances({ bundle, env: { GATE_URL: gateUrl }, cwd: path.join(tmp, 'fn') }, 2);
  client = sqsClient(moto);
});

afterEach(() => {
  for (const h of held) release(h);
  held.length = 0;
});

afterAll(async () => {
  for (const m of mappings) await m.stop();
  for (const r of instances) await r.proc.stop();
  gate.close();
  client?.destroy();
  if (tmp) await removeTempDir(tmp);
});

/** A mapping of batch size 1 at `maxConcurrency` 2 over both instances, on a new queue. */
async function startMapping(name: string): Promise<{ mapping: EventSourceMapping; send: SendFn }> {
  const queue = await createFifoQueue(moto, `${id}-${name}`, { visibilityTimeoutSeconds: VISIBILITY_SECONDS });
  const mapping = new EventSourceMapping({
    name,
    client,
    queueUrl: queue.url,
    queueArn: queue.arn,
    region: moto.region,
    batchSize: 1,
    visibilityTimeoutSeconds: VISIBILITY_SECONDS,
    invoke: instances.map((r) => (event: unknown) => invokeRie(r, event)),
    maxConcurrency: 2,
  });
  mappings.push(mapping);
  mapping.start();
  const send: SendFn = async (body, group, attributes = {}) => {
    await client.send(
      new SendMessageCommand({
        QueueUrl: queue.url,
        MessageBody: body,
        MessageGroupId: group,
        MessageDeduplicationId: body,
        MessageAttributes: attributes,
      }),
    );
  };
  return { mapping, send };
}
type SendFn = (
  body: string,
  group: string,
  attributes?: Record<string, { DataType: string; StringValue: string }>,
) => Promise<void>;

const heldCount = (n: number) => async () => (held.filter((h) => !h.res.writableEnded).length >= n ? true : undefined);

it('runs records of two message groups in two invocations at once, one per instance', async () => {
  const { mapping, send } = await startMapping('two-groups');
  await send('a', 'group-a', { [POSTPONED_ATTRIBUTE]: { DataType: 'Number', StringValue: '2' } });
  await send('b', 'group-b');
  await waitFor('both groups in flight at once', heldCount(2), {
    timeoutMs: 10_000,
    intervalMs: 50,
    describe: () => `held: ${JSON.stringify(groupsHeld())}, poller error: ${String(mapping.error)}`,
  });
  expect(groupsHeld().sort()).toEqual(['group-a', 'group-b']);
  const a = held.flatMap((h) => h.records).find((r) => r.body === 'a');
  expect(a?.messageAttributes).toEqual({
    [POSTPONED_ATTRIBUTE]: { stringValue: '2', dataType: 'Number', stringListValues: [], binaryListValues: [] },
  });
  for (const h of held) release(h);
  await waitFor('both invocations settled', async () => (mapping.invocations.length === 2 ? true : undefined), {
    timeoutMs: 10_000,
    intervalMs: 50,
  });
  expect(mapping.invocations.map((i) => i.instance).sort()).toEqual([0, 1]);
  expect(mapping.invocations.map((i) => i.outcome)).toEqual(['ok', 'ok']);
  expect(mapping.error).toBeUndefined();
});

it('never runs two records of one message group at once, though an instance is free', async () => {
  const { mapping, send } = await startMapping('one-group');
  await send('c1', 'group-c');
  await send('c2', 'group-c');
  await waitFor('the first record in flight', heldCount(1), { timeoutMs: 10_000, intervalMs: 50 });
  // Held past the visibility timeout (the poller keeps the record invisible) while the poller
  // has a free slot and receives again and again: the group's second record must not come.
  await new Promise((r) => setTimeout(r, (VISIBILITY_SECONDS + 1) * 1000));
  expect(held.map((h) => h.records.map((r) => r.body))).toEqual([['c1']]);
  release(held[0]);
  await waitFor('the second record in flight', heldCount(1), { timeoutMs: 10_000, intervalMs: 50 });
  expect(held.map((h) => h.records.map((r) => r.body))).toEqual([['c1'], ['c2']]);
  release(held[1]);
  await waitFor('both invocations settled', async () => (mapping.invocations.length === 2 ? true : undefined), {
    timeoutMs: 10_000,
    intervalMs: 50,
  });
  const [first, second] = mapping.invocations;
  expect([first?.messageIds.length, second?.messageIds.length]).toEqual([1, 1]);
  expect((first?.endedAt ?? 0) <= (second?.startedAt ?? 0)).toBe(true);
  expect(mapping.invocations.flatMap((i) => i.receiveCounts)).toEqual([1, 1]);
  expect(mapping.error).toBeUndefined();
});
