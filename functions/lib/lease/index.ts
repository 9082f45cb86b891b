/**
 * The run lease of an App on Lambda (`./run-leases.ts`), the gate a stage function's record runs
 * through (`./gate.ts`), the coalescing rule the lease shares with the embedded runtime
 * (`./coalesce.ts`), and the fair shares of a stage function's slots per cluster and namespace
 * (`./shares.ts`).
 *
 * @module
 */
export * from './coalesce.js';
export * from './gate.js';
export * from './run-leases.js';
export * from './shares.js';
