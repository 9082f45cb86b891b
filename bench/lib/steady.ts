/**
 * Arithmetic of the steady-state scenario (`../scenarios/steady.ts`, issue 13 item 6): the API
 * server's request counter read from its Prometheus text, and a measuring window's counts turned
 * into per-minute figures and ratios ours/kapp-controller's. Pure: no I/O.
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
  /** `apiserver_request_total` at the window's end − at its start: every client's requests. */
  apiRequests: number;
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
export function steadyFigures(w: SteadyWindow, baselinePerMin: number): SteadyFigures {
  const raw = perMinute(w.apiRequests, w.windowMs);
  const api = Math.max(0, raw - baselinePerMin);
  const cpu = perMinute(w.cpuSeconds, w.windowMs);
  const reconciles = perMinute(w.reconciles, w.windowMs);
  return {
    cpuSecondsPerMin: cpu,
    apiRequestsPerMin: api,
    rawApiRequestsPerMin: raw,
    reconcilesPerMin: reconciles,
    cpuSecondsPerReconcile: reconciles > 0 ? cpu / reconciles : null,
    apiRequestsPerReconcile: reconciles > 0 ? api / reconciles : null,
  };
}

/** Issue 13 item 6: the steady state of kapp-lambda costs at most this share of kapp-controller's. */
export const STEADY_TARGET_RATIO = 0.1;

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
