/**
 * Shared pieces of the e2e tests (whole flow: forwarder → fetch → template → deploy against
 * the shared local control plane, the fixture servers and the real Carvel tools): applying the
 * CRDs, a tenant namespace with its ServiceAccount, an embedded runtime per test file with an
 * in-memory log ({@link useE2ERuntime}), App manifests, polling with timeouts, and the exact
 * status shapes kapp-controller writes (reference §2.1.5, §3.4, §3.5).
 *
 * The e2e and integration files run in parallel against one control plane: each file uses its
 * own random namespaces, and its runtimes watch only those (so their Leases, named by the
 * namespaces watched, differ from other files'). A file that must disturb the control plane
 * itself starts its own ({@link e2eCluster} binds these helpers to it).
 *
 * Not a test file (vitest only collects `*.test.ts`).
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ApiException, CustomObjectsApi } from '@kubernetes/client-node';
import { afterAll, beforeAll, expect, inject } from 'vitest';
import { type KappEvent, objectEvent } from '../../events/schema.js';
import { type EmbeddedOptions, type EmbeddedRuntime, startEmbedded } from '../../functions/embedded/runtime.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { PKGR_KAPP_RBAC_FILE } from '../../scripts/local-env.js';
import { type KubectlResult, kubectl, loadKubeConfig, tenantManifests } from '../harness/kube.js';
import type { ServersInfo } from '../harness/servers.js';

/** Admin kubeconfig of the shared cluster (never log its contents). */
export const kubeconfigPath = inject('kubeconfigPath');

/** The fixture servers started by the global setup. */
export function servers(): ServersInfo {
  const s = inject('servers');
  if (!s) throw new Error('e2e tests need the fixture servers (test/harness/servers.ts)');
  return s as unknown as ServersInfo;
}

/** kapp-controller's App finalizer (`pkg/app/finalizer.go`). */
export const APP_FINALIZER = 'finalizers.kapp-ctrl.k14s.io/delete';

/** `AttachErrorf`'s text for a tool that exited with `exit status 1`. */
export const SEE_USEFUL = 'Error (see .status.usefulErrorMessage for details)';

/** `metav1.Time` as serialized: RFC 3339, UTC, whole seconds. */
export const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/;

/** The ServiceAccount every tenant namespace gets (namespace-scoped all-verbs Role). */
export const SA = 'e2e-sa';

/** A short random suffix for namespace and App names. */
export function suffix(): string {
  return randomBytes(3).toString('hex');
}

/**
 * What the e2e tests do to one cluster: kubectl (argv only), CRDs, tenants and reads of Apps
 * and other objects. {@link shared} is the shared cluster of the global setup (and the plain
 * exports below are its members); {@link e2eCluster} binds the same helpers to another cluster,
 * for a test that must not disturb the other files (one that pauses its API server).
 */
export interface E2ECluster {
  /** Admin kubeconfig (never log its contents). */
  readonly kubeconfigPath: string;
  /** Runs the local kubectl against the cluster (argv only). */
  k(args: string[], input?: string, check?: boolean): Promise<KubectlResult>;
  /**
   * Applies `infra/crds/crds.yaml` server-side (idempotent; `--force-conflicts` because other
   * test files apply the same CRDs client-side) and waits until they are established. Also
   * creates the `kapp-lambda` namespace, where the runtimes' leader-election Leases live, and
   * applies `infra/rbac/package-repository-kapp.yml` there (the ServiceAccount
   * `kapp-lambda-pkgr` a PackageRepository's kapp runs as, and its RBAC). Once per cluster and
   * test worker: the files of a worker share this module (no isolation), and no file deletes
   * these objects from a cluster it shares (a file that does runs its own control plane).
   */
  applyCrds(): Promise<void>;
  /**
   * Creates a namespace with the ServiceAccount {@link SA} bound to a namespace-scoped Role
   * allowing every verb on every resource (kapp-controller `examples/rbac/default-ns.yml`).
   */
  createTenant(ns: string): Promise<void>;
  /** Applies any objects (JSON documents in one List). */
  apply(...objects: object[]): Promise<void>;
  /**
   * Reads an App; `undefined` when it does not exist. An in-process GET, not a kubectl run:
   * the waits poll Apps every 500 ms, many at once across files, and each kubectl run costs
   * about 0.1 s of CPU (process start, TLS, discovery cache).
   */
  getApp(ns: string, name: string): Promise<AppObject | undefined>;
  /** Reads any namespaced object as JSON (kubectl); `undefined` when it does not exist. */
  getObject<T = Record<string, unknown>>(kind: string, ns: string, name: string): Promise<T | undefined>;
  /** Deletes test namespaces without waiting (the cluster is torn down after the run). */
  deleteNamespaces(namespaces: string[]): Promise<void>;
}

const APP_RESOURCE = { group: 'kappctrl.k14s.io', version: 'v1alpha1', plural: 'apps' } as const;

/** The e2e helpers bound to the cluster of `kubeconfig` (see {@link E2ECluster}). */
export function e2eCluster(kubeconfig: string): E2ECluster {
  const k = async (args: string[], input?: string, check = true) => await kubectl(kubeconfig, args, { input, check });
  // Files run in parallel and share some objects (the `kapp-lambda` namespace, the CRDs): two
  // applies can both find one missing and create it; the loser gets AlreadyExists (or a
  // conflict) although the object is there. Applying again then updates it.
  const applyWith = async (args: string[], input?: string) => {
    for (let attempt = 1; ; attempt++) {
      const r = await k(args, input, attempt >= 3);
      if (r.code === 0) return;
      if (!/AlreadyExists|Conflict|the object has been modified/.test(r.stderr)) {
        throw new Error(`kubectl ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
      }
    }
  };
  const apply = async (...objects: object[]) => {
    await applyWith(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
  };
  let apps: CustomObjectsApi | undefined;
  let crdsApplied: Promise<void> | undefined;
  return {
    kubeconfigPath: kubeconfig,
    k,
    apply,
    applyCrds() {
      crdsApplied ??= (async () => {
        const file = fileURLToPath(new URL('../../infra/crds/crds.yaml', import.meta.url));
        await applyWith(['apply', '--server-side', '--force-conflicts', '--field-manager=kapp-lambda-e2e', '-f', file]);
        await apply({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'kapp-lambda' } });
        // The identity a PackageRepository's kapp runs as (kapp-lambda/kapp-lambda-pkgr).
        await applyWith(['apply', '-f', fileURLToPath(new URL(`../../${PKGR_KAPP_RBAC_FILE}`, import.meta.url))]);
        await k([
          'wait',
          '--for=condition=Established',
          '--timeout=60s',
          'crd/apps.kappctrl.k14s.io',
          'crd/packageinstalls.packaging.carvel.dev',
          'crd/packagerepositories.packaging.carvel.dev',
          'crd/packages.data.packaging.carvel.dev',
          'crd/packagemetadatas.data.packaging.carvel.dev',
        ]);
      })().catch((e: unknown) => {
        crdsApplied = undefined;
        throw e;
      });
      return crdsApplied;
    },
    async createTenant(ns) {
      await apply(...tenantManifests(ns, SA));
    },
    async getApp(ns, name) {
      apps ??= loadKubeConfig(kubeconfig).makeApiClient(CustomObjectsApi);
      try {
        return (await apps.getNamespacedCustomObject({ ...APP_RESOURCE, namespace: ns, name })) as AppObject;
      } catch (e) {
        if (e instanceof ApiException && e.code === 404) return undefined;
        const detail = e instanceof ApiException ? `${e.code} ${String(e.body).slice(0, 2000)}` : String(e);
        throw new Error(`get App ${ns}/${name}: ${detail}`);
      }
    },
    async getObject<T>(kind: string, ns: string, name: string) {
      const r = await k(['get', kind, name, '-n', ns, '-o', 'json'], undefined, false);
      if (r.code !== 0) {
        if (/NotFound|not found/.test(r.stderr)) return undefined;
        throw new Error(`kubectl get ${kind} ${ns}/${name}: ${r.stderr.trim()}`);
      }
      return JSON.parse(r.stdout) as T;
    },
    async deleteNamespaces(namespaces) {
      if (namespaces.length === 0) return;
      await k(['delete', 'namespace', '--wait=false', '--ignore-not-found', ...namespaces], undefined, false);
    },
  };
}

/** The shared cluster of the global setup. */
export const shared: E2ECluster = e2eCluster(kubeconfigPath);

/** Runs the local kubectl against the shared cluster (argv only). */
export const k = shared.k;
/** {@link E2ECluster.applyCrds} on the shared cluster. */
export const applyCrds = shared.applyCrds;
/** {@link E2ECluster.createTenant} on the shared cluster. */
export const createTenant = shared.createTenant;
/** {@link E2ECluster.apply} on the shared cluster. */
export const apply = shared.apply;
/** {@link E2ECluster.getApp} on the shared cluster. */
export const getApp = shared.getApp;
/** {@link E2ECluster.getObject} on the shared cluster. */
export const getObject = shared.getObject;
/** {@link E2ECluster.deleteNamespaces} on the shared cluster. */
export const deleteNamespaces = shared.deleteNamespaces;

/** The parts of an App the tests read. */
export interface AppObject {
  metadata: {
    name: string;
    namespace: string;
    uid: string;
    generation: number;
    resourceVersion?: string;
    finalizers?: string[];
    deletionTimestamp?: string;
    annotations?: Record<string, string>;
  };
  spec: Record<string, unknown>;
  status?: AppStatusView;
}

/** `status` of an App as served by the API server. */
export interface AppStatusView {
  observedGeneration?: number;
  conditions?: { type: string; status: string; message?: string; reason?: string }[];
  friendlyDescription?: string;
  usefulErrorMessage?: string;
  consecutiveReconcileSuccesses?: number;
  consecutiveReconcileFailures?: number;
  fetch?: StagePart;
  template?: StagePart;
  deploy?: StagePart & {
    finished?: boolean;
    kapp?: { associatedResources?: { label?: string; namespaces?: string[]; groupKinds?: object[] } };
  };
  inspect?: StagePart;
}

/** One stage block of App status. */
export interface StagePart {
  stdout?: string;
  stderr?: string;
  exitCode?: number;
  error?: string;
  startedAt?: string;
  updatedAt?: string;
}

/**
 * The object event a forwarder of `clusterId` sends for the App `ns/name` as it is now in the
 * shared cluster (its uid, generation and resourceVersion).
 * @throws Error when there is no such App.
 */
export async function appObjectEvent(
  clusterId: string,
  ns: string,
  name: string,
  reason: 'added' | 'modified',
): Promise<KappEvent> {
  const app = await getApp(ns, name);
  if (!app) throw new Error(`no App ${ns}/${name}`);
  const raw = app.metadata as AppObject['metadata'] & { resourceVersion: string };
  return objectEvent(
    {
      clusterId,
      kind: 'App',
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      namespace: ns,
      name,
      uid: raw.uid,
      generation: raw.generation,
      resourceVersion: raw.resourceVersion,
    },
    reason,
    { time: new Date() },
  );
}

/** An App manifest (`kappctrl.k14s.io/v1alpha1`) deploying with {@link SA}. */
export function appManifest(ns: string, name: string, spec: Record<string, unknown>): object {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name, namespace: ns },
    spec: { serviceAccountName: SA, syncPeriod: '10m', ...spec },
  };
}

/**
 * A plain ConfigMap manifest (YAML, for an inline fetch) `name` with `data` (each value
 * JSON-quoted, so it stays a string), in `namespace` when given.
 */
export function configMapYaml(name: string, data: Record<string, string>, namespace?: string): string {
  return [
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    `  name: ${name}`,
    ...(namespace ? [`  namespace: ${namespace}`] : []),
    'data:',
    ...Object.entries(data).map(([key, v]) => `  ${key}: ${JSON.stringify(v)}`),
  ].join('\n');
}

/**
 * A ytt template of ConfigMap `name` (YAML, for an inline fetch or ytt `inline.paths`): it loads
 * `@ytt:data` and then each module of `loads` (e.g. `json`), and writes each `data` value as
 * given (a ytt expression such as `#@ data.values.greeting`, or a literal). `name` may be a ytt
 * expression too.
 */
export function yttConfigMap(name: string, data: Record<string, string>, loads: string[] = []): string {
  return [
    '#@ load("@ytt:data", "data")',
    ...loads.map((m) => `#@ load("@ytt:${m}", "${m}")`),
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    `  name: ${name}`,
    'data:',
    ...Object.entries(data).map(([key, v]) => `  ${key}: ${v}`),
  ].join('\n');
}

/**
 * The status part upstream writes for a stage that failed before any tool ran
 * (`exec.NewCmdRunResultWithErr`): exit code -1, the error, `updatedAt`; fetch and deploy also
 * carry `startedAt`, deploy `finished: true`. Times as `expect` matchers (RFC 3339).
 */
export function preExecPart(
  error: string,
  stage: 'fetch' | 'template' | 'deploy' | 'inspect',
): Record<string, unknown> {
  return {
    exitCode: -1,
    error,
    updatedAt: expect.stringMatching(RFC3339),
    ...(stage === 'fetch' || stage === 'deploy' ? { startedAt: expect.stringMatching(RFC3339) } : {}),
    ...(stage === 'deploy' ? { finished: true } : {}),
  };
}

/**
 * Creates a kwok-managed Node `name` (kwok makes it Ready and its Pods Running), labelled
 * `kapp-lambda.test/<name>: "true"`, which only it carries, so a workload pinned to it
 * (`pendingDeployment`) runs there and nowhere else; the shared nodes are not touched (other
 * files run in parallel). Its name is pushed to `created`, for the file's afterAll to delete.
 * @returns its name and label key
 */
export async function createTestNode(name: string, created: string[]): Promise<{ node: string; label: string }> {
  const label = `kapp-lambda.test/${name}`;
  const resources = { cpu: '8', memory: '16Gi', pods: '20' };
  const doc = {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name,
      annotations: { 'kwok.x-k8s.io/node': 'fake', 'node.alpha.kubernetes.io/ttl': '0' },
      labels: { type: 'kwok', 'kubernetes.io/hostname': name, [label]: 'true' },
    },
    spec: {},
    status: { allocatable: resources, capacity: resources, phase: 'Running' },
  };
  created.push(name);
  await k(['create', '--raw', '/api/v1/nodes', '-f', '-'], JSON.stringify(doc));
  await k(['wait', '--for=condition=Ready', '--timeout', '60s', `node/${name}`]);
  return { node: name, label };
}

/** The Node goes, and the Pods labelled `app=<app>` in `ns` with it (a drain, a lost node): their replacements find no node. */
export async function loseTestNode(ns: string, node: string, app: string): Promise<void> {
  await k(['delete', 'node', node, '--wait=false']);
  await k(['-n', ns, 'delete', 'pods', '-l', `app=${app}`, '--grace-period=0', '--force', '--wait=false']);
}

/**
 * A Deployment `name` (Pods labelled `app: <app>`) whose one Pod asks for a node labelled
 * `<nodeLabel>: "true"`: while no node has the label it never becomes available, so kapp keeps
 * waiting for it. As YAML, for an inline fetch.
 */
export function pendingDeployment(name: string, app: string, nodeLabel: string): string {
  return [
    'apiVersion: apps/v1',
    'kind: Deployment',
    'metadata:',
    `  name: ${name}`,
    'spec:',
    '  replicas: 1',
    `  selector: {matchLabels: {app: ${app}}}`,
    '  template:',
    `    metadata: {labels: {app: ${app}}}`,
    '    spec:',
    `      nodeSelector: {${nodeLabel}: "true"}`,
    '      containers: [{name: c, image: registry.invalid/none}]',
  ].join('\n');
}

/** An inline fetch + ytt App rendering one ConfigMap `<name>-config` with `data.greeting`. */
export function inlineConfigMapApp(ns: string, name: string, greeting: string, extra = ''): object {
  return appManifest(ns, name, {
    fetch: [
      {
        inline: {
          paths: {
            'config.yml': [yttConfigMap(`${name}-config`, { greeting: '#@ data.values.greeting' }), extra].join('\n'),
            'values.yml': `#@data/values\n---\ngreeting: ${JSON.stringify(greeting)}\n`,
          },
        },
      },
    ],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  });
}

/**
 * Polls `probe` every `intervalMs` until it returns something other than `undefined`.
 * @throws Error `timed out after <ms> waiting for <what>` plus `describe()`'s text.
 */
export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  opts: { timeoutMs?: number; intervalMs?: number; describe?: () => Promise<string> | string } = {},
): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 120_000;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) {
      const detail = opts.describe ? await opts.describe() : '';
      throw new Error(`timed out after ${timeoutMs}ms waiting for ${what}${detail ? `\n${detail}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? 500));
  }
}

/** True when the App's status reports a finished reconcile (succeeded or failed) of its current generation. */
export function reconciled(app: AppObject | undefined): boolean {
  const s = app?.status;
  return (
    !!app &&
    s?.observedGeneration === app.metadata.generation &&
    !!s?.conditions?.some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed')
  );
}

/** `pred` for {@link E2ERuntime.waitForApp}: generation `generation` reconciled with ReconcileSucceeded. */
export const succeededAt = (generation: number) => (a: AppObject) =>
  a.metadata.generation === generation &&
  a.status?.observedGeneration === generation &&
  (a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded') ?? false);

/** `pred` for {@link E2ERuntime.waitForApp}: generation `generation` reconciled with ReconcileFailed. */
export const failedAt = (generation: number) => (a: AppObject) =>
  a.metadata.generation === generation &&
  a.status?.observedGeneration === generation &&
  (a.status?.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false);

/** How long {@link E2ERuntime.waitForApp} waits after the App matched, for the runtime's log. */
const SETTLE_MS = 300;

/** One embedded runtime for a test file, with its captured log. */
export interface E2ERuntime {
  runtime: EmbeddedRuntime;
  /** The cluster it serves. */
  cluster: E2ECluster;
  /** Everything the runtime logged (memory logger records). */
  records: { level: string; obj: Record<string, unknown>; msg?: string }[];
  /** Temp root holding `store/` and `work/`. */
  root: string;
  /** Starts a fresh runtime on the same store and work dirs (stops none). */
  restart(overrides?: Partial<EmbeddedOptions>): EmbeddedRuntime;
  /** Stops the current runtime. */
  stop(): Promise<void>;
  /** Stops the runtime and removes the temp root. */
  dispose(): Promise<void>;
  /** Log records about one App (`<cluster>/App/<ns>/<name>`). */
  logsFor(ns: string, name: string): { level: string; obj: Record<string, unknown>; msg?: string }[];
  /** Stage-run records (`stage run`) about one App. */
  stageRuns(ns: string, name: string): Record<string, unknown>[];
  /** Waits until `pred(app)` holds; the error shows the App's status and log on timeout. */
  waitForApp(
    ns: string,
    name: string,
    pred: (app: AppObject) => boolean,
    what?: string,
    timeoutMs?: number,
  ): Promise<AppObject>;
  /** Waits until the App finished a reconcile of its current generation. */
  waitReconciled(ns: string, name: string, timeoutMs?: number): Promise<AppObject>;
}

/**
 * The leader election of the runtimes {@link startRuntime} starts unless told otherwise: the
 * algorithm and retry period of production, but a runtime stops leading only after its renewals
 * failed for 45 s (production: 10 s; Lease 60 s instead of 15 s). The integration and e2e files
 * run in parallel on a small machine that others use too, and a worker or API server starved for
 * 10 s cost a runtime its Lease in the middle of a test that is not about leadership (seen: the
 * NotLeaderError crashes of hostile.test.ts under a load average of 15). The files about
 * leadership use the production timings: {@link PRODUCTION_LEASE}.
 */
export const PATIENT_LEASE: Partial<EmbeddedOptions> = {
  leaderElection: { leaseDurationMs: 60_000, renewDeadlineMs: 45_000 },
};

/** Runtime options for the production leader election (controller-runtime's timings). */
export const PRODUCTION_LEASE: Partial<EmbeddedOptions> = { leaderElection: {} };

/**
 * Starts the embedded runtime (forwarder + in-process stages) over `cluster` (default the shared
 * one), watching only `namespaces`, with an in-memory log, a temp store and, unless `overrides`
 * say otherwise, the {@link PATIENT_LEASE} election.
 */
export async function startRuntime(
  namespaces: string[],
  overrides: Partial<EmbeddedOptions> = {},
  cluster: E2ECluster = shared,
): Promise<E2ERuntime> {
  const root = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-e2e-'));
  const log = memoryLogger();
  const records = log.records;
  const options = (o: Partial<EmbeddedOptions>): EmbeddedOptions => ({
    kubeconfigPath: cluster.kubeconfigPath,
    namespaces,
    cacheRoot: cacheRoot(),
    storeDir: path.join(root, 'store'),
    tmpRoot: path.join(root, 'work'),
    log,
    retry: { baseRetryMs: 200, maxRetryMs: 5000 },
    ...PATIENT_LEASE,
    ...o,
    // Health after deploy adds a condition after kapp-controller's a second after each
    // reconcile; the files that compare `conditions` whole with upstream's run without it, and
    // the files about health turn it on (`forwarder: { health: true }`).
    forwarder: { health: false, ...o.forwarder },
  });
  let runtime = startEmbedded(options(overrides));
  const logsFor = (ns: string, name: string) =>
    records.filter((r) => typeof r.obj.object === 'string' && r.obj.object.endsWith(`/App/${ns}/${name}`));
  const e2e: E2ERuntime = {
    get runtime() {
      return runtime;
    },
    cluster,
    records,
    root,
    restart(o = {}) {
      runtime = startEmbedded(options({ ...overrides, ...o }));
      return runtime;
    },
    async stop() {
      await runtime.stop();
    },
    async dispose() {
      await runtime.stop().catch(() => undefined);
      await rm(root, { recursive: true, force: true });
    },
    logsFor,
    stageRuns: (ns, name) =>
      logsFor(ns, name)
        .filter((r) => r.msg === 'stage run')
        .map((r) => r.obj),
    async waitForApp(ns, name, pred, what = 'condition', timeoutMs = 150_000) {
      let last: AppObject | undefined;
      const app = await waitFor(
        `App ${ns}/${name}: ${what}`,
        async () => {
          last = await cluster.getApp(ns, name);
          return last && pred(last) ? last : undefined;
        },
        {
          timeoutMs,
          describe: () =>
            `last App: ${JSON.stringify(last ? { metadata: last.metadata, status: last.status } : null, null, 1)}\n` +
            `log: ${logsFor(ns, name)
              .slice(-20)
              .map((r) => JSON.stringify({ level: r.level, msg: r.msg, ...r.obj }))
              .join('\n')}`,
        },
      );
      // The runtime logs a stage's record (`stage run`, a final failure) just after the status
      // write this read saw; tests read those records next. The read is in-process and can beat
      // the runtime's next turn (a kubectl read took ~0.1-0.5 s and never did).
      await new Promise((r) => setTimeout(r, SETTLE_MS));
      return app;
    },
    async waitReconciled(ns, name, timeoutMs) {
      return await e2e.waitForApp(ns, name, reconciled, 'a finished reconcile of the current generation', timeoutMs);
    },
  };
  return e2e;
}

/** Options of {@link useE2ERuntime}. */
export interface UseE2ERuntimeOptions {
  /** Runtime options; a function is called in `beforeAll` (for values known only then). */
  overrides?: Partial<EmbeddedOptions> | (() => Partial<EmbeddedOptions>);
  /** More tenant namespaces to create (and delete) that this runtime does not watch. */
  tenants?: string[];
  /** The cluster, default {@link shared}; a function is called in `beforeAll`. */
  cluster?: E2ECluster | (() => E2ECluster);
}

/**
 * The prologue of an e2e file with one runtime: `beforeAll` applies the CRDs, creates the tenant
 * namespaces (`namespaces` and `tenants`) and starts a runtime watching `namespaces`; `afterAll`
 * disposes of it and deletes the namespaces. Hooks registered before this call run before its
 * `beforeAll` and after its `afterAll`.
 * @returns the runtime, usable in tests and later hooks (it throws when used before `beforeAll`).
 */
export function useE2ERuntime(namespaces: string[], opts: UseE2ERuntimeOptions = {}): E2ERuntime {
  let current: E2ERuntime | undefined;
  let cluster: E2ECluster = shared;
  const tenants = [...new Set([...namespaces, ...(opts.tenants ?? [])])];
  beforeAll(async () => {
    cluster = typeof opts.cluster === 'function' ? opts.cluster() : (opts.cluster ?? shared);
    await cluster.applyCrds();
    await Promise.all(tenants.map((ns) => cluster.createTenant(ns)));
    const overrides = typeof opts.overrides === 'function' ? opts.overrides() : opts.overrides;
    current = await startRuntime(namespaces, overrides, cluster);
  });
  afterAll(async () => {
    await current?.dispose();
    await cluster.deleteNamespaces(tenants);
  });
  return new Proxy({} as E2ERuntime, {
    get(_target, prop) {
      if (!current) throw new Error(`the e2e runtime for ${namespaces.join(',')} is used before its beforeAll ran`);
      const v: unknown = Reflect.get(current, prop);
      return typeof v === 'function' ? v.bind(current) : v;
    },
  });
}

/** Keys kapp-controller may serialize in App status. */
export const STATUS_KEYS: ReadonlySet<string> = new Set([
  'observedGeneration',
  'conditions',
  'friendlyDescription',
  'usefulErrorMessage',
  'fetch',
  'template',
  'deploy',
  'inspect',
  'consecutiveReconcileSuccesses',
  'consecutiveReconcileFailures',
]);

/**
 * `conditions` without this project's added ones (`kapp-lambda.carvel.dev/…`: Healthy, Rollout),
 * which kapp-controller never writes and which always follow its own.
 */
export function kappConditions<T extends { type: string }>(conditions: readonly T[] | undefined): T[] | undefined {
  return conditions?.filter((c) => !c.type.startsWith('kapp-lambda.carvel.dev/'));
}

/**
 * The status checks every successful reconcile shares, App or PackageRepository (upstream's
 * GenericStatus plus the fetch/template/deploy parts of one successful run): only `allowedKeys`
 * at the top, `ReconcileSucceeded` for the current generation, omitempty fields absent, each
 * part with exit code 0, no error, RFC 3339 times and kapp's `Succeeded` in deploy's stdout.
 * @returns the status, for the caller's kind-specific checks.
 */
export function expectSucceededStatus(
  obj: { metadata: { namespace: string; name: string; generation?: number }; status?: AppStatusView },
  allowedKeys: ReadonlySet<string>,
): AppStatusView {
  const s = obj.status ?? {};
  const where = `${obj.metadata.namespace}/${obj.metadata.name}: ${s.usefulErrorMessage ?? ''}`;
  for (const key of Object.keys(s)) expect(allowedKeys.has(key), `unexpected status key ${key} (${where})`).toBe(true);
  // kapp-controller's conditions as it writes them, first; this project's own (`Healthy`, `Rollout`:
  // the forwarder's health tracking adds one about a second after a reconcile) only after them.
  expect(kappConditions(s.conditions), where).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
  expect(s.conditions?.[0], where).toEqual({ type: 'ReconcileSucceeded', status: 'True' });
  expect(s.friendlyDescription).toBe('Reconcile succeeded');
  expect(s.observedGeneration).toBe(obj.metadata.generation);
  // omitempty upstream: absent, not "" or 0
  expect(s).not.toHaveProperty('usefulErrorMessage');
  expect(s).not.toHaveProperty('consecutiveReconcileFailures');
  expect(s.consecutiveReconcileSuccesses).toBeGreaterThanOrEqual(1);
  expect(s.fetch?.exitCode).toBe(0);
  expect(s.fetch?.error).toBeUndefined();
  expect(s.fetch?.startedAt).toMatch(RFC3339);
  expect(s.fetch?.updatedAt).toMatch(RFC3339);
  expect(s.template?.exitCode).toBe(0);
  expect(s.template?.error).toBeUndefined();
  expect(s.template?.updatedAt).toMatch(RFC3339);
  expect(s.template).not.toHaveProperty('stdout');
  expect(s.deploy?.exitCode).toBe(0);
  expect(s.deploy?.finished).toBe(true);
  expect(s.deploy?.error).toBeUndefined();
  expect(s.deploy?.startedAt).toMatch(RFC3339);
  expect(s.deploy?.updatedAt).toMatch(RFC3339);
  // kapp's change table and summary
  expect(s.deploy?.stdout).toContain('Succeeded');
  return s;
}

/**
 * Asserts the status kapp-controller leaves after a successful reconcile of the current
 * generation, and that the kapp app record `<name>.app` exists in the App namespace (of
 * `cluster`, default the shared one) and matches `associatedResources.label`.
 * @returns the kapp label (`kapp.k14s.io/app=<id>`).
 */
export async function expectSucceeded(app: AppObject, cluster: E2ECluster = shared): Promise<string> {
  const s = expectSucceededStatus(app, STATUS_KEYS);
  const label = s.deploy?.kapp?.associatedResources?.label ?? '';
  expect(label).toMatch(/^kapp\.k14s\.io\/app=\d+$/);
  expect(s.deploy?.kapp?.associatedResources?.namespaces).toEqual([app.metadata.namespace]);
  expect(s.inspect).toBeUndefined();
  expect(app.metadata.finalizers).toContain(APP_FINALIZER);
  // kapp's app record: ConfigMap <name>.app in the App namespace, pointing at the same label.
  const record = await cluster.getObject<{ data?: { spec?: string } }>(
    'configmap',
    app.metadata.namespace,
    `${app.metadata.name}.app`,
  );
  expect(record, `kapp app record ${app.metadata.name}.app`).toBeDefined();
  const spec = JSON.parse(record?.data?.spec ?? '{}') as { labelKey?: string; labelValue?: string };
  expect(`${spec.labelKey}=${spec.labelValue}`).toBe(label);
  return label;
}

/**
 * Asserts the status after a failed reconcile of the current generation: the one
 * `ReconcileFailed` condition with `message`, `Reconcile failed: <message>`, counters.
 */
export function expectFailed(app: AppObject, message: string): void {
  const s = app.status ?? {};
  const where = `${app.metadata.namespace}/${app.metadata.name}`;
  for (const key of Object.keys(s)) expect(STATUS_KEYS.has(key), `unexpected status key ${key} (${where})`).toBe(true);
  expect(s.conditions, where).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
  expect(s.friendlyDescription).toBe(`Reconcile failed: ${message}`);
  expect(s.observedGeneration).toBe(app.metadata.generation);
  expect(s.consecutiveReconcileFailures).toBeGreaterThanOrEqual(1);
  expect(s).not.toHaveProperty('consecutiveReconcileSuccesses'); // omitempty upstream
}
