/**
 * What the pipeline reports about one object's reconcile, in one place: kapp-controller's
 * counters and times (`./metrics.ts`) and the reconcile Events (`./events.ts`), at the points
 * where upstream registers them (`pkg/app/app_reconcile.go`):
 *
 * - every reconcile call of a live object: `init` (its counters at 0);
 * - a run starts (`setReconciling`): attempt + 1, Event `ReconcileStarted` (not for a resync of an
 *   unchanged generation: most change nothing); when drift asked for it, Event `DriftDetected`
 *   (ours) naming the change;
 * - each phase ends (fetch, template, deploy): its time;
 * - the run ends (`setReconcileCompleted`): success or failure + 1 (not for a PackageInstall,
 *   which upstream counts attempts of only), the overall time, Event `ReconcileSucceeded` (not
 *   when the run changed nothing and wrote no status) or `ReconcileFailed` (the error, redacted);
 * - a delete starts (`setDeleting`): delete attempt + 1;
 * - a delete ends (`setDeleteCompleted`): delete failed + 1 and Event `DeleteFailed`, or, on
 *   success, the object's counters are dropped (`DeleteMetrics`).
 *
 * Nothing here throws or fails a reconcile.
 *
 * @module
 */
import type { EventWriter } from '../kube/port.js';
import type { Logger } from '../log.js';
import type { EventObject, ReconcileEventRecorder } from './events.js';
import { CONTROLLER_TYPE, type MetricTarget, type ReconcileMetrics, type ReconcilePhase } from './metrics.js';

/** Where reports go (the pipeline's `metrics`, `events`, the cluster's Event writer, logger). */
export interface ObserveSinks {
  metrics?: ReconcileMetrics;
  events?: ReconcileEventRecorder;
  /** The cluster's Event writer, looked up when an Event is written; `undefined` writes none. */
  eventWriter?: () => EventWriter | undefined;
  log: Logger;
}

/** The object reconciled. */
export interface ObservedObject extends EventObject {
  clusterId: string;
  kind: 'App' | 'PackageInstall' | 'PackageRepository';
}

/** The status fields that say whether an object has finished a reconcile before. */
export interface ReconcileCounts {
  consecutiveReconcileSuccesses?: number;
  consecutiveReconcileFailures?: number;
  conditions?: ReadonlyArray<{ type: string }>;
}

/**
 * Upstream's `firstReconcile` label: the object has not finished a reconcile yet when the run
 * starts (both consecutive counters of its status are 0 or absent, and no condition shows an
 * outcome: a PackageInstall's status has no counters).
 */
export function isFirstReconcile(status: ReconcileCounts | null | undefined): boolean {
  if (status?.consecutiveReconcileSuccesses || status?.consecutiveReconcileFailures) return false;
  return !status?.conditions?.some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed');
}

/** Reports about one object; see the module comment for when each is called. */
export interface ReconcileObserver {
  init(): void;
  /**
   * @param opts - `event: false` counts the attempt without Event `ReconcileStarted`: a resync of
   *   an unchanged generation, which most often changes nothing (issue 24: an idle App costs the
   *   API server no write; a resync that does change or fails still ends in its Event).
   */
  started(opts?: { event?: boolean }): Promise<void>;
  /**
   * The run was asked for by drift in what the object deployed (the forwarder's `drift: ...`
   * cause): Event `DriftDetected` naming it (the run's kapp reverts it, as upstream's next sync
   * would).
   */
  drift(cause: string): Promise<void>;
  phase(phase: Exclude<ReconcilePhase, 'overall'>, seconds: number): void;
  /**
   * @param outcome - `error`: the run's error, redacted (absent: it succeeded); `pending`: the
   *   run ended without an outcome yet (a PackageInstall waiting for its App): time only;
   *   `unchanged`: it succeeded and changed nothing, so no status was written and no
   *   `ReconcileSucceeded` Event is either (the success is still counted, as upstream's sync).
   */
  completed(
    outcome: { error?: string; pending?: boolean; unchanged?: boolean },
    overallSeconds: number | undefined,
  ): Promise<void>;
  deleting(): void;
  /** @param error - the delete's error, redacted; absent: the object is gone. */
  deleteCompleted(error: string | undefined): Promise<void>;
}

/**
 * The observer of one object's run.
 *
 * @param firstReconcile - {@link isFirstReconcile} of the status the run started from.
 */
export function reconcileObserver(
  sinks: ObserveSinks,
  object: ObservedObject,
  firstReconcile: boolean,
): ReconcileObserver {
  const target: MetricTarget = {
    clusterId: object.clusterId,
    controller: CONTROLLER_TYPE[object.kind],
    namespace: object.namespace,
    name: object.name,
  };
  const { metrics, events, log } = sinks;
  const about: EventObject = {
    apiVersion: object.apiVersion,
    kind: object.kind,
    namespace: object.namespace,
    name: object.name,
    uid: object.uid,
  };
  const event = async (reason: Parameters<ReconcileEventRecorder['record']>[2], message: string) => {
    if (!events) return;
    let writer: EventWriter | undefined;
    try {
      writer = sinks.eventWriter?.();
    } catch (err) {
      log.debug({ err: (err as Error).message }, 'no event writer');
      return;
    }
    await events.record(writer, about, reason, message, log);
  };
  return {
    init: () => metrics?.init(target),
    async started(opts) {
      metrics?.count(target, 'attempt');
      if (opts?.event !== false) await event('ReconcileStarted', 'Reconcile started');
    },
    async drift(cause) {
      await event('DriftDetected', `${cause.replace(/^drift: /, 'Drift detected: ')}; reconciling to revert it`);
    },
    phase: (phase, seconds) => metrics?.time(target, phase, firstReconcile, seconds),
    async completed({ error, pending, unchanged }, overallSeconds) {
      if (overallSeconds !== undefined) metrics?.time(target, 'overall', firstReconcile, overallSeconds);
      if (pending) return;
      // Upstream counts a PackageInstall's attempts only (its App's outcome is the App's).
      if (object.kind !== 'PackageInstall') metrics?.count(target, error === undefined ? 'success' : 'failure');
      if (error === undefined && unchanged) return;
      if (error === undefined) await event('ReconcileSucceeded', 'Reconcile succeeded');
      else await event('ReconcileFailed', `Reconcile failed: ${error}`);
    },
    deleting: () => metrics?.count(target, 'deleteAttempt'),
    async deleteCompleted(error) {
      if (error === undefined) {
        metrics?.forget(target);
        return;
      }
      metrics?.count(target, 'deleteFailed');
      await event('DeleteFailed', `Delete failed: ${error}`);
    },
  };
}
