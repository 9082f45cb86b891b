/**
 * The run lease of an App (issue 11 item 6b) at its port: a memory object store with
 * compare-and-swap, a fake clock. One run holds the lease across its stages, events meanwhile
 * coalesce into one follow-up (the embedded runtime's rule), the follow-up gets the lease when
 * the run ends, a crashed holder's lease expires.
 */
import { describe, expect, it } from 'vitest';
import { idleRunLeaseRequests } from '../../bench/lease-counters.js';
import { deployEvent, type KappEvent, objectEvent, type Reason, templateEvent } from '../../events/schema.js';
import { templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import {
  DEFAULT_LEASE_TTL_MS,
  holderOf,
  leaseKey,
  leaseSubject,
  parseLease,
  RunLeases,
} from '../../functions/lib/lease/index.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { NOW, PKGR_REF, REF, RUN } from './support/app-world.js';

const fetchKey = `artifacts/fetch/sha256/${'f'.repeat(64)}.tgz`;
const manifestKey = templateArtifactKey('a'.repeat(64));
const KEY = leaseKey(REF);

function setup() {
  const store = new MemoryStore();
  const clock = { t: Date.parse(NOW) };
  const leases = new RunLeases({ store, now: () => new Date(clock.t) });
  const lease = async () => parseLease(await store.get(KEY));
  return { store, clock, leases, lease };
}

const change = (reason: Reason, resourceVersion: string, generation = 1) =>
  objectEvent({ ...REF, generation, resourceVersion }, reason, { time: NOW });
const template = (runId = RUN.runId) =>
  templateEvent({ object: REF, run: { ...RUN, runId }, artifacts: { fetchKey } }, { time: NOW });
const deploy = (runId = RUN.runId) =>
  deployEvent({ object: REF, run: { ...RUN, runId }, artifacts: { manifestKey } }, { time: NOW });

async function acquired(leases: RunLeases, event: KappEvent) {
  const got = await leases.acquire(event);
  if (got.kind !== 'acquired') throw new Error(`expected the lease, ${got.holder} holds it`);
  return got;
}

describe('the run lease', () => {
  it('is per App, in state/leases, and only App events take it', () => {
    expect(KEY).toBe('state/leases/c1/ns/app.json');
    expect(leaseSubject(change('added', '1'))).toBeDefined();
    expect(leaseSubject(template())).toBeDefined();
    expect(leaseSubject(objectEvent(PKGR_REF, 'added', { time: NOW }))).toBeUndefined();
    expect(holderOf(template())).toBe('run:run-1');
    expect(holderOf(deploy())).toBe('run:run-1');
  });

  it('a run holds it across its stages; changes meanwhile coalesce into one follow-up, run when it ends', async () => {
    const { leases, lease } = setup();
    const first = change('added', '1');
    const fetch = await acquired(leases, first);
    expect(fetch.event).toEqual(first);
    expect(fetch.tookOver).toBe(false);

    // fetch hands off to template: the lease goes with the run.
    await fetch.lease.handOff(template());
    expect((await lease()).holder).toBe('run:run-1');
    // A new generation's object event while the run goes on: not run, coalesced.
    expect(await leases.acquire(change('modified', '2', 2))).toEqual({ kind: 'coalesced', holder: 'run:run-1' });
    const tmpl = await acquired(leases, template());
    await tmpl.lease.handOff(deploy());
    expect(await leases.acquire(change('ref-changed', '3', 2))).toMatchObject({ kind: 'coalesced' });
    expect(await leases.acquire(change('resync', '4', 2))).toMatchObject({ kind: 'coalesced' });
    const dep = await acquired(leases, deploy());
    // One follow-up: the newest object event, with the strongest reason of those coalesced.
    const pending = (await lease()).pending;
    expect(pending?.type).toBe('dev.kapp-lambda.object.v1');
    expect(pending?.data).toMatchObject({ resourceVersion: '4', generation: 2, reason: 'ref-changed' });

    // The run ends: the follow-up is returned to be sent, and the lease is reserved for it.
    const followUp = await dep.lease.end();
    // Under a new id: SQS FIFO would drop a message whose id it saw in the last 5 minutes.
    expect(followUp).toEqual({ ...pending, id: followUp?.id });
    expect(followUp?.id).not.toBe(pending?.id);
    expect(followUp?.id).toMatch(/^[0-9a-f]{32}$/);
    expect((await lease()).holder).toBe(`event:${followUp?.id}`);
    expect(await leases.acquire(change('resync', '5', 2))).toMatchObject({ kind: 'coalesced' });
    const next = await acquired(leases, followUp as KappEvent);
    // It runs the follow-up merged with what came while it was on its way (the stage re-reads the App).
    expect(next.event.data).toMatchObject({ generation: 2, reason: 'ref-changed' });
    expect((await lease()).pending).toBeUndefined();
    expect(await next.lease.end()).toBeUndefined();
    // Free again: every write counts one more (`seq`), the run that freed it is `last`.
    expect(await lease()).toEqual({ seq: expect.any(Number), last: `event:${followUp?.id}` });
  });

  it('is free after a run without follow-up; the deploy continuation is the same run', async () => {
    const { leases, lease } = setup();
    const dep = await acquired(leases, deploy());
    await dep.lease.handOff(deploy()); // the continuation
    expect(await leases.acquire(change('modified', '2', 2))).toMatchObject({ kind: 'coalesced' });
    const cont = await acquired(leases, deploy());
    expect((await cont.lease.end())?.data).toMatchObject({ resourceVersion: '2' });
    // Reserved for that follow-up: another run's hand-off is fenced (the lease moved past its run)
    // and leaves the follow-up as it is.
    const reserved = await lease();
    expect(await leases.acquire(template('run-2'))).toEqual({ kind: 'fenced', holder: reserved.holder });
    expect(await lease()).toEqual(reserved);
  });

  it("a crashed holder's lease expires: its own retry takes it back until another event took it over", async () => {
    const { leases, clock, lease } = setup();
    const run1 = await acquired(leases, template());
    // Another run's stage event while run-1 holds it: that run lost the lease, it is fenced.
    expect(await leases.acquire(template('run-2'))).toEqual({ kind: 'fenced', holder: 'run:run-1' });
    // The holder never renews nor ends (crashed).
    clock.t += DEFAULT_LEASE_TTL_MS - 1;
    expect(await leases.acquire(change('modified', '9'))).toMatchObject({ kind: 'coalesced' });
    expect(await run1.lease.renew()).toBe(true);
    clock.t += DEFAULT_LEASE_TTL_MS;
    // Expired: another run's stage event still does not take it (its run never had it since).
    expect(await leases.acquire(deploy('run-3'))).toEqual({ kind: 'fenced', holder: 'run:run-1' });
    // The crashed stage's own retry takes it back, nobody having come since; the follow-up waits.
    const retried = await acquired(leases, template());
    expect(retried.tookOver).toBe(false);
    expect((await lease()).pending?.data).toMatchObject({ resourceVersion: '9' });
    // It crashes again; an object event taking over the expired lease absorbs the follow-up: it
    // runs from the latest object.
    clock.t += DEFAULT_LEASE_TTL_MS + 1;
    const taken = await acquired(leases, change('modified', '10'));
    expect(taken.tookOver).toBe(true);
    expect(taken.event.data).toMatchObject({ resourceVersion: '10', reason: 'modified' });
    expect((await lease()).pending).toBeUndefined();
    // The crashed holder comes back: the lease is not its any more, and its retry is fenced.
    expect(await run1.lease.renew()).toBe(false);
    expect(await run1.lease.end()).toBeUndefined();
    const before = await lease();
    expect(await leases.acquire(template())).toEqual({ kind: 'fenced', holder: holderOf(taken.event) });
    // Freed by the run that took it: the retry is fenced still (`last` is another run's).
    expect(await taken.lease.end()).toBeUndefined();
    expect(await leases.acquire(deploy())).toEqual({ kind: 'fenced', last: holderOf(taken.event) });
    expect((await lease()).seq).toBe((before.seq ?? 0) + 1);
  });

  it('a stage that ended its run (it failed) takes the free lease back on its retry, unless another run came since', async () => {
    const { leases, lease } = setup();
    const run1 = await acquired(leases, deploy());
    expect(await run1.lease.end()).toBeUndefined();
    expect(await lease()).toEqual({ seq: 2, last: 'run:run-1' });
    const retry = await acquired(leases, deploy());
    expect(retry.tookOver).toBe(false);
    await retry.lease.end();
    // A resync runs in between: the next retry of run-1 is fenced.
    const other = await acquired(leases, change('resync', '2'));
    await other.lease.end();
    expect(await leases.acquire(deploy())).toEqual({ kind: 'fenced', last: holderOf(other.event) });
  });

  it('of many events at once exactly one runs; the others become the one follow-up', async () => {
    const { leases, lease } = setup();
    const events = Array.from({ length: 8 }, (_, i) => change('resync', String(i + 1)));
    const results = await Promise.all(events.map((e) => leases.acquire(e)));
    const ran = results.flatMap((r) => (r.kind === 'acquired' ? [r.event.id] : []));
    expect(ran).toHaveLength(1);
    expect(results.filter((r) => r.kind === 'coalesced')).toHaveLength(7);
    const pending = (await lease()).pending;
    expect(events.map((e) => e.id).filter((id) => id !== ran[0])).toContain(pending?.id);
    expect((await lease()).holder).toBe(`event:${ran[0]}`);
  });

  it.each([
    ['not JSON', 'oops'],
    ['not an object', '[1]'],
    ['an expiry that is not a time', '{"holder":"run:x","expiresAt":"later"}'],
    ['an invalid pending event (dropped)', '{"pending":{"type":"x"}}'],
  ])('a stored record that is %s reads as free', async (_name, body) => {
    const { store, leases } = setup();
    await store.put(KEY, body);
    expect(parseLease(Buffer.from(body))).toEqual({});
    expect(await leases.acquire(change('added', '1'))).toMatchObject({ kind: 'acquired', tookOver: false });
  });

  it('an idle resync reads the lease twice and writes nothing (it runs optimistic: fetch reads it, deploy checks it)', async () => {
    expect(await idleRunLeaseRequests()).toEqual({ gets: 2, puts: 0 });
  });

  it("a fresh claim is not rewritten by the run's own acquire and hand-off; a claim past half its TTL is", async () => {
    const { store, clock, leases, lease } = setup();
    const fetch = await acquired(leases, change('resync', '1'));
    await fetch.lease.handOff(template());
    const handedOff = await store.getVersioned(KEY);
    clock.t += DEFAULT_LEASE_TTL_MS / 2 - 1;
    const tpl = await acquired(leases, template());
    await tpl.lease.handOff(deploy());
    // nothing written: the claim still has half its TTL
    expect((await store.getVersioned(KEY))?.etag).toBe(handedOff?.etag);
    clock.t += 2;
    const dep = await acquired(leases, deploy());
    expect((await lease()).expiresAt).toBe(new Date(clock.t + DEFAULT_LEASE_TTL_MS).toISOString());
    clock.t += DEFAULT_LEASE_TTL_MS / 2 + 1;
    await dep.lease.handOff(deploy());
    expect((await lease()).expiresAt).toBe(new Date(clock.t + DEFAULT_LEASE_TTL_MS).toISOString());
  });

  it('with the writes skipped, a change during the run still waits for it and the run still ends with its follow-up', async () => {
    const { leases, lease } = setup();
    const fetch = await acquired(leases, change('resync', '1'));
    await fetch.lease.handOff(template());
    const tpl = await acquired(leases, template());
    // a new generation arrives while the template stage runs: coalesced, not run
    const newer = change('modified', '2', 2);
    expect(await leases.acquire(newer)).toEqual({ kind: 'coalesced', holder: holderOf(template()) });
    // the pending follow-up is kept through the skipped hand-off and the deploy's acquire
    await tpl.lease.handOff(deploy());
    const dep = await acquired(leases, deploy());
    expect((await lease()).pending?.id).toBe(newer.id);
    const followUp = await dep.lease.end();
    expect(followUp?.data).toEqual(newer.data);
    expect((await lease()).holder).toBe(holderOf(followUp!));
  });
});
