/**
 * Fleet single-flight (`functions/lib/artifact/single-flight.ts`), over the memory store: many
 * runners asking for the same key run the tool once, a crashed holder is taken over after its
 * marker expires, a holder's failure lets its waiters run for themselves, and waits end on abort,
 * deadline or budget. The pause between polls is a fake that yields to the event loop and moves
 * a fake clock on, so no assertion depends on real time.
 */
import { setImmediate as tick } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { inflightKey, renderCacheKey } from '../../functions/lib/artifact/keys.js';
import {
  DEFAULT_FLIGHT_TTL_MS,
  FLIGHT_EXPIRY_SLACK_MS,
  FlightDeadlineError,
  type FlightOptions,
  parseFlightMarker,
  singleFlight,
} from '../../functions/lib/artifact/single-flight.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';
import { useTempDir } from './support/stage-deps.js';

const dir = useTempDir('single-flight-');
const KEY = renderCacheKey('a'.repeat(64));
const MARKER = inflightKey(KEY);
const T0 = Date.parse('2026-01-01T00:00:00Z');

/** A fleet of runners over one store and one fake clock; `sleeps` counts the pauses taken. */
function fleet(store: ObjectStore = new MemoryStore()) {
  const clock = { ms: T0, stepMs: 0 };
  const log = memoryLogger();
  const counts = { runs: 0, sleeps: 0 };
  const opts = (label: string, extra: Partial<FlightOptions> = {}): FlightOptions => ({
    store,
    key: KEY,
    label,
    now: () => new Date(clock.ms),
    log,
    maxWaitMs: 10 * 60_000,
    sleep: async () => {
      counts.sleeps++;
      clock.ms += clock.stepMs;
      await tick();
    },
    ...extra,
  });
  /** The artifact lookup: the stored record's body. */
  const find = async () => (await store.get(KEY))?.toString();
  /** A run that stores the record once `release` resolves. */
  const runner = (release: Promise<void> = Promise.resolve(), shared = true, value = 'made') => {
    return async () => {
      counts.runs++;
      await release;
      if (shared) await store.put(KEY, value);
      return { result: value, shared };
    };
  };
  return { store, clock, log, counts, opts, find, runner };
}

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((r) => {
    open = r;
  });
  return { opened, open };
}

async function marker(store: ObjectStore) {
  return parseFlightMarker(await store.get(MARKER));
}

describe('fleet single-flight', () => {
  it.each([
    ['memory store', () => new MemoryStore()],
    // The embedded runtime's store over one directory, as the dedup bench's 20 runtimes share it.
    ['local directory store', () => new LocalDirStore(dir(), { fsync: false })],
  ])('N concurrent runners of one key run the tool once; the others use its artifact (%s)', async (_name, make) => {
    const f = fleet(make());
    const g = gate();
    const n = 12;
    const all = Array.from({ length: n }, (_, i) => singleFlight(f.opts(`r${i}`), f.find, f.runner(g.opened)));
    // The holder finishes only once every other runner has paused at least once (is waiting).
    while (f.counts.sleeps < n - 1) await tick();
    g.open();
    const out = await Promise.all(all);
    expect(f.counts.runs).toBe(1);
    expect(out.filter((o) => o.kind === 'ran')).toEqual([{ kind: 'ran', result: 'made', role: 'leader' }]);
    expect(out.filter((o) => o.kind === 'found')).toHaveLength(n - 1);
    for (const o of out) if (o.kind === 'found') expect(o).toEqual({ kind: 'found', value: 'made', waited: true });
    // The holder deleted its marker once the artifact was stored.
    expect(await f.store.get(MARKER)).toBeUndefined();
  });

  it('a runner that claims the marker after the artifact landed uses it and runs nothing', async () => {
    const f = fleet();
    await f.store.put(KEY, 'earlier');
    const out = await singleFlight(f.opts('late'), f.find, f.runner());
    expect(out).toEqual({ kind: 'found', value: 'earlier', waited: false });
    expect(f.counts.runs).toBe(0);
    expect(await f.store.get(MARKER)).toBeUndefined();
  });

  it('a runner alone claims the absent marker with one conditional create: no read of the marker', async () => {
    const ops: string[] = [];
    const store = new MemoryStore();
    for (const op of ['get', 'getVersioned', 'putIfMatch', 'put', 'delete'] as const) {
      const inner = (store[op] as (...a: unknown[]) => Promise<unknown>).bind(store);
      Object.assign(store, {
        [op]: async (...a: unknown[]) => {
          ops.push(`${op} ${a[0] === MARKER ? 'marker' : 'record'}`);
          return await inner(...a);
        },
      });
    }
    const f = fleet(store);
    const out = await singleFlight(f.opts('alone'), f.find, f.runner());
    expect(out).toEqual({ kind: 'ran', result: 'made', role: 'leader' });
    // claim, look again (the artifact may have landed before the claim), run and store, release
    expect(ops).toEqual(['putIfMatch marker', 'get record', 'put record', 'delete marker']);
  });

  it('a crashed holder: its expired marker is taken over by CAS and the tool runs once', async () => {
    const f = fleet();
    const expired = new Date(T0 - 1).toISOString();
    await f.store.put(MARKER, JSON.stringify({ holder: 'crashed/1', expiresAt: expired }));
    const out = await Promise.all([1, 2, 3].map((i) => singleFlight(f.opts(`r${i}`), f.find, f.runner())));
    expect(f.counts.runs).toBe(1);
    expect(out.map((o) => o.kind).sort()).toEqual(['found', 'found', 'ran']);
    expect(f.log.records.some((r) => r.msg === 'in-flight marker had expired; taken over')).toBe(true);
  });

  it('a holder that stops renewing while others wait is taken over once its marker expires', async () => {
    const f = fleet();
    // Live when the waiter comes; the fake clock passes its expiry after a few polls.
    const live = new Date(T0 + DEFAULT_FLIGHT_TTL_MS).toISOString();
    await f.store.put(MARKER, JSON.stringify({ holder: 'frozen/1', expiresAt: live }));
    f.clock.stepMs = 5_000;
    const out = await singleFlight(f.opts('waiter'), f.find, f.runner());
    expect(out).toEqual({ kind: 'ran', result: 'made', role: 'leader' });
    expect(f.counts.runs).toBe(1);
    expect(f.counts.sleeps).toBeGreaterThanOrEqual(DEFAULT_FLIGHT_TTL_MS / 5_000);
  });

  it('the holder renews its marker while the tool runs (a long run is not taken over)', async () => {
    const f = fleet();
    const g = gate();
    const leader = singleFlight(f.opts('leader', { ttlMs: 60 }), f.find, f.runner(g.opened));
    while (!(await marker(f.store))) await tick();
    const first = (await marker(f.store))?.expiresAt;
    f.clock.ms += 30;
    // Renewed every third of the TTL (20 ms of real time): a later expiry, by the same holder.
    while ((await marker(f.store))?.expiresAt === first) await new Promise((r) => setTimeout(r, 5));
    expect((await marker(f.store))?.holder).toMatch(/^leader\//);
    g.open();
    expect(await leader).toEqual({ kind: 'ran', result: 'made', role: 'leader' });
  });

  it('a holder whose run stores no shared artifact marks the marker failed; its waiters run for themselves', async () => {
    const f = fleet();
    const g = gate();
    const holder = singleFlight(f.opts('holder'), f.find, f.runner(g.opened, false, 'holder failed'));
    while (!(await marker(f.store))) await tick();
    const waiters = [1, 2, 3].map((i) =>
      singleFlight(f.opts(`w${i}`), f.find, f.runner(Promise.resolve(), false, `w${i} ran`)),
    );
    while (f.counts.sleeps < 3) await tick();
    g.open();
    expect(await holder).toEqual({ kind: 'ran', result: 'holder failed', role: 'leader' });
    // Each waiter has its own result (its own run), not the holder's.
    expect(await Promise.all(waiters)).toEqual(
      [1, 2, 3].map((i) => ({ kind: 'ran', result: `w${i} ran`, role: 'solo' })),
    );
    expect(f.counts.runs).toBe(4);
    expect((await marker(f.store))?.failed).toBe(true);
    // A failed marker is free for the next runner that comes: it leads, and its success clears it.
    expect(await singleFlight(f.opts('next'), f.find, f.runner())).toEqual({
      kind: 'ran',
      result: 'made',
      role: 'leader',
    });
    expect(await f.store.get(MARKER)).toBeUndefined();
  });

  it('a holder whose run throws marks the marker failed and rethrows its own error', async () => {
    const f = fleet();
    const boom = async (): Promise<{ result: string; shared: boolean }> => {
      throw new Error('storing the manifest failed');
    };
    await expect(singleFlight(f.opts('holder'), f.find, boom)).rejects.toThrow('storing the manifest failed');
    expect((await marker(f.store))?.failed).toBe(true);
  });

  it('the abort signal ends a wait: nothing runs', async () => {
    const f = fleet();
    await f.store.put(
      MARKER,
      JSON.stringify({ holder: 'other/1', expiresAt: new Date(T0 + DEFAULT_FLIGHT_TTL_MS).toISOString() }),
    );
    const abort = new AbortController();
    abort.abort();
    const out = await singleFlight(f.opts('w', { signal: abort.signal }), f.find, f.runner());
    expect(out).toEqual({ kind: 'aborted' });
    expect(f.counts.runs).toBe(0);
  });

  it('the function deadline ends a wait with a retryable FlightDeadlineError', async () => {
    const f = fleet();
    await f.store.put(
      MARKER,
      JSON.stringify({ holder: 'other/1', expiresAt: new Date(T0 + DEFAULT_FLIGHT_TTL_MS).toISOString() }),
    );
    const deadline = new AbortController();
    deadline.abort();
    await expect(singleFlight(f.opts('w', { deadline: deadline.signal }), f.find, f.runner())).rejects.toBeInstanceOf(
      FlightDeadlineError,
    );
    expect(f.counts.runs).toBe(0);
  });

  it('a wait longer than maxWaitMs ends in a run of its own', async () => {
    const f = fleet();
    const live = new Date(T0 + DEFAULT_FLIGHT_TTL_MS).toISOString();
    await f.store.put(MARKER, JSON.stringify({ holder: 'slow/1', expiresAt: live }));
    f.clock.stepMs = 1_000;
    const out = await singleFlight(f.opts('w', { maxWaitMs: 5_000 }), f.find, f.runner(Promise.resolve(), false));
    expect(out).toEqual({ kind: 'ran', result: 'made', role: 'solo' });
    // The slow holder's marker is left alone.
    expect((await marker(f.store))?.holder).toBe('slow/1');
  });

  it('a marker expiring further than one TTL (and the clock slack) away reads as expired: taken over at once', async () => {
    const f = fleet();
    // A holder never writes this: a run of another cluster keeping the fleet waiting.
    await f.store.put(MARKER, JSON.stringify({ holder: 'squatter/1', expiresAt: '2100-01-01T00:00:00Z' }));
    f.clock.stepMs = 1_000;
    const out = await singleFlight(f.opts('w'), f.find, f.runner());
    expect(out).toEqual({ kind: 'ran', result: 'made', role: 'leader' });
    expect(f.counts.sleeps).toBe(0);
    expect(f.log.records.some((r) => r.msg === 'in-flight marker had expired; taken over')).toBe(true);
    // One within the TTL plus the slack is a live holder's: waited for.
    const g = fleet();
    const skewed = new Date(T0 + DEFAULT_FLIGHT_TTL_MS + FLIGHT_EXPIRY_SLACK_MS).toISOString();
    await g.store.put(MARKER, JSON.stringify({ holder: 'skewed/1', expiresAt: skewed }));
    g.clock.stepMs = 1_000;
    const waited = await singleFlight(g.opts('w', { maxWaitMs: 3_000 }), g.find, g.runner(Promise.resolve(), false));
    expect(waited).toEqual({ kind: 'ran', result: 'made', role: 'solo' });
    expect((await marker(g.store))?.holder).toBe('skewed/1');
  });

  it('a wait lasts at most half the time left before the function deadline, whatever maxWaitMs', async () => {
    const f = fleet();
    // A holder that keeps its marker live for ever (renewed before each poll) and never delivers.
    const renew = async () => {
      const live = new Date(f.clock.ms + DEFAULT_FLIGHT_TTL_MS).toISOString();
      await f.store.put(MARKER, JSON.stringify({ holder: 'forever/1', expiresAt: live }));
    };
    await renew();
    const leftMs = 20 * 60_000;
    const out = await singleFlight(
      f.opts('w', {
        maxWaitMs: 60 * 60_000,
        deadlineAt: T0 + leftMs,
        sleep: async () => {
          f.clock.ms += 1_000;
          await renew();
          await tick();
        },
      }),
      f.find,
      f.runner(Promise.resolve(), false),
    );
    expect(out).toEqual({ kind: 'ran', result: 'made', role: 'solo' });
    // It gave up at half the time left: the other half is its own run's.
    expect(f.clock.ms - T0).toBe(leftMs / 2);
  });

  it('private keys take no marker: content made from Secrets is never shared', () => {
    expect(() =>
      inflightKey(`private/${'0'.repeat(32)}/${'1'.repeat(32)}/cache/render/${'a'.repeat(64)}.json`),
    ).toThrow(TypeError);
    expect(MARKER).toBe(`inflight/${KEY}`);
  });
});
