/**
 * How an install run reaches the fleet's rollouts (docs/decisions.md D18): a port with two
 * adapters, because who may write a rollout record differs by runtime.
 *
 * - {@link StoreRollouts} (the embedded runtime, a stage function on its own role): the run reads
 *   the policies and records, starts a rollout and records the next state itself, by
 *   compare-and-swap in the store (`./state.ts`), as every runtime did before the cloud mode.
 * - {@link ReportingRollouts} (the shared stack's dispatched install runs): a run holds one
 *   cluster's session, so it must neither write a record every cluster obeys nor learn other
 *   clusters' PackageInstalls. It reads the view its dispatcher narrowed to its cluster
 *   ({@link ClusterRolloutView}), writes its own fleet entry, and reports what it touched and
 *   which rollout it would start ({@link RolloutReport}); the install dispatcher starts,
 *   evaluates and stores the records, and pokes the waves (`../entry/dispatch-rollouts.ts`).
 *
 * @module
 */
import * as z from 'zod';
import type { ObjectStore } from '../store/port.js';
import { evaluateRollout, newRollout, startsRollout } from './evaluate.js';
import { type RolloutPolicy, rolloutPolicyShape } from './policy.js';
import {
  casRollout,
  type FleetEntry,
  gatingPolicy,
  isFinal,
  listFleetEntries,
  policyFor,
  type RolloutRecord,
  readFleetEntry,
  readRollout,
  rolloutRecordSchema,
  writeFleetEntry,
} from './state.js';

/** What a run stores after its status write (`RolloutPlan` of `./gate.ts`, the parts this port needs). */
export interface PlannedRecord {
  entry: FleetEntry;
  previous: FleetEntry | undefined;
  /** The gate's policy and refName, and the record as the run evaluated it; absent: not gated. */
  gate?: { policy: RolloutPolicy; refName: string; record?: RolloutRecord };
  /** The members the run evaluated with (empty when it did not evaluate). */
  members: readonly FleetEntry[];
  /** Whether the run's evaluation moved the rollout. */
  changed: boolean;
}

/** What {@link RolloutAccess.record} stored. */
export interface RecordedRollout {
  /** The wave indexes this run released (their PackageInstalls want a poke). */
  released: number[];
  /**
   * Whether this run ended the rollout (completed or stopped): every member then wants a poke, so
   * a version that arrived while it moved (held behind it) starts its own rollout.
   */
  ended: boolean;
}

/** The result of {@link RolloutAccess.start}. */
export type StartedRollout =
  /** The rollout record as stored after the call (the new one, or one already moving). */
  | { record: RolloutRecord | undefined }
  /** Asked of the coordinator: the run holds at its current version until the record exists. */
  | { pending: true };

/** The rollouts as one install run reaches them (see the module comment). */
export interface RolloutAccess {
  /**
   * The policy gating `refName` (`policyFor` of `./state.ts`); `undefined`: not gated.
   * @throws StoreError when the policies cannot be read
   */
  policyFor(refName: string, now: Date): Promise<RolloutPolicy | undefined>;
  /** The current rollout of `refName` under `policy`; `undefined` when none. @throws StoreError */
  read(policy: string, refName: string): Promise<RolloutRecord | undefined>;
  /**
   * Starts the rollout of `version` (from `from`) unless one is moving (`startsRollout`).
   * @throws StoreError, RolloutConflictError
   */
  start(policy: RolloutPolicy, refName: string, version: string, from: string, now: Date): Promise<StartedRollout>;
  /** The PackageInstall's fleet entry; `undefined` when none. @throws StoreError */
  entry(clusterId: string, namespace: string, name: string): Promise<FleetEntry | undefined>;
  /**
   * The refName's members (every cluster's fleet entries) to evaluate the rollout with;
   * `undefined` when this run does not evaluate (the coordinator does). @throws StoreError
   */
  members(refName: string): Promise<FleetEntry[] | undefined>;
  /** Stores the run's entry and, where this run may, the rollout's next state. @throws StoreError, RolloutConflictError */
  record(plan: PlannedRecord, now: Date): Promise<RecordedRollout>;
}

/**
 * The store-backed {@link RolloutAccess}: the run writes the records itself (the embedded runtime,
 * and a stage function that runs its own records). `cacheOwner` keeps the policies read
 * `POLICY_CACHE_MS` (`policyFor`): an object living as long as the runtime (its cluster registry).
 */
export class StoreRollouts implements RolloutAccess {
  constructor(
    private readonly store: ObjectStore,
    private readonly cacheOwner: object = store,
  ) {}

  /** {@inheritDoc RolloutAccess.policyFor} */
  async policyFor(refName: string, now: Date): Promise<RolloutPolicy | undefined> {
    return await policyFor(this.store, refName, now.getTime(), this.cacheOwner);
  }

  /** {@inheritDoc RolloutAccess.read} */
  async read(policy: string, refName: string): Promise<RolloutRecord | undefined> {
    return (await readRollout(this.store, policy, refName))?.record;
  }

  /** {@inheritDoc RolloutAccess.start} */
  async start(policy: RolloutPolicy, refName: string, version: string, from: string, now: Date) {
    const { record } = await casRollout(this.store, policy.metadata.name, refName, (r) =>
      startsRollout(r, version) ? newRollout(policy, refName, version, from, now) : undefined,
    );
    return { record };
  }

  /** {@inheritDoc RolloutAccess.entry} */
  async entry(clusterId: string, namespace: string, name: string): Promise<FleetEntry | undefined> {
    return await readFleetEntry(this.store, clusterId, namespace, name);
  }

  /** {@inheritDoc RolloutAccess.members} */
  async members(refName: string): Promise<FleetEntry[]> {
    return await listFleetEntries(this.store, refName);
  }

  /**
   * The entry (when it changed), then the rollout's next state evaluated again on the record as
   * stored (compare-and-swap: another cluster's run may have moved it meanwhile).
   */
  async record(plan: PlannedRecord, now: Date): Promise<RecordedRollout> {
    await writeFleetEntry(this.store, plan.entry, plan.previous);
    const gate = plan.gate;
    if (!plan.changed || !gate?.record) return { released: [], ended: false };
    let released: number[] = [];
    let ended = false;
    await casRollout(this.store, gate.policy.metadata.name, gate.refName, (cur) => {
      released = [];
      ended = false;
      if (!cur || cur.target !== gate.record?.target || cur.createdAt !== gate.record.createdAt) return undefined;
      const e = evaluateRollout(cur, gate.policy, plan.members, now);
      released = e.released;
      ended = e.changed && !isFinal(cur.status) && isFinal(e.record.status);
      return e.changed ? e.record : undefined;
    });
    return { released, ended };
  }
}

/**
 * The rollouts an install dispatcher hands one cluster's batch (`DispatchedBatch.rollouts`):
 * every applied policy and every rollout record, narrowed to that cluster
 * (`narrowRolloutView` of `../entry/dispatch-rollouts.ts`), so the run can gate and show its
 * Rollout condition and learns no other cluster's id or PackageInstall.
 */
export interface ClusterRolloutView {
  /** The policies, each wave listing only this cluster (or no cluster); the catch-all as applied. */
  readonly policies: readonly RolloutPolicy[];
  /** The records, with this cluster's failures only, no history, and a cause naming no other cluster. */
  readonly records: readonly RolloutRecord[];
}

/** The schema of a {@link ClusterRolloutView} in a payload (a narrowed wave may list no cluster). */
export const clusterRolloutViewSchema = z.object({
  policies: z.array(rolloutPolicyShape),
  records: z.array(rolloutRecordSchema),
});

/**
 * What a dispatched install run reports to its dispatcher (`SqsBatchResponse.rollouts`): the
 * rollouts whose members it recorded (`<policy>/<refName>`), to be evaluated, and the rollouts it
 * saw a reason to start. The dispatcher trusts neither blindly: it evaluates from the stored
 * fleet entries, and starts a rollout only for a cluster of the policy's first wave.
 */
export interface RolloutReport {
  touched: string[];
  start: { policy: string; refName: string; version: string; from?: string }[];
}

/** Most entries of each list of a {@link RolloutReport} the dispatcher reads (a batch has 10 records). */
export const MAX_REPORT_ENTRIES = 100;

/** The schema of a {@link RolloutReport} in a stage's answer: bounded strings and lists. */
export const rolloutReportSchema = z.object({
  touched: z.array(z.string().max(512)).max(MAX_REPORT_ENTRIES),
  start: z
    .array(
      z.object({
        policy: z.string().max(256),
        refName: z.string().max(256),
        version: z.string().max(256),
        from: z.string().max(256).optional(),
      }),
    )
    .max(MAX_REPORT_ENTRIES),
});

/** A dispatched install run's reports, collected per batch ({@link ReportingRollouts}). */
export class RolloutReports {
  #touched = new Set<string>();
  #start = new Map<string, RolloutReport['start'][number]>();

  /** Notes that the run recorded a member of `<policy>/<refName>`. */
  touch(policy: string, refName: string): void {
    this.#touched.add(`${policy}/${refName}`);
  }

  /** Notes a rollout the run would start (the newest ask per rollout wins). */
  ask(start: RolloutReport['start'][number]): void {
    this.#start.set(`${start.policy}/${start.refName}`, start);
  }

  /** What was noted since the last call (`undefined` when nothing); empties it. */
  take(): RolloutReport | undefined {
    if (this.#touched.size === 0 && this.#start.size === 0) return undefined;
    const report = { touched: [...this.#touched], start: [...this.#start.values()] };
    this.#touched.clear();
    this.#start.clear();
    return report;
  }
}

/**
 * The dispatched install run's {@link RolloutAccess}: reads `view()` (the current batch's,
 * `undefined` when the batch brought none: not gated), writes only its own fleet entry to
 * `store` (its session's `state/fleet/<cluster>/`), and reports the rest to `reports`.
 */
export class ReportingRollouts implements RolloutAccess {
  constructor(
    private readonly view: () => ClusterRolloutView | undefined,
    private readonly store: ObjectStore,
    private readonly reports: RolloutReports,
  ) {}

  /** The policy gating `refName` in the batch's view (first by name listing it, else `*`). */
  async policyFor(refName: string): Promise<RolloutPolicy | undefined> {
    return gatingPolicy(this.view()?.policies ?? [], refName);
  }

  /** {@inheritDoc RolloutAccess.read} */
  async read(policy: string, refName: string): Promise<RolloutRecord | undefined> {
    return this.view()?.records.find((r) => r.policy === policy && r.refName === refName);
  }

  /** A moving rollout as viewed; else the ask is reported and the run holds ({@link StartedRollout}). */
  async start(policy: RolloutPolicy, refName: string, version: string, from: string): Promise<StartedRollout> {
    const current = await this.read(policy.metadata.name, refName);
    if (!startsRollout(current, version)) return { record: current };
    this.reports.ask({ policy: policy.metadata.name, refName, version, from });
    return { pending: true };
  }

  /** {@inheritDoc RolloutAccess.entry} */
  async entry(clusterId: string, namespace: string, name: string): Promise<FleetEntry | undefined> {
    return await readFleetEntry(this.store, clusterId, namespace, name);
  }

  /** `undefined`: the dispatcher evaluates, with every cluster's entries. */
  async members(): Promise<undefined> {
    return undefined;
  }

  /** The entry (when it changed); the rollout is reported as touched, never written here. */
  async record(plan: PlannedRecord): Promise<RecordedRollout> {
    await writeFleetEntry(this.store, plan.entry, plan.previous);
    if (plan.gate?.record) this.reports.touch(plan.gate.policy.metadata.name, plan.gate.refName);
    return { released: [], ended: false };
  }
}
