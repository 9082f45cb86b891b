/**
 * The embedded runtime's source poll timers (`../lib/pipeline/source-poll.ts`): a poll every
 * `config.sourcePollPeriodMs` (the registry or git request, once per source per period for the
 * fleet) and, between polls, a record check every `config.sourceCheckPeriodMs` (store reads only),
 * so that a runtime serving some clusters of a fleet pokes its repositories within one check of
 * another runtime seeing the tag move or building the new digest's index, not at its own next
 * poll.
 *
 * @module
 */
import type { PipelineDeps } from '../lib/pipeline/deps.js';
import { pollSources, sourceCheckPeriodMs, sourcePollPeriodMs } from '../lib/pipeline/repo/index.js';

/** Timer port of {@link startSourcePoller} (tests drive it by hand); default the global `setInterval`. */
export type IntervalTimer = (fn: () => void, ms: number) => { cancel(): void };

/** The global `setInterval`, unref'd (a timer never keeps the process alive), as an {@link IntervalTimer}. */
export const globalInterval: IntervalTimer = (fn, ms) => {
  const t = setInterval(fn, ms);
  t.unref();
  return { cancel: () => clearInterval(t) };
};

/**
 * Starts the poll and check timers. One {@link pollSources} runs at a time: a check that comes
 * while one runs is skipped (the next comes soon), a poll that comes while a check runs runs
 * right after it (skipping it would leave the sources unresolved for a whole period). Failures
 * are logged (`source poll failed`, warn) and the next tick runs on time. The checks are off when
 * their period is 0 or not shorter than the poll's.
 * @returns `stop()`, which clears the timers and waits for a poll or check in flight.
 */
export function startSourcePoller(
  deps: PipelineDeps,
  setTimer: IntervalTimer = globalInterval,
): { stop(): Promise<void> } {
  const pokedAt = new Map<string, number>();
  const periodMs = sourcePollPeriodMs(deps);
  const checkMs = sourceCheckPeriodMs(deps);
  let running: Promise<void> | undefined;
  let pollWaiting = false;
  let stopped = false;
  const run = (resolve: boolean): void => {
    if (stopped) return;
    if (running) {
      if (resolve) pollWaiting = true;
      return;
    }
    running = pollSources(deps, { pokedAt, resolve })
      .then((s) => {
        if (s.polled > 0 || s.poked > 0) deps.log.debug({ ...s, resolve }, 'source poll');
      })
      .catch((err: unknown) => deps.log.warn({ err: (err as Error).message, resolve }, 'source poll failed'))
      .finally(() => {
        running = undefined;
        if (pollWaiting) {
          pollWaiting = false;
          run(true);
        }
      });
  };
  const timers = [setTimer(() => run(true), periodMs)];
  if (checkMs > 0 && checkMs < periodMs) timers.push(setTimer(() => run(false), checkMs));
  return {
    async stop() {
      stopped = true;
      for (const t of timers) t.cancel();
      while (running) await running;
    },
  };
}
