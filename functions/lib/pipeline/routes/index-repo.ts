/**
 * The index-repo function's route: a PackageRepository's whole reconcile in one invocation
 * (`../repo/index-repo.ts`), and the schedule's source poll (`../source-poll.ts`).
 *
 * @module
 */
import { EVENT_TYPES } from '../../../../events/schema.js';
import { runIndexRepo } from '../repo/index-repo.js';
import { pollSources } from '../source-poll.js';
import { type FunctionRoute, unhandled } from './route.js';

/** {@link FunctionRoute} of the index-repo function. */
export const route: FunctionRoute = {
  dispatch: async (event, deps) =>
    event.type === EVENT_TYPES.object && event.data.kind === 'PackageRepository'
      ? await runIndexRepo(event, deps)
      : unhandled(event, deps),
  pollSources: (deps) => pollSources(deps),
};
