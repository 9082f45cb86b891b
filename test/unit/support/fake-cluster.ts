/**
 * The one fake Kubernetes cluster of the unit tests, at the port (`functions/lib/kube/port.ts`):
 * it implements every method of a {@link DeployView} (so it serves as fetch and deploy view) and
 * records each object read and status write in {@link FakeCluster.calls}.
 *
 * Two modes:
 * - **scripted** (`new FakeCluster(reads, writes)`): GETs answer from `reads` in order and status
 *   writes from `writes` (a new `resourceVersion`, or an error to throw); running out of either
 *   fails the test. For the status-write protocol (`kube/status-write.ts`).
 * - **stateful** (`new FakeCluster()` + {@link FakeCluster.put}): holds objects, Secrets and
 *   Namespaces; a status write checks its uid and resourceVersion preconditions as the API
 *   server does (`GoneError`, `ConflictError`), replaces `.status` and bumps the
 *   resourceVersion. For the stage tables. It also serves as an install view: `list`, App
 *   create/update/delete (generation bumped on a spec change, a delete of an object with
 *   finalizers only sets `deletionTimestamp`) and Secret creation (AlreadyExists ignored).
 */
import {
  type ApiServerInfo,
  ConflictError,
  type DeployView,
  type FinalizerResult,
  GoneError,
  type InstallView,
  type KubeConfigMap,
  type KubeNamespace,
  type KubeObject,
  type KubeSecret,
  type ListResult,
  type NewSecret,
  type ResourceKind,
  type ResourceRef,
  type ServiceAccountToken,
  type WritePrecondition,
} from '../../../functions/lib/kube/port.js';

/** The ServiceAccount token {@link FakeCluster.serviceAccountToken} returns unless a test sets {@link FakeCluster.saToken}. */
export const FAKE_SA_TOKEN = 'fake-sa-token';

/** The API server of every {@link FakeCluster}. */
export const FAKE_API_SERVER: ApiServerInfo = { server: 'https://127.0.0.1:6443' };

/**
 * The admission policy bounding `kapp-lambda-pkgr` and its binding as the release installs them
 * (the fields the runtime checks, `functions/lib/deploy/pkgr-admission.ts`): every
 * {@link FakeCluster} starts with both ({@link FakeCluster.admission}).
 */
export const PKGR_ADMISSION_OBJECTS = Object.freeze([
  {
    apiVersion: 'admissionregistration.k8s.io/v1',
    kind: 'ValidatingAdmissionPolicy',
    metadata: { name: 'kapp-lambda-pkgr', uid: 'uid-vap', resourceVersion: '1' },
    spec: { failurePolicy: 'Fail' },
  },
  {
    apiVersion: 'admissionregistration.k8s.io/v1',
    kind: 'ValidatingAdmissionPolicyBinding',
    metadata: { name: 'kapp-lambda-pkgr', uid: 'uid-vapb', resourceVersion: '1' },
    spec: { policyName: 'kapp-lambda-pkgr', validationActions: ['Deny'] },
  },
] as const);

const keyOf = (ref: Pick<ResourceRef, 'kind' | 'namespace' | 'name'>) =>
  `${ref.kind}/${ref.namespace ?? ''}/${ref.name}`;

/** A fake cluster at the port; see the module comment for its two modes. */
export class FakeCluster implements DeployView, InstallView {
  /** Every object read (`['get', name]`) and status write (`['update', name, precondition, status]`), in order. */
  readonly calls: Array<[string, ...unknown[]]> = [];
  /** Stateful mode: the objects, keyed `kind/namespace/name`. */
  readonly objects = new Map<string, KubeObject>();
  /** Stateful mode: Secrets, keyed `namespace/name`. */
  readonly secrets = new Map<string, KubeSecret>();
  /** Stateful mode: ConfigMaps, keyed `namespace/name`. */
  readonly configMaps = new Map<string, KubeConfigMap>();
  /**
   * The admission policy bounding `kapp-lambda-pkgr` and its binding, by kind (both modes;
   * {@link PKGR_ADMISSION_OBJECTS} at first): apart from {@link objects}, which tests read as the
   * objects under reconcile. A test deletes or replaces an entry.
   */
  readonly admission = new Map<string, KubeObject>(
    PKGR_ADMISSION_OBJECTS.map((o) => [o.kind, structuredClone(o) as unknown as KubeObject]),
  );
  /** Stateful mode: Namespaces by name (absent: gone). */
  readonly namespaces = new Map<string, KubeNamespace>();
  /**
   * Stateful mode: called before each status write with its 1-based count, so a test can change
   * the cluster between a stage's read (or its copy of the object) and its write. What it throws
   * fails that write (it does not land), as an API server that refuses it.
   */
  onWrite?: (count: number) => void;
  /** The token {@link FakeCluster.serviceAccountToken} mints; a test that looks for it in output sets its own. */
  saToken = FAKE_SA_TOKEN;
  private writeCount = 0;
  private readonly reads: Array<KubeObject | undefined> | undefined;
  private readonly writes: Array<string | Error>;

  /**
   * @param reads - scripted mode: the objects GETs return, in order (`undefined`: 404).
   * @param writes - scripted mode: the `resourceVersion` each status write returns, or the error it throws.
   */
  constructor(reads?: Array<KubeObject | undefined>, writes: Array<string | Error> = []) {
    this.reads = reads;
    this.writes = writes;
  }

  /** Stateful mode: adds or replaces an object (a deep copy). @returns `this`. */
  put(object: KubeObject): this {
    this.objects.set(keyOf({ ...object.metadata, kind: object.kind }), structuredClone(object));
    return this;
  }

  /** Stateful mode: the stored object of `kind` named `namespace/name` (live, not a copy). */
  get(kind: string, namespace: string, name: string): KubeObject | undefined {
    return this.objects.get(keyOf({ kind, namespace, name }));
  }

  /** The status writes so far (their bodies), in order; in stateful mode only those that landed (no 409 or gone). */
  get statuses(): unknown[] {
    return this.calls.filter((c) => c[0] === 'update' && c[4] !== false).map((c) => c[3]);
  }

  async getObject<T extends KubeObject>(ref: ResourceRef): Promise<T | undefined> {
    this.calls.push(['get', ref.name]);
    if (ref.kind.startsWith('ValidatingAdmissionPolicy')) return structuredClone(this.admission.get(ref.kind)) as T;
    if (this.reads) {
      if (this.reads.length === 0) throw new Error('unexpected read');
      return structuredClone(this.reads.shift()) as T | undefined;
    }
    return structuredClone(this.objects.get(keyOf(ref))) as T | undefined;
  }

  async updateStatus(ref: ResourceRef, pre: WritePrecondition, status: unknown): Promise<{ resourceVersion: string }> {
    const call: [string, ...unknown[]] = ['update', ref.name, pre, status];
    this.calls.push(call);
    if (this.reads) {
      const next = this.writes.shift();
      if (next === undefined) throw new Error('unexpected write');
      if (next instanceof Error) throw next;
      return { resourceVersion: next };
    }
    try {
      this.onWrite?.(++this.writeCount);
    } catch (err) {
      call[4] = false;
      throw err;
    }
    const obj = this.objects.get(keyOf(ref));
    if (!obj || obj.metadata.uid !== pre.uid) {
      call[4] = false;
      throw new GoneError(`${ref.kind} ${ref.name} not found`);
    }
    if (obj.metadata.resourceVersion !== pre.resourceVersion) {
      call[4] = false;
      throw new ConflictError(`${ref.name}: 409 conflict`);
    }
    obj.status = structuredClone(status);
    obj.metadata.resourceVersion = String(Number(obj.metadata.resourceVersion) + 1);
    return { resourceVersion: obj.metadata.resourceVersion };
  }

  async getSecret(namespace: string, name: string): Promise<KubeSecret | undefined> {
    const secret = structuredClone(this.secrets.get(`${namespace}/${name}`));
    // structuredClone makes each Buffer a plain Uint8Array; the real client's values are Buffers.
    if (secret) secret.data = Object.fromEntries(Object.entries(secret.data).map(([k, v]) => [k, Buffer.from(v)]));
    return secret;
  }

  async getConfigMap(namespace: string, name: string): Promise<KubeConfigMap | undefined> {
    return structuredClone(this.configMaps.get(`${namespace}/${name}`));
  }

  /**
   * The ConfigMaps of every namespace whose labels match `key` (present) or `key=value`,
   * comma-joined, each through `keep` as the API client passes them.
   */
  async listConfigMaps(
    labelSelector: string,
    keep: (cm: KubeConfigMap) => KubeConfigMap | undefined = (cm) => cm,
  ): Promise<KubeConfigMap[]> {
    this.calls.push(['listConfigMaps', labelSelector]);
    const terms = labelSelector.split(',').map((t) => t.split('=') as [string, string?]);
    const match = (labels: Record<string, string> = {}) =>
      terms.every(([key, value]) => Object.hasOwn(labels, key) && (value === undefined || labels[key] === value));
    const listed = structuredClone([...this.configMaps.values()].filter((cm) => match(cm.metadata.labels)));
    return listed.flatMap((cm) => keep(cm) ?? []);
  }

  async getNamespace(name: string): Promise<KubeNamespace | undefined> {
    return structuredClone(this.namespaces.get(name));
  }

  async addFinalizer(ref: ResourceRef, finalizer: string, opts: { uid?: string } = {}): Promise<FinalizerResult> {
    this.calls.push(['addFinalizer', ref.name, finalizer]);
    const obj = this.objects.get(keyOf(ref));
    if (!obj || (opts.uid && obj.metadata.uid !== opts.uid)) throw new GoneError(`${ref.kind} ${ref.name} not found`);
    const list = obj.metadata.finalizers ?? [];
    if (list.includes(finalizer)) return { changed: false, resourceVersion: obj.metadata.resourceVersion };
    obj.metadata.finalizers = [...list, finalizer];
    obj.metadata.resourceVersion = String(Number(obj.metadata.resourceVersion) + 1);
    return { changed: true, resourceVersion: obj.metadata.resourceVersion };
  }

  async removeFinalizer(ref: ResourceRef, finalizer: string, opts: { uid?: string } = {}): Promise<FinalizerResult> {
    this.calls.push(['removeFinalizer', ref.name, finalizer]);
    const obj = this.objects.get(keyOf(ref));
    if (!obj || (opts.uid && obj.metadata.uid !== opts.uid) || !obj.metadata.finalizers?.includes(finalizer)) {
      return { changed: false, resourceVersion: obj?.metadata.resourceVersion };
    }
    obj.metadata.finalizers = obj.metadata.finalizers.filter((f) => f !== finalizer);
    obj.metadata.resourceVersion = String(Number(obj.metadata.resourceVersion) + 1);
    return { changed: true, resourceVersion: obj.metadata.resourceVersion };
  }

  async list<T extends KubeObject>(kind: ResourceKind, opts: { namespace?: string }): Promise<ListResult<T>> {
    const items = [...this.objects.values()].filter(
      (o) =>
        o.kind === kind.kind &&
        o.apiVersion === kind.apiVersion &&
        (opts.namespace === undefined || o.metadata.namespace === opts.namespace),
    );
    return { items: structuredClone(items) as T[], resourceVersion: '1', continue: undefined };
  }

  async createApp<T extends KubeObject>(app: T): Promise<T> {
    this.calls.push(['createApp', app.metadata.name]);
    if (this.objects.has(keyOf({ ...app.metadata, kind: 'App' }))) {
      throw new ConflictError(`apps "${app.metadata.name}" already exists`, { reason: 'AlreadyExists' });
    }
    const stored = structuredClone(app);
    stored.metadata = { ...stored.metadata, uid: `uid-${app.metadata.name}-app`, resourceVersion: '1', generation: 1 };
    this.put(stored);
    return structuredClone(stored);
  }

  async updateApp<T extends KubeObject>(app: T): Promise<T> {
    this.calls.push(['updateApp', app.metadata.name]);
    const cur = this.objects.get(keyOf({ ...app.metadata, kind: 'App' }));
    if (!cur) throw new GoneError(`apps "${app.metadata.name}" not found`);
    if (cur.metadata.resourceVersion !== app.metadata.resourceVersion) throw new ConflictError('409 conflict');
    const specChanged = JSON.stringify(cur.spec) !== JSON.stringify(app.spec);
    const next: KubeObject = { ...structuredClone(app), status: cur.status };
    next.metadata = {
      ...next.metadata,
      resourceVersion: String(Number(cur.metadata.resourceVersion) + 1),
      generation: (cur.metadata.generation ?? 1) + (specChanged ? 1 : 0),
    };
    this.put(next);
    return structuredClone(next) as T;
  }

  async deleteApp(namespace: string, name: string, opts: { uid?: string } = {}): Promise<boolean> {
    this.calls.push(['deleteApp', name]);
    const key = keyOf({ kind: 'App', namespace, name });
    const cur = this.objects.get(key);
    if (!cur || (opts.uid && cur.metadata.uid !== opts.uid)) return false;
    if (cur.metadata.finalizers?.length) cur.metadata.deletionTimestamp = '2025-01-01T00:00:00Z';
    else this.objects.delete(key);
    return true;
  }

  async createSecret(secret: NewSecret): Promise<boolean> {
    this.calls.push(['createSecret', secret.metadata.name]);
    const key = `${secret.metadata.namespace}/${secret.metadata.name}`;
    if (this.secrets.has(key)) return false;
    this.secrets.set(key, {
      metadata: { ...secret.metadata, uid: `uid-${secret.metadata.name}`, resourceVersion: '1' },
      type: secret.type,
      data: secret.data,
    } as KubeSecret);
    return true;
  }

  /** Records `['serviceAccountToken', '<ns>/<name>']`, and the lifetime asked when one is. */
  async serviceAccountToken(namespace: string, name: string, expirationSeconds?: number): Promise<ServiceAccountToken> {
    this.calls.push(['serviceAccountToken', `${namespace}/${name}`, ...(expirationSeconds ? [expirationSeconds] : [])]);
    return { token: this.saToken, expiresAt: new Date('2025-01-01T02:00:00Z') };
  }

  async serverVersion(): Promise<string> {
    return '1.34.4';
  }

  async apiGroupVersions(): Promise<string[]> {
    return ['v1'];
  }

  apiServer(): ApiServerInfo {
    return FAKE_API_SERVER;
  }
}
