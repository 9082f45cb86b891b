/**
 * Kubernetes access of the core: the port (`port.ts`), fenced status writes
 * (`status-write.ts`), capability views (`views.ts`) and the client-node adapter
 * (`registry.ts`, `client.ts`, `transport.ts`). Stages import types from here and get a
 * {@link ClusterRegistry} (or a view) passed in; only entry files build a registry.
 *
 * @module
 */

export * from './client.js';
export * from './port.js';
export * from './registry.js';
export * from './status-write.js';
export * from './transport.js';
export * from './views.js';
