/**
 * e2e: hostile input stays contained (issue 7, item 10). Every case goes through the real
 * pipeline (API server → forwarder → fetch → template → deploy, with the real tools) and ends
 * in a clear status, or in a clear error from the API server that kubectl prints; never in a
 * crash loop. For each App that fails, the test checks that the reconciles the runtime started
 * stay bounded by `status.consecutiveReconcileFailures` (the failure backoff: 2 s, 4 s, 8 s,
 * ...), that no stage crashed, and that the tool that would have been abused never ran.
 *
 * Cases: option-like values in tool argv (helm release name, git ref, cue path), an archive
 * entry climbing out of the fetch directory, the URL policy (a direct fetch of the Lambda
 * Runtime API and a redirect to it, against a counting stand-in), malformed and unknown
 * fields, an invalid duration, names at the length limits, a spec near the API server's size
 * limit, and duplicated / out-of-order events.
 *
 * Each case has its own namespace; the cases run concurrently on two runtimes (the URL policy
 * one enforces the cloud policy with an allow-list).
 */
import { type Dirent, existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { objectEvent } from '../../events/schema.js';
import { publishFile, rawTgz } from '../harness/fixtures.js';
import {
  type AppObject,
  apply,
  applyCrds,
  appManifest,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  expectFailed,
  expectSucceeded,
  getApp,
  getObject,
  inlineConfigMapApp,
  k,
  reconciled,
  servers,
  startRuntime,
  suffix,
} from './support.js';

const id = suffix();

/** A DNS-1123 label of exactly 63 characters, starting with `prefix`. */
function label63(prefix: string): string {
  return `${prefix}${'x'.repeat(63 - prefix.length - 1)}z`;
}

const NS = {
  helm: `e2e-hostile-helm-${id}`,
  git: `e2e-hostile-git-${id}`,
  cue: `e2e-hostile-cue-${id}`,
  archive: `e2e-hostile-archive-${id}`,
  schema: `e2e-hostile-schema-${id}`,
  duration: `e2e-hostile-duration-${id}`,
  unknown: `e2e-hostile-unknown-${id}`,
  long: label63(`e2e-hl-${id}-`),
  big: `e2e-hostile-big-${id}`,
  events: `e2e-hostile-events-${id}`,
  policy: `e2e-hostile-policy-${id}`,
};

let rt: E2ERuntime;
let policyRt: E2ERuntime;

/** The stand-in for the Lambda Runtime API: counts every request it receives. */
let standIn: Server;
const standInRequests: string[] = [];
/** An allowed server: `/ok.yml` serves a ConfigMap, `/redirect` 302s to the stand-in. */
let allowed: Server;

const portOf = (s: Server) => (s.address() as AddressInfo).port;

async function listen(s: Server): Promise<Server> {
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  return s;
}

const RUNTIME_API_PATH = '/2018-06-01/runtime/invocation/next';

beforeAll(async () => {
  await applyCrds();
  await Promise.all(Object.values(NS).map(createTenant));
  standIn = await listen(
    createServer((req, res) => {
      standInRequests.push(`${req.method} ${req.url}`);
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"stolen":"invocation"}');
    }),
  );
  allowed = await listen(
    createServer((req, res) => {
      if (req.url === '/ok.yml') {
        res
          .writeHead(200, { 'content-type': 'text/yaml' })
          .end('apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: allowed-ok\ndata:\n  from: allowed\n');
      } else if (req.url === '/redirect') {
        res.writeHead(302, { location: `http://127.0.0.1:${portOf(standIn)}${RUNTIME_API_PATH}` }).end();
      } else res.writeHead(404).end();
    }),
  );
  const gitPort = new URL(servers().git.baseUrl).port;
  rt = await startRuntime(Object.values(NS).filter((ns) => ns !== NS.policy));
  policyRt = await startRuntime([NS.policy], {
    config: { urlPolicy: { mode: 'enforce', allow: [`127.0.0.1:${gitPort}`, `127.0.0.1:${portOf(allowed)}`] } },
  });
});

afterAll(async () => {
  await rt?.dispose();
  await policyRt?.dispose();
  await new Promise((r) => standIn?.close(r));
  await new Promise((r) => allowed?.close(r));
  await deleteNamespaces(Object.values(NS));
});

/** A failed reconcile of the current generation, retried at least once (the backoff runs). */
async function waitFailedTwice(r: E2ERuntime, ns: string, name: string): Promise<AppObject> {
  return await r.waitForApp(
    ns,
    name,
    (a) =>
      a.status?.observedGeneration === a.metadata.generation &&
      (a.status?.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false) &&
      (a.status?.consecutiveReconcileFailures ?? 0) >= 2,
    'ReconcileFailed with consecutiveReconcileFailures >= 2',
    200_000,
  );
}

/** Reconcile runs the runtime started for an App (the reconcile step went on to fetch). */
function runsStarted(r: E2ERuntime, ns: string, name: string): number {
  return r.stageRuns(ns, name).filter((x) => x.stage === 'reconcile' && x.outcome !== 'noop').length;
}

/**
 * No crash loop: no stage crashed, and the runs started are bounded by the failures status
 * counts (one run per backoff step, plus possibly the one in progress); over a further
 * 10 s window the backoff (already >= 4 s) allows at most a few more.
 */
async function expectBounded(r: E2ERuntime, ns: string, name: string): Promise<void> {
  const crashes = r.logsFor(ns, name).filter((x) => x.msg === 'stage crashed; retrying' || x.obj.outcome === 'crashed');
  expect(crashes, `${ns}/${name} crashed`).toEqual([]);
  const before = runsStarted(r, ns, name);
  const app = await getApp(ns, name);
  const failures = app?.status?.consecutiveReconcileFailures ?? 0;
  expect(before, `${ns}/${name}: runs started vs consecutiveReconcileFailures ${failures}`).toBeLessThanOrEqual(
    failures + 1,
  );
  await new Promise((res) => setTimeout(res, 10_000));
  const after = runsStarted(r, ns, name);
  expect(after - before, `${ns}/${name}: runs in 10 s`).toBeLessThanOrEqual(3);
  // every event about it (no-ops included) stays few: no tight loop between status writes and events
  expect(r.stageRuns(ns, name).length, `${ns}/${name}: stage records`).toBeLessThan(60);
}

/** Tool runs recorded for an App's stage records (`tools.runs`). */
function toolRuns(r: E2ERuntime, ns: string, name: string, stage: string): number {
  return r
    .stageRuns(ns, name)
    .filter((x) => x.stage === stage)
    .reduce((n, x) => n + ((x.tools as { runs?: number } | undefined)?.runs ?? 0), 0);
}

/** Every file name under `dir` (recursive). */
async function namesUnder(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    let entries: Dirent[];
    try {
      entries = await readdir(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (e.isDirectory()) await walk(path.join(d, e.name));
      else out.push(e.name);
    }
  };
  await walk(dir);
  return out;
}

/** A minimal chart fetched inline, for helmTemplate. */
const CHART = {
  'Chart.yaml': 'apiVersion: v2\nname: hostile\nversion: 0.1.0\n',
  'templates/cm.yaml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-helm\ndata:\n  a: "1"\n',
};

describe.concurrent('hostile values in tool argv never reach the tool', () => {
  it('helmTemplate.name "--post-renderer=sh": ReconcileFailed with the release-name error; helm never ran', async () => {
    const ns = NS.helm;
    const name = `helm-${id}`;
    await apply(
      appManifest(ns, name, {
        fetch: [{ inline: { paths: CHART } }],
        template: [{ helmTemplate: { name: '--post-renderer=sh' } }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await waitFailedTwice(rt, ns, name);
    const message =
      'helmTemplate.name "--post-renderer=sh" is not a valid release name: invalid release name, must match regex ' +
      '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53';
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.fetch?.exitCode).toBe(0);
    expect(app.status?.template?.error).toBe(message);
    expect(app.status?.deploy).toBeUndefined();
    expect(toolRuns(rt, ns, name, 'template')).toBe(0);
    expect(rt.runtime.toolMetrics.snapshot().helm).toBeUndefined();
    expect(await getObject('configmap', ns, 'from-helm')).toBeUndefined();
    await expectBounded(rt, ns, name);
  });

  it('git.ref "origin/--upload-pack=...": ReconcileFailed with the git ref error; nothing ran, no file made', async () => {
    const ns = NS.git;
    const repo = servers().git.repos['k8s-simple-app-example'];
    expect(repo).toBeDefined();
    const cases = [
      {
        name: `git-space-${id}`,
        ref: `origin/--upload-pack=touch /tmp/pwned-${id}`,
        reason: 'it must not contain control characters, space or any of ~ ^ : ? * [ \\',
        pwned: `/tmp/pwned-${id}`,
      },
      {
        name: `git-dash-${id}`,
        ref: `origin/--upload-pack=/tmp/pwned2-${id}.sh`,
        reason: 'a "/"-separated part must not begin with "-" (git would read it as an option)',
        pwned: `/tmp/pwned2-${id}.sh`,
      },
    ];
    await apply(
      ...cases.map((c) =>
        appManifest(ns, c.name, {
          fetch: [{ git: { url: repo!.url, ref: c.ref } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        }),
      ),
    );
    for (const c of cases) {
      const app = await waitFailedTwice(rt, ns, c.name);
      const message = `Fetching (0): git.ref ${JSON.stringify(c.ref)} is not a valid git ref: ${c.reason}`;
      expectFailed(app, message);
      expect(app.status?.usefulErrorMessage).toBe(message);
      expect(app.status?.fetch?.error).toBe(message);
      expect(app.status?.fetch?.exitCode).toBe(-1);
      expect(app.status?.template).toBeUndefined();
      expect(toolRuns(rt, ns, c.name, 'fetch')).toBe(0);
      expect(existsSync(c.pwned)).toBe(false);
      await expectBounded(rt, ns, c.name);
    }
  });

  it('cue.paths "--outfile=...": ReconcileFailed with the path error; cue never wrote the file', async () => {
    const ns = NS.cue;
    const name = `cue-${id}`;
    const outfile = `/tmp/cue-out-${id}`;
    await apply(
      appManifest(ns, name, {
        fetch: [
          { inline: { paths: { 'cm.cue': 'apiVersion: "v1"\nkind: "ConfigMap"\nmetadata: name: "from-cue"\n' } } },
        ],
        template: [{ cue: { paths: [`--outfile=${outfile}`] } }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await waitFailedTwice(rt, ns, name);
    const message = `cue.paths[0] "--outfile=${outfile}" is not a valid path: it must not begin with "-" (a tool would read it as an option)`;
    expectFailed(app, message);
    expect(app.status?.template?.error).toBe(message);
    expect(toolRuns(rt, ns, name, 'template')).toBe(0);
    expect(existsSync(outfile)).toBe(false);
    expect(await getObject('configmap', ns, 'from-cue')).toBeUndefined();
    await expectBounded(rt, ns, name);
  });

  it('an http .tgz with an entry "../../escape-*": ReconcileFailed naming the entry; no file written outside', async () => {
    const ns = NS.archive;
    const name = `archive-${id}`;
    const entry = `../../escape-${id}`;
    const file = await publishFile(
      servers().http,
      `hostile-${id}.tgz`,
      rawTgz({ 'ok.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-archive\n', [entry]: 'pwned' }),
    );
    await apply(
      appManifest(ns, name, {
        fetch: [{ http: { url: file.url } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await waitFailedTwice(rt, ns, name);
    const message =
      "Fetching resources: Syncing directory '0': Syncing directory '.' with HTTP contents: Unpacking archive: " +
      `archive entry ${JSON.stringify(entry)} escapes the fetch directory`;
    expectFailed(app, message);
    expect(app.status?.fetch?.error).toBe(message);
    expect(app.status?.template).toBeUndefined();
    expect(await getObject('configmap', ns, 'from-archive')).toBeUndefined();
    // nowhere under the runtime's temp root (store, scratch), nor two levels above it
    expect(await namesUnder(rt.root)).not.toContain(`escape-${id}`);
    expect(existsSync(path.join(path.dirname(rt.root), `escape-${id}`))).toBe(false);
    expect(existsSync(path.join('/tmp', `escape-${id}`))).toBe(false);
    await expectBounded(rt, ns, name);
  });
});

describe.concurrent('the URL policy (enforced, allow-list: the git server and one server of the test)', () => {
  it('an allowed server still works (control)', async () => {
    const ns = NS.policy;
    const name = `allowed-${id}`;
    await apply(
      appManifest(ns, name, {
        fetch: [{ http: { url: `http://127.0.0.1:${portOf(allowed)}/ok.yml` } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await policyRt.waitReconciled(ns, name, 200_000);
    await expectSucceeded(app);
    expect((await getObject<{ data?: Record<string, string> }>('configmap', ns, 'allowed-ok'))?.data).toEqual({
      from: 'allowed',
    });
  });

  it('the Lambda Runtime API on loopback: refused before any request; a redirect to it: refused', async () => {
    const ns = NS.policy;
    const target = `http://127.0.0.1:${portOf(standIn)}${RUNTIME_API_PATH}`;
    const direct = `runtime-api-${id}`;
    const redirect = `redirect-${id}`;
    await apply(
      appManifest(ns, direct, {
        fetch: [{ http: { url: target } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
      appManifest(ns, redirect, {
        fetch: [{ http: { url: `http://127.0.0.1:${portOf(allowed)}/redirect` } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const refused = `Fetching resources: URL policy refused ${target}: 127.0.0.1, a loopback address, which this deployment does not allow`;
    for (const name of [direct, redirect]) {
      const app = await waitFailedTwice(policyRt, ns, name);
      expectFailed(app, refused);
      expect(app.status?.fetch?.error).toBe(refused);
      expect(app.status?.template).toBeUndefined();
      expect(toolRuns(policyRt, ns, name, 'fetch')).toBe(0);
      await expectBounded(policyRt, ns, name);
    }
    expect(standInRequests).toEqual([]);
    // the counter works: a request of our own is seen
    expect((await fetch(target)).status).toBe(200);
    expect(standInRequests).toEqual([`GET ${RUNTIME_API_PATH}`]);
  });

  it('a kubeconfig Secret whose server is the Lambda Runtime API: Deploying: URL policy refused ..., kapp never started', async () => {
    const ns = NS.policy;
    const name = `kubeconfig-${id}`;
    // A stand-in of its own (the test above counts the shared one's requests).
    const seen: string[] = [];
    const own = await listen(
      createServer((req, res) => {
        seen.push(`${req.method} ${req.url}`);
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      }),
    );
    try {
      const server = `http://127.0.0.1:${portOf(own)}`;
      const kubeconfig = [
        'apiVersion: v1',
        'kind: Config',
        `clusters: [{name: c, cluster: {server: "${server}"}}]`,
        'users: [{name: u, user: {token: t0ken}}]',
        'contexts: [{name: x, context: {cluster: c, user: u}}]',
        'current-context: x',
      ].join('\n');
      const app = appManifest(ns, name, {
        fetch: [{ inline: { paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: never}\n' } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }) as { spec: Record<string, unknown> };
      delete app.spec.serviceAccountName;
      app.spec.cluster = { kubeconfigSecretRef: { name: `target-${id}` } };
      await apply(
        {
          apiVersion: 'v1',
          kind: 'Secret',
          metadata: { name: `target-${id}`, namespace: ns },
          stringData: { value: kubeconfig },
        },
        app,
      );
      const refused = `Deploying: URL policy refused kubeconfig clusters[0].cluster.server ${server}: 127.0.0.1, a loopback address, which this deployment does not allow`;
      const failed = await waitFailedTwice(policyRt, ns, name);
      expectFailed(failed, refused);
      expect(failed.status?.deploy?.error).toBe(refused);
      expect(toolRuns(policyRt, ns, name, 'deploy')).toBe(0);
      await expectBounded(policyRt, ns, name);
      expect(seen).toEqual([]);
    } finally {
      await new Promise((r) => own.close(r));
    }
  });
});

describe.concurrent('malformed, unknown and invalid fields', () => {
  it('wrong field types: the API server refuses them, kubectl prints its error', async () => {
    const ns = NS.schema;
    const bad = [
      {
        name: `fetch-string-${id}`,
        spec: { fetch: 'x' },
        error: /spec\.fetch: Invalid value: "string": spec\.fetch in body must be of type array: "string"/,
      },
      {
        name: `sync-number-${id}`,
        spec: { syncPeriod: 5 },
        error: /spec\.syncPeriod: Invalid value: "integer": spec\.syncPeriod in body must be of type string: "integer"/,
      },
    ];
    for (const b of bad) {
      const manifest = inlineConfigMapApp(ns, b.name, 'never') as { spec: Record<string, unknown> };
      Object.assign(manifest.spec, b.spec);
      const r = await k(['apply', '-f', '-'], JSON.stringify(manifest), false);
      expect(r.code, b.name).not.toBe(0);
      expect(r.stderr).toMatch(b.error);
      expect(r.stderr).toContain(`The App "${b.name}" is invalid`);
      expect(await getApp(ns, b.name)).toBeUndefined();
    }
  });

  it('syncPeriod "soon" (a string the schema accepts, not a duration): a clear status, no crash loop', async () => {
    // Upstream decodes spec.syncPeriod as metav1.Duration, so such an App fails to decode in
    // the controller and never gets a status. Here it gets a ReconcileFailed naming the field.
    const ns = NS.duration;
    const name = `soon-${id}`;
    const manifest = inlineConfigMapApp(ns, name, 'never') as { spec: Record<string, unknown> };
    manifest.spec.syncPeriod = 'soon';
    await apply(manifest);
    const app = await rt.waitForApp(
      ns,
      name,
      (a) => reconciled(a),
      'a finished reconcile of the current generation',
      200_000,
    );
    const s = app.status!;
    expect(s.conditions?.map((c) => c.type)).toEqual(['ReconcileFailed']);
    const message = s.conditions?.[0]?.message ?? '';
    expect(message).toBe(`Reconciling: invalid App ${ns}/${name}: spec.syncPeriod: time: invalid duration "soon"`);
    expect(s.friendlyDescription).toBe(`Reconcile failed: ${message}`);
    expect(await getObject('configmap', ns, `${name}-config`)).toBeUndefined();
    expect(toolRuns(rt, ns, name, 'fetch')).toBe(0);
    const crashes = rt.logsFor(ns, name).filter((x) => x.msg === 'stage crashed; retrying');
    expect(crashes).toEqual([]);
    // status writes must not feed a loop of events and writes
    const before = rt.stageRuns(ns, name).length;
    const rv = (await getApp(ns, name))?.status?.consecutiveReconcileFailures ?? 0;
    await new Promise((res) => setTimeout(res, 10_000));
    expect(rt.stageRuns(ns, name).length - before).toBeLessThanOrEqual(3);
    expect(((await getApp(ns, name))?.status?.consecutiveReconcileFailures ?? 0) - rv).toBeLessThanOrEqual(3);

    // a valid duration afterwards reconciles
    manifest.spec.syncPeriod = '10m';
    await apply(manifest);
    await expectSucceeded(await rt.waitReconciled(ns, name, 200_000));
  });

  it('an unknown field: kubectl (strict validation) refuses it; without validation the API server prunes it', async () => {
    const ns = NS.unknown;
    const name = `unknown-${id}`;
    const repo = servers().git.repos['k8s-simple-app-example'];
    const manifest = appManifest(ns, name, {
      fetch: [{ git: { url: repo!.url, ref: 'origin/develop', subPath: 'config-step-2-template', bogus: 1 } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: { intoNs: ns } }],
    });
    const strict = await k(['apply', '-f', '-'], JSON.stringify(manifest), false);
    expect(strict.code).not.toBe(0);
    expect(strict.stderr).toContain('unknown field "spec.fetch[0].git.bogus"');
    expect(await getApp(ns, name)).toBeUndefined();

    const lax = await k(['apply', '--validate=false', '-f', '-'], JSON.stringify(manifest), false);
    expect(lax.code, lax.stderr).toBe(0);
    const stored = await getApp(ns, name);
    const git = ((stored?.spec.fetch ?? []) as { git?: Record<string, unknown> }[])[0]?.git;
    expect(git).toBeDefined();
    expect(git).not.toHaveProperty('bogus');
    expect(git?.ref).toBe('origin/develop');
    await expectSucceeded(await rt.waitReconciled(ns, name, 200_000));
  });
});

describe.concurrent('sizes at the limits', () => {
  it('a 63-character App name in a 63-character namespace reconciles', async () => {
    const ns = NS.long;
    expect(ns).toHaveLength(63);
    const name = label63(`long-${id}-`);
    const app = appManifest(ns, name, {
      fetch: [
        {
          inline: {
            paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: long-names\ndata:\n  a: "1"\n' },
          },
        },
      ],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    });
    await apply(app);
    await expectSucceeded(await rt.waitReconciled(ns, name, 200_000));
    expect(await getObject('configmap', ns, 'long-names')).toBeDefined();
  });

  it('a 253-character App name (the API maximum): kapp refuses its app record name, a clear status', async () => {
    // kapp's app record is `<name>.app`, 257 characters: more than a ConfigMap name may have,
    // so the API server refuses it and kapp fails; upstream fails the same way.
    const ns = NS.long;
    const name = `max-${id}-${'y'.repeat(253 - `max-${id}-`.length - 1)}z`;
    expect(name).toHaveLength(253);
    await apply(
      appManifest(ns, name, {
        fetch: [
          {
            inline: {
              paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: max-name\ndata:\n  a: "1"\n' },
            },
          },
        ],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await waitFailedTwice(rt, ns, name);
    const message = 'Deploying: Error (see .status.usefulErrorMessage for details)';
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toMatch(/^kapp: Error: /);
    expect(app.status?.usefulErrorMessage).toContain('must be no more than 253 characters');
    expect(app.status?.fetch?.exitCode).toBe(0);
    expect(app.status?.template?.exitCode).toBe(0);
    expect(app.status?.deploy?.exitCode).toBe(1);
    expect(await getObject('configmap', ns, 'max-name')).toBeUndefined();
    await expectBounded(rt, ns, name);
  });

  it('a spec of ~1.2 MiB inline content: reconciles, status stays small', async () => {
    const ns = NS.big;
    const name = `big-${id}`;
    const chunk = 'x'.repeat(1024 * 1024 + 200 * 1024);
    const manifest = appManifest(ns, name, {
      fetch: [
        {
          inline: {
            paths: {
              'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big-spec\ndata:\n  a: "1"\n',
              'big.txt': chunk,
            },
          },
        },
      ],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    });
    // create (not client-side apply): apply would copy the spec into the
    // last-applied-configuration annotation, which may hold only 256 KiB.
    const r = await k(['create', '-f', '-'], JSON.stringify(manifest), false);
    expect(r.code, r.stderr).toBe(0);
    const app = await rt.waitReconciled(ns, name, 200_000);
    await expectSucceeded(app);
    expect(Buffer.byteLength(JSON.stringify(app.status))).toBeLessThan(64 * 1024);
    expect(await getObject('configmap', ns, 'big-spec')).toBeDefined();
  });
});

describe('duplicate and out-of-order events', () => {
  it('duplicates and an older generation after a newer one: one run for the latest generation, no stale status', async () => {
    const ns = NS.events;
    const name = `events-${id}`;
    await apply(inlineConfigMapApp(ns, name, 'one'));
    const first = await rt.waitReconciled(ns, name, 200_000);
    await expectSucceeded(first);
    const clusterId = rt.runtime.registry.clusterIds()[0]!;
    const refOf = (a: AppObject & { metadata: { resourceVersion?: string } }) => ({
      clusterId,
      kind: 'App' as const,
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      namespace: ns,
      name,
      uid: a.metadata.uid,
      generation: a.metadata.generation,
      resourceVersion: a.metadata.resourceVersion ?? '1',
    });
    const gen1 = refOf(first);

    // generation 2, then at once: the same event twice and the older generation's event
    await apply(inlineConfigMapApp(ns, name, 'two'));
    const bumped = (await getApp(ns, name))!;
    expect(bumped.metadata.generation).toBe(gen1.generation + 1);
    const gen2 = refOf(bumped);
    const time = new Date();
    const dup = objectEvent(gen2, 'modified', { time });
    await rt.runtime.pipeline.send([dup, dup, objectEvent(gen1, 'modified', { time: new Date(time.getTime() + 1) })]);
    const second = await rt.waitReconciled(ns, name, 200_000);
    await expectSucceeded(second);
    expect(second.metadata.generation).toBe(gen2.generation);
    await rt.runtime.pipeline.idle();
    const fetchesFor = (g: number) =>
      rt.stageRuns(ns, name).filter((x) => x.stage === 'fetch' && x.generation === g && x.outcome !== 'stale');
    expect(fetchesFor(gen2.generation), 'fetch runs for generation 2').toHaveLength(1);
    expect(
      rt.stageRuns(ns, name).filter((x) => x.stage === 'deploy' && x.generation === gen2.generation),
      'deploy runs for generation 2',
    ).toHaveLength(1);
    expect(
      (await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`))?.data?.greeting,
    ).toBe('two');

    // replayed again once everything is done: no run, no status write
    const settled = (await getApp(ns, name)) as AppObject & { metadata: { resourceVersion?: string } };
    const runsBefore = runsStarted(rt, ns, name);
    const staleSeen = () =>
      rt.stageRuns(ns, name).filter((x) => x.stage === 'reconcile' && x.generation === gen1.generation).length;
    const staleBefore = staleSeen();
    await rt.runtime.pipeline.send([
      dup,
      objectEvent(gen2, 'resync', { time: new Date() }),
      // last, so that coalescing keeps it (a newer event replaces a waiting one)
      objectEvent(gen1, 'modified', { time: new Date() }),
    ]);
    await new Promise((res) => setTimeout(res, 1000));
    await rt.runtime.pipeline.idle();
    expect(staleSeen(), 'the replayed generation-1 event was handled').toBe(staleBefore + 1);
    expect(runsStarted(rt, ns, name)).toBe(runsBefore);
    const after = (await getApp(ns, name)) as AppObject & { metadata: { resourceVersion?: string } };
    expect(after.metadata.resourceVersion).toBe(settled.metadata.resourceVersion);
    expect(after.status).toEqual(settled.status);
    expect(rt.logsFor(ns, name).filter((x) => x.msg === 'stage crashed; retrying')).toEqual([]);
  });
});
