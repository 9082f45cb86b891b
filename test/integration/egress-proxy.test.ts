/**
 * The tools' egress proxy (`functions/lib/fetch/egress-proxy.ts`) with the real vendir and the
 * helm and imgpkg code it runs, through the fetch stage's `fetchWithVendir` under an enforced
 * URL policy: a helm chart repository and a registry the allow-list names are fetched through
 * the proxy; a chart download and a bundle blob that the server redirects to a denied address
 * (`metadata.kapp-lambda.test`, loopback) fail with the policy's message in status, and no
 * request reaches the denied server.
 *
 * Every test server listens on 127.0.0.1; the tools mostly see them under `*.kapp-lambda.test`
 * names, which only the proxy's injected resolver knows (127.0.0.1): a request that did not go
 * through the proxy could not resolve at all. The registry is fronted by a TLS server
 * (self-signed, `dangerousSkipTLSVerify` for it) because vendir's imgpkg speaks plain http only
 * to loopback and private IP literals.
 *
 * Loopback targets: stock Go never proxies `localhost` or a loopback IP literal, so a chart URL
 * in `index.yaml`, a redirect or a token realm naming `http://127.0.0.1:<port>/` went direct.
 * The four Go tools are built with kapp-lambda's httpproxy patch (`patchProxyLoopback`,
 * layers/gobuild.ts), which proxies them too under `KL_PROXY_LOOPBACK=1` (the proxy's
 * environment): those cases are refused here with the denied server on 127.0.0.1 (and ::1) and
 * the allowed ones on the allow-list by `127.0.0.1:<port>`, and each binary is run directly,
 * with and without the variable, to show where its loopback request lands.
 *
 * `git://` and ssh (`git daemon` on 127.0.0.1 as `gitd.kapp-lambda.test`) go through the proxy
 * by the egress connector (`layers/native/connect.c`): git's `GIT_PROXY_COMMAND` and the `ssh`
 * wrapper on the tools' `PATH`.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { lookup } from 'node:dns/promises';
import { once } from 'node:events';
import { chmod, mkdir, mkdtemp, readFile, realpath, rm, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, request, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import { createServer as createTcpServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import type { App } from '../../functions/lib/api/index.js';
import { gitConnectHost, gitUrlError } from '../../functions/lib/argv-values.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { type ProxiedRunner, withEgressProxy } from '../../functions/lib/fetch/egress-proxy.js';
import { fetchWithVendir } from '../../functions/lib/fetch/run.js';
import { fetchEndpoints, type UrlPolicy, UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';
import { toolEnv } from '../../functions/lib/pipeline/compose.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { SecretMask } from '../../functions/lib/reconcile/secret-mask.js';
import { markFailed } from '../../functions/lib/reconcile/status.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { buildConnector } from '../../layers/native.js';
import { buildHelmRepo, createRepo, pushBundle, selfSignedCert } from '../harness/fixtures.js';
import {
  type GitServer,
  type HttpServer,
  type RegistryServer,
  startGitServer,
  startHttpServer,
  startRegistry,
} from '../harness/servers.js';

const CHARTS = 'charts.kapp-lambda.test';
const REGISTRY = 'registry.kapp-lambda.test';
const METADATA = 'metadata.kapp-lambda.test';
const GIT = 'git.kapp-lambda.test';
const GITD = 'gitd.kapp-lambda.test';
/** How a chart index or a redirect names the denied server on loopback (`[::1]` when it listens there). */
const LOOPBACK = { literal: '127.0.0.1', localhost: 'localhost', ipv6: '[::1]' } as const;
type LoopbackForm = keyof typeof LOOPBACK;

let scratch: string;
let http: HttpServer;
let registry: RegistryServer;
let git: GitServer;
let chartFront: Server;
let registryFront: Server;
let realmFront: Server;
let denied: Server;
/** The denied server's twin on `[::1]` (same port), when the host has IPv6 loopback. */
let denied6: Server | undefined;
let deniedHits: string[] = [];
let gitDaemon: ChildProcess | undefined;
let ports: { charts: number; registry: number; realm: number; denied: number; git: number; gitd: number };
let runner: ProxiedRunner;
let deps: PipelineDeps;

function portOf(s: Server): number {
  return (s.address() as { port: number }).port;
}

async function listen(s: Server): Promise<Server> {
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  return s;
}

/** Forwards a request to `127.0.0.1:<port>` as is and pipes the answer back. */
function forward(req: IncomingMessage, res: ServerResponse, port: number, rewrite?: (body: string) => string): void {
  const out = request({ host: '127.0.0.1', port, method: req.method, path: req.url, headers: req.headers }, (r) => {
    if (!rewrite) {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
      return;
    }
    let body = '';
    r.setEncoding('utf8');
    r.on('data', (c: string) => {
      body += c;
    });
    r.on('end', () => {
      const text = rewrite(body);
      res.writeHead(r.statusCode ?? 502, { 'content-type': 'application/x-yaml' }).end(text);
    });
  });
  out.on('error', () => res.writeHead(502).end());
  req.pipe(out);
}

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'egress-proxy-')));
  [http, registry, git] = await Promise.all([startHttpServer(), startRegistry(), startGitServer()]);
  const deniedHandler = (req: IncomingMessage, res: ServerResponse) => {
    deniedHits.push(`${req.method} ${req.url}`);
    res.end('the instance credentials');
  };
  denied = await listen(createServer(deniedHandler));
  const twin = createServer(deniedHandler);
  denied6 = await new Promise<Server | undefined>((resolve) => {
    twin.once('error', () => resolve(undefined));
    twin.listen(portOf(denied), '::1', () => resolve(twin));
  });

  // A one-chart helm repository, served under several prefixes by the chart front.
  const chart = path.join(scratch, 'chart');
  await mkdir(path.join(chart, 'templates'), { recursive: true });
  await writeFile(path.join(chart, 'Chart.yaml'), 'apiVersion: v2\nname: egress\nversion: 1.0.0\nappVersion: "1"\n');
  await writeFile(
    path.join(chart, 'templates', 'cm.yaml'),
    'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: egress\ndata:\n  a: "1"\n',
  );
  await buildHelmRepo(http, [chart]);
  const httpPort = Number(new URL(http.baseUrl).port);

  // The chart front serves the repo under `/<how>[-<form>]/charts/*`: `ok` with the index
  // rewritten to name the front, `redirect` the same but the chart archive answers 307 to the
  // denied server (by `METADATA`, or by the loopback form), and `index` with the index naming
  // the archive on the denied server (by the loopback form).
  chartFront = await listen(
    createServer((req, res) => {
      const m = /^(\/(ok|redirect|index)(?:-(literal|localhost|ipv6))?)\/charts(\/.*)$/.exec(req.url ?? '');
      if (!m?.[4]) return void res.writeHead(404).end();
      const [, prefix, how, form, rest] = m as unknown as [string, string, string, LoopbackForm | undefined, string];
      const deniedBase = `http://${form ? LOOPBACK[form] : METADATA}:${ports.denied}`;
      if (how === 'redirect' && rest.endsWith('.tgz')) {
        res.writeHead(307, { location: `${deniedBase}/latest/meta-data/` }).end();
        return;
      }
      req.url = `/charts${rest}`;
      // The front as the request named it (`CHARTS` or `127.0.0.1`, both on the allow-list).
      const front = `http://${req.headers.host}${prefix}/charts`;
      const index = (body: string) =>
        how === 'index'
          ? body.replaceAll(`${http.baseUrl}/charts/`, `${deniedBase}/x/`)
          : body.replaceAll(`${http.baseUrl}/charts`, front);
      forward(req, res, httpPort, rest.endsWith('/index.yaml') ? index : undefined);
    }),
  );

  // The registry front (TLS): forwards to docker-registry; blobs of kc/redirected answer 307
  // to the denied server by `METADATA`, those of kc/redirected-<form> by the loopback form.
  const regPort = Number(registry.host.split(':')[1]);
  registryFront = await listen(
    createTlsServer(await selfSignedCert(scratch, REGISTRY), (req, res) => {
      const m = /^\/v2\/kc\/redirected(?:-(literal|localhost|ipv6))?\/blobs\//.exec(req.url ?? '');
      if (req.method === 'GET' && m) {
        const host = m[1] ? LOOPBACK[m[1] as LoopbackForm] : METADATA;
        res.writeHead(307, { location: `http://${host}:${ports.denied}/blob` }).end();
        return;
      }
      forward(req, res, regPort);
    }),
  );
  // A registry (plain http, which go-containerregistry speaks to a loopback literal) that
  // asks for a bearer token from a realm on the denied server.
  realmFront = await listen(
    createServer((_req, res) => {
      const realm = `http://127.0.0.1:${ports.denied}/token`;
      res.writeHead(401, { 'www-authenticate': `Bearer realm="${realm}",service="realm"` }).end();
    }),
  );
  // git's own protocol: `git daemon` over the same bare repos, on a port it is given.
  const free = await listen(createTcpServer() as unknown as Server);
  const gitdPort = portOf(free);
  free.close();
  gitDaemon = spawn(
    'git',
    [
      'daemon',
      '--reuseaddr',
      '--export-all',
      `--base-path=${git.root}`,
      '--listen=127.0.0.1',
      `--port=${gitdPort}`,
      git.root,
    ],
    { stdio: 'ignore' },
  );
  ports = {
    charts: portOf(chartFront),
    registry: portOf(registryFront),
    realm: portOf(realmFront),
    denied: portOf(denied),
    git: Number(new URL(git.baseUrl).port),
    gitd: gitdPort,
  };
  await createRepo(git, 'egress', { 'config.yml': 'a: 1\n' }, { branch: 'main' });
  const bundle = { 'config.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bundled\n' };
  await pushBundle(registry, 'kc/allowed:v1', bundle);
  await pushBundle(registry, 'kc/redirected:v1', bundle);
  for (const form of Object.keys(LOOPBACK)) await pushBundle(registry, `kc/redirected-${form}:v1`, bundle);

  const policy: UrlPolicy = {
    mode: 'enforce',
    allow: [
      `${CHARTS}:${ports.charts}`,
      `${REGISTRY}:${ports.registry}`,
      `${GIT}:${ports.git}`,
      `${GITD}:${ports.gitd}`,
      // Loopback literals by port: the denied server (same address, another port) stays refused.
      `127.0.0.1:${ports.charts}`,
      `127.0.0.1:${ports.realm}`,
    ],
  };
  const checker = new UrlPolicyChecker(policy, async (host) => {
    if (host.endsWith('.kapp-lambda.test')) return ['127.0.0.1'];
    if (host === 'localhost') return (await lookup(host, { all: true })).map((a) => a.address);
    throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  });
  await mkdir(path.join(scratch, 'home'));
  const connector = buildConnector(() => {});
  const tools = {
    allow: ['vendir', 'imgpkg', 'helm', 'git'],
    resolveBin: cacheBinResolver(cacheRoot()),
    home: path.join(scratch, 'home'),
    tmpDir: scratch,
    connector,
  };
  runner = withEgressProxy(createCommandRunner({ ...tools, baseEnv: toolEnv('fetch', tools) }), { checker, connector });
  deps = {
    runner,
    store: new MemoryStore(),
    now: () => new Date(),
    config: {
      tmpRoot: scratch,
      toolVersions: {},
      controllerVersion: 'test',
      urlPolicy: policy,
      dangerousSkipTLSVerify: `${REGISTRY}:${ports.registry}`,
    },
  } as unknown as PipelineDeps;
}, 120_000);

afterAll(async () => {
  gitDaemon?.kill();
  await runner?.close();
  for (const s of [chartFront, registryFront, realmFront, denied, denied6]) {
    s?.closeAllConnections();
    s?.close();
  }
  await Promise.all([http?.stop(), registry?.stop(), git?.stop()]);
  await rm(scratch, { recursive: true, force: true });
});

/** Runs the fetch stage's vendir for one source and returns its result and the status a failure gives. */
async function fetchOne(fetch: App['spec']['fetch']) {
  const app = { metadata: { name: 'a', namespace: 'ns', uid: `u-${Math.random()}` }, spec: { fetch } } as App;
  const { result, fetchKey } = await fetchWithVendir(
    app,
    deps,
    {} as never,
    undefined,
    new SecretMask(),
    new AbortController().signal,
  );
  const status = result.error ? markFailed(undefined, result.error, result.stderr) : undefined;
  return { result, fetchKey, status };
}

describe('egress proxy with the real vendir, helm and imgpkg', () => {
  it('the test names resolve only through the proxy', async () => {
    await expect(lookup(CHARTS)).rejects.toThrow();
  });

  it('helmChart from an allow-listed repository: fetched through the proxy', async () => {
    const { result, fetchKey } = await fetchOne([
      {
        helmChart: {
          name: 'egress',
          version: '1.0.0',
          repository: { url: `http://${CHARTS}:${ports.charts}/ok/charts` },
        },
      },
    ]);
    expect(result.error, result.stderr).toBeUndefined();
    expect(fetchKey).toBeDefined();
  });

  it('helmChart whose archive redirects to a denied address: refused by the policy, nothing reaches it', async () => {
    deniedHits = [];
    const { result, status } = await fetchOne([
      {
        helmChart: {
          name: 'egress',
          version: '1.0.0',
          repository: { url: `http://${CHARTS}:${ports.charts}/redirect/charts` },
        },
      },
    ]);
    const refusal = `URL policy refused http://${METADATA}:${ports.denied}: ${METADATA} resolves to 127.0.0.1, a loopback address, which this deployment does not allow`;
    expect(result.error).toBe(`Fetching resources: ${refusal}`);
    expect(status?.friendlyDescription).toBe(`Reconcile failed: Fetching resources: ${refusal}`);
    expect(status?.conditions).toEqual([
      expect.objectContaining({ type: 'ReconcileFailed', message: `Fetching resources: ${refusal}` }),
    ]);
    // helm's own words, with the proxy's reason phrase, stay in usefulErrorMessage.
    expect(status?.usefulErrorMessage).toContain(`403 ${refusal}`);
    expect(deniedHits).toEqual([]);
  });

  it('git over http from an allow-listed server: the git (curl) vendir runs goes through the proxy', async () => {
    const { result, fetchKey } = await fetchOne([
      { git: { url: `http://${GIT}:${ports.git}/egress`, ref: 'origin/main' } },
    ]);
    expect(result.error, result.stderr).toBeUndefined();
    expect(fetchKey).toBeDefined();
  });

  it('imgpkgBundle from an allow-listed registry: fetched through the proxy', async () => {
    const { result, fetchKey } = await fetchOne([
      { imgpkgBundle: { image: `${REGISTRY}:${ports.registry}/kc/allowed:v1` } },
    ]);
    expect(result.error, result.stderr).toBeUndefined();
    expect(fetchKey).toBeDefined();
  });

  it('imgpkgBundle whose blob the registry redirects to a denied address: refused, nothing reaches it', async () => {
    deniedHits = [];
    const { result, status } = await fetchOne([
      { imgpkgBundle: { image: `${REGISTRY}:${ports.registry}/kc/redirected:v1` } },
    ]);
    const refusal = `URL policy refused http://${METADATA}:${ports.denied}: ${METADATA} resolves to 127.0.0.1, a loopback address, which this deployment does not allow`;
    expect(result.error).toBe(`Fetching resources: ${refusal}`);
    expect(status?.friendlyDescription).toBe(`Reconcile failed: Fetching resources: ${refusal}`);
    // go-containerregistry's own words, with the proxy's body, stay in usefulErrorMessage.
    expect(status?.usefulErrorMessage).toContain(
      `GET http://${METADATA}:${ports.denied}/blob: unexpected status code 403 Forbidden:\n      ${refusal}`,
    );
    expect(deniedHits).toEqual([]);
  });

  it('git:// from an allow-listed server: the git protocol goes through the proxy (GIT_PROXY_COMMAND)', async () => {
    const { result, fetchKey } = await fetchOne([
      { git: { url: `git://${GITD}:${ports.gitd}/egress.git`, ref: 'origin/main' } },
    ]);
    expect(result.error, result.stderr).toBeUndefined();
    expect(fetchKey).toBeDefined();
  });

  // Past the up-front check (which sees only the App's URL), as after a DNS answer that changed.
  it('git:// to a denied address: the proxy refuses the connector, the run reports the policy', async () => {
    deniedHits = [];
    const r = await runner.run({ cmd: 'git', args: ['ls-remote', `git://${METADATA}:${ports.denied}/x.git`] });
    const refusal = `URL policy refused ${METADATA}:${ports.denied}: ${METADATA} resolves to 127.0.0.1, a loopback address, which this deployment does not allow`;
    expect(r.error?.message).toBe(refusal);
    expect(r.stderr).toContain(`kl-connect: proxy refused ${METADATA}:${ports.denied}: HTTP/1.1 403`);
    expect(deniedHits).toEqual([]);
  });

  it('ssh to a denied address: the ssh wrapper gives ssh the connector, the proxy refuses it', async () => {
    deniedHits = [];
    const r = await runner.run({
      cmd: 'git',
      args: ['ls-remote', `ssh://git@${METADATA}:${ports.denied}/x.git`],
      env: { GIT_SSH_COMMAND: 'ssh -o BatchMode=yes -F /dev/null' },
    });
    const refusal = `URL policy refused ${METADATA}:${ports.denied}: ${METADATA} resolves to 127.0.0.1, a loopback address, which this deployment does not allow`;
    expect(r.error?.message).toBe(refusal);
    expect(deniedHits).toEqual([]);
  });

  it('ssh to an allow-listed name: connected through the proxy (the name resolves nowhere else)', async () => {
    // git daemon is no ssh server: the connection is made, then ssh fails at its handshake.
    const r = await runner.run({
      cmd: 'git',
      args: ['ls-remote', `ssh://git@${GITD}:${ports.gitd}/egress.git`],
      env: { GIT_SSH_COMMAND: 'ssh -o BatchMode=yes -F /dev/null' },
    });
    expect(r.error).toBeDefined();
    expect(r.stderr).not.toContain('Could not resolve hostname');
    expect(r.stderr).not.toContain('kl-connect');
    expect(r.stderr).toMatch(/kex_exchange_identification|Connection closed|banner/);
  });
});

describe('loopback targets: the patched Go tools send them through the proxy too', () => {
  const FORMS = Object.keys(LOOPBACK) as LoopbackForm[];

  /** The policy's refusal of the denied server as `form` names it (`localhost` as it resolves here). */
  async function refusalOf(form: LoopbackForm): Promise<string> {
    const reason = 'a loopback address, which this deployment does not allow';
    const d = ports.denied;
    if (form === 'literal') return `URL policy refused http://127.0.0.1:${d}: 127.0.0.1, ${reason}`;
    if (form === 'ipv6') return `URL policy refused http://[::1]:${d}: ::1, ${reason}`;
    const [first] = await lookup('localhost', { all: true });
    return `URL policy refused http://localhost:${d}: localhost resolves to ${first?.address}, ${reason}`;
  }

  /** Fetches `fetch` and expects the refusal of `form` in the error and status, nothing at the denied server. */
  async function expectRefused(fetch: App['spec']['fetch'], form: LoopbackForm) {
    deniedHits = [];
    const refusal = await refusalOf(form);
    const { result, status } = await fetchOne(fetch);
    expect(result.error, result.stderr).toBe(`Fetching resources: ${refusal}`);
    expect(status?.friendlyDescription).toBe(`Reconcile failed: Fetching resources: ${refusal}`);
    expect(status?.conditions).toEqual([
      expect.objectContaining({ type: 'ReconcileFailed', message: `Fetching resources: ${refusal}` }),
    ]);
    expect(deniedHits).toEqual([]);
    return status;
  }

  const chart = (repo: string) => [{ helmChart: { name: 'egress', version: '1.0.0', repository: { url: repo } } }];

  it('helmChart from an allow-listed loopback literal (127.0.0.1:<port>): fetched through the proxy', async () => {
    const { result, fetchKey } = await fetchOne(chart(`http://127.0.0.1:${ports.charts}/ok/charts`));
    expect(result.error, result.stderr).toBeUndefined();
    expect(fetchKey).toBeDefined();
  });

  it.for(FORMS)(
    'helmChart whose index.yaml names the archive on the denied server (%s): refused',
    async (form, ctx) => {
      if (form === 'ipv6' && !denied6) return ctx.skip();
      const status = await expectRefused(chart(`http://127.0.0.1:${ports.charts}/index-${form}/charts`), form);
      expect(status?.usefulErrorMessage).toContain(`403 ${await refusalOf(form)}`);
    },
  );

  it.for(FORMS)('helmChart whose archive redirects to the denied server (%s): refused', async (form, ctx) => {
    if (form === 'ipv6' && !denied6) return ctx.skip();
    await expectRefused(chart(`http://127.0.0.1:${ports.charts}/redirect-${form}/charts`), form);
  });

  it.for(FORMS)(
    'imgpkgBundle whose blob the registry redirects to the denied server (%s): refused',
    async (form, ctx) => {
      if (form === 'ipv6' && !denied6) return ctx.skip();
      const status = await expectRefused(
        [{ imgpkgBundle: { image: `${REGISTRY}:${ports.registry}/kc/redirected-${form}:v1` } }],
        form,
      );
      expect(status?.usefulErrorMessage).toContain(`unexpected status code 403 Forbidden`);
    },
  );

  it('imgpkgBundle from an allow-listed registry whose token realm is on the denied server: refused', async () => {
    await expectRefused([{ imgpkgBundle: { image: `127.0.0.1:${ports.realm}/kc/realm:v1` } }], 'literal');
  });
});

/**
 * Each patched binary run directly against a loopback target, with `HTTP(S)_PROXY` at a recording
 * server: with `KL_PROXY_LOOPBACK=1` the request reaches the proxy and never the target; without
 * it the binary goes direct, as upstream's does.
 */
describe('the patched binaries: KL_PROXY_LOOPBACK=1 proxies loopback targets, unset keeps upstream', () => {
  let recorder: Server;
  let target: Server;
  const proxied: string[] = [];
  let direct = 0;

  beforeAll(async () => {
    recorder = await listen(
      createServer((req, res) => {
        proxied.push(`${req.method} ${req.url}`);
        res.writeHead(502).end();
      }),
    );
    recorder.on('connect', (req: IncomingMessage, socket: import('node:stream').Duplex) => {
      proxied.push(`CONNECT ${req.url}`);
      socket.end('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n');
    });
    target = await listen(createServer((_req, res) => res.writeHead(404).end()));
    target.on('connection', () => {
      direct++;
    });
  });

  afterAll(() => {
    for (const s of [recorder, target]) {
      s?.closeAllConnections();
      s?.close();
    }
  });

  /** argv of one request of each tool to `host:port` (files it needs are written to `dir`). */
  async function argvOf(tool: string, hostPort: string, dir: string): Promise<string[]> {
    switch (tool) {
      case 'helm':
        return ['pull', `http://${hostPort}/x.tgz`, `--destination=${dir}`];
      case 'imgpkg':
        return ['pull', '-b', `${hostPort}/kc/xy:v1`, '-o', path.join(dir, 'out')];
      case 'kbld': {
        const pod = `apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: ${hostPort}/kc/xy:v1\n`;
        await writeFile(path.join(dir, 'pod.yml'), pod);
        return ['-f', path.join(dir, 'pod.yml')];
      }
      default: {
        const config = `apiVersion: vendir.k14s.io/v1alpha1\nkind: Config\ndirectories:\n- path: out\n  contents:\n  - path: .\n    http:\n      url: http://${hostPort}/x.yml\n`;
        await writeFile(path.join(dir, 'vendir.yml'), config);
        return ['sync', `--chdir=${dir}`];
      }
    }
  }

  const cases = ['helm', 'imgpkg', 'kbld', 'vendir'].flatMap((tool) =>
    ['127.0.0.1', 'localhost'].flatMap((host) =>
      ['KL_PROXY_LOOPBACK=1', 'no KL_PROXY_LOOPBACK'].map((mode) => [tool, host, mode] as const),
    ),
  );

  it.each(cases)('%s to %s, %s', async (tool, host, mode) => {
    const on = mode === 'KL_PROXY_LOOPBACK=1';
    proxied.length = 0;
    direct = 0;
    const dir = await mkdtemp(path.join(scratch, `${tool}-`));
    const hostPort = `${host}:${portOf(target)}`;
    const proxy = `http://127.0.0.1:${portOf(recorder)}`;
    const env = {
      PATH: '/usr/bin:/bin',
      HOME: dir,
      TMPDIR: dir,
      ...Object.fromEntries(['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy'].map((k) => [k, proxy])),
      ...Object.fromEntries(['NO_PROXY', 'no_proxy'].map((k) => [k, ''])),
      ...(on ? { KL_PROXY_LOOPBACK: '1' } : {}),
    };
    const bin = cacheBinResolver(cacheRoot())(tool);
    // Each fails (a 502 or a 404); only where its requests went matters.
    await promisify(execFile)(bin, await argvOf(tool, hostPort, dir), { cwd: dir, env, timeout: 60_000 }).catch(
      () => undefined,
    );
    if (on) {
      expect(proxied.length, `${tool} sent nothing to the proxy`).toBeGreaterThan(0);
      expect(
        proxied.every((r) => r.includes(hostPort)),
        proxied.join('\n'),
      ).toBe(true);
      expect(direct).toBe(0);
    } else {
      expect(proxied).toEqual([]);
      expect(direct).toBeGreaterThan(0);
    }
  });
});

// ssh expands the host into the connector's ProxyCommand through /bin/sh (OpenSSH before 9.6
// does not refuse shell characters in it), so the host gitUrlError checks must be the one git
// really gives ssh (or GIT_PROXY_COMMAND), however git reads the URL.
describe('the host the real git gives ssh and GIT_PROXY_COMMAND', () => {
  /**
   * Runs `git ls-remote url` with a recording ssh and proxy command; the host ssh would connect
   * to (after the last `@` of its destination, the argument before the remote command) or the
   * host the proxy command got.
   */
  async function hostGitGives(url: string): Promise<string | undefined> {
    const dir = await mkdtemp(path.join(scratch, 'rec-'));
    const scripts = {
      ssh: `#!/bin/sh\nfor a; do d="$p"; p="$a"; done\nprintf '%s' "\${d##*@}" > ${dir}/host\nexit 1\n`,
      proxy: `#!/bin/sh\nprintf '%s' "$1" > ${dir}/host\nexit 1\n`,
    };
    for (const [name, text] of Object.entries(scripts)) {
      await writeFile(path.join(dir, name), text);
      await chmod(path.join(dir, name), 0o755);
    }
    const env = {
      PATH: '/usr/bin:/bin',
      HOME: dir,
      GIT_SSH: path.join(dir, 'ssh'),
      GIT_SSH_VARIANT: 'ssh',
      GIT_PROXY_COMMAND: path.join(dir, 'proxy'),
    };
    await promisify(execFile)('git', ['ls-remote', url], { cwd: dir, env }).catch(() => undefined);
    return readFile(path.join(dir, 'host'), 'utf8').catch(() => undefined);
  }

  it.each([
    ['u@good.example:x@[evil;id]:path', 'evil;id'],
    ['ssh://u@good.example/x@[evil;id]/path', 'evil;id'],
    ['ssh://good.example/x%40%5Bevil%3Bid%5D/path', 'evil;id'],
    ['u@good.example:x@[127.0.0.1]:path', '127.0.0.1'],
    ['git://good.example/x@[evil]/path', 'good.example/x@evil'],
  ])('%s reaches %j, and gitUrlError refuses it', async (url, host) => {
    expect(await hostGitGives(url)).toBe(host);
    expect(gitConnectHost(url)).toBe(host);
    expect(gitUrlError(url)).toBeDefined();
  });

  it.each([
    ['git@github.com:org/repo.git', 'github.com'],
    ['ssh://git@host.example:2222/repo', 'host.example'],
    ['ssh://git@[::1]:2222/repo', '::1'],
    ['git+ssh://u@host.example/r', 'host.example'],
    ['ssh://good.example:22@evil.example/x', 'evil.example'],
    ['git://git.example.org:9418/repo', 'git.example.org'],
    ['git://[::1]/repo', '::1'],
  ])('%s reaches %j: the host gitUrlError and the URL policy check', async (url, host) => {
    expect(await hostGitGives(url)).toBe(host);
    expect(gitUrlError(url)).toBeUndefined();
    expect(fetchEndpoints([{ git: { url, ref: 'main' } }])[0]?.host).toBe(host);
  });
});
