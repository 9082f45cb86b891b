/**
 * Logging port. The core logs through {@link Logger}; entry files pass a pino logger
 * (pino's API is a superset), tests pass {@link memoryLogger}. Log lines are JSON objects,
 * one per event; never put secrets, tokens or kubeconfig contents in them.
 */

/** Structured logger (the subset of pino the core uses). */
export interface Logger {
  info(obj: Record<string, unknown>, msg?: string): void;
  warn(obj: Record<string, unknown>, msg?: string): void;
  error(obj: Record<string, unknown>, msg?: string): void;
  debug(obj: Record<string, unknown>, msg?: string): void;
  child(bindings: Record<string, unknown>): Logger;
}

/** Outcome of one stage run, as logged and as counted by benchmarks. */
export type StageOutcome =
  | 'succeeded'
  | 'failed'
  | 'noop'
  | 'cached'
  | 'stale'
  | 'gone'
  | 'paused'
  | 'deleted'
  | 'crashed'
  // The function deadline stopped the stage's tool; a follow-up invocation continues the run.
  | 'continued';

/** One line per stage run, like a controller's reconcile log. */
export interface StageRunRecord {
  /** `cluster/Kind/namespace/name`. */
  object: string;
  /** `reconcile` (the decision step), `fetch`, `template`, `deploy`, `delete`. */
  stage: string;
  /** `metadata.generation` the run was started for. */
  generation: number;
  /** Wall time of the stage run in milliseconds. */
  durationMs: number;
  outcome: StageOutcome;
  /** Tool processes started by this stage run and their total time in milliseconds. */
  tools?: { runs: number; ms: number };
  /** Short error text (already redacted) for failed/crashed runs. */
  error?: string;
}

/** Logs one {@link StageRunRecord} at info level (error level for `crashed`). */
export function logStageRun(log: Logger, rec: StageRunRecord): void {
  if (rec.outcome === 'crashed') log.error({ ...rec }, 'stage run');
  else log.info({ ...rec }, 'stage run');
}

/**
 * An error as a log field: `<name>: <message>`, or only its type for a thrown non-Error (whose
 * content is unknown, so it is not logged). The `cause` is logged apart where it is wanted.
 */
export function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : typeof err;
}

/** A logger that keeps records in memory, for tests and the demo summary. */
export function memoryLogger(
  records: Array<{ level: string; obj: Record<string, unknown>; msg?: string }> = [],
  bindings: Record<string, unknown> = {},
): Logger & { records: typeof records } {
  const at =
    (level: string) =>
    (obj: Record<string, unknown>, msg?: string): void => {
      records.push({ level, obj: { ...bindings, ...obj }, msg });
    };
  return {
    records,
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    debug: at('debug'),
    child: (b) => memoryLogger(records, { ...bindings, ...b }),
  };
}
