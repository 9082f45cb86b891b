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
 * The simulated ids share cluster A, so their Apps live in different namespaces
 * (`bench-dedup-sNN`); the two real clusters use the same namespace and name. The render key
 * covers the App's name and namespace, so only ids with the same namespace can share a
 * render: `realClusters` gives the two real clusters' own counts.
 *
 * @module
 */
import path from 'node:path';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { applyCrds } from '../../scripts/local-env.js';
import { startCluster } from '../../test/harness/cluster.js';
import { createRepo } from '../../test/harness/fixtures.js';
import { type GitServer, startGitServer } from '../../test/harness/servers/git.js';
import { type BenchContext, clusterOf, scratchDir } from '../lib/context.js';
import { type FleetId, fleetIds, fleetKubeconfig } from '../lib/fleet.js';
import { AppWatch, BENCH_SA, createAll, createTenants, type Manifest, restFor, yttConfigMap } from '../lib/kube.js';
import { appKey, type Ours, startOurs, toolDelta, waitForwardersReady } from '../lib/ours.js';

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

/** Result of the dedup scenario. */
export interface DedupResult {
  burst: DedupPhase;
  staggered: DedupPhase;
}

type Id = FleetId;

function gitApp(ns: string, name: string, url: string, sha: string): Manifest {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name, namespace: ns },
    spec: {
      serviceAccountName: BENCH_SA,
      syncPeriod: '10m0s',
      fetch: [{ git: { url, ref: sha } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    },
  };
}

async function phase(
  ctx: BenchContext,
  fleet: { ids: Id[]; runtimes: Ours[]; kubeconfig: string },
  git: GitServer,
  label: string,
  staggered: boolean,
): Promise<DedupPhase> {
  const repo = await createRepo(git, `dedup-${label}`, {
    'config.yml': yttConfigMap({ release: '#@ data.values.release' }),
    'values.yml': `#@data/values\n---\nname: fleet-${label}\nrelease: ${label}\n`,
  });
  const name = `fleet-${label}`;
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

/**
 * Runs the dedup scenario (starts and stops a second control plane and a git server).
 * @throws Error when the second cluster or the git server cannot start.
 */
export async function dedupOurs(ctx: BenchContext, simulated = 18): Promise<DedupResult> {
  const { cluster: a, rest: restA } = clusterOf(ctx);
  const dir = await scratchDir(ctx, 'dedup');
  ctx.say('dedup: starting a second control plane and a git server');
  const [b, git] = await Promise.all([startCluster({ log: ctx.say }), startGitServer()]);
  const runtimes: Ours[] = [];
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
    for (const i of ids) {
      runtimes.push(
        startOurs({
          kubeconfigPath: kubeconfig,
          contexts: [i.id],
          namespaces: [i.ns],
          store,
          tmpRoot: path.join(dir, 'work', i.id),
          cacheRoot: ctx.cacheRoot,
          concurrency: 4,
          say: ctx.say,
        }),
      );
    }
    await Promise.all(runtimes.map((r) => waitForwardersReady(r, 60_000)));
    const fleet = { ids, runtimes, kubeconfig };
    const burst = await phase(ctx, fleet, git, 'burst', false);
    const staggered = await phase(ctx, fleet, git, 'staggered', true);
    return { burst, staggered };
  } finally {
    await Promise.all(runtimes.map((r) => r.stop()));
    await git.stop();
    await b.stop();
  }
}
