/**
 * e2e: a cluster's `kapp-controller-config` (reference §1.3) on the shared control plane.
 *
 * - an http source served over https with a private CA fails with upstream's CA hint; once the
 *   CA is the config Secret's `caCerts`, the same App succeeds (the Secret is read from the
 *   cluster, in the runtime's configured namespace);
 * - with `httpProxy` in the config, the fetch goes through a proxy that records what it is asked
 *   (the App names a host only that proxy knows);
 * - git over https (the private CA trusted through `caCerts`) with a `username`/`password`
 *   `secretRef` (reference §2.1.2): vendir hands git the credentials through a credential store,
 *   which git uses only after a 401 challenge, so a server that answers 404 to an anonymous
 *   request (as GitHub does for a private repo) is reached only with `forceHTTPBasicAuth: true`
 *   (vendir's `http.extraHeader`: the Basic header on every request);
 * - the config's `kappDeployRawOptions` (§1.3, §3.8.1) reach every App's kapp deploy after the
 *   built-in `--app-changes-max-to-keep=5 --apply-timeout=5m` and before the App's own rawOptions,
 *   and the last flag wins: seen in `status.deploy.stdout` (kapp's diff, kapp's `Deleted <n> older
 *   app changes`).
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
import { createRepo } from '../harness/fixtures.js';
import { gitHttpBackend } from '../harness/servers/git.js';
import {
  apply,
  appManifest,
  expectFailed,
  expectSucceeded,
  failedAt,
  getObject,
  inlineConfigMapApp,
  k,
  SEE_USEFUL,
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

const GIT_USER = 'e2e-git-user';
const GIT_PASSWORD = `git-password-${id}`;
const GIT_AUTH = `Basic ${Buffer.from(`${GIT_USER}:${GIT_PASSWORD}`).toString('base64')}`;
/** The Apps of the git-over-https tests; each fetches its own repo (named as the App). */
const GIT = { noForce: `git-no-force-${id}`, force: `git-force-${id}`, challenge: `git-challenge-${id}` };
/** Each request the gated git server saw: its gate, repo and what Authorization it carried. */
const gitRequests: { gate: string; repo: string; auth: 'none' | 'right' | 'wrong' }[] = [];
/** The commit of each App's repo. */
const gitShas = new Map<string, string>();

let dir: string;
let httpsPort: number;
let gitPort: number;
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
  // Git's smart HTTP over https behind a Basic-auth gate chosen by the first path segment: without
  // the right header, `/hidden/<repo>` answers 404 (GitHub's answer to an anonymous request for a
  // private repo: no challenge, so git never asks its credential helper) and `/challenge/<repo>`
  // answers 401 with a Basic challenge.
  const gitRoot = path.join(dir, 'git');
  const backend = gitHttpBackend(gitRoot);
  const gitServer = createHttpsServer({ key: tls.key, cert: tls.cert }, (req, res) => {
    const [, gate, rest] = /^\/(hidden|challenge)(\/.*)$/.exec(req.url ?? '') ?? [];
    if (!gate || !rest) return void res.writeHead(404).end();
    const header = req.headers.authorization;
    const auth = header === undefined ? 'none' : header === GIT_AUTH ? 'right' : 'wrong';
    gitRequests.push({ gate, repo: rest.split(/[/?]/)[1] ?? '', auth });
    if (auth !== 'right') {
      if (gate === 'hidden') return void res.writeHead(404, { 'content-type': 'text/plain' }).end('Not Found\n');
      return void res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="e2e"' }).end();
    }
    req.url = rest;
    backend(req, res);
  });
  servers.push(gitServer);
  gitPort = await listen(gitServer);
  for (const name of Object.values(GIT)) {
    const repo = await createRepo({ baseUrl: `https://127.0.0.1:${gitPort}`, root: gitRoot }, name, {
      'cm.yml': MANIFEST(name),
    });
    gitShas.set(name, repo.commitSha);
  }
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

/** An App fetching its repo from the gated git server through `gate`, with the basic-auth Secret. */
const gitApp = (name: string, gate: 'hidden' | 'challenge', forceHTTPBasicAuth: boolean) =>
  appManifest(NS, name, {
    fetch: [
      {
        git: {
          url: `https://127.0.0.1:${gitPort}/${gate}/${name}`,
          ref: 'origin/main',
          secretRef: { name: 'git-basic-auth' },
          ...(forceHTTPBasicAuth ? { forceHTTPBasicAuth } : {}),
        },
      },
    ],
    template: [{ ytt: {} }],
    deploy: [{ kapp: { intoNs: NS } }],
  });

/** What Authorization the requests for one repo carried, in order. */
const authOf = (repo: string) => gitRequests.filter((r) => r.repo === repo).map((r) => r.auth);

describe('git over https with a username/password secretRef (the CA trusted through caCerts)', () => {
  it('a server answering 404 without credentials: fails unless forceHTTPBasicAuth; a 401 challenge needs no force', async () => {
    await applyConfig({ caCerts: caCert });
    await apply(
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'git-basic-auth', namespace: NS },
        stringData: { username: GIT_USER, password: GIT_PASSWORD },
      },
      gitApp(GIT.noForce, 'hidden', false),
      gitApp(GIT.force, 'hidden', true),
      gitApp(GIT.challenge, 'challenge', false),
    );
    const [failed, forced, challenged] = await Promise.all([
      rt.waitForApp(NS, GIT.noForce, failedAt(1), 'the fetch failing on the 404'),
      rt.waitForApp(NS, GIT.force, succeededAt(1), 'success with the Basic header sent up front'),
      rt.waitForApp(NS, GIT.challenge, succeededAt(1), 'success after the 401 challenge'),
    ]);

    // Without forceHTTPBasicAuth git never sends the stored credentials: the 404 is final.
    const message = `Fetching resources: ${SEE_USEFUL}`;
    expectFailed(failed, message);
    const s = failed.status!;
    expect(s.fetch?.exitCode).toBe(1);
    expect(s.fetch?.error).toBe(message);
    expect(s.usefulErrorMessage).toBe(
      [
        "vendir: Error: Syncing directory '0':",
        "  Syncing directory '.' with git contents:",
        '    Fetching git repository:',
        '      Git [fetch origin main --depth 1]: exit status 128 (stderr: remote: Not Found',
        `fatal: repository 'https://127.0.0.1:${gitPort}/hidden/${GIT.noForce}/' not found`,
        ')',
        '',
      ].join('\n'),
    );
    expect(s.fetch?.stderr).toBe(s.usefulErrorMessage);
    expect(s.template).toBeUndefined();
    expect(s.deploy).toBeUndefined();
    expect(await getObject('configmap', NS, GIT.noForce)).toBeUndefined();
    expect(authOf(GIT.noForce).length).toBeGreaterThanOrEqual(1);
    expect(new Set(authOf(GIT.noForce))).toEqual(new Set(['none']));

    // forceHTTPBasicAuth: the first request already carries the header, as every later one.
    for (const [app, auths] of [
      [forced, authOf(GIT.force)],
      [challenged, authOf(GIT.challenge)],
    ] as const) {
      await expectSucceeded(app);
      const name = app.metadata.name;
      expect(app.status?.fetch?.stdout).toContain(`sha: ${gitShas.get(name)}`);
      const cm = (await getObject('configmap', NS, name)) as { data?: Record<string, string> } | undefined;
      expect(cm?.data?.from).toBe(name);
      expect(auths.length, name).toBeGreaterThanOrEqual(1);
    }
    expect(new Set(authOf(GIT.force))).toEqual(new Set(['right']));
    // The challenged one asked anonymously first, then with the stored credentials.
    expect(authOf(GIT.challenge)[0]).toBe('none');
    expect(authOf(GIT.challenge)).toContain('right');
    expect(authOf(GIT.challenge)).not.toContain('wrong');
    for (const app of [failed, forced, challenged]) {
      expect(JSON.stringify(app.status)).not.toContain(GIT_PASSWORD);
      expect(JSON.stringify(app.status)).not.toContain(GIT_AUTH.slice('Basic '.length));
    }
    expect(JSON.stringify(rt.records)).not.toContain(GIT_PASSWORD);
  });
});

/** {@link inlineConfigMapApp} deploying with `rawOptions` of its own. */
const rawOptionsApp = (name: string, greeting: string, rawOptions?: string[]) => {
  const app = inlineConfigMapApp(NS, name, greeting) as { spec: Record<string, unknown> };
  if (rawOptions) app.spec.deploy = [{ kapp: { rawOptions } }];
  return app;
};

describe('kappDeployRawOptions of the config', () => {
  it("every App's deploy gets them after the built-in defaults and before its own rawOptions (the last wins)", async () => {
    await applyConfig({ kappDeployRawOptions: JSON.stringify(['--diff-changes=true', '--app-changes-max-to-keep=1']) });
    const global = `raw-global-${id}`;
    const own = `raw-own-${id}`;
    const ownOptions = ['--diff-changes=false', '--app-changes-max-to-keep=5'];
    await apply(rawOptionsApp(global, 'one'), rawOptionsApp(own, 'one', ownOptions));
    const first = await Promise.all([
      rt.waitForApp(NS, global, succeededAt(1), 'the first deploy'),
      rt.waitForApp(NS, own, succeededAt(1), 'the first deploy'),
    ]);
    // A second deploy with a change: kapp keeps one app change more and may collect the oldest.
    await apply(rawOptionsApp(global, 'two'), rawOptionsApp(own, 'two', ownOptions));
    const second = await Promise.all([
      rt.waitForApp(NS, global, succeededAt(2), 'the second deploy'),
      rt.waitForApp(NS, own, succeededAt(2), 'the second deploy'),
    ]);
    for (const app of [...first, ...second]) await expectSucceeded(app);
    const [g1, o1] = first.map((a) => a.status?.deploy?.stdout ?? '');
    const [g2, o2] = second.map((a) => a.status?.deploy?.stdout ?? '');
    const diffHeader = (op: string, app: string) => `@@ ${op} configmap/${app}-config (v1) namespace: ${NS} @@`;
    // The config's --diff-changes=true: kapp prints each change's diff.
    expect(g1).toContain(diffHeader('create', global));
    expect(g2).toContain(diffHeader('update', global));
    expect(g2).toMatch(/^.*- +greeting: one$/m);
    expect(g2).toMatch(/^.*\+ +greeting: two$/m);
    // The config's --app-changes-max-to-keep=1 comes after the built-in =5, so it wins: the
    // second deploy's change pushes the first out.
    expect(g1).not.toContain('older app changes');
    expect(g2).toContain('Deleted 1 older app changes');
    // The App's own options come last and win over the config's: no diff, five changes kept.
    for (const out of [o1, o2]) {
      expect(out).toContain('Succeeded');
      expect(out).not.toContain('@@');
      expect(out).not.toContain('older app changes');
    }
  });
});
