/**
 * Both ends of a run, framed once for every kind ({@link StageKind} of `./stage.ts`):
 * {@link openRun} is the first step of every object event (read, the failed status of an object
 * our schema rejects, delete, hold, due, and `Reconciling` on a spec change), as
 * `pkg/app/app_reconcile.go` `Reconcile` is one switch; a delete path opens with
 * {@link openDelete} (`Deleting`) and ends with {@link closeDelete}.
 */

import {
  DRIFT_CAUSE_PREFIX,
  type ObjectEventData,
  type ObjectRef,
  SOURCE_FAILED_CAUSE_PREFIX,
  SOURCE_MOVED_CAUSE_PREFIX,
} from '../../../events/schema.js';
import type { AppStatus } from '../api/index.js';
import type { FetchView, KubeObject, ResourceRef } from '../kube/port.js';
import type { RunFence, StatusWriteResult } from '../kube/status-write.js';
import type { ReconcileCounts, ReconcileObserver } from '../observe/reconcile.js';
import type { StageResult } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { markDeleteCompleted, markDeleting, summarizeStatus } from '../reconcile/status.js';
import { hasTrueCondition } from '../reconcile/timer.js';
import type { DeployStatus } from '../reconcile/types.js';
import { type PipelineDeps, secretMaskOf } from './deps.js';
import { eventErrorText, observerOf, stageTimer, writeAppStatus } from './report.js';
import { RESYNC_EARLY_TOLERANCE_MS, type StageDone, type StageKind } from './stage.js';
import { objectKey } from './stage-inputs.js';

/** An object event's run as {@link openRun} opened it: the object as read, its fence, log line and observer. */
export interface OpenedRun<V extends FetchView, L extends { raw: KubeObject }, S = AppStatus> {
  /** The view of the object's cluster the run holds. */
  kube: V;
  /** The object's Kubernetes reference. */
  ref: ResourceRef;
  /** The object as read (uid, generation, resourceVersion and namespace of the live object). */
  object: ObjectRef;
  /** The run's fence: the live uid and generation. */
  fence: RunFence;
  /** The object as read. */
  loaded: L;
  /** The kind of object. */
  kind: StageKind<L, S>;
  /** The log line of the open step (still open for a kind that {@link StageKind.keepsRunLine}). */
  done: StageDone;
  /** Metrics and Events of the run (`init` done). */
  observe: ReconcileObserver;
  /** The object as stored now: as read, or as the `Reconciling` write left it. */
  latest: KubeObject;
  /** When the run started (`run.startedAt`). */
  startedAt: Date;
}

/**
 * What {@link openRun} found. Every state but `deleting` and `run` ended the event (its log line
 * written): `gone` (no object, or deleted without our finalizer), `invalid` (a failed status
 * written), `held` (paused or canceled: marked), `not-due` (a no-op), `stale` (the `Reconciling`
 * write found a newer spec or the object gone).
 */
export type OpenRun<V extends FetchView, L extends { raw: KubeObject }, S = AppStatus> =
  | { state: 'gone' | 'invalid' | 'held' | 'not-due' | 'stale' }
  | { state: 'deleting'; run: OpenedRun<V, L, S> }
  | {
      state: 'run';
      run: OpenedRun<V, L, S>;
      /**
       * The `Reconciling` write of a spec change written alongside the run
       * ({@link StageKind.reconciling} `alongside`): await it before anything else is written.
       */
      reconciling?: Promise<StatusWriteResult>;
      /**
       * The run's `ReconcileStarted` (and `DriftDetected`) Events, written alongside the run when
       * {@link OpenRunInput.announceAlongside}: await it before the event's handler returns. Never
       * rejects (a failed Event write is logged and dropped).
       */
      announced?: Promise<void>;
    };

/** What {@link openRun} takes. */
export interface OpenRunInput<V extends FetchView, L extends { raw: KubeObject }, S> {
  /** The open step's name, for its log line (`reconcile`, `install`). */
  stage: string;
  /** The object event. */
  event: ObjectEventData;
  /** The view the run holds, for the object's cluster. */
  view: (clusterId: string) => V;
  /** The kind of object. */
  kind: StageKind<L, S>;
  /**
   * Writes the run's Events alongside the run instead of before it ({@link OpenRun} `announced`):
   * an Event never delays a reconcile (`../observe/events.ts`), so the first stage starts without
   * waiting for the API server to take it. The caller awaits `announced` before it returns.
   */
  announceAlongside?: boolean;
}

/**
 * The first step of every object event, as `pkg/app/app_reconcile.go` `Reconcile` (and
 * `pkg/pkgrepository/app_reconcile.go`, `pkg/packageinstall/packageinstall.go`): re-reads the
 * object (functions never trust the event's copy: events are references) and decides what the
 * event means:
 *
 * - gone → nothing;
 * - rejected by our schema → a failed reconcile in status ({@link StageKind.invalid});
 * - upstream `InitMetrics`, on every reconcile of a live object;
 * - `deletionTimestamp` → `deleting` when one of the kind's finalizers is on it, else gone;
 * - held (paused, canceled) → `observedGeneration` + the kind's paused text, nothing else
 *   (checked before the deletion for a kind that {@link StageKind.holdsDelete});
 * - not forced and not due by the kind's timer → a no-op (no tool, no write);
 * - otherwise a run: `Reconciling` is written when the spec changed
 *   (`generation != observedGeneration`), else deferred to the end (§3.4).
 *
 * @returns the state, with the opened run for `deleting` and `run`.
 * @throws KubeApiError when the read or a status write fails (the transport retries the event).
 */
export async function openRun<
  V extends FetchView,
  L extends { raw: KubeObject },
  S extends ReconcileCounts & { observedGeneration?: number },
>(deps: PipelineDeps, input: OpenRunInput<V, L, S>): Promise<OpenRun<V, L, S>> {
  const { event: ev, kind } = input;
  const kube = input.view(ev.clusterId);
  const ref = kind.ref(ev);
  const key = objectKey(ev);
  const done = stageTimer(deps, input.stage, key, ev.generation);
  const read = await kind.load(kube, ref);
  if (read.kind === 'gone') {
    done('gone');
    return { state: 'gone' };
  }
  if (read.kind === 'invalid') {
    const meta = read.raw.metadata;
    const fence = { uid: meta.uid, generation: meta.generation ?? 0 };
    const failed = (cur: S | undefined) => kind.invalid(cur, fence.generation, read.message);
    await kind.write(kube, ref, fence, failed, undefined, { object: read.raw });
    done('failed', { error: read.message });
    return { state: 'invalid' };
  }
  const { loaded } = read;
  const { raw } = loaded;
  const meta = raw.metadata;
  const generation = meta.generation ?? 0;
  const fence = { uid: meta.uid, generation };
  const object: ObjectRef = {
    clusterId: ev.clusterId,
    kind: ref.kind as ObjectRef['kind'],
    apiVersion: raw.apiVersion,
    namespace: meta.namespace ?? ev.namespace,
    name: meta.name,
    uid: meta.uid,
    generation,
    resourceVersion: meta.resourceVersion,
  };
  const observe = observerOf(deps, object, kind.status(loaded));
  observe.init();
  const opened = { kube, ref, object, fence, loaded, kind, done, observe, latest: raw, startedAt: deps.now() };
  const hold = async (): Promise<{ state: 'held' }> => {
    await kind.write(kube, ref, fence, (cur) => kind.markHeld(cur, generation), undefined, { object: raw });
    done('paused');
    return { state: 'held' };
  };
  if (kind.holdsDelete && kind.held(loaded)) return await hold();
  if (meta.deletionTimestamp) {
    const ours = kind.finalizers.some((f) => (meta.finalizers ?? []).includes(f));
    if (!ours || !kind.keepsRunLine) done(ours ? 'deleted' : 'gone');
    return ours ? { state: 'deleting', run: opened } : { state: 'gone' };
  }
  if (kind.held(loaded)) return await hold();
  const specChanged = kind.status(loaded)?.observedGeneration !== generation;
  const soon = new Date(deps.now().getTime() + RESYNC_EARLY_TOLERANCE_MS);
  if (!(await kind.due({ loaded, reason: ev.reason, specChanged, generation, key, kube, soon, deps }))) {
    done('noop');
    return { state: 'not-due' };
  }
  let reconciling: Promise<StatusWriteResult> | undefined;
  if (specChanged && kind.reconciling) {
    const { mark, alongside } = kind.reconciling;
    // The object was just read: the status write plans on it, no second read.
    const w = kind.write(kube, ref, fence, (cur) => mark(cur, generation), undefined, { object: raw });
    if (alongside) {
      reconciling = w;
      reconciling.catch(() => {}); // its failure is thrown where it is awaited
    } else {
      const written = await w;
      if (written.outcome === 'gone' || written.outcome === 'stale') {
        done(written.outcome);
        return { state: 'stale' };
      }
      if (written.object) opened.latest = written.object;
    }
  }
  if (!kind.keepsRunLine) done('succeeded');
  const drift = ev.cause?.startsWith(DRIFT_CAUSE_PREFIX) ? ev.cause : undefined;
  const announce = async () => {
    if (!kind.keepsRunLine) {
      // Upstream `setReconciling`: attempt + 1 (and our `ReconcileStarted` Event, not for a resync
      // of a generation that succeeded: an idle one changes nothing and writes nothing; a failing
      // object's retries and drift reverts still announce themselves).
      const settledResync =
        !specChanged && !drift && hasTrueCondition(kind.status(loaded)?.conditions, 'ReconcileSucceeded');
      await observe.started({ event: !settledResync });
    }
    if (drift) await observe.drift(drift);
  };
  if (drift) {
    deps.log.info({ object: key, generation, cause: drift }, 'reconciling for drift in deployed objects');
  } else if (ev.cause?.startsWith(SOURCE_MOVED_CAUSE_PREFIX)) {
    deps.log.info({ object: key, generation, cause: ev.cause }, 'reconciling for a moved source');
  } else if (ev.cause?.startsWith(SOURCE_FAILED_CAUSE_PREFIX)) {
    deps.log.info({ object: key, generation, cause: ev.cause }, 'reconciling for a source the poll cannot resolve');
  }
  const announced = input.announceAlongside ? announce().catch(() => {}) : await announce();
  return { state: 'run', run: opened, ...(reconciling ? { reconciling } : {}), ...(announced ? { announced } : {}) };
}

/**
 * A status write of an opened run ({@link openRun}): the kind's write, fenced on the run.
 *
 * @returns what `writeStatus` returns.
 * @throws what `writeStatus` throws.
 */
export function writeRunStatus<S>(
  run: Pick<OpenedRun<FetchView, { raw: KubeObject }, S>, 'kube' | 'ref' | 'fence' | 'kind'>,
  mutate: (current: S | undefined) => S,
): Promise<StatusWriteResult> {
  return run.kind.write(run.kube, run.ref, run.fence, mutate);
}

/** An open delete path ({@link openDelete}): what {@link closeDelete} ends it with. */
export interface DeleteFrame<V extends FetchView> {
  /** The view the delete holds. */
  kube: V;
  /** The object's Kubernetes reference. */
  ref: ResourceRef;
  /** The live uid and generation every write of the delete is fenced on. */
  fence: RunFence;
  /** The kind of object (its `DeleteFailed` Event text). */
  kind: Pick<StageKind<{ raw: KubeObject }>, 'deleteEventText'>;
  /** The run's Secret values, masked in all it writes. */
  mask: SecretMask;
  /** The `delete` log line. */
  done: StageDone;
  /** Metrics and Events of the delete (`deleting` counted). */
  observe: ReconcileObserver;
  /** When the delete started (`status.deploy.startedAt` of its kapp run). */
  startedAt: Date;
  /** The `Deleting` write, started by {@link openDelete}: await it before the delete's next write. */
  deleting: Promise<StatusWriteResult>;
}

/**
 * Opens a delete path (`reconcileDelete`): counts the deletion (`observe.deleting`) and starts
 * the `Deleting` write, planned on the object as just read; the caller awaits
 * {@link DeleteFrame.deleting} before its next write (a PackageRepository checks kapp's records
 * meanwhile, so kapp does not wait for a status write of an object that may hold ~1 MB inline).
 *
 * @param opened.done - the delete's log line; default `delete` of the object's generation.
 */
export function openDelete<V extends FetchView>(
  deps: PipelineDeps,
  kind: DeleteFrame<V>['kind'],
  opened: {
    kube: V;
    ref: ResourceRef;
    object: ObjectRef;
    raw: KubeObject;
    observe: ReconcileObserver;
    done?: StageDone;
  },
): DeleteFrame<V> {
  const { kube, ref, object, raw, observe } = opened;
  observe.deleting();
  const fence = { uid: raw.metadata.uid, generation: raw.metadata.generation ?? 0 };
  const done = opened.done ?? stageTimer(deps, 'delete', objectKey(object), object.generation);
  const mask = secretMaskOf(deps);
  const startedAt = deps.now();
  const deleting = writeAppStatus(kube, ref, fence, (cur) => markDeleting(cur, fence.generation), undefined, {
    object: raw,
  });
  deleting.catch(() => {}); // its failure is thrown where it is awaited
  return { kube, ref, fence, kind, mask, done, observe, startedAt, deleting };
}

/**
 * Ends a delete path: on success `finalize` (the finalizers removed, and what the kind keeps
 * until then), the `deleted` log line and Event; on failure `DeleteFailed` with the delete's
 * `status.deploy` (the finalizers stay: retried with the failure backoff), the `failed` line and
 * the `DeleteFailed` Event.
 *
 * @param input.deploy - `status.deploy` of the failed delete.
 * @throws what the status write or `finalize` throws (the transport retries the event).
 */
export async function closeDelete(
  frame: DeleteFrame<FetchView>,
  input: {
    result: StageResult;
    deploy: () => DeployStatus;
    tools: { runs: number; ms: number };
    finalize: () => Promise<void>;
  },
): Promise<void> {
  const { fence, mask, done, observe } = frame;
  const { result, tools } = input;
  if (!result.error) {
    await input.finalize();
    done('deleted', { tools });
    await observe.deleteCompleted(undefined);
    return;
  }
  const deploy = input.deploy();
  await writeAppStatus(
    frame.kube,
    frame.ref,
    fence,
    (cur) => markDeleteCompleted(summarizeStatus(cur, fence.generation, { deploy }), result),
    mask,
  );
  done('failed', { error: mask.redact(result.error), tools });
  await observe.deleteCompleted((frame.kind.deleteEventText ?? eventErrorText)(result, mask));
}
