import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { afterAll, describe, expect, it } from 'vitest';
import { KubeApiClient } from '../../functions/lib/kube/client.js';
import { inClusterConnection } from '../../functions/lib/kube/kubeconfig-auth.js';
import {
  ConflictError,
  GoneError,
  KubeApiError,
  type KubeClient,
  RESOURCE_TYPES,
  resourceFor,
  UnknownClusterError,
  WatchGoneError,
} from '../../functions/lib/kube/port.js';
import {
  apiServerInfoOf,
  IN_CLUSTER_ID,
  inClusterKubeConfig,
  KubeConfigClusterRegistry,
  MapClusterRegistry,
} from '../../functions/lib/kube/registry.js';
import { deployViewOf, fetchViewOf, watchViewOf } from '../../functions/lib/kube/views.js';

const dir = mkdtempSync(join(tmpdir(), 'kube-registry-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CA_PEM = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n';
writeFileSync(join(dir, 'ca.crt'), CA_PEM);

const KUBECONFIG = `apiVersion: v1
kind: Config
current-context: east
clusters:
- name: c-east
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: ${Buffer.from(CA_PEM).toString('base64')}
    tls-server-name: kubernetes
- name: c-west
  cluster:
    server: https://127.0.0.2:6443
    certificate-authority: ca.crt
- name: c-insecure
  cluster:
    server: https://127.0.0.3:6443
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    token: very-secret-token
contexts:
- name: east
  context: { cluster: c-east, user: u }
- name: west
  context: { cluster: c-west, user: u }
- name: insecure
  context: { cluster: c-insecure, user: u }
`;
const kubeconfigPath = join(dir, 'kubeconfig');
writeFileSync(kubeconfigPath, KUBECONFIG);

describe('resource table', () => {
  it('resolves the plurals of the carvel kinds', () => {
    expect(
      Object.fromEntries(Object.entries(RESOURCE_TYPES).map(([k, v]) => [k, `${v.plural}.${v.group}`])),
    ).toMatchObject({
      'kappctrl.k14s.io/v1alpha1/App': 'apps.kappctrl.k14s.io',
      'packaging.carvel.dev/v1alpha1/PackageInstall': 'packageinstalls.packaging.carvel.dev',
      'packaging.carvel.dev/v1alpha1/PackageRepository': 'packagerepositories.packaging.carvel.dev',
      'data.packaging.carvel.dev/v1alpha1/Package': 'packages.data.packaging.carvel.dev',
      'data.packaging.carvel.dev/v1alpha1/PackageMetadata': 'packagemetadatas.data.packaging.carvel.dev',
    });
    expect(resourceFor({ apiVersion: 'v1', kind: 'Namespace' }).namespaced).toBe(false);
  });

  it('error classes keep code, reason, cause and name', () => {
    const cause = new Error('x');
    const c = new ConflictError('m', { cause });
    expect([c.name, c.statusCode, c.cause, c instanceof KubeApiError]).toEqual(['ConflictError', 409, cause, true]);
    const w = new WatchGoneError('m');
    expect([w.name, w.statusCode, w.reason]).toEqual(['WatchGoneError', 410, 'Expired']);
    expect(new GoneError('m', { statusCode: 404 }).statusCode).toBe(404);
    const u = new UnknownClusterError('nope');
    expect([u.name, u.message, u.clusterId]).toEqual(['UnknownClusterError', 'unknown cluster id "nope"', 'nope']);
  });
});

describe('KubeConfigClusterRegistry', () => {
  it('fromFile: every context is a cluster id, one client each, reused', () => {
    const registry = KubeConfigClusterRegistry.fromFile(kubeconfigPath);
    expect(registry.clusterIds()).toEqual(['east', 'insecure', 'west']);
    const east = registry.client('east');
    expect(east).toBeInstanceOf(KubeApiClient);
    expect(registry.client('east')).toBe(east);
    expect(registry.client('west')).not.toBe(east);
    expect(registry.fetchView('east')).toBe(registry.fetchView('east'));
    expect(east.apiServer()).toEqual({
      server: 'https://127.0.0.1:6443',
      caData: Buffer.from(CA_PEM).toString('base64'),
      tlsServerName: 'kubernetes',
    });
    expect(registry.client('west').apiServer()).toEqual({
      server: 'https://127.0.0.2:6443',
      caData: Buffer.from(CA_PEM).toString('base64'),
    });
    expect(registry.client('insecure').apiServer()).toEqual({
      server: 'https://127.0.0.3:6443',
      insecureSkipTlsVerify: true,
    });
  });

  it('fromFile with a subset of contexts', () => {
    const registry = KubeConfigClusterRegistry.fromFile(kubeconfigPath, { contexts: ['west'] });
    expect(registry.clusterIds()).toEqual(['west']);
    expect(() => registry.client('east')).toThrow(UnknownClusterError);
    expect(() => registry.fetchView('east')).toThrow('unknown cluster id "east"');
    expect(() => registry.deployView('east')).toThrow(UnknownClusterError);
    expect(() => registry.watchView('east')).toThrow(UnknownClusterError);
  });

  it('fromFile errors name the file and context, never the contents', () => {
    expect(() => KubeConfigClusterRegistry.fromFile(kubeconfigPath, { contexts: ['nope'] })).toThrow(
      `loading kubeconfig ${kubeconfigPath}: no context "nope"`,
    );
    const missing = join(dir, 'missing');
    const err = (() => {
      try {
        KubeConfigClusterRegistry.fromFile(missing);
      } catch (e) {
        return e as Error;
      }
    })();
    expect(err?.message).toBe(`loading kubeconfig ${missing}`);
    expect((err?.cause as NodeJS.ErrnoException | undefined)?.code).toBe('ENOENT');

    const bad = join(dir, 'bad');
    writeFileSync(bad, 'users: [{name: u, user: {token: leaked-token}}]\n  : : :\n');
    const badErr = (() => {
      try {
        KubeConfigClusterRegistry.fromFile(bad);
      } catch (e) {
        return e as Error;
      }
    })();
    expect(badErr?.message).toBe(`loading kubeconfig ${bad}: not a valid kubeconfig`);
    expect(badErr?.cause).toBeUndefined();
  });

  it('fromKubeConfigs keys clusters by the given ids', () => {
    const kc = new KubeConfig();
    kc.loadFromString(KUBECONFIG);
    const registry = KubeConfigClusterRegistry.fromKubeConfigs({ 'fleet-a': kc });
    expect(registry.clusterIds()).toEqual(['fleet-a']);
    expect(registry.client('fleet-a').apiServer().server).toBe('https://127.0.0.1:6443');
  });

  it('inCluster: one cluster, in-cluster, reached with the ServiceAccount token file and CA', async () => {
    writeFileSync(join(dir, 'token'), 'sa-token-1');
    const conn = inClusterConnection({ KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' }, dir);
    const registry = KubeConfigClusterRegistry.inCluster(conn);
    expect(registry.clusterIds()).toEqual([IN_CLUSTER_ID]);
    expect(registry.client(IN_CLUSTER_ID).apiServer()).toEqual({
      server: 'https://10.0.0.1:443',
      caData: Buffer.from(CA_PEM).toString('base64'),
    });
    const opts: { headers: Record<string, string> } = { headers: {} };
    await inClusterKubeConfig(conn).applyToHTTPSOptions(opts);
    expect(opts.headers.Authorization).toBe('Bearer sa-token-1');
    expect(() =>
      inClusterConnection({ KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' }, join(dir, 'none')),
    ).toThrow(/token/);
  });

  it('apiServerInfoOf names the file when the CA cannot be read', () => {
    const kc = new KubeConfig();
    kc.loadFromString(
      KUBECONFIG.replace('certificate-authority: ca.crt', `certificate-authority: ${join(dir, 'no-ca')}`),
    );
    kc.setCurrentContext('west');
    expect(() => apiServerInfoOf(kc)).toThrow(`reading certificate-authority ${join(dir, 'no-ca')}`);
  });
});

describe('views', () => {
  const methods = (o: object) => Object.keys(o).sort();
  const client = KubeConfigClusterRegistry.fromFile(kubeconfigPath).client('east');

  it('fetch view: read + status only, frozen', () => {
    const view = fetchViewOf(client);
    expect(methods(view)).toEqual(['getConfigMap', 'getNamespace', 'getObject', 'getSecret', 'updateStatus']);
    expect(Object.isFrozen(view)).toBe(true);
    expect('serviceAccountToken' in view).toBe(false);
    expect('addFinalizer' in view).toBe(false);
  });

  it('deploy view: no list/watch but the label-selected list of ConfigMaps (kapp records)', () => {
    expect(methods(deployViewOf(client))).toEqual([
      'addFinalizer',
      'apiGroupVersions',
      'apiServer',
      'cachedServiceAccountToken',
      'getConfigMap',
      'getNamespace',
      'getObject',
      'getSecret',
      'listConfigMaps',
      'removeFinalizer',
      'serverVersion',
      'serviceAccountToken',
      'updateStatus',
    ]);
  });

  it('watch view: read, discovery, list and watch only', () => {
    expect(methods(watchViewOf(client))).toEqual([
      'discover',
      'getConfigMap',
      'getNamespace',
      'getObject',
      'getSecret',
      'list',
      'watch',
    ]);
  });

  it('views call through to the client', async () => {
    const calls: string[] = [];
    // Every method of the fake records its name.
    const fake = new Proxy(
      {},
      {
        get: (_t, name) => async () => {
          calls.push(String(name));
          return undefined;
        },
      },
    ) as KubeClient;
    const registry = new MapClusterRegistry(new Map([['c', fake]]));
    expect(registry.clusterIds()).toEqual(['c']);
    expect(registry.client('c')).toBe(fake);
    await registry.fetchView('c').getObject({ apiVersion: 'v1', kind: 'Namespace', name: 'x' });
    await registry.deployView('c').serverVersion();
    await registry.watchView('c').getSecret('n', 's');
    expect(calls).toEqual(['getObject', 'serverVersion', 'getSecret']);
  });
});
