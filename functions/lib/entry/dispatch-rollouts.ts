/**
 * Rollouts in the shared stack (issue 28, docs/decisions.md D18): the install dispatcher
 * coordinates them, because a dispatched install run holds one cluster's session and must
 * neither write a record every cluster obeys nor send events for another cluster.
 *
 * - Before an invoke, the batch gets the rollouts narrowed to its cluster ({@link narrowRolloutView}).
 * - After a dispatcher batch, what its runs reported (`RolloutReport` of `../rollout/access.ts`):
 *   a rollout a first-wave cluster asked is created; each touched rollout is evaluated with the
 *   fleet index (`evaluateRollout`) and stored by compare-and-swap; the PackageInstalls that must
 *   select again are poked (`ref-changed` to the install queue, sent from the dispatcher's role,
 *   which the sender check lets send any event whose target is install): a released wave's
 *   members, a wave that became healthy (their Rollout condition then says `Soaking until T`,
 *   the forwarder's due time for the soak's end), every member when the rollout ended.
 * - On its schedule (`ROLLOUT_CHECK_EVENT_TYPE`, every minute), the same for every moving rollout,
 *   and the end pokes of a rollout the CLI aborted: what no run reports.
 *
 * It loads none of the pipeline: the rollout state machine and the store only.
 *
 * @module
 */
import { type KappEvent, objectEvent } from '../../../events/schema.js';
import { isDns1123Subdomain } from '../api/names.js';
import { CLUSTER_ID_PATTERN } from '../kube/cluster-doc.js';
import { PACKAGING_API_VERSION } from '../kube/port.js';
import { errorText, type Logger } from '../log.js';
import type { ClusterRolloutView, RolloutReport } from '../rollout/access.js';
import {
  endCause,
  evaluateRollout,
  newRollout,
  recordWaveOf,
  releaseCause,
  startsRollout,
} from '../rollout/evaluate.js';
import { type RolloutPolicy, waveOf } from '../rollout/policy.js';
import {
  casRollout,
  type FleetEntry,
  gatingPolicy,
  isFinal,
  listFleetEntries,
  listPolicies,
  listRollouts,
  type RolloutRecord,
  readRollout,
} from '../rollout/state.js';
import type { ObjectStore } from '../store/port.js';

/** Sends the pokes (`SqsEventSender.sendMany('install', …)` in the dispatcher). */
export type PokeSender = (events: readonly KappEvent[]) => Promise<void>;

/** How long the coordinator keeps the policies and records it read for views, in milliseconds. */
export const VIEW_CACHE_MS = 2000;

/**
 * How long after a wave's release the schedule's check pokes again its members that have not run
 * since (a poke lost to a failure): 10 min, about ten checks.
 */
export const RE_POKE_WINDOW_MS = 10 * 60_000;

/** How long after its end a rollout still gets its end pokes from the schedule: 10 min. */
export const END_POKE_WINDOW_MS = 10 * 60_000;

/**
 * `policy` as one cluster sees it: the wave listing `clusterId` lists only it, the other listing
 * waves list no cluster, the catch-all stays as applied; so `waveOf` gives the cluster the same
 * wave and the run learns no other cluster's id.
 */
export function narrowPolicy(policy: RolloutPolicy, clusterId: string): RolloutPolicy {
  return {
    ...policy,
    spec: {
      ...policy.spec,
      waves: policy.spec.waves.map((w) =>
        w.clusters ? { ...w, clusters: w.clusters.includes(clusterId) ? [clusterId] : [] } : w,
      ),
    },
  };
}

/**
 * `record` as one cluster sees it: its own failures only, no history (it names clusters), and a
 * cause that names another cluster replaced by the count of failures (`wave W: N failed
 * (maxUnavailable M)`, the part of the cause before the first failure's name).
 */
export function narrowRecord(record: RolloutRecord, clusterId: string): RolloutRecord {
  const failed = record.failed.filter((f) => f.cluster === clusterId);
  const others = record.failed.some((f) => f.cluster !== clusterId);
  const cause = record.cause !== undefined && others ? record.cause.replace(/, first .*$/s, '') : record.cause;
  return { ...record, failed, history: [], ...(cause === undefined ? {} : { cause }) };
}

/** The view of `clusterId` ({@link ClusterRolloutView}) from every policy and record. */
export function narrowRolloutView(
  policies: readonly RolloutPolicy[],
  records: readonly RolloutRecord[],
  clusterId: string,
): ClusterRolloutView {
  return {
    policies: policies.map((p) => narrowPolicy(p, clusterId)),
    records: records.map((r) => narrowRecord(r, clusterId)),
  };
}

/**
 * Whether `clusterId` may start a rollout under `policy`: it is in the first wave (listed there,
 * or the first wave is the catch-all and no other wave lists it). Why: a run reports the version
 * it would select, which its own cluster's repositories decide; a rollout every cluster then obeys
 * must come from the clusters the operator chose to go first, not from any tenant.
 */
export function mayStart(policy: RolloutPolicy, clusterId: string): boolean {
  return waveOf(policy, clusterId) === 0;
}

/** The `ref-changed` poke of a member's PackageInstall; `undefined` when its entry has no uid yet. */
export function pokeEvent(e: FleetEntry, cause: string, now: Date): KappEvent | undefined {
  if (!e.uid) return undefined;
  return objectEvent(
    {
      clusterId: e.clusterId,
      kind: 'PackageInstall',
      apiVersion: PACKAGING_API_VERSION,
      namespace: e.namespace,
      name: e.name,
      uid: e.uid,
      // Events are references: the run re-reads the object; these two only name the poke.
      generation: 0,
      resourceVersion: '0',
    },
    'ref-changed',
    { time: now, cause },
  );
}

/** Options of {@link RolloutCoordinator}. */
export interface RolloutCoordinatorOptions {
  /** The artifact bucket (the dispatcher role's grants on `state/rollout*`, `state/fleet/`). */
  store: ObjectStore;
  /** Sends the pokes to the install queue. */
  poke: PokeSender;
  log: Logger;
  /** Default `() => new Date()`. */
  now?: () => Date;
}

/** Whom to poke, and why (the cause each poke event carries). */
interface Poke {
  entries: FleetEntry[];
  cause: string;
}

/** A version a rollout may target: semver (an optional leading `v`), bounded. */
const SEMVER = /^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$/;

/** `<policy>/<refName>` of a report as the two names, or `undefined` when it is not that. */
export function touchedRollout(key: unknown): { policy: string; refName: string } | undefined {
  if (typeof key !== 'string' || key.length > 320) return undefined;
  const slash = key.indexOf('/');
  const policy = key.slice(0, slash);
  const refName = key.slice(slash + 1);
  if (slash < 0 || !CLUSTER_ID_PATTERN.test(policy) || !isDns1123Subdomain(refName)) return undefined;
  return { policy, refName };
}

/**
 * The fleet index of one coordination, listed at most once however many rollouts it evaluates
 * (the listing reads every entry: its cost grows with the fleet, so once per batch or check).
 */
class FleetIndex {
  #all: Promise<FleetEntry[]> | undefined;
  constructor(private readonly store: ObjectStore) {}
  /** The entries of `refName`. @throws StoreError */
  async of(refName: string): Promise<FleetEntry[]> {
    this.#all ??= listFleetEntries(this.store);
    return (await this.#all).filter((e) => e.refName === refName);
  }
}

/**
 * The install dispatcher's rollout coordinator (see the module comment). One per dispatcher
 * process. `viewFor` throws when the rollouts cannot be read (the batch fails and is retried: a
 * store that does not answer must not let every cluster past its wave); `afterBatch` and `check`
 * never throw: each rollout is handled on its own, failures are logged, and what a failure left
 * undone is done again by the next batch or check (a released wave's members that never
 * attempted the target are poked again; the end pokes are marked sent only once sent).
 */
export class RolloutCoordinator {
  readonly #store: ObjectStore;
  readonly #poke: PokeSender;
  readonly #log: Logger;
  readonly #now: () => Date;
  #cache: { at: number; read: Promise<{ policies: RolloutPolicy[]; records: RolloutRecord[] }> } | undefined;

  constructor(opts: RolloutCoordinatorOptions) {
    this.#store = opts.store;
    this.#poke = opts.poke;
    this.#log = opts.log;
    this.#now = opts.now ?? (() => new Date());
  }

  /**
   * The policies and records, read at most once per {@link VIEW_CACHE_MS}; with `records`, the
   * records even when no policy is left (a deleted policy's aborted rollout wants its end pokes).
   * @throws StoreError
   */
  async #read(records = false): Promise<{ policies: RolloutPolicy[]; records: RolloutRecord[] }> {
    if (records) {
      this.#cache = undefined;
      return { policies: await listPolicies(this.#store), records: await listRollouts(this.#store) };
    }
    const at = this.#now().getTime();
    if (!this.#cache || at - this.#cache.at >= VIEW_CACHE_MS || at < this.#cache.at) {
      // No policy, no rollout to read: a fleet without rollouts pays one listing per period.
      const read = (async () => {
        const policies = await listPolicies(this.#store);
        return { policies, records: policies.length === 0 ? [] : await listRollouts(this.#store) };
      })();
      this.#cache = { at, read };
      read.catch(() => {
        this.#cache = undefined;
      });
    }
    return await this.#cache.read;
  }

  /**
   * The view of `clusterId`'s batch; `undefined` when there are no policies (nothing is gated).
   * @throws StoreError when the rollouts cannot be read: the cluster's records fail and are
   *   retried, rather than run ungated.
   */
  async viewFor(clusterId: string): Promise<ClusterRolloutView | undefined> {
    const { policies, records } = await this.#read();
    if (policies.length === 0) return undefined;
    return narrowRolloutView(policies, records, clusterId);
  }

  /**
   * What a batch's runs reported, per cluster invoked: creates the rollouts first-wave clusters
   * asked, evaluates every touched or created rollout once, and pokes. Never throws.
   */
  async afterBatch(reports: ReadonlyMap<string, RolloutReport>): Promise<void> {
    if (reports.size === 0) return;
    try {
      const { policies } = await this.#read();
      const fleet = new FleetIndex(this.#store);
      const touched = new Map<string, { policy: string; refName: string }>();
      const pokes: Poke[] = [];
      for (const [clusterId, report] of reports) {
        for (const t of report.touched ?? []) {
          const r = touchedRollout(t);
          if (r) touched.set(`${r.policy}/${r.refName}`, r);
        }
        for (const ask of report.start ?? []) {
          await this.#guarded(`${ask?.policy}/${ask?.refName}`, async () => {
            const created = await this.#start(clusterId, ask, policies, fleet);
            if (!created) return;
            touched.set(`${created.policy}/${created.refName}`, created);
            const policy = policies.find((p) => p.metadata.name === created.policy) as RolloutPolicy;
            pokes.push(...releasePokes(created, policy, [0], await fleet.of(created.refName)));
          });
        }
      }
      const ended: RolloutRecord[] = [];
      for (const { policy: name, refName } of touched.values()) {
        const policy = policies.find((p) => p.metadata.name === name);
        if (!policy) continue;
        await this.#guarded(`${name}/${refName}`, async () => {
          const moved = await this.#evaluate(policy, refName, fleet);
          if (moved) pokes.push(...moved.pokes);
          if (moved && isFinal(moved.record.status)) ended.push(moved.record);
        });
      }
      if (await this.#send(pokes)) for (const r of ended) await this.#markEndPoked(r);
    } catch (err) {
      this.#log.warn({ error: errorText(err) }, 'rollout coordination failed; the next batch or check evaluates again');
    } finally {
      this.#cache = undefined;
    }
  }

  /**
   * The schedule's check: evaluates every moving rollout (a soak whose end no run reported, a
   * rollout the CLI resumed), pokes a released wave's members that never attempted the target (a
   * poke lost to a failure), and sends the end pokes of a rollout that ended without them (one the
   * CLI aborted or deleted), marking it once sent. Never throws.
   */
  async check(): Promise<void> {
    try {
      const { policies, records } = await this.#read(true);
      const fleet = new FleetIndex(this.#store);
      const pokes: Poke[] = [];
      const ended: RolloutRecord[] = [];
      const now = this.#now().getTime();
      for (const r of records) {
        await this.#guarded(`${r.policy}/${r.refName}`, async () => {
          const policy = policies.find((p) => p.metadata.name === r.policy);
          if (!isFinal(r.status)) {
            if (!policy) return;
            const moved = await this.#evaluate(policy, r.refName, fleet);
            const record = moved?.record ?? r;
            if (moved) pokes.push(...moved.pokes);
            if (isFinal(record.status)) ended.push(record);
            else {
              // A poke lost to a failure: a released wave's members that have not run since the
              // release, within RE_POKE_WINDOW_MS of it (a cluster that is down, or entries no
              // PackageInstall backs, are not poked for ever).
              const released = record.waves.flatMap((w, i) =>
                w.releasedAt && now - Date.parse(w.releasedAt) <= RE_POKE_WINDOW_MS ? [i] : [],
              );
              const behind = (await fleet.of(r.refName)).filter(
                (e) =>
                  e.version !== record.target &&
                  e.lastAttemptedVersion !== record.target &&
                  Date.parse(e.at) <=
                    Date.parse(record.waves[recordWaveOf(record, policy, e.clusterId) ?? -1]?.releasedAt ?? ''),
              );
              pokes.push(...releasePokes(record, policy, released, behind));
            }
            return;
          }
          const last = Date.parse(r.history.at(-1)?.at ?? '');
          if (r.endPokedAt !== undefined || !(now - last <= END_POKE_WINDOW_MS)) return;
          pokes.push({ entries: await fleet.of(r.refName), cause: endCause(r) });
          ended.push(r);
        });
      }
      if (await this.#send(pokes)) for (const r of ended) await this.#markEndPoked(r);
    } catch (err) {
      this.#log.warn({ error: errorText(err) }, 'rollout check failed; the next check tries again');
    } finally {
      this.#cache = undefined;
    }
  }

  /** Runs `work` for one rollout; a failure is logged and ends that rollout's part only. */
  async #guarded(rollout: string, work: () => Promise<void>): Promise<void> {
    try {
      await work();
    } catch (err) {
      this.#log.warn(
        { rollout: rollout.slice(0, 320), error: errorText(err) },
        'rollout coordination failed for this rollout; the next batch or check evaluates it again',
      );
    }
  }

  /** Marks `record`'s end pokes sent (`endPokedAt`), once they were. */
  async #markEndPoked(record: RolloutRecord): Promise<void> {
    await this.#guarded(`${record.policy}/${record.refName}`, async () => {
      const at = this.#now().toISOString();
      await casRollout(this.#store, record.policy, record.refName, (cur) =>
        cur && cur.createdAt === record.createdAt && isFinal(cur.status) && cur.endPokedAt === undefined
          ? { ...cur, endPokedAt: at }
          : undefined,
      );
    });
  }

  /**
   * Creates the rollout `ask` names when it is well formed, under the policy that gates its
   * refName, from a cluster of that policy's first wave, and from a version that cluster's own
   * entries of the refName run; the record created, else `undefined`.
   */
  async #start(
    clusterId: string,
    ask: RolloutReport['start'][number],
    policies: readonly RolloutPolicy[],
    fleet: FleetIndex,
  ): Promise<RolloutRecord | undefined> {
    const refOk = typeof ask?.refName === 'string' && isDns1123Subdomain(ask.refName);
    if (!refOk || typeof ask.version !== 'string' || ask.version.length > 128 || !SEMVER.test(ask.version)) {
      return undefined;
    }
    const policy = gatingPolicy(policies, ask.refName);
    if (!policy || policy.metadata.name !== ask.policy) return undefined;
    if (!mayStart(policy, clusterId)) {
      this.#log.info(
        { clusterId, rollout: `${ask.policy}/${ask.refName}`, version: ask.version },
        'a cluster outside the first wave saw a new version; held until a first-wave cluster starts its rollout',
      );
      return undefined;
    }
    // The version it rolls out from (what a held PackageInstall without one gets) is one the fleet
    // runs: another cluster's entries when there are any (the asker writes its own and could name
    // any version there), else its own.
    const entries = await fleet.of(ask.refName);
    const others = entries.filter((e) => e.clusterId !== clusterId);
    const runs = (others.length > 0 ? others : entries).map((e) => e.version);
    if (ask.from === undefined || !runs.includes(ask.from)) return undefined;
    const now = this.#now();
    const from = ask.from;
    const { record, written } = await casRollout(this.#store, policy.metadata.name, ask.refName, (r) =>
      startsRollout(r, ask.version) ? newRollout(policy, ask.refName, ask.version, from, now) : undefined,
    );
    if (!written || !record) return undefined;
    this.#log.info(
      { clusterId, rollout: `${record.policy}/${record.refName}`, target: record.target },
      'rollout started',
    );
    return record;
  }

  /** Evaluates the moving rollout of `refName` under `policy` with the fleet index; stores and says whom to poke. */
  async #evaluate(
    policy: RolloutPolicy,
    refName: string,
    fleet: FleetIndex,
  ): Promise<{ record: RolloutRecord; pokes: Poke[] } | undefined> {
    const seen = await readRollout(this.#store, policy.metadata.name, refName);
    if (!seen || isFinal(seen.record.status)) return undefined;
    const members = await fleet.of(refName);
    const now = this.#now();
    let before: RolloutRecord | undefined;
    let released: number[] = [];
    const { record, written } = await casRollout(this.#store, policy.metadata.name, refName, (cur) => {
      before = cur;
      released = [];
      if (!cur || isFinal(cur.status)) return undefined;
      const e = evaluateRollout(cur, policy, members, now);
      released = e.released;
      return e.changed ? e.record : undefined;
    });
    if (!written || !record || !before) return undefined;
    const prior = before;
    for (const i of released) {
      this.#log.info(
        { rollout: `${policy.metadata.name}/${refName}`, wave: record.waves[i]?.name },
        'rollout wave released',
      );
    }
    const pokes = releasePokes(record, policy, released, members);
    // A wave that became healthy: its members show `Soaking until T`, the forwarder's due time.
    record.waves.forEach((w, i) => {
      if (w.soakEndsAt && !w.completedAt && prior.waves[i]?.soakEndsAt !== w.soakEndsAt) {
        pokes.push({
          entries: waveEntries(record, policy, members, i),
          cause: `rollout: ${record.policy}/${record.refName} wave ${w.name} healthy, soaking until ${w.soakEndsAt}`,
        });
      }
    });
    if (isFinal(record.status)) pokes.push({ entries: members, cause: endCause(record) });
    return { record, pokes };
  }

  /**
   * Sends the pokes, one per PackageInstall (the first cause wins); an entry no event can be made
   * of is skipped (counted in the log).
   * @returns whether every event was sent (or there was none); a failed send is logged.
   */
  async #send(pokes: readonly Poke[]): Promise<boolean> {
    const now = this.#now();
    const events = new Map<string, KappEvent>();
    let skipped = 0;
    for (const { entries, cause } of pokes) {
      for (const e of entries) {
        const key = `${e.clusterId}/${e.namespace}/${e.name}`;
        if (events.has(key)) continue;
        let event: KappEvent | undefined;
        try {
          event = pokeEvent(e, cause, now);
        } catch {
          event = undefined;
        }
        if (event) events.set(key, event);
        else skipped++;
      }
    }
    if (skipped > 0) this.#log.info({ skipped }, 'fleet entries no poke can be made of (no uid yet) are not poked');
    if (events.size === 0) return true;
    try {
      await this.#poke([...events.values()]);
    } catch (err) {
      this.#log.warn(
        { pokes: events.size, error: errorText(err) },
        'could not send the rollout pokes; the next check sends them again',
      );
      return false;
    }
    this.#log.info({ poked: events.size }, 'rollout pokes sent');
    return true;
  }
}

/** The pokes of the waves `released` of `record`: their members among `entries` not at the target yet. */
function releasePokes(
  record: RolloutRecord,
  policy: RolloutPolicy,
  released: readonly number[],
  entries: readonly FleetEntry[],
): Poke[] {
  return released.map((i) => ({
    entries: waveEntries(record, policy, entries, i).filter((e) => e.version !== record.target),
    cause: releaseCause(record, i),
  }));
}

/** The members of wave `i` of `record` among `entries`. */
function waveEntries(record: RolloutRecord, policy: RolloutPolicy, entries: readonly FleetEntry[], i: number) {
  return entries.filter((e) => e.refName === record.refName && recordWaveOf(record, policy, e.clusterId) === i);
}
