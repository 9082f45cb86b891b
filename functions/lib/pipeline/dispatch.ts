/**
 * Routing of events to stage handlers.
 *
 * {@link dispatchEvent} runs the stage an event is for (through the route of the function it
 * targets, `./routes/`) and returns the next stage's event (or none). On Lambda each stage is
 * its own function, which loads its own route only, and the returned event goes to the next
 * stage's queue; the embedded runtime's
 * driver (`functions/embedded/pipeline.ts`) runs the stages of one object back to back in
 * process.
 */
import { type FunctionName, type KappEvent, targetFunction } from '../../../events/schema.js';
import type { DispatchDeps } from './deps.js';
import { route as deployRoute } from './routes/deploy.js';
import { route as fetchRoute } from './routes/fetch.js';
import { route as indexRepoRoute } from './routes/index-repo.js';
import { route as installRoute } from './routes/install.js';
import type { FunctionRoute } from './routes/route.js';
import { route as templateRoute } from './routes/template.js';

export type { DispatchDeps } from './deps.js';

/** Every function's route (`./routes/`), by function. */
export const ROUTES: Readonly<Record<FunctionName, FunctionRoute>> = Object.freeze({
  fetch: fetchRoute,
  template: templateRoute,
  deploy: deployRoute,
  'index-repo': indexRepoRoute,
  install: installRoute,
});

/**
 * Runs the stage `event` is for: the route of the function it targets (`targetFunction`). A
 * PackageRepository's run may return a `repo.indexed` event (its versions changed), whose stage
 * sends `ref-changed` events to PackageInstalls through `deps.emit`.
 *
 * @returns the next stage's event, or `undefined` when the run ended (success, failure with
 *   status written, no-op, stale, gone).
 * @throws on infrastructure failures (API, store, crashed code): deliver the same event again.
 */
export async function dispatchEvent(event: KappEvent, deps: DispatchDeps): Promise<KappEvent | undefined> {
  return await ROUTES[targetFunction(event)].dispatch(event, deps);
}
