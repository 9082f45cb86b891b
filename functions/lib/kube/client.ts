/**
 * {@link KubeClient} over two small transports (see `transport.ts`): builds paths,
 * preconditions and retries, and maps API answers to the port's errors. Mirrors the
 * I/O half of kapp-controller's `pkg/app/crd_app.go` (status and finalizer writes),
 * `pkg/kubeconfig/service_accounts.go` (TokenRequest) and
 * `pkg/componentinfo/component_info.go` (server version, API group versions).
 *
 * @module
 */

import { writeCoreEvent } from './events.js';
import {
  METADATA_LIST_ACCEPT,
  METADATA_ONLY_ACCEPT,
  type RestRequest,
  type RestResponse,
  type RestTransport,
  WatchHttpError,
  type WatchTransport,
} from './http.js';
import {
  APP_API_VERSION,
  type ApiServerInfo,
  ConflictError,
  type DiscoveredKind,
  describeRef,
  type FinalizerOptions,
  type FinalizerResult,
  GoneError,
  KubeApiError,
  type KubeClient,
  type KubeConfigMap,
  type KubeNamespace,
  type KubeObject,
  type KubeSecret,
  type Lease,
  type LeaseSpec,
  type ListOptions,
  type ListResult,
  type NewEvent,
  type NewSecret,
  type ObjectMeta,
  type ResourceKind,
  type ResourceRef,
  type ResourceType,
  resourceFor,
  type ServiceAccountToken,
  type WatchEvent,
  WatchGoneError,
  type WatchOptions,
  type WritePrecondition,
} from './port.js';

/** Attempts of a finalizer change before giving up on 409s (as `crd_app.go`'s 5 retries). */
export const FINALIZER_ATTEMPTS = 5;

/** Default TokenRequest lifetime in seconds (`pkg/kubeconfig/service_accounts.go`). */
export const DEFAULT_TOKEN_EXPIRATION_SECONDS = 7200;

/** Dependencies of {@link KubeApiClient}. */
export interface KubeApiClientOptions {
  /** JSON requests. */
  rest: RestTransport;
  /** Watch streams. */
  watch: WatchTransport;
  /** Address and CA of the API server, returned by `apiServer()`. */
  apiServer: ApiServerInfo;
  /** Clock of the ServiceAccount token cache; default `() => new Date()`. Tests fix it. */
  now?: () => Date;
}

/** ServiceAccount tokens one client keeps at most ({@link ServiceAccountTokens}); the oldest goes first. */
export const TOKEN_CACHE_ENTRIES = 1024;

/**
 * Margin before a cached token's refresh point at which it is no longer handed out, ms: 10 000
 * (upstream's refresh jitter, at its largest, so a token is never used later than upstream's).
 */
export const TOKEN_REFRESH_MARGIN_MS = 10_000;

/**
 * Page size of {@link KubeApiClient.listConfigMaps}: 50, not client-go's 500: a ConfigMap may
 * hold 1 MiB and any tenant can label its own as a kapp app record, so a page is bounded to about
 * 50 MiB in memory (the list runs in every PackageRepository's record check).
 */
const CONFIG_MAP_PAGE = 50;

/**
 * The TokenRequest tokens of one cluster's ServiceAccounts, as kapp-controller's token manager
 * (`pkg/satoken/token_manager.go`) keeps them: one per ServiceAccount (namespace, name and uid:
 * a recreated ServiceAccount gets a new token) and lifetime asked, reused until half its lifetime
 * has passed (less {@link TOKEN_REFRESH_MARGIN_MS}), then requested again; at most
 * {@link TOKEN_CACHE_ENTRIES}. Concurrent requests for one ServiceAccount share one
 * TokenRequest; a failed one is not kept. Tokens stay in memory only.
 */
export class ServiceAccountTokens {
  readonly #entries = new Map<
    string,
    { token: Promise<ServiceAccountToken>; refreshAt: number; made?: ServiceAccountToken }
  >();
  /** The key of the last token made per ServiceAccount and lifetime ({@link fresh}). */
  readonly #lastBySa = new Map<string, string>();
  readonly #now: () => Date;

  /** @param now - the clock (refresh points are compared with it). */
  constructor(now: () => Date) {
    this.#now = now;
  }

  /**
   * The cached token for `key`, or the one `request` makes (then kept).
   *
   * @param key - identifies the ServiceAccount and the lifetime asked.
   * @param request - makes a TokenRequest; its time of asking counts as the token's issue time.
   * @param saOf - the ServiceAccount and lifetime without its uid: {@link fresh} finds the token by it.
   * @throws what `request` throws.
   */
  async get(key: string, request: () => Promise<ServiceAccountToken>, saOf?: string): Promise<ServiceAccountToken> {
    const now = this.#now().getTime();
    const entry = this.#entries.get(key);
    if (entry && now < entry.refreshAt) return await entry.token;
    this.#entries.delete(key);
    const token = request();
    // Until the answer comes it may be shared: its refresh point is set from the answer.
    const pending: { token: Promise<ServiceAccountToken>; refreshAt: number; made?: ServiceAccountToken } = {
      token,
      refreshAt: Number.POSITIVE_INFINITY,
    };
    this.#entries.set(key, pending);
    while (this.#entries.size > TOKEN_CACHE_ENTRIES) {
      const oldest = this.#entries.keys().next().value as string;
      this.#entries.delete(oldest);
    }
    try {
      const made = await token;
      pending.refreshAt = now + (made.expiresAt.getTime() - now) / 2 - TOKEN_REFRESH_MARGIN_MS;
      pending.made = made;
      if (saOf) this.#lastBySa.set(saOf, key);
      return made;
    } catch (error) {
      if (this.#entries.get(key) === pending) this.#entries.delete(key);
      throw error;
    }
  }

  /**
   * The last token made for `saOf` (as given to {@link get}) while it is still before its refresh
   * point, without any request; `undefined` when there is none.
   */
  fresh(saOf: string): ServiceAccountToken | undefined {
    const key = this.#lastBySa.get(saOf);
    const entry = key === undefined ? undefined : this.#entries.get(key);
    if (!entry?.made || this.#now().getTime() >= entry.refreshAt) return undefined;
    return entry.made;
  }
}

/**
 * `/api/v1/...` or `/apis/<group>/<version>/...` for a kind, optionally in a namespace.
 * Pure.
 */
export function collectionPath(type: ResourceType, namespace?: string): string {
  const base = type.group === '' ? `/api/${type.version}` : `/apis/${type.group}/${type.version}`;
  const ns = type.namespaced && namespace ? `/namespaces/${encodeURIComponent(namespace)}` : '';
  return `${base}${ns}/${type.plural}`;
}

/**
 * Whether `name` can name an object in a path (client-go's `IsValidPathSegmentName`): not `.` or
 * `..`, no `/` or `%`. The API server reads `secrets/.` as the namespace's Secret list and
 * `secrets/..` as the namespace, and decodes `%2F`: a tenant naming such a Secret would have the
 * reads take the list (every Secret of the namespace, in one answer counted as an empty Secret by
 * the referenced cap) or another object. No kind lets an object have such a name: reading one
 * answers absent, without a request.
 */
export function isPathSegmentName(name: string): boolean {
  return name !== '.' && name !== '..' && !/[/%]/.test(name);
}

/**
 * Path of one object, with an optional subresource (`status`, `token`). Pure.
 *
 * @throws TypeError for an unknown kind, or a namespaced kind without a namespace.
 */
export function objectPath(ref: ResourceRef, subresource?: string): string {
  const type = resourceFor(ref);
  if (type.namespaced && !ref.namespace) {
    throw new TypeError(`${ref.kind} ${ref.name} needs a namespace`);
  }
  const path = `${collectionPath(type, ref.namespace)}/${encodeURIComponent(ref.name)}`;
  return subresource ? `${path}/${subresource}` : path;
}

/** `metav1.Status` fields we read from an error answer. */
interface ApiStatus {
  message?: string;
  reason?: string;
  code?: number;
}

function asStatus(body: unknown): ApiStatus {
  if (body && typeof body === 'object') return body as ApiStatus;
  return {};
}

/**
 * The API server's own message of an error answer (`Status.message`), else a short
 * excerpt of a non-JSON body, else the HTTP status code alone. Never echoes a request.
 */
export function apiMessage(response: RestResponse): string {
  const status = asStatus(response.body);
  if (typeof status.message === 'string' && status.message !== '') return status.message;
  if (typeof response.body === 'string' && response.body !== '') {
    return response.body.length > 200 ? `${response.body.slice(0, 200)}…` : response.body;
  }
  return `HTTP ${response.statusCode}`;
}

/** Cause of an API error: what the server answered, without headers or the request. */
export class ApiResponseError extends Error {
  /** HTTP status code. */
  readonly statusCode: number;
  /** The parsed answer (usually a `metav1.Status`). */
  readonly body: unknown;
  constructor(response: RestResponse) {
    super(`${response.statusCode} ${apiMessage(response)}`);
    this.name = 'ApiResponseError';
    this.statusCode = response.statusCode;
    this.body = response.body;
  }
}

/**
 * Maps a non-2xx answer to the port's error: message `<action>: <code> <API message>`,
 * `cause` an {@link ApiResponseError}. 409 → {@link ConflictError}, 410 →
 * {@link WatchGoneError}, everything else {@link KubeApiError}. Pure.
 */
export function errorFromResponse(action: string, response: RestResponse): KubeApiError {
  const status = asStatus(response.body);
  const options = {
    statusCode: response.statusCode,
    reason: typeof status.reason === 'string' ? status.reason : undefined,
    cause: new ApiResponseError(response),
  };
  const message = `${action}: ${response.statusCode} ${apiMessage(response)}`;
  if (response.statusCode === 409) return new ConflictError(message, options);
  if (response.statusCode === 410) return new WatchGoneError(message, options);
  return new KubeApiError(message, options);
}

/**
 * `v1.34.4+k3s1` / `v1.34.0-rc.1` → `1.34.4` / `1.34.0` (as `semver.ParseTolerant`,
 * then major.minor.patch). Pure.
 *
 * @throws Error when the string has no `major.minor.patch`.
 */
export function parseServerVersion(gitVersion: string): string {
  const match = /^v?(\d+)\.(\d+)\.(\d+)/.exec(gitVersion.trim());
  if (!match) throw new Error(`parsing kubernetes version ${JSON.stringify(gitVersion)}`);
  return `${Number(match[1])}.${Number(match[2])}.${Number(match[3])}`;
}

/**
 * Group/versions from `/api` (`APIVersions`) and `/apis` (`APIGroupList`): core versions
 * first (`v1`), then `<group>/<version>` for every version of every group, in server
 * order, without duplicates (`metav1.ExtractGroupVersions`). Pure.
 */
export function extractGroupVersions(core: unknown, groups: unknown): string[] {
  const out: string[] = [];
  const push = (gv: unknown): void => {
    if (typeof gv === 'string' && gv !== '' && !out.includes(gv)) out.push(gv);
  };
  for (const v of (core as { versions?: unknown[] } | undefined)?.versions ?? []) push(v);
  const list = (groups as { groups?: Array<{ versions?: Array<{ groupVersion?: unknown }> }> })?.groups;
  for (const group of list ?? []) {
    for (const version of group.versions ?? []) push(version.groupVersion);
  }
  return out;
}

/**
 * Sends one request; a transport failure (refused connection, TLS, timeout) becomes a
 * {@link KubeApiError} `<action>: <reason>` (the answer's status is the caller's to judge).
 */
async function sendAs(rest: RestTransport, action: string, request: RestRequest): Promise<RestResponse> {
  try {
    return await rest.send(request);
  } catch (cause) {
    const reason = cause instanceof Error ? cause.message : String(cause);
    throw new KubeApiError(`${action}: ${reason}`, { cause });
  }
}

/** A GET's JSON body; `undefined` on 404. @throws KubeApiError on any other non-200 answer. */
async function getAs<T>(rest: RestTransport, action: string, path: string, accept?: string): Promise<T | undefined> {
  const response = await sendAs(rest, action, { method: 'GET', path, ...(accept ? { accept } : {}) });
  if (response.statusCode === 404) return undefined;
  if (response.statusCode !== 200) throw errorFromResponse(action, response);
  return response.body as T;
}

/**
 * The server version of the cluster behind `rest` (`GET /version`, then
 * {@link parseServerVersion}), as `pkg/componentinfo/component_info.go` reads it: from the
 * App's own cluster, or from the cluster of its kubeconfig Secret over a transport made from it.
 *
 * @throws KubeApiError `getting server version: <reason>` when the call fails or the answer
 *   has no `gitVersion`; Error when `gitVersion` has no `major.minor.patch`.
 */
export async function discoverServerVersion(rest: RestTransport): Promise<string> {
  const action = 'getting server version';
  const info = await getAs<{ gitVersion?: string }>(rest, action, '/version');
  if (!info?.gitVersion) throw new KubeApiError(`${action}: no gitVersion`);
  return parseServerVersion(info.gitVersion);
}

/**
 * Every group/version the cluster behind `rest` serves (`/api` and `/apis`, then
 * {@link extractGroupVersions}).
 *
 * @throws KubeApiError `getting api group versions: <reason>` when a call fails.
 */
export async function discoverApiGroupVersions(rest: RestTransport): Promise<string[]> {
  const action = 'getting api group versions';
  const [core, groups] = await Promise.all([
    getAs<unknown>(rest, action, '/api'),
    getAs<unknown>(rest, action, '/apis'),
  ]);
  return extractGroupVersions(core, groups);
}

/** The reference of an App to write, from its own metadata. */
function appRefOf(app: KubeObject): ResourceRef {
  return { apiVersion: APP_API_VERSION, kind: 'App', namespace: app.metadata.namespace, name: app.metadata.name };
}

function leaseRef(namespace: string, name: string): ResourceRef {
  return { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', namespace, name };
}

/**
 * Decodes a base64 map (`Secret.data`, `ConfigMap.binaryData`). Built with `Object.fromEntries`
 * (own data properties), so a key named `__proto__` stays a data key (masked and digested) and
 * never sets the result's prototype.
 */
function decodeMap(data: unknown): Record<string, Buffer> {
  if (!data || typeof data !== 'object') return {};
  return Object.fromEntries(
    Object.entries(data as Record<string, unknown>).flatMap(([key, value]) =>
      typeof value === 'string' ? [[key, Buffer.from(value, 'base64')]] : [],
    ),
  );
}

/**
 * The adapter behind {@link KubeClient}: one per cluster, created once and reused.
 * Messages never contain tokens, keys or kubeconfig contents.
 */
export class KubeApiClient implements KubeClient {
  readonly #rest: RestTransport;
  readonly #watch: WatchTransport;
  readonly #apiServer: ApiServerInfo;
  readonly #tokens: ServiceAccountTokens;

  /** See {@link KubeApiClientOptions}. */
  constructor(options: KubeApiClientOptions) {
    this.#rest = options.rest;
    this.#watch = options.watch;
    this.#apiServer = Object.freeze({ ...options.apiServer });
    this.#tokens = new ServiceAccountTokens(options.now ?? (() => new Date()));
  }

  async #send(action: string, request: RestRequest): Promise<RestResponse> {
    return await sendAs(this.#rest, action, request);
  }

  /** GET returning `undefined` on 404. */
  async #get<T>(action: string, path: string, accept?: string): Promise<T | undefined> {
    return await getAs<T>(this.#rest, action, path, accept);
  }

  /** {@inheritDoc KubeReader.getObject} */
  async getObject<T extends KubeObject = KubeObject>(ref: ResourceRef): Promise<T | undefined> {
    if (!isPathSegmentName(ref.name)) return undefined;
    const object = await this.#get<T>(`getting ${describeRef(ref)}`, objectPath(ref));
    if (object) {
      object.apiVersion ??= ref.apiVersion;
      object.kind ??= ref.kind;
    }
    return object;
  }

  /** {@inheritDoc KubeReader.getSecret} */
  async getSecret(namespace: string, name: string): Promise<KubeSecret | undefined> {
    if (!isPathSegmentName(name)) return undefined;
    const ref = { apiVersion: 'v1', kind: 'Secret', namespace, name };
    const raw = await this.#get<{ metadata: ObjectMeta; type?: string; data?: unknown }>(
      `getting ${describeRef(ref)}`,
      objectPath(ref),
    );
    if (!raw) return undefined;
    return { metadata: raw.metadata, type: raw.type ?? 'Opaque', data: decodeMap(raw.data) };
  }

  /** {@inheritDoc KubeReader.getConfigMap} */
  async getConfigMap(namespace: string, name: string): Promise<KubeConfigMap | undefined> {
    if (!isPathSegmentName(name)) return undefined;
    const ref = { apiVersion: 'v1', kind: 'ConfigMap', namespace, name };
    const raw = await this.#get<{
      metadata: ObjectMeta;
      data?: Record<string, string>;
      binaryData?: unknown;
    }>(`getting ${describeRef(ref)}`, objectPath(ref));
    if (!raw) return undefined;
    return {
      metadata: raw.metadata,
      data: { ...(raw.data ?? {}) },
      binaryData: decodeMap(raw.binaryData),
    };
  }

  /** {@inheritDoc ConfigMapLister.listConfigMaps} */
  async listConfigMaps(
    labelSelector: string,
    keep: (cm: KubeConfigMap) => KubeConfigMap | undefined = (cm) => cm,
  ): Promise<KubeConfigMap[]> {
    const out: KubeConfigMap[] = [];
    let next: string | undefined;
    do {
      const response = await this.#send('listing configmaps', {
        method: 'GET',
        path: collectionPath(resourceFor({ apiVersion: 'v1', kind: 'ConfigMap' })),
        query: { labelSelector, limit: CONFIG_MAP_PAGE, continue: next },
      });
      if (response.statusCode !== 200) throw errorFromResponse('listing configmaps', response);
      const body = response.body as {
        items?: { metadata: ObjectMeta; data?: Record<string, string>; binaryData?: unknown }[];
        metadata?: { continue?: string };
      };
      for (const raw of body.items ?? []) {
        const kept = keep({
          metadata: raw.metadata,
          data: { ...(raw.data ?? {}) },
          binaryData: decodeMap(raw.binaryData),
        });
        if (kept) out.push(kept);
      }
      next = body.metadata?.continue || undefined;
    } while (next);
    return out;
  }

  /** {@inheritDoc KubeReader.getNamespace} */
  async getNamespace(name: string): Promise<KubeNamespace | undefined> {
    const ref = { apiVersion: 'v1', kind: 'Namespace', name };
    const raw = await this.#get<{ metadata: ObjectMeta; status?: { phase?: string } }>(
      `getting ${describeRef(ref)}`,
      objectPath(ref),
    );
    if (!raw) return undefined;
    return { metadata: raw.metadata, phase: raw.status?.phase ?? 'Active' };
  }

  /** {@inheritDoc StatusWriter.updateStatus} */
  async updateStatus(
    ref: ResourceRef,
    precondition: WritePrecondition,
    status: unknown,
  ): Promise<{ resourceVersion: string; object?: KubeObject }> {
    const action = `updating status of ${describeRef(ref)}`;
    // The /status PUT takes the whole object but keeps everything except .status from
    // the stored one; metadata.resourceVersion is the optimistic-concurrency check and
    // metadata.uid a precondition (a recreated object answers 409 "Precondition failed").
    const metadata: Record<string, string> = {
      name: ref.name,
      resourceVersion: precondition.resourceVersion,
      uid: precondition.uid,
    };
    if (ref.namespace) metadata.namespace = ref.namespace;
    const response = await this.#send(action, {
      method: 'PUT',
      path: objectPath(ref, 'status'),
      // Only the new resourceVersion is read back: the API server answers with the metadata, not
      // the whole object (a PackageRepository holds its inline repository, up to ~1 MB, and its
      // deploy progress is written every 2 s).
      accept: METADATA_ONLY_ACCEPT,
      body: { apiVersion: ref.apiVersion, kind: ref.kind, metadata, status },
    });
    if (response.statusCode === 404) {
      throw new GoneError(`${action}: 404 ${apiMessage(response)}`, {
        statusCode: 404,
        reason: asStatus(response.body).reason,
        cause: new ApiResponseError(response),
      });
    }
    if (response.statusCode === 409 && /\bUID\b/i.test(apiMessage(response))) {
      throw new GoneError(`${action}: 409 ${apiMessage(response)}`, {
        statusCode: 409,
        reason: asStatus(response.body).reason,
        cause: new ApiResponseError(response),
      });
    }
    if (response.statusCode !== 200 && response.statusCode !== 201) {
      throw errorFromResponse(action, response);
    }
    // The answer is `PartialObjectMetadata`, not the object: no `object` is returned, and the
    // caller's next write plans on its own copy with this status and resourceVersion.
    const answered = response.body as { metadata?: { resourceVersion?: string } } | undefined;
    const resourceVersion = answered?.metadata?.resourceVersion;
    // An empty resourceVersion would make the next write unconditional (it would overwrite a
    // newer status): an answer without one is an error, not a success.
    if (!resourceVersion) throw new Error(`${action}: the API server's answer carries no resourceVersion`);
    return { resourceVersion };
  }

  /** {@inheritDoc FinalizerWriter.addFinalizer} */
  addFinalizer(ref: ResourceRef, finalizer: string, options: FinalizerOptions = {}): Promise<FinalizerResult> {
    return this.#changeFinalizers(`adding finalizer to ${describeRef(ref)}`, ref, options, {
      absent: 'gone',
      edit: (list) => (list.includes(finalizer) ? undefined : [...list, finalizer]),
    });
  }

  /** {@inheritDoc FinalizerWriter.removeFinalizer} */
  removeFinalizer(ref: ResourceRef, finalizer: string, options: FinalizerOptions = {}): Promise<FinalizerResult> {
    return this.#changeFinalizers(`removing finalizer from ${describeRef(ref)}`, ref, options, {
      absent: 'noop',
      edit: (list) => (list.includes(finalizer) ? list.filter((f) => f !== finalizer) : undefined),
    });
  }

  async #changeFinalizers(
    action: string,
    ref: ResourceRef,
    options: FinalizerOptions,
    how: { absent: 'gone' | 'noop'; edit: (list: string[]) => string[] | undefined },
  ): Promise<FinalizerResult> {
    const path = objectPath(ref);
    let lastConflict: ConflictError | undefined;
    for (let attempt = 0; attempt < FINALIZER_ATTEMPTS; attempt++) {
      // Metadata only, read and written: all a finalizer change needs of an object that may be large.
      const object =
        attempt === 0 && options.object
          ? options.object
          : await this.#get<KubeObject>(action, path, METADATA_ONLY_ACCEPT);
      if (!object || (options.uid !== undefined && object.metadata.uid !== options.uid)) {
        if (how.absent === 'noop') return { changed: false, resourceVersion: undefined };
        throw new GoneError(`${action}: object not found${object ? ' (uid changed)' : ''}`, {
          statusCode: object ? undefined : 404,
        });
      }
      const current = object.metadata.finalizers ?? [];
      const next = how.edit(current);
      if (!next) return { changed: false, resourceVersion: object.metadata.resourceVersion };
      // A merge patch replaces the whole list; the resourceVersion in the patch makes the
      // server reject it with 409 if anyone changed the object since our GET.
      const response = await this.#send(action, {
        method: 'PATCH',
        path,
        contentType: 'application/merge-patch+json',
        accept: METADATA_ONLY_ACCEPT,
        body: {
          metadata: { resourceVersion: object.metadata.resourceVersion, finalizers: next },
        },
      });
      if (response.statusCode === 200) {
        return {
          changed: true,
          resourceVersion: (response.body as KubeObject).metadata.resourceVersion,
        };
      }
      if (response.statusCode === 404 && how.absent === 'noop') {
        return { changed: false, resourceVersion: undefined };
      }
      if (response.statusCode === 404) {
        // Only after planning on the caller's copy: a GET would have found it gone.
        throw new GoneError(`${action}: object not found`, { statusCode: 404, cause: new ApiResponseError(response) });
      }
      const error = errorFromResponse(action, response);
      if (!(error instanceof ConflictError)) throw error;
      lastConflict = error;
    }
    throw lastConflict ?? new ConflictError(`${action}: conflict`);
  }

  /**
   * {@inheritDoc DeployCredentials.serviceAccountToken}
   *
   * The ServiceAccount is read every time (upstream's `Getting service account`); its token comes
   * from the client's {@link ServiceAccountTokens} while it is fresh, as upstream's token manager.
   */
  async serviceAccountToken(
    namespace: string,
    serviceAccount: string,
    expirationSeconds: number = DEFAULT_TOKEN_EXPIRATION_SECONDS,
  ): Promise<ServiceAccountToken> {
    const ref = { apiVersion: 'v1', kind: 'ServiceAccount', namespace, name: serviceAccount };
    // Upstream (`service_accounts.go`) GETs the SA first and reports client-go's error
    // text, which is the Status message: `Getting service account: serviceaccounts "x" not found`.
    const sa = await this.#send('Getting service account', { method: 'GET', path: objectPath(ref) });
    if (sa.statusCode !== 200) {
      throw new KubeApiError(`Getting service account: ${apiMessage(sa)}`, {
        statusCode: sa.statusCode,
        reason: asStatus(sa.body).reason,
        cause: new ApiResponseError(sa),
      });
    }
    const uid = (sa.body as Partial<KubeObject>).metadata?.uid ?? '';
    const key = JSON.stringify([namespace, serviceAccount, uid, expirationSeconds]);
    const saOf = JSON.stringify([namespace, serviceAccount, expirationSeconds]);
    return await this.#tokens.get(key, () => this.#requestToken(ref, expirationSeconds), saOf);
  }

  /** {@inheritDoc DeployCredentials.cachedServiceAccountToken} */
  cachedServiceAccountToken(
    namespace: string,
    serviceAccount: string,
    expirationSeconds: number = DEFAULT_TOKEN_EXPIRATION_SECONDS,
  ): ServiceAccountToken | undefined {
    return this.#tokens.fresh(JSON.stringify([namespace, serviceAccount, expirationSeconds]));
  }

  async #requestToken(ref: ResourceRef, expirationSeconds: number): Promise<ServiceAccountToken> {
    const response = await this.#send('Getting service account token', {
      method: 'POST',
      path: objectPath(ref, 'token'),
      body: {
        apiVersion: 'authentication.k8s.io/v1',
        kind: 'TokenRequest',
        spec: { expirationSeconds },
      },
    });
    if (response.statusCode !== 200 && response.statusCode !== 201) {
      throw new KubeApiError(`Getting service account token: ${apiMessage(response)}`, {
        statusCode: response.statusCode,
        reason: asStatus(response.body).reason,
        cause: new ApiResponseError(response),
      });
    }
    const status = (response.body as { status?: { token?: string; expirationTimestamp?: string } }).status;
    if (!status?.token || !status.expirationTimestamp) {
      throw new KubeApiError('Getting service account token: empty TokenRequest status');
    }
    return { token: status.token, expiresAt: new Date(status.expirationTimestamp) };
  }

  /** {@inheritDoc DeployCredentials.serverVersion} */
  async serverVersion(): Promise<string> {
    return await discoverServerVersion(this.#rest);
  }

  /** {@inheritDoc DeployCredentials.apiGroupVersions} */
  async apiGroupVersions(): Promise<string[]> {
    return await discoverApiGroupVersions(this.#rest);
  }

  /** {@inheritDoc DeployCredentials.apiServer} */
  apiServer(): ApiServerInfo {
    return { ...this.#apiServer };
  }

  /** {@inheritDoc AppWriter.createApp} */
  async createApp<T extends KubeObject>(app: T): Promise<T> {
    const ref = appRefOf(app);
    const action = `creating ${describeRef(ref)}`;
    const response = await this.#send(action, {
      method: 'POST',
      path: collectionPath(resourceFor(ref), ref.namespace),
      body: app,
    });
    if (response.statusCode !== 201 && response.statusCode !== 200) throw errorFromResponse(action, response);
    return response.body as T;
  }

  /** {@inheritDoc AppWriter.updateApp} */
  async updateApp<T extends KubeObject>(app: T): Promise<T> {
    const ref = appRefOf(app);
    const action = `updating ${describeRef(ref)}`;
    const response = await this.#send(action, { method: 'PUT', path: objectPath(ref), body: app });
    if (response.statusCode === 404) {
      throw new GoneError(`${action}: 404 ${apiMessage(response)}`, {
        statusCode: 404,
        cause: new ApiResponseError(response),
      });
    }
    if (response.statusCode !== 200) throw errorFromResponse(action, response);
    return response.body as T;
  }

  /** {@inheritDoc AppWriter.deleteApp} */
  async deleteApp(namespace: string, name: string, options: { uid?: string } = {}): Promise<boolean> {
    const ref = { apiVersion: APP_API_VERSION, kind: 'App', namespace, name };
    const action = `deleting ${describeRef(ref)}`;
    const response = await this.#send(action, {
      method: 'DELETE',
      path: objectPath(ref),
      body: {
        apiVersion: 'v1',
        kind: 'DeleteOptions',
        propagationPolicy: 'Background',
        ...(options.uid ? { preconditions: { uid: options.uid } } : {}),
      },
    });
    if (response.statusCode === 404) return false;
    if (response.statusCode === 409 && options.uid) return false;
    if (response.statusCode !== 200 && response.statusCode !== 202) throw errorFromResponse(action, response);
    return true;
  }

  /** {@inheritDoc AppWriter.createSecret} */
  async createSecret(secret: NewSecret): Promise<boolean> {
    const namespace = secret.metadata.namespace ?? '';
    const ref = { apiVersion: 'v1', kind: 'Secret', namespace, name: secret.metadata.name };
    const action = `creating ${describeRef(ref)}`;
    const response = await this.#send(action, {
      method: 'POST',
      path: collectionPath(resourceFor(ref), namespace),
      body: {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: secret.metadata,
        type: secret.type,
        data: Object.fromEntries(Object.entries(secret.data).map(([k, v]) => [k, v.toString('base64')])),
      },
    });
    if (response.statusCode === 409 && asStatus(response.body).reason === 'AlreadyExists') return false;
    if (response.statusCode !== 201 && response.statusCode !== 200) throw errorFromResponse(action, response);
    return true;
  }

  /** {@inheritDoc EventWriter.writeEvent} */
  async writeEvent(event: NewEvent): Promise<'created' | 'updated'> {
    return await writeCoreEvent((action, request) => this.#send(action, request), errorFromResponse, event);
  }

  /** {@inheritDoc LeaseView.getLease} */
  async getLease(namespace: string, name: string): Promise<Lease | undefined> {
    const ref = leaseRef(namespace, name);
    return await this.#get<Lease>(`getting ${describeRef(ref)}`, objectPath(ref));
  }

  /** {@inheritDoc LeaseView.createLease} */
  async createLease(namespace: string, name: string, spec: LeaseSpec): Promise<Lease> {
    const ref = leaseRef(namespace, name);
    const action = `creating ${describeRef(ref)}`;
    const response = await this.#send(action, {
      method: 'POST',
      path: collectionPath(resourceFor(ref), namespace),
      body: { apiVersion: ref.apiVersion, kind: ref.kind, metadata: { name, namespace }, spec },
    });
    if (response.statusCode !== 201 && response.statusCode !== 200) throw errorFromResponse(action, response);
    return response.body as Lease;
  }

  /** {@inheritDoc LeaseView.updateLease} */
  async updateLease(namespace: string, name: string, resourceVersion: string, spec: LeaseSpec): Promise<Lease> {
    const ref = leaseRef(namespace, name);
    const action = `updating ${describeRef(ref)}`;
    const response = await this.#send(action, {
      method: 'PUT',
      path: objectPath(ref),
      body: { apiVersion: ref.apiVersion, kind: ref.kind, metadata: { name, namespace, resourceVersion }, spec },
    });
    if (response.statusCode !== 200) throw errorFromResponse(action, response);
    return response.body as Lease;
  }

  /** {@inheritDoc ObjectWatcher.discover} */
  async discover(group: string, kind: string): Promise<DiscoveredKind | undefined> {
    let groupVersion = 'v1';
    if (group !== '') {
      const info = await this.#get<{ preferredVersion?: { groupVersion?: string } }>(
        `discovering ${group}`,
        `/apis/${encodeURIComponent(group)}`,
      );
      const preferred = info?.preferredVersion?.groupVersion;
      if (!preferred) return undefined;
      groupVersion = preferred;
    }
    const list = await this.#get<{ resources?: Array<{ name?: string; kind?: string; namespaced?: boolean }> }>(
      `discovering ${groupVersion}`,
      group === '' ? '/api/v1' : `/apis/${groupVersion.split('/').map(encodeURIComponent).join('/')}`,
    );
    const found = list?.resources?.find((r) => r.kind === kind && typeof r.name === 'string' && !r.name.includes('/'));
    if (!found) return undefined;
    const version = group === '' ? 'v1' : groupVersion.slice(group.length + 1);
    return {
      apiVersion: groupVersion,
      kind,
      type: { group, version, plural: found.name!, namespaced: found.namespaced === true },
    };
  }

  /** {@inheritDoc ObjectWatcher.list} */
  async list<T extends KubeObject = KubeObject>(resource: ResourceKind, options: ListOptions): Promise<ListResult<T>> {
    const type = resourceFor(resource);
    const action = `listing ${type.plural}${type.group ? `.${type.group}` : ''}`;
    const response = await this.#send(action, {
      method: 'GET',
      path: collectionPath(type, options.namespace),
      query: {
        limit: options.limit,
        continue: options.continue,
        fieldSelector: options.fieldSelector,
        labelSelector: options.labelSelector,
      },
      ...(options.metadataOnly ? { accept: METADATA_LIST_ACCEPT } : {}),
    });
    if (response.statusCode !== 200) throw errorFromResponse(action, response);
    const body = response.body as {
      items?: T[];
      metadata?: { resourceVersion?: string; continue?: string };
    };
    const items = (body.items ?? []).map((item) => {
      item.apiVersion ??= resource.apiVersion;
      item.kind ??= resource.kind;
      return item;
    });
    return {
      items,
      resourceVersion: body.metadata?.resourceVersion ?? '',
      continue: body.metadata?.continue || undefined,
    };
  }

  /** {@inheritDoc ObjectWatcher.watch} */
  async watch<T extends KubeObject = KubeObject>(
    resource: ResourceKind,
    options: WatchOptions,
    onEvent: (event: WatchEvent<T>) => void,
    signal?: AbortSignal,
  ): Promise<void> {
    const type = resourceFor(resource);
    const action = `watching ${type.plural}${type.group ? `.${type.group}` : ''}`;
    const query = {
      resourceVersion: options.resourceVersion,
      allowWatchBookmarks: options.allowWatchBookmarks,
      timeoutSeconds: options.timeoutSeconds,
      fieldSelector: options.fieldSelector,
      labelSelector: options.labelSelector,
    };
    let handlerFailed = false;
    try {
      await this.#watch.stream(
        collectionPath(type, options.namespace),
        query,
        (eventType, object) => {
          if (eventType === 'ERROR') {
            // The server reports an expired resourceVersion in-band: an ERROR event whose
            // object is a Status with code 410 (reason Expired or Gone).
            throw errorFromResponse(action, {
              statusCode: asStatus(object).code ?? 500,
              body: object,
            });
          }
          if (
            eventType !== 'ADDED' &&
            eventType !== 'MODIFIED' &&
            eventType !== 'DELETED' &&
            eventType !== 'BOOKMARK'
          ) {
            return;
          }
          const item = object as T;
          item.apiVersion ??= resource.apiVersion;
          item.kind ??= resource.kind;
          try {
            onEvent({ type: eventType, object: item });
          } catch (error) {
            handlerFailed = true;
            throw error;
          }
        },
        signal,
        options.metadataOnly ? METADATA_ONLY_ACCEPT : undefined,
      );
    } catch (error) {
      if (error instanceof WatchHttpError) {
        throw errorFromResponse(action, { statusCode: error.statusCode, body: error.message });
      }
      if (handlerFailed || error instanceof KubeApiError) throw error;
      const reason = error instanceof Error ? error.message : String(error);
      throw new KubeApiError(`${action}: ${reason}`, { cause: error });
    }
  }
}
