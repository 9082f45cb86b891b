/**
 * Scenario 8, package repositories, modelled on upstream's own repository benchmark
 * (kapp-controller `test/bench/pkgr_test.go`): one inline PackageRepository of 50, 100 and 500
 * Packages (50 refNames × 1 version, 50 × 2, 100 × 5, as upstream), timed from the create
 * request to `ReconcileSucceeded` of its generation and from the delete request to the object
 * gone (its Packages are removed by `kapp delete <name>.pkgr` before the finalizer goes), for
 * kapp-lambda and for upstream kapp-controller, each in a namespace of its own, in the same run.
 * Upstream's published thresholds are printed beside the figures.
 *
 * Differences from upstream's benchmark: each refName also gets a PackageMetadata (`packages/
 * <refName>/metadata.yml`, the layout of a real repository such as kadras-packages), and the
 * Packages have the shape of a small real one (kadras `secretgen-controller` 0.21.1: an
 * imgpkgBundle fetch by digest, ytt + kbld, kapp raw options, licenses, release notes, a small
 * values schema) instead of upstream's `template: {spec: {}}`. Upstream times `kapp deploy`
 * and `kapp delete` of the PackageRepository with `--wait-check-interval=1s` (so up to 1 s of
 * polling is in its figures); here the benchmark's watch sees the status and the deletion.
 *
 * Object size: a PackageRepository is one Kubernetes object (etcd's default request limit is
 * 1.5 MiB). The repository is split by refName into several PackageRepositories (`repo-N-1`,
 * `repo-N-2`, …) only when one would exceed {@link MAX_REPOSITORY_BYTES} of JSON; the results
 * record the size and the number of objects (with the shapes here even 500 Packages stay well
 * below, as upstream's single inline repository did). With several objects, "deployed" is the
 * last one succeeded and "deleted" the last one gone.
 *
 * Fleet (kapp-lambda only): a second cluster id (a kubeconfig context pointing at the same
 * control plane, its own namespace and runtime, one object store shared with the first, as a
 * fleet shares its bucket) gets the same 500-Package repository after the first id reconciled
 * it; counted: the tool processes the second id starts other than kapp (target 0: it deploys the
 * index stored for that content digest).
 *
 * @module
 */
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { stringify } from 'yaml';
import type { ToolStats } from '../../functions/lib/exec/metrics.js';
import { PACKAGING_API_VERSION } from '../../functions/lib/kube/port.js';
import type { RestTransport } from '../../functions/lib/kube/transport.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { type BenchContext, clusterOf, contextOf, scratchDir } from '../lib/context.js';
import { startKappController } from '../lib/kapp-controller.js';
import {
  AppWatch,
  collectionPath,
  createAll,
  createTenants,
  loadKubeConfig,
  type Manifest,
  restFor,
} from '../lib/kube.js';
import { type Ours, startOurs, startOursIn, toolDelta, waitForwardersReady } from '../lib/ours.js';
import { fmtMs } from '../lib/stats.js';

/** One repository size of upstream's benchmark and its published thresholds. */
export interface RepositorySize {
  /** Packages in all: `refNames × versions`. */
  packages: number;
  refNames: number;
  versions: number;
  /** Upstream's threshold for create → reconciled, seconds (`deploySecondsForPackageCount`). */
  deployThresholdS: number;
  /** Upstream's threshold for delete → gone, seconds (`deleteSecondsForPackageCount`). */
  deleteThresholdS: number;
}

/** Upstream's three sizes (`Benchmark_pkgr_with_{50,100,500}_packages`) and thresholds. */
export const REPOSITORY_SIZES: readonly RepositorySize[] = [
  { packages: 50, refNames: 50, versions: 1, deployThresholdS: 5, deleteThresholdS: 7 },
  { packages: 100, refNames: 50, versions: 2, deployThresholdS: 7, deleteThresholdS: 8 },
  { packages: 500, refNames: 100, versions: 5, deployThresholdS: 22.5, deleteThresholdS: 25 },
];

/**
 * Largest PackageRepository written as one object, bytes of JSON: below etcd's default
 * request limit (1.5 MiB), leaving room for status, managed fields and the finalizer.
 */
export const MAX_REPOSITORY_BYTES = 1_000_000;

/** Target of the issue: ours at most this multiple of kapp-controller's time at each size. */
export const TARGET_RATIO = 0.8;

const PKGR_KIND = { apiVersion: PACKAGING_API_VERSION, kind: 'PackageRepository' };
const TIMEOUT_MS = 5 * 60_000;
/** Idle time between the reconcile being seen and the delete request (both implementations). */
const SETTLE_MS = 2000;

/** `pkg<i>.test.carvel.dev`, upstream's refNames. */
function refName(i: number): string {
  return `pkg${i}.test.carvel.dev`;
}

/** A Package in the shape of a small real one (kadras secretgen-controller 0.21.1). */
function packageDoc(ref: string, version: string): object {
  const digest = createHash('sha256').update(`${ref}@${version}`).digest('hex');
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${ref}.${version}` },
    spec: {
      refName: ref,
      version,
      licenses: ['Apache 2.0'],
      releaseNotes: `https://example.invalid/${ref}/releases/${version}`,
      releasedAt: '2026-06-12T15:39:24Z',
      template: {
        spec: {
          fetch: [{ imgpkgBundle: { image: `registry.invalid/bench/${ref}@sha256:${digest}` } }],
          template: [{ ytt: { paths: ['config'] } }, { kbld: { paths: ['-', '.imgpkg/images.yml'] } }],
          deploy: [{ kapp: { rawOptions: ['--wait-timeout=5m', '--kube-api-qps=50', '--kube-api-burst=100'] } }],
        },
      },
      valuesSchema: {
        openAPIv3: {
          type: 'object',
          additionalProperties: false,
          properties: {
            namespace: { type: 'string', default: 'default', description: 'Namespace to install into.' },
            replicas: { type: 'integer', default: 1, description: 'Number of replicas.' },
          },
        },
      },
    },
  };
}

/** A PackageMetadata in the shape of a real one without an icon (kadras opentelemetry-operator). */
function metadataDoc(ref: string, i: number): object {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'PackageMetadata',
    metadata: { name: ref },
    spec: {
      displayName: `pkg${i}`,
      categories: ['benchmark'],
      shortDescription: `Benchmark package ${i}.`,
      longDescription: `Benchmark package ${i}, generated in the shape of a real package repository entry.`,
      providerName: 'kapp-lambda bench',
      maintainers: [{ name: 'kapp-lambda' }],
      supportDescription: 'Generated by npm run bench.',
    },
  };
}

/** The `packages/` files of one refName: `metadata.yml` and one `<version>.yml` per version. */
function refNameFiles(i: number, versions: number): Record<string, string> {
  const ref = refName(i);
  const files: Record<string, string> = { [`packages/${ref}/metadata.yml`]: stringify(metadataDoc(ref, i)) };
  for (let j = 0; j < versions; j++) {
    const v = `0.${j}.0`;
    files[`packages/${ref}/${v}.yml`] = stringify(packageDoc(ref, v));
  }
  return files;
}

function repositoryManifest(ns: string, name: string, paths: Record<string, string>): Manifest {
  return {
    apiVersion: PACKAGING_API_VERSION,
    kind: 'PackageRepository',
    metadata: { name, namespace: ns },
    spec: { syncPeriod: '10m0s', fetch: { inline: { paths } } },
  };
}

/** The PackageRepositories of one size and their JSON sizes. */
export interface RepositorySet {
  manifests: Manifest[];
  /** JSON bytes of each manifest. */
  bytes: number[];
}

/**
 * The inline PackageRepository (or, above `maxBytes`, repositories split by refName, all files
 * of one refName in the same one) of one size, named `repo-<packages>` (`repo-<packages>-<n>`
 * when split).
 *
 * @param maxBytes - largest JSON size of one repository; default {@link MAX_REPOSITORY_BYTES}
 */
export function repositorySet(ns: string, size: RepositorySize, maxBytes = MAX_REPOSITORY_BYTES): RepositorySet {
  const base = `repo-${size.packages}`;
  // JSON bytes of the manifest without files (with the longest name it can get), plus each
  // file's `"path":"content",`: the exact size is measured at the end.
  const empty = Buffer.byteLength(JSON.stringify(repositoryManifest(ns, `${base}-${size.refNames}`, {})));
  const groups: { files: Record<string, string>; bytes: number }[] = [{ files: {}, bytes: empty }];
  for (let i = 0; i < size.refNames; i++) {
    const files = refNameFiles(i, size.versions);
    const bytes = Object.entries(files).reduce(
      (n, [p, c]) => n + Buffer.byteLength(JSON.stringify(p)) + Buffer.byteLength(JSON.stringify(c)) + 2,
      0,
    );
    const last = groups[groups.length - 1]!;
    if (last.bytes + bytes <= maxBytes || Object.keys(last.files).length === 0) {
      Object.assign(last.files, files);
      last.bytes += bytes;
    } else groups.push({ files, bytes: empty + bytes });
  }
  const manifests = groups.map((g, n) =>
    repositoryManifest(ns, groups.length > 1 ? `${base}-${n + 1}` : base, g.files),
  );
  return { manifests, bytes: manifests.map((m) => Buffer.byteLength(JSON.stringify(m))) };
}

/** One size measured on one implementation. */
export interface RepositoryRun {
  packages: number;
  /** PackageRepository objects the content was written as, and their JSON bytes. */
  objects: number;
  bytes: number[];
  /** Create request of the first → the last seen `ReconcileSucceeded`. */
  deployMs: number;
  /** Delete request of the first → the last seen gone. */
  deleteMs: number;
  /** kapp-lambda only: tool runs during the deploy and during the delete. */
  tools?: {
    deploy: Record<string, { runs: number; ms: number }>;
    delete: Record<string, { runs: number; ms: number }>;
  };
  /** kapp-lambda only: stage → Σ durations of the stage records of these repositories. */
  stages?: Record<string, number>;
}

/** Counts Packages and PackageMetadatas in a namespace. */
async function countPackaging(rest: RestTransport, ns: string): Promise<{ packages: number; metadatas: number }> {
  const count = async (kind: string) => {
    const r = await rest.send({ method: 'GET', path: collectionPath(kind, ns) });
    if (r.statusCode !== 200) throw new Error(`list ${kind} in ${ns}: ${r.statusCode}`);
    return (r.body as { items: unknown[] }).items.length;
  };
  return { packages: await count('Package'), metadatas: await count('PackageMetadata') };
}

/** Sends a delete request for each named PackageRepository of `ns` (404 counts as deleted). */
async function deleteRepositories(rest: RestTransport, ns: string, names: readonly string[]): Promise<void> {
  for (const n of names) {
    const r = await rest.send({ method: 'DELETE', path: `${collectionPath('PackageRepository', ns)}/${n}` });
    if (r.statusCode !== 200 && r.statusCode !== 202 && r.statusCode !== 404) {
      throw new Error(`delete PackageRepository ${ns}/${n}: ${r.statusCode}`);
    }
  }
}

/** What a measurement needs of the implementation under test. */
interface Target {
  label: string;
  kubeconfigPath: string;
  context?: string;
  rest: RestTransport;
  ns: string;
  /** kapp-lambda: the instrumented runtime (tool counts, stage records, idle). */
  ours?: Ours;
}

/**
 * Creates the repositories of one size, waits for `ReconcileSucceeded`, checks that every
 * Package and PackageMetadata exists, deletes them, waits until they are gone and checks that
 * their packages are gone too.
 * @throws Error when a repository fails, times out, or the package counts are wrong.
 */
async function deployAndDelete(ctx: BenchContext, t: Target, size: RepositorySize): Promise<RepositoryRun> {
  const set = repositorySet(t.ns, size);
  const names = set.manifests.map((m) => m.metadata.name);
  const keys = names.map((n) => `${t.ns}/${n}`);
  const watch = new AppWatch(t.kubeconfigPath, t.ns, t.context, PKGR_KIND);
  await watch.start();
  try {
    const tools0: Record<string, ToolStats> = t.ours?.tools() ?? {};
    const rec0 = t.ours?.records.length ?? 0;
    const t0 = performance.now();
    await createAll(t.rest, set.manifests);
    const seen = await watch.waitAll(keys, TIMEOUT_MS);
    const failed = [...seen.entries()].filter(([, s]) => s.final !== 'succeeded');
    if (failed.length) throw new Error(`${t.label}: ${failed[0]![0]} failed: ${failed[0]![1].message}`);
    const deployMs = Math.max(...[...seen.values()].map((s) => s.at)) - t0;
    await t.ours?.runtime.pipeline.idle();
    const tools1 = t.ours?.tools() ?? {};
    const after = await countPackaging(t.rest, t.ns);
    if (after.packages !== size.packages || after.metadatas !== size.refNames) {
      throw new Error(
        `${t.label}: ${after.packages} Packages and ${after.metadatas} PackageMetadatas after reconcile, expected ${size.packages} and ${size.refNames}`,
      );
    }
    await new Promise((r) => setTimeout(r, SETTLE_MS));

    const t1 = performance.now();
    await deleteRepositories(t.rest, t.ns, names);
    const gone = await watch.waitGone(keys, TIMEOUT_MS);
    const deleteMs = Math.max(...gone.values()) - t1;
    await t.ours?.runtime.pipeline.idle();
    const left = await countPackaging(t.rest, t.ns);
    if (left.packages + left.metadatas !== 0) {
      throw new Error(`${t.label}: ${left.packages} Packages and ${left.metadatas} PackageMetadatas left after delete`);
    }
    const run: RepositoryRun = {
      packages: size.packages,
      objects: set.manifests.length,
      bytes: set.bytes,
      deployMs,
      deleteMs,
    };
    if (t.ours) {
      run.tools = { deploy: toolDelta(tools0, tools1), delete: toolDelta(tools1, t.ours.tools()) };
      const own = new Set(names);
      const stages: Record<string, number> = {};
      for (const r of t.ours.records.slice(rec0)) {
        if (own.has(r.object.split('/').pop() ?? '')) stages[r.stage] = (stages[r.stage] ?? 0) + r.durationMs;
      }
      run.stages = stages;
    }
    ctx.say(
      `repositories ${t.label} ${size.packages}: deploy ${fmtMs(deployMs)}, delete ${fmtMs(deleteMs)} (${set.manifests.length} object(s), ${set.bytes.join('+')} B)`,
    );
    return run;
  } catch (err) {
    // Leave nothing behind for the next size: the same package names would meet these.
    await deleteRepositories(t.rest, t.ns, names)
      .then(() => watch.waitGone(keys, 60_000))
      .catch((e: Error) => ctx.say(`repositories ${t.label}: clean-up after failure: ${e.message}`));
    throw err;
  } finally {
    await watch.stop();
  }
}

/** kapp-lambda's runtime for this scenario (one namespace), with the measurement bound to it. */
export interface RepositoriesOurs {
  measure(size: RepositorySize): Promise<RepositoryRun>;
  stop(): Promise<void>;
}

/**
 * Starts kapp-lambda's embedded runtime for namespace `ns` (which must exist).
 * @throws Error when its forwarder does not start watching in time.
 */
export async function startRepositoriesOurs(ctx: BenchContext, ns: string): Promise<RepositoriesOurs> {
  const { cluster, rest } = clusterOf(ctx);
  const ours = await startOursIn(ctx, ns, 'repositories');
  try {
    await waitForwardersReady(ours);
  } catch (err) {
    await ours.stop();
    throw err;
  }
  const target: Target = { label: 'kapp-lambda', kubeconfigPath: cluster.kubeconfigPath, rest, ns, ours };
  return { measure: (size) => deployAndDelete(ctx, target, size), stop: () => ours.stop() };
}

/**
 * Measures one size against a running kapp-controller that watches `ns`.
 * @throws Error as {@link deployAndDelete}.
 */
export function repositoriesTheirs(ctx: BenchContext, ns: string, size: RepositorySize): Promise<RepositoryRun> {
  const { cluster, rest } = clusterOf(ctx);
  return deployAndDelete(ctx, { label: 'kapp-controller', kubeconfigPath: cluster.kubeconfigPath, rest, ns }, size);
}

/** The fleet case: the same repository on a second cluster id. */
export interface RepositoryFleet {
  packages: number;
  /** create → ReconcileSucceeded on the first id and on the second. */
  firstMs: number;
  secondMs: number;
  /** Tool runs of the second id, by tool. */
  secondTools: Record<string, { runs: number; ms: number }>;
  /** Of those, every run that is not kapp (target 0). */
  toolRunsBeforeKapp: number;
}

/**
 * The fleet case (see the module comment). Starts and stops two runtimes sharing one store;
 * the namespaces must exist.
 * @throws Error when a repository fails or times out on either id.
 */
export async function repositoryFleetOurs(
  ctx: BenchContext,
  namespaces: readonly [string, string],
  size: RepositorySize,
): Promise<RepositoryFleet> {
  const { cluster } = clusterOf(ctx);
  const dir = await scratchDir(ctx, 'repositories-fleet');
  // A second context on cluster A: another cluster id for the runtime.
  const kc = loadKubeConfig(cluster.kubeconfigPath);
  const first = contextOf(cluster);
  const current = kc.getContextObject(first);
  if (!current) throw new Error(`repositories fleet: no context ${first} in the kubeconfig`);
  const second = 'bench-fleet-2';
  kc.addContext({ ...current, name: second });
  const kubeconfig = path.join(dir, 'kubeconfig.yaml');
  await writeFile(kubeconfig, kc.exportConfig(), { mode: 0o600 });
  const store = new LocalDirStore(path.join(dir, 'store'));
  const ids = [first, second] as const;
  const runtimes = ids.map((id, j) =>
    startOurs({
      kubeconfigPath: kubeconfig,
      contexts: [id],
      namespaces: [namespaces[j]!],
      store,
      tmpRoot: path.join(dir, 'work', id),
      cacheRoot: ctx.cacheRoot,
      concurrency: 4,
      say: ctx.say,
    }),
  );
  const watches = ids.map((id, j) => new AppWatch(kubeconfig, namespaces[j], id, PKGR_KIND));
  try {
    await Promise.all(runtimes.map((r) => waitForwardersReady(r, 60_000)));
    for (const w of watches) await w.start();
    const times: number[] = [];
    let secondTools: Record<string, { runs: number; ms: number }> = {};
    for (const j of [0, 1]) {
      const ns = namespaces[j]!;
      const set = repositorySet(ns, size);
      const keys = set.manifests.map((m) => `${ns}/${m.metadata.name}`);
      const before = runtimes[j]!.tools();
      const t0 = performance.now();
      await createAll(restFor(kubeconfig, ids[j]), set.manifests);
      const seen = await watches[j]!.waitAll(keys, TIMEOUT_MS);
      const bad = [...seen.values()].find((s) => s.final !== 'succeeded');
      if (bad) throw new Error(`repositories fleet: ${ids[j]} failed: ${bad.message}`);
      times.push(Math.max(...[...seen.values()].map((s) => s.at)) - t0);
      await runtimes[j]!.runtime.pipeline.idle();
      if (j === 1) secondTools = toolDelta(before, runtimes[j]!.tools());
    }
    const toolRunsBeforeKapp = Object.entries(secondTools)
      .filter(([tool]) => tool !== 'kapp')
      .reduce((a, [, v]) => a + v.runs, 0);
    ctx.say(
      `repositories fleet: first id ${fmtMs(times[0]!)}, second id ${fmtMs(times[1]!)}; second id's tools ${JSON.stringify(secondTools)}`,
    );
    // Clean up: delete both repositories (their packages go with them) and wait until gone.
    for (const j of [0, 1]) {
      const ns = namespaces[j]!;
      const rest = restFor(kubeconfig, ids[j]);
      const names = repositorySet(ns, size).manifests.map((m) => m.metadata.name);
      await deleteRepositories(rest, ns, names);
      await watches[j]!.waitGone(
        names.map((n) => `${ns}/${n}`),
        TIMEOUT_MS,
      );
    }
    return { packages: size.packages, firstMs: times[0]!, secondMs: times[1]!, secondTools, toolRunsBeforeKapp };
  } finally {
    for (const w of watches) await w.stop();
    await Promise.all(runtimes.map((r) => r.stop()));
  }
}

/** `run.ts`'s step runner: a failure is recorded as not measured and `undefined` returned. */
export type StepRunner = <T>(scenario: string, figure: string, fn: () => Promise<T>) => Promise<T | undefined>;

/** Result of the repositories scenario, as written to the results file. */
export interface RepositoriesResult {
  sizes: readonly RepositorySize[];
  maxRepositoryBytes: number;
  /** Namespaces: kapp-lambda's, kapp-controller's, the fleet's two. */
  namespaces: { ours: string; theirs: string; fleet: readonly [string, string] };
  ours: RepositoryRun[];
  theirs: RepositoryRun[];
  kappController?: { version: string; startMs: number; cpuSeconds: number };
  /** Per size: ours/theirs of deploy and delete time (null when either is missing). */
  ratios: Record<string, { deploy: number | null; delete: number | null }>;
  fleet?: RepositoryFleet;
}

const SCENARIO = '8 repositories';
const NS = {
  ours: 'bench-repos',
  theirs: 'bench-kc-repos',
  fleet: ['bench-repos-fleet-1', 'bench-repos-fleet-2'] as const,
};

const secs = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

/** `kapp 1× 2.91 s, ytt 3× 0.71 s`: tool runs and their summed time. */
function fmtTools(tools: Record<string, { runs: number; ms: number }>): string {
  return (
    Object.entries(tools)
      .map(([tool, v]) => `${tool} ${v.runs}× ${secs(v.ms)}`)
      .join(', ') || 'none'
  );
}

/**
 * Runs the scenario: per size kapp-lambda, then kapp-controller (both running throughout, each
 * watching only its own namespace, so the idle one costs next to nothing), then the fleet case.
 * Every measurement is its own step, so one failure leaves the others measured. Adds the table
 * rows (upstream's thresholds beside the figures).
 *
 * @param bin - the kapp-controller binary, or undefined when its build failed (then only ours)
 */
export async function repositoriesScenario(
  ctx: BenchContext,
  bin: string | undefined,
  step: StepRunner,
): Promise<RepositoriesResult> {
  const { cluster, rest } = clusterOf(ctx);
  const result: RepositoriesResult = {
    sizes: REPOSITORY_SIZES,
    maxRepositoryBytes: MAX_REPOSITORY_BYTES,
    namespaces: NS,
    ours: [],
    theirs: [],
    ratios: {},
  };
  const ready = await step(SCENARIO, 'namespaces', async () => {
    await createTenants(rest, [NS.ours, NS.theirs, ...NS.fleet]);
    return true;
  });
  if (!ready) return result;
  const ours = await step(SCENARIO, 'start kapp-lambda', () => startRepositoriesOurs(ctx, NS.ours));
  const kc = bin
    ? await step(SCENARIO, 'start kapp-controller', () =>
        startKappController(bin, {
          kubeconfigPath: cluster.kubeconfigPath,
          namespace: NS.theirs,
          concurrency: 4,
          controllers: ['app', 'pkgr'],
          log: ctx.say,
        }),
      )
    : undefined;
  try {
    for (const size of REPOSITORY_SIZES) {
      const n = size.packages;
      const o = ours ? await step(SCENARIO, `${n} Packages, kapp-lambda`, () => ours.measure(size)) : undefined;
      const t = kc
        ? await step(SCENARIO, `${n} Packages, kapp-controller`, () => repositoriesTheirs(ctx, NS.theirs, size))
        : undefined;
      if (o) result.ours.push(o);
      if (t) result.theirs.push(t);
      const ratio = (f: (r: RepositoryRun) => number) => (o && t ? f(o) / f(t) : null);
      const deployRatio = ratio((r) => r.deployMs);
      const deleteRatio = ratio((r) => r.deleteMs);
      result.ratios[String(n)] = {
        deploy: deployRatio === null ? null : Math.round(deployRatio * 1000) / 1000,
        delete: deleteRatio === null ? null : Math.round(deleteRatio * 1000) / 1000,
      };
      const what = `${n} Packages (${size.refNames} refNames × ${size.versions}, + ${size.refNames} PackageMetadata)`;
      for (const [phase, ms, r, threshold] of [
        ['create → ReconcileSucceeded', (x: RepositoryRun) => x.deployMs, deployRatio, size.deployThresholdS],
        ['delete → gone', (x: RepositoryRun) => x.deleteMs, deleteRatio, size.deleteThresholdS],
      ] as const) {
        if (o) {
          ctx.rows.push({
            scenario: SCENARIO,
            figure: `${what}: ${phase}, kapp-lambda`,
            value: `${secs(ms(o))}${r === null ? '' : `; ours/theirs ${r.toFixed(2)}`}`,
            target: `≤ ${TARGET_RATIO}× kapp-controller (upstream's threshold < ${threshold} s)`,
            verdict: r === null ? '' : r <= TARGET_RATIO ? 'met' : 'missed',
          });
        }
        if (t) {
          ctx.rows.push({
            scenario: SCENARIO,
            figure: `${what}: ${phase}, kapp-controller ${kc?.version ?? ''}`.trimEnd(),
            value: secs(ms(t)),
            target: `upstream's threshold < ${threshold} s`,
            verdict: ms(t) < threshold * 1000 ? 'met' : 'missed',
          });
        }
      }
      if (o?.tools) {
        ctx.rows.push({
          scenario: SCENARIO,
          figure: `  ${n} Packages, kapp-lambda: inside tools, create / delete (Σ stages ${secs(o.stages?.['index-repo'] ?? 0)} / ${secs(o.stages?.delete ?? 0)})`,
          value: `${fmtTools(o.tools.deploy)} / ${fmtTools(o.tools.delete)}`,
        });
      }
    }
    if (kc) result.kappController = { version: kc.version, startMs: kc.startMs, cpuSeconds: kc.cpuSeconds() };
  } finally {
    await kc?.stop();
    await ours?.stop();
  }

  const size = REPOSITORY_SIZES[REPOSITORY_SIZES.length - 1]!;
  const fleet = await step(SCENARIO, `fleet: ${size.packages} Packages on a second cluster id`, () =>
    repositoryFleetOurs(ctx, NS.fleet, size),
  );
  if (fleet) {
    result.fleet = fleet;
    ctx.rows.push({
      scenario: SCENARIO,
      figure: `fleet: the same ${size.packages}-Package repository on a 2nd cluster id: tool runs before kapp`,
      value: `${fleet.toolRunsBeforeKapp} (2nd id: ${fmtTools(fleet.secondTools)}; reconciled in ${secs(fleet.secondMs)}, 1st id ${secs(fleet.firstMs)})`,
      target: '0',
      verdict: fleet.toolRunsBeforeKapp === 0 ? 'met' : 'missed',
    });
  }
  return result;
}
