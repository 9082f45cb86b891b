/**
 * Fetch-stage planning (vendir config, referenced objects, pinned sources).
 *
 * @module
 */
export * from './pinned.js';
export * from './refs.js';
export * from './types.js';
export * from './vendir.js';
