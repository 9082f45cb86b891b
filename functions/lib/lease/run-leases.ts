/**
 * The run lease of an App on Lambda: at most one run per App across the fetch, template and
 * deploy functions, and the events that arrive meanwhile coalesced into one follow-up. The
 * embedded runtime gets the same from its in-process `KeyedQueue` (kapp-controller's
 * `UniqueReconciler`); on Lambda each stage is its own function with its own FIFO queue, which
 * orders one object's events per queue only, so a new generation's fetch could otherwise run
 * while the same App's deploy still runs kapp.
 *
 * The lease is one small JSON object per App in the artifact bucket,
 * `state/leases/<cluster>/<namespace>/<name>.json` ({@link leaseKey}), changed only by
 * compare-and-swap (`ObjectStore.putIfMatch`: S3 `If-Match`/`If-None-Match`):
 * `{ holder?, expiresAt?, pending? }`.
 *
 * - `holder`: who runs the App now ({@link holderOf}): `run:<runId>` for a stage event of a run,
 *   `event:<id>` for the object event that may start one. A run keeps the lease across its
 *   stages: a hand-off passes it to the next stage's event before that event is sent
 *   ({@link HeldLease.handOff}), and the deploy's own continuation is the same run.
 * - `expiresAt`: the lease is renewed while a stage runs ({@link HeldLease.keepAlive}) and
 *   given {@link DEFAULT_LEASE_TTL_MS} on each hand-off that changes the holder or finds less than
 *   half of it left; a crashed holder's lease expires and the next event takes it over.
 *
 * Object-store requests (each change a read and a conditional write; a change that would write
 * the lease as it is skips the write): a run that works reads the lease 6 times and writes it 3
 * times (the object event's acquire, the hand-off from the object event to the run, the end); the
 * run's own hand-off and acquire of template and deploy only read it while the claim is fresh. An
 * idle resync writes nothing: it runs optimistic ({@link OptimisticRun}: the lease read once by
 * fetch and once before deploy's final status write) and takes the lease only when a stage must
 * work. `idleRunLeaseRequests` and `workingRunLeaseRequests` (`bench/lease-counters.ts`) count
 * them by running this code.
 * - `pending`: an object event that found the lease held by another run: acknowledged without
 *   running, coalesced into this one follow-up (`coalesceEvents`, the embedded runtime's rule), and
 *   sent when the run ends ({@link HeldLease.end}), with the lease reserved for it.
 * - the fence: a run's stage event (a hand-off, or an SQS retry of one after a crash) acts only
 *   while its run still has the lease: `holder` is its `run:<runId>` (live, or expired with nobody
 *   come since: the retry of a crashed stage goes on), or the lease is free and its run was the
 *   last to free it (the retry of a stage that failed and ended its run). Once the lease moved
 *   past the run (another holder, live or expired, a reservation for a follow-up, or freed last by
 *   another run) the event is {@link AcquireResult} `fenced` ({@link movedPast}): it does nothing
 *   and the App runs again from the start ({@link fencedRestartOf}). Without it, a crashed deploy's
 *   retry arriving after its lease expired and a newer run of the same generation deployed (the
 *   visibility timeout is longer than the TTL) deployed its older manifest over the newer one.
 *
 * Only App events take the lease (object events of Apps, template, deploy and delete hand-offs):
 * a PackageRepository or PackageInstall runs in one function only, where its FIFO group already
 * orders its events.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import {
  EVENT_TYPES,
  type KappEvent,
  type ObjectIdentity,
  objectEvent,
  objectRefOf,
  parseEvent,
  serializeEvent,
} from '../../../events/schema.js';
import type { Logger } from '../log.js';
import type { ObjectStore } from '../store/port.js';
import { coalesceEvents } from './coalesce.js';

/**
 * How long a lease lasts without renewal, ms: 5 minutes. Long enough for a hand-off to wait in
 * the next stage's queue (the lease is given this much at each hand-off), short enough that a
 * crashed holder blocks its App's changes for minutes, not for the queue's visibility timeout.
 */
export const DEFAULT_LEASE_TTL_MS = 5 * 60_000;

/** Where the leases live in the artifact bucket. */
export const LEASE_PREFIX = 'state/leases/';

/** The version an {@link OptimisticRun} carries when its App had no lease object at all. */
export const ABSENT_LEASE = 'absent';

/** Compare-and-swap attempts of one lease change before it gives up (conflicts are rare: one App's events). */
const CAS_ATTEMPTS = 20;

/** A lease as stored. */
export interface LeaseRecord {
  /** Who runs the App ({@link holderOf}); absent: nobody. */
  holder?: string;
  /** RFC 3339 time the holder's claim ends unless renewed. */
  expiresAt?: string;
  /** The one follow-up, sent when the holder's run ends. */
  pending?: KappEvent;
  /**
   * Write counter: every write sets it one higher, so every write changes the body and its ETag
   * (an S3 ETag is the body's MD5: without it a lease freed again would look untouched to an
   * {@link OptimisticRun}).
   */
  seq?: number;
  /** Who ended the last run that freed the lease ({@link HeldLease.end} with nothing pending). */
  last?: string;
}

/** The App an event is about when it takes the run lease; `undefined` for every other event. */
export function leaseSubject(event: KappEvent): ObjectIdentity | undefined {
  switch (event.type) {
    case EVENT_TYPES.object:
      return event.data.kind === 'App' ? event.data : undefined;
    case EVENT_TYPES.template:
    case EVENT_TYPES.deploy:
    case EVENT_TYPES.delete:
      return objectRefOf(event);
    default:
      return undefined;
  }
}

/** The lease's key: `state/leases/<cluster>/<namespace>/<name>.json` (every part a DNS name). */
export function leaseKey(ref: ObjectIdentity): string {
  return `${LEASE_PREFIX}${ref.clusterId}/${ref.namespace}/${ref.name}.json`;
}

/**
 * Who an event runs as: `run:<runId>` for a stage event (every stage of a run), `event:<id>` for
 * an object event (and a health event, which takes no lease).
 */
export function holderOf(event: KappEvent): string {
  return event.type === EVENT_TYPES.object || event.type === EVENT_TYPES.health
    ? `event:${event.id}`
    : `run:${event.data.run.runId}`;
}

/**
 * Reads a stored lease. A record that is not a lease (or whose `pending` is not a valid event) reads
 * as free: it is replaced by the next write under its version, and an invalid pending event is
 * dropped (it could never be processed).
 */
export function parseLease(body: Buffer | undefined): LeaseRecord {
  if (!body) return {};
  let raw: unknown;
  try {
    raw = JSON.parse(body.toString('utf8'));
  } catch {
    return {};
  }
  if (typeof raw !== 'object' || raw === null) return {};
  const r = raw as Record<string, unknown>;
  const out: LeaseRecord = {};
  if (typeof r.holder === 'string' && typeof r.expiresAt === 'string' && !Number.isNaN(Date.parse(r.expiresAt))) {
    out.holder = r.holder;
    out.expiresAt = r.expiresAt;
  }
  if (r.pending !== undefined) {
    const p = parseEvent(r.pending);
    if (p.ok) out.pending = p.event;
  }
  if (typeof r.seq === 'number' && Number.isSafeInteger(r.seq) && r.seq >= 0) out.seq = r.seq;
  if (typeof r.last === 'string') out.last = r.last;
  return out;
}

function serializeLease(rec: LeaseRecord): string {
  // The pending event is stored as its validated body (bounded by the event size limit).
  return JSON.stringify({
    ...(rec.holder ? { holder: rec.holder, expiresAt: rec.expiresAt } : {}),
    ...(rec.pending ? { pending: JSON.parse(serializeEvent(rec.pending)) } : {}),
    ...(rec.seq !== undefined ? { seq: rec.seq } : {}),
    ...(rec.last !== undefined ? { last: rec.last } : {}),
  });
}

/** Options of {@link RunLeases}. */
export interface RunLeasesOptions {
  /** Where leases live: the artifact bucket. */
  store: ObjectStore;
  /** Default `() => new Date()`. */
  now?: () => Date;
  /** Default {@link DEFAULT_LEASE_TTL_MS}. */
  ttlMs?: number;
}

/** What {@link RunLeases.acquire} decided. */
export type AcquireResult =
  | {
      kind: 'acquired';
      /**
       * The event to run: the one received, or for an object event the one coalesced with a
       * pending object event it supersedes (a stronger pending reason is kept).
       */
      event: KappEvent;
      /** The lease held; end it with {@link HeldLease.handOff} or {@link HeldLease.end}. */
      lease: HeldLease;
      /** The previous holder's claim had expired (it crashed or its hand-off waited too long). */
      tookOver: boolean;
    }
  | {
      kind: 'coalesced';
      /** Who holds the lease. */
      holder: string;
    }
  | {
      /**
       * A stage event whose run no longer has the lease ({@link movedPast}): it must not run.
       * Nothing was written.
       */
      kind: 'fenced';
      /** Who holds the lease now (live or expired); absent: nobody. */
      holder?: string;
      /** Who freed it last, when it is free. */
      last?: string;
    };

/**
 * Whether the lease moved past `holder` (a run's `run:<runId>`, {@link holderOf}), which held it
 * at some point: anyone else holds it or held it since (another holder, live or expired; a free
 * lease with a follow-up waiting; a free lease another holder freed last). A free lease `holder`
 * itself freed last, or one with no trace of anybody (no lease object), has not moved.
 */
export function movedPast(rec: LeaseRecord, holder: string): boolean {
  if (rec.holder !== undefined) return rec.holder !== holder;
  return rec.pending !== undefined || (rec.last !== undefined && rec.last !== holder);
}

/** The run leases of the Apps of a fleet, in one object store. */
export class RunLeases {
  readonly #store: ObjectStore;
  readonly #now: () => Date;
  readonly ttlMs: number;

  constructor(opts: RunLeasesOptions) {
    this.#store = opts.store;
    this.#now = opts.now ?? (() => new Date());
    this.ttlMs = opts.ttlMs ?? DEFAULT_LEASE_TTL_MS;
  }

  /** `expiresAt` of a claim made now. */
  expiry(): string {
    return new Date(this.#now().getTime() + this.ttlMs).toISOString();
  }

  /**
   * Whether `rec`'s claim has at least half the TTL left: a holder that finds its own claim so
   * fresh does not write it again ({@link acquire} of a hand-off, {@link HeldLease.handOff} to the
   * same run). A stage renews its claim every third of the TTL while it runs
   * ({@link HeldLease.keepAlive}), well before half a TTL is gone, so the claim never lapses
   * while the stage runs; a hand-off waiting in the next queue has at least half a TTL.
   */
  isFresh(rec: LeaseRecord): boolean {
    return Date.parse(rec.expiresAt ?? '') - this.#now().getTime() >= this.ttlMs / 2;
  }

  /** Whether `rec` is held by someone whose claim has not expired. */
  isLive(rec: LeaseRecord): boolean {
    return rec.holder !== undefined && Date.parse(rec.expiresAt ?? '') > this.#now().getTime();
  }

  /**
   * Takes the lease for `event`'s run, coalesces `event` into the lease's pending follow-up, or
   * fences it.
   *
   * A stage event (template, deploy, delete: a run that had the lease) takes it only while it is
   * still its run's ({@link holderOf}), expired or not, or free with nobody else since
   * ({@link movedPast}); it leaves a pending follow-up where it is (it runs after this run).
   * Otherwise it is `fenced`: it must not run, and nothing is written (see the module comment).
   *
   * An object event takes the lease when it is free, already the event's (the follow-up it was
   * reserved for), or expired, and absorbs a pending follow-up (it starts a run from the latest
   * object itself); otherwise it becomes (or merges into) the pending follow-up and must be
   * acknowledged without running.
   *
   * @param event - an event with a {@link leaseSubject}.
   * @throws StoreError when the store fails; Error after {@link CAS_ATTEMPTS} conflicts in a row.
   */
  async acquire(event: KappEvent): Promise<AcquireResult> {
    const subject = leaseSubject(event);
    if (!subject) throw new Error(`event ${event.type} takes no run lease`);
    const key = leaseKey(subject);
    const me = holderOf(event);
    return this.update<AcquireResult>(key, (rec) => {
      const mine = rec.holder === me;
      if (event.type !== EVENT_TYPES.object && movedPast(rec, me)) {
        const { holder, last } = rec;
        return { result: { kind: 'fenced', ...(holder ? { holder } : {}), ...(last && !holder ? { last } : {}) } };
      }
      if (mine || !this.isLive(rec)) {
        let run = event;
        let pending = rec.pending;
        // The follow-up the lease was reserved for has arrived.
        if (pending?.id === event.id) pending = undefined;
        if (pending && event.type === EVENT_TYPES.object) {
          run = coalesceEvents(pending, event);
          pending = undefined;
        }
        const tookOver = !mine && rec.holder !== undefined;
        const result: AcquireResult = { kind: 'acquired', event: run, lease: new HeldLease(this, key, me), tookOver };
        // The run's own hand-off with its claim still fresh and nothing pending changed: the
        // lease is already as it would be written (an idle resync's template and deploy stages).
        if (mine && pending === rec.pending && this.isFresh(rec)) return { result };
        return {
          next: { holder: me, expiresAt: this.expiry(), ...(pending ? { pending } : {}) },
          result,
        };
      }
      // Only an object event gets here (a stage event finding another holder is fenced above).
      const pending = rec.pending ? coalesceEvents(rec.pending, event) : event;
      return { next: { ...rec, pending }, result: { kind: 'coalesced', holder: rec.holder ?? '' } };
    });
  }

  /**
   * How an App event starts: an {@link OptimisticRun} when it may run without taking the lease
   * (see there), else `undefined`: take it with {@link acquire} as before.
   *
   * - a `resync` object event of an App reads the lease (one GET) and runs optimistic when nobody
   *   holds it (no live holder) and nothing is pending;
   * - a template or deploy event of an optimistic run (`run.lease` set) goes on optimistic, with
   *   no request;
   * - every other event takes the lease.
   *
   * @throws StoreError when the store fails.
   */
  async start(event: KappEvent): Promise<OptimisticRun | undefined> {
    const subject = leaseSubject(event);
    if (!subject) return undefined;
    const key = leaseKey(subject);
    if (event.type === EVENT_TYPES.template || event.type === EVENT_TYPES.deploy) {
      const seen = event.data.run.lease;
      return seen === undefined ? undefined : new OptimisticRun(this, key, event, seen);
    }
    if (event.type !== EVENT_TYPES.object || event.data.reason !== 'resync') return undefined;
    const { rec, version } = await this.read(key);
    return this.isLive(rec) || rec.pending ? undefined : new OptimisticRun(this, key, event, version);
  }

  /** The lease as stored and its version ({@link ABSENT_LEASE} when there is none). */
  async read(key: string): Promise<{ rec: LeaseRecord; version: string; etag?: string }> {
    const got = await this.#store.getVersioned(key);
    const etag = got?.etag;
    // A store without versions is versioned by the body (every write changes it: `seq`).
    const version = !got ? ABSENT_LEASE : (etag ?? `sha256:${createHash('sha256').update(got.body).digest('hex')}`);
    return { rec: parseLease(got?.body), version, ...(etag ? { etag } : {}) };
  }

  /**
   * Takes the lease for `holder` only if it is still at version `seen` (the free lease an
   * {@link OptimisticRun} started from): one conditional write.
   * @returns `claimed`; `own` when the lease moved because of `holder` itself (it holds it, or it
   *   freed it last and nobody came since: an earlier attempt of the same stage claimed it and
   *   failed); `contended` when anybody else took it or queued for it since `seen`.
   * @throws StoreError when the store fails.
   */
  async claimAt(key: string, seen: string, holder: string): Promise<'claimed' | 'own' | 'contended'> {
    for (let i = 0; i < CAS_ATTEMPTS; i++) {
      const { rec, version, etag } = await this.read(key);
      if (version !== seen) {
        const own = rec.holder === holder || (rec.holder === undefined && !rec.pending && rec.last === holder);
        return own ? 'own' : 'contended';
      }
      const body = serializeLease({ holder, expiresAt: this.expiry(), seq: (rec.seq ?? 0) + 1 });
      if ((await this.#store.putIfMatch(key, body, etag)) === 'written') return 'claimed';
    }
    return 'contended';
  }

  /**
   * Whether the lease is still at version `seen`; otherwise whether the change was `holder`'s own
   * (as {@link claimAt} tells).
   * @throws StoreError when the store fails.
   */
  async checkAt(key: string, seen: string, holder: string): Promise<'unchanged' | 'own' | 'contended'> {
    const { rec, version } = await this.read(key);
    if (version === seen) return 'unchanged';
    const own = rec.holder === holder || (rec.holder === undefined && !rec.pending && rec.last === holder);
    return own ? 'own' : 'contended';
  }

  /**
   * Read-modify-write of one lease under compare-and-swap, retried on conflict: `change` gets the
   * lease as read and returns the record to write (none: leave it) and the result.
   * @throws StoreError when the store fails; Error after {@link CAS_ATTEMPTS} conflicts in a row.
   */
  async update<T>(key: string, change: (rec: LeaseRecord) => { next?: LeaseRecord; result: T }): Promise<T> {
    for (let i = 0; i < CAS_ATTEMPTS; i++) {
      const got = await this.#store.getVersioned(key);
      const rec = parseLease(got?.body);
      const { next, result } = change(rec);
      if (!next) return result;
      const body = serializeLease({ ...next, seq: (rec.seq ?? 0) + 1 });
      if ((await this.#store.putIfMatch(key, body, got?.etag)) === 'written') return result;
      await new Promise((r) => setTimeout(r, Math.random() * 10 * 2 ** Math.min(i, 5)));
    }
    throw new Error(`run lease ${key}: ${CAS_ATTEMPTS} conflicting writes in a row`);
  }
}

/** A lease taken by {@link RunLeases.acquire}, for one stage of one run. */
export class HeldLease {
  #holder: string;

  /** @internal */
  constructor(
    private readonly leases: RunLeases,
    /** The lease's key. */
    readonly key: string,
    holder: string,
  ) {
    this.#holder = holder;
  }

  /** Who holds it now. */
  get holder(): string {
    return this.#holder;
  }

  /**
   * Extends the claim by the TTL from now, when it is still ours.
   * @returns false when another run holds the lease now (ours expired and was taken over).
   */
  renew(): Promise<boolean> {
    return this.leases.update(this.key, (rec) =>
      rec.holder === this.#holder
        ? { next: { ...rec, expiresAt: this.leases.expiry() }, result: true }
        : { result: false },
    );
  }

  /**
   * Renews the claim every third of the TTL while the stage runs (failures are logged: the
   * claim then lasts until its expiry).
   * @returns stops the renewals.
   */
  keepAlive(log: Logger): () => void {
    const timer = setInterval(() => {
      this.renew().then(
        (ours) => {
          if (!ours) log.warn({ lease: this.key }, 'run lease taken over by another run while this stage ran');
        },
        (err: unknown) =>
          log.warn(
            { lease: this.key, error: err instanceof Error ? err.message : String(err) },
            'run lease renewal failed',
          ),
      );
    }, this.leases.ttlMs / 3);
    timer.unref?.();
    return () => clearInterval(timer);
  }

  /**
   * Passes the lease to the run's next event (call it before sending that event): its holder
   * ({@link holderOf}) gets a fresh TTL; the pending follow-up stays. Nothing is changed when the
   * lease is no longer ours (the next event, a stage of a run the lease moved past, is then
   * fenced where it arrives: {@link RunLeases.acquire}), nor when the
   * next event is the same run's (`run:<runId>`, template → deploy) and the claim is still
   * fresh ({@link RunLeases.isFresh}): the write would change nothing but the expiry.
   */
  async handOff(next: KappEvent): Promise<void> {
    const to = holderOf(next);
    const ours = await this.leases.update(this.key, (rec) => {
      if (rec.holder !== this.#holder) return { result: false };
      if (to === rec.holder && this.leases.isFresh(rec)) return { result: true };
      return { next: { ...rec, holder: to, expiresAt: this.leases.expiry() }, result: true };
    });
    if (ours) this.#holder = to;
  }

  /**
   * Ends the run's claim. With a pending follow-up the lease is reserved for it (holder: the
   * follow-up's, a fresh TTL; `pending` kept until it arrives, so a follow-up lost on the way
   * runs with whoever takes the lease after its expiry); without one it is freed.
   *
   * @returns the follow-up to send now (its `targetFunction`), if any.
   */
  end(): Promise<KappEvent | undefined> {
    return this.leases.update(this.key, (rec) => {
      if (rec.holder !== this.#holder) return { result: undefined };
      if (!rec.pending) return { next: { last: this.#holder }, result: undefined };
      const followUp = followUpOf(rec.pending, this.#holder);
      return {
        next: { holder: holderOf(followUp), expiresAt: this.leases.expiry(), pending: followUp },
        result: followUp,
      };
    });
  }
}

/**
 * Thrown by an {@link OptimisticRun} that must stop: another run of its App took the lease or
 * queued for it since the optimistic run started, or an earlier attempt's claim was followed by
 * another run's. The stage handler then acknowledges the event ({@link OptimisticRun.stopped}
 * says how the App runs again).
 */
export class LeaseContendedError extends Error {
  override readonly name = 'LeaseContendedError';
}

/**
 * A run that holds no lease while it only reads: an App's resync that finds the lease free runs
 * its stages without writing the lease, and each stage's event carries the version of the lease
 * it started from (`run.lease`). The stage handler gates the stage's writes on it:
 *
 * - before any real work (a tool, an object-store write, a finalizer change) the run claims the
 *   lease with one conditional write at that version ({@link claim}); from then on it is an
 *   ordinary run holding the lease (hand-offs, renewals, end as before);
 * - a status write of a run that has claimed nothing (the final `ReconcileSucceeded` of a
 *   resync whose stages all ended `cached`) first checks that the lease is still at that version
 *   ({@link verify}), read after the App the status is planned on, and is sent with that read's
 *   resourceVersion and never re-planned: a 409 stops the run. So a real run that started
 *   meanwhile (it took the lease first) either wrote the App before (the check or the 409 sees
 *   it) or writes it after: the optimistic run's write is never the later one;
 * - when the lease moved (another run took it, queued for it, or was freed since), the run stops:
 *   it writes nothing more, and the App runs again from the start (a `resync` from
 *   {@link restartEvent}, which takes the lease as any object event: coalesced into the holder's
 *   follow-up, or sent when the lease is free). The artifacts the run carries may be older than
 *   the other run's, so it never goes on with them.
 *
 * An event carries the lease's version (every write changes it: `seq`), so a lease taken and freed
 * again by another run in between is seen as moved.
 */
export class OptimisticRun {
  #held: HeldLease | undefined;
  #stopped: 'restart' | 'coalesced' | undefined;

  /** @internal */
  constructor(
    private readonly leases: RunLeases,
    /** The lease's key. */
    readonly key: string,
    /** The event of the stage running. */
    readonly event: KappEvent,
    /** The version of the free lease the run started from ({@link ABSENT_LEASE}: no lease object). */
    readonly seen: string,
  ) {}

  /** The lease once claimed. */
  get held(): HeldLease | undefined {
    return this.#held;
  }

  /**
   * Why the run stopped, when it did: `restart` (send {@link restartEvent} through the lease) or
   * `coalesced` (this event is the lease's pending follow-up already).
   */
  get stopped(): 'restart' | 'coalesced' | undefined {
    return this.#stopped;
  }

  /**
   * Claims the lease for this stage's event ({@link holderOf}) before real work; once claimed,
   * returns the same lease. An earlier attempt's own claim is taken back as {@link RunLeases.acquire}
   * would on a retry.
   * @throws LeaseContendedError when the run must stop; StoreError when the store fails.
   */
  async claim(): Promise<HeldLease> {
    if (this.#held) return this.#held;
    this.#refuseStopped();
    const holder = holderOf(this.event);
    const got = await this.leases.claimAt(this.key, this.seen, holder);
    if (got === 'claimed') {
      this.#held = new HeldLease(this.leases, this.key, holder);
      return this.#held;
    }
    if (got === 'own') return await this.#retake();
    return this.#stop('restart');
  }

  /**
   * Before a status write of a run that claimed nothing: the lease must still be at its version.
   * Does nothing once the lease is claimed.
   * @throws LeaseContendedError when the run must stop; StoreError when the store fails.
   */
  async verify(): Promise<void> {
    if (this.#held) return;
    this.#refuseStopped();
    const got = await this.leases.checkAt(this.key, this.seen, holderOf(this.event));
    if (got === 'own') await this.#retake();
    else if (got === 'contended') this.#stop('restart');
  }

  /**
   * Stops the run (its status write met a 409: somebody wrote the App since it was read).
   * @throws LeaseContendedError always.
   */
  conflict(): never {
    return this.#stop('restart');
  }

  /**
   * The `resync` object event that runs the App again from the start after the run stopped: its
   * id derived from the stopped event's (32 hex chars of a sha256), so a retried stop sends the
   * same event.
   */
  restartEvent(time: Date): KappEvent {
    return objectEvent(objectRefOf(this.event), 'resync', { time, id: derivedId(this.event.id, 'optimistic-restart') });
  }

  async #retake(): Promise<HeldLease> {
    const got = await this.leases.acquire(this.event);
    if (got.kind === 'coalesced') return this.#stop('coalesced');
    if (got.kind === 'fenced') return this.#stop('restart');
    this.#held = got.lease;
    return got.lease;
  }

  #refuseStopped(): void {
    if (this.#stopped) throw new LeaseContendedError(`run lease ${this.key}: the optimistic run stopped`);
  }

  #stop(why: 'restart' | 'coalesced'): never {
    this.#stopped ??= why;
    throw new LeaseContendedError(
      why === 'coalesced'
        ? `run lease ${this.key}: held by another run; this event waits as its follow-up`
        : `run lease ${this.key}: another run of the App started meanwhile`,
    );
  }
}

/**
 * The follow-up as sent: the pending event under a new id, derived from its own and the run that
 * ends (32 hex chars of a sha256). The pending event was delivered once already with its own id,
 * and an SQS FIFO queue drops a message whose deduplication id (the event id) it saw in the last
 * 5 minutes; the same run ending twice (a retried record) still derives the same id.
 */
export function followUpOf(pending: KappEvent, endedBy: string): KappEvent {
  return { ...pending, id: derivedId(pending.id, 'follow-up', endedBy) };
}

/**
 * The object event that runs the App again from the start after `fenced`, a stage event its run's
 * lease moved past ({@link AcquireResult} `fenced`), was dropped: reason `ref-changed`, which
 * forces a run whatever the timer says (`pipeline/app/reconcile.ts`), because the dropped run may have
 * been forced itself (a changed Secret, a new generation whose `Reconciling` it wrote) while the
 * run that moved the lease may have been a resync the timer made a no-op. Its id is derived from
 * the dropped event's (32 hex chars of a sha256): a redelivered stale event sends the same one
 * (deduplicated by the FIFO queue, merged in the lease's follow-up). Costs one extra run when the
 * other run had converged the App already; fencing needs a crash or failure plus another event
 * meanwhile, so it is rare.
 */
export function fencedRestartOf(fenced: KappEvent, time: Date): KappEvent {
  return objectEvent(objectRefOf(fenced), 'ref-changed', { time, id: derivedId(fenced.id, 'fenced-restart') });
}

/** 32 hex chars of the sha256 of `parts` (as a JSON array): an event id derived from another's. */
function derivedId(...parts: string[]): string {
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex').slice(0, 32);
}
