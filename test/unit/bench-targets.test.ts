/**
 * The benchmark's targets block (`bench/lib/targets.ts`), computed from copies of committed
 * results files (`fixtures/bench-results/`): each figure read from its scenario's result object with its target, `met` as the
 * scenario's own table row decides it, and absent when its scenario did not run.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { computeTargets, FORWARDER_RSS_TARGET_MIB, meets, targetRows } from '../../bench/lib/targets.js';

// Copies of results files as committed on 2026-12-02 (a rerun of a scenario rewrites its file
// under bench/results/; the figures below are those of these copies).
const RESULTS = path.join(import.meta.dirname, 'fixtures/bench-results');
const resultsOf = (file: string) =>
  (JSON.parse(readFileSync(path.join(RESULTS, file), 'utf8')) as { results: Record<string, unknown> }).results;

describe('bench targets: the full run of 2026-11-30', () => {
  const t = computeTargets(resultsOf('2026-11-30-2cpu-24gib.json'));

  it('reads latency, resync, dedup, bundles, forwarder and CPU figures with their targets', () => {
    // restShare.median 0.7256… ; 702.48 / 265.05 = 2.650
    expect(t['latency.overheadShare']).toEqual({ value: 0.726, target: 0.1, unit: 'share', op: '<=', met: false });
    expect(t['latency.ratio']).toEqual({ value: 2.65, target: 0.8, unit: 'ratio', op: '<=', met: false });
    expect(t['resync.toolRuns']).toEqual({ value: 1, target: 0, unit: 'runs', op: '==', met: false });
    expect(t['resync.ms']).toEqual({ value: 238, target: 50, unit: 'ms', op: '<', met: false });
    expect(t['dedup.burst.vendir']).toMatchObject({ value: 20, target: 1, met: false });
    expect(t['dedup.burst.ytt']).toMatchObject({ value: 20, met: false });
    // staggered: 1 vendir (met), 19 ytt (missed)
    expect(t['dedup.staggered.vendir']).toMatchObject({ value: 1, target: 1, met: true });
    expect(t['dedup.staggered.ytt']).toMatchObject({ value: 19, met: false });
    expect(t['bundles.fetch.bytes']).toEqual({
      value: 2_467_132,
      target: 1_000_000,
      unit: 'bytes',
      op: '<=',
      met: false,
    });
    // Before issue 24 the file's `coldStart` was the empty batch: read as `initMs`; no real first invocation.
    expect(t['bundles.deploy.initMs']?.unit).toBe('ms');
    expect(t['bundles.deploy.initMs']?.met).toBe(false);
    expect(t['bundles.fetch.coldStartMs']).toBeUndefined();
    // 61.07 / 29.24 = 2.089 at concurrency 4; the worst of c4 and c10 is the c10 figure 2.226
    expect(t['throughput.cpuRatio.c4']).toMatchObject({ value: 2.089, target: 1, met: false });
    expect(t['throughput.cpuRatio']?.value).toBe(t['throughput.cpuRatio.c10']?.value);
    expect(t['throughput.cpuRatio']?.value).toBe(2.226);
  });

  it('takes the forwarder RSS of 10,000 Apps with the V8 flags, settled, in MiB against 120 MB', () => {
    const f = t['forwarder.rssMiB']!;
    expect(f.target).toBe(FORWARDER_RSS_TARGET_MIB);
    expect(FORWARDER_RSS_TARGET_MIB).toBe(114.44);
    // bench/README.md's 93.6 MiB (98.1 MB)
    expect(f.value).toBeCloseTo(93.6, 1);
    expect(f.met).toBe(true);
  });

  it('has no figure of a scenario that did not run in that file', () => {
    expect(Object.keys(t).some((k) => k.startsWith('repositories.') || k.startsWith('upgrade.'))).toBe(false);
  });
});

describe('bench targets: scenario-only files', () => {
  it('reads the repository ratios per size and the fleet case', () => {
    const t = computeTargets(resultsOf('2026-12-02-2cpu-24gib-repositories.json'));
    expect(t['repositories.50.createRatio']).toEqual({
      value: 1.081,
      target: 0.8,
      unit: 'ratio',
      op: '<=',
      met: false,
    });
    expect(t['repositories.100.createRatio']).toMatchObject({ value: 0.629, met: true });
    expect(t['repositories.500.deleteRatio']).toMatchObject({ value: 1.045, met: false });
    expect(t['repositories.fleet.toolRunsBeforeKapp']).toMatchObject({ value: 0, target: 0, met: true });
    expect(Object.keys(t).every((k) => k.startsWith('repositories.'))).toBe(true);
  });

  it('reads the fleet upgrade: event-driven time, tag resolutions per period, fetch and index runs', () => {
    const t = computeTargets(resultsOf('2026-12-02-2cpu-24gib-upgrade.json'));
    expect(t['upgrade.eventDrivenMs']).toEqual({ value: 148_798, target: 30_000, unit: 'ms', op: '<', met: false });
    // 4 tag resolutions in 4 periods
    expect(t['upgrade.tagResolutionsPerPeriod']).toMatchObject({ value: 1, target: 1, met: true });
    expect(t['upgrade.fetchRuns']).toMatchObject({ value: 1, met: true });
    expect(t['upgrade.indexRuns']).toMatchObject({ value: 1, met: true });
  });

  it('leaves out what a run did not measure: kapp-controller alone, or an upgrade that failed', () => {
    expect(computeTargets(resultsOf('2026-12-01-2cpu-24gib-upgrade.json'))).toEqual({});
    expect(computeTargets(resultsOf('2026-12-01-2cpu-24gib-fleet-upgrade.json'))).toEqual({});
    expect(computeTargets({})).toEqual({});
  });

  it('reads the cold start as a real first invocation less its tool time, and init apart (issue 24)', () => {
    const t = computeTargets({
      bundles: [
        {
          stage: 'fetch',
          bytes: 600_000,
          init: { median: 120 },
          firstInvocation: { wall: { median: 400 }, toolMs: 180, outsideTools: { median: 220 } },
        },
        { stage: 'deploy', bytes: 590_000, init: { median: 110 } },
      ],
    });
    expect(t['bundles.fetch.initMs']).toEqual({ value: 120, target: 150, unit: 'ms', op: '<=', met: true });
    expect(t['bundles.fetch.coldStartMs']).toEqual({ value: 220, target: 150, unit: 'ms', op: '<=', met: false });
    expect(t['bundles.deploy.initMs']?.value).toBe(110);
    expect(t['bundles.deploy.coldStartMs']).toBeUndefined();
  });

  it('reads the moved branch under the dedup fleet: resolutions, fetches of the new commit, renders (issue 24)', () => {
    const t = computeTargets({
      dedup: {
        branch: {
          resolutions: 1,
          runs: { fetchExecutions: 1, vendir: 2, templateExecutions: 19, deployExecutions: 20 },
        },
      },
    });
    expect(t['dedup.branch.resolutions']).toMatchObject({ value: 1, target: 1, op: '==', met: true });
    expect(t['dedup.branch.vendir']).toMatchObject({ value: 1, met: true });
    expect(t['dedup.branch.ytt']).toMatchObject({ value: 19, target: 1, met: false });
    // a file whose branch phase failed has none
    expect(computeTargets({ dedup: { burst: {}, staggered: {} } })['dedup.branch.resolutions']).toBeUndefined();
  });

  it('leaves out a ratio whose other side failed (null in the file)', () => {
    const t = computeTargets({ repositories: { ratios: { '50': { deploy: null, delete: 0.7 } } } });
    expect(t).toEqual({
      'repositories.50.deleteRatio': { value: 0.7, target: 0.8, unit: 'ratio', op: '<=', met: true },
    });
  });
});

describe('bench targets: drift (issue 24)', () => {
  it("reads ours' median revert time against 5 s, the wait's bound standing in for a sample not reverted", () => {
    const t = computeTargets({
      drift: {
        waitBoundMs: 90_000,
        ours: { edit: { missed: 0, ms: { median: 812.4 } }, delete: { missed: 1, ms: { median: 900 } } },
        theirs: { edit: { missed: 0, ms: { median: 14_000 } } },
      },
    });
    expect(t).toEqual({
      'drift.editMs': { value: 812, target: 5_000, unit: 'ms', op: '<', met: true },
      'drift.deleteMs': { value: 90_000, target: 5_000, unit: 'ms', op: '<', met: false },
    });
  });
});

describe('bench targets: comparison and rows', () => {
  it('compares with each operator', () => {
    expect(meets(50, '<', 50)).toBe(false);
    expect(meets(50, '<=', 50)).toBe(true);
    expect(meets(0, '==', 0)).toBe(true);
    expect(meets(1, '==', 0)).toBe(false);
  });

  it('renders one row per key with the target and the verdict', () => {
    const rows = targetRows({
      'resync.ms': { value: 12.5, target: 50, unit: 'ms', op: '<', met: true },
      'bundles.fetch.bytes': { value: 2_467_132, target: 1_000_000, unit: 'bytes', op: '<=', met: false },
    });
    expect(rows).toEqual([
      { scenario: 'targets', figure: 'resync.ms', value: '12.5 ms', target: '< 50 ms', verdict: 'met' },
      {
        scenario: 'targets',
        figure: 'bundles.fetch.bytes',
        value: '2,467,132 bytes',
        target: '≤ 1,000,000 bytes',
        verdict: 'missed',
      },
    ]);
  });
});
