/**
 * The fleet cost model (`bench/lib/cost-model.ts`) and the cost scenario's inputs
 * (`bench/scenarios/cost.ts`): fixed inputs → monthly dollars worked out by hand in the
 * comments, the duration tiers, kapp-controller's node share, and the measurements picked from
 * the committed results files.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  type FunctionSize,
  kappControllerFleetCost,
  lambdaFleetCost,
  type Prices,
  tieredDurationUsd,
  type Workload,
} from '../../bench/lib/cost-model.js';
import { computeTargets } from '../../bench/lib/targets.js';
import {
  type CostMeasurements,
  committedResults,
  costModel,
  FLEET,
  forwarderPodRequests,
  leaseRequestsPerRun,
  pickMeasurements,
  pricesFor,
  quantity,
  resyncWorkloadOf,
} from '../../bench/scenarios/cost.js';

const src = 'test';
const RESULTS = path.join(import.meta.dirname, '../../bench/results');
// Copies of results files as committed on 2026-12-02 (a rerun of a scenario rewrites its file
// under bench/results/; the figures below are those of these copies).
const FIXTURES = path.join(import.meta.dirname, 'fixtures/bench-results');
const readDoc = (file: string, dir = FIXTURES) =>
  JSON.parse(readFileSync(path.join(dir, file), 'utf8')) as { startedAt: string; results: Record<string, unknown> };
const fileSource = (name: string) => ({ name, results: readDoc(name).results });
/** Round prices: $0.20/M requests, $0.0000166667/GB-s, $0.50/M SQS, $0.005/1k PUT, $0.0004/1k GET. */
const PRICES: Prices = {
  region: 'test',
  architecture: 'x86_64',
  lambdaRequest: { usd: 0.2e-6, unit: 'request', source: src },
  lambdaGbSecond: { usd: 0.0000166667, unit: 'GB-s', source: src },
  lambdaTiers: [
    { upToGbSeconds: 6e9, factor: 1 },
    { upToGbSeconds: 15e9, factor: 0.9 },
    { upToGbSeconds: Number.POSITIVE_INFINITY, factor: 0.8 },
  ],
  lambdaEphemeralGbSecond: { usd: 0.0000000309, unit: 'GB-s', source: src },
  sqsFifoRequest: { usd: 0.5e-6, unit: 'request', source: src },
  s3Put: { usd: 0.005 / 1000, unit: 'request', source: src },
  s3Get: { usd: 0.0004 / 1000, unit: 'request', source: src },
  s3StorageGbMonth: { usd: 0.023, unit: 'GB-month', source: src },
  kmsKeyMonth: { usd: 1, unit: 'key-month', source: src },
  kmsRequest: { usd: 0.03 / 10_000, unit: 'request', source: src },
};
const SIZING: Record<string, FunctionSize> = {
  small: { memoryMiB: 1024, ephemeralMiB: 512 },
  big: { memoryMiB: 2048, ephemeralMiB: 4096 },
};
const workload = (w: Partial<Workload>): Workload => ({
  name: 'w',
  perMonth: 1_000_000,
  invocations: [],
  storeGets: 0,
  storePuts: 0,
  messages: 0,
  source: src,
  ...w,
});
const line = (c: ReturnType<typeof lambdaFleetCost>, prefix: string) => c.lines.find((l) => l.item.startsWith(prefix))!;

describe('cost model: Lambda + SQS + S3 + KMS, by hand', () => {
  it.each([
    {
      what: '1 M × (1 invocation of 100 ms at 1 GiB, 2 GETs, 1 PUT, 1 message), 10 GB stored, 1 key',
      w: workload({ invocations: [{ fn: 'small', ms: 100 }], storeGets: 2, storePuts: 1, messages: 1 }),
      // requests 1 M × $0.2e-6 = 0.20; duration 1 GB × 0.1 s × 1 M = 100,000 GB-s × 0.0000166667 = 1.66667;
      // ephemeral 0 (512 MB is free); SQS 3 M × 0.5e-6 = 1.50; PUT 1 M × 5e-6 = 5.00;
      // GET 2 M × 0.4e-6 = 0.80; storage 10 × 0.023 = 0.23; KMS 1 key = 1.00 → 10.39667
      storedGb: 10,
      total: 10.39667,
      byWorkload: 9.16667,
    },
    {
      what: '1 M × (1 invocation of 250.4 ms at 2 GiB with 4 GiB /tmp), nothing else',
      w: workload({ invocations: [{ fn: 'big', ms: 250.4 }] }),
      // billed 251 ms; duration 2 GB × 0.251 s × 1 M = 502,000 GB-s × 0.0000166667 = 8.3666834;
      // ephemeral (4096 − 512)/1024 = 3.5 GB × 0.251 s × 1 M = 878,500 GB-s × 0.0000000309 = 0.0271457;
      // requests 0.20; KMS 1.00 → 9.5938291
      storedGb: 0,
      total: 9.5938291,
      byWorkload: 8.5938291,
    },
    {
      what: '2 M × (3 invocations of 10 ms at 1 GiB, 3 messages, 6 PUTs)',
      w: workload({
        perMonth: 2_000_000,
        invocations: [
          { fn: 'small', ms: 10 },
          { fn: 'small', ms: 10 },
          { fn: 'small', ms: 10 },
        ],
        storePuts: 6,
        messages: 3,
      }),
      // requests 6 M × 0.2e-6 = 1.20; duration 0.03 GB-s × 2 M = 60,000 × 0.0000166667 = 1.000002;
      // SQS 18 M × 0.5e-6 = 9.00; PUT 12 M × 5e-6 = 60.00; KMS 1.00 → 72.200002
      storedGb: 0,
      total: 72.200002,
      byWorkload: 71.200002,
    },
  ])('$what', ({ w, storedGb, total, byWorkload }) => {
    const c = lambdaFleetCost([w], SIZING, PRICES, { storedGb, kmsKeys: 1, kmsRequestsPerMonth: 0 });
    expect(c.total).toBeCloseTo(total, 5);
    expect(c.byWorkload[0]!.usd).toBeCloseTo(byWorkload, 5);
    expect(c.byWorkload[0]!.usdPerOccurrence).toBeCloseTo(byWorkload / w.perMonth, 12);
  });

  it('names the dominant line and workload with their shares', () => {
    // the third case above: PUT 60.00 of 72.200002
    const c = lambdaFleetCost(
      [
        workload({ perMonth: 2_000_000, invocations: [{ fn: 'small', ms: 30 }], storePuts: 6, messages: 3 }),
        workload({ name: 'tiny', perMonth: 1, invocations: [{ fn: 'small', ms: 1 }] }),
      ],
      SIZING,
      PRICES,
      { storedGb: 0, kmsKeys: 1, kmsRequestsPerMonth: 0 },
    );
    expect(c.dominant.line).toBe('S3 PUT/LIST requests');
    expect(c.dominant.workload).toBe('w');
    expect(line(c, 'S3 PUT').usd).toBeCloseTo(60, 6);
    expect(c.dominant.lineShare).toBeCloseTo(60 / c.total, 9);
  });

  it('applies the duration tiers to the month total', () => {
    const base = 0.0000166667;
    // 10 B GB-s: 6 B at base + 4 B at 0.9 × base = 9.6 B × base = 160,000.32
    expect(tieredDurationUsd(10e9, base, PRICES.lambdaTiers)).toBeCloseTo(160_000.32, 2);
    // 20 B: 6 B + 9 B × 0.9 + 5 B × 0.8 = 18.1 B × base = 301,667.27
    expect(tieredDurationUsd(20e9, base, PRICES.lambdaTiers)).toBeCloseTo(301_667.27, 2);
    // within the first tier: plain product
    expect(tieredDurationUsd(1e6, base, PRICES.lambdaTiers)).toBeCloseTo(16.6667, 6);
  });

  it('refuses an invocation of a function it has no size for', () => {
    expect(() =>
      lambdaFleetCost([workload({ invocations: [{ fn: 'nope', ms: 1 }] })], SIZING, PRICES, {
        storedGb: 0,
        kmsKeys: 0,
        kmsRequestsPerMonth: 0,
      }),
    ).toThrow('no sizing for function nope');
  });
});

describe('cost model: kapp-controller as a node share', () => {
  it.each([
    {
      // 0.24 / 2 = 12 % CPU > 0.195 / 8 = 2.4 % memory: 0.12 × $0.0816 × 720 h = $7.05024 per cluster
      pod: { vcpu: 0.24, memoryGiB: 200 / 1024, source: src },
      node: { instance: 'm7g.large', usdPerHour: 0.0816, vcpu: 2, memoryGiB: 8, source: src },
      hours: 720,
      perCluster: 7.05024,
      boundBy: 'cpu',
    },
    {
      // memory-bound: 2 / 8 = 25 % > 0.1 / 2 = 5 %: 0.25 × $0.10 × 100 h = $2.50
      pod: { vcpu: 0.1, memoryGiB: 2, source: src },
      node: { instance: 'n', usdPerHour: 0.1, vcpu: 2, memoryGiB: 8, source: src },
      hours: 100,
      perCluster: 2.5,
      boundBy: 'memory',
    },
  ])('$boundBy-bound: $perCluster per cluster', ({ pod, node, hours, perCluster, boundBy }) => {
    const c = kappControllerFleetCost(1000, pod, node, hours);
    expect(c.perClusterUsd).toBeCloseTo(perCluster, 6);
    expect(c.total).toBeCloseTo(perCluster * 1000, 3);
    expect(c.boundBy).toBe(boundBy);
  });
});

const MEASURED: CostMeasurements = {
  reconcile: { stagesMs: { reconcile: 36, fetch: 31, template: 86, deploy: 352 }, storeCalls: 8, from: 'f' },
  resync: { functionMs: 240, stages: ['reconcile', 'fetch', 'template', 'deploy'], toolRuns: 1, from: 'f' },
  repository: { indexRepoMs: 4882, from: 'f' },
  kappControllerCpuPerReconcile: { seconds: 0.146, from: 'f' },
  lease: { gets: 6, puts: 3, run: { gets: 6, puts: 3 }, from: 'f' },
};

describe('cost scenario: the fleet from measurements', () => {
  it('prices one idle resync as measured: 3 invocations, lease writes, by hand', () => {
    const w = resyncWorkloadOf(MEASURED.resync, MEASURED.lease);
    // 240 ms over fetch, template, deploy: 80 ms each; per stage 1 read, plus the lease's 6 GETs, 3 PUTs
    expect(w.invocations).toEqual([
      { fn: 'fetch', ms: 80 },
      { fn: 'template', ms: 80 },
      { fn: 'deploy', ms: 80 },
    ]);
    expect([w.storeGets, w.storePuts, w.messages]).toEqual([9, 3, 3]);
    const c = costModel(MEASURED);
    const resync = c.lambda.x86_64.byWorkload[0]!;
    // requests 3 × 0.2e-6 = 0.6e-6; duration (1 + 2 + 1) GB × 0.08 s = 0.32 GB-s × 0.0000166667 = 5.333344e-6;
    // ephemeral (3.5 + 1.5 + 0.5) GB × 0.08 s = 0.44 GB-s × 3.09e-8 = 0.0136e-6; SQS 9 × 0.5e-6 = 4.5e-6;
    // PUT 3 × 5e-6 = 15e-6; GET 9 × 0.4e-6 = 3.6e-6 → 29.046944e-6 per resync
    expect(resync.usdPerOccurrence).toBeCloseTo(29.046944e-6, 10);
    // by exception: 50,000 Apps × 2,592,000 s / (600 s safety period + 2.5 s mean jitter)
    expect(resync.name).toBe('App safety resync (10 m)');
    expect(resync.perMonth).toBeCloseTo(215_103_734.4, 0);
    // periodic, as upstream: 50,000 Apps × 2,592,000 s / (30 s + 2.5 s mean jitter) = 3,987,692,308 resyncs
    const periodic = costModel(MEASURED, { ...FLEET, syncMode: 'periodic' });
    const everySync = periodic.lambda.x86_64.byWorkload.find((b) => b.name === 'App idle resync (30 s)')!;
    expect(everySync.perMonth).toBeCloseTo(3_987_692_307.7, 0);
    expect(periodic.lambda.x86_64.dominant.line).toBe('S3 PUT/LIST requests');
    // no drift workload when every App resyncs at its syncPeriod anyway
    expect(periodic.workloads.some((w) => w.name.startsWith('App drift'))).toBe(false);
  });

  it('charges drift reconciles as first reconciles at the assumed rate, only by exception', () => {
    const c = costModel(MEASURED);
    const drift = c.workloads.find((w) => w.name.startsWith('App drift reconcile'))!;
    // 50,000 Apps × 1/7 a day × 30 days
    expect(drift.perMonth).toBeCloseTo(214_285.7, 1);
    expect(drift.invocations.map((i) => i.fn)).toEqual(['fetch', 'template', 'deploy']);
    expect(drift.messages).toBe(3);
    // a safety period no longer than the syncPeriod: the App is never quiet (the forwarder's rule)
    const never = costModel(MEASURED, { ...FLEET, safetySyncSeconds: 30 });
    expect(never.workloads[0]?.name).toBe('App idle resync (30 s)');
  });

  it('prices the forwarders as written in their Deployment, and counts them in the ratio', () => {
    const pod = forwarderPodRequests();
    // infra/forwarder/deployment.yml: 2 replicas × (50m, 128Mi)
    expect(pod).toMatchObject({ replicas: 2, vcpu: 0.1, memoryGiB: 0.25 });
    const c = costModel(MEASURED, FLEET, pod);
    // max(0.1 / 2 vCPU, 0.25 / 8 GiB) = 5 % of an m7g.large: 0.05 × $0.0816 × 720 h = $2.9376 per cluster
    expect(c.forwarders.boundBy).toBe('cpu');
    expect(c.forwarders.total).toBeCloseTo(2937.6, 1);
    expect(c.ratio).toBeCloseTo((c.lambda.x86_64.total + 2937.6) / 7050.24, 6);
    expect(c.lambdaRatio).toBeCloseTo(c.lambda.x86_64.total / 7050.24, 9);
    // each what-if is cheaper than the fleet as configured, except upstream's periodic sync and
    // the dispatchers of the shared stack (D15): one more request and 128 MiB per stage invocation
    const dispatchedIndex = c.whatIfs.findIndex((w) => w.name.startsWith('dispatched'));
    const [dispatched] = c.whatIfs.splice(dispatchedIndex, 1);
    expect(dispatched!.forwarders).toBe(c.forwarders.total);
    expect(dispatched!.lambda).toBeGreaterThan(c.lambda.x86_64.total);
    // at most a quarter more duration (128 of install's 512 MiB) plus a request per invocation
    expect(dispatched!.lambda).toBeLessThan(c.lambda.x86_64.total * 1.5);
    const [periodic, ...cheaper] = c.whatIfs;
    expect(periodic!.total).toBeGreaterThan(c.lambda.x86_64.total + c.forwarders.total);
    for (const w of cheaper) expect(w.total).toBeLessThan(c.lambda.x86_64.total + c.forwarders.total);
    expect(cheaper.at(-1)!.total).toBe(Math.min(...cheaper.map((w) => w.total)));
  });

  it('reads Kubernetes quantities', () => {
    expect([quantity('50m'), quantity('128Mi'), quantity('1'), quantity('2Gi'), quantity(3)]).toEqual([
      0.05,
      134_217_728,
      1,
      2 ** 31,
      3,
    ]);
    expect(() => quantity('lots')).toThrow('cost: unknown quantity "lots"');
  });

  it('prices kapp-controller for the fleet and its measured CPU at the fleet resync rate', () => {
    const c = costModel(MEASURED);
    // 1,000 × $7.05024
    expect(c.kappController.total).toBeCloseTo(7050.24, 2);
    // 0.146 CPU-s × (50 / 32.5 + 1 / 602.5) resyncs/s = 0.2249 vCPU
    expect(c.kappController.measuredVcpuPerCluster).toBeCloseTo(0.225, 3);
    expect(c.lambdaRatio).toBeCloseTo(c.lambda.x86_64.total / 7050.24, 9);
    // the what-if resync (1 invocation, reads only) is cheaper than the measured one
    expect(c.whatIfResyncAtTarget.x86_64.total).toBeLessThan(c.lambda.x86_64.total);
    expect(c.lambda.arm64.total).toBeLessThan(c.lambda.x86_64.total);
  });

  it('reads each measurement from the results files in the order given (same run, then newest first)', () => {
    // explicit files, so a newer committed run does not change the expectations
    const m = pickMeasurements([
      fileSource('2026-12-02-2cpu-24gib-upgrade.json'),
      fileSource('2026-12-02-2cpu-24gib-repositories.json'),
      fileSource('2026-12-01-2cpu-24gib-repositories.json'),
      fileSource('2026-11-30-2cpu-24gib.json'),
    ]);
    expect(m.reconcile.from).toBe('2026-11-30-2cpu-24gib.json');
    expect(m.reconcile.storeCalls).toBe(8);
    // per-stage medians of the 5 latency runs
    expect(m.reconcile.stagesMs.deploy).toBeGreaterThan(m.reconcile.stagesMs.fetch!);
    expect(m.resync).toMatchObject({ functionMs: 238, toolRuns: 1, from: '2026-11-30-2cpu-24gib.json' });
    // the 50-Package run of 2026-12-02 (the first file that has one): index-repo 5543 ms − vendir 351.6 − ytt 308.8
    expect(m.repository.from).toBe('2026-12-02-2cpu-24gib-repositories.json');
    expect(m.repository.indexRepoMs).toBeCloseTo(4882.6, 1);
    // kapp-controller, concurrency 4: 29.24 CPU-s / 200 Apps
    expect(m.kappControllerCpuPerReconcile?.seconds).toBeCloseTo(0.1462, 4);
  });

  it('lists the committed results files newest first', () => {
    const files = committedResults(RESULTS);
    expect(files.map((f) => f.name)).toContain('2026-11-30-2cpu-24gib.json');
    const started = files.map((f) => readDoc(f.name, RESULTS).startedAt);
    expect(started).toEqual([...started].sort().reverse());
  });

  it('prefers the same run over the committed files, and names what no source has', () => {
    const sameRun = {
      resync: { functionMs: { median: 12 }, toolRunsPerApp: 0, outcomes: { reconcile: [], fetch: [] } },
    };
    const m = pickMeasurements([
      { name: 'this run', results: sameRun },
      fileSource('2026-11-30-2cpu-24gib.json'),
      fileSource('2026-12-02-2cpu-24gib-repositories.json'),
    ]);
    expect(m.resync).toEqual({ functionMs: 12, stages: ['reconcile', 'fetch'], toolRuns: 0, from: 'this run' });
    expect(resyncWorkloadOf(m.resync, MEASURED.lease).invocations).toEqual([{ fn: 'fetch', ms: 12 }]);
    expect(() => pickMeasurements([{ name: 'x', results: sameRun }])).toThrow(
      'cost: no results with latency, repositories',
    );
  });

  it('uses the fleet of issue 13 and the deployed functions’ sizes', () => {
    expect(FLEET).toMatchObject({ clusters: 1000, appsPerCluster: 50, appSyncSeconds: 30, packageSyncSeconds: 600 });
    const c = costModel(MEASURED);
    expect(c.sizing.template).toEqual({ memoryMiB: 2048, ephemeralMiB: 2048 });
    expect(pricesFor('arm64').lambdaGbSecond.usd).toBe(0.0000133334);
  });

  it('charges each run the lease requests the lease code makes (counted, not written down)', async () => {
    expect(await leaseRequestsPerRun()).toMatchObject({ gets: 2, puts: 0, run: { gets: 6, puts: 3 } });
  });
});

describe('cost target', () => {
  it('compares the whole month (Lambda and forwarders) with a tenth of kapp-controller’s', () => {
    const c = costModel(MEASURED, FLEET, forwarderPodRequests());
    const t = computeTargets({ cost: c });
    expect(t['cost.ratio']).toMatchObject({ target: 0.1, op: '<=', unit: 'ratio' });
    expect(t['cost.ratio']?.value).toBeCloseTo(c.ratio, 3);
    expect(computeTargets({ cost: { ratio: 0.09 } })['cost.ratio']?.met).toBe(true);
    expect(computeTargets({})['cost.ratio']).toBeUndefined();
  });
});
