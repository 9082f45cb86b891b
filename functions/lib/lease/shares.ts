/**
 * Fair shares of a stage function's slots on Lambda: no cluster holds more than its share of the
 * records a stage function runs at once, fleet-wide, and no namespace more than its share of its
 * cluster's. The embedded runtime gets the same from its round-robin `KeyedQueue`
 * (`functions/embedded/keyed-queue.ts`); on Lambda each stage has one FIFO queue and a fixed
 * reserved concurrency for the whole fleet, so ten slow fetches of one cluster would otherwise hold
 * every fetch slot while another cluster's events wait behind them.
 *
 * One small JSON document per stage and cluster in the artifact bucket,
 * `state/shares/<stage>/<cluster>.json` ({@link sharesKey}; the cluster id is a DNS name, as in the
 * run leases' keys), changed only by compare-and-swap (`ObjectStore.putIfMatch`):
 * `{ holders, parked, seq }`.
 *
 * - `holders`: the records running now, `{ id (the SQS message id), namespace, until }`. `until`
 *   (epoch ms) is the invocation's time limit plus a margin, so a crashed holder's slot frees
 *   itself: every change drops the holders past their `until`.
 * - `parked`: records that found their cluster or namespace over its share, oldest first (the
 *   array's order is the order they were parked in). Each one's message (body, message group,
 *   message id, postponements) is one object under `state/shares/<stage>/<cluster>/parked/` (the
 *   key {@link parkedKey}: zero-padded epoch ms and message id); the record itself is acknowledged,
 *   so it holds no Lambda slot while it waits. An entry being woken carries `woken` (epoch ms): its
 *   copy was sent back to the function's queue ({@link MessageRequeuer}) and it keeps a slot
 *   reserved until the copy arrives (the copy then holds it) or `woken` passes (then it reads as
 *   parked again; a parked entry whose object is gone was requeued already and is dropped).
 *
 * Who wakes parked records: every change that leaves room (a holder's {@link StageShares.release},
 * an {@link StageShares.acquire} that finds room beyond itself, an expired holder dropped) picks the
 * parked records to wake in the same write ({@link chooseWakes}: oldest first, round-robin across
 * namespaces, up to the room the cluster and each namespace have), then sends them back and deletes
 * their objects. An arrival takes a slot only when it wins that same choice (it counts as the
 * newest waiter), so arrivals never overtake records parked before them; and a record whose message
 * group (its object) has a parked or waking record parks behind it, so an object's events keep
 * their order. When every holder of a cluster crashed, its parked records are woken by the next
 * record of that cluster and stage that acquires or releases: at the latest the crashed holders'
 * own messages, which come back after their visibility timeout (the function timeout plus its
 * margin, longer than `until`) and find the expired holders dropped.
 *
 * Object-store requests per record with room: 2 GETs and 2 conditional PUTs (acquire and
 * release); a parked record adds one PUT (its object), and its wake one GET and one DELETE of it
 * and one requeue.
 *
 * @module
 */
import type { ObjectStore } from '../store/port.js';
import type { MessageRequeuer, RequeuedMessage } from '../transport/port.js';

/** Where the shares live in the artifact bucket. */
export const SHARES_PREFIX = 'state/shares/';

/**
 * How long a woken record's slot stays reserved for its copy, ms: 5 minutes (the run leases'
 * TTL). Past it the entry reads as parked again; its object is gone, so the next wake drops it.
 */
export const DEFAULT_WAKE_TTL_MS = 5 * 60_000;

/**
 * Parked records of one stage and cluster, at most ({@link StageSharesOptions.maxParked}): 1,000.
 * Why a bound: every change rewrites the whole document, and its forwarder chooses how many
 * events a cluster has (events naming objects that need not exist pass the edge checks), so
 * without one a flooding forwarder grows its document, and the time every one of its records
 * spends in a shared slot to read and write it, without end. A record turned away waits in the
 * queue instead (`batchItemFailures`), where it costs no slot.
 */
export const DEFAULT_MAX_PARKED = 1000;

/** Compare-and-swap attempts of one change before it gives up (conflicts: one cluster's records of one stage). */
const CAS_ATTEMPTS = 20;

/** Digits of the epoch ms in a parked key: sorts by time until the year 33658. */
const MS_DIGITS = 15;

/** One record holding a slot. */
export interface ShareHolder {
  /** The SQS message id of the record. */
  id: string;
  /** The namespace of the record's object. */
  namespace: string;
  /** Epoch ms after which the slot is free (the holder crashed). */
  until: number;
}

/** One parked record (its message is the object {@link ParkedEntry.key}). */
export interface ParkedEntry {
  /** The object holding its {@link RequeuedMessage} (as sent back: postponements already counted). */
  key: string;
  /** The namespace of the record's object. */
  namespace: string;
  /** The record's `MessageGroupId`: a later record of the group parks behind it. */
  group: string;
  /** The event's id: the woken copy (same body) is known by it. */
  eventId: string;
  /** Set while woken: epoch ms until which its slot stays reserved for the copy. */
  woken?: number;
}

/** The document of one stage and cluster. */
export interface SharesDoc {
  holders: ShareHolder[];
  parked: ParkedEntry[];
  /** Write counter: every write changes the body (and its ETag). */
  seq: number;
  /** The namespace whose record was served last: the next {@link chooseWakes} starts after it. */
  turn?: string;
}

/** A record asking for a slot ({@link StageShares.acquire}). */
export interface ShareEntrant {
  /** The SQS message id: the holder's id. */
  id: string;
  /** Epoch ms after which its slot frees itself: the invocation's time limit plus a margin. */
  until: number;
  /** The event's id (a woken copy finds its reservation by it). */
  eventId: string;
  /** The message as it is parked and sent back if over share (`postponements` already counted). */
  message: RequeuedMessage;
  /**
   * Whether it may be parked when over share; default true. False: it is turned away instead
   * (`turned-away`, nothing stored), as when the cluster has {@link StageSharesOptions.maxParked}.
   */
  park?: boolean;
}

/** The cluster and namespace a record counts against. */
export interface ShareSubject {
  clusterId: string;
  namespace: string;
}

/** Options of {@link StageShares}. */
export interface StageSharesOptions {
  /** Where the documents and parked messages live: the artifact bucket. */
  store: ObjectStore;
  /** Sends woken records back to the function's own queue. */
  requeuer: MessageRequeuer;
  /** Records of one cluster running at once, at most (at least 1). */
  clusterShare: number;
  /** Records of one namespace of a cluster running at once, at most (at least 1). */
  namespaceShare: number;
  /** Default `Date.now`. */
  now?: () => number;
  /** Default {@link DEFAULT_WAKE_TTL_MS}. */
  wakeTtlMs?: number;
  /** Parked records of one stage and cluster, at most. Default {@link DEFAULT_MAX_PARKED}. */
  maxParked?: number;
}

/** The document's key: `state/shares/<stage>/<cluster>.json`. */
export function sharesKey(stage: string, clusterId: string): string {
  return `${SHARES_PREFIX}${stage}/${clusterId}.json`;
}

/** A parked message's key: `state/shares/<stage>/<cluster>/parked/<zero-padded epoch ms>-<message id>`. */
export function parkedKey(stage: string, clusterId: string, nowMs: number, messageId: string): string {
  const safeId = messageId.replace(/[^A-Za-z0-9._-]/g, '_').slice(0, 128);
  return `${SHARES_PREFIX}${stage}/${clusterId}/parked/${String(Math.max(0, Math.floor(nowMs))).padStart(MS_DIGITS, '0')}-${safeId}`;
}

/** The default cluster share of a stage: half its fleet-wide slots (`maxConcurrency × recordConcurrency`), at least 1. */
export function defaultClusterShare(maxConcurrency: number, recordConcurrency: number): number {
  return Math.max(1, Math.floor((maxConcurrency * recordConcurrency) / 2));
}

/** The default namespace share: half the cluster share, rounded up, at least 1. */
export function defaultNamespaceShare(clusterShare: number): number {
  return Math.max(1, Math.ceil(clusterShare / 2));
}

/** Reads a stored document; anything unreadable reads as empty (replaced by the next write). */
export function parseShares(body: Buffer | undefined): SharesDoc {
  const empty: SharesDoc = { holders: [], parked: [], seq: 0 };
  if (!body) return empty;
  let raw: unknown;
  try {
    raw = JSON.parse(body.toString('utf8'));
  } catch {
    return empty;
  }
  if (typeof raw !== 'object' || raw === null) return empty;
  const r = raw as Record<string, unknown>;
  const str = (v: unknown): v is string => typeof v === 'string';
  const num = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
  const holders = (Array.isArray(r.holders) ? r.holders : []).filter(
    (h): h is ShareHolder => str(h?.id) && str(h?.namespace) && num(h?.until),
  );
  const parked = (Array.isArray(r.parked) ? r.parked : []).filter(
    (p): p is ParkedEntry =>
      str(p?.key) && str(p?.namespace) && str(p?.group) && str(p?.eventId) && (p.woken === undefined || num(p.woken)),
  );
  return { holders, parked, seq: num(r.seq) ? r.seq : 0, ...(str(r.turn) ? { turn: r.turn } : {}) };
}

/** The limits {@link chooseWakes} works within. */
export interface ShareLimits {
  clusterShare: number;
  namespaceShare: number;
}

/** What {@link chooseWakes} chose. */
export interface WakeChoice {
  /** Indexes into `parked` of the entries that take the room, in the order chosen. */
  chosen: number[];
  /** The namespace served last: the next choice starts after it ({@link SharesDoc.turn}). */
  turn?: string;
}

/**
 * Which waiting entries of `parked` (those not woken) take the room left by `holders` and the woken
 * entries' reservations, while the cluster and the entry's namespace are under their shares:
 * round-robin across namespaces (in name order, starting after `turn`, the namespace served last,
 * so a namespace with many waiters does not starve one with few across successive wakes), the
 * oldest entry of each namespace first. An entry whose message group has a woken entry is passed
 * over (its object's older record is on its way back and runs first). Pure.
 */
export function chooseWakes(
  holders: readonly ShareHolder[],
  parked: readonly ParkedEntry[],
  limits: ShareLimits,
  turn?: string,
): WakeChoice {
  const used = new Map<string, number>();
  let total = 0;
  const take = (ns: string) => {
    used.set(ns, (used.get(ns) ?? 0) + 1);
    total++;
  };
  for (const h of holders) take(h.namespace);
  const wokenGroups = new Set<string>();
  for (const p of parked) {
    if (p.woken === undefined) continue;
    take(p.namespace);
    wokenGroups.add(p.group);
  }
  const queues = new Map<string, number[]>();
  parked.forEach((p, i) => {
    if (p.woken !== undefined || wokenGroups.has(p.group)) return;
    const q = queues.get(p.namespace);
    if (q) q.push(i);
    else queues.set(p.namespace, [i]);
  });
  const names = [...queues.keys()].sort();
  const first = names.findIndex((n) => turn === undefined || n > turn);
  const order = first < 0 ? names : [...names.slice(first), ...names.slice(0, first)];
  const chosen: number[] = [];
  let last = turn;
  let progress = true;
  while (progress && total < limits.clusterShare) {
    progress = false;
    for (const ns of order) {
      const q = queues.get(ns) as number[];
      if (total >= limits.clusterShare) break;
      if (q.length === 0 || (used.get(ns) ?? 0) >= limits.namespaceShare) continue;
      chosen.push(q.shift() as number);
      take(ns);
      last = ns;
      progress = true;
    }
  }
  return { chosen, ...(last === undefined ? {} : { turn: last }) };
}

/**
 * What {@link StageShares.acquire} decided: `held` (a slot), `over-share` (parked), or
 * `turned-away` (over share and not parked: nothing of it stored, the caller fails the record so
 * that it waits in the queue, spending a receive).
 */
export type ShareResult = 'held' | 'over-share' | 'turned-away';

/** A record asking for a slot in one change ({@link StageShares.acquire}). */
interface Claim {
  /** Where it waits among the parked if it does not win (its own entry's place on a retry, else last). */
  at: number;
  /** It is a woken copy with a live reservation: the slot is its own. */
  reserved: boolean;
  /** It may park when it does not win: its own entry's place on a retry, else within the bounds. */
  mayPark: boolean;
  /** Its entry if it parks. */
  entry: ParkedEntry;
  /** Its slot if it wins. */
  holder: ShareHolder;
}

/** The fair shares of one stage function's slots, per cluster and namespace, in one object store. */
export class StageShares {
  readonly #store: ObjectStore;
  readonly #requeuer: MessageRequeuer;
  readonly #now: () => number;
  readonly #wakeTtlMs: number;
  readonly #maxParked: number;
  /** The shares in force. */
  readonly limits: ShareLimits;

  constructor(opts: StageSharesOptions) {
    this.#store = opts.store;
    this.#requeuer = opts.requeuer;
    this.#now = opts.now ?? Date.now;
    this.#wakeTtlMs = opts.wakeTtlMs ?? DEFAULT_WAKE_TTL_MS;
    this.#maxParked = Math.max(0, opts.maxParked ?? DEFAULT_MAX_PARKED);
    this.limits = { clusterShare: Math.max(1, opts.clusterShare), namespaceShare: Math.max(1, opts.namespaceShare) };
  }

  /**
   * Takes a slot of `subject`'s cluster for `entrant`, or parks it: `held` when it wins the room
   * as the newest waiter of {@link chooseWakes} (the cluster and its namespace under their shares,
   * no earlier waiter served first in the round, no woken record of its message group on its way);
   * else `over-share`: its message is stored and the caller acknowledges the record (it runs when
   * woken); or `turned-away` when it may not park ({@link ShareEntrant.park} false, or the cluster
   * has {@link StageSharesOptions.maxParked} parked records already; a record that was parked
   * before keeps its place): nothing is stored and the caller fails the record. A woken copy takes its own reservation. An entrant already holding (a retry of a
   * crashed record with the same message id) takes its slot again. Wakes any parked records the
   * change leaves room for.
   *
   * @throws StoreError when the store fails; Error after {@link CAS_ATTEMPTS} conflicts in a row
   *   (the caller fails the record: it is retried the usual way, nothing of it left parked).
   */
  async acquire(stage: string, subject: ShareSubject, entrant: ShareEntrant): Promise<ShareResult> {
    const group = entrant.message.messageGroupId;
    let key: string | undefined;
    // The record's own parked entry (it was parked, then its invocation crashed before the
    // acknowledgment): it keeps its place and its object.
    let ownKey: string | undefined;
    const result = await this.#update(
      stage,
      subject.clusterId,
      (doc, now) => {
        const own = doc.parked.findIndex((p) => p.eventId === entrant.eventId && p.group === group);
        const reserved = own >= 0 && doc.parked[own]?.woken !== undefined;
        ownKey = own >= 0 && !reserved ? doc.parked[own]?.key : undefined;
        key = ownKey ?? key ?? parkedKey(stage, subject.clusterId, now, entrant.message.messageId);
        const claim: Claim = {
          at: own >= 0 ? own : doc.parked.length,
          reserved,
          mayPark: ownKey !== undefined || (entrant.park !== false && doc.parked.length < this.#maxParked),
          entry: { key, namespace: subject.namespace, group, eventId: entrant.eventId },
          holder: { id: entrant.id, namespace: subject.namespace, until: entrant.until },
        };
        return {
          holders: doc.holders.filter((h) => h.id !== entrant.id),
          parked: doc.parked.filter((_, i) => i !== own),
          claim,
        };
      },
      entrant.message,
    );
    if (result === 'held' && ownKey) await this.#store.delete(ownKey).catch(() => {});
    return result;
  }

  /**
   * Frees `id`'s slot of `subject`'s cluster and wakes the parked records the room allows.
   * Releasing a slot not held (expired and dropped, never taken) only wakes.
   * @throws StoreError when the store fails; Error after {@link CAS_ATTEMPTS} conflicts in a row.
   */
  async release(stage: string, subject: ShareSubject, id: string): Promise<void> {
    await this.#update(stage, subject.clusterId, (doc) => ({
      holders: doc.holders.filter((h) => h.id !== id),
      parked: doc.parked,
    }));
  }

  /** The document as stored (tests, diagnostics). */
  async read(stage: string, clusterId: string): Promise<SharesDoc> {
    return parseShares((await this.#store.getVersioned(sharesKey(stage, clusterId)))?.body);
  }

  /**
   * One read-modify-write under compare-and-swap, retried on conflict: expired holders dropped and
   * expired wakes read as parked before `change`; then one {@link chooseWakes} over the result,
   * the claim (if any) among the waiters: chosen (or reserved), it holds a slot; else it parks (its
   * `message` stored under its entry's key before the document is written). The other entries
   * chosen are marked woken in the same write, then sent back ({@link #wake}).
   *
   * @returns `held`, `over-share` or `turned-away` for a claim; `held` without one.
   */
  async #update(
    stage: string,
    clusterId: string,
    change: (doc: SharesDoc, now: number) => { holders: ShareHolder[]; parked: ParkedEntry[]; claim?: Claim },
    message?: RequeuedMessage,
  ): Promise<ShareResult> {
    const key = sharesKey(stage, clusterId);
    let stored: string | undefined;
    try {
      for (let i = 0; i < CAS_ATTEMPTS; i++) {
        const got = await this.#store.getVersioned(key);
        const now = this.#now();
        const read = parseShares(got?.body);
        const doc: SharesDoc = {
          holders: read.holders.filter((h) => h.until > now),
          parked: read.parked.map((p) => (p.woken !== undefined && p.woken <= now ? withoutWoken(p) : p)),
          seq: read.seq,
          ...(read.turn === undefined ? {} : { turn: read.turn }),
        };
        const { holders, parked, claim } = change(doc, now);
        let result: ShareResult = 'held';
        let waiting = parked;
        let room = holders;
        if (claim?.reserved) room = [...holders, claim.holder];
        else if (claim) waiting = [...parked.slice(0, claim.at), claim.entry, ...parked.slice(claim.at)];
        const choice = chooseWakes(room, waiting, this.limits, doc.turn);
        const wokenUntil = now + this.#wakeTtlMs;
        if (claim && !claim.reserved) {
          if (choice.chosen.includes(claim.at)) room = [...holders, claim.holder];
          else result = claim.mayPark ? 'over-share' : 'turned-away';
        }
        const next = waiting.flatMap((p, j) => {
          if (claim && !claim.reserved && j === claim.at) return result === 'over-share' ? [p] : [];
          return [choice.chosen.includes(j) ? { ...p, woken: wokenUntil } : p];
        });
        if (result === 'over-share' && message && stored !== claim?.entry.key) {
          await this.#store.put(claim?.entry.key as string, JSON.stringify(message));
          stored = claim?.entry.key;
        }
        const body: SharesDoc = { holders: room, parked: next, seq: read.seq + 1 };
        if (choice.turn !== undefined) body.turn = choice.turn;
        if ((await this.#store.putIfMatch(key, JSON.stringify(body), got?.etag)) === 'written') {
          if (result !== 'over-share' && stored) await this.#store.delete(stored).catch(() => {});
          const wakes = choice.chosen
            .filter((j) => !(claim && !claim.reserved && j === claim.at))
            .map((j) => ({ ...(waiting[j] as ParkedEntry), woken: wokenUntil }));
          if (wakes.length > 0) await this.#wake(key, wakes);
          return result;
        }
        await new Promise((r) => setTimeout(r, Math.random() * 10 * 2 ** Math.min(i, 5)));
      }
    } catch (err) {
      if (stored) await this.#store.delete(stored).catch(() => {});
      throw err;
    }
    if (stored) await this.#store.delete(stored).catch(() => {});
    throw new Error(`stage shares ${key}: ${CAS_ATTEMPTS} conflicting writes in a row`);
  }

  /**
   * Sends the woken entries' messages back to the function's queue (oldest first, so an object's
   * records keep their order), then deletes their objects. An entry whose object is gone was sent
   * back already (by a wake whose reservation expired): it is dropped. When the queue refuses the
   * copies, the entries are parked again (their objects kept) for the next change to wake.
   * Failures are not thrown: the record that woke them has its own outcome.
   */
  async #wake(key: string, entries: readonly ParkedEntry[]): Promise<void> {
    const messages: RequeuedMessage[] = [];
    const gone: ParkedEntry[] = [];
    const sent: ParkedEntry[] = [];
    try {
      for (const e of entries) {
        const body = await this.#store.get(e.key);
        const m = body && parseMessage(body);
        if (m) {
          messages.push(m);
          sent.push(e);
        } else gone.push(e);
      }
      if (messages.length > 0) await this.#requeuer.requeue(messages);
    } catch {
      await this.#forget(key, entries, (p) => withoutWoken(p)).catch(() => {});
      return;
    }
    await Promise.all(sent.map((e) => this.#store.delete(e.key).catch(() => {})));
    if (gone.length > 0) await this.#forget(key, gone, () => undefined).catch(() => {});
  }

  /** Replaces (or with `undefined`, removes) the parked entries `entries` under compare-and-swap. */
  async #forget(
    key: string,
    entries: readonly ParkedEntry[],
    replace: (p: ParkedEntry) => ParkedEntry | undefined,
  ): Promise<void> {
    const keys = new Set(entries.map((e) => e.key));
    for (let i = 0; i < CAS_ATTEMPTS; i++) {
      const got = await this.#store.getVersioned(key);
      const doc = parseShares(got?.body);
      const parked = doc.parked.flatMap((p) => {
        if (!keys.has(p.key)) return [p];
        const r = replace(p);
        return r ? [r] : [];
      });
      const body = JSON.stringify({ ...doc, parked, seq: doc.seq + 1 } satisfies SharesDoc);
      if ((await this.#store.putIfMatch(key, body, got?.etag)) === 'written') return;
    }
  }
}

function withoutWoken(p: ParkedEntry): ParkedEntry {
  const { woken: _, ...rest } = p;
  return rest;
}

function parseMessage(body: Buffer): RequeuedMessage | undefined {
  try {
    const m = JSON.parse(body.toString('utf8')) as Partial<RequeuedMessage>;
    if (
      typeof m.messageId === 'string' &&
      typeof m.body === 'string' &&
      typeof m.messageGroupId === 'string' &&
      typeof m.postponements === 'number'
    ) {
      return { messageId: m.messageId, body: m.body, messageGroupId: m.messageGroupId, postponements: m.postponements };
    }
  } catch {
    // unreadable: treated as gone
  }
  return undefined;
}
