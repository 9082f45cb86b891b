/**
 * The PackageInstall product's public entry (kapp-controller's `pkg/packageinstall`): what
 * other products, the runtimes and the scripts may use of it. The function routes
 * (`../routes/`) import the stage modules themselves (one bundle per function).
 *
 * @module
 */

export { PKGI_KIND, runInstall } from './install.js';
export { fanOutRepoIndexed } from './install-fanout.js';
export { checkRollouts } from './rollout-pokes.js';
