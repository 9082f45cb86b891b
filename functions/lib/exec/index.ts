/**
 * The command runner port, its Node implementation and per-tool metrics. The test fake lives in
 * `./fake.js` and is not re-exported here, so Lambda bundles do not carry it (the build-cache
 * resolver is the embedded runtime's: `functions/embedded/bins.ts`).
 *
 * @module
 */
export * from './metrics.js';
export * from './runner.js';
export * from './tail.js';
