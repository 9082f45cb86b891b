/**
 * The first step of every App event (the fetch function's entry): re-read the App and
 * decide what this event means, as `pkg/app/app_reconcile.go` `Reconcile`:
 *
 * - gone → nothing (the App was deleted and its finalizer already removed);
 * - `deletionTimestamp` → the delete path (deploy function), when our finalizer is on it;
 * - `spec.canceled` / `spec.paused` → `observedGeneration` + `Canceled/paused`, nothing else;
 * - not forced and not due by the timer (§3.3) → a no-op (no tool, no write);
 * - status still `Reconciling` for this generation where no run can be in flight
 *   (`config.oneRunPerObject`, the embedded queue) → forced: that run was lost;
 * - otherwise → a new run: `Reconciling` is written at once when the spec changed
 *   (`generation != observedGeneration`), else deferred to the end (§3.4), then fetch.
 *
 * Forced: `added`, `ref-changed` (a referenced Secret/ConfigMap changed, upstream's force
 * flag), `modified` of an App with the rollback annotations of `./receipts.ts` (they changed) and
 * any generation change. An App rolled back for its generation runs `./rollback.ts` instead of
 * the fetch. `resync` relies on the timer, so a duplicated resync
 * event after a run is a no-op.
 */
import { randomUUID } from 'node:crypto';
import type { ObjectEvent } from '../../../events/schema.js';
import { Finalizer } from '../api/index.js';
import type { KubeObject } from '../kube/port.js';
import { resultFromError } from '../reconcile/result.js';
import { markPausedOrCanceled, markReconciling, summarizeStatus, writesImmediately } from '../reconcile/status.js';
import { isReadyAt } from '../reconcile/timer.js';
import { appRef, loadApp, objectKey, observerOf, stageTimer, writeAppStatus } from './common.js';
import type { PipelineDeps, RunContext, StageOutput } from './deps.js';
import { runFetch } from './fetch.js';
import { activeRollback, hasRollbackAnnotation } from './receipts.js';
import { runRollback } from './rollback.js';

/** Tolerance for a resync event that arrives a little before the timer says due, ms. */
const RESYNC_EARLY_TOLERANCE_MS = 1000;

/**
 * Handles an object event for an App (the fetch function's entry point).
 *
 * @returns the next stage's event (template, or delete for the deploy function), or none.
 * @throws KubeApiError / StoreError on infrastructure failures: the transport retries.
 */
export async function handleAppEvent(event: ObjectEvent, deps: PipelineDeps): Promise<StageOutput> {
  const ref = event.data;
  const key = objectKey(ref);
  const kube = deps.clusters.fetchView(ref.clusterId);
  const kref = appRef(ref);
  const loaded = await loadApp(kube, kref);
  const done = stageTimer(deps, 'reconcile', key, ref.generation);
  if (loaded.kind === 'gone') {
    done('gone');
    return {};
  }
  if (loaded.kind === 'invalid') {
    // The API server accepted it, but it does not fit the App type we reconcile: say so in
    // status (as a failed reconcile) instead of crashing on every event.
    const meta = loaded.raw.metadata;
    const fence = { uid: meta.uid, generation: meta.generation ?? 0 };
    await writeAppStatus(
      kube,
      kref,
      fence,
      (cur) => summarizeStatus(cur, fence.generation, {}, resultFromError(loaded.message, 'Reconciling: ')),
      undefined,
      { object: loaded.raw },
    );
    done('failed', { error: loaded.message });
    return {};
  }
  const { raw, app } = loaded.loaded;
  const generation = raw.metadata.generation ?? 0;
  const fence = { uid: raw.metadata.uid, generation };
  const ctx: RunContext = {
    clusterId: ref.clusterId,
    ref: {
      clusterId: ref.clusterId,
      kind: 'App',
      apiVersion: raw.apiVersion,
      namespace: raw.metadata.namespace ?? ref.namespace,
      name: raw.metadata.name,
      uid: raw.metadata.uid,
      generation,
      resourceVersion: raw.metadata.resourceVersion,
    },
    run: { generation, runId: randomUUID(), startedAt: deps.now().toISOString() },
  };
  // Upstream `InitMetrics`, on every reconcile of a live App.
  const observe = observerOf(deps, ctx.ref, app.status);
  observe.init();

  if (app.metadata.deletionTimestamp) {
    const ours = (app.metadata.finalizers ?? []).includes(Finalizer.App);
    done(ours ? 'deleted' : 'gone');
    return ours ? { delete: ctx } : {};
  }
  if (app.spec.canceled || app.spec.paused) {
    await writeAppStatus(kube, kref, fence, (cur) => markPausedOrCanceled(cur, generation), undefined, {
      object: raw,
    });
    done('paused');
    return {};
  }
  const specChanged = app.status?.observedGeneration !== generation;
  // Only where no other run of this App can be in flight (`oneRunPerObject`): its run was lost.
  const lostRun = !specChanged && deps.config.oneRunPerObject === true && writesImmediately(app.status);
  if (lostRun) {
    deps.log.warn(
      { object: key, generation, reason: event.data.reason },
      'run left in flight (Reconciling); running again',
    );
  }
  // `modified` with the spec unchanged on an App with rollback annotations: they changed (the
  // forwarder's App change key), so the App is deployed from (or back off) a receipt's render at
  // once. For any other App a `modified` of the same generation is a duplicate: no run.
  const forced =
    specChanged ||
    lostRun ||
    event.data.reason === 'added' ||
    event.data.reason === 'ref-changed' ||
    (event.data.reason === 'modified' && hasRollbackAnnotation(raw));
  const now = deps.now();
  if (!forced && !isReadyAt(app, new Date(now.getTime() + RESYNC_EARLY_TOLERANCE_MS), { config: deps.config.timer })) {
    done('noop');
    return {};
  }
  // The App was just read: the status write plans on it, no second read.
  let latest: KubeObject | undefined = raw;
  if (specChanged) {
    const w = await writeAppStatus(kube, kref, fence, (cur) => markReconciling(cur, generation), undefined, {
      object: raw,
    });
    if (w.outcome === 'gone' || w.outcome === 'stale') {
      done(w.outcome);
      return {};
    }
    latest = w.object;
  }
  done('succeeded');
  // Upstream `setReconciling`: attempt + 1 (and our `ReconcileStarted` Event).
  await observe.started();
  // A rollback deploys a kept receipt's render instead of fetching and templating (`./rollback.ts`).
  const rollbackTo = activeRollback(raw);
  if (rollbackTo) return await runRollback(ctx, loaded.loaded, rollbackTo, deps, latest);
  return await runFetch(ctx, loaded.loaded, deps, latest);
}
