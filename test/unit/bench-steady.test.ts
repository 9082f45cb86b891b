/**
 * The idle scenario's arithmetic (`bench/lib/steady.ts`): the API server's request counter
 * summed from its metrics text, per-minute and per-reconcile figures with the control plane's
 * baseline taken off, the ratios and their targets (`bench/lib/targets.ts`), the safety
 * period's message allowance, the alternating order of the sides, and the
 * kapp-controller log line counter (`bench/lib/kapp-controller.ts`). Figures worked by hand.
 */
import { describe, expect, it } from 'vitest';
import { lineCounter } from '../../bench/lib/kapp-controller.js';
import {
  apiRates,
  nextOrder,
  perMinute,
  requestTotal,
  safetyAllowance,
  steadyFigures,
  steadyRatios,
} from '../../bench/lib/steady.js';
import { computeTargets } from '../../bench/lib/targets.js';

const METRICS = [
  '# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, ...',
  '# TYPE apiserver_request_total counter',
  'apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="GET",version="v1"} 120',
  'apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="serviceaccounts",scope="resource",subresource="token",verb="POST",version="v1"} 7',
  'apiserver_request_total{code="0",component="apiserver",dry_run="",group="kappctrl.k14s.io",resource="apps",scope="namespace",subresource="",verb="WATCH",version="v1alpha1"} 3',
  'apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 1.5e+03',
  '# HELP apiserver_request_total_other a metric whose name only starts the same',
  'apiserver_request_total_other{verb="GET"} 1000000',
  'apiserver_request_duration_seconds_count{verb="GET"} 999',
  '',
].join('\n');

describe('requestTotal', () => {
  it('sums every apiserver_request_total sample, exponent form included, and nothing else', () => {
    // 120 + 7 + 3 + 1500
    expect(requestTotal(METRICS)).toBe(1630);
  });

  it('reads a sample without labels', () => {
    expect(requestTotal('apiserver_request_total 42\n')).toBe(42);
  });

  it('refuses a text without the counter rather than reading 0', () => {
    expect(() => requestTotal('# nothing here\nprocess_cpu_seconds_total 3\n')).toThrow(/no sample/);
  });

  it('refuses an unreadable value', () => {
    expect(() => requestTotal('apiserver_request_total{verb="GET"} abc\n')).toThrow(/unreadable/);
  });
});

describe('apiRates: mean and peak from readings about once a second', () => {
  it("takes the sampler's own read off each interval; the peak is the busiest interval", () => {
    // intervals: 1 s with 11 counted (10 + the read), 1 s with 41 (40), 2 s with 21 (20 → 10/s)
    const r = apiRates([
      { atMs: 0, total: 100 },
      { atMs: 1000, total: 111 },
      { atMs: 2000, total: 152 },
      { atMs: 4000, total: 173 },
    ]);
    expect(r).toEqual({ requests: 70, windowMs: 4000, meanPerSecond: 17.5, peakPerSecond: 40, samples: 4 });
  });

  it('a late reading spreads its interval: the rate is per its own length', () => {
    const r = apiRates([
      { atMs: 0, total: 0 },
      { atMs: 1500, total: 31 },
    ]);
    expect(r.peakPerSecond).toBe(20);
    expect(r.meanPerSecond).toBe(20);
  });

  it('joins an interval shorter than half a second to its neighbour (the reading at stop)', () => {
    // last interval 5 ms with 6 requests: joined to the one before (1 s, 10) → 16 in 1.005 s
    const r = apiRates([
      { atMs: 0, total: 0 },
      { atMs: 1000, total: 11 },
      { atMs: 1005, total: 18 },
    ]);
    expect(r.requests).toBe(16);
    expect(r.peakPerSecond).toBeCloseTo(16 / 1.005, 6);
  });

  it('never counts below 0 in an interval, and needs two readings over a positive window', () => {
    expect(
      apiRates([
        { atMs: 0, total: 5 },
        { atMs: 1000, total: 5 },
      ]).requests,
    ).toBe(0);
    expect(() => apiRates([{ atMs: 0, total: 5 }])).toThrow(RangeError);
    expect(() =>
      apiRates([
        { atMs: 0, total: 5 },
        { atMs: 0, total: 9 },
      ]),
    ).toThrow(RangeError);
  });
});

describe('per-minute figures', () => {
  it('scales a count over a window to a minute', () => {
    expect(perMinute(300, 120_000)).toBe(150);
    expect(perMinute(7, 30_000)).toBe(14);
    expect(() => perMinute(1, 0)).toThrow(RangeError);
  });

  it('takes the control plane baseline off the requests and divides by the reconciles', () => {
    // 2 min: 12 CPU-s → 6/min; 1,000 requests → 500/min, less 20/min baseline = 480;
    // 240 reconciles → 120/min; per reconcile 6/120 = 0.05 CPU-s and 480/120 = 4 requests
    const f = steadyFigures({ windowMs: 120_000, cpuSeconds: 12, apiRequests: 1000, reconciles: 240 }, 20);
    expect(f).toEqual({
      cpuSecondsPerMin: 6,
      apiRequestsPerMin: 480,
      rawApiRequestsPerMin: 500,
      apiRequestsPerSecond: 8,
      rawApiRequestsPerSecond: 500 / 60,
      reconcilesPerMin: 120,
      cpuSecondsPerReconcile: 0.05,
      apiRequestsPerReconcile: 4,
    });
  });

  it('never goes below 0 requests, and has no per-reconcile figure without a reconcile', () => {
    const f = steadyFigures({ windowMs: 60_000, cpuSeconds: 0.5, apiRequests: 10, reconciles: 0 }, 25);
    expect(f.apiRequestsPerMin).toBe(0);
    expect(f.rawApiRequestsPerMin).toBe(10);
    expect(f.cpuSecondsPerReconcile).toBeNull();
    expect(f.apiRequestsPerReconcile).toBeNull();
  });

  it('compares ours with theirs, with no ratio against a zero', () => {
    expect(
      steadyRatios({ cpuSecondsPerMin: 1, apiRequestsPerMin: 50 }, { cpuSecondsPerMin: 8, apiRequestsPerMin: 1000 }),
    ).toEqual({ cpu: 0.125, api: 0.05 });
    expect(
      steadyRatios({ cpuSecondsPerMin: 1, apiRequestsPerMin: 50 }, { cpuSecondsPerMin: 0, apiRequestsPerMin: 0 }),
    ).toEqual({ cpu: null, api: null });
  });
});

describe('idle targets', () => {
  const results = {
    idle: {
      ours: { cpuSecondsPerMin: 1, apiRequestsPerMin: 40, counts: { messages: 101, allowedMessages: 100 } },
      theirs: { cpuSecondsPerMin: 8, apiRequestsPerMin: 1000 },
    },
  };

  it('sets each per-minute figure against 0.05 of kapp-controller’s, and the ratios against 0.05', () => {
    const t = computeTargets(results);
    // 1 CPU-s/min against 0.4: missed; 40 requests/min against 50: met
    expect(t['idle.cpuSecondsPerMin']).toEqual({ value: 1, target: 0.4, unit: 'CPU-s/min', op: '<=', met: false });
    expect(t['idle.cpuRatio']).toEqual({ value: 0.125, target: 0.05, unit: 'ratio', op: '<=', met: false });
    expect(t['idle.apiRequestsPerMin']).toEqual({ value: 40, target: 50, unit: 'requests/min', op: '<=', met: true });
    expect(t['idle.apiRatio']).toEqual({ value: 0.04, target: 0.05, unit: 'ratio', op: '<=', met: true });
  });

  it('holds the messages against the safety period’s allowance, one over is missed', () => {
    expect(computeTargets(results)['idle.messages']).toEqual({
      value: 101,
      target: 100,
      unit: 'messages',
      op: '<=',
      met: false,
    });
  });

  it('has no ratio when kapp-controller’s side is missing', () => {
    const t = computeTargets({ idle: { ours: results.idle.ours } });
    expect(Object.keys(t).filter((k) => k.startsWith('idle.'))).toEqual(['idle.messages']);
  });
});

describe('safetyAllowance', () => {
  it('allows one message per App per safety period begun in the window', () => {
    expect(safetyAllowance(100, 600_000, 600_000)).toBe(100);
    expect(safetyAllowance(100, 600_001, 600_000)).toBe(200);
    expect(safetyAllowance(10, 60_000, 600_000)).toBe(10);
  });

  it('refuses a window or period that is not positive', () => {
    expect(() => safetyAllowance(1, 0, 600_000)).toThrow(RangeError);
    expect(() => safetyAllowance(1, 60_000, 0)).toThrow(RangeError);
  });
});

describe('nextOrder: which side runs first', () => {
  it('flips the last run’s order, ours first when none was recorded', () => {
    expect(nextOrder(undefined)).toBe('ours-first');
    expect(nextOrder('ours-first')).toBe('theirs-first');
    expect(nextOrder('theirs-first')).toBe('ours-first');
  });

  it('takes the override over the last order, and refuses anything but ours or theirs', () => {
    expect(nextOrder('theirs-first', 'theirs')).toBe('theirs-first');
    expect(nextOrder('ours-first', 'ours')).toBe('ours-first');
    expect(nextOrder('ours-first', '')).toBe('theirs-first');
    expect(() => nextOrder(undefined, 'both')).toThrow(/ours or theirs/);
  });
});

describe('lineCounter', () => {
  it('counts complete lines holding the needle, a line split across chunks once, per stream', () => {
    const c = lineCounter('"Completed deploy"');
    const out = c.stream();
    const err = c.stream();
    out.push('{"msg":"Started deploy"}\n{"msg":"Compl');
    err.push('{"msg":"Completed deploy","app":"b"}\n{"msg":"Comp');
    expect(c.count).toBe(1);
    out.push('eted deploy","app":"a"}\n');
    expect(c.count).toBe(2);
    // the other stream's unfinished line counts only once it ends
    err.push('leted deploy"}');
    expect(c.count).toBe(2);
    err.push('\n{"msg":"Reconcile noop"}\n');
    expect(c.count).toBe(3);
  });
});
