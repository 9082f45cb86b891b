/**
 * The function deadline at the command runner: a {@link CommandRunner} whose every run is also
 * canceled by one deadline signal, so a tool is killed cleanly (its whole process group, by the
 * runner) before the platform kills the process, and the stage still has time to write its
 * final status. Middy's core does the same per request: an `AbortController` armed at the
 * remaining time minus a margin.
 *
 * The stages need no change: they get the wrapped runner in their deps, and a tool cut by the
 * deadline fails like a tool that timed out (`toolTimeoutMs`): its stage writes
 * `ReconcileFailed` with `<stage prefix>Process was canceled: cut by the function deadline ...`
 * and the App runs again after the failure backoff (upstream's handling of a tool failure).
 *
 * @module
 */
import { CommandCanceledError, type CommandRunner, type RunRequest, type RunResult } from './runner.js';

/** The reason of a deadline signal: the invocation is `marginMs` from its time limit. */
export class DeadlineError extends Error {
  override readonly name = 'DeadlineError';
  /** @param marginMs - time left before the platform's limit when the signal fired, ms. */
  constructor(readonly marginMs: number) {
    super(`the function deadline is ${Math.round(marginMs / 1000)} s away`);
  }
}

/**
 * A run canceled by the deadline ({@link withDeadline}): a {@link CommandCanceledError} whose
 * message says so, e.g. `Process was canceled: cut by the function deadline (30 s before the
 * time limit of the invocation)`. `cause` is the {@link DeadlineError}.
 */
export class CommandDeadlineError extends CommandCanceledError {
  /**
   * @param cmd - Tool name.
   * @param started - Whether the process had started.
   * @param reason - The deadline signal's reason.
   */
  constructor(cmd: string, started: boolean, reason: DeadlineError) {
    super(cmd, started, reason);
    this.name = 'CommandDeadlineError';
    const secs = Math.round(reason.marginMs / 1000);
    this.message = `${this.message}: cut by the function deadline (${secs} s before the time limit of the invocation)`;
  }
}

/**
 * Wraps `runner` so that `deadline` also cancels every run (combined with the request's own
 * signal, e.g. the App-canceled watch). A run the deadline canceled (and not its own signal)
 * fails with a {@link CommandDeadlineError}; every other result is passed through unchanged.
 *
 * @param runner - the runner of the process.
 * @param deadline - aborted with a {@link DeadlineError} when the deadline comes.
 * @returns the wrapped runner.
 */
export function withDeadline(runner: CommandRunner, deadline: AbortSignal): CommandRunner {
  const inner = withSignal(runner, deadline);
  return {
    async run(req: RunRequest): Promise<RunResult> {
      const result = await inner.run(req);
      const cut = deadline.aborted && !req.signal?.aborted && deadline.reason instanceof DeadlineError;
      if (cut && result.error instanceof CommandCanceledError) {
        return { ...result, error: new CommandDeadlineError(req.cmd, result.error.started, deadline.reason) };
      }
      return result;
    },
  };
}

/**
 * Wraps `runner` so that `signal` also cancels every run (combined with the request's own
 * signal): a run started after it aborted never starts, a running tool is killed as on its own
 * signal (the process group, SIGTERM then SIGKILL). Results pass through unchanged. Used by the
 * function deadline ({@link withDeadline}) and by the embedded runtime for a cluster's lost
 * Lease (`ClusterLeadership.termSignal`, `events/forwarder/leadership.ts`).
 *
 * @param runner - the runner of the process.
 * @param signal - cancels every run once aborted.
 * @returns the wrapped runner.
 */
export function withSignal(runner: CommandRunner, signal: AbortSignal): CommandRunner {
  return {
    run: (req: RunRequest): Promise<RunResult> =>
      runner.run({ ...req, signal: req.signal ? AbortSignal.any([req.signal, signal]) : signal }),
  };
}
