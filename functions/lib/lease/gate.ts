/**
 * The run lease around one record of a stage function ({@link RunGate}): the choreography the
 * SQS handler (`../entry/stage-handler.ts`) runs each App event through, beside the leases
 * themselves (`./run-leases.ts`). The protocol, step by step: `docs/lambda-runtime.md`.
 *
 * The ports of a stage of an optimistic run (`OptimisticRun`) are gated ({@link gatedPorts}):
 * the stage's code is unchanged, its writes are gated where they leave the process. Any tool
 * run, object-store write or finalizer change first claims the run lease; a status write of a
 * run that claimed nothing first checks the lease and is never re-planned on a 409 (see
 * `OptimisticRun`). Reads, Events and token requests pass as they are: they change no state
 * another run depends on.
 *
 * @module
 */
import { EVENT_TYPES, type KappEvent, targetFunction } from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { CommandRunner } from '../exec/runner.js';
import { type ClusterRegistry, ConflictError, type DeployView, type FetchView, type KubeObject } from '../kube/port.js';
import { errorText, type Logger } from '../log.js';
import type { ObjectStore } from '../store/port.js';
import type { EventSender } from '../transport/port.js';
import {
  type AcquireResult,
  fencedRestartOf,
  type HeldLease,
  leaseSubject,
  type OptimisticRun,
  type RunLeases,
} from './run-leases.js';

/** Object-store methods that write. */
const STORE_WRITES = new Set(['put', 'putIfAbsent', 'putIfMatch', 'delete']);
/** Cluster-view methods that write the object a run works for, besides its status. */
const VIEW_WRITES = new Set(['addFinalizer', 'removeFinalizer']);

/**
 * `target` with the methods named in `names` awaiting `before()` first, unless `exempt` says the
 * call changes nothing.
 */
function gateMethods<T extends object>(
  target: T,
  names: Set<string>,
  before: () => Promise<void>,
  exempt: (method: string, args: unknown[]) => boolean = () => false,
): T {
  return new Proxy(target, {
    get(t, prop) {
      const value = Reflect.get(t, prop, t) as unknown;
      if (typeof value !== 'function') return value;
      if (typeof prop !== 'string' || !names.has(prop)) return value.bind(t);
      return async (...args: unknown[]) => {
        if (!exempt(prop, args)) await before();
        return (await value.apply(t, args)) as unknown;
      };
    },
  });
}

/**
 * A finalizer change the view makes no request for: the caller passes the object as it holds it
 * (`FinalizerOptions.object`) and the finalizer is already on it (add) or not on it (remove).
 */
function finalizerUnchanged(method: string, args: unknown[]): boolean {
  const [, finalizer, options] = args as [unknown, string, { object?: KubeObject } | undefined];
  const on = options?.object?.metadata.finalizers?.includes(finalizer);
  return on === undefined ? false : method === 'addFinalizer' ? on : !on;
}

/** A cluster view whose writes are gated, and whose status writes follow the optimistic rule. */
function gateView<V extends FetchView | DeployView>(view: V, run: OptimisticRun, claim: () => Promise<void>): V {
  const gated = gateMethods(view, VIEW_WRITES, claim, finalizerUnchanged);
  return new Proxy(gated, {
    get(t, prop) {
      if (prop !== 'updateStatus') return Reflect.get(t, prop, t) as unknown;
      return async (...args: Parameters<FetchView['updateStatus']>) => {
        if (run.held) return await view.updateStatus(...args);
        await run.verify();
        // verify() may take the lease back (the run's own earlier attempt freed it): hold it
        // through the gate, so it is renewed and end()/abandon() release it, instead of leaving
        // it held by a finished run until it expires with the App's next change parked behind it.
        if (run.held) await claim();
        try {
          return await view.updateStatus(...args);
        } catch (err) {
          // Planned on the App as read before the check: a 409 means somebody wrote it since.
          if (err instanceof ConflictError && !run.held) run.conflict();
          throw err;
        }
      };
    },
  });
}

/** The ports a stage writes through, the ones {@link gatedPorts} gates (`PipelineDeps` has them). */
export interface WritingPorts {
  /** The clusters: their fetch and deploy views' finalizer changes and status writes are gated. */
  clusters: ClusterRegistry;
  /** The object store: its writes are gated. */
  store: ObjectStore;
  /** The command runner: every tool run is gated. */
  runner: CommandRunner;
}

/**
 * The stage's ports for an optimistic run.
 *
 * @param claim - claims the lease (`OptimisticRun.claim`, plus the gate's renewals);
 *   rejects with `LeaseContendedError` when the run must stop.
 * @returns `deps` with `clusters`, `store` and `runner` gated, every other field as it was.
 */
export function gatedPorts<D extends WritingPorts>(deps: D, run: OptimisticRun, claim: () => Promise<void>): D {
  const clusters: ClusterRegistry = new Proxy(deps.clusters, {
    get(t, prop) {
      const value = Reflect.get(t, prop, t) as unknown;
      if (prop === 'fetchView' || prop === 'deployView') {
        return (id: string) => gateView((value as (id: string) => FetchView).call(t, id), run, claim);
      }
      return typeof value === 'function' ? value.bind(t) : value;
    },
  });
  return {
    ...deps,
    clusters,
    store: gateMethods(deps.store, STORE_WRITES, claim),
    runner: gateMethods(deps.runner, new Set(['run']), claim),
  };
}

/**
 * What a record comes to when its gate, not its stage, decides it (logged as `outcome`, a part of
 * the stage handler's `RecordOutcome`): `coalesced` (another run holds the lease, or an optimistic
 * run stopped for one), `fenced` (its run's lease moved past it), `failed` (the restart that
 * either sends could not be queued; the record is retried).
 */
export type GateOutcome = 'coalesced' | 'fenced' | 'failed';

/**
 * One infrastructure step of the run: the retry bound's `infraStep` (`pipeline/retry-bound.ts`,
 * which the handler loads on its first record), so that a failing lease or send step fails the
 * record as `<action> failed` with the port's error as cause, as any step of a stage.
 */
export type InfraStep = <T>(action: string, step: () => Promise<T>) => Promise<T>;

/** What a {@link RunGate} works with: one record's. */
export interface RunGateOptions {
  /** The run leases of the function; absent: no lease (every record runs as it came). */
  leases?: RunLeases | undefined;
  /** Where hand-offs, follow-ups and restarts go (the function's checked sender). */
  sender: EventSender;
  /** The clock that dates restart events (`PipelineDeps.now`). */
  now: () => Date;
  /** Wraps each lease and send step: see {@link InfraStep}. */
  step: InfraStep;
  /** The function the record runs in (logged as `stage`). */
  stage: PipelineStage;
  /** The record's logger (its subject and event id bound); the lease renewals log here too. */
  log: Logger;
}

/**
 * The run lease around one record: {@link RunGate.begin} takes (or reads) the lease before the
 * stage runs, {@link ports} gates an optimistic run's writes, {@link guard} and {@link forward}
 * wrap the stage and its hand-off for the retry bound, and after the stage {@link restart},
 * {@link end} or {@link abandon} settle the lease; {@link close} stops the renewals. Without
 * leases (or for an event that takes none, `leaseSubject`) every step passes the record through.
 */
export class RunGate {
  readonly #opts: RunGateOptions;
  readonly #optimistic: OptimisticRun | undefined;
  #lease: HeldLease | undefined;
  #stopRenewing: (() => void) | undefined;
  /**
   * The claim of an optimistic run in flight (or done), shared by every gated write that needs
   * it: two writes at once must not each claim and each start renewing ({@link #claim}).
   */
  #claiming: Promise<void> | undefined;
  /** {@link close} was called: a claim landing after it starts no renewal. */
  #closed = false;

  private constructor(
    /** The event the stage runs: the one received, or the object event it was coalesced with. */
    readonly event: KappEvent,
    opts: RunGateOptions,
    optimistic?: OptimisticRun,
  ) {
    this.#opts = opts;
    this.#optimistic = optimistic;
  }

  /**
   * Opens the gate for `event`: a resync that finds the lease free runs optimistic (holding no
   * lease); any other App event takes the lease (renewed until {@link close}), or is coalesced
   * into the holder's follow-up, or is fenced (its run's lease moved past it: the App runs again
   * from the start, `fencedRestartOf`).
   *
   * @returns the gate to run the stage through, or the record's outcome when the stage must not
   *   run (`coalesced` and `fenced` logged here; `failed` when a fenced event's restart could not
   *   be queued, logged, the record retried).
   * @throws InfraError (from `opts.step`) when the lease cannot be read or taken.
   */
  static async begin(event: KappEvent, opts: RunGateOptions): Promise<RunGate | GateOutcome> {
    const { leases, step, stage, log } = opts;
    if (!leases || !leaseSubject(event)) return new RunGate(event, opts);
    const optimistic = await step('reading the run lease', () => leases.start(event));
    if (optimistic) return new RunGate(event, opts, optimistic);
    const got = await step('taking the run lease', () => leases.acquire(event));
    if (got.kind === 'coalesced') {
      log.info(
        { stage, outcome: 'coalesced' satisfies GateOutcome, type: event.type, holder: got.holder },
        'another run of this object holds its lease; coalesced into its follow-up',
      );
      return 'coalesced';
    }
    if (got.kind === 'fenced') return await dropFenced(event, got, opts);
    if (got.tookOver) log.warn({ stage, lease: got.lease.key }, 'run lease had expired; taken over');
    const gate = new RunGate(got.event, opts);
    gate.#hold(got.lease);
    return gate;
  }

  /** The stage's ports: gated ({@link gatedPorts}) for an optimistic run, else `deps` itself. */
  ports<D extends WritingPorts>(deps: D): D {
    const run = this.#optimistic;
    return run ? gatedPorts(deps, run, () => this.#claim()) : deps;
  }

  /**
   * `dispatch` for the retry bound: an optimistic run that had to stop is no failure and hands
   * nothing on (what its stage threw, or returned, is dropped; {@link restart} settles it).
   */
  guard<D>(
    dispatch: (event: KappEvent, deps: D) => Promise<KappEvent | undefined>,
  ): (event: KappEvent, deps: D) => Promise<KappEvent | undefined> {
    return async (e, deps) => {
      let next: KappEvent | undefined;
      try {
        next = await dispatch(e, deps);
      } catch (err) {
        if (this.#optimistic?.stopped) return undefined;
        throw err;
      }
      return this.#optimistic?.stopped ? undefined : next;
    };
  }

  /**
   * Hands `next` on to its function's queue: a run holding the lease passes it to `next` first
   * (`HeldLease.handOff`); an optimistic run passes on the lease version it started from
   * (`run.lease`) with a template or deploy hand-off, and claims the lease before any other (the
   * delete path is real work).
   * @throws InfraError when the claim, the hand-off or the send fails (`LeaseContendedError` as
   *   its cause when the optimistic run must stop).
   */
  async forward(next: KappEvent): Promise<void> {
    const { step, sender } = this.#opts;
    const to = targetFunction(next);
    // An optimistic run goes on without the lease while it only reads; any other hand-off
    // (the delete path) is real work.
    if (this.#optimistic && !this.#lease && !carriesRunLease(next)) await this.#claim();
    const sent = withRunLease(next, this.#lease ? undefined : this.#optimistic?.seen);
    // The run keeps its lease: passed to the next stage's event before that is sent.
    const held = this.#lease;
    if (held) await step('passing the run lease on', () => held.handOff(sent));
    await step(`queueing the ${to} stage`, () => sender.send(to, sent));
  }

  /**
   * Ends an optimistic run that had to stop (another run of its App started meanwhile): the
   * record is acknowledged, and the App runs again from the start through the lease, as any
   * object event (`OptimisticRun.restartEvent`: coalesced into the holder's follow-up, or sent to
   * the fetch function with the lease reserved for it). Nothing is restarted when the event
   * itself is the lease's follow-up already.
   *
   * @returns `undefined` when the run did not stop (nothing done); else `coalesced`, or `failed`
   *   when the lease or the send failed (logged; the record is retried, stops again and sends the
   *   same restart). Never throws.
   */
  async restart(): Promise<'coalesced' | 'failed' | undefined> {
    const run = this.#optimistic;
    if (!run?.stopped) return undefined;
    const { stage, log } = this.#opts;
    try {
      if (run.stopped === 'restart') await restartThroughLease(run.restartEvent(this.#opts.now()), this.#opts);
    } catch (err) {
      log.error(
        { stage, outcome: 'failed' satisfies GateOutcome, type: run.event.type, error: errorText(err) },
        'optimistic run stopped, but its restart could not be queued; will be retried',
      );
      return 'failed';
    }
    log.info(
      { stage, outcome: 'coalesced' satisfies GateOutcome, type: run.event.type, restarted: run.stopped === 'restart' },
      'another run of this object started while this one held no lease; it runs again after it',
    );
    return 'coalesced';
  }

  /**
   * Ends the run here (its stage handed nothing on): ends the lease it holds, if any, and sends
   * the follow-up coalesced meanwhile. The lease is let go first, so an {@link abandon} after a
   * failure here does not end it twice.
   * @throws InfraError when the lease or the send fails (the record is retried; a follow-up not
   *   sent runs once the lease reserved for it expires and the next event takes it over).
   */
  async end(): Promise<void> {
    const held = this.#lease;
    if (!held) return;
    this.#lease = undefined;
    await endRun(held, this.#opts);
  }

  /**
   * After a failed stage: a failed stage does not hold its App, so the lease it holds (if any) is
   * ended and the follow-up (if any) runs now, the retry after it (the embedded runtime's rule: a
   * newer event replaces a run waiting for its retry). Never throws: a lease not ended is logged
   * and expires.
   */
  async abandon(): Promise<void> {
    const held = this.#lease;
    if (!held) return;
    const { stage, log } = this.#opts;
    await endRun(held, this.#opts).catch((endErr: unknown) =>
      log.warn({ stage, error: errorText(endErr) }, 'run lease not ended; it expires'),
    );
  }

  /**
   * Stops renewing the lease (call once the record is done, whatever its outcome). A claim still
   * in flight (a gated write the stage left running) starts no renewal when it lands: its lease
   * expires.
   */
  close(): void {
    this.#closed = true;
    this.#stopRenewing?.();
    this.#stopRenewing = undefined;
  }

  /** Holds `lease` from now on, renewed until {@link close} (not at all once closed). */
  #hold(lease: HeldLease): void {
    this.#lease = lease;
    if (this.#closed) {
      this.#opts.log.warn(
        { stage: this.#opts.stage, lease: lease.key },
        'run lease claimed after the record was done (a write left running); not renewed, it expires',
      );
      return;
    }
    this.#stopRenewing = lease.keepAlive(this.#opts.log);
  }

  /**
   * Claims the lease of an optimistic run before its first real work ({@link gatedPorts}). One
   * claim at a time: gated writes at the same moment (a stage's `Promise.all`) share it, so the
   * lease is claimed and renewed once; a claim that failed is forgotten, the next write claims
   * again (as `OptimisticRun.claim` refuses a stopped run, that one rejects at once).
   */
  #claim(): Promise<void> {
    const run = this.#optimistic;
    if (!run || this.#lease) return Promise.resolve();
    this.#claiming ??= this.#opts
      .step('taking the run lease', () => run.claim())
      .then(
        (lease) => this.#hold(lease),
        (err: unknown) => {
          this.#claiming = undefined;
          throw err;
        },
      );
    return this.#claiming;
  }
}

/** Whether an optimistic run may pass `next` on without the lease: a template or deploy hand-off. */
function carriesRunLease(next: KappEvent): boolean {
  return next.type === EVENT_TYPES.template || next.type === EVENT_TYPES.deploy;
}

/**
 * `next` with `run.lease` set to `seen` (an optimistic run's hand-off), or without it (`seen`
 * undefined: a run holding the lease, whose next stage takes it as before).
 */
function withRunLease(next: KappEvent, seen: string | undefined): KappEvent {
  if (!carriesRunLease(next) || !('run' in next.data)) return next;
  const { lease: _dropped, ...run } = next.data.run;
  return { ...next, data: { ...next.data, run: seen === undefined ? run : { ...run, lease: seen } } } as KappEvent;
}

/**
 * Sends `again`, an object event that runs the App from the start, through the lease as any
 * object event: coalesced into the holder's follow-up, or (the lease free or expired) sent to the
 * fetch function with the lease taken for it.
 * @throws InfraError when the lease or the send fails.
 */
async function restartThroughLease(again: KappEvent, opts: RunGateOptions): Promise<void> {
  const { step, sender } = opts;
  const leases = opts.leases as RunLeases;
  const got = await step('taking the run lease', () => leases.acquire(again));
  if (got.kind !== 'acquired') return;
  const next = got.event;
  await step('passing the run lease on', () => got.lease.handOff(next));
  const to = targetFunction(next);
  await step(`queueing the ${to} stage`, () => sender.send(to, next));
}

/**
 * Drops a stage event whose run's lease moved past it (`fenced`): its stage does not run, and the
 * App runs again from the start ({@link restartThroughLease} of `fencedRestartOf`).
 *
 * @returns `fenced`; `failed` when the restart could not be queued (logged; the record is retried,
 *   is fenced again and sends the same restart). Never throws.
 */
async function dropFenced(
  event: KappEvent,
  got: Extract<AcquireResult, { kind: 'fenced' }>,
  opts: RunGateOptions,
): Promise<GateOutcome> {
  const { stage, log } = opts;
  const restart = fencedRestartOf(event, opts.now());
  try {
    await restartThroughLease(restart, opts);
  } catch (err) {
    log.error(
      { stage, outcome: 'failed' satisfies GateOutcome, type: event.type, error: errorText(err) },
      "stage event of a run that lost its lease dropped, but the App's restart could not be queued; will be retried",
    );
    return 'failed';
  }
  log.warn(
    {
      stage,
      outcome: 'fenced' satisfies GateOutcome,
      type: event.type,
      ...(got.holder ? { holder: got.holder } : {}),
      ...(got.last ? { last: got.last } : {}),
      restartId: restart.id,
    },
    'run lease moved past this run (another run took it); stage not run, the App runs again from the start',
  );
  return 'fenced';
}

/**
 * Ends a run's lease and sends the follow-up coalesced meanwhile, if any.
 * @throws InfraError when the lease or the send fails.
 */
async function endRun(lease: HeldLease, opts: RunGateOptions): Promise<void> {
  const { step, sender, log } = opts;
  const followUp = await step('ending the run lease', () => lease.end());
  if (!followUp) return;
  const to = targetFunction(followUp);
  await step(`queueing the ${to} follow-up`, () => sender.send(to, followUp));
  log.info({ to, type: followUp.type, followUpId: followUp.id }, 'run ended; coalesced follow-up queued');
}
