/**
 * What the plain transports (`./plain.ts`) connect with: a {@link PlainConnection} (the API
 * server, its CA, the credentials) and how its credentials become request headers, from the
 * in-cluster ServiceAccount (client-go's `rest.InClusterConfig`: `KUBERNETES_SERVICE_HOST`/`_PORT`,
 * the mounted token re-read as it rotates, the mounted CA) or a kubeconfig context
 * ({@link plainConnectionOf}, {@link plainConnectionOfDocument}): users with a client
 * certificate and key, a `token` or a `tokenFile`, an `exec` credential plugin's token (EKS,
 * GKE), basic auth (`username` and `password`), impersonation (`as`, `as-groups`,
 * `as-user-extra`), or an `auth-provider`'s stored token (`id-token` of `oidc`, `access-token` of
 * the others; never refreshed), through an `http://` `proxy-url` (CONNECT). Other proxies are
 * reported as unsupported.
 *
 * Loads no YAML parser until a kubeconfig file is read ({@link plainConnectionOf}), so the
 * forwarder in a Pod (in-cluster) never does; the functions' kubeconfig readers, which parse
 * YAML anyway, are `./kubeconfig-plain.ts`.
 *
 * @module
 */

import { readFileSync } from 'node:fs';
import path from 'node:path';

/** How to reach and authenticate to one API server (the subset of a kubeconfig the plain transports of `./plain.ts` speak). */
export interface PlainConnection {
  /** `https://host:port[/prefix]` (or `http://` for a local insecure server). */
  server: string;
  /** PEM CA bundle; Node's default CAs when absent. */
  ca?: string;
  /** PEM client certificate (with {@link key}). */
  cert?: string;
  /** PEM client key. */
  key?: string;
  /** Static bearer token. */
  token?: string;
  /** File holding the bearer token, re-read at most every {@link TOKEN_FILE_REFRESH_MS} (a projected token rotates). */
  tokenFile?: string;
  /** Exec credential plugin giving the bearer token, run again as its token expires. */
  exec?: ExecPlugin;
  /**
   * Bearer token asked for per request (per watch for a watch), so a short-lived token is
   * replaced as it expires (the fleet registry's EKS and ServiceAccount tokens); wins over the
   * other token sources.
   */
  bearer?: () => Promise<string>;
  /** `insecure-skip-tls-verify`. */
  insecureSkipTlsVerify?: boolean;
  /** `tls-server-name`: the name the server's certificate is checked against. */
  tlsServerName?: string;
  /** Basic auth (`username`/`password`), sent when no bearer token is. */
  basic?: { username: string; password: string };
  /**
   * `proxy-url` of an `http://` proxy: every connection to the (https) server is a `CONNECT`
   * tunnel through it (the functions' egress proxy in cloud mode, as kapp is given it).
   */
  proxyUrl?: string;
  /** Impersonation (`as`, `as-groups`, `as-user-extra`): client-go's `Impersonate-*` headers. */
  impersonate?: { user?: string; groups?: string[]; extra?: Record<string, string[]> };
}

/** A token file is read again after this long, ms: 60 000 (client-go's `cachingTokenSource` period). */
export const TOKEN_FILE_REFRESH_MS = 60_000;

/** The in-cluster ServiceAccount mount. */
export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/**
 * A kubeconfig `exec` credential plugin (client.authentication.k8s.io): the command run for an
 * `ExecCredential` whose `status.token` is the bearer token (an EKS or GKE kubeconfig).
 */
export interface ExecPlugin {
  command: string;
  args: string[];
  /** Added to the process's environment. */
  env: Record<string, string>;
  /** The `apiVersion` of the `ExecCredential` the plugin is asked for. */
  apiVersion: string;
}

/** A token from an exec plugin without an expiry is asked for again after this long, ms: 10 minutes. */
export const EXEC_TOKEN_DEFAULT_LIFE_MS = 10 * 60_000;

/** Runs an {@link ExecPlugin}; the token and when to ask again (a minute before its expiry). */
async function runExecPlugin(plugin: ExecPlugin): Promise<{ token: string; renewAt: number }> {
  const { execFile } = await import('node:child_process');
  const stdout = await new Promise<string>((resolve, reject) => {
    execFile(
      plugin.command,
      plugin.args,
      {
        env: {
          ...process.env,
          ...plugin.env,
          KUBERNETES_EXEC_INFO: JSON.stringify({
            apiVersion: plugin.apiVersion,
            kind: 'ExecCredential',
            spec: { interactive: false },
          }),
        },
        timeout: 60_000,
        maxBuffer: 1 << 20,
      },
      (error, out) =>
        error ? reject(new Error(`kubeconfig exec plugin ${plugin.command} failed`, { cause: error })) : resolve(out),
    );
  });
  let status: { token?: unknown; expirationTimestamp?: unknown } | undefined;
  try {
    status = (JSON.parse(stdout) as { status?: typeof status }).status;
  } catch {
    throw new Error(`kubeconfig exec plugin ${plugin.command}: output is not an ExecCredential`);
  }
  if (typeof status?.token !== 'string' || status.token === '') {
    throw new Error(`kubeconfig exec plugin ${plugin.command}: ExecCredential without status.token`);
  }
  const expires = typeof status.expirationTimestamp === 'string' ? Date.parse(status.expirationTimestamp) : Number.NaN;
  return {
    token: status.token,
    renewAt: Number.isNaN(expires) ? Date.now() + EXEC_TOKEN_DEFAULT_LIFE_MS : expires - 60_000,
  };
}

/**
 * `Authorization` header value source of a connection: {@link PlainConnection.bearer}, the static
 * token, the exec plugin's (run again as its token expires; a failed run is tried again on the
 * next request), the token file's (re-read every {@link TOKEN_FILE_REFRESH_MS}), or none.
 *
 * @throws Error (from the returned function) when the exec plugin fails or the token file cannot be read.
 */
export function bearerOf(conn: PlainConnection): () => Promise<string | undefined> {
  if (conn.bearer) return conn.bearer;
  if (conn.token) {
    const token = conn.token;
    return async () => token;
  }
  const plugin = conn.exec;
  if (plugin) {
    let cached: Promise<{ token: string; renewAt: number }> | undefined;
    return async () => {
      const current = cached ? await cached.catch(() => undefined) : undefined;
      if (!current || Date.now() >= current.renewAt) {
        cached = runExecPlugin(plugin);
        return (await cached).token;
      }
      return current.token;
    };
  }
  const file = conn.tokenFile;
  if (!file) return async () => undefined;
  let cached: { token: string; readAt: number } | undefined;
  return async () => {
    const now = Date.now();
    if (!cached || now - cached.readAt >= TOKEN_FILE_REFRESH_MS) {
      cached = { token: readFileSync(file, 'utf8').trim(), readAt: now };
    }
    return cached.token;
  };
}

/**
 * Headers of a connection that never change: basic auth (a bearer token replaces it) and
 * client-go's `Impersonate-User`, `Impersonate-Group` and `Impersonate-Extra-<key>` (key
 * percent-encoded).
 */
export function fixedHeadersOf(conn: PlainConnection): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  if (conn.basic) {
    out.Authorization = `Basic ${Buffer.from(`${conn.basic.username}:${conn.basic.password}`).toString('base64')}`;
  }
  const imp = conn.impersonate;
  if (imp?.user) out['Impersonate-User'] = imp.user;
  if (imp?.groups?.length) out['Impersonate-Group'] = imp.groups;
  for (const [k, v] of Object.entries(imp?.extra ?? {})) out[`Impersonate-Extra-${encodeURIComponent(k)}`] = v;
  return out;
}

/**
 * The in-cluster connection (client-go's `InClusterConfig`): `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`,
 * the ServiceAccount token file (re-read as it rotates) and CA of {@link SERVICE_ACCOUNT_DIR}.
 *
 * @throws Error when the variables are unset or the CA cannot be read (not running in a Pod).
 */
export function inClusterConnection(
  env: NodeJS.ProcessEnv = process.env,
  dir: string = SERVICE_ACCOUNT_DIR,
): PlainConnection {
  const host = env.KUBERNETES_SERVICE_HOST?.trim();
  const port = env.KUBERNETES_SERVICE_PORT?.trim();
  if (!host || !port)
    throw new Error('not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset');
  const tokenFile = path.join(dir, 'token');
  readFileSync(tokenFile); // fail at start, not on the first request
  return {
    server: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    ca: readFileSync(path.join(dir, 'ca.crt'), 'utf8'),
    tokenFile,
  };
}

/** A kubeconfig document or one of its mappings. */
export type Yaml = Record<string, unknown>;
const obj = (x: unknown): Yaml => (x !== null && typeof x === 'object' && !Array.isArray(x) ? (x as Yaml) : {});
const str = (x: unknown): string | undefined => (typeof x === 'string' && x !== '' ? x : undefined);

/** The named entry of a kubeconfig list (`clusters`, `users`, `contexts`): its `field` mapping (`cluster`, ...). */
export function named(doc: Yaml, list: string, name: string | undefined, field: string): Yaml | undefined {
  const entries = doc[list];
  if (!Array.isArray(entries) || name === undefined) return undefined;
  const hit = entries.map(obj).find((e) => e.name === name);
  return hit ? obj(hit[field]) : undefined;
}

/** What {@link plainConnectionOf} decided for a kubeconfig context. */
export type PlainConnectionResult = { connection: PlainConnection } | { unsupported: string };

/** Where a kubeconfig document came from, for {@link plainConnectionOfDocument}. */
export interface KubeconfigOrigin {
  /** Prefix of every error, naming the kubeconfig (e.g. `loading kubeconfig <path>`); never its contents. */
  what: string;
  /** The context; default the document's `current-context`. */
  context?: string;
  /**
   * Folder relative file paths and exec commands are resolved against (the kubeconfig's, as
   * client-go does). Absent for a kubeconfig that is not a file (an App's): then a file path or
   * an exec plugin is reported as unsupported, never read or run.
   */
  dir?: string;
}

/**
 * Parses a kubeconfig's text (YAML or JSON) into its document.
 *
 * @throws Error `<what>: not a valid kubeconfig` (the parser's error is not attached: it may
 *   quote the text, which holds credentials).
 */
export function parseKubeconfigText(text: string, what: string, parse: (text: string) => unknown): Yaml {
  let doc: unknown;
  try {
    doc = parse(text);
  } catch {
    throw new Error(`${what}: not a valid kubeconfig`);
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new Error(`${what}: not a valid kubeconfig`);
  return doc as Yaml;
}

/**
 * The text of a kubeconfig file, with the `what` its errors start with.
 *
 * @throws Error `loading kubeconfig <path>` when the file cannot be read (the fs error as `cause`).
 */
export function readKubeconfigText(kubeconfigPath: string): { text: string; what: string } {
  const what = `loading kubeconfig ${kubeconfigPath}`;
  try {
    return { text: readFileSync(kubeconfigPath, 'utf8'), what };
  } catch (cause) {
    throw new Error(what, { cause });
  }
}

/**
 * The plain connection of a kubeconfig file's context, or why there is none (a feature only
 * client-node implements): {@link plainConnectionOfDocument} of the file, relative paths against
 * its folder.
 *
 * @param kubeconfigPath - the kubeconfig file (YAML or JSON).
 * @param context - the context; default the file's `current-context`.
 * @throws Error `loading kubeconfig <path>` when the file cannot be read (the fs error as cause)
 *   or is not a kubeconfig, or what {@link plainConnectionOfDocument} throws.
 */
export async function plainConnectionOf(kubeconfigPath: string, context?: string): Promise<PlainConnectionResult> {
  const { text, what } = readKubeconfigText(kubeconfigPath);
  // Only here, so the in-cluster path never loads a YAML parser.
  const { parse } = await import('yaml');
  return plainConnectionOfDocument(parseKubeconfigText(text, what, parse), {
    what,
    ...(context === undefined ? {} : { context }),
    dir: path.dirname(kubeconfigPath),
  });
}

/** The bearer token an `auth-provider` stored (client-go's oidc `id-token`, gcp/azure `access-token`). */
function authProviderToken(provider: Yaml): PlainConnectionResult | string {
  const field = str(provider.name) === 'oidc' ? 'id-token' : 'access-token';
  const token = str(obj(provider.config)[field]);
  return token ?? { unsupported: `user auth-provider without config ${field}` };
}

/**
 * The plain connection of a context of a parsed kubeconfig, or why there is none:
 * `cluster proxy-url`, a file path or exec plugin without {@link KubeconfigOrigin.dir}, an
 * `auth-provider` without its stored token (the name of the missing field only).
 *
 * @throws Error `<what>: no context "<name>"` / `<what>: context "<name>" has no cluster`, or
 *   `reading <field> <file> of context "<name>"` (the fs error as cause): names and paths only,
 *   never contents.
 */
export function plainConnectionOfDocument(doc: Yaml, origin: KubeconfigOrigin): PlainConnectionResult {
  const { what, dir } = origin;
  const name = origin.context ?? str(doc['current-context']);
  const ctx = named(doc, 'contexts', name, 'context');
  if (!ctx) throw new Error(`${what}: no context ${JSON.stringify(name ?? '')}`);
  const cluster = named(doc, 'clusters', str(ctx.cluster), 'cluster');
  const server = str(cluster?.server);
  if (!cluster || !server) {
    throw new Error(`${what}: context ${JSON.stringify(name)} has no cluster`);
  }
  const user = named(doc, 'users', str(ctx.user), 'user') ?? {};
  const proxyUrl = str(cluster['proxy-url']);
  if (cluster['proxy-url'] !== undefined && !(proxyUrl?.startsWith('http://') && server.startsWith('https://'))) {
    return { unsupported: 'cluster proxy-url other than an http:// proxy to an https server' };
  }
  if (dir === undefined) {
    const files: [Yaml, string, string][] = [
      [cluster, 'certificate-authority', 'cluster'],
      [user, 'client-certificate', 'user'],
      [user, 'client-key', 'user'],
      [user, 'tokenFile', 'user'],
      [user, 'exec', 'user'],
    ];
    const hit = files.find(([o, f]) => o[f] !== undefined);
    if (hit) return { unsupported: `${hit[2]} ${hit[1]}` };
  }
  const base = dir ?? '.';
  const execConf = user.exec === undefined ? undefined : obj(user.exec);
  const execCommand = str(execConf?.command);
  if (execConf && !execCommand) return { unsupported: 'user exec without a command' };
  const pem = (data: unknown, file: unknown, field: string): string | undefined => {
    const d = str(data);
    if (d) return Buffer.from(d, 'base64').toString('utf8');
    const f = str(file);
    if (!f) return undefined;
    const resolved = path.resolve(base, f);
    try {
      return readFileSync(resolved, 'utf8');
    } catch (cause) {
      throw new Error(`reading ${field} ${resolved} of context ${JSON.stringify(name)}`, { cause });
    }
  };
  let token = str(user.token);
  if (!token && user['auth-provider'] !== undefined) {
    const stored = authProviderToken(obj(user['auth-provider']));
    if (typeof stored !== 'string') return stored;
    token = stored;
  }
  const ca = pem(cluster['certificate-authority-data'], cluster['certificate-authority'], 'certificate-authority');
  const cert = pem(user['client-certificate-data'], user['client-certificate'], 'client-certificate');
  const key = pem(user['client-key-data'], user['client-key'], 'client-key');
  const tokenFile = str(user.tokenFile);
  const tlsServerName = str(cluster['tls-server-name']);
  const username = str(user.username);
  const groups = Array.isArray(user['as-groups']) ? user['as-groups'].map(String) : [];
  const extra = Object.fromEntries(
    Object.entries(obj(user['as-user-extra'])).map(([k, v]) => [k, Array.isArray(v) ? v.map(String) : []]),
  );
  const impersonate = {
    ...(str(user.as) ? { user: str(user.as) } : {}),
    ...(groups.length ? { groups } : {}),
    ...(Object.keys(extra).length ? { extra } : {}),
  };
  return {
    connection: {
      server,
      ...(ca ? { ca } : {}),
      ...(cert ? { cert } : {}),
      ...(key ? { key } : {}),
      ...(token ? { token } : tokenFile ? { tokenFile: path.resolve(base, tokenFile) } : {}),
      ...(execConf && execCommand && !token && !tokenFile
        ? {
            exec: {
              // client-go: a command with a path separator is relative to the kubeconfig's folder
              command: execCommand.includes('/') ? path.resolve(base, execCommand) : execCommand,
              args: Array.isArray(execConf.args) ? execConf.args.map(String) : [],
              env: Object.fromEntries(
                (Array.isArray(execConf.env) ? execConf.env : [])
                  .map(obj)
                  .filter((e) => typeof e.name === 'string')
                  .map((e) => [String(e.name), String(e.value ?? '')]),
              ),
              apiVersion: str(execConf.apiVersion) ?? 'client.authentication.k8s.io/v1beta1',
            },
          }
        : {}),
      ...(username ? { basic: { username, password: typeof user.password === 'string' ? user.password : '' } } : {}),
      ...(Object.keys(impersonate).length ? { impersonate } : {}),
      ...(proxyUrl ? { proxyUrl } : {}),
      ...(cluster['insecure-skip-tls-verify'] === true ? { insecureSkipTlsVerify: true } : {}),
      ...(tlsServerName ? { tlsServerName } : {}),
    },
  };
}
