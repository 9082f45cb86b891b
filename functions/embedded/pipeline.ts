/**
 * The embedded runtime's in-process pipeline driver.
 *
 * {@link EmbeddedPipeline} runs the stages of one object back to back on a
 * {@link KeyedQueue}, so one object has at most one run at a time, events that arrive
 * meanwhile coalesce into one follow-up ({@link coalesceEvents}), and a crashed stage is
 * retried from that stage. Each stage runs through `dispatchWithRetryBound`: `dispatchEvent`,
 * the routing every Lambda function entry uses, with the same retry bound.
 */
import {
  EVENT_TYPES,
  type FunctionName,
  type KappEvent,
  objectRefOf,
  orderingKey,
  targetFunction,
} from '../../events/schema.js';
import { emitRefusal } from '../lib/entry/sender.js';
import { withSignal } from '../lib/exec/deadline.js';
import { coalesceEvents } from '../lib/lease/coalesce.js';
import type { DispatchDeps, RunCopy } from '../lib/pipeline/deps.js';
import { dispatchEvent } from '../lib/pipeline/dispatch.js';
import { DEFAULT_MAX_ATTEMPTS, dispatchWithRetryBound } from '../lib/pipeline/retry-bound.js';
import { carryingArtifacts } from '../lib/pipeline/run-artifacts.js';
import { KeyedQueue, type KeyedQueueOptions, RetryFrom } from './keyed-queue.js';

/** The coalescing rule, shared with the Lambda run lease (`../lib/lease/`). */
export { coalesceEvents };

/** Options of {@link EmbeddedPipeline}. */
export interface EmbeddedPipelineOptions {
  /** Objects reconciled at once. Default 4 (packaged kapp-controller's `-concurrency`). */
  concurrency?: number;
  /** First retry delay after a crash, ms. Default 500. */
  baseRetryMs?: number;
  /** Retry delay cap, ms. Default 30 000. */
  maxRetryMs?: number;
  /**
   * Attempts of a run before it ends with a final failed status (`retry-bound.ts`). Default
   * {@link DEFAULT_MAX_ATTEMPTS}.
   */
  maxAttempts?: number;
  /** Timer port of the crash retries (tests fire them by hand); default the global timers. */
  setTimer?: KeyedQueueOptions<KappEvent>['setTimer'];
  /**
   * A stage still running after this long is logged once (`stage still running`, warn) with its
   * object, function and attempt: a run that never ends holds its object (every later event of
   * it only waits), so it must be visible. Default 120 000 (2 min; a kapp deploy waiting on its
   * resources may take longer, the warning then only says so); 0 turns it off.
   */
  stallWarnMs?: number;
  /**
   * The signal a stage of cluster `clusterId` runs with, taken when the stage starts: once
   * aborted, the stage's tools are canceled (running ones killed, later ones never started).
   * The runtime gives the cluster's leadership term (`leadership.ts`), so a runtime that loses
   * a cluster's Lease stops its running kapp. Default none.
   */
  stageSignal?: (clusterId: string) => AbortSignal | undefined;
  /**
   * Whether this runtime acts for cluster `clusterId` now (leads its Lease). A stage that fails
   * while it does not is parked instead of retried: its retries could only fail the same way
   * (every view refuses), and after the retry bound the event was dropped, which lost what the
   * next term's forwarder cannot derive from status (a repository's fan-out to its
   * PackageInstalls, a poke). {@link EmbeddedPipeline.resume} re-queues the parked events of a
   * cluster when this runtime leads it again. Default: always acting (nothing is parked).
   */
  acting?: (clusterId: string) => boolean;
}

/** A stage running now, as {@link EmbeddedPipeline.inFlight} reports it. */
export interface InFlightStage {
  /** The object's ordering key (`cluster/Kind/namespace/name`). */
  object: string;
  /** The function the stage event is for (`fetch` also covers the reconcile step). */
  stage: FunctionName;
  /** Attempt of the run (1 for a fresh event). */
  attempt: number;
  /** When the stage started, ms since the epoch. */
  startedAt: number;
}

/**
 * The embedded default's transport and driver: accepts forwarder events (it implements the
 * forwarder's `Transport`) and runs each object's stages in process.
 */
export class EmbeddedPipeline {
  private readonly queue: KeyedQueue<KappEvent>;
  private readonly maxAttempts: number;
  private readonly stallWarnMs: number;
  private readonly current = new Map<string, InFlightStage>();
  private readonly stageSignal: EmbeddedPipelineOptions['stageSignal'];
  private readonly acting: EmbeddedPipelineOptions['acting'];
  /** Events parked while their cluster was not led, by ordering key (coalesced). */
  private readonly parked = new Map<string, KappEvent>();
  /**
   * While events are parked, checks every second whether their cluster is led again: a term
   * that only missed its renewal deadline and then renewed (no new term, so no
   * {@link resume} call) leads again without starting over.
   */
  private parkCheck: ReturnType<typeof setInterval> | undefined;
  private closed = false;

  constructor(
    private readonly deps: DispatchDeps,
    opts: EmbeddedPipelineOptions = {},
  ) {
    this.maxAttempts = opts.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    this.stallWarnMs = opts.stallWarnMs ?? 120_000;
    this.stageSignal = opts.stageSignal;
    this.acting = opts.acting;
    this.queue = new KeyedQueue<KappEvent>((key, item, attempt) => this.run(key, item, attempt), {
      concurrency: opts.concurrency ?? 4,
      baseRetryMs: opts.baseRetryMs,
      maxRetryMs: opts.maxRetryMs,
      ...(opts.setTimer ? { setTimer: opts.setTimer } : {}),
      coalesce: coalesceEvents,
      onError: (key, err, attempt) =>
        deps.log.error(
          { object: key, attempt, error: err instanceof Error ? err.message : String(err) },
          'stage crashed; retrying',
        ),
    });
  }

  /**
   * Accepts a batch of events (the forwarder's `Transport.send`). Never rejects. An App's health
   * event waits under a key of its own (`<ordering key>#health`): coalesced with the App's object
   * events, one would replace the other, and neither may be lost (its status write is fenced and
   * checks that no reconcile runs, so it needs no turn among the App's runs).
   */
  async send(events: readonly KappEvent[]): Promise<void> {
    for (const e of events) {
      const key = orderingKey(objectRefOf(e));
      this.queue.add(e.type === EVENT_TYPES.health ? `${key}#health` : key, e);
    }
  }

  /**
   * Re-queues the events parked for cluster `clusterId` ({@link EmbeddedPipelineOptions.acting}),
   * each joining any newer event of its object by the usual coalescing. Call when this runtime
   * starts leading the cluster.
   */
  resume(clusterId: string): void {
    for (const [key, ev] of [...this.parked]) {
      if (objectRefOf(ev).clusterId !== clusterId) continue;
      this.parked.delete(key);
      this.queue.add(key, ev);
    }
    if (this.parked.size === 0 && this.parkCheck !== undefined) {
      clearInterval(this.parkCheck);
      this.parkCheck = undefined;
    }
  }

  private park(key: string, ev: KappEvent): void {
    const earlier = this.parked.get(key);
    this.parked.set(key, earlier ? coalesceEvents(earlier, ev) : ev);
    if (this.parkCheck !== undefined || this.closed) return;
    this.parkCheck = setInterval(() => {
      const clusters = new Set([...this.parked.values()].map((e) => objectRefOf(e).clusterId));
      for (const c of clusters) if (this.acting?.(c)) this.resume(c);
    }, 1000);
    this.parkCheck.unref();
  }

  /** Events parked now, waiting for their cluster's leadership. */
  get parkedCount(): number {
    return this.parked.size;
  }

  /** Resolves when no object runs or waits (crash retries included). */
  async idle(): Promise<void> {
    await this.queue.idle();
  }

  /** Stops accepting events; running stages finish. */
  close(): void {
    this.closed = true;
    if (this.parkCheck !== undefined) clearInterval(this.parkCheck);
    this.parkCheck = undefined;
    this.queue.close();
  }

  /** Objects running now and waiting. */
  get stats(): { running: number; waiting: number } {
    return { running: this.queue.running, waiting: this.queue.waiting };
  }

  /** The stages running now, oldest first (what a stuck object is doing). */
  inFlight(): InFlightStage[] {
    return [...this.current.values()].sort((a, b) => a.startedAt - b.startedAt);
  }

  /**
   * The deps a run gets: the queue runs one event per object at a time and every stage of a run
   * before the next, so `oneRunPerObject` holds (read per run: the runtime sets `deps.emit` after
   * construction), and the run's {@link RunCopy}, whose artifacts answer the run's store reads of
   * what it stored (`carryingArtifacts`). With a `signal` ({@link EmbeddedPipelineOptions.stageSignal}), every tool of
   * the stage is canceled once it aborts.
   */
  private runDeps(signal: AbortSignal | undefined, runCopy: RunCopy): DispatchDeps {
    return {
      ...this.deps,
      ...(signal ? { runner: withSignal(this.deps.runner, signal) } : {}),
      config: { ...this.deps.config, oneRunPerObject: true },
      runCopy,
      ...(runCopy.artifacts ? { store: carryingArtifacts(this.deps.store, runCopy.artifacts) } : {}),
    };
  }

  private async run(key: string, first: KappEvent, attempt: number): Promise<void> {
    let ev: KappEvent | undefined = first;
    // The run's stages hand the object on in process: a later stage reads it again only when
    // an event about it arrived meanwhile (see `RunCopy`).
    // Its artifacts too: the next stage reads no tarball or manifest back from the store.
    const runCopy: RunCopy = { superseded: () => this.queue.hasPending(key), artifacts: new Map() };
    try {
      while (ev) {
        const current: KappEvent = ev;
        const stage: InFlightStage = { object: key, stage: targetFunction(current), attempt, startedAt: Date.now() };
        this.current.set(key, stage);
        const stall =
          this.stallWarnMs > 0
            ? setTimeout(() => this.deps.log.warn({ ...stage }, 'stage still running'), this.stallWarnMs)
            : undefined;
        stall?.unref();
        try {
          const deps = this.runDeps(this.stageSignal?.(objectRefOf(current).clusterId), runCopy);
          ev = (
            await dispatchWithRetryBound(
              current,
              deps,
              { attempt, maxAttempts: this.maxAttempts },
              { dispatch: dispatchEvent },
            )
          ).next;
          // The hand-off must be one the stage's function sends in the cloud mode (the sender
          // table, `../lib/entry/sender.ts`): the e2e suite then catches a stage and the table
          // drifting apart, which the cloud functions would refuse (`sendingAs`).
          const refusal = ev ? emitRefusal(stage.stage, ev) : undefined;
          if (refusal !== undefined) throw new Error(refusal);
        } catch (err) {
          const clusterId = objectRefOf(current).clusterId;
          if (this.acting && !this.acting(clusterId)) {
            this.park(key, current);
            this.deps.log.warn(
              { object: key, stage: stage.stage, error: err instanceof Error ? err.message : String(err) },
              'stage parked: this runtime does not lead the cluster; it runs again when it does',
            );
            return;
          }
          throw new RetryFrom(current, err);
        } finally {
          clearTimeout(stall);
        }
      }
    } finally {
      this.current.delete(key);
    }
  }
}
