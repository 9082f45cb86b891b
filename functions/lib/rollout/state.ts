/**
 * Where rollouts live in the object store (docs/decisions.md D18); the CLI, the
 * install function and (later) the fleet page read the same keys, with no cluster access:
 *
 * - `state/rollout-policies/<name>.json`: an applied {@link RolloutPolicy} (JSON);
 * - `state/rollouts/<policy>/<refName>.json`: the {@link RolloutRecord} of that policy's current
 *   rollout of `refName`, changed only by compare-and-swap (`putIfMatch`), as many install runs
 *   of many clusters write it;
 * - `state/fleet/<clusterId>/<namespace>/<name>.json`: the fleet index, one {@link FleetEntry}
 *   per PackageInstall, written by its install run (clusterId first: a per-cluster prefix).
 *
 * @module
 */
import * as z from 'zod';
import { isDns1123Label, isDns1123Subdomain } from '../api/names.js';
import { CLUSTER_ID_PATTERN } from '../kube/cluster-doc.js';
import type { ObjectStore } from '../store/port.js';
import { type RolloutPolicy, validateRolloutPolicy } from './policy.js';

/** Prefix of the applied policies. */
export const POLICY_PREFIX = 'state/rollout-policies/';
/** Prefix of the rollout records. */
export const ROLLOUT_PREFIX = 'state/rollouts/';
/** Prefix of the fleet index. */
export const FLEET_PREFIX = 'state/fleet/';
/** Most history lines a record keeps (the oldest are dropped): the page's timeline. */
export const HISTORY_KEPT = 200;
/** Attempts of a compare-and-swap before giving up (each after a fresh read and a jittered pause). */
export const CAS_ATTEMPTS = 8;

/** `state/rollout-policies/<name>.json`. */
export function policyKey(name: string): string {
  return `${POLICY_PREFIX}${name}.json`;
}
/** `state/rollouts/<policy>/<refName>.json`. */
export function rolloutKey(policy: string, refName: string): string {
  return `${ROLLOUT_PREFIX}${policy}/${refName}.json`;
}
/** `state/fleet/<clusterId>/<namespace>/<name>.json`. */
export function fleetKey(clusterId: string, namespace: string, name: string): string {
  return `${FLEET_PREFIX}${clusterId}/${namespace}/${name}.json`;
}

/** States of a rollout: `running` releases waves; `paused` releases none (released waves go on); the rest are final. */
export const ROLLOUT_STATUSES = ['running', 'paused', 'stopped', 'aborted', 'completed'] as const;
/** One of {@link ROLLOUT_STATUSES}. */
export type RolloutStatus = (typeof ROLLOUT_STATUSES)[number];

const time = z.string(); // RFC 3339, UTC
const waveState = z.object({
  name: z.string(),
  /** When the wave's clusters were allowed the target. */
  releasedAt: time.optional(),
  /** When every member (but `maxUnavailable`) was at the target and healthy; cleared if that stops. */
  healthyAt: time.optional(),
  /** `healthyAt` + the wave's soak: the next wave is released at or after this time. */
  soakEndsAt: time.optional(),
  /** When the next wave was released (or the rollout completed) after this one. */
  completedAt: time.optional(),
});

/** The record of one rollout of one refName (see the module comment). */
export const rolloutRecordSchema = z.object({
  policy: z.string(),
  refName: z.string(),
  /** The version rolled out. */
  target: z.string(),
  /** The version of the PackageInstall that started it (held clusters without a version get it). */
  from: z.string().optional(),
  status: z.enum(ROLLOUT_STATUSES),
  /** Why it stopped or was aborted. */
  cause: z.string().optional(),
  createdAt: time,
  waves: z.array(waveState),
  failed: z.array(
    z.object({ cluster: z.string(), namespace: z.string(), name: z.string(), at: time, why: z.string() }),
  ),
  history: z.array(
    z.object({ at: time, what: z.string(), wave: z.string().optional(), cluster: z.string().optional() }),
  ),
  /**
   * When the shared stack's install dispatcher poked every member after the rollout ended
   * (`../entry/dispatch-rollouts.ts`): its schedule's check sends the end pokes only once.
   */
  endPokedAt: time.optional(),
});
/** A rollout record. */
export type RolloutRecord = z.infer<typeof rolloutRecordSchema>;

/** Whether a rollout no longer moves (a newer version may start a new one). */
export function isFinal(status: RolloutStatus): boolean {
  return status === 'stopped' || status === 'aborted' || status === 'completed';
}

/** A version string as a fleet entry holds it (semver, or what a Package says: bounded, no space). */
const versionString = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[A-Za-z0-9._+~-]+$/);
/** An RFC 3339 time in UTC, as `Date.toISOString` writes it (a time that does not parse is refused). */
const isoTime = z.iso.datetime();

/**
 * One PackageInstall in the fleet index (see the module comment). Strict in every field a reader
 * builds on: in the shared stack a cluster's run writes its own entries (`state/fleet/<id>/`), and
 * the install dispatcher turns entries into pokes and rollout decisions for the whole fleet, so an
 * entry that is no Kubernetes object's (a `/` in an id, a name that is no DNS name, a time that
 * does not parse) must be refused where it is read, not fail the fleet's coordination.
 */
export const fleetEntrySchema = z.object({
  clusterId: z.string().regex(CLUSTER_ID_PATTERN),
  namespace: z.string().refine(isDns1123Label),
  name: z.string().refine(isDns1123Subdomain),
  refName: z.string().refine(isDns1123Subdomain),
  /** `metadata.uid` of the PackageInstall: a coordinator's poke names it (`../entry/dispatch-rollouts.ts`). */
  uid: z
    .string()
    .max(128)
    .regex(/^[A-Za-z0-9._:-]+$/)
    .optional(),
  /** `status.version`. */
  version: versionString.optional(),
  /** `status.lastAttemptedVersion`. */
  lastAttemptedVersion: versionString.optional(),
  /** From the status's first condition: `ReconcileSucceeded`, `ReconcileFailed`, else reconciling. */
  reconcile: z.enum(['succeeded', 'failed', 'reconciling']),
  /** `kapp-lambda.carvel.dev/Healthy` of the status, when it has one (`True`, `False`, `Unknown`). */
  health: z.string().max(16).optional(),
  /** Since when it has been healthy at `version` (kept while it stays so). */
  healthySince: isoTime.optional(),
  /** The wave's name in the policy gating it, if any. */
  wave: z.string().max(63).optional(),
  /** `<policy>/<refName>` of the rollout it belongs to, if any. */
  rollout: z.string().max(320).optional(),
  /** The last version it was healthy at. */
  lastGoodVersion: versionString.optional(),
  /**
   * The generation of its App when it was last healthy: the rollback's receipt is the App's newest
   * succeeded one of that generation or before (`../pipeline/install/rollback.ts`).
   */
  lastGoodAppGeneration: z.int().min(0).optional(),
  /** When this entry was written. */
  at: isoTime,
});
/** A fleet index entry. */
export type FleetEntry = z.infer<typeof fleetEntrySchema>;

/**
 * Most bytes of a policy, record or fleet entry read (1 MiB): an entry any cluster may write is
 * a few hundred bytes, a record with its bounded history some kilobytes.
 */
export const MAX_STATE_BYTES = 1024 * 1024;

/** Reads and parses a JSON object; `undefined` when absent. @throws Error when it does not parse or is too large. */
async function readJson<T>(store: ObjectStore, key: string, schema: z.ZodType<T>): Promise<T | undefined> {
  const body = await store.get(key, { maxBytes: MAX_STATE_BYTES });
  return body === undefined ? undefined : schema.parse(JSON.parse(body.toString('utf8')));
}

/** Every key under `prefix` (paged). */
async function listAll(store: ObjectStore, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for (;;) {
    const last = keys.at(-1);
    const page = await store.list(prefix, last === undefined ? {} : { startAfter: last });
    keys.push(...page);
    if (page.length < 1000) return keys;
  }
}

/** Stores `policy` (replacing the one of that name). */
export async function putPolicy(store: ObjectStore, policy: RolloutPolicy): Promise<void> {
  await store.put(policyKey(policy.metadata.name), `${JSON.stringify(policy)}\n`);
}

/**
 * Deletes the policy `name`; whether it was there. Its rollout records stay (history; a moving one
 * should be aborted first, so every runtime pokes its members to select again).
 */
export async function deletePolicy(store: ObjectStore, name: string): Promise<boolean> {
  if (!(await store.head(policyKey(name)))) return false;
  await store.delete(policyKey(name));
  return true;
}

/** Every applied policy, by name. @throws RolloutPolicyError for a stored policy that no longer validates. */
export async function listPolicies(store: ObjectStore): Promise<RolloutPolicy[]> {
  const out: RolloutPolicy[] = [];
  for (const key of await listAll(store, POLICY_PREFIX)) {
    const body = await store.get(key);
    if (body) out.push(validateRolloutPolicy(JSON.parse(body.toString('utf8'))));
  }
  return out;
}

/** Policies read within the TTL, per cache owner (see {@link policyFor}). */
const policyCache = new WeakMap<object, { at: number; policies: Promise<RolloutPolicy[]> }>();
/** How long {@link policyFor} keeps what it read, in milliseconds. */
export const POLICY_CACHE_MS = 2000;

/**
 * The policy gating `refName`: the first (by name) applied policy that lists it, else the first
 * with `*`; `undefined` when none does (the PackageInstall is not gated). What it read is kept
 * {@link POLICY_CACHE_MS} per `owner` (default the store): a runtime passes an object that lives
 * as long as it does (its cluster registry), as its runs get per-run store wrappers (the meter).
 * `nowMs` is the caller's clock.
 */
export async function policyFor(
  store: ObjectStore,
  refName: string,
  nowMs: number,
  owner: object = store,
): Promise<RolloutPolicy | undefined> {
  let cached = policyCache.get(owner);
  if (!cached || nowMs - cached.at >= POLICY_CACHE_MS || nowMs < cached.at) {
    cached = { at: nowMs, policies: listPolicies(store) };
    policyCache.set(owner, cached);
    cached.policies.catch(() => policyCache.delete(owner));
  }
  return gatingPolicy(await cached.policies, refName);
}

/**
 * The policy of `policies` gating `refName`: the first by name that lists it, else the first with
 * `*`; `undefined` when none does. The one rule of every reader ({@link policyFor}, a dispatched
 * run's view, the install dispatcher).
 */
export function gatingPolicy(policies: readonly RolloutPolicy[], refName: string): RolloutPolicy | undefined {
  const sorted = [...policies].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  return sorted.find((p) => p.spec.packages.includes(refName)) ?? sorted.find((p) => p.spec.packages.includes('*'));
}

/** A record and its version, for {@link casRollout}. */
export interface VersionedRecord {
  record: RolloutRecord;
  etag: string;
}

/** Reads a rollout record with its version; `undefined` when there is none. */
export async function readRollout(
  store: ObjectStore,
  policy: string,
  refName: string,
): Promise<VersionedRecord | undefined> {
  const got = await store.getVersioned(rolloutKey(policy, refName));
  if (!got) return undefined;
  return { record: rolloutRecordSchema.parse(JSON.parse(got.body.toString('utf8'))), etag: got.etag };
}

/** Every rollout record. */
export async function listRollouts(store: ObjectStore): Promise<RolloutRecord[]> {
  const out: RolloutRecord[] = [];
  for (const key of await listAll(store, ROLLOUT_PREFIX)) {
    const r = await readJson(store, key, rolloutRecordSchema);
    if (r) out.push(r);
  }
  return out;
}

/** `record` with its history bounded to the newest {@link HISTORY_KEPT} lines. */
function bounded(record: RolloutRecord): RolloutRecord {
  return record.history.length <= HISTORY_KEPT ? record : { ...record, history: record.history.slice(-HISTORY_KEPT) };
}

/** A compare-and-swap that kept conflicting ({@link CAS_ATTEMPTS} times). */
export class RolloutConflictError extends Error {
  override readonly name = 'RolloutConflictError';
}

/**
 * Changes a rollout record by compare-and-swap: reads it, asks `change` for the next record
 * (`undefined`: nothing to write), writes it only if the record did not move meanwhile
 * (`putIfMatch`; a create when absent), and on a conflict reads again after a jittered pause.
 *
 * @param change - the next record from the current one (`undefined` when there is none); pure,
 *   it may run several times
 * @returns the record as stored afterwards (`undefined` if none), and whether this call wrote it
 * @throws RolloutConflictError after {@link CAS_ATTEMPTS} conflicts
 */
export async function casRollout(
  store: ObjectStore,
  policy: string,
  refName: string,
  change: (current: RolloutRecord | undefined) => RolloutRecord | undefined,
): Promise<{ record: RolloutRecord | undefined; written: boolean }> {
  const key = rolloutKey(policy, refName);
  for (let attempt = 1; attempt <= CAS_ATTEMPTS; attempt++) {
    const got = await readRollout(store, policy, refName);
    const next = change(got?.record);
    if (next === undefined) return { record: got?.record, written: false };
    const body = `${JSON.stringify(bounded(next))}\n`;
    if ((await store.putIfMatch(key, body, got?.etag)) === 'written') return { record: bounded(next), written: true };
    await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 20 * attempt)));
  }
  throw new RolloutConflictError(`rollout ${policy}/${refName} kept changing (${CAS_ATTEMPTS} attempts)`);
}

/** Reads a fleet index entry; `undefined` when absent. */
export async function readFleetEntry(
  store: ObjectStore,
  clusterId: string,
  namespace: string,
  name: string,
): Promise<FleetEntry | undefined> {
  return await readJson(store, fleetKey(clusterId, namespace, name), fleetEntrySchema);
}

/** `entry` without its write time: two entries that differ only in `at` are the same. */
function sameEntry(a: FleetEntry, b: FleetEntry): boolean {
  return JSON.stringify({ ...a, at: '' }) === JSON.stringify({ ...b, at: '' });
}

/**
 * Writes a fleet index entry when it differs from `previous` (the stored one, as read), so a
 * no-op resync costs one GET and no PUT.
 *
 * @returns whether it was written
 */
export async function writeFleetEntry(
  store: ObjectStore,
  entry: FleetEntry,
  previous: FleetEntry | undefined,
): Promise<boolean> {
  if (previous && sameEntry(previous, entry)) return false;
  await store.put(fleetKey(entry.clusterId, entry.namespace, entry.name), `${JSON.stringify(entry)}\n`);
  return true;
}

/** Deletes a PackageInstall's entry (it was deleted). */
export async function deleteFleetEntry(store: ObjectStore, clusterId: string, namespace: string, name: string) {
  await store.delete(fleetKey(clusterId, namespace, name));
}

/**
 * The fleet index entries, every cluster's, optionally only those of `refName`. One LIST of
 * `state/fleet/` and a GET per entry: its cost grows with the fleet (see the plan's risks).
 */
export async function listFleetEntries(store: ObjectStore, refName?: string): Promise<FleetEntry[]> {
  const out: FleetEntry[] = [];
  for (const key of await listAll(store, FLEET_PREFIX)) {
    const e = await readJson(store, key, fleetEntrySchema).catch(() => undefined);
    // An entry is its key's: one written under cluster A's prefix naming cluster B is ignored (a
    // dispatched run may write its own cluster's prefix only, and must not speak for another).
    if (!e || fleetKey(e.clusterId, e.namespace, e.name) !== key) continue;
    if (refName === undefined || e.refName === refName) out.push(e);
  }
  return out;
}
