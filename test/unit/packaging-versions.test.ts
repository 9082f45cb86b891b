/**
 * Version selection (functions/lib/packaging/versions.ts over semver.ts) against upstream's own
 * tests and documented behaviour. Every row names its source in `src`:
 *   range_test / semver_test = carvel-dev/semver `v4/range_test.go`, `v4/semver_test.go`;
 *   semvers_test / semvers.go / selector.go = vendir `pkg/vendir/versions/`;
 *   packageinstall.go = kapp-controller `pkg/packageinstall/packageinstall.go`;
 *   §N = ../shared/reference/kapp-controller.md; "range.go (derived)" = read off upstream's code.
 * Where blang's original range_test.go and the carvel fork disagree (build metadata), the fork wins,
 * as vendir's semvers_test.go shows.
 */
import { describe, expect, it } from 'vitest';
import { Annotation } from '../../functions/lib/api/constants.js';
import {
  compare,
  finalizeVersion,
  parseTolerantVersion,
  parseVersion,
  SemverError,
} from '../../functions/lib/packaging/semver.js';
import {
  type ConstraintCallback,
  compareVersions,
  highestConstrainedVersion,
  type PackageVersionCallbackOptions,
  type PackageVersionConstraints,
  packageVersionCallbacks,
  parseRange,
  VersionSelectionError,
  type VersionSelectionSemver,
  withExactPrereleaseRule,
} from '../../functions/lib/packaging/versions.js';

/** `range` matches `version` (`true`) or not. */
const ranges: { src: string; range: string; version: string; want: boolean }[] = [
  // range_test TestParseRange: simple expressions
  { src: 'range_test TestParseRange', range: '>1.2.3', version: '1.2.2', want: false },
  { src: 'range_test TestParseRange', range: '>1.2.3', version: '1.2.3', want: false },
  { src: 'range_test TestParseRange', range: '>1.2.3', version: '1.2.4', want: true },
  { src: 'range_test TestParseRange', range: '>=1.2.3', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange', range: '>=1.2.3', version: '1.2.4', want: true },
  { src: 'range_test TestParseRange', range: '>=1.2.3', version: '1.2.2', want: false },
  { src: 'range_test TestParseRange', range: '<1.2.3', version: '1.2.2', want: true },
  { src: 'range_test TestParseRange', range: '<1.2.3', version: '1.2.3', want: false },
  { src: 'range_test TestParseRange', range: '<1.2.3', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange', range: '<=1.2.3', version: '1.2.2', want: true },
  { src: 'range_test TestParseRange', range: '<=1.2.3', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange', range: '<=1.2.3', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange', range: '1.2.3', version: '1.2.2', want: false },
  { src: 'range_test TestParseRange', range: '1.2.3', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange', range: '1.2.3', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange', range: '=1.2.3', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange', range: '=1.2.3', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange', range: '==1.2.3', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange', range: '==1.2.3', version: '1.2.2', want: false },
  { src: 'range_test TestParseRange', range: '!=1.2.3', version: '1.2.2', want: true },
  { src: 'range_test TestParseRange', range: '!=1.2.3', version: '1.2.3', want: false },
  { src: 'range_test TestParseRange', range: '!1.2.3', version: '1.2.4', want: true },
  { src: 'range_test TestParseRange', range: '!1.2.3', version: '1.2.3', want: false },
  // AND by space
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.4', version: '1.2.2', want: false },
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.4', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.4', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange AND', range: '<1.2.2 <1.2.4', version: '1.2.1', want: true },
  { src: 'range_test TestParseRange AND', range: '<1.2.2 <1.2.4', version: '1.2.3', want: false },
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.5 !=1.2.4', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.5 !=1.2.4', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.5 !1.2.4', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange AND', range: '>1.2.2 <1.2.5 !1.2.4', version: '1.2.5', want: false },
  // OR by ||
  { src: 'range_test TestParseRange OR', range: '>1.2.2 || <1.2.4', version: '1.2.2', want: true },
  { src: 'range_test TestParseRange OR', range: '>1.2.2 || <1.2.4', version: '1.2.4', want: true },
  { src: 'range_test TestParseRange OR', range: '<1.2.2 || >1.2.4', version: '1.2.3', want: false },
  { src: 'range_test TestParseRange OR', range: '<1.2.2 || >1.2.4', version: '1.2.4', want: false },
  // x wildcards
  { src: 'range_test TestParseRange wildcard', range: '>1.x', version: '0.1.9', want: false },
  { src: 'range_test TestParseRange wildcard', range: '>1.x', version: '1.9.0', want: false },
  { src: 'range_test TestParseRange wildcard', range: '>1.x', version: '2.0.0', want: true },
  { src: 'range_test TestParseRange wildcard', range: '>1.2.x', version: '1.2.6', want: false },
  { src: 'range_test TestParseRange wildcard', range: '>1.2.x', version: '1.3.0', want: true },
  { src: 'range_test TestParseRange wildcard', range: '1.3.x', version: '1.2.0', want: false },
  { src: 'range_test TestParseRange wildcard', range: '1.3.x', version: '1.3.0-0', want: true },
  { src: 'range_test TestParseRange wildcard', range: '1.3.x', version: '1.3.9', want: true },
  { src: 'range_test TestParseRange wildcard', range: '1.3.x', version: '1.4.0-0', want: false },
  { src: 'range_test TestParseRange wildcard', range: '2.x', version: '1.9.9', want: false },
  { src: 'range_test TestParseRange wildcard', range: '2.x', version: '2.0.0-0', want: true },
  { src: 'range_test TestParseRange wildcard', range: '2.x', version: '2.9.9', want: true },
  { src: 'range_test TestParseRange wildcard', range: '2.x', version: '3.0.0-0', want: false },
  // wildcard expansion rules (range_test TestExpandWildcardVersion, observed through matching)
  { src: 'range_test TestExpandWildcardVersion >=1.2.x', range: '>=1.2.x', version: '1.2.0-0', want: true },
  { src: 'range_test TestExpandWildcardVersion <=1.2.x', range: '<=1.2.x', version: '1.2.9', want: true },
  { src: 'range_test TestExpandWildcardVersion <=1.2.x', range: '<=1.2.x', version: '1.3.0-0', want: false },
  { src: 'range_test TestExpandWildcardVersion <1.2.x', range: '<1.2.x', version: '1.2.0-0', want: false },
  // != of a wildcard expands to `<1.2.0-0 >=1.3.0-0` inside the same AND group, so it matches nothing upstream
  { src: 'range_test TestExpandWildcardVersion !=1.2.x', range: '!=1.2.x', version: '1.1.9', want: false },
  { src: 'range_test TestExpandWildcardVersion !=1.2.x', range: '!=1.2.x', version: '1.2.5', want: false },
  { src: 'range_test TestExpandWildcardVersion !=1.2.x', range: '!=1.2.x', version: '1.3.0', want: false },
  { src: 'range_test TestExpandWildcardVersion <=1.x', range: '<=1.x', version: '1.9.9', want: true },
  { src: 'range_test TestExpandWildcardVersion <=1.x', range: '<=1.x', version: '2.0.0-0', want: false },
  { src: 'range_test TestExpandWildcardVersion <1.x', range: '<1.x', version: '0.9.9', want: true },
  { src: 'range_test TestExpandWildcardVersion <1.x', range: '<1.x', version: '1.0.0-0', want: false },
  { src: 'range_test TestExpandWildcardVersion !=1.x', range: '!=1.x', version: '1.5.0', want: false },
  { src: 'range_test TestExpandWildcardVersion !=1.x', range: '!=1.x', version: '2.0.0', want: false },
  { src: 'range_test TestExpandWildcardVersion !=1.x', range: '!=1.x', version: '0.9.0', want: false },
  // combined
  { src: 'range_test TestParseRange combined', range: '>1.2.2 <1.2.4 || >=2.0.0', version: '1.2.3', want: true },
  { src: 'range_test TestParseRange combined', range: '>1.2.2 <1.2.4 || >=2.0.0', version: '1.2.4', want: false },
  { src: 'range_test TestParseRange combined', range: '>1.2.2 <1.2.4 || >=2.0.0', version: '2.0.1', want: true },
  { src: 'range_test TestParseRange combined', range: '1.x || >=2.0.x <2.2.x', version: '0.9.2', want: false },
  { src: 'range_test TestParseRange combined', range: '1.x || >=2.0.x <2.2.x', version: '1.2.2', want: true },
  { src: 'range_test TestParseRange combined', range: '1.x || >=2.0.x <2.2.x', version: '2.1.8', want: true },
  { src: 'range_test TestParseRange combined', range: '1.x || >=2.0.x <2.2.x', version: '2.2.0', want: false },
  { src: 'range_test TestParseRange combined', range: '>1.2.2 <1.2.4 || >=2.0.0 <3.0.0', version: '2.9.9', want: true },
  {
    src: 'range_test TestParseRange combined',
    range: '>1.2.2 <1.2.4 || >=2.0.0 <3.0.0',
    version: '3.0.0',
    want: false,
  },
  // spaces: around parts and between operator and version
  { src: 'range_test TestSplitAndTrim', range: '  >=   1.2.3   <=  1.2.3   ', version: '1.2.3', want: true },
  { src: 'range_test TestSplitAndTrim', range: '  >=   1.2.3   <=  1.2.3   ', version: '1.2.4', want: false },
  {
    src: 'range_test TestSplitAndTrim',
    range: '      1.2.3      ||     >=1.2.3     <1.2.3    ',
    version: '1.2.3',
    want: true,
  },
  { src: '§2.5 (">= 1.0.0" tolerated)', range: '>= 1.0.0 < 2.0.0', version: '1.5.0', want: true },
  { src: '§2.5 (">= 1.0.0" tolerated)', range: '>= 1.0.0 < 2.0.0', version: '2.0.0', want: false },
  // prereleases are not excluded by a range (only by the prerelease filter)
  { src: 'semvers_test TestSemverFilter', range: '>0.0.5 <5.0.0', version: '2.0.0-10', want: true },
  { src: 'semvers_test TestSemverFilter', range: '>0.0.5 <5.0.0', version: '2.0.0-10+meta.10', want: true },
  { src: 'semvers_test TestSemverFilter', range: '>0.0.5 <5.0.0', version: '0.0.1-pre.10', want: false },
  { src: '§2.5 (prereleases not excluded by the range)', range: '>=1.0.0', version: '1.1.0-rc.1', want: true },
  { src: '§2.5 (prereleases not excluded by the range)', range: '<2.0.0', version: '2.0.0-rc.1', want: true },
  // build metadata takes part in range comparisons (the fork; blang's range_test expects the opposite)
  {
    src: 'semvers_test TestSemverWithBuildMetadataAndConstraint',
    range: '>1.0.0+ab1.foo',
    version: '1.0.0+z1',
    want: true,
  },
  {
    src: 'semvers_test TestSemverWithBuildMetadataAndConstraint',
    range: '>1.0.0+ab1.foo',
    version: '1.0.0+ab1',
    want: false,
  },
  {
    src: 'semvers_test TestSemverWithBuildMetadataAndConstraint',
    range: '>1.0.0+ab1.foo',
    version: '1.0.0+2',
    want: false,
  },
  {
    src: 'semvers_test TestSemverWithBuildMetadataAndConstraint',
    range: '>1.0.0+ab1.foo',
    version: '1.0.0-pre+foo',
    want: false,
  },
  {
    src: 'semver_test compareTests (build compared) vs range_test "1.2.3+ignoreme"',
    range: '1.2.3',
    version: '1.2.3+ignoreme',
    want: false,
  },
  { src: 'semver_test compareTests (build compared)', range: '>1.2.3', version: '1.2.3+ignoreme', want: true },
  // blang splitAndTrim drops one-character parts: the lone "!" of "! 1.0.0" vanishes
  { src: 'range.go splitAndTrim (derived)', range: '! 1.0.0', version: '1.0.0', want: true },
  // ... and the lone "-" of a hyphen range, leaving two exact versions ANDed: nothing matches
  { src: 'range.go splitAndTrim (derived; no hyphen ranges)', range: '1.0.0 - 2.0.0', version: '1.5.0', want: false },
  { src: 'range.go splitAndTrim (derived; no hyphen ranges)', range: '1.0.0 - 2.0.0', version: '1.0.0', want: false },
];

describe('parseRange (blang ParseRange)', () => {
  it.each(ranges)('$range ∋ $version = $want ($src)', ({ range, version, want }) => {
    expect(parseRange(range)(version)).toBe(want);
  });
});

/** Ranges blang refuses, with its exact error text. */
const badRanges: { src: string; range: string; message: string }[] = [
  {
    src: 'range_test TestParseRange errors',
    range: '>>1.2.3',
    message: 'Could not parse Range ">>1.2.3": Could not parse comparator ">>" in ">>1.2.3"',
  },
  {
    src: 'range_test TestParseRange errors',
    range: '1.0',
    message: 'Could not parse Range "1.0": Could not parse version "1.0" in "1.0": No Major.Minor.Patch elements found',
  },
  { src: 'range_test TestParseRange errors', range: 'string', message: 'Could not get version from string: "string"' },
  { src: 'range_test TestParseRange errors', range: '', message: "Last element in range is '||'" },
  {
    src: 'range_test TestParseRange errors',
    range: 'fo.ob.ar.x',
    message: 'Could not get version from string: "fo.ob.ar.x"',
  },
  { src: 'range_test TestSplitORParts', range: '|| >1.2.3', message: "First element in range is '||'" },
  { src: 'range_test TestSplitORParts', range: '>1.2.3 ||', message: "Last element in range is '||'" },
  {
    src: 'range_test TestBuildVersionRange (invalid version)',
    range: '=1.2.3.4',
    message:
      'Could not parse Range "=1.2.3.4": Could not parse version "1.2.3.4" in "=1.2.3.4": Invalid character(s) found in patch number "3.4"',
  },
  {
    src: '§2.5 docs discrepancy (">v1.5.3")',
    range: '>v1.5.3',
    message: 'Could not parse Range ">v1.5.3": Could not parse comparator ">v" in ">v1.5.3"',
  },
  {
    src: '§2.5 (v prefix in a constraint)',
    range: 'v1.0.0',
    message: 'Could not parse Range "v1.0.0": Could not parse comparator "v" in "v1.0.0"',
  },
  {
    src: '§2.5 (v prefix in a constraint, second comparator)',
    range: '>=1.0.0 <v2.0.0',
    message: 'Could not parse Range "<v2.0.0": Could not parse comparator "<v" in "<v2.0.0"',
  },
  {
    src: '§2.5 (no ^)',
    range: '^1.0.0',
    message: 'Could not parse Range "^1.0.0": Could not parse comparator "^" in "^1.0.0"',
  },
  {
    src: '§2.5 (no ~)',
    range: '~1.2.0',
    message: 'Could not parse Range "~1.2.0": Could not parse comparator "~" in "~1.2.0"',
  },
  {
    src: '§2.5 (full x.y.z only)',
    range: '>=1.2',
    message:
      'Could not parse Range ">=1.2": Could not parse version "1.2" in ">=1.2": No Major.Minor.Patch elements found',
  },
  {
    src: 'range.go expandWildcardVersion (only lowercase x)',
    range: '1.X',
    message: 'Could not parse Range "1.X": Could not parse version "1.X" in "1.X": No Major.Minor.Patch elements found',
  },
  {
    src: 'range.go expandWildcardVersion (only lowercase x)',
    range: '1.2.*',
    message:
      'Could not parse Range "1.2.*": Could not parse version "1.2.*" in "1.2.*": Invalid character(s) found in patch number "*"',
  },
  { src: 'range.go splitComparatorVersion', range: '>=*', message: 'Could not get version from string: ">=*"' },
  {
    src: 'range.go splitAndTrim (derived: a one-character part is dropped)',
    range: '*',
    message: "Last element in range is '||'",
  },
];

describe('parseRange refusals', () => {
  it.each(badRanges)('$range ($src)', ({ range, message }) => {
    expect(() => parseRange(range)).toThrow(new SemverError(message));
  });
});

/** `compareVersions(a, b)`; the reverse is checked too (semver_test TestCompare "Test counterpart"). */
const comparisons: { src: string; a: string; b: string; want: number }[] = [
  { src: 'semver_test compareTests', a: '1.0.0', b: '1.0.0', want: 0 },
  { src: 'semver_test compareTests', a: '2.0.0', b: '1.0.0', want: 1 },
  { src: 'semver_test compareTests', a: '0.2.0', b: '0.1.0', want: 1 },
  { src: 'semver_test compareTests', a: '0.0.2', b: '0.0.1', want: 1 },
  { src: 'semver_test compareTests', a: '2.2.4', b: '1.2.4', want: 1 },
  { src: 'semver_test compareTests', a: '1.3.3', b: '1.2.3', want: 1 },
  { src: 'semver_test compareTests', a: '1.2.4', b: '1.2.3', want: 1 },
  { src: 'semver_test compareTests spec #11', a: '1.0.0', b: '2.0.0', want: -1 },
  { src: 'semver_test compareTests spec #11', a: '2.0.0', b: '2.1.0', want: -1 },
  { src: 'semver_test compareTests spec #11', a: '2.1.0', b: '2.1.1', want: -1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0', b: '1.0.0-alpha', want: 1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0-alpha', b: '1.0.0-alpha.1', want: -1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0-alpha.1', b: '1.0.0-alpha.beta', want: -1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0-alpha.beta', b: '1.0.0-beta', want: -1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0-beta', b: '1.0.0-beta.2', want: -1 },
  { src: 'semver_test compareTests spec #9 (numeric prerelease)', a: '1.0.0-beta.2', b: '1.0.0-beta.11', want: -1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0-beta.11', b: '1.0.0-rc.1', want: -1 },
  { src: 'semver_test compareTests spec #9', a: '1.0.0-rc.1', b: '1.0.0', want: -1 },
  { src: 'semver_test compareTests build', a: '1.0.0+1.2.3', b: '1.0.0', want: 1 },
  { src: 'semver_test compareTests build', a: '1.0.0+1.2.3', b: '1.0.0+1.2', want: 1 },
  { src: 'semver_test compareTests build', a: '1.0.0+a', b: '1.0.0+1', want: 1 },
  { src: 'semver_test compareTests build', a: '1.0.0+a', b: '1.0.0+a', want: 0 },
  { src: 'semver_test compareTests build', a: '1.0.0+1', b: '1.0.0+2', want: -1 },
  { src: 'semver_test compareTests build', a: '1.0.0-2+2', b: '1.0.0-3+1', want: -1 },
  { src: 'semvers_test TestSemverOrder', a: '0.0.1-pre.1', b: '0.0.1-pre.10', want: -1 },
  { src: 'semvers_test TestSemverOrder', a: '2.0.0-10', b: '2.0.0-10+meta.10', want: -1 },
  { src: 'semvers_test TestSemverWithBuildMetadata', a: '1.0.0+ab1', b: '1.0.0+ab1.foo', want: -1 },
  { src: 'semvers_test TestSemverWithBuildMetadata', a: '1.0.0+ab1.foo', b: '1.0.0+z1', want: -1 },
  { src: 'semvers_test TestSemverWithBuildMetadata', a: '1.0.0+2', b: '1.0.0+ab1', want: -1 },
];

describe('compareVersions (the fork: build metadata compared)', () => {
  it.each(comparisons)('$a vs $b = $want ($src)', ({ a, b, want }) => {
    expect(compareVersions(a, b)).toBe(want);
    expect(compareVersions(b, a)).toBe(-want || 0);
  });
});

/** Strict parse refusals (blang Parse) with the exact error text. */
const badVersions: { src: string; version: string; message: string }[] = [
  { src: 'semver_test wrongformatTests', version: '', message: 'Version string empty' },
  { src: 'semver_test wrongformatTests', version: '1.', message: 'No Major.Minor.Patch elements found' },
  { src: 'semver_test wrongformatTests', version: 'a.b.c', message: 'Invalid character(s) found in major number "a"' },
  { src: 'semver_test wrongformatTests', version: '1.a.1', message: 'Invalid character(s) found in minor number "a"' },
  { src: 'semver_test wrongformatTests', version: '1.1.a', message: 'Invalid character(s) found in patch number "a"' },
  { src: 'semver_test wrongformatTests', version: '1..1', message: 'strconv.ParseUint: parsing "": invalid syntax' },
  {
    src: 'semver_test wrongformatTests',
    version: '-1.1.1',
    message: 'Invalid character(s) found in major number "-1"',
  },
  {
    src: 'semver_test wrongformatTests (giant numbers)',
    version: '20000000000000000000.1.1',
    message: 'strconv.ParseUint: parsing "20000000000000000000": value out of range',
  },
  {
    src: 'semver_test wrongformatTests (leading zeroes)',
    version: '01.1.1',
    message: 'Major number must not contain leading zeroes "01"',
  },
  {
    src: 'semver_test wrongformatTests (leading zeroes)',
    version: '1.1.01',
    message: 'Patch number must not contain leading zeroes "01"',
  },
  {
    src: 'semver_test wrongformatTests (leading zeroes)',
    version: '1.1.1-beta.01',
    message: 'Numeric PreRelease version must not contain leading zeroes "01"',
  },
  { src: 'semver_test wrongformatTests', version: '0.0.0-!', message: 'Invalid character(s) found in PreRelease "!"' },
  { src: 'semver_test wrongformatTests (empty prversion)', version: '0.0.0-.alpha', message: 'PreRelease is empty' },
  {
    src: 'semver_test wrongformatTests (empty build meta data)',
    version: '0.0.0-alpha+test.',
    message: 'BuildMeta is empty',
  },
  {
    src: '§2.4 (spec.version is strict: no v)',
    version: 'v1.0.0',
    message: 'Invalid character(s) found in major number "v1"',
  },
];

describe('strict parse refusals', () => {
  it.each(badVersions)('$version ($src)', ({ version, message }) => {
    expect(() => parseVersion(version)).toThrow(new SemverError(message));
    expect(() => compareVersions(version, '1.0.0')).toThrow(SemverError);
  });
});

describe('parseTolerantVersion (blang ParseTolerant: kapp-controller and cluster versions, §3.11.2)', () => {
  it.each([
    { src: 'semver_test tolerantFormatTests', input: 'v1.2.3', want: '1.2.3' },
    { src: 'semver_test tolerantFormatTests', input: '1.2.0-alpha', want: '1.2.0-alpha' },
    { src: 'semver_test tolerantFormatTests', input: '1.2.00', want: '1.2.0' },
    { src: 'semver_test tolerantFormatTests', input: '\t1.2.3 ', want: '1.2.3' },
    { src: 'semver_test tolerantFormatTests', input: '01.02.03', want: '1.2.3' },
    { src: 'semver_test tolerantFormatTests', input: '000.0.03', want: '0.0.3' },
    { src: 'semver_test tolerantFormatTests', input: '1.2', want: '1.2.0' },
    { src: 'semver_test tolerantFormatTests', input: '1', want: '1.0.0' },
  ])('$input → $want ($src)', ({ input, want }) => {
    expect(compare(parseTolerantVersion(input), parseVersion(want))).toBe(0);
  });

  it.each([
    { input: '1.0+abc', message: 'Short version cannot contain PreRelease/Build meta data' },
    { input: '1.0-rc.1', message: 'Invalid character(s) found in minor number "0-rc"' },
  ])('$input is refused (semver_test wrongTolerantFormatTests)', ({ input, message }) => {
    expect(() => parseTolerantVersion(input)).toThrow(new SemverError(message));
  });

  it('finalizes to major.minor.patch (semver_test finalizeTests; §3.11.2 "pre/build stripped")', () => {
    expect(finalizeVersion(parseTolerantVersion('v1.27.3+k3s1'))).toBe('1.27.3');
    expect(finalizeVersion(parseVersion('1.2.3-alpha.b-eta+123.b-uild'))).toBe('1.2.3');
  });
});

const TEST_SEMVER_LIST = [
  '2.0.0-10+meta.10',
  '0.0.1-pre.10',
  '0.0.1-pre.1',
  '0.1.0',
  '2.0.0-10',
  '2.0.0',
  '0.0.1-rc.0',
];
const BUILD_LIST = [
  '1.0.0',
  '1.0.0+1',
  '1.0.0+2',
  '1.0.0+ab1',
  '1.0.0+z1',
  '1.0.0+ab1.foo',
  '1.0.0-pre+foo',
  '1.1.0',
  '1.1.0+aaaa',
  '2.0.0',
];
const CONSTRAINTS_LIST = ['2.0.3', '0.0.1', '0.3.1', '0.3.0', '2.0.0', '2.3.0', '0.0.1'];
const noThree: ConstraintCallback = { name: 'myConstraint', check: (v) => !v.includes('3') };
const notFound = (details: string) => `Expected to find at least one version, but did not (details: ${details})`;

/** The selection returns `want` when no `error` is expected, else throws VersionSelectionError with `error`. */
function expectSelection(run: () => string, want: string | undefined, error: string | undefined): void {
  if (error === undefined) expect(run()).toBe(want);
  else expect(run).toThrow(new VersionSelectionError(error));
}

/** `highestConstrainedVersion` returns `want`, or throws VersionSelectionError with `error`. */
const selections: {
  src: string;
  candidates: string[];
  selection: VersionSelectionSemver;
  callbacks?: ConstraintCallback[];
  want?: string;
  error?: string;
}[] = [
  {
    src: 'semvers_test TestSemverOrder (Highest = last of Sorted; equal versions keep input order)',
    candidates: [...TEST_SEMVER_LIST, 'v2.0.0'],
    selection: {},
    want: 'v2.0.0',
  },
  {
    src: 'semvers_test TestSemverOrder (stable order of equal versions)',
    candidates: ['v2.0.0', '2.0.0'],
    selection: {},
    want: '2.0.0',
  },
  {
    src: 'semvers_test TestSemverWithoutPrereleases',
    candidates: TEST_SEMVER_LIST,
    selection: { constraints: '<2.0.0' },
    want: '0.1.0',
  },
  {
    src: 'semvers_test TestSemverWithoutPrereleases (null = nil)',
    candidates: TEST_SEMVER_LIST,
    selection: { constraints: '<2.0.0', prereleases: null },
    want: '0.1.0',
  },
  {
    src: 'semvers_test TestSemverWithPrereleases (+ build compared)',
    candidates: TEST_SEMVER_LIST,
    selection: { constraints: '<2.0.0', prereleases: {} },
    want: '2.0.0-10+meta.10',
  },
  {
    src: 'semvers.go shouldKeepPrerelease (empty identifiers keep all)',
    candidates: TEST_SEMVER_LIST,
    selection: { constraints: '<0.1.0', prereleases: { identifiers: [] } },
    want: '0.0.1-rc.0',
  },
  {
    src: 'semvers_test TestSemverWithPrereleaseIdentifiers',
    candidates: TEST_SEMVER_LIST,
    selection: { constraints: '<0.1.0', prereleases: { identifiers: ['alpha', 'rc'] } },
    want: '0.0.1-rc.0',
  },
  {
    src: 'semvers_test TestSemverWithPrereleaseIdentifiers',
    candidates: ['0.0.1-pre.10', '0.0.1-alpha.1', '0.1.0'],
    selection: { constraints: '<0.1.0', prereleases: { identifiers: ['alpha', 'rc'] } },
    want: '0.0.1-alpha.1',
  },
  {
    src: 'semvers.go shouldKeepPrerelease (any dot-part, numeric too)',
    candidates: TEST_SEMVER_LIST,
    selection: { constraints: '<2.0.0', prereleases: { identifiers: ['10'] } },
    want: '2.0.0-10+meta.10',
  },
  { src: 'semvers_test TestSemverWithBuildMetadata', candidates: BUILD_LIST, selection: {}, want: '2.0.0' },
  {
    src: 'semvers_test TestSemverWithBuildMetadata',
    candidates: BUILD_LIST,
    selection: { constraints: '<1.1.0' },
    want: '1.0.0+z1',
  },
  {
    src: 'semvers_test TestSemverWithBuildMetadata',
    candidates: BUILD_LIST,
    selection: { constraints: '<2.0.0' },
    want: '1.1.0+aaaa',
  },
  {
    src: 'semvers_test TestSemverWithBuildMetadataAndConstraint',
    candidates: BUILD_LIST.slice(0, 7),
    selection: { constraints: '>1.0.0+ab1.foo', prereleases: {} },
    want: '1.0.0+z1',
  },
  {
    src: 'semvers_test TestHighestVersionWithConstraints',
    candidates: CONSTRAINTS_LIST,
    selection: { constraints: '>0.1.0' },
    callbacks: [noThree],
    want: '2.0.0',
  },
  {
    src: 'semvers_test TestHighestVersionWithConstraints (error names the callback)',
    candidates: CONSTRAINTS_LIST,
    selection: { constraints: '>2.1.0' },
    callbacks: [noThree],
    error: notFound('all=7 -> after-prereleases-filter=7 -> after-myConstraint=3 -> after-constraints-filter=0'),
  },
  {
    src: '§2.5 step 1 (leading v stripped, original returned)',
    candidates: ['v1.0.0', 'v1.2.0', '1.1.0'],
    selection: { constraints: '>=1.0.0' },
    want: 'v1.2.0',
  },
  {
    src: '§2.5 step 1 (unparseable candidates silently dropped)',
    candidates: ['latest', '1.3', '01.0.0', 'vv2.0.0', 'V2.0.0', '1.0.0'],
    selection: {},
    want: '1.0.0',
  },
  {
    src: '§2.5 step 1 (dropped before all=N)',
    candidates: ['latest', '1.3', '1.0.0'],
    selection: { constraints: '>1.0.0' },
    error: notFound('all=1 -> after-prereleases-filter=1 -> after-constraints-filter=0'),
  },
  {
    src: 'selector.go (no constraints: no after-constraints-filter step)',
    candidates: ['1.0.0-rc.1'],
    selection: {},
    error: notFound('all=1 -> after-prereleases-filter=0'),
  },
  {
    src: 'selector.go (no candidates)',
    candidates: [],
    selection: { constraints: '' },
    error: notFound('all=0 -> after-prereleases-filter=0'),
  },
  {
    src: '§2.5 step 6 (callbacks in order, then constraints)',
    candidates: ['1.0.0', '2.0.0', '3.0.0'],
    selection: { constraints: '>=3.0.0' },
    callbacks: [
      { name: 'kubernetes-version-check', check: (v) => v !== '3.0.0' },
      { name: 'kapp-controller-version-check', check: (v) => v !== '1.0.0' },
    ],
    error: notFound(
      'all=3 -> after-prereleases-filter=3 -> after-kubernetes-version-check=2 -> after-kapp-controller-version-check=1 -> after-constraints-filter=0',
    ),
  },
  {
    src: 'semvers.go Filter (callbacks see the candidate as written)',
    candidates: ['v1.0.0', '1.1.0'],
    selection: {},
    callbacks: [{ name: 'c', check: (v) => v.startsWith('v') }],
    want: 'v1.0.0',
  },
  {
    src: 'selector.go (constraints parsed even with no candidate left)',
    candidates: [],
    selection: { constraints: '>v1.5.3' },
    error: `Selecting versions: Parsing version constraint '>v1.5.3': Could not parse Range ">v1.5.3": Could not parse comparator ">v" in ">v1.5.3"`,
  },
  {
    src: '§2.5 (no ^)',
    candidates: ['1.0.0'],
    selection: { constraints: '^1.0.0' },
    error: `Selecting versions: Parsing version constraint '^1.0.0': Could not parse Range "^1.0.0": Could not parse comparator "^" in "^1.0.0"`,
  },
  {
    src: '§2.5 (OR)',
    candidates: ['1.5.0', '2.5.0', '3.5.0'],
    selection: { constraints: '<2.0.0 || >=3.0.0' },
    want: '3.5.0',
  },
  { src: '§2.5 (!=)', candidates: ['1.5.0', '2.5.0', '3.5.0'], selection: { constraints: '!=3.5.0' }, want: '2.5.0' },
  { src: '§2.5 (wildcard)', candidates: ['1.5.0', '2.5.0', '3.5.0'], selection: { constraints: '2.x' }, want: '2.5.0' },
  {
    src: '§2.5 (operator with a space)',
    candidates: ['1.5.0', '2.5.0'],
    selection: { constraints: '>= 1.0.0 < 2.0.0' },
    want: '1.5.0',
  },
  {
    src: '§2.5 (prerelease filtered, not ranged)',
    candidates: ['1.0.0', '2.0.0-rc.1'],
    selection: { constraints: '>=1.0.0' },
    want: '1.0.0',
  },
  {
    src: '§2.5 (prerelease kept by {} and inside the range)',
    candidates: ['1.0.0', '2.0.0-rc.1'],
    selection: { constraints: '>=1.0.0', prereleases: {} },
    want: '2.0.0-rc.1',
  },
  {
    src: 'packageinstall.go (exact prerelease without the rule)',
    candidates: ['3.0.0-rc.1', '2.0.0'],
    selection: { constraints: '3.0.0-rc.1' },
    error: notFound('all=2 -> after-prereleases-filter=1 -> after-constraints-filter=0'),
  },
  {
    src: 'packageinstall.go (exact prerelease with the rule)',
    candidates: ['3.0.0-rc.1', '2.0.0'],
    selection: withExactPrereleaseRule({ constraints: '3.0.0-rc.1' }),
    want: '3.0.0-rc.1',
  },
];

describe('highestConstrainedVersion (vendir HighestConstrainedVersionWithAdditionalConstraints)', () => {
  it.each(selections)('$src', ({ candidates, selection, callbacks, want, error }) => {
    expectSelection(() => highestConstrainedVersion(candidates, selection, callbacks), want, error);
  });
});

describe('withExactPrereleaseRule (packageinstall.go)', () => {
  it.each<{ src: string; selection: VersionSelectionSemver; want: VersionSelectionSemver }>([
    {
      src: 'packageinstall.go (one exact prerelease, prereleases nil)',
      selection: { constraints: '3.0.0-rc.1' },
      want: { constraints: '3.0.0-rc.1', prereleases: {} },
    },
    {
      src: 'packageinstall.go (null is nil)',
      selection: { constraints: '1.0.0-alpha+b.1', prereleases: null },
      want: { constraints: '1.0.0-alpha+b.1', prereleases: {} },
    },
    { src: 'packageinstall.go (no prerelease)', selection: { constraints: '3.0.0' }, want: { constraints: '3.0.0' } },
    {
      src: 'packageinstall.go (NewSemver refuses an operator)',
      selection: { constraints: '>=3.0.0-rc.1' },
      want: { constraints: '>=3.0.0-rc.1' },
    },
    {
      src: 'packageinstall.go (NewSemver is strict: no v)',
      selection: { constraints: 'v3.0.0-rc.1' },
      want: { constraints: 'v3.0.0-rc.1' },
    },
    {
      src: 'packageinstall.go (prereleases already set)',
      selection: { constraints: '3.0.0-rc.1', prereleases: { identifiers: ['beta'] } },
      want: { constraints: '3.0.0-rc.1', prereleases: { identifiers: ['beta'] } },
    },
    { src: 'packageinstall.go (empty constraints)', selection: { constraints: '' }, want: { constraints: '' } },
  ])('$src', ({ selection, want }) => {
    expect(withExactPrereleaseRule(selection)).toEqual(want);
  });
});

const IGNORE_K8S = { [Annotation.IgnoreKubernetesVersionSelection]: '' };
const IGNORE_KC = { [Annotation.IgnoreKappControllerVersionSelection]: '' };
const K8S_PKGS: PackageVersionConstraints[] = [
  { version: '1.0.0' },
  { version: '2.0.0', kubernetesConstraints: '>=1.30.0' },
];
const KC_PKGS: PackageVersionConstraints[] = [
  { version: '1.0.0' },
  { version: '2.0.0', kappControllerConstraints: '>=0.50.0' },
];

/** Selection through `packageVersionCallbacks`: `want`, or VersionSelectionError `error`. */
const packageChecks: {
  src: string;
  packages: PackageVersionConstraints[];
  options: PackageVersionCallbackOptions;
  constraints?: string;
  names?: string[];
  want?: string;
  error?: string;
}[] = [
  {
    src: 'packageinstall.go Find (no Kubernetes constraint: no cluster version asked, no check)',
    packages: KC_PKGS,
    options: { kappControllerVersion: 'v0.50.0' },
    names: ['kapp-controller-version-check'],
    want: '2.0.0',
  },
  {
    src: 'packageinstall.go Find (Kubernetes check first, then kapp-controller)',
    packages: K8S_PKGS,
    options: { kubernetesVersion: 'v1.30.1', kappControllerVersion: 'v0.50.0' },
    names: ['kubernetes-version-check', 'kapp-controller-version-check'],
    want: '2.0.0',
  },
  {
    src: 'packageinstall.go clusterVersionConstraintsSatisfied',
    packages: K8S_PKGS,
    options: { kubernetesVersion: 'v1.29.2+k3s1', kappControllerVersion: 'v0.50.0' },
    want: '1.0.0',
  },
  {
    src: '§2.5 step 6 (details with both callbacks)',
    packages: K8S_PKGS,
    options: { kubernetesVersion: 'v1.29.2+k3s1', kappControllerVersion: 'v0.50.0' },
    constraints: '>=2.0.0',
    error:
      'Expected to find at least one version, but did not (details: all=2 -> after-prereleases-filter=2 -> after-kubernetes-version-check=1 -> after-kapp-controller-version-check=1 -> after-constraints-filter=0)',
  },
  {
    src: 'component_info.go parseAndScrubVersion (cluster pre/build dropped)',
    packages: [{ version: '1.0.0', kubernetesConstraints: '>=1.30.0' }],
    options: { kubernetesVersion: 'v1.30.0-gke.1+abc', kappControllerVersion: 'v0.50.0' },
    want: '1.0.0',
  },
  {
    src: 'packageinstall.go (ignore-kubernetes-version-selection)',
    packages: K8S_PKGS,
    options: { annotations: IGNORE_K8S, kubernetesVersion: 'v1.29.2', kappControllerVersion: 'v0.50.0' },
    want: '2.0.0',
  },
  {
    src: 'packageinstall.go (cluster version fetched even when ignored; ParseTolerant prefixes 0)',
    packages: K8S_PKGS,
    options: { annotations: IGNORE_K8S, kubernetesVersion: 'latest', kappControllerVersion: 'v0.50.0' },
    error: 'Unable to get kubernetes version: Invalid character(s) found in major number "0latest"',
  },
  {
    src: 'packageinstall.go kcVersionConstraintsSatisfied',
    packages: KC_PKGS,
    options: { kappControllerVersion: 'v0.49.3' },
    want: '1.0.0',
  },
  {
    src: 'packageinstall.go kcVersionConstraintsSatisfied (controller pre/build dropped)',
    packages: KC_PKGS,
    options: { kappControllerVersion: 'v0.50.0-rc.1+dev' },
    want: '2.0.0',
  },
  {
    src: '§3.11.2 step 6 (unparseable controller version refuses kc-constrained packages)',
    packages: KC_PKGS,
    options: { kappControllerVersion: 'develop' },
    constraints: '>=2.0.0',
    error:
      'Expected to find at least one version, but did not (details: all=2 -> after-prereleases-filter=2 -> after-kapp-controller-version-check=1 -> after-constraints-filter=0)',
  },
  {
    src: 'packageinstall.go (ignore-kapp-controller-version-selection)',
    packages: KC_PKGS,
    options: { annotations: IGNORE_KC, kappControllerVersion: 'develop' },
    want: '2.0.0',
  },
  {
    src: 'kapp-lambda deviation (a Package range that does not parse refuses it)',
    packages: [{ version: '1.0.0' }, { version: '2.0.0', kappControllerConstraints: '^0.50.0' }],
    options: { kappControllerVersion: 'v0.50.0' },
    want: '1.0.0',
  },
];

describe('packageVersionCallbacks (kapp-controller PackageFinder.Find)', () => {
  it.each(packageChecks)('$src', ({ packages, options, constraints, names, want, error }) => {
    if (names !== undefined) expect(packageVersionCallbacks(packages, options).map((c) => c.name)).toEqual(names);
    const versions = packages.map((p) => p.version);
    expectSelection(
      () => highestConstrainedVersion(versions, { constraints }, packageVersionCallbacks(packages, options)),
      want,
      error,
    );
  });
});
