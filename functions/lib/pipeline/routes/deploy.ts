/**
 * The deploy function's route: `kapp deploy` for a template → deploy hand-off (or its own
 * continuation, `../app/deploy.ts`), `kapp delete` for a delete hand-off (`../app/delete.ts`).
 *
 * @module
 */
import { deployEvent, EVENT_TYPES } from '../../../../events/schema.js';
import { runDelete } from '../app/delete.js';
import { runDeploy } from '../app/deploy.js';
import { type FunctionRoute, unhandled } from './route.js';

/** {@link FunctionRoute} of the deploy function. */
export const route: FunctionRoute = {
  dispatch: async (event, deps) => {
    if (event.type === EVENT_TYPES.deploy) {
      // The deadline stopped kapp: the deploy continues in a follow-up invocation (Lambda).
      const continuation = await runDeploy(event.data, deps);
      return continuation && deployEvent(continuation, { time: deps.now() });
    }
    if (event.type === EVENT_TYPES.delete) {
      await runDelete({ clusterId: event.data.object.clusterId, ref: event.data.object, run: event.data.run }, deps);
      return undefined;
    }
    return unhandled(event, deps);
  },
};
