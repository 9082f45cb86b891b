/**
 * Deploy-stage planning (kapp command lines, raw option allow-lists, credentials).
 *
 * @module
 */
export * from './kapp.js';
export * from './kapp-restrict.js';
export * from './kubeconfig.js';
export * from './kubeconfig-restrict.js';
