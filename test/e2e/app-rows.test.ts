/**
 * e2e: more App rows of reference §2.1 and §3.6–§3.10, each through the whole flow with the
 * real tools and the status kapp-controller writes asserted (upstream v0.53 `pkg/app/*.go`,
 * `pkg/template/*.go`, `pkg/kubeconfig/*.go`):
 *
 * - spec validation at reconcile time: no fetch, no template, two deploy entries, neither
 *   ServiceAccount nor cluster, a kubeconfig Secret without the key, `cluster` without a
 *   Secret reference; the finalizer and delete consequences of the deploy-stage ones;
 * - template: ytt `ignoreUnknownComments`; `valuesFrom.path: "-"` (stdin) for ytt and helm
 *   after a stream step, and without one (ytt reads an empty stream, helm refuses); cue and
 *   sops after a stream step;
 *   `jsonnet`;
 * - fetch: git `refSelection.semver` (with prereleases), `image` and `imgpkgBundle`
 *   `tagSelection.semver` from the local registry, git `depth`;
 * - deploy: `kapp.inspect.rawOptions` and `kapp.delete.rawOptions` reach kapp.
 *
 * Every App is applied in `beforeAll` and reconciles side by side; each test waits for its own.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { createRepo, pushBundle, pushImage } from '../harness/fixtures.js';
import {
  APP_FINALIZER,
  type AppObject,
  apply,
  appManifest,
  configMapYaml,
  expectFailed,
  expectSucceeded,
  getApp,
  getObject,
  k,
  preExecPart,
  servers,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
  yttConfigMap,
} from './support.js';

const id = suffix();
const NS = `e2e-rows-${id}`;

const N = {
  noFetch: `no-fetch-${id}`,
  noTemplate: `no-template-${id}`,
  twoDeploys: `two-deploys-${id}`,
  noCreds: `no-creds-${id}`,
  missingKey: `missing-key-${id}`,
  noSecretRef: `no-secret-ref-${id}`,
  comments: `comments-${id}`,
  yttStdin: `ytt-stdin-${id}`,
  yttNoStdin: `ytt-no-stdin-${id}`,
  helmStdin: `helm-stdin-${id}`,
  helmNoStdin: `helm-no-stdin-${id}`,
  cueStream: `cue-stream-${id}`,
  sopsStream: `sops-stream-${id}`,
  jsonnet: `jsonnet-${id}`,
  gitSemver: `git-semver-${id}`,
  imageSemver: `image-semver-${id}`,
  gitDepth1: `git-depth1-${id}`,
  gitDepth0: `git-depth0-${id}`,
  inspectRaw: `inspect-raw-${id}`,
  deleteRaw: `delete-raw-${id}`,
};

interface ConfigMap {
  metadata: { name: string; labels?: Record<string, string> };
  data?: Record<string, string>;
}

/** A ytt template of a ConfigMap `<name>` whose `greeting` is the data value `greeting`. */
function greetingTemplate(name: string): string {
  return yttConfigMap(name, { greeting: '#@ data.values.greeting' });
}

/** One inline fetch with `paths`. */
const inline = (paths: Record<string, string>) => [{ inline: { paths } }];

/** An App without `serviceAccountName` (appManifest sets it). */
function withoutSA(app: object): object {
  delete (app as { spec: Record<string, unknown> }).spec.serviceAccountName;
  return app;
}

/** A tiny helm chart (`mini`) rendering ConfigMap `<release>-cm` with `.Values.greeting`. */
const chart = {
  'chart/Chart.yaml': 'apiVersion: v2\nname: mini\nversion: 0.1.0\n',
  'chart/values.yaml': 'greeting: chart default\n',
  'chart/templates/cm.yaml': [
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    '  name: {{ .Release.Name }}-cm',
    'data:',
    '  greeting: {{ .Values.greeting | quote }}',
  ].join('\n'),
};

/** First commit id of each depth repo (`depth1`, `depth0`); a second commit is the tip of `main`. */
const firstCommit: Record<string, string> = {};
/** Digests of what `tagSelection` should pick. */
let pickedImage = '';
let pickedBundle = '';

const rt = useE2ERuntime([NS]);

beforeAll(async () => {
  const s = servers();
  // git refSelection: tags v1.0.0, v1.1.0 and v2.0.0-rc.1, one commit each
  const tagged = `e2e-rows-${id}/tagged`;
  for (const [tag, greeting] of [
    ['v1.0.0', 'one-zero'],
    ['v1.1.0', 'one-one'],
    ['v2.0.0-rc.1', 'two-rc'],
  ] as const) {
    await createRepo(s.git, tagged, { 'version.txt': greeting }, { tags: [tag] });
  }
  // git depth: two commits on main; the App asks for the first by id
  const depthRepos = [`e2e-rows-${id}/depth1`, `e2e-rows-${id}/depth0`];
  for (const repo of depthRepos) {
    const short = repo.split('/')[1]!;
    for (const greeting of ['first commit', 'second commit']) {
      const commit = await createRepo(s.git, repo, { 'cm.yml': configMapYaml(`${short}-${id}`, { greeting }) });
      firstCommit[short] ??= commit.commitSha;
    }
  }
  // image and imgpkgBundle tagSelection: 1.0.0, 1.2.0, 2.0.0
  for (const v of ['1.0.0', '1.2.0', '2.0.0']) {
    const [img, bundle] = await Promise.all([
      pushImage(s.registry, `e2e-rows-${id}/image:${v}`, { 'image.txt': `image ${v}` }),
      pushBundle(s.registry, `e2e-rows-${id}/bundle:${v}`, { 'bundle.txt': `bundle ${v}` }),
    ]);
    if (v === '1.2.0') {
      pickedImage = img.digest;
      pickedBundle = bundle.digest;
    }
  }
  const host = s.registry.host;
  const gitUrl = (repo: string) => `${s.git.baseUrl}/${repo}`;
  const cm = (name: string) => ({ 'cm.yml': configMapYaml(`${name}-config`, { from: name }) });

  await apply(
    // ---- validation
    appManifest(NS, N.noFetch, { template: [{ ytt: {} }], deploy: [{ kapp: {} }] }),
    appManifest(NS, N.noTemplate, { fetch: inline(cm(N.noTemplate)), deploy: [{ kapp: {} }] }),
    appManifest(NS, N.twoDeploys, {
      fetch: inline(cm(N.twoDeploys)),
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }, { kapp: {} }],
    }),
    withoutSA(
      appManifest(NS, N.noCreds, {
        fetch: inline(cm(N.noCreds)),
        template: [{ ytt: {} }],
        deploy: [{ kapp: { inspect: {} } }],
      }),
    ),
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'kubeconfig', namespace: NS },
      stringData: { value: 'not read', other: 'not read either' },
    },
    withoutSA(
      appManifest(NS, N.missingKey, {
        cluster: { kubeconfigSecretRef: { name: 'kubeconfig', key: 'config' } },
        fetch: inline(cm(N.missingKey)),
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    ),
    withoutSA(
      appManifest(NS, N.noSecretRef, {
        cluster: { namespace: NS },
        fetch: inline(cm(N.noSecretRef)),
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    ),
    // ---- template
    appManifest(NS, N.comments, {
      fetch: inline({ 'cm.yml': `${configMapYaml(`${N.comments}-config`, { a: 'b' })}\n# a plain comment\n` }),
      template: [{ ytt: { ignoreUnknownComments: true } }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.yttStdin, {
      fetch: inline({ 'values-src.yml': 'greeting: from stdin\n', 'cm.yml': greetingTemplate(`${N.yttStdin}-config`) }),
      template: [{ ytt: { paths: ['values-src.yml'] } }, { ytt: { paths: ['cm.yml'], valuesFrom: [{ path: '-' }] } }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.yttNoStdin, {
      fetch: inline({
        'values.yml': '#@data/values\n---\ngreeting: the default\n',
        'cm.yml': greetingTemplate(`${N.yttNoStdin}-config`),
      }),
      template: [{ ytt: { valuesFrom: [{ path: '-' }] } }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.helmStdin, {
      fetch: inline({ ...chart, 'values-src.yml': 'greeting: helm from stdin\n' }),
      template: [
        { ytt: { paths: ['values-src.yml'] } },
        { helmTemplate: { path: 'chart', valuesFrom: [{ path: '-' }] } },
      ],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.helmNoStdin, {
      fetch: inline(chart),
      template: [{ helmTemplate: { path: 'chart', valuesFrom: [{ path: '-' }] } }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.cueStream, {
      fetch: inline({ ...cm(N.cueStream), 'x.cue': 'a: 1\n' }),
      template: [{ ytt: { paths: ['cm.yml'] } }, { cue: {} }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.sopsStream, {
      fetch: inline(cm(N.sopsStream)),
      // the key Secret does not exist: upstream fails on the stream before reading it
      template: [{ ytt: {} }, { sops: { age: { privateKeysSecretRef: { name: 'no-such-key' } } } }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.jsonnet, {
      fetch: inline(cm(N.jsonnet)),
      template: [{ jsonnet: {} }],
      deploy: [{ kapp: {} }],
    }),
    // ---- fetch
    appManifest(NS, N.gitSemver, {
      fetch: [
        { git: { url: gitUrl(tagged), refSelection: { semver: { constraints: '>=1.0.0 <2.0.0' } } }, path: 'stable' },
        {
          git: {
            url: gitUrl(tagged),
            refSelection: { semver: { constraints: '>=1.0.0', prereleases: { identifiers: ['rc'] } } },
          },
          path: 'pre',
        },
      ],
      template: [
        {
          ytt: {
            inline: {
              paths: {
                'cm.yml': yttConfigMap(`${N.gitSemver}-config`, {
                  stable: '#@ data.read("stable/version.txt")',
                  pre: '#@ data.read("pre/version.txt")',
                }),
              },
            },
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.imageSemver, {
      fetch: [
        { image: { url: `${host}/e2e-rows-${id}/image`, tagSelection: { semver: { constraints: '<2.0.0' } } } },
        {
          imgpkgBundle: { image: `${host}/e2e-rows-${id}/bundle`, tagSelection: { semver: { constraints: '<2.0.0' } } },
          path: 'bundle',
        },
      ],
      template: [
        {
          ytt: {
            inline: {
              paths: {
                'cm.yml': yttConfigMap(`${N.imageSemver}-config`, {
                  image: '#@ data.read("0/image.txt")',
                  bundle: '#@ data.read("bundle/bundle.txt")',
                }),
              },
            },
            // the bundle's ImagesLock is YAML ytt would render
            fileMarks: ['bundle/.imgpkg/images.yml:exclude=true'],
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.gitDepth1, {
      fetch: [{ git: { url: gitUrl(depthRepos[0]!), ref: firstCommit.depth1 } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS, N.gitDepth0, {
      fetch: [{ git: { url: gitUrl(depthRepos[1]!), ref: firstCommit.depth0, depth: 0 } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
    // ---- deploy rawOptions
    appManifest(NS, N.inspectRaw, {
      fetch: inline({
        'cm.yml': configMapYaml(`${N.inspectRaw}-config`, { a: 'b' }),
        'secret.yml': `apiVersion: v1\nkind: Secret\nmetadata:\n  name: ${N.inspectRaw}-secret\nstringData:\n  a: b\n`,
      }),
      template: [{ ytt: {} }],
      deploy: [{ kapp: { inspect: { rawOptions: ['--raw=true'] } } }],
    }),
    appManifest(NS, N.deleteRaw, {
      fetch: inline({
        'cm.yml': configMapYaml(`${N.deleteRaw}-config`, { a: 'b' }),
        'secret.yml': `apiVersion: v1\nkind: Secret\nmetadata:\n  name: ${N.deleteRaw}-secret\nstringData:\n  a: b\n`,
      }),
      template: [{ ytt: {} }],
      deploy: [{ kapp: { delete: { rawOptions: ['--filter-kind=ConfigMap'] } } }],
    }),
  );
}, 240_000);

/** Waits for a failed reconcile of generation 1. */
async function failed(name: string): Promise<AppObject> {
  return await rt.waitForApp(
    NS,
    name,
    (a) =>
      a.status?.observedGeneration === a.metadata.generation &&
      (a.status?.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false),
    'ReconcileFailed',
  );
}

/** Waits for a successful reconcile of generation 1 and checks the common success shape. */
async function succeeded(name: string): Promise<AppObject> {
  const app = await rt.waitForApp(NS, name, succeededAt(1), 'generation 1 reconciled', 170_000);
  await expectSucceeded(app);
  return app;
}

/** Deletes the App and waits until it reports DeleteFailed with `message`. */
async function deleteFails(name: string, message: string): Promise<AppObject> {
  await k(['delete', 'apps.kappctrl.k14s.io', name, '-n', NS, '--wait=false']);
  const app = await rt.waitForApp(
    NS,
    name,
    (a) => !!a.metadata.deletionTimestamp && (a.status?.conditions?.some((c) => c.type === 'DeleteFailed') ?? false),
    'DeleteFailed',
  );
  expect(app.status?.conditions).toEqual([{ type: 'DeleteFailed', status: 'True', message }]);
  expect(app.status?.friendlyDescription).toBe(`Delete failed: ${message}`);
  expect(app.status?.usefulErrorMessage).toBe(message);
  expect(app.metadata.finalizers).toContain(APP_FINALIZER);
  return app;
}

/** Merges `spec` into the App's spec (a deleting App's spec can still change). */
async function patchSpec(name: string, spec: Record<string, unknown>): Promise<void> {
  await k(['patch', 'apps.kappctrl.k14s.io', name, '-n', NS, '--type=merge', '-p', JSON.stringify({ spec })]);
}

/** Waits until the App is gone. */
async function gone(name: string): Promise<void> {
  await waitFor(`App ${NS}/${name} gone`, async () => ((await getApp(NS, name)) ? undefined : true), {
    timeoutMs: 120_000,
    describe: async () => JSON.stringify((await getApp(NS, name))?.status ?? null),
  });
}

describe.concurrent('spec validation at reconcile time (reference §2.1.1, §3.8.3)', () => {
  it('no fetch: Expected at least one fetch option in status.fetch; nothing templated or deployed', async () => {
    const app = await failed(N.noFetch);
    const message = 'Expected at least one fetch option';
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.fetch).toEqual(preExecPart(message, 'fetch'));
    expect(s.template).toBeUndefined();
    expect(s.deploy).toBeUndefined();
    expect(app.metadata.finalizers ?? []).not.toContain(APP_FINALIZER);
  });

  it('no template: Expected at least one template option in status.template; not deployed', async () => {
    const app = await failed(N.noTemplate);
    const message = 'Expected at least one template option';
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.fetch?.exitCode).toBe(0);
    expect(s.template).toEqual(preExecPart(message, 'template'));
    expect(s.deploy).toBeUndefined();
    expect(app.metadata.finalizers ?? []).not.toContain(APP_FINALIZER);
  });

  it('two deploy entries: Expected exactly one deploy option in deploy and inspect, after the finalizer; delete fails the same way until fixed', async () => {
    const app = await failed(N.twoDeploys);
    const message = 'Expected exactly one deploy option';
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.template?.exitCode).toBe(0);
    expect(s.deploy).toEqual(preExecPart(message, 'deploy'));
    // upstream inspects whenever status.deploy is set, and inspect checks the count first
    expect(s.inspect).toEqual(preExecPart(message, 'inspect'));
    // blockDeletion ran before the check
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
    expect(await getObject('configmap', NS, `${N.twoDeploys}-config`)).toBeUndefined();

    await deleteFails(N.twoDeploys, message);
    // the way out: one deploy entry, and no kapp delete
    await patchSpec(N.twoDeploys, { deploy: [{ kapp: {} }], noopDelete: true });
    await gone(N.twoDeploys);
  });

  it('neither ServiceAccount nor cluster: Preparing kapp: Expected service account or cluster specified (deploy, inspect, delete)', async () => {
    const app = await failed(N.noCreds);
    const message = 'Preparing kapp: Expected service account or cluster specified';
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.deploy).toEqual(preExecPart(message, 'deploy'));
    expect(s.inspect).toEqual(preExecPart(message, 'inspect'));
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);

    await deleteFails(N.noCreds, message);
    await patchSpec(N.noCreds, { noopDelete: true });
    await gone(N.noCreds);
  });

  it("a kubeconfig Secret without the key: Preparing kapp: Expected to find key '<k>' in secret (keys: ...)", async () => {
    const app = await failed(N.missingKey);
    // upstream lists the keys in Go map order; kapp-lambda sorts them
    const message = "Preparing kapp: Expected to find key 'config' in secret (keys: other, value)";
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.deploy).toEqual(preExecPart(message, 'deploy'));
    expect(app.status?.inspect).toBeUndefined();
  });

  it('cluster without kubeconfigSecretRef: Preparing kapp: Expected kubeconfig secret reference to be specified', async () => {
    const app = await failed(N.noSecretRef);
    const message = 'Preparing kapp: Expected kubeconfig secret reference to be specified';
    expectFailed(app, message);
    expect(app.status?.deploy).toEqual(preExecPart(message, 'deploy'));
  });
});

describe.concurrent('template (reference §2.1.3, §3.7)', () => {
  it('ytt ignoreUnknownComments: the real ytt accepts the flag and renders the file with a plain comment', async () => {
    await succeeded(N.comments);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.comments}-config`))?.data).toEqual({ a: 'b' });
  });

  it('ytt valuesFrom path "-" after a stream step: the previous output is the data values', async () => {
    await succeeded(N.yttStdin);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.yttStdin}-config`))?.data).toEqual({
      greeting: 'from stdin',
    });
  });

  it('ytt valuesFrom path "-" as the first step: an empty stream, the defaults apply (only helm checks for stdin)', async () => {
    await succeeded(N.yttNoStdin);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.yttNoStdin}-config`))?.data).toEqual({
      greeting: 'the default',
    });
  });

  it('helmTemplate valuesFrom path "-" after a stream step: the previous output is the values', async () => {
    await succeeded(N.helmStdin);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.helmStdin}-cm`))?.data).toEqual({
      greeting: 'helm from stdin',
    });
  });

  it('helmTemplate valuesFrom path "-" as the first step: Expected stdin to be available ...', async () => {
    const app = await failed(N.helmNoStdin);
    const message = 'Expected stdin to be available when using it as path, but was not';
    expectFailed(app, message);
    expect(app.status?.template).toEqual(preExecPart(message, 'template'));
    expect(app.status?.deploy).toBeUndefined();
  });

  it.each([
    [N.cueStream, 'Templating stream is not supported'],
    [N.sopsStream, 'Templating data is not supported'],
    [N.jsonnet, 'Unsupported way to template'],
  ])('%s: ReconcileFailed with %s', async (name, message) => {
    const app = await failed(name);
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.template).toEqual(preExecPart(message, 'template'));
    expect(app.status?.deploy).toBeUndefined();
  });
});

describe.concurrent('fetch (reference §2.1.2, §2.5)', () => {
  it('git refSelection.semver: the highest matching tag, prereleases only when asked', async () => {
    const app = await succeeded(N.gitSemver);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.gitSemver}-config`))?.data).toEqual({
      stable: 'one-one',
      pre: 'two-rc',
    });
    expect(app.status?.fetch?.stdout).toContain('v1.1.0');
    expect(app.status?.fetch?.stdout).toContain('v2.0.0-rc.1');
  });

  it('image and imgpkgBundle tagSelection.semver: the highest tag under 2.0.0 from the local registry', async () => {
    const app = await succeeded(N.imageSemver);
    expect((await getObject<ConfigMap>('configmap', NS, `${N.imageSemver}-config`))?.data).toEqual({
      image: 'image 1.2.0',
      bundle: 'bundle 1.2.0',
    });
    expect(app.status?.fetch?.stdout).toContain(pickedImage);
    expect(app.status?.fetch?.stdout).toContain(pickedBundle);
  });

  it('git depth: the default (1) cannot check out an older commit; depth 0 (full history) can', async () => {
    const shallow = await failed(N.gitDepth1);
    expectFailed(shallow, `Fetching resources: ${'Error (see .status.usefulErrorMessage for details)'}`);
    expect(shallow.status?.fetch?.stderr).toContain(firstCommit.depth1);
    const full = await succeeded(N.gitDepth0);
    expect(full.status?.fetch?.stdout).toContain(firstCommit.depth0);
    expect((await getObject<ConfigMap>('configmap', NS, `depth0-${id}`))?.data).toEqual({
      greeting: 'first commit',
    });
  });
});

describe.concurrent('deploy rawOptions (reference §2.1.4, §3.8.1, §3.8.2)', () => {
  it('kapp.inspect.rawOptions --raw=true: status.inspect holds the resources as YAML', async () => {
    // (a --filter-* option has no effect on inspect: kapp ignores the kind and name filters once
    // a --filter expression is given, and upstream always gives one)
    const app = await rt.waitForApp(NS, N.inspectRaw, succeededAt(1), 'generation 1 reconciled', 170_000);
    const inspect = app.status?.inspect;
    expect(inspect?.exitCode).toBe(0);
    expect(inspect?.stdout).not.toContain(`Resources in app '${N.inspectRaw}.app'`);
    expect(inspect?.stdout).toMatch(new RegExp(`^ +name: ${N.inspectRaw}-secret$`, 'm'));
    expect(inspect?.stdout).toMatch(new RegExp(`^ +name: ${N.inspectRaw}-config$`, 'm'));
    expect(inspect?.stdout).toMatch(/^kind: ConfigMap$/m);
  });

  it('kapp.delete.rawOptions --filter-kind=ConfigMap: delete removes the ConfigMap only', async () => {
    await succeeded(N.deleteRaw);
    await k(['delete', 'apps.kappctrl.k14s.io', N.deleteRaw, '-n', NS, '--wait=false']);
    await gone(N.deleteRaw);
    expect(await getObject('configmap', NS, `${N.deleteRaw}-config`)).toBeUndefined();
    expect(await getObject('secret', NS, `${N.deleteRaw}-secret`)).toBeDefined();
  });
});
