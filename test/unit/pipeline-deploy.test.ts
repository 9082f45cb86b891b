/**
 * The deploy stage over its outcomes (review R6): one row per outcome, each asserting the exact
 * status writes (deploy is the run's last stage: a final status, or none), that no event follows,
 * and the stage's logged outcome. Called through `dispatchEvent` with a deploy event. Faked at
 * the ports: the shared fake cluster, the fake runner (kapp), a memory store holding the manifest.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { deleteEvent, deployEvent } from '../../events/schema.js';
import { type AppStatus, Finalizer } from '../../functions/lib/api/index.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { fetchArtifactKey } from '../../functions/lib/artifact/keys.js';
import type { ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { NewEvent } from '../../functions/lib/kube/port.js';
import { ReconcileEventRecorder } from '../../functions/lib/observe/events.js';
import { deployRecordKey } from '../../functions/lib/pipeline/app/deploy.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { KAPP_APPLYING_MARKER } from '../../functions/lib/reconcile/status.js';
import {
  type AppShape,
  type AppWorld,
  appObject,
  appWorld,
  changeApp,
  FETCH_PART,
  finalFailed,
  finalSucceeded,
  MANIFEST,
  MANIFEST_KEY,
  NOW,
  openStopRows,
  RECONCILING,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
  TEMPLATE_PART,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-deploy-');

const PARTS = { fetch: FETCH_PART, template: TEMPLATE_PART };
const DEPLOYED = { finished: true, exitCode: 0, stdout: 'Succeeded', startedAt: NOW, updatedAt: NOW };
const KAPP_FAILED = 'Deploying: Error (see .status.usefulErrorMessage for details)';
const UNSUPPORTED = 'Unsupported way to deploy';
const ALREADY_CANCELED = 'Deploying: Already canceled';

/** A run's final status as written for an App paused or canceled since (generation 2): marked held. */
function markedHeld(status: AppStatus): AppStatus {
  return { ...status, observedGeneration: 2, friendlyDescription: 'Canceled/paused' };
}

interface Row {
  /** The App in the cluster; `null`: none. */
  app: AppShape | null;
  /** Scripts kapp (default: prints `Succeeded`). */
  kapp?: (w: AppWorld) => ScriptedResult | (() => Promise<ScriptedResult>);
  statuses: AppStatus[];
  /** Whether the finalizer was added before kapp (`blockDeletion`). */
  finalizer: boolean;
  outcome: string;
  tools: string[];
}

const rows: Record<string, Row> = {
  'succeeded: the final status with every part of the run': {
    app: { status: SUCCEEDED_BEFORE },
    statuses: [finalSucceeded({ ...PARTS, deploy: DEPLOYED } as Partial<AppStatus>)],
    finalizer: true,
    outcome: 'succeeded',
    tools: ['kapp'],
  },
  'succeeded after Reconciling: the same one final write (deploy never defers)': {
    app: { status: RECONCILING },
    statuses: [finalSucceeded({ ...PARTS, deploy: DEPLOYED } as Partial<AppStatus>)],
    finalizer: true,
    outcome: 'succeeded',
    tools: ['kapp'],
  },
  'failed: kapp exits 1; usefulErrorMessage is the friendly stderr, as status.deploy': {
    app: { status: SUCCEEDED_BEFORE },
    // upstream's updateLastDeploy returns the friendly result (trimmed, `\s+\n` → `\n`)
    kapp: () => ({ stderr: 'kapp: Error: Applying create configmap \n', exitCode: 1 }),
    statuses: [
      finalFailed(KAPP_FAILED, 'kapp: Error: Applying create configmap', {
        ...PARTS,
        deploy: {
          finished: true,
          exitCode: 1,
          stderr: 'kapp: Error: Applying create configmap',
          error: KAPP_FAILED,
          startedAt: NOW,
          updatedAt: NOW,
        },
      } as Partial<AppStatus>),
    ],
    finalizer: true,
    outcome: 'failed',
    tools: ['kapp'],
  },
  'invalid: a deploy without kapp fails before any tool runs, and so does inspect': {
    app: { status: SUCCEEDED_BEFORE, spec: { deploy: [{}] } },
    statuses: [
      finalFailed(UNSUPPORTED, UNSUPPORTED, {
        ...PARTS,
        deploy: { finished: true, exitCode: -1, error: UNSUPPORTED, startedAt: NOW, updatedAt: NOW },
        // upstream's inspect() checks the entry too, whether inspect is asked for or not
        inspect: { exitCode: -1, error: 'Unsupported way to inspect', updatedAt: NOW },
      } as Partial<AppStatus>),
    ],
    finalizer: true,
    outcome: 'failed',
    tools: [],
  },
  ...openStopRows({ finalizer: false }),
  'stale but paused: paused while kapp ran, the run still writes its result': {
    app: { status: SUCCEEDED_BEFORE },
    kapp: (w) => async () => {
      changeApp(w, 'paused');
      return { stdout: 'Succeeded' };
    },
    // the result and the held spec's mark, in one write (reference §3.10)
    statuses: [markedHeld(finalSucceeded({ ...PARTS, deploy: DEPLOYED } as Partial<AppStatus>))],
    finalizer: true,
    outcome: 'succeeded',
    tools: ['kapp'],
  },
  // upstream's cancel channel is closed before kapp starts (reference §3.10): no kapp, ReconcileFailed
  'canceled since the run started: kapp never starts, Deploying: Already canceled, marked Canceled/paused': {
    app: { generation: 2, spec: { canceled: true } },
    statuses: [
      markedHeld(
        finalFailed(ALREADY_CANCELED, ALREADY_CANCELED, {
          ...PARTS,
          deploy: { finished: true, exitCode: -1, error: ALREADY_CANCELED, startedAt: NOW, updatedAt: NOW },
        } as Partial<AppStatus>),
      ),
    ],
    finalizer: true,
    outcome: 'failed',
    // asked with an aborted signal: the runner answers `Already canceled` without a process
    tools: ['kapp'],
  },
  'paused since the run started: the run deploys (upstream finishes it), marked Canceled/paused': {
    app: { generation: 2, spec: { paused: true } },
    statuses: [markedHeld(finalSucceeded({ ...PARTS, deploy: DEPLOYED } as Partial<AppStatus>))],
    finalizer: true,
    outcome: 'succeeded',
    tools: ['kapp'],
  },
  'stale: the spec changed while kapp ran, the result is dropped (the next run owns the status)': {
    app: { status: SUCCEEDED_BEFORE },
    kapp: (w) => async () => {
      changeApp(w, 'generation');
      return { stdout: 'Succeeded' };
    },
    statuses: [],
    finalizer: true,
    outcome: 'stale',
    tools: ['kapp'],
  },
};

async function deployOnce(row: Row, manifest = true) {
  const w = appWorld({ ...(row.app ? { app: appObject(row.app) } : {}), tmpRoot: path.join(tempDir(), 'scratch') });
  if (manifest) await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
  const kapp = row.kapp?.(w) ?? { stdout: 'Succeeded' };
  w.runner.on('kapp', typeof kapp === 'function' ? () => kapp() : kapp);
  return { w, next: await dispatchDeploy(w) };
}

/** Dispatches the deploy event of {@link RUN} (the fetch and template parts done) in `w`. */
async function dispatchDeploy(w: AppWorld) {
  const data = {
    object: REF,
    run: RUN,
    artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey: MANIFEST_KEY },
    ...{ fetchStatus: FETCH_PART, templateStatus: TEMPLATE_PART },
  };
  return await dispatchEvent(deployEvent(data, { time: new Date(NOW) }), w.deps);
}

describe('deploy stage table', () => {
  it.each(Object.entries(rows))('%s', async (_name, row) => {
    const { w, next } = await deployOnce(row);
    expect(w.statuses()).toEqual(row.statuses);
    expect(next).toBeUndefined();
    expect(w.app()?.metadata.finalizers ?? []).toEqual(row.finalizer ? [Finalizer.App] : []);
    expect(w.outcomes()).toEqual([['deploy', row.outcome]]);
    expect(w.tools()).toEqual(row.tools);
  });

  it('a manifest missing from the store: the stage throws (restart), writes no status, runs no kapp', async () => {
    const row = rows['succeeded: the final status with every part of the run']!;
    const run = deployOnce(row, false);
    await expect(run).rejects.toThrow(`manifest ${MANIFEST_KEY} is missing from the object store`);
  });
});

describe('deploy progress', () => {
  // Upstream's every sync sets `Reconciling` before kapp runs; a resync here writes nothing at
  // its start, so once kapp changes the cluster its progress must say `Reconciling`, or kapp's
  // wait rule on Apps reads the last `ReconcileSucceeded` beside an unfinished deploy.
  it('a resync whose kapp starts applying writes its progress as Reconciling, then the final status', async () => {
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE }),
      tmpRoot: path.join(tempDir(), 'scratch'),
      config: { deployProgressIntervalMs: 5 },
    });
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
    w.runner.on('kapp', async (req) => {
      req.onOutput?.(`Changes\n${KAPP_APPLYING_MARKER}1 changes [0/1 done] ----\n`, 'stdout');
      await vi.waitFor(() => expect(w.statuses().length).toBeGreaterThan(0));
      return { stdout: 'Succeeded' };
    });
    await dispatchDeploy(w);
    const [progress, ...rest] = w.statuses();
    expect(progress?.deploy?.finished).toBe(false);
    expect(progress?.conditions?.map((c) => c.type)).toEqual(['Reconciling']);
    expect(progress?.friendlyDescription).toBe('Reconciling');
    expect(rest.at(-1)?.deploy?.finished).toBe(true);
    expect(rest.at(-1)?.conditions?.map((c) => c.type)).toEqual(['ReconcileSucceeded']);
  });
});

describe('delete stage', () => {
  const live = { status: SUCCEEDED_BEFORE, metadata: { finalizers: [Finalizer.App] } };
  const deleting = { ...live, metadata: { ...live.metadata, deletionTimestamp: NOW } };
  it.each<[string, AppShape, number, string, string[], string[]]>([
    ['deleting: kapp delete runs, the finalizer goes', deleting, 1, 'deleted', ['kapp'], []],
    ['live (no deletionTimestamp): gone, nothing written, no tool', live, 1, 'gone', [], [Finalizer.App]],
    ['live, the event naming another generation: gone', live, 99, 'gone', [], [Finalizer.App]],
  ])('%s', async (_name, app, generation, outcome, tools, finalizers) => {
    const w = appWorld({ app: appObject(app), tmpRoot: path.join(tempDir(), 'scratch') });
    w.runner.on('kapp', { stdout: 'Succeeded' });
    const next = await dispatchEvent(
      deleteEvent({ object: REF, run: { ...RUN, generation } }, { time: new Date(NOW) }),
      w.deps,
    );
    expect(next).toBeUndefined();
    expect(w.outcomes()).toEqual([['delete', outcome]]);
    expect(w.tools()).toEqual(tools);
    expect(w.app()?.metadata.finalizers ?? []).toEqual(finalizers);
    if (outcome === 'gone') expect(w.statuses()).toEqual([]);
  });
});

describe('no-op resync (the deploy record)', () => {
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
  const CM_LIST = `/api/v1/namespaces/${REF.namespace}/configmaps`;

  /** A world with a keyring and an App reader serving `items()` for the ConfigMap list. */
  function world(items: () => unknown[]) {
    // Every reconcile Event the runs write (no repeat suppression: each run's Events show).
    const events: NewEvent[] = [];
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE }),
      tmpRoot: path.join(tempDir(), 'scratch'),
      extra: {
        events: new ReconcileEventRecorder({ repeatIntervalMs: 0 }),
        keyring: new DerivedKeyring(Buffer.alloc(32, 7)),
        appReader: () => ({
          send: async (req) =>
            req.path === '/api/v1'
              ? { statusCode: 200, body: { resources: [{ name: 'configmaps', kind: 'ConfigMap', namespaced: true }] } }
              : req.path === CM_LIST
                ? { statusCode: 200, body: { items: items() } }
                : { statusCode: 404, body: {} },
        }),
      },
    });
    Object.assign(w.deps.clusters, {
      eventWriter: () => ({
        async writeEvent(e: NewEvent) {
          events.push(e);
          return 'created' as const;
        },
      }),
    });
    // kapp prints `Succeeded` and leaves its app metadata where it is asked to
    w.runner.on('kapp', kappWith('Succeeded'));
    return Object.assign(w, { events });
  }
  /** A kapp deploy that prints `stdout` and leaves its app metadata where it is asked to. */
  const kappWith = (stdout: string) => async (req: { args: readonly string[] }) => {
    const file = req.args[req.args.indexOf('--app-metadata-file-output') + 1] as string;
    await writeFile(
      file,
      `labelKey: kapp.k14s.io/app\nlabelValue: "123"\nlastChange: {namespaces: [${REF.namespace}]}\nusedGKs: [{Group: "", Kind: ConfigMap}]\n`,
    );
    return { stdout };
  };
  const deploy = async (w: AppWorld) => {
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
    await dispatchDeploy(w);
  };

  it('the same run again ends as the last deploy without kapp; an edited object runs kapp', async () => {
    let live = [LIVE];
    const w = world(() => live);
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    const first = w.statuses().at(-1) as AppStatus;
    expect(first.deploy?.kapp?.associatedResources?.label).toBe('kapp.k14s.io/app=123');

    // the status the first run wrote is the App's now: the resync's deploy reuses it, and as it
    // changed nothing (same outputs, same conditions) it writes no status at all
    const written = w.statuses().length;
    const app = w.app();
    const eventsBefore = w.events.length;
    expect(w.events.map((e) => e.reason)).toContain('ReconcileSucceeded');
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    expect(w.outcomes().at(-1)).toEqual(['deploy', 'cached']);
    expect(w.statuses()).toHaveLength(written);
    expect(w.app()).toEqual(app);
    // nor any Event: a run that changed nothing is not news
    expect(w.events).toHaveLength(eventsBefore);

    // a status-only write is not drift; an edit is, and kapp runs and its status is written
    live = [{ ...LIVE, metadata: { ...LIVE.metadata, resourceVersion: '6' }, status: { seen: true } } as never];
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    expect(w.statuses()).toHaveLength(written);
    live = [{ ...LIVE, metadata: { ...LIVE.metadata, resourceVersion: '7' }, data: { a: 'hand' } }];
    w.runner.on('kapp', async () => ({ stdout: 'applying 1 changes\nSucceeded' }));
    await deploy(w);
    expect(w.tools()).toEqual(['kapp', 'kapp']);
    expect(w.outcomes().at(-1)).toEqual(['deploy', 'succeeded']);
    expect(w.statuses()).toHaveLength(written + 1);
    expect(w.events.slice(eventsBefore).map((e) => e.reason)).toEqual(['ReconcileSucceeded']);
    const reverted = w.statuses().at(-1) as AppStatus;
    expect(reverted.deploy?.stdout).toBe('applying 1 changes\nSucceeded');
    expect(reverted.conditions).toEqual(first.conditions);
    expect(reverted.consecutiveReconcileSuccesses).toBe((first.consecutiveReconcileSuccesses ?? 0) + 1);
  });

  it('a run whose kapp changed the cluster keeps no record: the next runs kapp again, and a run that applied nothing keeps it', async () => {
    const w = world(() => [LIVE]);
    w.runner.once('kapp', kappWith('12:00:00AM: ---- applying 1 changes [0/1 done] ----\nSucceeded'));
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    expect(await w.store.get(await deployRecordKey(w.deps, REF))).toBeUndefined();
    // A write under kapp's name while it ran could be in what it left: kapp runs once more.
    await deploy(w);
    expect(w.tools()).toEqual(['kapp', 'kapp']);
    expect(w.outcomes().at(-1)).toEqual(['deploy', 'succeeded']);
    // It applied nothing: its record is kept, and the next run ends without kapp.
    await deploy(w);
    expect(w.tools()).toEqual(['kapp', 'kapp']);
    expect(w.outcomes().at(-1)).toEqual(['deploy', 'cached']);
  });

  it('a first deploy that changed the cluster sends no DELETE for a record it found absent; a kept one is removed', async () => {
    let live = [LIVE];
    const w = world(() => live);
    const key = await deployRecordKey(w.deps, REF);
    const deletes: string[] = [];
    const del = w.store.delete.bind(w.store);
    w.store.delete = async (k) => {
      deletes.push(k);
      return await del(k);
    };
    const applying = kappWith('12:00:00AM: ---- applying 1 changes [0/1 done] ----\nSucceeded');
    w.runner.once('kapp', applying);
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    expect(deletes).toEqual([]);
    // a run that applied nothing keeps its record; the next one that changes the cluster removes it
    await deploy(w);
    expect(await w.store.get(key)).toBeDefined();
    live = [{ ...LIVE, metadata: { ...LIVE.metadata, resourceVersion: '7' }, data: { a: 'hand' } }];
    w.runner.once('kapp', applying);
    await deploy(w);
    expect(w.tools()).toEqual(['kapp', 'kapp', 'kapp']);
    expect(deletes).toEqual([key]);
    expect(await w.store.get(key)).toBeUndefined();
  });

  it('a resync whose kapp run changed nothing (same output) writes no status; a failure does', async () => {
    const w = world(() => [LIVE]);
    await deploy(w);
    const written = w.statuses().length;
    // no deploy record (e.g. an App deploying to another cluster): kapp runs and applies nothing
    await w.store.delete(await deployRecordKey(w.deps, REF));
    await deploy(w);
    expect(w.tools()).toEqual(['kapp', 'kapp']);
    expect(w.statuses()).toHaveLength(written);
    // sync-mode periodic is upstream's behaviour exactly: the same no-op writes its status
    const app = w.app()!;
    w.cluster.put({
      ...app,
      metadata: { ...app.metadata, annotations: { 'kapp-lambda.carvel.dev/sync-mode': 'periodic' } },
    } as never);
    await w.store.delete(await deployRecordKey(w.deps, REF));
    await deploy(w);
    expect(w.statuses()).toHaveLength(written + 1);
    w.cluster.put(app as never);
    w.runner.on('kapp', async () => ({ stderr: 'kapp: Error: boom', exitCode: 1 }));
    await w.store.delete(await deployRecordKey(w.deps, REF));
    await deploy(w);
    expect(w.statuses()).toHaveLength(written + 2);
    expect((w.statuses().at(-1) as AppStatus).conditions?.[0]?.type).toBe('ReconcileFailed');
  });

  it('a new generation runs kapp whatever the cluster holds', async () => {
    const w = world(() => [LIVE]);
    await deploy(w);
    changeApp(w, 'generation');
    const gen = (w.app()?.metadata.generation ?? 0) as number;
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
    await dispatchEvent(
      deployEvent(
        {
          object: { ...REF, generation: gen },
          run: { ...RUN, generation: gen },
          artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey: MANIFEST_KEY },
          fetchStatus: FETCH_PART,
          templateStatus: TEMPLATE_PART,
        },
        { time: new Date(NOW) },
      ),
      w.deps,
    );
    expect(w.tools()).toEqual(['kapp', 'kapp']);
  });
});
