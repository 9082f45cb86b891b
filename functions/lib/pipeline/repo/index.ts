/**
 * The PackageRepository product's public entry (kapp-controller's `pkg/pkgrepository`), with
 * the fleet's source poll: what other products, the runtimes and the scripts may use of it.
 * The function routes (`../routes/`) import the stage modules themselves (one bundle per
 * function).
 *
 * @module
 */

export { type PollSummary, pollSources, sourceCheckPeriodMs, sourcePollPeriodMs } from '../source-poll.js';
export { PKGR_KIND, runIndexRepo } from './index-repo.js';
