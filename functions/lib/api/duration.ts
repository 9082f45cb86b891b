/**
 * Go `time.Duration` parsing and formatting, the one parser behind `spec.syncPeriod` (a
 * `metav1.Duration`, validated by `DurationSchema` and read by the reconcile timer) and the
 * controller config keys `appDefaultSyncPeriod`, `appMinimumSyncPeriod` and
 * `packageInstallDefaultSyncPeriod`.
 *
 * Mirrors the Go standard library `time/format.go` (`ParseDuration`, `leadingInt`,
 * `leadingFraction`, `quote`) and `time/time.go` (`Duration.String`, `fmtFrac`, `fmtInt`), which
 * kapp-controller reaches through `metav1.Duration.UnmarshalJSON` and `pkg/config/config.go`.
 * Durations are int64 nanoseconds in Go; here they are `bigint` nanoseconds internally and
 * milliseconds (a JS number, possibly fractional) at the API.
 *
 * @module
 */

/** One nanosecond-based unit from Go's `unitMap`. There is deliberately no `d` (day) unit. */
const UNIT_NANOS: ReadonlyMap<string, bigint> = new Map([
  ['ns', 1n],
  ['us', 1_000n],
  ['µs', 1_000n], // U+00B5 micro sign
  ['μs', 1_000n], // U+03BC Greek small letter mu
  ['ms', 1_000_000n],
  ['s', 1_000_000_000n],
  ['m', 60_000_000_000n],
  ['h', 3_600_000_000_000n],
]);

/** `1 << 63`: one past the largest int64, the bound Go checks against while accumulating. */
const TWO_POW_63 = 1n << 63n;

/** Nanoseconds per millisecond. */
const NANOS_PER_MS = 1_000_000n;

/**
 * Error thrown by {@link parseDuration} and {@link parseDurationNanos}. `message` is exactly the
 * Go error text, e.g. `time: invalid duration "abc"`, `time: missing unit in duration "1"`,
 * `time: unknown unit "d" in duration "1d"`.
 */
export class DurationParseError extends Error {
  /** The string that failed to parse. */
  readonly input: string;

  /**
   * @param message - Go's error text.
   * @param input - The string that failed to parse.
   */
  constructor(message: string, input: string) {
    super(message);
    this.name = 'DurationParseError';
    this.input = input;
  }
}

/**
 * Go's `time.quote`: wraps in double quotes, backslash-escapes `"` and `\`, and writes every byte
 * of a non-ASCII or control character as `\xNN` (lowercase hex of its UTF-8 bytes).
 */
function goQuote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const code = ch.codePointAt(0) ?? 0;
    if (code >= 0x80 || code < 0x20) {
      for (const byte of Buffer.from(ch, 'utf8')) out += `\\x${byte.toString(16).padStart(2, '0')}`;
    } else {
      if (ch === '"' || ch === '\\') out += '\\';
      out += ch;
    }
  }
  return `${out}"`;
}

function isDigit(c: string | undefined): boolean {
  return c !== undefined && c >= '0' && c <= '9';
}

/**
 * Parses a Go duration string into int64 nanoseconds, exactly as Go's `time.ParseDuration`:
 * an optional sign, then one or more `[0-9]*(\.[0-9]*)?<unit>` elements with units `ns`, `us`,
 * `µs`, `μs`, `ms`, `s`, `m`, `h`; `"0"` alone (with an optional sign) is valid. Fractions are
 * converted through float64 and truncated per element, as Go does.
 *
 * @param s - The duration text, e.g. `30s`, `1h30m`, `300ms`, `1.5h`.
 * @returns Signed nanoseconds.
 * @throws {DurationParseError} with Go's message for any input Go rejects (empty string, missing
 *   or unknown unit, `d`, whitespace, int64 overflow).
 */
export function parseDurationNanos(s: string): bigint {
  const orig = s;
  const invalid = () => new DurationParseError(`time: invalid duration ${goQuote(orig)}`, orig);
  let rest = s;
  let neg = false;
  if (rest !== '' && (rest[0] === '-' || rest[0] === '+')) {
    neg = rest[0] === '-';
    rest = rest.slice(1);
  }
  if (rest === '0') return 0n;
  if (rest === '') throw invalid();

  let d = 0n;
  while (rest !== '') {
    if (!(rest[0] === '.' || isDigit(rest[0]))) throw invalid();

    // leadingInt: consume [0-9]*, failing on int64 overflow.
    let i = 0;
    let v = 0n;
    while (isDigit(rest[i])) {
      if (v > TWO_POW_63 / 10n) throw invalid();
      v = v * 10n + BigInt(rest.charCodeAt(i) - 48);
      if (v > TWO_POW_63) throw invalid();
      i++;
    }
    const pre = i > 0;
    rest = rest.slice(i);

    // leadingFraction: consume (\.[0-9]*)?, ignoring digits once they would overflow.
    let f = 0n;
    let scale = 1;
    let post = false;
    if (rest[0] === '.') {
      rest = rest.slice(1);
      let j = 0;
      let overflow = false;
      while (isDigit(rest[j])) {
        if (!overflow) {
          if (f > (TWO_POW_63 - 1n) / 10n) {
            overflow = true;
          } else {
            const y = f * 10n + BigInt(rest.charCodeAt(j) - 48);
            if (y > TWO_POW_63) {
              overflow = true;
            } else {
              f = y;
              scale *= 10;
            }
          }
        }
        j++;
      }
      post = j > 0;
      rest = rest.slice(j);
    }
    if (!pre && !post) throw invalid();

    // Unit: everything up to the next '.' or digit.
    let u = 0;
    while (u < rest.length && !(rest[u] === '.' || isDigit(rest[u]))) u++;
    if (u === 0) throw new DurationParseError(`time: missing unit in duration ${goQuote(orig)}`, orig);
    const unitText = rest.slice(0, u);
    rest = rest.slice(u);
    const unit = UNIT_NANOS.get(unitText);
    if (unit === undefined) {
      throw new DurationParseError(`time: unknown unit ${goQuote(unitText)} in duration ${goQuote(orig)}`, orig);
    }
    if (v > TWO_POW_63 / unit) throw invalid();
    v *= unit;
    if (f > 0n) {
      v += BigInt(Math.trunc(Number(f) * (Number(unit) / scale)));
      if (v > TWO_POW_63) throw invalid();
    }
    d += v;
    if (d > TWO_POW_63) throw invalid();
  }
  if (neg) return -d;
  if (d > TWO_POW_63 - 1n) throw invalid();
  return d;
}

/**
 * Parses a Go duration string (see {@link parseDurationNanos}) into milliseconds.
 *
 * @param s - The duration text, e.g. `30s` (→ 30000), `1h30m` (→ 5400000), `300ms` (→ 300).
 * @returns Signed milliseconds; sub-millisecond parts are kept as a fraction (`1500us` → 1.5).
 * @throws {DurationParseError} for any input Go rejects.
 */
export function parseDuration(s: string): number {
  const ns = parseDurationNanos(s);
  return Number(ns / NANOS_PER_MS) + Number(ns % NANOS_PER_MS) / 1e6;
}

/**
 * Like {@link parseDuration} but returns `undefined` instead of throwing.
 *
 * @param s - The duration text.
 * @returns Milliseconds, or `undefined` when Go would reject `s`.
 */
export function tryParseDuration(s: string): number | undefined {
  try {
    return parseDuration(s);
  } catch (err) {
    if (err instanceof DurationParseError) return undefined;
    throw err;
  }
}

/**
 * The message a `metav1.Duration` field's schema issue carries for any rejected value:
 * `time: invalid duration "<value>"` (JSON-quoted), whatever Go's more specific reason.
 *
 * @param value - The rejected text.
 * @returns The issue message.
 */
export function invalidDurationMessage(value: unknown): string {
  return `time: invalid duration ${JSON.stringify(value)}`;
}

/**
 * True when `value` is a string Go's `time.ParseDuration` would accept (including its int64
 * overflow limit of about 292 years). The predicate of `DurationSchema`.
 *
 * @param value - The duration text.
 * @returns Whether {@link parseDurationNanos} accepts it.
 */
export function isGoDuration(value: string): boolean {
  return tryParseDuration(value) !== undefined;
}

/**
 * Parses like {@link parseDuration}, but reports every rejection with the schema's single message
 * ({@link invalidDurationMessage}), as the API layer does for `metav1.Duration` fields.
 *
 * @param value - The duration text.
 * @returns Signed milliseconds.
 * @throws {RangeError} `time: invalid duration "<value>"` (with the {@link DurationParseError} as
 *   `cause`) when Go would reject `value`.
 */
export function parseGoDuration(value: string): number {
  try {
    return parseDuration(value);
  } catch (cause) {
    if (cause instanceof DurationParseError) throw new RangeError(invalidDurationMessage(value), { cause });
    throw cause;
  }
}

/** Go's `fmtFrac`: the fraction of `v / 10^prec`, without trailing zeros (and no dot if zero). */
function fmtFrac(v: bigint, prec: number): { text: string; rest: bigint } {
  let text = '';
  let print = false;
  let rest = v;
  for (let i = 0; i < prec; i++) {
    const digit = rest % 10n;
    print = print || digit !== 0n;
    if (print) text = digit.toString() + text;
    rest /= 10n;
  }
  if (print) text = `.${text}`;
  return { text, rest };
}

/**
 * Formats int64 nanoseconds exactly like Go's `Duration.String()`: `0s`, `300ms`, `1.5µs`,
 * `1m30s`, `1h30m0s`, `-2s`.
 *
 * @param ns - Signed nanoseconds.
 * @returns Go's text for the duration.
 */
export function formatDurationNanos(ns: bigint): string {
  const neg = ns < 0n;
  let u = neg ? -ns : ns;
  let out: string;
  if (u < 1_000_000_000n) {
    if (u === 0n) return '0s';
    let prec: number;
    let unit: string;
    if (u < 1_000n) {
      prec = 0;
      unit = 'ns';
    } else if (u < 1_000_000n) {
      prec = 3;
      unit = 'µs';
    } else {
      prec = 6;
      unit = 'ms';
    }
    const frac = fmtFrac(u, prec);
    out = `${frac.rest}${frac.text}${unit}`;
  } else {
    const frac = fmtFrac(u, 9);
    u = frac.rest;
    out = `${u % 60n}${frac.text}s`;
    u /= 60n;
    if (u > 0n) {
      out = `${u % 60n}m${out}`;
      u /= 60n;
      if (u > 0n) out = `${u}h${out}`;
    }
  }
  return neg ? `-${out}` : out;
}

/**
 * Formats milliseconds like Go's `Duration.String()` (see {@link formatDurationNanos}); the value
 * is rounded to whole nanoseconds first.
 *
 * @param ms - Signed milliseconds, e.g. 5400000.
 * @returns e.g. `1h30m0s`.
 * @throws {RangeError} when `ms` is not finite.
 */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) throw new RangeError(`cannot format non-finite duration ${ms}`);
  const whole = Math.trunc(ms);
  const nanos = BigInt(whole) * NANOS_PER_MS + BigInt(Math.round((ms - whole) * 1e6));
  return formatDurationNanos(nanos);
}
