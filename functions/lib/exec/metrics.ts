/**
 * Per-tool execution metrics: how many times each tool ran, how many runs failed, and the time
 * spent inside it. Benchmarks report "time inside each tool" from {@link ToolMetrics.snapshot}.
 *
 * @module
 */

/** How a run ended. */
export type ToolRunOutcome = 'ok' | 'exit' | 'signal' | 'timeout' | 'canceled' | 'start-failed';

/** One finished tool run, as reported by the command runner. */
export interface ToolRunSample {
  /** Allow-listed tool name, e.g. `kapp`. */
  tool: string;
  /** Wall time from spawn to exit, milliseconds. */
  durationMs: number;
  /** Exit code, or -1 when killed or not started. */
  exitCode: number;
  outcome: ToolRunOutcome;
}

/** Receiver of run samples; the command runner calls `record` once per run. */
export interface ToolMetricsSink {
  record(sample: ToolRunSample): void;
}

/** Aggregates of one tool. */
export interface ToolStats {
  /** Runs, including failed ones. */
  count: number;
  /** Runs whose outcome is not `ok`. */
  failures: number;
  /** Sum of run durations, milliseconds. */
  totalMs: number;
  /** Longest run, milliseconds. */
  maxMs: number;
}

/** An in-memory {@link ToolMetricsSink} that aggregates per tool. */
export interface ToolMetrics extends ToolMetricsSink {
  /** A copy of the aggregates, keyed by tool name (sorted). */
  snapshot(): Record<string, ToolStats>;
  /** Forgets everything recorded so far. */
  reset(): void;
}

/**
 * Creates an in-memory per-tool aggregator.
 *
 * @returns A {@link ToolMetrics}; pass it as the runner's `metrics` option.
 */
export function createToolMetrics(): ToolMetrics {
  let stats = new Map<string, ToolStats>();
  return {
    record(sample) {
      const s = stats.get(sample.tool) ?? { count: 0, failures: 0, totalMs: 0, maxMs: 0 };
      s.count += 1;
      if (sample.outcome !== 'ok') s.failures += 1;
      s.totalMs += sample.durationMs;
      s.maxMs = Math.max(s.maxMs, sample.durationMs);
      stats.set(sample.tool, s);
    },
    snapshot() {
      const out: Record<string, ToolStats> = {};
      for (const tool of [...stats.keys()].sort()) {
        const s = stats.get(tool);
        if (s) out[tool] = { ...s };
      }
      return out;
    },
    reset() {
      stats = new Map();
    },
  };
}

/**
 * Fans one sample out to several sinks (e.g. the in-memory aggregate and a receipt writer).
 *
 * @param sinks - Receivers; none may throw.
 */
export function teeToolMetrics(...sinks: ToolMetricsSink[]): ToolMetricsSink {
  return {
    record(sample) {
      for (const s of sinks) s.record(sample);
    },
  };
}
