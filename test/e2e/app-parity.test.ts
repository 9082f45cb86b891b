/**
 * e2e: App rows of reference §2.1 and §3 that no other e2e file ran (docs/parity-e2e.md), each
 * through the whole flow (forwarder → fetch → template → deploy with the real vendir, ytt and
 * kapp) with the status kapp-controller v0.53 writes asserted:
 *
 * - ytt `strict: true` is accepted and ignored (§2.1.3: upstream never passes `--strict`), so a
 *   file the real `ytt --strict` refuses (`immutable: yes`) still deploys;
 * - a change of a Secret, then of a ConfigMap, the App references (ytt `valuesFrom`) redeploys
 *   it at once, the generation unchanged (§3.1 trigger 2, the ref tracker's force flag);
 * - `image.subPath`: only that directory of the image is the fetch root (§2.1.2);
 * - helmTemplate `name`, `namespace` and a `valuesFrom` Secret reach helm (`.Release.Name`,
 *   `.Release.Namespace`, `.Values`); a
 *   chart helm cannot render fails with `Templating helm chart: ...` and helm's stderr (§2.1.3,
 *   §3.5);
 * - a `rawOptions` entry without `=`: `Expected flag '...' to be in '--name=val' format`
 *   (§2.1.4);
 * - http `sha256`: the right digest deploys; another fails with vendir's digest error (§2.1.2);
 * - a fetch entry with no source (the CRD accepts it): `Fetching (0): Unsupported way to fetch
 *   templates` (§3.5);
 * - an `image` referenced by digest keeps reconciling after its registry went away, one
 *   referenced by tag fails (§3.6 cache, upstream `imgpkg_bundle_test.go`): the registry is
 *   reached through a loopback TCP relay this file closes, so the shared registry stays up;
 * - `paused` set while the fetch runs: the running reconcile finishes normally (deployed,
 *   `ReconcileSucceeded`), then `Canceled/paused` (§3.10: "a running reconcile is not affected");
 * - `canceled` set while the fetch runs: fetch and template are not cancellable upstream (they
 *   run in the sidecar), so the run reaches kapp with the cancel channel already closed by the
 *   App watch's first event: `Deploying: Already canceled`, exit code -1, `ReconcileFailed`,
 *   nothing deployed (§3.5, §3.10, `pkg/app/app_deploy.go` `newCancelCh`).
 *
 * The two mid-fetch cases fetch from a loopback server that holds its answer until the test
 * releases it. Every App is applied in `beforeAll`, so they reconcile side by side.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pushImage } from '../harness/fixtures.js';
import { type LoopbackHttpService, makeTempDir, startLoopbackHttp } from '../harness/servers/process.js';
import {
  APP_FINALIZER,
  type AppObject,
  apply,
  appManifest,
  configMapYaml,
  expectFailed,
  expectSucceeded,
  failedAt,
  getObject,
  k,
  preExecPart,
  RFC3339,
  SEE_USEFUL,
  servers,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
  yttConfigMap,
} from './support.js';

const id = suffix();
const NS = `e2e-parity-${id}`;

const N = {
  strict: `strict-${id}`,
  refChange: `ref-change-${id}`,
  helmNamed: `helm-named-${id}`,
  subPath: `image-subpath-${id}`,
  helmBroken: `helm-broken-${id}`,
  badFlag: `bad-flag-${id}`,
  noSource: `no-source-${id}`,
  shaOk: `sha-ok-${id}`,
  shaWrong: `sha-wrong-${id}`,
  digest: `by-digest-${id}`,
  paused: `paused-mid-fetch-${id}`,
  canceled: `canceled-mid-fetch-${id}`,
  tag: `by-tag-${id}`,
};

interface ConfigMap {
  metadata: { name: string };
  immutable?: boolean;
  data?: Record<string, string>;
}

/** A ytt template of ConfigMap `<name>` whose `text` is the fetched file `file` and `round` is `round`. */
function readingTemplate(name: string, file: string, round: string): string {
  return yttConfigMap(name, { text: `#@ data.read(${JSON.stringify(file)})`, round: JSON.stringify(round) });
}

/** A tiny helm chart under `chart/` rendering ConfigMap `<release>-cm` with the release's namespace and `.Values.greeting`; `broken` adds a template helm cannot parse. */
function chart(broken = false): Record<string, string> {
  return {
    'chart/Chart.yaml': 'apiVersion: v2\nname: mini\nversion: 0.1.0\n',
    'chart/values.yaml': 'greeting: chart default\n',
    'chart/templates/cm.yaml': [
      'apiVersion: v1',
      'kind: ConfigMap',
      'metadata:',
      '  name: {{ .Release.Name }}-cm',
      'data:',
      '  releaseNamespace: {{ .Release.Namespace | quote }}',
      '  greeting: {{ .Values.greeting | quote }}',
    ].join('\n'),
    ...(broken ? { 'chart/templates/broken.yaml': 'data: {{ .Values.unclosed\n' } : {}),
  };
}

/** The file the http server serves at `/files/sha.yml`, and its sha256 (hex). */
const SHA_FILE = configMapYaml(`sha-${id}-config`, { from: 'http with sha256' });
const SHA_HEX = createHash('sha256').update(SHA_FILE).digest('hex');
const WRONG_HEX = '0'.repeat(64);

let web: LoopbackHttpService;

/** Held answers of the slow server by App name: requested once the fetch asked, released by the test. */
/**
 * The held fetches: every request for `/held/<app>.yml` waits until the test releases the App
 * (the fleet source poll's resolution GET of the http source, then the fetch's own download),
 * and later ones are answered at once.
 */
const held = new Map<
  string,
  { requested: boolean; released?: boolean; waiting?: (() => void)[]; release?: () => void }
>();

/** A loopback TCP relay to the shared registry; {@link closeRelay} makes the registry unreachable. */
let relay: net.Server;
const relaySockets = new Set<net.Socket>();
let relayHost = '';
let imageDigest = '';

const rt = useE2ERuntime([NS]);

beforeAll(async () => {
  // -- the http server: /files/sha.yml at once, /held/<app>.yml once the test releases it
  web = await startLoopbackHttp('parity http server', await makeTempDir('parity-http'), (req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/files/sha.yml') return void res.writeHead(200).end(SHA_FILE);
    const name = /^\/held\/([a-z0-9-]+)\.yml$/.exec(url.pathname)?.[1];
    const entry = name ? held.get(name) : undefined;
    if (!name || !entry) return void res.writeHead(404).end();
    entry.requested = true;
    const answer = () => {
      if (!res.destroyed && !res.writableEnded) res.writeHead(200).end(configMapYaml(`${name}-config`, { v: 'one' }));
    };
    if (entry.released) return answer();
    entry.waiting = [...(entry.waiting ?? []), answer];
    entry.release = () => {
      entry.released = true;
      for (const w of entry.waiting?.splice(0) ?? []) w();
    };
  });
  for (const name of [N.paused, N.canceled]) held.set(name, { requested: false });

  // -- the registry relay and the image it serves
  const registry = servers().registry;
  const [regHost, regPort] = registry.host.split(':') as [string, string];
  relay = net.createServer((client) => {
    const upstream = net.connect(Number(regPort), regHost);
    for (const s of [client, upstream]) {
      relaySockets.add(s);
      s.on('close', () => relaySockets.delete(s));
      s.on('error', () => undefined);
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((r) => relay.listen(0, '127.0.0.1', r));
  relayHost = `127.0.0.1:${(relay.address() as net.AddressInfo).port}`;
  const image = await pushImage(registry, `e2e-parity-${id}/img:v1`, { 'data.txt': `image content ${id}` });
  imageDigest = image.digest;
  const nested = await pushImage(registry, `e2e-parity-${id}/nested:v1`, {
    'sub/dir/data.txt': `nested content ${id}`,
    'other.txt': 'outside subPath',
  });
  const imageRepo = `${relayHost}/e2e-parity-${id}/img`;

  const inline = (paths: Record<string, string>) => [{ inline: { paths } }];
  await apply(
    // ytt strict: `yes` is ambiguous for `ytt --strict` (a bool here, without it)
    appManifest(NS, N.strict, {
      fetch: inline({
        'cm.yml': `${configMapYaml(`${N.strict}-config`, { a: 'b' })}\nimmutable: yes\n`,
      }),
      template: [{ ytt: { strict: true } }],
      deploy: [{ kapp: {} }],
    }),
    // a referenced Secret's change
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'ref-values', namespace: NS },
      stringData: { 'values.yml': 'greeting: one\n' },
    },
    appManifest(NS, N.refChange, {
      fetch: inline({
        'values.yml': '#@data/values\n---\ngreeting: default\nfarewell: default\n',
        'cm.yml': yttConfigMap(`${N.refChange}-config`, {
          greeting: '#@ data.values.greeting',
          farewell: '#@ data.values.farewell',
        }),
      }),
      template: [
        {
          ytt: {
            valuesFrom: [{ secretRef: { name: 'ref-values' } }, { configMapRef: { name: 'ref-more-values' } }],
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'ref-more-values', namespace: NS },
      data: { 'values.yml': 'farewell: one\n' },
    },
    // helmTemplate name and namespace; a chart helm cannot render
    appManifest(NS, N.helmNamed, {
      fetch: inline(chart()),
      template: [
        {
          helmTemplate: {
            path: 'chart',
            name: `rel-${id}`,
            namespace: 'elsewhere',
            valuesFrom: [{ secretRef: { name: 'helm-values' } }],
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'helm-values', namespace: NS },
      stringData: { 'values.yml': 'greeting: from a Secret\n' },
    },
    // image subPath: only the subdirectory becomes the fetch root
    appManifest(NS, N.subPath, {
      fetch: [{ image: { url: nested.ref, subPath: 'sub/dir' } }],
      template: [
        {
          ytt: {
            inline: {
              paths: {
                'cm.yml': yttConfigMap(
                  `${N.subPath}-config`,
                  { files: '#@ json.encode(data.list())', text: '#@ data.read("data.txt")' },
                  ['json'],
                ),
              },
            },
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.helmBroken, {
      fetch: inline(chart(true)),
      template: [{ helmTemplate: { path: 'chart' } }],
      deploy: [{ kapp: {} }],
    }),
    // a fetch entry with only a path
    appManifest(NS, N.noSource, {
      fetch: [{ path: 'nothing' }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
    // a raw option without a value
    appManifest(NS, N.badFlag, {
      fetch: inline({ 'cm.yml': configMapYaml(`${N.badFlag}-config`, { a: 'b' }) }),
      template: [{ ytt: {} }],
      deploy: [{ kapp: { rawOptions: ['--wait-timeout'] } }],
    }),
    // http sha256
    ...[
      [N.shaOk, SHA_HEX],
      [N.shaWrong, WRONG_HEX],
    ].map(([name, sha256]) =>
      appManifest(NS, name!, {
        fetch: [{ http: { url: `${web.baseUrl}/files/sha.yml`, sha256 } }],
        // both render the ConfigMap `sha-<id>-config`: the wrong one never gets to deploy it
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    ),
    // image by digest and by tag, through the relay
    ...[
      [N.digest, `${imageRepo}@${image.digest}`],
      [N.tag, `${imageRepo}:v1`],
    ].map(([name, url]) => imageApp(name!, url!, '1')),
    // the two held fetches
    ...[N.paused, N.canceled].map((name) =>
      appManifest(NS, name, {
        fetch: [{ http: { url: `${web.baseUrl}/held/${name}.yml` } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    ),
  );
}, 120_000);

afterAll(async () => {
  for (const entry of held.values()) entry.release?.();
  await closeRelay();
  await web?.stop();
});

/** An App fetching the image `url` and deploying ConfigMap `<name>-config` with its `data.txt` and `round`. */
function imageApp(name: string, url: string, round: string): object {
  return appManifest(NS, name, {
    fetch: [{ image: { url } }],
    template: [{ ytt: { inline: { paths: { 'cm.yml': readingTemplate(`${name}-config`, 'data.txt', round) } } } }],
    deploy: [{ kapp: {} }],
  });
}

/** Stops the relay: the registry refuses every new connection through it from now on. */
async function closeRelay(): Promise<void> {
  if (!relay?.listening) return;
  const closed = new Promise<void>((r) => relay.close(() => r()));
  for (const s of relaySockets) s.destroy();
  await closed;
}

/** Waits for a successful reconcile of generation `generation` and checks the common success shape. */
async function succeeded(name: string, generation = 1): Promise<AppObject> {
  const app = await rt.waitForApp(NS, name, succeededAt(generation), `generation ${generation} reconciled`, 170_000);
  await expectSucceeded(app);
  return app;
}

/** Merges `spec` into the App's spec. */
async function patchSpec(name: string, spec: Record<string, unknown>): Promise<void> {
  await k(['patch', 'apps.kappctrl.k14s.io', name, '-n', NS, '--type=merge', '-p', JSON.stringify({ spec })]);
}

/**
 * Waits until the held fetch of `name` reached the server, sets `spec` (a new generation) while
 * that fetch still waits, holds the answer for `holdMs` more (longer than any poll of the App
 * during a tool run), releases it, and returns the App once generation 2 is marked
 * `Canceled/paused` and the run's final status is written.
 */
async function holdFetchAndSet(name: string, spec: Record<string, unknown>, holdMs = 5_000): Promise<AppObject> {
  await waitFor(
    `the fetch of ${name} to reach the server`,
    async () => (held.get(name)?.requested ? true : undefined),
    {
      timeoutMs: 120_000,
    },
  );
  const running = await rt.waitForApp(NS, name, (a) => a.status?.observedGeneration === 1, 'generation 1 running');
  expect(running.status?.conditions).toEqual([{ type: 'Reconciling', status: 'True' }]);
  await patchSpec(name, spec);
  await new Promise((r) => setTimeout(r, holdMs));
  held.get(name)?.release?.();
  // The run's final status (no longer Reconciling), marked for generation 2. Not the runtime's
  // idle(): the other App's fetch is still held then, so the runtime is never idle.
  const app = await rt.waitForApp(
    NS,
    name,
    (a) =>
      a.status?.observedGeneration === 2 &&
      a.status?.friendlyDescription === 'Canceled/paused' &&
      !(a.status?.conditions ?? []).some((c) => c.type === 'Reconciling'),
    'generation 2 observed as Canceled/paused with the run finished',
  );
  expect(app.metadata.generation).toBe(2);
  return app;
}

describe('template, deploy options and triggers (reference §2.1.3, §2.1.4, §3.1)', () => {
  it('ytt strict: true is ignored as upstream: a file ytt --strict refuses (immutable: yes) deploys', async () => {
    await succeeded(N.strict);
    const cm = await getObject<ConfigMap>('configmap', NS, `${N.strict}-config`);
    expect(cm?.immutable).toBe(true);
    expect(cm?.data).toEqual({ a: 'b' });
  });

  it('a referenced Secret, then a referenced ConfigMap, changes: redeployed at once, the generation unchanged', async () => {
    const first = await succeeded(N.refChange);
    const data = async () => (await getObject<ConfigMap>('configmap', NS, `${N.refChange}-config`))?.data;
    expect(await data()).toEqual({ greeting: 'one', farewell: 'one' });
    /**
     * Applies `object` and waits (syncPeriod is 10m: only the change can bring it) until the
     * deployed ConfigMap holds `want` and the App shows a successful reconcile of generation 1
     * after `prev`. The data is what is awaited, not the next success alone: under load a
     * reconcile already in flight before the change may be the next success, with the old data.
     */
    const changeAndWait = async (object: object, prev: AppObject, want: Record<string, string>): Promise<AppObject> => {
      const successes = prev.status?.consecutiveReconcileSuccesses ?? 0;
      await apply(object);
      await waitFor(
        `ConfigMap ${N.refChange}-config to hold ${JSON.stringify(want)}`,
        async () => {
          const got = (await data()) ?? {};
          const same = Object.keys(got).length === Object.keys(want).length;
          return same && Object.entries(want).every(([key, v]) => got[key] === v) ? true : undefined;
        },
        { timeoutMs: 60_000, describe: async () => `it holds ${JSON.stringify(await data())}` },
      );
      const next = await rt.waitForApp(
        NS,
        N.refChange,
        (a) => succeededAt(1)(a) && (a.status?.consecutiveReconcileSuccesses ?? 0) > successes,
        'another successful reconcile of generation 1',
        60_000,
      );
      await expectSucceeded(next);
      expect(next.metadata.generation).toBe(1);
      return next;
    };
    const second = await changeAndWait(
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'ref-values', namespace: NS },
        stringData: { 'values.yml': 'greeting: two\n' },
      },
      first,
      { greeting: 'two', farewell: 'one' },
    );
    await changeAndWait(
      {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'ref-more-values', namespace: NS },
        data: { 'values.yml': 'farewell: two\n' },
      },
      second,
      { greeting: 'two', farewell: 'two' },
    );
  });

  it('helmTemplate name, namespace and valuesFrom Secret: what helm renders with', async () => {
    await succeeded(N.helmNamed);
    expect((await getObject<ConfigMap>('configmap', NS, `rel-${id}-cm`))?.data).toEqual({
      releaseNamespace: 'elsewhere',
      greeting: 'from a Secret',
    });
    expect(await getObject('configmap', NS, `${N.helmNamed}-cm`)).toBeUndefined();
  });

  it("a chart helm cannot render: Templating helm chart, helm's stderr in usefulErrorMessage", async () => {
    const app = await rt.waitForApp(NS, N.helmBroken, failedAt(1), 'generation 1 failed');
    const message = `Templating helm chart: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toMatch(/^Error: /);
    expect(s.usefulErrorMessage).toContain('broken.yaml');
    expect(s.template).toEqual({
      exitCode: 1,
      error: message,
      stderr: s.usefulErrorMessage,
      updatedAt: expect.stringMatching(RFC3339),
    });
    expect(s.deploy).toBeUndefined();
  });

  it("a rawOptions entry without a value: Expected flag '--wait-timeout' to be in '--name=val' format", async () => {
    const app = await rt.waitForApp(NS, N.badFlag, failedAt(1), 'generation 1 failed');
    const message = "Expected flag '--wait-timeout' to be in '--name=val' format";
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.deploy).toEqual(preExecPart(message, 'deploy'));
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
    expect(await getObject('configmap', NS, `${N.badFlag}-config`)).toBeUndefined();
  });
});

describe('fetch (reference §2.1.2, §3.6)', () => {
  it('http sha256: the right digest deploys; another fails with vendir digest error', async () => {
    await succeeded(N.shaOk);
    expect((await getObject<ConfigMap>('configmap', NS, `sha-${id}-config`))?.data).toEqual({
      from: 'http with sha256',
    });
    const wrong = await rt.waitForApp(NS, N.shaWrong, failedAt(1), 'generation 1 failed');
    expectFailed(wrong, `Fetching resources: ${SEE_USEFUL}`);
    const s = wrong.status!;
    expect(s.usefulErrorMessage).toBe(
      "vendir: Error: Syncing directory '0':\n  Syncing directory '.' with HTTP contents:\n    Downloading URL:\n" +
        `      Expected digest to match 'sha256:${WRONG_HEX}', but was 'sha256:${SHA_HEX}'\n`,
    );
    expect(s.fetch?.stderr).toBe(s.usefulErrorMessage);
    expect(s.fetch?.exitCode).toBe(1);
    expect(s.template).toBeUndefined();
    expect(s.deploy).toBeUndefined();
  });

  it('image subPath: only that directory of the image is the fetch root', async () => {
    await succeeded(N.subPath);
    const cm = await getObject<ConfigMap>('configmap', NS, `${N.subPath}-config`);
    // (ytt's order of the two -f directories is the same as upstream's: compare the set)
    expect((JSON.parse(cm?.data?.files ?? '[]') as string[]).sort()).toEqual(['cm.yml', 'data.txt']);
    expect(cm?.data?.text).toBe(`nested content ${id}`);
  });

  it('a fetch entry without a source: Fetching (0): Unsupported way to fetch templates, before vendir', async () => {
    const app = await rt.waitForApp(NS, N.noSource, failedAt(1), 'generation 1 failed');
    const message = 'Fetching (0): Unsupported way to fetch templates';
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.fetch).toEqual(preExecPart(message, 'fetch'));
    expect(app.status?.template).toBeUndefined();
  });

  it('the registry gone: an image by digest still reconciles a new generation, one by tag fails', async () => {
    await Promise.all([succeeded(N.digest), succeeded(N.tag)]);
    const digestApp = await rt.cluster.getApp(NS, N.digest);
    expect(digestApp?.status?.fetch?.stdout).toContain(imageDigest);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.tag}-config`))?.data).toEqual({
      text: `image content ${id}`,
      round: '1',
    });

    await closeRelay();
    const imageRepo = `${relayHost}/e2e-parity-${id}/img`;
    await apply(imageApp(N.digest, `${imageRepo}@${imageDigest}`, '2'), imageApp(N.tag, `${imageRepo}:v1`, '2'));

    await succeeded(N.digest, 2);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.digest}-config`))?.data).toEqual({
      text: `image content ${id}`,
      round: '2',
    });
    const tag = await rt.waitForApp(NS, N.tag, failedAt(2), 'generation 2 failed');
    expectFailed(tag, `Fetching resources: ${SEE_USEFUL}`);
    expect(tag.status?.usefulErrorMessage).toMatch(/^vendir: Error: /);
    expect(tag.status?.usefulErrorMessage).toContain(relayHost);
    expect(tag.status?.fetch?.exitCode).toBe(1);
    // the last deploy (round 1) stays
    expect((await getObject<ConfigMap>('configmap', NS, `${N.tag}-config`))?.data?.round).toBe('1');
  });
});

describe('paused and canceled while the fetch runs (reference §3.10)', () => {
  it('paused: the running reconcile finishes (deployed, ReconcileSucceeded), then Canceled/paused', async () => {
    const app = await holdFetchAndSet(N.paused, { paused: true });
    const s = app.status ?? {};
    expect(s.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(s.consecutiveReconcileSuccesses).toBe(1);
    expect(s.deploy?.exitCode).toBe(0);
    expect(s.deploy?.finished).toBe(true);
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.paused}-config`))?.data).toEqual({ v: 'one' });
  });

  it('canceled: fetch and template finish, kapp never starts: Deploying: Already canceled', async () => {
    const app = await holdFetchAndSet(N.canceled, { canceled: true });
    const message = 'Deploying: Already canceled';
    const s = app.status ?? {};
    expect(s.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.consecutiveReconcileFailures).toBe(1);
    expect(s.fetch?.exitCode).toBe(0);
    expect(s.template?.exitCode).toBe(0);
    expect(s.deploy).toEqual(preExecPart(message, 'deploy'));
    // blockDeletion runs before kapp: the finalizer is on, nothing deployed
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
    expect(await getObject('configmap', NS, `${N.canceled}-config`)).toBeUndefined();
    expect(await getObject('configmap', NS, `${N.canceled}.app`)).toBeUndefined();
  });
});
