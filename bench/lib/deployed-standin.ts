/**
 * A stand-in in front of a kube-apiserver for the forwarder-memory scenario: it serves the
 * label-selected metadata-only lists and watches of what Apps deployed (the forwarder's drift
 * watches, `events/forwarder/drift.ts`) from a generator, and passes every other request
 * through to the real API server unchanged.
 *
 * Why: 10,000 Apps that deployed 20 objects each are 200,000 objects; writing them through
 * the API server here (~150 writes/s on a shared 2-core machine) would take over 20 minutes per
 * run. The forwarder only ever reads them as `PartialObjectMetadataList` pages, so the stand-in
 * sends the bytes a kube-apiserver would for kapp-deployed objects: `metadata` with `uid`,
 * `resourceVersion`, kapp's labels (`kapp.k14s.io/app`, `kapp.k14s.io/association`) and
 * annotations (`kapp.k14s.io/identity`, `kapp.k14s.io/original` holding the applied object,
 * `kapp.k14s.io/original-diff-md5`) and `managedFields` (kapp's apply; for Deployments also
 * kube-controller-manager's revision annotation and status), no `ownerReferences`. Watches of
 * those lists stay open with a bookmark every 10 s until their `timeoutSeconds`.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { plainConnectionOf } from '../../functions/lib/kube/kubeconfig-auth.js';

/** One deployed kind served by the stand-in, and how many objects of it each App has. */
export interface StandInKind {
  group: string;
  version: string;
  /** Plural resource name, as in the REST path. */
  resource: string;
  kind: string;
  perApp: number;
}

/**
 * What each App deployed: 20 objects over four kinds in three API groups, half in the App's
 * namespace and half in a shared workload namespace ({@link workloadNamespace}).
 */
export const STANDIN_KINDS: readonly StandInKind[] = [
  { group: '', version: 'v1', resource: 'configmaps', kind: 'ConfigMap', perApp: 8 },
  { group: '', version: 'v1', resource: 'services', kind: 'Service', perApp: 4 },
  { group: 'apps', version: 'v1', resource: 'deployments', kind: 'Deployment', perApp: 4 },
  { group: 'rbac.authorization.k8s.io', version: 'v1', resource: 'rolebindings', kind: 'RoleBinding', perApp: 4 },
];

/** Where an App's odd-numbered objects go: one of five shared namespaces. */
export function workloadNamespace(app: number): string {
  return `mem-wl-${app % 5}`;
}

/** kapp's app label value of App `app` (what its `associatedResources.label` names). */
export function appLabel(app: number): string {
  return `17${String(app).padStart(17, '0')}`;
}

/** When the deployed objects were written: long before any App's last reconcile (no drift). */
const WRITTEN_AT = '2026-01-01T00:00:00Z';
const RESOURCE_VERSION = '1000';

/** A running stand-in. */
export interface DeployedStandIn {
  /** kubeconfig for the child: {@link url}, no credentials, context `context`. */
  kubeconfigPath: string;
  /** `http://127.0.0.1:<port>`. */
  url: string;
  /** Apps whose deployed objects are served (App `i` for `i < apps`). */
  apps: number;
  /** Requests served: generated list pages, watches, and passed through. */
  readonly served: { pages: number; watches: number; passed: number };
  close(): Promise<void>;
}

function hex(s: string): string {
  return createHash('md5').update(s).digest('hex');
}

function metadataOf(k: StandInKind, app: number, j: number, appNs: string): Record<string, unknown> {
  const apiVersion = k.group ? `${k.group}/${k.version}` : k.version;
  const namespace = j % 2 === 0 ? appNs : workloadNamespace(app);
  const name = `app-${String(app).padStart(5, '0')}-${k.kind.toLowerCase()}-${j}`;
  const label = appLabel(app);
  const association = `v1.${hex(`${namespace}/${k.kind}/${name}`)}`;
  const labels = { 'kapp.k14s.io/app': label, 'kapp.k14s.io/association': association, app: name.slice(0, 9) };
  const spec =
    k.kind === 'Deployment'
      ? {
          replicas: 2,
          selector: { matchLabels: { app: name } },
          template: {
            metadata: { labels: { app: name } },
            spec: {
              containers: [{ name: 'app', image: `registry.example/app:${app}`, ports: [{ containerPort: 8080 }] }],
            },
          },
        }
      : k.kind === 'Service'
        ? { selector: { app: name }, ports: [{ port: 80, targetPort: 8080 }] }
        : k.kind === 'RoleBinding'
          ? undefined
          : undefined;
  const original = {
    apiVersion,
    kind: k.kind,
    metadata: { name, namespace, labels },
    ...(spec ? { spec } : {}),
    ...(k.kind === 'ConfigMap' ? { data: { 'app.yml': `image: registry.example/app:${app}\nreplicas: 2\n` } } : {}),
    ...(k.kind === 'RoleBinding'
      ? {
          roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'app' },
          subjects: [{ kind: 'ServiceAccount', name: 'app', namespace }],
        }
      : {}),
  };
  const originalJson = JSON.stringify(original);
  const fieldsMeta = {
    'f:annotations': {
      '.': {},
      'f:kapp.k14s.io/identity': {},
      'f:kapp.k14s.io/original': {},
      'f:kapp.k14s.io/original-diff-md5': {},
    },
    'f:labels': { '.': {}, 'f:app': {}, 'f:kapp.k14s.io/app': {}, 'f:kapp.k14s.io/association': {} },
  };
  const body =
    k.kind === 'ConfigMap'
      ? { 'f:data': { '.': {}, 'f:app.yml': {} } }
      : k.kind === 'RoleBinding'
        ? { 'f:roleRef': {}, 'f:subjects': {} }
        : {
            'f:spec': {
              'f:selector': {},
              'f:ports': {},
              ...(k.kind === 'Deployment' ? { 'f:replicas': {}, 'f:template': {} } : {}),
            },
          };
  const managedFields: Record<string, unknown>[] = [
    {
      manager: 'kapp',
      operation: 'Update',
      apiVersion,
      time: WRITTEN_AT,
      fieldsType: 'FieldsV1',
      fieldsV1: { 'f:metadata': fieldsMeta, ...body },
    },
  ];
  if (k.kind === 'Deployment') {
    managedFields.push(
      {
        manager: 'kube-controller-manager',
        operation: 'Update',
        apiVersion,
        time: WRITTEN_AT,
        fieldsType: 'FieldsV1',
        fieldsV1: { 'f:metadata': { 'f:annotations': { 'f:deployment.kubernetes.io/revision': {} } } },
      },
      {
        manager: 'kube-controller-manager',
        operation: 'Update',
        apiVersion,
        time: WRITTEN_AT,
        fieldsType: 'FieldsV1',
        fieldsV1: {
          'f:status': {
            'f:availableReplicas': {},
            'f:conditions': {},
            'f:observedGeneration': {},
            'f:readyReplicas': {},
            'f:replicas': {},
            'f:updatedReplicas': {},
          },
        },
        subresource: 'status',
      },
    );
  }
  return {
    name,
    namespace,
    uid: hex(`${namespace}/${name}`).replace(/^(.{8})(.{4})(.{4})(.{4})(.{12})$/, '$1-$2-$3-$4-$5'),
    resourceVersion: String(1000 + app),
    ...(k.kind === 'Deployment' ? { generation: 1 } : {}),
    creationTimestamp: WRITTEN_AT,
    labels,
    annotations: {
      ...(k.kind === 'Deployment' ? { 'deployment.kubernetes.io/revision': '1' } : {}),
      'kapp.k14s.io/identity': `v1;${namespace}/${k.group}/${k.kind}/${name};${apiVersion}`,
      'kapp.k14s.io/original': originalJson,
      'kapp.k14s.io/original-diff-md5': hex(originalJson),
    },
    managedFields,
  };
}

/** `{kind index, namespace}` when `pathname` is a collection of a {@link STANDIN_KINDS} kind. */
function kindOf(pathname: string): { k: StandInKind; namespace?: string } | undefined {
  const m = /^\/(?:api\/(v1)|apis\/([^/]+)\/([^/]+))(?:\/namespaces\/([^/]+))?\/([^/]+)$/.exec(pathname);
  if (!m) return undefined;
  const group = m[1] ? '' : m[2]!;
  const version = m[1] ?? m[3]!;
  const k = STANDIN_KINDS.find((x) => x.group === group && x.version === version && x.resource === m[5]);
  return k ? { k, ...(m[4] ? { namespace: m[4] } : {}) } : undefined;
}

/**
 * Starts the stand-in on 127.0.0.1 (a free port) in front of `context` of `kubeconfigPath`, and
 * writes a kubeconfig for it to `childKubeconfigPath` (context `context`).
 *
 * @param appNamespace - The namespace of App `i` (its even-numbered objects go there).
 * @throws Error when the upstream context cannot be loaded.
 */
export async function startDeployedStandIn(opts: {
  kubeconfigPath: string;
  context: string;
  childKubeconfigPath: string;
  appNamespace: (app: number) => string;
}): Promise<DeployedStandIn> {
  const plain = await plainConnectionOf(opts.kubeconfigPath, opts.context);
  if ('unsupported' in plain) throw new Error(`stand-in: upstream context needs ${plain.unsupported}`);
  const up = new URL(plain.connection.server);
  const agent = new https.Agent({
    keepAlive: true,
    ...(plain.connection.ca ? { ca: plain.connection.ca } : {}),
    ...(plain.connection.cert ? { cert: plain.connection.cert } : {}),
    ...(plain.connection.key ? { key: plain.connection.key } : {}),
  });
  const served = { pages: 0, watches: 0, passed: 0 };
  const state = { apps: 0 };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://standin');
    const target = kindOf(url.pathname);
    const selector = url.searchParams.get('labelSelector') ?? '';
    if (req.method === 'GET' && target && selector.split(',').includes('kapp.k14s.io/app')) {
      const watch = url.searchParams.get('watch');
      if (watch === 'true' || watch === '1') {
        served.watches++;
        res.writeHead(200, { 'content-type': 'application/json' });
        const bookmark = () =>
          res.write(
            `${JSON.stringify({ type: 'BOOKMARK', object: { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: { resourceVersion: RESOURCE_VERSION } } })}\n`,
          );
        const tick = setInterval(bookmark, 10_000);
        const end = setTimeout(() => res.end(), Number(url.searchParams.get('timeoutSeconds') ?? 300) * 1000);
        res.on('close', () => {
          clearInterval(tick);
          clearTimeout(end);
        });
        return;
      }
      served.pages++;
      const { k, namespace } = target;
      const total = state.apps * k.perApp;
      const limit = Number(url.searchParams.get('limit') ?? total) || total;
      const from = Number(url.searchParams.get('continue') ?? 0);
      const items: unknown[] = [];
      let i = from;
      for (; i < total && items.length < limit; i++) {
        const app = Math.floor(i / k.perApp);
        const md = metadataOf(k, app, i % k.perApp, opts.appNamespace(app));
        if (namespace === undefined || md.namespace === namespace) items.push({ metadata: md });
      }
      const body = {
        kind: 'PartialObjectMetadataList',
        apiVersion: 'meta.k8s.io/v1',
        metadata: { resourceVersion: RESOURCE_VERSION, ...(i < total ? { continue: String(i) } : {}) },
        items,
      };
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
      return;
    }
    served.passed++;
    const headers = { ...req.headers, host: up.host };
    const upReq = https.request(
      { protocol: 'https:', hostname: up.hostname, port: up.port, method: req.method, path: req.url, headers, agent },
      (upRes) => {
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        upRes.pipe(res);
      },
    );
    upReq.on('error', () => res.destroy());
    res.on('close', () => upReq.destroy());
    req.pipe(upReq);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  await writeFile(
    opts.childKubeconfigPath,
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'standin', cluster: { server: `http://127.0.0.1:${port}` } }],
      users: [{ name: 'standin', user: {} }],
      contexts: [{ name: opts.context, context: { cluster: 'standin', user: 'standin' } }],
      'current-context': opts.context,
    }),
    { mode: 0o600 },
  );
  return {
    kubeconfigPath: opts.childKubeconfigPath,
    url: `http://127.0.0.1:${port}`,
    get apps() {
      return state.apps;
    },
    set apps(n: number) {
      state.apps = n;
    },
    served,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      agent.destroy();
    },
  };
}
