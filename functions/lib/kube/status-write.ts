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
  KubeApiError,
  type KubeObject,
  type KubeReader,
  type ResourceRef,
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
  /**
   * Set when the API server rejected the status as too large and {@link StatusBounds.tooLarge}'s
   * status was written (or found unchanged) instead.
   */
  tooLarge?: true;
  /** `metadata.resourceVersion` after the call (`written`: the new one; `unchanged`/`stale`: the one read); `undefined` when `gone`. */
  resourceVersion: string | undefined;
  /** Number of GETs done (1 unless 409s forced re-reads). */
  attempts: number;
  /**
   * The object as stored after the call, as far as it is known: the write's answer (or the object
   * planned on with the written status and new resourceVersion), or the object read for
   * `unchanged`/`stale`; `undefined` when `gone`. What a later write of the same stage may plan on
   * (`read` of {@link writeStatus}) instead of reading the object again.
   */
  object?: KubeObject;
}

/**
 * How a status is kept within the API server's size limit (see `reconcile/status-budget.ts`).
 * Both functions must be pure.
 */
export interface StatusBounds<S> {
  /** Makes the status about to be written fit; `object` is the object as read (its size counts). */
  fit(status: S, object: KubeObject): S;
  /**
   * The status written instead when the API server rejected `attempted` as too large
   * ({@link isStatusTooLargeError}); it must be small.
   */
  tooLarge(current: S | undefined, attempted: S, error: KubeApiError): S;
}

/** What the API server answers when a request or the stored object is too large. */
const TOO_LARGE_MESSAGE =
  /request entity too large|etcdserver: request is too large|ResourceExhausted|trying to send message larger than max/i;

/**
 * True when a write failed because of its size: HTTP 413 (`Request entity too large: limit is
 * 3145728`, the API server's 3 MiB request body bound), or a 500/422 carrying etcd's refusal
 * (`etcdserver: request is too large` above `--max-request-bytes`, 1.5 MiB by default) or its
 * client's (`rpc error: code = ResourceExhausted desc = trying to send message larger than max
 * (N vs. 2097152)`). Retrying such a write can never succeed.
 *
 * @param error - Anything thrown by a {@link StatusWriter}.
 */
export function isStatusTooLargeError(error: unknown): error is KubeApiError {
  if (!(error instanceof KubeApiError)) return false;
  if (error.statusCode === 413 || error.reason === 'RequestEntityTooLarge') return true;
  return (error.statusCode === 500 || error.statusCode === 422) && TOO_LARGE_MESSAGE.test(error.message);
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
 * the new one; `fitTo` (a {@link StatusBounds.fit}), when given, then bounds it before it is
 * compared with the stored one. Pure (as long as `mutate` and `fitTo` are).
 */
export function planStatusWrite<S>(
  object: KubeObject | undefined,
  run: RunFence,
  mutate: (current: S | undefined) => S,
  fitTo?: StatusBounds<S>['fit'],
): StatusWritePlan {
  if (!object || object.metadata.uid !== run.uid) return { action: 'gone' };
  const resourceVersion = object.metadata.resourceVersion;
  if (object.metadata.generation !== run.generation) return { action: 'stale', resourceVersion };
  const current = normalizeStatus(object.status);
  const mutated = mutate(structuredClone(current) as S | undefined);
  const next = normalizeStatus(fitTo ? fitTo(mutated, object) : mutated);
  if (isDeepStrictEqual(current, next)) return { action: 'unchanged', resourceVersion };
  return { action: 'write', resourceVersion, status: next };
}

/**
 * The object as the caller holds it, planned on by {@link writeStatus}'s first attempt instead of
 * a GET.
 */
export interface KnownObject {
  /** The object; `undefined` (not found) ends the write as `gone`, as a GET would. */
  object: KubeObject | undefined;
  /**
   * True when the copy may be older than a read made now would give (kept from an earlier read or
   * write of the stage, rather than just read): a plan that finds the status `unchanged` on it is
   * then checked against the stored object (a GET) before nothing is written, so a status some
   * other writer changed meanwhile is still written back. Any other stale plan costs a 409 and the
   * usual re-read.
   */
  kept?: boolean;
}

/**
 * GETs `ref`, applies {@link planStatusWrite}, and replaces the status with the read
 * resourceVersion as precondition. On 409 it re-reads and re-plans (so `mutate` may run
 * up to {@link STATUS_WRITE_ATTEMPTS} times and must be a pure function of the current
 * status). A deletion run must carry the generation read after the deletionTimestamp
 * was set (the API server bumps it).
 *
 * With `bounds`, every status passes `bounds.fit` before it is compared and sent, and a write
 * the API server rejects as too large ({@link isStatusTooLargeError}) is not retried as is:
 * the next attempt writes `bounds.tooLarge(...)` instead (once; result `tooLarge: true`).
 *
 * @param read - the object as the caller holds it: the first attempt plans on it instead of a
 *   GET (a large object, a PackageRepository holding its whole inline repository, is not fetched
 *   twice in a row; a stage's second write plans on the first one's {@link StatusWriteResult.object}).
 *   A copy older than the stored object only costs a 409 and the usual re-read (and, when
 *   {@link KnownObject.kept}, a GET before an `unchanged` outcome).
 * @returns the outcome; see {@link StatusWriteOutcome}.
 * @throws ConflictError when all {@link STATUS_WRITE_ATTEMPTS} attempts conflicted.
 * @throws KubeApiError on any other API failure (from the reader or writer), including a
 *   too-large rejection without `bounds` or of the fallback status itself.
 */
export async function writeStatus<S>(
  client: KubeReader & StatusWriter,
  ref: ResourceRef,
  run: RunFence,
  mutate: (current: S | undefined) => S,
  bounds?: StatusBounds<S>,
  read?: KnownObject,
): Promise<StatusWriteResult> {
  let lastConflict: ConflictError | undefined;
  let planned = mutate;
  let tooLarge = false;
  let copy = read;
  const result = (r: StatusWriteResult): StatusWriteResult => (tooLarge ? { ...r, tooLarge: true } : r);
  // The fallback after a too-large rejection gets one attempt of its own.
  for (let attempt = 1; attempt <= STATUS_WRITE_ATTEMPTS + (tooLarge ? 1 : 0); attempt++) {
    let object = copy ? copy.object : await client.getObject(ref);
    let plan = planStatusWrite(object, run, planned, bounds?.fit);
    if (copy?.kept && plan.action === 'unchanged') {
      object = await client.getObject(ref);
      plan = planStatusWrite(object, run, planned, bounds?.fit);
    }
    copy = undefined;
    if (plan.action === 'gone') {
      return result({ outcome: 'gone', resourceVersion: undefined, attempts: attempt });
    }
    if (plan.action === 'stale' || plan.action === 'unchanged') {
      return result({ outcome: plan.action, resourceVersion: plan.resourceVersion, attempts: attempt, object });
    }
    try {
      const written = await client.updateStatus(
        ref,
        { resourceVersion: plan.resourceVersion, uid: run.uid },
        plan.status,
      );
      const stored = written.object ?? {
        ...(object as KubeObject),
        metadata: { ...(object as KubeObject).metadata, resourceVersion: written.resourceVersion },
        status: plan.status,
      };
      return result({
        outcome: 'written',
        resourceVersion: written.resourceVersion,
        attempts: attempt,
        object: stored,
      });
    } catch (error) {
      if (error instanceof GoneError) {
        return result({ outcome: 'gone', resourceVersion: undefined, attempts: attempt });
      }
      if (bounds && !tooLarge && isStatusTooLargeError(error)) {
        const attempted = plan.status as S;
        planned = (current) => bounds.tooLarge(current, attempted, error);
        tooLarge = true;
        continue;
      }
      if (!(error instanceof ConflictError)) throw error;
      lastConflict = error;
    }
  }
  throw lastConflict ?? new ConflictError('writing status: conflict');
}
