/**
 * Reconcile core: the reconcile timer, the command result and its error classifier, redaction
 * and bounding, and status transitions and the summarizer.
 * Mirrors kapp-controller `pkg/app/reconcile_timer.go`, `pkg/app/app_reconcile.go`,
 * `pkg/exec/cmd_run_result.go` (see each module).
 *
 * @module
 */
export * from './redact.js';
export * from './result.js';
export * from './secret-mask.js';
export * from './status.js';
export * from './status-budget.js';
export * from './timer.js';
export type * from './types.js';
