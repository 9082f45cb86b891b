/**
 * Hostile package repository bundles (issue 7, repository content is tenant input): kbld passes
 * every document of `.imgpkg/images.yml` that is not one of its own configuration kinds through
 * to its output (checked with kbld v0.46: a ClusterRoleBinding after the ImagesLock comes out
 * unchanged), and kapp deploys that output with the repository's kapp identity. Upstream
 * (`app_template.go`) has the same hole; kapp-lambda refuses such a bundle with a clear error and
 * checks the final stream before kapp sees it.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { templateRepository, unexpectedRenderedDocument } from '../../functions/lib/packaging/repo-template.js';
import { useTempDir } from './support/stage-deps.js';

const tmp = useTempDir('attack-repo-bundle-');

const PKG = `apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: app.corp.com.1.0.0
spec:
  refName: app.corp.com
  version: 1.0.0
`;

const LOCK = 'apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\nimages: []\n';

const CRB = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: pwn}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: default, namespace: tenant}]
`;

let n = 0;

/** A bundle root with `packages/` and the given `.imgpkg/images.yml` (a directory when `dir`). */
async function bundle(images: string | { dir: true }) {
  const base = path.join(tmp(), `case-${n++}`);
  const root = path.join(base, 'root');
  await mkdir(path.join(root, 'packages'), { recursive: true });
  const file = path.join(root, '.imgpkg', 'images.yml');
  if (typeof images === 'string') {
    await mkdir(path.dirname(file), { recursive: true });
    await writeFile(file, images);
  } else await mkdir(file, { recursive: true });
  return { root, scratch: path.join(base, 'scratch') };
}

/** ytt as in the pipeline; kbld as the real one: stdin, then the non-config documents of images.yml. */
function tools(kbldExtra: (images: string) => string) {
  const runner = new FakeCommandRunner();
  runner.on('ytt', { stdout: PKG }, (a) => a[0] === '--ignore-unknown-comments');
  runner.on('ytt', { stdout: PKG }, (a) => a.includes('-'));
  runner.on('ytt', { stdout: `${PKG}---\napiVersion: kapp.k14s.io/v1alpha1\nkind: Config\n` }, (a) =>
    a.some((x) => x.endsWith('packages.yml')),
  );
  runner.on('kbld', async (_req, call) => ({ stdout: `${call.stdin ?? ''}---\n${kbldExtra(call.args[3] ?? '')}` }));
  return runner;
}

const deps = (runner: FakeCommandRunner) => ({ runner, config: { toolTimeoutMs: 5000 } });

describe('attack: a bundle plants objects through .imgpkg/images.yml', () => {
  const hostile: Array<[string, string, string]> = [
    [
      'a ClusterRoleBinding after the ImagesLock',
      `${LOCK}---\n${CRB}`,
      'rbac.authorization.k8s.io/v1 ClusterRoleBinding',
    ],
    [
      'a Package for another namespace',
      `${LOCK}---\n${PKG.replace('metadata:\n', 'metadata:\n  namespace: other-tenant\n')}`,
      'data.packaging.carvel.dev/v1alpha1 Package',
    ],
    [
      'a kapp Config of its own',
      `${LOCK}---\napiVersion: kapp.k14s.io/v1alpha1\nkind: Config\n`,
      'kapp.k14s.io/v1alpha1 Config',
    ],
    ['an ImagesLock of another apiVersion', 'apiVersion: v1\nkind: ImagesLock\n', 'v1 ImagesLock'],
  ];
  for (const [name, images, found] of hostile) {
    it(`${name}: a clear template error, kbld never runs, nothing to deploy`, async () => {
      const { root, scratch } = await bundle(images);
      const runner = tools(() => '');
      const out = await templateRepository(
        { root, name: 'repo', namespace: 'ns', bundle: true, scratch },
        deps(runner),
      );
      expect(out.result.error).toBe(
        `Templating dir: Expected .imgpkg/images.yml to hold only imgpkg.carvel.dev/v1alpha1 ImagesLock documents but found '${found}'`,
      );
      expect(out.manifest).toBeUndefined();
      expect(runner.argv().map((a) => a[0])).not.toContain('kbld');
    });
  }

  it('images.yml as a directory (kbld -f would read every file in it) is refused', async () => {
    const { root, scratch } = await bundle({ dir: true });
    const runner = tools(() => '');
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: true, scratch }, deps(runner));
    expect(out.result.error).toBe('Templating dir: Expected .imgpkg/images.yml to be a file but it is a directory');
    expect(runner.argv().map((a) => a[0])).not.toContain('kbld');
  });

  it('an alias bomb in images.yml is a clear template error, not a thrown stage', async () => {
    const bomb = ['a: &a [x, x, x, x, x, x, x, x, x]'];
    for (const c of 'bcdefghij')
      bomb.push(
        `${c}: &${c} [${Array(9)
          .fill(`*${String.fromCharCode(c.charCodeAt(0) - 1)}`)
          .join(', ')}]`,
      );
    const { root, scratch } = await bundle(`${LOCK}---\n${bomb.join('\n')}\n`);
    const runner = tools(() => '');
    const out = await templateRepository({ root, name: 'repo', namespace: 'ns', bundle: true, scratch }, deps(runner));
    expect(out.result.error).toMatch(/^Templating dir: Parsing \.imgpkg\/images\.yml: .*alias/i);
    expect(runner.argv().map((a) => a[0])).not.toContain('kbld');
  });

  it('whatever kbld adds to the stream anyway is refused before kapp', async () => {
    const { root, scratch } = await bundle(LOCK);
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: true, scratch },
      deps(tools(() => CRB)),
    );
    expect(out.result.error).toBe(
      "Templating dir: Expected only Packages and PackageMetadatas of the repository's namespace but found 'rbac.authorization.k8s.io/v1 ClusterRoleBinding'",
    );
    expect(out.manifest).toBeUndefined();
  });

  it('a genuine ImagesLock renders as before', async () => {
    const { root, scratch } = await bundle(LOCK);
    const out = await templateRepository(
      { root, name: 'repo', namespace: 'ns', bundle: true, scratch },
      deps(tools(() => '')),
    );
    expect(out.result.error).toBeUndefined();
    expect(out.manifest).toContain('kind: Package');
  });

  it('the final check names a namespaced Package and a second Config', () => {
    const cfg = 'apiVersion: kapp.k14s.io/v1alpha1\nkind: Config\n';
    expect(unexpectedRenderedDocument(`${PKG}---\n${cfg}`)).toBeUndefined();
    expect(unexpectedRenderedDocument(`${cfg}---\n${cfg}`)).toBe(
      "Expected only Packages and PackageMetadatas of the repository's namespace but found 'kapp.k14s.io/v1alpha1 Config'",
    );
    expect(unexpectedRenderedDocument(PKG.replace('metadata:\n', 'metadata:\n  namespace: kube-system\n'))).toBe(
      "Expected only Packages and PackageMetadatas of the repository's namespace but found 'data.packaging.carvel.dev/v1alpha1 Package' in namespace 'kube-system'",
    );
  });
});
