/**
 * e2e: `spec.cluster.kubeconfigSecretRef` deploying to a second cluster (reference §3.8.3, the
 * `cluster` path), through the whole flow (forwarder → fetch → template → deploy with the real
 * ytt, helm and kapp), with the status kapp-controller writes asserted:
 *
 * - an App on the shared (home) cluster with `cluster.namespace` C and `defaultNamespace` X
 *   deploys its ConfigMap into X of the second cluster, kapp's record into C there; nothing
 *   lands on the home cluster, although X and C exist there too;
 * - its ytt `downwardAPI` items `kubernetesVersion`, `kubernetesAPIs` and
 *   `kappControllerVersion` read the destination: the API groups are the second cluster's
 *   (its own CRD group, none of the home cluster's kapp-controller groups);
 * - a `helmTemplate` with `kubernetesVersion` and `kubernetesAPIs` gets the destination's
 *   version and group/versions (`.Capabilities`);
 * - deleting the App removes its objects and kapp's record from the second cluster;
 * - a kubeconfig Secret naming a server nobody listens on: kapp's own failure text; a missing
 *   Secret: upstream's `Preparing kapp: Getting kubeconfig secret: …`, and, for an App that
 *   reads the version, upstream's `Unable to get kubernetes version: …` in the template stage.
 *
 * The second cluster is a control plane of its own (the harness's `startCluster`, no Nodes),
 * started once for the file. Both run the same kube-apiserver build, so their versions are
 * equal; they differ in their API groups (the CRD installed only on the second one, the
 * kapp-controller CRDs only on the home one).
 *
 * - under the cloud mode's URL policy (a second runtime, `urlPolicy: enforce`), with the second
 *   API server in the allow-list as an operator would put it (`KAPP_LAMBDA_URL_ALLOW=host:port`,
 *   fleet setting `urlAllow`): the same App succeeds, kapp and the template stage's discovery
 *   calls going through the egress proxy; a server not allowed is refused in the template stage.
 *
 * The kubeconfig Secret holds the second cluster's admin kubeconfig under `value` (upstream's
 * default key), its server on loopback. The embedded runtime's default, as kapp-controller,
 * checks no URL (`KAPP_LAMBDA_URL_POLICY` unset), so nothing needs configuring for it; the cloud
 * functions enforce the policy by default, where loopback, link-local and private API servers
 * need an allow-list entry (`functions/lib/pipeline/app/kubeconfig-policy.ts`).
 */
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { type Cluster, startCluster } from '../harness/cluster.js';
import {
  type AppObject,
  apply,
  appManifest,
  type E2ECluster,
  type E2ERuntime,
  e2eCluster,
  expectFailed,
  expectSucceededStatus,
  failedAt,
  getApp,
  getObject,
  k,
  SEE_USEFUL,
  STATUS_KEYS,
  startRuntime,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
  yttConfigMap,
} from './support.js';

const id = suffix();
const NS = {
  /** The Apps and their kubeconfig Secrets (home cluster). */
  app: `e2e-c2-${id}`,
  /** `defaultNamespace`: where the resources land (second cluster; a decoy of the same name at home). */
  x: `e2e-c2-x-${id}`,
  /** `cluster.namespace`: where kapp keeps its record (second cluster; a decoy at home). */
  c: `e2e-c2-c-${id}`,
  /** Apps of the runtime with the URL policy enforced (home cluster). */
  policed: `e2e-c2-policed-${id}`,
};
const N = {
  deploy: `deploy-${id}`,
  helm: `helm-${id}`,
  unreachable: `unreachable-${id}`,
  missing: `missing-${id}`,
  missingVersion: `missing-version-${id}`,
  policed: `policed-${id}`,
  refused: `refused-${id}`,
};
const SECRET = { second: 'second-cluster', unreachable: 'unreachable-cluster', missing: 'no-such-secret' };
/** The API group served by the second cluster only (its CRD). */
const SECOND_GROUP = `c2-${id}.e2e.kapp-lambda.dev`;
const SECOND_GV = `${SECOND_GROUP}/v1`;
/** A group only the home cluster serves (the kapp-controller CRDs). */
const HOME_GV = 'kappctrl.k14s.io/v1alpha1';

interface ConfigMap {
  metadata: { name: string; namespace?: string };
  data?: Record<string, string>;
}

let second: Cluster | undefined;
let remote: E2ECluster;
/** `major.minor.patch` of the second cluster, as `/version` reports it (pre-release and build stripped). */
let remoteVersion = '';
/** The second cluster's group/versions as kubectl lists them. */
let remoteApis: string[] = [];
/** A loopback port nothing listens on. */
let closedPort = 0;

beforeAll(async () => {
  second = await startCluster({ nodes: 0, log: (m) => process.stderr.write(`[second-cluster] ${m}\n`) });
  remote = e2eCluster(second.kubeconfigPath);
}, 180_000);
afterAll(async () => {
  await second?.stop();
});

const rt = useE2ERuntime([NS.app], { tenants: [NS.x, NS.c, NS.policed] });
/** A second runtime, on {@link NS.policed}, with the cloud mode's URL policy enforced. */
let policedRt: E2ERuntime | undefined;
afterAll(async () => {
  await policedRt?.dispose();
});

/** An App of `ns` (default {@link NS.app}) deploying through the kubeconfig Secret `secret` (no ServiceAccount). */
function clusterApp(name: string, secret: string, spec: Record<string, unknown>, ns: string = NS.app): object {
  const app = appManifest(ns, name, {
    defaultNamespace: NS.x,
    cluster: { namespace: NS.c, kubeconfigSecretRef: { name: secret } },
    deploy: [{ kapp: {} }],
    ...spec,
  }) as { spec: Record<string, unknown> };
  delete app.spec.serviceAccountName;
  return app;
}

/** ytt renders a ConfigMap `<name>-config` holding its data values as JSON in `values`. */
function valuesConfigMapFetch(name: string): object[] {
  const template = yttConfigMap(`${name}-config`, { values: '#@ json.encode(data.values)' }, ['json']);
  return [{ inline: { paths: { 'config.yml': template } } }];
}

/** A helm chart whose ConfigMap shows what helm was told of the cluster. */
function capabilitiesChartFetch(name: string): object[] {
  const cm = [
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    `  name: ${name}-config`,
    'data:',
    '  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}',
    `  hasSecondGroup: {{ .Capabilities.APIVersions.Has ${JSON.stringify(SECOND_GV)} | quote }}`,
  ].join('\n');
  return [
    {
      inline: {
        paths: {
          'Chart.yaml': `apiVersion: v2\nname: capabilities\nversion: 0.1.0\n`,
          'templates/cm.yaml': cm,
        },
      },
    },
  ];
}

/** A loopback port that was free a moment ago and is closed now. */
async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen({ port: 0, host: '127.0.0.1' }, () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

beforeAll(async () => {
  if (!second) throw new Error('the second cluster did not start');
  const kubeconfig = await readFile(second.kubeconfigPath, 'utf8');
  closedPort = await freePort();
  const unreachable = parseYaml(kubeconfig) as { clusters: { cluster: { server: string } }[] };
  unreachable.clusters[0]!.cluster.server = `https://127.0.0.1:${closedPort}`;

  await remote.apply(
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS.x } },
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS.c } },
    {
      apiVersion: 'apiextensions.k8s.io/v1',
      kind: 'CustomResourceDefinition',
      metadata: { name: `widgets.${SECOND_GROUP}` },
      spec: {
        group: SECOND_GROUP,
        scope: 'Namespaced',
        names: { plural: 'widgets', singular: 'widget', kind: 'Widget', listKind: 'WidgetList' },
        versions: [
          {
            name: 'v1',
            served: true,
            storage: true,
            schema: { openAPIV3Schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } },
          },
        ],
      },
    },
  );
  // As an operator would: the second cluster's API server is an exception to the policy.
  policedRt = await startRuntime([NS.policed], {
    config: { urlPolicy: { mode: 'enforce', allow: [new URL(second.server).host] } },
  });
  await remote.k(['wait', '--for=condition=Established', '--timeout=60s', `crd/widgets.${SECOND_GROUP}`]);
  // Discovery serves a new group a moment after the CRD is Established.
  remoteApis = await waitFor('the second cluster serving its CRD group', async () => {
    const lines = (await remote.k(['api-versions'])).stdout.split('\n').filter(Boolean);
    return lines.includes(SECOND_GV) ? lines : undefined;
  });
  const version = JSON.parse((await remote.k(['version', '-o', 'json'])).stdout) as {
    serverVersion: { gitVersion: string };
  };
  remoteVersion = version.serverVersion.gitVersion.replace(/^v/, '').replace(/[-+].*$/, '');

  const secret = (name: string, value: string, namespace: string = NS.app) => ({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name, namespace },
    stringData: { value },
  });
  const versionAndApis = {
    ytt: {
      valuesFrom: [
        {
          downwardAPI: {
            items: [
              { name: 'kubernetesVersion', kubernetesVersion: {} },
              { name: 'kubernetesAPIs', kubernetesAPIs: {} },
            ],
          },
        },
      ],
    },
  };
  await apply(
    secret(SECRET.second, kubeconfig),
    secret(SECRET.unreachable, stringifyYaml(unreachable)),
    secret(SECRET.second, kubeconfig, NS.policed),
    secret(SECRET.unreachable, stringifyYaml(unreachable), NS.policed),
    clusterApp(
      N.policed,
      SECRET.second,
      { fetch: valuesConfigMapFetch(N.policed), template: [versionAndApis] },
      NS.policed,
    ),
    clusterApp(
      N.refused,
      SECRET.unreachable,
      { fetch: valuesConfigMapFetch(N.refused), template: [versionAndApis] },
      NS.policed,
    ),
    clusterApp(N.deploy, SECRET.second, {
      fetch: valuesConfigMapFetch(N.deploy),
      template: [
        {
          ytt: {
            valuesFrom: [
              {
                downwardAPI: {
                  items: [
                    { name: 'name', fieldPath: 'metadata.name' },
                    { name: 'kubernetesVersion', kubernetesVersion: {} },
                    { name: 'kubernetesAPIs', kubernetesAPIs: {} },
                    { name: 'kappControllerVersion', kappControllerVersion: {} },
                  ],
                },
              },
            ],
          },
        },
      ],
    }),
    clusterApp(N.helm, SECRET.second, {
      fetch: capabilitiesChartFetch(N.helm),
      template: [{ helmTemplate: { kubernetesVersion: {}, kubernetesAPIs: {} } }],
    }),
    clusterApp(N.unreachable, SECRET.unreachable, {
      fetch: valuesConfigMapFetch(N.unreachable),
      template: [{ ytt: {} }],
    }),
    clusterApp(N.missing, SECRET.missing, {
      fetch: valuesConfigMapFetch(N.missing),
      template: [{ ytt: {} }],
    }),
    clusterApp(N.missingVersion, SECRET.missing, {
      fetch: valuesConfigMapFetch(N.missingVersion),
      template: [{ ytt: { valuesFrom: [{ downwardAPI: { items: [{ name: 'v', kubernetesVersion: {} }] } }] } }],
    }),
  );
}, 120_000);

/** Waits for the App's first reconcile to succeed and checks the status shape of a success. */
async function succeeded(name: string, runtime: E2ERuntime = rt, ns: string = NS.app): Promise<AppObject> {
  const app = await runtime.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded');
  const s = expectSucceededStatus(app, STATUS_KEYS);
  expect(s.inspect).toBeUndefined();
  expect(s.deploy?.kapp?.associatedResources?.label).toMatch(/^kapp\.k14s\.io\/app=\d+$/);
  // The resources went to defaultNamespace on the second cluster.
  expect(s.deploy?.kapp?.associatedResources?.namespaces).toEqual([NS.x]);
  return app;
}

/** Asserts where the App's ConfigMap and kapp's record are: in X and C of the second cluster only. */
async function expectOnSecondOnly(name: string): Promise<ConfigMap> {
  const cm = await remote.getObject<ConfigMap>('configmap', NS.x, `${name}-config`);
  expect(cm, `${name}-config in ${NS.x} of the second cluster`).toBeDefined();
  const record = await remote.getObject<{ data?: { spec?: string } }>('configmap', NS.c, `${name}.app`);
  expect(record, `kapp record ${name}.app in ${NS.c} of the second cluster`).toBeDefined();
  for (const ns of [NS.app, NS.policed, NS.x, NS.c]) {
    expect(await getObject('configmap', ns, `${name}-config`), `${name}-config at home in ${ns}`).toBeUndefined();
    expect(await getObject('configmap', ns, `${name}.app`), `${name}.app at home in ${ns}`).toBeUndefined();
  }
  expect(await remote.getObject('configmap', NS.c, `${name}-config`)).toBeUndefined();
  return cm!;
}

describe('cluster.kubeconfigSecretRef to a second cluster (reference §3.8.3)', () => {
  it('deploys into defaultNamespace of the second cluster, kapp record in cluster.namespace there; the downward API reads the destination', async () => {
    await succeeded(N.deploy);
    const cm = await expectOnSecondOnly(N.deploy);
    const values = JSON.parse(cm.data?.values ?? '{}') as Record<string, unknown>;
    expect(values).toEqual({
      name: N.deploy,
      kubernetesVersion: remoteVersion,
      kubernetesAPIs: expect.any(Array),
      kappControllerVersion: expect.stringMatching(/^\d+\.\d+\.\d+/),
    });
    const apis = values.kubernetesAPIs as string[];
    // The second cluster's group/versions (discovery order; kubectl sorts them), not the home cluster's.
    expect([...apis].sort()).toEqual([...remoteApis].sort());
    expect(apis).toContain(SECOND_GV);
    expect(apis).not.toContain(HOME_GV);
  });

  it("helmTemplate's kubernetesVersion and kubernetesAPIs come from the second cluster", async () => {
    await succeeded(N.helm);
    const cm = await expectOnSecondOnly(N.helm);
    expect(cm.data).toEqual({ kubeVersion: `v${remoteVersion}`, hasSecondGroup: 'true' });
  });

  it('deleting the App removes its objects and kapp record from the second cluster', async () => {
    await succeeded(N.deploy);
    await k(['delete', 'apps.kappctrl.k14s.io', N.deploy, '-n', NS.app, '--wait=false']);
    await waitFor(`App ${NS.app}/${N.deploy} gone`, async () => ((await getApp(NS.app, N.deploy)) ? undefined : true), {
      timeoutMs: 120_000,
      describe: async () => JSON.stringify((await getApp(NS.app, N.deploy))?.status ?? null),
    });
    expect(await remote.getObject('configmap', NS.x, `${N.deploy}-config`)).toBeUndefined();
    expect(await remote.getObject('configmap', NS.c, `${N.deploy}.app`)).toBeUndefined();
    const deletes = rt.stageRuns(NS.app, N.deploy).filter((r) => r.stage === 'delete');
    expect(deletes.at(-1)?.outcome).toBe('deleted');
  });

  it("a kubeconfig Secret naming a server nobody listens on: kapp's failure, ReconcileFailed", async () => {
    const app = await rt.waitForApp(NS.app, N.unreachable, failedAt(1), 'ReconcileFailed');
    const message = `Deploying: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    // kapp's own text (the real kapp runs, as upstream's): client-go's dial error for the
    // first request, the GET of kapp's app record in cluster.namespace.
    expect(s.usefulErrorMessage).toBe(
      `kapp: Error: Getting app:\n  Get "https://127.0.0.1:${closedPort}/api/v1/namespaces/${NS.c}/configmaps/${N.unreachable}.app.apps.k14s.io": dial tcp 127.0.0.1:${closedPort}: connect: connection refused`,
    );
    expect(s.deploy?.exitCode).toBe(1);
    expect(s.deploy?.finished).toBe(true);
    expect(s.deploy?.error).toBe(message);
    expect(s.deploy?.stderr).toBe(s.usefulErrorMessage);
  });

  it("a missing kubeconfig Secret: upstream's Preparing kapp text", async () => {
    const app = await rt.waitForApp(NS.app, N.missing, failedAt(1), 'ReconcileFailed');
    const message = `Preparing kapp: Getting kubeconfig secret: secrets "${SECRET.missing}" not found`;
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
  });

  it("a missing kubeconfig Secret with a version lookup: upstream's Unable to get kubernetes version text", async () => {
    const app = await rt.waitForApp(NS.app, N.missingVersion, failedAt(1), 'ReconcileFailed');
    const message = `Preparing template values: Unable to get kubernetes version: Getting kubeconfig secret: secrets "${SECRET.missing}" not found`;
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
  });
});

describe('the same under the URL policy (cloud mode), the second API server allowed', () => {
  it("kapp and the template stage's discovery reach the allowed server through the egress proxy", async () => {
    await succeeded(N.policed, policedRt!, NS.policed);
    const cm = await expectOnSecondOnly(N.policed);
    const values = JSON.parse(cm.data?.values ?? '{}') as { kubernetesVersion?: string; kubernetesAPIs?: string[] };
    expect(values.kubernetesVersion).toBe(remoteVersion);
    expect([...(values.kubernetesAPIs ?? [])].sort()).toEqual([...remoteApis].sort());
  });

  it('a kubeconfig Secret naming a server not allowed: refused in the template stage, before any tool', async () => {
    const app = await policedRt!.waitForApp(NS.policed, N.refused, failedAt(1), 'ReconcileFailed');
    const refused = `URL policy refused kubeconfig clusters[0].cluster.server https://127.0.0.1:${closedPort}: 127.0.0.1, a loopback address, which this deployment does not allow`;
    const message = `Preparing template values: Unable to get kubernetes version: ${refused}`;
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.deploy).toBeUndefined();
  });
});
