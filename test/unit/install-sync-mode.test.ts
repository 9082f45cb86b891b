/**
 * A PackageInstall has no timer of its own (upstream reconciles it on each status write of its
 * App), so its sync mode is its App's: the App a PackageInstall generates carries the
 * PackageInstall's `kapp-lambda.carvel.dev/sync-mode` and `safety-sync-period` annotations, and
 * loses them when the PackageInstall drops them; the forwarder's App rule then decides for both.
 */
import { describe, expect, it } from 'vitest';
import { appQuietUntil } from '../../events/forwarder/quiet.js';
import { Annotation } from '../../functions/lib/api/constants.js';
import type { Package } from '../../functions/lib/api/datapackaging.js';
import type { PackageInstall } from '../../functions/lib/api/packaging.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import { newApp, sameApp } from '../../functions/lib/packaging/app-from-package.js';

const T0 = Date.parse('2025-01-01T00:00:00Z');

const pkg = {
  apiVersion: 'data.packaging.carvel.dev/v1alpha1',
  kind: 'Package',
  metadata: { name: 'p.1.0.0', namespace: 'ns', uid: 'u', resourceVersion: '1' },
  spec: {
    refName: 'p',
    version: '1.0.0',
    template: {
      spec: { fetch: [{ inline: { paths: { 'a.yml': 'a: 1\n' } } }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] },
    },
  },
} as unknown as Package;

function pkgi(annotations: Record<string, string>): PackageInstall {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name: 'inst', namespace: 'ns', uid: 'uid-pkgi', resourceVersion: '1', annotations },
    spec: { packageRef: { refName: 'p' }, serviceAccountName: 'sa', syncPeriod: '30s' },
  } as unknown as PackageInstall;
}

/** The generated App after a successful reconcile at T0 (as the forwarder sees it). */
function reconciled(app: ReturnType<typeof newApp>): KubeObject {
  return {
    ...app,
    metadata: { ...app.metadata, uid: 'uid-app', resourceVersion: '2', generation: 1 },
    status: {
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      deploy: {
        exitCode: 0,
        finished: true,
        updatedAt: new Date(T0).toISOString(),
        kapp: { associatedResources: { label: 'kapp.k14s.io/app=1', namespaces: ['ns'], groupKinds: [] } },
      },
    },
  } as unknown as KubeObject;
}

describe("a PackageInstall's sync mode is its App's", () => {
  it('the App carries the sync-mode and safety-period annotations; the App rule follows them', () => {
    const periodic = newApp(undefined, pkgi({ [Annotation.SyncMode]: 'periodic' }), pkg);
    expect(periodic.metadata.annotations?.[Annotation.SyncMode]).toBe('periodic');
    expect(appQuietUntil(reconciled(periodic), undefined, () => 0)).toBeUndefined();
    const quiet = newApp(undefined, pkgi({ [Annotation.SafetySyncPeriod]: '1h' }), pkg);
    expect(quiet.metadata.annotations?.[Annotation.SafetySyncPeriod]).toBe('1h');
    expect(appQuietUntil(reconciled(quiet), undefined, () => 0)).toBe(T0 + 3_600_000);
  });

  it('an annotation the PackageInstall drops leaves its App too (an App change, so it is written)', () => {
    const before = newApp(undefined, pkgi({ [Annotation.SyncMode]: 'periodic' }), pkg);
    const existing = { ...before, metadata: { ...before.metadata, uid: 'uid-app', resourceVersion: '2' } };
    const after = newApp(existing, pkgi({}), pkg);
    expect(after.metadata.annotations).not.toHaveProperty(Annotation.SyncMode);
    expect(sameApp(after, existing)).toBe(false);
  });
});
