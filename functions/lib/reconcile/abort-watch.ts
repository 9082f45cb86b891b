/**
 * The abort watch of a running tool (upstream `newCancelCh`, a watch of the App while kapp
 * runs): here the App is re-read on a timer and a signal aborts when it is deleted, recreated
 * or canceled, so the tool is killed and the delete queued behind the run starts at once.
 * Used by the fetch and template stages and by `runKapp` (`../deploy/run.ts`).
 *
 * @module
 */
import type { KubeObject, KubeReader, ResourceRef } from '../kube/port.js';
import type { Logger } from '../log.js';

/** What the watch uses of the stage's dependencies (a `PipelineDeps` fits). */
export interface AbortWatchDeps {
  /** Where a failed poll is logged. */
  log: Logger;
  /** `abortPollIntervalMs`: the default poll period, ms (else 2000). */
  config: { abortPollIntervalMs?: number };
}

/** A running watch of an App for deletion or cancellation (see {@link watchForAbort}). */
export interface AbortWatch {
  /** Aborted once the App is deleted (`deletionTimestamp`, gone, or recreated) or canceled. */
  readonly signal: AbortSignal;
  /** Stops polling; resolves once a poll in flight has finished. */
  stop(): Promise<void>;
}

/** Options of {@link watchForAbort}. */
export interface AbortWatchOptions {
  /** Poll period, ms. Default `deps.config.abortPollIntervalMs`, else 2000. */
  intervalMs?: number;
  /** Abort when the App is deleted, not only when canceled. Default true. */
  abortOnDelete?: boolean;
  /**
   * Abort when the App is canceled (`spec.canceled`). Default true (kapp). The fetch and
   * template stages pass false: upstream runs vendir and the templaters in its sidecar, which
   * cannot cancel them (reference §3.10), so a canceled run finishes them and kapp answers
   * `Already canceled`.
   */
  abortOnCancel?: boolean;
  /**
   * Runs after each poll that did not abort (deploy copies kapp's progress into status), with
   * the object that poll read (`undefined`: not found), so a status write need not read it again.
   */
  onTick?: (live: KubeObject | undefined) => Promise<void>;
  /** Log message of a failed poll or `onTick`. Default `App deletion poll failed`. */
  failureMessage?: string;
}

/**
 * Polls the App every `deps.config.abortPollIntervalMs` (default 2000 ms) while a fetch or
 * template tool runs, and aborts {@link AbortWatch.signal} when the App is deleted (its
 * `deletionTimestamp` set, gone, or another uid under the name) or `spec.canceled`: the tool is
 * killed, so the delete (queued behind this run for the same object) starts at once instead of
 * waiting for a long fetch. `runKapp` (`../deploy/run.ts`) uses the same loop during a deploy
 * (with `onTick` for its progress writes). A failed poll is logged and the tool keeps running; `stop()` waits for a
 * poll or `onTick` in flight.
 *
 * @param kube - reader of the App.
 * @param ref - the App.
 * @param uid - the uid the run started from.
 */
export function watchForAbort(
  kube: KubeReader,
  ref: ResourceRef,
  uid: string,
  deps: AbortWatchDeps,
  opts: AbortWatchOptions = {},
): AbortWatch {
  const abort = new AbortController();
  let inflight: Promise<void> | undefined;
  let stopped = false;
  const tick = setInterval(
    () => {
      if (inflight || stopped || abort.signal.aborted) return;
      inflight = (async () => {
        try {
          const live = await kube.getObject<KubeObject & { spec?: { canceled?: boolean } }>(ref);
          const deleted = !live || live.metadata.uid !== uid || Boolean(live.metadata.deletionTimestamp);
          const canceled = (opts.abortOnCancel ?? true) && Boolean(live?.spec?.canceled);
          if (!stopped && (canceled || ((opts.abortOnDelete ?? true) && deleted))) {
            abort.abort(new Error('App canceled or deleted'));
          } else if (!stopped) {
            await opts.onTick?.(live);
          }
        } catch (err) {
          deps.log.warn(
            { app: `${ref.namespace}/${ref.name}`, error: (err as Error).message },
            opts.failureMessage ?? 'App deletion poll failed',
          );
        } finally {
          inflight = undefined;
        }
      })();
    },
    opts.intervalMs ?? deps.config.abortPollIntervalMs ?? 2000,
  );
  return {
    signal: abort.signal,
    async stop() {
      stopped = true;
      clearInterval(tick);
      await inflight;
    },
  };
}
