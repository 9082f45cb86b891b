/**
 * A port of the semver library kapp-controller selects package versions with: carvel's fork of
 * blang/semver v4 (`github.com/carvel-dev/semver/v4`, formerly `github.com/k14s/semver/v4`), reference
 * §2.5 and §7.1. npm `semver` differs on every point that matters here (it has `^`/`~`, excludes
 * prereleases from ranges and ignores build metadata), so this is our own code, written from
 * upstream's `semver.go` and `range.go` and proven by `test/unit/packaging-versions.test.ts`.
 *
 * What this fork does that plain blang does not: build metadata takes part in ordering (after the
 * prerelease, a version with build metadata sorts above the same version without; parts compare
 * numeric < alphanumeric, numbers by value, strings by bytes, a longer list above its prefix), so
 * `=1.0.0` does not match `1.0.0+build` and `>1.0.0+ab1.foo` matches `1.0.0+z1`.
 *
 * Error texts are upstream's, Go `%q` quoting included, because they reach
 * `status.usefulErrorMessage` of a PackageInstall.
 *
 * @module
 */

/** One dot-separated identifier of a prerelease or of build metadata. */
interface Identifier {
  /** The identifier as written. */
  readonly str: string;
  /** Its value when it is all digits (uint64), else undefined. */
  readonly num: bigint | undefined;
}

/** A parsed version: blang `Version` (uint64 numbers held as bigint). */
export interface Version {
  readonly major: bigint;
  readonly minor: bigint;
  readonly patch: bigint;
  /** Prerelease identifiers; empty for a release. */
  readonly pre: readonly Identifier[];
  /** Build metadata identifiers; empty when there is none. */
  readonly build: readonly Identifier[];
}

/** A version or range string that blang refuses; `message` is upstream's error text. */
export class SemverError extends Error {
  override name = 'SemverError';
}

const UINT64_MAX = (1n << 64n) - 1n;
const INT64_MAX = (1n << 63n) - 1n;
const NUMBERS = /^[0-9]*$/;
const ALPHANUM = /^[0-9A-Za-z-]*$/;

/** Go `strconv.Quote` for the strings that reach error messages (what `%q` prints). */
function goQuote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0) ?? 0;
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\t') out += '\\t';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\x07') out += '\\a';
    else if (ch === '\b') out += '\\b';
    else if (ch === '\f') out += '\\f';
    else if (ch === '\v') out += '\\v';
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return `${out}"`;
}

/** Go `strconv.ParseUint(s, 10, 64)`, with its error text. */
function parseUint(s: string): bigint {
  if (!/^[0-9]+$/.test(s)) throw new SemverError(`strconv.ParseUint: parsing ${goQuote(s)}: invalid syntax`);
  const n = BigInt(s);
  if (n > UINT64_MAX) throw new SemverError(`strconv.ParseUint: parsing ${goQuote(s)}: value out of range`);
  return n;
}

function hasLeadingZeroes(s: string): boolean {
  return s.length > 1 && s[0] === '0';
}

/** blang `newVersionExtension`: `PreRelease` identifiers also refuse numeric leading zeroes. */
function parseIdentifier(s: string, kind: 'PreRelease' | 'BuildMeta'): Identifier {
  if (s.length === 0) throw new SemverError(`${kind} is empty`);
  if (NUMBERS.test(s)) {
    let num: bigint;
    try {
      num = parseUint(s);
    } catch (err) {
      throw new SemverError(`Invalid numeric ${kind} ${goQuote(s)}: ${(err as Error).message}`);
    }
    if (kind === 'PreRelease' && hasLeadingZeroes(s)) {
      throw new SemverError(`Numeric PreRelease version must not contain leading zeroes ${goQuote(s)}`);
    }
    return { str: s, num };
  }
  if (!ALPHANUM.test(s)) throw new SemverError(`Invalid character(s) found in ${kind} ${goQuote(s)}`);
  return { str: s, num: undefined };
}

/** One of major/minor/patch: digits only, no leading zero, uint64. */
function parseNumber(s: string, name: 'major' | 'minor' | 'patch'): bigint {
  if (!NUMBERS.test(s)) throw new SemverError(`Invalid character(s) found in ${name} number ${goQuote(s)}`);
  const title = `${name[0]?.toUpperCase()}${name.slice(1)}`;
  if (hasLeadingZeroes(s)) throw new SemverError(`${title} number must not contain leading zeroes ${goQuote(s)}`);
  return parseUint(s);
}

/**
 * blang `Parse`: strict `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`, no `v`, no leading zeroes.
 *
 * @throws SemverError with upstream's text (e.g. `No Major.Minor.Patch elements found`)
 */
export function parseVersion(s: string): Version {
  if (s.length === 0) throw new SemverError('Version string empty');
  const first = s.indexOf('.');
  const second = first < 0 ? -1 : s.indexOf('.', first + 1);
  if (second < 0) throw new SemverError('No Major.Minor.Patch elements found');
  const major = parseNumber(s.slice(0, first), 'major');
  const minor = parseNumber(s.slice(first + 1, second), 'minor');
  let patchStr = s.slice(second + 1);
  let build: string[] = [];
  let pre: string[] = [];
  const plus = patchStr.indexOf('+');
  if (plus >= 0) {
    build = patchStr.slice(plus + 1).split('.');
    patchStr = patchStr.slice(0, plus);
  }
  const dash = patchStr.indexOf('-');
  if (dash >= 0) {
    pre = patchStr.slice(dash + 1).split('.');
    patchStr = patchStr.slice(0, dash);
  }
  const patch = parseNumber(patchStr, 'patch');
  return {
    major,
    minor,
    patch,
    pre: pre.map((p) => parseIdentifier(p, 'PreRelease')),
    build: build.map((b) => parseIdentifier(b, 'BuildMeta')),
  };
}

/**
 * blang `ParseTolerant`: trims spaces, drops one leading `v`, removes leading zeroes and fills a
 * short `1` or `1.2` with zeroes (not when the short form has a prerelease or build). What
 * kapp-controller parses its own and the cluster's version with (reference §3.11.2).
 *
 * @throws SemverError with upstream's text
 */
export function parseTolerantVersion(input: string): Version {
  let s = input.trim();
  if (s.startsWith('v')) s = s.slice(1);
  const parts = splitN(s, '.', 3).map((p) => {
    if (p.length <= 1) return p;
    const trimmed = p.replace(/^0+/, '');
    return trimmed.length === 0 || !/^[0-9]/.test(trimmed) ? `0${trimmed}` : trimmed;
  });
  if (parts.length < 3) {
    if (/[+-]/.test(parts[parts.length - 1] ?? '')) {
      throw new SemverError('Short version cannot contain PreRelease/Build meta data');
    }
    while (parts.length < 3) parts.push('0');
  }
  return parseVersion(parts.join('.'));
}

/** Go `strings.SplitN`. */
function splitN(s: string, sep: string, n: number): string[] {
  const out: string[] = [];
  let rest = s;
  while (out.length < n - 1) {
    const i = rest.indexOf(sep);
    if (i < 0) break;
    out.push(rest.slice(0, i));
    rest = rest.slice(i + sep.length);
  }
  out.push(rest);
  return out;
}

/** `major.minor.patch` of a version, prerelease and build dropped (blang `FinalizeVersion`). */
export function finalizeVersion(v: Version): string {
  return `${v.major}.${v.minor}.${v.patch}`;
}

function sign(a: bigint, b: bigint): number {
  return a === b ? 0 : a > b ? 1 : -1;
}

/** Numeric identifiers below alphanumeric ones; numbers by value, strings by bytes. */
function compareIdentifier(a: Identifier, b: Identifier): number {
  if (a.num !== undefined && b.num !== undefined) return sign(a.num, b.num);
  if (a.num !== undefined) return -1;
  if (b.num !== undefined) return 1;
  return a.str === b.str ? 0 : a.str > b.str ? 1 : -1;
}

/** Pairwise, then the longer list above its prefix. */
function compareLists(a: readonly Identifier[], b: readonly Identifier[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const c = compareIdentifier(a[i] as Identifier, b[i] as Identifier);
    if (c !== 0) return c;
  }
  return Math.sign(a.length - b.length);
}

/**
 * The fork's `Version.Compare`: major, minor, patch; then prerelease (a release above any of its
 * prereleases); then build metadata (none below some).
 *
 * @returns -1, 0 or 1
 */
export function compare(a: Version, b: Version): number {
  const c = sign(a.major, b.major) || sign(a.minor, b.minor) || sign(a.patch, b.patch);
  if (c !== 0) return c;
  if (a.pre.length === 0 || b.pre.length === 0) {
    if (a.pre.length !== b.pre.length) return a.pre.length === 0 ? 1 : -1;
  } else {
    const p = compareLists(a.pre, b.pre);
    if (p !== 0) return p;
  }
  if (a.build.length === 0 || b.build.length === 0) return Math.sign(a.build.length - b.build.length);
  return compareLists(a.build, b.build);
}

/** A parsed range: true when the version is in it. */
export type Range = (v: Version) => boolean;

const COMPARATORS: Record<string, (c: number) => boolean> = {
  '': (c) => c === 0,
  '=': (c) => c === 0,
  '==': (c) => c === 0,
  '!': (c) => c !== 0,
  '!=': (c) => c !== 0,
  '>': (c) => c === 1,
  '>=': (c) => c >= 0,
  '<': (c) => c === -1,
  '<=': (c) => c <= 0,
};

/**
 * blang `splitAndTrim`: splits on spaces, except a space right after `>`, `<` or `=` (so
 * `>= 1.0.0` is one part), then deletes the spaces inside each part. Faithful to a blang quirk:
 * a one-character part is dropped.
 */
function splitAndTrim(s: string): string[] {
  const result: string[] = [];
  let last = 0;
  let lastChar = '';
  for (let i = 0; i < s.length; i++) {
    if (s[i] === ' ' && !'><='.includes(lastChar || '\0')) {
      if (last < i - 1) result.push(s.slice(last, i));
      last = i + 1;
    } else if (s[i] !== ' ') {
      lastChar = s[i] as string;
    }
  }
  if (last < s.length - 1) result.push(s.slice(last));
  return result.map((p) => p.replaceAll(' ', ''));
}

/** blang `splitORParts`. */
function splitOrParts(parts: string[]): string[][] {
  const out: string[][] = [];
  let last = 0;
  parts.forEach((p, i) => {
    if (p !== '||') return;
    if (i === 0) throw new SemverError("First element in range is '||'");
    out.push(parts.slice(last, i));
    last = i + 1;
  });
  if (last === parts.length) throw new SemverError("Last element in range is '||'");
  out.push(parts.slice(last));
  return out;
}

/** blang `splitComparatorVersion`: the operator is everything before the first digit. */
function splitComparatorVersion(s: string): [string, string] {
  const i = s.search(/\p{Nd}/u);
  if (i < 0) throw new SemverError(`Could not get version from string: ${goQuote(s)}`);
  return [s.slice(0, i).trim(), s.slice(i)];
}

/** Go `strconv.Atoi` then `Itoa(n + 1)` on one dot-part; '' when Atoi fails (blang ignores the error). */
function incrementPart(vStr: string, index: number): string {
  const parts = vStr.split('.');
  const p = parts[index];
  if (p === undefined || !/^[+-]?[0-9]+$/.test(p)) return '';
  const n = BigInt(p);
  if (n > INT64_MAX || n < -INT64_MAX - 1n) return '';
  parts[index] = String(n + 1n);
  return parts.join('.');
}

/**
 * blang `expandWildcardVersion`, mechanically: any part containing a lowercase `x` is rewritten
 * (`1.2.x` → `>=1.2.0-0 <1.3.0-0`, `>1.x` → `>=2.0.0-0`, `!=1.x` → `<1.0.0-0 >=2.0.0-0`). `X` and
 * `*` are not wildcards upstream and fail later as versions.
 */
function expandWildcards(parts: string[][]): string[][] {
  return parts.map((p) => {
    const out: string[] = [];
    for (const ap of p) {
      if (!ap.includes('x')) {
        out.push(ap);
        continue;
      }
      const [op, vStr] = splitComparatorVersion(ap);
      const dots = vStr.split('.');
      const wildcard = dots[dots.length - 1] === 'x' && (dots.length === 2 || dots.length === 3) ? dots.length : 0;
      let flat = vStr.replace('.x.x', '.x').replace('.x', '.0');
      if (flat.split('.').length === 2) flat += '.0';
      flat += '-0';
      let resultOp = '';
      let increment = false;
      switch (op) {
        case '>':
          resultOp = '>=';
          increment = true;
          break;
        case '>=':
          resultOp = '>=';
          break;
        case '<':
          resultOp = '<';
          break;
        case '<=':
          resultOp = '<';
          increment = true;
          break;
        case '':
        case '=':
        case '==':
          out.push(`>=${flat}`);
          resultOp = '<';
          increment = true;
          break;
        case '!=':
        case '!':
          out.push(`<${flat}`);
          resultOp = '>=';
          increment = true;
          break;
      }
      let resultVersion = flat;
      if (increment)
        resultVersion = wildcard === 3 ? incrementPart(flat, 1) : wildcard === 2 ? incrementPart(flat, 0) : '';
      out.push(resultOp + resultVersion);
    }
    return out;
  });
}

/**
 * blang `ParseRange`: comparators `<` `<=` `>` `>=` `=` `==` (or none) `!` `!=`, AND by space, OR by
 * `||` (AND binds tighter), `x` wildcards; no `^`, `~`, brackets or `v` prefix.
 *
 * @throws SemverError with upstream's text, e.g.
 *   `Could not parse Range ">v1.5.3": Could not parse comparator ">v" in ">v1.5.3"`
 */
export function parseRangeExpr(s: string): Range {
  const orParts = expandWildcards(splitOrParts(splitAndTrim(s)));
  const alternatives = orParts.map((andParts) =>
    andParts.map((ap) => {
      const [op, vStr] = splitComparatorVersion(ap);
      const test = COMPARATORS[op];
      if (test === undefined) {
        throw new SemverError(
          `Could not parse Range ${goQuote(ap)}: Could not parse comparator ${goQuote(op)} in ${goQuote(op + vStr)}`,
        );
      }
      let bound: Version;
      try {
        bound = parseVersion(vStr);
      } catch (err) {
        const detail = `Could not parse version ${goQuote(vStr)} in ${goQuote(op + vStr)}: ${(err as Error).message}`;
        throw new SemverError(`Could not parse Range ${goQuote(ap)}: ${detail}`);
      }
      return (v: Version) => test(compare(v, bound));
    }),
  );
  return (v) => alternatives.some((all) => all.every((f) => f(v)));
}
