/**
 * Shared pieces of the PackageRepository e2e files (reference §2.2, §3.12, §3.13): the resource
 * names, status shape and waits of a PackageRepository, the documents a repository author
 * writes, and the assertions every successful repository reconcile shares.
 *
 * Not a test file (vitest only collects `*.test.ts`).
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { ApiException, CustomObjectsApi } from '@kubernetes/client-node';
import { expect } from 'vitest';
import { parse as parseYaml, stringify } from 'yaml';
import { Finalizer } from '../../functions/lib/api/index.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { parseRolloutPolicy } from '../../functions/lib/rollout/policy.js';
import { putPolicy } from '../../functions/lib/rollout/state.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';
import { loadKubeConfig } from '../harness/kube.js';
import {
  type AppStatusView,
  applyCrds,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  expectSucceededStatus,
  getObject,
  k,
  kubeconfigPath,
  SA,
  STATUS_KEYS,
  startRuntime,
  waitFor,
} from './support.js';

/** Resource names for kubectl, fully qualified (no clash with another API's `packages`). */
export const PKGR = 'packagerepositories.packaging.carvel.dev';
/** Packages (CRD), fully qualified. */
export const PKG = 'packages.data.packaging.carvel.dev';
/** PackageMetadatas (CRD), fully qualified. */
export const PKGM = 'packagemetadatas.data.packaging.carvel.dev';

/** Keys kapp-controller may serialize in PackageRepository status: App status without inspect. */
export const PKGR_STATUS_KEYS: ReadonlySet<string> = new Set([...STATUS_KEYS].filter((key) => key !== 'inspect'));

/** The parts of a PackageRepository the tests read. */
export interface RepoObject {
  metadata: {
    name: string;
    namespace: string;
    generation: number;
    finalizers?: string[];
    deletionTimestamp?: string;
  };
  status?: AppStatusView;
}

/** The parts of a Package or PackageMetadata the tests read. */
export interface PackagingObject {
  metadata: { name: string; namespace?: string; annotations?: Record<string, string>; labels?: Record<string, string> };
  spec: Record<string, unknown> & { refName?: string; version?: string };
}

/** A PackageRepository manifest with one fetch source and a 10m sync period (no resync in a test). */
export function repositoryManifest(ns: string, name: string, fetch: Record<string, unknown>): object {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageRepository',
    metadata: { name, namespace: ns },
    spec: { syncPeriod: '10m', fetch },
  };
}

/** An inline PackageRepository whose `paths` (file → content) are its fetched tree. */
export function inlineRepositoryManifest(ns: string, name: string, paths: Record<string, string>): object {
  return repositoryManifest(ns, name, { inline: { paths } });
}

/** A PackageMetadata document as a repository author writes it. */
export function packageMetadataDoc(refName: string, spec: Record<string, unknown> = {}): object {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'PackageMetadata',
    metadata: { name: refName },
    spec: { displayName: refName.split('.')[0], ...spec },
  };
}

/** A Package document as a repository author writes it (its name carries a raw `+`). */
export function packageDoc(
  refName: string,
  version: string,
  opts: { annotations?: Record<string, string>; spec?: Record<string, unknown> } = {},
): object {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${refName}.${version}`, ...(opts.annotations ? { annotations: opts.annotations } : {}) },
    spec: {
      refName,
      version,
      template: {
        spec: {
          fetch: [{ imgpkgBundle: { image: `registry.invalid/${refName}:${version.replace('+', '_')}` } }],
          template: [{ ytt: { paths: ['config/'] } }],
          deploy: [{ kapp: {} }],
        },
      },
      ...opts.spec,
    },
  };
}

/** A Package of `version` whose App deploys an inline ytt ConfigMap `name` with `data.version` (kapp succeeds at once). */
export function inlineConfigMapPackageDoc(refName: string, version: string, name: string): object {
  const config = `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${name}\ndata:\n  version: "${version}"\n`;
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${refName}.${version}` },
    spec: {
      refName,
      version,
      template: {
        spec: {
          fetch: [{ inline: { paths: { 'config.yml': config } } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
}

/** An inline repository's `paths`: `packages/<i>.yml` per document. */
export function packagesPaths(docs: object[]): Record<string, string> {
  return Object.fromEntries(docs.map((d, i) => [`packages/${i}.yml`, stringify(d)]));
}

/** True when the repository finished a reconcile (succeeded or failed) of its current generation. */
export function repoReconciled(repo: RepoObject): boolean {
  const s = repo.status;
  return (
    s?.observedGeneration === repo.metadata.generation &&
    (s.conditions?.some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed') ?? false)
  );
}

let repos: CustomObjectsApi | undefined;

/**
 * Reads a PackageRepository of the shared cluster; `undefined` when it does not exist. In
 * process, as `getApp`: the waits poll every second, several at once, and a kubectl run costs
 * about 0.1 s of CPU on a machine the parallel files share.
 */
export async function getRepo(ns: string, name: string): Promise<RepoObject | undefined> {
  repos ??= loadKubeConfig(kubeconfigPath).makeApiClient(CustomObjectsApi);
  try {
    return (await repos.getNamespacedCustomObject({ ...PKGR_RESOURCE, namespace: ns, name })) as RepoObject;
  } catch (e) {
    if (e instanceof ApiException && e.code === 404) return undefined;
    throw new Error(`get PackageRepository ${ns}/${name}: ${e instanceof ApiException ? e.code : String(e)}`);
  }
}

const PKGR_RESOURCE = { group: 'packaging.carvel.dev', version: 'v1alpha1', plural: 'packagerepositories' } as const;

/**
 * Waits until `pred` holds for the PackageRepository (default: {@link repoReconciled}); the
 * timeout error shows it and the runtime's last log records about it.
 */
export async function waitRepo(
  rt: E2ERuntime,
  ns: string,
  name: string,
  pred: (repo: RepoObject) => boolean = repoReconciled,
  what = 'a finished reconcile of the current generation',
): Promise<RepoObject> {
  let last: RepoObject | undefined;
  return await waitFor(
    `PackageRepository ${ns}/${name}: ${what}`,
    async () => {
      last = await getRepo(ns, name);
      return last && pred(last) ? last : undefined;
    },
    {
      timeoutMs: 150_000,
      intervalMs: 1000,
      describe: () =>
        `last: ${JSON.stringify(last ?? null, null, 1)}\nlog: ${rt.records
          .filter((r) => typeof r.obj.object === 'string' && r.obj.object.endsWith(`/${ns}/${name}`))
          .slice(-20)
          .map((r) => JSON.stringify({ level: r.level, msg: r.msg, ...r.obj }))
          .join('\n')}`,
    },
  );
}

/** Waits until the PackageRepository is gone (the error shows it as last read). */
export async function waitRepoGone(ns: string, name: string, timeoutMs = 120_000): Promise<void> {
  await waitFor(`PackageRepository ${ns}/${name} gone`, async () => ((await getRepo(ns, name)) ? undefined : true), {
    timeoutMs,
    intervalMs: 1000,
    describe: async () => JSON.stringify((await getRepo(ns, name)) ?? null),
  });
}

/** Lists every object of `kind` in `ns` (kubectl, JSON). */
export async function listObjects<T = PackagingObject>(kind: string, ns: string, args: string[] = []): Promise<T[]> {
  const r = await k(['get', kind, '-n', ns, ...args, '-o', 'json']);
  return (JSON.parse(r.stdout) as { items: T[] }).items;
}

/** Lists the Packages of `ns` whose `spec.refName` is `refName` (the CRD's selectable field). */
export async function packagesByRefName(ns: string, refName: string): Promise<PackagingObject[]> {
  return listObjects(PKG, ns, ['--field-selector', `spec.refName=${refName}`]);
}

/** Asserts upstream's status after a successful PackageRepository reconcile (§3.12 step 7). */
export function expectRepoSucceeded(repo: RepoObject): void {
  const s = expectSucceededStatus(repo, PKGR_STATUS_KEYS);
  expect(s.fetch?.stdout).toContain('kind: LockConfig');
  // a repository's deploy status has no associatedResources upstream
  expect(s.deploy).not.toHaveProperty('kapp');
  expect(repo.metadata.finalizers).toContain(Finalizer.PackageRepository);
}

/** The four annotations the clean-up overlay adds (§3.12 step 5.3). */
export const cleanUpAnnotations = (ns: string, name: string): Record<string, string> => ({
  'kapp.k14s.io/disable-original': '',
  'kapp.k14s.io/disable-wait': '',
  'packaging.carvel.dev/package-repository-ref': `${ns}/${name}`,
  'kapp.k14s.io/create-strategy': 'fallback-on-update-or-noop',
});

/**
 * Writes to `file` the shared kubeconfig with one more context per name in `contexts`, each a
 * copy of the current one: so many cluster ids of one control plane (a fleet in one test).
 */
export async function fleetKubeconfig(file: string, contexts: readonly string[]): Promise<void> {
  const doc = parseYaml(await readFile(kubeconfigPath, 'utf8')) as {
    'current-context': string;
    contexts: Array<{ name: string; context: Record<string, unknown> }>;
  };
  const current = doc.contexts.find((c) => c.name === doc['current-context']);
  if (!current) throw new Error('the shared kubeconfig has no current context');
  doc.contexts = [...doc.contexts, ...contexts.map((name) => ({ name, context: { ...current.context } }))];
  await writeFile(file, stringify(doc), { mode: 0o600 });
}

/** The last 30 log records of `runtimes` whose `msg object` matches `pattern`, one JSON line each (a wait's `describe`). */
export function fleetLog(runtimes: readonly E2ERuntime[], pattern: RegExp): string {
  return runtimes
    .flatMap((r) => r.records)
    .filter((r) => pattern.test(`${r.msg} ${String(r.obj.object ?? '')}`))
    .slice(-30)
    .map((r) => JSON.stringify({ level: r.level, msg: r.msg, ...r.obj }))
    .join('\n');
}

/** Log records of a source poll seeing a source move, across `runtimes` (one per resolution that saw it). */
export function sourceMoves(runtimes: readonly E2ERuntime[]): E2ERuntime['records'] {
  return runtimes.flatMap((r) => r.records).filter((r) => r.msg === 'source moved to a new digest');
}

/** The second and later runtimes' source poll period in {@link startFleet}, ms: longer than any test, so no poll of theirs sees a move. */
const FLEET_LONG_POLL_PERIOD_MS = 600_000;

/** A fleet started by {@link startFleet}: one runtime per cluster id, in the order given. */
export interface E2EFleet {
  runtimes: E2ERuntime[];
  /** Stops the runtimes, removes the fleet's directory and deletes its namespaces. */
  dispose(): Promise<void>;
}

/**
 * Starts a fleet on the shared control plane: each cluster id a kubeconfig context of its own
 * (`fleetKubeconfig`) with a tenant namespace and an embedded runtime of its own, all sharing
 * one object store, as a fleet shares one bucket. Only the first runtime polls sources, every
 * `pollPeriodMs`; the others learn of a move from the poll records, as members of a fleet
 * whose poll another runtime won. Every tool run of every runtime goes to `onToolRun` first.
 * `health`: the forwarders track what the Apps deployed (off by default in the e2e runtimes).
 */
export async function startFleet(
  clusters: readonly { context: string; ns: string }[],
  opts: { prefix: string; pollPeriodMs: number; onToolRun: (req: RunRequest) => void; health?: boolean },
): Promise<E2EFleet> {
  await applyCrds();
  await Promise.all(clusters.map((c) => createTenant(c.ns)));
  const dir = await mkdtemp(path.join(tmpdir(), opts.prefix));
  const runtimes: E2ERuntime[] = [];
  const dispose = async () => {
    for (const r of runtimes) await r.dispose();
    await rm(dir, { recursive: true, force: true });
    await deleteNamespaces(clusters.map((c) => c.ns));
  };
  try {
    const kubeconfig = path.join(dir, 'kubeconfig');
    await fleetKubeconfig(
      kubeconfig,
      clusters.map((c) => c.context),
    );
    for (const [i, c] of clusters.entries()) {
      runtimes.push(
        await startRuntime([c.ns], {
          kubeconfigPath: kubeconfig,
          contexts: [c.context],
          storeDir: path.join(dir, 'store'),
          config: { sourcePollPeriodMs: i === 0 ? opts.pollPeriodMs : FLEET_LONG_POLL_PERIOD_MS },
          ...(opts.health ? { forwarder: { health: true } } : {}),
          wrapDeps: (deps) => ({
            ...deps,
            runner: {
              run: async (req: RunRequest) => {
                opts.onToolRun(req);
                return await deps.runner.run(req);
              },
            },
          }),
        }),
      );
    }
  } catch (err) {
    await dispose();
    throw err;
  }
  return { runtimes, dispose };
}

/**
 * PackageInstall `app` of `refName` in `ns`, any version from 1.0.0 (`>=1.0.0`), sync period 10m
 * (no timer fires during a test: what moves it are events).
 */
export function fleetPackageInstall(ns: string, refName: string): object {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name: 'app', namespace: ns },
    spec: {
      serviceAccountName: SA,
      syncPeriod: '10m',
      packageRef: { refName, versionSelection: { constraints: '>=1.0.0' } },
    },
  };
}

/** A PackageInstall's status as the fleet tests read it. */
export interface PkgiObject {
  status?: {
    version?: string;
    conditions?: Array<{ type: string; status?: string; reason?: string; message?: string }>;
  };
}

/**
 * Waits until PackageInstall `<ns>/app` satisfies `pred`; on a timeout the error shows its last
 * read and `runtimes`' log lines about rollouts, health and PackageInstalls.
 * @returns the object then
 */
export async function waitFleetPackageInstall(
  runtimes: readonly E2ERuntime[],
  ns: string,
  what: string,
  pred: (p: PkgiObject | undefined) => boolean,
  timeoutMs = 150_000,
): Promise<PkgiObject> {
  let last: PkgiObject | undefined;
  return await waitFor(
    `PackageInstall ${ns}/app: ${what}`,
    async () => {
      last = await getObject<PkgiObject>('packageinstalls.packaging.carvel.dev', ns, 'app');
      return pred(last) ? (last as PkgiObject) : undefined;
    },
    {
      timeoutMs,
      intervalMs: 250,
      describe: () =>
        `last: ${JSON.stringify(last ?? null)}\nlog: ${fleetLog(runtimes, /rollout|health|PackageInstall/)}`,
    },
  );
}

/**
 * Stores RolloutPolicy `name` with `spec` in `store`, as `npm run fleet -- rollout apply` does
 * (the file's YAML parsed and validated by `parseRolloutPolicy`); the runtimes read it within 2 s.
 */
export async function applyRolloutPolicy(store: ObjectStore, name: string, spec: object): Promise<void> {
  await putPolicy(
    store,
    parseRolloutPolicy(stringify({ apiVersion: 'kapp-lambda/v1', kind: 'RolloutPolicy', metadata: { name }, spec })),
  );
}
