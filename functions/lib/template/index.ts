/**
 * Template-stage planning (the pipeline plan and each templater).
 *
 * @module
 */
export * from './cue.js';
export * from './downward-api.js';
export * from './helm.js';
export * from './inline.js';
export * from './kbld.js';
export * from './kustomize.js';
export * from './paths-arg.js';
export * from './plan.js';
export * from './sops.js';
export * from './step.js';
export * from './values.js';
export * from './ytt.js';
