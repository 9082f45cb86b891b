/**
 * The run lease of an App on Lambda (`./run-leases.ts`) and the coalescing rule it shares with
 * the embedded runtime (`./coalesce.ts`).
 *
 * @module
 */
export * from './coalesce.js';
export * from './run-leases.js';
