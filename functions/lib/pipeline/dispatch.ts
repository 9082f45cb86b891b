/**
 * Routing of events to stage handlers.
 *
 * {@link dispatchEvent} is what every function entry calls: it runs the stage an event is
 * for and returns the next stage's event (or none). On Lambda each stage is its own
 * function and the returned event goes to the next stage's queue; the embedded runtime's
 * driver (`functions/embedded/pipeline.ts`) runs the stages of one object back to back in
 * process.
 */
import { deleteEvent, deployEvent, EVENT_TYPES, type KappEvent, templateEvent } from '../../../events/schema.js';
import { SecretMask } from '../reconcile/secret-mask.js';
import { runDelete, runDeploy } from './deploy.js';
import type { PipelineDeps, StageOutput } from './deps.js';
import { type IndexRepoDeps, runIndexRepo } from './index-repo.js';
import { runInstall } from './install.js';
import { fanOutRepoIndexed } from './install-fanout.js';
import { handleAppEvent } from './reconcile.js';
import { endRunAfterRetries } from './retry-bound.js';
import { type ClusterInfoSource, runTemplate } from './template.js';

/** Dependencies of {@link dispatchEvent} (the index-repo ports are optional). */
export interface DispatchDeps extends IndexRepoDeps {
  /** Live cluster values for templates that need them. */
  clusterInfo: ClusterInfoSource;
}

function nextEvent(out: StageOutput, deps: PipelineDeps): KappEvent | undefined {
  const opts = { time: deps.now() };
  if (out.template) return templateEvent(out.template, opts);
  if (out.deploy) return deployEvent(out.deploy, opts);
  if (out.delete) return deleteEvent({ object: out.delete.ref, run: out.delete.run }, opts);
  return undefined;
}

/**
 * Runs the stage `event` is for. A PackageRepository's run may return a `repo.indexed` event
 * (its versions changed), whose stage sends `ref-changed` events to PackageInstalls through
 * `deps.emit`.
 *
 * @returns the next stage's event, or `undefined` when the run ended (success, failure with
 *   status written, no-op, stale, gone).
 * @throws on infrastructure failures (API, store, crashed code): deliver the same event again.
 */
export async function dispatchEvent(event: KappEvent, deps: DispatchDeps): Promise<KappEvent | undefined> {
  switch (event.type) {
    case EVENT_TYPES.object:
      if (event.data.kind === 'PackageRepository') return await runIndexRepo(event, deps);
      if (event.data.kind === 'PackageInstall') {
        await runInstall(event, deps);
        return undefined;
      }
      if (event.data.kind !== 'App') {
        deps.log.warn({ kind: event.data.kind, subject: event.subject }, 'no handler for this kind yet; event dropped');
        return undefined;
      }
      return nextEvent(await handleAppEvent(event, deps), deps);
    case EVENT_TYPES.template:
      return nextEvent(await runTemplate(event.data, deps, deps.clusterInfo), deps);
    case EVENT_TYPES.deploy: {
      // The deadline stopped kapp: the deploy continues in a follow-up invocation (Lambda).
      const continuation = await runDeploy(event.data, deps);
      return continuation && deployEvent(continuation, { time: deps.now() });
    }
    case EVENT_TYPES.delete:
      await runDelete({ clusterId: event.data.object.clusterId, ref: event.data.object, run: event.data.run }, deps);
      return undefined;
    case EVENT_TYPES.repoIndexed:
      await fanOutRepoIndexed(event, deps);
      return undefined;
    default:
      deps.log.warn({ type: (event as KappEvent).type }, 'no handler for this event type; event dropped');
      return undefined;
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
export interface RetryBoundOptions {
  /** The stage runner; default {@link dispatchEvent} (tests replace it). */
  dispatch?: (event: KappEvent, deps: DispatchDeps) => Promise<KappEvent | undefined>;
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
}

/**
 * {@link dispatchEvent} under the retry bound, THE one used by both runtimes (the embedded
 * driver and the Lambda SQS handler): the stage runs with the run's {@link SecretMask}, its next
 * event is forwarded (`forward`), and when either throws on the last attempt the run ends with a
 * final failed status (`endRunAfterRetries`: `ReconcileFailed`, or `DeleteFailed` for a delete,
 * for Apps and PackageRepositories alike) instead of another retry.
 *
 * @param attempt - which attempt this is; an `attempt` below `maxAttempts` (or unknown: 0) never
 *   ends the run.
 * @returns `next`: the next stage's event, if any (already forwarded when `forward` is given);
 *   `ended`: true when the run was ended by the retry bound (the event must be acknowledged).
 * @throws what the stage or the hand-off threw, before the last attempt, or when the final
 *   status could not be written either.
 */
export async function dispatchWithRetryBound(
  event: KappEvent,
  deps: DispatchDeps,
  attempt: AttemptInfo,
  options: RetryBoundOptions = {},
): Promise<{ next?: KappEvent; ended?: true }> {
  const secretMask = options.secretMask ?? new SecretMask();
  const dispatch = options.dispatch ?? dispatchEvent;
  try {
    const next = await dispatch(event, { ...deps, secretMask });
    if (next && options.forward) await options.forward(next);
    return next ? { next } : {};
  } catch (err) {
    if (attempt.attempt < attempt.maxAttempts) throw err;
    if (await endRunAfterRetries(event, err, deps, secretMask, attempt.attempt)) return { ended: true };
    throw err;
  }
}
