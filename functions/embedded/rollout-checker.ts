/**
 * The embedded runtime's rollout check (`../lib/pipeline/install/rollout-pokes.ts`
 * `checkRollouts`), every `config.rolloutCheckPeriodMs` (default 1000 ms): a runtime serving
 * some cluster ids of a fleet pokes its PackageInstalls of a wave another runtime released
 * within a second, and releases a wave whose soak ended when no member's run did. Store reads
 * only while no rollout moves. The shape of `./source-poller.ts`.
 *
 * @module
 */
import type { PipelineDeps } from '../lib/pipeline/deps.js';
import { checkRollouts } from '../lib/pipeline/install/index.js';
import { globalInterval, type IntervalTimer } from './source-poller.js';

/** Default period of the rollout check, in milliseconds. */
export const DEFAULT_ROLLOUT_CHECK_PERIOD_MS = 1000;

/**
 * Starts the check timer (off when the period is 0). One check runs at a time: a tick that comes
 * while one runs is skipped. Failures are logged (`rollout check failed`, warn).
 * @returns `stop()`, which clears the timer and waits for a check in flight.
 */
export function startRolloutChecker(
  deps: PipelineDeps,
  periodMs: number = DEFAULT_ROLLOUT_CHECK_PERIOD_MS,
  setTimer: IntervalTimer = globalInterval,
): { stop(): Promise<void> } {
  const poked = new Set<string>();
  let running: Promise<void> | undefined;
  let stopped = false;
  const run = (): void => {
    if (stopped || running) return;
    running = checkRollouts(deps, poked)
      .then((n) => {
        if (n > 0) deps.log.debug({ poked: n }, 'rollout check');
      })
      .catch((err: unknown) => deps.log.warn({ err: (err as Error).message }, 'rollout check failed'))
      .finally(() => {
        running = undefined;
      });
  };
  const timer = periodMs > 0 ? setTimer(run, periodMs) : undefined;
  return {
    async stop() {
      stopped = true;
      timer?.cancel();
      while (running) await running;
    },
  };
}
