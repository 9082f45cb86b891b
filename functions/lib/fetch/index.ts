/**
 * Fetch-stage planning (vendir config, pinned sources).
 *
 * @module
 */
export * from './pinned.js';
export * from './vendir.js';
