/**
 * The embedded runtime's template → deploy hand-off under concurrency (the `npm run demo` flake
 * where `demo-helm/podinfo` stayed `Reconciling`): a deploy that crashes once is retried by the
 * keyed queue, and an object event for the same App that arrives meanwhile (the forwarder's
 * resync, a relist) must not replace that retry with a timer-gated no-op. Also the safety net: an
 * App whose status still shows a run in flight when an object event starts is reconciled again
 * at once, since the embedded queue never runs two events of one object together.
 * Faked at the ports: the shared fake cluster, the fake runner, a memory store; the real
 * `EmbeddedPipeline`, `KeyedQueue` and stage handlers.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  deleteEvent,
  deployEvent,
  type KappEvent,
  objectEvent,
  REASONS,
  type Reason,
  templateEvent,
} from '../../events/schema.js';
import { coalesceEvents, EmbeddedPipeline } from '../../functions/embedded/pipeline.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { ObjectBody } from '../../functions/lib/store/port.js';
import { StoreError } from '../../functions/lib/store/port.js';
import {
  type AppWorld,
  appObject,
  appWorld,
  NOW,
  RECONCILING,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
  vendirWrites,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('embedded-handoff-');

const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';

/**
 * A memory store whose first write of a fetch artifact (`putIfAbsent`, the fetch stage) fails:
 * that stage crashes once.
 */
class FailsOnce extends MemoryStore {
  failed = false;
  /** Runs when the call fails, while the stage is still running. */
  onFail: () => void = () => {};
  override async putIfAbsent(key: string, body: ObjectBody): Promise<'created' | 'exists'> {
    if (!this.failed && key.startsWith('artifacts/fetch/')) {
      this.failed = true;
      this.onFail();
      throw new StoreError(`putIfAbsent ${key}: 503 SlowDown`, 'putIfAbsent', key);
    }
    return await super.putIfAbsent(key, body);
  }
}

/**
 * Makes the deploy stage of `w` crash once: its kapp run fails to start (an infrastructure error,
 * not kapp's own failure), so the stage is retried and runs kapp again. (A run's stages hand the
 * manifest on in process, so the deploy stage of a whole run reads nothing from the store to
 * fail on.)
 */
function crashDeployOnce(w: AppWorld): { failed: boolean; onFail: () => void } {
  const crash = { failed: false, onFail: () => {} };
  w.runner.once('kapp', async () => {
    crash.failed = true;
    crash.onFail();
    throw new Error('spawn kapp EAGAIN');
  });
  return crash;
}

/** A world whose App (generation 1, never reconciled) fetches, renders and deploys with fakes. */
function world(store: MemoryStore, status?: AppStatus): AppWorld {
  const w = appWorld({
    app: appObject(status ? { status } : {}),
    tmpRoot: path.join(tempDir(), 'scratch'),
    store,
  });
  w.runner.on('vendir', vendirWrites());
  w.runner.on('ytt', { stdout: MANIFEST, exitCode: 0 });
  w.runner.on('kapp', { stdout: 'Succeeded', exitCode: 0 });
  return w;
}

const event = (reason: Reason): KappEvent => objectEvent(REF, reason, { time: new Date(NOW) });

/** Timers the test fires by hand (the queue's retry backoff). */
function manualTimers() {
  const due: (() => void)[] = [];
  return {
    setTimer: (fn: () => void) => {
      due.push(fn);
      return {
        cancel: () => {
          const i = due.indexOf(fn);
          if (i >= 0) due.splice(i, 1);
        },
      };
    },
    pending: () => due.length,
    fireAll: () => {
      for (const fn of due.splice(0)) fn();
    },
  };
}

/** An App run whose deploy crashed once and now waits for its retry timer (fired by hand). */
async function deployInBackoff() {
  const w = world(new MemoryStore());
  const store = crashDeployOnce(w);
  const timers = manualTimers();
  const pipeline = new EmbeddedPipeline(w.deps, { setTimer: timers.setTimer });
  await pipeline.send([event('added')]);
  await waitFor(() => timers.pending() === 1);
  return { store, w, timers, pipeline };
}

const lastCondition = (w: AppWorld) => w.app()?.status?.conditions?.map((c) => c.type);

describe('embedded template → deploy hand-off', () => {
  it('a resync arriving while the deploy crashes does not drop the deploy retry', async () => {
    const w = world(new MemoryStore());
    const store = crashDeployOnce(w);
    const pipeline = new EmbeddedPipeline(w.deps, { baseRetryMs: 1, maxRetryMs: 1 });
    // The forwarder's timer (or a relist) sends a resync for the App while its deploy runs.
    store.onFail = () => void pipeline.send([event('resync')]);
    await pipeline.send([event('added')]);
    await pipeline.idle();
    expect(store.failed).toBe(true);
    // The deploy was retried (no second fetch): the resync merged into its retry.
    expect(w.tools()).toEqual(['vendir', 'ytt', 'kapp', 'kapp']);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
  });

  it('a resync arriving while the deploy waits for its retry keeps the retry (and its backoff)', async () => {
    const { store, w, timers, pipeline } = await deployInBackoff();
    expect(store.failed).toBe(true);
    await pipeline.send([event('resync')]);
    // The retry still waits for its timer: the resync neither ran nor cancelled it.
    expect(timers.pending()).toBe(1);
    expect(pipeline.stats).toEqual({ running: 0, waiting: 1 });
    timers.fireAll();
    await pipeline.idle();
    expect(w.tools().filter((t) => t === 'kapp')).toEqual(['kapp', 'kapp']);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
  });

  it('a ref-changed arriving while the deploy waits for its retry starts a new run at once', async () => {
    const { w, timers, pipeline } = await deployInBackoff();
    await pipeline.send([event('ref-changed')]);
    expect(timers.pending()).toBe(0);
    await pipeline.idle();
    // The new run fetches again (a git ref is never cached) and reuses the render.
    expect(w.tools()).toEqual(['vendir', 'ytt', 'kapp', 'vendir', 'kapp']);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
  });
});

describe("a run's artifacts are handed on in process", () => {
  it('template and deploy read back neither the tarball nor the manifest their run stored; a retried stage reads the store', async () => {
    const reads: string[] = [];
    class Counting extends MemoryStore {
      override async get(key: string, opts?: Parameters<MemoryStore['get']>[1]): Promise<Buffer | undefined> {
        reads.push(key);
        return await super.get(key, opts);
      }
    }
    const store = new Counting();
    const w = world(store);
    const pipeline = new EmbeddedPipeline(w.deps, { baseRetryMs: 1, maxRetryMs: 1 });
    await pipeline.send([event('added')]);
    await pipeline.idle();
    expect(w.tools()).toEqual(['vendir', 'ytt', 'kapp']);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
    expect(reads.filter((k) => k.startsWith('artifacts/'))).toEqual([]);
    // the deploy event retried alone (a new run of the queue) reads its manifest from the store
    const next = world(store, SUCCEEDED_BEFORE);
    crashDeployOnce(next);
    const again = new EmbeddedPipeline(next.deps, { baseRetryMs: 1, maxRetryMs: 1 });
    const manifestKey = templateArtifactKey(sha256Hex(MANIFEST));
    await again.send([
      deployEvent(
        {
          object: REF,
          run: RUN,
          artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey },
        },
        { time: new Date(NOW) },
      ),
    ]);
    await again.idle();
    expect(next.tools()).toEqual(['kapp', 'kapp']);
    expect(reads.filter((k) => k === manifestKey)).toHaveLength(2);
  });
});

describe('coalesceEvents', () => {
  const time = { time: new Date(NOW) };
  const fetchKey = fetchArtifactKey(sha256Hex('fetched'));
  const manifestKey = templateArtifactKey(sha256Hex(MANIFEST));
  const template = templateEvent({ object: REF, run: RUN, artifacts: { fetchKey } }, time);
  const stages: KappEvent[] = [
    template,
    deployEvent({ object: REF, run: RUN, artifacts: { fetchKey, manifestKey } }, time),
    deleteEvent({ object: REF, run: RUN }, time),
  ];

  it('keeps a stage event waiting for its retry against a resync of its run (same uid and generation)', () => {
    for (const stage of stages) expect(coalesceEvents(stage, event('resync'))).toBe(stage);
  });

  it('lets every other object event replace a waiting stage event', () => {
    for (const stage of stages) {
      for (const reason of REASONS.filter((r) => r !== 'resync')) {
        const next = event(reason);
        expect(coalesceEvents(stage, next)).toBe(next);
      }
      const newer = objectEvent({ ...REF, generation: 2 }, 'resync', time);
      expect(coalesceEvents(stage, newer)).toBe(newer);
      const recreated = objectEvent({ ...REF, uid: 'uid-2' }, 'resync', time);
      expect(coalesceEvents(stage, recreated)).toBe(recreated);
    }
  });

  it('lets a newer stage event replace a waiting one', () => {
    expect(coalesceEvents(stages[1]!, template)).toBe(template);
  });
});

describe('a crashed object event merged with one that arrived meanwhile', () => {
  it('a ref-changed whose fetch crashes while a resync arrives still forces its run', async () => {
    const store = new FailsOnce();
    // Reconciled 10 s ago: a resync alone is not due.
    const recent = { ...SUCCEEDED_BEFORE, fetch: { exitCode: 0, updatedAt: '2024-12-31T23:59:50Z' } } as AppStatus;
    const w = world(store, recent);
    const pipeline = new EmbeddedPipeline(w.deps, { baseRetryMs: 1, maxRetryMs: 1 });
    store.onFail = () => void pipeline.send([event('resync')]);
    await pipeline.send([event('ref-changed')]);
    await pipeline.idle();
    expect(store.failed).toBe(true);
    expect(w.tools()).toEqual(['vendir', 'vendir', 'ytt', 'kapp']);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
  });
});

describe('safety net: a run left in flight is re-driven', () => {
  /** The status a run of generation 1 leaves when it is lost after template (not due by the timer). */
  const LOST: AppStatus = {
    ...RECONCILING,
    fetch: { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW },
    template: { exitCode: 0, updatedAt: NOW },
  } as AppStatus;

  it('embedded: a resync finding Reconciling for its generation reconciles the App at once', async () => {
    const w = world(new MemoryStore(), LOST);
    const pipeline = new EmbeddedPipeline(w.deps);
    await pipeline.send([event('resync')]);
    await pipeline.idle();
    expect(w.tools()).toEqual(['vendir', 'ytt', 'kapp']);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
    expect(w.log.records.filter((r) => r.msg === 'run left in flight (Reconciling); running again')).toHaveLength(1);
  });

  it('where runs may be in flight (Lambda: no oneRunPerObject), the same resync waits for the timer', async () => {
    const w = world(new MemoryStore(), LOST);
    expect(await dispatchEvent(event('resync'), w.deps)).toBeUndefined();
    expect(w.tools()).toEqual([]);
    expect(w.outcomes()).toEqual([['reconcile', 'noop']]);
  });

  it('any runtime: once the sync period has passed since the lost run, a resync reconciles it', async () => {
    const old = '2024-12-31T23:59:00Z'; // 60 s before NOW; the default sync period is 30 s
    const lostLongAgo = {
      ...LOST,
      fetch: { exitCode: 0, startedAt: old, updatedAt: old },
      template: { exitCode: 0, updatedAt: old },
    } as AppStatus;
    const w = world(new MemoryStore(), lostLongAgo);
    const next = await dispatchEvent(event('resync'), w.deps);
    expect(next?.type).toBe('dev.kapp-lambda.stage.template.v1');
    expect(w.tools()).toEqual(['vendir']);
  });
});

describe('a stage that never ends is visible', () => {
  it('inFlight() names the object and stage holding it, and a stall warning is logged once', async () => {
    const w = world(new MemoryStore());
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    // The deploy's first API call hangs (a request without an answer).
    const addFinalizer = w.cluster.addFinalizer.bind(w.cluster);
    w.cluster.addFinalizer = async (...args) => {
      await gate;
      return await addFinalizer(...args);
    };
    const pipeline = new EmbeddedPipeline(w.deps, { stallWarnMs: 1 });
    await pipeline.send([event('added')]);
    // Every stage outlives 1 ms; the deploy is the one that hangs.
    const stalled = () =>
      w.log.records.filter((r) => r.msg === 'stage still running' && r.obj.stage === 'deploy').map((r) => r.obj);
    await waitFor(() => stalled().length === 1);
    expect(stalled()[0]).toMatchObject({ object: 'c1/App/ns/app', attempt: 1 });
    expect(pipeline.inFlight()).toEqual([
      { object: 'c1/App/ns/app', stage: 'deploy', attempt: 1, startedAt: expect.any(Number) },
    ]);
    release();
    await pipeline.idle();
    expect(pipeline.inFlight()).toEqual([]);
    expect(stalled()).toHaveLength(1);
    expect(lastCondition(w)).toEqual(['ReconcileSucceeded']);
  });
});

/** Resolves once `cond` holds (checked every few ms, for at most about 10 s). */
async function waitFor(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  expect(cond()).toBe(true);
}
