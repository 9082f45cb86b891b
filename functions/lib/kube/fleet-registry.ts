/**
 * The fleet's cluster registry, read at run time: one document per cluster
 * (`clusters/<id>.json`, `cluster-doc.ts`) in an object store (S3 for the functions, a
 * directory for the embedded mode and tests), so one function deployment serves every
 * registered cluster and a new cluster needs no redeploy.
 *
 * Each function authenticates as its own stage identity ({@link StoreClusterRegistryOptions.stage}):
 * on EKS its IAM role (mapped by an access entry to the group `kapp-lambda:<stage>`; behind the
 * dispatcher, the token the dispatcher signed with its role, `eksTokens`), otherwise
 * the ServiceAccount token the document names for that stage. What each identity may do is
 * the RBAC in `infra/rbac/`.
 *
 * The {@link ClusterRegistry} interface is synchronous: {@link StoreClusterRegistry.prepare}
 * loads a cluster (document, client, a current token) before a record of that cluster runs, and
 * the views then use what it loaded. Documents are read again after a short TTL; a removed
 * document makes the cluster unknown again.
 *
 * @module
 */
import type { AwsCredentialIdentityProvider } from '@smithy/types';
import type { PipelineStage } from '../api/functions.js';
import type { ObjectStore } from '../store/port.js';
import { type BearerSource, type BearerToken, EksTokenSource, type SecretStore, SecretTokenSource } from './bearer.js';
import { KubeApiClient } from './client.js';
import {
  CLUSTER_ID_PATTERN,
  type ClusterDoc,
  clusterDocKey,
  type EksClusterAuth,
  MAX_CLUSTER_DOC_BYTES,
  parseClusterDoc,
} from './cluster-doc.js';
import type { PlainConnection } from './kubeconfig-auth.js';
import { PlainRestTransport, PlainWatchTransport } from './plain.js';
import { type ApiServerInfo, type ClusterRegistry, UnknownClusterError } from './port.js';
import { rateLimited } from './rate-limit.js';
import { type ClusterViews, clusterViewsOf, ViewsClusterRegistry } from './views-registry.js';

/** Default {@link StoreClusterRegistryOptions.ttlMs}: 60 s. */
export const DEFAULT_CLUSTER_TTL_MS = 60_000;

/** Default {@link StoreClusterRegistryOptions.runtimeTokenValidityMs}: 10 minutes. */
export const DEFAULT_RUNTIME_TOKEN_VALIDITY_MS = 10 * 60_000;

/** Options of {@link StoreClusterRegistry}. */
export interface StoreClusterRegistryOptions {
  /** Where the documents are (`clusters/<id>.json` under the store's root). */
  store: ObjectStore;
  /** The function this registry serves: its identity in each cluster. */
  stage: PipelineStage;
  /** The function role's AWS credentials, for `eks` clusters (the SDK's default chain on Lambda). */
  credentials?: AwsCredentialIdentityProvider;
  /**
   * Where every `eks` cluster's token comes from instead of signing one with `credentials`: a
   * stage behind the dispatcher (docs/decisions.md D15), whose token the dispatcher mints for the
   * one cluster it serves (`RunCredentialHolder.eksToken`). Set, `credentials` signs nothing.
   */
  eksTokens?: BearerSource;
  /** Where `token` clusters' ServiceAccount tokens are (Secrets Manager on Lambda). */
  secrets?: SecretStore;
  /** How long a loaded document (and a token read from the secret store) is used before it is read again, ms. */
  ttlMs?: number;
  /**
   * How long the token in {@link StoreClusterRegistry.runtimeKubeconfig} (and so the stage's
   * requests) must still be valid when `prepare` returns, ms: the longest one event's run takes.
   * Default 10 minutes.
   */
  runtimeTokenValidityMs?: number;
  /** Clock; default `() => new Date()`. */
  now?: () => Date;
}

interface Entry extends ClusterViews {
  text: string;
  doc: ClusterDoc;
  loadedAt: number;
  bearer: BearerSource;
  current?: BearerToken;
}

/** The plain connection of a document, its bearer asked for per request (per watch). */
function connectionOf(doc: ClusterDoc, bearer: () => Promise<string>): PlainConnection {
  return {
    server: doc.endpoint,
    ca: Buffer.from(doc.caData, 'base64').toString('utf8'),
    bearer,
    ...(doc.tlsServerName ? { tlsServerName: doc.tlsServerName } : {}),
  };
}

/**
 * A document's kubeconfig authenticated with `token`, as JSON (valid YAML), in the shape
 * client-node's `KubeConfig.exportConfig` writes (what this registry handed before).
 */
function kubeconfigOf(doc: ClusterDoc, token: string): string {
  return JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: doc.id,
        cluster: {
          server: doc.endpoint,
          'certificate-authority-data': doc.caData,
          'insecure-skip-tls-verify': false,
          ...(doc.tlsServerName ? { 'tls-server-name': doc.tlsServerName } : {}),
        },
      },
    ],
    users: [{ name: 'kapp-lambda', user: { token } }],
    contexts: [{ name: doc.id, context: { name: doc.id, cluster: doc.id, user: 'kapp-lambda' } }],
    preferences: {},
    'current-context': doc.id,
  });
}

/**
 * A {@link ClusterRegistry} over the cluster documents of an object store, for one stage's
 * identity. Call {@link prepare} for a cluster before using its views.
 */
export class StoreClusterRegistry extends ViewsClusterRegistry {
  readonly #options: StoreClusterRegistryOptions;
  readonly #entries = new Map<string, Entry>();
  readonly #loading = new Map<string, Promise<void>>();

  /** See {@link StoreClusterRegistryOptions}. */
  constructor(options: StoreClusterRegistryOptions) {
    super();
    this.#options = options;
  }

  #now(): number {
    return (this.#options.now ?? (() => new Date()))().getTime();
  }

  /** This stage's token source for a document. @throws Error when the document gives this stage no identity. */
  #bearerOf(doc: ClusterDoc): BearerSource {
    const { stage } = this.#options;
    if (doc.auth.kind === 'eks') {
      if (this.#options.eksTokens) return this.#options.eksTokens;
      if (!this.#options.credentials) throw new Error(`cluster ${doc.id}: eks auth needs AWS credentials`);
      return new EksTokenSource({
        clusterName: doc.auth.clusterName,
        region: doc.auth.region,
        credentials: this.#options.credentials,
        ...(this.#options.now ? { now: this.#options.now } : {}),
      });
    }
    const name = doc.auth.secrets[stage];
    if (!name) throw new Error(`cluster ${doc.id} has no token for the ${stage} function`);
    if (!this.#options.secrets) throw new Error(`cluster ${doc.id}: token auth needs a secret store`);
    return new SecretTokenSource({
      store: this.#options.secrets,
      name,
      ttlMs: this.#options.ttlMs ?? DEFAULT_CLUSTER_TTL_MS,
      ...(this.#options.now ? { now: this.#options.now } : {}),
    });
  }

  #build(text: string, doc: ClusterDoc): Entry {
    const bearer = this.#bearerOf(doc);
    const apiServer: ApiServerInfo = {
      server: doc.endpoint,
      caData: doc.caData,
      ...(doc.tlsServerName ? { tlsServerName: doc.tlsServerName } : {}),
    };
    const conn = connectionOf(doc, async () => (await bearer.token()).token);
    // The bucket is the cluster id's, not this entry's: a document read again keeps its limit.
    const client = new KubeApiClient({
      ...rateLimited(doc.id, { rest: new PlainRestTransport(conn), watch: new PlainWatchTransport(conn) }),
      apiServer,
    });
    return { ...clusterViewsOf(client), text, doc, loadedAt: this.#now(), bearer };
  }

  async #load(clusterId: string): Promise<void> {
    const key = clusterDocKey(clusterId);
    const body = await this.#options.store.get(key, { maxBytes: MAX_CLUSTER_DOC_BYTES });
    if (body === undefined) {
      this.#entries.delete(clusterId);
      return;
    }
    const text = body.toString('utf8');
    const old = this.#entries.get(clusterId);
    if (old && old.text === text) {
      old.loadedAt = this.#now();
      return;
    }
    // A changed (or newly invalid) document replaces (or drops) the old entry and its tokens.
    this.#entries.delete(clusterId);
    this.#entries.set(clusterId, this.#build(text, parseClusterDoc(key, text)));
  }

  /**
   * Loads a cluster for use: its document (read again when older than the TTL), its client and
   * a token of this stage's identity valid for `runtimeTokenValidityMs`. Concurrent calls for
   * one cluster share one read.
   *
   * @throws UnknownClusterError when no document exists for the id (or the id is not a DNS-1123 label).
   * @throws InvalidClusterDocumentError when the document is not valid.
   * @throws Error when the document gives this stage no identity, or its token cannot be had
   *   (secret store, credentials); StoreError when the store cannot be read.
   */
  async prepare(clusterId: string): Promise<void> {
    if (!CLUSTER_ID_PATTERN.test(clusterId)) throw new UnknownClusterError(clusterId);
    await this.#fresh(clusterId);
    const loaded = this.#entry(clusterId);
    loaded.current = await loaded.bearer.token(
      this.#options.runtimeTokenValidityMs ?? DEFAULT_RUNTIME_TOKEN_VALIDITY_MS,
    );
  }

  /** Reads a cluster's document unless the loaded one is younger than the TTL; one read per cluster at a time. */
  async #fresh(clusterId: string): Promise<void> {
    const entry = this.#entries.get(clusterId);
    const ttl = this.#options.ttlMs ?? DEFAULT_CLUSTER_TTL_MS;
    if (entry && this.#now() - entry.loadedAt < ttl) return;
    let loading = this.#loading.get(clusterId);
    if (!loading) {
      loading = this.#load(clusterId).finally(() => this.#loading.delete(clusterId));
      this.#loading.set(clusterId, loading);
    }
    await loading;
  }

  /**
   * A cluster's forwarder (`forwarder` of its document, read as {@link prepare} reads it,
   * without asking for a token): who may send events naming the cluster (`../entry/sender.ts`).
   *
   * @returns `undefined` when the cluster is not registered (or the id is not a DNS-1123
   *   label); `{}` when its document names no forwarder, else `{ roleId }`.
   * @throws InvalidClusterDocumentError, StoreError, or Error when the document gives this
   *   stage no identity, as {@link prepare}.
   */
  async forwarderOf(clusterId: string): Promise<{ roleId?: string } | undefined> {
    if (!CLUSTER_ID_PATTERN.test(clusterId)) return undefined;
    await this.#fresh(clusterId);
    const entry = this.#entries.get(clusterId);
    if (!entry) return undefined;
    const roleId = entry.doc.forwarder?.roleId;
    return roleId === undefined ? {} : { roleId };
  }

  /**
   * A cluster's EKS identity (`auth` of its document when `eks`, read as {@link forwarderOf}
   * reads it): what the dispatcher signs a run's token for.
   *
   * @returns `undefined` when the cluster is not registered or is not an `eks` cluster.
   * @throws as {@link forwarderOf}.
   */
  async eksAuthOf(clusterId: string): Promise<EksClusterAuth | undefined> {
    if (!CLUSTER_ID_PATTERN.test(clusterId)) return undefined;
    await this.#fresh(clusterId);
    const auth = this.#entries.get(clusterId)?.doc.auth;
    return auth?.kind === 'eks' ? { kind: 'eks', clusterName: auth.clusterName, region: auth.region } : undefined;
  }

  /**
   * A cluster's event key (`eventKey` of its document, read as {@link forwarderOf} reads it): the
   * key of the SQS deduplication ids of the events the function sends for the cluster
   * (`SqsEventSender`'s `dedupKeyOf`, `../transport/sqs.ts`).
   *
   * @returns the key's bytes; `undefined` when the cluster is not registered or its document has
   *   no key (the event id is then the deduplication id).
   * @throws as {@link forwarderOf}.
   */
  async eventKeyOf(clusterId: string): Promise<Uint8Array | undefined> {
    if (!CLUSTER_ID_PATTERN.test(clusterId)) return undefined;
    await this.#fresh(clusterId);
    const key = this.#entries.get(clusterId)?.doc.eventKey;
    return key === undefined ? undefined : Buffer.from(key, 'base64');
  }

  /** {@inheritDoc ClusterRegistry.packagingGlobalNamespaceUid} */
  packagingGlobalNamespaceUid(clusterId: string): string | undefined {
    return this.#entries.get(clusterId)?.doc.packagingGlobalNamespaceUid;
  }

  #entry(clusterId: string): Entry {
    const entry = this.#entries.get(clusterId);
    if (!entry) throw new UnknownClusterError(clusterId);
    return entry;
  }

  /** {@inheritDoc ViewsClusterRegistry.views} */
  protected views(clusterId: string): ClusterViews {
    return this.#entry(clusterId);
  }

  /** The clusters loaded so far (by {@link prepare}), sorted: the registry is not listed at run time. */
  clusterIds(): string[] {
    return [...this.#entries.keys()].sort();
  }

  /**
   * This stage's identity in a prepared cluster as a self-contained kubeconfig (endpoint, CA,
   * the token `prepare` made valid for `runtimeTokenValidityMs`), for a tool acting as this
   * stage (kubectl or kapp in the tests; no function hands it to a tool: a PackageRepository's
   * kapp gets a token of its own ServiceAccount). Holds a credential: never log it.
   *
   * @throws UnknownClusterError when the cluster was not prepared.
   */
  runtimeKubeconfig(clusterId: string): string {
    const entry = this.#entry(clusterId);
    if (!entry.current) throw new UnknownClusterError(clusterId);
    return kubeconfigOf(entry.doc, entry.current.token);
  }
}
