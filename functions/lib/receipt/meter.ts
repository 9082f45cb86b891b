/**
 * The per-invocation meter of a stage: wraps the store and the command runner a stage gets
 * so that its receipt entry ({@link StageMeasure}) counts every object-store request and tool
 * run the stage made, and times the stage from the moment the event was taken. One meter per
 * event (`dispatchWithRetryBound`); the wrappers only count and delegate.
 *
 * @module
 */
import type { CommandRunner } from '../exec/runner.js';
import type { ObjectStore } from '../store/port.js';
import {
  MAX_TOOL_RUNS_PER_STAGE,
  noRequests,
  type ReceiptStage,
  type StageMeasure,
  type StoreRequests,
  type ToolRun,
} from './receipt.js';

/** Counts a stage's store requests and tool runs (see the module comment). */
export class StageMeter {
  private readonly requests: StoreRequests = noRequests();
  private readonly runs: ToolRun[] = [];
  private readonly started: number;

  /** @param clock - monotonic ms (default `performance.now`). */
  constructor(private readonly clock: () => number = () => performance.now()) {
    this.started = clock();
  }

  /** `store`, counting each request by class before it is sent. */
  store(store: ObjectStore): ObjectStore {
    const r = this.requests;
    const counted =
      <A extends unknown[], T>(kind: keyof StoreRequests, op: (...args: A) => Promise<T>) =>
      (...args: A): Promise<T> => {
        r[kind] += 1;
        return op(...args);
      };
    return {
      get: counted('get', (key, opts) => store.get(key, opts)),
      getVersioned: counted('get', (key, opts) => store.getVersioned(key, opts)),
      head: counted('head', (key) => store.head(key)),
      put: counted('put', (key, body) => store.put(key, body)),
      putIfAbsent: counted('put', (key, body) => store.putIfAbsent(key, body)),
      putIfMatch: counted('put', (key, body, ifMatch) => store.putIfMatch(key, body, ifMatch)),
      list: counted('list', (prefix, opts) => store.list(prefix, opts)),
      delete: counted('delete', (key) => store.delete(key)),
    };
  }

  /** `runner`, recording each run's tool, wall time and exit code (the first {@link MAX_TOOL_RUNS_PER_STAGE}). */
  runner(runner: CommandRunner): CommandRunner {
    return {
      run: async (req) => {
        const res = await runner.run(req);
        if (this.runs.length < MAX_TOOL_RUNS_PER_STAGE) {
          this.runs.push({ tool: req.cmd, ms: res.durationMs, exitCode: res.exitCode });
        }
        return res;
      },
    };
  }

  /** The stage's measure so far: its time since the meter was made, its tool runs and store requests. */
  measure(stage: ReceiptStage): StageMeasure {
    return {
      stage,
      ms: Math.max(0, this.clock() - this.started),
      tools: this.runs.map((t) => ({ ...t })),
      store: { ...this.requests },
    };
  }
}
