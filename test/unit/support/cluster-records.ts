/**
 * SQS records of template events of Apps in several clusters, as a stage queue delivers them:
 * the batches of the tests that split or share by cluster (`entry-shares.test.ts`,
 * `entry-dispatch.test.ts`).
 */
import {
  type KappEvent,
  type ObjectRef,
  objectEvent,
  objectRefOf,
  orderingKey,
  serializeEvent,
  templateEvent,
} from '../../../events/schema.js';
import type { SqsRecord } from '../../../functions/lib/entry/stage-handler.js';
import { REF } from './app-world.js';

const time = '2025-01-02T03:04:05.000Z';
const FETCH_KEY = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;

/** The template event of App `name` (uid `uid-<name>`) of cluster `clusterId`, generation `n`. */
export function clusterTemplateEvent(clusterId: string, name: string, n = 1): KappEvent {
  const object: ObjectRef = { ...REF, clusterId, name, uid: `uid-${name}`, generation: n };
  return templateEvent(
    { object, run: { generation: n, runId: `r-${name}-${n}`, startedAt: time }, artifacts: { fetchKey: FETCH_KEY } },
    { time },
  );
}

/**
 * Its record, first receive: receipt handle `h-<messageId>`, its object's message group.
 * @param messageId - default `<name><n>`.
 */
export function clusterTemplateRecord(clusterId: string, name: string, n = 1, messageId = `${name}${n}`): SqsRecord {
  return recordOf(clusterTemplateEvent(clusterId, name, n), messageId);
}

/**
 * The record of an object event (reason `modified`) of PackageInstall `ns/<name>` of
 * cluster `clusterId`: an event for the install function, first receive.
 */
export function clusterInstallRecord(clusterId: string, name: string, messageId = name): SqsRecord {
  return clusterPackagingRecord('PackageInstall', clusterId, name, messageId);
}

/**
 * The record of an object event (reason `modified`) of the packaging object `kind` `ns/<name>`
 * of cluster `clusterId` (a PackageInstall's goes to install, a PackageRepository's to
 * index-repo), first receive.
 */
export function clusterPackagingRecord(
  kind: 'PackageInstall' | 'PackageRepository',
  clusterId: string,
  name: string,
  messageId = name,
): SqsRecord {
  const object: ObjectRef = {
    clusterId,
    kind,
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    namespace: 'ns',
    name,
    uid: `uid-${name}`,
    generation: 1,
    resourceVersion: '1',
  };
  return recordOf(objectEvent(object, 'modified', { time }), messageId);
}

/** `e` as its first receive: receipt handle `h-<messageId>`, its object's message group. */
export function recordOf(e: KappEvent, messageId: string): SqsRecord {
  return {
    messageId,
    receiptHandle: `h-${messageId}`,
    body: serializeEvent(e),
    attributes: { MessageGroupId: orderingKey(objectRefOf(e)), ApproximateReceiveCount: '1' },
  };
}
