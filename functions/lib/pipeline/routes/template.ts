/**
 * The template function's route: a fetch → template hand-off renders the artifact
 * (`../app/template.ts`) and hands on to deploy.
 *
 * @module
 */
import { EVENT_TYPES } from '../../../../events/schema.js';
import { runTemplate } from '../app/template.js';
import { type FunctionRoute, nextEvent, unhandled } from './route.js';

/** {@link FunctionRoute} of the template function. */
export const route: FunctionRoute = {
  dispatch: async (event, deps) =>
    event.type === EVENT_TYPES.template
      ? nextEvent(await runTemplate(event.data, deps, deps.clusterInfo), deps)
      : unhandled(event, deps),
};
