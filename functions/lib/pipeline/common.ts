/**
 * Pieces every stage handler shares: the App an event refers to and reading it, reading
 * referenced Secrets/ConfigMaps into the planners' shapes (`../kube/refs.ts`) and scratch
 * directories (`../exec/scratch.ts`), both re-exported here, THE App status write and the
 * stage-run log line. The stage frame (open, fence, close with the write policy)
 * is `./stage.ts`; the status summarizer and the abort watch are in `../reconcile/`.
 */
import type { ObjectRef } from '../../../events/schema.js';
import { type App, type AppStatus, parseApp } from '../api/index.js';
import { APP_API_VERSION, type FetchView, type KubeObject, type KubeReader, type ResourceRef } from '../kube/port.js';
import { type RunFence, type StatusBounds, type StatusWriteResult, writeStatus } from '../kube/status-write.js';
import { logStageRun, type StageOutcome } from '../log.js';
import {
  isFirstReconcile,
  type ReconcileCounts,
  type ReconcileObserver,
  reconcileObserver,
} from '../observe/reconcile.js';
import type { StageResult } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { omitEmptyStatusFields, usefulErrorMessage } from '../reconcile/status.js';
import { fitStatus, statusBudgetFor, tooLargeStatus } from '../reconcile/status-budget.js';
import type { PipelineDeps } from './deps.js';

export { makeScratch, removeScratch } from '../exec/scratch.js';
// Below the pipeline, where the planners' runs (`../fetch/run.ts`) use them too.
export { readRefs } from '../kube/refs.js';

/** The Kubernetes reference of the App an event refers to. */
export function appRef(ref: Pick<ObjectRef, 'namespace' | 'name'>): ResourceRef {
  return { apiVersion: APP_API_VERSION, kind: 'App', namespace: ref.namespace, name: ref.name };
}

/** `cluster/<kind>/namespace/name` (kind default `App`): the object key used in logs. */
export function objectKey(ref: Pick<ObjectRef, 'clusterId' | 'namespace' | 'name'> & { kind?: string }): string {
  return `${ref.clusterId}/${ref.kind ?? 'App'}/${ref.namespace}/${ref.name}`;
}

/** The App as read, raw (for status writes) and parsed (for decisions). */
export interface LoadedApp {
  raw: KubeObject;
  app: App;
}

/** Result of {@link loadApp}. */
export type LoadResult =
  | { kind: 'ok'; loaded: LoadedApp }
  | { kind: 'gone' }
  | { kind: 'invalid'; raw: KubeObject; message: string };

/**
 * Re-reads the App (functions never trust the event's copy: events are references).
 * An object the API server accepted but our schema rejects (only possible with a CRD older
 * than ours) is reported as `invalid` with the field path, so it can get a status, not a crash.
 *
 * @throws KubeApiError when the read fails (the run is retried).
 */
export async function loadApp(kube: KubeReader, ref: ResourceRef): Promise<LoadResult> {
  const raw = await kube.getObject(ref);
  if (!raw) return { kind: 'gone' };
  const parsed = parseApp(raw);
  if (!parsed.success) return { kind: 'invalid', raw, message: parsed.error.message };
  return { kind: 'ok', loaded: { raw, app: parsed.data } };
}

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
