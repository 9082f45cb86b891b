import { describe, expect, it } from 'vitest';
import {
  chooseWakes,
  defaultClusterShare,
  defaultNamespaceShare,
  type ShareEntrant,
  StageShares,
  sharesKey,
} from '../../functions/lib/lease/shares.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { MessageRequeuer, RequeuedMessage } from '../../functions/lib/transport/port.js';

class FakeRequeuer implements MessageRequeuer {
  sent: RequeuedMessage[][] = [];
  reject = false;
  async requeue(messages: readonly RequeuedMessage[]): Promise<void> {
    if (this.reject) throw new Error('queue refused');
    this.sent.push([...messages]);
  }
}

const T0 = 1_700_000_000_000;

function setup(clusterShare: number, namespaceShare: number, store = new MemoryStore()) {
  let now = T0;
  const requeuer = new FakeRequeuer();
  const shares = new StageShares({ store, requeuer, clusterShare, namespaceShare, now: () => now });
  return { shares, store, requeuer, tick: (ms: number) => (now += ms), at: () => now };
}

/** A record `id` of object `ns/name`, running until `until`. */
function entrant(id: string, ns: string, name: string, until = T0 + 60_000): ShareEntrant {
  return {
    id,
    until,
    eventId: `ev-${id}`,
    message: { messageId: id, body: `{"id":"ev-${id}"}`, messageGroupId: `c1/${ns}/${name}`, postponements: 1 },
  };
}

const A = { clusterId: 'c1', namespace: 'a' };
const B = { clusterId: 'c1', namespace: 'b' };

async function parkedObjects(store: MemoryStore): Promise<string[]> {
  return await store.list('state/shares/fetch/c1/parked/');
}

describe('StageShares', () => {
  it('holds up to the cluster share, then parks the record', async () => {
    const { shares, store } = setup(2, 2);
    expect(await shares.acquire('fetch', A, entrant('m1', 'a', 'x'))).toBe('held');
    expect(await shares.acquire('fetch', B, entrant('m2', 'b', 'y'))).toBe('held');
    expect(await shares.acquire('fetch', B, entrant('m3', 'b', 'z'))).toBe('over-share');
    // Another cluster has its own share.
    expect(await shares.acquire('fetch', { clusterId: 'c2', namespace: 'a' }, entrant('m4', 'a', 'x'))).toBe('held');
    const doc = await shares.read('fetch', 'c1');
    expect(doc.holders.map((h) => h.id)).toEqual(['m1', 'm2']);
    expect(doc.parked.map((p) => p.eventId)).toEqual(['ev-m3']);
    const objects = await parkedObjects(store);
    expect(objects).toEqual([`state/shares/fetch/c1/parked/00${T0}-m3`]);
    expect(JSON.parse(String(await store.get(objects[0] as string)))).toEqual(entrant('m3', 'b', 'z').message);
  });

  it('holds up to the namespace share within the cluster share', async () => {
    const { shares } = setup(3, 1);
    expect(await shares.acquire('fetch', A, entrant('m1', 'a', 'x'))).toBe('held');
    expect(await shares.acquire('fetch', A, entrant('m2', 'a', 'y'))).toBe('over-share');
    expect(await shares.acquire('fetch', B, entrant('m3', 'b', 'z'))).toBe('held');
  });

  it("frees a crashed holder's slot once its until passes", async () => {
    const { shares, tick } = setup(1, 1);
    expect(await shares.acquire('fetch', A, entrant('m1', 'a', 'x', T0 + 1000))).toBe('held');
    expect(await shares.acquire('fetch', A, entrant('m2', 'a', 'y', T0 + 1000))).toBe('over-share');
    tick(1001);
    // The next record of the cluster finds the crashed holder dropped and wakes the older waiter first.
    expect(await shares.acquire('fetch', A, entrant('m3', 'a', 'z', T0 + 90_000))).toBe('over-share');
    const doc = await shares.read('fetch', 'c1');
    expect(doc.holders).toEqual([]);
    expect(doc.parked.map((p) => [p.eventId, p.woken !== undefined])).toEqual([
      ['ev-m2', true],
      ['ev-m3', false],
    ]);
  });

  it('retries a conflicting write: two acquirers racing for the last slot, one wins', async () => {
    const store = new MemoryStore();
    const { shares } = setup(1, 1, store);
    const got = await Promise.all([
      shares.acquire('fetch', A, entrant('m1', 'a', 'x')),
      shares.acquire('fetch', A, entrant('m2', 'a', 'y')),
    ]);
    expect(got.sort()).toEqual(['held', 'over-share']);
    const doc = await shares.read('fetch', 'c1');
    expect(doc.holders).toHaveLength(1);
    expect(doc.parked).toHaveLength(1);
  });

  it('wakes parked records oldest first, round-robin across namespaces, on release', async () => {
    const { shares, requeuer, tick } = setup(1, 1);
    expect(await shares.acquire('fetch', A, entrant('h', 'a', 'h'))).toBe('held');
    for (const [id, ns] of [
      ['a1', 'a'],
      ['a2', 'a'],
      ['a3', 'a'],
      ['b1', 'b'],
      ['b2', 'b'],
    ] as const) {
      tick(1);
      expect(await shares.acquire('fetch', ns === 'a' ? A : B, entrant(id, ns, id))).toBe('over-share');
    }
    const order: string[] = [];
    // Each woken copy comes back, holds its reserved slot, runs and releases.
    for (let i = 0; i < 5; i++) {
      await shares.release('fetch', A, i === 0 ? 'h' : (order.at(-1) as string));
      const woken = requeuer.sent.at(-1) ?? [];
      expect(woken).toHaveLength(1);
      const m = woken[0] as RequeuedMessage;
      order.push(m.messageId);
      const ns = m.messageId.startsWith('a') ? A : B;
      expect(await shares.acquire('fetch', ns, entrant(m.messageId, ns.namespace, m.messageId))).toBe('held');
      requeuer.sent = [];
    }
    // h (namespace a) was served last, so b goes first; each namespace's oldest first.
    expect(order).toEqual(['b1', 'a1', 'b2', 'a2', 'a3']);
  });

  it('round-robin picks one of each namespace when the room allows several', () => {
    const parked = ['a', 'a', 'b', 'a', 'c'].map((namespace, i) => ({
      key: `k${i}`,
      namespace,
      group: `g${i}`,
      eventId: `e${i}`,
    }));
    expect(chooseWakes([], parked, { clusterShare: 4, namespaceShare: 4 })).toEqual({
      chosen: [0, 2, 4, 1],
      turn: 'a',
    });
    // Starts after the namespace served last; a full namespace is passed over.
    expect(chooseWakes([], parked, { clusterShare: 2, namespaceShare: 4 }, 'a')).toEqual({ chosen: [2, 4], turn: 'c' });
    expect(
      chooseWakes([{ id: 'h', namespace: 'a', until: 1 }], parked, { clusterShare: 4, namespaceShare: 1 }),
    ).toEqual({ chosen: [2, 4], turn: 'c' });
    // A record whose object's older record is on its way back waits for it.
    const woken = parked.map((p, i) => (i === 0 ? { ...p, woken: 1 } : i === 1 ? { ...p, group: 'g0' } : p));
    expect(chooseWakes([], woken, { clusterShare: 4, namespaceShare: 4 })).toEqual({ chosen: [3, 2, 4], turn: 'c' });
  });

  it('deletes the parked objects once their copies are requeued', async () => {
    const { shares, store, requeuer } = setup(1, 1);
    await shares.acquire('fetch', A, entrant('m1', 'a', 'x'));
    await shares.acquire('fetch', A, entrant('m2', 'a', 'y'));
    expect(await parkedObjects(store)).toHaveLength(1);
    await shares.release('fetch', A, 'm1');
    expect(requeuer.sent).toEqual([[entrant('m2', 'a', 'y').message]]);
    expect(await parkedObjects(store)).toEqual([]);
    // The slot stays reserved for the copy: an arrival of another namespace does not take it.
    expect(await shares.acquire('fetch', B, entrant('m3', 'b', 'z'))).toBe('over-share');
    // The copy takes its reservation.
    expect(await shares.acquire('fetch', A, entrant('m2-copy', 'a', 'y-copy'))).toBe('over-share');
    const copy = { ...entrant('m2-copy', 'a', 'y'), eventId: 'ev-m2' };
    expect(await shares.acquire('fetch', A, copy)).toBe('held');
  });

  it('leaves the records parked when the queue refuses the copies, and wakes them at the next change', async () => {
    const { shares, store, requeuer } = setup(1, 1);
    await shares.acquire('fetch', A, entrant('m1', 'a', 'x'));
    await shares.acquire('fetch', A, entrant('m2', 'a', 'y'));
    requeuer.reject = true;
    await shares.release('fetch', A, 'm1');
    expect(await parkedObjects(store)).toHaveLength(1);
    const doc = await shares.read('fetch', 'c1');
    expect(doc.parked.map((p) => [p.eventId, p.woken])).toEqual([['ev-m2', undefined]]);
    requeuer.reject = false;
    await shares.release('fetch', A, 'm1');
    expect(requeuer.sent.flat().map((m) => m.messageId)).toEqual(['m2']);
    expect(await parkedObjects(store)).toEqual([]);
  });

  it("parks a record behind a parked record of its message group (an object's order)", async () => {
    const { shares } = setup(2, 2);
    await shares.acquire('fetch', A, entrant('m1', 'a', 'x'));
    await shares.acquire('fetch', A, entrant('m2', 'a', 'y'));
    expect(await shares.acquire('fetch', A, entrant('m3', 'a', 'x'))).toBe('over-share');
    await shares.release('fetch', A, 'm2');
    // m3 is woken into the free slot; a later event of its object waits behind the woken copy.
    const later = { ...entrant('m4', 'a', 'x'), message: { ...entrant('m4', 'a', 'x').message } };
    await shares.release('fetch', A, 'm1');
    expect(await shares.acquire('fetch', A, later)).toBe('over-share');
  });

  it('gives a parked record redelivered (its invocation crashed before the acknowledgment) its old place, and removes its object once it runs', async () => {
    const { shares, store, tick } = setup(1, 1);
    await shares.acquire('fetch', A, entrant('m1', 'a', 'x', T0 + 1000));
    await shares.acquire('fetch', A, entrant('m2', 'a', 'y'));
    tick(1);
    await shares.acquire('fetch', A, entrant('m3', 'a', 'z'));
    expect((await shares.read('fetch', 'c1')).parked.map((p) => p.eventId)).toEqual(['ev-m2', 'ev-m3']);
    // m2 comes back while m1 still holds: parked again in its place, one object.
    expect(await shares.acquire('fetch', A, entrant('m2', 'a', 'y'))).toBe('over-share');
    expect((await shares.read('fetch', 'c1')).parked.map((p) => p.eventId)).toEqual(['ev-m2', 'ev-m3']);
    expect(await parkedObjects(store)).toHaveLength(2);
    // m1 crashed; m2 comes back again after its slot expired (the wake of m2 was not seen yet).
    tick(1000);
    const doc = await shares.read('fetch', 'c1');
    expect(doc.holders.map((h) => h.id)).toEqual(['m1']);
    expect(await shares.acquire('fetch', A, entrant('m2', 'a', 'y'))).toBe('held');
    expect((await shares.read('fetch', 'c1')).parked.map((p) => p.eventId)).toEqual(['ev-m3']);
    expect(await parkedObjects(store)).toEqual([`state/shares/fetch/c1/parked/00${T0 + 1}-m3`]);
  });

  it('parks at most maxParked records of a cluster: a flood beyond it is turned away, nothing of it stored', async () => {
    const store = new MemoryStore();
    const shares = new StageShares({
      store,
      requeuer: new FakeRequeuer(),
      clusterShare: 1,
      namespaceShare: 1,
      maxParked: 2,
      now: () => T0,
    });
    expect(await shares.acquire('fetch', A, entrant('m1', 'a', 'x'))).toBe('held');
    expect(await shares.acquire('fetch', A, entrant('m2', 'a', 'y'))).toBe('over-share');
    expect(await shares.acquire('fetch', A, entrant('m3', 'a', 'z'))).toBe('over-share');
    expect(await shares.acquire('fetch', A, entrant('m4', 'a', 'w'))).toBe('turned-away');
    expect((await shares.read('fetch', 'c1')).parked.map((p) => p.eventId)).toEqual(['ev-m2', 'ev-m3']);
    expect(await parkedObjects(store)).toHaveLength(2);
    // Another cluster's records still park: the bound is per cluster.
    const C2 = { clusterId: 'c2', namespace: 'a' };
    expect(await shares.acquire('fetch', C2, entrant('n1', 'a', 'x'))).toBe('held');
    expect(await shares.acquire('fetch', C2, entrant('n2', 'a', 'y'))).toBe('over-share');
  });

  it('turns away an entrant that may not park (park: false) instead of parking it', async () => {
    const { shares, store } = setup(1, 1);
    expect(await shares.acquire('fetch', A, entrant('m1', 'a', 'x'))).toBe('held');
    expect(await shares.acquire('fetch', A, { ...entrant('m2', 'a', 'y'), park: false })).toBe('turned-away');
    expect((await shares.read('fetch', 'c1')).parked).toEqual([]);
    expect(await parkedObjects(store)).toEqual([]);
    // With room, it holds as any other.
    await shares.release('fetch', A, 'm1');
    expect(await shares.acquire('fetch', A, { ...entrant('m2', 'a', 'y'), park: false })).toBe('held');
  });

  it('stores one document per stage and cluster', () => {
    expect(sharesKey('fetch', 'c1')).toBe('state/shares/fetch/c1.json');
  });

  it('defaults: half the fleet-wide slots per cluster, half of that per namespace', () => {
    expect(defaultClusterShare(10, 1)).toBe(5);
    expect(defaultClusterShare(1, 1)).toBe(1);
    expect(defaultClusterShare(5, 10)).toBe(25);
    expect(defaultNamespaceShare(5)).toBe(3);
    expect(defaultNamespaceShare(1)).toBe(1);
  });
});
