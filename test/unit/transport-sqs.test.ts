/**
 * Transport port rules and the SQS FIFO adapter, with a recording fake SQS client at the
 * port boundary: exact SendMessage inputs.
 */
import {
  type DeleteMessageBatchCommand,
  SendMessageBatchCommand,
  type SendMessageBatchResult,
  SendMessageCommand,
} from '@aws-sdk/client-sqs';
import { describe, expect, it } from 'vitest';
import {
  deleteEvent,
  deployEvent,
  EventValidationError,
  type KappEvent,
  type ObjectRef,
  objectEvent,
  objectRefOf,
  repoIndexedEvent,
  targetFunction,
  templateEvent,
} from '../../events/schema.js';
import { isPipelineStage } from '../../functions/lib/api/functions.js';
import {
  MemoryEventSender,
  POSTPONED_ATTRIBUTE,
  postponedDedupId,
  SqsEventSender,
  SqsMessageDeleter,
  SqsMessageRequeuer,
  type SqsSendClient,
  sendAll,
  sendMessageBatches,
  sendMessageInput,
  TransportError,
} from '../../functions/lib/transport/index.js';

const app: ObjectRef = {
  clusterId: 'prod-eu-1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'default',
  name: 'simple-app',
  uid: '6f1c2a7e-3b7d-4c7e-9a55-0d1f7b1d2c11',
  generation: 3,
  resourceVersion: '48213',
};
const run = { generation: 3, runId: 'r-1', startedAt: '2025-01-02T03:04:05.000Z' };
const time = '2025-01-02T03:04:07.500Z';
const FETCH_KEY = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
const MANIFEST_KEY = `artifacts/template/sha256/${'b'.repeat(64)}.yaml`;

const tmpl = templateEvent({ object: app, run, artifacts: { fetchKey: FETCH_KEY } }, { time });
const dep = deployEvent({ object: app, run, artifacts: { fetchKey: FETCH_KEY, manifestKey: MANIFEST_KEY } }, { time });
const del = deleteEvent({ object: app, run }, { time });
const obj = objectEvent(app, 'modified', { time });

const TEMPLATE_Q = 'https://sqs.eu-west-1.amazonaws.com/123456789012/kapp-lambda-template.fifo';
const DEPLOY_Q = 'https://sqs.eu-west-1.amazonaws.com/123456789012/kapp-lambda-deploy.fifo';

type SqsCommand = SendMessageCommand | SendMessageBatchCommand;

/**
 * A recording SQS client. `batchResult` answers a `SendMessageBatch` (default: every entry
 * successful).
 */
function fakeSqs(
  fail?: Error,
  batchResult?: (command: SendMessageBatchCommand) => SendMessageBatchResult,
): SqsSendClient & { commands: SendMessageCommand[]; batches: SendMessageBatchCommand[]; all: SqsCommand[] } {
  const commands: SendMessageCommand[] = [];
  const batches: SendMessageBatchCommand[] = [];
  const all: SqsCommand[] = [];
  return {
    commands,
    batches,
    all,
    async send(sent) {
      const command = sent as SqsCommand;
      all.push(command);
      if (command instanceof SendMessageBatchCommand) batches.push(command);
      else commands.push(command);
      if (fail) throw fail;
      if (command instanceof SendMessageBatchCommand) {
        return (
          batchResult?.(command) ?? {
            Successful: (command.input.Entries ?? []).map((e) => ({ Id: e.Id, MessageId: `m-${e.Id}` })),
            Failed: [],
          }
        );
      }
      return { MessageId: 'm-1' };
    },
  };
}

describe('routing to a pipeline stage (targetFunction, isPipelineStage)', () => {
  it.each([
    ['object event for an App', obj, 'fetch'],
    ['fetch → template hand-off', tmpl, 'template'],
    ['template → deploy hand-off', dep, 'deploy'],
    ['delete hand-off', del, 'deploy'],
  ] as const)('%s → %s', (_name, event, want) => {
    expect(targetFunction(event)).toBe(want);
    expect(isPipelineStage(targetFunction(event))).toBe(true);
  });

  it('routes a PackageRepository object event to the index-repo function, which has a queue', () => {
    const repo: ObjectRef = { ...app, kind: 'PackageRepository', apiVersion: 'packaging.carvel.dev/v1alpha1' };
    const event = objectEvent(repo, 'added', { time });
    expect(targetFunction(event)).toBe('index-repo');
    expect(isPipelineStage(targetFunction(event))).toBe(true);
  });

  it('routes PackageInstall object events and repo.indexed to the install function, which has a queue', () => {
    const repo: ObjectRef = { ...app, kind: 'PackageRepository', apiVersion: 'packaging.carvel.dev/v1alpha1' };
    const indexed = repoIndexedEvent(
      { object: repo, run, artifacts: { indexKey: `artifacts/index/sha256/${'c'.repeat(64)}.json` } },
      { time },
    );
    const pkgi: ObjectRef = { ...app, kind: 'PackageInstall', apiVersion: 'packaging.carvel.dev/v1alpha1' };
    for (const event of [indexed, objectEvent(pkgi, 'added', { time })]) {
      expect(targetFunction(event)).toBe('install');
      expect(isPipelineStage(targetFunction(event))).toBe(true);
    }
  });

  it('objectRefOf finds the object of every event shape', () => {
    for (const e of [obj, tmpl, dep, del] as KappEvent[]) {
      expect(objectRefOf(e)).toMatchObject({
        clusterId: 'prod-eu-1',
        kind: 'App',
        namespace: 'default',
        name: 'simple-app',
      });
    }
  });
});

describe('SqsEventSender', () => {
  it('sends one SendMessage per event with group = ordering key, dedup id = event id, body = the CloudEvent', async () => {
    const sqs = fakeSqs();
    const sender = new SqsEventSender({ client: sqs, queueUrls: { template: TEMPLATE_Q, deploy: DEPLOY_Q } });
    await sender.send('template', tmpl);
    await sender.send('deploy', dep);
    await sender.send('deploy', del);
    expect(sqs.commands.map((c) => c instanceof SendMessageCommand)).toEqual([true, true, true]);
    expect(sqs.commands.map((c) => c.input)).toEqual([
      {
        QueueUrl: TEMPLATE_Q,
        MessageBody: JSON.stringify(tmpl),
        MessageGroupId: 'prod-eu-1/App/default/simple-app',
        MessageDeduplicationId: tmpl.id,
      },
      {
        QueueUrl: DEPLOY_Q,
        MessageBody: JSON.stringify(dep),
        MessageGroupId: 'prod-eu-1/App/default/simple-app',
        MessageDeduplicationId: dep.id,
      },
      {
        QueueUrl: DEPLOY_Q,
        MessageBody: JSON.stringify(del),
        MessageGroupId: 'prod-eu-1/App/default/simple-app',
        MessageDeduplicationId: del.id,
      },
    ]);
    expect(tmpl.id).toMatch(/^[0-9a-f]{32}$/);
    expect(JSON.parse(sqs.commands[0]?.input.MessageBody ?? '')).toEqual(tmpl);
  });

  it('hashes an ordering key longer than 128 characters (a valid MessageGroupId)', () => {
    const long: ObjectRef = { ...app, name: `${'n'.repeat(60)}.${'m'.repeat(60)}` };
    const e = templateEvent({ object: long, run, artifacts: { fetchKey: FETCH_KEY } }, { time });
    const input = sendMessageInput(TEMPLATE_Q, e);
    expect(input.MessageGroupId).toMatch(/^sha256-[0-9a-f]{64}$/);
    expect(input.MessageGroupId).toHaveLength(71);
    expect(input.MessageDeduplicationId).toBe(e.id);
  });

  it('rejects a stage it has no queue for, without calling SQS', async () => {
    const sqs = fakeSqs();
    const sender = new SqsEventSender({ client: sqs, queueUrls: { deploy: DEPLOY_Q } });
    const err = await sender.send('template', tmpl).catch((e: Error) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect((err as Error).message).toBe('no queue configured for the template function');
    expect(sqs.commands).toEqual([]);
  });

  it('wraps an SDK error with the action and the SDK error as cause', async () => {
    const sdkErr = Object.assign(new Error('Access to the resource is denied.'), { name: 'AccessDenied' });
    const sender = new SqsEventSender({ client: fakeSqs(sdkErr), queueUrls: { template: TEMPLATE_Q } });
    const err = await sender.send('template', tmpl).catch((e: Error) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect((err as Error).message).toBe('failed to send event to the template queue');
    expect((err as Error).cause).toBe(sdkErr);
  });

  it('refuses an event over 256 KiB before calling SQS', async () => {
    const sqs = fakeSqs();
    const sender = new SqsEventSender({ client: sqs, queueUrls: { template: TEMPLATE_Q } });
    const huge = { ...tmpl, pad: 'x'.repeat(256 * 1024) } as unknown as KappEvent;
    await expect(sender.send('template', huge)).rejects.toBeInstanceOf(EventValidationError);
    expect(sqs.commands).toEqual([]);
  });

  it('copies its queue map (later mutation of the options does not reroute)', async () => {
    const sqs = fakeSqs();
    const urls: { template?: string } = { template: TEMPLATE_Q };
    const sender = new SqsEventSender({ client: sqs, queueUrls: urls });
    urls.template = 'https://example.invalid/other.fifo';
    await sender.send('template', tmpl);
    expect(sqs.commands[0]?.input.QueueUrl).toBe(TEMPLATE_Q);
  });
});

describe('SqsEventSender.sendMany (SendMessageBatch)', () => {
  /** `n` object events of distinct Apps. */
  const many = (n: number, pad = 0): KappEvent[] =>
    Array.from({ length: n }, (_, i) => {
      const e = objectEvent(
        { ...app, name: `app-${i}`, uid: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}` },
        'resync',
        { time },
      );
      // A padded body (the size rule is what is tested, not the event's validity).
      return (pad ? { ...e, pad: 'x'.repeat(pad) } : e) as KappEvent;
    });
  const FETCH_Q = 'https://sqs.eu-west-1.amazonaws.com/123456789012/kapp-lambda-fetch.fifo';

  it('sends 23 events as 3 requests of 10, 10 and 3 entries, in order, each with its group and dedup id', async () => {
    const sqs = fakeSqs();
    const events = many(23);
    await new SqsEventSender({ client: sqs, queueUrls: { fetch: FETCH_Q } }).sendMany('fetch', events);
    expect(sqs.commands).toEqual([]);
    expect(sqs.batches.map((b) => b.input.Entries?.length)).toEqual([10, 10, 3]);
    const entries = sqs.batches.flatMap((b) => b.input.Entries ?? []);
    expect(sqs.batches.every((b) => b.input.QueueUrl === FETCH_Q)).toBe(true);
    expect(entries.map((e) => e.MessageBody)).toEqual(events.map((e) => JSON.stringify(e)));
    expect(entries.map((e) => e.MessageGroupId)).toEqual(events.map((_, i) => `prod-eu-1/App/default/app-${i}`));
    expect(entries.map((e) => e.MessageDeduplicationId)).toEqual(events.map((e) => e.id));
    // Ids unique within a request (SQS refuses a batch with a repeated id).
    for (const b of sqs.batches) {
      const ids = (b.input.Entries ?? []).map((e) => e.Id);
      expect(new Set(ids).size).toBe(ids.length);
    }
  });

  it('starts a new request before the bodies pass 256 KiB', () => {
    // Each body is a little over 100 KiB: two fit in 256 KiB, three do not.
    const events = many(5, 100 * 1024);
    const batches = sendMessageBatches(FETCH_Q, events);
    expect(batches.map((b) => b.length)).toEqual([2, 2, 1]);
    for (const b of batches) {
      expect(b.reduce((n, e) => n + Buffer.byteLength(e.MessageBody ?? ''), 0)).toBeLessThanOrEqual(256 * 1024);
    }
  });

  it('rejects when SQS refuses an entry, naming how many and the code; later requests are not sent', async () => {
    const sqs = fakeSqs(undefined, (c) => ({
      Successful: [],
      Failed: [{ Id: c.input.Entries?.[0]?.Id, Code: 'InternalError', SenderFault: false, Message: 'try again' }],
    }));
    const err = await new SqsEventSender({ client: sqs, queueUrls: { fetch: FETCH_Q } })
      .sendMany('fetch', many(12))
      .catch((e: Error) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect((err as Error).message).toBe('failed to send 1 of 10 events to the fetch queue: InternalError: try again');
    expect(sqs.batches).toHaveLength(1);
  });

  it('wraps an SDK error of a batch with the action and the SDK error as cause', async () => {
    const sdkErr = Object.assign(new Error('Access to the resource is denied.'), { name: 'AccessDenied' });
    const err = await new SqsEventSender({ client: fakeSqs(sdkErr), queueUrls: { fetch: FETCH_Q } })
      .sendMany('fetch', many(2))
      .catch((e: Error) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect((err as Error).message).toBe('failed to send events to the fetch queue');
    expect((err as Error).cause).toBe(sdkErr);
  });

  it('refuses an event over 256 KiB before any request, and a stage without a queue', async () => {
    const sqs = fakeSqs();
    const sender = new SqsEventSender({ client: sqs, queueUrls: { fetch: FETCH_Q } });
    await expect(sender.sendMany('fetch', [...many(1), ...many(1, 256 * 1024)])).rejects.toBeInstanceOf(
      EventValidationError,
    );
    await expect(sender.sendMany('template', many(2))).rejects.toThrow('no queue configured for the template function');
    expect(sqs.all).toEqual([]);
  });
});

describe('SqsMessageDeleter', () => {
  const OWN_Q = 'https://sqs.eu-west-1.amazonaws.com/123456789012/kapp-lambda-fetch.fifo';
  /** A client that records each DeleteMessageBatch and answers with `failed` entries (default none). */
  const fakeDeletes = (failed: (ids: string[]) => { Id: string; Code: string; Message: string }[] = () => []) => {
    const requests: { QueueUrl?: string; Entries?: { Id?: string; ReceiptHandle?: string }[] }[] = [];
    const client: SqsSendClient = {
      async send(command) {
        const input = (command as DeleteMessageBatchCommand).input;
        requests.push(input);
        return { Successful: [], Failed: failed((input.Entries ?? []).map((e) => e.Id ?? '')) };
      },
    };
    return { client, requests };
  };

  it('deletes the handles from its own queue in requests of at most 10', async () => {
    const { client, requests } = fakeDeletes();
    const handles = Array.from({ length: 12 }, (_, i) => `h${i}`);
    await new SqsMessageDeleter(client, OWN_Q).delete(handles);
    expect(requests.map((r) => r.QueueUrl)).toEqual([OWN_Q, OWN_Q]);
    expect(requests.map((r) => r.Entries?.map((e) => e.ReceiptHandle))).toEqual([
      handles.slice(0, 10),
      handles.slice(10),
    ]);
    expect(requests[1]?.Entries?.map((e) => e.Id)).toEqual(['10', '11']);
  });

  it('rejects with a TransportError when SQS refuses an entry or the request', async () => {
    const { client } = fakeDeletes((ids) => [{ Id: ids[0] ?? '', Code: 'ReceiptHandleIsInvalid', Message: 'gone' }]);
    await expect(new SqsMessageDeleter(client, OWN_Q).delete(['h1', 'h2'])).rejects.toThrow(
      "failed to delete 1 of 2 messages of the function's queue: ReceiptHandleIsInvalid: gone",
    );
    const sdkErr = new Error('denied');
    const err = await new SqsMessageDeleter(
      {
        send: async () => {
          throw sdkErr;
        },
      },
      OWN_Q,
    )
      .delete(['h1'])
      .catch((e: Error) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect((err as Error).cause).toBe(sdkErr);
  });
});

describe('SqsMessageRequeuer', () => {
  const OWN_Q = 'https://sqs.eu-west-1.amazonaws.com/123456789012/kapp-lambda-template.fifo';
  const copy = (i: number, postponements = 1) => ({
    messageId: `m${i}`,
    body: `{"n":${i}}`,
    messageGroupId: 'g-a',
    postponements,
  });

  it('sends each copy to its own queue as received, in order, with its postponements and a derived deduplication id', async () => {
    const inputs: SendMessageBatchCommand['input'][] = [];
    const client: SqsSendClient = {
      async send(command) {
        inputs.push((command as SendMessageBatchCommand).input);
        return { Successful: [], Failed: [] };
      },
    };
    const messages = Array.from({ length: 11 }, (_, i) => copy(i, i === 0 ? 2 : 1));
    await new SqsMessageRequeuer(client, OWN_Q).requeue(messages);
    expect(inputs.map((r) => [r.QueueUrl, r.Entries?.length])).toEqual([
      [OWN_Q, 10],
      [OWN_Q, 1],
    ]);
    expect(inputs[0]?.Entries?.[0]).toEqual({
      Id: '0',
      MessageBody: '{"n":0}',
      MessageGroupId: 'g-a',
      MessageDeduplicationId: postponedDedupId('m0', 2),
      MessageAttributes: { [POSTPONED_ATTRIBUTE]: { DataType: 'Number', StringValue: '2' } },
    });
    expect(inputs.flatMap((r) => r.Entries?.map((e) => e.MessageBody))).toEqual(messages.map((m) => m.body));
    // The same record postponed the same time again is the same copy; a further postponement is not.
    expect(postponedDedupId('m0', 1)).toBe(postponedDedupId('m0', 1));
    expect(postponedDedupId('m0', 1)).not.toBe(postponedDedupId('m0', 2));
    expect(postponedDedupId('m0', 1)).toMatch(/^[0-9a-f]{64}$/);
  });

  it('rejects with a TransportError when SQS refuses an entry', async () => {
    const client: SqsSendClient = {
      send: async () => ({
        Successful: [],
        Failed: [{ Id: '0', Code: 'AccessDenied', Message: 'no', SenderFault: true }],
      }),
    };
    await expect(new SqsMessageRequeuer(client, OWN_Q).requeue([copy(0)])).rejects.toThrow(
      "failed to send 1 of 1 postponed messages to the function's queue: AccessDenied: no",
    );
  });
});

describe('sendAll', () => {
  it('falls back to one send per event for a sender without sendMany, in order, stopping at the first refusal', async () => {
    const sender = new MemoryEventSender((_, e) => (e === del ? new Error('queue down') : undefined));
    await expect(
      sendAll(sender, [
        { stage: 'template', event: tmpl },
        { stage: 'deploy', event: dep },
        { stage: 'deploy', event: del },
        { stage: 'template', event: tmpl },
      ]),
    ).rejects.toThrow('queue down');
    expect(sender.sent).toEqual([
      { stage: 'template', event: tmpl },
      { stage: 'deploy', event: dep },
    ]);
  });
});

describe('MemoryEventSender', () => {
  it('records accepted events in order and rejects what fail() returns', async () => {
    const sender = new MemoryEventSender((stage) => (stage === 'deploy' ? new Error('queue down') : undefined));
    await sender.send('template', tmpl);
    await expect(sender.send('deploy', dep)).rejects.toThrow('queue down');
    expect(sender.sent).toEqual([{ stage: 'template', event: tmpl }]);
  });
});
