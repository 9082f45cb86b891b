/**
 * Go `time.Duration` strings as used by `metav1.Duration` fields (`spec.syncPeriod`) and the
 * controller configuration (`appDefaultSyncPeriod`, ...).
 *
 * Mirrors `time.ParseDuration` from the Go standard library, which `metav1.Duration.UnmarshalJSON`
 * (k8s.io/apimachinery `pkg/apis/meta/v1/duration.go`) calls: a sign, then one or more
 * `<decimal><unit>` elements; units `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`; `"0"` alone is
 * valid. There is no `d` unit.
 *
 * @module
 */

/**
 * Matches exactly the strings `time.ParseDuration` accepts (leaving out its overflow check, which
 * {@link parseGoDuration} applies). Each element needs at least one digit before or after the dot.
 */
export const GO_DURATION_PATTERN = /^[-+]?(?:0|(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)$/;

const ELEMENT = /(\d*)(?:\.(\d*))?(ns|us|µs|μs|ms|s|m|h)/g;

/** Nanoseconds per unit, as in Go's `unitMap` (`time/format.go`). */
const NANOS_PER_UNIT: Readonly<Record<string, bigint>> = {
  ns: 1n,
  us: 1_000n,
  µs: 1_000n,
  μs: 1_000n,
  ms: 1_000_000n,
  s: 1_000_000_000n,
  m: 60_000_000_000n,
  h: 3_600_000_000_000n,
};

/** Largest magnitude a Go `time.Duration` (int64 nanoseconds) can hold. */
const MAX_NANOS = (1n << 63n) - 1n;

/**
 * True when `value` is a string Go's `time.ParseDuration` would accept (including its int64
 * overflow limit of about 292 years).
 */
export function isGoDuration(value: string): boolean {
  return goDurationNanos(value) !== undefined;
}

/**
 * Parses a Go duration string into whole nanoseconds (a bigint, like Go's int64), or `undefined`
 * when Go would reject it. Fractions are truncated towards zero per element, as Go does.
 */
export function goDurationNanos(value: string): bigint | undefined {
  if (!GO_DURATION_PATTERN.test(value)) return undefined;
  let rest = value;
  let negative = false;
  if (rest.startsWith('-') || rest.startsWith('+')) {
    negative = rest.startsWith('-');
    rest = rest.slice(1);
  }
  if (rest === '0') return 0n;
  let total = 0n;
  for (const match of rest.matchAll(ELEMENT)) {
    const [, whole = '', fraction = '', unit = ''] = match;
    const perUnit = NANOS_PER_UNIT[unit];
    if (perUnit === undefined) return undefined;
    let nanos = BigInt(whole === '' ? '0' : whole) * perUnit;
    if (fraction !== '') {
      nanos += (BigInt(fraction) * perUnit) / 10n ** BigInt(fraction.length);
    }
    total += nanos;
    if (total > MAX_NANOS + (negative ? 1n : 0n)) return undefined;
  }
  return negative ? -total : total;
}

/**
 * Parses a Go duration string into milliseconds (a JS number; sub-millisecond parts are kept as
 * a fraction).
 *
 * @throws {RangeError} when `value` is not a valid Go duration; the message is Go's
 *   (`time: invalid duration "<value>"`).
 */
export function parseGoDuration(value: string): number {
  const nanos = goDurationNanos(value);
  if (nanos === undefined) throw new RangeError(`time: invalid duration ${JSON.stringify(value)}`);
  return Number(nanos) / 1e6;
}
