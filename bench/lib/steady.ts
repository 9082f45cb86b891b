/**
 * Arithmetic of the idle scenario (`../scenarios/idle.ts`, issue 24; issue 13 item 6's steady
 * state before it): the API server's request counter read from its Prometheus text, a measuring
 * window's counts turned into per-minute figures and ratios ours/kapp-controller's, the messages
 * the safety period allows and the order of the sides. Pure: no I/O.
 *
 * @module
 */

/** The API server's counter of handled requests (every verb, resource and code). */
const REQUEST_TOTAL = 'apiserver_request_total';

/**
 * Sum of every `apiserver_request_total` sample in a Prometheus text exposition (the API
 * server's `GET /metrics`): all requests the server has finished since it started, whatever
 * their client, verb, resource or code. A watch counts once, when it ends. Comment (`#`) lines
 * and other metrics, including `apiserver_request_total_…` ones, are ignored.
 * @throws Error when the text holds no such sample (not the API server's metrics, or a
 *   version that renamed the counter): a count of 0 would be a silent wrong figure.
 */
export function requestTotal(metrics: string): number {
  let sum = 0;
  let samples = 0;
  for (const line of metrics.split('\n')) {
    if (!line.startsWith(REQUEST_TOTAL)) continue;
    const next = line[REQUEST_TOTAL.length];
    if (next !== '{' && next !== ' ') continue;
    // value after the label set (label values never hold the closing brace of the set last)
    const rest = next === '{' ? line.slice(line.lastIndexOf('}') + 1) : line.slice(REQUEST_TOTAL.length);
    const value = Number(rest.trim().split(/\s+/)[0]);
    if (!Number.isFinite(value)) throw new Error(`${REQUEST_TOTAL}: unreadable sample ${line.slice(0, 200)}`);
    sum += value;
    samples++;
  }
  if (samples === 0) throw new Error(`${REQUEST_TOTAL}: no sample in the metrics text`);
  return sum;
}

/**
 * `count` over `ms` milliseconds, per minute.
 * @throws RangeError when `ms` is not positive.
 */
export function perMinute(count: number, ms: number): number {
  if (!(ms > 0)) throw new RangeError(`perMinute: window of ${ms} ms`);
  return (count * 60_000) / ms;
}

/** What one measuring window counted, for one implementation running alone. */
export interface SteadyWindow {
  /** Window length, ms. */
  windowMs: number;
  /** CPU-seconds (user + system, processes and reaped tool children) spent in the window. */
  cpuSeconds: number;
  /**
   * `apiserver_request_total` at the window's end − at its start: every client's requests (less
   * the benchmark's own counter reads, {@link apiRates}).
   */
  apiRequests: number;
  /** The busiest second's requests per second, as counted (the baseline's included): {@link apiRates}. */
  peakApiRequestsPerSecond: number;
  /** Reconciles (kapp-lambda: pipeline runs ended; kapp-controller: "Completed deploy") ended in the window. */
  reconciles: number;
}

/** A window's figures per minute (and per reconcile, which does not depend on the App count). */
export interface SteadyFigures {
  cpuSecondsPerMin: number;
  /** API requests per minute less the control plane's own (the baseline), at least 0. */
  apiRequestsPerMin: number;
  /** API requests per minute as counted, the control plane's own included. */
  rawApiRequestsPerMin: number;
  /** `apiRequestsPerMin` per second: the mean over the window, less the baseline. */
  apiRequestsPerSecond: number;
  /** `rawApiRequestsPerMin` per second: the mean the API server saw. */
  rawApiRequestsPerSecond: number;
  reconcilesPerMin: number;
  /** `null` when the window ended no reconcile. */
  cpuSecondsPerReconcile: number | null;
  apiRequestsPerReconcile: number | null;
}

/**
 * Per-minute figures of a window.
 * @param baselinePerMin - requests per minute of the control plane with neither implementation
 *   running (kube-controller-manager, scheduler, kwok), subtracted from the window's count
 * @throws RangeError when the window is not positive.
 */
export function steadyFigures(
  w: Pick<SteadyWindow, 'windowMs' | 'cpuSeconds' | 'apiRequests' | 'reconciles'>,
  baselinePerMin: number,
): SteadyFigures {
  const raw = perMinute(w.apiRequests, w.windowMs);
  const api = Math.max(0, raw - baselinePerMin);
  const cpu = perMinute(w.cpuSeconds, w.windowMs);
  const reconciles = perMinute(w.reconciles, w.windowMs);
  return {
    cpuSecondsPerMin: cpu,
    apiRequestsPerMin: api,
    rawApiRequestsPerMin: raw,
    apiRequestsPerSecond: api / 60,
    rawApiRequestsPerSecond: raw / 60,
    reconcilesPerMin: reconciles,
    cpuSecondsPerReconcile: reconciles > 0 ? cpu / reconciles : null,
    apiRequestsPerReconcile: reconciles > 0 ? api / reconciles : null,
  };
}

/**
 * Issue 24's idle target: idle Apps cost kapp-lambda at most this share of kapp-controller's CPU
 * and API requests per minute (issue 13 item 6 asked for 0.1 of the steady state).
 */
export const STEADY_TARGET_RATIO = 0.05;

/**
 * Messages the idle scenario allows in a window (issue 24: "no messages beyond the safety
 * period's"): each App may have one full reconcile per safety period begun in the window,
 * `apps × ⌈windowMs / safetyPeriodMs⌉`.
 * @throws RangeError when the window or the period is not positive.
 */
export function safetyAllowance(apps: number, windowMs: number, safetyPeriodMs: number): number {
  if (!(windowMs > 0) || !(safetyPeriodMs > 0)) {
    throw new RangeError(`safetyAllowance: window ${windowMs} ms, period ${safetyPeriodMs} ms`);
  }
  return apps * Math.ceil(windowMs / safetyPeriodMs);
}

/** Which side of a two-sided scenario measured its window first. */
export type SideOrder = 'ours-first' | 'theirs-first';

/**
 * The order of this run: `override` (`ours` or `theirs`, the side to run first) when given,
 * else the flip of the last recorded run's order, else ours first. Alternating between runs
 * spreads a drift in the machine's load over both sides.
 * @throws Error when `override` is neither `ours` nor `theirs`.
 */
export function nextOrder(previous: SideOrder | undefined, override?: string): SideOrder {
  if (override !== undefined && override !== '') {
    if (override === 'ours' || override === 'theirs') return `${override}-first`;
    throw new Error(`the side to run first must be ours or theirs, not ${JSON.stringify(override)}`);
  }
  if (previous === 'ours-first') return 'theirs-first';
  return 'ours-first';
}

/**
 * Ratios ours/theirs of the per-minute figures; `null` where kapp-controller's figure is 0
 * (nothing to compare with).
 */
export function steadyRatios(
  ours: Pick<SteadyFigures, 'cpuSecondsPerMin' | 'apiRequestsPerMin'>,
  theirs: Pick<SteadyFigures, 'cpuSecondsPerMin' | 'apiRequestsPerMin'>,
): { cpu: number | null; api: number | null } {
  return {
    cpu: theirs.cpuSecondsPerMin > 0 ? ours.cpuSecondsPerMin / theirs.cpuSecondsPerMin : null,
    api: theirs.apiRequestsPerMin > 0 ? ours.apiRequestsPerMin / theirs.apiRequestsPerMin : null,
  };
}

/** One reading of the API server's request counter: when (ms, any clock common to all) and Σ {@link requestTotal}. */
export interface ApiSample {
  atMs: number;
  total: number;
}

/** The API server's load over a sampled window (`lib/api-sampler.ts`). */
export interface ApiRates {
  /** Requests finished between the first and the last sample, less the sampler's own. */
  requests: number;
  /** First sample → last, ms. */
  windowMs: number;
  /** `requests` per second over `windowMs`. */
  meanPerSecond: number;
  /** The largest per-second rate between two consecutive samples (each less its own read). */
  peakPerSecond: number;
  /** Samples read. */
  samples: number;
}

/**
 * Mean and peak request rate of a window from counter samples taken about once a second. Each
 * sample is one `GET /metrics`, counted by the server after it answered, so every interval holds
 * exactly one request of the sampler's (the read that opened it): `ownPerInterval` (default 1)
 * is taken off each interval, never below 0. The peak is the busiest interval's rate, so its
 * resolution is the sampling interval (a burst shorter than it is averaged over it); an interval
 * shorter than `minIntervalMs` (the reading taken at stop, just after a periodic one) is joined
 * to its neighbour, so a few requests in a few ms do not read as a huge rate. A watch counts in
 * the interval it ended in.
 * @throws RangeError with fewer than two samples or a window that is not positive.
 */
export function apiRates(samples: readonly ApiSample[], ownPerInterval = 1, minIntervalMs = 500): ApiRates {
  if (samples.length < 2) throw new RangeError(`apiRates: ${samples.length} sample(s), need 2`);
  let requests = 0;
  const merged: { n: number; ms: number }[] = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1] as ApiSample;
    const b = samples[i] as ApiSample;
    const n = Math.max(0, b.total - a.total - ownPerInterval);
    requests += n;
    const ms = b.atMs - a.atMs;
    const last = merged.at(-1);
    if (last && last.ms < minIntervalMs) {
      last.n += n;
      last.ms += ms;
    } else merged.push({ n, ms });
  }
  const tail = merged.at(-1);
  if (merged.length > 1 && tail && tail.ms < minIntervalMs) {
    merged.pop();
    const prev = merged.at(-1) as { n: number; ms: number };
    prev.n += tail.n;
    prev.ms += tail.ms;
  }
  let peak = 0;
  for (const { n, ms } of merged) if (ms > 0) peak = Math.max(peak, (n * 1000) / ms);
  const windowMs = (samples.at(-1) as ApiSample).atMs - (samples[0] as ApiSample).atMs;
  if (!(windowMs > 0)) throw new RangeError(`apiRates: window of ${windowMs} ms`);
  return {
    requests,
    windowMs,
    meanPerSecond: (requests * 1000) / windowMs,
    peakPerSecond: peak,
    samples: samples.length,
  };
}
