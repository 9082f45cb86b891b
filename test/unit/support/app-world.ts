/**
 * The shared builder of the stage tables (`pipeline-*.test.ts`): one App in a
 * {@link FakeCluster}, a {@link FakeCommandRunner}, a memory store and the stage deps over them
 * ({@link stageDeps}), plus readers of what a stage left behind (status writes, stage-run log
 * outcomes, tool calls).
 */
import { mkdtemp, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { ObjectRef, StageRun } from '../../../events/schema.js';
import type { App, AppStatus } from '../../../functions/lib/api/index.js';
import type { StageStatusSummary } from '../../../functions/lib/api/status.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../../functions/lib/artifact/keys.js';
import { packDir } from '../../../functions/lib/artifact/tarball.js';
import { FakeCommandRunner, type ScriptedResult } from '../../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../../functions/lib/exec/runner.js';
import { runFetch } from '../../../functions/lib/pipeline/app/fetch.js';
import type { DispatchDeps, PipelineConfig, StageOutput } from '../../../functions/lib/pipeline/deps.js';
import type { MemoryStore } from '../../../functions/lib/store/memory.js';
import { FakeCluster } from './fake-cluster.js';
import { stageDeps } from './stage-deps.js';

/** The fixed clock of every table: `2025-01-01T00:00:00Z`. */
export const NOW = '2025-01-01T00:00:00Z';

/** The App of the tables as events refer to it (generation 1). */
export const REF: ObjectRef = {
  clusterId: 'c1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'ns',
  name: 'app',
  uid: 'uid-1',
  generation: 1,
  resourceVersion: '1',
};

/** A PackageRepository `ns/repo` in the same cluster, as events refer to it (generation 1). */
export const PKGR_REF: ObjectRef = {
  clusterId: 'c1',
  kind: 'PackageRepository',
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  namespace: 'ns',
  name: 'repo',
  uid: 'uid-r',
  generation: 1,
  resourceVersion: '1',
};

/** A one-ConfigMap render, as the template stage stores it, and its artifact key. */
export const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
/** {@link MANIFEST}'s template artifact key. */
export const MANIFEST_KEY = templateArtifactKey(sha256Hex(MANIFEST));
/** The fetch stage's status summary a deploy event carries after a successful fetch. */
export const FETCH_PART: StageStatusSummary = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };
/** The template stage's status summary a deploy event carries after a successful template. */
export const TEMPLATE_PART: StageStatusSummary = { exitCode: 0, updatedAt: NOW };

/** The run of the stage events of the tables. */
export const RUN: StageRun = { generation: 1, runId: 'run-1', startedAt: NOW };

/** `spec` of the table App: a git fetch (never cached), ytt, kapp with a ServiceAccount. */
export const SPEC = {
  serviceAccountName: 'sa',
  fetch: [{ git: { url: 'https://git.example/repo', ref: 'origin/main' } }],
  template: [{ ytt: {} }],
  deploy: [{ kapp: {} }],
};

/** What {@link appObject} changes of the table App. */
export interface AppShape {
  generation?: number;
  spec?: Record<string, unknown>;
  status?: AppStatus;
  metadata?: Record<string, unknown>;
}

/** The table App, generation 1 with {@link SPEC}, changed by `shape`. */
export function appObject(shape: AppShape = {}): App {
  return {
    apiVersion: REF.apiVersion,
    kind: 'App',
    metadata: {
      name: REF.name,
      namespace: REF.namespace,
      uid: REF.uid,
      generation: shape.generation ?? 1,
      resourceVersion: '1',
      ...shape.metadata,
    },
    spec: { ...SPEC, ...shape.spec },
    ...(shape.status ? { status: shape.status } : {}),
  } as unknown as App;
}

/** A status whose last run of generation 1 succeeded: a new run of it defers its writes. */
export const SUCCEEDED_BEFORE: AppStatus = {
  observedGeneration: 1,
  conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
  friendlyDescription: 'Reconcile succeeded',
} as AppStatus;

/** A status announcing a run of generation 1 (`Reconciling`): stages write their parts now. */
export const RECONCILING: AppStatus = {
  observedGeneration: 1,
  conditions: [{ type: 'Reconciling', status: 'True' }],
  friendlyDescription: 'Reconciling',
} as AppStatus;

/** What {@link appWorld} takes. */
export interface WorldOptions {
  /** The App in the cluster; absent: none (gone). */
  app?: App;
  /** Scratch root of the stages (a per-file temp directory). */
  tmpRoot: string;
  /** Merged over the {@link stageDeps} default config. */
  config?: Partial<PipelineConfig>;
  /** Shared between worlds to test caches. */
  store?: MemoryStore;
  /** Other ports. */
  extra?: Partial<DispatchDeps>;
}

/**
 * One App in a fake cluster with a fake runner and the stage deps over them.
 *
 * @returns the cluster, runner, deps, logger and store, and readers of what a stage did
 */
export function appWorld(opts: WorldOptions) {
  const cluster = new FakeCluster();
  if (opts.app) cluster.put(opts.app as never);
  const runner = new FakeCommandRunner();
  const { deps, log, store } = stageDeps(cluster, {
    runner,
    store: opts.store,
    now: NOW,
    tmpRoot: opts.tmpRoot,
    config: {
      toolVersions: { vendir: '0.44.0', ytt: '0.55.3', kapp: '0.64.2' },
      // Long polls: the stage's own App re-reads happen only where a table row makes them.
      abortPollIntervalMs: 60_000,
      deployProgressIntervalMs: 60_000,
      ...opts.config,
    },
    extra: {
      // The table's git branch is one the fleet's source poll follows; its resolution fails here,
      // so the fetch runs by ref and is never cached, as the rows expect (the poll's own tests
      // are test/unit/source-poll.test.ts).
      resolveSource: async () => {
        throw new Error('no source poll in the stage tables');
      },
      ...opts.extra,
    },
  });
  return {
    cluster,
    runner,
    deps,
    log,
    store,
    /** The App as stored now. */
    app: () => cluster.get('App', REF.namespace, REF.name) as unknown as App | undefined,
    /** Every status written, in order. */
    statuses: () => cluster.statuses as AppStatus[],
    /** `[stage, outcome]` of each stage-run log line, in order. */
    outcomes: () =>
      log.records.filter((r) => r.msg === 'stage run').map((r) => [r.obj.stage, r.obj.outcome] as [string, string]),
    /** The tools run, by name. */
    tools: () => runner.calls.map((c) => c.cmd),
  };
}

/** A world of {@link appWorld}. */
export type AppWorld = ReturnType<typeof appWorld>;

/**
 * Runs the fetch stage of {@link RUN} on the world's App as the reconcile step read it: a copy,
 * so later changes to the cluster do not reach it.
 *
 * @returns the stage's output (the template stage's input on success)
 */
export async function fetchAsRead(world: AppWorld): Promise<StageOutput> {
  const app = structuredClone(world.app()!);
  const loaded = { raw: structuredClone(app) as never, app };
  return await runFetch({ clusterId: REF.clusterId, ref: REF, run: RUN }, loaded, world.deps);
}

/**
 * A scripted vendir that leaves `config.yml` in the fetch directory and prints `stdout`.
 *
 * @param then - runs while vendir "runs" (changes the cluster meanwhile).
 */
export function vendirWrites(stdout = 'lock: vendir\n', then?: () => void) {
  return async (req: RunRequest): Promise<ScriptedResult> => {
    await writeFile(path.join(req.cwd ?? '', 'config.yml'), 'a: 1\n');
    then?.();
    return { stdout, exitCode: 0 };
  };
}

/**
 * Changes the stored App: `generation` bumps the spec, `paused`/`canceled` set it in the spec
 * (bumping the generation as the API server does), `deleted` removes it, `recreated` gives the
 * name a new uid.
 */
export function changeApp(world: AppWorld, what: 'generation' | 'paused' | 'canceled' | 'deleted' | 'recreated'): void {
  const obj = world.cluster.get('App', REF.namespace, REF.name);
  if (!obj) throw new Error('no App to change');
  if (what === 'deleted') {
    world.cluster.objects.clear();
    return;
  }
  // Every change moves the resourceVersion, as the API server's.
  obj.metadata.resourceVersion = String(Number(obj.metadata.resourceVersion ?? 0) + 1);
  if (what === 'recreated') {
    obj.metadata.uid = 'uid-2';
    obj.status = undefined;
    return;
  }
  obj.metadata.generation = (obj.metadata.generation ?? 0) + 1;
  if (what !== 'generation') obj.spec = { ...(obj.spec as object), [what]: true };
}

/**
 * The final status of a failed run of generation 1, over the earlier status `before` (default
 * none: its other fields, such as an earlier inspect, stay).
 */
export function finalFailed(
  message: string,
  useful: string,
  parts: Partial<AppStatus>,
  before: Partial<AppStatus> = {},
): AppStatus {
  return {
    ...before,
    observedGeneration: 1,
    conditions: [{ type: 'ReconcileFailed', status: 'True', message }],
    friendlyDescription: `Reconcile failed: ${message}`,
    consecutiveReconcileFailures: 1,
    usefulErrorMessage: useful,
    ...parts,
  } as AppStatus;
}

/** The final status of a succeeded run of generation 1, over no earlier status. */
export function finalSucceeded(parts: Partial<AppStatus>): AppStatus {
  return {
    observedGeneration: 1,
    conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
    friendlyDescription: 'Reconcile succeeded',
    consecutiveReconcileSuccesses: 1,
    ...parts,
  } as AppStatus;
}

/**
 * The rows every stage that opens with a re-read shares (`openStage`): the App deleted, recreated
 * (another uid), with a newer spec, or paused. None writes a status or runs a tool.
 *
 * @param extra - the stage's own fields of a row that stops (its next event, finalizer, ...).
 */
export function openStopRows<T extends object>(extra: T) {
  const stop = (app: AppShape | null, outcome: 'gone' | 'stale' | 'paused') => ({
    app,
    statuses: [] as AppStatus[],
    outcome,
    tools: [] as string[],
    ...extra,
  });
  return {
    'gone: the App was deleted': stop(null, 'gone'),
    'gone: the App was recreated (another uid)': stop({ metadata: { uid: 'uid-2' } }, 'gone'),
    'stale: the spec changed since the run started': stop({ generation: 2, status: SUCCEEDED_BEFORE }, 'stale'),
    'paused: the App is paused': stop({ status: SUCCEEDED_BEFORE, spec: { paused: true } }, 'paused'),
  };
}

/**
 * Packs a fetch directory holding `config.yml` and stores it as the fetch stage would.
 *
 * @param dir - a temp directory for the fetched files.
 * @returns the fetch artifact's key.
 */
export async function putFetchArtifact(store: MemoryStore, dir: string): Promise<string> {
  const fetched = await mkdtemp(path.join(dir, 'fetched-'));
  await writeFile(path.join(fetched, 'config.yml'), 'a: 1\n');
  const packed = await packDir(fetched);
  const key = fetchArtifactKey(packed.sha256);
  await store.putIfAbsent(key, packed.tgz);
  return key;
}
