/**
 * Credentials and namespaces for `kapp`: which credential source an App uses, the restricted
 * kubeconfig handed to kapp, and the `--namespace` / `--app-namespace` values.
 *
 * Mirrors kapp-controller `pkg/kubeconfig/kubeconfig.go` (`ClusterAccess`, incl. the
 * `defaultNamespace` rules), `service_accounts.go` (the generated kubeconfig) and
 * `kubeconfig_secrets.go` (`Find`, `fetchKubeconfigYAML`); the restriction itself
 * (`kubeconfig_restricted.go`) is `./kubeconfig-restrict.ts`. Pure: the ServiceAccount token, CA
 * and Secret come in as arguments.
 *
 * No error text produced here ever contains kubeconfig contents, tokens or keys.
 *
 * @module
 */
import { stringify } from 'yaml';
import type { AppSpec } from '../api/app.js';
import { DEFAULT_KUBECONFIG_SECRET_KEY } from '../api/defaults.js';
import type { SecretLike } from '../api/refs.js';
import { KappControllerError } from '../reconcile/result.js';
import { type RestrictedKubeconfig, restrictKubeconfig } from './kubeconfig-restrict.js';

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
