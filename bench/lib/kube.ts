/**
 * Kubernetes helpers of the benchmark: a JSON REST transport per kubeconfig context (the
 * project's own client-node transport), parallel creates and status patches, tenant
 * namespaces, the benchmark's App manifests, and {@link AppWatch}, which records the moment
 * each App's status first reports a finished reconcile of its generation (the same watch for
 * kapp-lambda and kapp-controller, so both are timed alike).
 *
 * @module
 */
import { KubeConfig } from '@kubernetes/client-node';
import {
  APP_API_VERSION,
  DATA_PACKAGING_API_VERSION,
  type KubeObject,
  PACKAGING_API_VERSION,
} from '../../functions/lib/kube/port.js';
import { clientForKubeConfig } from '../../functions/lib/kube/registry.js';
import { ClientNodeRestTransport, type RestTransport } from '../../functions/lib/kube/transport.js';
import { kubectl, tenantManifests } from '../../test/harness/kube.js';

/** The ServiceAccount every benchmark namespace gets (namespace-scoped all-verbs Role). */
export const BENCH_SA = 'bench-sa';

/** Loads a kubeconfig, optionally switching to `context`. */
export function loadKubeConfig(kubeconfigPath: string, context?: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  if (context) kc.setCurrentContext(context);
  return kc;
}

/** A JSON REST transport for the kubeconfig's (current or given) context. */
export function restFor(kubeconfigPath: string, context?: string): RestTransport {
  return loadKubeConfig(kubeconfigPath, context).makeApiClient(ClientNodeRestTransport);
}

/** REST path of a namespaced collection: `kind` is one of the few kinds the benchmark creates. */
export function collectionPath(kind: string, namespace?: string): string {
  const ns = namespace ? `/namespaces/${namespace}` : '';
  switch (kind) {
    case 'App':
      return `/apis/kappctrl.k14s.io/v1alpha1${ns}/apps`;
    case 'PackageRepository':
      return `/apis/${PACKAGING_API_VERSION}${ns}/packagerepositories`;
    case 'PackageInstall':
      return `/apis/${PACKAGING_API_VERSION}${ns}/packageinstalls`;
    case 'Package':
      return `/apis/${DATA_PACKAGING_API_VERSION}${ns}/packages`;
    case 'PackageMetadata':
      return `/apis/${DATA_PACKAGING_API_VERSION}${ns}/packagemetadatas`;
    case 'Namespace':
      return '/api/v1/namespaces';
    case 'ServiceAccount':
      return `/api/v1${ns}/serviceaccounts`;
    case 'Secret':
      return `/api/v1${ns}/secrets`;
    case 'ConfigMap':
      return `/api/v1${ns}/configmaps`;
    case 'Role':
      return `/apis/rbac.authorization.k8s.io/v1${ns}/roles`;
    case 'RoleBinding':
      return `/apis/rbac.authorization.k8s.io/v1${ns}/rolebindings`;
    default:
      throw new Error(`bench: no path for kind ${kind}`);
  }
}

/** An object to create: apiVersion, kind and metadata with name (and namespace when namespaced). */
export type Manifest = {
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
} & Record<string, unknown>;

/**
 * Creates objects, at most `parallel` requests in flight. An existing object (409) counts as
 * created.
 * @returns the wall time of the whole call, milliseconds.
 * @throws Error naming the first object the API server refused (status and message).
 */
export async function createAll(rest: RestTransport, objects: readonly Manifest[], parallel = 16): Promise<number> {
  const t0 = performance.now();
  let next = 0;
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= objects.length) return;
      const o = objects[i]!;
      const r = await rest.send({ method: 'POST', path: collectionPath(o.kind, o.metadata.namespace), body: o });
      if (r.statusCode !== 201 && r.statusCode !== 200 && r.statusCode !== 409) {
        const msg = (r.body as { message?: string } | undefined)?.message ?? String(r.body);
        throw new Error(`create ${o.kind} ${o.metadata.namespace ?? ''}/${o.metadata.name}: ${r.statusCode} ${msg}`);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(parallel, objects.length) }, worker));
  return performance.now() - t0;
}

/**
 * Runs `kubectl <args> -f -` over `objects` split into `procs` Lists, the processes in parallel
 * (each kubectl sends its requests one after another over one HTTP/2 connection; several
 * processes are the fastest way to write tens of thousands of objects here).
 * @throws Error with kubectl's stderr when one of them fails.
 */
export async function kubectlBulk(
  kubeconfigPath: string,
  args: readonly string[],
  objects: readonly object[],
  procs = 8,
): Promise<void> {
  const size = Math.ceil(objects.length / procs);
  const chunks = Array.from({ length: procs }, (_, i) => objects.slice(i * size, (i + 1) * size)).filter(
    (c) => c.length,
  );
  await Promise.all(
    chunks.map((items) =>
      kubectl(kubeconfigPath, [...args, '-f', '-'], {
        input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items }),
        timeoutMs: 20 * 60_000,
      }),
    ),
  );
}

/**
 * A ytt `config.yml` of one ConfigMap named by the data value `name`, its `data` the given
 * entries (each value a ytt expression or plain text): the git repositories' template.
 */
export function yttConfigMap(data: Record<string, string>): string {
  return [
    '#@ load("@ytt:data", "data")',
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    '  name: #@ data.values.name',
    'data:',
    ...Object.entries(data).map(([k, v]) => `  ${k}: ${v}`),
    '',
  ].join('\n');
}

/**
 * A namespace with {@link BENCH_SA} bound to a namespace-scoped all-verbs Role (kapp-controller
 * `examples/rbac/default-ns.yml`): what every benchmark App deploys with.
 */
export function tenant(ns: string): Manifest[] {
  return tenantManifests(ns, BENCH_SA) as Manifest[];
}

/**
 * Creates tenant namespaces (namespaces first, then their ServiceAccount and RBAC) and waits
 * until each namespace's ServiceAccount exists.
 */
export async function createTenants(rest: RestTransport, namespaces: readonly string[]): Promise<void> {
  const all = namespaces.flatMap(tenant);
  await createAll(
    rest,
    all.filter((o) => o.kind === 'Namespace'),
    8,
  );
  await createAll(
    rest,
    all.filter((o) => o.kind !== 'Namespace'),
    16,
  );
}

/**
 * The benchmark App: inline ytt source rendering one ConfigMap `<name>-config` whose data
 * holds `value`, deployed by kapp with {@link BENCH_SA}. Different `value`s give different
 * sources (nothing is shared between Apps through the fetch or render cache). `syncPeriod` is
 * written in Go's canonical form (`10m0s`): kapp-controller updates the whole App when it adds
 * its finalizer, and a non-canonical `10m` would come back as `10m0s`, a spec change that costs
 * it a second reconcile.
 */
export function inlineApp(ns: string, name: string, value: string, syncPeriod = '10m0s'): Manifest {
  return {
    apiVersion: APP_API_VERSION,
    kind: 'App',
    metadata: { name, namespace: ns },
    spec: {
      serviceAccountName: BENCH_SA,
      syncPeriod,
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
                '  value: #@ data.values.value',
                '',
              ].join('\n'),
              'values.yml': `#@data/values\n---\nvalue: ${JSON.stringify(value)}\n`,
            },
          },
        },
      ],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    },
  };
}

/** The App's final state for its generation, when it has one. */
export type Final = 'succeeded' | 'failed';

function finalOf(obj: KubeObject): Final | undefined {
  const status = obj.status as
    | { observedGeneration?: number; conditions?: { type: string; status?: string }[] }
    | undefined;
  if (!status || status.observedGeneration !== obj.metadata.generation) return undefined;
  const c = status.conditions ?? [];
  if (c.some((x) => x.type === 'ReconcileSucceeded' && x.status !== 'False')) return 'succeeded';
  if (c.some((x) => x.type === 'ReconcileFailed' && x.status !== 'False')) return 'failed';
  return undefined;
}

/** What {@link AppWatch} recorded about one App. */
export interface AppSeen {
  /** `performance.now()` when a finished reconcile of the current generation was first seen. */
  at: number;
  final: Final;
  /** `status.usefulErrorMessage` / `friendlyDescription` on failure. */
  message?: string;
}

/** What {@link listWatch} hands its caller. */
export interface ListWatchHandler {
  /** A complete list (every page): what exists now; what it lacks is gone. */
  listed(items: KubeObject[]): void;
  /** One watch event (`ADDED`, `MODIFIED` or `DELETED`; bookmarks are not passed on). */
  event(type: string, obj: KubeObject): void;
  /** A watch ended with an error; a relist follows. */
  failed?(): void;
}

/**
 * The benchmark's own list+watch of `kind` in `namespace` (all when undefined): lists every
 * page, then watches from the list's resourceVersion in the background, relisting after any
 * failure (410 included) and rewatching after a normal end, until `signal` aborts.
 * @returns once the first watch request is sent (plus 100 ms for the server to register it):
 *   `running`, the background loop, which settles after `signal` aborts.
 */
export async function listWatch(
  client: ReturnType<typeof clientForKubeConfig>,
  kind: { apiVersion: string; kind: string },
  namespace: string | undefined,
  handler: ListWatchHandler,
  signal: AbortSignal,
): Promise<{ running: Promise<void> }> {
  const relist = async (): Promise<string> => {
    const items: KubeObject[] = [];
    let cont: string | undefined;
    let rv = '';
    do {
      const page = await client.list(kind, { namespace, limit: 500, continue: cont });
      items.push(...page.items);
      rv = page.resourceVersion;
      cont = page.continue;
    } while (cont);
    handler.listed(items);
    return rv;
  };
  let rv = await relist();
  let established!: () => void;
  const ready = new Promise<void>((r) => {
    established = r;
  });
  const running = (async () => {
    while (!signal.aborted) {
      try {
        const p = client.watch(
          kind,
          { resourceVersion: rv, allowWatchBookmarks: true, timeoutSeconds: 600, namespace },
          (ev) => {
            rv = ev.object.metadata.resourceVersion ?? rv;
            if (ev.type !== 'BOOKMARK') handler.event(ev.type, ev.object);
          },
          signal,
        );
        established();
        await p;
      } catch {
        handler.failed?.();
        established();
        if (signal.aborted) return;
        rv = await relist().catch(() => rv);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  })();
  await ready;
  // the watch request is sent when `client.watch` is called; give the server a moment to register it
  await new Promise((r) => setTimeout(r, 100));
  return { running };
}

/** The kind {@link AppWatch} watches unless told otherwise. */
const APP_KIND = { apiVersion: APP_API_VERSION, kind: 'App' };

/**
 * Watches the Apps (or the objects of another kind with the App's status shape, e.g.
 * PackageRepositories) of one namespace (or all) and records, per `namespace/name`, when a
 * finished reconcile of the object's current generation was first seen, and when the object
 * was first seen gone (a `DELETED` event, or missing from a relist after a watch failure). A
 * successful reconcile after an earlier one (e.g. a resync) is recorded again only after
 * {@link AppWatch.forget}.
 */
export class AppWatch {
  readonly #seen = new Map<string, AppSeen>();
  /** Keys of objects that exist as far as the watch knows. */
  readonly #present = new Set<string>();
  /** `performance.now()` when each key was first seen gone. */
  readonly #gone = new Map<string, number>();
  readonly #abort = new AbortController();
  readonly #waiters = new Set<() => void>();
  #running: Promise<void> | undefined;
  /** Watch failures other than a normal end (for diagnostics). */
  errors = 0;

  /**
   * @param kubeconfigPath - Admin kubeconfig.
   * @param namespace - Namespace to watch; undefined: all.
   * @param context - Kubeconfig context; default the current one.
   * @param kind - apiVersion and kind to watch; default App.
   */
  constructor(
    private readonly kubeconfigPath: string,
    private readonly namespace?: string,
    private readonly context?: string,
    private readonly kind: { apiVersion: string; kind: string } = APP_KIND,
  ) {}

  /** Lists, then watches in the background. Resolves once the watch is established. */
  async start(): Promise<void> {
    const client = clientForKubeConfig(loadKubeConfig(this.kubeconfigPath, this.context));
    this.#running = (
      await listWatch(
        client,
        this.kind,
        this.namespace,
        {
          listed: (items) => {
            const listed = new Set(items.map(keyOf));
            for (const k of [...this.#present]) if (!listed.has(k)) this.#markGone(k);
            for (const o of items) this.#observe(o);
          },
          event: (type, o) => {
            if (type === 'ADDED' || type === 'MODIFIED') this.#observe(o);
            if (type === 'DELETED') this.#markGone(keyOf(o));
          },
          failed: () => {
            this.errors++;
          },
        },
        this.#abort.signal,
      )
    ).running;
  }

  #observe(o: KubeObject): void {
    const key = keyOf(o);
    this.#present.add(key);
    if (this.#seen.has(key)) return;
    const final = finalOf(o);
    if (!final) return;
    const s = o.status as { usefulErrorMessage?: string; friendlyDescription?: string };
    const seen: AppSeen = { at: performance.now(), final };
    if (final === 'failed') seen.message = `${s.friendlyDescription ?? ''} ${s.usefulErrorMessage ?? ''}`.trim();
    this.#seen.set(key, seen);
    this.#wake();
  }

  #markGone(key: string): void {
    this.#present.delete(key);
    if (!this.#gone.has(key)) this.#gone.set(key, performance.now());
    this.#wake();
  }

  #wake(): void {
    for (const w of this.#waiters) w();
  }

  /** What was seen for `namespace/name`. */
  seen(key: string): AppSeen | undefined {
    return this.#seen.get(key);
  }

  /** Forgets what was seen for these keys (to time their next reconcile, or their next deletion). */
  forget(keys: readonly string[]): void {
    for (const k of keys) {
      this.#seen.delete(k);
      this.#gone.delete(k);
    }
  }

  /**
   * Waits until every key has a finished reconcile recorded.
   * @throws Error listing how many are missing (and a few names) after `timeoutMs`.
   */
  async waitAll(keys: readonly string[], timeoutMs: number): Promise<Map<string, AppSeen>> {
    await this.#waitFor(keys, this.#seen, timeoutMs, 'reconciled');
    return new Map(keys.map((k) => [k, this.#seen.get(k)!]));
  }

  /**
   * Waits until every key has been seen gone.
   * @returns key → `performance.now()` when it was first seen gone.
   * @throws Error listing how many are missing (and a few names) after `timeoutMs`.
   */
  async waitGone(keys: readonly string[], timeoutMs: number): Promise<Map<string, number>> {
    await this.#waitFor(keys, this.#gone, timeoutMs, 'gone');
    return new Map(keys.map((k) => [k, this.#gone.get(k)!]));
  }

  async #waitFor(keys: readonly string[], done: Map<string, unknown>, timeoutMs: number, what: string): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const missing = keys.filter((k) => !done.has(k));
      if (missing.length === 0) return;
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(
          `timed out after ${timeoutMs} ms: ${missing.length} of ${keys.length} ${this.kind.kind}s not ${what} (${missing.slice(0, 5).join(', ')})`,
        );
      }
      await new Promise<void>((resolve) => {
        const t = setTimeout(wake, Math.min(left, 1000));
        const waiters = this.#waiters;
        function wake() {
          clearTimeout(t);
          waiters.delete(wake);
          resolve();
        }
        waiters.add(wake);
      });
    }
  }

  /** Ends the watch. */
  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#running?.catch(() => undefined);
  }
}

function keyOf(o: KubeObject): string {
  return `${o.metadata.namespace}/${o.metadata.name}`;
}
