/**
 * Counters of the run lease's object-store requests for the cost model (`./scenarios/cost.ts`):
 * they run the lease code itself (`functions/lib/lease/run-leases.ts`) on a counting memory
 * store, so the cost model charges what the code does rather than a figure written down by hand.
 * Benchmark-only: no function bundle imports this module.
 *
 * @module
 */
import { deployEvent, type KappEvent, objectEvent, templateEvent } from '../events/schema.js';
import { fetchArtifactKey, templateArtifactKey } from '../functions/lib/artifact/keys.js';
import { RunLeases } from '../functions/lib/lease/run-leases.js';
import { MemoryStore } from '../functions/lib/store/memory.js';

/** A memory store counting its lease reads and conditional writes, and the leases on it. */
function countingLeases(): { leases: RunLeases; counted: { gets: number; puts: number } } {
  const counted = { gets: 0, puts: 0 };
  const store = new MemoryStore();
  const counting = new Proxy(store, {
    get(target, prop) {
      if (prop === 'getVersioned') counted.gets++;
      if (prop === 'putIfMatch') counted.puts++;
      const value = Reflect.get(target, prop, target) as unknown;
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return { leases: new RunLeases({ store: counting }), counted };
}

const COUNTED_TIME = new Date(0);
const COUNTED_APP = {
  clusterId: 'c',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'n',
  name: 'a',
  uid: 'u',
  generation: 1,
  resourceVersion: '1',
} as const;
const COUNTED_FETCH_KEY = fetchArtifactKey('0'.repeat(64));
const COUNTED_MANIFEST_KEY = templateArtifactKey('0'.repeat(64));

/**
 * The lease's object-store requests of one idle App resync (a `resync` object event through
 * fetch, template and deploy, every stage `cached`, nothing pending), counted by running
 * {@link RunLeases} on a counting memory store: what the cost model (`bench/scenarios/cost.ts`)
 * charges an idle resync, so it follows this code rather than a figure written down by hand. The
 * run is optimistic (`OptimisticRun`): the fetch stage reads the lease once
 * (`RunLeases.start`), template makes no request, and deploy checks it once before its final
 * status write (`OptimisticRun.verify`); nothing is written.
 *
 * @returns reads (`getVersioned`: S3 GET) and conditional writes (`putIfMatch`: S3 PUT).
 * @throws Error when the run does not stay optimistic (a change to the lease code that would
 *   charge writes again fails the cost model instead of hiding in it).
 */
export async function idleRunLeaseRequests(): Promise<{ gets: number; puts: number }> {
  const { leases, counted } = countingLeases();
  const [time, object] = [COUNTED_TIME, COUNTED_APP];
  const fetched = await leases.start(objectEvent(object, 'resync', { time }));
  if (!fetched) throw new Error('idle run: the resync did not run optimistic');
  const run = { generation: 1, runId: 'run-1', startedAt: time.toISOString(), lease: fetched.seen };
  const templated = await leases.start(
    templateEvent({ object, run, artifacts: { fetchKey: COUNTED_FETCH_KEY } }, { time }),
  );
  const deployed = await leases.start(
    deployEvent({ object, run, artifacts: { manifestKey: COUNTED_MANIFEST_KEY } }, { time }),
  );
  if (!templated || !deployed) throw new Error('idle run: a hand-off did not stay optimistic');
  await deployed.verify();
  if (deployed.held || deployed.stopped) throw new Error('idle run: the final status write took the lease');
  return counted;
}

/**
 * The lease's object-store requests of one App run that works (an object event other than a
 * resync, e.g. the `modified` of a package upgrade, through fetch, template and deploy, each
 * handing off to the next, nothing pending), counted as {@link idleRunLeaseRequests}: the object
 * event's acquire and its hand-off to the run write, the run's own template and deploy acquires
 * and the template → deploy hand-off only read while the claim is fresh, the end writes. A
 * resync that turns out to need a tool pays about the same: its claim replaces the acquire.
 *
 * @returns reads (`getVersioned`: S3 GET) and conditional writes (`putIfMatch`: S3 PUT).
 */
export async function workingRunLeaseRequests(): Promise<{ gets: number; puts: number }> {
  const { leases, counted } = countingLeases();
  const [time, object] = [COUNTED_TIME, COUNTED_APP];
  const run = { generation: 1, runId: 'run-1', startedAt: time.toISOString() };
  const template = templateEvent({ object, run, artifacts: { fetchKey: COUNTED_FETCH_KEY } }, { time });
  const deploy = deployEvent({ object, run, artifacts: { manifestKey: COUNTED_MANIFEST_KEY } }, { time });
  const steps: [KappEvent, KappEvent | undefined][] = [
    [objectEvent(object, 'modified', { time }), template],
    [template, deploy],
    [deploy, undefined],
  ];
  for (const [event, next] of steps) {
    if (await leases.start(event)) throw new Error(`working run: ${event.type} ran optimistic`);
    const got = await leases.acquire(event);
    if (got.kind !== 'acquired') throw new Error(`working run: ${event.type} did not get the lease`);
    if (next) await got.lease.handOff(next);
    else await got.lease.end();
  }
  return counted;
}
