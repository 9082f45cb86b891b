/**
 * The stage handler with fair shares (`EntryDeps.shares`, `functions/lib/lease/shares.ts`): a
 * record of a cluster already running its share is parked and acknowledged (`postponed`, not in
 * `batchItemFailures`), a record of another cluster runs, a record that ran frees its slot and
 * wakes a parked one through the requeuer. The shares live in the memory store; the requeuer and
 * the stage are fakes at their ports.
 */
import { describe, expect, it } from 'vitest';
import { objectRefOf } from '../../events/schema.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { MAX_POSTPONEMENTS } from '../../functions/lib/entry/stage-handler.js';
import { StageShares } from '../../functions/lib/lease/shares.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { type MessageRequeuer, POSTPONED_ATTRIBUTE, type RequeuedMessage } from '../../functions/lib/transport/port.js';
import { REF } from './support/app-world.js';
import { clusterTemplateRecord } from './support/cluster-records.js';

/** The record of App `name` of cluster `clusterId`, generation `n` (message id `<name><n>`), postponed `postponed` times. */
const rec = (clusterId: string, name: string, n = 1, postponed?: number): SqsRecord => ({
  ...clusterTemplateRecord(clusterId, name, n),
  ...(postponed === undefined
    ? {}
    : { messageAttributes: { [POSTPONED_ATTRIBUTE]: { stringValue: String(postponed), dataType: 'Number' } } }),
});

function setup() {
  const log = memoryLogger();
  const ran: string[] = [];
  const requeued: RequeuedMessage[] = [];
  const requeuer: MessageRequeuer = {
    async requeue(messages) {
      requeued.push(...messages);
    },
  };
  const shares = new StageShares({ store: new MemoryStore(), requeuer, clusterShare: 1, namespaceShare: 1 });
  const deps: EntryDeps = {
    pipeline: {} as DispatchDeps,
    sender: new MemoryEventSender(),
    log,
    shares,
    recordConcurrency: 3,
    dispatch: async (event) => {
      ran.push(`${objectRefOf(event).clusterId}/${objectRefOf(event).name}`);
      return undefined;
    },
  };
  const outcomes = () =>
    Object.fromEntries(
      log.records.filter((r) => r.obj.outcome !== undefined).map((r) => [r.obj.messageId, r.obj.outcome]),
    );
  return { handler: makeSqsHandler('template', () => deps), shares, ran, requeued, outcomes };
}

/** Another invocation's record holding cluster c1's one slot. */
const elsewhere = (shares: StageShares) =>
  shares.acquire(
    'template',
    { clusterId: 'c1', namespace: REF.namespace },
    {
      id: 'other',
      until: Date.now() + 60_000,
      eventId: 'other',
      message: { messageId: 'other', body: '{}', messageGroupId: 'other', postponements: 1 },
    },
  );

describe('the stage handler with fair shares', () => {
  it("postpones a record of a cluster at its share (acknowledged, not failed) and runs another cluster's", async () => {
    const { handler, shares, ran, requeued, outcomes } = setup();
    expect(await elsewhere(shares)).toBe('held');
    const res = await handler({ Records: [rec('c1', 'a'), rec('c2', 'x')] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(ran).toEqual(['c2/x']);
    expect(outcomes()).toEqual({ a1: 'postponed', x1: 'done' });
    // The record that ran freed its slot.
    expect((await shares.read('template', 'c2')).holders).toEqual([]);
    // When the other invocation's record ends, the parked one is sent back, its postponement counted.
    await shares.release('template', { clusterId: 'c1', namespace: REF.namespace }, 'other');
    expect(requeued).toEqual([
      {
        messageId: 'a1',
        body: rec('c1', 'a').body,
        messageGroupId: rec('c1', 'a').attributes?.MessageGroupId,
        postponements: 1,
      },
    ]);
  });

  it('keeps an object order: its later record parks behind its parked one; a copy counts its postponements', async () => {
    const { handler, shares, ran, requeued, outcomes } = setup();
    await elsewhere(shares);
    const res = await handler({ Records: [rec('c1', 'a', 1, 2), rec('c1', 'a', 2)] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(ran).toEqual([]);
    expect(outcomes()).toEqual({ a1: 'postponed', a2: 'postponed' });
    await shares.release('template', { clusterId: 'c1', namespace: REF.namespace }, 'other');
    expect(requeued.map((m) => [m.messageId, m.postponements])).toEqual([['a1', 3]]);
    // The copy runs in its reserved slot, then wakes the object's next record.
    const copy = { ...rec('c1', 'a', 1, 3), messageId: 'copy-a1' };
    expect(await handler({ Records: [copy] })).toEqual({ batchItemFailures: [] });
    expect(ran).toEqual(['c1/a']);
    expect(requeued.map((m) => [m.messageId, m.postponements])).toEqual([
      ['a1', 3],
      ['a2', 1],
    ]);
  });

  it('does not park a record postponed MAX_POSTPONEMENTS times already: it fails, spending a receive, so its retry bound still ends it', async () => {
    const { handler, shares, ran, requeued, outcomes } = setup();
    await elsewhere(shares);
    // A copy (receive count 1 again) that was postponed MAX_POSTPONEMENTS times: parking it once more would
    // send yet another copy with a fresh receive count, so a record that fails each time it runs and
    // finds its cluster busy at each retry would never reach its last receive.
    const res = await handler({ Records: [rec('c1', 'a', 1, MAX_POSTPONEMENTS)] });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'a1' }] });
    expect(ran).toEqual([]);
    expect(outcomes()).toEqual({ a1: 'failed' });
    expect((await shares.read('template', 'c1')).parked).toEqual([]);
    await shares.release('template', { clusterId: 'c1', namespace: REF.namespace }, 'other');
    expect(requeued).toEqual([]);
  });

  it('runs every record without shares', async () => {
    const { handler, ran } = setup();
    const h = makeSqsHandler('template', () => ({
      pipeline: {} as DispatchDeps,
      sender: new MemoryEventSender(),
      log: memoryLogger(),
      dispatch: async (event) => {
        ran.push(objectRefOf(event).name);
        return undefined;
      },
    }));
    expect(handler).toBeDefined();
    expect(await h({ Records: [rec('c1', 'a'), rec('c1', 'b')] })).toEqual({ batchItemFailures: [] });
    expect(ran).toEqual(['a', 'b']);
  });
});
