/**
 * The Kubernetes port of the core: interfaces and error classes only, no I/O.
 *
 * Split by capability so the types show who may do what (DESIGN.md "Credentials"):
 * the fetch and template stages get {@link FetchView} (read the App and the Secrets and
 * ConfigMaps it references, write status) and never a {@link DeployCredentials}; only the
 * deploy stage gets {@link DeployView}; the forwarder gets {@link WatchView}; the leader
 * election of a runtime that hosts forwarders gets {@link LeaseView} (one Lease, nothing else).
 *
 * Mirrors the `App` vs `CRDApp` split of kapp-controller (`pkg/app/app.go`,
 * `pkg/app/crd_app.go`): the core decides, the adapter (`kubeconfig-registry.ts`) talks
 * to the API server.
 *
 * @module
 */

/** `apiVersion` of `App` (`kappctrl.k14s.io/v1alpha1`). */
export const APP_API_VERSION = 'kappctrl.k14s.io/v1alpha1';
/** `apiVersion` of `PackageInstall` and `PackageRepository` (`packaging.carvel.dev/v1alpha1`). */
export const PACKAGING_API_VERSION = 'packaging.carvel.dev/v1alpha1';
/** `apiVersion` of the aggregated `Package` and `PackageMetadata` (`data.packaging.carvel.dev/v1alpha1`). */
export const DATA_PACKAGING_API_VERSION = 'data.packaging.carvel.dev/v1alpha1';

/** A kind of object: `{ apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' }`. */
export interface ResourceKind {
  /** `group/version`, or `v1` for the core group. */
  apiVersion: string;
  /** Kind in PascalCase, e.g. `App`. */
  kind: string;
}

/**
 * A reference to one object. `namespace` is omitted (or `''`) for cluster-scoped kinds
 * such as `Namespace`.
 */
export interface ResourceRef extends ResourceKind {
  /** Namespace of a namespaced object; omit for cluster-scoped kinds. */
  namespace?: string;
  /** `metadata.name`. */
  name: string;
}

/** REST coordinates of a kind: `/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`. */
export interface ResourceType {
  /** API group; `''` for the core group. */
  group: string;
  /** API version, e.g. `v1alpha1`. */
  version: string;
  /** Lower-case plural resource name, e.g. `apps`. */
  plural: string;
  /** Whether objects of this kind live in a namespace. */
  namespaced: boolean;
}

/**
 * The kinds this project reads, writes or watches, keyed by `apiVersion/kind`. Plurals are
 * fixed here rather than discovered (kapp-controller uses generated typed clients, which
 * hard-code them as well). Package and PackageMetadata are served by kapp-controller's
 * aggregated API (`data.packaging.carvel.dev`), the internal CRDs back them.
 */
export const RESOURCE_TYPES: Readonly<Record<string, ResourceType>> = Object.freeze({
  'kappctrl.k14s.io/v1alpha1/App': {
    group: 'kappctrl.k14s.io',
    version: 'v1alpha1',
    plural: 'apps',
    namespaced: true,
  },
  'packaging.carvel.dev/v1alpha1/PackageInstall': {
    group: 'packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'packageinstalls',
    namespaced: true,
  },
  'packaging.carvel.dev/v1alpha1/PackageRepository': {
    group: 'packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'packagerepositories',
    namespaced: true,
  },
  'data.packaging.carvel.dev/v1alpha1/Package': {
    group: 'data.packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'packages',
    namespaced: true,
  },
  'data.packaging.carvel.dev/v1alpha1/PackageMetadata': {
    group: 'data.packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'packagemetadatas',
    namespaced: true,
  },
  'internal.packaging.carvel.dev/v1alpha1/InternalPackage': {
    group: 'internal.packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'internalpackages',
    namespaced: true,
  },
  'internal.packaging.carvel.dev/v1alpha1/InternalPackageMetadata': {
    group: 'internal.packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'internalpackagemetadatas',
    namespaced: true,
  },
  'v1/Secret': { group: '', version: 'v1', plural: 'secrets', namespaced: true },
  'v1/ConfigMap': { group: '', version: 'v1', plural: 'configmaps', namespaced: true },
  'v1/ServiceAccount': { group: '', version: 'v1', plural: 'serviceaccounts', namespaced: true },
  'v1/Namespace': { group: '', version: 'v1', plural: 'namespaces', namespaced: false },
  'coordination.k8s.io/v1/Lease': { group: 'coordination.k8s.io', version: 'v1', plural: 'leases', namespaced: true },
  // The admission policy bounding a PackageRepository's kapp, and its binding, checked before
  // that kapp runs (`../deploy/pkgr-admission.ts`).
  'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy': {
    group: 'admissionregistration.k8s.io',
    version: 'v1',
    plural: 'validatingadmissionpolicies',
    namespaced: false,
  },
  'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding': {
    group: 'admissionregistration.k8s.io',
    version: 'v1',
    plural: 'validatingadmissionpolicybindings',
    namespaced: false,
  },
});

/**
 * A kind outside {@link RESOURCE_TYPES} whose REST coordinates were discovered
 * ({@link ObjectWatcher.discover}): the forwarder's drift watches of what Apps deployed, whose
 * kinds are whatever the Apps' manifests hold.
 */
export interface DiscoveredKind extends ResourceKind {
  /** The discovered coordinates (the group's preferred version). */
  readonly type: ResourceType;
}

/**
 * Resolves a kind to its REST coordinates (see {@link RESOURCE_TYPES}); a {@link DiscoveredKind}
 * carries its own.
 *
 * @throws TypeError for a kind not in the table (no guessing of plurals).
 */
export function resourceFor(kind: ResourceKind): ResourceType {
  const discovered = (kind as Partial<DiscoveredKind>).type;
  if (discovered) return discovered;
  const type = RESOURCE_TYPES[`${kind.apiVersion}/${kind.kind}`];
  if (!type) throw new TypeError(`unknown resource kind ${kind.apiVersion}/${kind.kind}`);
  return type;
}

/** `kind namespace/name` (or `kind name`) for messages; never includes object contents. */
export function describeRef(ref: ResourceRef): string {
  return ref.namespace ? `${ref.kind} ${ref.namespace}/${ref.name}` : `${ref.kind} ${ref.name}`;
}

/** The part of `metadata` the core uses. Unknown fields are preserved by adapters. */
export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid: string;
  /** Opaque; compare for equality only. */
  resourceVersion: string;
  /** Bumped by the API server on every spec change (CRDs with a status subresource). */
  generation?: number;
  /** RFC 3339 timestamp; set once deletion was requested. */
  deletionTimestamp?: string;
  finalizers?: string[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: Array<{
    apiVersion: string;
    kind: string;
    name: string;
    uid: string;
    controller?: boolean;
    blockOwnerDeletion?: boolean;
  }>;
  creationTimestamp?: string;
  [extra: string]: unknown;
}

/** Any Kubernetes object as read from the API server (`apiVersion` and `kind` always set). */
export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  spec?: unknown;
  status?: unknown;
  [extra: string]: unknown;
}

/** A Secret with its `data` base64-decoded (`stringData` is write-only and never returned). */
export interface KubeSecret {
  metadata: ObjectMeta;
  /** e.g. `Opaque`, `kubernetes.io/dockerconfigjson`. */
  type: string;
  /** Decoded values; `{}` when the Secret has no data. */
  data: Record<string, Buffer>;
}

/** A ConfigMap. */
export interface KubeConfigMap {
  metadata: ObjectMeta;
  /** `{}` when absent. */
  data: Record<string, string>;
  /** Decoded `binaryData`; `{}` when absent. */
  binaryData: Record<string, Buffer>;
}

/** A Namespace; `phase` is `Terminating` once its deletion started. */
export interface KubeNamespace {
  metadata: ObjectMeta;
  phase: 'Active' | 'Terminating' | string;
}

/** Reads objects. All methods return `undefined` on 404 and throw {@link KubeApiError} otherwise. */
export interface KubeReader {
  /**
   * GETs one object (any kind in {@link RESOURCE_TYPES}).
   *
   * @returns the object, or `undefined` when it does not exist (404).
   * @throws KubeApiError on any other API failure; TypeError for an unknown kind.
   */
  getObject<T extends KubeObject = KubeObject>(ref: ResourceRef): Promise<T | undefined>;
  /** GETs a Secret (for fetch credentials and `spec.cluster.kubeconfigSecretRef`). */
  getSecret(namespace: string, name: string): Promise<KubeSecret | undefined>;
  /** GETs a ConfigMap (for template values). */
  getConfigMap(namespace: string, name: string): Promise<KubeConfigMap | undefined>;
  /** GETs a Namespace (`noopDeleteDueToTerminatingNamespaces`, `pkg/app/app.go`). */
  getNamespace(name: string): Promise<KubeNamespace | undefined>;
}

/**
 * Lists ConfigMaps by label across the cluster: kapp's app records (`kapp.k14s.io/is-app`), for
 * the PackageRepository record check (`../deploy/kapp-record.ts`). Needs `list` on
 * `configmaps` cluster-wide.
 */
export interface ConfigMapLister {
  /**
   * Every ConfigMap of every namespace matching `labelSelector` (all pages, 50 a page).
   *
   * @param keep - when given, each ConfigMap as its page brings it goes through it and only what
   *   it returns is held (`undefined`: dropped): any tenant can label its ConfigMaps (up to 1 MiB
   *   each) as the list selects, so a caller that needs a little of each holds only that.
   * @throws KubeApiError on any API failure (403 included).
   */
  listConfigMaps(
    labelSelector: string,
    keep?: (cm: KubeConfigMap) => KubeConfigMap | undefined,
  ): Promise<KubeConfigMap[]>;
}

/** Preconditions of a status write: the object read before computing the new status. */
export interface WritePrecondition {
  /** `metadata.resourceVersion` that was read; the write fails with 409 if it moved. */
  resourceVersion: string;
  /** `metadata.uid` that was read; a different object with the same name is "gone". */
  uid: string;
}

/** Writes the status subresource. */
export interface StatusWriter {
  /**
   * Replaces `.status` through the `/status` subresource (PUT) with optimistic
   * concurrency on `resourceVersion` (kapp-controller `pkg/app/crd_app.go` `updateStatus`
   * uses `UpdateStatus` the same way). Spec and metadata are not changed.
   *
   * @returns the new `metadata.resourceVersion`, and `object`, the whole object as the API server
   *   answered the write, when the writer has it (a status write after it plans on it instead of
   *   reading the object again). The API client asks for the metadata only (a PackageRepository
   *   holds its whole inline repository) and returns no `object`: `writeStatus` then plans on
   *   the copy it wrote with the written status and the new resourceVersion.
   * @throws ConflictError on 409 (resourceVersion moved); re-read and retry.
   * @throws GoneError on 404, or when the object now has another uid.
   * @throws KubeApiError on any other API failure.
   */
  updateStatus(
    ref: ResourceRef,
    precondition: WritePrecondition,
    status: unknown,
  ): Promise<{ resourceVersion: string; object?: KubeObject }>;
}

/** Result of a finalizer change. */
export interface FinalizerResult {
  /** `false` when the finalizer was already present (add) or absent / object gone (remove). */
  changed: boolean;
  /** `metadata.resourceVersion` after the call; `undefined` when the object is gone. */
  resourceVersion: string | undefined;
}

/** Optional fencing for finalizer changes. */
export interface FinalizerOptions {
  /** Expected `metadata.uid`; a different uid is treated as a different object (gone). */
  uid?: string;
  /**
   * The object as the caller holds it (its metadata is all that is used): the first attempt
   * plans on it instead of a GET, as kapp-controller's `blockDeletion` decides on its own copy
   * (`pkg/app/crd_app.go`). A finalizer already on the copy means no request at all; a copy
   * older than the stored object only costs a 409 and the usual re-read.
   */
  object?: KubeObject;
}

/**
 * Adds and removes finalizers. Both calls are idempotent: they GET the object (or take the
 * caller's copy, {@link FinalizerOptions.object}), return
 * `changed: false` if nothing is to do, otherwise write `metadata.finalizers` with a
 * `resourceVersion` precondition and retry on 409 (up to 5 attempts, as `crd_app.go`).
 * Mirrors `pkg/app/finalizer.go` / `pkg/packageinstall/finalizer.go`; names in
 * kapp-controller.md Appendix B.
 */
export interface FinalizerWriter {
  /**
   * @throws GoneError when the object does not exist or has another uid.
   * @throws ConflictError when 5 attempts all conflicted.
   * @throws KubeApiError on any other API failure (e.g. 422 when the object is being deleted).
   */
  addFinalizer(ref: ResourceRef, finalizer: string, options?: FinalizerOptions): Promise<FinalizerResult>;
  /**
   * Removing the last finalizer of an object with a `deletionTimestamp` lets it disappear.
   * A missing object (or another uid) is not an error: `changed: false`.
   *
   * @throws ConflictError when 5 attempts all conflicted.
   * @throws KubeApiError on any other API failure.
   */
  removeFinalizer(ref: ResourceRef, finalizer: string, options?: FinalizerOptions): Promise<FinalizerResult>;
}

/** A short-lived ServiceAccount token from the TokenRequest API. Never log it. */
export interface ServiceAccountToken {
  /** Bearer token. Secret. */
  token: string;
  /** When the API server says it expires (`status.expirationTimestamp`). */
  expiresAt: Date;
}

/**
 * How to reach the API server, for the kubeconfig kapp gets (kapp-controller
 * `pkg/kubeconfig/service_accounts.go`). Contains no user credentials.
 */
export interface ApiServerInfo {
  /** `https://host:port`. */
  server: string;
  /** `certificate-authority-data`: base64 of the PEM CA bundle, when the cluster has one. */
  caData?: string;
  /** `tls-server-name`. */
  tlsServerName?: string;
  /** `insecure-skip-tls-verify`. */
  insecureSkipTlsVerify?: boolean;
}

/** What only the deploy stage may do: mint tokens and inspect the API server. */
export interface DeployCredentials {
  /**
   * GETs the ServiceAccount, then creates a TokenRequest (`serviceaccounts/token`).
   * Mirrors `pkg/kubeconfig/service_accounts.go` and `pkg/satoken/token_manager.go`.
   *
   * @param expirationSeconds token lifetime in seconds; default 7200 (upstream).
   * @throws KubeApiError with message `Getting service account: <API message>` when the GET
   *   fails (e.g. `Getting service account: serviceaccounts "x" not found`), or
   *   `Getting service account token: <API message>` when the TokenRequest fails.
   */
  serviceAccountToken(
    namespace: string,
    serviceAccount: string,
    expirationSeconds?: number,
  ): Promise<ServiceAccountToken>;
  /**
   * The token {@link serviceAccountToken} last made for this ServiceAccount and lifetime, while it
   * is fresh, with no request at all (no GET of the ServiceAccount): `undefined` when there is
   * none. Only for a request that itself proves the identity is still valid (the API server
   * refuses a token whose ServiceAccount was deleted or recreated), as the no-op resync's list
   * of the App's resources does: whatever that list cannot do runs the full path, which reads
   * the ServiceAccount as upstream. Optional: a client without a token cache has none.
   */
  cachedServiceAccountToken?(
    namespace: string,
    serviceAccount: string,
    expirationSeconds?: number,
  ): ServiceAccountToken | undefined;
  /**
   * `GET /version` as `major.minor.patch` (e.g. `v1.34.4+k3s1` → `1.34.4`; pre-release and
   * build metadata stripped), as `pkg/componentinfo/component_info.go`.
   *
   * @throws KubeApiError on failure.
   */
  serverVersion(): Promise<string>;
  /**
   * Every served group/version (`v1`, `apps/v1`, `kappctrl.k14s.io/v1alpha1`, …), from
   * `/api` and `/apis`, in discovery order, as `metav1.ExtractGroupVersions` (for helm
   * `--api-versions`).
   *
   * @throws KubeApiError on failure.
   */
  apiGroupVersions(): Promise<string[]>;
  /** Server address and CA of this cluster, from its configuration (no I/O). */
  apiServer(): ApiServerInfo;
}

/** One page of a list. */
export interface ListResult<T extends KubeObject = KubeObject> {
  /** Items with `apiVersion` and `kind` filled in. */
  items: T[];
  /** The list's `metadata.resourceVersion`: start a watch from here. */
  resourceVersion: string;
  /** Token for the next page; `undefined` on the last page. */
  continue: string | undefined;
}

/** Options of {@link ObjectWatcher.list}. */
export interface ListOptions {
  /** Omit to list across all namespaces. */
  namespace?: string;
  /** Page size; the API server may return fewer. */
  limit?: number;
  /** `continue` token of the previous page. */
  continue?: string;
  /** Field selector, e.g. `metadata.name=kapp-controller-config` (one object, a cheap watch). */
  fieldSelector?: string;
  /** Label selector, e.g. `kapp.k14s.io/app` (every object kapp deployed). */
  labelSelector?: string;
  /**
   * Ask for `PartialObjectMetadata` (metadata only: no spec, data or status), as client-go's
   * metadata informers do; an adapter that cannot ask for it returns whole objects.
   */
  metadataOnly?: boolean;
}

/** Options of {@link ObjectWatcher.watch}. */
export interface WatchOptions {
  /** Start after this resourceVersion (from a list or the last event/bookmark). */
  resourceVersion: string;
  /** Always `true`: bookmarks keep the resourceVersion fresh so restarts avoid 410. */
  allowWatchBookmarks: true;
  /** Server-side timeout in seconds; the watch then ends normally. */
  timeoutSeconds?: number;
  /** Omit to watch all namespaces. */
  namespace?: string;
  /** Field selector; the same as the list's the watch resumes. */
  fieldSelector?: string;
  /** Label selector; the same as the list's the watch resumes. */
  labelSelector?: string;
  /** See {@link ListOptions.metadataOnly}. */
  metadataOnly?: boolean;
}

/** One watch event. For `BOOKMARK`, only `object.metadata.resourceVersion` is meaningful. */
export interface WatchEvent<T extends KubeObject = KubeObject> {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK';
  object: T;
}

/** List and watch for the in-cluster forwarder (informer-style, without a cache). */
export interface ObjectWatcher {
  /**
   * Lists one page of objects.
   *
   * @throws WatchGoneError on 410 (an expired `continue` token); restart the list.
   * @throws KubeApiError on any other API failure.
   */
  list<T extends KubeObject = KubeObject>(resource: ResourceKind, options: ListOptions): Promise<ListResult<T>>;
  /**
   * Watches from `resourceVersion`, calling `onEvent` synchronously per event in order.
   * Resolves when the server ends the watch (e.g. after `timeoutSeconds`) or `signal`
   * aborts. An exception thrown by `onEvent` ends the watch and rejects with it.
   *
   * @throws WatchGoneError when the resourceVersion is too old (HTTP 410 or an `ERROR`
   *   event with code 410, "Expired"): list again.
   * @throws KubeApiError on any other API failure.
   */
  watch<T extends KubeObject = KubeObject>(
    resource: ResourceKind,
    options: WatchOptions,
    onEvent: (event: WatchEvent<T>) => void,
    signal?: AbortSignal,
  ): Promise<void>;
  /**
   * The REST coordinates of a group and kind (API discovery: the group's preferred version),
   * so kinds outside {@link RESOURCE_TYPES} can be listed and watched; `undefined` when the
   * server does not serve the kind (a CRD not installed, or removed).
   *
   * @param group - API group, `''` for the core group.
   * @param kind - Kind in PascalCase.
   * @throws KubeApiError when discovery fails.
   */
  discover(group: string, kind: string): Promise<DiscoveredKind | undefined>;
}

/**
 * `spec` of a `coordination.k8s.io/v1` Lease as leader election uses it (client-go
 * `tools/leaderelection/resourcelock/leaselock.go` `LeaderElectionRecord`). Times are RFC 3339
 * `MicroTime` strings as the API server serializes them.
 */
export interface LeaseSpec {
  /** Who holds the lease; `''` or absent: nobody (released). */
  holderIdentity?: string;
  /** How long, in whole seconds, a candidate waits after seeing the lease last change before taking it. */
  leaseDurationSeconds?: number;
  /** When the current holder acquired it. */
  acquireTime?: string;
  /** When the current holder last renewed it. */
  renewTime?: string;
  /** How many times the holder changed. */
  leaseTransitions?: number;
}

/** A Lease: its metadata (`resourceVersion` is the optimistic-concurrency token) and spec. */
export interface Lease {
  metadata: ObjectMeta;
  spec: LeaseSpec;
}

/**
 * One Lease per call, for leader election (`coordination.k8s.io/v1`, verbs get, create,
 * update). Mirrors client-go's `LeaseLock` (`Get`, `Create`, `Update`).
 */
export interface LeaseView {
  /**
   * GETs a Lease.
   *
   * @returns the Lease, or `undefined` on 404.
   * @throws KubeApiError on any other API failure.
   */
  getLease(namespace: string, name: string): Promise<Lease | undefined>;
  /**
   * POSTs a new Lease.
   *
   * @throws ConflictError on 409 (it already exists: someone else created it first).
   * @throws KubeApiError on any other API failure (e.g. 404 when the namespace does not exist).
   */
  createLease(namespace: string, name: string, spec: LeaseSpec): Promise<Lease>;
  /**
   * PUTs the Lease's spec with a `resourceVersion` precondition (labels and annotations are
   * not kept; a lease used for election has none).
   *
   * @throws ConflictError on 409 (it changed since `resourceVersion` was read).
   * @throws KubeApiError on any other API failure (404 when it was deleted).
   */
  updateLease(namespace: string, name: string, resourceVersion: string, spec: LeaseSpec): Promise<Lease>;
}

/** A Secret to create: `data` as bytes (base64-encoded by the adapter). */
export interface NewSecret {
  metadata: Pick<ObjectMeta, 'name' | 'namespace' | 'annotations' | 'labels' | 'ownerReferences'>;
  /** e.g. `kubernetes.io/dockerconfigjson`. */
  type: string;
  data: Record<string, Buffer>;
}

/**
 * The writes of the install function (kapp-controller `pkg/packageinstall/packageinstall.go`):
 * create, update and delete the App it generates for a PackageInstall, and create the
 * placeholder Secrets of its fetch steps. Nothing else: Apps only, and Secrets only created
 * (never read back through this interface, never updated).
 */
export interface AppWriter {
  /**
   * POSTs a new App (`metadata.resourceVersion` must be absent).
   *
   * @returns the App as stored.
   * @throws ConflictError (reason `AlreadyExists`) when an object of that name exists.
   * @throws KubeApiError on any other API failure.
   */
  createApp<T extends KubeObject>(app: T): Promise<T>;
  /**
   * PUTs an App (spec and metadata; the status subresource is untouched) with its
   * `metadata.resourceVersion` as the optimistic-concurrency check (upstream `Update`).
   *
   * @returns the App as stored.
   * @throws ConflictError on 409 (it changed since it was read).
   * @throws GoneError on 404.
   * @throws KubeApiError on any other API failure.
   */
  updateApp<T extends KubeObject>(app: T): Promise<T>;
  /**
   * DELETEs an App (background propagation), with a uid precondition when `uid` is given.
   *
   * @returns false when it did not exist (404) or has another uid (409 precondition).
   * @throws KubeApiError on any other API failure.
   */
  deleteApp(namespace: string, name: string, options?: { uid?: string }): Promise<boolean>;
  /**
   * POSTs a Secret.
   *
   * @returns false when a Secret of that name already exists (409 AlreadyExists: upstream
   *   ignores it, the placeholder is created idempotently).
   * @throws KubeApiError on any other API failure.
   */
  createSecret(secret: NewSecret): Promise<boolean>;
}

/** A core/v1 Event about an object (`./events.ts` writes it). */
export interface NewEvent {
  /** The Event's name: the same name again adds to the existing Event's count. */
  name: string;
  /** The object the Event is about (its namespace is the Event's). */
  involvedObject: { apiVersion: string; kind: string; namespace: string; name: string; uid: string };
  /** `Normal` or `Warning`. */
  type: 'Normal' | 'Warning';
  /** CamelCase reason, e.g. `ReconcileFailed`. */
  reason: string;
  /** Human-readable text, already bounded and redacted by the caller. */
  message: string;
  /** `source.component`, e.g. `kapp-lambda`. */
  component: string;
  /** When it happened (`firstTimestamp` of a new Event, `lastTimestamp` always). */
  at: Date;
}

/** Writes core/v1 Events (`create`, `get`, `patch` on `events`), nothing else. */
export interface EventWriter {
  /**
   * Creates the Event, or, when one of that name exists, adds one to its `count` and moves its
   * `lastTimestamp` (client-go's event aggregation).
   *
   * @returns `created` or `updated`.
   * @throws KubeApiError when the API server refuses or cannot be reached.
   */
  writeEvent(event: NewEvent): Promise<'created' | 'updated'>;
}

/** Everything one cluster offers. Only the registry and tests hold this. */
export type KubeClient = KubeReader &
  ConfigMapLister &
  StatusWriter &
  FinalizerWriter &
  DeployCredentials &
  ObjectWatcher &
  LeaseView &
  AppWriter &
  EventWriter;

/** Fetch and template stages: read the App and its referenced Secrets/ConfigMaps, write status. No finalizers, no tokens. */
export type FetchView = KubeReader & StatusWriter;

/**
 * Deploy stage (and deletion), and the index-repo function: no list/watch of objects; only the
 * label-selected ConfigMap list of kapp's records ({@link ConfigMapLister}).
 */
export type DeployView = KubeReader & ConfigMapLister & StatusWriter & FinalizerWriter & DeployCredentials;

/**
 * The install function (PackageInstall reconcile): read and list (Packages through the
 * resolver, `../packaging/resolver.ts`), status and finalizers of the PackageInstall, the App
 * and placeholder Secret writes ({@link AppWriter}) and the server version (the Packages'
 * `kubernetesVersionSelection`). No tokens, no watch: the App it writes is deployed by the App
 * pipeline with the App's own ServiceAccount.
 */
export type InstallView = KubeReader &
  StatusWriter &
  FinalizerWriter &
  AppWriter &
  Pick<ObjectWatcher, 'list'> &
  Pick<DeployCredentials, 'serverVersion'>;

/** The forwarder: read, list and watch; no writes, no tokens. */
export type WatchView = KubeReader & ObjectWatcher;

/**
 * Clusters this runtime serves, by cluster id (the id events carry). Clients are created
 * once per cluster and reused. Views are distinct objects that expose only their methods,
 * so a narrowed view cannot be cast back to a full client at run time.
 */
export interface ClusterRegistry {
  /** Known cluster ids, sorted. */
  clusterIds(): string[];
  /** @throws UnknownClusterError */
  client(clusterId: string): KubeClient;
  /** @throws UnknownClusterError */
  fetchView(clusterId: string): FetchView;
  /** @throws UnknownClusterError */
  deployView(clusterId: string): DeployView;
  /** @throws UnknownClusterError */
  watchView(clusterId: string): WatchView;
  /**
   * The install function's view. Optional so that registries of runtimes without an install
   * function (and test registries) need not offer it; the install function fails its event
   * when absent.
   *
   * @throws UnknownClusterError
   */
  installView?(clusterId: string): InstallView;
  /**
   * The cluster's Event writer (reconcile Events on Apps, PackageInstalls and
   * PackageRepositories). Optional: a registry without one records no Events.
   *
   * @throws UnknownClusterError
   */
  eventWriter?(clusterId: string): EventWriter;
  /**
   * Loads a cluster before its views are used, for registries that look clusters up at run
   * time (`fleet-registry.ts`); absent when every cluster is known up front. Callers run it
   * once per record, before the stage.
   *
   * @throws UnknownClusterError
   */
  prepare?(clusterId: string): Promise<void>;
  /**
   * The `metadata.uid` of the cluster's packaging global namespace as its registry document
   * records it (`packagingGlobalNamespaceUid`, written by `npm run cluster -- join`), read from
   * what {@link prepare} loaded. Optional, and `undefined` when nothing is recorded: registries
   * without documents (kubeconfig clusters) record it in the cluster's `kapp-controller-config`.
   */
  packagingGlobalNamespaceUid?(clusterId: string): string | undefined;
}

/** Options of the error classes below. */
export interface KubeErrorOptions {
  /** HTTP status code from the API server; `undefined` when no response was received. */
  statusCode?: number;
  /** `Status.reason` (e.g. `NotFound`, `Conflict`, `Expired`). */
  reason?: string;
  /** The underlying error. */
  cause?: unknown;
}

/**
 * A failed API call. `message` is short: `<action>: <status code> <API server message>`
 * (no tokens, keys or kubeconfig contents); the original error is in `cause`.
 */
export class KubeApiError extends Error {
  /** HTTP status code; `undefined` for transport errors. */
  readonly statusCode: number | undefined;
  /** `Status.reason`, when the server sent one. */
  readonly reason: string | undefined;
  constructor(message: string, options: KubeErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'KubeApiError';
    this.statusCode = options.statusCode;
    this.reason = options.reason;
  }
}

/** 409: the object changed since it was read (stale `resourceVersion`). Re-read and retry. */
export class ConflictError extends KubeApiError {
  constructor(message: string, options: KubeErrorOptions = {}) {
    super(message, { ...options, statusCode: options.statusCode ?? 409 });
    this.name = 'ConflictError';
  }
}

/** The object is gone: 404, or the name now belongs to an object with another uid. */
export class GoneError extends KubeApiError {
  constructor(message: string, options: KubeErrorOptions = {}) {
    super(message, options);
    this.name = 'GoneError';
  }
}

/** 410 Expired on list/watch: the resourceVersion or continue token is too old; list again. */
export class WatchGoneError extends KubeApiError {
  constructor(message: string, options: KubeErrorOptions = {}) {
    super(message, {
      ...options,
      statusCode: options.statusCode ?? 410,
      reason: options.reason ?? 'Expired',
    });
    this.name = 'WatchGoneError';
  }
}

/** An event named a cluster id the registry does not know. */
export class UnknownClusterError extends Error {
  /** The unknown id. */
  readonly clusterId: string;
  constructor(clusterId: string) {
    super(`unknown cluster id ${JSON.stringify(clusterId)}`);
    this.name = 'UnknownClusterError';
    this.clusterId = clusterId;
  }
}
