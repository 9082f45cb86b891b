/**
 * The rollout state machine (docs/decisions.md D18), pure: records in, records
 * out, no store and no clock of its own. `./state.ts` stores what it returns by compare-and-swap.
 *
 * - A new version above a PackageInstall's current one, with no moving rollout, creates a rollout
 *   ({@link newRollout}): its first wave is released at once.
 * - A wave is healthy when all its members but `maxUnavailable` are at the target and healthy
 *   ({@link memberHealthy}); after its `soak` the next wave is released, after the last the
 *   rollout is `completed` ({@link evaluateRollout}).
 * - More than `maxUnavailable` failed members in a released wave ({@link memberFailure}) stop it.
 * - `paused` releases nothing (released waves go on, failures still stop it); `stopped`,
 *   `aborted` and `completed` are final.
 * - A PackageInstall may select at most its {@link capFor} version.
 *
 * Members are the fleet index entries of the refName (`./state.ts`), each in the wave of its
 * cluster id ({@link waveOf}): a cluster is a member once it reports. A cluster a wave lists by
 * id that has not reported counts as not healthy (it holds its wave, within `maxUnavailable`);
 * the catch-all wave has only the members that reported.
 *
 * @module
 */
import { KappLambdaConditionType } from '../api/constants.js';
import { compareVersions } from '../packaging/versions.js';
import { type RolloutPolicy, soakMs, waveOf } from './policy.js';
import { type FleetEntry, isFinal, type RolloutRecord } from './state.js';

/** `version` without one leading `v` (versions compare strictly). */
function strict(version: string): string {
  return version.startsWith('v') ? version.slice(1) : version;
}

/** `a` vs `b` by semver; a version that does not parse sorts below every other. */
export function compareLoose(a: string, b: string): number {
  try {
    return compareVersions(strict(a), strict(b));
  } catch {
    const pa = tryParse(a);
    const pb = tryParse(b);
    return pa === pb ? 0 : pa ? 1 : -1;
  }
}

function tryParse(v: string): boolean {
  try {
    compareVersions(strict(v), strict(v));
    return true;
  } catch {
    return false;
  }
}

/** The record's wave index of `clusterId` under `policy` (by the wave's name); `undefined`: not gated. */
export function recordWaveOf(record: RolloutRecord, policy: RolloutPolicy, clusterId: string): number | undefined {
  const i = waveOf(policy, clusterId);
  if (i === undefined) return undefined;
  const name = policy.spec.waves[i]?.name;
  const at = record.waves.findIndex((w) => w.name === name);
  return at >= 0 ? at : undefined;
}

/**
 * A new rollout of `target` (from the PackageInstall's `from`), its first wave released at `now`.
 */
export function newRollout(
  policy: RolloutPolicy,
  refName: string,
  target: string,
  from: string | undefined,
  now: Date,
): RolloutRecord {
  const at = now.toISOString();
  const first = policy.spec.waves[0]?.name ?? '';
  return {
    policy: policy.metadata.name,
    refName,
    target,
    ...(from === undefined ? {} : { from }),
    status: 'running',
    createdAt: at,
    waves: policy.spec.waves.map((w, i) => (i === 0 ? { name: w.name, releasedAt: at } : { name: w.name })),
    failed: [],
    history: [
      { at, what: `rollout of ${target} created${from ? ` (from ${from})` : ''}` },
      { at, what: 'released', wave: first },
    ],
  };
}

/**
 * Whether a rollout of `version` replaces `current`: there is none, or it is final and `version`
 * is above its target. A moving rollout keeps newer versions waiting.
 */
export function startsRollout(current: RolloutRecord | undefined, version: string): boolean {
  return !current || (isFinal(current.status) && compareLoose(version, current.target) > 0);
}

/**
 * The highest version the PackageInstall may select: `undefined` (no cap) when the rollout is
 * completed or the cluster is in no wave; the target (or the current version, if higher) once
 * its wave is released; otherwise its current version, or the rollout's `from` when it has none.
 * A wave index the record does not have (the policy's waves changed since the rollout started)
 * is a wave not yet released.
 */
export function capFor(record: RolloutRecord, wave: number | undefined, current: string | undefined) {
  if (wave === undefined || record.status === 'completed') return undefined;
  if (record.waves[wave]?.releasedAt !== undefined) {
    return current && compareLoose(current, record.target) > 0 ? current : record.target;
  }
  return current ?? record.from;
}

/** Whether a member is at the target, reconciled, and (when it carries a Healthy condition) `True`. */
export function memberHealthy(m: FleetEntry, target: string): boolean {
  return m.version === target && m.reconcile === 'succeeded' && (m.health === undefined || m.health === 'True');
}

/**
 * Why a member failed at the target (`undefined`: it did not): its reconcile failed while
 * attempting the target, or its Healthy condition is `False`.
 */
export function memberFailure(m: FleetEntry, target: string): string | undefined {
  if (m.lastAttemptedVersion !== target && m.version !== target) return undefined;
  if (m.reconcile === 'failed') return `reconcile of ${target} failed`;
  if (m.version === target && m.health === 'False') return `${target} unhealthy`;
  return undefined;
}

/** Most failures a stopped record keeps per cluster (10) and in all (200): see {@link keptFailures}. */
export const FAILURES_KEPT = { perCluster: 10, total: 200 } as const;

/**
 * The failures a stopped record keeps: at most {@link FAILURES_KEPT} per cluster and in all, in
 * order. Why: in the shared stack a cluster writes its own fleet entries, and thousands of made-up
 * failing members would grow the record every reader loads (the page reads at most 1 MiB); each
 * real cluster keeps its failed members, so its rollback still finds them.
 */
export function keptFailures<T extends { cluster: string }>(failed: readonly T[]): T[] {
  const per = new Map<string, number>();
  const kept: T[] = [];
  for (const f of failed) {
    const n = per.get(f.cluster) ?? 0;
    if (n >= FAILURES_KEPT.perCluster || kept.length >= FAILURES_KEPT.total) continue;
    per.set(f.cluster, n + 1);
    kept.push(f);
  }
  return kept;
}

/** What {@link evaluateRollout} decided. */
export interface Evaluation {
  /** The next record (the same object when nothing changed). */
  record: RolloutRecord;
  changed: boolean;
  /** Indexes of the waves released by this evaluation (their PackageInstalls want a poke). */
  released: number[];
}

/**
 * One step of the state machine for `members` (the refName's fleet entries) at `now`: stop on
 * too many failures, note a wave's health and soak, release the next wave (or complete) once the
 * soak is over. A released wave without members (and no listed cluster) counts as healthy at its
 * release, with no soak, so the next one follows at once.
 */
export function evaluateRollout(
  current: RolloutRecord,
  policy: RolloutPolicy,
  members: readonly FleetEntry[],
  now: Date,
): Evaluation {
  if (isFinal(current.status)) return { record: current, changed: false, released: [] };
  const at = now.toISOString();
  const r: RolloutRecord = structuredClone(current);
  const byWave = new Map<number, FleetEntry[]>();
  for (const m of members) {
    const w = recordWaveOf(r, policy, m.clusterId);
    if (w !== undefined) byWave.set(w, [...(byWave.get(w) ?? []), m]);
  }
  const spec = (i: number) => policy.spec.waves.find((w) => w.name === r.waves[i]?.name);
  let changed = false;
  for (let i = 0; i < r.waves.length; i++) {
    if (r.waves[i]?.releasedAt === undefined) break;
    const failed = (byWave.get(i) ?? []).flatMap((m) => {
      const why = memberFailure(m, r.target);
      return why ? [{ cluster: m.clusterId, namespace: m.namespace, name: m.name, at, why }] : [];
    });
    const allowed = spec(i)?.maxUnavailable ?? 0;
    if (failed.length > allowed) {
      const f = failed[0] as (typeof failed)[number];
      r.status = 'stopped';
      r.failed = keptFailures(failed);
      r.cause = `wave ${r.waves[i]?.name}: ${failed.length} failed (maxUnavailable ${allowed}), first ${f.cluster} ${f.namespace}/${f.name}: ${f.why}`;
      r.history.push({ at, what: `stopped: ${r.cause}`, wave: r.waves[i]?.name, cluster: f.cluster });
      return { record: r, changed: true, released: [] };
    }
  }
  const released: number[] = [];
  for (;;) {
    const i = r.waves.findLastIndex((w) => w.releasedAt !== undefined);
    const w = r.waves[i];
    if (!w?.releasedAt) break;
    const ms = byWave.get(i) ?? [];
    // A listed cluster that has not reported counts as not (yet) healthy: a canary is never skipped.
    const silent = (spec(i)?.clusters ?? []).filter(
      (id) => recordWaveOf(r, policy, id) === i && !ms.some((m) => m.clusterId === id),
    ).length;
    const healthy = ms.filter((m) => memberHealthy(m, r.target));
    const ok = healthy.length >= ms.length + silent - (spec(i)?.maxUnavailable ?? 0);
    if (ok && !w.healthyAt) {
      const since = Math.max(Date.parse(w.releasedAt), ...healthy.map((m) => Date.parse(m.healthySince ?? at)));
      const soak = ms.length === 0 ? 0 : soakMs(spec(i) ?? { soak: '0s', name: '', maxUnavailable: 0 });
      w.healthyAt = new Date(since).toISOString();
      w.soakEndsAt = new Date(since + soak).toISOString();
      r.history.push({ at, what: `healthy, soaking until ${w.soakEndsAt}`, wave: w.name });
      changed = true;
    } else if (!ok && w.healthyAt) {
      delete w.healthyAt;
      delete w.soakEndsAt;
      r.history.push({ at, what: 'no longer healthy', wave: w.name });
      changed = true;
    }
    if (!ok || r.status !== 'running' || !w.soakEndsAt || Date.parse(w.soakEndsAt) > now.getTime()) break;
    w.completedAt = at;
    changed = true;
    const next = r.waves[i + 1];
    if (!next) {
      r.status = 'completed';
      r.history.push({ at, what: `completed: ${r.target} in every wave` });
      break;
    }
    next.releasedAt = at;
    released.push(i + 1);
    r.history.push({ at, what: 'released', wave: next.name });
  }
  return changed ? { record: r, changed, released } : { record: current, changed: false, released: [] };
}

/** An operator's command on a rollout (`npm run fleet -- rollout pause|resume|abort`). */
export type RolloutCommand = 'pause' | 'resume' | 'abort';

const NEXT_STATUS = { pause: 'paused', resume: 'running', abort: 'aborted' } as const;

/** A command that does not apply to the rollout's status (e.g. resuming a completed rollout). */
export class RolloutCommandError extends Error {
  override readonly name = 'RolloutCommandError';
}

/**
 * The record after `command` at `now`: `pause` (running → paused), `resume` (paused → running),
 * `abort` (any moving status → aborted: frozen, no wave released again). A command that
 * changes nothing (pausing a paused rollout) returns `undefined`.
 *
 * @throws RolloutCommandError for a final rollout (stopped, aborted, completed)
 */
export function commandRollout(r: RolloutRecord, command: RolloutCommand, now: Date): RolloutRecord | undefined {
  if (isFinal(r.status)) throw new RolloutCommandError(`rollout of ${r.target} is ${r.status}: cannot ${command}`);
  const next = NEXT_STATUS[command];
  if (r.status === next) return undefined;
  const at = now.toISOString();
  const history = [...r.history, { at, what: `${next} by the operator` }];
  if (command === 'abort') return { ...r, status: 'aborted', cause: 'aborted by the operator', history };
  return { ...r, status: next, history };
}

/** Reasons of the {@link KappLambdaConditionType}.Rollout condition. */
export type RolloutReason = 'Held' | 'Upgrading' | 'Soaking' | 'Stopped' | 'Completed' | 'RolledBack';

/** The Rollout condition of a PackageInstall. */
export interface RolloutCondition {
  type: typeof KappLambdaConditionType.Rollout;
  status: 'True' | 'False';
  reason: RolloutReason;
  message: string;
}

/**
 * The Rollout condition of a member of wave `wave` (the record's index) at `now`: `Stopped`
 * (stopped or aborted: status False), `Completed`, `Held` (its wave not released: False),
 * `Soaking` (its wave healthy, message ending `until <RFC 3339>`, which
 * {@link soakingUntil} reads back), else `Upgrading`. The message is for people.
 */
export function rolloutCondition(r: RolloutRecord, wave: number, now: Date): RolloutCondition {
  const type = KappLambdaConditionType.Rollout;
  const w = r.waves[wave];
  const name = w?.name ?? '?';
  const at = r.waves.findLast((x) => x.releasedAt !== undefined)?.name ?? '?';
  const paused = r.status === 'paused' ? ' (rollout paused)' : '';
  if (r.status === 'stopped' || r.status === 'aborted') {
    return {
      type,
      status: 'False',
      reason: 'Stopped',
      message: `rollout of ${r.target} ${r.status}: ${r.cause ?? ''}`,
    };
  }
  if (r.status === 'completed') {
    return { type, status: 'True', reason: 'Completed', message: `${r.target} rolled out to every wave` };
  }
  if (!w?.releasedAt) {
    return {
      type,
      status: 'False',
      reason: 'Held',
      message: `${r.target} held: wave ${name} not started (rollout at wave ${at})${paused}`,
    };
  }
  if (w.soakEndsAt && !w.completedAt && Date.parse(w.soakEndsAt) > now.getTime()) {
    return {
      type,
      status: 'True',
      reason: 'Soaking',
      message: `${r.target}: wave ${name} healthy${paused}, soaking until ${w.soakEndsAt}`,
    };
  }
  return { type, status: 'True', reason: 'Upgrading', message: `${r.target} released to wave ${name}${paused}` };
}

/** The cause of a poke for wave `wave` of `record` (its members select the target). */
export function releaseCause(record: RolloutRecord, wave: number): string {
  return `rollout: ${record.policy}/${record.refName} wave ${record.waves[wave]?.name} released (${record.target})`;
}

/** The cause of the pokes of every member once `record` ended (completed, stopped, aborted). */
export function endCause(record: RolloutRecord): string {
  return `rollout: ${record.policy}/${record.refName} of ${record.target} ended: selecting again`;
}
