/**
 * Small statistics and formatting helpers of the benchmark (`npm run bench`). Pure.
 *
 * @module
 */

/** Summary of a sample of numbers (all in the sample's unit). */
export interface Summary {
  /** Number of values. */
  n: number;
  median: number;
  min: number;
  max: number;
  mean: number;
  /** max − min. */
  spread: number;
}

/**
 * Summarizes a sample.
 * @throws Error when `values` is empty.
 */
export function summarize(values: readonly number[]): Summary {
  if (values.length === 0) throw new Error('summarize: empty sample');
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  const median = s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
  const min = s[0]!;
  const max = s[s.length - 1]!;
  const mean = s.reduce((a, b) => a + b, 0) / s.length;
  return { n: s.length, median, min, max, mean, spread: max - min };
}

/** Rounds to `digits` decimals (for JSON output). */
export function round(x: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** `1234.5` → `"1,235 ms"`; values of 10 s and more → `"12.3 s"`. */
export function fmtMs(ms: number): string {
  if (Math.abs(ms) >= 10_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms).toLocaleString('en-US')} ms`;
}

/** Bytes as MiB with one decimal, or KiB below 1 MiB. */
export function fmtBytes(n: number): string {
  if (n >= 1_048_576) return `${(n / 1_048_576).toFixed(2)} MiB`;
  return `${(n / 1024).toFixed(1)} KiB`;
}

/** `median (min–max)` of a millisecond sample. */
export function fmtSummaryMs(s: Summary): string {
  return `${fmtMs(s.median)} (${fmtMs(s.min)}–${fmtMs(s.max)}, n=${s.n})`;
}

/** One row of the printed results table. */
export interface Row {
  scenario: string;
  figure: string;
  value: string;
  /** Target from the issue, when it sets one. */
  target?: string;
  /** `met`, `missed`, or empty when there is no target. */
  verdict?: 'met' | 'missed' | '';
}

/** Renders rows as a fixed-width text table (no trailing spaces). */
export function renderTable(rows: readonly Row[]): string {
  const head: Row = { scenario: 'scenario', figure: 'figure', value: 'value', target: 'target', verdict: '' };
  const all = [head, ...rows];
  const w = (f: (r: Row) => string) => Math.max(...all.map((r) => f(r).length));
  const ws = [w((r) => r.scenario), w((r) => r.figure), w((r) => r.value), w((r) => r.target ?? '')];
  const line = (r: Row) =>
    [
      r.scenario.padEnd(ws[0]!),
      r.figure.padEnd(ws[1]!),
      r.value.padEnd(ws[2]!),
      (r.target ?? '').padEnd(ws[3]!),
      r.verdict === undefined || r.verdict === '' ? '' : r.verdict === 'met' ? 'met' : 'MISSED',
    ]
      .join('  ')
      .trimEnd();
  const sep = ws.map((n) => '-'.repeat(n)).join('  ');
  return [line(head), sep, ...rows.map(line)].join('\n');
}
