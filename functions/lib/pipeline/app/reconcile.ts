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
 *
 * The decision is the stage frame's first step (`../stage.ts` `openRun`), with the App's rules in
 * its `APP_KIND`; this file starts what follows it.
 */
import { randomUUID } from 'node:crypto';
import type { ObjectEvent } from '../../../../events/schema.js';
import type { FetchView } from '../../kube/port.js';
import type { PipelineDeps, RunContext, StageOutput } from '../deps.js';
import { type OpenedRun, openRun } from '../run.js';
import type { LoadedApp } from '../stage-inputs.js';
import { runFetch } from './fetch.js';
import { APP_KIND } from './kind.js';
import { activeRollback } from './receipts.js';
import { runRollback } from './rollback.js';

/**
 * Handles an object event for an App (the fetch function's entry point): {@link openRun} with
 * {@link APP_KIND}, then the delete path's hand-off, the rollback or the fetch.
 *
 * @returns the next stage's event (template, or delete for the deploy function), or none.
 * @throws KubeApiError / StoreError on infrastructure failures: the transport retries.
 */
export async function handleAppEvent(event: ObjectEvent, deps: PipelineDeps): Promise<StageOutput> {
  const opened = await openRun(deps, {
    stage: 'reconcile',
    event: event.data,
    view: (id) => deps.clusters.fetchView(id),
    kind: APP_KIND,
    // `ReconcileStarted` is written while the fetch runs: the run does not wait for it.
    announceAlongside: true,
  });
  if (opened.state === 'deleting') return { delete: runContext(opened.run) };
  if (opened.state !== 'run') return {};
  const { run } = opened;
  const ctx = runContext(run);
  try {
    // A rollback deploys a kept receipt's render instead of fetching and templating (`./rollback.ts`).
    const rollbackTo = activeRollback(run.loaded.raw);
    if (rollbackTo) return await runRollback(ctx, run.loaded, rollbackTo, deps, run.latest);
    return await runFetch(ctx, run.loaded, deps, run.latest);
  } finally {
    await opened.announced;
  }
}

/** The run an opened App event starts: a new run id, timed from the open. */
function runContext(run: OpenedRun<FetchView, LoadedApp>): RunContext {
  const { object } = run;
  return {
    clusterId: object.clusterId,
    ref: object,
    run: { generation: object.generation, runId: randomUUID(), startedAt: run.startedAt.toISOString() },
  };
}
