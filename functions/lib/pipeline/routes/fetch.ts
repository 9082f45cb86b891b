/**
 * The fetch function's route: an App's object event starts (or deletes) its run
 * (`../app/reconcile.ts`: vendir, then the template hand-off); an App's health event (the
 * forwarder's, `dev.kapp-lambda.health.v1`) writes its added Healthy condition
 * (`../app/health.ts`): the fetch function is the one that writes App status.
 *
 * @module
 */
import { EVENT_TYPES } from '../../../../events/schema.js';
import { applyHealth } from '../app/health.js';
import { handleAppEvent } from '../app/reconcile.js';
import { type FunctionRoute, nextEvent, unhandled } from './route.js';

/** {@link FunctionRoute} of the fetch function. */
export const route: FunctionRoute = {
  dispatch: async (event, deps) => {
    if (event.type === EVENT_TYPES.health) {
      await applyHealth(event, deps);
      return undefined;
    }
    return event.type === EVENT_TYPES.object && event.data.kind === 'App'
      ? nextEvent(await handleAppEvent(event, deps), deps)
      : unhandled(event, deps);
  },
};
