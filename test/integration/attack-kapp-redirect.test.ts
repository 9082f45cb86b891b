/**
 * Regression (s19 attack): a hostile, public API server named by an App's kubeconfig Secret
 * redirects kapp (client-go follows up to 10 `GET` redirects, to any address) to a refused
 * address, and kapp echoes the body of the answer into its error (hence the App's status).
 * Under the enforced URL policy kapp gets the function's egress proxy as every cluster's
 * `proxy-url` (`policedClusterAccess`), so the redirect's target is checked when kapp connects
 * and refused. Real kapp of the deploy layer, real egress proxy; only the proxy's resolver and
 * connector map the attacker's public name to the local hostile server. kapp is the pinned build
 * `npm run setup` makes (the deploy layer copies the same binary).
 */
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { connect } from 'node:net';
import { expect, it } from 'vitest';
import { restrictKubeconfig, withProxyUrl } from '../../functions/lib/deploy/kubeconfig-restrict.js';
import { startEgressProxy } from '../../functions/lib/fetch/egress-proxy.js';
import { UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';
import { checkKubeconfigUrls } from '../../functions/lib/pipeline/app/kubeconfig-policy.js';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';

const KAPP = binPath(component('kapp'), 'kapp');
const ATTACKER_IP = '93.184.216.34';

const kubeconfig = (server: string) => `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: '${server}'}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]
current-context: x
`;

it('kapp through the egress proxy: the redirect to a refused address is refused, nothing echoed', async () => {
  const hits: string[] = [];
  const internal = createServer((req, res) => {
    hits.push(`${req.method} ${req.url}`);
    res.writeHead(500, { 'content-type': 'text/plain' }).end('INTERNAL-SECRET-BODY');
  });
  await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
  const ip = (internal.address() as { port: number }).port;
  const hostileHits: string[] = [];
  // The attacker's public API server (its name resolves to a public address).
  const hostile = createServer((req, res) => {
    hostileHits.push(`${req.method} ${req.url}`);
    res.writeHead(302, { location: `http://127.0.0.1:${ip}/latest/meta-data/iam/security-credentials/` }).end();
  });
  await new Promise<void>((r) => hostile.listen(0, '127.0.0.1', r));
  const hp = (hostile.address() as { port: number }).port;
  const checker = new UrlPolicyChecker({ mode: 'enforce', allow: [] }, async (host) =>
    host === 'api.attacker.example' ? [ATTACKER_IP] : [],
  );
  const proxy = await startEgressProxy({
    checker,
    // The public address is the hostile server; every other (checked) address as is.
    connect: (address, port) =>
      connect({ host: address === ATTACKER_IP ? '127.0.0.1' : address, port: address === ATTACKER_IP ? hp : port }),
  });
  try {
    const restricted = restrictKubeconfig(kubeconfig(`http://api.attacker.example:${hp}`)).yaml;
    // The up-front check passes (a public server) ...
    await expect(checkKubeconfigUrls(restricted, checker)).resolves.toBeUndefined();
    // ... and kapp gets the proxy, as the deploy stage gives it.
    const yaml = withProxyUrl(restricted, proxy.url);
    const out = await new Promise<string>((resolve) => {
      const p = spawn(KAPP, ['deploy', '--app', 'a', '-f', '-', '--kubeconfig=/dev/null', '--yes'], {
        env: { PATH: '/usr/bin:/bin', HOME: '/tmp', KAPP_KUBECONFIG_YAML: yaml },
      });
      let o = '';
      p.stdout.on('data', (d) => (o += d));
      p.stderr.on('data', (d) => (o += d));
      p.stdin.end('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n');
      const t = setTimeout(() => p.kill('SIGKILL'), 20_000);
      p.on('close', () => {
        clearTimeout(t);
        resolve(o);
      });
    });
    expect(hostileHits.length).toBeGreaterThan(0); // kapp reached the attacker's server ...
    expect(hits).toEqual([]); // ... but never the refused address it redirects to
    expect(out).not.toContain('INTERNAL-SECRET-BODY');
    expect(out).toContain('URL policy refused');
  } finally {
    await proxy.close();
    internal.close();
    hostile.close();
  }
}, 30_000);
