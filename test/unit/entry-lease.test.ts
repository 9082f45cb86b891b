/**
 * The run lease through the SQS handlers of the fetch and deploy functions (issue 11 item 6b):
 * a new generation's fetch does not run while the same App's deploy runs kapp; it is acknowledged,
 * coalesced, and sent to the fetch queue as the one follow-up when the deploy ends. Faked at the
 * ports: the shared fake cluster, a fake kapp held until the test lets it go, one memory store
 * (the bucket both functions share) and sender.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { deployEvent, type KappEvent, objectEvent, serializeEvent } from '../../events/schema.js';
import { sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { leaseKey, parseLease, RunLeases } from '../../functions/lib/lease/index.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { appObject, appWorld, changeApp, NOW, REF, RUN, SUCCEEDED_BEFORE, vendirWrites } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('entry-lease-');
const MANIFEST_BODY = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
// A shared manifest's key is its bytes' digest (deploy refuses one that is not).
const MANIFEST_KEY = templateArtifactKey(sha256Hex(MANIFEST_BODY));

const record = (event: KappEvent, messageId = 'm1') => ({ Records: [{ messageId, body: serializeEvent(event) }] });

describe('the run lease across the stage functions', () => {
  it("a new generation's fetch waits for the deploy that runs kapp, then runs as its one follow-up", async () => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST_BODY));
    const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
    const sender = new MemoryEventSender();
    const deps = { pipeline: w.deps, sender, log: w.log, leases };
    const deployFn = makeSqsHandler('deploy', () => deps);
    const fetchFn = makeSqsHandler('fetch', () => deps);

    let started!: () => void;
    const kappStarted = new Promise<void>((r) => {
      started = r;
    });
    let finish!: () => void;
    const kappMayFinish = new Promise<void>((r) => {
      finish = r;
    });
    w.runner.on('kapp', async () => {
      started();
      await kappMayFinish;
      return { stdout: 'Succeeded' };
    });
    w.runner.on('vendir', vendirWrites());

    const deploying = deployFn(
      record(deployEvent({ object: REF, run: RUN, artifacts: { manifestKey: MANIFEST_KEY } }, { time: NOW })),
    );
    await kappStarted;
    // The App changes while kapp runs: the forwarder sends the new generation to the fetch queue.
    changeApp(w, 'generation');
    const changed = objectEvent({ ...REF, generation: 2, resourceVersion: '2' }, 'modified', { time: NOW });
    expect(await fetchFn(record(changed, 'm2'))).toEqual({ batchItemFailures: [] });
    expect(w.tools()).toEqual(['kapp']);
    expect(sender.sent).toEqual([]);
    expect(w.log.records.find((r) => r.obj.messageId === 'm2' && r.obj.outcome)?.obj.outcome).toBe('coalesced');

    finish();
    expect(await deploying).toEqual({ batchItemFailures: [] });
    // The deploy ended (its run is stale now) and queued the follow-up to the fetch function.
    expect(sender.sent.map((s) => [s.stage, s.event.data])).toEqual([['fetch', changed.data]]);
    const followUp = sender.sent[0]?.event as KappEvent;
    // A new id: the fetch queue saw the coalesced event's own id a moment ago (FIFO deduplication).
    expect(followUp.id).not.toBe(changed.id);
    expect(parseLease(await w.store.get(leaseKey(REF))).holder).toBe(`event:${followUp.id}`);

    expect(await fetchFn(record(followUp, 'm3'))).toEqual({ batchItemFailures: [] });
    expect(w.tools()).toEqual(['kapp', 'vendir']);
    expect(sender.sent.map((s) => s.stage)).toEqual(['fetch', 'template']);
    // The run of generation 2 holds the lease on its way to template.
    const lease = parseLease(await w.store.get(leaseKey(REF)));
    const next = sender.sent[1]?.event;
    expect(lease.holder).toBe(next && 'run' in next.data ? `run:${next.data.run.runId}` : '');
    expect(lease.pending).toBeUndefined();
  });

  it('a stage that fails does not hold its App: the lease is freed for the retry', async () => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
    const sender = new MemoryEventSender();
    // No manifest in the store: the deploy stage throws (an infrastructure failure, retried).
    const deployFn = makeSqsHandler('deploy', () => ({ pipeline: w.deps, sender, log: w.log, leases }));
    const res = await deployFn(
      record(deployEvent({ object: REF, run: RUN, artifacts: { manifestKey: MANIFEST_KEY } }, { time: NOW })),
    );
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm1' }] });
    expect(parseLease(await w.store.get(leaseKey(REF)))).toEqual({ seq: 2, last: `run:${RUN.runId}` });
  });
});
