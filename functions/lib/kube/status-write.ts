/**
 * Fenced status writes: kapp-controller's status-write discipline (`pkg/app/crd_app.go`
 * `updateStatus`: GET, skip if DeepEqual, `UpdateStatus`, up to 5 attempts) plus the
 * fence of our pipeline (DESIGN.md "Ordering"): a run carries the uid and generation it
 * started from and never overwrites the status of a newer spec or of a recreated object.
 *
 * @module
 */

import { isDeepStrictEqual } from 'node:util';
import {
  ConflictError,
  GoneError,
  type KubeObject,
  type KubeReader,
  type ObjectRef,
  type StatusWriter,
} from './port.js';

/** Attempts before a run of 409s is given up (`crd_app.go` retries 5 times). */
export const STATUS_WRITE_ATTEMPTS = 5;

/** What a run is fenced by: the object it started from. */
export interface RunFence {
  /** `metadata.uid` of the object the run started from. */
  uid: string;
  /** `metadata.generation` the run started from. */
  generation: number;
}

/**
 * - `written`: the status was replaced;
 * - `unchanged`: the new status deep-equals the stored one, nothing was sent;
 * - `stale`: `metadata.generation` moved past the run's (a newer spec exists; its run
 *   owns the status now);
 * - `gone`: the object no longer exists, or the name now belongs to another uid.
 */
export type StatusWriteOutcome = 'written' | 'unchanged' | 'stale' | 'gone';

/** Result of {@link writeStatus}. */
export interface StatusWriteResult {
  outcome: StatusWriteOutcome;
  /** `metadata.resourceVersion` after the call (`written`: the new one; `unchanged`/`stale`: the one read); `undefined` when `gone`. */
  resourceVersion: string | undefined;
  /** Number of GETs done (1 unless 409s forced re-reads). */
  attempts: number;
}

/** Decision for one read object. */
export type StatusWritePlan =
  | { action: 'gone' }
  | { action: 'stale'; resourceVersion: string }
  | { action: 'unchanged'; resourceVersion: string }
  | { action: 'write'; resourceVersion: string; status: unknown };

/**
 * JSON-normalizes a status: drops `undefined` members and turns Dates into strings, so
 * the deep-equal check compares what the API server would store. Pure.
 */
export function normalizeStatus(status: unknown): unknown {
  return status === undefined ? undefined : (JSON.parse(JSON.stringify(status)) as unknown);
}

/**
 * Decides what to do with `object` (as just read, or `undefined` on 404) for `run`.
 * `mutate` gets a deep copy of the current status (`undefined` when none) and returns
 * the new one. Pure (as long as `mutate` is).
 */
export function planStatusWrite<S>(
  object: KubeObject | undefined,
  run: RunFence,
  mutate: (current: S | undefined) => S,
): StatusWritePlan {
  if (!object || object.metadata.uid !== run.uid) return { action: 'gone' };
  const resourceVersion = object.metadata.resourceVersion;
  if (object.metadata.generation !== run.generation) return { action: 'stale', resourceVersion };
  const current = normalizeStatus(object.status);
  const next = normalizeStatus(mutate(structuredClone(current) as S | undefined));
  if (isDeepStrictEqual(current, next)) return { action: 'unchanged', resourceVersion };
  return { action: 'write', resourceVersion, status: next };
}

/**
 * GETs `ref`, applies {@link planStatusWrite}, and replaces the status with the read
 * resourceVersion as precondition. On 409 it re-reads and re-plans (so `mutate` may run
 * up to {@link STATUS_WRITE_ATTEMPTS} times and must be a pure function of the current
 * status). A deletion run must carry the generation read after the deletionTimestamp
 * was set (the API server bumps it).
 *
 * @returns the outcome; see {@link StatusWriteOutcome}.
 * @throws ConflictError when all {@link STATUS_WRITE_ATTEMPTS} attempts conflicted.
 * @throws KubeApiError on any other API failure (from the reader or writer).
 */
export async function writeStatus<S>(
  client: KubeReader & StatusWriter,
  ref: ObjectRef,
  run: RunFence,
  mutate: (current: S | undefined) => S,
): Promise<StatusWriteResult> {
  let lastConflict: ConflictError | undefined;
  for (let attempt = 1; attempt <= STATUS_WRITE_ATTEMPTS; attempt++) {
    const plan = planStatusWrite(await client.getObject(ref), run, mutate);
    if (plan.action === 'gone') {
      return { outcome: 'gone', resourceVersion: undefined, attempts: attempt };
    }
    if (plan.action === 'stale' || plan.action === 'unchanged') {
      return { outcome: plan.action, resourceVersion: plan.resourceVersion, attempts: attempt };
    }
    try {
      const written = await client.updateStatus(
        ref,
        { resourceVersion: plan.resourceVersion, uid: run.uid },
        plan.status,
      );
      return { outcome: 'written', resourceVersion: written.resourceVersion, attempts: attempt };
    } catch (error) {
      if (error instanceof GoneError) {
        return { outcome: 'gone', resourceVersion: undefined, attempts: attempt };
      }
      if (!(error instanceof ConflictError)) throw error;
      lastConflict = error;
    }
  }
  throw lastConflict ?? new ConflictError('writing status: conflict');
}
