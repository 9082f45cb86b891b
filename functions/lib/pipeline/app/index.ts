/**
 * The App product's public entry (kapp-controller's `pkg/app`): what other products, the
 * runtimes and the scripts may use of it. The function routes (`../routes/`) import the stage
 * modules themselves, so each function's bundle holds its own stage and none of the others'.
 *
 * @module
 */
export { runDelete } from './delete.js';
export { runDeploy } from './deploy.js';
export { runFetch } from './fetch.js';
export { APP_KIND } from './kind.js';
export { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION } from './receipts.js';
export { handleAppEvent } from './reconcile.js';
export { runTemplate } from './template.js';
