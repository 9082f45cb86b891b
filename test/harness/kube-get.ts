/**
 * `kubectl get <resource> [<name>] [-n <ns>] -o json` answered in the test process: one HTTPS
 * request instead of a kubectl process. The tests poll objects this way hundreds of times a run
 * (wait loops read a ConfigMap or a PackageInstall every few hundred milliseconds), and each
 * kubectl is ~130 ms of CPU plus its discovery on the API server: on the 2-core CI machine the
 * suite is CPU-bound, so that was about a sixth of its time.
 *
 * Only the shapes whose kubectl output is plain API JSON are answered here; kubectl's own wording
 * is kept for the one error it is asked about (`Error from server (NotFound): …`). Anything else
 * (another flag, an unknown resource word, a status other than 200/404: Forbidden, Unauthorized,
 * a connection error) returns `undefined`, and the caller runs the real kubectl, which words it.
 */
import { statSync } from 'node:fs';
import { request } from 'node:https';
import { KubeConfig } from '@kubernetes/client-node';
import type { KubectlResult } from './kube.js';

/** A resource the tests get by one of kubectl's words for it. */
interface Resource {
  /** `/api/v1` or `/apis/<group>/<version>`. */
  readonly prefix: string;
  readonly plural: string;
  /** kubectl's name for it in NotFound messages: `<plural>` (core) or `<plural>.<group>`. */
  readonly qualified: string;
  readonly kind: string;
  readonly apiVersion: string;
  readonly namespaced: boolean;
}

function resource(group: string, version: string, plural: string, kind: string, namespaced = true): Resource {
  return {
    prefix: group ? `/apis/${group}/${version}` : `/api/${version}`,
    plural,
    qualified: group ? `${plural}.${group}` : plural,
    kind,
    apiVersion: group ? `${group}/${version}` : version,
    namespaced,
  };
}

const CORE: Resource[] = [
  resource('', 'v1', 'configmaps', 'ConfigMap'),
  resource('', 'v1', 'secrets', 'Secret'),
  resource('', 'v1', 'services', 'Service'),
  resource('', 'v1', 'serviceaccounts', 'ServiceAccount'),
  resource('', 'v1', 'pods', 'Pod'),
  resource('', 'v1', 'namespaces', 'Namespace', false),
  resource('apps', 'v1', 'deployments', 'Deployment'),
  resource('kappctrl.k14s.io', 'v1alpha1', 'apps', 'App'),
  resource('packaging.carvel.dev', 'v1alpha1', 'packageinstalls', 'PackageInstall'),
  resource('packaging.carvel.dev', 'v1alpha1', 'packagerepositories', 'PackageRepository'),
  resource('data.packaging.carvel.dev', 'v1alpha1', 'packages', 'Package'),
  resource('data.packaging.carvel.dev', 'v1alpha1', 'packagemetadatas', 'PackageMetadata'),
];
const SHORT: Record<string, string> = { cm: 'configmaps', ns: 'namespaces', deploy: 'deployments' };
const CARVEL_SHORT: Record<string, string> = {
  pkgi: 'packageinstalls',
  pkgr: 'packagerepositories',
  pkg: 'packages',
  pkgm: 'packagemetadatas',
};

/** kubectl's resource words (plural, singular, kind, short name, `<plural>.<group>`) → resource. */
const WORDS: ReadonlyMap<string, Resource> = (() => {
  const words = new Map<string, Resource>();
  for (const r of CORE) {
    for (const w of [r.plural, r.kind.toLowerCase(), r.qualified]) words.set(w, r);
  }
  for (const [short, plural] of Object.entries({ ...SHORT, ...CARVEL_SHORT })) {
    const r = CORE.find((c) => c.plural === plural);
    if (r) words.set(short, r);
  }
  return words;
})();

/** A parsed `get`: what {@link inProcessGet} answers, or `undefined` for any other argv. */
export function parseSimpleGet(
  args: readonly string[],
): { resource: Resource; name?: string; namespace?: string } | undefined {
  let namespace: string | undefined;
  let json = false;
  const words: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    if (a === '-n' || a === '--namespace') {
      namespace = args[++i];
      if (namespace === undefined) return undefined;
    } else if (a === '-o' || a === '--output') {
      if (args[++i] !== 'json') return undefined;
      json = true;
    } else if (a.startsWith('-')) return undefined;
    else words.push(a);
  }
  if (!json || words[0] !== 'get' || words.length < 2 || words.length > 3) return undefined;
  const r = WORDS.get(words[1] as string);
  if (!r) return undefined;
  return { resource: r, ...(words[2] ? { name: words[2] } : {}), ...(namespace ? { namespace } : {}) };
}

/** Loaded kubeconfigs by path, kept while the file's mtime holds (clusters reuse paths and ports). */
const loaded = new Map<string, { mtimeMs: number; kc: KubeConfig }>();

/** The kubeconfig at `file`, parsed once per version of the file: the tests poll through it. */
function kubeConfigOf(file: string): KubeConfig {
  const { mtimeMs } = statSync(file);
  const kept = loaded.get(file);
  if (kept?.mtimeMs === mtimeMs) return kept.kc;
  const kc = new KubeConfig();
  kc.loadFromFile(file);
  loaded.set(file, { mtimeMs, kc });
  return kc;
}

/** One GET with the kubeconfig's server, CA and credentials; the status and the body. */
async function get(kc: KubeConfig, path: string): Promise<{ status: number; body: string }> {
  const server = kc.getCurrentCluster()?.server;
  if (!server) throw new Error('kubeconfig has no current cluster');
  const url = new URL(path, server);
  const opts: Parameters<typeof request>[1] = { method: 'GET', headers: { accept: 'application/json' } };
  await kc.applyToHTTPSOptions(opts);
  return await new Promise((resolve, reject) => {
    const req = request(url, opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(30_000, () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

/**
 * Answers `kubectl --kubeconfig <kubeconfigPath> <args>` in process when `args` is a simple
 * `get … -o json` ({@link parseSimpleGet}) and the API server says 200 or 404.
 * @returns what kubectl would have printed and its exit code, or `undefined` (run kubectl).
 */
export async function inProcessGet(
  kubeconfigPath: string,
  args: readonly string[],
): Promise<KubectlResult | undefined> {
  const parsed = parseSimpleGet(args);
  if (!parsed) return undefined;
  const { resource: r, name } = parsed;
  // kubectl's default namespace when -n is absent: the context's, else `default`.
  const kc = kubeConfigOf(kubeconfigPath);
  const ns = r.namespaced
    ? (parsed.namespace ?? kc.getContextObject(kc.getCurrentContext())?.namespace ?? 'default')
    : undefined;
  const collection = `${r.prefix}${ns ? `/namespaces/${encodeURIComponent(ns)}` : ''}/${r.plural}`;
  let res: { status: number; body: string };
  try {
    res = await get(kc, name ? `${collection}/${encodeURIComponent(name)}` : collection);
  } catch {
    return undefined;
  }
  if (res.status === 404 && name) {
    return { stdout: '', stderr: `Error from server (NotFound): ${r.qualified} "${name}" not found\n`, code: 1 };
  }
  if (res.status !== 200) return undefined;
  const print = (o: unknown) => ({ stdout: `${JSON.stringify(o, null, 4)}\n`, stderr: '', code: 0 });
  if (name) return print(withoutManagedFields(JSON.parse(res.body) as Record<string, unknown>));
  // A list as kubectl prints it: a v1 List whose items carry their apiVersion and kind.
  const list = JSON.parse(res.body) as { items?: Record<string, unknown>[] };
  const items = (list.items ?? []).map((o) => withoutManagedFields({ apiVersion: r.apiVersion, kind: r.kind, ...o }));
  return print({ apiVersion: 'v1', items, kind: 'List', metadata: { resourceVersion: '' } });
}

/** kubectl hides `metadata.managedFields` unless `--show-managed-fields`. */
function withoutManagedFields(o: Record<string, unknown>): Record<string, unknown> {
  const { managedFields: _, ...metadata } = (o.metadata ?? {}) as Record<string, unknown>;
  return { ...o, metadata };
}
