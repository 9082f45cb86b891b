/**
 * The fixed PackageRepository template pipeline (`functions/lib/packaging/repo-template.ts`,
 * upstream `pkg/pkgrepository/app_template.go`) over the fake command runner: the argv sequence
 * of the one-pass run and of upstream's way, the stream handed between tools, and every error
 * with upstream's text.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { exitWith, FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import {
  cleanUpOverlay,
  filterRepositoryJson,
  filterRepositoryResources,
  INVALID_PACKAGE_REPOSITORY_MESSAGE,
  JSON_CHECK_OVERLAY,
  REBASE_CONFIG,
  sortVersions,
  templateRepository,
} from '../../functions/lib/packaging/repo-template.js';
import { useTempDir } from './support/stage-deps.js';

const tmp = useTempDir('repo-template-');

const PKG = `apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: app.corp.com.1.0.0+build.1
  annotations:
    packaging.carvel.dev/package-repository-ref: ns/repo
spec:
  refName: app.corp.com
  version: 1.0.0+build.1
  futureField: dropped
`;

const PKGM = `apiVersion: data.packaging.carvel.dev/v1alpha1
kind: PackageMetadata
metadata:
  name: app.corp.com
spec:
  displayName: App
`;

let n = 0;

/** A fresh repository root (with `packages/` unless `packages` is false) and scratch directory. */
async function dirs(packages = true) {
  const base = path.join(tmp(), `case-${n++}`);
  const root = path.join(base, 'root');
  await mkdir(packages ? path.join(root, 'packages') : root, { recursive: true });
  return { root, scratch: path.join(base, 'scratch') };
}

/** A ytt's answer printing `cleaned` as it is, or with `-o json` as ytt prints it (concatenated objects). */
function cleanedAnswer(cleaned: string, stderr = '') {
  return (_req: unknown, call: { args: readonly string[] }) => ({
    stderr,
    stdout: call.args.includes('json')
      ? parseAllDocuments(cleaned)
          .map((d) => JSON.stringify(d.toJS()))
          .join('')
      : cleaned,
  });
}

/** The one-pass ytt: over `packages/` with the clean-up and JSON-check overlays. */
const isOnePass = (a: readonly string[]) => a.some((x) => x.endsWith('kapp-lambda-json-check.yml'));

/**
 * A fake runner scripting the tools: the one-pass ytt prints `cleaned` (as JSON), upstream's
 * first ytt prints `packages`, upstream's clean-up ytt prints `cleaned` (as JSON when asked),
 * kbld echoes its stdin after `# relocated`.
 */
function fakeTools(opts: { packages?: string; cleaned?: string } = {}) {
  const runner = new FakeCommandRunner();
  const cleaned = opts.cleaned ?? `${PKG}---\n${PKGM}`;
  runner.on('ytt', { stdout: opts.packages ?? 'pass-1\n' }, (a) => a[0] === '--ignore-unknown-comments');
  runner.on('ytt', cleanedAnswer(cleaned), (a) => a.includes('-'));
  runner.on('ytt', cleanedAnswer(cleaned, 'ytt warnings of the repository\n'), isOnePass);
  runner.on('kbld', async (_req, call) => ({ stdout: `# relocated\n${call.stdin ?? ''}` }));
  return runner;
}

const deps = (runner: FakeCommandRunner) => ({ runner, config: { toolTimeoutMs: 5000 } });

describe('templateRepository', () => {
  it('runs one ytt over packages/ with the clean-up and JSON-check overlays, then kbld over the filtered documents and the rebase Config', async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools();
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: true, scratch }, deps(runner));

    expect(out.result.error).toBeUndefined();
    const cleanUp = path.join(scratch, 'one-pass', 'kapp-controller-clean-up.yml');
    const check = path.join(scratch, 'one-pass', 'kapp-lambda-json-check.yml');
    expect(runner.argv()).toEqual([
      ['ytt', '--ignore-unknown-comments', '-f', path.join(root, 'packages'), '-f', cleanUp, '-f', check, '-o', 'json'],
      ['kbld', '-f', '-', '-f', path.join(root, '.imgpkg', 'images.yml'), '--build=false'],
    ]);
    expect(runner.calls.every((c) => c.timeoutMs === 5000)).toBe(true);
    expect(await readFile(cleanUp, 'utf8')).toBe(cleanUpOverlay('ns/repo'));
    expect(await readFile(check, 'utf8')).toBe(JSON_CHECK_OVERLAY);
    const stdin = runner.calls[1]?.stdin ?? '';
    expect(stdin.endsWith(REBASE_CONFIG)).toBe(true);
    expect(parseAllDocuments(stdin).map((d) => d.toJS().kind)).toEqual(['Package', 'PackageMetadata', 'Config']);
    expect(out.manifest).toBe(`# relocated\n${stdin}`);
    expect(out.versions).toEqual({ 'app.corp.com': ['1.0.0+build.1'] });
  });

  it("without a bundle runs one tool; the manifest holds the filtered packages with encoded names; stderr is empty as upstream's last ytt", async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools();
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: false, scratch }, deps(runner));

    expect(runner.argv().map((a) => a[0])).toEqual(['ytt']);
    expect(out.result).toEqual({ stdout: '', stderr: '', exitCode: 0, finished: true });
    const docs = parseAllDocuments(out.manifest ?? '').map((d) => d.toJS());
    expect(docs.map((d) => [d.kind, d.metadata?.name])).toEqual([
      ['Package', 'app.corp.com.1.0.0--build.1'],
      ['PackageMetadata', 'app.corp.com'],
      ['Config', undefined],
    ]);
    expect(docs[0].spec).toEqual({ refName: 'app.corp.com', version: '1.0.0+build.1' });
    expect(docs[2]).toEqual(parseAllDocuments(REBASE_CONFIG).at(-1)?.toJS());
  });

  it('without a bundle, a namespaced document left after the clean-up is refused before kapp', async () => {
    const { root, scratch } = await dirs();
    const namespaced = PKG.replace('metadata:\n', 'metadata:\n  namespace: kube-system\n');
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: false, scratch },
      deps(fakeTools({ cleaned: namespaced })),
    );
    expect(out.result.error).toBe(
      "Templating dir: Expected only Packages and PackageMetadatas of the repository's namespace but found 'data.packaging.carvel.dev/v1alpha1 Package' in namespace 'kube-system'",
    );
    expect(out.manifest).toBeUndefined();
  });

  it("fails with upstream's text when packages/ is missing, without running a tool", async () => {
    const { root, scratch } = await dirs(false);
    const runner = fakeTools();
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: false, scratch }, deps(runner));
    expect(out.result).toEqual({
      stdout: '',
      stderr: '',
      exitCode: -1,
      error: "Invalid package repository content: must contain 'packages/' directory but did not",
      finished: true,
    });
    expect(out.manifest).toBeUndefined();
    expect(runner.calls).toEqual([]);
  });

  it('fails the same way when packages is a file', async () => {
    const { root, scratch } = await dirs(false);
    await writeFile(path.join(root, 'packages'), 'not a directory');
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: false, scratch },
      deps(fakeTools()),
    );
    expect(out.result.error).toBe(INVALID_PACKAGE_REPOSITORY_MESSAGE);
  });

  it("a failing one-pass ytt goes upstream's way, whose first ytt's failure ends the run with its stderr", async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools();
    runner.on('ytt', exitWith(1, 'ytt: Error: bad yaml\n'), (a) => a[0] === '--ignore-unknown-comments');
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: true, scratch }, deps(runner));
    expect(out.result).toMatchObject({
      exitCode: 1,
      stderr: 'ytt: Error: bad yaml\n',
      error: 'Templating dir: Error (see .status.usefulErrorMessage for details)',
    });
    expect(out.manifest).toBeUndefined();
    expect(runner.argv().map((a) => isOnePass(a))).toEqual([true, false]);
  });

  it('a canceled one-pass ytt (the repository deleted) is not run again', async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools();
    const ac = new AbortController();
    ac.abort();
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: false, scratch, signal: ac.signal },
      deps(runner),
    );
    expect(out.result.error).toBeDefined();
    expect(out.manifest).toBeUndefined();
    expect(runner.calls).toHaveLength(1);
  });

  it("upstream's way: ytt over packages/, then the clean-up ytt over its stream, the repository named in the overlay", async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools();
    runner.on('ytt', exitWith(1, 'ytt: Error: anything\n'), isOnePass);
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: false, scratch }, deps(runner));
    expect(out.result.error).toBeUndefined();
    const cleanUpDir = path.join(scratch, 'clean-up');
    expect(runner.argv().slice(1)).toEqual([
      ['ytt', '--ignore-unknown-comments', '-f', path.join(root, 'packages')],
      ['ytt', '-f', '-', '--file-mark=stdin.yml:type=yaml-plain', '-f', cleanUpDir, '-o', 'json'],
    ]);
    expect(runner.calls[2]?.stdin).toBe('pass-1\n');
    expect(await readFile(path.join(cleanUpDir, 'kapp-controller-clean-up.yml'), 'utf8')).toBe(
      cleanUpOverlay('ns/repo'),
    );
    expect(out.versions).toEqual({ 'app.corp.com': ['1.0.0+build.1'] });
  });

  it('a failing kbld (e.g. no .imgpkg/images.yml) fails the run', async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools();
    runner.on('kbld', exitWith(1, 'kbld: Error: open images.yml: no such file or directory\n'));
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: true, scratch }, deps(runner));
    expect(out.result.error).toBe('Templating dir: Error (see .status.usefulErrorMessage for details)');
    expect(out.result.stderr).toContain('no such file or directory');
    expect(out.versions).toBeUndefined();
  });

  it("a document of another kind after clean-up is an error set on upstream's clean-up result", async () => {
    const { root, scratch } = await dirs();
    const runner = fakeTools({ cleaned: 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n' });
    runner.on('ytt', cleanedAnswer('apiVersion: v1\nkind: ConfigMap\n', 'warning\n'), (a) => a.includes('-'));
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: false, scratch }, deps(runner));
    expect(out.result).toEqual({
      stdout: '',
      stderr: 'warning\n',
      exitCode: 0,
      error: "Expected group 'data.packaging.carvel.dev' but was ''",
      finished: true,
    });
    expect(runner.calls).toHaveLength(3);
  });

  it.each([
    ['a value JSON cannot hold (.inf)', `${PKG}  maximum: .inf\n`, [false]],
    ['ytt failing to print JSON (a key that is not a string)', PKG, [true, false]],
  ])("%s: the JSON check fails the one pass; upstream's clean-up ytt prints YAML", async (_what, cleaned, jsonRuns) => {
    const { root, scratch } = await dirs();
    const runner = fakeTools({ packages: cleaned, cleaned });
    runner.on('ytt', exitWith(2, 'panic: Expected key to be string\n'), (a) => a.includes('json') && !isOnePass(a));
    runner.on('ytt', exitWith(1, 'json.encode: json: unsupported value: +Inf\n'), isOnePass);
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: false, scratch }, deps(runner));
    expect(out.result.error).toBeUndefined();
    const cleanUps = runner.argv().filter((a) => a.includes('-'));
    expect(cleanUps.map((a) => a.includes('json'))).toEqual(jsonRuns);
    expect(runner.calls).toHaveLength(2 + jsonRuns.length);
    expect(out.versions).toEqual({ 'app.corp.com': ['1.0.0+build.1'] });
  });

  it('re-encodes documents as JSON, so no string is re-read as another type', async () => {
    const { root, scratch } = await dirs();
    const cleaned = PKG.replace('futureField: dropped', 'releaseNotes: "yes"');
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: false, scratch },
      deps(fakeTools({ cleaned })),
    );
    expect(out.manifest).toContain('"releaseNotes":"yes"');
    expect(parseAllDocuments(out.manifest ?? '')[0]?.toJS().spec.releaseNotes).toBe('yes');
  });

  it('a version no Package name can hold is an error naming the package', async () => {
    const { root, scratch } = await dirs();
    const bad = PKG.replaceAll('1.0.0+build.1', '1.0.0-RC.1');
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: false, scratch },
      deps(fakeTools({ cleaned: bad })),
    );
    expect(out.result.error).toMatch(
      /^Encoding name of Package 'app\.corp\.com\.1\.0\.0-RC\.1': spec\.version: Invalid value: "1\.0\.0-RC\.1": must not contain uppercase letters/,
    );
  });
});

describe('cleanUpOverlay', () => {
  it('names the repository as a quoted string in the annotation value', () => {
    expect(cleanUpOverlay('tenant-a/kadras.repo')).toContain(
      'packaging.carvel.dev/package-repository-ref: "tenant-a/kadras.repo"',
    );
  });

  it.each(['ns', 'ns/a/b', 'ns/"x"', 'ns/x\n#@ fail("x")', 'NS/x'])('refuses %j, which is not two DNS names', (ref) => {
    expect(() => cleanUpOverlay(ref)).toThrow(/not a <namespace>\/<name>/);
  });
});

describe('filterRepositoryResources', () => {
  it('drops unknown fields and keeps a Package named other than <refName>.<version> as it is', () => {
    const misnamed = PKG.replace('name: app.corp.com.1.0.0+build.1', 'name: other');
    const { manifest, versions } = filterRepositoryResources(`${misnamed}---\n${PKGM}`);
    const docs = parseAllDocuments(manifest).map((d) => d.toJS());
    expect(docs[0].metadata.name).toBe('other');
    expect(docs[0].spec.futureField).toBeUndefined();
    expect(versions).toEqual({ 'app.corp.com': ['1.0.0+build.1'] });
  });

  it.each([
    [
      'apiVersion: other.dev/v1alpha1\nkind: Package\n',
      "Expected group 'data.packaging.carvel.dev' but was 'other.dev'",
    ],
    ['apiVersion: data.packaging.carvel.dev/v1\nkind: Package\n', "Expected version 'v1alpha1' but was 'v1'"],
    [
      'apiVersion: data.packaging.carvel.dev/v1alpha1\nkind: PackageInstall\n',
      "Expected kind to be 'Package' or 'PackageMetadata' but was 'PackageInstall'",
    ],
  ])('refuses %j', (doc, message) => {
    expect(() => filterRepositoryResources(doc)).toThrow(message);
  });

  it('refuses a Package whose fields have the wrong types', () => {
    expect(() => filterRepositoryResources(PKG.replace('version: 1.0.0+build.1', 'version: [1]'))).toThrow(
      /^Deserializing resource: invalid Package app\.corp\.com\.1\.0\.0\+build\.1: spec\.version: /,
    );
  });

  it('refuses a stream that is not YAML', () => {
    expect(() => filterRepositoryResources('a: [\n')).toThrow(/^Parsing stream of resources: /);
  });

  it('an empty stream yields no documents', () => {
    expect(filterRepositoryResources('')).toEqual({ manifest: '', versions: {} });
  });
});

describe('filterRepositoryJson', () => {
  const json = (yaml: string) => JSON.stringify(parseAllDocuments(yaml)[0]?.toJS());

  it("reads ytt's concatenated JSON documents, braces and quotes inside strings included", () => {
    const pkgm = PKGM.replace('displayName: App', 'displayName: \'a "}{" b\'');
    const out = filterRepositoryJson(`${json(PKG)}${json(pkgm)}\n`);
    expect(out?.versions).toEqual({ 'app.corp.com': ['1.0.0+build.1'] });
    const docs = parseAllDocuments(out?.manifest ?? '').map((d) => d.toJS());
    expect(docs.map((d) => d.metadata.name)).toEqual(['app.corp.com.1.0.0--build.1', 'app.corp.com']);
    expect(docs[1].spec.displayName).toBe('a "}{" b');
  });

  it('gives the same documents as the YAML stream', () => {
    expect(filterRepositoryJson(`${json(PKG)}${json(PKGM)}`)).toEqual(filterRepositoryResources(`${PKG}---\n${PKGM}`));
  });

  it.each(['"text"', '5', '{"a":1', '{"a":1}}', 'apiVersion: v1'])('leaves %j to the YAML path', (stream) => {
    expect(filterRepositoryJson(stream)).toBeUndefined();
  });

  it('refuses other kinds with the same errors', () => {
    expect(() => filterRepositoryJson('{"apiVersion":"v1","kind":"ConfigMap"}')).toThrow(
      "Expected group 'data.packaging.carvel.dev' but was ''",
    );
  });
});

describe('sortVersions', () => {
  it('sorts by semver precedence; build metadata ties and non-semver versions keep their order', () => {
    expect(
      sortVersions(['2.3.4', '10.0.0', '2.2.0+kadras.2', '2.3.2', 'v1', '1.0.0-rc.10', '1.0.0-rc.2', '1.0.0']),
    ).toEqual(['1.0.0-rc.2', '1.0.0-rc.10', '1.0.0', '2.2.0+kadras.2', '2.3.2', '2.3.4', '10.0.0', 'v1']);
  });
});
