/**
 * e2e: a cluster's `kapp-controller-config` (reference §1.3) on the shared control plane.
 *
 * - an http source served over https with a private CA fails with upstream's CA hint; once the
 *   CA is the config Secret's `caCerts`, the same App succeeds (the Secret is read from the
 *   cluster, in the runtime's configured namespace);
 * - with `httpProxy` in the config, the fetch goes through a proxy that records what it is asked
 *   (the App names a host only that proxy knows).
 *
 * The runtime caches the config for an hour: every change above reaches the next run through the
 * forwarder's watch of the object (reference §1.3: upstream reloads on change).
 *
 * The config lives in a namespace of this file only, so the proxy never reaches other files' runs.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer, request, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CA_HINT } from '../../functions/lib/reconcile/result.js';
import {
  apply,
  appManifest,
  expectSucceeded,
  failedAt,
  getObject,
  k,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-ccfg-${id}`;
const CONFIG_NS = `e2e-ccfg-system-${id}`;
const MANIFEST = (name: string) =>
  `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${name}\ndata:\n  from: ${name}\n`;

const run = promisify(execFile);

/** A CA and a server certificate it signed for 127.0.0.1, made with openssl (argv only). */
async function privateCa(dir: string): Promise<{ caCert: string; key: string; cert: string }> {
  const f = (n: string) => path.join(dir, n);
  await run('openssl', [
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '1',
    '-subj',
    `/CN=e2e private CA ${id}`,
    '-keyout',
    f('ca.key'),
    '-out',
    f('ca.crt'),
  ]);
  await run('openssl', [
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-subj',
    '/CN=127.0.0.1',
    '-keyout',
    f('tls.key'),
    '-out',
    f('tls.csr'),
  ]);
  await writeFile(f('san.ext'), 'subjectAltName=IP:127.0.0.1\n');
  await run('openssl', [
    'x509',
    '-req',
    '-in',
    f('tls.csr'),
    '-CA',
    f('ca.crt'),
    '-CAkey',
    f('ca.key'),
    '-CAcreateserial',
    '-days',
    '1',
    '-extfile',
    f('san.ext'),
    '-out',
    f('tls.crt'),
  ]);
  return {
    caCert: await readFile(f('ca.crt'), 'utf8'),
    key: await readFile(f('tls.key'), 'utf8'),
    cert: await readFile(f('tls.crt'), 'utf8'),
  };
}

const listen = async (server: Server): Promise<number> => {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return (server.address() as AddressInfo).port;
};

let dir: string;
let httpsPort: number;
let plainPort: number;
let proxyPort: number;
let caCert: string;
const servers: Server[] = [];
/** What the recording proxy was asked: `GET http://…` or `CONNECT host:port`. */
const proxied: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'e2e-ccfg-'));
  const tls = await privateCa(dir);
  caCert = tls.caCert;
  const serve = (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => {
    const name = /^\/([a-z0-9-]+)\.yml$/.exec(new URL(req.url ?? '/', 'http://x').pathname)?.[1];
    if (!name) return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'text/yaml' }).end(MANIFEST(name));
  };
  const https = createHttpsServer({ key: tls.key, cert: tls.cert }, serve);
  const plain = createHttpServer(serve);
  servers.push(https, plain);
  httpsPort = await listen(https);
  plainPort = await listen(plain);
  // The recording proxy: every host it is asked for is the local plain server.
  const proxy = createHttpServer((req, res) => {
    proxied.push(`${req.method} ${req.url}`);
    const target = new URL(req.url ?? '');
    const out = request(
      {
        host: '127.0.0.1',
        port: plainPort,
        method: req.method,
        path: `${target.pathname}${target.search}`,
        headers: req.headers,
      },
      (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      },
    );
    out.on('error', () => res.writeHead(502).end());
    req.pipe(out);
  });
  proxy.on('connect', (req, socket) => {
    proxied.push(`CONNECT ${req.url}`);
    socket.end('HTTP/1.1 403 Forbidden\r\n\r\n');
  });
  servers.push(proxy);
  proxyPort = await listen(proxy);
  await k(['create', 'namespace', CONFIG_NS]);
});

afterAll(async () => {
  for (const s of servers) s.close();
  await k(['delete', 'namespace', CONFIG_NS, '--wait=false', '--ignore-not-found']).catch(() => undefined);
  await rm(dir, { recursive: true, force: true });
});

const rt = useE2ERuntime([NS], {
  // A cache that outlives the file: each change must reach the runs through the forwarder's
  // watch of the config (which drops the cached one), not through the cache expiring.
  overrides: { config: { controllerConfigNamespace: CONFIG_NS }, controllerConfigTtlMs: 3_600_000 },
});

/** Applies the config Secret and waits until the forwarder reported the change (the cache is dropped). */
async function applyConfig(data: Record<string, string>): Promise<void> {
  const seen = () => rt.records.filter((r) => r.msg === 'kapp-controller-config changed' && r.obj.kind === 'Secret');
  const before = seen().length;
  await apply(configSecret(data));
  await waitFor('the forwarder to see the kapp-controller-config change', async () =>
    seen().length > before ? true : undefined,
  );
}

const configSecret = (data: Record<string, string>) => ({
  apiVersion: 'v1',
  kind: 'Secret',
  metadata: { name: 'kapp-controller-config', namespace: CONFIG_NS },
  stringData: data,
});

const httpApp = (name: string, url: string, syncPeriod?: string) =>
  appManifest(NS, name, {
    ...(syncPeriod ? { syncPeriod } : {}),
    fetch: [{ http: { url } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: { intoNs: NS } }],
  });

describe('kapp-controller-config of the cluster', () => {
  it('an https source with a private CA fails with the CA hint, then succeeds once caCerts has the CA', async () => {
    const name = `private-ca-${id}`;
    const url = `https://127.0.0.1:${httpsPort}/${name}.yml`;
    await apply(httpApp(name, url));
    const failed = await rt.waitForApp(NS, name, failedAt(1), 'the fetch failing on the unknown CA');
    expect(failed.status?.fetch?.exitCode).not.toBe(0);
    expect(failed.status?.fetch?.stderr).toContain('x509: certificate signed by unknown authority');
    expect(failed.status?.fetch?.stderr).toContain(CA_HINT);
    expect(failed.status?.usefulErrorMessage).toContain(CA_HINT);

    await applyConfig({ caCerts: caCert });
    // A new generation reconciles at once (the failed one would retry only after its backoff).
    await apply(httpApp(name, url, '11m'));
    const ok = await rt.waitForApp(NS, name, succeededAt(2), 'success with the CA trusted');
    await expectSucceeded(ok);
    const cm = (await getObject('configmap', NS, name)) as { data?: Record<string, string> } | undefined;
    expect(cm?.data?.from).toBe(name);
    // The Secret's values never reach the log.
    const pemLine = caCert.split('\n')[1] ?? '';
    expect(JSON.stringify(rt.records)).not.toContain(pemLine);
  });

  it('httpProxy: the fetch goes through the configured proxy, which sees the request', async () => {
    const name = `via-proxy-${id}`;
    const host = `artifacts-${id}.proxied.test`;
    await applyConfig({ caCerts: caCert, httpProxy: `http://127.0.0.1:${proxyPort}` });
    await apply(httpApp(name, `http://${host}/${name}.yml`));
    const ok = await rt.waitForApp(NS, name, succeededAt(1), 'success through the proxy');
    await expectSucceeded(ok);
    expect(proxied).toContain(`GET http://${host}/${name}.yml`);
    const cm = (await getObject('configmap', NS, name)) as { data?: Record<string, string> } | undefined;
    expect(cm?.data?.from).toBe(name);
  });
});
