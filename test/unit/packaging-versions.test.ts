/**
 * Version selection (functions/lib/packaging/versions.ts, semver.ts) against upstream's own tests
 * and documented behaviour: carvel-dev/semver v4 `range_test.go` and `semver_test.go`, vendir
 * `pkg/vendir/versions/semvers_test.go`, kapp-controller `pkg/packageinstall/packageinstall.go`,
 * reference §2.5, §3.11.2 and §7.1. Each case names its source.
 */
import { describe, expect, it } from 'vitest';
import {
  compareVersions,
  highestConstrainedVersion,
  parseRange,
  VersionSelectionError,
  withExactPrereleaseRule,
} from '../../functions/lib/packaging/versions.js';

describe('highestConstrainedVersion', () => {
  it('picks the highest candidate that passes every filter', () => {
    // vendir semvers_test.go TestHighestVersionWithConstraints
    const vs = ['2.0.3', '0.0.1', '0.3.1', '0.3.0', '2.0.0', '2.3.0', '0.0.1'];
    const cb = [{ name: 'myConstraint', check: (v: string) => !v.includes('3') }];
    expect(highestConstrainedVersion(vs, { constraints: '>0.1.0' }, cb)).toBe('2.0.0');
    expect(() => highestConstrainedVersion(vs, { constraints: '>2.1.0' }, cb)).toThrow(
      new VersionSelectionError(
        'Expected to find at least one version, but did not (details: all=7 -> after-prereleases-filter=7 -> after-myConstraint=3 -> after-constraints-filter=0)',
      ),
    );
  });
});

describe('parseRange, compareVersions, withExactPrereleaseRule', () => {
  it('follow blang', () => {
    // carvel-dev/semver range_test.go TestParseRange "1.x || >=2.0.x <2.2.x"
    expect(parseRange('1.x || >=2.0.x <2.2.x')('2.1.8')).toBe(true);
    // carvel-dev/semver semver_test.go compareTests "Ignore Build metadata" (fork: build compared)
    expect(compareVersions('1.0.0+1.2.3', '1.0.0')).toBe(1);
    // kapp-controller packageinstall.go: single exact prerelease version
    expect(withExactPrereleaseRule({ constraints: '3.0.0-rc.1' })).toEqual({
      constraints: '3.0.0-rc.1',
      prereleases: {},
    });
  });
});
