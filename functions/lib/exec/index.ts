/**
 * The command runner port, its Node implementation and per-tool metrics. The test fake lives in
 * `./fake.js` and the build-cache resolver in `./bins.js`; neither is re-exported here, so Lambda
 * bundles do not carry them.
 *
 * @module
 */
export * from './metrics.js';
export * from './runner.js';
export * from './tail.js';
