/**
 * The events the forwarder emits: `dev.kapp-lambda.object.v1` envelopes from
 * `events/schema.ts`, re-exported under the names the forwarder uses.
 *
 * @module
 */
import { type ObjectEvent, type ObjectEventData, objectEvent, type Reason } from '../schema.js';

/** Why an event was emitted: `added | modified | deleted | resync | ref-changed`. */
export type ObjectEventReason = Reason;

/** The reference an event carries (cluster, kind, namespace, name, uid, generation, resourceVersion, reason). */
export type { ObjectEventData };

/** The CloudEvents envelope handed to the {@link Transport}: `dev.kapp-lambda.object.v1`. */
export type CloudEvent = ObjectEvent;

/**
 * Builds the envelope of one event with `objectEvent` (id derived from the content, `time`
 * from `now`).
 *
 * @param data - The reference and reason.
 * @param now - Emission time, ms since the epoch.
 * @throws EventValidationError when `data` does not make a valid event (e.g. a kind that is
 *   not App, PackageInstall or PackageRepository, or a clusterId that is not a DNS label).
 */
export function toCloudEvent(data: ObjectEventData, now: number): CloudEvent {
  const { reason, ...ref } = data;
  return objectEvent(ref, reason, { time: new Date(now) });
}
