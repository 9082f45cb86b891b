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
  isFinal,
  listFleetEntries,
  listPolicies,
  listRollouts,
  type RolloutRecord,
} from '../rollout/state.js';
import type { ObjectStore } from '../store/port.js';

/** Sends the pokes (`SqsEventSender.sendMany('install', …)` in the dispatcher). */
export type PokeSender = (events: readonly KappEvent[]) => Promise<void>;

/** How long the coordinator keeps the policies and records it read for views, in milliseconds. */
export const VIEW_CACHE_MS = 2000;

/** Longest `version`, `policy` or `refName` an ask may carry (a refName is at most 253). */
const MAX_ASK_FIELD = 256;

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

/** A rollout's evaluation by the coordinator: the record stored and whom to poke, with why. */
interface Moved {
  record: RolloutRecord;
  pokes: { entries: FleetEntry[]; cause: string }[];
}

/**
 * The install dispatcher's rollout coordinator (see the module comment). One per dispatcher
 * process; its methods never throw (failures are logged: the next batch or check evaluates again).
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

  /** The policies and records, read at most once per {@link VIEW_CACHE_MS}. @throws StoreError */
  async #read(): Promise<{ policies: RolloutPolicy[]; records: RolloutRecord[] }> {
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
   * The view of `clusterId`'s batch; `undefined` when there are no policies (nothing is gated)
   * or they cannot be read (logged: the batch runs ungated, as a runtime without the keys did).
   */
  async viewFor(clusterId: string): Promise<ClusterRolloutView | undefined> {
    try {
      const { policies, records } = await this.#read();
      if (policies.length === 0) return undefined;
      return narrowRolloutView(policies, records, clusterId);
    } catch (err) {
      this.#log.warn({ clusterId, error: errorText(err) }, 'could not read the rollouts; this batch is not gated');
      return undefined;
    }
  }

  /**
   * What a batch's runs reported, per cluster invoked: creates the rollouts first-wave clusters
   * asked, evaluates every touched or created rollout once, and pokes. Never throws.
   */
  async afterBatch(reports: ReadonlyMap<string, RolloutReport>): Promise<void> {
    if (reports.size === 0) return;
    try {
      const { policies } = await this.#read();
      const byName = new Map(policies.map((p) => [p.metadata.name, p]));
      const touched = new Set<string>();
      const pokes: Moved['pokes'] = [];
      for (const [clusterId, report] of reports) {
        for (const t of report.touched ?? [])
          if (typeof t === 'string' && t.length <= 2 * MAX_ASK_FIELD) touched.add(t);
        for (const ask of report.start ?? []) {
          const created = await this.#start(clusterId, ask, byName);
          if (created) {
            touched.add(`${created.policy}/${created.refName}`);
            pokes.push(...(await this.#releasePokes(created, byName.get(created.policy) as RolloutPolicy, [0])));
          }
        }
      }
      for (const key of touched) {
        const slash = key.indexOf('/');
        const policy = byName.get(key.slice(0, slash));
        if (!policy) continue;
        const moved = await this.#evaluate(policy, key.slice(slash + 1));
        if (moved) pokes.push(...moved.pokes);
      }
      await this.#send(pokes);
    } catch (err) {
      this.#log.warn({ error: errorText(err) }, 'rollout coordination failed; the next batch or check evaluates again');
    } finally {
      this.#cache = undefined;
    }
  }

  /**
   * The schedule's check: evaluates every moving rollout (a soak whose end no run reported, a
   * rollout the CLI resumed) and sends the end pokes of a rollout that ended without them (one the
   * CLI aborted), marking it so the next check does not. Never throws.
   */
  async check(): Promise<void> {
    try {
      const { policies, records } = await this.#read();
      const byName = new Map(policies.map((p) => [p.metadata.name, p]));
      const pokes: Moved['pokes'] = [];
      const now = this.#now().getTime();
      for (const r of records) {
        const policy = byName.get(r.policy);
        if (!isFinal(r.status)) {
          if (policy) pokes.push(...((await this.#evaluate(policy, r.refName))?.pokes ?? []));
          continue;
        }
        const last = Date.parse(r.history.at(-1)?.at ?? '');
        if (r.endPokedAt !== undefined || !(now - last <= END_POKE_WINDOW_MS)) continue;
        const { written } = await casRollout(this.#store, r.policy, r.refName, (cur) =>
          cur && cur.createdAt === r.createdAt && cur.endPokedAt === undefined
            ? { ...cur, endPokedAt: new Date(now).toISOString() }
            : undefined,
        );
        if (written) pokes.push({ entries: await listFleetEntries(this.#store, r.refName), cause: endCause(r) });
      }
      await this.#send(pokes);
    } catch (err) {
      this.#log.warn({ error: errorText(err) }, 'rollout check failed; the next check tries again');
    } finally {
      this.#cache = undefined;
    }
  }

  /** Creates the rollout `ask` names when `clusterId` may start it; the record created, else `undefined`. */
  async #start(
    clusterId: string,
    ask: RolloutReport['start'][number],
    byName: ReadonlyMap<string, RolloutPolicy>,
  ): Promise<RolloutRecord | undefined> {
    const fields = [ask?.policy, ask?.refName, ask?.version];
    if (!fields.every((f) => typeof f === 'string' && f.length > 0 && f.length <= MAX_ASK_FIELD)) return undefined;
    if (ask.from !== undefined && (typeof ask.from !== 'string' || ask.from.length > MAX_ASK_FIELD)) return undefined;
    const policy = byName.get(ask.policy);
    const covers = policy?.spec.packages.includes(ask.refName) || policy?.spec.packages.includes('*');
    if (!policy || !covers) return undefined;
    if (!mayStart(policy, clusterId)) {
      this.#log.info(
        { clusterId, rollout: `${ask.policy}/${ask.refName}`, version: ask.version },
        'a cluster outside the first wave saw a new version; held until a first-wave cluster starts its rollout',
      );
      return undefined;
    }
    const now = this.#now();
    const { record, written } = await casRollout(this.#store, policy.metadata.name, ask.refName, (r) =>
      startsRollout(r, ask.version) ? newRollout(policy, ask.refName, ask.version, ask.from, now) : undefined,
    );
    if (!written || !record) return undefined;
    this.#log.info(
      { clusterId, rollout: `${record.policy}/${record.refName}`, target: record.target },
      'rollout started',
    );
    return record;
  }

  /** Evaluates the rollout of `refName` under `policy` with the fleet index; stores and says whom to poke. */
  async #evaluate(policy: RolloutPolicy, refName: string): Promise<Moved | undefined> {
    const members = await listFleetEntries(this.#store, refName);
    const now = this.#now();
    let before: RolloutRecord | undefined;
    let released: number[] = [];
    const { record, written } = await casRollout(this.#store, policy.metadata.name, refName, (cur) => {
      before = cur;
      released = [];
      if (!cur || isFinal(cur.status)) return undefined;
      const e = evaluateRollout(cur, policy, members, now);
      released = e.released;
      if (!e.changed) return undefined;
      return isFinal(e.record.status) ? { ...e.record, endPokedAt: now.toISOString() } : e.record;
    });
    if (!written || !record || !before) return undefined;
    const prior = before;
    const pokes: Moved['pokes'] = [];
    for (const i of released)
      this.#log.info(
        { rollout: `${policy.metadata.name}/${refName}`, wave: record.waves[i]?.name },
        'rollout wave released',
      );
    pokes.push(...(await this.#releasePokes(record, policy, released, members)));
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

  /** The pokes of the waves `released` of `record` (members not at the target yet). */
  async #releasePokes(
    record: RolloutRecord,
    policy: RolloutPolicy,
    released: readonly number[],
    members?: FleetEntry[],
  ): Promise<Moved['pokes']> {
    if (released.length === 0) return [];
    const all = members ?? (await listFleetEntries(this.#store, record.refName));
    return released.map((i) => ({
      entries: waveEntries(record, policy, all, i).filter((e) => e.version !== record.target),
      cause: releaseCause(record, i),
    }));
  }

  /** Sends the pokes, one per PackageInstall (the first cause wins). @throws TransportError */
  async #send(pokes: Moved['pokes']): Promise<void> {
    const now = this.#now();
    const events = new Map<string, KappEvent>();
    let noUid = 0;
    for (const { entries, cause } of pokes) {
      for (const e of entries) {
        const key = `${e.clusterId}/${e.namespace}/${e.name}`;
        if (events.has(key)) continue;
        const event = pokeEvent(e, cause, now);
        if (event) events.set(key, event);
        else noUid++;
      }
    }
    if (noUid > 0) this.#log.info({ noUid }, 'fleet entries without a uid are not poked (their next run records it)');
    if (events.size === 0) return;
    await this.#poke([...events.values()]);
    this.#log.info({ poked: events.size }, 'rollout pokes sent');
  }
}

/** The members of wave `i` of `record` among `entries`. */
function waveEntries(record: RolloutRecord, policy: RolloutPolicy, entries: readonly FleetEntry[], i: number) {
  return entries.filter((e) => e.refName === record.refName && recordWaveOf(record, policy, e.clusterId) === i);
}
