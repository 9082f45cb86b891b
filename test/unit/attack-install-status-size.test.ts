/**
 * A PackageInstall whose status would not fit (issue 7 §7 for the install function): the error of
 * a 1 MB `versionSelection.constraints` quotes the whole string, so the status written as it is
 * makes the object larger than etcd stores and the write fails on every retry (the
 * PackageInstall stays `Reconciling`). Every PackageInstall status write is bounded as App
 * status writes are (`fitStatus` within `statusBudgetFor` the object).
 */
import { describe, expect, it } from 'vitest';
import { type ObjectRef, objectEvent } from '../../events/schema.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { encodedSize, statusBudgetFor } from '../../functions/lib/reconcile/status-budget.js';
import { FakeCluster } from './support/fake-cluster.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('attack-install-status-size-');
const NOW = '2025-01-01T00:00:00Z';
const API = 'packaging.carvel.dev/v1alpha1';
const REF: ObjectRef = {
  clusterId: 'c1',
  kind: 'PackageInstall',
  apiVersion: API,
  namespace: 'ns',
  name: 'inst',
  uid: 'uid-pkgi',
  generation: 1,
  resourceVersion: '1',
};

function pkgi(constraints: string): KubeObject {
  return {
    apiVersion: API,
    kind: 'PackageInstall',
    metadata: { name: 'inst', namespace: 'ns', uid: 'uid-pkgi', generation: 1, resourceVersion: '1' },
    spec: {
      serviceAccountName: 'sa',
      packageRef: { refName: 'pkg.test.carvel.dev', versionSelection: { constraints } },
    },
  };
}

const PKG: KubeObject = {
  apiVersion: 'data.packaging.carvel.dev/v1alpha1',
  kind: 'Package',
  metadata: { name: 'pkg.test.carvel.dev.1.0.0', namespace: 'ns', uid: 'uid-p', resourceVersion: '1' },
  spec: { refName: 'pkg.test.carvel.dev', version: '1.0.0', template: { spec: { deploy: [{ kapp: {} }] } } },
} as KubeObject;

describe('attack: a PackageInstall status that would not fit', () => {
  it.each([
    ['no digit at all', 'a'.repeat(1_000_000)],
    ['a bad comparator', `${'>'.repeat(1_000_000)}1.0.0`],
  ])(
    '%s: ReconcileFailed within the status budget, the tail kept',
    async (_name, constraints) => {
      const cluster = new FakeCluster();
      const obj = pkgi(constraints);
      cluster.put(obj);
      cluster.put(PKG);
      cluster.namespaces.set('ns', { metadata: { name: 'ns', uid: 'uid-ns', resourceVersion: '1' }, phase: 'Active' });
      const { deps } = stageDeps(cluster, { runner: new FakeCommandRunner(), now: NOW, tmpRoot: tempDir() });
      await dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), deps);
      const status = cluster.statuses.at(-1) as { conditions?: Array<{ type: string; message?: string }> };
      expect(status.conditions?.[0]?.type).toBe('ReconcileFailed');
      expect(status.conditions?.[0]?.message).toContain('[output truncated]');
      expect(encodedSize(status)).toBeLessThanOrEqual(statusBudgetFor(obj as unknown as Record<string, unknown>));
      // A megabyte of constraint is parsed and its 3 MB error cut to the budget: about 2 s of CPU
      // alone, more while the unit suite loads both cores, so vitest's 5 s default would be flaky.
    },
    30_000,
  );
});
