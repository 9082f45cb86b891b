/**
 * The fetch's progress rule (issue 27): a connection of a tool run (through the egress proxy,
 * `./egress-proxy.ts`) or an in-process download (`./http-download.ts`) that brings fewer than
 * {@link StallRule.minBytes} from the server in a window of {@link StallRule.windowMs} is cut as
 * stalled, and the fetch's status says so ({@link stallNote}). A tarpit that sends one byte every
 * 30 s is never idle, so the proxy's idle timeout alone let it hold a fetch slot until the
 * function deadline (15 min on Lambda), fetch after fetch. kapp-controller has no such rule (its
 * fetches are bounded only by vendir's and the tools' own timeouts).
 *
 * Why 4 KiB in 60 s, counted from the connection's start: a registry answers its first bytes in
 * well under a second and then streams; a git server sends its refs at once and, while it
 * packs, only keep-alive packets (every 5 s, a few bytes each) until the pack streams, so a
 * window of a minute lets a server pack for a minute. Counting from the start also catches a
 * server that accepts and never answers. The floor is far below any real transfer (68 B/s) and
 * far above a trickle. Both are settings (`KAPP_LAMBDA_FETCH_STALL_SECONDS`,
 * `KAPP_LAMBDA_FETCH_STALL_MIN_BYTES`) for a fleet whose git servers pack for longer.
 *
 * @module
 */

/** Default stall window, seconds (`KAPP_LAMBDA_FETCH_STALL_SECONDS`). */
export const DEFAULT_FETCH_STALL_SECONDS = 60;
/** Default byte floor of a stall window (`KAPP_LAMBDA_FETCH_STALL_MIN_BYTES`): 4 KiB. */
export const DEFAULT_FETCH_STALL_MIN_BYTES = 4096;
/** The setting a stall note names, so an operator knows which limit cut the fetch. */
export const FETCH_STALL_SETTING = 'KAPP_LAMBDA_FETCH_STALL_SECONDS';

/** The progress rule: at least `minBytes` from the server in every window of `windowMs`. */
export interface StallRule {
  /** Window length, ms. */
  windowMs: number;
  /** Fewest bytes the server must send in a window. */
  minBytes: number;
}

/** The fleet's default rule: 4 KiB in 60 s. */
export const DEFAULT_STALL_RULE: Readonly<StallRule> = Object.freeze({
  windowMs: DEFAULT_FETCH_STALL_SECONDS * 1000,
  minBytes: DEFAULT_FETCH_STALL_MIN_BYTES,
});

/**
 * The line status carries for a stalled connection, e.g. `fetch from charts.example made no
 * progress (under 4096 bytes in 60 s); cut by the fleet's stall limit
 * (KAPP_LAMBDA_FETCH_STALL_SECONDS)`.
 *
 * @param host - the server as `host` or `host:port`; never a URL (no userinfo, path or query)
 * @param rule - the rule that cut it
 */
export function stallNote(host: string, rule: StallRule): string {
  return `fetch from ${host} made no progress (under ${rule.minBytes} bytes in ${rule.windowMs / 1000} s); cut by the fleet's stall limit (${FETCH_STALL_SETTING})`;
}

/** What a connection reports to its {@link watchStall}. */
export interface StallWatch {
  /** `bytes` arrived from the server. */
  received(bytes: number): void;
  /** The client sent something (a request): it now waits for an answer. */
  sent(): void;
  /** The last traffic was the client's: a request the server has not answered yet. */
  readonly waiting: boolean;
  /** Ends the watch (the connection closed). Idempotent. */
  stop(): void;
}

/** Options of {@link watchStall}. */
export interface StallWatchOptions {
  /**
   * Spare a window that ends on a kept-alive connection at rest (an opaque tunnel cannot tell a
   * finished answer from a slow one): one whose server spoke last and has been quiet for half a
   * window or more, and one whose client sent a request less than half a window ago. A trickle
   * (a byte every `p` < window) always has a byte in a window's second half, so it is judged at
   * the first window end; the proxy's idle timeout closes a quiet connection. Default false:
   * every window is judged (an in-process download is waited on until its body ends).
   */
  spareIdle?: boolean;
  /** The clock, ms. Default `Date.now`. */
  now?: () => number;
}

/**
 * Watches one connection against `rule`: at the end of every window (from now) that brought
 * fewer than `rule.minBytes`, `onStall` is called once and the watch stops. The timer does not
 * keep the process alive.
 *
 * @param rule - window and byte floor
 * @param onStall - cuts the connection (called at most once)
 * @param opts - see {@link StallWatchOptions}
 * @returns the watch the connection's traffic is reported to
 */
export function watchStall(rule: StallRule, onStall: () => void, opts: StallWatchOptions = {}): StallWatch {
  const now = opts.now ?? Date.now;
  let bytes = 0;
  let lastReceived = now();
  let lastSent = Number.NEGATIVE_INFINITY;
  const half = rule.windowMs / 2;
  const spared = (t: number): boolean => (lastSent > lastReceived ? t - lastSent < half : t - lastReceived >= half);
  const timer = setInterval(() => {
    const t = now();
    if (bytes >= rule.minBytes || (opts.spareIdle && spared(t))) {
      bytes = 0;
      return;
    }
    clearInterval(timer);
    onStall();
  }, rule.windowMs);
  timer.unref();
  return {
    received(n) {
      bytes += n;
      lastReceived = now();
    },
    sent() {
      lastSent = now();
    },
    get waiting() {
      return lastSent > lastReceived;
    },
    stop() {
      clearInterval(timer);
    },
  };
}
