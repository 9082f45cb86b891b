/**
 * The renewals of the run lease a `RunGate` holds: one per record, stopped by `close()`.
 *
 * The defect: an optimistic run (a resync that found the lease free) claims the lease at its
 * first gated write. Two gated writes at the same moment (a stage's `Promise.all` of a store
 * write and a tool run) both found the gate holding nothing, both claimed, and each claim started
 * renewing; `close()` stopped only the second. The first kept renewing the lease after the record
 * was done: holding the App from its next run until it expired, and renewing from a frozen Lambda
 * environment when it thawed. Likewise a claim still in flight when the record was closed (a write
 * the stage left running) started renewing after `close()`, and nothing ever stopped it.
 *
 * Faked at the ports: a memory store (the bucket, with the lease read held back where a test
 * needs a claim in flight), a fake runner, a memory sender, a fixed lease clock and fake interval
 * timers (the renewals).
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { type KappEvent, objectEvent } from '../../events/schema.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import type { ClusterRegistry } from '../../functions/lib/kube/port.js';
import {
  DEFAULT_LEASE_TTL_MS,
  leaseKey,
  parseLease,
  RunGate,
  RunLeases,
  type WritingPorts,
} from '../../functions/lib/lease/index.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { infraStep } from '../../functions/lib/reconcile/infra-step.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { VersionedObject } from '../../functions/lib/store/port.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { NOW, REF } from './support/app-world.js';

const KEY = leaseKey(REF);
const RENEW_EVERY_MS = DEFAULT_LEASE_TTL_MS / 3;

/** The bucket: a memory store whose lease reads can be held back, or failed, one at a time. */
class Bucket extends MemoryStore {
  /** Resolved to let the held lease reads through; set by {@link holdLeaseReads}. */
  #held: Promise<void> | undefined;
  #failNext = false;

  /** Holds every lease read until the returned function is called. */
  holdLeaseReads(): () => void {
    let release = () => {};
    this.#held = new Promise<void>((r) => {
      release = r;
    });
    return () => {
      this.#held = undefined;
      release();
    };
  }

  /** Fails the next lease read (a 503 from the bucket). */
  failNextLeaseRead(): void {
    this.#failNext = true;
  }

  override async getVersioned(key: string): Promise<VersionedObject | undefined> {
    if (key === KEY) {
      if (this.#failNext) {
        this.#failNext = false;
        throw new Error('503 SlowDown');
      }
      await this.#held;
    }
    return await super.getVersioned(key);
  }
}

function setup() {
  const store = new Bucket();
  const leases = new RunLeases({ store, now: () => new Date(NOW) });
  const log = memoryLogger();
  const runner = new FakeCommandRunner({ fallback: { stdout: 'ok\n' } });
  const deps: WritingPorts = { clusters: {} as ClusterRegistry, store, runner };
  /** The lease's write counter: one more for each claim, renewal or hand-off written. */
  const writes = async () => parseLease(await store.get(KEY)).seq ?? 0;
  const open = async (event: KappEvent) => {
    const gate = await RunGate.begin(event, {
      leases,
      sender: new MemoryEventSender(),
      now: () => new Date(NOW),
      step: infraStep,
      stage: 'fetch',
      log,
    });
    if (typeof gate === 'string') throw new Error(`expected a gate, the record was ${gate}`);
    return { gate, ports: gate.ports(deps) };
  };
  return { store, runner, log, writes, open };
}

const resync = () => objectEvent({ ...REF, resourceVersion: '1' }, 'resync', { time: NOW });
const added = () => objectEvent({ ...REF, resourceVersion: '1' }, 'added', { time: NOW });
/** Two gated writes of a stage at the same moment: an artifact stored while a tool runs. */
const writeTwice = (ports: WritingPorts) =>
  Promise.all([ports.store.put('artifacts/a', 'a'), ports.runner.run({ cmd: 'vendir', args: ['sync'] })]);

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
});

afterEach(() => {
  vi.useRealTimers();
});

describe('the run gate renews the lease it holds until close()', () => {
  it('two gated writes of an optimistic run claiming at once start one renewal, and close() stops it', async () => {
    const { writes, open } = setup();
    const { gate, ports } = await open(resync());
    expect(await writes()).toBe(0); // optimistic: nothing written yet

    await writeTwice(ports);
    expect(vi.getTimerCount()).toBe(1);
    const claimed = await writes();
    await vi.advanceTimersByTimeAsync(RENEW_EVERY_MS);
    expect(await writes()).toBe(claimed + 1); // one renewal

    // A later write and another burst reuse the lease claimed: still one renewal.
    await ports.store.put('artifacts/b', 'b');
    await writeTwice(ports);
    expect(vi.getTimerCount()).toBe(1);

    gate.close();
    expect(vi.getTimerCount()).toBe(0);
    const closed = await writes();
    await vi.advanceTimersByTimeAsync(DEFAULT_LEASE_TTL_MS);
    expect(await writes()).toBe(closed);
  });

  it('a claim still in flight at close() starts no renewal when it lands', async () => {
    const { store, log, writes, open } = setup();
    const { gate, ports } = await open(resync());
    const release = store.holdLeaseReads();
    const write = ports.store.put('artifacts/a', 'a');

    gate.close();
    release();
    await write;
    expect(await store.get('artifacts/a')).toEqual(Buffer.from('a'));
    expect(vi.getTimerCount()).toBe(0);
    const claimed = await writes();
    await vi.advanceTimersByTimeAsync(DEFAULT_LEASE_TTL_MS);
    expect(await writes()).toBe(claimed);
    expect(log.records.filter((r) => r.level === 'warn')).toEqual([
      {
        level: 'warn',
        obj: { stage: 'fetch', lease: KEY },
        msg: 'run lease claimed after the record was done (a write left running); not renewed, it expires',
      },
    ]);
  });

  it('a claim that failed is not shared: the next gated write claims again, and one renewal runs', async () => {
    const { store, runner, writes, open } = setup();
    const { gate, ports } = await open(resync());
    store.failNextLeaseRead();

    await expect(ports.store.put('artifacts/a', 'a')).rejects.toThrow('taking the run lease failed');
    expect(await store.get('artifacts/a')).toBeUndefined();
    expect(vi.getTimerCount()).toBe(0);

    await ports.runner.run({ cmd: 'vendir', args: ['sync'] });
    expect(runner.argv()).toEqual([['vendir', 'sync']]);
    expect(vi.getTimerCount()).toBe(1);
    expect(await writes()).toBe(1); // the claim

    gate.close();
    expect(vi.getTimerCount()).toBe(0);
  });

  it('a run that took the lease at begin renews it until close(), once however often close() is called', async () => {
    const { writes, open } = setup();
    const { gate, ports } = await open(added());
    expect(ports.store).toBeInstanceOf(Bucket); // not optimistic: its writes are not gated
    expect(vi.getTimerCount()).toBe(1);
    const taken = await writes();
    await vi.advanceTimersByTimeAsync(RENEW_EVERY_MS);
    expect(await writes()).toBe(taken + 1);

    gate.close();
    gate.close();
    expect(vi.getTimerCount()).toBe(0);
    await vi.advanceTimersByTimeAsync(DEFAULT_LEASE_TTL_MS);
    expect(await writes()).toBe(taken + 1);
  });
});
