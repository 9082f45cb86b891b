/**
 * Leader election (`events/forwarder/leader.ts`) against an in-memory Lease port with
 * optimistic concurrency, driven by fake timers: acquire, hold-off, take-over after expiry,
 * renew, loss on conflict / other holder / missed deadline / hung requests, release on stop,
 * and two candidates racing for one Lease.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { LeaderElector, type LeaderElectorOptions } from '../../events/forwarder/leader.js';
import {
  ConflictError,
  KubeApiError,
  type Lease,
  type LeaseSpec,
  type LeaseView,
} from '../../functions/lib/kube/port.js';

const T0 = Date.parse('2025-03-01T10:00:00.000Z');
const NS = 'kapp-lambda';
const NAME = 'kapp-lambda-forwarder';

type Call = { op: 'get' | 'create' | 'update'; by?: string; rv?: string; holder?: string };

/** A Lease store: resourceVersion bumps on every write, 409 on a stale one, scripted faults. */
class FakeLeases {
  lease: Lease | undefined;
  readonly calls: Call[] = [];
  /** Errors the next calls (any op) throw, in order. */
  readonly failures: unknown[] = [];
  /** Errors the next updates throw (after their GET passed), in order. */
  readonly updateFailures: unknown[] = [];
  /** While true, calls never answer. */
  hang = false;
  private rv = 100;

  /** A port bound to one caller (so calls record who made them). */
  view(by: string): LeaseView {
    return {
      getLease: async (ns, name) => this.call({ op: 'get', by }, () => this.get(ns, name)),
      createLease: async (ns, name, spec) =>
        this.call({ op: 'create', by, holder: spec.holderIdentity }, () => this.create(ns, name, spec)),
      updateLease: async (ns, name, rv, spec) =>
        this.call({ op: 'update', by, rv, holder: spec.holderIdentity }, () => this.update(ns, name, rv, spec)),
    };
  }

  /** Another party writes the Lease (no precondition). */
  put(spec: LeaseSpec): void {
    this.lease = {
      metadata: { name: NAME, namespace: NS, uid: 'u1', resourceVersion: String(++this.rv) },
      spec: structuredClone(spec),
    };
  }

  writesBy(by: string): Call[] {
    return this.calls.filter((c) => c.by === by && c.op !== 'get');
  }

  private async call<T>(c: Call, fn: () => T): Promise<T> {
    this.calls.push(c);
    if (this.hang) return await new Promise<T>(() => {});
    const f = this.failures.shift() ?? (c.op === 'update' ? this.updateFailures.shift() : undefined);
    if (f !== undefined) throw f;
    return structuredClone(fn());
  }

  private get(ns: string, name: string): Lease | undefined {
    expect([ns, name]).toEqual([NS, NAME]);
    return this.lease;
  }

  private create(ns: string, name: string, spec: LeaseSpec): Lease {
    if (this.lease) throw new ConflictError(`creating Lease ${ns}/${name}: 409 already exists`);
    this.put(spec);
    return this.lease!;
  }

  private update(ns: string, name: string, rv: string, spec: LeaseSpec): Lease {
    if (!this.lease) throw new KubeApiError(`updating Lease ${ns}/${name}: 404 not found`, { statusCode: 404 });
    if (this.lease.metadata.resourceVersion !== rv)
      throw new ConflictError(`updating Lease ${ns}/${name}: 409 conflict`);
    this.put(spec);
    return this.lease!;
  }
}

let leases: FakeLeases;
let electors: LeaderElector[];
let events: string[];

function elector(identity: string, extra: Partial<LeaderElectorOptions> = {}): LeaderElector {
  const e = new LeaderElector({
    lease: leases.view(identity),
    namespace: NS,
    name: NAME,
    identity,
    random: () => 0.5,
    onStartedLeading: () => events.push(`${identity} started`),
    onStoppedLeading: (reason) => events.push(`${identity} stopped: ${reason}`),
    ...extra,
  });
  electors.push(e);
  return e;
}

const advance = (ms: number) => vi.advanceTimersByTimeAsync(ms);
const isoAt = (ms: number) => new Date(ms).toISOString().replace('Z', '000Z');

/** Another holder that renews every 2 s until `stop()`. */
function otherHolder(identity = 'other'): { stop(): void } {
  leases.put({ holderIdentity: identity, leaseDurationSeconds: 15, renewTime: isoAt(Date.now()) });
  const t = setInterval(() => {
    leases.put({ ...leases.lease!.spec, renewTime: isoAt(Date.now()) });
  }, 2000);
  return { stop: () => clearInterval(t) };
}

beforeEach(() => {
  vi.useFakeTimers({ now: T0 });
  leases = new FakeLeases();
  electors = [];
  events = [];
});

afterEach(async () => {
  leases.hang = false;
  await Promise.all(electors.map((e) => e.stop({ release: false })));
  vi.useRealTimers();
});

describe('LeaderElector', () => {
  it('acquires a Lease that does not exist by creating it, with controller-runtime durations', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    expect(a.isLeader()).toBe(true);
    expect(events).toEqual(['a started']);
    expect(leases.lease?.spec).toEqual({
      holderIdentity: 'a',
      leaseDurationSeconds: 15,
      acquireTime: '2025-03-01T10:00:00.000000Z',
      renewTime: '2025-03-01T10:00:00.000000Z',
      leaseTransitions: 0,
    });
    expect(leases.calls.map((c) => c.op)).toEqual(['get', 'create']);
  });

  it('acquires a released Lease (empty holder) at once, counting a transition', async () => {
    leases.put({ holderIdentity: '', leaseDurationSeconds: 1, leaseTransitions: 3 });
    const a = elector('a');
    a.start();
    await advance(0);
    expect(a.isLeader()).toBe(true);
    expect(leases.lease?.spec).toMatchObject({ holderIdentity: 'a', leaseTransitions: 4 });
  });

  it('does not take a Lease another holder keeps renewing, and never writes it', async () => {
    const other = otherHolder();
    const a = elector('a');
    a.start();
    await advance(120_000);
    expect(a.isLeader()).toBe(false);
    expect(events).toEqual([]);
    expect(leases.writesBy('a')).toEqual([]);
    expect(leases.lease?.spec.holderIdentity).toBe('other');
    other.stop();
  });

  it('takes over a Lease that stopped changing, after its duration as observed locally', async () => {
    // The holder's renewTime says "just now" but it never renews again (crashed).
    leases.put({ holderIdentity: 'dead', leaseDurationSeconds: 15, renewTime: isoAt(T0), leaseTransitions: 2 });
    const a = elector('a');
    a.start();
    await advance(14_900);
    expect(a.isLeader()).toBe(false);
    await advance(3_000); // next try after 15 s (tries every 2.2 s with the jitter of random 0.5)
    expect(a.isLeader()).toBe(true);
    const took = Date.parse(leases.lease!.spec.acquireTime!.replace('000Z', 'Z'));
    expect(took - T0).toBeGreaterThanOrEqual(15_000);
    expect(took - T0).toBeLessThan(17_500);
    expect(leases.lease?.spec).toMatchObject({ holderIdentity: 'a', leaseTransitions: 3 });
  });

  it('judges expiry by when it saw the Lease change, not by renewTime (no cross-machine clocks)', async () => {
    // renewTime an hour old (a holder with a slow clock) but the Lease just changed: wait.
    leases.put({ holderIdentity: 'skewed', leaseDurationSeconds: 15, renewTime: isoAt(T0 - 3_600_000) });
    const a = elector('a');
    a.start();
    await advance(10_000);
    expect(a.isLeader()).toBe(false);
  });

  it('renews every retry period, keeping acquireTime, while leading', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    await advance(10_000);
    expect(a.isLeader()).toBe(true);
    expect(a.stats()).toMatchObject({ acquired: 1, renewals: 5, lost: 0 });
    expect(leases.lease?.spec).toMatchObject({
      holderIdentity: 'a',
      acquireTime: '2025-03-01T10:00:00.000000Z',
      renewTime: '2025-03-01T10:00:10.000000Z',
      leaseTransitions: 0,
    });
    // every update carried the resourceVersion last written; renewals read nothing (client-go's
    // optimistic renewal): the only GET is the acquiring one
    const updates = leases.calls.filter((c) => c.op === 'update');
    expect(updates).toHaveLength(5);
    expect(new Set(updates.map((u) => u.rv)).size).toBe(5);
    expect(leases.calls.filter((c) => c.op === 'get')).toHaveLength(1);
  });

  it('a renewal whose optimistic write fails reads the Lease and renews when it is still its own', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    leases.updateFailures.push(new ConflictError('updating Lease kapp-lambda/kapp-lambda-forwarder: 409 conflict'));
    const before = leases.calls.length;
    await advance(2_000);
    expect(a.isLeader()).toBe(true);
    expect(leases.calls.slice(before).map((c) => c.op)).toEqual(['update', 'get', 'update']);
    expect(events).toEqual(['a started']);
  });

  it('stops leading at once when a renewal gets 409', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    // the optimistic write, then the write after the read
    for (let i = 0; i < 2; i++)
      leases.updateFailures.push(new ConflictError('updating Lease kapp-lambda/kapp-lambda-forwarder: 409 conflict'));
    await advance(2_000);
    expect(a.isLeader()).toBe(false);
    expect(events).toEqual(['a started', 'a stopped: renewal conflicted (409)']);
  });

  it('stops leading at once when a renewal finds another holder', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    leases.put({ holderIdentity: 'b', leaseDurationSeconds: 15, renewTime: isoAt(Date.now()) });
    await advance(2_000);
    expect(a.isLeader()).toBe(false);
    expect(events).toEqual(['a started', 'a stopped: lease taken by b']);
    expect(leases.lease?.spec.holderIdentity).toBe('b'); // it did not write over b
  });

  it('stops leading when no renewal succeeds within the renew deadline, and re-acquires when it can', async () => {
    const a = elector('a');
    a.start();
    await advance(0); // acquired at T0
    for (let i = 0; i < 20; i++)
      leases.failures.push(new KubeApiError('getting Lease: 503 unavailable', { statusCode: 503 }));
    await advance(9_900);
    expect(a.isLeader()).toBe(true);
    await advance(100);
    expect(a.isLeader()).toBe(false);
    expect(events).toEqual(['a started', 'a stopped: no renewal within 10000ms']);
    // the API comes back; the Lease still names a: it leads again
    leases.failures.length = 0;
    await advance(2_500);
    expect(a.isLeader()).toBe(true);
    expect(events.at(-1)).toBe('a started');
  });

  it('stops leading on time while a renewal hangs (the deadline is a timer, not the request)', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    await advance(2_000); // one renewal at T0+2s
    leases.hang = true;
    await advance(9_900); // T0+11.9s: the renewals since T0+2s hang
    expect(a.isLeader()).toBe(true);
    await advance(200); // T0+12.1s: 10 s after the last renewal was sent
    expect(a.isLeader()).toBe(false);
    expect(events).toEqual(['a started', 'a stopped: no renewal within 10000ms']);
  });

  it('answers isLeader() false past the deadline even before any timer ran (a stalled event loop)', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    vi.setSystemTime(T0 + 10_000);
    expect(a.isLeader()).toBe(false);
  });

  it('releases the Lease on stop, so a waiting candidate takes over on its next try', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    const b = elector('b');
    b.start();
    await advance(4_000);
    expect([a.isLeader(), b.isLeader()]).toEqual([true, false]);
    await a.stop();
    expect(events).toEqual(['a started', 'a stopped: stopped']);
    expect(leases.lease?.spec).toMatchObject({ holderIdentity: '', leaseDurationSeconds: 1 });
    await advance(2_200);
    expect(b.isLeader()).toBe(true);
    expect(leases.lease?.spec).toMatchObject({ holderIdentity: 'b', leaseTransitions: 1 });
  });

  it('does not write on stop when it never led', async () => {
    const other = otherHolder();
    const a = elector('a');
    a.start();
    await advance(5_000);
    await a.stop();
    expect(leases.writesBy('a')).toEqual([]);
    expect(events).toEqual([]);
    other.stop();
  });

  it('with stop({ release: false }) the Lease is left to expire', async () => {
    const a = elector('a');
    a.start();
    await advance(0);
    await a.stop({ release: false });
    expect(leases.lease?.spec.holderIdentity).toBe('a');
  });

  it('of two candidates started together exactly one leads, at every moment, across losses', async () => {
    const a = elector('a');
    const b = elector('b', { random: () => 0.9 });
    a.start();
    b.start();
    let both = 0;
    const leaders = new Set<string>();
    for (let t = 0; t < 120_000; t += 100) {
      if (t === 30_000) for (let i = 0; i < 12; i++) leases.failures.push(new KubeApiError('503', { statusCode: 503 }));
      await advance(100);
      if (a.isLeader() && b.isLeader()) both++;
      if (a.isLeader()) leaders.add('a');
      if (b.isLeader()) leaders.add('b');
    }
    expect(both).toBe(0);
    expect(leaders.size).toBeGreaterThanOrEqual(1);
    expect(a.isLeader() !== b.isLeader()).toBe(true);
  });

  it('logs each distinct failure once, not every retry', async () => {
    const warn = vi.fn();
    const a = elector('a', { logger: { info: () => {}, debug: () => {}, warn } });
    for (let i = 0; i < 10; i++) {
      leases.failures.push(
        new KubeApiError('creating Lease kapp-lambda/kapp-lambda-forwarder: 404 namespaces "kapp-lambda" not found'),
      );
    }
    a.start();
    await advance(20_000);
    expect(a.isLeader()).toBe(false);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(warn.mock.calls[0]).toEqual([
      {
        lease: 'kapp-lambda/kapp-lambda-forwarder',
        leading: false,
        error: 'creating Lease kapp-lambda/kapp-lambda-forwarder: 404 namespaces "kapp-lambda" not found',
      },
      'leader election: try failed',
    ]);
  });

  it('rejects durations client-go rejects', () => {
    const base = { lease: leases.view('x'), namespace: NS, name: NAME, identity: 'x' };
    expect(() => new LeaderElector({ ...base, leaseDurationMs: 10_000, renewDeadlineMs: 10_000 })).toThrow(
      'leaseDurationMs must be greater than renewDeadlineMs',
    );
    expect(() => new LeaderElector({ ...base, renewDeadlineMs: 2_400, retryPeriodMs: 2_000 })).toThrow(
      'renewDeadlineMs must be greater than 1.2 × retryPeriodMs',
    );
    expect(() => new LeaderElector({ ...base, identity: '' })).toThrow('identity must not be empty');
  });
});
