/**
 * Kubeconfigs without `@kubernetes/client-node`, read by `./kubeconfig-auth.ts` and spoken to over
 * the plain transports (`./plain.ts`): what
 * the Lambda functions use, so their bundles carry none of client-node's module graph (its
 * generated API classes, node-fetch, openid-client: ~200 KB minified per function, and its
 * import time at every cold start). The embedded runtime keeps client-node's registry
 * (`./registry.ts`); the App readers come from here for both.
 *
 * - {@link kubeconfigFileRegistry}: every (or the given) context of the operator's kubeconfig file
 *   as a cluster id, one plain client each.
 * - {@link restTransportForKubeconfig}: the deploy stage's reads as the App (its restricted
 *   kubeconfig, `../deploy/kubeconfig-restrict.ts`) and the template stage's discovery of a
 *   destination cluster.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import { parse } from 'yaml';
import { parseKubeconfigText, plainConnectionOfDocument, readKubeconfigText, type Yaml } from './kubeconfig-auth.js';
import { APP_SERVER_MAX_BODY_BYTES, PlainRestTransport, plainClient } from './plain.js';
import type { KubeClient } from './port.js';
import type { RestTransport } from './transport.js';
import { MapClusterRegistry } from './views-registry.js';

/**
 * A context of a kubeconfig uses a feature the plain transports do not speak
 * (`plainConnectionOfDocument`'s `unsupported`): the context and the feature, never a value.
 */
export class UnsupportedKubeconfigError extends Error {
  override readonly name = 'UnsupportedKubeconfigError';
  constructor(
    readonly what: string,
    readonly context: string,
    readonly feature: string,
  ) {
    super(`${what}: context ${JSON.stringify(context)} uses ${feature}, which is not supported`);
  }
}

/**
 * Reads and parses a kubeconfig file.
 *
 * @throws Error `loading kubeconfig <path>` when the file cannot be read (the fs error as
 *   `cause`) or `loading kubeconfig <path>: not a valid kubeconfig` (parse errors are not
 *   attached: they may quote the file).
 */
export function loadKubeconfigFile(kubeconfigPath: string): Yaml {
  const { text, what } = readKubeconfigText(kubeconfigPath);
  return parseKubeconfigText(text, what, parse);
}

/** The names of a kubeconfig's contexts, in file order. */
function contextNames(doc: Yaml): string[] {
  const list = doc.contexts;
  return Array.isArray(list)
    ? list.flatMap((c) => (c && typeof c === 'object' && typeof c.name === 'string' ? [c.name] : []))
    : [];
}

/**
 * One cluster per context of the kubeconfig at `kubeconfigPath` (cluster id = context name),
 * each a plain client (`plainClient`), created now and reused. Mirrors client-node's
 * `KubeConfigClusterRegistry.fromFile` (`./registry.ts`) for what the plain transports speak.
 *
 * @param contexts - the contexts to serve; default every context of the file.
 * @throws Error what {@link loadKubeconfigFile} throws, or `loading kubeconfig <path>: no context
 *   "<name>"` / `... has no cluster`, or a referenced file that cannot be read (its path named).
 * @throws UnsupportedKubeconfigError when a context uses a feature the plain transports lack
 *   (`proxy-url`, an `auth-provider` without its stored token).
 */
export function kubeconfigFileRegistry(kubeconfigPath: string, contexts?: readonly string[]): MapClusterRegistry {
  const doc = loadKubeconfigFile(kubeconfigPath);
  const what = `loading kubeconfig ${kubeconfigPath}`;
  const clients = new Map<string, KubeClient>();
  for (const context of contexts ?? contextNames(doc)) {
    const r = plainConnectionOfDocument(doc, { what, context, dir: path.dirname(kubeconfigPath) });
    if ('unsupported' in r) throw new UnsupportedKubeconfigError(what, context, r.unsupported);
    clients.set(context, plainClient(r.connection, context));
  }
  return new MapClusterRegistry(clients);
}

/** App-identity transports {@link restTransportForKubeconfig} keeps open at most; the oldest is closed first. */
export const APP_READER_TRANSPORTS = 64;

/** Kept App-identity transports by the digest of their kubeconfig (in memory only: it holds a token). */
const appReaders = new Map<string, PlainRestTransport>();

/** How the App kubeconfig is named in errors (never its contents: it holds credentials). */
const APP_KUBECONFIG = 'the App kubeconfig';

/**
 * A {@link RestTransport} acting as the identity of a kubeconfig given as YAML (the restricted
 * kubeconfig kapp gets for an App: its ServiceAccount token, or its kubeconfig Secret), for the
 * deploy stage's reads of the App's resources as the App itself and the template stage's
 * discovery of a destination cluster. Speaks what the restricted kubeconfig keeps: a bearer
 * token, a client certificate, basic auth, impersonation, an `auth-provider`'s stored token
 * (`id-token` of oidc, else `access-token`); no file and no exec plugin is ever read or run.
 * The same kubeconfig (the ServiceAccount's token is cached, so one App's deploys hand the same
 * one) gets the same transport, and with it its kept connections; an answer's body is bounded
 * by `APP_SERVER_MAX_BODY_BYTES` (the server is the tenant's; the function serves every
 * tenant); at most
 * {@link APP_READER_TRANSPORTS} are kept, the least recently asked for is closed first. A new
 * token makes a new transport.
 *
 * @throws Error `the App kubeconfig is not a valid kubeconfig` (its text is never quoted: it
 *   holds credentials), `the App kubeconfig: no context ...`, or `the App kubeconfig: context
 *   "<name>" uses <feature>, which is not supported` (the field's name only).
 */
export function restTransportForKubeconfig(yaml: string): RestTransport {
  const key = createHash('sha256').update(yaml).digest('hex');
  const kept = appReaders.get(key);
  if (kept) {
    appReaders.delete(key);
    appReaders.set(key, kept);
    return kept;
  }
  let doc: Yaml;
  try {
    doc = parseKubeconfigText(yaml, APP_KUBECONFIG, parse);
  } catch {
    throw new Error(`${APP_KUBECONFIG} is not a valid kubeconfig`);
  }
  const r = plainConnectionOfDocument(doc, { what: APP_KUBECONFIG });
  if ('unsupported' in r) {
    const context = typeof doc['current-context'] === 'string' ? doc['current-context'] : '';
    throw new UnsupportedKubeconfigError(APP_KUBECONFIG, context, r.unsupported);
  }
  const transport = new PlainRestTransport(r.connection, undefined, APP_SERVER_MAX_BODY_BYTES);
  appReaders.set(key, transport);
  while (appReaders.size > APP_READER_TRANSPORTS) {
    const [oldest, closing] = appReaders.entries().next().value as [string, PlainRestTransport];
    appReaders.delete(oldest);
    closing.close();
  }
  return transport;
}
