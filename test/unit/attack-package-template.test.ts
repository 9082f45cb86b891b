/**
 * A Package's template is repository content (hostile): it must not choose the identity or the
 * target cluster of the App a PackageInstall generates. As upstream `NewApp`, the App's spec is
 * the template's, then `serviceAccountName`, `cluster`, `noopDelete`, `paused`, `canceled`,
 * `syncPeriod` and `defaultNamespace` are set from the PackageInstall, absent ones removed.
 */
import { describe, expect, it } from 'vitest';
import type { Package } from '../../functions/lib/api/datapackaging.js';
import type { PackageInstall } from '../../functions/lib/api/packaging.js';
import { newApp } from '../../functions/lib/packaging/app-from-package.js';

const HOSTILE_TEMPLATE = {
  serviceAccountName: 'kapp-controller-sa',
  cluster: { namespace: 'other-tenant', kubeconfigSecretRef: { name: 'admin-kubeconfig', key: 'value' } },
  noopDelete: true,
  paused: true,
  canceled: true,
  syncPeriod: '1ns',
  defaultNamespace: 'kube-system',
  fetch: [{ inline: { paths: { 'a.yml': 'a: 1\n' } } }],
  template: [{ ytt: {} }],
  deploy: [{ kapp: {} }],
};

const pkg = {
  apiVersion: 'data.packaging.carvel.dev/v1alpha1',
  kind: 'Package',
  metadata: { name: 'p.1.0.0', namespace: 'ns', uid: 'u', resourceVersion: '1' },
  spec: { refName: 'p', version: '1.0.0', template: { spec: HOSTILE_TEMPLATE } },
} as unknown as Package;

function pkgi(spec: Record<string, unknown>): PackageInstall {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name: 'inst', namespace: 'ns', uid: 'uid-pkgi', resourceVersion: '1' },
    spec: { packageRef: { refName: 'p' }, ...spec },
  } as unknown as PackageInstall;
}

describe('attack: a Package template sets the identity or the cluster of its App', () => {
  it('with a ServiceAccount on the PackageInstall: only its values reach the App', () => {
    const app = newApp(undefined, pkgi({ serviceAccountName: 'sa' }), pkg);
    expect(app.metadata.namespace).toBe('ns');
    expect(app.spec).toEqual({
      serviceAccountName: 'sa',
      syncPeriod: '10m0s',
      fetch: HOSTILE_TEMPLATE.fetch,
      template: HOSTILE_TEMPLATE.template,
      deploy: HOSTILE_TEMPLATE.deploy,
    });
  });

  it("with a cluster on the PackageInstall: its cluster, never the template's Secret", () => {
    const cluster = { kubeconfigSecretRef: { name: 'mine', key: 'value' } };
    const app = newApp(undefined, pkgi({ cluster }), pkg);
    expect(app.spec?.cluster).toEqual(cluster);
    expect(app.spec?.serviceAccountName).toBeUndefined();
  });
});
