/**
 * The rollout as the install function sees it (docs/decisions.md D18): the
 * gate on the version a PackageInstall selects, its Rollout condition, and what its run records
 * (its fleet index entry, the rollout's next state).
 *
 * 1. {@link rolloutGate}, before the choice: the policy gating the refName (none: no gate, no
 *    change of behaviour); a version above the PackageInstall's current one starts a rollout
 *    (compare-and-swap, so the first run of the fleet to see it creates it, wave 1 released);
 *    the cap of this cluster's wave becomes the `rollout-wave` version callback.
 * 2. {@link planRolloutRecord}, once the status is known: the run's own fleet entry, the
 *    rollout evaluated with it (`./evaluate.ts`), and the Rollout condition appended to the
 *    status (kapp-controller's condition stays first).
 * 3. `RolloutAccess.record` (`./access.ts`), after the status write: the entry and, where the
 *    run may write it, the rollout's new state stored; the waves it released, for the caller to poke.
 *
 * @module
 */
import type { Condition } from '../api/common.js';
import { KappLambdaConditionType } from '../api/constants.js';
import type { PackageInstall, PackageInstallStatus } from '../api/packaging.js';
import type { ConstraintCallback } from '../packaging/versions.js';
import type { PlannedRecord, RolloutAccess } from './access.js';
import { capFor, compareLoose, evaluateRollout, memberHealthy, recordWaveOf, rolloutCondition } from './evaluate.js';
import { type RolloutPolicy, waveOf } from './policy.js';
import { type FleetEntry, isFinal, type RolloutRecord } from './state.js';

/** Name of the gate's version callback: `after-rollout-wave=N` in a selection error. */
export const ROLLOUT_WAVE_CHECK = 'rollout-wave';

/** What the gate found for one PackageInstall. */
export interface RolloutGate {
  policy: RolloutPolicy;
  refName: string;
  /** The rollout of the refName, if there is one. */
  record?: RolloutRecord;
  /** The record's wave index of this cluster; `undefined`: in no wave of the record (see `cap`). */
  wave?: number;
  /** The highest version it may select; `undefined`: no cap. */
  cap?: string;
  /** The extra version callbacks for `PackageSelection.choose` (empty without a cap). */
  callbacks: ConstraintCallback[];
  /**
   * Set when this PackageInstall goes back to its last good version: the rollout stopped under
   * `onFailure: rollback` with it among the failed, and its fleet entry names the version (and the
   * App generation) it was last healthy at. The cap is that version.
   */
  rollback?: { version: string; appGeneration?: number; receipt?: string };
}

/** The Rollout condition of a member going back to its last good version ({@link RolloutGate.rollback}). */
export function rolledBackCondition(record: RolloutRecord, rollback: NonNullable<RolloutGate['rollback']>): Condition {
  const how = rollback.receipt
    ? `receipt ${rollback.receipt}, its render deployed as it was`
    : 'rendered again: no receipt of it left';
  return {
    type: KappLambdaConditionType.Rollout,
    status: 'False',
    reason: 'RolledBack',
    message: `rolled back to ${rollback.version} (${how}) after the rollout of ${record.target} stopped: ${record.cause ?? ''}`,
  };
}

/**
 * The rollback of a failed member ({@link RolloutGate.rollback}): `undefined` unless `record`
 * stopped under a policy with `onFailure: rollback`, the member is among its failed, and its entry
 * knows a last good version other than the target.
 */
export function rollbackOf(
  policy: RolloutPolicy,
  record: RolloutRecord,
  member: { clusterId: string; namespace: string; name: string },
  entry: FleetEntry | undefined,
): RolloutGate['rollback'] {
  if (policy.spec.onFailure !== 'rollback' || record.status !== 'stopped') return undefined;
  const failed = record.failed.some(
    (f) => f.cluster === member.clusterId && f.namespace === member.namespace && f.name === member.name,
  );
  const version = entry?.lastGoodVersion;
  if (!failed || version === undefined || version === record.target) return undefined;
  return {
    version,
    ...(entry?.lastGoodAppGeneration === undefined ? {} : { appGeneration: entry.lastGoodAppGeneration }),
  };
}

/**
 * The gate of `pkgi` in `clusterId` at `now`; `undefined` when no policy gates its refName.
 *
 * @param ungated - the version the PackageInstall would select without the gate (`undefined` when
 *   it selects none): above `status.version`, it starts a rollout unless one is moving; where the
 *   start is asked of a coordinator (`RolloutAccess.start` pending), the PackageInstall holds at
 *   its current version until the record exists
 * @throws StoreError when the store cannot be read (the run fails and is retried)
 */
export async function rolloutGate(
  access: RolloutAccess,
  now: Date,
  clusterId: string,
  pkgi: PackageInstall,
  ungated: () => string | undefined,
): Promise<RolloutGate | undefined> {
  const refName = pkgi.spec.packageRef?.refName ?? '';
  const policy = await access.policyFor(refName, now);
  if (!policy) return undefined;
  const current = pkgi.status?.version;
  const v = ungated();
  let record: RolloutRecord | undefined;
  if (current && v && compareLoose(v, current) > 0) {
    const started = await access.start(policy, refName, v, current, now);
    if ('pending' in started) return { policy, refName, cap: current, callbacks: [capCheck(current)] };
    record = started.record;
  } else {
    record = await access.read(policy.metadata.name, refName);
  }
  if (!record) return { policy, refName, callbacks: [] };
  const wave = recordWaveOf(record, policy, clusterId);
  const member = { clusterId, namespace: pkgi.metadata.namespace ?? '', name: pkgi.metadata.name ?? '' };
  const rollback =
    policy.spec.onFailure === 'rollback' && record.status === 'stopped'
      ? rollbackOf(policy, record, member, await access.entry(clusterId, member.namespace, member.name))
      : undefined;
  // A member the stopped rollout failed on is not offered its target again by it: one rolled back
  // stays back (whatever the policy says now), one that failed at the target stays there.
  const failedHere =
    record.status === 'stopped' &&
    current !== undefined &&
    record.failed.some((f) => f.cluster === clusterId && f.namespace === member.namespace && f.name === member.name);
  // A cluster the policy puts in a wave the record does not know (the policy's waves changed since
  // the rollout started) is held as one in a wave not yet released, until the rollout completes:
  // without a cap it would take any version, the one a stopped rollout failed on included.
  const unknownWave = wave === undefined && waveOf(policy, clusterId) !== undefined;
  const cap =
    rollback?.version ?? (failedHere ? current : capFor(record, unknownWave ? record.waves.length : wave, current));
  return {
    policy,
    refName,
    record,
    ...(wave === undefined ? {} : { wave }),
    ...(cap === undefined ? {} : { cap }),
    callbacks: cap === undefined ? [] : [capCheck(cap)],
    ...(rollback ? { rollback } : {}),
  };
}

/** The version callback of a cap: versions at or below `cap` pass. */
function capCheck(cap: string): ConstraintCallback {
  return { name: ROLLOUT_WAVE_CHECK, check: (c: string) => compareLoose(c, cap) <= 0 };
}

/** The condition `type` of `status`, if it has one. */
function conditionOf(status: PackageInstallStatus, type: string): Condition | undefined {
  return status.conditions?.find((c) => c.type === type);
}

/**
 * The fleet index entry of a PackageInstall whose run ends with `status`: its reconcile from the
 * first condition, its health from the `kapp-lambda.carvel.dev/Healthy` condition when present,
 * `healthySince` kept from `previous` while it stays healthy at the same version.
 */
export function fleetEntryOf(
  clusterId: string,
  pkgi: PackageInstall,
  status: PackageInstallStatus,
  previous: FleetEntry | undefined,
  now: Date,
  gate: RolloutGate | undefined,
  appGeneration?: number,
): FleetEntry {
  const first = status.conditions?.[0]?.type;
  const health = conditionOf(status, KappLambdaConditionType.Healthy)?.status;
  const entry: FleetEntry = {
    clusterId,
    namespace: pkgi.metadata.namespace ?? '',
    name: pkgi.metadata.name ?? '',
    refName: pkgi.spec.packageRef?.refName ?? '',
    ...(pkgi.metadata.uid ? { uid: pkgi.metadata.uid } : {}),
    ...(status.version === undefined ? {} : { version: status.version }),
    ...(status.lastAttemptedVersion === undefined ? {} : { lastAttemptedVersion: status.lastAttemptedVersion }),
    reconcile: first === 'ReconcileSucceeded' ? 'succeeded' : first === 'ReconcileFailed' ? 'failed' : 'reconciling',
    ...(health === undefined ? {} : { health }),
    at: now.toISOString(),
  };
  const healthy = entry.version !== undefined && memberHealthy(entry, entry.version);
  const wasHealthy = previous?.version !== undefined && memberHealthy(previous, previous.version);
  const since = healthy
    ? wasHealthy && previous?.version === entry.version && previous.healthySince
      ? previous.healthySince
      : entry.at
    : undefined;
  const wave = gate?.record && gate.wave !== undefined ? gate.record.waves[gate.wave]?.name : undefined;
  const lastGood = healthy ? entry.version : previous?.lastGoodVersion;
  const lastGoodGeneration = healthy ? appGeneration : previous?.lastGoodAppGeneration;
  return {
    ...entry,
    ...(since === undefined ? {} : { healthySince: since }),
    ...(wave === undefined ? {} : { wave }),
    ...(gate?.record ? { rollout: `${gate.policy.metadata.name}/${gate.refName}` } : {}),
    ...(lastGood === undefined ? {} : { lastGoodVersion: lastGood }),
    ...(lastGoodGeneration === undefined ? {} : { lastGoodAppGeneration: lastGoodGeneration }),
  };
}

/** What a run records after its status write (`RolloutAccess.record`). */
export interface RolloutPlan extends PlannedRecord {
  /** The status to write: the run's, with the Rollout condition appended when it is gated. */
  status: PackageInstallStatus;
  gate: RolloutGate | undefined;
  /** The refName's members as read, the run's own entry replaced by `entry` (empty: not evaluated here). */
  members: FleetEntry[];
}

/**
 * The run's entry, the rollout evaluated with it, and the status with the Rollout condition
 * (replacing one already there, after kapp-controller's conditions). Without a rollout the
 * status is unchanged and only the entry is planned.
 *
 * @throws StoreError when the store cannot be read
 */
export async function planRolloutRecord(
  access: RolloutAccess,
  now: Date,
  clusterId: string,
  pkgi: PackageInstall,
  status: PackageInstallStatus,
  gate: RolloutGate | undefined,
  appGeneration?: number,
): Promise<RolloutPlan> {
  const ns = pkgi.metadata.namespace ?? '';
  const name = pkgi.metadata.name ?? '';
  const previous = await access.entry(clusterId, ns, name).catch(() => undefined);
  const entry = fleetEntryOf(clusterId, pkgi, status, previous, now, gate, appGeneration);
  if (!gate?.record) return { status, entry, previous, gate, members: [], changed: false };
  const mine = (m: FleetEntry) => m.clusterId === clusterId && m.namespace === ns && m.name === name;
  // A final rollout no longer moves: its condition needs no members (no LIST of the fleet).
  // Where the run does not evaluate (a coordinator does, `RolloutAccess.members`), the record is as read.
  const all = isFinal(gate.record.status) ? [] : await access.members(gate.refName);
  const members = all ? [...all.filter((m) => !mine(m)), entry] : [];
  const evaluation = all
    ? evaluateRollout(gate.record, gate.policy, members, now)
    : { record: gate.record, changed: false };
  const record = evaluation.record;
  const withCondition =
    gate.wave === undefined
      ? status
      : {
          ...status,
          conditions: [
            ...(status.conditions ?? []).filter((c) => c.type !== KappLambdaConditionType.Rollout),
            gate.rollback ? rolledBackCondition(record, gate.rollback) : rolloutCondition(record, gate.wave, now),
          ],
        };
  return { status: withCondition, entry, previous, gate: { ...gate, record }, members, changed: evaluation.changed };
}
