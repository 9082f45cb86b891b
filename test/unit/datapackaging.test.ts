/**
 * Package names and the validation regexes behind the Package/PackageMetadata CRDs' CEL rules
 * (upstream `pkg/apiserver/apis/datapackaging/validation/validations.go`). The API server's own
 * evaluation of the rules is covered by test/integration/package-crds.test.ts.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import {
  PACKAGE_NAME_PLUS,
  PackageNameError,
  PackageValidationMessage,
  packageObjectName,
  STRICT_SEMVER_REGEX,
} from '../../functions/lib/api/datapackaging.js';
import { isDns1123Subdomain } from '../../functions/lib/api/names.js';
import { fixturePath } from '../harness/fixtures.js';

const KADRAS = fixturePath('kadras-packages', 'repo', 'packages');

/** Every Package of the kadras repository: [file name, metadata.name, refName, version]. */
function kadrasPackages(): Array<[string, string, string, string]> {
  const out: Array<[string, string, string, string]> = [];
  for (const dir of readdirSync(KADRAS)) {
    for (const file of readdirSync(path.join(KADRAS, dir))) {
      const doc = parse(readFileSync(path.join(KADRAS, dir, file), 'utf8')) as {
        kind: string;
        metadata: { name: string };
        spec: { refName: string; version: string };
      };
      if (doc.kind === 'Package') out.push([file, doc.metadata.name, doc.spec.refName, doc.spec.version]);
    }
  }
  return out;
}

describe('packageObjectName', () => {
  it.each([
    ['crossplane.packages.kadras.io', '2.2.0+kadras.2', 'crossplane.packages.kadras.io.2.2.0--kadras.2'],
    ['crossplane.packages.kadras.io', '2.3.4', 'crossplane.packages.kadras.io.2.3.4'],
    ['test-pkg.carvel.dev', '1.0.0+alpha.1', 'test-pkg.carvel.dev.1.0.0--alpha.1'],
    ['pkg.test.carvel.dev', '1.0.0-rc.1+build.5', 'pkg.test.carvel.dev.1.0.0-rc.1--build.5'],
    ['pkg.test.carvel.dev', '0.0.0-0', 'pkg.test.carvel.dev.0.0.0-0'],
  ])('%s %s → %s', (refName, version, name) => {
    expect(packageObjectName(refName, version)).toBe(name);
    expect(isDns1123Subdomain(name)).toBe(true);
  });

  it('is the identity of upstream names without + and a valid object name for every kadras package', () => {
    const packages = kadrasPackages();
    expect(packages.length).toBe(14);
    expect(packages.filter(([, name]) => name.includes('+')).map(([file]) => file)).toEqual(
      expect.arrayContaining(['2.2.0+kadras.2.yml', '1.28.1+kadras.1.yml']),
    );
    for (const [, upstreamName, refName, version] of packages) {
      const name = packageObjectName(refName, version);
      expect(upstreamName).toBe(`${refName}.${version}`);
      expect(name).toBe(upstreamName.replace('+', PACKAGE_NAME_PLUS));
      expect(isDns1123Subdomain(name), name).toBe(true);
    }
  });

  it.each([
    ['1.0.0-RC1', PackageValidationMessage.versionUppercase],
    ['1.0.0+Build', PackageValidationMessage.versionUppercase],
    ['1.0.0--x', PackageValidationMessage.versionAmbiguous],
    ['1.0.0-rc--1', PackageValidationMessage.versionAmbiguous],
    ['1.0.0-x-+b', PackageValidationMessage.versionAmbiguous],
    ['1.0.0+-b', PackageValidationMessage.versionAmbiguous],
  ])('refuses %s, which no name could stand for unambiguously', (version, reason) => {
    const error = (() => {
      try {
        packageObjectName('pkg.test.carvel.dev', version);
      } catch (e) {
        return e;
      }
      throw new Error('no error');
    })();
    expect(error).toBeInstanceOf(PackageNameError);
    expect(error).toMatchObject({
      field: 'spec.version',
      value: version,
      message: `spec.version: Invalid value: ${JSON.stringify(version)}: ${reason}`,
    });
  });

  it('is one-to-one on the versions it accepts', () => {
    const versions = ['1.0.0', '1.0.0-a', '1.0.0+a', '1.0.0-a-b', '1.0.0-a+b', '1.0.0-a.b', '1.0.0+a.b', '1.0.0-a+b.c'];
    const names = versions.map((v) => packageObjectName('pkg.test.carvel.dev', v));
    expect(new Set(names).size).toBe(versions.length);
  });
});

describe('STRICT_SEMVER_REGEX (blang/semver Parse, as upstream NewSemver)', () => {
  it.each([
    '0.0.0',
    '1.2.3',
    '10.20.30',
    '1.0.0-alpha',
    '1.0.0-alpha.1',
    '1.0.0-0.3.7',
    '1.0.0-x.7.z.92',
    '1.0.0-x-y-z.--',
    '2.2.0+kadras.2',
    '1.0.0-alpha+001',
    '1.0.0+20130313144700',
    '1.0.0-RC1',
  ])('accepts %s', (version) => {
    expect(STRICT_SEMVER_REGEX.test(version)).toBe(true);
  });

  it.each([
    '',
    'v1.0.0',
    '1.0',
    '1',
    '01.0.0',
    '1.02.0',
    '1.0.0-01',
    '1.0.0-',
    '1.0.0+',
    '1.0.0-a..b',
    '1.0.0 ',
    '1.0.0_1',
  ])('rejects %j', (version) => {
    expect(STRICT_SEMVER_REGEX.test(version)).toBe(false);
  });
});
