/**
 * Health after deploy: pure rules that tell, from one workload object as the forwarder's drift
 * watch sees it (`drift.ts`), whether it is healthy, still progressing or failed, and the
 * aggregation of an App's workloads into one verdict (issue 28 item 3). Nothing here keeps an
 * object: the drift watch computes a {@link ResourceHealth} in its handler and keeps only the
 * verdicts of workloads that are not healthy ({@link HealthIndex}), so an App of 1000 healthy
 * Deployments costs nothing.
 *
 * The rules are kapp's own wait rules read once the deploy is over (kapp
 * `pkg/kapp/resourcesmisc/apps_v1_deployment.go`, `apps_v1_stateful_set.go`,
 * `apps_v1_daemon_set.go`, `batch_v1_job.go`), which is what upstream's `ReconcileSucceeded`
 * meant at the time it was written: the difference is that they keep being applied afterwards.
 *
 * @module
 */

import type { KubeObject } from '../../functions/lib/kube/port.js';

/** A group and kind (`''` is the core group), as `drift.ts` keys its watches. */
export interface GroupKind {
  readonly group: string;
  readonly kind: string;
}

/** One workload's verdict: `ok` (healthy), `progressing` (moving towards healthy) or `failed`. */
export type ResourceHealth = 'ok' | 'progressing' | 'failed';

/** A workload's verdict and, when it is not `ok`, why (short, for a condition message). */
export interface HealthVerdict {
  readonly health: ResourceHealth;
  /** Why it is not healthy, e.g. `Available=False (MinimumReplicasUnavailable)`; absent when `ok`. */
  readonly why?: string;
}

/** `group/Kind` keys of the kinds whose health is judged: every other kind is healthy once applied. */
export const HEALTH_KINDS: ReadonlySet<string> = new Set([
  'apps/Deployment',
  'apps/StatefulSet',
  'apps/DaemonSet',
  'batch/Job',
]);

/** Whether objects of `gk` are judged by {@link resourceHealth} (their drift watch reads full objects). */
export function isHealthKind(gk: GroupKind): boolean {
  return HEALTH_KINDS.has(`${gk.group}/${gk.kind}`);
}

const OK: HealthVerdict = Object.freeze({ health: 'ok' });

type Rec = Record<string, unknown>;

function rec(v: unknown): Rec | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Rec) : undefined;
}

/** A non-negative integer field, or `fallback` when absent or malformed. */
function int(v: unknown, fallback: number): number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0 ? v : fallback;
}

/** The condition of `type` in `status.conditions`, when present. */
function condition(status: Rec | undefined, type: string): Rec | undefined {
  const list = status?.conditions;
  if (!Array.isArray(list)) return undefined;
  return list.map(rec).find((c) => c?.type === type);
}

function progressing(why: string): HealthVerdict {
  return { health: 'progressing', why };
}

function failed(why: string): HealthVerdict {
  return { health: 'failed', why };
}

/** Whether the workload's controller has seen its latest spec (`observedGeneration >= generation`). */
function observed(obj: KubeObject, status: Rec | undefined): HealthVerdict | undefined {
  const generation = obj.metadata.generation ?? 0;
  const og = int(status?.observedGeneration, -1);
  return og >= generation ? undefined : progressing(`waiting for generation ${generation} to be observed`);
}

/**
 * A Deployment is healthy when its controller observed the latest spec, `Available` is `True`,
 * every desired replica is updated and no old one is left, and it did not exceed its progress
 * deadline. `Progressing=False` with reason `ProgressDeadlineExceeded` or `Available` not
 * `True` is a failure; an update still rolling out is progressing.
 */
function deploymentHealth(obj: KubeObject): HealthVerdict {
  const status = rec(obj.status);
  const pending = observed(obj, status);
  if (pending) return pending;
  const prog = condition(status, 'Progressing');
  if (prog?.status === 'False' && prog.reason === 'ProgressDeadlineExceeded') {
    return failed('ProgressDeadlineExceeded');
  }
  const available = condition(status, 'Available');
  if (available?.status !== 'True') {
    const reason = typeof available?.reason === 'string' ? ` (${available.reason})` : '';
    return failed(`Available=${typeof available?.status === 'string' ? available.status : 'missing'}${reason}`);
  }
  const desired = int(rec(obj.spec)?.replicas, 1);
  const updated = int(status?.updatedReplicas, 0);
  const replicas = int(status?.replicas, 0);
  if (updated !== desired || replicas !== updated) {
    return progressing(`${updated}/${desired} replicas updated, ${replicas} total`);
  }
  return OK;
}

/**
 * A StatefulSet is healthy when every desired replica (`spec.replicas`, default 1) is ready and
 * the rollout is over (`currentRevision == updateRevision`). A revision change or an unobserved
 * spec is progressing; fewer ready replicas than desired, with the rollout over, is a failure.
 */
function statefulSetHealth(obj: KubeObject): HealthVerdict {
  const status = rec(obj.status);
  const pending = observed(obj, status);
  if (pending) return pending;
  const desired = int(rec(obj.spec)?.replicas, 1);
  const ready = int(status?.readyReplicas, 0);
  if (status?.currentRevision !== status?.updateRevision) {
    return progressing(`rolling out revision ${String(status?.updateRevision ?? '')}`.trim());
  }
  return ready === desired ? OK : failed(`${ready}/${desired} replicas ready`);
}

/**
 * A DaemonSet is healthy when no scheduled pod is unavailable and every node that should run it
 * runs the updated pod (`updatedNumberScheduled == desiredNumberScheduled`). Unavailable pods are
 * a failure; pods not yet updated are progressing.
 */
function daemonSetHealth(obj: KubeObject): HealthVerdict {
  const status = rec(obj.status);
  const pending = observed(obj, status);
  if (pending) return pending;
  const unavailable = int(status?.numberUnavailable, 0);
  const desired = int(status?.desiredNumberScheduled, 0);
  const updated = int(status?.updatedNumberScheduled, 0);
  if (unavailable > 0) return failed(`${unavailable}/${desired} pods unavailable`);
  return updated === desired ? OK : progressing(`${updated}/${desired} pods updated`);
}

/** A Job is healthy once `Complete`, failed once `Failed`, progressing until either. */
function jobHealth(obj: KubeObject): HealthVerdict {
  const status = rec(obj.status);
  if (condition(status, 'Complete')?.status === 'True') return OK;
  const f = condition(status, 'Failed');
  if (f?.status === 'True') return failed(`Failed${typeof f.reason === 'string' ? ` (${f.reason})` : ''}`);
  return progressing('not complete');
}

/**
 * The health of one object of a judged kind ({@link HEALTH_KINDS}); `undefined` for any other
 * kind (healthy once applied). Never throws, whatever the object holds: a missing or malformed
 * status reads as not yet observed.
 *
 * @param gk - The object's group and kind (from discovery; `apiVersion` is not read).
 * @param obj - The object as the watch delivered it (full, not metadata only).
 */
export function resourceHealth(gk: GroupKind, obj: KubeObject): HealthVerdict | undefined {
  switch (`${gk.group}/${gk.kind}`) {
    case 'apps/Deployment':
      return deploymentHealth(obj);
    case 'apps/StatefulSet':
      return statefulSetHealth(obj);
    case 'apps/DaemonSet':
      return daemonSetHealth(obj);
    case 'batch/Job':
      return jobHealth(obj);
    default:
      return undefined;
  }
}

/** A workload that is not healthy, as reported in an App's health. */
export interface UnhealthyResource {
  readonly kind: string;
  /** `''` for a cluster-scoped object. */
  readonly namespace: string;
  readonly name: string;
  readonly health: Exclude<ResourceHealth, 'ok'>;
  readonly why: string;
}

/** Most unhealthy resources an App's health names (the event and the condition message). */
export const MAX_UNHEALTHY_NAMED = 5;

/** An App's health: the `status` of its `kapp-lambda.carvel.dev/Healthy` condition and why. */
export interface AppHealth {
  /** `True`: every judged workload healthy; `False`: one failed; `Unknown`: one still progressing. */
  readonly status: 'True' | 'False' | 'Unknown';
  /** `Healthy`, `Unhealthy` or `Progressing`. */
  readonly reason: 'Healthy' | 'Unhealthy' | 'Progressing';
  /** Failed ones first, then progressing ones; by kind, namespace, name; at most {@link MAX_UNHEALTHY_NAMED}. */
  readonly unhealthy: readonly UnhealthyResource[];
}

/**
 * Aggregates an App's workloads that are not healthy into its health: `False` (`Unhealthy`) when
 * one failed, else `Unknown` (`Progressing`) when one is still progressing, else `True`
 * (`Healthy`), which is also the health of an App that deployed no judged kind: its deploy
 * reconciled, and nothing it deployed has a health of its own. Only call it for an App that
 * has reconciled and whose judged kinds' watches are listed: before, nothing is known.
 *
 * @param notOk - The App's workloads whose verdict is not `ok` (any order).
 */
export function appHealth(notOk: Iterable<UnhealthyResource>): AppHealth {
  const list = [...notOk].sort(
    (a, b) =>
      (a.health === b.health ? 0 : a.health === 'failed' ? -1 : 1) ||
      a.kind.localeCompare(b.kind) ||
      a.namespace.localeCompare(b.namespace) ||
      a.name.localeCompare(b.name),
  );
  const unhealthy = list.slice(0, MAX_UNHEALTHY_NAMED);
  if (list.length === 0) return { status: 'True', reason: 'Healthy', unhealthy };
  if (list[0]!.health === 'failed') return { status: 'False', reason: 'Unhealthy', unhealthy };
  return { status: 'Unknown', reason: 'Progressing', unhealthy };
}

/**
 * The workloads that are not healthy, by kapp's app label: all the drift watches keep about
 * health (a verdict and a short reason per such object; nothing for a healthy one). Keys are
 * `<group/Kind>\0<namespace>\0<name>`.
 */
export class HealthIndex {
  private readonly byLabel = new Map<string, Map<string, UnhealthyResource>>();
  /** Object key → its label, so a relabelled or deleted object is found. */
  private readonly labelOf = new Map<string, string>();

  /** Labels with at least one workload that is not healthy. */
  get size(): number {
    return this.byLabel.size;
  }

  /**
   * Records the verdict of one object under `label` (`ok` removes it).
   *
   * @returns the labels whose set changed (its old label too, when it moved), empty when none did.
   */
  set(label: string, gk: GroupKind, obj: KubeObject, verdict: HealthVerdict): string[] {
    const namespace = obj.metadata.namespace ?? '';
    const key = objectKey(gk, namespace, obj.metadata.name);
    const changed = this.drop(key, verdict.health === 'ok' ? undefined : label);
    if (verdict.health === 'ok') return changed;
    const entry: UnhealthyResource = {
      kind: gk.kind,
      namespace,
      name: obj.metadata.name,
      health: verdict.health,
      why: verdict.why ?? verdict.health,
    };
    const cur = this.byLabel.get(label)?.get(key);
    if (cur && cur.health === entry.health && cur.why === entry.why) return changed;
    let m = this.byLabel.get(label);
    if (!m) {
      m = new Map();
      this.byLabel.set(label, m);
    }
    m.set(key, entry);
    this.labelOf.set(key, label);
    return changed.includes(label) ? changed : [...changed, label];
  }

  /** Forgets one object (deleted). @returns the label whose set changed, if any. */
  delete(gk: GroupKind, namespace: string, name: string): string[] {
    return this.drop(objectKey(gk, namespace, name), undefined);
  }

  /**
   * After a list of `gk` in `namespace` (`undefined`: all): forgets the objects of that kind and
   * scope the list did not return (`seen` holds the keys of {@link keyOf} it did).
   *
   * @returns the labels whose set changed.
   */
  sweep(gk: GroupKind, namespace: string | undefined, seen: ReadonlySet<string>): string[] {
    const prefix = `${gk.group}/${gk.kind}\u0000${namespace === undefined ? '' : `${namespace}\u0000`}`;
    const changed: string[] = [];
    for (const key of [...this.labelOf.keys()]) {
      if (!key.startsWith(prefix) || seen.has(key)) continue;
      for (const l of this.drop(key, undefined)) if (!changed.includes(l)) changed.push(l);
    }
    return changed;
  }

  /**
   * The workloads under `label` that are not healthy, of those in `namespaces` (an App's deploy
   * namespaces: an object anyone labelled in another namespace is not its own; empty: all).
   */
  notOk(label: string, namespaces: readonly string[] = []): UnhealthyResource[] {
    const m = this.byLabel.get(label);
    if (!m) return [];
    const all = [...m.values()];
    return namespaces.length === 0 ? all : all.filter((r) => r.namespace === '' || namespaces.includes(r.namespace));
  }

  /** The key {@link sweep} compares: `<group/Kind>\0<namespace>\0<name>`. */
  static keyOf(gk: GroupKind, obj: KubeObject): string {
    return objectKey(gk, obj.metadata.namespace ?? '', obj.metadata.name);
  }

  /** Removes `key` unless it stays under `keep`. @returns the label it left. */
  private drop(key: string, keep: string | undefined): string[] {
    const was = this.labelOf.get(key);
    if (was === undefined || was === keep) return [];
    this.labelOf.delete(key);
    const m = this.byLabel.get(was);
    m?.delete(key);
    if (m?.size === 0) this.byLabel.delete(was);
    return [was];
  }
}

function objectKey(gk: GroupKind, namespace: string, name: string): string {
  return `${gk.group}/${gk.kind}\u0000${namespace}\u0000${name}`;
}
