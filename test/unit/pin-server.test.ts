/**
 * kapp's API server address pinned for a run (issue 7): the host resolved once, kapp given the
 * address with `tls-server-name` = the host (`functions/lib/deploy/pin-server.ts`), on the
 * ServiceAccount path (`clusterAccessFor`) and the PackageRepository's runtime kubeconfig.
 */
import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import type { App } from '../../functions/lib/api/index.js';
import { pinServer, tcpProbe } from '../../functions/lib/deploy/pin-server.js';
import { clusterAccessFor } from '../../functions/lib/deploy/run.js';
import type { DeployView } from '../../functions/lib/kube/port.js';

const resolver =
  (answers: Record<string, string[]>, seen: string[] = []) =>
  async (host: string) => {
    seen.push(host);
    const a = answers[host];
    if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    return a;
  };
const noProbe = async () => {
  throw new Error('probed a single address');
};

describe('pinServer', () => {
  it('replaces a DNS name by its address, the port written, TLS verifying the name', async () => {
    const seen: string[] = [];
    await expect(
      pinServer('https://Kube.Corp:6443', undefined, {
        resolve: resolver({ 'kube.corp': ['10.0.0.7'] }, seen),
        probe: noProbe,
      }),
    ).resolves.toEqual({ server: 'https://10.0.0.7:6443', tlsServerName: 'kube.corp' });
    expect(seen).toEqual(['kube.corp']);
    await expect(
      pinServer('https://kube.corp', undefined, { resolve: resolver({ 'kube.corp': ['10.0.0.7'] }) }),
    ).resolves.toEqual({ server: 'https://10.0.0.7:443', tlsServerName: 'kube.corp' });
  });

  it('brackets IPv6, keeps a path prefix and the kubeconfig own tls-server-name', async () => {
    const resolve = resolver({ 'rancher.corp': ['fd00::7'] });
    await expect(pinServer('https://rancher.corp:8443/k8s/clusters/c-1', undefined, { resolve })).resolves.toEqual({
      server: 'https://[fd00::7]:8443/k8s/clusters/c-1',
      tlsServerName: 'rancher.corp',
    });
    await expect(pinServer('https://rancher.corp/', 'api.internal', { resolve })).resolves.toEqual({
      server: 'https://[fd00::7]:443/',
      tlsServerName: 'api.internal',
    });
  });

  it('leaves IP literals, non-http servers and http without a TLS name', async () => {
    const resolve = resolver({});
    for (const server of ['https://127.0.0.1:6443', 'https://[::1]:6443', 'kube.corp:6443', 'ftp://kube.corp']) {
      await expect(pinServer(server, undefined, { resolve })).resolves.toEqual({ server });
    }
    await expect(pinServer('https://10.0.0.1', 'api.internal', { resolve })).resolves.toEqual({
      server: 'https://10.0.0.1',
      tlsServerName: 'api.internal',
    });
    await expect(
      pinServer('http://kube.corp:8080', undefined, { resolve: resolver({ 'kube.corp': ['10.0.0.8'] }) }),
    ).resolves.toEqual({
      server: 'http://10.0.0.8:8080',
    });
  });

  it('of several addresses takes the first that accepts, else the first', async () => {
    const resolve = resolver({ 'kube.corp': ['fd00::7', '10.0.0.7', '10.0.0.8'] });
    const probed: string[] = [];
    const probe = async (a: string, port: number) => {
      probed.push(`${a}:${port}`);
      return a === '10.0.0.7';
    };
    await expect(pinServer('https://kube.corp:6443', undefined, { resolve, probe })).resolves.toMatchObject({
      server: 'https://10.0.0.7:6443',
    });
    expect(probed).toEqual(['fd00::7:6443', '10.0.0.7:6443']);
    await expect(
      pinServer('https://kube.corp:6443', undefined, { resolve, probe: async () => false }),
    ).resolves.toMatchObject({ server: 'https://[fd00::7]:6443' });
  });

  it('a name that does not resolve is an error naming the host and code', async () => {
    await expect(pinServer('https://gone.corp', undefined, { resolve: resolver({}) })).rejects.toThrow(
      'resolving the API server host gone.corp: ENOTFOUND',
    );
    await expect(pinServer('https://empty.corp', undefined, { resolve: async () => [] })).rejects.toThrow(
      'resolving the API server host empty.corp: no address',
    );
  });

  it('tcpProbe: true for a listening port, false for a closed one', async () => {
    const server = createServer((s) => s.destroy());
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const { port } = server.address() as { port: number };
    try {
      await expect(tcpProbe('127.0.0.1', port)).resolves.toBe(true);
    } finally {
      await new Promise((r) => server.close(r));
    }
    await expect(tcpProbe('127.0.0.1', port)).resolves.toBe(false);
  });
});

describe('clusterAccessFor on the ServiceAccount path', () => {
  const app = {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name: 'a', namespace: 'team' },
    spec: { serviceAccountName: 'sa' },
  } as App;
  const kube = (server: string, tlsServerName?: string) =>
    ({
      serviceAccountToken: async () => ({ token: 'tok', expiresAt: new Date(0) }),
      apiServer: () => ({ server, caData: 'Q0E=', ...(tlsServerName ? { tlsServerName } : {}) }),
    }) as unknown as DeployView;
  const clusterOf = (yaml: string | undefined) =>
    (parse(yaml ?? '') as { clusters: { cluster: Record<string, unknown> }[] }).clusters[0]?.cluster;

  it("gives kapp the resolved address with the registry server's name as tls-server-name", async () => {
    const access = await clusterAccessFor(app, kube('https://api.fleet.corp:443'), undefined, {
      resolve: resolver({ 'api.fleet.corp': ['10.1.2.3'] }),
    });
    expect(clusterOf(access.kubeconfigYaml)).toEqual({
      server: 'https://10.1.2.3:443',
      'tls-server-name': 'api.fleet.corp',
      'certificate-authority-data': 'Q0E=',
    });
  });

  it("keeps the cluster's tls-server-name, with an address server as with a pinned one", async () => {
    const literal = await clusterAccessFor(app, kube('https://10.1.2.3:6443', 'api.internal'), undefined, {
      resolve: resolver({}),
    });
    expect(clusterOf(literal.kubeconfigYaml)).toMatchObject({
      server: 'https://10.1.2.3:6443',
      'tls-server-name': 'api.internal',
    });
    const named = await clusterAccessFor(app, kube('https://api.fleet.corp', 'api.internal'), undefined, {
      resolve: resolver({ 'api.fleet.corp': ['10.1.2.4'] }),
    });
    expect(clusterOf(named.kubeconfigYaml)).toMatchObject({
      server: 'https://10.1.2.4:443',
      'tls-server-name': 'api.internal',
    });
  });

  it("a registry server that does not resolve is an infrastructure error, not the App's", async () => {
    const err = await clusterAccessFor(app, kube('https://gone.corp'), undefined, { resolve: resolver({}) }).catch(
      (e: Error) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).constructor.name).toBe('Error');
    expect((err as Error).message).toBe('resolving the API server host gone.corp: ENOTFOUND');
  });
});
