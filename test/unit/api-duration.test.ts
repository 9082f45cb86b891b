import { describe, expect, it } from 'vitest';
import {
  DurationParseError,
  formatDuration,
  formatDurationNanos,
  parseDurationNanos as goDurationNanos,
  isGoDuration,
  parseDuration,
  parseDurationNanos,
  parseGoDuration,
  tryParseDuration,
} from '../../functions/lib/api/duration.js';

const ns = 1n;
const us = 1_000n;
const msec = 1_000_000n;
const sec = 1_000_000_000n;
const min = 60n * sec;
const hour = 60n * min;
const MAX = (1n << 63n) - 1n;
const MIN = -(1n << 63n);

// Go's time_test.go parseDurationTests (the valid half), plus kapp-controller's usual values.
const valid: [string, bigint][] = [
  ['0', 0n],
  ['5s', 5n * sec],
  ['30s', 30n * sec],
  ['1478s', 1478n * sec],
  ['-5s', -5n * sec],
  ['+5s', 5n * sec],
  ['-0', 0n],
  ['+0', 0n],
  ['5.0s', 5n * sec],
  ['5.6s', 5n * sec + 600n * msec],
  ['5.s', 5n * sec],
  ['.5s', 500n * msec],
  ['1.0s', 1n * sec],
  ['1.00s', 1n * sec],
  ['1.004s', 1n * sec + 4n * msec],
  ['1.0040s', 1n * sec + 4n * msec],
  ['100.00100s', 100n * sec + 1n * msec],
  ['10ns', 10n * ns],
  ['11us', 11n * us],
  ['12µs', 12n * us],
  ['12μs', 12n * us],
  ['13ms', 13n * msec],
  ['14s', 14n * sec],
  ['15m', 15n * min],
  ['16h', 16n * hour],
  ['3h30m', 3n * hour + 30n * min],
  ['10.5s4m', 4n * min + 10n * sec + 500n * msec],
  ['-2m3.4s', -(2n * min + 3n * sec + 400n * msec)],
  ['1h2m3s4ms5us6ns', hour + 2n * min + 3n * sec + 4n * msec + 5n * us + 6n * ns],
  ['39h9m14.425s', 39n * hour + 9n * min + 14n * sec + 425n * msec],
  ['52763797000ns', 52763797000n],
  ['0.3333333333333333333h', 20n * min],
  ['9007199254740993ns', (1n << 53n) + 1n],
  ['9223372036854775807ns', MAX],
  ['9223372036854775.807us', MAX],
  ['9223372036s854ms775us807ns', MAX],
  ['-9223372036854775808ns', MIN],
  ['-9223372036854775.808us', MIN],
  ['-9223372036s854ms775us808ns', MIN],
  ['-2562047h47m16.854775808s', MIN],
  ['0.100000000000000000000h', 6n * min],
  ['0.830103483285477580700h', 49n * min + 48n * sec + 372539827n],
  ['1m', min],
  ['1h30m', hour + 30n * min],
  ['300ms', 300n * msec],
  ['1.5h', hour + 30n * min],
  ['10m', 10n * min],
];

describe('parseDurationNanos (Go time.ParseDuration)', () => {
  it.each(valid)('%s', (input, expected) => {
    expect(parseDurationNanos(input)).toBe(expected);
  });
});

describe('parseDuration (milliseconds)', () => {
  it.each([
    ['30s', 30_000],
    ['1m', 60_000],
    ['1h30m', 5_400_000],
    ['300ms', 300],
    ['1.5h', 5_400_000],
    ['10m', 600_000],
    ['1500us', 1.5],
    ['-2s', -2000],
    ['0', 0],
  ] as const)('%s -> %d', (input, expected) => {
    expect(parseDuration(input)).toBe(expected);
  });
});

// Go's parseDurationErrorTests, with Go's exact messages. Inputs that are invalid UTF-8 in Go
// cannot exist in a JS string; U+FFFD stands in for them.
const invalid: [string, string][] = [
  ['', 'time: invalid duration ""'],
  ['3', 'time: missing unit in duration "3"'],
  ['-', 'time: invalid duration "-"'],
  ['s', 'time: invalid duration "s"'],
  ['.', 'time: invalid duration "."'],
  ['-.', 'time: invalid duration "-."'],
  ['.s', 'time: invalid duration ".s"'],
  ['+.s', 'time: invalid duration "+.s"'],
  ['1d', 'time: unknown unit "d" in duration "1d"'],
  ['2w', 'time: unknown unit "w" in duration "2w"'],
  ['1h 30m', 'time: unknown unit "h " in duration "1h 30m"'],
  [' 30s', 'time: invalid duration " 30s"'],
  ['30S', 'time: unknown unit "S" in duration "30S"'],
  ['"', 'time: invalid duration "\\""'],
  ['\uFFFD', 'time: invalid duration "\\xef\\xbf\\xbd"'],
  ['\uFFFD hello \uFFFD world', 'time: invalid duration "\\xef\\xbf\\xbd hello \\xef\\xbf\\xbd world"'],
  ['1\uFFFD', 'time: unknown unit "\\xef\\xbf\\xbd" in duration "1\\xef\\xbf\\xbd"'],
  ['9223372036854775810ns', 'time: invalid duration "9223372036854775810ns"'],
  ['9223372036854775808ns', 'time: invalid duration "9223372036854775808ns"'],
  ['9223372036854776us', 'time: invalid duration "9223372036854776us"'],
  ['3000000h', 'time: invalid duration "3000000h"'],
  ['9223372036854775.808us', 'time: invalid duration "9223372036854775.808us"'],
  ['9223372036854ms775us808ns', 'time: invalid duration "9223372036854ms775us808ns"'],
  ['-9223372036854775809ns', 'time: invalid duration "-9223372036854775809ns"'],
  ['99999999999999999999s', 'time: invalid duration "99999999999999999999s"'],
];

describe('parseDuration errors', () => {
  it.each(invalid)('%j', (input, message) => {
    let caught: unknown;
    try {
      parseDuration(input);
    } catch (e) {
      caught = e;
    }
    expect(caught).toBeInstanceOf(DurationParseError);
    expect((caught as DurationParseError).message).toBe(message);
    expect((caught as DurationParseError).input).toBe(input);
    expect(tryParseDuration(input)).toBeUndefined();
  });
});

// Go's time_test.go durationTests.
const formats: [string, bigint][] = [
  ['0s', 0n],
  ['1ns', 1n],
  ['1.1µs', 1100n],
  ['2.2ms', 2200n * us],
  ['3.3s', 3300n * msec],
  ['4m5s', 4n * min + 5n * sec],
  ['4m5.001s', 4n * min + 5001n * msec],
  ['5h6m7.001s', 5n * hour + 6n * min + 7001n * msec],
  ['8m0.000000001s', 8n * min + 1n],
  ['2562047h47m16.854775807s', MAX],
  ['-2562047h47m16.854775808s', MIN],
  ['1h30m0s', hour + 30n * min],
  ['30s', 30n * sec],
  ['10m0s', 10n * min],
  ['300ms', 300n * msec],
  ['-1.5s', -1500n * msec],
];

describe('formatDurationNanos (Go Duration.String)', () => {
  it.each(formats)('%s', (text, value) => {
    expect(formatDurationNanos(value)).toBe(text);
  });

  it('round-trips every valid parse', () => {
    for (const [input, value] of valid) {
      expect(parseDurationNanos(formatDurationNanos(value)), input).toBe(value);
    }
  });
});

describe('formatDuration (milliseconds)', () => {
  it.each([
    [0, '0s'],
    [300, '300ms'],
    [30_000, '30s'],
    [90_000, '1m30s'],
    [5_400_000, '1h30m0s'],
    [1.5, '1.5ms'],
    [0.001, '1µs'],
    [-2_000, '-2s'],
  ] as const)('%d -> %s', (value, text) => {
    expect(formatDuration(value)).toBe(text);
  });

  it('rejects non-finite input', () => {
    expect(() => formatDuration(Number.NaN)).toThrow('cannot format non-finite duration NaN');
  });
});

describe('Go durations', () => {
  it.each([
    ['30s', 30_000],
    ['1m', 60_000],
    ['10m', 600_000],
    ['1h30m', 5_400_000],
    ['1.5h', 5_400_000],
    ['300ms', 300],
    ['1us', 0.001],
    ['1µs', 0.001],
    ['2h45m30.5s', 9_930_500],
    ['0', 0],
    ['-1m', -60_000],
    ['+5s', 5_000],
    ['1.s', 1_000],
    ['.5s', 500],
  ])('%s = %d ms', (text, ms) => {
    expect(isGoDuration(text)).toBe(true);
    expect(parseGoDuration(text)).toBe(ms);
  });

  it.each(['', '1', '1d', '10 s', 's', '.s', '1.2.3s', '1S', '30sec', '2562048h'])('rejects %j', (text) => {
    expect(isGoDuration(text)).toBe(false);
    expect(() => parseGoDuration(text)).toThrow(`time: invalid duration ${JSON.stringify(text)}`);
  });

  it('holds int64 nanoseconds like Go', () => {
    expect(goDurationNanos('2562047h')).toBe(9_223_369_200_000_000_000n);
    expect(goDurationNanos('1.000000001s')).toBe(1_000_000_001n);
  });
});
