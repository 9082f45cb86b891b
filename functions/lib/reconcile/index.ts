/**
 * Reconcile core: the reconcile timer, and status transitions and error surface.
 * Mirrors kapp-controller `pkg/app/reconcile_timer.go`, `pkg/app/app_reconcile.go`,
 * `pkg/exec/cmd_run_result.go` (see each module).
 *
 * @module
 */
export * from './secret-mask.js';
export * from './status.js';
export * from './status-budget.js';
export * from './timer.js';
export type * from './types.js';
