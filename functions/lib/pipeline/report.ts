/**
 * What a run reports, for every stage and kind: THE App status write ({@link writeAppStatus},
 * its bounds, and the failed status of an object our schema rejects, shared by Apps and
 * PackageRepositories, whose status is the App's), the stage-run log line ({@link stageTimer}),
 * the run's observer ({@link observerOf}) and a failed run's Event text ({@link eventErrorText}).
 */

import type { ObjectRef } from '../../../events/schema.js';
import type { AppStatus } from '../api/index.js';
import type { FetchView, KubeObject, ResourceRef } from '../kube/port.js';
import { type RunFence, type StatusBounds, type StatusWriteResult, writeStatus } from '../kube/status-write.js';
import { logStageRun, type StageOutcome } from '../log.js';
import {
  isFirstReconcile,
  type ReconcileCounts,
  type ReconcileObserver,
  reconcileObserver,
} from '../observe/reconcile.js';
import { resultFromError, type StageResult } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { omitEmptyStatusFields, summarizeStatus, usefulErrorMessage } from '../reconcile/status.js';
import { fitStatus, statusBudgetFor, tooLargeStatus } from '../reconcile/status-budget.js';
import type { PipelineDeps } from './deps.js';
/**
 * The size discipline of every App status write (`reconcile/status-budget.ts`): the status is
 * fitted to the object's budget ({@link statusBudgetFor}: 1 MiB, less when the spec is large),
 * and a status the API server still rejects as too large is replaced by
 * {@link tooLargeStatus} (`ReconcileFailed`, or `DeleteFailed` during a delete, with a short
 * message) instead of being retried.
 *
 * @param generation - `observedGeneration` of the fallback status (the run's generation).
 */
export function appStatusBounds(generation: number): StatusBounds<AppStatus> {
  return {
    fit: (status, object) =>
      fitStatus(status, statusBudgetFor(object as unknown as Record<string, unknown>), generation),
    tooLarge: (current, attempted, error) =>
      omitEmptyStatusFields(tooLargeStatus(current, attempted, generation, error.message)),
  };
}

/**
 * Writes a status computed from the current one, fenced by the run (see `writeStatus`), with
 * upstream's `omitempty` fields dropped when empty ({@link omitEmptyStatusFields}). THE one
 * path of App status writes: every status is bounded by {@link appStatusBounds} here, and,
 * with `mask`, every string of it has the run's Secret values masked (a last pass: stages mask
 * each tool result as it returns, before any cut, see `../reconcile/secret-mask.ts`).
 *
 * @param read - the object as just read, planned on instead of a first GET (see `writeStatus`)
 */
export async function writeAppStatus(
  kube: FetchView,
  ref: ResourceRef,
  fence: RunFence,
  mutate: (current: AppStatus | undefined) => AppStatus,
  mask?: SecretMask,
  read?: { object: KubeObject | undefined },
): Promise<StatusWriteResult> {
  return await writeStatus<AppStatus>(
    kube,
    ref,
    fence,
    (cur) => omitEmptyStatusFields(mask ? mask.deep(mutate(cur)) : mutate(cur)),
    appStatusBounds(fence.generation),
    read,
  );
}

/** Helper for one stage-run log line and its timing. */
export function stageTimer(deps: PipelineDeps, stage: string, object: string, generation: number) {
  const started = performance.now();
  return (outcome: StageOutcome, extra: { error?: string; tools?: { runs: number; ms: number } } = {}) =>
    logStageRun(deps.log, {
      object,
      stage,
      generation,
      durationMs: Math.round(performance.now() - started),
      outcome,
      ...extra,
    });
}

/**
 * The observer (metrics and Events, `../observe/reconcile.ts`) of a run of `object`, with the
 * pipeline's sinks and the Event writer of the object's cluster (looked up when an Event is
 * written, so the embedded runtime's leadership gate applies).
 *
 * @param status - the object's status as the run found it (decides `firstReconcile`).
 */
export function observerOf(
  deps: PipelineDeps,
  object: Pick<ObjectRef, 'clusterId' | 'kind' | 'apiVersion' | 'namespace' | 'name' | 'uid'>,
  status: ReconcileCounts | null | undefined,
): ReconcileObserver {
  return reconcileObserver(
    {
      metrics: deps.metrics,
      events: deps.events,
      eventWriter: () => deps.clusters.eventWriter?.(object.clusterId),
      log: deps.log,
    },
    object,
    isFirstReconcile(status),
  );
}

/**
 * The error text of a failed run's `ReconcileFailed` / `DeleteFailed` Event: what the status's
 * `usefulErrorMessage` shows (the failing tool's stderr, else the stage-prefixed error; the text
 * kapp's wait rule reports for an App), redacted with the run's mask and without the final
 * newline. The stage error alone ("Templating dir: Error (see .status.usefulErrorMessage for
 * details)") would send Event readers back to the status.
 */
export function eventErrorText(result: Pick<StageResult, 'error' | 'stderr'>, mask: SecretMask): string {
  return mask.redact(usefulErrorMessage(result.error ?? '', result.stderr)).trimEnd();
}

/**
 * The status of an App-shaped object our schema rejects (the API server accepted it: only
 * possible with a CRD older than ours): a failed reconcile with the schema's message prefixed
 * `Reconciling: `, as upstream fails a reconcile it cannot start, so the object gets a status
 * instead of a crash on every event. Apps and PackageRepositories share it (their status is the
 * App's).
 *
 * @param status - the status as read; its conditions and counts are carried on.
 * @param generation - the generation the failure is observed for.
 */
export function invalidAppStatus(status: AppStatus | undefined, generation: number, message: string): AppStatus {
  return summarizeStatus(status, generation, {}, resultFromError(message, 'Reconciling: '));
}
