/**
 * Waves advance on events (docs/decisions.md D18): the PackageInstalls of a wave
 * the rollout just released are sent `ref-changed` at once (as the repository fan-out does,
 * `./install-fanout.ts`), so they select the target without waiting for a timer. Only the
 * clusters this runtime serves are poked; a runtime serving the others finds the release with its
 * rollout check ({@link checkRollouts}, every second in the embedded runtime).
 *
 * @module
 */
import { objectEvent } from '../../../../events/schema.js';
import { PACKAGING_API_VERSION } from '../../kube/port.js';
import { endCause, evaluateRollout, recordWaveOf, releaseCause } from '../../rollout/evaluate.js';
import {
  casRollout,
  type FleetEntry,
  isFinal,
  listFleetEntries,
  listRollouts,
  policyFor,
  type RolloutRecord,
} from '../../rollout/state.js';
import type { PipelineDeps } from '../deps.js';

/** Whether `clusterId` is served by this runtime. */
function serves(deps: PipelineDeps, clusterId: string): boolean {
  try {
    return deps.clusters.clusterIds().includes(clusterId);
  } catch {
    return false;
  }
}

/**
 * Sends `ref-changed` to each entry's PackageInstall that this runtime serves and that still
 * exists (read first, for its uid and resourceVersion). The cause names the rollout and wave.
 *
 * @returns how many were sent
 * @throws TransportError when the events are not accepted
 */
export async function pokeInstalls(deps: PipelineDeps, entries: readonly FleetEntry[], cause: string): Promise<number> {
  const events = [];
  for (const e of entries) {
    if (!serves(deps, e.clusterId)) continue;
    const ref = { apiVersion: PACKAGING_API_VERSION, kind: 'PackageInstall', namespace: e.namespace, name: e.name };
    const obj = await deps.clusters
      .installView?.(e.clusterId)
      .getObject(ref)
      .catch(() => undefined);
    if (!obj) continue;
    events.push(
      objectEvent(
        {
          clusterId: e.clusterId,
          kind: 'PackageInstall',
          apiVersion: PACKAGING_API_VERSION,
          namespace: e.namespace,
          name: e.name,
          uid: obj.metadata.uid ?? '',
          generation: obj.metadata.generation ?? 0,
          resourceVersion: obj.metadata.resourceVersion ?? '0',
        },
        'ref-changed',
        { time: deps.now(), cause },
      ),
    );
  }
  if (events.length === 0) return 0;
  if (!deps.emit) {
    deps.log.warn({ cause, installs: events.length }, 'no transport for rollout pokes; dropped');
    return 0;
  }
  await deps.emit(events);
  return events.length;
}

/** The members of wave `wave` of `record` among `entries` (by the policy's membership). */
export function waveMembers(
  record: RolloutRecord,
  policy: Parameters<typeof recordWaveOf>[1],
  entries: readonly FleetEntry[],
  wave: number,
): FleetEntry[] {
  return entries.filter((e) => e.refName === record.refName && recordWaveOf(record, policy, e.clusterId) === wave);
}

/**
 * How long after a rollout ended (its last history entry) the rollout check still pokes the
 * members it serves (once each): 10 min, so a runtime that was down meanwhile still does, and one
 * started later does not poke every member of every old rollout.
 */
export const ENDED_POKE_WINDOW_MS = 10 * 60_000;

/** Whether `r`'s last history entry (its end, for a final one) is at or after `since` (ms). */
function endedSince(r: RolloutRecord, since: number): boolean {
  const last = r.history.at(-1)?.at;
  return last !== undefined && Date.parse(last) >= since;
}

/**
 * One rollout check (store reads; a compare-and-swap only when a rollout moves): for each moving
 * rollout, evaluates it with every member (a soak that ended releases the next wave, as the
 * member's own run at its due time would), then pokes the served members of released waves that
 * are not at the target yet, once per release (`poked`, kept by the caller between checks), and
 * the served members of a rollout that ended (here or, within {@link ENDED_POKE_WINDOW_MS}, in
 * another runtime), once per end: a version held behind it starts its own rollout, and a held
 * member learns the rollout stopped.
 *
 * @returns how many PackageInstalls were poked
 * @throws StoreError, TransportError (the next check tries again)
 */
export async function checkRollouts(deps: PipelineDeps, poked: Set<string>): Promise<number> {
  const now = deps.now();
  const rollouts = await listRollouts(deps.store);
  const moving = rollouts.filter((r) => !isFinal(r.status));
  // Each end is handled once per runtime (one listing), not at every check of the window.
  const endKey = (r: RolloutRecord) => `${r.policy}/${r.refName}@${r.createdAt}:${r.status}`;
  const ended = rollouts.filter(
    (r) => isFinal(r.status) && !poked.has(endKey(r)) && endedSince(r, now.getTime() - ENDED_POKE_WINDOW_MS),
  );
  if (moving.length === 0 && ended.length === 0) return 0;
  const all = await listFleetEntries(deps.store);
  let sent = 0;
  // A rollout another runtime ended: this runtime's members select again, once per end.
  for (const r of ended) {
    poked.add(endKey(r));
    sent += await pokeInstalls(
      deps,
      all.filter((e) => e.refName === r.refName),
      endCause(r),
    );
  }
  for (const seen of moving) {
    const policy = await policyFor(deps.store, seen.refName, now.getTime(), deps.clusters);
    if (!policy || policy.metadata.name !== seen.policy) continue;
    const members = all.filter((e) => e.refName === seen.refName);
    let ended = false;
    const { record } = await casRollout(deps.store, seen.policy, seen.refName, (cur) => {
      ended = false;
      if (!cur || cur.createdAt !== seen.createdAt) return undefined;
      const e = evaluateRollout(cur, policy, members, now);
      ended = e.changed && !isFinal(cur.status) && isFinal(e.record.status);
      return e.changed ? e.record : undefined;
    });
    const r = record ?? seen;
    // Ended here: every member selects again (a version held behind it starts its own rollout).
    if (ended) sent += await pokeInstalls(deps, members, endCause(r));
    for (let i = 0; i < r.waves.length; i++) {
      if (!r.waves[i]?.releasedAt) break;
      const behind = waveMembers(r, policy, members, i).filter((e) => {
        const key = `${r.policy}/${r.refName}@${r.createdAt}/${e.clusterId}/${e.namespace}/${e.name}`;
        if (e.version === r.target || e.lastAttemptedVersion === r.target || poked.has(key)) return false;
        poked.add(key);
        return true;
      });
      if (behind.length > 0) sent += await pokeInstalls(deps, behind, releaseCause(r, i));
    }
  }
  return sent;
}
