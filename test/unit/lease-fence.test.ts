/**
 * The run lease's fence through the SQS handlers of the fetch, template and deploy functions.
 *
 * The defect: a deploy holding its App's lease crashes in kapp (the function timed out; nothing
 * ends the lease). SQS redelivers it only after the queue's visibility timeout, longer than the
 * lease's TTL (5 min), so another run of the same generation (a changed Secret: `ref-changed`)
 * took the expired lease meanwhile and deployed the newer render. The retry then took the lease
 * again (free, or as the newer run's follow-up) and deployed the OLDER render over it.
 *
 * Now the retry is fenced (`RunLeases.acquire` `fenced`): no tool, no artifact, finalizer or status
 * write; acknowledged, and a forcing object event runs the App again from the start, so it ends on
 * the newest render. A retry whose lease nobody took since goes on as the same run: before the
 * lease expired, and after (decided: the crashed run is still the App's last run, and nothing
 * newer can be overwritten; a follow-up that waited in the lease runs after it).
 *
 * Faked at the ports: the fake cluster, fake vendir and ytt (the source and render switched by the test) and
 * kapp (a "crash" hangs forever, as the invocation that died in it), one memory store (the
 * bucket), a memory sender (the queues, drained by hand) and a fake clock for the lease.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { EVENT_TYPES, type KappEvent, objectEvent, serializeEvent } from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import {
  DEFAULT_LEASE_TTL_MS,
  LEASE_PREFIX,
  leaseKey,
  parseLease,
  RunLeases,
} from '../../functions/lib/lease/index.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { appObject, appWorld, NOW, REF, SUCCEEDED_BEFORE } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('lease-fence-');
const KEY = leaseKey(REF);
/** The render before and after the referenced Secret changed (the App's generation stays 1). */
const OLDER = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  v: older\n';
const NEWER = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  v: newer\n';

/** A `ref-changed` object event (the forwarder's, for a changed Secret) under its own id. */
const secretChanged = (rv: string) => objectEvent({ ...REF, resourceVersion: rv }, 'ref-changed', { time: NOW });

function fenceWorld() {
  const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
  const clock = { t: Date.parse(NOW) };
  const leases = new RunLeases({ store: w.store, now: () => new Date(clock.t) });
  const sender = new MemoryEventSender();
  const deps = { pipeline: w.deps, sender, log: w.log, leases };
  const fns = {
    fetch: makeSqsHandler('fetch', () => deps),
    template: makeSqsHandler('template', () => deps),
    deploy: makeSqsHandler('deploy', () => deps),
  } as Record<PipelineStage, ReturnType<typeof makeSqsHandler>>;
  const state = { render: OLDER, crashNext: false };
  /** kapp's stdin (the render) of every deploy, in order. */
  const deployed: string[] = [];
  // The fetched source follows the render (so neither the fetch nor the template is a cached one).
  w.runner.on('vendir', async (req) => {
    await writeFile(path.join(req.cwd ?? '', 'config.yml'), state.render);
    return { stdout: 'lock: vendir\n', exitCode: 0 };
  });
  w.runner.on('ytt', async () => ({ stdout: state.render, exitCode: 0 }));
  w.runner.on('kapp', async (req) => {
    deployed.push(Buffer.from(req.stdin ?? '').toString('utf8'));
    if (state.crashNext) {
      state.crashNext = false;
      await new Promise<never>(() => {});
    }
    return { stdout: 'Succeeded', exitCode: 0 };
  });
  let messages = 0;
  /** Delivers `event` to its function as one SQS record (`receiveCount`: 2 for a retry). */
  const deliver = (stage: PipelineStage, event: KappEvent, receiveCount = 1) =>
    fns[stage]({
      Records: [
        {
          messageId: `m${++messages}`,
          body: serializeEvent(event),
          attributes: { ApproximateReceiveCount: String(receiveCount) },
        },
      ],
    });
  /** The oldest queued event, which must be for `stage`. */
  const take = (stage: PipelineStage): KappEvent => {
    const next = sender.sent.shift();
    expect(next?.stage).toBe(stage);
    return next?.event as KappEvent;
  };
  /** Delivers the queued events, oldest first, until none is left. */
  const drain = async () => {
    for (let next = sender.sent.shift(); next; next = sender.sent.shift()) {
      expect(await deliver(next.stage, next.event)).toEqual({ batchItemFailures: [] });
    }
  };
  /** Runs `start` through fetch and template; returns its deploy event (queued, not delivered). */
  const upToDeploy = async (start: KappEvent, render: string): Promise<KappEvent> => {
    state.render = render;
    expect(await deliver('fetch', start)).toEqual({ batchItemFailures: [] });
    expect(await deliver('template', take('template'))).toEqual({ batchItemFailures: [] });
    return take('deploy');
  };
  /** Delivers `deploy`, whose kapp crashes: the invocation never returns (nor ends the lease). */
  const crash = async (deploy: KappEvent) => {
    const before = deployed.length;
    state.crashNext = true;
    void deliver('deploy', deploy);
    await vi.waitFor(() => expect(deployed).toHaveLength(before + 1));
  };
  return {
    w,
    clock,
    /** What ytt renders from now on. */
    render: (r: string) => {
      state.render = r;
    },
    sender,
    deployed,
    deliver,
    take,
    drain,
    upToDeploy,
    crash,
    lease: async () => parseLease(await w.store.get(KEY)),
    /** Every stored object but the leases, with its body. */
    artifacts: async () => {
      const keys = (await w.store.list('')).filter((k) => !k.startsWith(LEASE_PREFIX));
      return await Promise.all(keys.map(async (k) => [k, (await w.store.get(k))?.toString('base64')]));
    },
    outcome: (type: string) =>
      w.log.records.filter((r) => r.obj.outcome && r.msg !== 'stage run' && r.obj.type === type).at(-1)?.obj.outcome,
    lastCondition: () => w.app()?.status?.conditions?.map((c) => c.type),
  };
}

const runOf = (e: KappEvent) => ('run' in e.data ? e.data.run.runId : '');

describe('the run lease fence: a stage of a run that lost its lease does nothing', () => {
  it.each([
    ['after the newer run ended', true],
    ['while the newer run still holds the lease (its deploy queued)', false],
  ])(
    'a crashed deploy retried after its lease expired and a newer run took it is dropped (%s)',
    async (_when, newerEnded) => {
      const t = fenceWorld();
      // Run A: a changed Secret, rendered OLDER; its deploy crashes in kapp.
      const deployA = await t.upToDeploy(secretChanged('2'), OLDER);
      await t.crash(deployA);
      expect((await t.lease()).holder).toBe(`run:${runOf(deployA)}`);
      // The Secret changes again after the lease expired (nobody renews a crashed stage's claim):
      // run B takes the lease over and renders NEWER.
      t.clock.t += DEFAULT_LEASE_TTL_MS + 1;
      const deployB = await t.upToDeploy(secretChanged('3'), NEWER);
      if (newerEnded) {
        expect(await t.deliver('deploy', deployB)).toEqual({ batchItemFailures: [] });
        expect(t.deployed).toEqual([OLDER, NEWER]);
        expect(t.lastCondition()).toEqual(['ReconcileSucceeded']);
      }
      const statuses = t.w.statuses().length;
      const tools = t.w.tools().length;
      const artifacts = await t.artifacts();
      const finalizers = t.w.app()?.metadata.finalizers;

      // A's deploy comes back from SQS (its visibility timeout is longer than the lease's TTL).
      expect(await t.deliver('deploy', deployA, 2)).toEqual({ batchItemFailures: [] });
      // No tool, no status, no artifact, no finalizer change.
      expect(t.deployed.at(-1)).toBe(newerEnded ? NEWER : OLDER);
      expect(t.w.tools()).toHaveLength(tools);
      expect(t.w.statuses()).toHaveLength(statuses);
      expect(await t.artifacts()).toEqual(artifacts);
      expect(t.w.app()?.metadata.finalizers).toEqual(finalizers);
      expect(t.outcome(deployA.type)).toBe('fenced');
      // The App runs again from the start, forced: sent now (the lease was free) or as B's follow-up.
      if (newerEnded) {
        const restart = t.sender.sent.at(-1);
        expect(restart?.stage).toBe('fetch');
        expect(restart?.event.data).toMatchObject({ reason: 'ref-changed', name: REF.name });
        expect((await t.lease()).holder).toBe(`event:${restart?.event.id}`);
      } else {
        expect(t.sender.sent).toEqual([]);
        expect((await t.lease()).pending?.data).toMatchObject({ reason: 'ref-changed' });
        t.sender.sent.push({ stage: 'deploy', event: deployB });
      }
      await t.drain();
      // Nothing deployed OLDER after NEWER: the App ends on the newest render, succeeded.
      expect(t.deployed.slice(t.deployed.indexOf(NEWER))).toEqual(expect.arrayContaining([NEWER]));
      expect(t.deployed.slice(t.deployed.indexOf(NEWER)).every((d) => d === NEWER)).toBe(true);
      expect(t.deployed.at(-1)).toBe(NEWER);
      expect(t.lastCondition()).toEqual(['ReconcileSucceeded']);
      // The lease is free again, nothing waiting.
      const lease = await t.lease();
      expect(lease.holder).toBeUndefined();
      expect(lease.pending).toBeUndefined();
      // A redelivered copy of the stale retry is fenced again and restarts the same way (same id).
      const sentBefore = t.sender.sent.length;
      expect(await t.deliver('deploy', deployA, 3)).toEqual({ batchItemFailures: [] });
      expect(t.outcome(deployA.type)).toBe('fenced');
      expect(t.sender.sent.length).toBe(sentBefore + 1);
    },
  );

  it.each([
    ['before the lease expired', DEFAULT_LEASE_TTL_MS / 5],
    ['after the lease expired, nobody having taken it', DEFAULT_LEASE_TTL_MS + 1],
  ])('a crashed deploy retried %s goes on as its run', async (_when, after) => {
    const t = fenceWorld();
    const deployA = await t.upToDeploy(secretChanged('2'), OLDER);
    await t.crash(deployA);
    t.clock.t += after;
    expect(await t.deliver('deploy', deployA, 2)).toEqual({ batchItemFailures: [] });
    expect(t.outcome(deployA.type)).toBe('done');
    expect(t.deployed).toEqual([OLDER, OLDER]);
    expect(t.lastCondition()).toEqual(['ReconcileSucceeded']);
    expect(t.sender.sent).toEqual([]);
    expect(await t.lease()).toEqual({ seq: expect.any(Number), last: `run:${runOf(deployA)}` });
  });

  it('a change that waited in the lease of a crashed run runs after that run’s retry', async () => {
    const t = fenceWorld();
    const deployA = await t.upToDeploy(secretChanged('2'), OLDER);
    await t.crash(deployA);
    // The Secret changes while the lease is live: coalesced as the follow-up.
    t.clock.t += DEFAULT_LEASE_TTL_MS / 5;
    expect(await t.deliver('fetch', secretChanged('3'))).toEqual({ batchItemFailures: [] });
    expect(t.outcome(EVENT_TYPES.object)).toBe('coalesced');
    // The retry comes after the lease expired: the crashed run goes on, then the follow-up runs.
    t.clock.t += DEFAULT_LEASE_TTL_MS;
    expect(await t.deliver('deploy', deployA, 2)).toEqual({ batchItemFailures: [] });
    expect(t.outcome(deployA.type)).toBe('done');
    expect(t.sender.sent.map((s) => s.stage)).toEqual(['fetch']);
    expect(t.sender.sent[0]?.event.data).toMatchObject({ reason: 'ref-changed', resourceVersion: '3' });
    t.render(NEWER);
    await t.drain();
    expect(t.deployed).toEqual([OLDER, OLDER, NEWER]);
    expect(t.lastCondition()).toEqual(['ReconcileSucceeded']);
  });
});
