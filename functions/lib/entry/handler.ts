/**
 * The SQS handler of the stage functions with every function's route (`dispatchEvent`): what
 * the unit tests and local runs build. The Lambda entry files use `makeStageHandler`
 * (`./stage-handler.ts`) with their own route only, so that a function's bundle carries its
 * own stage and none of the others'.
 *
 * @module
 */

import type { PipelineStage } from '../api/functions.js';
import { type EntryDeps, makeStageHandler, type SqsHandler } from './stage-handler.js';

export * from './stage-handler.js';

/**
 * {@link makeStageHandler} with every route: `dispatchEvent` runs whatever stage an event is
 * for (the handler still drops events for another function than `stage`), and the poll is
 * `pollSources`.
 *
 * @param stage - the function this handler runs as.
 * @param depsFactory - builds the dependencies once per process (see {@link makeStageHandler}).
 * @returns the handler.
 */
export function makeSqsHandler(stage: PipelineStage, depsFactory: () => EntryDeps | Promise<EntryDeps>): SqsHandler {
  return makeStageHandler(stage, depsFactory, async () => {
    const [{ dispatchEvent }, { pollSources }] = await Promise.all([
      import('../pipeline/dispatch.js'),
      import('../pipeline/repo/index.js'),
    ]);
    return { dispatch: dispatchEvent, pollSources };
  });
}
