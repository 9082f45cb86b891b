/**
 * The run lease of an App on Lambda (`./run-leases.ts`), the gate a stage function's record runs
 * through (`./gate.ts`), and the coalescing rule the lease shares with the embedded runtime
 * (`./coalesce.ts`).
 *
 * @module
 */
export * from './coalesce.js';
export * from './gate.js';
export * from './run-leases.js';
