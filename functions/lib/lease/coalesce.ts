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
 * still force the run). One exception: a stage event waiting for its retry (a crashed template,
 * deploy, delete or fan-out) is kept against a `resync` of the same object and generation. A
 * resync is timer-gated (`pipeline/app/reconcile.ts`), and the run that stage belongs to has just
 * written its parts (`updatedAt` now), so the resync would be a no-op and the run would be lost,
 * leaving the App `Reconciling` (the `npm run demo` flake of `demo-helm/podinfo`); it applies
 * to the embedded queue, whose failed stage waits there for its retry: on Lambda a stage event never
 * waits in the run lease (one whose run lost the lease is fenced, `./run-leases.ts`). Any other
 * object event (`added`, `modified`, `ref-changed`, `deleted`, or a newer uid or generation)
 * still replaces it.
 *
 * @returns `pending` itself when it is kept, so the queue keeps its retry backoff.
 */
export function coalesceEvents(pending: KappEvent, next: KappEvent): KappEvent {
  // A health event never shares a key with an object event (the embedded queue keys it apart);
  // should it, neither replaces the other's kind: the health is dropped, the run kept.
  if (next.type === EVENT_TYPES.health) return pending.type === EVENT_TYPES.health ? next : pending;
  if (next.type !== EVENT_TYPES.object) return next;
  if (pending.type === EVENT_TYPES.object) {
    const reason = strongerReason(pending.data.reason, next.data.reason);
    return reason === next.data.reason ? next : { ...next, data: { ...next.data, reason } };
  }
  if (pending.type === EVENT_TYPES.health) return next; // takes no lease: never pending
  const { object, run } = pending.data;
  const sameRun = next.data.uid === object.uid && next.data.generation === run.generation;
  return next.data.reason === 'resync' && sameRun ? pending : next;
}
