/**
 * Scenario 9, upgrades across the fleet (issue 10): a new package version is pushed under the
 * tag a PackageRepository follows, and every PackageInstall referencing it must report the new
 * version.
 *
 * **kapp-lambda**: 20 cluster ids, the two real control planes (cluster A and a second one
 * started here) plus 18 simulated ids (kubeconfig contexts on cluster A, each with its own
 * namespace), each served by its own embedded runtime, all sharing one object store (a fleet
 * shares one bucket). Each id has a PackageRepository on `<registry>/upgrade-fleet:latest`
 * (an imgpkg bundle in the local registry, reached through a counting proxy) and a
 * PackageInstall with `constraints: ">=1.0.0"`, both with `syncPeriod: 10m0s` (no sync timer
 * fires during the measurement). Version 1.0.0 is installed everywhere, then a bundle with
 * 1.0.0 and 2.0.0 is pushed under the same tag. Measured: push → every PackageInstall reports
 * `status.version` 2.0.0 (`ReconcileSucceeded`), and of that the wait for the source poll (push
 * → the first runtime logs "source moved to a new digest") and the event-driven rest; registry
 * requests for the repository in that window (tag resolutions, manifests and blobs by
 * digest); tool runs of the whole fleet, split into the repository's fetch (vendir of the
 * bundle), its index (ytt and kbld in an `index-repo-` scratch) and the PackageInstalls' Apps.
 * The source poll period is the default (60 s) unless `BENCH_UPGRADE_POLL_MS` says otherwise.
 *
 * **kapp-controller** v0.53.1 (one cluster, default timers): the same on one namespace of
 * cluster A with its own tag (`upgrade-kc:latest`), PackageRepository and PackageInstall with no
 * `syncPeriod` (10m, upstream's default). The new version reaches the PackageInstall when the
 * PackageRepository's next sync (10m + up to 5 s jitter after its last reconcile) writes the new
 * Package and the PackageInstall controller's Package watch fires. The wait is bounded by
 * `BENCH_UPGRADE_KC_WAIT_S` (default 660 s); its next sync's due time (last reconcile seen +
 * 10 min) is printed and recorded. It runs at the same time as kapp-lambda's fleet (it spends
 * its time waiting for that timer), each on its own registry repository and namespaces.
 *
 * @module
 */
import path from 'node:path';
import { stringify } from 'yaml';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { PACKAGING_API_VERSION } from '../../functions/lib/kube/port.js';
import type { RestTransport } from '../../functions/lib/kube/transport.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { applyCrds } from '../../scripts/local-env.js';
import { startCluster } from '../../test/harness/cluster.js';
import { type PushedBundle, pushBundle } from '../../test/harness/fixtures.js';
import { type RegistryServer, startRegistry } from '../../test/harness/servers/registry.js';
import { type BenchContext, clusterOf, scratchDir } from '../lib/context.js';
import { type FleetId, fleetIds, fleetKubeconfig } from '../lib/fleet.js';
import { startKappController } from '../lib/kapp-controller.js';
import { AppWatch, BENCH_SA, collectionPath, createAll, createTenants, type Manifest, restFor } from '../lib/kube.js';
import { type Ours, startOurs, toolDelta, waitForwardersReady } from '../lib/ours.js';
import {
  countRegistryRequests,
  type RegistryCounts,
  type RegistryProxy,
  startRegistryProxy,
} from '../lib/registry-proxy.js';
import type { Row } from '../lib/stats.js';
import type { StepRunner } from './repositories.js';

/** The refName of the benchmark's package. */
export const UPGRADE_REF_NAME = 'upgrade.bench.carvel.dev';
/** Source poll period of the fleet's runtimes unless `BENCH_UPGRADE_POLL_MS` is set: the runtime's default. */
export const DEFAULT_POLL_MS = 60_000;
/** Bound of the kapp-controller wait unless `BENCH_UPGRADE_KC_WAIT_S` is set: its PackageRepository syncs every 10 min. */
export const DEFAULT_KC_WAIT_S = 660;
/** Upstream's PackageRepository sync period (its default), ms. */
export const KC_PKGR_SYNC_MS = 10 * 60_000;
/** Target of the issue for the fleet: every PackageInstall at the new version within this. */
export const TARGET_MS = 30_000;

const SCENARIO = '9 upgrade';
const PKGR_KIND = { apiVersion: PACKAGING_API_VERSION, kind: 'PackageRepository' };
const FLEET_REPO = 'upgrade-fleet';
const KC_REPO = 'upgrade-kc';
const NS = { fleet: 'bench-upgrade', theirs: 'bench-kc-upgrade' };

/**
 * What a Package's template reads from a PackageInstall's values Secret (`values.yml`): with
 * `fail: true`, the versions listed as `breaks` of {@link upgradeBundle} fail to render (a ytt
 * `assert.fail`), the others render as without it. Declared (default false) only in bundles with
 * `breaks`, so the upgrade scenario's Packages are unchanged.
 */
export const FAIL_VALUES = 'fail: true\n';

/** A Package of `version`: an inline ytt ConfigMap (no registry access of its own); `breaks`: see {@link FAIL_VALUES}. */
function packageDoc(version: string, breaks?: readonly string[]): object {
  const paths: Record<string, string> = {
    'config.yml': `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: upgrade-bench\ndata:\n  version: "${version}"\n`,
  };
  if (breaks) {
    paths['values.yml'] = '#@data/values\n---\nfail: false\n';
    if (breaks.includes(version)) {
      paths['config.yml'] =
        `#@ load("@ytt:data", "data")\n#@ load("@ytt:assert", "assert")\n#@ if data.values.fail:\n#@   assert.fail("bench: ${version} broken on purpose")\n#@ end\n${paths['config.yml']}`;
    }
  }
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${UPGRADE_REF_NAME}.${version}` },
    spec: {
      refName: UPGRADE_REF_NAME,
      version,
      template: {
        spec: {
          fetch: [{ inline: { paths } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
}

/**
 * The repository bundle's files (`packages/<refName>/`) holding `versions`; `breaks`: the
 * versions that fail to render for a PackageInstall whose values say so ({@link FAIL_VALUES}).
 */
export function upgradeBundle(versions: readonly string[], breaks?: readonly string[]): Record<string, string> {
  const files: Record<string, string> = {
    [`packages/${UPGRADE_REF_NAME}/metadata.yml`]: stringify({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'PackageMetadata',
      metadata: { name: UPGRADE_REF_NAME },
      spec: { displayName: 'Upgrade bench' },
    }),
  };
  for (const v of versions) files[`packages/${UPGRADE_REF_NAME}/${v}.yml`] = stringify(packageDoc(v, breaks));
  return files;
}

/**
 * The PackageRepository on `image` and the PackageInstall `app` (`>=1.0.0`, {@link BENCH_SA})
 * of one namespace; `syncPeriod` left out means upstream's default (10m); `valuesSecret`: the
 * PackageInstall's values Secret (created by the caller).
 */
export function upgradeManifests(ns: string, image: string, syncPeriod?: string, valuesSecret?: string): Manifest[] {
  const period = syncPeriod ? { syncPeriod } : {};
  const values = valuesSecret ? { values: [{ secretRef: { name: valuesSecret } }] } : {};
  return [
    {
      apiVersion: PACKAGING_API_VERSION,
      kind: 'PackageRepository',
      metadata: { name: 'upgrade', namespace: ns },
      spec: { ...period, fetch: { imgpkgBundle: { image } } },
    },
    {
      apiVersion: PACKAGING_API_VERSION,
      kind: 'PackageInstall',
      metadata: { name: 'app', namespace: ns },
      spec: {
        serviceAccountName: BENCH_SA,
        ...period,
        ...values,
        packageRef: { refName: UPGRADE_REF_NAME, versionSelection: { constraints: '>=1.0.0' } },
      },
    },
  ];
}

/** Whose a tool run is: the repository's fetch, its index (template pipeline), or an App's. */
export type ToolRunKind = 'repo-fetch' | 'repo-index' | 'app';

/**
 * Tells a repository's tool runs from an App's, as the fleet e2e does: the repository's fetch
 * is the vendir run whose config (stdin) names an imgpkg bundle (the Packages' Apps fetch
 * inline); its index the ytt and kbld runs in an `index-repo-` scratch directory.
 */
export function classifyToolRun(req: Pick<RunRequest, 'cmd' | 'args' | 'cwd' | 'writable' | 'stdin'>): ToolRunKind {
  const stdin = typeof req.stdin === 'string' ? req.stdin : '';
  if (req.cmd === 'vendir' && stdin.includes('imgpkgBundle')) return 'repo-fetch';
  const places = [req.cwd ?? '', ...(req.writable ?? []), ...req.args].join(' ');
  if ((req.cmd === 'ytt' || req.cmd === 'kbld') && places.includes(`${path.sep}index-repo-`)) return 'repo-index';
  return 'app';
}

/** Tool runs counted by kind and tool: `{ 'repo-fetch': { vendir: 1 }, app: { ytt: 20, … } }`. */
export type ToolRunCounts = Record<ToolRunKind, Record<string, number>>;

/** Counts classified tool runs. */
export function countToolRuns(runs: readonly { kind: ToolRunKind; cmd: string }[]): ToolRunCounts {
  const out: ToolRunCounts = { 'repo-fetch': {}, 'repo-index': {}, app: {} };
  for (const r of runs) out[r.kind][r.cmd] = (out[r.kind][r.cmd] ?? 0) + 1;
  return out;
}

/** Poll periods begun in a window of `windowMs` (at least 1): the most tag resolutions "one per period" allows. */
export function periodsIn(windowMs: number, periodMs: number): number {
  return Math.max(1, Math.ceil(windowMs / periodMs));
}

/** kapp-lambda's fleet upgrade. */
export interface FleetUpgrade {
  clusterIds: number;
  pollPeriodMs: number;
  /** `sha256:` digests of the bundle before and after the push. */
  digests: { from: string; to: string };
  /** imgpkg push of the new bundle returned → every PackageInstall at the new version, ms. */
  wallMs: number;
  /** Push returned → the first runtime logged "source moved to a new digest" (null: not seen), ms. */
  pollWaitMs: number | null;
  /** "source moved" → every PackageInstall at the new version (null: not seen), ms. */
  eventDrivenMs: number | null;
  /** Per cluster id: push returned → its PackageInstall at the new version, ms. */
  perIdMs: Record<string, number>;
  /** Requests for the repository through the proxy from the push to the end. */
  registry: RegistryCounts;
  /** Poll periods begun in that window. */
  periods: number;
  /** "source moved" log lines across the fleet (one per move: one poller won the period). */
  moves: number;
  tools: ToolRunCounts;
  /** Tool runs per tool from the runners' metrics, summed over the fleet (cross-check). */
  metrics: Record<string, { runs: number; ms: number }>;
  /** Setup: create → every PackageInstall at 1.0.0, ms. */
  setupMs: number;
}

/** kapp-controller's upgrade on one cluster with default timers. */
export interface TheirUpgrade {
  version: string;
  /** Push returned → the PackageInstall at the new version; null when not within the bound. */
  wallMs: number | null;
  boundS: number;
  /** The PackageRepository's reconcile last seen before the push, and its next sync due (ISO times). */
  lastSyncAt: string;
  nextSyncDueAt: string;
  /** Push returned at (ISO), and the next sync's due time relative to it, ms. */
  pushedAt: string;
  nextSyncDueAfterPushMs: number;
  registry: RegistryCounts;
  setupMs: number;
}

/** Result of the scenario, as written to the results file. */
export interface UpgradeResult {
  ours?: FleetUpgrade;
  theirs?: TheirUpgrade;
}

interface PkgiList {
  items: {
    metadata: { namespace: string; name: string };
    status?: { version?: string; conditions?: { type: string; status?: string }[] };
  }[];
}

/** `namespace → status.version` of the PackageInstalls that have `ReconcileSucceeded`. */
export async function installedVersions(rest: RestTransport, ns?: string): Promise<Map<string, string>> {
  const r = await rest.send({ method: 'GET', path: collectionPath('PackageInstall', ns) });
  if (r.statusCode !== 200) throw new Error(`list PackageInstalls: ${r.statusCode}`);
  const out = new Map<string, string>();
  for (const p of (r.body as PkgiList).items) {
    const ok = p.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded' && c.status !== 'False');
    if (ok && p.status?.version) out.set(p.metadata.namespace, p.status.version);
  }
  return out;
}

/**
 * Polls (every 250 ms) until the PackageInstall `app` of each `(rest, ns)` reports `version`.
 * @returns per key, `performance.now()` when first seen at it; missing keys when `timeoutMs` ran out.
 */
export async function waitVersions(
  targets: readonly VersionTarget[],
  version: string,
  timeoutMs: number,
): Promise<Map<string, number>> {
  const seen = new Map<string, number>();
  const deadline = performance.now() + timeoutMs;
  // one cluster-wide list per distinct transport
  const groups = new Map<RestTransport, { key: string; ns: string }[]>();
  for (const t of targets) groups.set(t.rest, [...(groups.get(t.rest) ?? []), t]);
  while (seen.size < targets.length && performance.now() < deadline) {
    for (const [rest, ts] of groups) {
      const versions = await installedVersions(rest, ts.length === 1 ? ts[0]!.ns : undefined);
      const now = performance.now();
      for (const t of ts) if (!seen.has(t.key) && versions.get(t.ns) === version) seen.set(t.key, now);
    }
    if (seen.size < targets.length) await new Promise((r) => setTimeout(r, 250));
  }
  return seen;
}

/** Wall-clock ISO time of a `performance.now()` instant. */
export const isoOf = (at: number) => new Date(performance.timeOrigin + at).toISOString();

/** A PackageInstall `app` to wait for: `key` names it in the result. */
export interface VersionTarget {
  key: string;
  rest: RestTransport;
  ns: string;
}

/** A started benchmark fleet ({@link startUpgradeFleet}). */
export interface UpgradeFleet {
  ids: FleetId[];
  /** The fleet kubeconfig (one context per id). */
  kubeconfig: string;
  /** Admin transports to control planes A and B, through the fleet kubeconfig. */
  rests: Record<FleetId['cluster'], RestTransport>;
  /** Each id's PackageInstall `app`, keyed by id, for {@link waitVersions}. */
  targets: VersionTarget[];
  /** The runtimes, in the order of `ids`. */
  runtimes: Ours[];
  /** The object store they share. */
  store: LocalDirStore;
  /** Stops the runtimes and control plane B. */
  stop(): Promise<void>;
}

/**
 * Starts a benchmark fleet: a second control plane (B), the ids of {@link fleetIds} (`ns`,
 * `simulated` ids on A) with their tenant namespaces, and one embedded runtime per id sharing
 * one object store, with the source poll period `pollMs`. `name` names the scratch directory
 * and the progress lines.
 *
 * @throws Error when a runtime's forwarders are not listing and watching within 120 s (all
 *   stopped)
 */
export async function startUpgradeFleet(
  ctx: BenchContext,
  name: string,
  ns: string,
  pollMs: number,
  simulated: number,
  onToolRun?: (req: RunRequest) => void,
): Promise<UpgradeFleet> {
  const { cluster: a, rest: restA } = clusterOf(ctx);
  const dir = await scratchDir(ctx, name);
  ctx.say(`${name}: starting a second control plane`);
  const b = await startCluster({ log: ctx.say });
  const runtimes: Ours[] = [];
  const stop = async () => {
    await Promise.all(runtimes.map((r) => r.stop()));
    await b.stop();
  };
  try {
    await applyCrds(b.kubeconfigPath);
    const ids = fleetIds(ns, simulated);
    await createTenants(
      restA,
      ids.filter((i) => i.cluster === 'a').map((i) => i.ns),
    );
    await createTenants(restFor(b.kubeconfigPath), [ns]);
    const kubeconfig = path.join(dir, 'fleet-kubeconfig.yaml');
    await fleetKubeconfig(a, b, ids, kubeconfig);
    const store = new LocalDirStore(path.join(dir, 'store'));
    // One at a time, each forwarder listing and watching before the next starts: 20 runtimes
    // started at once in one process on the loaded machine never all got there (4 min, twice).
    for (const i of ids) {
      const r = startOurs({
        kubeconfigPath: kubeconfig,
        contexts: [i.id],
        namespaces: [i.ns],
        store,
        tmpRoot: path.join(dir, 'work', i.id),
        cacheRoot: ctx.cacheRoot,
        concurrency: 4,
        config: { sourcePollPeriodMs: pollMs },
        say: ctx.say,
        ...(onToolRun ? { onToolRun } : {}),
      });
      runtimes.push(r);
      await waitForwardersReady(r, 120_000).catch((e: Error) => {
        throw new Error(
          `${name}: ${i.id}: ${e.message}: ${JSON.stringify(r.runtime.forwarders.map((f) => f.stats()))}`,
        );
      });
    }
    const rests = { a: restFor(kubeconfig, 'real-a'), b: restFor(kubeconfig, 'real-b') };
    const targets = ids.map((i) => ({ key: i.id, rest: rests[i.cluster], ns: i.ns }));
    return { ids, kubeconfig, rests, targets, runtimes, store, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * kapp-lambda's fleet upgrade (see the module comment). Starts and stops a second control
 * plane and 20 runtimes.
 * @throws Error when setup fails or a PackageInstall does not reach the new version in time.
 */
export async function upgradeOurs(
  ctx: BenchContext,
  registry: RegistryServer,
  proxy: RegistryProxy,
  pollMs: number,
  simulated = 18,
): Promise<FleetUpgrade> {
  const runs: { at: number; kind: ToolRunKind; cmd: string }[] = [];
  const fleet = await startUpgradeFleet(ctx, 'upgrade', NS.fleet, pollMs, simulated, (req) =>
    runs.push({ at: performance.now(), kind: classifyToolRun(req), cmd: req.cmd }),
  );
  const { ids, rests, targets, runtimes } = fleet;
  try {
    const v1 = await pushBundle(registry, `${FLEET_REPO}:latest`, upgradeBundle(['1.0.0']));
    const image = `${proxy.host}/${FLEET_REPO}:latest`;

    const s0 = performance.now();
    await Promise.all(ids.map((i) => createAll(rests[i.cluster], upgradeManifests(i.ns, image, '10m0s'))));
    const at1 = await waitVersions(targets, '1.0.0', 300_000);
    if (at1.size < ids.length) {
      throw new Error(`upgrade: ${ids.length - at1.size} PackageInstall(s) not at 1.0.0 after 300 s`);
    }
    const setupMs = Math.max(...at1.values()) - s0;
    await Promise.all(runtimes.map((r) => r.runtime.pipeline.idle()));
    ctx.say(`upgrade: 1.0.0 installed on ${ids.length} cluster ids in ${(setupMs / 1000).toFixed(1)} s; pushing 2.0.0`);

    const mark = runs.length;
    const tools0 = runtimes.map((r) => r.tools());
    const logs0 = runtimes.map((r) => r.logs.length);
    const p0 = performance.now();
    const v2: PushedBundle = await pushBundle(registry, `${FLEET_REPO}:latest`, upgradeBundle(['1.0.0', '2.0.0']));
    const pushed = performance.now();
    const at2 = await waitVersions(targets, '2.0.0', 2 * pollMs + 180_000);
    if (at2.size < ids.length) {
      const missing = ids.filter((i) => !at2.has(i.id)).map((i) => i.id);
      throw new Error(`upgrade: PackageInstall(s) of ${missing.join(', ')} not at 2.0.0 in time`);
    }
    const end = Math.max(...at2.values());
    await Promise.all(runtimes.map((r) => r.runtime.pipeline.idle()));
    const moved = runtimes.flatMap((r, j) =>
      r.logs.slice(logs0[j]).filter((l) => l.msg === 'source moved to a new digest'),
    );
    const firstMove = moved.length ? Math.min(...moved.map((l) => l.at)) : undefined;
    const metrics: Record<string, { runs: number; ms: number }> = {};
    runtimes.forEach((r, j) => {
      for (const [tool, d] of Object.entries(toolDelta(tools0[j]!, r.tools()))) {
        const m = metrics[tool] ?? { runs: 0, ms: 0 };
        m.runs += d.runs;
        m.ms += d.ms;
        metrics[tool] = m;
      }
    });
    const result: FleetUpgrade = {
      clusterIds: ids.length,
      pollPeriodMs: pollMs,
      digests: { from: v1.digest, to: v2.digest },
      wallMs: end - pushed,
      pollWaitMs: firstMove === undefined ? null : firstMove - pushed,
      eventDrivenMs: firstMove === undefined ? null : end - firstMove,
      perIdMs: Object.fromEntries([...at2].map(([k, t]) => [k, Math.round(t - pushed)])),
      registry: countRegistryRequests(proxy.requests, FLEET_REPO, p0, performance.now()),
      periods: periodsIn(performance.now() - p0, pollMs),
      moves: moved.length,
      tools: countToolRuns(runs.slice(mark)),
      metrics,
      setupMs,
    };
    ctx.say(`upgrade: kapp-lambda ${JSON.stringify({ ...result, perIdMs: undefined })}`);
    return result;
  } finally {
    await fleet.stop();
  }
}

/**
 * kapp-controller's upgrade on one namespace of cluster A with its default timers (see the
 * module comment).
 * @throws Error when it does not start or 1.0.0 is not installed in time (a timeout waiting
 * for 2.0.0 is a result: `wallMs: null`).
 */
export async function upgradeTheirs(
  ctx: BenchContext,
  bin: string,
  registry: RegistryServer,
  proxy: RegistryProxy,
  boundS: number,
): Promise<TheirUpgrade> {
  const { cluster, rest } = clusterOf(ctx);
  await createTenants(rest, [NS.theirs]);
  const kc = await startKappController(bin, {
    kubeconfigPath: cluster.kubeconfigPath,
    namespace: NS.theirs,
    concurrency: 4,
    controllers: ['app', 'pkgr', 'pkgi'],
    log: ctx.say,
  });
  const watch = new AppWatch(cluster.kubeconfigPath, NS.theirs, undefined, PKGR_KIND);
  try {
    await watch.start();
    await pushBundle(registry, `${KC_REPO}:latest`, upgradeBundle(['1.0.0']));
    const s0 = performance.now();
    await createAll(rest, upgradeManifests(NS.theirs, `${proxy.host}/${KC_REPO}:latest`));
    const repo = await watch.waitAll([`${NS.theirs}/upgrade`], 300_000);
    const seen = repo.get(`${NS.theirs}/upgrade`);
    if (seen?.final !== 'succeeded') throw new Error(`kapp-controller: PackageRepository failed: ${seen?.message}`);
    const target = [{ key: 'kc', rest, ns: NS.theirs }];
    const at1 = await waitVersions(target, '1.0.0', 300_000);
    if (!at1.size) throw new Error('kapp-controller: PackageInstall not at 1.0.0 after 300 s');
    const setupMs = at1.get('kc')! - s0;
    const p0 = performance.now();
    await pushBundle(registry, `${KC_REPO}:latest`, upgradeBundle(['1.0.0', '2.0.0']));
    const pushed = performance.now();
    const due = seen.at + KC_PKGR_SYNC_MS;
    ctx.say(
      `upgrade: kapp-controller: 2.0.0 pushed at ${isoOf(pushed)}; its PackageRepository last reconciled at ${isoOf(seen.at)}, next sync due at ${isoOf(due)} (+ up to 5 s jitter), ${((due - pushed) / 1000).toFixed(0)} s after the push; waiting up to ${boundS} s`,
    );
    const at2 = await waitVersions(target, '2.0.0', boundS * 1000);
    const t = at2.get('kc');
    const result: TheirUpgrade = {
      version: kc.version,
      wallMs: t === undefined ? null : t - pushed,
      boundS,
      lastSyncAt: isoOf(seen.at),
      nextSyncDueAt: isoOf(due),
      pushedAt: isoOf(pushed),
      nextSyncDueAfterPushMs: due - pushed,
      registry: countRegistryRequests(proxy.requests, KC_REPO, p0, performance.now()),
      setupMs,
    };
    ctx.say(`upgrade: kapp-controller ${JSON.stringify(result)}`);
    return result;
  } finally {
    await watch.stop();
    await kc.stop();
  }
}

const secs = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
const fmtCounts = (c: Record<string, number>) =>
  Object.entries(c)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ') || 'none';

/** Table rows of the scenario's results. */
export function upgradeRows(r: UpgradeResult): Row[] {
  const rows: Row[] = [];
  const o = r.ours;
  if (o) {
    const n = o.clusterIds;
    rows.push(
      {
        scenario: SCENARIO,
        figure: `push → all ${n} PackageInstalls at the new version (poll period ${secs(o.pollPeriodMs)})`,
        value: `${secs(o.wallMs)} (poll wait ${o.pollWaitMs === null ? '?' : secs(o.pollWaitMs)} + event-driven ${o.eventDrivenMs === null ? '?' : secs(o.eventDrivenMs)})`,
        target: '< 30 s after the poll sees the tag move',
        verdict: o.eventDrivenMs === null ? 'missed' : o.eventDrivenMs < TARGET_MS ? 'met' : 'missed',
      },
      {
        scenario: SCENARIO,
        figure: '  tag resolutions (manifest by tag) at the registry',
        value: `${o.registry.manifestByTag} (${o.registry.manifestByTagHead} HEAD) in ${o.periods} period(s); ${o.moves} move(s) logged`,
        target: '≤ 1 per period per source',
        verdict: o.registry.manifestByTag <= o.periods ? 'met' : 'missed',
      },
      {
        scenario: SCENARIO,
        figure: '  registry requests in all (the repository)',
        value: `${o.registry.all} (manifests by digest ${o.registry.manifestByDigest}, blobs ${o.registry.blobs})`,
      },
      {
        scenario: SCENARIO,
        figure: '  repository fetch / index runs for the new digest',
        value: `fetch: ${fmtCounts(o.tools['repo-fetch'])}; index: ${fmtCounts(o.tools['repo-index'])}`,
        target: '1 fetch, 1 index',
        verdict:
          (o.tools['repo-fetch'].vendir ?? 0) === 1 && (o.tools['repo-index'].kbld ?? 0) === 1 ? 'met' : 'missed',
      },
      {
        scenario: SCENARIO,
        figure: `  the ${n} PackageInstalls' Apps: tool runs`,
        value: fmtCounts(o.tools.app),
      },
    );
  }
  const t = r.theirs;
  if (t) {
    rows.push({
      scenario: SCENARIO,
      figure: `kapp-controller ${t.version}, 1 cluster, default timers: push → PackageInstall at the new version`,
      value: `${t.wallMs === null ? `not within ${t.boundS} s` : secs(t.wallMs)} (next PackageRepository sync was due ${secs(t.nextSyncDueAfterPushMs)} after the push, at ${t.nextSyncDueAt}; registry requests ${t.registry.all})`,
    });
    if (o && t.wallMs !== null) {
      rows.push({
        scenario: SCENARIO,
        figure: '  ours (20 cluster ids) / theirs (1 cluster)',
        value: (o.wallMs / t.wallMs).toFixed(3),
      });
    }
  }
  return rows;
}

/**
 * Starts the local registry and a counting proxy in front of it (the registry stopped again if
 * the proxy does not start).
 */
export async function startRegistryAndProxy(): Promise<{ registry: RegistryServer; proxy: RegistryProxy }> {
  const registry = await startRegistry();
  try {
    return { registry, proxy: await startRegistryProxy(registry.host) };
  } catch (err) {
    await registry.stop();
    throw err;
  }
}

/**
 * Runs the scenario: starts the registry and its counting proxy, then kapp-controller's case
 * and kapp-lambda's fleet at the same time (each its own step), and adds the table rows.
 *
 * @param bin - the kapp-controller binary, or undefined when its build failed (then only ours)
 */
export async function upgradeScenario(
  ctx: BenchContext,
  bin: string | undefined,
  step: StepRunner,
  opts: { pollMs: number; kcWaitS: number },
): Promise<UpgradeResult> {
  const result: UpgradeResult = {};
  const servers = await step(SCENARIO, 'registry and proxy', startRegistryAndProxy);
  if (!servers) return result;
  const { registry, proxy } = servers;
  try {
    const [theirs, ours] = await Promise.all([
      bin && opts.kcWaitS > 0
        ? step(SCENARIO, 'kapp-controller, 1 cluster', () => upgradeTheirs(ctx, bin, registry, proxy, opts.kcWaitS))
        : undefined,
      step(SCENARIO, 'kapp-lambda, 20 cluster ids', () => upgradeOurs(ctx, registry, proxy, opts.pollMs)),
    ]);
    if (ours) result.ours = ours;
    if (theirs) result.theirs = theirs;
  } finally {
    await proxy.stop();
    await registry.stop();
  }
  ctx.rows.push(...upgradeRows(result));
  return result;
}
