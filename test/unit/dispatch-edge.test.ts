/**
 * The dispatcher's edge work and answers (`makeDispatcher`, `functions/lib/entry/dispatch.ts`,
 * docs/decisions.md D15): the record proof and the sender check refuse before any run session or
 * invoke, a run role's session must be the event's cluster, the fair share parks a record that is
 * then never invoked and is freed (waking the parked) after the invoke, even a failed one, the
 * stage's `requeue` goes back as postponed copies, a finished cluster's groups are deleted early,
 * and the source poll runs once per member cluster. Fakes at the ports: the queue (prover,
 * requeuer, deleter), STS and the stage function; the shares are the real `StageShares` over the
 * memory store.
 */
import { describe, expect, it, vi } from 'vitest';
import { type KappEvent, objectRefOf, SOURCE_POLL_EVENT_TYPE } from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import {
  type DispatchedBatch,
  type DispatcherDeps,
  makeDispatcher,
  SOURCE_POLL_RECORDS_PREFIX,
  sourcePollClusters,
} from '../../functions/lib/entry/dispatch.js';
import { parseBatchResponse } from '../../functions/lib/entry/dispatch-aws.js';
import {
  MAX_POSTPONEMENTS,
  type SenderCheck,
  type SqsBatchResponse,
  type SqsRecord,
} from '../../functions/lib/entry/edge.js';
import { runSessionName, type SenderPolicy, senderRefusal } from '../../functions/lib/entry/sender.js';
import { StageShares } from '../../functions/lib/lease/shares.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { SOURCE_POLL_PREFIX } from '../../functions/lib/pipeline/source-poll.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  type MessageDeleter,
  type MessageRequeuer,
  POSTPONED_ATTRIBUTE,
  type RecordProver,
  type RequeuedMessage,
} from '../../functions/lib/transport/port.js';
import { messageGroupId } from '../../functions/lib/transport/sqs.js';
import { clusterTemplateRecord } from './support/cluster-records.js';

const RUN_ROLE = 'AROARUNROLEFETCH0001';
const DISPATCHER_ROLE = 'AROADISPATCHERTPL001';
const FORWARDER_ALPHA = 'AROAFORWARDERALPHA01';

/** The record of App `name` of cluster `clusterId` (message id `<clusterId>-<name>`), sent by `senderId`. */
const rec = (clusterId: string, name: string, senderId?: string, postponed?: number): SqsRecord => {
  const r = clusterTemplateRecord(clusterId, name, 1, `${clusterId}-${name}`);
  return {
    ...r,
    attributes: { ...r.attributes, ...(senderId ? { SenderId: senderId } : {}) },
    ...(postponed === undefined
      ? {}
      : { messageAttributes: { [POSTPONED_ATTRIBUTE]: { stringValue: String(postponed), dataType: 'Number' } } }),
  };
};
const ok = (...ids: string[]): SqsBatchResponse => ({
  batchItemFailures: ids.map((itemIdentifier) => ({ itemIdentifier })),
});

/** The sender policy of the template dispatcher: fetch's run role, its own role, cluster alpha's forwarder. */
const POLICY: SenderPolicy = {
  functionSenders: new Map([[RUN_ROLE, ['fetch']]]),
  receiver: 'template',
  receiverRoleId: DISPATCHER_ROLE,
  runSessions: true,
  forwarderOf: async (id) => (id === 'alpha' ? { roleId: FORWARDER_ALPHA } : undefined),
};

interface Fakes {
  answer?: (tenant: string, payload: DispatchedBatch) => Promise<SqsBatchResponse>;
  prove?: RecordProver['prove'];
  shares?: boolean;
  requeue?: MessageRequeuer['requeue'];
  stage?: PipelineStage;
  pollClusters?: () => Promise<readonly string[]>;
  check?: boolean;
  checkSender?: SenderCheck;
  groupKeyOf?: DispatcherDeps['groupKeyOf'];
}

function setup(f: Fakes = {}) {
  const invokes: { tenant: string; payload: DispatchedBatch }[] = [];
  const sessions: string[] = [];
  const requeued: RequeuedMessage[][] = [];
  const deleted: string[][] = [];
  const log = memoryLogger();
  const requeuer: MessageRequeuer = {
    async requeue(messages) {
      if (f.requeue) await f.requeue(messages);
      requeued.push([...messages]);
    },
  };
  const deleter: MessageDeleter = {
    async delete(handles) {
      deleted.push([...handles]);
    },
  };
  const shares = f.shares
    ? new StageShares({ store: new MemoryStore(), requeuer, clusterShare: 1, namespaceShare: 1 })
    : undefined;
  const deps: DispatcherDeps = {
    log,
    keyring: new DerivedKeyring(Buffer.alloc(32, 3)),
    credentials: {
      async forRun(_stage, clusterId) {
        sessions.push(clusterId);
        return {
          accessKeyId: 'AKIA',
          secretAccessKey: 's',
          sessionToken: 't',
          expiration: new Date(2_000_000_000_000),
        };
      },
    },
    invoker: {
      async invoke(_stage, tenant, payload) {
        invokes.push({ tenant, payload });
        return f.answer ? await f.answer(tenant, payload) : ok();
      },
    },
    requeuer,
    deleter,
    ...(f.prove ? { prover: { prove: f.prove } } : {}),
    ...(f.check ? { checkSender: (e: KappEvent, s: string | undefined) => senderRefusal(POLICY, e, s) } : {}),
    ...(f.checkSender ? { checkSender: f.checkSender } : {}),
    ...(f.groupKeyOf ? { groupKeyOf: f.groupKeyOf } : {}),
    ...(shares ? { shares } : {}),
    ...(f.pollClusters ? { pollClusters: f.pollClusters } : {}),
  };
  const outcomes = () =>
    Object.fromEntries(
      log.records
        .filter((r) => r.obj.outcome !== undefined && r.obj.messageId)
        .map((r) => [r.obj.messageId, r.obj.outcome]),
    );
  const invoked = () => invokes.map((i) => `${i.tenant}:${i.payload.records.map((r) => r.messageId).join(',')}`);
  return {
    dispatch: makeDispatcher(f.stage ?? 'template', deps),
    invokes,
    invoked,
    sessions,
    requeued,
    deleted,
    shares,
    outcomes,
    log,
  };
}

describe('makeDispatcher: the edge before any invoke', () => {
  it('drops a record the queue does not prove, and asks for no session nor invoke for it', async () => {
    const t = setup({ prove: async (handles) => handles.map((h) => h !== 'h-alpha-forged') });
    const forged = { ...rec('alpha', 'forged'), receiptHandle: 'h-alpha-forged' };
    const answer = await t.dispatch({ Records: [forged, rec('beta', 'a')] });
    expect(answer).toEqual(ok());
    expect(t.invoked()).toEqual(['beta:beta-a']);
    expect(t.sessions).toEqual(['beta']);
    expect(t.outcomes()['alpha-forged']).toBe('refused');
  });

  it('fails every record, invoking nothing, when the queue cannot prove them', async () => {
    const t = setup({
      prove: async () => {
        throw new Error('sqs down');
      },
    });
    expect(await t.dispatch({ Records: [rec('alpha', 'a'), rec('beta', 'b')] })).toEqual(ok('alpha-a', 'beta-b'));
    expect(t.invokes).toEqual([]);
    expect(t.sessions).toEqual([]);
  });

  it('drops an event from a sender that may not send it before any session, and keeps the others', async () => {
    const t = setup({ check: true });
    const answer = await t.dispatch({
      Records: [rec('alpha', 'stranger', 'AROASOMEONEELSE00001:x'), rec('alpha', 'mine', `${RUN_ROLE}:alpha`)],
    });
    // A template event is fetch's hand-off, never a forwarder's: only the run role may send it.
    expect(answer).toEqual(ok());
    expect(t.invoked()).toEqual(['alpha:alpha-mine']);
    expect(t.outcomes()['alpha-stranger']).toBe('refused');
  });

  it("takes a record in its cluster's keyed message group only, before any session or invoke", async () => {
    const key = Buffer.alloc(32, 5);
    const t = setup({ check: true, groupKeyOf: async (id) => (id === 'alpha' ? key : undefined) });
    const keyed = (r: SqsRecord): SqsRecord => {
      const event = JSON.parse(r.body) as KappEvent;
      return { ...r, attributes: { ...r.attributes, MessageGroupId: messageGroupId(key, objectRefOf(event)) } };
    };
    await t.dispatch({
      Records: [rec('alpha', 'squatted', `${RUN_ROLE}:alpha`), keyed(rec('alpha', 'mine', `${RUN_ROLE}:alpha`))],
    });
    expect(t.invoked()).toEqual(['alpha:alpha-mine']);
    expect(t.sessions).toEqual(['alpha']);
    expect(t.outcomes()['alpha-squatted']).toBe('refused');
  });

  it("refuses a run role's event naming another cluster than its session's", async () => {
    const t = setup({ check: true });
    await t.dispatch({
      Records: [
        rec('alpha', 'a', `${RUN_ROLE}:beta`),
        rec('beta', 'b', `${RUN_ROLE}:beta`),
        rec('gamma', 'c', RUN_ROLE),
      ],
    });
    expect(t.invoked()).toEqual(['beta:beta-b']);
    expect(t.outcomes()).toMatchObject({ 'alpha-a': 'refused', 'gamma-c': 'refused' });
    const reasons = t.log.records.filter((r) => r.obj.outcome === 'refused').map((r) => String(r.obj.reason));
    expect(reasons[0]).toMatch(/session "beta" is not cluster alpha's/);
  });

  it("names a one-character cluster's session `<id>.` (STS takes 2 to 64 characters) and holds its events to it", async () => {
    expect([runSessionName('a'), runSessionName('ab'), runSessionName('x'.repeat(63))]).toEqual([
      'a.',
      'ab',
      'x'.repeat(63),
    ]);
    const event = JSON.parse(rec('a', 'one').body) as KappEvent;
    expect(await senderRefusal(POLICY, event, `${RUN_ROLE}:a.`)).toBeUndefined();
    expect(await senderRefusal(POLICY, event, `${RUN_ROLE}:a`)).toMatch(/session "a" is not cluster a's/);
  });

  it('holds a run role to what its stage emits: no own-queue copies, which only the dispatcher sends', async () => {
    // template's run role sending the template queue a template hand-off (fetch's event)
    const templateRuns: SenderPolicy = { ...POLICY, functionSenders: new Map([[RUN_ROLE, ['template']]]) };
    const event = JSON.parse(rec('alpha', 'a').body) as KappEvent;
    expect(await senderRefusal(templateRuns, event, `${RUN_ROLE}:alpha`)).toMatch(/never sends/);
    // the stage functions' own roles (no run sessions) keep the own-queue rule
    expect(await senderRefusal({ ...templateRuns, runSessions: false }, event, `${RUN_ROLE}:alpha`)).toBeUndefined();
  });

  it("takes the dispatcher's own role for copies of its queue's events, whatever their cluster", async () => {
    const t = setup({ check: true });
    await t.dispatch({ Records: [rec('alpha', 'a', `${DISPATCHER_ROLE}:dispatch-template`)] });
    expect(t.invoked()).toEqual(['alpha:alpha-a']);
    expect(
      await senderRefusal(POLICY, JSON.parse(rec('alpha', 'a').body) as KappEvent, `${DISPATCHER_ROLE}:x`),
    ).toBeUndefined();
    // Not a run role: the run-session rule is not the receiver's, and without `runSessions` a
    // function role sends for any cluster (the stage functions' own roles).
    const plain: SenderPolicy = { ...POLICY, runSessions: false, receiverRoleId: undefined };
    expect(
      await senderRefusal(plain, JSON.parse(rec('alpha', 'a').body) as KappEvent, `${RUN_ROLE}:fn`),
    ).toBeUndefined();
    expect(await senderRefusal(plain, JSON.parse(rec('alpha', 'a').body) as KappEvent, `${DISPATCHER_ROLE}:x`)).toMatch(
      /not the forwarder|not registered|never sends/,
    );
  });

  it("fails the later records of a group whose record's sender could not be checked, invoking none of them", async () => {
    const t = setup({
      checkSender: async (e) => {
        if (e.id === JSON.parse(rec('alpha', 'first').body).id) throw new Error('registry down');
        return undefined;
      },
    });
    // Two events of one App, so one message group: the second may not overtake the first.
    const second = { ...rec('alpha', 'first'), messageId: 'alpha-second', receiptHandle: 'h-alpha-second' };
    const body = JSON.parse(second.body);
    second.body = JSON.stringify({ ...body, id: `${body.id}-2` });
    expect(await t.dispatch({ Records: [rec('alpha', 'first'), second, rec('beta', 'b')] })).toEqual(
      ok('alpha-first', 'alpha-second'),
    );
    expect(t.invoked()).toEqual(['beta:beta-b']);
    expect(t.outcomes()['alpha-second']).toBe('skipped');
  });
});

describe('makeDispatcher: fair shares', () => {
  it('parks a record over its share, never invokes it, and wakes it once the invoke ended', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const t = setup({
      shares: true,
      answer: async () => {
        await held;
        return ok();
      },
    });
    const run = t.dispatch({ Records: [rec('alpha', 'a'), rec('alpha', 'b'), rec('beta', 'c')] });
    // alpha's one slot is a's: b is parked (acknowledged), and nothing is requeued while a runs.
    await vi.waitFor(() => expect(t.invoked().sort()).toEqual(['alpha:alpha-a', 'beta:beta-c']), { timeout: 10_000 });
    expect(t.outcomes()['alpha-b']).toBe('postponed');
    expect(t.requeued).toEqual([]);
    release();
    expect(await run).toEqual(ok());
    expect(t.invoked().sort()).toEqual(['alpha:alpha-a', 'beta:beta-c']);
    expect(t.outcomes()['alpha-b']).toBe('postponed');
    // a's end freed alpha's slot and woke b: a copy, postponed once.
    expect(t.requeued.flat().map((m) => [m.messageId, m.postponements])).toEqual([['alpha-b', 1]]);
  });

  it('frees the slots of an invoke that throws, so the next record of its cluster runs', async () => {
    let fail = true;
    const t = setup({
      shares: true,
      answer: async () => {
        if (fail) throw new Error('throttled');
        return ok();
      },
    });
    expect(await t.dispatch({ Records: [rec('alpha', 'a')] })).toEqual(ok('alpha-a'));
    fail = false;
    expect(await t.dispatch({ Records: [rec('alpha', 'b')] })).toEqual(ok());
    expect(t.invoked()).toEqual(['alpha:alpha-a', 'alpha:alpha-b']);
    expect(t.outcomes()['alpha-b']).toBeUndefined();
  });

  it('frees the slots when the run session cannot be had', async () => {
    const t = setup({ shares: true });
    const store = new MemoryStore();
    const requeued: RequeuedMessage[] = [];
    const shares = new StageShares({
      store,
      requeuer: { requeue: async (m) => void requeued.push(...m) },
      clusterShare: 1,
      namespaceShare: 1,
    });
    const d = makeDispatcher('template', {
      log: t.log,
      keyring: new DerivedKeyring(Buffer.alloc(32, 3)),
      credentials: {
        forRun: async () => {
          throw new Error('sts down');
        },
      },
      invoker: { invoke: async () => ok() },
      shares,
    });
    expect(await d({ Records: [rec('alpha', 'a'), rec('alpha', 'b')] })).toEqual(ok('alpha-a'));
    // b was parked behind a, and woken when a's slot was freed.
    expect(requeued.map((m) => m.messageId)).toEqual(['alpha-b']);
  });
});

describe("makeDispatcher: the stage's answer", () => {
  it("sends the stage's requeue back as postponed copies, in the stage's order, and acknowledges them", async () => {
    const t = setup({ answer: async () => ({ batchItemFailures: [], requeue: ['alpha-b', 'alpha-a'] }) });
    expect(await t.dispatch({ Records: [rec('alpha', 'a'), rec('alpha', 'b', undefined, 1)] })).toEqual(ok());
    expect(
      t.requeued
        .flat()
        .map((m) => [
          m.messageId,
          m.postponements,
          m.messageGroupId === rec('alpha', m.messageId.slice(6)).attributes?.MessageGroupId,
        ]),
    ).toEqual(
      expect.arrayContaining([
        ['alpha-b', 2, true],
        ['alpha-a', 1, true],
      ]),
    );
    expect(t.outcomes()).toMatchObject({ 'alpha-a': 'postponed', 'alpha-b': 'postponed' });
  });

  it('fails the records whose copies were not accepted, or that were postponed too often', async () => {
    const t = setup({
      answer: async () => ({ batchItemFailures: [], requeue: ['alpha-a', 'alpha-b'] }),
      requeue: async (messages) => {
        if (messages.some((m) => m.messageId === 'alpha-a')) throw new Error('sqs down');
      },
    });
    const tooOften = rec('alpha', 'b', undefined, MAX_POSTPONEMENTS);
    expect(await t.dispatch({ Records: [rec('alpha', 'a'), tooOften] })).toEqual(ok('alpha-a', 'alpha-b'));
    expect(t.requeued).toEqual([]);
  });

  it('ignores a requeue or failure naming a record the stage was not given, and never requeues a failed one', async () => {
    const t = setup({
      answer: async (tenant) =>
        tenant === 'alpha'
          ? {
              batchItemFailures: [{ itemIdentifier: 'alpha-a' }, { itemIdentifier: 'beta-b' }],
              requeue: ['alpha-a', 'beta-b'],
            }
          : ok(),
    });
    expect(await t.dispatch({ Records: [rec('alpha', 'a'), rec('beta', 'b')] })).toEqual(ok('alpha-a'));
    expect(t.requeued).toEqual([]);
  });

  it('fails the requeue without a requeuer', async () => {
    const t = setup();
    const d = makeDispatcher('template', {
      log: t.log,
      keyring: new DerivedKeyring(Buffer.alloc(32, 3)),
      credentials: {
        forRun: async () => ({
          accessKeyId: 'a',
          secretAccessKey: 's',
          sessionToken: 't',
          expiration: new Date(2_000_000_000_000),
        }),
      },
      invoker: { invoke: async () => ({ batchItemFailures: [], requeue: ['alpha-a'] }) },
    });
    expect(await d({ Records: [rec('alpha', 'a')] })).toEqual(ok('alpha-a'));
  });

  it("keeps a stage's requeue of records it was given only, and refuses one that is no list of ids", () => {
    const bytes = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
    const given = new Set(['m1', 'm2']);
    expect(parseBatchResponse(bytes({ batchItemFailures: [], requeue: ['m2', 'x', 'm1', 'm2'] }), given)).toEqual({
      batchItemFailures: [],
      requeue: ['m2', 'm1'],
    });
    expect(parseBatchResponse(bytes({ batchItemFailures: [], requeue: ['x'] }), given)).toEqual({
      batchItemFailures: [],
    });
    expect(parseBatchResponse(bytes({ batchItemFailures: [], requeue: [1] }), given)).toBeUndefined();
    expect(parseBatchResponse(bytes({ batchItemFailures: [{ itemIdentifier: 'm1' }] }), given)).toEqual(ok('m1'));
  });

  it('keeps an install run`s rollout report of its shape and bounds; leaves out any other, the answer still read', () => {
    const bytes = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
    const given = new Set(['m1']);
    const rollouts = {
      touched: ['default/pkg'],
      start: [{ policy: 'default', refName: 'pkg', version: '2.0.0', from: '1.0.0' }],
    };
    expect(parseBatchResponse(bytes({ batchItemFailures: [], rollouts }), given)).toEqual({
      batchItemFailures: [],
      rollouts,
    });
    for (const bad of [
      'x',
      { touched: 'default/pkg', start: [] },
      { touched: [], start: [{ policy: 'default', refName: 'pkg' }] },
      { touched: Array.from({ length: 101 }, (_, i) => `p/${i}`), start: [] },
      { touched: [], start: [{ policy: 'p', refName: 'r', version: 'v'.repeat(257) }] },
    ]) {
      expect(parseBatchResponse(bytes({ batchItemFailures: [], rollouts: bad }), given)).toEqual({
        batchItemFailures: [],
      });
    }
  });

  it("deletes a finished cluster's groups early while another cluster still runs, never a failed one's", async () => {
    let release!: () => void;
    const beta = new Promise<void>((r) => (release = r));
    const t = setup({
      answer: async (tenant) => {
        if (tenant === 'beta') await beta;
        return tenant === 'gamma' ? ok('gamma-c') : ok();
      },
    });
    const run = t.dispatch({ Records: [rec('alpha', 'a'), rec('beta', 'b'), rec('gamma', 'c')] });
    await vi.waitFor(() => expect(t.deleted).toEqual([['h-alpha-a']]), { timeout: 10_000 });
    release();
    expect(await run).toEqual(ok('gamma-c'));
    // beta ended last: the event source mapping deletes its record.
    expect(t.deleted).toEqual([['h-alpha-a']]);
  });
});

describe('makeDispatcher: the source poll', () => {
  const poll = { type: SOURCE_POLL_EVENT_TYPE } as const;

  it('runs the poll in the stage once per member cluster, under its session, with no records', async () => {
    const t = setup({ stage: 'index-repo', pollClusters: async () => ['alpha', 'beta'] });
    expect(await t.dispatch(poll)).toEqual(ok());
    expect(
      t.invokes.map((i) => [i.tenant, i.payload.records.length, i.payload.poll, i.payload.clusterId]).sort(),
    ).toEqual([
      ['alpha', 0, true, 'alpha'],
      ['beta', 0, true, 'beta'],
    ]);
    expect(t.sessions.sort()).toEqual(['alpha', 'beta']);
  });

  it("logs a cluster whose poll failed and still polls the others; fails when the clusters can't be listed", async () => {
    const t = setup({
      stage: 'index-repo',
      pollClusters: async () => ['alpha', 'beta'],
      answer: async (tenant) => {
        if (tenant === 'alpha') throw new Error('timed out');
        return ok();
      },
    });
    expect(await t.dispatch(poll)).toEqual(ok());
    expect(t.invokes.map((i) => i.tenant).sort()).toEqual(['alpha', 'beta']);
    expect(t.log.records.find((r) => r.msg === 'source poll run in each member cluster')?.obj.failed).toBe(1);
    const broken = setup({
      stage: 'index-repo',
      pollClusters: async () => {
        throw new Error('s3 down');
      },
    });
    await expect(broken.dispatch(poll)).rejects.toThrow('s3 down');
  });

  it('drops a poll sent to a dispatcher of another stage', async () => {
    const t = setup({ pollClusters: async () => ['alpha'] });
    expect(await t.dispatch(poll)).toEqual(ok());
    expect(t.invokes).toEqual([]);
  });

  it("finds the member clusters in the fleet's source poll records", async () => {
    expect(SOURCE_POLL_RECORDS_PREFIX).toBe(SOURCE_POLL_PREFIX);
    const store = new MemoryStore();
    const member = (cluster: string) => ({ cluster, namespace: 'ns', name: 'r', uid: 'u', at: 'sha256:0' });
    await store.put(`${SOURCE_POLL_PREFIX}a.json`, JSON.stringify({ members: [member('beta'), member('alpha')] }));
    await store.put(`${SOURCE_POLL_PREFIX}b.json`, JSON.stringify({ members: [member('alpha'), member('Not_An_Id')] }));
    await store.put(`${SOURCE_POLL_PREFIX}c.json`, 'not json');
    await store.put('cache/other/d.json', JSON.stringify({ members: [member('gamma')] }));
    expect(await sourcePollClusters(store)).toEqual(['alpha', 'beta']);
  });
});
