/**
 * A store that can only be read: for the servers of the fleet page (`npm run fleet -- serve`,
 * the page's Lambda function), which show a fleet and must never change it, whatever code they
 * call. The grants say the same in the cloud (the page function's role may read, not write);
 * this says it everywhere else too (a local directory, an operator's own credentials).
 *
 * @module
 */
import { type ObjectStore, StoreError, type StoreOp } from './port.js';

/**
 * `store` with its reads (`get`, `head`, `getVersioned`, `list`) passed through and its writes
 * (`put`, `putIfAbsent`, `putIfMatch`, `delete`) refused.
 *
 * @returns a store whose writes reject with a {@link StoreError} `read-only store: <op> <key> refused`
 *   and touch nothing.
 */
export function readOnlyStore(store: ObjectStore): ObjectStore {
  const refuse = (op: StoreOp, key: string) =>
    Promise.reject(new StoreError(`read-only store: ${op} ${key} refused`, op, key));
  return {
    get: (key, opts) => store.get(key, opts),
    head: (key) => store.head(key),
    getVersioned: (key, opts) => store.getVersioned(key, opts),
    list: (prefix, opts) => store.list(prefix, opts),
    put: (key) => refuse('put', key),
    putIfAbsent: (key) => refuse('putIfAbsent', key),
    putIfMatch: (key) => refuse('putIfMatch', key),
    delete: (key) => refuse('delete', key),
  };
}
