/**
 * The event contract (CloudEvents envelopes, zod schemas, builders, ordering key).
 * See ./schema.ts; sample events are in ./samples/.
 */
export * from './schema.js';
