/**
 * The kustomize template step (issue 12 item 4): its argv and environment, where it may stand in
 * the pipeline, and the check that refuses remote and out-of-root references before kustomize
 * starts (the fake runner is then never called). The real binary is run in
 * `test/integration/kustomize.test.ts`.
 */
import { mkdir, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { type AppTemplate, refObjectsFrom } from '../../functions/lib/api/index.js';
import { exitWith, FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { runTemplateSteps } from '../../functions/lib/template/execute.js';
import {
  checkKustomizeTree,
  isRemoteReference,
  KUSTOMIZE_DEAD_PROXY,
  kustomizationReferences,
  planTemplate,
  type RunStep,
} from '../../functions/lib/template/index.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('template-kustomize-');
const REMOTE =
  'is a remote resource: the kustomize step builds only the fetched files (fetch remote sources with spec.fetch)';

const KEYS = refObjectsFrom({
  secrets: [{ metadata: { name: 'keys' }, data: { k: Buffer.from('AGE-SECRET-KEY-1X', 'utf8') } }],
});

function plan(template: AppTemplate[], root = '/w/fetch/0', scratch = '/w/scratch') {
  return planTemplate({
    app: { metadata: { name: 'app', namespace: 'ns' }, spec: { template } },
    templateRoot: root,
    scratchRoot: scratch,
    refs: KEYS,
  });
}

function run(step: unknown): RunStep {
  expect((step as RunStep).kind).toBe('run');
  return step as RunStep;
}

/** Writes `files` (relative path → content) under a fresh directory; returns it. */
async function tree(name: string, files: Record<string, string>): Promise<string> {
  const root = path.join(tempDir(), name);
  for (const [rel, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(root, rel)), { recursive: true });
    await writeFile(path.join(root, rel), content);
  }
  await mkdir(root, { recursive: true });
  return root;
}

describe('planning', () => {
  it('builds the template root with the root-only load restrictor, no plugins, no git and a dead proxy', () => {
    const step = run(plan([{ kustomize: {} }]).steps[0]);
    expect(step).toEqual({
      kind: 'run',
      index: 0,
      templater: 'kustomize',
      bin: 'kustomize',
      args: ['build', '--load-restrictor=LoadRestrictionsRootOnly', '--', '/w/fetch/0'],
      env: {
        PATH: '/w/scratch/0/no-tools',
        HTTP_PROXY: KUSTOMIZE_DEAD_PROXY,
        HTTPS_PROXY: KUSTOMIZE_DEAD_PROXY,
        http_proxy: KUSTOMIZE_DEAD_PROXY,
        https_proxy: KUSTOMIZE_DEAD_PROXY,
        NO_PROXY: '',
        no_proxy: '',
        KL_PROXY_LOOPBACK: '1',
      },
      stdin: 'none',
      files: [],
      dirs: ['/w/scratch/0/no-tools'],
      errorPrefix: 'Templating dir: ',
      kustomizeRoot: '/w/fetch/0',
    });
    expect(step.args.filter((a) => /enable|plugin|exec|helm/.test(a))).toEqual([]);
  });

  it('produces a stream: ytt and kbld after it read stdin', () => {
    const steps = plan([{ kustomize: {} }, { ytt: {} }, { kbld: {} }]).steps.map(run);
    expect(steps.map((s) => [s.bin, s.stdin, s.args[0], s.args[1]])).toEqual([
      ['kustomize', 'none', 'build', '--load-restrictor=LoadRestrictionsRootOnly'],
      ['ytt', 'previous', '-f', '-'],
      ['kbld', 'previous', '-f', '-'],
    ]);
  });

  it('reads the directory sops decrypted before it', () => {
    const steps = plan([{ sops: { age: { privateKeysSecretRef: { name: 'keys' } } } }, { kustomize: {} }]).steps;
    expect(steps.map((s) => s.kind)).toEqual(['sops', 'run']);
    expect(run(steps[1]).args.at(-1)).toBe('/w/fetch/0');
    expect(run(steps[1]).stdin).toBe('none');
  });

  it.each([[[{ ytt: {} }, { kustomize: {} }]], [[{ kustomize: {} }, { kustomize: {} }]]] as Array<[AppTemplate[]]>)(
    'cannot read a stream %#',
    (template) => {
      expect(plan(template).steps[1]).toEqual({
        kind: 'fail',
        index: 1,
        message: 'Templating stream is not supported',
      });
    },
  );
});

describe('isRemoteReference (git.NewRepoSpecFromURL, fileloader IsRemoteFile)', () => {
  it.each([
    'https://example.com/x.yaml',
    'HTTP://example.com/x.yaml',
    'ssh://git@example.com/org/repo',
    'file:///etc/repo',
    'git::https://github.com/org/repo',
    'git@github.com:org/repo.git',
    'github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v1.0.6',
    'GitHub.com:org/repo',
  ])('%s is remote', (ref) => {
    expect(isRemoteReference(ref)).toBe(true);
  });

  it.each(['base', '../base', 'deploy.yaml', 'sub/github.com/x', 'a=b.yaml', '9@x'])('%s is local', (ref) => {
    expect(isRemoteReference(ref)).toBe(false);
  });

  it('errs on the side of remote for a local name that looks like scp-style user@host', () => {
    expect(isRemoteReference('me@file.yaml')).toBe(true);
  });
});

describe('kustomizationReferences', () => {
  it('lists every field kustomize loads from, keys matched ignoring case as Go json does', () => {
    const refs = kustomizationReferences({
      Resources: ['a', 7],
      bases: ['b'],
      components: ['c'],
      generators: ['g'],
      transformers: ['t'],
      validators: ['v'],
      crds: ['crd.yaml'],
      configurations: ['conf.yaml'],
      patchesStrategicMerge: ['p.yaml'],
      patches: [{ path: 'p2.yaml' }, { patch: 'inline' }],
      patchesJson6902: [{ path: 'j.yaml' }],
      replacements: [{ path: 'r.yaml' }],
      openapi: { path: 'schema.json' },
      configMapGenerator: [{ files: ['k=f.txt', 'g.txt'], envs: ['e.env'], env: 'old.env' }],
      secretGenerator: [{ files: ['s.txt'] }],
      commonAnnotations: { link: 'https://example.com' },
    });
    expect(refs.map((r) => [r.field, r.value, r.directory])).toEqual([
      ['resources[0]', 'a', true],
      ['bases[0]', 'b', true],
      ['components[0]', 'c', true],
      ['generators[0]', 'g', true],
      ['transformers[0]', 't', true],
      ['validators[0]', 'v', true],
      ['crds[0]', 'crd.yaml', false],
      ['configurations[0]', 'conf.yaml', false],
      ['patchesStrategicMerge[0]', 'p.yaml', false],
      ['patches[0].path', 'p2.yaml', false],
      ['patchesJson6902[0].path', 'j.yaml', false],
      ['replacements[0].path', 'r.yaml', false],
      ['openapi.path', 'schema.json', false],
      ['configMapGenerator[0].files[0]', 'f.txt', false],
      ['configMapGenerator[0].files[1]', 'g.txt', false],
      ['configMapGenerator[0].envs[0]', 'e.env', false],
      ['configMapGenerator[0].env', 'old.env', false],
      ['secretGenerator[0].files[0]', 's.txt', false],
    ]);
  });
});

let trees = 0;
const CM = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';

describe('checkKustomizeTree', () => {
  it('accepts an overlay over a local base', async () => {
    const root = await tree('ok', {
      'kustomization.yaml': 'resources: [overlay]\n',
      'overlay/kustomization.yaml': 'resources: [../base]\nnamePrefix: dev-\n',
      'base/kustomization.yml': 'resources: [cm.yaml]\ncommonAnnotations: {docs: "https://example.com"}\n',
      'base/cm.yaml': CM,
    });
    expect(await checkKustomizeTree(root)).toBeUndefined();
  });

  it.each([
    ['kustomization.yaml', 'resources:\n- https://evil.example/x.yaml\n', `resources[0] "https://evil.example/x.yaml"`],
    ['kustomization.yml', 'bases: [github.com/org/repo//base]\n', `bases[0] "github.com/org/repo//base"`],
    ['Kustomization', 'components: ["git@example.com:org/repo.git"]\n', `components[0] "git@example.com:org/repo.git"`],
    ['kustomization.yaml', 'Resources: ["git::ssh://example.com/r"]\n', `resources[0] "git::ssh://example.com/r"`],
    [
      'kustomization.yaml',
      'configMapGenerator:\n- name: c\n  files: ["k=http://127.0.0.1:9001/2018-06-01/runtime/invocation/next"]\n',
      `configMapGenerator[0].files[0] "http://127.0.0.1:9001/2018-06-01/runtime/invocation/next"`,
    ],
    [
      'kustomization.yaml',
      'patches:\n- path: https://evil.example/p.yaml\n',
      `patches[0].path "https://evil.example/p.yaml"`,
    ],
  ])('refuses a remote reference in %s: %s', async (file, content, what) => {
    const root = await tree(`remote-${++trees}`, { [file]: content });
    expect(await checkKustomizeTree(root)).toBe(`${file}: ${what} ${REMOTE}`);
  });

  it('refuses a remote base reached through a local overlay, naming the file', async () => {
    const root = await tree('deep', {
      'kustomization.yaml': 'resources: [overlay]\n',
      'overlay/kustomization.yaml': 'resources: [../base]\n',
      'base/kustomization.yaml': 'resources: [github.com/org/repo]\n',
    });
    expect(await checkKustomizeTree(root)).toBe(
      `base/kustomization.yaml: resources[0] "github.com/org/repo" ${REMOTE}`,
    );
  });

  it('reads a !!binary reference as kustomize does (its decoded text): a base64 URL is refused', async () => {
    // kustomize v5.8.2 (go-yaml v2) fetched `resources: [!!binary <base64 of a loopback URL>]`
    // directly (Go never proxies loopback), while the check skipped the value as a non-string.
    const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');
    const url = 'http://127.0.0.1:9001/2018-06-01/runtime/invocation/next';
    const root = await tree('binary', { 'kustomization.yaml': `resources:\n- !!binary ${b64(url)}\n` });
    expect(await checkKustomizeTree(root)).toBe(`kustomization.yaml: resources[0] "${url}" ${REMOTE}`);
    const folded = await tree('binary-folded', {
      'kustomization.yaml': `patches:\n- path: !!binary |\n    ${b64(url).slice(0, 20)}\n    ${b64(url).slice(20)}\n`,
    });
    expect(await checkKustomizeTree(folded)).toBe(`kustomization.yaml: patches[0].path "${url}" ${REMOTE}`);
    // a key in !!binary is the field it spells, as before
    const key = await tree('binary-key', { 'kustomization.yaml': `!!binary ${b64('resources')}: ["${url}"]\n` });
    expect(await checkKustomizeTree(key)).toBe(`kustomization.yaml: resources[0] "${url}" ${REMOTE}`);
  });

  it('matches field names as Go json does, Unicode folding included (reſources is resources)', async () => {
    // kustomize v5.8.2 fetched `reſources: [http://127.0.0.1:…]` (U+017F folds to s in Go).
    const url = 'http://127.0.0.1:9001/x.yaml';
    for (const [key, field] of [
      ['re\u017fources', 'resources'],
      ['patche\u017f', 'patches'],
    ]) {
      const body = field === 'patches' ? `${key}:\n- path: ${url}\n` : `${key}: ["${url}"]\n`;
      const root = await tree(`fold-${field}`, { 'kustomization.yaml': body });
      const at = field === 'patches' ? 'patches[0].path' : 'resources[0]';
      expect(await checkKustomizeTree(root), key).toBe(`kustomization.yaml: ${at} "${url}" ${REMOTE}`);
    }
  });

  it('refuses a base outside the fetched directory, by path or through a symlink', async () => {
    const outside = await tree('outside', { 'kustomization.yaml': 'resources: []\n' });
    const byPath = await tree('by-path', { 'kustomization.yaml': 'resources: [../outside]\n' });
    expect(await checkKustomizeTree(byPath)).toBe(
      'kustomization.yaml: resources[0] "../outside" is outside the fetched directory',
    );
    const byLink = await tree('by-link', { 'kustomization.yaml': 'resources: [linked]\n' });
    await symlink(outside, path.join(byLink, 'linked'));
    expect(await checkKustomizeTree(byLink)).toBe(
      'kustomization.yaml: resources[0] "linked" is outside the fetched directory',
    );
  });

  it('refuses a kustomization it cannot parse (an unchecked file never reaches kustomize)', async () => {
    const root = await tree('bad-yaml', { 'kustomization.yaml': 'resources: [a\n' });
    expect(await checkKustomizeTree(root)).toMatch(/^kustomization\.yaml: Flow sequence .*/);
  });

  it('leaves missing references and cycles to kustomize', async () => {
    const root = await tree('cycle', {
      'kustomization.yaml': 'resources: [missing.yaml, a]\n',
      'a/kustomization.yaml': 'resources: [../a, ..]\n',
    });
    expect(await checkKustomizeTree(root)).toBeUndefined();
  });
});

describe('running (execute.ts)', () => {
  const deps = (runner: FakeCommandRunner) => ({ runner, config: {} });

  it('never starts kustomize for a refused tree, and fails with Templating dir', async () => {
    const root = await tree('run-refused', { 'kustomization.yaml': 'resources: [https://evil.example/x.yaml]\n' });
    const runner = new FakeCommandRunner({ fallback: { stdout: CM } });
    const r = await runTemplateSteps(plan([{ kustomize: {} }], root, `${root}-scratch`).steps, deps(runner), root);
    expect(runner.calls).toEqual([]);
    expect(r.result.error).toBe(
      `Templating dir: kustomization.yaml: resources[0] "https://evil.example/x.yaml" ${REMOTE}`,
    );
    expect(r.manifest).toBe('');
  });

  it('fails the step, not the stage run, when the root cannot be read', async () => {
    const root = path.join(tempDir(), 'run-missing');
    const runner = new FakeCommandRunner({ fallback: { stdout: CM } });
    const r = await runTemplateSteps(plan([{ kustomize: {} }], root, `${root}-scratch`).steps, deps(runner), root);
    expect(runner.calls).toEqual([]);
    expect(r.result.error).toBe(`Templating dir: ENOENT: no such file or directory, realpath '${root}'`);
  });

  it('pipes kustomize output into ytt', async () => {
    const root = await tree('run-ok', { 'kustomization.yaml': 'resources: []\n' });
    const runner = new FakeCommandRunner().on('kustomize', { stdout: CM }).on('ytt', (req) => ({
      stdout: `from-ytt: ${JSON.stringify(req.stdin)}\n`,
    }));
    const r = await runTemplateSteps(
      plan([{ kustomize: {} }, { ytt: {} }], root, `${root}-scratch`).steps,
      deps(runner),
      root,
    );
    expect(r.result.error).toBeUndefined();
    expect(runner.calls.map((c) => [c.cmd, c.stdin])).toEqual([
      ['kustomize', undefined],
      ['ytt', CM],
    ]);
    expect(r.manifest).toBe(`from-ytt: ${JSON.stringify(CM)}\n`);
  });

  it("reports kustomize's failure like ytt's, with its stderr", async () => {
    const root = await tree('run-fail', { 'kustomization.yaml': 'resources: [missing.yaml]\n' });
    const runner = new FakeCommandRunner().on('kustomize', exitWith(1, 'Error: accumulating resources: missing\n'));
    const r = await runTemplateSteps(plan([{ kustomize: {} }], root, `${root}-scratch`).steps, deps(runner), root);
    expect(r.result.error).toBe('Templating dir: Error (see .status.usefulErrorMessage for details)');
    expect(r.result.stderr).toBe('Error: accumulating resources: missing\n');
  });
});
