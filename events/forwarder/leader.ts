/**
 * Leader election through a `coordination.k8s.io/v1` Lease, so that of several runtimes
 * serving one cluster only one forwards events and runs stages (two at once both reconcile
 * every App, and their kapp deploys conflict).
 *
 * The algorithm is client-go's `tools/leaderelection` (what every controller-runtime manager,
 * kapp-controller's included, runs), with controller-runtime's defaults:
 *
 * - every `retryPeriodMs` (2 s; ×[1, 1.2) jitter while not leading) a candidate GETs the Lease:
 *   - none: it creates one naming itself (a 409 means another candidate was first);
 *   - held by another identity: it waits until the Lease has not changed for the holder's
 *     `leaseDurationSeconds` (15 s) **as observed on the local clock since the candidate last
 *     saw it change** (no comparison of clocks across machines: a fresh candidate always waits a
 *     full lease duration), then takes it over (`leaseTransitions + 1`);
 *   - free (`holderIdentity` empty: released), expired, or its own: it writes itself as holder
 *     with `renewTime = now`;
 *   every write is a PUT with the `resourceVersion` just read (optimistic concurrency), so of two
 *   candidates racing for the same Lease exactly one wins; the other gets 409.
 * - the leader renews every `retryPeriodMs` with one PUT on the Lease it last wrote, without
 *   reading it first (client-go v1.27+'s optimistic renewal); when that PUT fails (409 included)
 *   it reads the Lease and decides as a candidate does. It stops leading **at once** when a
 *   renewal finds another holder or its write gets 409, and when no renewal succeeded for `renewDeadlineMs` (10 s),
 *   counted from the start of the last successful one, even while a request hangs (a timer, not
 *   the request, ends the term). As `renewDeadlineMs < leaseDurationSeconds`, it has stopped
 *   before any other candidate may take over.
 * - {@link LeaderElector.stop} stops renewing and, when leading, releases the Lease
 *   (`holderIdentity: ''`, `leaseDurationSeconds: 1`, client-go's `ReleaseOnCancel`), so a
 *   waiting candidate takes over on its next try instead of after the lease duration.
 *
 * After a loss the elector keeps trying, and leads again when the Lease is free or expired.
 * Nothing is carried across terms: a new leader's forwarder starts from a list and derives
 * every due time from status (see `README.md`, "Event rules", first list after a (re)start).
 *
 * @module
 */
import { ConflictError, type Lease, type LeaseSpec, type LeaseView } from '../../functions/lib/kube/port.js';
import { type Clock, sleep, systemClock, type TimerHandle } from './clock.js';
import { type ForwarderLogger, silentLogger } from './log.js';

/** controller-runtime's `LeaseDuration` default, ms. */
export const DEFAULT_LEASE_DURATION_MS = 15_000;
/** controller-runtime's `RenewDeadline` default, ms. */
export const DEFAULT_RENEW_DEADLINE_MS = 10_000;
/** controller-runtime's `RetryPeriod` default, ms. */
export const DEFAULT_RETRY_PERIOD_MS = 2_000;
/** client-go's `JitterFactor`: a candidate waits `retryPeriod × [1, 1.2)` between tries. */
export const JITTER_FACTOR = 1.2;
/**
 * The log message of a term's start: what operators and the fault e2e tests wait for, so other
 * text (the `npm start` banner) must not contain it.
 */
export const LEASE_ACQUIRED_MESSAGE = 'leader election: acquired lease';

/** Options of {@link LeaderElector}. Times in milliseconds. */
export interface LeaderElectorOptions {
  /** Lease access of the cluster. */
  lease: LeaseView;
  /** Namespace of the Lease (it must exist). */
  namespace: string;
  /** Name of the Lease; every runtime that must not act alongside this one uses the same. */
  name: string;
  /** This candidate's identity, unique per process (e.g. `<hostname>_<random hex>`). */
  identity: string;
  /** Written as `leaseDurationSeconds` (rounded up to whole seconds). Default 15 000. */
  leaseDurationMs?: number;
  /** A leader that could not renew for this long stops leading. Default 10 000. */
  renewDeadlineMs?: number;
  /** Time between tries and renewals. Default 2 000. */
  retryPeriodMs?: number;
  /** Time and timers. Default {@link systemClock}. */
  clock?: Clock;
  /** Uniform `[0, 1)` source for the candidate jitter. Default `Math.random`. */
  random?: () => number;
  /** Logger (acquired, lost, released, failures: each distinct failure once). Default silent. */
  logger?: ForwarderLogger;
  /** Called when this candidate starts leading. Must not throw. */
  onStartedLeading?: () => void;
  /**
   * Called when it stops leading (lost, or {@link LeaderElector.stop}), before anything else
   * happens; `reason` says why. Must not throw.
   */
  onStoppedLeading?: (reason: string) => void;
}

/** Counters, for tests and metrics. */
export interface LeaderElectorStats {
  /** Terms started. */
  acquired: number;
  /** Terms ended (losses and stops). */
  lost: number;
  /** Successful renewals within a term (not counting the acquiring write). */
  renewals: number;
  /** Failed tries (API errors, timeouts, 409s), leading or not. */
  failures: number;
}

/** Options of {@link LeaderElector.stop}. */
export interface ElectorStopOptions {
  /** Release the Lease when leading. Default true. */
  release?: boolean;
}

type Attempt = { ok: true } | { ok: false; lost?: string; error?: unknown };

function iso(ms: number): string {
  // MicroTime: RFC 3339 with microseconds; Date gives milliseconds, padded.
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

class AttemptTimeout extends Error {
  constructor(ms: number) {
    super(`lease request got no answer within ${ms}ms`);
    this.name = 'AttemptTimeout';
  }
}

/** See the module comment. One elector per cluster and Lease; start once, stop once. */
export class LeaderElector {
  private readonly lease: LeaseView;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly logger: ForwarderLogger;
  private readonly leaseDurationMs: number;
  private readonly renewDeadlineMs: number;
  private readonly retryPeriodMs: number;
  private readonly where: string;
  private leading = false;
  /** Local time at which the last successful acquire/renew request was sent. */
  private renewedAt = Number.NEGATIVE_INFINITY;
  private deadline: TimerHandle | undefined;
  /** The Lease as last read or written, and when (local clock) it was last seen to change. */
  private observed: Lease | undefined;
  private observedAt = 0;
  private ac: AbortController | undefined;
  private loop: Promise<void> | undefined;
  private lastFailure: string | undefined;
  private readonly counters: LeaderElectorStats = { acquired: 0, lost: 0, renewals: 0, failures: 0 };

  /**
   * @param opts - See {@link LeaderElectorOptions}.
   * @throws RangeError unless `leaseDurationMs > renewDeadlineMs > 1.2 × retryPeriodMs > 0`
   *   (client-go's `NewLeaderElector` checks).
   */
  constructor(private readonly opts: LeaderElectorOptions) {
    this.lease = opts.lease;
    this.clock = opts.clock ?? systemClock;
    this.random = opts.random ?? Math.random;
    this.logger = opts.logger ?? silentLogger;
    this.leaseDurationMs = opts.leaseDurationMs ?? DEFAULT_LEASE_DURATION_MS;
    this.renewDeadlineMs = opts.renewDeadlineMs ?? DEFAULT_RENEW_DEADLINE_MS;
    this.retryPeriodMs = opts.retryPeriodMs ?? DEFAULT_RETRY_PERIOD_MS;
    if (!(this.retryPeriodMs > 0)) throw new RangeError('retryPeriodMs must be greater than zero');
    if (!(this.renewDeadlineMs > JITTER_FACTOR * this.retryPeriodMs)) {
      throw new RangeError('renewDeadlineMs must be greater than 1.2 × retryPeriodMs');
    }
    if (!(this.leaseDurationMs > this.renewDeadlineMs)) {
      throw new RangeError('leaseDurationMs must be greater than renewDeadlineMs');
    }
    if (!opts.identity) throw new RangeError('identity must not be empty');
    this.where = `${opts.namespace}/${opts.name}`;
  }

  /** This candidate's identity. */
  get identity(): string {
    return this.opts.identity;
  }

  /**
   * Whether this candidate leads now: it holds the Lease and renewed it less than
   * `renewDeadlineMs` ago (so the answer turns false on time even if the event loop was
   * stalled and the deadline timer has not fired yet).
   */
  isLeader(): boolean {
    return this.leading && this.clock.now() - this.renewedAt < this.renewDeadlineMs;
  }

  /** A snapshot of the counters. */
  stats(): LeaderElectorStats {
    return { ...this.counters };
  }

  /**
   * Starts trying to acquire (and then renewing) the Lease. Returns at once.
   *
   * @throws Error `leader elector already started` on a second call.
   */
  start(): void {
    if (this.ac) throw new Error('leader elector already started');
    this.ac = new AbortController();
    this.loop = this.run(this.ac.signal);
  }

  /**
   * Stops trying and renewing. When leading: calls `onStoppedLeading('stopped')`, then (unless
   * `release: false`) releases the Lease with one PUT (a failure is logged, not thrown: the
   * Lease then expires after its duration). Idempotent; resolves when the loop has ended.
   */
  async stop(options: ElectorStopOptions = {}): Promise<void> {
    if (!this.ac || this.ac.signal.aborted) {
      await this.loop;
      return;
    }
    this.ac.abort();
    await this.loop;
    if (this.leading) this.endTerm('stopped');
    // Also when a try was cut short: the Lease may name us though no term started.
    if (options.release !== false) await this.release();
  }

  private async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      const started = this.clock.now();
      let attempt: Attempt;
      try {
        attempt = await this.withTimeout(this.tryAcquireOrRenew(started), signal);
      } catch (error) {
        attempt = { ok: false, error };
      }
      if (signal.aborted) break;
      this.settle(attempt, started);
      const wait = this.leading ? this.retryPeriodMs : this.retryPeriodMs * (1 + (JITTER_FACTOR - 1) * this.random());
      await sleep(this.clock, wait, signal);
    }
  }

  /** Applies the result of one try. */
  private settle(attempt: Attempt, started: number): void {
    if (attempt.ok) {
      this.lastFailure = undefined;
      if (this.clock.now() - started >= this.renewDeadlineMs) {
        // The write landed, but too late to count: our own deadline has passed since it was sent.
        if (this.leading) this.endTerm(`renewal took longer than ${this.renewDeadlineMs}ms`);
        return;
      }
      this.renewedAt = started;
      if (this.leading) {
        this.counters.renewals++;
      } else {
        this.leading = true;
        this.counters.acquired++;
        this.logger.info({ lease: this.where, identity: this.identity }, LEASE_ACQUIRED_MESSAGE);
        this.opts.onStartedLeading?.();
      }
      this.armDeadline();
      return;
    }
    this.counters.failures++;
    if (attempt.error !== undefined) {
      const text = message(attempt.error);
      if (text !== this.lastFailure) {
        this.lastFailure = text;
        this.logger.warn({ lease: this.where, leading: this.leading, error: text }, 'leader election: try failed');
      }
    }
    if (!this.leading) return;
    if (attempt.lost) this.endTerm(attempt.lost);
    else if (attempt.error instanceof ConflictError) this.endTerm('renewal conflicted (409)');
    else if (this.clock.now() - this.renewedAt >= this.renewDeadlineMs) {
      this.endTerm(`no renewal within ${this.renewDeadlineMs}ms`);
    }
  }

  private armDeadline(): void {
    if (this.deadline !== undefined) this.clock.clearTimeout(this.deadline);
    const left = this.renewedAt + this.renewDeadlineMs - this.clock.now();
    this.deadline = this.clock.setTimeout(() => {
      this.deadline = undefined;
      if (this.leading && this.clock.now() - this.renewedAt >= this.renewDeadlineMs) {
        this.endTerm(`no renewal within ${this.renewDeadlineMs}ms`);
      }
    }, left);
  }

  private endTerm(reason: string): void {
    if (!this.leading) return;
    this.leading = false;
    this.counters.lost++;
    if (this.deadline !== undefined) this.clock.clearTimeout(this.deadline);
    this.deadline = undefined;
    this.logger.info({ lease: this.where, identity: this.identity, reason }, 'leader election: stopped leading');
    this.opts.onStoppedLeading?.(reason);
  }

  /** Bounds one try by the renew deadline (a hung request must not hold the loop forever). */
  private async withTimeout<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
    const bound = new AbortController();
    const stop = () => bound.abort();
    signal.addEventListener('abort', stop, { once: true });
    const timeout = sleep(this.clock, this.renewDeadlineMs, bound.signal).then(() => {
      throw new AttemptTimeout(this.renewDeadlineMs);
    });
    try {
      return await Promise.race([p, timeout]);
    } finally {
      bound.abort();
      signal.removeEventListener('abort', stop);
      timeout.catch(() => undefined);
      p.catch(() => undefined);
    }
  }

  /** Records what was read; the expiry clock restarts whenever the Lease changed. */
  private observe(lease: Lease): void {
    if (this.observed?.metadata.resourceVersion !== lease.metadata.resourceVersion) {
      this.observed = lease;
      this.observedAt = this.clock.now();
    }
  }

  private spec(now: number, previous: LeaseSpec | undefined, mine: boolean): LeaseSpec {
    const transitions = previous?.leaseTransitions ?? 0;
    return {
      holderIdentity: this.identity,
      leaseDurationSeconds: Math.ceil(this.leaseDurationMs / 1000),
      acquireTime: mine && previous?.acquireTime ? previous.acquireTime : iso(now),
      renewTime: iso(now),
      leaseTransitions: previous && !mine ? transitions + 1 : transitions,
    };
  }

  /** One try: client-go's `tryAcquireOrRenew`. */
  private async tryAcquireOrRenew(now: number): Promise<Attempt> {
    const { namespace, name } = this.opts;
    // client-go's optimistic renewal (v1.27+ `tryAcquireOrRenew`): while leading, write on the
    // Lease last seen, without reading it first (one request per renewal instead of two). Any
    // failure, a 409 included (someone else wrote it), falls back to the read-then-write path.
    const seen = this.observed;
    if (this.leading && seen && (seen.spec?.holderIdentity ?? '') === this.identity) {
      try {
        this.observe(
          await this.lease.updateLease(namespace, name, seen.metadata.resourceVersion, this.spec(now, seen.spec, true)),
        );
        return { ok: true };
      } catch {
        // the slow path below reads the Lease and decides
      }
    }
    const current = await this.lease.getLease(namespace, name);
    if (!current) {
      if (this.leading) return { ok: false, lost: 'lease was deleted' };
      try {
        this.observe(await this.lease.createLease(namespace, name, this.spec(now, undefined, false)));
      } catch (error) {
        if (error instanceof ConflictError) return { ok: false }; // another candidate created it first
        throw error;
      }
      return { ok: true };
    }
    this.observe(current);
    const spec = current.spec ?? {};
    const holder = spec.holderIdentity ?? '';
    const mine = holder === this.identity;
    if (holder !== '' && !mine) {
      if (this.leading) return { ok: false, lost: `lease taken by ${holder}` };
      const durationMs = (spec.leaseDurationSeconds ?? Math.ceil(this.leaseDurationMs / 1000)) * 1000;
      if (this.observedAt + durationMs > this.clock.now()) return { ok: false }; // held and not expired
    }
    const written = await this.lease.updateLease(
      namespace,
      name,
      current.metadata.resourceVersion,
      this.spec(now, spec, mine),
    );
    this.observe(written);
    return { ok: true };
  }

  /** Gives the Lease up (only if still ours, by resourceVersion). */
  private async release(): Promise<void> {
    const seen = this.observed;
    if (!seen || (seen.spec?.holderIdentity ?? '') !== this.identity) return;
    const now = this.clock.now();
    try {
      const written = await this.lease.updateLease(this.opts.namespace, this.opts.name, seen.metadata.resourceVersion, {
        holderIdentity: '',
        leaseDurationSeconds: 1,
        acquireTime: iso(now),
        renewTime: iso(now),
        leaseTransitions: seen.spec?.leaseTransitions ?? 0,
      });
      this.observe(written);
      this.logger.info({ lease: this.where, identity: this.identity }, 'leader election: released lease');
    } catch (error) {
      this.logger.warn({ lease: this.where, error: message(error) }, 'leader election: release failed');
    }
  }
}
