/**
 * A batch of several records in one invocation (issue 24 item 5): records of different message
 * groups run side by side up to `recordConcurrency`, one group's in batch order, a failure skips
 * only its group's later records, a group whose records all succeeded is deleted at once while
 * others still run, and records not started by the deadline or the start window go back. The
 * stage route and the deleter are faked at their ports; overlap is shown with promises, not time.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  type KappEvent,
  type ObjectRef,
  objectRefOf,
  orderingKey,
  serializeEvent,
  templateEvent,
} from '../../events/schema.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { MAX_POSTPONEMENTS } from '../../functions/lib/entry/stage-handler.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import {
  MemoryEventSender,
  MemoryMessageRequeuer,
  type MessageDeleter,
  POSTPONED_ATTRIBUTE,
  TransportError,
} from '../../functions/lib/transport/index.js';
import { REF } from './support/app-world.js';

const time = '2025-01-02T03:04:05.000Z';
const FETCH_KEY = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
const app = (name: string): ObjectRef => ({ ...REF, name, uid: `uid-${name}` });

/** The `n`th template event of App `name` (one message group per App). */
const ev = (name: string, n = 1): KappEvent =>
  templateEvent(
    {
      object: { ...app(name), generation: n },
      run: { generation: n, runId: `r-${n}`, startedAt: time },
      artifacts: { fetchKey: FETCH_KEY },
    },
    { time },
  );
/** Its record: message id `<name><n>`, receipt handle `h-<name><n>`. */
const rec = (name: string, n = 1): SqsRecord => {
  const e = ev(name, n);
  return {
    messageId: `${name}${n}`,
    receiptHandle: `h-${name}${n}`,
    body: serializeEvent(e),
    attributes: { MessageGroupId: orderingKey(objectRefOf(e)), ApproximateReceiveCount: '1' },
  };
};
/** The record a dispatched event came from. */
const idOf = (e: KappEvent) => `${objectRefOf(e).name}${objectRefOf(e).generation}`;

interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
}
function deferred(): Deferred {
  let resolve = () => {};
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** A recording deleter; `onDelete` runs with each call's handles. */
function fakeDeleter(onDelete?: (handles: readonly string[]) => Promise<void> | void) {
  const calls: string[][] = [];
  const deleter: MessageDeleter = {
    async delete(handles) {
      calls.push([...handles]);
      await onDelete?.(handles);
    },
  };
  return { deleter, calls };
}

/**
 * A template handler whose stage is `dispatch`; `trace` records `start <id>` and `end <id>` of
 * each record's stage.
 */
function setup(
  dispatch: (id: string, deps: DispatchDeps) => Promise<void>,
  opts: Partial<Pick<EntryDeps, 'recordConcurrency' | 'deleter' | 'requeuer' | 'checkSender'>> = {},
) {
  const log = memoryLogger();
  const trace: string[] = [];
  const deps: EntryDeps = {
    pipeline: {} as DispatchDeps,
    sender: new MemoryEventSender(),
    log,
    ...opts,
    dispatch: async (event, d) => {
      const id = idOf(event);
      trace.push(`start ${id}`);
      try {
        await dispatch(id, d);
      } finally {
        trace.push(`end ${id}`);
      }
      return undefined;
    },
  };
  const outcomes = () =>
    Object.fromEntries(
      log.records.filter((r) => r.obj.outcome !== undefined).map((r) => [r.obj.messageId, r.obj.outcome]),
    );
  return { handler: makeSqsHandler('template', () => deps), trace, log, outcomes };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('a batch of several message groups', () => {
  it('runs records of two groups at once: each starts before the other ends', async () => {
    const started = { a1: deferred(), b1: deferred() };
    const { handler, trace } = setup(
      async (id) => {
        started[id as 'a1' | 'b1'].resolve();
        // Each waits for the other to start: one after another, neither would ever end.
        await started[id === 'a1' ? 'b1' : 'a1'].promise;
      },
      { recordConcurrency: 2 },
    );
    const res = await handler({ Records: [rec('a'), rec('b')] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(trace.slice(0, 2).sort()).toEqual(['start a1', 'start b1']);
  });

  it("runs one group's records one after another, in batch order, beside another group", async () => {
    const { handler, trace } = setup(
      async () => {
        // Yield, so that records that may overlap do.
        for (let i = 0; i < 3; i++) await new Promise<void>((r) => setImmediate(r));
      },
      { recordConcurrency: 4 },
    );
    const res = await handler({ Records: [rec('a', 1), rec('b', 1), rec('a', 2), rec('a', 3), rec('b', 2)] });
    expect(res).toEqual({ batchItemFailures: [] });
    const ofGroup = (g: string) =>
      trace.filter((t) => t.endsWith(`${g}1`) || t.endsWith(`${g}2`) || t.endsWith(`${g}3`));
    expect(ofGroup('a')).toEqual(['start a1', 'end a1', 'start a2', 'end a2', 'start a3', 'end a3']);
    expect(ofGroup('b')).toEqual(['start b1', 'end b1', 'start b2', 'end b2']);
    // The groups did overlap.
    expect(trace.indexOf('start b1')).toBeLessThan(trace.indexOf('end a1'));
  });

  it("a failed record fails its group's later records without running them, not another group's", async () => {
    const { handler, trace, outcomes } = setup(
      async (id) => {
        if (id === 'a1') throw new Error('boom');
      },
      { recordConcurrency: 2 },
    );
    const res = await handler({ Records: [rec('a', 1), rec('b', 1), rec('a', 2), rec('b', 2)] });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'a1' }, { itemIdentifier: 'a2' }] });
    expect(trace.filter((t) => t.startsWith('start')).sort()).toEqual(['start a1', 'start b1', 'start b2']);
    expect(outcomes()).toEqual({ a1: 'failed', a2: 'skipped', b1: 'done', b2: 'done' });
  });

  it.each([1, 2, 3])('runs at most %i records at once', async (limit) => {
    let running = 0;
    let most = 0;
    const { handler } = setup(
      async () => {
        running++;
        most = Math.max(most, running);
        for (let i = 0; i < 3; i++) await new Promise<void>((r) => setImmediate(r));
        running--;
      },
      { recordConcurrency: limit },
    );
    const res = await handler({ Records: ['a', 'b', 'c', 'd', 'e', 'f'].map((n) => rec(n)) });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(most).toBe(limit);
  });
});

describe('the early delete of handled records', () => {
  it('deletes a group whose records succeeded while a slow record of another group still runs', async () => {
    const bDeleted = deferred();
    const { deleter, calls } = fakeDeleter((handles) => {
      if (handles.includes('h-b2')) bDeleted.resolve();
    });
    const { handler, trace } = setup(
      async (id) => {
        // The slow record ends only once the fast group was deleted.
        if (id === 'a1') await bDeleted.promise;
      },
      { recordConcurrency: 2, deleter },
    );
    const res = await handler({ Records: [rec('a'), rec('b', 1), rec('b', 2)] });
    expect(res).toEqual({ batchItemFailures: [] });
    // One request for the group's two records; the last group to end is left to the mapping.
    expect(calls).toEqual([['h-b1', 'h-b2']]);
    expect(trace.at(-1)).toBe('end a1');
  });

  it('deletes no group that had a failure, and none when it is the last to end', async () => {
    const { deleter, calls } = fakeDeleter();
    const aFailed = deferred();
    const { handler } = setup(
      async (id) => {
        if (id === 'a1') {
          aFailed.resolve();
          throw new Error('boom');
        }
        // c ends last, after a failed.
        if (id === 'c1') await aFailed.promise;
      },
      { recordConcurrency: 3, deleter },
    );
    const res = await handler({ Records: [rec('c'), rec('a', 1), rec('a', 2)] });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'a1' }, { itemIdentifier: 'a2' }] });
    expect(calls).toEqual([]);
  });

  it('a failed delete is only logged: the batch is unchanged', async () => {
    const { deleter, calls } = fakeDeleter(() => {
      throw new TransportError("failed to delete messages of the function's queue");
    });
    const bDone = deferred();
    const { handler, log } = setup(
      async (id) => {
        if (id === 'b1') bDone.resolve();
        if (id === 'a1') await bDone.promise;
      },
      { recordConcurrency: 2, deleter },
    );
    const res = await handler({ Records: [rec('a'), rec('b')] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(calls).toEqual([['h-b1']]);
    expect(log.records.filter((r) => r.level === 'warn').map((r) => [r.msg, r.obj.messageIds])).toEqual([
      [
        'could not delete handled events early; the event source mapping deletes them when the invocation returns',
        ['b1'],
      ],
    ]);
  });
});

describe('records not started in time', () => {
  it('the function deadline: the running record sees it, the records not started go back', async () => {
    const { handler, outcomes } = setup(
      async (id, deps) => {
        // Runs until the deadline (2.1 s after the start: 3.1 s left, 1 s margin; 100 ms could pass
        // on a loaded machine before a1 started).
        if (id === 'a1') {
          await new Promise<void>((resolve) => deps.deadline?.addEventListener('abort', () => resolve()));
        }
      },
      { recordConcurrency: 1 },
    );
    const res = await handler(
      { Records: [rec('a', 1), rec('a', 2), rec('b', 1)] },
      { getRemainingTimeInMillis: () => 3100 },
    );
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'a2' }, { itemIdentifier: 'b1' }] });
    expect(outcomes()).toEqual({ a1: 'done', a2: 'deadline', b1: 'deadline' });
  });

  it('a record that never ends (deaf to the deadline) fails only itself and its group: the invocation returns, the others keep their outcomes', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    const { handler, outcomes, trace } = setup(
      async (id) => {
        // a1 waits on a cluster that never answers; c1 throws; b1 and d1 succeed.
        if (id === 'a1') await new Promise<void>(() => undefined);
        if (id === 'c1') throw new Error('connect ECONNREFUSED 10.0.0.9:443');
      },
      { recordConcurrency: 10 },
    );
    let res: unknown;
    void handler(
      { Records: [rec('a', 1), rec('b', 1), rec('a', 2), rec('c', 1), rec('d', 1)] },
      // 120 s left (install's timeout), the default 30 s margin: the deadline comes at 90 s.
      { getRemainingTimeInMillis: () => 120_000 },
    ).then((r) => {
      res = r;
    });
    await vi.advanceTimersByTimeAsync(90_000);
    expect(res).toBeUndefined();
    // Half the margin later the invocation returns, within the function timeout.
    await vi.advanceTimersByTimeAsync(15_000);
    expect(res).toEqual({
      batchItemFailures: [{ itemIdentifier: 'a1' }, { itemIdentifier: 'a2' }, { itemIdentifier: 'c1' }],
    });
    expect(outcomes()).toEqual({ a1: 'deadline', a2: 'deadline', b1: 'done', c1: 'failed', d1: 'done' });
    expect(trace).not.toContain('start a2');
  });

  it('once less than half the invocation is left, no record starts; the running one goes on', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const { handler, outcomes, trace } = setup(
      async (id) => {
        // Half of the 10 minutes has gone by while the first record ran.
        if (id === 'a1') vi.setSystemTime(Date.now() + 5 * 60_000 + 1);
      },
      { recordConcurrency: 1 },
    );
    const res = await handler({ Records: [rec('a'), rec('b'), rec('c')] }, { getRemainingTimeInMillis: () => 600_000 });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'b1' }, { itemIdentifier: 'c1' }] });
    expect(outcomes()).toEqual({ a1: 'done', b1: 'deadline', c1: 'deadline' });
    expect(trace).toEqual(['start a1', 'end a1']);
  });

  it('a lane with a record on its last receive starts past the window: going back would dead-letter it with no status', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const { handler, outcomes, trace } = setup(
      async (id) => {
        // The record ahead of it in its group takes more than half of the 10 minutes.
        if (id === 'a1') vi.setSystemTime(Date.now() + 5 * 60_000 + 1);
      },
      { recordConcurrency: 1 },
    );
    // a3 went back behind slow records of its group on each earlier receive: this one is its
    // last, and a2 ahead of it starts too (running a3 first would break the group's order).
    const received = (r: SqsRecord, count: string) => ({
      ...r,
      attributes: { ...r.attributes, ApproximateReceiveCount: count },
    });
    const res = await handler(
      { Records: [rec('a', 1), received(rec('a', 2), '4'), received(rec('a', 3), '5'), rec('b')] },
      { getRemainingTimeInMillis: () => 600_000 },
    );
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'b1' }] });
    expect(outcomes()).toEqual({ a1: 'done', a2: 'done', a3: 'done', b1: 'deadline' });
    expect(trace).toEqual(['start a1', 'end a1', 'start a2', 'end a2', 'start a3', 'end a3']);
  });
});

describe('the time the function deadline fires', () => {
  it("reaches the stage's deps with the deadline (the single-flight waits are bounded by it)", async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(Date.parse(time));
    const seen: (number | undefined)[] = [];
    const { handler } = setup(async (_id, d) => {
      seen.push(d.deadlineAt);
    });
    await handler({ Records: [rec('a')] }, { getRemainingTimeInMillis: () => 600_000 });
    // 600 s left, the default 30 s margin: the deadline fires 570 s from now.
    expect(seen).toEqual([Date.parse(time) + 570_000]);
    await handler({ Records: [rec('b')] });
    expect(seen).toEqual([Date.parse(time) + 570_000, undefined]);
  });
});

describe('records postponed at the deadline (a requeuer)', () => {
  /** `r` as a copy postponed `n` times. */
  const postponed = (r: SqsRecord, n: number): SqsRecord => ({
    ...r,
    messageAttributes: { [POSTPONED_ATTRIBUTE]: { stringValue: String(n), dataType: 'Number' } },
  });
  /** What each requeue call sent: `<message id>:<postponements>`. */
  const sentBack = (q: MemoryMessageRequeuer) => q.calls.map((c) => c.map((m) => `${m.messageId}:${m.postponements}`));
  /** A stage where a1 takes more than half of the invocation's 10 minutes: nothing after it starts. */
  const slowFirst = (opts: Parameters<typeof setup>[1]) =>
    setup(async (id) => {
      if (id === 'a1') vi.setSystemTime(Date.now() + 5 * 60_000 + 1);
    }, opts);

  it('a record cut while it runs and the one behind it are requeued in lane order, postponed once, not failed nor deleted', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    const requeuer = new MemoryMessageRequeuer();
    const { deleter, calls } = fakeDeleter();
    const release = deferred();
    const { handler, outcomes } = setup(
      async (id) => {
        // a1 is deaf to the deadline; it ends only after the invocation was cut.
        if (id === 'a1') await release.promise;
      },
      { recordConcurrency: 2, deleter, requeuer },
    );
    let res: unknown;
    void handler(
      { Records: [rec('a', 1), rec('b', 1), rec('a', 2), rec('a', 3)] },
      { getRemainingTimeInMillis: () => 120_000 },
    ).then((r) => {
      res = r;
    });
    await vi.advanceTimersByTimeAsync(90_000 + 15_000);
    expect(res).toEqual({ batchItemFailures: [] });
    expect(sentBack(requeuer)).toEqual([['a1:1', 'a2:1', 'a3:1']]);
    expect(requeuer.calls[0]?.map((m) => m.body)).toEqual([rec('a', 1).body, rec('a', 2).body, rec('a', 3).body]);
    expect(requeuer.calls[0]?.map((m) => m.messageGroupId)).toEqual(Array(3).fill(rec('a').attributes?.MessageGroupId));
    expect(outcomes()).toEqual({ a1: 'postponed', a2: 'postponed', a3: 'postponed', b1: 'done' });
    // a1 ends after the cut: its lane is not deleted early (its copy is the record now).
    release.resolve();
    await vi.advanceTimersByTimeAsync(0);
    expect(calls).toEqual([['h-b1']]);
  });

  it('records not started are requeued, one call per lane; a copy is postponed once more', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const requeuer = new MemoryMessageRequeuer();
    const { handler, outcomes } = slowFirst({ recordConcurrency: 1, requeuer });
    const res = await handler(
      { Records: [rec('a', 1), postponed(rec('b', 1), 1), rec('b', 2), rec('c', 1)] },
      { getRemainingTimeInMillis: () => 600_000 },
    );
    expect(res).toEqual({ batchItemFailures: [] });
    expect(sentBack(requeuer).sort()).toEqual([['b1:2', 'b2:1'], ['c1:1']]);
    expect(outcomes()).toEqual({ a1: 'done', b1: 'postponed', b2: 'postponed', c1: 'postponed' });
  });

  it(`a record postponed ${MAX_POSTPONEMENTS} times goes back through batchItemFailures, its lane with it`, async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const requeuer = new MemoryMessageRequeuer();
    const { handler, outcomes } = slowFirst({ recordConcurrency: 1, requeuer });
    const res = await handler(
      { Records: [rec('a', 1), rec('b', 1), postponed(rec('b', 2), MAX_POSTPONEMENTS), rec('c', 1)] },
      { getRemainingTimeInMillis: () => 600_000 },
    );
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'b1' }, { itemIdentifier: 'b2' }] });
    expect(sentBack(requeuer)).toEqual([['c1:1']]);
    expect(outcomes()).toEqual({ a1: 'done', b1: 'deadline', b2: 'skipped', c1: 'postponed' });
  });

  it('a rejected requeue sends the records back through batchItemFailures', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const requeuer = new MemoryMessageRequeuer(() => new TransportError('failed to send postponed messages'));
    const { handler, outcomes, log } = slowFirst({ recordConcurrency: 1, requeuer });
    const res = await handler(
      { Records: [rec('a', 1), rec('a', 2), rec('b', 1)] },
      { getRemainingTimeInMillis: () => 600_000 },
    );
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'a2' }, { itemIdentifier: 'b1' }] });
    expect(outcomes()).toEqual({ a1: 'done', a2: 'deadline', b1: 'deadline' });
    expect(log.records.find((r) => r.obj.messageId === 'b1')?.obj.notPostponed).toBe(
      'the requeue failed: TransportError: failed to send postponed messages',
    );
  });

  it("a held record its sender may not send is dropped, not requeued under the function's own name", async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const requeuer = new MemoryMessageRequeuer();
    const { handler, outcomes } = slowFirst({
      recordConcurrency: 1,
      requeuer,
      checkSender: async (_event, senderId) => (senderId === 'intruder' ? "not this cluster's forwarder" : undefined),
    });
    const forged = { ...rec('b', 1), attributes: { ...rec('b', 1).attributes, SenderId: 'intruder' } };
    const res = await handler(
      { Records: [rec('a', 1), forged, rec('c', 1)] },
      { getRemainingTimeInMillis: () => 600_000 },
    );
    expect(res).toEqual({ batchItemFailures: [] });
    expect(sentBack(requeuer)).toEqual([['c1:1']]);
    expect(outcomes()).toEqual({ a1: 'done', b1: 'refused', c1: 'postponed' });
  });
});
