/**
 * Scenario 10, cost (issue 13 item 8): the monthly cost of a fleet of 1,000 clusters × 50 Apps
 * (default sync periods, one package upgrade a day) on Lambda + SQS + S3, next to the same
 * fleet on kapp-controller, from measured figures: those of the same run when its scenarios
 * ran (`latency`, `resync`, `repositories`, `kapp-controller`), otherwise the latest committed
 * results file that has them. Starts nothing and installs nothing: a few milliseconds.
 *
 * Prices, their sources and dates, and every assumption: bench/README.md, "Fleet cost model".
 *
 * @module
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { AWS_PRICES_USD } from '../../functions/lib/receipt/prices.js';
import { DISPATCHER_MEMORY_MIB, STAGE_SIZING } from '../../infra/aws/stages.js';
import { idleRunLeaseRequests, workingRunLeaseRequests } from '../lease-counters.js';
import {
  type FixedUse,
  type Invocation,
  type KappControllerFleetCost,
  kappControllerFleetCost,
  type LambdaFleetCost,
  lambdaFleetCost,
  type NodePrice,
  type PodRequests,
  type Prices,
  type Workload,
} from '../lib/cost-model.js';
import type { Row } from '../lib/stats.js';
import { round, summarize } from '../lib/stats.js';

type Json = Record<string, unknown>;
const o = (x: unknown): Json => (x !== null && typeof x === 'object' ? (x as Json) : {});
const n = (x: unknown): number | undefined => (typeof x === 'number' && Number.isFinite(x) ? x : undefined);

/** The dispatcher functions' key in the sizing table. */
const DISPATCHER = 'dispatcher';
/**
 * What a dispatcher adds to the stage invocation it waits on, ms: 30, assumed (the edge checks'
 * reads and the synchronous invoke's round trip; the run session is reused per stage and
 * cluster for 40 minutes, so `AssumeRole` is rare). Not measured: no Lambda here.
 */
const DISPATCH_OVERHEAD_MS = 30;

/**
 * `w` on the dispatched shared stack (docs/decisions.md D15): each stage invocation is paired
 * with its dispatcher's, which lasts as long plus {@link DISPATCH_OVERHEAD_MS}: one more request
 * and 128 MiB for that time. Queue and bucket requests are the same (the edge reads moved, they
 * did not double).
 */
function dispatched(w: Workload): Workload {
  return {
    ...w,
    invocations: w.invocations.flatMap((inv) => [inv, { fn: DISPATCHER, ms: inv.ms + DISPATCH_OVERHEAD_MS }]),
  };
}

/** Where the prices were read (all US East (N. Virginia), on-demand, USD). */
const SRC = {
  lambdaArchive:
    'aws.amazon.com/lambda/pricing (archived 2026-06-18) and cloudchipr.com/blog/aws-lambda-pricing (2024): x86 $0.0000166667, arm64 $0.0000133334 per GB-s, $0.20 per 1M requests',
  lambdaTiers: 'aws.amazon.com/blogs/compute/introducing-tiered-pricing-for-aws-lambda (2022): −10 % / −20 % tiers',
  ephemeral:
    'not found in the search corpus: $0.0000000309 per GB-s, AWS public price list (Lambda pricing page, us-east-1), unchanged since the 2022 launch, as of 2026-03',
  sqs: 'cloudburn.io/blog/amazon-sqs-pricing (March 2026) and factualminds.com (June 2026): FIFO $0.50 per 1M requests, 64 KB chunks',
  s3Requests:
    'c3x.dev/blog/s3-request-fees-explained and cloudburn.io/blog/amazon-s3-pricing (March 2026): PUT/COPY/POST/LIST $0.005, GET/HEAD $0.0004 per 1,000',
  s3Storage: 'cloudburn.io/blog/amazon-s3-pricing (March 2026): S3 Standard $0.023 per GB-month, first 50 TB',
  kms: 'cloudburn.io/blog/aws-kms-pricing and wring.co (March 2026): $1 per customer managed key-month, $0.03 per 10,000 requests',
  node: 'factualminds.com/blog/amazon-ec2-on-demand-pricing-instance-families-2026 (June 2026): m7g.large Linux $0.0816/h',
  pod: 'kapp-controller v0.53.1 config/config/deployment.yml (Go module carvel.dev/kapp-controller@v0.53.1, the version the benchmark builds): kapp-controller and kapp-controller-sidecarexec containers, each requests cpu 120m, memory 100Mi; 1 replica',
} as const;

const TIERS_X86 = [
  { upToGbSeconds: 6e9, factor: 1 },
  { upToGbSeconds: 15e9, factor: 0.9 },
  { upToGbSeconds: Number.POSITIVE_INFINITY, factor: 0.8 },
];
const TIERS_ARM = [
  { upToGbSeconds: 7.5e9, factor: 1 },
  { upToGbSeconds: 18.75e9, factor: 0.9 },
  { upToGbSeconds: Number.POSITIVE_INFINITY, factor: 0.8 },
];

/** US East (N. Virginia) prices for one Lambda architecture. */
export function pricesFor(architecture: 'x86_64' | 'arm64'): Prices {
  const x86 = architecture === 'x86_64';
  return {
    region: 'us-east-1',
    architecture,
    lambdaRequest: { usd: AWS_PRICES_USD.lambdaRequest, unit: 'request', source: SRC.lambdaArchive },
    lambdaGbSecond: { usd: AWS_PRICES_USD.lambdaGbSecond[architecture], unit: 'GB-s', source: SRC.lambdaArchive },
    lambdaTiers: x86 ? TIERS_X86 : TIERS_ARM,
    lambdaEphemeralGbSecond: { usd: AWS_PRICES_USD.lambdaEphemeralGbSecond, unit: 'GB-s', source: SRC.ephemeral },
    sqsFifoRequest: { usd: AWS_PRICES_USD.sqsFifoRequest, unit: 'request', source: SRC.sqs },
    s3Put: { usd: AWS_PRICES_USD.s3Put, unit: 'request', source: SRC.s3Requests },
    s3Get: { usd: AWS_PRICES_USD.s3Get, unit: 'request', source: SRC.s3Requests },
    s3StorageGbMonth: { usd: AWS_PRICES_USD.s3StorageGbMonth, unit: 'GB-month', source: SRC.s3Storage },
    kmsKeyMonth: { usd: AWS_PRICES_USD.kmsKeyMonth, unit: 'key-month', source: SRC.kms },
    kmsRequest: { usd: AWS_PRICES_USD.kmsRequest, unit: 'request', source: SRC.kms },
  };
}

/** The node kapp-controller's pod is priced as a share of. */
export const NODE: NodePrice = { instance: 'm7g.large', usdPerHour: 0.0816, vcpu: 2, memoryGiB: 8, source: SRC.node };

/** kapp-controller's pod requests: 2 × (120m, 100Mi). */
export const KAPP_CONTROLLER_POD: PodRequests = { vcpu: 0.24, memoryGiB: 200 / 1024, source: SRC.pod };

/** Where the forwarder's Deployment is (its replicas and resource requests are priced as written). */
export const FORWARDER_DEPLOYMENT = path.join(import.meta.dirname, '..', '..', 'infra', 'forwarder', 'deployment.yml');

/**
 * A Kubernetes quantity in base units: `50m` → 0.05, `128Mi` → 134217728, `1` → 1.
 * @throws Error for a form it does not know.
 */
export function quantity(q: string | number): number {
  if (typeof q === 'number') return q;
  const m = /^([0-9.]+)(m|k|M|G|Ki|Mi|Gi)?$/.exec(q.trim());
  if (!m) throw new Error(`cost: unknown quantity ${JSON.stringify(q)}`);
  const unit = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30 }[m[2] ?? ''] ?? 1;
  return Number(m[1]) * unit;
}

/**
 * The forwarder's requests per cluster, read from its Deployment: replicas × the container's
 * `resources.requests` (the standby replica reserves as much as the leader).
 * @throws Error when the file has no replicas or requests.
 */
export function forwarderPodRequests(file = FORWARDER_DEPLOYMENT): PodRequests & { replicas: number } {
  const doc = parseAllDocuments(readFileSync(file, 'utf8'))
    .map((d) => d.toJS() as Json)
    .find((d) => d.kind === 'Deployment');
  const spec = o(doc?.spec);
  const replicas = n(spec.replicas);
  const containers = (o(o(o(spec.template).spec)).containers ?? []) as Json[];
  const requests = o(o(containers[0]?.resources).requests);
  if (!replicas || requests.cpu === undefined || requests.memory === undefined) {
    throw new Error(`cost: ${file} has no replicas or resource requests`);
  }
  const cpu = quantity(requests.cpu as string);
  const mem = quantity(requests.memory as string) / 2 ** 30;
  return {
    replicas,
    vcpu: replicas * cpu,
    memoryGiB: replicas * mem,
    source: `infra/forwarder/deployment.yml: ${replicas} replicas × (cpu ${String(requests.cpu)}, memory ${String(requests.memory)})`,
  };
}

/** The fleet of issue 13 item 8. */
export interface FleetShape {
  clusters: number;
  appsPerCluster: number;
  /** App `syncPeriod`, s (kapp-controller's default 30 s). */
  appSyncSeconds: number;
  /**
   * `exception` (the default since issue 24): an App whose watches are healthy and whose last
   * reconcile succeeded gets no event at its syncPeriod, only once per {@link safetySyncSeconds};
   * `periodic`: every syncPeriod, as kapp-controller (the `sync-mode` opt-in).
   */
  syncMode: 'exception' | 'periodic';
  /**
   * The safety period, s (default 10 min; `kappLambdaSafetySyncPeriod`): an App quiet by
   * exception still reconciles once per period. Applies only to periods shorter than it (the
   * forwarder's quiet rule), so the 10 m PackageInstall and PackageRepository periods are as upstream.
   */
  safetySyncSeconds: number;
  /**
   * Drift reconciles per App per day (assumed: a hand edit or deletion of a deployed object that
   * the drift watches turn into one full reconcile with kapp). kapp-controller reverts drift at
   * its next sync with no extra cost, so this is charged to kapp-lambda only.
   */
  driftPerAppPerDay: number;
  packageRepositoriesPerCluster: number;
  /** PackageInstalls per cluster; each makes one App with the PackageInstall's sync period. */
  packageInstallsPerCluster: number;
  /** PackageInstall and PackageRepository `syncPeriod`, s (default 10 m). */
  packageSyncSeconds: number;
  /** Mean of the timer's jitter after a success, s (upstream adds U[0 s, 5 s)). */
  jitterMeanSeconds: number;
  upgradesPerDay: number;
  /** The fleet's source poll period, s (the runtime's default 60 s), one poll per distinct source. */
  sourcePollSeconds: number;
  distinctSources: number;
  /** Seconds in the month: 30 days. */
  monthSeconds: number;
}

/**
 * 1,000 clusters × 50 Apps at 30 s (reconciled by exception, 10 min safety period, one drift per
 * App a week), 1 PackageRepository and 1 PackageInstall each at 10 m, 1 upgrade a day.
 */
export const FLEET: FleetShape = {
  clusters: 1000,
  appsPerCluster: 50,
  appSyncSeconds: 30,
  syncMode: 'exception',
  safetySyncSeconds: 600,
  driftPerAppPerDay: 1 / 7,
  packageRepositoriesPerCluster: 1,
  packageInstallsPerCluster: 1,
  packageSyncSeconds: 600,
  jitterMeanSeconds: 2.5,
  upgradesPerDay: 1,
  sourcePollSeconds: 60,
  distinctSources: 1,
  monthSeconds: 30 * 86_400,
};

/**
 * The run lease's object-store requests per App run on Lambda (the embedded runtime the
 * benchmark measures has no lease: its keyed queue does the same in memory), counted by running
 * the lease code (functions/lib/lease/run-leases.ts, `../lease-counters.ts`): an idle resync runs optimistic, reading the lease
 * and writing nothing (`idleRunLeaseRequests`); a run that works takes the lease, hands it on
 * twice and ends it (`workingRunLeaseRequests`).
 */
export interface LeaseRequests {
  /** S3 GETs (lease reads) per idle resync. */
  gets: number;
  /** S3 conditional PUTs (lease writes) per idle resync. */
  puts: number;
  /** The same per run that works (a reconcile that runs tools). */
  run: { gets: number; puts: number };
  from: string;
}

/** {@link LeaseRequests} as the lease code makes them now. */
export async function leaseRequestsPerRun(): Promise<LeaseRequests> {
  return {
    ...(await idleRunLeaseRequests()),
    run: await workingRunLeaseRequests(),
    from: 'bench/lease-counters.ts idleRunLeaseRequests() and workingRunLeaseRequests(), the lease code run on a counting store',
  };
}

/** Assumed, not measured: an `install` invocation (no tool, a few API requests), ms. */
export const INSTALL_MS = 100;
/** Assumed, not measured: one fleet source poll (a registry HEAD and the poll record's CAS), ms. */
export const SOURCE_POLL_MS = 100;
/** Assumed: bytes kept per App in the bucket (fetch tarball, manifest, records). */
export const BYTES_PER_APP = 100_000;

/** The measured figures the model needs, each with the file (or run) it came from. */
export interface CostMeasurements {
  /** One first reconcile of the inline-ytt App: per-stage function time (median of the runs), store calls. */
  reconcile: { stagesMs: Record<string, number>; storeCalls: number; from: string };
  /** One idle resync: Σ stage time (median), the stages that ran, tool runs. */
  resync: { functionMs: number; stages: string[]; toolRuns: number; from: string };
  /** A PackageRepository of 50 Packages on a fleet member (the index already stored): index-repo time, ms. */
  repository: { indexRepoMs: number; from: string };
  /** kapp-controller's CPU-seconds per reconcile (throughput, concurrency 4), when measured. */
  kappControllerCpuPerReconcile?: { seconds: number; from: string };
  /** The run lease's requests per idle resync and per run that works ({@link leaseRequestsPerRun}). */
  lease: LeaseRequests;
}

/** The reconcile figures of a latency result, or undefined. */
function reconcileOf(latency: unknown, from: string): CostMeasurements['reconcile'] | undefined {
  const runs = (o(latency).runs ?? []) as { stages?: Record<string, number>; store?: { calls?: number } }[];
  if (!Array.isArray(runs) || runs.length === 0) return undefined;
  const stagesMs: Record<string, number> = {};
  for (const s of Object.keys(runs[0]?.stages ?? {})) {
    stagesMs[s] = summarize(runs.map((r) => r.stages?.[s] ?? 0)).median;
  }
  const calls = runs.map((r) => r.store?.calls).filter((c): c is number => typeof c === 'number');
  if (calls.length === 0) return undefined;
  return { stagesMs, storeCalls: summarize(calls).median, from };
}

function resyncOf(resync: unknown, from: string): CostMeasurements['resync'] | undefined {
  const r = o(resync);
  const functionMs = n(o(r.functionMs).median);
  const toolRuns = n(r.toolRunsPerApp);
  if (functionMs === undefined || toolRuns === undefined) return undefined;
  return { functionMs, stages: Object.keys(o(r.outcomes)), toolRuns, from };
}

function repositoryOf(repositories: unknown, from: string): CostMeasurements['repository'] | undefined {
  const runs = (o(repositories).ours ?? []) as Json[];
  const r = Array.isArray(runs) ? runs.find((x) => x.packages === 50) : undefined;
  const stage = n(o(r?.stages)['index-repo']);
  if (!r || stage === undefined) return undefined;
  const deploy = o(o(r.tools).deploy);
  // a fleet member finds the index stored: no vendir, no ytt (the repositories fleet case)
  const skipped = (n(o(deploy.vendir).ms) ?? 0) + (n(o(deploy.ytt).ms) ?? 0);
  return { indexRepoMs: stage - skipped, from };
}

function kcCpuOf(kc: unknown, from: string): CostMeasurements['kappControllerCpuPerReconcile'] {
  const runs = (o(kc).throughput ?? []) as Json[];
  const t = Array.isArray(runs) ? runs.find((x) => x.concurrency === 4) : undefined;
  const cpu = n(t?.cpuSeconds);
  const apps = n(t?.apps);
  return cpu !== undefined && apps ? { seconds: cpu / apps, from } : undefined;
}

/** A results file's scenario results, with its name. */
export interface ResultsSource {
  name: string;
  results: Record<string, unknown>;
}

/**
 * The committed results files of `dir`, newest first (by `startedAt`).
 * @throws Error when the directory cannot be read or a file is not JSON.
 */
export function committedResults(dir: string): ResultsSource[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .map((f) => {
      const doc = JSON.parse(readFileSync(path.join(dir, f), 'utf8')) as { startedAt?: string; results?: Json };
      return { name: f, startedAt: doc.startedAt ?? '', results: doc.results ?? {} };
    })
    .sort((a, b) => b.startedAt.localeCompare(a.startedAt))
    .map(({ name, results }) => ({ name, results }));
}

/**
 * Picks each measurement from the first source that has it (the same run first, then the
 * committed files newest first).
 * @throws Error naming a measurement no source has.
 */
export function pickMeasurements(sources: readonly ResultsSource[]): Omit<CostMeasurements, 'lease'> {
  const first = <T>(f: (s: ResultsSource) => T | undefined): T | undefined => {
    for (const s of sources) {
      const v = f(s);
      if (v !== undefined) return v;
    }
    return undefined;
  };
  const reconcile = first((s) => reconcileOf(s.results.latency, s.name));
  const resync = first((s) => resyncOf(s.results.resync, s.name));
  const repository = first((s) => repositoryOf(s.results.repositories, s.name));
  const kc = first((s) => kcCpuOf(s.results.kappController, s.name));
  const missing = [!reconcile && 'latency', !resync && 'resync', !repository && 'repositories'].filter(Boolean);
  if (!reconcile || !resync || !repository) {
    throw new Error(`cost: no results with ${missing.join(', ')} (run those scenarios once)`);
  }
  return { reconcile, resync, repository, ...(kc ? { kappControllerCpuPerReconcile: kc } : {}) };
}

/** The App pipeline's stages, in order (`reconcile` runs inside the fetch function). */
const APP_STAGES = ['fetch', 'template', 'deploy'] as const;

/** An idle resync's resources as measured (the stages that ran, Σ time split evenly among them) and the lease's requests. */
export function resyncWorkloadOf(
  m: CostMeasurements['resync'],
  lease: LeaseRequests,
): Omit<Workload, 'name' | 'perMonth'> {
  const ran = APP_STAGES.filter((s) => m.stages.includes(s));
  const stages = ran.length ? ran : ['fetch'];
  const each = m.functionMs / stages.length;
  return {
    invocations: stages.map((fn) => ({ fn, ms: each })),
    // per stage: one cache or manifest read (fetch record, render cache, manifest), plus the lease's
    storeGets: stages.length + lease.gets,
    storePuts: lease.puts,
    messages: stages.length,
    source: `${m.from}: resync Σ stages ${round(m.functionMs, 1)} ms over ${stages.join(', ')}, ${m.toolRuns} tool run(s); store reads modelled (1 per stage) + the lease's ${lease.gets} GETs and ${lease.puts} PUTs (${lease.from})`,
  };
}

/**
 * The fleet's workloads for a month, from the measurements.
 * @param resync - the idle resync to use (measured by default; the what-if passes the target's)
 */
export function fleetWorkloads(
  fleet: FleetShape,
  m: CostMeasurements,
  resync: Omit<Workload, 'name' | 'perMonth'> = resyncWorkloadOf(m.resync, m.lease),
): Workload[] {
  const per = (periodS: number) => fleet.monthSeconds / (periodS + fleet.jitterMeanSeconds);
  const st = m.reconcile.stagesMs;
  const reconcileInvocations: Invocation[] = [
    { fn: 'fetch', ms: (st.reconcile ?? 0) + (st.fetch ?? 0) },
    { fn: 'template', ms: st.template ?? 0 },
    { fn: 'deploy', ms: st.deploy ?? 0 },
  ];
  // measured store calls (embedded runtime), split half reads half writes (fetch: tarball put;
  // template: fetch artifact get, cache get, manifest put, cache record put; deploy: manifest get)
  const reconcileStore = {
    storeGets: Math.ceil(m.reconcile.storeCalls / 2) + m.lease.run.gets,
    storePuts: Math.floor(m.reconcile.storeCalls / 2) + m.lease.run.puts,
  };
  const repoResync: Omit<Workload, 'name' | 'perMonth'> = {
    invocations: [{ fn: 'index-repo', ms: m.repository.indexRepoMs }],
    storeGets: 2,
    storePuts: 0,
    messages: 1,
    source: `${m.repository.from}: 50-Package first deploy less vendir and ytt (an upper bound of a no-op kapp); 2 index reads assumed`,
  };
  const install = { fn: 'install', ms: INSTALL_MS };
  const days = fleet.monthSeconds / 86_400;
  const upgradesPerMonth = fleet.upgradesPerDay * days * fleet.clusters;
  const apps = fleet.clusters * fleet.appsPerCluster;
  const pkgis = fleet.clusters * fleet.packageInstallsPerCluster;
  const quiet = fleet.syncMode === 'exception' && fleet.safetySyncSeconds > fleet.appSyncSeconds;
  const appPeriod = quiet ? fleet.safetySyncSeconds : fleet.appSyncSeconds;
  const reconcileWorkload = {
    invocations: reconcileInvocations,
    ...reconcileStore,
    messages: 3,
  };
  return [
    {
      name: quiet ? `App safety resync (${appPeriod / 60} m)` : `App idle resync (${appPeriod} s)`,
      perMonth: apps * per(appPeriod),
      ...resync,
    },
    ...(quiet
      ? [
          {
            name: `App drift reconcile (${round(fleet.driftPerAppPerDay * 7, 2)} a week)`,
            perMonth: apps * fleet.driftPerAppPerDay * days,
            ...reconcileWorkload,
            source: `assumed rate; ${m.reconcile.from}: a first reconcile (latency, median per stage): drift runs kapp as a first reconcile does`,
          },
        ]
      : []),
    {
      name: "PackageInstall's App idle resync (10 m)",
      perMonth: pkgis * per(fleet.packageSyncSeconds),
      ...resync,
    },
    {
      name: 'PackageInstall idle resync (10 m)',
      perMonth: pkgis * per(fleet.packageSyncSeconds),
      invocations: [install],
      storeGets: 0,
      storePuts: 0,
      messages: 1,
      source: `assumed: one install invocation of ${INSTALL_MS} ms, no bucket access`,
    },
    {
      name: 'PackageRepository idle resync (10 m)',
      perMonth: fleet.clusters * fleet.packageRepositoriesPerCluster * per(fleet.packageSyncSeconds),
      ...repoResync,
    },
    {
      name: 'fleet source poll (60 s)',
      perMonth: fleet.distinctSources * (fleet.monthSeconds / fleet.sourcePollSeconds),
      invocations: [{ fn: 'index-repo', ms: SOURCE_POLL_MS }],
      storeGets: 1,
      storePuts: 1,
      messages: 1,
      source: `assumed: ${SOURCE_POLL_MS} ms, the poll record's compare-and-swap`,
    },
    {
      name: 'package upgrade (1 a day, every cluster)',
      perMonth: upgradesPerMonth,
      invocations: [...repoResync.invocations, install, ...reconcileInvocations],
      storeGets: repoResync.storeGets + reconcileStore.storeGets,
      storePuts: repoResync.storePuts + reconcileStore.storePuts,
      messages: 1 + 1 + 3,
      source: `${m.reconcile.from}: a first reconcile (latency, median per stage) + the repository's and the install's runs; fetch and template are not deduplicated here (an upper bound)`,
    },
  ];
}

/** The `cost` block of the results file. */
export interface CostResult {
  fleet: FleetShape;
  measurements: CostMeasurements;
  sizing: Record<string, { memoryMiB: number; ephemeralMiB: number }>;
  lambda: { x86_64: LambdaFleetCost; arm64: LambdaFleetCost };
  /** The same fleet with an idle App resync at issue 13's target: 1 invocation < 50 ms, no tool, no lease write. */
  whatIfResyncAtTarget: { x86_64: LambdaFleetCost };
  workloads: Workload[];
  kappController: KappControllerFleetCost & {
    pod: PodRequests;
    node: NodePrice;
    /** kapp-controller's measured CPU at this fleet's resync rate, vCPU per cluster (when measured). */
    measuredVcpuPerCluster?: number;
  };
  /** The forwarders in the clusters, their requests priced as kapp-controller's pod is. */
  forwarders: KappControllerFleetCost & { pod: PodRequests };
  /** The whole of kapp-lambda's month (Lambda x86_64 + the forwarders) ÷ kapp-controller's. */
  ratio: number;
  /** Lambda (x86_64) alone ÷ kapp-controller. */
  lambdaRatio: number;
  /** The month under other settings, each one change from this fleet (the last: all at once). */
  whatIfs: { name: string; lambda: number; forwarders: number; total: number; ratio: number }[];
  prices: { x86_64: Prices; arm64: Prices };
}

/** Issue 13's target for an idle resync: one fetch invocation of 50 ms, reads only (no lease write, no tool). */
export const RESYNC_AT_TARGET: Omit<Workload, 'name' | 'perMonth'> = {
  invocations: [{ fn: 'fetch', ms: 50 }],
  storeGets: 3,
  storePuts: 0,
  messages: 1,
  source: "issue 13 item 2's target (< 50 ms, 0 tools) with a read-only no-op check (no lease write)",
};

/**
 * Forwarder requests sized to this fleet's 50-App cluster rather than to 10,000 Apps: one
 * replica of 10m CPU and 64 MiB (measured: well under both; see events/forwarder/README.md,
 * "Memory"). A what-if, not the shipped Deployment.
 */
export const FORWARDER_AT_FLEET_SIZE: PodRequests = {
  vcpu: 0.01,
  memoryGiB: 64 / 1024,
  source: 'what-if: 1 replica × (10m, 64Mi)',
};

/** Computes the whole `cost` block from the measurements. Pure. */
export function costModel(
  m: CostMeasurements,
  fleet: FleetShape = FLEET,
  forwarder: PodRequests = { vcpu: 0.1, memoryGiB: 0.25, source: 'default: 2 × (50m, 128Mi)' },
): CostResult {
  const sizing = {
    ...Object.fromEntries(
      Object.entries(STAGE_SIZING).map(([k, v]) => [k, { memoryMiB: v.memoryMiB, ephemeralMiB: v.ephemeralMiB }]),
    ),
    [DISPATCHER]: { memoryMiB: DISPATCHER_MEMORY_MIB, ephemeralMiB: 512 },
  };
  const apps = fleet.clusters * (fleet.appsPerCluster + fleet.packageInstallsPerCluster);
  const fixed: FixedUse = { storedGb: (apps * BYTES_PER_APP) / 1e9, kmsKeys: 1, kmsRequestsPerMonth: 0 };
  const workloads = fleetWorkloads(fleet, m);
  const prices = { x86_64: pricesFor('x86_64'), arm64: pricesFor('arm64') };
  const x86 = lambdaFleetCost(workloads, sizing, prices.x86_64, fixed);
  const hours = fleet.monthSeconds / 3600;
  const kc = kappControllerFleetCost(fleet.clusters, KAPP_CONTROLLER_POD, NODE, hours);
  const fwd = kappControllerFleetCost(fleet.clusters, forwarder, NODE, hours);
  const whatIf = (
    name: string,
    f: FleetShape,
    pod: PodRequests,
    resync?: Omit<Workload, 'name' | 'perMonth'>,
    shape: (w: Workload) => Workload = (w) => w,
  ) => {
    const lambda = lambdaFleetCost(fleetWorkloads(f, m, resync).map(shape), sizing, prices.x86_64, fixed).total;
    const forwarders = kappControllerFleetCost(f.clusters, pod, NODE, hours).total;
    return { name, lambda, forwarders, total: lambda + forwarders, ratio: (lambda + forwarders) / kc.total };
  };
  const resyncsPerSecond =
    fleet.appsPerCluster / (fleet.appSyncSeconds + fleet.jitterMeanSeconds) +
    fleet.packageInstallsPerCluster / (fleet.packageSyncSeconds + fleet.jitterMeanSeconds);
  const cpu = m.kappControllerCpuPerReconcile?.seconds;
  return {
    fleet,
    measurements: m,
    sizing,
    lambda: { x86_64: x86, arm64: lambdaFleetCost(workloads, sizing, prices.arm64, fixed) },
    whatIfResyncAtTarget: {
      x86_64: lambdaFleetCost(fleetWorkloads(fleet, m, RESYNC_AT_TARGET), sizing, prices.x86_64, fixed),
    },
    workloads,
    kappController: {
      ...kc,
      pod: KAPP_CONTROLLER_POD,
      node: NODE,
      ...(cpu === undefined ? {} : { measuredVcpuPerCluster: round(cpu * resyncsPerSecond, 3) }),
    },
    forwarders: { ...fwd, pod: forwarder },
    ratio: (x86.total + fwd.total) / kc.total,
    lambdaRatio: x86.total / kc.total,
    whatIfs: [
      whatIf("periodic (upstream's every syncPeriod)", { ...fleet, syncMode: 'periodic' }, forwarder),
      whatIf('safety period 1 h', { ...fleet, safetySyncSeconds: 3600 }, forwarder),
      whatIf('idle resync at the target (1 invocation, < 50 ms, reads only)', fleet, forwarder, RESYNC_AT_TARGET),
      whatIf(`forwarder at the fleet's size (${FORWARDER_AT_FLEET_SIZE.source})`, fleet, FORWARDER_AT_FLEET_SIZE),
      whatIf(
        `dispatched (D15, the shared stack since 2026-12-07): a ${DISPATCHER_MEMORY_MIB} MiB dispatcher waits on each stage invocation, +${DISPATCH_OVERHEAD_MS} ms (assumed)`,
        fleet,
        forwarder,
        undefined,
        dispatched,
      ),
      whatIf(
        'all three: safety 1 h, resync at the target, forwarder at the fleet’s size',
        { ...fleet, safetySyncSeconds: 3600 },
        FORWARDER_AT_FLEET_SIZE,
        RESYNC_AT_TARGET,
      ),
    ],
    prices,
  };
}

const usd = (x: number) =>
  `$${x.toLocaleString('en-US', { maximumFractionDigits: x < 100 ? 2 : 0, minimumFractionDigits: x < 100 ? 2 : 0 })}`;
const pct = (x: number) => `${(x * 100).toFixed(1)} %`;
const big = (x: number) =>
  x >= 1e6
    ? `${(x / 1e6).toLocaleString('en-US', { maximumFractionDigits: 1 })} M`
    : x.toLocaleString('en-US', { maximumFractionDigits: 1 });

/** Table rows of the cost block. */
export function costRows(c: CostResult): Row[] {
  const S = '10 cost';
  const x = c.lambda.x86_64;
  const f = c.fleet;
  const rows: Row[] = [
    {
      scenario: S,
      figure: `fleet: ${f.clusters.toLocaleString('en-US')} clusters × ${f.appsPerCluster} Apps (${f.appSyncSeconds} s), ${f.packageInstallsPerCluster} PackageInstall + ${f.packageRepositoriesPerCluster} PackageRepository each (${f.packageSyncSeconds / 60} m), ${f.upgradesPerDay} upgrade/day`,
      value: `Lambda+SQS+S3 ${usd(x.total)}/month (arm64 ${usd(c.lambda.arm64.total)}) + forwarders ${usd(c.forwarders.total)} = ${usd(x.total + c.forwarders.total)}; kapp-controller ${usd(c.kappController.total)}/month; ratio ${c.ratio.toFixed(2)}× (Lambda alone ${c.lambdaRatio.toFixed(2)}×)`,
    },
  ];
  for (const l of x.lines) {
    rows.push({ scenario: S, figure: `  ${l.item}`, value: `${usd(l.usd)} (${big(l.quantity)} ${l.unit})` });
  }
  for (const w of x.byWorkload) {
    rows.push({
      scenario: S,
      figure: `  workload: ${w.name}`,
      value: `${usd(w.usd)} (${big(w.perMonth)}/month × ${usd(w.usdPerOccurrence * 1e6)} per million)`,
    });
  }
  rows.push(
    {
      scenario: S,
      figure: '  dominant',
      value: `${x.dominant.line} (${pct(x.dominant.lineShare)}); ${x.dominant.workload} (${pct(x.dominant.workloadShare)})`,
    },
    {
      scenario: S,
      figure: `  forwarders: ${c.forwarders.pod.source}`,
      value: `${pct(c.forwarders.nodeShare)} of a node (${c.forwarders.boundBy}) = ${usd(c.forwarders.perClusterUsd)}/cluster-month`,
    },
    ...c.whatIfs.map((w) => ({
      scenario: S,
      figure: `  what-if: ${w.name}`,
      value: `${usd(w.total)}/month (Lambda ${usd(w.lambda)} + forwarders ${usd(w.forwarders)}) = ${w.ratio.toFixed(3)}× kapp-controller`,
    })),
    {
      scenario: S,
      figure: `  kapp-controller: pod requests ${c.kappController.pod.vcpu} vCPU + ${round(c.kappController.pod.memoryGiB * 1024, 0)} MiB per cluster on ${c.kappController.node.instance}`,
      value: `${pct(c.kappController.nodeShare)} of a node (${c.kappController.boundBy}) = ${usd(c.kappController.perClusterUsd)}/cluster-month${c.kappController.measuredVcpuPerCluster === undefined ? '' : `; measured use ${c.kappController.measuredVcpuPerCluster} vCPU/cluster`}`,
    },
  );
  return rows;
}

/**
 * Runs the scenario: the same run's results first, then the committed files of `resultsDir`; the
 * lease's requests from running the lease code.
 * @throws Error when no source has a needed measurement.
 */
export async function costScenario(
  sameRun: Record<string, unknown>,
  resultsDir: string,
): Promise<{ result: CostResult; rows: Row[] }> {
  const m: CostMeasurements = {
    ...pickMeasurements([{ name: 'this run', results: sameRun }, ...committedResults(resultsDir)]),
    lease: await leaseRequestsPerRun(),
  };
  const result = costModel(m, FLEET, forwarderPodRequests());
  return { result, rows: costRows(result) };
}
