import { describe, expect, it } from 'vitest';
import { KeyedQueue } from '../../functions/embedded/keyed-queue.js';

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** A timer port that keeps the last timer set, to be fired by hand, and records a cancel. */
function oneTimer() {
  const t = {
    fire: undefined as (() => void) | undefined,
    cancelled: false,
    set: (fn: () => void) => {
      t.fire = fn;
      return {
        cancel: () => {
          t.cancelled = true;
        },
      };
    },
  };
  return t;
}

describe('KeyedQueue', () => {
  it('runs one item per key at a time and coalesces arrivals into one follow-up', async () => {
    const gate = deferred();
    const runs: string[] = [];
    let concurrentForKey = 0;
    let maxConcurrentForKey = 0;
    const q = new KeyedQueue<string>(async (_key, item) => {
      concurrentForKey++;
      maxConcurrentForKey = Math.max(maxConcurrentForKey, concurrentForKey);
      runs.push(item);
      if (item === 'g1') await gate.promise;
      concurrentForKey--;
    });
    q.add('c/App/ns/a', 'g1');
    q.add('c/App/ns/a', 'g2');
    q.add('c/App/ns/a', 'g3');
    q.add('c/App/ns/a', 'g4');
    expect(runs).toEqual(['g1']);
    gate.resolve();
    await q.idle();
    expect(runs).toEqual(['g1', 'g4']);
    expect(maxConcurrentForKey).toBe(1);
  });

  it('uses the coalesce function to merge waiting items', async () => {
    const gate = deferred();
    const runs: string[][] = [];
    const q = new KeyedQueue<string[]>(
      async (_k, item) => {
        runs.push(item);
        if (runs.length === 1) await gate.promise;
      },
      { coalesce: (a, b) => [...a, ...b] },
    );
    q.add('k', ['first']);
    q.add('k', ['ref-changed']);
    q.add('k', ['resync']);
    gate.resolve();
    await q.idle();
    expect(runs).toEqual([['first'], ['ref-changed', 'resync']]);
  });

  it('bounds concurrency across keys', async () => {
    let active = 0;
    let peak = 0;
    const q = new KeyedQueue<number>(
      async () => {
        active++;
        peak = Math.max(peak, active);
        await new Promise((r) => setTimeout(r, 5));
        active--;
      },
      { concurrency: 3 },
    );
    for (let i = 0; i < 20; i++) q.add(`c/k${i}`, i);
    await q.idle();
    expect(peak).toBe(3);
  });

  it('picks tenants round-robin so a burst from one cluster does not starve another', async () => {
    const gate = deferred();
    const order: string[] = [];
    const q = new KeyedQueue<string>(
      async (key) => {
        if (key === 'busy/0') await gate.promise;
        order.push(key);
      },
      { concurrency: 1 },
    );
    for (let i = 0; i < 5; i++) q.add(`busy/${i}`, 'x');
    q.add('quiet/0', 'x');
    gate.resolve();
    await q.idle();
    expect(order).toEqual(['busy/0', 'quiet/0', 'busy/1', 'busy/2', 'busy/3', 'busy/4']);
  });

  it('retries a crashed run with exponential backoff until it succeeds', async () => {
    const delays: number[] = [];
    let calls = 0;
    const errors: number[] = [];
    const q = new KeyedQueue<string>(
      async () => {
        calls++;
        if (calls < 4) throw new Error('function crashed');
      },
      {
        baseRetryMs: 100,
        maxRetryMs: 250,
        onError: (_k, _e, attempt) => errors.push(attempt),
        setTimer: (fn, ms) => {
          delays.push(ms);
          queueMicrotask(fn);
          return { cancel: () => {} };
        },
      },
    );
    q.add('k', 'item');
    await q.idle();
    expect(calls).toBe(4);
    expect(delays).toEqual([100, 200, 250]);
    expect(errors).toEqual([0, 1, 2]);
  });

  it('lets a newer item replace one waiting in backoff', async () => {
    const seen: string[] = [];
    const timer = oneTimer();
    const q = new KeyedQueue<string>(
      async (_k, item) => {
        seen.push(item);
        if (item === 'old') throw new Error('boom');
      },
      {
        setTimer: timer.set,
      },
    );
    q.add('k', 'old');
    await new Promise((r) => setTimeout(r, 0));
    expect(timer.fire).toBeDefined();
    q.add('k', 'new');
    await q.idle();
    expect(timer.cancelled).toBe(true);
    expect(seen).toEqual(['old', 'new']);
  });
  it('keeps an item in backoff, with its timer, when the merge with a newer item returns it', async () => {
    const seen: string[] = [];
    const timer = oneTimer();
    const q = new KeyedQueue<string>(
      async (_k, item) => {
        seen.push(item);
        if (item === 'crashed' && seen.length === 1) throw new Error('boom');
      },
      {
        // 'resync' never supersedes a crashed item; anything else does.
        coalesce: (pending, next) => (next === 'resync' && pending === 'crashed' ? pending : next),
        setTimer: timer.set,
      },
    );
    q.add('k', 'crashed');
    await new Promise((r) => setTimeout(r, 0));
    q.add('k', 'resync');
    expect(timer.cancelled).toBe(false);
    expect(seen).toEqual(['crashed']);
    timer.fire?.();
    await q.idle();
    expect(seen).toEqual(['crashed', 'crashed']);
  });

  it('merges a crashed item with the item that arrived while it ran, instead of dropping it', async () => {
    const seen: string[] = [];
    let q!: KeyedQueue<string>;
    q = new KeyedQueue<string>(
      async (k, item) => {
        seen.push(item);
        if (seen.length === 1) {
          q.add(k, 'resync');
          throw new Error('boom');
        }
      },
      { coalesce: (pending, next) => `${pending}+${next}`, baseRetryMs: 1, maxRetryMs: 1 },
    );
    q.add('k', 'ref-changed');
    await q.idle();
    expect(seen).toEqual(['ref-changed', 'ref-changed+resync']);
  });
});
