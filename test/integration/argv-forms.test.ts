/**
 * The argv forms that keep user values from being read as flags (issue 7, item 1) work with the
 * real pinned tools: helm with `--flag=value` and `--` before the release name and chart, cue with
 * `--path=`/`--expression=` and `--` before its inputs, ytt with `--file-mark=`. Planned by
 * `planTemplate` and run by `runTemplateSteps` with the real command runner.
 *
 * And cue's module registry: a hostile App's `cue.mod/module.cue` with `deps` makes the real cue
 * contact a registry (`registry.cue.works` by default, seen here through a recording
 * `HTTPS_PROXY`); the planned step (`CUE_REGISTRY=none`) sends nothing and fails with
 * `CUE_MODULE_FETCH_MESSAGE`, while packages vendored under `cue.mod/pkg` still resolve.
 */
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, realpath, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { type AppTemplate, refObjectsFrom } from '../../functions/lib/api/index.js';
import { createCommandRunner, minimalEnv } from '../../functions/lib/exec/runner.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { runTemplateSteps } from '../../functions/lib/template/execute.js';
import { CUE_MODULE_FETCH_MESSAGE, planTemplate } from '../../functions/lib/template/index.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { fixturePath } from '../harness/fixtures.js';

let scratch: string;
let deps: PipelineDeps;

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'argv-forms-')));
  await mkdir(path.join(scratch, 'home'));
  const runner = createCommandRunner({
    allow: ['helm', 'cue', 'ytt'],
    resolveBin: cacheBinResolver(cacheRoot()),
    home: path.join(scratch, 'home'),
    tmpDir: scratch,
  });
  // Only the runner and the tool timeout are used by runTemplateSteps.
  deps = {
    runner,
    config: { tmpRoot: scratch, toolVersions: {}, controllerVersion: 'test' },
  } as unknown as PipelineDeps;
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

async function render(
  name: string,
  template: AppTemplate[],
  files: Record<string, string> = {},
  runDeps: PipelineDeps = deps,
) {
  const root = path.join(scratch, name, 'root');
  await mkdir(root, { recursive: true });
  for (const [f, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(root, f)), { recursive: true });
    await writeFile(path.join(root, f), content);
  }
  const plan = planTemplate({
    app: { metadata: { name: 'app', namespace: 'ns' }, spec: { template } },
    templateRoot: root,
    scratchRoot: path.join(scratch, name, 'scratch'),
    refs: refObjectsFrom({
      configMaps: [
        {
          metadata: { name: 'cue-values' },
          data: { 'values.yml': await readFile(fixturePath('kapp-controller-cue-app', 'values.yml'), 'utf8') },
        },
      ],
    }),
  });
  return { root, plan, run: await runTemplateSteps(plan.steps, runDeps, path.join(scratch, name)) };
}

describe('argv forms with the real tools', () => {
  it('helm template --namespace=<ns> ... -- <name> <chart> renders the chart', async () => {
    const chart = fixturePath('podinfo', 'charts', 'podinfo');
    const root = path.join(scratch, 'helm', 'root');
    await mkdir(root, { recursive: true });
    await cp(chart, path.join(root, 'chart'), { recursive: true });
    const { plan, run } = await render('helm', [
      { helmTemplate: { name: 'rel', namespace: 'target', path: 'chart', kubernetesVersion: { version: '1.30.0' } } },
    ]);
    expect((plan.steps[0] as { args: string[] }).args.slice(-3)).toEqual(['--', 'rel', path.join(root, 'chart')]);
    expect(run.result.error).toBeUndefined();
    const docs = parseAllDocuments(run.manifest).map((d) => d.toJS());
    const deployment = docs.find((d) => d?.kind === 'Deployment');
    expect(deployment.metadata).toMatchObject({ name: 'rel-podinfo', namespace: 'target' });
  });

  it('helm takes a flag-looking --kube-version= value as a version, not as a flag', async () => {
    const root = path.join(scratch, 'helm2', 'root');
    await mkdir(root, { recursive: true });
    await cp(fixturePath('podinfo', 'charts', 'podinfo'), path.join(root, 'chart'), { recursive: true });
    const { run } = await render('helm2', [
      {
        helmTemplate: { name: 'rel', path: 'chart', kubernetesVersion: { version: `--post-renderer=/usr/bin/touch` } },
      },
    ]);
    expect(run.result.error).toBe('Templating helm chart: Error (see .status.usefulErrorMessage for details)');
    expect(run.result.stderr).toContain('--post-renderer=/usr/bin/touch');
  });

  it('cue export --path=config: --expression=output -- . <values> renders the cue example', async () => {
    const app = await readFile(fixturePath('kapp-controller-cue-app', 'app.cue'), 'utf8');
    const { run } = await render(
      'cue',
      [
        {
          cue: {
            inputExpression: 'config:',
            outputExpression: 'output',
            valuesFrom: [{ configMapRef: { name: 'cue-values' } }],
          },
        },
      ],
      { 'app.cue': app },
    );
    expect(run.result.error).toBeUndefined();
    expect(run.manifest).toContain('kind: List');
    expect(run.manifest).toContain('from cue');
  });

  it('cue export -- <paths> renders the named files only', async () => {
    const { run } = await render('cue-paths', [{ cue: { paths: ['a.cue'] } }], {
      'a.cue': 'a: 1\n',
      'b.cue': 'b: 2\n',
    });
    expect(run.result.error).toBeUndefined();
    expect(run.manifest.trim()).toBe('a: 1');
  });

  it('ytt --file-mark=<m> applies the mark', async () => {
    const { run } = await render('ytt', [{ ytt: { fileMarks: ['b.yml:exclude=true'] } }], {
      'a.yml': 'a: 1\n',
      'b.yml': 'b: 2\n',
    });
    expect(run.result.error).toBeUndefined();
    expect(run.manifest.trim()).toBe('a: 1');
  });
});

describe('cue fetches no module dependency', () => {
  /** Every request and CONNECT the recording proxy got. */
  const proxied: string[] = [];
  let recorder: Server;
  let proxiedDeps: PipelineDeps;
  const MODULE = 'module: "example.com/app@v0"\nlanguage: version: "v0.9.0"\n';
  const DEPS = 'deps: "example.com/dep@v0": v: "v0.0.1"\n';
  const APP = 'package app\nimport "example.com/dep@v0:dep"\nout: dep.x\n';

  beforeAll(async () => {
    recorder = createServer((req, res) => {
      proxied.push(`${req.method} ${req.url}`);
      res.writeHead(502).end();
    });
    recorder.on('connect', (req, socket) => {
      proxied.push(`CONNECT ${req.url}`);
      socket.end('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n');
    });
    await new Promise<void>((r) => recorder.listen(0, '127.0.0.1', r));
    const proxy = `http://127.0.0.1:${(recorder.address() as AddressInfo).port}`;
    const tools = {
      allow: ['cue'],
      resolveBin: cacheBinResolver(cacheRoot()),
      home: path.join(scratch, 'home'),
      tmpDir: scratch,
    };
    // As if the runtime's environment reached cue: its registry requests land at the recorder.
    const baseEnv = { ...minimalEnv(tools), HTTPS_PROXY: proxy, HTTP_PROXY: proxy };
    proxiedDeps = { ...deps, runner: createCommandRunner({ ...tools, baseEnv }) } as PipelineDeps;
  });

  afterAll(() => {
    recorder?.closeAllConnections();
    recorder?.close();
  });

  it('the real cue contacts registry.cue.works for deps when run without CUE_REGISTRY=none', async () => {
    proxied.length = 0;
    const dir = path.join(scratch, 'cue-direct');
    await mkdir(path.join(dir, 'cue.mod'), { recursive: true });
    await writeFile(path.join(dir, 'cue.mod', 'module.cue'), MODULE + DEPS);
    await writeFile(path.join(dir, 'app.cue'), APP);
    const proxy = `http://127.0.0.1:${(recorder.address() as AddressInfo).port}`;
    const env = { PATH: '/usr/bin:/bin', HOME: dir, HTTPS_PROXY: proxy };
    const cue = cacheBinResolver(cacheRoot())('cue');
    const err = await promisify(execFile)(cue, ['export', '--out', 'yaml', '--', '.'], { cwd: dir, env }).then(
      () => undefined,
      (e: { stderr: string }) => e,
    );
    expect(err?.stderr).toContain('cannot fetch example.com/dep@v0.0.1');
    expect(proxied).toEqual(['CONNECT registry.cue.works:443']);
  });

  it('the cue step: a module with deps sends nothing and fails with the registry message', async () => {
    proxied.length = 0;
    const { plan, run } = await render(
      'cue-deps',
      [{ cue: {} }],
      { 'cue.mod/module.cue': MODULE + DEPS, 'app.cue': APP },
      proxiedDeps,
    );
    expect((plan.steps[0] as { env: Record<string, string> }).env).toEqual({ CUE_REGISTRY: 'none' });
    expect(run.result.error).toBe(`Templating dir: ${CUE_MODULE_FETCH_MESSAGE}`);
    expect(run.result.stderr).toContain('cannot fetch example.com/dep@v0.0.1: module not found');
    expect(proxied).toEqual([]);
  });

  it('the cue step: the same package vendored under cue.mod/pkg (no deps) renders', async () => {
    proxied.length = 0;
    const { run } = await render(
      'cue-vendored',
      [{ cue: {} }],
      {
        'cue.mod/module.cue': MODULE,
        'cue.mod/pkg/example.com/dep/dep.cue': 'package dep\nx: "vendored"\n',
        'app.cue': APP,
      },
      proxiedDeps,
    );
    expect(run.result.error, run.result.stderr).toBeUndefined();
    expect(run.manifest.trim()).toBe('out: vendored');
    expect(proxied).toEqual([]);
  });
});
