/**
 * The read-once view of a fetch run: each referenced Secret/ConfigMap is read once per run,
 * by the credential digests and vendir's documents alike.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { ObjectRef } from '../../events/schema.js';
import type { App } from '../../functions/lib/api/index.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { exitWith, FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import type { FetchView, KubeObject, KubeSecret } from '../../functions/lib/kube/port.js';
import { readingRefsOnce } from '../../functions/lib/kube/views.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const APP = {
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  kind: 'App',
  metadata: { name: 'app', namespace: 'ns', uid: 'uid-1', generation: 1, resourceVersion: '1' },
  spec: {
    fetch: [{ git: { url: 'https://git.example/r', ref: 'origin/main', secretRef: { name: 'creds' } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  },
} as unknown as App;

/** A fetch view with {@link APP} and the Secret `creds`, recording every read. */
function countingKube(failSecretReads = 0) {
  const reads: string[] = [];
  let failures = failSecretReads;
  const kube = {
    reads,
    async getObject() {
      reads.push('app');
      return structuredClone(APP) as unknown as KubeObject as never;
    },
    async updateStatus() {
      reads.push('status');
      return { resourceVersion: '2' };
    },
    async getSecret(ns: string, name: string): Promise<KubeSecret | undefined> {
      reads.push(`secret ${ns}/${name}`);
      if (failures-- > 0) throw new Error('connection reset');
      if (name !== 'creds') return undefined;
      const metadata = { name, namespace: ns, uid: 's1', resourceVersion: '1' };
      return { metadata, type: 'Opaque', data: { username: Buffer.from('u'), password: Buffer.from('p') } };
    },
    async getConfigMap(ns: string, name: string) {
      reads.push(`configmap ${ns}/${name}`);
      return undefined;
    },
    async getNamespace() {
      return undefined;
    },
  };
  return kube;
}

describe('readingRefsOnce', () => {
  it('reads each Secret and ConfigMap once, passes everything else through', async () => {
    const kube = countingKube();
    const view: FetchView = readingRefsOnce(kube);
    const first = await view.getSecret('ns', 'creds');
    expect(await view.getSecret('ns', 'creds')).toBe(first);
    expect(await view.getSecret('other', 'creds')).toBeDefined();
    expect(await view.getSecret('ns', 'missing')).toBeUndefined();
    expect(await view.getSecret('ns', 'missing')).toBeUndefined();
    await view.getConfigMap('ns', 'cm');
    await view.getConfigMap('ns', 'cm');
    await view.getObject({ apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: 'ns', name: 'app' });
    await view.getObject({ apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: 'ns', name: 'app' });
    expect(kube.reads).toEqual([
      'secret ns/creds',
      'secret other/creds',
      'secret ns/missing',
      'configmap ns/cm',
      'app',
      'app',
    ]);
  });

  it('wraps a frozen view, as the real views are (fetchViewOf), keeping its other methods', async () => {
    const kube = countingKube();
    const frozen = Object.freeze({ ...kube, getSecret: kube.getSecret.bind(kube) }) as FetchView;
    const view = readingRefsOnce(frozen);
    await view.getSecret('ns', 'creds');
    await view.getSecret('ns', 'creds');
    await view.getObject({ apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: 'ns', name: 'app' });
    expect(kube.reads).toEqual(['secret ns/creds', 'app']);
  });

  it('does not keep a failed read', async () => {
    const kube = countingKube(1);
    const view = readingRefsOnce(kube);
    await expect(view.getSecret('ns', 'creds')).rejects.toThrow('connection reset');
    expect(await view.getSecret('ns', 'creds')).toBeDefined();
    expect(kube.reads).toEqual(['secret ns/creds', 'secret ns/creds']);
  });
});

const tempDir = useTempDir('kube-views-');

describe('an uncached fetch', () => {
  it('reads the credential Secret once, for the cache identity and for vendir', async () => {
    const kube = countingKube();
    const runner = new FakeCommandRunner().on('vendir', exitWith(1, 'vendir: Error: no route\n'));
    const { deps } = stageDeps(kube, {
      runner,
      tmpRoot: path.join(tempDir(), 'scratch'),
      extra: { keyring: new DerivedKeyring(Buffer.alloc(32, 7)) },
    });
    const { apiVersion, metadata } = APP;
    const ref = { clusterId: 'c1', kind: 'App', apiVersion, ...metadata } as ObjectRef;
    const run = { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' };
    expect(await runFetch({ clusterId: 'c1', ref, run }, { raw: APP as never, app: APP }, deps)).toEqual({});
    expect(kube.reads.filter((r) => r.startsWith('secret'))).toEqual(['secret ns/creds']);
    // vendir got the Secret read for the cache identity.
    expect(runner.calls.map((c) => c.stdin?.toString())).toEqual([expect.stringContaining('name: creds')]);
  });
});
