/**
 * Health after deploy, written (issue 28 item 3): the fetch function (the one with App status
 * write) takes the forwarder's `dev.kapp-lambda.health.v1` event and writes the App's added
 * condition `kapp-lambda.carvel.dev/Healthy`, an Event on each change, and the health gauge.
 *
 * No kapp-controller field changes: the condition is appended after kapp-controller's own (which
 * stays `conditions[0]`, what `kubectl wait`, kctrl and every reader of `[0]` look at), and
 * written only while that one says the last reconcile ended (`ReconcileSucceeded` or
 * `ReconcileFailed`, observed at the App's generation). A reconcile's status write sets
 * `conditions` whole and so drops it; the forwarder sends the health again once the App settled.
 * kapp-controller has no such condition (upstream: `kapp deploy` waits once, nothing after).
 *
 * @module
 */

import { type HealthData, type HealthEvent, healthMessage } from '../../../../events/schema.js';
import { type AppStatus, type Condition, ConditionType, KappLambdaConditionType } from '../../api/index.js';
import type { ResourceRef } from '../../kube/port.js';
import { type StatusBounds, writeStatus } from '../../kube/status-write.js';
import type { EventReason } from '../../observe/events.js';
import { CONTROLLER_TYPE } from '../../observe/metrics.js';
import type { PipelineDeps } from '../deps.js';
import { appStatusBounds } from '../report.js';

/** The condition a health event is written as: type `kapp-lambda.carvel.dev/Healthy`, its status, reason and {@link healthMessage}. */
export function healthCondition(data: Pick<HealthData, 'status' | 'reason' | 'unhealthy'>): Condition {
  return {
    type: KappLambdaConditionType.Healthy,
    status: data.status,
    reason: data.reason,
    message: healthMessage(data),
  };
}

/**
 * `status` with its Healthy condition replaced by `condition` (appended after the others),
 * or `status` itself when it must not be written: no kapp-controller condition first, or one
 * that is not the end of a reconcile at `generation` (a reconcile or delete runs, or the spec
 * has not been reconciled yet). Only that condition changes: every other field is kept as is.
 * Pure (a status write may plan it several times).
 */
export function withHealthCondition(
  status: AppStatus | undefined,
  condition: Condition,
  generation: number,
): AppStatus | undefined {
  const first = status?.conditions?.[0];
  if (!status || !first || first.type === KappLambdaConditionType.Healthy) return status;
  if (first.type !== ConditionType.ReconcileSucceeded && first.type !== ConditionType.ReconcileFailed) return status;
  if (status.observedGeneration !== generation) return status;
  const others = (status.conditions ?? []).filter((c) => c.type !== KappLambdaConditionType.Healthy);
  return { ...status, conditions: [...others, condition] };
}

/**
 * {@link appStatusBounds}' fit for a status that may be absent (then nothing is fitted or
 * written); a status the API server rejects as too large is left as it was (no `ReconcileFailed`
 * for a condition of ours: the health is simply not shown).
 */
function healthBounds(generation: number): StatusBounds<AppStatus | undefined> {
  const app = appStatusBounds(generation);
  return {
    fit: (status, object) => (status === undefined ? status : app.fit(status, object)),
    tooLarge: (current) => current,
  };
}

const EVENT_REASON: Readonly<Record<HealthData['status'], EventReason>> = {
  True: 'Healthy',
  False: 'Unhealthy',
  Unknown: 'HealthProgressing',
};

/** What {@link applyHealth} did. */
export type HealthOutcome = 'written' | 'unchanged' | 'stale' | 'gone';

/**
 * Writes an App's health ({@link withHealthCondition}), fenced on the event's uid and
 * generation (a newer spec's health is not known yet: `stale`, nothing written). On a write, an
 * Event (`Healthy`, `Unhealthy` or `HealthProgressing`, the condition's message) when the status
 * changed, or when it is not `True` on an App whose reconcile had dropped the condition (a
 * healthy App's reconcile is not news; an unhealthy one's is), and the health gauge.
 *
 * @throws what the App read or the status write throws (the event is retried; the write is
 *   idempotent).
 */
export async function applyHealth(event: HealthEvent, deps: PipelineDeps): Promise<HealthOutcome> {
  const { object: ref } = event.data;
  const kube = deps.clusters.fetchView(ref.clusterId);
  const resource: ResourceRef = { apiVersion: ref.apiVersion, kind: 'App', namespace: ref.namespace, name: ref.name };
  const live = await kube.getObject(resource);
  if (!live || live.metadata.uid !== ref.uid) return 'gone';
  const condition = healthCondition(event.data);
  const before = ((live.status as AppStatus | undefined)?.conditions ?? []).find(
    (c) => c.type === KappLambdaConditionType.Healthy,
  );
  // Not `writeAppStatus`: its `omitempty` pass would touch fields of kapp-controller's; the
  // size bounds are the same (a status near its budget has its largest fields cut, as any write).
  const w = await writeStatus<AppStatus | undefined>(
    kube,
    resource,
    { uid: ref.uid, generation: ref.generation },
    (cur) => withHealthCondition(cur, condition, ref.generation),
    healthBounds(ref.generation),
    { object: live },
  );
  const object = `${ref.clusterId}/${ref.namespace}/${ref.name}`;
  if (w.outcome !== 'written') {
    deps.log.info({ object, status: condition.status, outcome: w.outcome }, 'health not written');
    return w.outcome;
  }
  deps.log.info({ object, status: condition.status, reason: condition.reason }, 'health written');
  deps.metrics?.health?.(
    { clusterId: ref.clusterId, controller: CONTROLLER_TYPE.App, namespace: ref.namespace, name: ref.name },
    event.data.status,
  );
  const changed = before ? before.status !== condition.status : condition.status !== 'True';
  if (changed) {
    await deps.events?.record(
      deps.clusters.eventWriter?.(ref.clusterId),
      { apiVersion: ref.apiVersion, kind: 'App', namespace: ref.namespace, name: ref.name, uid: ref.uid },
      EVENT_REASON[event.data.status],
      condition.message ?? '',
      deps.log,
    );
  }
  return 'written';
}
