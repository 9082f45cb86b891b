/**
 * The in-cluster forwarder: public API. The event rules are in `README.md` ("Event rules").
 *
 * @module
 */
export { type BackoffOptions, backoffDelay, DEFAULT_BACKOFF } from './backoff.js';
export { type Clock, MAX_TIMER_MS, sleep, systemClock, type TimerHandle } from './clock.js';
export { type ForwarderSettings, forwarderOptions, parseForwarderEnv } from './config.js';
export { DueHeap, type HeapItem } from './due-heap.js';
export { Forwarder, type ForwarderOptions, type ForwarderStats, type StopOptions } from './forwarder.js';
export {
  appKind,
  appNoopDeleteNamespaces,
  appRefs,
  NO_REFS,
  type ObjectRefs,
  observedGeneration,
  packageInstallKind,
  packageRepositoryKind,
  packageRepositoryRefs,
  type WatchedKind,
  type WatchedKindName,
  watchedKinds,
} from './kinds.js';
export {
  DEFAULT_LEASE_DURATION_MS,
  DEFAULT_RENEW_DEADLINE_MS,
  DEFAULT_RETRY_PERIOD_MS,
  type ElectorStopOptions,
  JITTER_FACTOR,
  LeaderElector,
  type LeaderElectorOptions,
  type LeaderElectorStats,
} from './leader.js';
export { type ForwarderLogger, silentLogger } from './log.js';
export { mergeEvents, Outbox, type OutboxOptions, toCloudEvent } from './outbox.js';
export { lastWriteTime } from './ref-index.js';
export {
  type ListMode,
  Reflector,
  type ReflectorCounters,
  type ReflectorHandler,
  type ReflectorOptions,
} from './reflector.js';
export { FakeObjectWatcher, type FakeWatcherCall } from './testing.js';
export { type StageTransportOptions, type Transport, transportToStages } from './transport.js';
