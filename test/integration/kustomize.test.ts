/**
 * The kustomize template step with the real pinned kustomize (issue 12 item 4): planned by
 * `planTemplate`, run by `runTemplateSteps` with the real command runner. A base + overlay
 * renders; ytt reads its stream; a broken kustomization fails with kustomize's text; plugins and
 * `helmCharts` are refused by kustomize itself (no enabling flag is passed); and, should a remote
 * reference get past the check, kustomize still cannot clone (no git) nor download (dead proxy).
 */
import { mkdir, mkdtemp, realpath, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { type AppTemplate, refObjectsFrom } from '../../functions/lib/api/index.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { runTemplateSteps, type TemplateRunDeps } from '../../functions/lib/template/execute.js';
import { planTemplate, type RunStep } from '../../functions/lib/template/index.js';
import { cacheRoot } from '../../layers/gobuild.js';

let scratch: string;
let deps: TemplateRunDeps;

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'kustomize-')));
  await mkdir(path.join(scratch, 'home'));
  deps = {
    runner: createCommandRunner({
      allow: ['kustomize', 'ytt'],
      resolveBin: cacheBinResolver(cacheRoot()),
      home: path.join(scratch, 'home'),
      tmpDir: scratch,
    }),
    config: {},
  };
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

const BASE = {
  'base/kustomization.yaml': 'resources:\n- cm.yaml\n- deploy.yaml\n',
  'base/cm.yaml': 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  color: blue\n',
  'base/deploy.yaml': [
    'apiVersion: apps/v1',
    'kind: Deployment',
    'metadata:',
    '  name: web',
    'spec:',
    '  selector:',
    '    matchLabels: {app: web}',
    '  template:',
    '    metadata:',
    '      labels: {app: web}',
    '    spec:',
    '      containers:',
    '      - name: web',
    '        image: registry.example/web:1.0',
    '',
  ].join('\n'),
};
const OVERLAY = 'resources:\n- base\nnamePrefix: dev-\ncommonLabels:\n  env: dev\n';

/** Writes `files` under `<scratch>/<name>/root`; returns the root. */
async function writeRoot(name: string, files: Record<string, string>): Promise<string> {
  const root = path.join(scratch, name, 'root');
  await mkdir(root, { recursive: true });
  for (const [f, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(root, f)), { recursive: true });
    await writeFile(path.join(root, f), content);
  }
  return root;
}

/** Plans `template` on `root`. */
function plan(name: string, root: string, template: AppTemplate[]) {
  return planTemplate({
    app: { metadata: { name: 'app', namespace: 'ns' }, spec: { template } },
    templateRoot: root,
    scratchRoot: path.join(scratch, name, 'scratch'),
    refs: refObjectsFrom({}),
  });
}

/** Plans and runs `template` on a root holding `files`. */
async function render(name: string, template: AppTemplate[], files: Record<string, string>) {
  const root = await writeRoot(name, files);
  return { root, run: await runTemplateSteps(plan(name, root, template).steps, deps, path.join(scratch, name)) };
}

/** Runs the planned kustomize step on `root` without `kustomizeRoot`, as if the check had missed. */
async function unchecked(name: string, root: string) {
  const planned = plan(name, root, [{ kustomize: {} }]).steps[0] as RunStep;
  expect(planned.kustomizeRoot).toBe(root);
  return await runTemplateSteps([{ ...planned, kustomizeRoot: undefined }], deps, path.join(scratch, name));
}

describe('kustomize build with the real binary', () => {
  it('renders an overlay over a base (namePrefix, commonLabels)', async () => {
    const { run } = await render('overlay', [{ kustomize: {} }], { ...BASE, 'kustomization.yaml': OVERLAY });
    expect(run.result.error).toBeUndefined();
    expect(run.manifest).toBe(
      [
        'apiVersion: v1',
        'data:',
        '  color: blue',
        'kind: ConfigMap',
        'metadata:',
        '  labels:',
        '    env: dev',
        '  name: dev-settings',
        '---',
        'apiVersion: apps/v1',
        'kind: Deployment',
        'metadata:',
        '  labels:',
        '    env: dev',
        '  name: dev-web',
        'spec:',
        '  selector:',
        '    matchLabels:',
        '      app: web',
        '      env: dev',
        '  template:',
        '    metadata:',
        '      labels:',
        '        app: web',
        '        env: dev',
        '    spec:',
        '      containers:',
        '      - image: registry.example/web:1.0',
        '        name: web',
        '',
      ].join('\n'),
    );
    // kustomize's deprecation notice goes to stderr, which the status keeps
    expect(run.result.stderr).toContain("'commonLabels' is deprecated");
  });

  it('hands its stream to a ytt overlay', async () => {
    const overlay = [
      '#@ load("@ytt:overlay", "overlay")',
      '#@overlay/match by=overlay.subset({"kind": "ConfigMap"})',
      '---',
      'data:',
      '  #@overlay/match missing_ok=True',
      '  from: ytt',
      '',
    ].join('\n');
    const { run } = await render(
      'then-ytt',
      [{ kustomize: {} }, { ytt: { inline: { paths: { 'overlay.yml': overlay } } } }],
      { ...BASE, 'kustomization.yaml': OVERLAY },
    );
    expect(run.result.error).toBeUndefined();
    expect(run.manifest).toContain('  name: dev-settings\n');
    expect(run.manifest).toContain('data:\n  color: blue\n  from: ytt\n');
  });

  it("fails a broken kustomization with kustomize's own text", async () => {
    const { root, run } = await render('broken', [{ kustomize: {} }], {
      'kustomization.yaml': 'resources:\n- gone.yaml\n',
    });
    expect(run.result.error).toBe('Templating dir: Error (see .status.usefulErrorMessage for details)');
    expect(run.result.stderr).toContain(`lstat ${path.join(root, 'gone.yaml')}: no such file or directory`);
    expect(run.manifest).toBe('');
  });

  it.each([
    [
      'an exec KRM function',
      'generators:\n- gen.yaml\n',
      'apiVersion: example.com/v1\nkind: Gen\nmetadata:\n  name: g\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: /bin/sh\n',
      "unable to load external plugin 'Gen'",
    ],
    [
      'a container KRM function',
      'transformers:\n- gen.yaml\n',
      'apiVersion: example.com/v1\nkind: Tr\nmetadata:\n  name: t\n  annotations:\n    config.kubernetes.io/function: |\n      container:\n        image: evil.example/fn\n',
      "unable to load external plugin 'Tr'",
    ],
    [
      'helmCharts',
      'helmCharts:\n- name: podinfo\n  repo: https://stefanprodan.github.io/podinfo\n',
      '',
      'must specify --enable-helm',
    ],
  ])('refuses %s: kustomize runs without the flags that enable it', async (_what, kustomization, gen, text) => {
    const { run } = await render(`plugin-${text.length}`, [{ kustomize: {} }], {
      'kustomization.yaml': kustomization,
      'gen.yaml': gen,
    });
    expect(run.result.error).toBe('Templating dir: Error (see .status.usefulErrorMessage for details)');
    expect(run.result.stderr).toContain(text);
  });

  it('refuses a remote base before kustomize starts', async () => {
    const { run } = await render('remote', [{ kustomize: {} }], {
      'kustomization.yaml': 'resources:\n- https://github.com/kubernetes-sigs/kustomize//examples/helloWorld\n',
    });
    expect(run.result.error).toBe(
      'Templating dir: kustomization.yaml: resources[0] "https://github.com/kubernetes-sigs/kustomize//examples/helloWorld" ' +
        'is a remote resource: the kustomize step builds only the fetched files (fetch remote sources with spec.fetch)',
    );
    expect(run.result.stderr).toBe('');
  });

  describe('behind the check (run without it)', () => {
    it('cannot clone a git base: there is no git on its PATH', async () => {
      const root = await writeRoot('no-git', { 'kustomization.yaml': 'resources:\n- github.com/org/repo//base\n' });
      expect((await unchecked('no-git', root)).result.stderr).toContain(`no 'git' program on path`);
    });

    it('cannot download a remote file: its proxy is unreachable', async () => {
      const root = await writeRoot('no-http', { 'kustomization.yaml': 'resources:\n- https://example.com/x.yaml\n' });
      expect((await unchecked('no-http', root)).result.stderr).toContain(
        'proxyconnect tcp: dial tcp 127.0.0.1:9: connect: connection refused',
      );
    });

    it('cannot download from loopback either: kustomize is built to proxy loopback literals (KL_PROXY_LOOPBACK=1)', async () => {
      // Stock Go sends 127.0.0.1 and localhost direct whatever HTTP_PROXY says; a listener on
      // loopback (in Lambda: the Runtime API on 127.0.0.1:9001) must see no request.
      const hits: string[] = [];
      const server = createServer((req, res) => {
        hits.push(req.url ?? '');
        res.end('apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-loopback\n');
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      try {
        const { port } = server.address() as AddressInfo;
        for (const host of [`127.0.0.1:${port}`, `localhost:${port}`]) {
          const root = await writeRoot(`loopback-${hits.length}-${host.length}`, {
            'kustomization.yaml': `resources:\n- http://${host}/x.yaml\n`,
          });
          const run = await unchecked(`loopback-${host.length}`, root);
          expect(run.result.stderr, host).toContain(
            'proxyconnect tcp: dial tcp 127.0.0.1:9: connect: connection refused',
          );
          expect(run.manifest, host).toBe('');
        }
        expect(hits).toEqual([]);
      } finally {
        server.close();
      }
    });

    it('cannot read a file outside its root: the root-only load restrictor (and the check refuses it first)', async () => {
      const outside = path.join(scratch, 'secret.yaml');
      await writeFile(outside, 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: leaked\n');
      const root = await writeRoot('restrictor', { 'kustomization.yaml': 'resources:\n- linked.yaml\n' });
      await symlink(outside, path.join(root, 'linked.yaml'));
      const run = await unchecked('restrictor', root);
      expect(run.result.stderr).toContain(
        `security; file '${path.join(root, 'linked.yaml')}' is not in or below '${root}'`,
      );
      expect(run.manifest).toBe('');
      const checked = await runTemplateSteps(plan('restrictor', root, [{ kustomize: {} }]).steps, deps, scratch);
      expect(checked.result.error).toBe(
        'Templating dir: kustomization.yaml: resources[0] "linked.yaml" is outside the fetched directory',
      );
    });
  });
});
