/**
 * Issue 7: on the ServiceAccount path kapp gets the registry's API server as an address, the
 * host resolved once by the runtime, with `tls-server-name` = the host
 * (`functions/lib/deploy/pin-server.ts`, through `clusterAccessFor`). Real kapp against the
 * shared cluster's real kube-apiserver, named by a host the system resolver does not know
 * (`.invalid`): only the runtime's own lookup (injected) maps it to 127.0.0.1, so kapp can reach
 * the server only at the pinned address, never by resolving the name again. TLS still verifies
 * the certificate against the name: the right one deploys, a wrong one fails with x509.
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, expect, inject, it } from 'vitest';
import { parse, stringify } from 'yaml';
import type { App } from '../../functions/lib/api/index.js';
import { clusterAccessFor } from '../../functions/lib/deploy/run.js';
import type { DeployView } from '../../functions/lib/kube/port.js';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { kubectl, loadKubeConfig, tenantManifests } from '../harness/kube.js';

const KAPP = binPath(component('kapp'), 'kapp');
const NS = 'pinned-server';
const NAME = 'kube.pin.invalid';

let kubeconfigPath: string;
let port: string;
let caData: string;
let token: string;

beforeAll(async () => {
  kubeconfigPath = inject('kubeconfigPath');
  const server = new URL(inject('cluster').server);
  port = server.port;
  const cluster = loadKubeConfig(kubeconfigPath).getCurrentCluster();
  caData = cluster?.caData ?? '';
  const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, input ? { input } : {});
  await k(
    ['apply', '-f', '-'],
    tenantManifests(NS, 'deployer')
      .map((m) => `---\n${stringify(m)}`)
      .join(''),
  );
  token = (await k(['create', 'token', 'deployer', '-n', NS, '--duration', '10m'])).stdout.trim();
});

afterAll(async () => {
  await kubectl(kubeconfigPath, ['delete', 'namespace', NS, '--wait=false'], { check: false });
});

const app = { metadata: { name: 'pinned', namespace: NS }, spec: { serviceAccountName: 'deployer' } } as App;

/** The deploy view of a cluster registered as `https://kube.pin.invalid:<port>` (TLS name `tlsServerName`). */
const view = (tlsServerName: string) =>
  ({
    serviceAccountToken: async () => ({ token, expiresAt: new Date(Date.now() + 600_000) }),
    apiServer: () => ({ server: `https://${NAME}:${port}`, caData, tlsServerName }),
  }) as unknown as DeployView;

/** kapp deploy of one ConfigMap with `kubeconfigYaml`; its output and exit code. */
function kappDeploy(kubeconfigYaml: string, configMap: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(
      KAPP,
      ['deploy', '--app', `${configMap}-app`, '-f', '-', '--kubeconfig=/dev/null', '--yes', '--tty=false'],
      {
        env: { PATH: '/usr/bin:/bin', HOME: '/tmp', KAPP_KUBECONFIG_YAML: kubeconfigYaml },
      },
    );
    let out = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (out += d));
    p.stdin.end(`apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ${configMap}, namespace: ${NS}}\ndata: {a: b}\n`);
    const t = setTimeout(() => p.kill('SIGKILL'), 60_000);
    p.on('close', (code) => {
      clearTimeout(t);
      resolve({ code: code ?? -1, out });
    });
  });
}

it('kapp reaches the API server at the pinned address, verifying its certificate against the name', async () => {
  const resolved: string[] = [];
  const resolve = async (host: string) => {
    resolved.push(host);
    return host === NAME ? ['127.0.0.1'] : [];
  };
  // The name is a stand-in the system cannot resolve; the certificate's name is `localhost`.
  const access = await clusterAccessFor(app, view('localhost'), undefined, { resolve });
  expect(resolved).toEqual([NAME]);
  const cluster = (parse(access.kubeconfigYaml ?? '') as { clusters: { cluster: Record<string, string> }[] })
    .clusters[0]?.cluster;
  expect(cluster).toMatchObject({ server: `https://127.0.0.1:${port}`, 'tls-server-name': 'localhost' });
  const ok = await kappDeploy(access.kubeconfigYaml ?? '', 'pinned-ok');
  expect(ok.code, ok.out).toBe(0);
  const cm = await kubectl(kubeconfigPath, ['get', 'configmap', 'pinned-ok', '-n', NS, '-o', 'jsonpath={.data.a}']);
  expect(cm.stdout).toBe('b');

  // Control: the same kubeconfig with the name instead of the address does not get there.
  const unpinned = await kappDeploy(
    (access.kubeconfigYaml ?? '').replace(`https://127.0.0.1:${port}`, `https://${NAME}:${port}`),
    'pinned-control',
  );
  expect(unpinned.code).not.toBe(0);
  expect(unpinned.out).toMatch(/no such host|server misbehaving|lookup kube\.pin\.invalid/);
}, 120_000);

it('a tls-server-name the certificate does not hold fails TLS: the address alone is not trusted', async () => {
  const access = await clusterAccessFor(app, view('wrong.example'), undefined, { resolve: async () => ['127.0.0.1'] });
  const res = await kappDeploy(access.kubeconfigYaml ?? '', 'pinned-wrong');
  expect(res.code).not.toBe(0);
  expect(res.out).toMatch(/x509: certificate is valid for .*not wrong\.example/);
  const cm = await kubectl(kubeconfigPath, ['get', 'configmap', 'pinned-wrong', '-n', NS], { check: false });
  expect(cm.code).not.toBe(0);
}, 120_000);
