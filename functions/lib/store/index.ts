/**
 * Object store port and adapters. Import the port types from here; entry files pick the
 * adapter (`LocalDirStore` embedded, `S3Store` in the cloud), unit tests use `MemoryStore`.
 */
export {
  DOMAIN_ROOT,
  DOMAIN_SCOPED_PREFIXES,
  domainKey,
  domainScopedStore,
  SHARING_MODES,
  type Sharing,
} from './domain.js';
export { LocalDirStore, type LocalDirStoreOptions } from './local.js';
export { MemoryStore, type MemoryStoreOptions } from './memory.js';
export {
  absentIfUnreadable,
  DEFAULT_LIST_LIMIT,
  DEFAULT_MAX_OBJECT_BYTES,
  type GetOptions,
  InvalidKeyError,
  keyProblem,
  type ListOptions,
  MAX_KEY_LENGTH,
  type ObjectBody,
  type ObjectHead,
  type ObjectStore,
  ObjectTooLargeError,
  StoreError,
  type StoreOp,
  validateKey,
  validatePrefix,
} from './port.js';
export { S3Store, type S3StoreOptions } from './s3.js';
