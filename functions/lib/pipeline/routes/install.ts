/**
 * The install function's route: a PackageInstall's reconcile in one invocation
 * (`../install/install.ts`), and a repository's `repo.indexed` fan-out to the PackageInstalls it
 * concerns (`../install/install-fanout.ts`).
 *
 * @module
 */
import { EVENT_TYPES } from '../../../../events/schema.js';
import { runInstall } from '../install/install.js';
import { fanOutRepoIndexed } from '../install/install-fanout.js';
import { type FunctionRoute, unhandled } from './route.js';

/** {@link FunctionRoute} of the install function. */
export const route: FunctionRoute = {
  dispatch: async (event, deps) => {
    if (event.type === EVENT_TYPES.object && event.data.kind === 'PackageInstall') {
      await runInstall(event, deps);
      return undefined;
    }
    if (event.type === EVENT_TYPES.repoIndexed) {
      await fanOutRepoIndexed(event, deps);
      return undefined;
    }
    return unhandled(event, deps);
  },
};
