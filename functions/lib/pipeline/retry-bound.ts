/**
 * The bound on retries of a stage that keeps failing for an infrastructure reason (the object
 * store cannot be written, the API server keeps refusing a read or a status write, code
 * crashes), and the final failed status written when that bound is reached.
 *
 * Why: a stage that throws is retried by its transport (the embedded `KeyedQueue`'s
 * backoff, SQS redelivery). Without a bound, the App shows `Reconciling` forever while the stage
 * crash-loops, and on Lambda the event finally lands in the dead-letter queue with nothing in
 * status. kapp-controller has no such failure mode (its status and caches live in one
 * process); its closest behaviour is `ReconcileFailed` with the error, then the failure
 * backoff of the reconcile timer, which is what this produces.
 *
 * Attempts are counted per (object, run): in the embedded runtime by the queue (reset by any
 * newer event of the object, which starts a new run), on Lambda by SQS's
 * `ApproximateReceiveCount` of the record. On the last attempt ({@link DEFAULT_MAX_ATTEMPTS}),
 * a stage that throws gets {@link failRunAfterRetries}: a final `ReconcileFailed` (`DeleteFailed`
 * for a delete) whose message is `<Stage>: <bounded, redacted cause>`, e.g.
 * `Fetching resources: storing the fetch artifact failed: 503 SlowDown`. In the embedded
 * runtime the event is then done; on Lambda it still fails its last receive, so the redrive
 * policy moves it to the dead-letter queue, whose alarm tells the operator (the status tells the
 * App's owner). The forwarder's timer re-runs the App after the failure backoff (§3.3), so
 * nothing is lost; a redrive after the fix re-runs the event too (the run lease and the
 * generation check make a stale one harmless). A PackageRepository, whose whole reconcile is one event (index-repo), ends
 * the same way: `ReconcileFailed` with `Reconciling: <cause>`, or `DeleteFailed` with
 * `Deleting: <cause>` when it is being deleted (its finalizers stay, so it is retried). When that status write fails too (the API server is what is failing),
 * nothing more can be done: the error is logged and the event goes on to the dead-letter queue
 * (Lambda) or stays in the queue's capped backoff (embedded).
 *
 * @module
 */
import {
  type DeployStageData,
  EVENT_TYPES,
  type KappEvent,
  type ObjectRef,
  objectRefOf,
} from '../../../events/schema.js';
import { KAPP_ERROR_PREFIX } from '../deploy/kapp.js';
import { FETCH_RUN_ERROR_PREFIX } from '../fetch/vendir.js';
import type { ResourceRef } from '../kube/port.js';
import type { StatusWriteOutcome } from '../kube/status-write.js';
import { StageMeter } from '../receipt/meter.js';
import { redactSecrets } from '../reconcile/redact.js';
import { SecretMask } from '../reconcile/secret-mask.js';
import {
  failedPartResult,
  formatStatusTime,
  fromEventPart,
  markDeleteFailed,
  markFailed,
  type RunParts,
  summarizeStatus,
} from '../reconcile/status.js';
import { withClusterConfig } from './cluster-config.js';
import type { PipelineDeps } from './deps.js';
import { writeAppStatus } from './report.js';

// Below the pipeline so that the planners' runs (`../fetch/run.ts`) name their steps the same way.
export { InfraError, infraStep } from '../reconcile/infra-step.js';
export { DEFAULT_MAX_ATTEMPTS } from './attempts.js';

/** Bound of the cause in the final status message, UTF-8 bytes (head kept: the action comes first). */
export const INFRA_CAUSE_BYTES = 1024;

/** Depth of the `cause` chain rendered into the message. */
const MAX_CAUSE_DEPTH = 4;

function messageOf(err: unknown): string {
  if (err instanceof Error) return err.message || err.name;
  return typeof err === 'string' ? err : 'unknown error';
}

function cutHead(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text) <= maxBytes) return text;
  const marker = ' [truncated]';
  let out = Buffer.from(text)
    .subarray(0, maxBytes - Buffer.byteLength(marker))
    .toString('utf8');
  // A character split by the byte cut decodes as U+FFFD: drop it.
  out = out.replace(/\uFFFD$/, '');
  return out + marker;
}

/**
 * The cause text of a final failed status: the messages of `err` and its `cause` chain joined
 * with `: ` (a message that already contains its cause's is not repeated), the run's Secret
 * values masked, credential shapes redacted ({@link redactSecrets}), whitespace runs folded to
 * one space, and the head kept within {@link INFRA_CAUSE_BYTES}.
 *
 * @param err - What the stage threw.
 * @param mask - The run's Secret values, when known.
 */
export function infraCauseText(err: unknown, mask?: SecretMask): string {
  const parts: string[] = [];
  let cur: unknown = err;
  for (let depth = 0; cur !== undefined && cur !== null && depth < MAX_CAUSE_DEPTH; depth++) {
    const m = messageOf(cur);
    const prev = parts.at(-1);
    if (!prev?.includes(m)) parts.push(m);
    cur = cur instanceof Error ? cur.cause : undefined;
  }
  const text = parts.join(': ').replace(/\s+/g, ' ').trim();
  const masked = mask ? mask.text(text) : text;
  return cutHead(redactSecrets(masked), INFRA_CAUSE_BYTES);
}

/**
 * Prefix of the final message of a PackageRepository reconcile: its one event runs fetch,
 * template and deploy, so the message names the run, and the cause names the step
 * (`<action> failed: ...`).
 */
export const REPO_RUN_ERROR_PREFIX = 'Reconciling: ';

/**
 * The stage an event runs, as its status prefix: what the user sees before the cause.
 *
 * @param deleting - the object is being deleted (a PackageRepository's delete runs in its
 *   object event); delete events are always a delete.
 */
export function infraStagePrefix(event: KappEvent, deleting = false): string {
  if (deleting) return KAPP_ERROR_PREFIX.delete;
  if (event.type === EVENT_TYPES.object && event.data.kind === 'PackageRepository') return REPO_RUN_ERROR_PREFIX;
  switch (event.type) {
    case EVENT_TYPES.delete:
      return KAPP_ERROR_PREFIX.delete;
    case EVENT_TYPES.template:
      return 'Templating: ';
    case EVENT_TYPES.deploy:
      return KAPP_ERROR_PREFIX.deploy;
    default:
      return FETCH_RUN_ERROR_PREFIX;
  }
}

/**
 * The status part (`fetch`, `template` or `deploy`) of the stage an event runs: the one marked
 * failed (a PackageRepository's run as a whole: `fetch`, its first part; its delete: `deploy`).
 */
function infraStagePart(event: KappEvent, deleting: boolean): 'fetch' | 'template' | 'deploy' {
  if (event.type === EVENT_TYPES.template) return 'template';
  if (deleting || event.type === EVENT_TYPES.deploy || event.type === EVENT_TYPES.delete) return 'deploy';
  return 'fetch';
}

/** The Kubernetes reference of the object an event is about (its kind and apiVersion as sent). */
function resourceRefOf(ref: ObjectRef): ResourceRef {
  return { apiVersion: ref.apiVersion, kind: ref.kind, namespace: ref.namespace, name: ref.name };
}

/**
 * The App or PackageRepository and run fence a final status is written for; `undefined` for
 * events of other kinds (a PackageInstall has no function yet).
 */
function targetOf(event: KappEvent): { ref: ObjectRef; fence: { uid: string; generation: number } } | undefined {
  switch (event.type) {
    case EVENT_TYPES.object:
      if (event.data.kind !== 'App' && event.data.kind !== 'PackageRepository') return undefined;
      return { ref: event.data, fence: { uid: event.data.uid, generation: event.data.generation } };
    case EVENT_TYPES.template:
    case EVENT_TYPES.deploy:
    case EVENT_TYPES.delete:
      return {
        ref: event.data.object,
        fence: { uid: event.data.object.uid, generation: event.data.run.generation },
      };
    default:
      return undefined;
  }
}

/**
 * Writes the final failed status of a run whose stage kept failing: `ReconcileFailed` (or
 * `DeleteFailed` for a delete) with message `<Stage>: <cause>` ({@link infraStagePrefix},
 * {@link infraCauseText}), counters and friendlyDescription as for any failed reconcile
 * (`markFailed`), fenced by the run (a newer spec or a recreated object is left alone). For a
 * PackageRepository the object is read first: with a `deletionTimestamp` its delete is what
 * failed (`DeleteFailed`, `Deleting: <cause>`).
 *
 * @param event - The event whose stage failed on its last attempt.
 * @param err - What the stage threw.
 * @param deps - The pipeline's ports (the status is written through `fetchView`, which every
 *   stage function holds).
 * @param mask - The run's Secret values, when known.
 * @returns the write's outcome (`stale`/`gone`: nothing to report any more; also `gone` for an
 *   event that is not about an App or PackageRepository, which has no such status).
 * @throws what the read or the status write throws (the API server is failing too).
 */
export async function failRunAfterRetries(
  event: KappEvent,
  err: unknown,
  deps: PipelineDeps,
  mask?: SecretMask,
): Promise<StatusWriteOutcome> {
  const target = targetOf(event);
  if (!target) return 'gone';
  const { fence } = target;
  const ref = resourceRefOf(target.ref);
  const kube = deps.clusters.fetchView(target.ref.clusterId);
  let deleting = event.type === EVENT_TYPES.delete;
  if (ref.kind === 'PackageRepository') {
    const live = await kube.getObject(ref);
    if (!live || live.metadata.uid !== fence.uid) return 'gone';
    deleting = Boolean(live.metadata.deletionTimestamp);
  }
  if (event.type === EVENT_TYPES.deploy && event.data.afterFailure) {
    return await failInspectAfterRetries(event.data, err, deps, mask);
  }
  const message = `${infraStagePrefix(event, deleting)}${infraCauseText(err, mask)}`;
  const w = await writeAppStatus(
    kube,
    ref,
    fence,
    (cur) => {
      // The stage that gave up gets a finished, failed part with `updatedAt` now, as a tool
      // failure would: the resync timer's failure backoff counts from the last `updatedAt`
      // (`lastReconcileTime`), and without it the object was never retried once the store healed.
      const part = infraStagePart(event, deleting);
      const prev = (cur as Record<string, unknown> | undefined)?.[part] as Record<string, unknown> | undefined;
      const failedPart = {
        ...(prev ?? {}),
        exitCode: -1,
        error: message,
        finished: true,
        updatedAt: formatStatusTime(deps.now()),
      };
      const next = { ...(cur ?? {}), [part]: failedPart, observedGeneration: fence.generation };
      return deleting ? markDeleteFailed(next, message) : markFailed(next, message);
    },
    mask,
  );
  return w.outcome;
}

/**
 * {@link failRunAfterRetries} for the deploy function's inspect after a failed stage
 * (`DeployStageData.afterFailure`): the run's failure is the stage that failed, not the
 * inspect, so the final status is that failure (as the event's parts hold it) with
 * `status.inspect` failed with the cause (`Inspecting: <cause>`), fenced by the run.
 */
async function failInspectAfterRetries(
  data: DeployStageData,
  err: unknown,
  deps: PipelineDeps,
  mask: SecretMask | undefined,
): Promise<StatusWriteOutcome> {
  const fence = { uid: data.object.uid, generation: data.run.generation };
  const parts: RunParts = {
    fetch: fromEventPart(data.fetchStatus),
    ...(data.templateStatus ? { template: fromEventPart(data.templateStatus) } : {}),
    inspect: {
      exitCode: -1,
      error: `${KAPP_ERROR_PREFIX.inspect}${infraCauseText(err, mask)}`,
      updatedAt: formatStatusTime(deps.now()),
    },
  };
  const w = await writeAppStatus(
    deps.clusters.fetchView(data.object.clusterId),
    resourceRefOf(data.object),
    fence,
    (cur) => {
      const failed = data.afterFailure === 'template' ? 'template' : 'fetch';
      const result = failedPartResult(parts[failed], cur?.[failed]);
      return summarizeStatus(cur, fence.generation, parts, result);
    },
    mask,
  );
  return w.outcome;
}

/**
 * The last attempt of a stage failed: writes the final failed status
 * ({@link failRunAfterRetries}) and logs the outcome (the cause masked and bounded, never the
 * raw error).
 *
 * @param attempts - how many attempts were made (logged).
 * @returns true when the run is over (status written, or nothing left to report: the App is
 *   gone or has a newer spec) and the event may be acknowledged; false when the status write
 *   itself failed (log only: the event goes to the dead-letter queue on Lambda, stays in the
 *   capped backoff in the embedded runtime).
 */
export async function endRunAfterRetries(
  event: KappEvent,
  err: unknown,
  deps: PipelineDeps,
  mask: SecretMask | undefined,
  attempts: number,
): Promise<boolean> {
  const error = infraCauseText(err, mask);
  try {
    const status = await failRunAfterRetries(event, err, deps, mask);
    deps.log.error(
      { subject: event.subject, type: event.type, attempts, error, status },
      'stage failed on its last attempt; run ended with a failed status',
    );
    return true;
  } catch (writeErr) {
    deps.log.error(
      { subject: event.subject, type: event.type, attempts, error, statusError: infraCauseText(writeErr, mask) },
      'stage failed on its last attempt and its failed status could not be written',
    );
    return false;
  }
}

/** Which attempt of a run a stage event is (see `retry-bound.ts`). */
export interface AttemptInfo {
  /** 1-based attempt of this run (embedded: the queue's count; Lambda: `ApproximateReceiveCount`). */
  attempt: number;
  /** Attempts allowed; the one numbered `maxAttempts` (or later) is the last. */
  maxAttempts: number;
}

/** Options of {@link dispatchWithRetryBound}. */
export interface RetryBoundOptions<D extends PipelineDeps = PipelineDeps> {
  /**
   * The stage runner: `dispatchEvent` (`./dispatch.ts`, every stage: the embedded runtime) or one
   * function's route (`./routes/`, the Lambda functions).
   */
  dispatch: (event: KappEvent, deps: D) => Promise<KappEvent | undefined>;
  /**
   * Hands the next stage's event on (Lambda: its queue). It runs inside the bound: a hand-off
   * that keeps failing ends the run like a stage that keeps failing. Default: none (the caller
   * runs `next` itself, as the embedded driver does).
   */
  forward?: (next: KappEvent) => Promise<void>;
  /**
   * The run's Secret values (what the stage adds to it is masked in the final status and in
   * the caller's logs). Default a fresh {@link SecretMask}.
   */
  secretMask?: SecretMask;
  /**
   * Loads the event's cluster before anything reads it (the fleet registry's `prepare`); then
   * the cluster's `kapp-controller-config` is laid over `deps` (`withClusterConfig`).
   */
  prepare?: (clusterId: string) => Promise<void>;
}

/**
 * A stage runner (`dispatchEvent` or a function's route) under the retry bound, THE one used by
 * both runtimes (the embedded driver and the Lambda SQS handler): the stage runs with the run's {@link SecretMask}, its next
 * event is forwarded (`forward`), and when either throws on the last attempt the run ends with a
 * final failed status ({@link endRunAfterRetries}: `ReconcileFailed`, or `DeleteFailed` for a delete,
 * for Apps and PackageRepositories alike) instead of another retry.
 *
 * @param attempt - which attempt this is; an `attempt` below `maxAttempts` (or unknown: 0) never
 *   ends the run.
 * @returns `next`: the next stage's event, if any (already forwarded when `forward` is given);
 *   `ended`: true when the run was ended by the retry bound (the event must be acknowledged).
 * @throws what the stage or the hand-off threw, before the last attempt, or when the final
 *   status could not be written either.
 */
export async function dispatchWithRetryBound<D extends PipelineDeps>(
  event: KappEvent,
  deps: D,
  attempt: AttemptInfo,
  options: RetryBoundOptions<D>,
): Promise<{ next?: KappEvent; ended?: true }> {
  const secretMask = options.secretMask ?? new SecretMask();
  // The run's texts show its scratch directories by their stable stand-ins (`addScratchRoot`);
  // a dispatch that never runs a stage (a test's stub deps) may come without a configuration.
  const tmpRoot = (deps.config as Partial<PipelineDeps['config']> | undefined)?.tmpRoot;
  if (tmpRoot) secretMask.addScratchRoot(tmpRoot);
  const dispatch = options.dispatch;
  try {
    const clusterId = objectRefOf(event).clusterId;
    await options.prepare?.(clusterId);
    // Each event's stage is metered for the run's receipt (`./app/receipts.ts`).
    const meter = new StageMeter();
    const metered = { ...deps, secretMask, meter, store: meter.store(deps.store), runner: meter.runner(deps.runner) };
    const next = await dispatch(event, await withClusterConfig(metered, clusterId));
    if (next && options.forward) await options.forward(next);
    return next ? { next } : {};
  } catch (err) {
    if (attempt.attempt < attempt.maxAttempts) throw err;
    if (await endRunAfterRetries(event, err, deps, secretMask, attempt.attempt)) return { ended: true };
    throw err;
  }
}
