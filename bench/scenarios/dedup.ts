/**
 * Scenario 5, fleet dedup: 20 cluster ids serve the same git-sourced App (git `ref` pinned to
 * a commit id, ytt, kapp): two real control planes (cluster A and a second one started here)
 * plus 18 simulated ids, each a kubeconfig context pointing at cluster A. Every id gets its
 * own embedded runtime (its forwarder watches only that id's namespace), and all share one
 * object store, as a fleet shares one bucket. Counted: vendir runs (fetch executions) and
 * ytt runs (template executions) across all 20, from the command runners' metrics; stage
 * outcomes (`cached` vs `succeeded`) from the stage records.
 *
 * Two phases with different commits: `burst`, the App created on all 20 ids at once (a
 * fleet-wide rollout), and `staggered`, created on one id first and on the other 19 once it
 * has reconciled.
 *
 * A third phase, `branch` (issue 24, "Input and source changes"), on the same fleet: an App on
 * every id follows a git branch (`ref: origin/main`, `syncPeriod: 1h`, so only the source poll
 * can explain an update); once all 20 deployed release one, a commit moves the branch, and the
 * time from the push to every id's ConfigMap at release two is split at the first "source
 * moved" log line into the poll wait and the event-driven rest. Counted over the 20 runtimes
 * from the push to the end: resolutions (those log lines), vendir runs naming the new commit,
 * ytt and kapp runs. Beside it, upstream kapp-controller (`bin`) with one such App on cluster
 * A at its default `syncPeriod: 30s`: the same push → its ConfigMap at release two (its next
 * sync). The source poll period of the fleet's runtimes is `pollMs` (default 60 s, the
 * runtime's).
 *
 * The simulated ids share cluster A, so their Apps live in different namespaces
 * (`bench-dedup-sNN`); the two real clusters use the same namespace and name. The render key
 * leaves the App's name and namespace out unless a helm step or a downward API value can read
 * them (`metadataDigest` in functions/lib/pipeline/app/template.ts), so the ytt Apps here share
 * one render across namespaces; `realClusters` gives the two real clusters' own counts (the
 * ids that would share a render even where the metadata counts).
 *
 * @module
 */
import path from 'node:path';
import type { RestTransport } from '../../functions/lib/kube/transport.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { applyCrds } from '../../scripts/local-env.js';
import { startCluster } from '../../test/harness/cluster.js';
import { createRepo } from '../../test/harness/fixtures.js';
import { type GitServer, startGitServer } from '../../test/harness/servers/git.js';
import { type BenchContext, clusterOf, scratchDir } from '../lib/context.js';
import { type FleetId, fleetIds, fleetKubeconfig } from '../lib/fleet.js';
import { type KappController, startKappController } from '../lib/kapp-controller.js';
import { AppWatch, BENCH_SA, createAll, createTenants, type Manifest, restFor, yttConfigMap } from '../lib/kube.js';
import { appKey, type Ours, startOurs, toolDelta, waitForwardersReady } from '../lib/ours.js';
import type { Row } from '../lib/stats.js';

/** One phase of the dedup scenario. */
export interface DedupPhase {
  clusterIds: number;
  /** vendir runs across all ids. */
  fetchExecutions: number;
  /** ytt runs across all ids. */
  templateExecutions: number;
  /** kapp runs across all ids. */
  deployExecutions: number;
  /** vendir and ytt runs of the two real clusters (same namespace and App name in both). */
  realClusters: { fetchExecutions: number; templateExecutions: number };
  /** vendir and ytt runs per cluster id. */
  perId: Record<string, { vendir: number; ytt: number }>;
  /** Stage → outcome → count. */
  outcomes: Record<string, Record<string, number>>;
  succeeded: number;
  wallMs: number;
}

/** kapp-lambda's tool runs of the `branch` phase, from the push to the end. */
export interface BranchRuns {
  /** vendir runs whose config names the new commit (fetches of it). */
  fetchExecutions: number;
  /** vendir runs of any commit. */
  vendir: number;
  /** ytt runs (renders). */
  templateExecutions: number;
  /** kapp runs. */
  deployExecutions: number;
}

/** kapp-controller's side of the `branch` phase: one App on cluster A at its default sync period. */
export interface BranchTheirs {
  version: string;
  syncPeriod: string;
  /** Push returned → its ConfigMap at the new release; null when not within `boundS`. */
  wallMs: number | null;
  boundS: number;
  /** Create → its ConfigMap at release one, ms. */
  setupMs: number;
  /** Its `"Completed deploy"` log lines from the push until every id of the fleet was at the new release. */
  deploys: number;
}

/** The `branch` phase: a git branch moved under the Apps of every id. */
export interface BranchPhase {
  clusterIds: number;
  /** Source poll period of the fleet's runtimes, ms. */
  pollPeriodMs: number;
  /** Commit ids of the branch before and after the push. */
  commits: { from: string; to: string };
  /** Which side was started first: both run at once and see the same push. */
  order: string;
  /** Create → every id's ConfigMap at release one, ms. */
  setupMs: number;
  /** Push returned → every id's ConfigMap at release two, ms. */
  wallMs: number;
  /** Push returned → the first runtime logged "source moved to a new digest" (null: not seen), ms. */
  pollWaitMs: number | null;
  /** That log line → every id's ConfigMap at release two (null: not seen), ms. */
  eventDrivenMs: number | null;
  /** Per cluster id: push returned → its ConfigMap at release two, ms. */
  perIdMs: Record<string, number>;
  /**
   * "source moved" log lines over the 20 runtimes (target 1: one resolution for the fleet).
   * The poll wait can exceed one period: a poller that claimed the record at one tick may find
   * it still fresh at its next (`isFresh` in functions/lib/pipeline/source-poll.ts).
   */
  resolutions: number;
  /** Over the 20 runtimes. */
  runs: BranchRuns;
  /** The two real clusters only (same namespace and App name: they can share a render). */
  realClusters: BranchRuns;
  theirs?: BranchTheirs;
}

/** Result of the dedup scenario. */
export interface DedupResult {
  burst: DedupPhase;
  staggered: DedupPhase;
  /** Absent when the phase failed (the reason is in the results file's `unmeasured`). */
  branch?: BranchPhase;
}

/** Source poll period of the fleet's runtimes unless `BENCH_DEDUP_POLL_MS` is set: the runtime's default. */
export const DEFAULT_DEDUP_POLL_MS = 60_000;
/** The `branch` phase's kapp-controller namespace (on cluster A). */
const KC_NS = 'bench-kc-dedup-branch';
/** kapp-controller's default App sync period. */
const KC_SYNC_PERIOD = '30s';
/** Bound of kapp-controller's wait for the new release: a sync period, its jitter and a reconcile on a loaded machine. */
const KC_WAIT_S = 120;
const SCENARIO = '5 dedup';

type Id = FleetId;

/** A tool run of one of the fleet's runtimes (`j`: its index), with vendir's config. */
interface FleetRun {
  j: number;
  cmd: string;
  stdin: string;
}

/** The started fleet the phases share. */
interface Fleet {
  ids: Id[];
  runtimes: Ours[];
  kubeconfig: string;
  /** Every tool run so far, in order. */
  runs: FleetRun[];
}

function gitApp(ns: string, name: string, url: string, ref: string, syncPeriod = '10m0s'): Manifest {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name, namespace: ns },
    spec: {
      serviceAccountName: BENCH_SA,
      syncPeriod,
      fetch: [{ git: { url, ref } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    },
  };
}

/** The repo's files: ytt renders the ConfigMap `name` whose `data.release` is `release`. */
function configTree(name: string, release: string): Record<string, string> {
  return {
    'config.yml': yttConfigMap({ release: '#@ data.values.release' }),
    'values.yml': `#@data/values\n---\nname: ${name}\nrelease: ${release}\n`,
  };
}

async function phase(
  ctx: BenchContext,
  fleet: Fleet,
  git: GitServer,
  label: string,
  staggered: boolean,
): Promise<DedupPhase> {
  const name = `fleet-${label}`;
  const repo = await createRepo(git, `dedup-${label}`, configTree(name, label));
  const before = fleet.runtimes.map((r) => r.tools());
  const rec0 = fleet.runtimes.map((r) => r.records.length);
  const watches = new Map<string, AppWatch>();
  for (const i of fleet.ids) {
    const w = new AppWatch(fleet.kubeconfig, i.ns, i.id);
    await w.start();
    watches.set(i.id, w);
  }
  const t0 = performance.now();
  const create = (i: Id) => createAll(restFor(fleet.kubeconfig, i.id), [gitApp(i.ns, name, repo.url, repo.commitSha)]);
  const wait = (i: Id) => watches.get(i.id)!.waitAll([`${i.ns}/${name}`], 300_000);
  let succeeded = 0;
  try {
    if (staggered) {
      await create(fleet.ids[0]!);
      await wait(fleet.ids[0]!);
      await fleet.runtimes[0]!.runtime.pipeline.idle();
      await Promise.all(fleet.ids.slice(1).map(create));
    } else {
      await Promise.all(fleet.ids.map(create));
    }
    const seen = await Promise.all(fleet.ids.map(wait));
    succeeded = seen.filter((m) => [...m.values()][0]?.final === 'succeeded').length;
    for (const [j, m] of seen.entries()) {
      const s = [...m.values()][0];
      if (s?.final !== 'succeeded') ctx.say(`dedup ${label}: ${fleet.ids[j]!.id} failed: ${s?.message ?? ''}`);
    }
  } finally {
    for (const w of watches.values()) await w.stop();
  }
  const wallMs = performance.now() - t0;
  await Promise.all(fleet.runtimes.map((r) => r.runtime.pipeline.idle()));
  const runsOf = (j: number, tool: string) => toolDelta(before[j]!, fleet.runtimes[j]!.tools())[tool]?.runs ?? 0;
  const sum = (tool: string) => fleet.runtimes.reduce((a, _r, j) => a + runsOf(j, tool), 0);
  const real = fleet.ids.flatMap((i, j) => (i.id.startsWith('real-') ? [j] : []));
  const perId: Record<string, { vendir: number; ytt: number }> = {};
  fleet.ids.forEach((i, j) => {
    perId[i.id] = { vendir: runsOf(j, 'vendir'), ytt: runsOf(j, 'ytt') };
  });
  const outcomes: Record<string, Record<string, number>> = {};
  fleet.runtimes.forEach((r, j) => {
    const key = appKey(fleet.ids[j]!.id, fleet.ids[j]!.ns, name);
    for (const rec of r.records.slice(rec0[j]).filter((x) => x.object === key)) {
      const o = outcomes[rec.stage] ?? {};
      o[rec.outcome] = (o[rec.outcome] ?? 0) + 1;
      outcomes[rec.stage] = o;
    }
  });
  const result: DedupPhase = {
    clusterIds: fleet.ids.length,
    fetchExecutions: sum('vendir'),
    templateExecutions: sum('ytt'),
    deployExecutions: sum('kapp'),
    realClusters: {
      fetchExecutions: real.reduce((a, j) => a + runsOf(j, 'vendir'), 0),
      templateExecutions: real.reduce((a, j) => a + runsOf(j, 'ytt'), 0),
    },
    perId,
    outcomes,
    succeeded,
    wallMs,
  };
  ctx.say(
    `dedup ${label}: ${succeeded}/${fleet.ids.length} succeeded; vendir ${result.fetchExecutions}×, ytt ${result.templateExecutions}×, kapp ${result.deployExecutions}×`,
  );
  return result;
}

/** A ConfigMap to read: the `name` in `ns` through one cluster id's context. */
interface ReleaseTarget {
  key: string;
  rest: RestTransport;
  ns: string;
  name: string;
}

/**
 * Polls (every 250 ms, one GET per target not yet there) until each target's ConfigMap has
 * `data.release` = `release`.
 * @returns per key, `performance.now()` when first seen at it; missing keys when `timeoutMs` ran out.
 */
async function waitReleases(
  targets: readonly ReleaseTarget[],
  release: string,
  timeoutMs: number,
): Promise<Map<string, number>> {
  const seen = new Map<string, number>();
  const deadline = performance.now() + timeoutMs;
  while (seen.size < targets.length && performance.now() < deadline) {
    await Promise.all(
      targets
        .filter((t) => !seen.has(t.key))
        .map(async (t) => {
          const r = await t.rest.send({ method: 'GET', path: `/api/v1/namespaces/${t.ns}/configmaps/${t.name}` });
          const data = (r.body as { data?: Record<string, string> } | undefined)?.data;
          if (r.statusCode === 200 && data?.release === release) seen.set(t.key, performance.now());
        }),
    );
    if (seen.size < targets.length) await new Promise((r) => setTimeout(r, 250));
  }
  return seen;
}

/** Tool runs of `runs` that match `keep`, counted as {@link BranchRuns}. */
function branchRuns(runs: readonly FleetRun[], sha: string, keep: (r: FleetRun) => boolean): BranchRuns {
  const mine = runs.filter(keep);
  const n = (cmd: string) => mine.filter((r) => r.cmd === cmd).length;
  return {
    fetchExecutions: mine.filter((r) => r.cmd === 'vendir' && r.stdin.includes(sha)).length,
    vendir: n('vendir'),
    templateExecutions: n('ytt'),
    deployExecutions: n('kapp'),
  };
}

/**
 * kapp-controller's App on the branch (its side of the `branch` phase), started and waited at
 * release one; `undefined` (reason in `ctx.unmeasured`) when it fails to.
 */
async function branchTheirsStart(
  ctx: BenchContext,
  bin: string,
  url: string,
  name: string,
): Promise<{ kc: KappController; target: ReleaseTarget; setupMs: number } | undefined> {
  const { cluster, rest } = clusterOf(ctx);
  let kc: KappController | undefined;
  try {
    await createTenants(rest, [KC_NS]);
    kc = await startKappController(bin, {
      kubeconfigPath: cluster.kubeconfigPath,
      namespace: KC_NS,
      concurrency: 4,
      log: ctx.say,
    });
    const t0 = performance.now();
    await createAll(rest, [gitApp(KC_NS, name, url, 'origin/main', KC_SYNC_PERIOD)]);
    const target = { key: 'kc', rest, ns: KC_NS, name };
    const at = (await waitReleases([target], 'one', 300_000)).get('kc');
    if (at === undefined) throw new Error('its ConfigMap not at release one after 300 s');
    return { kc, target, setupMs: at - t0 };
  } catch (err) {
    await kc?.stop();
    const why = (err as Error).message;
    ctx.say(`dedup branch: kapp-controller: ${why}`);
    ctx.unmeasured.push({ scenario: SCENARIO, figure: 'branch: kapp-controller', why });
    return undefined;
  }
}

/**
 * The `branch` phase (see the module comment), on the started fleet; kapp-controller beside it
 * when `bin` is given.
 * @throws Error when an id's ConfigMap does not reach a release in time.
 */
async function branchPhase(
  ctx: BenchContext,
  fleet: Fleet,
  git: GitServer,
  pollMs: number,
  bin: string | undefined,
): Promise<BranchPhase> {
  const name = 'fleet-branch';
  const repoName = 'dedup-branch';
  const first = await createRepo(git, repoName, configTree(name, 'one'));
  const theirs = bin ? await branchTheirsStart(ctx, bin, first.url, name) : undefined;
  try {
    const targets: ReleaseTarget[] = fleet.ids.map((i) => ({
      key: i.id,
      rest: restFor(fleet.kubeconfig, i.id),
      ns: i.ns,
      name,
    }));
    const s0 = performance.now();
    await Promise.all(
      fleet.ids.map((i, j) => createAll(targets[j]!.rest, [gitApp(i.ns, name, first.url, 'origin/main', '1h')])),
    );
    const at1 = await waitReleases(targets, 'one', 300_000);
    if (at1.size < targets.length) throw new Error(`${targets.length - at1.size} id(s) not at release one after 300 s`);
    const setupMs = Math.max(...at1.values()) - s0;
    await Promise.all(fleet.runtimes.map((r) => r.runtime.pipeline.idle()));
    ctx.say(
      `dedup branch: release one on ${targets.length} ids in ${(setupMs / 1000).toFixed(1)} s; moving the branch`,
    );

    const mark = fleet.runs.length;
    const logs0 = fleet.runtimes.map((r) => r.logs.length);
    const deploys0 = theirs?.kc.deploys() ?? 0;
    const second = await createRepo(git, repoName, configTree(name, 'two'));
    const pushed = performance.now();
    const [at2, kcAt] = await Promise.all([
      waitReleases(targets, 'two', 2 * pollMs + 180_000),
      theirs ? waitReleases([theirs.target], 'two', KC_WAIT_S * 1000) : undefined,
    ]);
    if (at2.size < targets.length) {
      const missing = targets.filter((t) => !at2.has(t.key)).map((t) => t.key);
      throw new Error(`ConfigMap(s) of ${missing.join(', ')} not at release two in time`);
    }
    const end = Math.max(...at2.values());
    await Promise.all(fleet.runtimes.map((r) => r.runtime.pipeline.idle()));
    const moved = fleet.runtimes.flatMap((r, j) =>
      r.logs.slice(logs0[j]).filter((l) => l.msg === 'source moved to a new digest'),
    );
    const firstMove = moved.length ? Math.min(...moved.map((l) => l.at)) : undefined;
    const runs = fleet.runs.slice(mark);
    const real = new Set(fleet.ids.flatMap((i, j) => (i.id.startsWith('real-') ? [j] : [])));
    const kcMs = kcAt?.get('kc');
    const result: BranchPhase = {
      clusterIds: fleet.ids.length,
      pollPeriodMs: pollMs,
      commits: { from: first.commitSha, to: second.commitSha },
      order: theirs ? 'both at once (kapp-controller started first; one push for both)' : 'kapp-lambda only',
      setupMs,
      wallMs: end - pushed,
      pollWaitMs: firstMove === undefined ? null : firstMove - pushed,
      eventDrivenMs: firstMove === undefined ? null : end - firstMove,
      perIdMs: Object.fromEntries([...at2].map(([k, t]) => [k, Math.round(t - pushed)])),
      resolutions: moved.length,
      runs: branchRuns(runs, second.commitSha, () => true),
      realClusters: branchRuns(runs, second.commitSha, (r) => real.has(r.j)),
      ...(theirs
        ? {
            theirs: {
              version: theirs.kc.version,
              syncPeriod: KC_SYNC_PERIOD,
              wallMs: kcMs === undefined ? null : kcMs - pushed,
              boundS: KC_WAIT_S,
              setupMs: theirs.setupMs,
              deploys: theirs.kc.deploys() - deploys0,
            },
          }
        : {}),
    };
    ctx.say(`dedup branch: ${JSON.stringify({ ...result, perIdMs: undefined })}`);
    return result;
  } finally {
    await theirs?.kc.stop();
  }
}

const secs = (ms: number | null) => (ms === null ? '?' : `${(ms / 1000).toFixed(1)} s`);
const verdict = (ok: boolean) => (ok ? 'met' : 'missed');

/** Table rows of the `branch` phase. */
export function branchRows(b: BranchPhase): Row[] {
  const rows: Row[] = [
    {
      scenario: SCENARIO,
      figure: `branch: push → all ${b.clusterIds} ConfigMaps at the new release (poll period ${secs(b.pollPeriodMs)})`,
      value: `${secs(b.wallMs)} (poll wait ${secs(b.pollWaitMs)} + event-driven ${secs(b.eventDrivenMs)})`,
    },
    {
      scenario: SCENARIO,
      figure: '  branch: resolutions ("source moved" log lines)',
      value: String(b.resolutions),
      target: '1',
      verdict: verdict(b.resolutions === 1),
    },
    {
      scenario: SCENARIO,
      figure: '  branch: fetches (vendir runs naming the new commit)',
      value: `${b.runs.fetchExecutions} (vendir runs in all ${b.runs.vendir})`,
      target: '1',
      verdict: verdict(b.runs.fetchExecutions === 1),
    },
    {
      scenario: SCENARIO,
      figure: '  branch: renders (ytt runs)',
      value: `${b.runs.templateExecutions} (the 2 real ids, same ns/name: ${b.realClusters.templateExecutions})`,
      target: '1',
      verdict: verdict(b.runs.templateExecutions === 1),
    },
    {
      scenario: SCENARIO,
      figure: '  branch: deploys (kapp runs)',
      value: String(b.runs.deployExecutions),
      target: `${b.clusterIds} (1 per id)`,
      verdict: verdict(b.runs.deployExecutions === b.clusterIds),
    },
  ];
  const t = b.theirs;
  if (t) {
    rows.push({
      scenario: SCENARIO,
      figure: `branch: kapp-controller ${t.version}, 1 App, syncPeriod ${t.syncPeriod}: push → its ConfigMap at the new release`,
      value: `${t.wallMs === null ? `not within ${t.boundS} s` : secs(t.wallMs)} (${t.deploys} deploy(s) from the push until the fleet was done)`,
    });
  }
  return rows;
}

/**
 * Runs the dedup scenario (starts and stops a second control plane and a git server): the
 * `burst` and `staggered` phases, then `branch` (a failure of it is recorded in
 * `ctx.unmeasured` and leaves it out of the result).
 *
 * @param bin - the kapp-controller binary for the `branch` phase's side by side; undefined: ours only
 * @param opts.pollMs - source poll period of the fleet's runtimes, ms ({@link DEFAULT_DEDUP_POLL_MS})
 * @throws Error when the second cluster or the git server cannot start.
 */
export async function dedupOurs(
  ctx: BenchContext,
  bin: string | undefined,
  opts: { pollMs: number } = { pollMs: DEFAULT_DEDUP_POLL_MS },
  simulated = 18,
): Promise<DedupResult> {
  const { cluster: a, rest: restA } = clusterOf(ctx);
  const dir = await scratchDir(ctx, 'dedup');
  ctx.say('dedup: starting a second control plane and a git server');
  const [b, git] = await Promise.all([startCluster({ log: ctx.say }), startGitServer()]);
  const runtimes: Ours[] = [];
  const runs: FleetRun[] = [];
  try {
    await applyCrds(b.kubeconfigPath);
    const ids = fleetIds('bench-dedup', simulated);
    await createTenants(
      restA,
      ids.filter((i) => i.cluster === 'a').map((i) => i.ns),
    );
    await createTenants(restFor(b.kubeconfigPath), ['bench-dedup']);
    const kubeconfig = path.join(dir, 'fleet-kubeconfig.yaml');
    await fleetKubeconfig(a, b, ids, kubeconfig);
    const store = new LocalDirStore(path.join(dir, 'store'));
    for (const [j, i] of ids.entries()) {
      runtimes.push(
        startOurs({
          kubeconfigPath: kubeconfig,
          contexts: [i.id],
          namespaces: [i.ns],
          store,
          tmpRoot: path.join(dir, 'work', i.id),
          cacheRoot: ctx.cacheRoot,
          concurrency: 4,
          config: { sourcePollPeriodMs: opts.pollMs },
          say: ctx.say,
          onToolRun: (req) =>
            runs.push({
              j,
              cmd: req.cmd,
              stdin: req.cmd === 'vendir' && typeof req.stdin === 'string' ? req.stdin : '',
            }),
        }),
      );
    }
    await Promise.all(runtimes.map((r) => waitForwardersReady(r, 60_000)));
    const fleet: Fleet = { ids, runtimes, kubeconfig, runs };
    const burst = await phase(ctx, fleet, git, 'burst', false);
    const staggered = await phase(ctx, fleet, git, 'staggered', true);
    const branch = await branchPhase(ctx, fleet, git, opts.pollMs, bin).catch((err: Error) => {
      ctx.say(`dedup branch: FAILED: ${err.message}`);
      ctx.unmeasured.push({ scenario: SCENARIO, figure: 'branch: 20 cluster ids', why: err.message });
      return undefined;
    });
    return { burst, staggered, ...(branch ? { branch } : {}) };
  } finally {
    await Promise.all(runtimes.map((r) => r.stop()));
    await git.stop();
    await b.stop();
  }
}
