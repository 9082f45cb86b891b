/**
 * The fetch function's route: an App's object event starts (or deletes) its run
 * (`../app/reconcile.ts`: vendir, then the template hand-off).
 *
 * @module
 */
import { EVENT_TYPES } from '../../../../events/schema.js';
import { handleAppEvent } from '../app/reconcile.js';
import { type FunctionRoute, nextEvent, unhandled } from './route.js';

/** {@link FunctionRoute} of the fetch function. */
export const route: FunctionRoute = {
  dispatch: async (event, deps) =>
    event.type === EVENT_TYPES.object && event.data.kind === 'App'
      ? nextEvent(await handleAppEvent(event, deps), deps)
      : unhandled(event, deps),
};
