/**
 * In-process keyed work queue: the embedded default's transport between the forwarder and
 * the functions. It reproduces kapp-controller's `UniqueReconciler`
 * (`cmd/controller/unique_reconciler.go`) and the controller-runtime work queue:
 *
 * - at most one run per key (cluster/kind/namespace/name) at a time;
 * - items that arrive while a key runs coalesce into exactly one follow-up, started as soon
 *   as the running one ends (upstream returns `Requeue=true, RequeueAfter=0`);
 * - at most `concurrency` keys run at once (upstream `-concurrency`, default 10; packaged 4);
 * - keys become ready in arrival order, but picked round-robin across tenants (the part of
 *   the key before the first `/`, the cluster id), so one cluster's burst cannot starve others;
 * - a run that throws (a crashed function) is retried with exponential backoff
 *   (`baseRetryMs * 2^attempt`, capped at `maxRetryMs`), like `ErrReconciler` plus the
 *   rate-limited requeue; a newer item for the key is merged with the one being retried by
 *   the coalesce function, whose result runs at once, unless it is the retried item itself,
 *   which then keeps its backoff and attempt count (the embedded pipeline keeps a crashed stage
 *   against a timer-gated resync, see `coalesceEvents`). The handler is told which attempt it runs (1 for a fresh item, reset by a newer item, a
 *   success, or a {@link RetryFrom} naming another item), so it can end a run that keeps
 *   failing (`retry-bound.ts`).
 *
 * Nothing sleeps inside a handler: retries are timers owned by the queue.
 */

/**
 * Thrown by a handler to have the queue retry a different item than the one it was given
 * (a multi-stage run that crashed in a later stage retries that stage, not the first).
 */
export class RetryFrom<T> extends Error {
  /**
   * @param item - the item to retry.
   * @param cause - the original failure.
   */
  constructor(
    readonly item: T,
    cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = 'RetryFrom';
  }
}

/** Merges a pending item with a newer one for the same key; the result is run once. */
export type Coalesce<T> = (pending: T, next: T) => T;

/** Options of {@link KeyedQueue}. Times in milliseconds. */
export interface KeyedQueueOptions<T> {
  /** Keys processed at once. Default 4 (packaged kapp-controller's `-concurrency`). */
  concurrency?: number;
  /**
   * Default: keep the newer item. Also merges a crashed item with one that arrived meanwhile
   * (`coalesce(crashed, newer)`); returning `pending` itself keeps a crashed item in backoff.
   */
  coalesce?: Coalesce<T>;
  /** First retry delay after a crash. Default 500. */
  baseRetryMs?: number;
  /** Retry delay cap. Default 30 000. */
  maxRetryMs?: number;
  /** Called when a run throws; the item will be retried. */
  onError?: (key: string, err: unknown, attempt: number) => void;
  /** Timer port; defaults to the global timers. */
  setTimer?: (fn: () => void, ms: number) => { cancel(): void };
}

interface KeyState<T> {
  running: boolean;
  pending?: T;
  attempt: number;
  retryTimer?: { cancel(): void };
}

/** See the module comment. */
export class KeyedQueue<T> {
  private readonly keys = new Map<string, KeyState<T>>();
  /** Ready keys per tenant, in arrival order. */
  private readonly ready = new Map<string, string[]>();
  private readonly tenants: string[] = [];
  private lastTenant: string | undefined;
  private active = 0;
  private idleWaiters: (() => void)[] = [];
  private readonly concurrency: number;
  private readonly coalesce: Coalesce<T>;
  private readonly baseRetryMs: number;
  private readonly maxRetryMs: number;
  private closed = false;

  /**
   * @param handler runs one item; resolves when the whole run for that key is done. `attempt`
   *   is 1 for a new item and counts up while the key's runs keep throwing.
   */
  constructor(
    private readonly handler: (key: string, item: T, attempt: number) => Promise<void>,
    private readonly opts: KeyedQueueOptions<T> = {},
  ) {
    this.concurrency = opts.concurrency ?? 4;
    this.coalesce = opts.coalesce ?? ((_, next) => next);
    this.baseRetryMs = opts.baseRetryMs ?? 500;
    this.maxRetryMs = opts.maxRetryMs ?? 30_000;
  }

  /** Adds an item for a key; coalesces with an item already waiting for that key. */
  add(key: string, item: T): void {
    if (this.closed) return;
    let st = this.keys.get(key);
    if (!st) {
      st = { running: false, attempt: 0 };
      this.keys.set(key, st);
    }
    const wasWaiting = st.pending !== undefined;
    const merged = st.pending === undefined ? item : this.coalesce(st.pending, item);
    // The crashed item kept by the merge keeps its backoff (and its attempt count).
    if (st.retryTimer && merged === st.pending) return;
    st.pending = merged;
    if (st.retryTimer) {
      // A newer item supersedes the backoff of a crashed one.
      st.retryTimer.cancel();
      st.retryTimer = undefined;
      st.attempt = 0;
    } else if (wasWaiting || st.running) {
      return;
    }
    this.markReady(key);
    this.pump();
  }

  /** Whether an item for `key` waits (a follow-up of the running one, or in backoff). */
  hasPending(key: string): boolean {
    return this.keys.get(key)?.pending !== undefined;
  }

  /** Number of keys running now. */
  get running(): number {
    return this.active;
  }

  /** Number of keys with an item waiting (ready, running with a follow-up, or in backoff). */
  get waiting(): number {
    let n = 0;
    for (const st of this.keys.values()) if (st.pending !== undefined) n++;
    return n;
  }

  /** Resolves when nothing runs and nothing waits (backoff timers included). */
  async idle(): Promise<void> {
    if (this.isIdle()) return;
    await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
  }

  /** Stops accepting items and cancels pending retries; running items finish. */
  close(): void {
    this.closed = true;
    for (const st of this.keys.values()) {
      st.retryTimer?.cancel();
      st.retryTimer = undefined;
      if (!st.running) st.pending = undefined;
    }
    this.ready.clear();
    this.tenants.length = 0;
    this.checkIdle();
  }

  private isIdle(): boolean {
    return this.active === 0 && this.waiting === 0;
  }

  private checkIdle(): void {
    if (!this.isIdle()) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  private markReady(key: string): void {
    const tenant = key.split('/')[0] ?? '';
    let list = this.ready.get(tenant);
    if (!list) {
      list = [];
      this.ready.set(tenant, list);
      this.tenants.push(tenant);
    }
    list.push(key);
  }

  /** Serves the tenant at the head of the rotation, then moves it to the back. */
  private nextReady(): string | undefined {
    // The tenant served last goes behind the others even if its list was emptied and refilled.
    if (this.tenants.length > 1 && this.tenants[0] === this.lastTenant) this.tenants.push(this.tenants.shift()!);
    while (this.tenants.length) {
      const tenant = this.tenants.shift()!;
      this.lastTenant = tenant;
      const list = this.ready.get(tenant)!;
      const key = list.shift();
      if (list.length) this.tenants.push(tenant);
      else this.ready.delete(tenant);
      if (key !== undefined) return key;
    }
    return undefined;
  }

  private pump(): void {
    while (this.active < this.concurrency) {
      const key = this.nextReady();
      if (key === undefined) break;
      const st = this.keys.get(key)!;
      if (st.running || st.pending === undefined) continue;
      const item = st.pending;
      st.pending = undefined;
      st.running = true;
      this.active++;
      void this.runOne(key, st, item);
    }
    this.checkIdle();
  }

  private async runOne(key: string, st: KeyState<T>, item: T): Promise<void> {
    let failed = false;
    try {
      await this.handler(key, item, st.attempt + 1);
      st.attempt = 0;
    } catch (err) {
      failed = true;
      const retryItem = err instanceof RetryFrom ? (err.item as T) : item;
      // A later stage of the run failed: its attempts count from 1, as each stage's message
      // does on SQS (its own receive count).
      if (retryItem !== item) st.attempt = 0;
      this.opts.onError?.(key, err instanceof RetryFrom ? err.cause : err, st.attempt);
      // An item that arrived while this one ran is merged with the retry, not put in its place:
      // the merge decides whether the newer item supersedes the crashed one (it then runs at
      // once) or the crashed one stands (retried after its backoff).
      const arrived = st.pending;
      if (arrived !== undefined) st.pending = this.coalesce(retryItem, arrived);
      if (!this.closed && (st.pending === undefined || st.pending === retryItem)) {
        const delay = Math.min(this.maxRetryMs, this.baseRetryMs * 2 ** st.attempt);
        st.attempt++;
        st.pending = retryItem;
        const setTimer =
          this.opts.setTimer ??
          ((fn: () => void, ms: number) => {
            const t = setTimeout(fn, ms);
            return { cancel: () => clearTimeout(t) };
          });
        st.retryTimer = setTimer(() => {
          st.retryTimer = undefined;
          if (this.closed) return;
          this.markReady(key);
          this.pump();
        }, delay);
      }
    } finally {
      st.running = false;
      this.active--;
      if (st.pending !== undefined && !st.retryTimer) {
        this.markReady(key);
      } else if (st.pending === undefined && !failed) {
        this.keys.delete(key);
      }
      this.pump();
    }
  }
}
