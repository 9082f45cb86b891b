import { describe, expect, it } from 'vitest';
import type { App } from '../../functions/lib/api/index.js';
import { pinnedFetchIdentity } from '../../functions/lib/fetch/pinned.js';
import type { DeployView } from '../../functions/lib/kube/port.js';
import { noopDeleteDueToTerminatingNamespaces } from '../../functions/lib/pipeline/app/delete.js';

const SHA = 'a'.repeat(64);

describe('pinnedFetchIdentity', () => {
  const http = (secret?: string) => [
    { http: { url: 'http://127.0.0.1:1/x.tgz', sha256: SHA, ...(secret ? { secretRef: { name: secret } } : {}) } },
  ];

  it('pins inline paths and digests, not branches', () => {
    expect(pinnedFetchIdentity([{ inline: { paths: { 'a.yml': 'a: 1' } } }], '0.44.0')).toMatch(/^[0-9a-f]{64}$/);
    expect(pinnedFetchIdentity([{ git: { url: 'http://h/r', ref: 'origin/develop' } }], '0.44.0')).toBeUndefined();
    expect(pinnedFetchIdentity([{ inline: { pathsFrom: [{ secretRef: { name: 's' } }] } }], '0.44.0')).toBeUndefined();
  });

  it('keys private sources by their credentials, so an App without them cannot reuse the artifact', () => {
    const withCreds = pinnedFetchIdentity(http('creds'), '0.44.0', { creds: 'digest-of-alice' });
    const otherCreds = pinnedFetchIdentity(http('creds'), '0.44.0', { creds: 'digest-of-mallory' });
    const none = pinnedFetchIdentity(http(), '0.44.0');
    expect(new Set([withCreds, otherCreds, none]).size).toBe(3);
    expect(pinnedFetchIdentity(http('creds'), '0.44.0', { creds: 'digest-of-alice' })).toBe(withCreds);
  });

  it('changes with the vendir version', () => {
    expect(pinnedFetchIdentity(http(), '0.44.0')).not.toBe(pinnedFetchIdentity(http(), '0.45.0'));
  });
});

describe('noopDeleteDueToTerminatingNamespaces', () => {
  const app = (namespaces: string[], sa = 'sa') =>
    ({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'a', namespace: 'ns' },
      spec: { serviceAccountName: sa },
      status: {
        deploy: { kapp: { associatedResources: { label: 'kapp.k14s.io/app=1', namespaces, groupKinds: [] } } },
      },
    }) as unknown as App;
  const kube = (phases: Record<string, string | undefined>) =>
    ({
      getNamespace: async (name: string) =>
        phases[name] === undefined
          ? undefined
          : { metadata: { name, uid: name, resourceVersion: '1' }, phase: phases[name] },
    }) as unknown as DeployView;

  it.each([
    ['App and resource namespaces terminating', ['ns'], { ns: 'Terminating' }, true],
    ['resource namespace already gone', ['ns', 'other'], { ns: 'Terminating' }, true],
    ['App namespace active', ['ns'], { ns: 'Active' }, false],
    ['a resource namespace active', ['ns', 'other'], { ns: 'Terminating', other: 'Active' }, false],
    ['cluster-scoped resources', ['ns', '(cluster)'], { ns: 'Terminating' }, false],
  ])('%s', async (_name, namespaces, phases, want) => {
    expect(await noopDeleteDueToTerminatingNamespaces(app(namespaces), kube(phases))).toBe(want);
  });

  it('needs a ServiceAccount (the case where it went away with the namespace)', async () => {
    expect(await noopDeleteDueToTerminatingNamespaces(app(['ns'], ''), kube({ ns: 'Terminating' }))).toBe(false);
  });
});
