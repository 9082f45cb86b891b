/**
 * A hand-off that waited in its queue past the lease TTL (5 min;
 * a backed-up deploy queue, e.g. maxConcurrency 10 held by long continuations) finds the lease
 * taken over by a newer run and is coalesced into the pending follow-up, where it REPLACES a
 * newer object event (`coalesceEvents`: any stage event won over an object event). The
 * follow-up was then the stale hand-off, which its stage drops as stale: the newest generation
 * was not reconciled until some later event (a resync) arrived. Now the object event is kept,
 * except a resync of the hand-off's own run (the embedded runtime's rule, `coalesceEvents`).
 *
 * Since the fence (`RunLeases.acquire` `fenced`), a stage event whose run lost the lease never
 * waits in it at all: it is fenced, the follow-up stays as it was, and the stage handler sends a
 * restart through the lease instead (`test/unit/lease-fence.test.ts`).
 */
import { describe, expect, it } from 'vitest';
import { deployEvent, objectEvent } from '../../events/schema.js';
import { templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { leaseKey, parseLease, RunLeases } from '../../functions/lib/lease/index.js';
import { MemoryStore } from '../../functions/lib/store/index.js';
import { NOW, REF, RUN } from './support/app-world.js';

describe('stale hand-off vs pending object event', () => {
  it('a stale hand-off does not replace the newer generation waiting as the follow-up', async () => {
    const store = new MemoryStore();
    let now = Date.parse(NOW);
    const leases = new RunLeases({ store, now: () => new Date(now) });
    const e1 = objectEvent(REF, 'modified', { time: NOW });
    const a1 = await leases.acquire(e1);
    if (a1.kind !== 'acquired') throw new Error('e1');
    const d1 = deployEvent(
      { object: REF, run: RUN, artifacts: { manifestKey: templateArtifactKey('d'.repeat(64)) } },
      { time: NOW },
    );
    await a1.lease.handOff(d1); // run-1's deploy waits in the deploy queue…
    now += 6 * 60_000; // …past the lease TTL
    const e2 = objectEvent({ ...REF, generation: 2, resourceVersion: '2' }, 'modified', { time: NOW });
    const a2 = await leases.acquire(e2); // generation 2 takes the expired lease
    expect(a2.kind === 'acquired' && a2.tookOver).toBe(true);
    const e3 = objectEvent({ ...REF, generation: 3, resourceVersion: '3' }, 'modified', { time: NOW });
    expect((await leases.acquire(e3)).kind).toBe('coalesced'); // generation 3 waits as the follow-up
    expect((await leases.acquire(d1)).kind).toBe('fenced'); // run-1's stale deploy arrives
    const pending = parseLease(await store.get(leaseKey(REF))).pending;
    expect(pending?.id).toBe(e3.id);
  });

  it('the stale hand-off does not replace a resync of its own run either: it is fenced', async () => {
    const store = new MemoryStore();
    let now = Date.parse(NOW);
    const leases = new RunLeases({ store, now: () => new Date(now) });
    const a1 = await leases.acquire(objectEvent(REF, 'modified', { time: NOW }));
    if (a1.kind !== 'acquired') throw new Error('e1');
    const d1 = deployEvent(
      { object: REF, run: RUN, artifacts: { manifestKey: templateArtifactKey('d'.repeat(64)) } },
      { time: NOW },
    );
    await a1.lease.handOff(d1);
    now += 6 * 60_000;
    const other = objectEvent({ ...REF, generation: 2, resourceVersion: '2' }, 'modified', { time: NOW });
    expect((await leases.acquire(other)).kind).toBe('acquired');
    const resync = objectEvent({ ...REF, resourceVersion: '3' }, 'resync', { time: NOW });
    expect((await leases.acquire(resync)).kind).toBe('coalesced');
    expect((await leases.acquire(d1)).kind).toBe('fenced');
    expect(parseLease(await store.get(leaseKey(REF))).pending?.id).toBe(resync.id);
  });
});
