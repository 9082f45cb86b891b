/**
 * A small fleet as the install function and the rollouts write it, for the tests of the page's
 * servers (`fleet serve`, the page's Lambda function, its grants): one PackageInstall index entry
 * with a receipt (its last reconcile) and one rollout record.
 */
import { FLEET_INDEX_PREFIX, ROLLOUTS_PREFIX } from '../../functions/lib/fleet/view.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';
import { putReceipt } from './receipt-fixture.js';

/** The fixture's cluster, PackageInstall and package. */
export const FIXTURE = {
  clusterId: 'prod-eu-1',
  namespace: 'apps',
  name: 'hello',
  refName: 'hello.example.com',
  policy: 'default',
} as const;

/**
 * Writes {@link FIXTURE}'s index entry (2.0.0, succeeded, healthy, wave `canary`), its App's
 * receipt (2.5 s, $0.000125) and the rollout of 2.0.0 from 1.0.0, running, wave `canary` released.
 */
export async function putFleetFixture(store: ObjectStore): Promise<void> {
  const { clusterId, namespace, name, refName, policy } = FIXTURE;
  await store.put(
    `${FLEET_INDEX_PREFIX}${clusterId}/${namespace}/${name}.json`,
    JSON.stringify({ refName, version: '2.0.0', reconcile: 'succeeded', health: 'True', wave: 'canary' }),
  );
  await putReceipt(store, { clusterId, namespace, name }, '20261207-095900-000-bbbbbbbb', {
    startedAt: '2026-12-07T09:59:00Z',
    endedAt: '2026-12-07T09:59:02.500Z',
    usd: 0.000125,
  });
  await store.put(
    `${ROLLOUTS_PREFIX}${policy}/${refName}.json`,
    JSON.stringify({
      target: '2.0.0',
      from: '1.0.0',
      status: 'running',
      waves: [{ name: 'canary', releasedAt: '2026-12-07T09:58:00Z' }, { name: 'rest' }],
      history: [{ at: '2026-12-07T09:58:00Z', what: 'wave canary released' }],
    }),
  );
}
