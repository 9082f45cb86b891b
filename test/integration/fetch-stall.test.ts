/**
 * The fetch's progress rule (`functions/lib/fetch/stall.ts`) through the fetch stage's
 * `fetchWithVendir`, with the real vendir and the helm it runs, under an enforced URL policy
 * (so through the egress proxy) and the stall window shortened to 3 s: a chart repository whose
 * `index.yaml` is a tarpit (a byte a second, never idle) and an `http` source served the same
 * way (the in-process download) each fail within the window with a `usefulErrorMessage` naming
 * the host and the rule; a chart from a server that answers at once is still fetched.
 *
 * Every server listens on 127.0.0.1 and is on the allow-list by port (the Go tools proxy
 * loopback literals too, `KL_PROXY_LOOPBACK`).
 */
import { once } from 'node:events';
import { mkdir, mkdtemp, realpath, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import type { App } from '../../functions/lib/api/index.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { type ProxiedRunner, withEgressProxy } from '../../functions/lib/fetch/egress-proxy.js';
import { fetchWithVendir } from '../../functions/lib/fetch/run.js';
import { type StallRule, stallNote } from '../../functions/lib/fetch/stall.js';
import { type UrlPolicy, UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';
import { toolEnv } from '../../functions/lib/pipeline/compose.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { SecretMask } from '../../functions/lib/reconcile/secret-mask.js';
import { markFailed } from '../../functions/lib/reconcile/status.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { buildHelmRepo } from '../harness/fixtures.js';
import { type HttpServer, startHttpServer } from '../harness/servers.js';

const RULE: StallRule = { windowMs: 3000, minBytes: 4096 };

let scratch: string;
let http: HttpServer;
let tarpit: Server;
let tarpitHost: string;
let runner: ProxiedRunner;
let deps: PipelineDeps;
const trickles = new Set<NodeJS.Timeout>();

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'fetch-stall-')));
  http = await startHttpServer();
  const chart = path.join(scratch, 'chart');
  await mkdir(path.join(chart, 'templates'), { recursive: true });
  await writeFile(path.join(chart, 'Chart.yaml'), 'apiVersion: v2\nname: stall\nversion: 1.0.0\nappVersion: "1"\n');
  await writeFile(
    path.join(chart, 'templates', 'cm.yaml'),
    'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stall\ndata:\n  a: "1"\n',
  );
  await buildHelmRepo(http, [chart]);

  // Every path: a 200 whose body comes a byte a second, for as long as the client stays.
  tarpit = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/x-yaml' });
    res.flushHeaders();
    const t = setInterval(() => res.write('#'), 1000);
    trickles.add(t);
    res.once('close', () => {
      clearInterval(t);
      trickles.delete(t);
    });
  });
  tarpit.listen(0, '127.0.0.1');
  await once(tarpit, 'listening');
  tarpitHost = `127.0.0.1:${(tarpit.address() as { port: number }).port}`;

  const policy: UrlPolicy = { mode: 'enforce', allow: [new URL(http.baseUrl).host, tarpitHost] };
  await mkdir(path.join(scratch, 'home'));
  const tools = {
    allow: ['vendir', 'helm'],
    resolveBin: cacheBinResolver(cacheRoot()),
    home: path.join(scratch, 'home'),
    tmpDir: scratch,
  };
  runner = withEgressProxy(createCommandRunner({ ...tools, baseEnv: toolEnv('fetch', tools) }), {
    checker: new UrlPolicyChecker(policy),
    stall: RULE,
  });
  deps = {
    runner,
    store: new MemoryStore(),
    now: () => new Date(),
    config: { tmpRoot: scratch, toolVersions: {}, controllerVersion: 'test', urlPolicy: policy, fetchStall: RULE },
  } as unknown as PipelineDeps;
}, 120_000);

afterAll(async () => {
  for (const t of trickles) clearInterval(t);
  await runner?.close();
  tarpit?.closeAllConnections();
  tarpit?.close();
  await http?.stop();
  await rm(scratch, { recursive: true, force: true });
});

/** Runs the fetch stage's vendir for one source; returns its result and the status a failure gives. */
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

describe('fetch stall cut through the fetch stage', () => {
  it('helmChart from a repository that answers at once: fetched', async () => {
    const { result, fetchKey } = await fetchOne([
      { helmChart: { name: 'stall', version: '1.0.0', repository: { url: `${http.baseUrl}/charts` } } },
    ]);
    expect(result.error, result.stderr).toBeUndefined();
    expect(fetchKey).toBeDefined();
  }, 15_000);

  it('helmChart whose index.yaml is a tarpit: the Fetching failure names the host and the rule', async () => {
    const { result, status } = await fetchOne([
      { helmChart: { name: 'stall', version: '1.0.0', repository: { url: `http://${tarpitHost}/charts` } } },
    ]);
    expect(result.error).toMatch(/^Fetching resources: /);
    const note = `kapp-lambda: fetch from ${tarpitHost} made no progress (under 4096 bytes in 3 s); cut by the fleet's stall limit (KAPP_LAMBDA_FETCH_STALL_SECONDS)`;
    expect(status?.usefulErrorMessage).toContain(note);
    expect(status?.conditions).toEqual([expect.objectContaining({ type: 'ReconcileFailed' })]);
  }, 15_000);

  it('http source from a tarpit (the in-process download): the failure names the host and the rule', async () => {
    const { result, status } = await fetchOne([
      { http: { url: `http://user:secret@${tarpitHost}/app.tgz?X-Amz-Signature=abc` } },
    ]);
    expect(result.error).toMatch(/^Fetching resources: /);
    expect(status?.usefulErrorMessage).toContain(stallNote(tarpitHost, RULE));
    expect(status?.usefulErrorMessage).not.toMatch(/secret|Signature/);
  }, 15_000);
});
