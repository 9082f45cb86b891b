/**
 * Shared pieces of the e2e tests (whole flow: forwarder → fetch → template → deploy against
 * the shared local control plane, the fixture servers and the real Carvel tools): applying the
 * CRDs, a tenant namespace with its ServiceAccount, an embedded runtime per test file with an
 * in-memory log, App manifests, polling with timeouts, and the exact status shapes
 * kapp-controller writes (reference §2.1.5, §3.4, §3.5).
 *
 * Not a test file (vitest only collects `*.test.ts`).
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, inject } from 'vitest';
import { type EmbeddedOptions, type EmbeddedRuntime, startEmbedded } from '../../functions/embedded/runtime.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { kubectl, tenantManifests } from '../harness/kube.js';
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

/** Runs the local kubectl against the shared cluster (argv only). */
export async function k(args: string[], input?: string, check = true) {
  return await kubectl(kubeconfigPath, args, { input, check });
}

/** A short random suffix for namespace and App names. */
export function suffix(): string {
  return randomBytes(3).toString('hex');
}

/**
 * Applies `infra/crds/crds.yaml` server-side (idempotent; `--force-conflicts` because other
 * test files apply the same CRDs client-side) and waits until they are established. Also
 * creates the `kapp-lambda` namespace, where the runtimes' leader-election Leases live.
 */
export async function applyCrds(): Promise<void> {
  const file = fileURLToPath(new URL('../../infra/crds/crds.yaml', import.meta.url));
  await k(['apply', '--server-side', '--force-conflicts', '--field-manager=kapp-lambda-e2e', '-f', file]);
  await k(
    ['apply', '-f', '-'],
    JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'kapp-lambda' } }),
  );
  await k([
    'wait',
    '--for=condition=Established',
    '--timeout=60s',
    'crd/apps.kappctrl.k14s.io',
    'crd/packageinstalls.packaging.carvel.dev',
    'crd/packagerepositories.packaging.carvel.dev',
  ]);
}

/**
 * Creates a namespace with the ServiceAccount {@link SA} bound to a namespace-scoped Role
 * allowing every verb on every resource (kapp-controller `examples/rbac/default-ns.yml`).
 */
export async function createTenant(ns: string): Promise<void> {
  const items = tenantManifests(ns, SA);
  await k(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
}

/** Applies any objects (JSON documents in one List). */
export async function apply(...objects: object[]): Promise<void> {
  await k(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
}

/** The parts of an App the tests read. */
export interface AppObject {
  metadata: {
    name: string;
    namespace: string;
    uid: string;
    generation: number;
    finalizers?: string[];
    deletionTimestamp?: string;
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

/** An App manifest (`kappctrl.k14s.io/v1alpha1`) deploying with {@link SA}. */
export function appManifest(ns: string, name: string, spec: Record<string, unknown>): object {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name, namespace: ns },
    spec: { serviceAccountName: SA, syncPeriod: '10m', ...spec },
  };
}

/** An inline fetch + ytt App rendering one ConfigMap `<name>-config` with `data.greeting`. */
export function inlineConfigMapApp(ns: string, name: string, greeting: string, extra = ''): object {
  return appManifest(ns, name, {
    fetch: [
      {
        inline: {
          paths: {
            'config.yml': [
              '#@ load("@ytt:data", "data")',
              'apiVersion: v1',
              'kind: ConfigMap',
              'metadata:',
              `  name: ${name}-config`,
              'data:',
              '  greeting: #@ data.values.greeting',
              extra,
            ].join('\n'),
            'values.yml': `#@data/values\n---\ngreeting: ${JSON.stringify(greeting)}\n`,
          },
        },
      },
    ],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  });
}

/** Reads an App; `undefined` when it does not exist. */
export async function getApp(ns: string, name: string): Promise<AppObject | undefined> {
  const r = await k(['get', 'apps.kappctrl.k14s.io', name, '-n', ns, '-o', 'json'], undefined, false);
  if (r.code !== 0) {
    if (/NotFound|not found/.test(r.stderr)) return undefined;
    throw new Error(`kubectl get app ${ns}/${name}: ${r.stderr.trim()}`);
  }
  return JSON.parse(r.stdout) as AppObject;
}

/** Reads any namespaced object as JSON; `undefined` when it does not exist. */
export async function getObject<T = Record<string, unknown>>(
  kind: string,
  ns: string,
  name: string,
): Promise<T | undefined> {
  const r = await k(['get', kind, name, '-n', ns, '-o', 'json'], undefined, false);
  if (r.code !== 0) {
    if (/NotFound|not found/.test(r.stderr)) return undefined;
    throw new Error(`kubectl get ${kind} ${ns}/${name}: ${r.stderr.trim()}`);
  }
  return JSON.parse(r.stdout) as T;
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

/** One embedded runtime for a test file, with its captured log. */
export interface E2ERuntime {
  runtime: EmbeddedRuntime;
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
 * Starts the embedded runtime (forwarder + in-process stages) over the shared cluster,
 * watching only `namespaces`, with an in-memory log and a temp store.
 */
export async function startRuntime(
  namespaces: string[],
  overrides: Partial<EmbeddedOptions> = {},
): Promise<E2ERuntime> {
  const root = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-e2e-'));
  const log = memoryLogger();
  const records = log.records;
  const options = (o: Partial<EmbeddedOptions>): EmbeddedOptions => ({
    kubeconfigPath,
    namespaces,
    cacheRoot: cacheRoot(),
    storeDir: path.join(root, 'store'),
    tmpRoot: path.join(root, 'work'),
    log,
    retry: { baseRetryMs: 200, maxRetryMs: 5000 },
    ...o,
  });
  let runtime = startEmbedded(options(overrides));
  const logsFor = (ns: string, name: string) =>
    records.filter((r) => typeof r.obj.object === 'string' && r.obj.object.endsWith(`/App/${ns}/${name}`));
  const e2e: E2ERuntime = {
    get runtime() {
      return runtime;
    },
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
      return await waitFor(
        `App ${ns}/${name}: ${what}`,
        async () => {
          last = await getApp(ns, name);
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
    },
    async waitReconciled(ns, name, timeoutMs) {
      return await e2e.waitForApp(ns, name, reconciled, 'a finished reconcile of the current generation', timeoutMs);
    },
  };
  return e2e;
}

/** Deletes test namespaces without waiting (the cluster is torn down after the run). */
export async function deleteNamespaces(namespaces: string[]): Promise<void> {
  if (namespaces.length === 0) return;
  await k(['delete', 'namespace', '--wait=false', '--ignore-not-found', ...namespaces], undefined, false);
}

/** Keys kapp-controller may serialize in App status. */
const STATUS_KEYS = new Set([
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
 * Asserts the status kapp-controller leaves after a successful reconcile of the current
 * generation, and that the kapp app record `<name>.app` exists in the App namespace and
 * matches `associatedResources.label`.
 * @returns the kapp label (`kapp.k14s.io/app=<id>`).
 */
export async function expectSucceeded(app: AppObject): Promise<string> {
  const s = app.status ?? {};
  const where = `${app.metadata.namespace}/${app.metadata.name}: ${s.usefulErrorMessage ?? ''}`;
  for (const key of Object.keys(s)) expect(STATUS_KEYS.has(key), `unexpected status key ${key} (${where})`).toBe(true);
  expect(s.conditions, where).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
  expect(s.friendlyDescription).toBe('Reconcile succeeded');
  expect(s.observedGeneration).toBe(app.metadata.generation);
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
  expect(s.deploy?.stdout).toContain('Succeeded');
  const label = s.deploy?.kapp?.associatedResources?.label ?? '';
  expect(label).toMatch(/^kapp\.k14s\.io\/app=\d+$/);
  expect(s.deploy?.kapp?.associatedResources?.namespaces).toEqual([app.metadata.namespace]);
  expect(s.inspect).toBeUndefined();
  expect(app.metadata.finalizers).toContain(APP_FINALIZER);
  // kapp's app record: ConfigMap <name>.app in the App namespace, pointing at the same label.
  const record = await getObject<{ data?: { spec?: string } }>(
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
