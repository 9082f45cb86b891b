/**
 * Credentials and namespaces for `kapp`: which credential source an App uses, the restricted
 * kubeconfig handed to kapp, and the `--namespace` / `--app-namespace` values.
 *
 * Mirrors kapp-controller `pkg/kubeconfig/kubeconfig.go` (`ClusterAccess`, incl. the
 * `defaultNamespace` rules), `service_accounts.go` (the generated kubeconfig), `kubeconfig_secrets.go`
 * (`Find`, `fetchKubeconfigYAML`) and `kubeconfig_restricted.go` (`NewKubeconfigRestricted`).
 * Pure: the ServiceAccount token, CA and Secret come in as arguments.
 *
 * No error text produced here ever contains kubeconfig contents, tokens or keys.
 *
 * @module
 */
import { parse, stringify } from 'yaml';
import type { AppSpec } from '../api/app.js';
import { DEFAULT_KUBECONFIG_SECRET_KEY } from '../api/defaults.js';
import type { SecretLike } from '../api/refs.js';
import { KappControllerError } from '../reconcile/result.js';

/** The spec fields that decide credentials, namespaces and the kapp invocation. */
export type AppDeploySpec = Pick<AppSpec, 'serviceAccountName' | 'cluster' | 'defaultNamespace' | 'deploy'>;

/** Upstream wraps every credential error in `Preparing kapp: ` (`pkg/app/app_deploy.go`). */
export const PREPARING_KAPP_PREFIX = 'Preparing kapp: ';

/** Upstream: `Expected service account or cluster specified`. */
export const NO_CREDENTIALS_MESSAGE = 'Expected service account or cluster specified';

/**
 * The server upstream writes into a ServiceAccount kubeconfig; kapp expands the variable from its
 * environment (so the caller sets `KAPP_KUBERNETES_SERVICE_HOST_PORT`).
 */
// biome-ignore lint/suspicious/noTemplateCurlyInString: a literal `${VAR}` that kapp expands, as upstream writes it.
export const UPSTREAM_SA_SERVER = 'https://${KAPP_KUBERNETES_SERVICE_HOST_PORT}';

/** Token lifetime upstream requests for ServiceAccount tokens (TokenRequest `expirationSeconds`). */
export const SA_TOKEN_EXPIRATION_SECONDS = 7200;

/** A kubeconfig reduced to the fields kapp-controller allows, plus its default namespace. */
export interface RestrictedKubeconfig {
  /** The restricted kubeconfig as YAML. Contains credentials: never log or store it. */
  yaml: string;
  /** Namespace of the current context, or `default`. */
  defaultNamespace: string;
}

type Obj = Record<string, unknown>;

class KubeconfigShapeError extends Error {}

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Reads a string field; `null`/missing is `''`; anything else is a type error naming only the path. */
function str(o: Obj, key: string, path: string): string {
  const v = o[key];
  if (v === undefined || v === null) return '';
  if (typeof v !== 'string') throw new KubeconfigShapeError(`expected a string at ${path}.${key}`);
  return v;
}

function bool(o: Obj, key: string, path: string): boolean {
  const v = o[key];
  if (v === undefined || v === null) return false;
  if (typeof v !== 'boolean') throw new KubeconfigShapeError(`expected a boolean at ${path}.${key}`);
  return v;
}

/** A Go `[]byte` field: base64 in YAML; re-encoded canonically, as Go's marshal does. */
function bytes(o: Obj, key: string, path: string): string | undefined {
  const v = str(o, key, path);
  if (v === '') return undefined;
  const compact = v.replace(/\s+/g, '');
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(compact) || compact.length % 4 !== 0) {
    throw new KubeconfigShapeError(`illegal base64 data at ${path}.${key}`);
  }
  return Buffer.from(compact, 'base64').toString('base64');
}

function strList(o: Obj, key: string, path: string): string[] | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) {
    throw new KubeconfigShapeError(`expected a list of strings at ${path}.${key}`);
  }
  return v.length > 0 ? [...(v as string[])] : undefined;
}

function list(o: Obj, key: string, path: string): Obj[] {
  const v = o[key];
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || v.some((x) => !isObj(x)))
    throw new KubeconfigShapeError(`expected a list at ${path}.${key}`);
  return v as Obj[];
}

function sub(o: Obj, key: string, path: string): Obj {
  const v = o[key];
  if (v === undefined || v === null) return {};
  if (!isObj(v)) throw new KubeconfigShapeError(`expected a mapping at ${path}.${key}`);
  return v;
}

/** Drops `undefined`, `''`, `false` (Go `omitempty`). */
function omitEmpty(o: Obj): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(o)) if (v !== undefined && v !== '' && v !== false) out[k] = v;
  return out;
}

function userExtra(o: Obj, path: string): Record<string, string[]> | undefined {
  const v = o['as-user-extra'];
  if (v === undefined || v === null) return undefined;
  if (!isObj(v)) throw new KubeconfigShapeError(`expected a mapping at ${path}.as-user-extra`);
  const out: Record<string, string[]> = {};
  for (const k of Object.keys(v)) {
    const list = v[k];
    if (list !== null && (!Array.isArray(list) || list.some((x) => typeof x !== 'string'))) {
      throw new KubeconfigShapeError(`expected a list of strings at ${path}.as-user-extra`);
    }
    Object.defineProperty(out, k, { value: list ?? null, enumerable: true, writable: true, configurable: true });
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

function authProvider(o: Obj, path: string): Obj | undefined {
  const v = o['auth-provider'];
  if (v === undefined || v === null) return undefined;
  if (!isObj(v)) throw new KubeconfigShapeError(`expected a mapping at ${path}.auth-provider`);
  const config = v.config;
  if (config !== undefined && config !== null) {
    if (!isObj(config) || Object.values(config).some((x) => typeof x !== 'string')) {
      throw new KubeconfigShapeError(`expected a mapping of strings at ${path}.auth-provider.config`);
    }
  }
  return { name: str(v, 'name', `${path}.auth-provider`), config: config ?? null };
}

/**
 * Reduces a kubeconfig to what kapp-controller lets kapp use, and finds its default namespace.
 *
 * Kept: `kind`, `apiVersion`, `current-context`; clusters' `server`, `tls-server-name`,
 * `insecure-skip-tls-verify`, `certificate-authority-data`, `proxy-url`; users'
 * `client-certificate-data`, `client-key-data`, `token`, `as`, `as-groups`, `as-user-extra`,
 * `username`, `password`, `auth-provider`; contexts' `cluster`, `user`, `namespace`. Dropped:
 * everything else, notably `exec` plugins and every file path (`certificate-authority`,
 * `client-certificate`, `client-key`, `tokenFile`), so kapp can neither run a program nor read a
 * local file on a user's behalf. Output follows `clientcmd/api/v1` marshalled by `sigs.k8s.io/yaml`
 * (keys sorted; `preferences: {}`; `clusters`/`users`/`contexts` `null` when empty).
 *
 * @param input - kubeconfig YAML
 * @returns the restricted YAML and the current context's namespace (or `default`)
 * @throws {KappControllerError} `Parsing kubeconfig: <reason>` (reason names a position or field
 *   path, never content); `Expected to find at least one cluster in kubeconfig`
 */
export function restrictKubeconfig(input: string): RestrictedKubeconfig {
  let doc: unknown;
  try {
    doc = parse(input, { maxAliasCount: 100, prettyErrors: false });
  } catch (err) {
    const pos = (err as { linePos?: Array<{ line: number; col: number }> }).linePos?.[0];
    const where = pos ? ` at line ${pos.line}, column ${pos.col}` : '';
    throw new KappControllerError(`Parsing kubeconfig: invalid YAML${where}`);
  }
  if (doc === null || doc === undefined) doc = {};
  try {
    if (!isObj(doc)) throw new KubeconfigShapeError('expected a mapping at the top level');
    const clustersIn = list(doc, 'clusters', '');
    if (clustersIn.length === 0) throw new KappControllerError('Expected to find at least one cluster in kubeconfig');
    const clusters = clustersIn.map((c, i) => {
      const p = `clusters[${i}].cluster`;
      const cl = sub(c, 'cluster', `clusters[${i}]`);
      return {
        name: str(c, 'name', `clusters[${i}]`),
        cluster: {
          server: str(cl, 'server', p),
          ...omitEmpty({
            'tls-server-name': str(cl, 'tls-server-name', p),
            'insecure-skip-tls-verify': bool(cl, 'insecure-skip-tls-verify', p),
            'certificate-authority-data': bytes(cl, 'certificate-authority-data', p),
            'proxy-url': str(cl, 'proxy-url', p),
          }),
        },
      };
    });
    const usersIn = list(doc, 'users', '');
    const users = usersIn.map((u, i) => {
      const p = `users[${i}].user`;
      const au = sub(u, 'user', `users[${i}]`);
      return {
        name: str(u, 'name', `users[${i}]`),
        user: omitEmpty({
          'client-certificate-data': bytes(au, 'client-certificate-data', p),
          'client-key-data': bytes(au, 'client-key-data', p),
          token: str(au, 'token', p),
          as: str(au, 'as', p),
          'as-groups': strList(au, 'as-groups', p),
          'as-user-extra': userExtra(au, p),
          username: str(au, 'username', p),
          password: str(au, 'password', p),
          'auth-provider': authProvider(au, p),
        }),
      };
    });
    const currentContext = str(doc, 'current-context', '');
    let defaultNamespace = 'default';
    const contextsIn = list(doc, 'contexts', '');
    const contexts = contextsIn.map((c, i) => {
      const p = `contexts[${i}].context`;
      const cx = sub(c, 'context', `contexts[${i}]`);
      const name = str(c, 'name', `contexts[${i}]`);
      const namespace = str(cx, 'namespace', p);
      if (name === currentContext && namespace !== '') defaultNamespace = namespace;
      return {
        name,
        context: { cluster: str(cx, 'cluster', p), user: str(cx, 'user', p), ...omitEmpty({ namespace }) },
      };
    });
    const out = {
      ...omitEmpty({ kind: str(doc, 'kind', ''), apiVersion: str(doc, 'apiVersion', '') }),
      preferences: {},
      clusters,
      users: users.length > 0 ? users : null,
      contexts: contexts.length > 0 ? contexts : null,
      'current-context': currentContext,
    };
    return { yaml: stringify(out, { sortMapEntries: true, lineWidth: 0 }), defaultNamespace };
  } catch (err) {
    if (err instanceof KubeconfigShapeError) {
      throw new KappControllerError(`Parsing kubeconfig: ${err.message}`);
    }
    throw err;
  }
}

/** A URL kapp would contact because a kubeconfig names it (see {@link kubeconfigUrls}). */
export interface KubeconfigUrl {
  /** Where it is, e.g. `kubeconfig clusters[0].cluster.server`; names no value. */
  label: string;
  /**
   * `server`: an API server (client-go speaks `https` or `http` to it); `proxy`: the proxy every
   * request to that cluster goes through (`http`, `https` or `socks5`); `token-issuer`: an OIDC
   * issuer kapp asks for a token endpoint, which it then posts the refresh token to.
   */
  kind: 'server' | 'proxy' | 'token-issuer';
  /** The absolute URL. */
  url: string;
}

/**
 * Every URL kapp may contact with a restricted kubeconfig ({@link restrictKubeconfig}'s output):
 * each cluster's `server` and `proxy-url` (every cluster, not only the current context's), and
 * the `idp-issuer-url` of an `auth-provider` that can refresh its token (`refresh-token` set;
 * client-go's oidc provider then fetches `<issuer>/.well-known/openid-configuration` and posts to
 * the `token_endpoint` it names; without a refresh token it sends nothing). A `server` without a
 * scheme is listed as both `https://` and `http://` (client-go picks one by the TLS settings).
 * An empty `server` is not listed: client-go refuses such a config before any request.
 *
 * @param restrictedYaml - the `yaml` of a {@link RestrictedKubeconfig}
 * @returns the URLs in document order
 */
export function kubeconfigUrls(restrictedYaml: string): KubeconfigUrl[] {
  const doc = parse(restrictedYaml) as {
    clusters?: { cluster?: { server?: string; 'proxy-url'?: string } }[] | null;
    users?: { user?: { 'auth-provider'?: { config?: Record<string, string> | null } } }[] | null;
  };
  const out: KubeconfigUrl[] = [];
  for (const [i, c] of (doc.clusters ?? []).entries()) {
    const at = `kubeconfig clusters[${i}].cluster`;
    const server = c.cluster?.server ?? '';
    if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(server)) out.push({ label: `${at}.server`, kind: 'server', url: server });
    else if (server !== '') {
      for (const scheme of ['https', 'http'])
        out.push({ label: `${at}.server`, kind: 'server', url: `${scheme}://${server}` });
    }
    const proxy = c.cluster?.['proxy-url'];
    if (proxy) out.push({ label: `${at}.proxy-url`, kind: 'proxy', url: proxy });
  }
  for (const [i, u] of (doc.users ?? []).entries()) {
    const config = u.user?.['auth-provider']?.config ?? {};
    if (config['refresh-token'] && config['idp-issuer-url']) {
      out.push({
        label: `kubeconfig users[${i}].user.auth-provider.config.idp-issuer-url`,
        kind: 'token-issuer',
        url: config['idp-issuer-url'],
      });
    }
  }
  return out;
}

/**
 * A restricted kubeconfig with every cluster's `proxy-url` set to `proxyUrl` (replacing any
 * value). client-go sends every request of such a cluster, redirects included, through
 * `http.ProxyURL`, which (unlike `ProxyFromEnvironment`) exempts no loopback address.
 *
 * @param restrictedYaml - the `yaml` of a {@link RestrictedKubeconfig}
 * @param proxyUrl - e.g. `http://127.0.0.1:41234`
 * @returns the restricted YAML with the proxy set
 */
export function withProxyUrl(restrictedYaml: string, proxyUrl: string): string {
  const doc = parse(restrictedYaml) as { clusters?: { cluster?: Record<string, unknown> }[] | null };
  for (const c of doc.clusters ?? []) {
    if (c.cluster) c.cluster['proxy-url'] = proxyUrl;
  }
  return restrictKubeconfig(stringify(doc)).yaml;
}

/** Input for {@link serviceAccountKubeconfig}. */
export interface ServiceAccountKubeconfigInput {
  /** TokenRequest token for the App's ServiceAccount. */
  token: string;
  /** Cluster CA certificate (PEM), as bytes or text. */
  caCert: Uint8Array | string;
  /** Context namespace: the App's namespace. */
  namespace: string;
  /** API server URL (upstream: {@link UPSTREAM_SA_SERVER}). */
  server: string;
  /** `tls-server-name`: the name TLS verifies when `server` is an address (`./pin-server.ts`). */
  tlsServerName?: string;
}

/**
 * The kubeconfig upstream builds for a ServiceAccount (cluster `dst-cluster`, user `dst-user`,
 * context `dst-ctx` with the App's namespace), already restricted as upstream does.
 *
 * @param input - token, CA, namespace, server
 * @returns restricted kubeconfig (default namespace = `namespace`)
 */
export function serviceAccountKubeconfig(input: ServiceAccountKubeconfigInput): RestrictedKubeconfig {
  const ca = typeof input.caCert === 'string' ? Buffer.from(input.caCert, 'utf8') : Buffer.from(input.caCert);
  const key = JSON.stringify([input.token, ca.toString('base64'), input.namespace, input.server, input.tlsServerName]);
  const kept = saKubeconfigs.get(key);
  if (kept) return { ...kept };
  const built = buildServiceAccountKubeconfig(input, ca);
  saKubeconfigs.set(key, built);
  while (saKubeconfigs.size > SA_KUBECONFIG_MEMO) saKubeconfigs.delete(saKubeconfigs.keys().next().value as string);
  return { ...built };
}

/**
 * Most ServiceAccount kubeconfigs {@link serviceAccountKubeconfig} keeps built: 256 (one per
 * App namespace and live token; the oldest built goes first). The kubeconfig is a pure function
 * of its input, and every no-op resync of an App asked for the same one again: a YAML stringify,
 * parse and stringify each time (about a tenth of the embedded runtime's CPU in the steady state).
 */
const SA_KUBECONFIG_MEMO = 256;
/** Built kubeconfigs by input (token, CA, namespace, server, TLS name). Holds tokens: memory only, never logged. */
const saKubeconfigs = new Map<string, RestrictedKubeconfig>();

function buildServiceAccountKubeconfig(input: ServiceAccountKubeconfigInput, ca: Buffer): RestrictedKubeconfig {
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: 'dst-cluster',
        cluster: {
          'certificate-authority-data': ca.toString('base64'),
          server: input.server,
          ...(input.tlsServerName ? { 'tls-server-name': input.tlsServerName } : {}),
        },
      },
    ],
    users: [{ name: 'dst-user', user: { token: input.token } }],
    contexts: [{ name: 'dst-ctx', context: { cluster: 'dst-cluster', namespace: input.namespace, user: 'dst-user' } }],
    'current-context': 'dst-ctx',
  };
  return restrictKubeconfig(stringify(doc));
}

/**
 * The kubeconfig text held in a kubeconfig Secret.
 *
 * @param secret - the Secret named by `cluster.kubeconfigSecretRef.name`
 * @param key - `cluster.kubeconfigSecretRef.key` (default `value`)
 * @throws {KappControllerError} `Expected to find key '<key>' in secret (keys: <k1>, <k2>)` (keys
 *   sorted; upstream lists them in random map order)
 */
export function kubeconfigFromSecret(secret: SecretLike, key?: string): string {
  const k = key || DEFAULT_KUBECONFIG_SECRET_KEY;
  const data = secret.data ?? {};
  if (!Object.hasOwn(data, k)) {
    const keys = Object.keys(data).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    throw new KappControllerError(`Expected to find key '${k}' in secret (keys: ${keys.join(', ')})`);
  }
  // Buffer.from: a Secret read through structuredClone (the embedded runtime's copies, the test
  // fakes) holds plain Uint8Arrays, whose toString is a list of numbers.
  return Buffer.from(data[k]!).toString('utf8');
}

/** Where an App's kapp credentials come from. */
export type CredentialSource =
  | {
      /** The App's ServiceAccount (TokenRequest token). */
      kind: 'serviceAccount';
      /** ServiceAccount name. */
      serviceAccountName: string;
      /** Its namespace (the App's). */
      namespace: string;
    }
  | {
      /** A kubeconfig Secret. */
      kind: 'kubeconfigSecret';
      /** Secret name. */
      secretName: string;
      /** Key in the Secret (default `value`). */
      key: string;
      /** Its namespace (the App's). */
      namespace: string;
    };

/**
 * Which credentials an App uses: `serviceAccountName` wins over `cluster`.
 *
 * @param spec - the App's spec
 * @param appNamespace - the App's namespace
 * @throws {KappControllerError} `Preparing kapp: Expected service account or cluster specified`;
 *   `Preparing kapp: Expected kubeconfig secret reference to be specified`
 */
export function credentialSource(spec: AppDeploySpec, appNamespace: string): CredentialSource {
  if (spec.serviceAccountName) {
    return { kind: 'serviceAccount', serviceAccountName: spec.serviceAccountName, namespace: appNamespace };
  }
  if (spec.cluster) {
    if (!spec.cluster.kubeconfigSecretRef) {
      throw new KappControllerError(`${PREPARING_KAPP_PREFIX}Expected kubeconfig secret reference to be specified`);
    }
    return {
      kind: 'kubeconfigSecret',
      secretName: spec.cluster.kubeconfigSecretRef.name ?? '',
      key: spec.cluster.kubeconfigSecretRef.key || DEFAULT_KUBECONFIG_SECRET_KEY,
      namespace: appNamespace,
    };
  }
  throw new KappControllerError(`${PREPARING_KAPP_PREFIX}${NO_CREDENTIALS_MESSAGE}`);
}

/** How kapp reaches the cluster, and which namespaces it uses. Mirrors `kubeconfig.AccessInfo`. */
export interface ClusterAccess {
  /** Object name; the kapp app is `<name><suffix>` (`.app`, `.pkgr`). */
  name: string;
  /** `--namespace` (default namespace for resources); `''` omits the flag. */
  namespace: string;
  /** `--app-namespace` (where kapp keeps its app record); `''` omits the flag. */
  deployNamespace: string;
  /** Restricted kubeconfig YAML (sent as `KAPP_KUBECONFIG_YAML`). Sensitive. */
  kubeconfigYaml?: string;
  /** Use the runtime's own identity (PackageRepositories only). */
  dangerousUsePodServiceAccount?: boolean;
}

/** The credential material the I/O layer gathered for {@link appClusterAccess}. */
export type CredentialMaterial =
  | {
      /** ServiceAccount path. */
      kind: 'serviceAccount';
      /** TokenRequest token. */
      token: string;
      /** Cluster CA (PEM). */
      caCert: Uint8Array | string;
      /** API server URL (see {@link UPSTREAM_SA_SERVER}). */
      server: string;
      /** `tls-server-name` (set when `server` is a pinned address). */
      tlsServerName?: string;
    }
  | {
      /** kubeconfig Secret path. */
      kind: 'kubeconfigSecret';
      /** The Secret. */
      secret: SecretLike;
    };

/**
 * Cluster access for an App's kapp commands (`Kubeconfig.ClusterAccess`):
 *
 * | credentials | defaultNamespace | cluster.namespace | `--namespace` | `--app-namespace` |
 * |---|---|---|---|---|
 * | SA | — | — | (none: the kubeconfig's, i.e. the App's) | App namespace |
 * | SA | X | — | X | App namespace |
 * | cluster | — | C | C | C |
 * | cluster | X | C | X | C |
 * | cluster | X | — | X | kubeconfig context namespace, or `default` |
 * | cluster | — | — | (none) | (none) |
 *
 * @param app - name, namespace and spec of the App
 * @param material - token + CA, or the kubeconfig Secret (matching {@link credentialSource})
 * @throws {KappControllerError} `Preparing kapp: <reason>` for a source/material mismatch, a missing
 *   Secret key or an unparsable kubeconfig
 */
export function appClusterAccess(
  app: { name: string; namespace: string; spec: AppDeploySpec },
  material: CredentialMaterial,
): ClusterAccess {
  const source = credentialSource(app.spec, app.namespace);
  let access: ClusterAccess;
  try {
    if (source.kind === 'serviceAccount') {
      if (material.kind !== 'serviceAccount') throw new TypeError('appClusterAccess: expected ServiceAccount material');
      const restricted = serviceAccountKubeconfig({
        token: material.token,
        caCert: material.caCert,
        namespace: app.namespace,
        server: material.server,
        ...(material.tlsServerName ? { tlsServerName: material.tlsServerName } : {}),
      });
      // The SA kubeconfig carries the App namespace as its context namespace.
      access = { name: app.name, namespace: '', deployNamespace: app.namespace, kubeconfigYaml: restricted.yaml };
    } else {
      if (material.kind !== 'kubeconfigSecret') throw new TypeError('appClusterAccess: expected kubeconfig Secret');
      const restricted = restrictKubeconfig(kubeconfigFromSecret(material.secret, source.key));
      const clusterNs = app.spec.cluster?.namespace ?? '';
      access = { name: app.name, namespace: clusterNs, deployNamespace: clusterNs, kubeconfigYaml: restricted.yaml };
      if (app.spec.defaultNamespace && access.deployNamespace === '') {
        access.deployNamespace = restricted.defaultNamespace;
      }
    }
  } catch (err) {
    if (err instanceof KappControllerError) {
      throw new KappControllerError(`${PREPARING_KAPP_PREFIX}${err.message}`, { cause: err });
    }
    throw err;
  }
  if (app.spec.defaultNamespace) access.namespace = app.spec.defaultNamespace;
  return access;
}
