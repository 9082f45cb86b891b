/**
 * The optimistic run through the SQS handlers (issue 13 item 8): an idle resync writes nothing to
 * the run lease; a run that turns into real work claims it first; a real run that starts meanwhile
 * is never overtaken (the optimistic run stops and runs again from the start through the lease);
 * a retry after the run's own claim goes on as a retry of a lease-holding run. Faked at the ports:
 * the fake cluster, a fake kapp, one memory store (the bucket) and a memory sender.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  deployEvent,
  EVENT_TYPES,
  type KappEvent,
  objectEvent,
  type StageRun,
  serializeEvent,
} from '../../events/schema.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { fetchArtifactKey } from '../../functions/lib/artifact/keys.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { ABSENT_LEASE, leaseKey, parseLease, RunLeases } from '../../functions/lib/lease/index.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  type AppWorld,
  appObject,
  appWorld,
  FETCH_PART,
  MANIFEST,
  MANIFEST_KEY,
  NOW,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
  TEMPLATE_PART,
  vendirWrites,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('entry-lease-optimistic-');
const KEY = leaseKey(REF);
const LIVE = {
  metadata: {
    name: 'cm',
    namespace: REF.namespace,
    uid: 'cm-uid',
    resourceVersion: '5',
    managedFields: [{ manager: 'kapp', operation: 'Update', time: '2024-12-31T00:00:00Z' }],
  },
  data: { a: '1' },
};
const DRIFTED = { ...LIVE, metadata: { ...LIVE.metadata, resourceVersion: '7' }, data: { a: 'hand' } };
const CM_LIST = `/api/v1/namespaces/${REF.namespace}/configmaps`;

const record = (event: KappEvent, messageId = 'm1', receiveCount = 1) => ({
  Records: [{ messageId, body: serializeEvent(event), attributes: { ApproximateReceiveCount: String(receiveCount) } }],
});
const deployOf = (run: StageRun) =>
  deployEvent(
    {
      object: REF,
      run,
      artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey: MANIFEST_KEY },
      fetchStatus: FETCH_PART,
      templateStatus: TEMPLATE_PART,
    },
    { time: NOW },
  );
/** The deploy event of an optimistic run that started from a lease at version `seen`. */
const optimisticDeploy = (seen: string) => deployOf({ ...RUN, lease: seen });
const change = (reason: 'added' | 'resync', rv: string) =>
  objectEvent({ ...REF, resourceVersion: rv }, reason, { time: NOW });

/**
 * An App deployed once (its deploy record kept, its finalizer on), its live ConfigMap served by
 * `live()`, and the deploy function with the run lease on the world's store.
 */
async function deployedWorld(drifted = false, failSends = 0) {
  let live: unknown[] = [LIVE];
  const w: AppWorld = appWorld({
    app: appObject({ status: SUCCEEDED_BEFORE }),
    tmpRoot: path.join(tempDir(), 'scratch'),
    extra: {
      keyring: new DerivedKeyring(Buffer.alloc(32, 7)),
      appReader: () => ({
        send: async (req) =>
          req.path === '/api/v1'
            ? { statusCode: 200, body: { resources: [{ name: 'configmaps', kind: 'ConfigMap', namespaced: true }] } }
            : req.path === CM_LIST
              ? { statusCode: 200, body: { items: live } }
              : { statusCode: 404, body: {} },
      }),
    },
  });
  const leaseSeen: { holder?: string }[] = [];
  w.runner.on('kapp', async (req) => {
    leaseSeen.push(parseLease(await w.store.get(KEY)));
    const file = req.args[req.args.indexOf('--app-metadata-file-output') + 1] as string;
    await writeFile(
      file,
      `labelKey: kapp.k14s.io/app\nlabelValue: "123"\nlastChange: {namespaces: [${REF.namespace}]}\nusedGKs: [{Group: "", Kind: ConfigMap}]\n`,
    );
    return { stdout: 'Succeeded' };
  });
  await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
  // The first deploy (no lease: the stage alone) keeps the record the resyncs reuse.
  await dispatchEvent(deployOf(RUN), w.deps);
  expect(w.tools()).toEqual(['kapp']);
  leaseSeen.length = 0;
  // A ConfigMap edited by hand since: the next deploy runs kapp.
  if (drifted) live = [DRIFTED];
  const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
  let failing = failSends;
  const sender = new MemoryEventSender(() => (failing-- > 0 ? new Error('SQS unavailable') : undefined));
  const deps = { pipeline: w.deps, sender, log: w.log, leases };
  return {
    w,
    leases,
    sender,
    /** The lease as the kapp runs saw it. */
    leaseSeen,
    deployFn: makeSqsHandler('deploy', () => deps),
    fetchFn: makeSqsHandler('fetch', () => deps),
    /** The record's outcome line (not a stage's). */
    outcome: (messageId: string) =>
      w.log.records.find((r) => r.obj.messageId === messageId && r.obj.outcome && r.msg !== 'stage run')?.obj,
  };
}

/**
 * Makes the stored status say more than the idle run's final status (a `usefulErrorMessage` left
 * over), so that status is a real write: an idle run that changes nothing writes none.
 */
function withLeftover(w: AppWorld): void {
  const app = w.cluster.get('App', REF.namespace, REF.name);
  if (!app) throw new Error('no App');
  app.status = { ...(app.status as object), usefulErrorMessage: 'left over' };
}

describe('the optimistic run (no lease while it only reads)', () => {
  it('an idle deploy that changed nothing writes no status and nothing to the lease, not even a read', async () => {
    const t = await deployedWorld();
    const before = t.w.statuses().length;
    const reads: string[] = [];
    const get = t.w.store.get.bind(t.w.store);
    t.w.store.get = async (key) => {
      reads.push(key);
      return await get(key);
    };
    expect(await t.deployFn(record(optimisticDeploy(ABSENT_LEASE)))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['kapp']);
    expect(t.w.outcomes().at(-1)).toEqual(['deploy', 'cached']);
    expect(t.w.statuses()).toHaveLength(before);
    expect(reads).not.toContain(KEY); // no status write, so no lease check before it
    expect(await t.w.store.get(KEY)).toBeUndefined();
    expect(t.sender.sent).toEqual([]);
  });

  it('an idle deploy whose status says something new writes nothing to the lease and ends with its status, as a run holding it', async () => {
    const t = await deployedWorld();
    withLeftover(t.w);
    const before = t.w.statuses().length;
    expect(await t.deployFn(record(optimisticDeploy(ABSENT_LEASE)))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['kapp']);
    expect(t.w.outcomes().at(-1)).toEqual(['deploy', 'cached']);
    expect(t.w.statuses()).toHaveLength(before + 1);
    expect((t.w.statuses().at(-1) as AppStatus).conditions?.[0]?.type).toBe('ReconcileSucceeded');
    // Not a single lease write: the lease object was never made.
    expect(await t.w.store.get(KEY)).toBeUndefined();
    expect(t.sender.sent).toEqual([]);
  });

  it('a resync that is not due (a no-op) writes nothing to the lease either', async () => {
    const t = await deployedWorld();
    const before = t.w.statuses().length;
    expect(await t.fetchFn(record(change('resync', '2'), 'r1'))).toEqual({ batchItemFailures: [] });
    expect(t.w.outcomes().at(-1)).toEqual(['reconcile', 'noop']);
    expect(t.w.statuses()).toHaveLength(before);
    expect(await t.w.store.get(KEY)).toBeUndefined();
  });

  it('a resync whose lease is held runs as before: coalesced into the holder’s follow-up', async () => {
    const t = await deployedWorld();
    const held = await t.leases.acquire(change('added', '2'));
    expect(held.kind).toBe('acquired');
    const resync = change('resync', '3');
    expect(await t.fetchFn(record(resync, 'r1'))).toEqual({ batchItemFailures: [] });
    expect(t.outcome('r1')?.outcome).toBe('coalesced');
    expect(parseLease(await t.w.store.get(KEY)).pending?.id).toBe(resync.id);
  });

  it('drift turns it into real work: it claims the lease before kapp, and frees it after', async () => {
    const t = await deployedWorld(true);
    expect(await t.deployFn(record(optimisticDeploy(ABSENT_LEASE)))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['kapp', 'kapp']);
    expect(t.leaseSeen.map((l) => l.holder)).toEqual([`run:${RUN.runId}`]);
    expect(parseLease(await t.w.store.get(KEY))).toMatchObject({ last: `run:${RUN.runId}` });
    expect(parseLease(await t.w.store.get(KEY)).holder).toBeUndefined();
  });

  it('drift while a real run holds the lease: no kapp; the App runs again after that run', async () => {
    const t = await deployedWorld(true);
    const seen = (await t.leases.read(KEY)).version;
    const real = await t.leases.acquire(change('added', '2'));
    if (real.kind !== 'acquired') throw new Error('the real run did not get the lease');
    const statuses = t.w.statuses().length;
    expect(await t.deployFn(record(optimisticDeploy(seen), 'o1'))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['kapp']);
    expect(t.w.statuses()).toHaveLength(statuses);
    expect(t.outcome('o1')?.outcome).toBe('coalesced');
    // A resync from the start waits as the holder's follow-up; nothing was sent.
    const pending = parseLease(await t.w.store.get(KEY)).pending;
    expect(pending?.type).toBe(EVENT_TYPES.object);
    expect(pending?.data).toMatchObject({ reason: 'resync', uid: REF.uid });
    expect(t.sender.sent).toEqual([]);
    // When the real run ends, it sends that follow-up.
    expect((await real.lease.end())?.type).toBe(EVENT_TYPES.object);
  });

  it('a real run that started meanwhile wins the status: the idle run does not write it and restarts', async () => {
    const t = await deployedWorld();
    const seen = (await t.leases.read(KEY)).version;
    // A real run takes the lease and ends between the idle run's start and its deploy.
    const real = await t.leases.acquire(change('added', '2'));
    if (real.kind !== 'acquired') throw new Error('the real run did not get the lease');
    await real.lease.end();
    withLeftover(t.w);
    const statuses = t.w.statuses().length;
    expect(await t.deployFn(record(optimisticDeploy(seen), 'o1'))).toEqual({ batchItemFailures: [] });
    expect(t.w.statuses()).toHaveLength(statuses);
    expect(t.w.tools()).toEqual(['kapp']);
    // The lease was free: the restart is sent to the fetch function with the lease reserved for it.
    expect(t.sender.sent.map((s) => [s.stage, s.event.type, (s.event.data as { reason?: string }).reason])).toEqual([
      ['fetch', EVENT_TYPES.object, 'resync'],
    ]);
    const restart = t.sender.sent[0]?.event as KappEvent;
    expect(parseLease(await t.w.store.get(KEY)).holder).toBe(`event:${restart.id}`);
    // The restart takes the lease as any object event (reserved for it), and is not due: no run.
    expect(await t.fetchFn(record(restart, 'r2'))).toEqual({ batchItemFailures: [] });
    expect(t.outcome('r2')?.outcome).toBe('done');
    expect(t.w.outcomes().at(-1)).toEqual(['reconcile', 'noop']);
    expect(parseLease(await t.w.store.get(KEY)).holder).toBeUndefined();
  });

  it('a restart that cannot be queued fails the record; its retry stops again and queues the same restart', async () => {
    const t = await deployedWorld(false, 1);
    const seen = (await t.leases.read(KEY)).version;
    const real = await t.leases.acquire(change('added', '2'));
    if (real.kind !== 'acquired') throw new Error('the real run did not get the lease');
    await real.lease.end();
    withLeftover(t.w);
    const event = optimisticDeploy(seen);
    expect(await t.deployFn(record(event, 'o1', 1))).toEqual({ batchItemFailures: [{ itemIdentifier: 'o1' }] });
    expect(t.sender.sent).toEqual([]);
    expect(await t.deployFn(record(event, 'o1', 2))).toEqual({ batchItemFailures: [] });
    const restart = t.sender.sent[0]?.event;
    expect(restart?.type).toBe(EVENT_TYPES.object);
    expect(parseLease(await t.w.store.get(KEY)).holder).toBe(`event:${restart?.id}`);
    expect(t.w.tools()).toEqual(['kapp']);
  });

  it('a real run that takes the lease after the check and writes the App first: the 409 stops the idle write', async () => {
    const t = await deployedWorld();
    withLeftover(t.w);
    const seen = (await t.leases.read(KEY)).version;
    const statuses = t.w.statuses().length;
    const write = t.w.cluster.updateStatus.bind(t.w.cluster);
    let raced = false;
    t.w.cluster.updateStatus = async (...args) => {
      if (!raced) {
        // Between the idle run's lease check and its status write, a real run starts and writes the App.
        raced = true;
        const real = await t.leases.acquire(change('added', '2'));
        expect(real.kind).toBe('acquired');
        const app = t.w.cluster.get('App', REF.namespace, REF.name);
        if (!app) throw new Error('no App');
        app.metadata.resourceVersion = String(Number(app.metadata.resourceVersion) + 1);
        app.status = { ...(app.status as object), friendlyDescription: 'written by the real run' };
      }
      return await write(...args);
    };
    expect(await t.deployFn(record(optimisticDeploy(seen), 'o1'))).toEqual({ batchItemFailures: [] });
    expect(t.outcome('o1')?.outcome).toBe('coalesced');
    // The idle write was refused and not planned again: the real run's status stays.
    expect(t.w.statuses()).toHaveLength(statuses);
    expect((t.w.app()?.status as AppStatus | undefined)?.friendlyDescription).toBe('written by the real run');
    // The restart waits as the real run's follow-up.
    expect(parseLease(await t.w.store.get(KEY)).pending?.data).toMatchObject({ reason: 'resync' });
    expect(t.sender.sent).toEqual([]);
  });

  it('a retry after its own claim failed goes on as a retry of the run holding the lease', async () => {
    const t = await deployedWorld(true);
    let fail = true;
    t.w.runner.on('kapp', async () => {
      if (fail) {
        fail = false;
        throw new Error('kapp could not start');
      }
      return { stdout: 'Succeeded' };
    });
    const event = optimisticDeploy(ABSENT_LEASE);
    expect(await t.deployFn(record(event, 'a1', 1))).toEqual({ batchItemFailures: [{ itemIdentifier: 'a1' }] });
    // The failed stage freed the lease it claimed.
    expect(parseLease(await t.w.store.get(KEY))).toMatchObject({ last: `run:${RUN.runId}` });
    expect(await t.deployFn(record(event, 'a1', 2))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['kapp', 'kapp', 'kapp']);
    expect(t.w.outcomes().at(-1)).toEqual(['deploy', 'succeeded']);
    expect(t.sender.sent).toEqual([]);
  });
});

describe('the optimistic run from the fetch function', () => {
  /** An App due for its resync (its last run wrote no times), fetching `fetch`, and the fetch function with leases. */
  function fetchWorld(fetch: unknown[]) {
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE, spec: { fetch } }),
      tmpRoot: path.join(tempDir(), 'scratch'),
    });
    const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
    const sender = new MemoryEventSender();
    const fetchFn = makeSqsHandler('fetch', () => ({ pipeline: w.deps, sender, log: w.log, leases }));
    return { w, leases, sender, fetchFn };
  }

  it('a cached fetch hands on without the lease: the template event carries the version it started from', async () => {
    const t = fetchWorld([{ inline: { paths: { 'config.yml': 'a: 1\n' } } }]);
    t.w.runner.on('vendir', vendirWrites());
    // A first fetch (no lease: the stage alone) keeps the pinned fetch's record.
    await dispatchEvent(change('added', '1'), t.w.deps);
    expect(t.w.tools()).toEqual(['vendir']);
    expect(await t.fetchFn(record(change('resync', '2')))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['vendir']);
    const next = t.sender.sent[0]?.event;
    expect(next?.type).toBe(EVENT_TYPES.template);
    expect(next && next.type === EVENT_TYPES.template ? next.data.run.lease : undefined).toBe(ABSENT_LEASE);
    expect(await t.w.store.get(KEY)).toBeUndefined();
  });

  it('a fetch that runs vendir claims the lease first and hands it on as a run holding it', async () => {
    const t = fetchWorld([{ git: { url: 'https://git.example/repo', ref: 'origin/main' } }]);
    const resync = change('resync', '2');
    let during: string | undefined;
    t.w.runner.on(
      'vendir',
      vendirWrites('lock: vendir\n', () => {
        void t.w.store.get(KEY).then((b) => {
          during = parseLease(b).holder;
        });
      }),
    );
    expect(await t.fetchFn(record(resync))).toEqual({ batchItemFailures: [] });
    expect(t.w.tools()).toEqual(['vendir']);
    expect(during).toBe(`event:${resync.id}`);
    const next = t.sender.sent[0]?.event;
    if (next?.type !== EVENT_TYPES.template) throw new Error('no template event');
    // A run holding the lease: its next stage takes it as before (no version carried).
    expect(next.data.run.lease).toBeUndefined();
    expect(parseLease(await t.w.store.get(KEY)).holder).toBe(`run:${next.data.run.runId}`);
  });
});
