/**
 * What one function runs: its {@link FunctionRoute}, one module per function
 * (`./<function>.ts`), so that a function's bundle holds its own stage and none of the others'
 * (each Lambda entry file loads only its own route, on the first record that needs it).
 * `../dispatch.ts` (`dispatchEvent`) joins the five for the embedded runtime, which runs every stage in one process.
 *
 * @module
 */
import { deleteEvent, deployEvent, type KappEvent, templateEvent } from '../../../../events/schema.js';
import type { DispatchDeps, PipelineDeps, StageOutput } from '../deps.js';
import type { PollSummary } from '../repo/index.js';

/**
 * Runs the stage `event` is for.
 *
 * @returns the next stage's event, or `undefined` when the run ended (success, failure with
 *   status written, no-op, stale, gone).
 * @throws on infrastructure failures (API, store, crashed code): deliver the same event again.
 */
export type StageDispatch = (event: KappEvent, deps: DispatchDeps) => Promise<KappEvent | undefined>;

/** One function's stage runner, and the index-repo function's source poll. */
export interface FunctionRoute {
  /** Runs the events targeted at this function (`targetFunction`); others are logged and dropped. */
  readonly dispatch: StageDispatch;
  /** The schedule's source poll (`../source-poll.ts`): the index-repo function's only. */
  readonly pollSources?: (deps: PipelineDeps) => Promise<PollSummary>;
}

/** The event a stage's output hands on: template, deploy or delete, else none. */
export function nextEvent(out: StageOutput, deps: PipelineDeps): KappEvent | undefined {
  const opts = { time: deps.now() };
  if (out.template) return templateEvent(out.template, opts);
  if (out.deploy) return deployEvent(out.deploy, opts);
  if (out.delete) return deleteEvent({ object: out.delete.ref, run: out.delete.run }, opts);
  return undefined;
}

/** Logs an event no handler of this function takes, and drops it (returns `undefined`). */
export function unhandled(event: KappEvent, deps: PipelineDeps): undefined {
  deps.log.warn({ type: event.type, subject: event.subject }, 'no handler for this event in this function; dropped');
  return undefined;
}
