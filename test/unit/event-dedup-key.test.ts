/**
 * SQS deduplication ids keyed per cluster (`dedupId`, functions/lib/transport/sqs.ts): event ids
 * are derived from content a tenant can learn (uid, resourceVersion, reason), and the entry
 * queues deduplicate per message group, which any sender may name. A forwarder of cluster X that
 * sends first, in the group of an object of cluster C, a message carrying the id of that object's
 * next event would have SQS drop the real event as its copy for 5 minutes. Under C's event key
 * (the registry document's `eventKey` for the functions, `FORWARDER_EVENT_KEY` for C's forwarder)
 * the id is not computable by X, while every copy from C's own senders keeps one id. SQS is faked
 * at the client port with FIFO deduplication per message group.
 */
import { randomBytes } from 'node:crypto';
import type { SendMessageBatchCommand, SendMessageCommand } from '@aws-sdk/client-sqs';
import { describe, expect, it } from 'vitest';
import { parseForwarderProgramEnv } from '../../events/forwarder/config.js';
import {
  type KappEvent,
  type ObjectRef,
  objectEvent,
  objectEventId,
  objectRefOf,
  orderingKey,
  serializeEvent,
} from '../../events/schema.js';
import { parseLambdaEnv } from '../../functions/lib/entry/config.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { DirSecretStore } from '../../functions/lib/kube/bearer.js';
import { clusterDocKey, InvalidClusterDocumentError, parseClusterDoc } from '../../functions/lib/kube/cluster-doc.js';
import { StoreClusterRegistry } from '../../functions/lib/kube/fleet-registry.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { MemoryEventSender } from '../../functions/lib/transport/memory.js';
import { dedupId, messageGroupId, SqsEventSender, type SqsSendClient } from '../../functions/lib/transport/sqs.js';
import { eventKeySecret, newEventKey } from '../../scripts/cluster-join.js';
import { clusterDocOf, putCluster } from '../../scripts/cluster-registry.js';
import { DISPATCHED_ENV } from './support/dispatched-batch.js';

const QUEUE = 'https://sqs.eu-west-1.amazonaws.com/111122223333/kapp-fetch.fifo';
const CA_PEM = '-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIU\n-----END CERTIFICATE-----\n';

const victim: ObjectRef = {
  clusterId: 'prod-eu-1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'payments',
  name: 'ledger',
  uid: '6f1c2a9e-3b7d-4c1e-9a55-0d2f4b8e7c13',
  generation: 4,
  resourceVersion: '981234',
};
/** The victim's next change, as its forwarder announces it. */
const next = objectEvent({ ...victim, resourceVersion: '981240' }, 'modified', { time: '2026-12-06T10:00:00Z' });

/**
 * An SQS FIFO queue with `deduplicationScope: MESSAGE_GROUP` at the client port: a message whose
 * (group, deduplication id) was seen is accepted and dropped (within the 5-minute window, which
 * this test never leaves); `delivered` is what consumers get.
 */
function fifoQueue() {
  const seen = new Set<string>();
  const delivered: { group: string; body: string }[] = [];
  const accept = (m: { MessageGroupId?: string; MessageDeduplicationId?: string; MessageBody?: string }) => {
    const slot = `${m.MessageGroupId}\n${m.MessageDeduplicationId}`;
    if (seen.has(slot)) return;
    seen.add(slot);
    delivered.push({ group: m.MessageGroupId ?? '', body: m.MessageBody ?? '' });
  };
  const client: SqsSendClient = {
    async send(command) {
      const input = (command as SendMessageCommand | SendMessageBatchCommand).input;
      if ('Entries' in input) {
        for (const e of input.Entries ?? []) accept(e);
        return { Successful: (input.Entries ?? []).map((e) => ({ Id: e.Id })), Failed: [] };
      }
      accept(input);
      return {};
    },
  };
  return { client, delivered, bodiesOf: (e: KappEvent) => delivered.filter((d) => d.body === serializeEvent(e)) };
}

describe('deduplication ids under the cluster event key', () => {
  it("a forwarder of another cluster cannot spend the victim's next deduplication id", async () => {
    const queue = fifoQueue();
    const victimKey = randomBytes(32);
    const attackerKey = randomBytes(32);
    // Cluster X's forwarder knows the victim's uid and guesses its next resourceVersion: it sends
    // first, in the victim's group, every id it can compute for that event (its own key's, none).
    const group = orderingKey(victim);
    const guessed = objectEventId({ ...victim, resourceVersion: '981240' }, 'modified');
    expect(guessed).toBe(next.id);
    for (const id of [guessed, dedupId(attackerKey, guessed)]) {
      await queue.client.send({
        input: { QueueUrl: QUEUE, MessageBody: '{"spent":true}', MessageGroupId: group, MessageDeduplicationId: id },
      } as SendMessageCommand);
    }
    // The victim's forwarder, then a function, send the real event under the victim's key.
    const forwarder = new SqsEventSender({
      client: queue.client,
      queueUrls: { fetch: QUEUE },
      dedupKeyOf: (id) => (id === 'prod-eu-1' ? victimKey : undefined),
    });
    await forwarder.send('fetch', next);
    expect(queue.bodiesOf(next)).toHaveLength(1);
  });

  it('drops every copy from the cluster own senders: a restarted forwarder, a batch, a function reading the key from the registry', async () => {
    const queue = fifoQueue();
    const eventKey = newEventKey();
    // The forwarder's key from its Secret (as `FORWARDER_EVENT_KEY`), the functions' from the document.
    const settings = parseForwarderProgramEnv({
      FORWARDER_CLUSTER_ID: 'prod-eu-1',
      AWS_REGION: 'eu-west-1',
      KAPP_LAMBDA_QUEUE_URL_FETCH: QUEUE,
      KAPP_LAMBDA_QUEUE_URL_INSTALL: QUEUE,
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: QUEUE,
      ...(eventKeySecret(eventKey).stringData as Record<string, string>),
    } as Record<string, string>);
    expect(Buffer.from(settings.eventKey ?? []).toString('base64')).toBe(eventKey);
    const store = new MemoryStore();
    await putCluster(
      store,
      clusterDocOf({
        id: 'prod-eu-1',
        endpoint: 'https://127.0.0.1:6443',
        caPem: CA_PEM,
        auth: { kind: 'eks', clusterName: 'prod-eu-1', region: 'eu-west-1' },
        eventKey,
      }),
    );
    const registry = new StoreClusterRegistry({
      store,
      stage: 'fetch',
      secrets: new DirSecretStore('/nonexistent'),
      credentials: async () => ({ accessKeyId: 'a', secretAccessKey: 's' }),
    });
    const forwarderSender = () =>
      new SqsEventSender({ client: queue.client, queueUrls: { fetch: QUEUE }, dedupKeyOf: () => settings.eventKey });
    const functionSender = new SqsEventSender({
      client: queue.client,
      queueUrls: { fetch: QUEUE },
      dedupKeyOf: (id) => registry.eventKeyOf(id),
    });
    const other = objectEvent(victim, 'resync', { time: '2026-12-06T10:00:01Z' });
    await forwarderSender().send('fetch', next);
    await forwarderSender().send('fetch', next); // after a restart
    await forwarderSender().sendMany('fetch', [next, other]); // a whole batch resent
    await functionSender.send('fetch', next);
    expect(queue.delivered.map((d) => d.body)).toEqual([serializeEvent(next), serializeEvent(other)]);
    expect(await registry.eventKeyOf('edge-9')).toBeUndefined();
  });

  it('is 64 hex chars under a key (a valid MessageDeduplicationId), the event id without one', () => {
    const key = Buffer.alloc(32, 7);
    expect(dedupId(key, next.id)).toMatch(/^[0-9a-f]{64}$/);
    expect(dedupId(key, next.id)).toBe(dedupId(Buffer.alloc(32, 7), next.id));
    expect(dedupId(Buffer.alloc(32, 8), next.id)).not.toBe(dedupId(key, next.id));
    expect(dedupId(undefined, next.id)).toBe(next.id);
  });

  it('fails the send, sending nothing, when the key cannot be read', async () => {
    const queue = fifoQueue();
    const sender = new SqsEventSender({
      client: queue.client,
      queueUrls: { fetch: QUEUE },
      dedupKeyOf: async () => {
        throw new Error('registry unreadable');
      },
    });
    await expect(sender.sendMany('fetch', [next])).rejects.toThrow(
      'failed to read the event key of a cluster to send to the fetch queue',
    );
    expect(queue.delivered).toEqual([]);
  });
});

describe('where the key lives', () => {
  it('the registry document takes base64 of 32 bytes only, and never quotes it', () => {
    const doc = (eventKey: string) =>
      JSON.stringify({
        ...clusterDocOf({
          id: 'prod-eu-1',
          endpoint: 'https://127.0.0.1:6443',
          caPem: CA_PEM,
          auth: { kind: 'eks', clusterName: 'prod-eu-1', region: 'eu-west-1' },
        }),
        eventKey,
      });
    const short = randomBytes(16).toString('base64');
    for (const bad of [short, 'not base64!', `${newEventKey()}AAAA`]) {
      let err: unknown;
      try {
        parseClusterDoc(clusterDocKey('prod-eu-1'), doc(bad));
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(InvalidClusterDocumentError);
      expect((err as InvalidClusterDocumentError).problems).toEqual(['eventKey: expected base64 of 32 bytes']);
      expect((err as Error).message).not.toContain(bad);
    }
    const key = newEventKey();
    expect(Buffer.from(key, 'base64')).toHaveLength(32);
    expect(parseClusterDoc(clusterDocKey('prod-eu-1'), doc(key)).eventKey).toBe(key);
  });

  it("the forwarder refuses a malformed FORWARDER_EVENT_KEY without quoting it; join's Secret carries it", () => {
    const env = {
      FORWARDER_CLUSTER_ID: 'prod-eu-1',
      AWS_REGION: 'eu-west-1',
      KAPP_LAMBDA_QUEUE_URL_FETCH: QUEUE,
      KAPP_LAMBDA_QUEUE_URL_INSTALL: QUEUE,
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: QUEUE,
    };
    expect(() => parseForwarderProgramEnv({ ...env, FORWARDER_EVENT_KEY: 'c2VjcmV0LWJ1dC1zaG9ydA==' })).toThrow(
      'invalid forwarder settings: FORWARDER_EVENT_KEY: expected base64 of 32 bytes',
    );
    expect(parseForwarderProgramEnv(env).eventKey).toBeUndefined();
    expect(eventKeySecret('S0VZ')).toEqual({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'kapp-lambda-forwarder-event-key', namespace: 'kapp-lambda' },
      type: 'Opaque',
      stringData: { FORWARDER_EVENT_KEY: 'S0VZ' },
    });
  });
});

describe('message groups under the cluster event key', () => {
  /** The victim's forwarder's role id. */
  const FORWARDER = 'AROAPRODFORWARDER0001';
  const victimKey = randomBytes(32);

  it('is `<cluster>/` and 64 hex chars under a key (at most 128 chars), the ordering key without one', () => {
    const longest = { ...victim, clusterId: `c${'x'.repeat(61)}1`, name: 'n'.repeat(253) };
    expect(messageGroupId(victimKey, victim)).toMatch(/^prod-eu-1\/[0-9a-f]{64}$/);
    expect(messageGroupId(victimKey, longest).length).toBe(128);
    expect(messageGroupId(Buffer.from(victimKey), victim)).toBe(messageGroupId(victimKey, victim));
    expect(messageGroupId(randomBytes(32), victim)).not.toBe(messageGroupId(victimKey, victim));
    expect(messageGroupId(victimKey, { ...victim, name: 'other' })).not.toBe(messageGroupId(victimKey, victim));
    expect(messageGroupId(undefined, victim)).toBe(orderingKey(victim));
  });

  it("another cluster's sender cannot name the victim's group: every group it can compute is another", async () => {
    const queue = fifoQueue();
    const attackerKey = randomBytes(32);
    // What a sender without the victim's key can compute for the victim's object.
    const guesses = [orderingKey(victim), messageGroupId(attackerKey, victim), messageGroupId(undefined, victim)];
    const forwarder = new SqsEventSender({
      client: queue.client,
      queueUrls: { fetch: QUEUE },
      dedupKeyOf: (id) => (id === 'prod-eu-1' ? victimKey : undefined),
    });
    await forwarder.send('fetch', next);
    const [real] = queue.bodiesOf(next);
    expect(real?.group).toBe(messageGroupId(victimKey, victim));
    expect(guesses).not.toContain(real?.group);
  });

  /** The fetch function's handler with the sender check and the registry's keys (as `lambda.ts` composes it). */
  function handler(groupKeyOf: EntryDeps['groupKeyOf'], acceptUnkeyed = false) {
    const log = memoryLogger();
    const seen: string[] = [];
    const deps: EntryDeps = {
      pipeline: {} as DispatchDeps,
      sender: new MemoryEventSender(),
      log,
      dispatch: async (event) => {
        seen.push(event.id);
        return undefined;
      },
      checkSender: async (event, senderId) =>
        senderId === `${FORWARDER}:s` && objectRefOf(event).clusterId === 'prod-eu-1' ? undefined : 'not the forwarder',
      ...(groupKeyOf ? { groupKeyOf } : {}),
      ...(acceptUnkeyed ? { acceptUnkeyed } : {}),
    };
    return { handle: makeSqsHandler('fetch', () => deps), log, seen };
  }
  const record = (group: string): SqsRecord => ({
    messageId: 'm',
    body: serializeEvent(next),
    attributes: { MessageGroupId: group, ApproximateReceiveCount: '1', SenderId: `${FORWARDER}:s` },
  });

  it('the functions take the keyed group only, and say why a sender without the key is refused', async () => {
    const keyed = handler(async (id) => (id === 'prod-eu-1' ? victimKey : undefined));
    await keyed.handle({ Records: [record(messageGroupId(victimKey, victim))] });
    expect(keyed.seen).toEqual([next.id]);
    for (const group of [orderingKey(victim), messageGroupId(randomBytes(32), victim)]) {
      const h = handler(async () => victimKey);
      expect(await h.handle({ Records: [record(group)] })).toEqual({ batchItemFailures: [] });
      expect(h.seen).toEqual([]);
      expect(h.log.records.find((r) => r.obj.outcome === 'refused')?.obj.reason).toBe(
        group === orderingKey(victim)
          ? `message group ${group} is not keyed, but cluster prod-eu-1 has an event key: the sender does not hold it (a forwarder without FORWARDER_EVENT_KEY, or started before join or add wrote its Secret: restart it)`
          : `message group ${group} is not the event's object's keyed group`,
      );
    }
    // A keyed group for a cluster whose document has no key: the operator's mistake, named.
    const unkeyed = handler(async () => undefined);
    await unkeyed.handle({ Records: [record(messageGroupId(victimKey, victim))] });
    expect(unkeyed.log.records.find((r) => r.obj.outcome === 'refused')?.obj.reason).toMatch(
      /is keyed, but the registry document of its cluster has no event key/,
    );
  });

  it("KAPP_LAMBDA_UNKEYED_GROUPS=accept (an upgrade's window) also takes the unkeyed group, nothing else", async () => {
    const config = (v?: string) =>
      parseLambdaEnv('fetch', {
        ...DISPATCHED_ENV,
        KAPP_LAMBDA_DISPATCHED: 'false',
        ...(v === undefined ? {} : { KAPP_LAMBDA_UNKEYED_GROUPS: v }),
      }).acceptUnkeyedGroups;
    expect([config(), config('refuse'), config('accept')]).toEqual([undefined, undefined, true]);
    expect(() => config('yes')).toThrow('KAPP_LAMBDA_UNKEYED_GROUPS: expected refuse or accept');
    for (const group of [orderingKey(victim), messageGroupId(victimKey, victim)]) {
      const h = handler(async () => victimKey, true);
      await h.handle({ Records: [record(group)] });
      expect(h.seen, group).toEqual([next.id]);
    }
    const squat = handler(async () => victimKey, true);
    await squat.handle({ Records: [record(messageGroupId(randomBytes(32), victim))] });
    expect(squat.seen).toEqual([]);
  });

  it('fails the record (retried), taking nothing, when the key cannot be read', async () => {
    const h = handler(async () => {
      throw new Error('registry unreadable');
    });
    expect(await h.handle({ Records: [record(messageGroupId(victimKey, victim))] })).toEqual({
      batchItemFailures: [{ itemIdentifier: 'm' }],
    });
    expect(h.seen).toEqual([]);
  });
});
