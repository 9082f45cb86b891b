/**
 * e2e: the App features of reference §2.1 and §3.6–§3.10 that sources.test.ts does not run,
 * each through the whole flow (forwarder → fetch → template → deploy with the real vendir,
 * sops, cue, ytt, helm and kapp) with the status kapp-controller writes asserted:
 *
 * - sops with a PGP key and with an age key (two steps, each scoped by `paths`);
 * - cue with `paths`, `valuesFrom` (ConfigMap, path, downwardAPI), `inputExpression` and
 *   `outputExpression`;
 * - the directory layout of §3.6 (one fetch with and without `path`; several fetches, one
 *   without `path`), with a plain `image` from the local registry and `inline.pathsFrom`
 *   (Secret with `directoryPath`, ConfigMap), seen through ytt's `data.list()`;
 * - ytt `inline`, `fileMarks` (`type=data`, `exclude=true`), `valuesFrom` (Secret, ConfigMap,
 *   `path`) and every `downwardAPI` item kind;
 * - a helm chart from an `oci://` repository; an http source behind basic auth;
 * - `defaultNamespace` in each row of §3.8.3 (the `cluster` rows through a kubeconfig Secret
 *   holding a ServiceAccount token for this same cluster), `mapNs`, `noopDelete`;
 * - `paused` (§3.10, upstream `pause_test.go`).
 *
 * Every App is applied in `beforeAll`, so they reconcile side by side; each test waits for its
 * own. The sops keys in `assets/sops/` are test-only keys made for this file (no passphrase).
 */
import { readFile, rm } from 'node:fs/promises';
import type http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { fixturePath, pushHelmChartOci, pushImage } from '../harness/fixtures.js';
import { writeTokenKubeconfig } from '../harness/kube.js';
import { makeTempDir, startLoopbackHttp } from '../harness/servers/process.js';
import {
  type AppObject,
  apply,
  appManifest,
  configMapYaml,
  expectSucceeded,
  expectSucceededStatus,
  getApp,
  getObject,
  inlineConfigMapApp,
  k,
  kubeconfigPath,
  SA,
  STATUS_KEYS,
  servers,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
  yttConfigMap,
} from './support.js';

const id = suffix();
const NS = {
  main: `e2e-feat-${id}`,
  /** Apps deploying elsewhere (defaultNamespace, mapNs). */
  ns: `e2e-feat-ns-${id}`,
  /** Where those resources land; not watched. */
  target: `e2e-feat-target-${id}`,
  /** `cluster.namespace` of the kubeconfig-Secret Apps; not watched. */
  c: `e2e-feat-c-${id}`,
  /** The namespace of the kubeconfig's current context; not watched. */
  kc: `e2e-feat-kc-${id}`,
};

const N = {
  sops: `sops-${id}`,
  cue: `cue-${id}`,
  layoutPath: `layout-path-${id}`,
  layoutNoPath: `layout-nopath-${id}`,
  layoutMulti: `layout-multi-${id}`,
  values: `ytt-values-${id}`,
  helmOci: `podinfo-oci-${id}`,
  httpAuth: `http-auth-${id}`,
  defaultNs: `default-ns-${id}`,
  mapNs: `map-ns-${id}`,
  clusterXC: `cluster-x-c-${id}`,
  clusterC: `cluster-c-${id}`,
  clusterX: `cluster-x-${id}`,
  clusterNone: `cluster-none-${id}`,
  noop: `noop-${id}`,
  paused: `paused-${id}`,
};

const ASSETS = path.join(path.dirname(fileURLToPath(import.meta.url)), 'assets', 'sops');
const HTTP_USER = 'e2e-user';
const HTTP_PASSWORD = `pw-${id}`;
const APP_LABEL = 'expectedLabelValue';
const APP_ANNOTATION = 'expectedAnnotationValue';

interface ConfigMap {
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  data?: Record<string, string>;
}

/** ytt template: a ConfigMap `<name>` whose `files` is `data.list()` and whose other keys read files. */
function listingTemplate(name: string, reads: Record<string, string> = {}): string {
  const read = Object.entries(reads).map(([key, file]) => [key, `#@ data.read(${JSON.stringify(file)})`]);
  return yttConfigMap(name, { files: '#@ json.encode(data.list())', ...Object.fromEntries(read) }, ['json']);
}

/** The basic-auth server's requests: the Authorization header each carried (undefined: none). */
const authSeen: (string | undefined)[] = [];
let authServer: { baseUrl: string; stop(): Promise<void> } | undefined;
let imageDigest = '';
let liveKubernetesVersion = '';

const rt = useE2ERuntime([NS.main, NS.ns], { tenants: [NS.target, NS.c, NS.kc] });

beforeAll(async () => {
  const s = servers();
  const gitRepo = s.git.repos['k8s-simple-app-example'];
  const zip = s.http.files['k8s-simple-app-example-master.zip'];
  expect(gitRepo && zip).toBeTruthy();

  const [image, ociUrl, pgpKey, pgpFile, ageKey, ageFile, version] = await Promise.all([
    pushImage(s.registry, `e2e-features/plain-${id}:v1`, { 'hello.txt': `hello from a plain image ${id}\n` }),
    pushHelmChartOci(s.registry, fixturePath('podinfo', 'charts', 'podinfo'), `e2e-features-${id}/charts`),
    readFile(path.join(ASSETS, 'pgp.asc'), 'utf8'),
    readFile(path.join(ASSETS, 'pgp.sops.yml'), 'utf8'),
    readFile(path.join(ASSETS, 'age.txt'), 'utf8'),
    readFile(path.join(ASSETS, 'age.sops.yml'), 'utf8'),
    k(['version', '-o', 'json']),
  ]);
  imageDigest = image.digest;
  liveKubernetesVersion = (JSON.parse(version.stdout) as { serverVersion: { gitVersion: string } }).serverVersion
    .gitVersion;

  const root = await makeTempDir('basic-auth');
  const expected = `Basic ${Buffer.from(`${HTTP_USER}:${HTTP_PASSWORD}`).toString('base64')}`;
  authServer = await startLoopbackHttp('basic auth server', root, (req: http.IncomingMessage, res) => {
    authSeen.push(req.headers.authorization);
    if (req.headers.authorization !== expected) {
      res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="e2e"' }).end('401 unauthorized\n');
      return;
    }
    res
      .writeHead(200, { 'Content-Type': 'application/x-yaml' })
      .end(`${configMapYaml(`${N.httpAuth}-config`, { source: 'behind basic auth' })}\n`);
  });

  // Lets the ServiceAccount of NS.ns deploy into NS.target, and the one of NS.target (the
  // identity of the kubeconfig Secret) into NS.c and NS.kc (kapp-controller's e2e gives its SA a
  // cluster-wide role; here only these namespaces).
  const binding = (ns: string, from: string) => ({
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'RoleBinding',
    metadata: { name: `${SA}-from-${from}`, namespace: ns },
    subjects: [{ kind: 'ServiceAccount', name: SA, namespace: from }],
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: `${SA}-role` },
  });
  await apply(binding(NS.target, NS.ns), binding(NS.c, NS.target), binding(NS.kc, NS.target));
  const token = (await k(['create', 'token', SA, '-n', NS.target, '--duration=2h'])).stdout.trim();
  const kubeconfigFile = await writeTokenKubeconfig(
    kubeconfigPath,
    token,
    path.join(await makeTempDir('kubeconfig'), 'kubeconfig'),
  );
  const kubeconfig = parseYaml(await readFile(kubeconfigFile, 'utf8')) as {
    contexts: { context: Record<string, string> }[];
  };
  kubeconfig.contexts[0]!.context.namespace = NS.kc;
  await rm(kubeconfigFile);
  /** An App deploying through the kubeconfig Secret (no ServiceAccount): §3.8.3's cluster rows. */
  const clusterApp = (name: string, defaultNamespace?: string, clusterNamespace?: string) => {
    const app = appManifest(NS.ns, name, {
      ...(defaultNamespace ? { defaultNamespace } : {}),
      cluster: {
        ...(clusterNamespace ? { namespace: clusterNamespace } : {}),
        kubeconfigSecretRef: { name: 'same-cluster' },
      },
      fetch: [{ inline: { paths: { 'cm.yml': configMapYaml(`${name}-config`, { via: 'kubeconfig secret' }) } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }) as { spec: Record<string, unknown> };
    delete app.spec.serviceAccountName;
    return app;
  };

  const valuesApp = appManifest(NS.main, N.values, {
    fetch: [
      {
        inline: {
          paths: {
            'config.yml': yttConfigMap(`${N.values}-config`, { values: '#@ json.encode(data.values)' }, ['json']),
            'vals.yml': 'from_path: true\n',
          },
        },
      },
    ],
    template: [
      {
        ytt: {
          // vals.yml is a values file, not a template: excluded from the templates
          fileMarks: ['vals.yml:exclude=true'],
          valuesFrom: [
            { secretRef: { name: 'ytt-values-secret' } },
            { configMapRef: { name: 'ytt-values-cm' } },
            { path: 'vals.yml' },
            {
              downwardAPI: {
                items: [
                  { name: 'name', fieldPath: 'metadata.name' },
                  { name: 'namespace', fieldPath: '{.metadata.namespace}' },
                  { name: 'uid', fieldPath: '.metadata.uid' },
                  { name: 'label', fieldPath: "{metadata.labels['expectedLabel']}" },
                  { name: 'annotation', fieldPath: "metadata.annotations['expectedAnnotation']" },
                  { name: 'allLabels', fieldPath: 'metadata.labels' },
                  { name: 'nested.app.name', fieldPath: 'metadata.name' },
                  { name: 'dotted\\.key', fieldPath: 'metadata.name' },
                  { name: 'kubernetesVersion', kubernetesVersion: { version: '1.0.0' } },
                  { name: 'liveKubernetesVersion', kubernetesVersion: {} },
                  { name: 'kcVersion', kappControllerVersion: { version: '2.0.0' } },
                  { name: 'liveKcVersion', kappControllerVersion: {} },
                  { name: 'k8sAPIs', kubernetesAPIs: { groupVersions: ['test/test', 'test2/test2'] } },
                  { name: 'liveK8sAPIs', kubernetesAPIs: {} },
                ],
              },
            },
          ],
        },
      },
    ],
    deploy: [{ kapp: {} }],
  }) as { metadata: Record<string, unknown> };
  valuesApp.metadata.labels = { expectedLabel: APP_LABEL };
  valuesApp.metadata.annotations = { expectedAnnotation: APP_ANNOTATION };

  await apply(
    // sops
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'sops-pgp', namespace: NS.main },
      stringData: { 'my.pk': pgpKey },
    },
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'sops-age', namespace: NS.main },
      stringData: { 'key.txt': ageKey },
    },
    appManifest(NS.main, N.sops, {
      fetch: [{ inline: { paths: { 'pgp/cm.sops.yml': pgpFile, 'age/cm.sops.yml': ageFile } } }],
      template: [
        { sops: { pgp: { privateKeysSecretRef: { name: 'sops-pgp' } }, paths: ['pgp'] } },
        { sops: { age: { privateKeysSecretRef: { name: 'sops-age' } }, paths: ['age'] } },
        { ytt: {} },
      ],
      deploy: [{ kapp: {} }],
    }),
    // cue
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'cue-values', namespace: NS.main },
      data: { 'values.yml': 'greeting: from a ConfigMap\n' },
    },
    appManifest(NS.main, N.cue, {
      fetch: [
        {
          inline: {
            paths: {
              'app.cue': [
                'package app',
                'config: {',
                '  greeting: string',
                '  count:    int | *1',
                '  appName:  string',
                '}',
                'output: {',
                '  apiVersion: "v1"',
                '  kind:       "ConfigMap"',
                `  metadata: name: "${N.cue}-config"`,
                '  data: {',
                '    greeting: config.greeting',
                '    count:    "\\(config.count)"',
                '    appName:  config.appName',
                '  }',
                '}',
              ].join('\n'),
              // not in `paths`: cue never reads it (it does not parse)
              'broken.cue': 'this is { not cue\n',
              'values/extra.yml': 'count: 3\n',
            },
          },
        },
      ],
      template: [
        {
          cue: {
            paths: ['app.cue'],
            valuesFrom: [
              { configMapRef: { name: 'cue-values' } },
              { path: 'values/extra.yml' },
              { downwardAPI: { items: [{ name: 'appName', fieldPath: 'metadata.name' }] } },
            ],
            inputExpression: 'config:',
            outputExpression: 'output',
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    // §3.6 layouts
    appManifest(NS.main, N.layoutPath, {
      fetch: [{ inline: { paths: { 'file.csv': 'a,b\n' } }, path: 'foo' }],
      template: [{ ytt: { inline: { paths: { 'file.yml': listingTemplate(`${N.layoutPath}-files`) } } } }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS.main, N.layoutNoPath, {
      fetch: [{ inline: { paths: { 'file.csv': 'a,b\n' } } }],
      template: [{ ytt: { inline: { paths: { 'file.yml': listingTemplate(`${N.layoutNoPath}-files`) } } } }],
      deploy: [{ kapp: {} }],
    }),
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'layout-secret', namespace: NS.main },
      stringData: { 'token.txt': `from a secret ${id}` },
    },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'layout-cm', namespace: NS.main },
      data: { 'note.txt': `from a configmap ${id}`, 'excluded.txt': 'never listed' },
    },
    appManifest(NS.main, N.layoutMulti, {
      fetch: [
        { git: { url: gitRepo!.url, ref: 'origin/develop', subPath: 'config-step-2-template' }, path: 'git-dest' },
        { http: { url: zip!.url, subPath: 'k8s-simple-app-example-master/config-step-1-minimal' } },
        { image: { url: image.ref }, path: 'img' },
        {
          inline: {
            pathsFrom: [
              { secretRef: { name: 'layout-secret', directoryPath: 's' } },
              { configMapRef: { name: 'layout-cm' } },
            ],
          },
          path: 'refs',
        },
      ],
      template: [
        {
          ytt: {
            inline: {
              paths: {
                'file.yml': listingTemplate(`${N.layoutMulti}-files`, {
                  image: 'img/hello.txt',
                  secret: 'refs/s/token.txt',
                  configMap: 'refs/note.txt',
                }),
              },
            },
            // the fetched YAML is data here, not templates; one file is left out
            fileMarks: ['git-dest/**/*:type=data', '1/**/*:type=data', 'refs/excluded.txt:exclude=true'],
          },
        },
      ],
      deploy: [{ kapp: {} }],
    }),
    // ytt values and the downward API
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'ytt-values-secret', namespace: NS.main },
      stringData: { 'v.yml': 'from_secret: true\n' },
    },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'ytt-values-cm', namespace: NS.main },
      data: { 'v.yml': 'from_cm: true\n' },
    },
    valuesApp,
    // helm from an OCI registry
    appManifest(NS.main, N.helmOci, {
      fetch: [{ helmChart: { name: 'podinfo', version: '6.14.1', repository: { url: ociUrl } } }],
      template: [{ helmTemplate: {} }],
      deploy: [{ kapp: {} }],
    }),
    // http with basic auth
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'http-auth', namespace: NS.main },
      stringData: { username: HTTP_USER, password: HTTP_PASSWORD },
    },
    appManifest(NS.main, N.httpAuth, {
      fetch: [{ http: { url: `${authServer.baseUrl}/private/config.yml`, secretRef: { name: 'http-auth' } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
    // defaultNamespace and mapNs (resources in NS.target)
    appManifest(NS.ns, N.defaultNs, {
      defaultNamespace: NS.target,
      fetch: [
        { inline: { paths: { 'cm.yml': configMapYaml(`${N.defaultNs}-config`, { placed: 'by defaultNamespace' }) } } },
      ],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
    appManifest(NS.ns, N.mapNs, {
      fetch: [
        {
          inline: {
            paths: { 'cm.yml': configMapYaml(`${N.mapNs}-config`, { placed: 'by mapNs' }, 'mapped-from') },
          },
        },
      ],
      template: [{ ytt: {} }],
      deploy: [{ kapp: { mapNs: [`mapped-from=${NS.target}`] } }],
    }),
    // §3.8.3's cluster rows, against the same cluster
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'same-cluster', namespace: NS.ns },
      stringData: { value: stringifyYaml(kubeconfig) },
    },
    clusterApp(N.clusterXC, NS.target, NS.c),
    clusterApp(N.clusterC, undefined, NS.c),
    clusterApp(N.clusterX, NS.target),
    clusterApp(N.clusterNone),
    // noopDelete
    (() => {
      const app = inlineConfigMapApp(NS.main, N.noop, 'kept after delete') as { spec: Record<string, unknown> };
      app.spec.noopDelete = true;
      return app;
    })(),
  );
}, 120_000);

afterAll(async () => {
  await authServer?.stop();
});

/** Waits for the App's first finished reconcile and asserts the shared success shape. */
async function succeeded(ns: string, name: string): Promise<AppObject> {
  const app = await rt.waitReconciled(ns, name, 170_000);
  await expectSucceeded(app);
  return app;
}

describe('template steps (reference §2.1.3, §3.7)', () => {
  it('sops decrypts a PGP-encrypted and an age-encrypted file, each step scoped by paths', async () => {
    const app = await succeeded(NS.main, N.sops);
    expect(app.status?.template?.stderr ?? '').toBe('');
    expect((await getObject<ConfigMap>('configmap', NS.main, 'from-pgp'))?.data).toEqual({
      secret: 'decrypted with a pgp key',
    });
    expect((await getObject<ConfigMap>('configmap', NS.main, 'from-age'))?.data).toEqual({
      secret: 'decrypted with an age key',
    });
  });

  it('cue export: paths, valuesFrom (ConfigMap, path, downwardAPI), inputExpression, outputExpression', async () => {
    await succeeded(NS.main, N.cue);
    // later values files fill what earlier ones left open: greeting (ConfigMap), count (path,
    // overriding the default 1), appName (downward API); broken.cue was never read
    expect((await getObject<ConfigMap>('configmap', NS.main, `${N.cue}-config`))?.data).toEqual({
      greeting: 'from a ConfigMap',
      count: '3',
      appName: N.cue,
    });
  });

  it('ytt valuesFrom Secret, ConfigMap, path and every downwardAPI item; fileMarks exclude', async () => {
    const app = await succeeded(NS.main, N.values);
    const cm = await getObject<ConfigMap>('configmap', NS.main, `${N.values}-config`);
    const values = JSON.parse(cm?.data?.values ?? '{}') as Record<string, unknown>;
    const apis = values.liveK8sAPIs as string[];
    expect(apis).toEqual(expect.arrayContaining(['v1', 'apps/v1', 'kappctrl.k14s.io/v1alpha1']));
    expect(values).toEqual({
      from_secret: true,
      from_cm: true,
      from_path: true,
      name: N.values,
      namespace: NS.main,
      uid: app.metadata.uid,
      label: APP_LABEL,
      annotation: APP_ANNOTATION,
      allLabels: { expectedLabel: APP_LABEL },
      nested: { app: { name: N.values } },
      'dotted.key': N.values,
      kubernetesVersion: '1.0.0',
      // the live version without its `v` (pre-release and build stripped, as upstream)
      liveKubernetesVersion: liveKubernetesVersion.replace(/^v/, '').replace(/[-+].*$/, ''),
      kcVersion: '2.0.0',
      liveKcVersion: expect.stringMatching(/^\d+\.\d+\.\d+/),
      k8sAPIs: ['test/test', 'test2/test2'],
      liveK8sAPIs: apis,
    });
  });
});

describe('fetch layout (reference §3.6)', () => {
  it('one inline fetch with path foo: ytt sees ["file.yml", "foo/file.csv"]', async () => {
    await succeeded(NS.main, N.layoutPath);
    const cm = await getObject<ConfigMap>('configmap', NS.main, `${N.layoutPath}-files`);
    expect(JSON.parse(cm?.data?.files ?? 'null')).toEqual(['file.yml', 'foo/file.csv']);
  });

  it('one inline fetch without path: ytt sees ["file.csv", "file.yml"]', async () => {
    await succeeded(NS.main, N.layoutNoPath);
    const cm = await getObject<ConfigMap>('configmap', NS.main, `${N.layoutNoPath}-files`);
    expect(JSON.parse(cm?.data?.files ?? 'null')).toEqual(['file.csv', 'file.yml']);
  });

  it('git with path, http without path (index 1), a plain image and inline.pathsFrom (Secret directoryPath, ConfigMap)', async () => {
    const app = await succeeded(NS.main, N.layoutMulti);
    const cm = await getObject<ConfigMap>('configmap', NS.main, `${N.layoutMulti}-files`);
    // ytt's order, as upstream's table: the inline file.yml first, then the fetched files
    expect(JSON.parse(cm?.data?.files ?? 'null')).toEqual([
      'file.yml',
      '1/config.yml',
      'git-dest/config.yml',
      'git-dest/values.yml',
      'img/hello.txt',
      'refs/note.txt',
      'refs/s/token.txt',
    ]);
    expect(cm?.data?.image).toBe(`hello from a plain image ${id}\n`);
    expect(cm?.data?.secret).toBe(`from a secret ${id}`);
    expect(cm?.data?.configMap).toBe(`from a configmap ${id}`);
    // vendir's lock config names the image by digest
    expect(app.status?.fetch?.stdout).toContain(imageDigest);
  });
});

describe('sources (reference §2.1.2)', () => {
  it('helmChart from an oci:// repository renders and deploys the chart', async () => {
    const app = await succeeded(NS.main, N.helmOci);
    expect(app.status?.fetch?.stdout).toContain('helmChart:\n      appVersion: 6.14.1\n      version: 6.14.1');
    const dep = await getObject<{ metadata: { labels?: Record<string, string> } }>('deployment', NS.main, N.helmOci);
    expect(dep?.metadata.labels?.['app.kubernetes.io/version']).toBe('6.14.1');
  });

  it('http with a basic-auth secretRef: the server saw the credentials and the file deployed', async () => {
    await succeeded(NS.main, N.httpAuth);
    const expected = `Basic ${Buffer.from(`${HTTP_USER}:${HTTP_PASSWORD}`).toString('base64')}`;
    expect(authSeen).toContain(expected);
    expect((await getObject<ConfigMap>('configmap', NS.main, `${N.httpAuth}-config`))?.data).toEqual({
      source: 'behind basic auth',
    });
  });
});

describe('deploy namespaces and delete (reference §2.1.4, §3.8.3, §3.9)', () => {
  /**
   * The success shape of an App of NS.ns, plus: its ConfigMap `<name>-config` in `resources`
   * only, the kapp record `<name>.app` in `record` only.
   */
  async function expectDeployedTo(name: string, resources: string, record: string): Promise<void> {
    const app = await rt.waitReconciled(NS.ns, name, 170_000);
    const s = expectSucceededStatus(app, STATUS_KEYS);
    expect(s.deploy?.kapp?.associatedResources?.namespaces).toEqual([resources]);
    const all = [NS.ns, NS.target, NS.c, NS.kc];
    for (const ns of all) {
      const found = (await getObject('configmap', ns, `${name}.app`)) !== undefined;
      expect(found, `kapp app record ${name}.app in ${ns}`).toBe(ns === record);
    }
    for (const ns of all.filter((n) => n !== resources)) {
      expect(await getObject('configmap', ns, `${name}-config`), `${name}-config in ${ns}`).toBeUndefined();
    }
  }

  it('defaultNamespace with a ServiceAccount: resources in it, the kapp record in the App namespace', async () => {
    await expectDeployedTo(N.defaultNs, NS.target, NS.ns);
    expect((await getObject<ConfigMap>('configmap', NS.target, `${N.defaultNs}-config`))?.data).toEqual({
      placed: 'by defaultNamespace',
    });
  });

  it('mapNs moves a resource from its namespace into another', async () => {
    await expectDeployedTo(N.mapNs, NS.target, NS.ns);
    expect((await getObject<ConfigMap>('configmap', NS.target, `${N.mapNs}-config`))?.data).toEqual({
      placed: 'by mapNs',
    });
  });

  it.each([
    ['defaultNamespace X and cluster.namespace C: resources in X, kapp record in C', N.clusterXC, NS.target, NS.c],
    ['cluster.namespace C only: resources and kapp record in C', N.clusterC, NS.c, NS.c],
    ['defaultNamespace X only: resources in X, kapp record in the kubeconfig namespace', N.clusterX, NS.target, NS.kc],
    ['neither: resources and kapp record in the kubeconfig namespace', N.clusterNone, NS.kc, NS.kc],
  ])('kubeconfigSecretRef (same cluster), %s', async (_what, name, resources, record) => {
    await expectDeployedTo(name, resources, record);
    expect((await getObject<ConfigMap>('configmap', resources, `${name}-config`))?.data).toEqual({
      via: 'kubeconfig secret',
    });
  });

  it('noopDelete: the App goes away, its resources and kapp record stay', async () => {
    await succeeded(NS.main, N.noop);
    await k(['delete', 'apps.kappctrl.k14s.io', N.noop, '-n', NS.main, '--wait=false']);
    await waitFor(`App ${NS.main}/${N.noop} gone`, async () => ((await getApp(NS.main, N.noop)) ? undefined : true), {
      timeoutMs: 120_000,
      describe: async () => JSON.stringify((await getApp(NS.main, N.noop))?.status ?? null),
    });
    expect((await getObject<ConfigMap>('configmap', NS.main, `${N.noop}-config`))?.data).toEqual({
      greeting: 'kept after delete',
    });
    expect(await getObject('configmap', NS.main, `${N.noop}.app`)).toBeDefined();
  });
});

describe('paused (reference §3.10)', () => {
  it('an update with paused: true is not deployed (Canceled/paused); unpausing deploys it', async () => {
    const name = N.paused;
    const app = (greeting: string, paused: boolean) => {
      const a = inlineConfigMapApp(NS.main, name, greeting) as { spec: Record<string, unknown> };
      if (paused) a.spec.paused = true;
      return a;
    };
    await apply(app('before pause', false));
    const first = await succeeded(NS.main, name);
    expect(first.metadata.generation).toBe(1);

    await apply(app('while paused', true));
    const paused = await rt.waitForApp(
      NS.main,
      name,
      (a) => a.status?.observedGeneration === 2 && a.status?.friendlyDescription === 'Canceled/paused',
      'generation 2 observed as Canceled/paused',
    );
    // only observedGeneration and the friendly text change; the last reconcile's condition stays
    expect(paused.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect((await getObject<ConfigMap>('configmap', NS.main, `${name}-config`))?.data).toEqual({
      greeting: 'before pause',
    });

    await apply(app('while paused', false));
    const resumed = await rt.waitForApp(NS.main, name, succeededAt(3), 'generation 3 reconciled');
    await expectSucceeded(resumed);
    expect((await getObject<ConfigMap>('configmap', NS.main, `${name}-config`))?.data).toEqual({
      greeting: 'while paused',
    });
  });
});
