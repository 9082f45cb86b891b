/**
 * Infrastructure errors reach status: a stage that keeps failing (object store down, status
 * writes refused) ends its run with a final ReconcileFailed after a bounded number of attempts,
 * in both runtimes (embedded queue, Lambda SQS handler), with a bounded and redacted cause;
 * when the status write itself is what fails, the event is failed to SQS (dead-letter queue).
 * Faked at the ports: kube, object store, command runner.
 */

import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { deleteEvent, type KappEvent, objectEvent, serializeEvent, templateEvent } from '../../events/schema.js';
import { EmbeddedPipeline } from '../../functions/embedded/pipeline.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { KubeApiError, type KubeObject } from '../../functions/lib/kube/port.js';
import {
  DEFAULT_MAX_ATTEMPTS,
  failRunAfterRetries,
  INFRA_CAUSE_BYTES,
  InfraError,
  infraCauseText,
} from '../../functions/lib/pipeline/retry-bound.js';
import { MASKED } from '../../functions/lib/reconcile/secret-mask.js';
import { nextDueAt, type TimedObject } from '../../functions/lib/reconcile/timer.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { StoreError } from '../../functions/lib/store/port.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { PKGR_REF, REF } from './support/app-world.js';
import { FakeCluster } from './support/fake-cluster.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const TIME = '2025-01-01T00:00:00.000Z';
const RUN = { generation: 1, runId: 'r1', startedAt: TIME };

const APP_OBJECT = {
  apiVersion: REF.apiVersion,
  kind: 'App',
  metadata: { name: 'app', namespace: 'ns', uid: 'uid-1', generation: 1, resourceVersion: '1' },
  spec: {
    fetch: [{ inline: { paths: { 'a.yml': 'a: 1\n' } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  },
} as KubeObject;

/** The PackageRepository of `PKGR_REF`: an inline repository. */
const PKGR_OBJECT = {
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  kind: 'PackageRepository',
  metadata: { name: 'repo', namespace: 'ns', uid: 'uid-r', generation: 1, resourceVersion: '1' },
  spec: { fetch: { inline: { paths: { 'packages/a.yml': 'kind: Package\n' } } } },
} as KubeObject;

/** A fake cluster holding one object (default an App); status writes can be made to fail (503). */
function clusterWith(opts: { failStatusWrites?: boolean; object?: KubeObject } = {}) {
  const cluster = new FakeCluster().put(opts.object ?? APP_OBJECT);
  if (opts.failStatusWrites) {
    cluster.onWrite = () => {
      throw new KubeApiError(
        'updating status of App ns/app: 503 the server is currently unable to handle the request',
        {
          statusCode: 503,
        } as never,
      );
    };
  }
  return cluster;
}

/** The one object of `cluster`, as stored now. */
const stored = (cluster: FakeCluster) => [...cluster.objects.values()][0] as KubeObject;

/** An object store whose artifact writes fail the first `failures` times (Infinity: always). */
class FlakyStore extends MemoryStore {
  readonly keysTried: string[] = [];
  constructor(
    private failures: number,
    private readonly prefix = '',
  ) {
    super();
  }
  get putAttempts(): number {
    return this.keysTried.length;
  }
  override async putIfAbsent(key: string, body: Parameters<MemoryStore['putIfAbsent']>[1]) {
    if (!key.startsWith(this.prefix)) return await super.putIfAbsent(key, body);
    this.keysTried.push(key);
    if (this.failures > 0) {
      this.failures--;
      throw new StoreError(`PUT ${key}: 503 SlowDown: Please reduce your request rate.`, 'putIfAbsent', key);
    }
    return await super.putIfAbsent(key, body);
  }
}

const tempDir = useTempDir('retry-bound-');

function depsWith(kube: FakeCluster, store: MemoryStore, runner = new FakeCommandRunner()) {
  const { deps, log } = stageDeps(kube, { runner, store, now: TIME, tmpRoot: path.join(tempDir(), 'scratch') });
  return { deps, log };
}

/** vendir that "fetches" one file into its working directory. */
const vendirOk = () =>
  new FakeCommandRunner().on('vendir', async (req) => {
    await writeFile(path.join(req.cwd ?? '', 'a.yml'), 'a: 1\n');
    return { stdout: 'apiVersion: vendir.k14s.io/v1alpha1\nkind: LockConfig\n' };
  });

describe('embedded runtime: a stage that keeps failing ends in ReconcileFailed', () => {
  it.each([
    ['App', APP_OBJECT, REF, 'Fetching resources: '],
    // A PackageRepository's one event runs fetch, template and deploy: the message names the run.
    ['PackageRepository', PKGR_OBJECT, PKGR_REF, 'Reconciling: '],
  ] as const)(
    '%s, object store down: 5 attempts, then ReconcileFailed naming the step and the cause',
    async (kind, object, ref, prefix) => {
      const kube = clusterWith({ object });
      const store = new FlakyStore(Number.POSITIVE_INFINITY);
      const runner = vendirOk();
      const { deps, log } = depsWith(kube, store, runner);
      const pipeline = new EmbeddedPipeline(deps, { baseRetryMs: 1, maxRetryMs: 1 });
      await pipeline.send([objectEvent(ref, 'added', { time: TIME })]);
      // Resolves only because the run ended: without the bound it retries forever.
      await pipeline.idle();
      expect(store.putAttempts).toBe(DEFAULT_MAX_ATTEMPTS);
      expect(runner.calls.filter((c) => c.cmd === 'vendir')).toHaveLength(DEFAULT_MAX_ATTEMPTS);
      expect(runner.calls.filter((c) => c.cmd === 'kapp')).toEqual([]);
      const message =
        `${prefix}storing the fetch artifact failed: ` +
        `PUT ${store.keysTried[0]}: 503 SlowDown: Please reduce your request rate.`;
      expect(new Set(store.keysTried).size).toBe(1);
      const status = stored(kube).status as AppStatus;
      expect(status.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
      expect(status.friendlyDescription).toBe(`Reconcile failed: ${message}`);
      expect(status.usefulErrorMessage).toBe(message);
      expect(status.consecutiveReconcileFailures).toBe(1);
      expect(status.observedGeneration).toBe(1);
      // The stage that gave up reads as a finished failure with updatedAt, so the resync timer
      // retries the object on the failure backoff (2^1 s) once the store heals.
      expect(status.fetch).toMatchObject({ exitCode: -1, error: message, finished: true });
      const updatedAt = (status.fetch as { updatedAt?: string }).updatedAt;
      expect(updatedAt).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/);
      const timed = { metadata: { generation: 1, uid: 'u' }, spec: {}, status } as unknown as TimedObject;
      expect(nextDueAt(timed, new Date(Date.parse(updatedAt ?? '')), { kind })?.getTime()).toBe(
        Date.parse(updatedAt ?? '') + 2000,
      );
      // Reconciling was shown while it retried.
      expect((kube.statuses[0] as AppStatus | undefined)?.conditions).toEqual([
        { type: 'Reconciling', status: 'True' },
      ]);
      expect(
        log.records.filter((r) => r.msg === 'stage failed on its last attempt; run ended with a failed status'),
      ).toHaveLength(1);
    },
  );

  it('a store that recovers within the bound: the run succeeds, no ReconcileFailed', async () => {
    const kube = clusterWith();
    const store = new FlakyStore(DEFAULT_MAX_ATTEMPTS - 1);
    const runner = vendirOk().on('ytt', { stderr: 'ytt: Error: boom\n', exitCode: 1 });
    const { deps } = depsWith(kube, store, runner);
    const pipeline = new EmbeddedPipeline(deps, { baseRetryMs: 1, maxRetryMs: 1 });
    await pipeline.send([objectEvent(REF, 'added', { time: TIME })]);
    await pipeline.idle();
    expect(store.putAttempts).toBe(DEFAULT_MAX_ATTEMPTS);
    expect(await store.list('artifacts/fetch/')).toHaveLength(1);
    // The fetch artifact reached the template stage, whose own (ordinary) failure ends the run.
    expect(runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(1);
    expect((stored(kube).status as AppStatus).conditions).toEqual([
      {
        type: 'ReconcileFailed',
        status: 'True',
        message: 'Templating dir: Error (see .status.usefulErrorMessage for details)',
      },
    ]);
  });

  it('a later stage gets attempts of its own: template storing its manifest fails 5 times', async () => {
    const kube = clusterWith();
    const store = new FlakyStore(Number.POSITIVE_INFINITY, 'artifacts/template/');
    const runner = vendirOk().on('ytt', { stdout: 'kind: ConfigMap\n' });
    const { deps } = depsWith(kube, store, runner);
    const pipeline = new EmbeddedPipeline(deps, { baseRetryMs: 1, maxRetryMs: 1 });
    await pipeline.send([objectEvent(REF, 'added', { time: TIME })]);
    await pipeline.idle();
    expect(runner.calls.filter((c) => c.cmd === 'vendir')).toHaveLength(1);
    expect(runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(DEFAULT_MAX_ATTEMPTS);
    const message = (stored(kube).status as AppStatus).conditions?.[0]?.message ?? '';
    expect(message).toBe(
      `Templating: storing the rendered manifest failed: PUT ${store.keysTried[0]}: 503 SlowDown: Please reduce your request rate.`,
    );
  });
});

describe('Lambda handler: ApproximateReceiveCount bounds the retries', () => {
  const record = (event: KappEvent, receiveCount: number): SqsRecord => ({
    messageId: `m${receiveCount}`,
    body: serializeEvent(event),
    attributes: { MessageGroupId: 'c1/App/ns/app', ApproximateReceiveCount: String(receiveCount) },
  });
  const SECRET = 'tenant-s3cr3t-value';
  const tmpl = templateEvent(
    { object: REF, run: RUN, artifacts: { fetchKey: `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz` } },
    { time: TIME },
  );

  function handlerWith(kube: FakeCluster) {
    const { deps: pipeline, log } = depsWith(kube, new MemoryStore());
    const deps: EntryDeps = {
      pipeline,
      sender: new MemoryEventSender(),
      log,
      // The stage read a Secret, then its store failed with an error quoting the value.
      dispatch: async (_event, d) => {
        d.secretMask?.addValue(SECRET);
        throw new InfraError(
          'storing the rendered manifest',
          new StoreError(`PUT x: 500 InternalError for ${SECRET} ${'z'.repeat(4000)}`, 'putIfAbsent', 'x'),
        );
      },
    };
    return { handler: makeSqsHandler('template', () => deps), log };
  }

  it('before the last attempt: the record fails (SQS redelivers), status untouched', async () => {
    const kube = clusterWith();
    const { handler } = handlerWith(kube);
    for (let n = 1; n < DEFAULT_MAX_ATTEMPTS; n++) {
      expect(await handler({ Records: [record(tmpl, n)] })).toEqual({
        batchItemFailures: [{ itemIdentifier: `m${n}` }],
      });
    }
    expect(kube.statuses).toEqual([]);
  });

  it('on the last attempt: ReconcileFailed with the bounded, masked cause, and the record is acknowledged', async () => {
    const kube = clusterWith();
    const { handler, log } = handlerWith(kube);
    expect(await handler({ Records: [record(tmpl, DEFAULT_MAX_ATTEMPTS)] })).toEqual({
      batchItemFailures: [{ itemIdentifier: `m${DEFAULT_MAX_ATTEMPTS}` }],
    });
    const status = stored(kube).status as AppStatus;
    const message = status.conditions?.[0]?.message ?? '';
    expect(status.conditions?.[0]?.type).toBe('ReconcileFailed');
    expect(
      message.startsWith(
        `Templating: storing the rendered manifest failed: PUT x: 500 InternalError for ${MASKED} zzz`,
      ),
    ).toBe(true);
    expect(message.endsWith('z [truncated]')).toBe(true);
    expect(Buffer.byteLength(message)).toBe('Templating: '.length + INFRA_CAUSE_BYTES);
    expect(JSON.stringify(kube.statuses)).not.toContain(SECRET);
    expect(JSON.stringify(log.records)).not.toContain(SECRET);
    expect(log.records.at(-1)).toMatchObject({ level: 'warn', obj: { outcome: 'ended', receiveCount: 5 } });
  });

  it("the handler's run mask shows a scratch path in the final status by its stable stand-in", async () => {
    const kube = clusterWith();
    const { deps: pipeline, log } = depsWith(kube, new MemoryStore());
    const scratch = path.join(pipeline.config.tmpRoot, 'template-Ab12Cd');
    const deps: EntryDeps = {
      pipeline,
      sender: new MemoryEventSender(),
      log,
      dispatch: async () => {
        throw new InfraError('unpacking the fetch artifact', new Error(`ENOSPC: write ${scratch}/src/a.yml`));
      },
    };
    await makeSqsHandler('template', () => deps)({ Records: [record(tmpl, DEFAULT_MAX_ATTEMPTS)] });
    const status = stored(kube).status as AppStatus;
    expect(status.usefulErrorMessage).toBe(
      'Templating: unpacking the fetch artifact failed: ENOSPC: write /tmp/kapp-lambda-template/src/a.yml',
    );
  });

  it('when the status write itself fails: logged, the record fails on to the dead-letter queue', async () => {
    const kube = clusterWith({ failStatusWrites: true });
    const { handler, log } = handlerWith(kube);
    expect(await handler({ Records: [record(tmpl, DEFAULT_MAX_ATTEMPTS)] })).toEqual({
      batchItemFailures: [{ itemIdentifier: `m${DEFAULT_MAX_ATTEMPTS}` }],
    });
    expect(kube.calls.filter(([op]) => op === 'update')).toHaveLength(1);
    const msgs = log.records.map((r) => r.msg);
    expect(msgs).toContain('stage failed on its last attempt and its failed status could not be written');
    expect(msgs).toContain('event failed on its last attempt; it goes to the dead-letter queue');
    expect(JSON.stringify(log.records)).not.toContain(SECRET);
  });
});

describe('failRunAfterRetries', () => {
  it('a delete that keeps failing ends in DeleteFailed with the Deleting: prefix', async () => {
    const kube = clusterWith();
    const { deps } = depsWith(kube, new MemoryStore());
    const ev = deleteEvent({ object: REF, run: RUN }, { time: TIME });
    expect(await failRunAfterRetries(ev, new Error('reading the App failed: 500 etcd leader changed'), deps)).toBe(
      'written',
    );
    const status = stored(kube).status as AppStatus;
    expect(status.conditions).toEqual([
      { type: 'DeleteFailed', status: 'True', message: 'Deleting: reading the App failed: 500 etcd leader changed' },
    ]);
  });

  it('leaves a newer spec alone (the fence): stale, nothing written', async () => {
    const kube = clusterWith();
    const { deps } = depsWith(kube, new MemoryStore());
    const ev = templateEvent(
      {
        object: REF,
        run: { ...RUN, generation: 0 },
        artifacts: { fetchKey: `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz` },
      },
      { time: TIME },
    );
    expect(await failRunAfterRetries(ev, new Error('x'), deps)).toBe('stale');
    expect(kube.statuses).toEqual([]);
  });
});

describe('PackageRepository (index-repo function): the retry bound on Lambda, and deletion', () => {
  const storeDown = (store: FlakyStore) =>
    `Reconciling: storing the fetch artifact failed: PUT ${store.keysTried[0]}: 503 SlowDown: Please reduce your request rate.`;

  it('Lambda: before the last receive the record fails; on it, ReconcileFailed and the record is acknowledged', async () => {
    const kube = clusterWith({ object: PKGR_OBJECT });
    const store = new FlakyStore(Number.POSITIVE_INFINITY);
    const { deps: pipeline, log } = depsWith(kube, store, vendirOk());
    const handler = makeSqsHandler('index-repo', () => ({ pipeline, sender: new MemoryEventSender(), log }));
    const record = (n: number): SqsRecord => ({
      messageId: `m${n}`,
      body: serializeEvent(objectEvent(PKGR_REF, 'added', { time: TIME })),
      attributes: { MessageGroupId: 'c1/PackageRepository/ns/repo', ApproximateReceiveCount: String(n) },
    });
    expect(await handler({ Records: [record(1)] })).toEqual({ batchItemFailures: [{ itemIdentifier: 'm1' }] });
    expect((stored(kube).status as AppStatus).conditions).toEqual([{ type: 'Reconciling', status: 'True' }]);
    expect(await handler({ Records: [record(DEFAULT_MAX_ATTEMPTS)] })).toEqual({
      batchItemFailures: [{ itemIdentifier: `m${DEFAULT_MAX_ATTEMPTS}` }],
    });
    expect((stored(kube).status as AppStatus).conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: storeDown(store) },
    ]);
    expect(log.records.at(-1)).toMatchObject({
      level: 'warn',
      obj: { stage: 'index-repo', outcome: 'ended', receiveCount: DEFAULT_MAX_ATTEMPTS },
    });
  });

  it('a repository being deleted ends in DeleteFailed with the Deleting: prefix (its finalizer stays)', async () => {
    const finalizers = ['finalizers.packagerepository.packaging.carvel.dev/delete'];
    const deleting = {
      ...PKGR_OBJECT,
      metadata: { ...PKGR_OBJECT.metadata, deletionTimestamp: TIME, finalizers },
    } as KubeObject;
    const kube = clusterWith({ object: deleting });
    const { deps } = depsWith(kube, new MemoryStore());
    const ev = objectEvent(PKGR_REF, 'modified', { time: TIME });
    expect(await failRunAfterRetries(ev, new Error('reading the PackageRepository failed: 500 etcd'), deps)).toBe(
      'written',
    );
    const status = stored(kube).status as AppStatus;
    const message = 'Deleting: reading the PackageRepository failed: 500 etcd';
    expect(status.conditions).toEqual([{ type: 'DeleteFailed', status: 'True', message }]);
    expect(status.deploy).toMatchObject({ exitCode: -1, error: message, finished: true });
    expect(stored(kube).metadata.finalizers).toEqual(finalizers);
  });

  it('a recreated repository (another uid) is left alone', async () => {
    const kube = clusterWith({ object: PKGR_OBJECT });
    const { deps } = depsWith(kube, new MemoryStore());
    const ev = objectEvent({ ...PKGR_REF, uid: 'uid-old' }, 'modified', { time: TIME });
    expect(await failRunAfterRetries(ev, new Error('x'), deps)).toBe('gone');
    expect(kube.statuses).toEqual([]);
  });
});

describe('infraCauseText', () => {
  it('joins the cause chain once, folds whitespace, redacts credential shapes', () => {
    const err = new InfraError(
      'reading the fetch cache',
      new Error('GET https://user:pw@s3.local/k:\n  403 Forbidden'),
    );
    expect(infraCauseText(err)).toBe('reading the fetch cache failed: GET https://***@s3.local/k: 403 Forbidden');
    const wrapped = new Error('boom: inner', { cause: new Error('inner') });
    expect(infraCauseText(wrapped)).toBe('boom: inner');
  });
});
