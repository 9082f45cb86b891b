/**
 * The Package and PackageMetadata CRDs (infra/crds, generated) on the real kube-apiserver of the
 * shared test cluster: upstream's create/update validation (`validations.go`) as CEL rules, the
 * `+` → `--` name encoding of build metadata (kadras packages), the `spec.refName` selectable
 * field and the printer columns of `kubectl get pkg`.
 */
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parse, stringify } from 'yaml';
import { PackageValidationMessage, packageObjectName } from '../../functions/lib/api/datapackaging.js';
import { DNS1123_SUBDOMAIN_MESSAGE } from '../../functions/lib/api/names.js';
import { fixturePath } from '../harness/fixtures.js';
import { kubectl } from '../harness/kube.js';

const kubeconfigPath = inject('kubeconfigPath');
const ns = `pkg-crds-${randomBytes(3).toString('hex')}`;
const CRD_DIR = path.resolve(import.meta.dirname, '../../infra/crds');
const KADRAS = fixturePath('kadras-packages', 'repo', 'packages');
const API_VERSION = 'data.packaging.carvel.dev/v1alpha1';

const k = (args: string[], input?: string) =>
  kubectl(kubeconfigPath, args, { check: false, ...(input === undefined ? {} : { input }) });

type Doc = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; spec: object };

/** A kadras fixture file, in the test namespace, with the name packageObjectName gives (as index-repo will). */
async function kadras(dir: string, file: string): Promise<Doc> {
  const doc = parse(await readFile(path.join(KADRAS, dir, file), 'utf8')) as Doc & {
    spec: { refName?: string; version?: string };
  };
  const name =
    doc.kind === 'Package' ? packageObjectName(doc.spec.refName ?? '', doc.spec.version ?? '') : doc.metadata.name;
  return { ...doc, metadata: { name, namespace: ns } };
}

function pkg(name: string, spec: Record<string, unknown>): Doc {
  return { apiVersion: API_VERSION, kind: 'Package', metadata: { name, namespace: ns }, spec };
}

/** `kubectl create -f -` of one object: exit code and the error lines (after `is invalid:`). */
async function create(doc: Doc): Promise<{ code: number; errors: string[] }> {
  const res = await k(['create', '-f', '-'], stringify(doc));
  const errors = res.stderr
    .replace(/^.*? is invalid: /s, '')
    .split('\n')
    .map((l) => l.replace(/^\* /, '').trim())
    .filter((l) => l !== '');
  return { code: res.code, errors: res.code === 0 ? [] : errors };
}

beforeAll(async () => {
  const files = ['packages.data.packaging.carvel.dev.yaml', 'packagemetadatas.data.packaging.carvel.dev.yaml'];
  const applied = await k(['apply', ...files.flatMap((f) => ['-f', path.join(CRD_DIR, f)])]);
  if (applied.code !== 0) throw new Error(`applying the CRDs failed: ${applied.stderr}`);
  await k(['wait', '--for=condition=Established', '--timeout=60s', ...files.map((f) => `crd/${f.slice(0, -5)}`)]);
  await k(['create', 'namespace', ns]);
  // The apiserver may serve a freshly established CRD a moment after Established.
  for (let i = 0; i < 50 && (await k(['get', 'packages.data.packaging.carvel.dev', '-n', ns])).code !== 0; i++) {
    await new Promise((r) => setTimeout(r, 200));
  }
});

afterAll(async () => {
  await k(['delete', 'namespace', ns, '--wait=false']);
});

describe('valid kadras packages are accepted', () => {
  it('PackageMetadata and every crossplane version, 2.2.0+kadras.2 included, under the encoded name', async () => {
    const dir = 'crossplane.packages.kadras.io';
    for (const file of ['metadata.yml', '2.2.0+kadras.2.yml', '2.3.2.yml', '2.3.4.yml']) {
      expect(await create(await kadras(dir, file)), file).toEqual({ code: 0, errors: [] });
    }
    expect(await create(await kadras('flux.packages.kadras.io', '2.8.3.yml'))).toEqual({ code: 0, errors: [] });
    const got = await k(['get', 'package', 'crossplane.packages.kadras.io.2.2.0--kadras.2', '-n', ns, '-o', 'json']);
    const stored = JSON.parse(got.stdout) as { spec: { refName: string; version: string } };
    expect([stored.spec.refName, stored.spec.version]).toEqual(['crossplane.packages.kadras.io', '2.2.0+kadras.2']);
  });

  it('an update is validated too', async () => {
    const patch = JSON.stringify({ spec: { version: '2.3.3' } });
    const res = await k([
      'patch',
      'package',
      'crossplane.packages.kadras.io.2.3.2',
      '-n',
      ns,
      '--type=merge',
      '-p',
      patch,
    ]);
    expect(res.code).toBe(1);
    expect(res.stderr).toContain(`metadata.name: Invalid value: "object": ${PackageValidationMessage.nameMismatch}`);
  });
});

describe('invalid objects are rejected with upstream messages', () => {
  const invalid = (value: string) => `Invalid value: "${value}"`;
  it.each<[string, Doc, string[]]>([
    [
      'name is not refName.version',
      pkg('pkg.test.carvel.dev.1.0.0', { refName: 'pkg.test.carvel.dev', version: '1.0.1' }),
      [`metadata.name: ${invalid('object')}: ${PackageValidationMessage.nameMismatch}`],
    ],
    [
      'the + of a version written verbatim is not the encoded name',
      pkg('pkg.test.carvel.dev.1.0.0-kadras.1', { refName: 'pkg.test.carvel.dev', version: '1.0.0+kadras.1' }),
      [`metadata.name: ${invalid('object')}: ${PackageValidationMessage.nameMismatch}`],
    ],
    [
      'refName with two segments',
      pkg('test.carvel.1.0.0', { refName: 'test.carvel', version: '1.0.0' }),
      [`spec.refName: ${invalid('string')}: should be a domain with at least three segments separated by dots`],
    ],
    [
      'refName not a DNS subdomain',
      pkg('x.test.carvel.dev.1.0.0', { refName: 'X_pkg.test.carvel.dev', version: '1.0.0' }),
      [
        `metadata.name: ${invalid('object')}: ${PackageValidationMessage.nameMismatch}`,
        `spec.refName: ${invalid('string')}: ${DNS1123_SUBDOMAIN_MESSAGE}`,
      ],
    ],
    [
      'refName missing',
      pkg('pkg.test.carvel.dev.1.0.0', { version: '1.0.0' }),
      ['spec.refName: Required value: can not be empty'],
    ],
    [
      'version missing',
      pkg('pkg.test.carvel.dev.1.0.0', { refName: 'pkg.test.carvel.dev' }),
      [`spec.version: ${invalid('object')}: cannot be empty`],
    ],
    [
      'version with a v prefix',
      pkg('pkg.test.carvel.dev.v1.0.0', { refName: 'pkg.test.carvel.dev', version: 'v1.0.0' }),
      [`spec.version: ${invalid('string')}: ${PackageValidationMessage.notSemver}`],
    ],
    [
      'version with a leading zero',
      pkg('pkg.test.carvel.dev.1.01.0', { refName: 'pkg.test.carvel.dev', version: '1.01.0' }),
      [`spec.version: ${invalid('string')}: ${PackageValidationMessage.notSemver}`],
    ],
    [
      'uppercase prerelease',
      pkg('pkg.test.carvel.dev.1.0.0-rc1', { refName: 'pkg.test.carvel.dev', version: '1.0.0-RC1' }),
      [
        `metadata.name: ${invalid('object')}: ${PackageValidationMessage.nameMismatch}`,
        `spec.version: ${invalid('string')}: ${PackageValidationMessage.versionUppercase}`,
      ],
    ],
    [
      'a version the encoding cannot tell apart',
      pkg('pkg.test.carvel.dev.1.0.0--x', { refName: 'pkg.test.carvel.dev', version: '1.0.0--x' }),
      [`spec.version: ${invalid('string')}: ${PackageValidationMessage.versionAmbiguous}`],
    ],
    [
      'PackageMetadata name with two segments',
      { apiVersion: API_VERSION, kind: 'PackageMetadata', metadata: { name: 'carvel.dev', namespace: ns }, spec: {} },
      [`metadata.name: ${invalid('object')}: should be a domain with at least three segments separated by dots`],
    ],
    [
      // One message, as upstream's IsFullyQualifiedName: the segment rule holds for a name that is not a subdomain.
      'PackageMetadata name that is not a DNS subdomain (and has two segments)',
      { apiVersion: API_VERSION, kind: 'PackageMetadata', metadata: { name: 'Carvel.dev', namespace: ns }, spec: {} },
      [`metadata.name: ${invalid('Carvel.dev')}: ${DNS1123_SUBDOMAIN_MESSAGE}`],
    ],
  ])('%s', async (_case, doc, errors) => {
    expect(await create(doc)).toEqual({ code: 1, errors });
  });
});

describe('kubectl get packages', () => {
  it('--field-selector spec.refName=X returns exactly the packages of X, with upstream columns', async () => {
    const res = await k([
      'get',
      'packages',
      '-n',
      ns,
      '--field-selector',
      'spec.refName=crossplane.packages.kadras.io',
      '-o',
      'jsonpath={.items[*].metadata.name}',
    ]);
    expect(res.code).toBe(0);
    expect(res.stdout.split(' ').sort()).toEqual([
      'crossplane.packages.kadras.io.2.2.0--kadras.2',
      'crossplane.packages.kadras.io.2.3.2',
      'crossplane.packages.kadras.io.2.3.4',
    ]);
    const flux = await k(['get', 'pkg', '-n', ns, '--field-selector', 'spec.refName=flux.packages.kadras.io']);
    expect(flux.stdout.split('\n')[0]?.split(/\s{2,}/)).toEqual(['NAME', 'PACKAGEMETADATA NAME', 'VERSION', 'AGE']);
    expect(flux.stdout.split('\n')[1]?.split(/\s+/).slice(0, 3)).toEqual([
      'flux.packages.kadras.io.2.8.3',
      'flux.packages.kadras.io',
      '2.8.3',
    ]);
    const none = await k([
      'get',
      'pkg',
      '-n',
      ns,
      '--field-selector',
      'spec.refName=none.test.carvel.dev',
      '-o',
      'name',
    ]);
    expect([none.code, none.stdout]).toEqual([0, '']);
  });

  it('kubectl get pkgm shows upstream columns', async () => {
    const res = await k(['get', 'pkgm', '-n', ns]);
    expect(res.stdout.split('\n')[0]?.split(/\s{2,}/)).toEqual([
      'NAME',
      'DISPLAY NAME',
      'CATEGORIES',
      'SHORT DESCRIPTION',
      'AGE',
    ]);
    expect(res.stdout).toContain('crossplane.packages.kadras.io   crossplane');
  });
});
