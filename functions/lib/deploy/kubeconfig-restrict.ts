/**
 * Restricting a kubeconfig for kapp: the allow-list of fields kapp-controller keeps
 * ({@link restrictKubeconfig}, upstream `pkg/kubeconfig/kubeconfig_restricted.go`
 * `NewKubeconfigRestricted`), the URLs a restricted kubeconfig makes kapp contact
 * ({@link kubeconfigUrls}) and pointing every cluster at a proxy ({@link withProxyUrl}). Which
 * credentials an App uses and the kubeconfig built for a ServiceAccount are `./kubeconfig.ts`.
 *
 * The allow-list is checked by hand rather than by a zod schema: the errors name the first bad
 * field in upstream's (Go unmarshal's) order, a list with a non-mapping item is named at the list
 * (`expected a list at .clusters`), `as-user-extra` and `auth-provider.config` at the mapping, and
 * the cluster count check sits between the `clusters` check and the fields of each cluster; zod
 * reports every issue at the innermost path in its own order, and its records drop a
 * `__proto__` key that the restricted kubeconfig keeps.
 *
 * Pure. No error text produced here ever contains kubeconfig contents, tokens or keys.
 *
 * @module
 */
import { parse, stringify } from 'yaml';
import { KappControllerError } from '../reconcile/result.js';

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
