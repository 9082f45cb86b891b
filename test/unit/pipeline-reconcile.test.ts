/**
 * The reconcile step that precedes fetch over its outcomes (review R6): one row per outcome, each
 * asserting the exact status writes (of the step and, when it starts a run, of the fetch after
 * it), the exact next event and the logged outcomes. Called through `dispatchEvent` with an
 * object event. Faked at the ports: the shared fake cluster, the fake runner (vendir), a memory
 * store.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  type DeployStageData,
  deleteEvent,
  deployEvent,
  type KappEvent,
  objectEvent,
  type Reason,
  type StageRun,
  templateEvent,
} from '../../events/schema.js';
import { type AppStatus, Finalizer } from '../../functions/lib/api/index.js';
import { sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import type { NewEvent } from '../../functions/lib/kube/port.js';
import { ReconcileEventRecorder } from '../../functions/lib/observe/events.js';
import { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION } from '../../functions/lib/pipeline/app/receipts.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { buildReceipt, receiptKey } from '../../functions/lib/receipt/receipt.js';
import {
  type AppShape,
  type AppWorld,
  appObject,
  appWorld,
  changeApp,
  NOW,
  RECONCILING,
  REF,
  SUCCEEDED_BEFORE,
  vendirWrites,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-reconcile-');

/** The last run ended 10 s ago: a resync is not due (default sync period 30 s). */
const RECENT: AppStatus = {
  ...SUCCEEDED_BEFORE,
  fetch: { exitCode: 0, updatedAt: '2024-12-31T23:59:50Z' },
} as AppStatus;
/** The last run ended a day ago: a resync is due. */
const OLD: AppStatus = { ...SUCCEEDED_BEFORE, fetch: { exitCode: 0, updatedAt: '2024-12-31T00:00:00Z' } } as AppStatus;
const INVALID = 'Reconciling: invalid App ns/app: spec.syncPeriod: Invalid input: expected string, received number';
const FETCH_OK = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };

type Next = 'template' | 'delete' | 'none';

interface Row {
  /** The App in the cluster; `null`: none. */
  app: AppShape | null;
  reason?: Reason;
  /** Changes the cluster before the n-th status write of the row (after the step read the App). */
  onWrite?: (w: AppWorld, n: number) => void;
  statuses: AppStatus[];
  next: Next;
  outcomes: Array<[string, string]>;
}

const rows: Record<string, Row> = {
  'gone: no App, nothing written, nothing next': {
    app: null,
    statuses: [],
    next: 'none',
    outcomes: [['reconcile', 'gone']],
  },
  'invalid: an App our schema rejects gets a ReconcileFailed status, not a crash': {
    app: { spec: { syncPeriod: 5 } },
    statuses: [
      {
        observedGeneration: 1,
        conditions: [{ type: 'ReconcileFailed', status: 'True', message: INVALID }],
        friendlyDescription: `Reconcile failed: ${INVALID}`,
        consecutiveReconcileFailures: 1,
        usefulErrorMessage: INVALID,
      } as AppStatus,
    ],
    next: 'none',
    outcomes: [['reconcile', 'failed']],
  },
  'deleting with our finalizer: the delete goes to the deploy function, nothing written': {
    app: {
      status: SUCCEEDED_BEFORE,
      metadata: { deletionTimestamp: '2025-01-01T00:00:00Z', finalizers: [Finalizer.App] },
    },
    statuses: [],
    next: 'delete',
    outcomes: [['reconcile', 'deleted']],
  },
  'deleting without our finalizer: nothing to do (gone)': {
    app: { status: SUCCEEDED_BEFORE, metadata: { deletionTimestamp: '2025-01-01T00:00:00Z', finalizers: ['other'] } },
    statuses: [],
    next: 'none',
    outcomes: [['reconcile', 'gone']],
  },
  'paused: observedGeneration and Canceled/paused are written, nothing runs': {
    app: { generation: 2, status: SUCCEEDED_BEFORE, spec: { paused: true } },
    statuses: [{ ...SUCCEEDED_BEFORE, observedGeneration: 2, friendlyDescription: 'Canceled/paused' }],
    next: 'none',
    outcomes: [['reconcile', 'paused']],
  },
  'canceled: the same as paused': {
    app: { generation: 2, status: SUCCEEDED_BEFORE, spec: { canceled: true } },
    statuses: [{ ...SUCCEEDED_BEFORE, observedGeneration: 2, friendlyDescription: 'Canceled/paused' }],
    next: 'none',
    outcomes: [['reconcile', 'paused']],
  },
  'noop: a resync that is not due yet runs nothing and writes nothing': {
    app: { status: RECENT },
    statuses: [],
    next: 'none',
    outcomes: [['reconcile', 'noop']],
  },
  'forced (added) although not due: a run with deferred writes': {
    app: { status: RECENT },
    reason: 'added',
    statuses: [],
    next: 'template',
    outcomes: [
      ['reconcile', 'succeeded'],
      ['fetch', 'succeeded'],
    ],
  },
  'forced (ref-changed) although not due: a run with deferred writes': {
    app: { status: RECENT },
    reason: 'ref-changed',
    statuses: [],
    next: 'template',
    outcomes: [
      ['reconcile', 'succeeded'],
      ['fetch', 'succeeded'],
    ],
  },
  'due resync: a run with deferred writes (no Reconciling)': {
    app: { status: OLD },
    statuses: [],
    next: 'template',
    outcomes: [
      ['reconcile', 'succeeded'],
      ['fetch', 'succeeded'],
    ],
  },
  // The fetch decides on the status as this step read it (before Reconciling), so its part rides
  // the event; the template stage, which re-reads the App, writes it (as before the stage frame).
  'spec changed: Reconciling is written at once, the fetch part rides the event': {
    app: {},
    statuses: [RECONCILING],
    next: 'template',
    outcomes: [
      ['reconcile', 'succeeded'],
      ['fetch', 'succeeded'],
    ],
  },
  'stale: the spec changed again before Reconciling was written: nothing written, nothing runs': {
    app: {},
    onWrite: (w, n) => {
      if (n === 1) changeApp(w, 'generation');
    },
    statuses: [],
    next: 'none',
    outcomes: [['reconcile', 'stale']],
  },
  'gone: the App was recreated before Reconciling was written': {
    app: {},
    onWrite: (w, n) => {
      if (n === 1) changeApp(w, 'recreated');
    },
    statuses: [],
    next: 'none',
    outcomes: [['reconcile', 'gone']],
  },
};

/** The next event the row expects, for the run the step started (its id is random). */
function expected(next: Next, got: KappEvent | undefined, fetchKey: string | undefined): KappEvent | undefined {
  if (next === 'none') return undefined;
  const run = (got?.data as { run?: StageRun } | undefined)?.run;
  expect(run?.runId).toMatch(/^[0-9a-f-]{36}$/);
  const r: StageRun = { generation: 1, runId: run?.runId ?? '', startedAt: new Date(NOW).toISOString() };
  const time = { time: new Date(NOW) };
  if (next === 'delete') return deleteEvent({ object: REF, run: r }, time);
  const fetchStatus = FETCH_OK;
  return templateEvent({ object: REF, run: r, artifacts: { fetchKey: fetchKey ?? '' }, fetchStatus }, time);
}

describe('reconcile step table', () => {
  it.each(Object.entries(rows))('%s', async (_name, row) => {
    const w = appWorld({
      ...(row.app ? { app: appObject(row.app) } : {}),
      tmpRoot: path.join(tempDir(), 'scratch'),
    });
    w.runner.on('vendir', vendirWrites());
    const onWrite = row.onWrite;
    if (onWrite) w.cluster.onWrite = (n) => onWrite(w, n);
    const next = await dispatchEvent(objectEvent(REF, row.reason ?? 'resync', { time: new Date(NOW) }), w.deps);
    expect(w.statuses()).toEqual(row.statuses);
    expect(next).toEqual(expected(row.next, next, (await w.store.list('artifacts/fetch/'))[0]));
    expect(w.outcomes()).toEqual(row.outcomes);
    expect(w.tools()).toEqual(row.next === 'template' ? ['vendir'] : []);
  });
});

describe('rollback to a receipt (kapp-lambda.carvel.dev/rollback-to)', () => {
  const RECEIPT_ID = '20250101-000000-000-0123abcd';
  // Its key is its bytes' digest: deploy refuses a shared manifest that is not.
  const MANIFEST_BODY = 'kind: ConfigMap\n';
  const DIGEST = sha256Hex(MANIFEST_BODY);
  const MANIFEST = templateArtifactKey(DIGEST);
  /** The App rolled back at `generation` (its own generation is 1). */
  const rolledBack = (generation: number): AppShape => ({
    status: RECENT,
    metadata: {
      annotations: { [ROLLBACK_TO_ANNOTATION]: RECEIPT_ID, [ROLLBACK_GENERATION_ANNOTATION]: String(generation) },
    },
  });
  /** Keeps a receipt of this App naming `MANIFEST` (stored when `withManifest`). */
  async function keep(w: AppWorld, withManifest: boolean): Promise<void> {
    const receipt = buildReceipt({
      owner: REF,
      uid: REF.uid,
      generation: 1,
      runId: 'earlier',
      startedAt: new Date(NOW),
      endedAt: new Date(NOW),
      trail: { stages: [] },
      render: { key: MANIFEST, digest: DIGEST, private: false },
    });
    await w.store.put(receiptKey(REF, RECEIPT_ID), JSON.stringify({ ...receipt, id: RECEIPT_ID }));
    if (withManifest) await w.store.put(MANIFEST, MANIFEST_BODY);
  }

  it('a modified event (the annotations changed) runs at once and hands the receipt render to deploy: no fetch, no template', async () => {
    const w = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch') });
    await keep(w, true);
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(next?.type).toBe('dev.kapp-lambda.stage.deploy.v1');
    expect((next?.data as { artifacts?: unknown } | undefined)?.artifacts).toEqual({ manifestKey: MANIFEST });
    expect((next?.data as { rollbackOf?: unknown } | undefined)?.rollbackOf).toBe(RECEIPT_ID);
    expect(w.tools()).toEqual([]);
    expect(w.statuses()).toEqual([]);
  });

  /** The rollback hand-off fetch sends for `w`, with `data` changed as given. */
  async function handOff(w: AppWorld, change: (data: DeployStageData) => DeployStageData = (d) => d) {
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    if (next?.type !== 'dev.kapp-lambda.stage.deploy.v1') throw new Error('no rollback hand-off');
    return deployEvent(change(next.data as DeployStageData), { time: new Date(NOW) });
  }

  it('the deploy function applies that render while the App asks for the receipt', async () => {
    const w = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch') });
    await keep(w, true);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    await dispatchEvent(await handOff(w), w.deps);
    expect(w.tools()).toContain('kapp');
    expect(w.statuses().at(-1)?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
  });

  it('and refuses a rollback hand-off the App no longer asks for, or naming another manifest: no kapp, no status', async () => {
    const w = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch') });
    await keep(w, true);
    const asked = await handOff(w);
    // The annotation is gone (or, forged, never was): what fetch hands on is not applied.
    const obj = w.cluster.get('App', REF.namespace, REF.name);
    if (obj) obj.metadata.annotations = {};
    await dispatchEvent(asked, w.deps);
    expect(w.tools()).toEqual([]);
    expect(w.statuses()).toEqual([]);

    const v = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch2') });
    await keep(v, true);
    const other = templateArtifactKey('f'.repeat(64));
    await v.store.put(other, 'kind: Secret\n');
    await dispatchEvent(await handOff(v, (d) => ({ ...d, artifacts: { manifestKey: other } })), v.deps);
    expect(v.tools()).toEqual([]);
    expect(v.statuses()).toEqual([]);
  });

  it('a receipt that is gone fails the reconcile with Rolling back: (kapp-controller status shape)', async () => {
    const w = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch') });
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(next).toBeUndefined();
    const message = `Rolling back: receipt "${RECEIPT_ID}" of this App not found`;
    expect(w.statuses().at(-1)).toMatchObject({
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileFailed', status: 'True', message }],
      friendlyDescription: `Reconcile failed: ${message}`,
      usefulErrorMessage: message,
    });
    expect(w.tools()).toEqual([]);
  });

  it('a receipt whose render expired fails the same way, naming it', async () => {
    const w = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch') });
    await keep(w, false);
    await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(
      `Rolling back: the rendered manifest of receipt "${RECEIPT_ID}" is no longer stored`,
    );
  });

  it('a receipt naming a store object that is no rendered manifest (planted in its receipts prefix by a tenant run) is not deployed', async () => {
    const w = appWorld({ app: appObject(rolledBack(1)), tmpRoot: path.join(tempDir(), 'scratch') });
    // Another cluster's document: any key of the bucket a forged receipt names.
    const planted = 'clusters/other-cluster.json';
    await w.store.put(planted, 'kind: ConfigMap\nmetadata: {name: other-cluster-material}\n');
    const receipt = buildReceipt({
      owner: REF,
      uid: REF.uid,
      generation: 1,
      runId: 'forged',
      startedAt: new Date(NOW),
      endedAt: new Date(NOW),
      trail: { stages: [] },
      render: { key: planted, private: false },
    });
    await w.store.put(receiptKey(REF, RECEIPT_ID), JSON.stringify({ ...receipt, id: RECEIPT_ID }));
    w.runner.on('kapp', { stdout: 'Succeeded' });
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    if (next) await dispatchEvent(next, w.deps);
    expect(w.tools()).toEqual([]);
    expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(
      `Rolling back: receipt "${RECEIPT_ID}" names no rendered manifest`,
    );
  });

  it('a rollback cleared (rollback-to: "") runs at once from the spec: fetch', async () => {
    const w = appWorld({
      app: appObject({ status: RECENT, metadata: { annotations: { [ROLLBACK_TO_ANNOTATION]: '' } } }),
      tmpRoot: path.join(tempDir(), 'scratch'),
    });
    w.runner.on('vendir', vendirWrites());
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(next?.type).toBe('dev.kapp-lambda.stage.template.v1');
    expect(w.tools()).toEqual(['vendir']);
  });

  it('a modified event of the reconciled generation of an App without rollback annotations is a duplicate: no run', async () => {
    const w = appWorld({ app: appObject({ status: RECENT }), tmpRoot: path.join(tempDir(), 'scratch') });
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(next).toBeUndefined();
    expect(w.tools()).toEqual([]);
    expect(w.statuses()).toEqual([]);
  });

  it('a rollback asked at an older generation no longer applies: the spec runs (fetch)', async () => {
    const w = appWorld({ app: appObject({ ...rolledBack(0), status: OLD }), tmpRoot: path.join(tempDir(), 'scratch') });
    w.runner.on('vendir', vendirWrites());
    await keep(w, true);
    const next = await dispatchEvent(objectEvent(REF, 'resync', { time: new Date(NOW) }), w.deps);
    expect(next?.type).toBe('dev.kapp-lambda.stage.template.v1');
    expect(w.tools()).toEqual(['vendir']);
  });
});

describe('the run announces itself alongside the fetch', () => {
  it('vendir starts while ReconcileStarted is being written; the handler returns only once it is', async () => {
    const w = appWorld({ app: appObject({}), tmpRoot: path.join(tempDir(), 'scratch') });
    const written: string[] = [];
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    Object.assign(w.deps, { events: new ReconcileEventRecorder({ repeatIntervalMs: 0 }) });
    Object.assign(w.deps.clusters, {
      eventWriter: () => ({
        async writeEvent(e: NewEvent) {
          await held;
          written.push(e.reason);
          return 'created' as const;
        },
      }),
    });
    let vendirStarted = false;
    w.runner.on(
      'vendir',
      vendirWrites('lock: vendir\n', () => {
        vendirStarted = true;
      }),
    );
    let returned = false;
    const handled = dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), w.deps).then((next) => {
      returned = true;
      return next;
    });
    while (!vendirStarted) await new Promise((r) => setImmediate(r));
    expect(written).toEqual([]);
    // The fetch stage ends (its log line): only the held Event write is left to keep the handler.
    // Waited for, not slept for: on a loaded machine a fixed sleep from vendir's start could end
    // before the fetch does, and a handler that did not wait for the write would pass unseen.
    while (!w.outcomes().some(([stage]) => stage === 'fetch')) await new Promise((r) => setImmediate(r));
    await new Promise((r) => setTimeout(r, 20));
    expect(returned).toBe(false);
    release();
    expect((await handled)?.type).toBe('dev.kapp-lambda.stage.template.v1');
    expect(written).toEqual(['ReconcileStarted']);
  });
});
