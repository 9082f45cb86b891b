/**
 * How two events for one object merge into the one follow-up that runs after the object's
 * current run: the one rule of both runtimes (the embedded `KeyedQueue` and the Lambda run lease).
 *
 * @module
 */
import { EVENT_TYPES, type KappEvent, strongerReason } from '../../../events/schema.js';

/**
 * Coalesces two events for one object into the one that runs: a newer object event replaces
 * anything waiting (it starts a new run from the latest object), keeping the stronger reason
 * (`strongerReason`, the same rank as the forwarder's outbox: a pending `ref-changed` must
 * still force the run); a stage event waiting for retry is replaced by any object event.
 */
export function coalesceEvents(pending: KappEvent, next: KappEvent): KappEvent {
  if (pending.type === EVENT_TYPES.object && next.type === EVENT_TYPES.object) {
    const reason = strongerReason(pending.data.reason, next.data.reason);
    if (reason !== next.data.reason) return { ...next, data: { ...next.data, reason } };
  }
  return next;
}
