/**
 * The fixed PackageRepository template pipeline (`functions/lib/packaging/repo-template.ts`) with
 * the real pinned ytt and kbld and the real command runner, over the kadras package repository
 * (../shared/fixtures/kadras-packages/repo: 8 PackageMetadatas, 14 Packages, two versions with
 * build metadata) and over an inline-style root holding a document of another kind.
 */
import { cp, mkdir, mkdtemp, realpath, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { type RepoTemplateInput, templateRepository } from '../../functions/lib/packaging/repo-template.js';
import type { TemplateRunDeps } from '../../functions/lib/template/execute.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { fixturePath } from '../harness/fixtures.js';

const KADRAS = fixturePath('kadras-packages', 'repo');
const REPO_ANNOTATIONS = {
  'kapp.k14s.io/disable-original': '',
  'kapp.k14s.io/disable-wait': '',
  'packaging.carvel.dev/package-repository-ref': 'tenant-a/kadras',
  'kapp.k14s.io/create-strategy': 'fallback-on-update-or-noop',
};
const FLUX_DIGEST = 'sha256:e5320f33b7f345133b5cfea14363a1aab71274110ef5ea4afbe80da7c310a8d5';

let scratch: string;
let deps: TemplateRunDeps;
let n = 0;

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'repo-template-')));
  await mkdir(path.join(scratch, 'home'));
  const runner = createCommandRunner({
    allow: ['ytt', 'kbld'],
    resolveBin: cacheBinResolver(cacheRoot()),
    home: path.join(scratch, 'home'),
    tmpDir: scratch,
  });
  deps = { runner, config: {} };
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

async function run(input: Omit<RepoTemplateInput, 'scratch' | 'name' | 'namespace'>) {
  const work = path.join(scratch, `run-${n++}`);
  await mkdir(work);
  const out = await templateRepository({ ...input, name: 'kadras', namespace: 'tenant-a', scratch: work }, deps);
  const docs = parseAllDocuments(out.manifest ?? '').map((d) => d.toJS());
  return { out, docs, of: (kind: string) => docs.filter((d) => d?.kind === kind) };
}

describe('templateRepository with the real ytt and kbld', () => {
  it('templates the kadras repository: packages with the four annotations, encoded names, the rebase Config', async () => {
    const { out, docs, of } = await run({ root: KADRAS, bundle: false });
    expect(out.result.error).toBeUndefined();
    expect(of('Package')).toHaveLength(14);
    expect(of('PackageMetadata')).toHaveLength(8);
    expect(docs).toHaveLength(14 + 8 + 1);
    for (const d of [...of('Package'), ...of('PackageMetadata')]) {
      expect(d.metadata.annotations).toEqual(REPO_ANNOTATIONS);
      expect(d.metadata.namespace).toBeUndefined();
      expect(d.metadata.creationTimestamp).toBeUndefined();
    }
    const crossplane = of('Package').find((d) => d.spec.version === '2.2.0+kadras.2');
    expect(crossplane.metadata.name).toBe('crossplane.packages.kadras.io.2.2.0--kadras.2');
    expect(crossplane.spec.refName).toBe('crossplane.packages.kadras.io');
    expect(out.versions).toEqual({
      'crossplane.packages.kadras.io': ['2.2.0+kadras.2', '2.3.2', '2.3.4'],
      'flux.packages.kadras.io': ['2.8.3', '2.8.8', '2.9.4'],
      'metrics-server.packages.kadras.io': ['0.8.1', '0.9.0'],
      'opentelemetry-operator.packages.kadras.io': ['0.147.0'],
      'postgresql-operator.packages.kadras.io': ['1.28.1+kadras.1'],
      'rabbitmq-operator.packages.kadras.io': ['2.19.2'],
      'rbac-configurer.packages.kadras.io': ['0.2.1'],
      'secretgen-controller.packages.kadras.io': ['0.20.1', '0.21.1'],
    });
    const [config] = of('Config');
    expect(config.apiVersion).toBe('kapp.k14s.io/v1alpha1');
    const [rule] = config.rebaseRules;
    expect(rule.resourceMatchers).toEqual([
      { apiVersionKindMatcher: { apiVersion: 'data.packaging.carvel.dev/v1alpha1', kind: 'Package' } },
      { apiVersionKindMatcher: { apiVersion: 'data.packaging.carvel.dev/v1alpha1', kind: 'PackageMetadata' } },
    ]);
    expect(rule.ytt.overlayContractV1['overlay.yml']).toContain(
      'fail("Error: Conflicting resources: " + data.values.existing.kind + "/" + data.values.existing.metadata.name + " is already present but not identical (" + reason +")")',
    );
  });

  it('for a bundle, kbld rewrites image references from .imgpkg/images.yml', async () => {
    const root = path.join(scratch, 'bundle');
    await cp(KADRAS, root, { recursive: true });
    await mkdir(path.join(root, '.imgpkg'));
    await writeFile(
      path.join(root, '.imgpkg', 'images.yml'),
      `apiVersion: imgpkg.carvel.dev/v1alpha1
kind: ImagesLock
images:
- image: registry.local:5000/kadras/relocated@${FLUX_DIGEST}
  annotations:
    kbld.carvel.dev/id: ghcr.io/kadras-io/package-for-flux@${FLUX_DIGEST}
`,
    );
    const { out, of } = await run({ root, bundle: true });
    expect(out.result.error).toBeUndefined();
    expect(of('Package')).toHaveLength(14);
    const flux = of('Package').find((d) => d.spec.version === '2.8.3');
    expect(flux.spec.template.spec.fetch[0].imgpkgBundle.image).toBe(
      `registry.local:5000/kadras/relocated@${FLUX_DIGEST}`,
    );
  });

  it('for a bundle without .imgpkg/images.yml, kbld fails the template', async () => {
    const { out } = await run({ root: KADRAS, bundle: true });
    expect(out.result.error).toBe('Templating dir: Error (see .status.usefulErrorMessage for details)');
    expect(out.result.stderr).toContain('images.yml: no such file or directory');
    expect(out.manifest).toBeUndefined();
  });

  it('an inline-style root: documents of other kinds are dropped, namespaces removed, nested files read', async () => {
    const root = path.join(scratch, 'inline');
    await mkdir(path.join(root, 'packages', 'nested'), { recursive: true });
    await writeFile(
      path.join(root, 'packages', 'all.yml'),
      `apiVersion: data.packaging.carvel.dev/v1alpha1
kind: PackageMetadata
metadata:
  name: simple-app.corp.com
  namespace: somewhere-else
spec:
  displayName: Simple
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: dropped
data: {a: b}
`,
    );
    await writeFile(
      path.join(root, 'packages', 'nested', '1.0.0.yml'),
      `apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: simple-app.corp.com.1.0.0
spec:
  refName: simple-app.corp.com
  version: 1.0.0
  notAField: dropped
  template:
    spec:
      fetch: [{inline: {paths: {a.yml: "kind: X"}}}]
`,
    );
    const { out, docs, of } = await run({ root, bundle: false });
    expect(out.result.error).toBeUndefined();
    expect(docs.map((d) => d.kind).sort()).toEqual(['Config', 'Package', 'PackageMetadata']);
    expect(of('PackageMetadata')[0].metadata).toEqual({ name: 'simple-app.corp.com', annotations: REPO_ANNOTATIONS });
    expect(of('Package')[0].spec.notAField).toBeUndefined();
    expect(out.versions).toEqual({ 'simple-app.corp.com': ['1.0.0'] });
  });

  it("a repository's own data values, templates and overlays apply before the clean-up, as in upstream's two ytt runs", async () => {
    const root = path.join(scratch, 'templated');
    await mkdir(path.join(root, 'packages', 'app'), { recursive: true });
    await writeFile(path.join(root, 'packages', 'values.yml'), '#@data/values\n---\nversion: 1.2.3\n');
    await writeFile(
      path.join(root, 'packages', 'app', 'package.yml'),
      `#@ load("@ytt:data", "data")
apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: #@ "app.corp.com." + data.values.version
spec:
  refName: app.corp.com
  version: #@ data.values.version
`,
    );
    // The repository's overlay sets a namespace and adds a ConfigMap-like kind change: the
    // clean-up (applied after it) still removes the namespace and drops other kinds.
    await writeFile(
      path.join(root, 'packages', 'zz-overlay.yml'),
      `#@ load("@ytt:overlay", "overlay")
#@overlay/match by=overlay.subset({"kind": "Package"})
---
metadata:
  #@overlay/match missing_ok=True
  namespace: elsewhere
  #@overlay/match missing_ok=True
  labels:
    team: a
`,
    );
    await writeFile(path.join(root, 'packages', 'other.yml'), 'apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n');
    const { out, of, docs } = await run({ root, bundle: false });
    expect(out.result).toEqual({ stdout: '', stderr: '', exitCode: 0, finished: true });
    expect(docs.map((d) => d.kind)).toEqual(['Package', 'Config']);
    expect(of('Package')[0].metadata).toEqual({
      name: 'app.corp.com.1.2.3',
      labels: { team: 'a' },
      annotations: REPO_ANNOTATIONS,
    });
    expect(out.versions).toEqual({ 'app.corp.com': ['1.2.3'] });
  });

  it('a Package holding a value JSON cannot (.inf) is kept, not dropped by a JSON printer', async () => {
    const root = path.join(scratch, 'non-finite');
    await mkdir(path.join(root, 'packages'), { recursive: true });
    await writeFile(
      path.join(root, 'packages', 'pkg.yml'),
      `apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: app.corp.com.1.0.0
spec:
  refName: app.corp.com
  version: 1.0.0
  valuesSchema:
    openAPIv3:
      properties:
        replicas: {type: number, maximum: .inf}
---
apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: app.corp.com.2.0.0
spec:
  refName: app.corp.com
  version: 2.0.0
`,
    );
    const { out, of } = await run({ root, bundle: false });
    expect(out.result.error).toBeUndefined();
    expect(of('Package').map((d) => d.spec.version)).toEqual(['1.0.0', '2.0.0']);
    expect(out.versions).toEqual({ 'app.corp.com': ['1.0.0', '2.0.0'] });
  });

  it("a root without packages/ fails with upstream's text", async () => {
    const { out } = await run({ root: path.join(KADRAS, 'packages'), bundle: false });
    expect(out.result.error).toBe("Invalid package repository content: must contain 'packages/' directory but did not");
  });
});
