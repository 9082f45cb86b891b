/**
 * The real vendir (pinned in layers/manifest.ts) syncs every source kind the fetch stage
 * uses from the local servers: git (smart HTTP, `ref: origin/develop` + subPath the way
 * kapp-controller writes it), helmChart (a helm repo built with `helm package` + `helm repo
 * index`), imgpkgBundle (docker-registry) and http (a zip as GitHub serves one). Each test
 * compares the fetched files with the fixture byte for byte and checks the LockConfig.
 */
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parse as parseYaml, stringify } from 'yaml';
import { type App, type AppFetch, refObjectsFrom } from '../../functions/lib/api/index.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { fetchWithVendir } from '../../functions/lib/fetch/run.js';
import { planVendirSync } from '../../functions/lib/fetch/vendir.js';
import type { FetchView } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { toolEnv as stageToolEnv } from '../../functions/lib/pipeline/compose.js';
import { type PipelineDeps, secretMaskOf } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { run } from '../../layers/gobuild.js';
import { createRepo, fixturePath, pushBundle, pushImage, readTree, toolBin, toolEnv } from '../harness/fixtures.js';
import { freePort, type ServersInfo, startAllServers } from '../harness/servers.js';

const SIMPLE_APP = fixturePath('k8s-simple-app-example');
const STEP2 = fixturePath('k8s-simple-app-example', 'config-step-2-template');
const PODINFO = fixturePath('podinfo', 'charts', 'podinfo');

let servers: ServersInfo;
let stopOwn: (() => Promise<void>) | undefined;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'vendir-test-'));
  const provided = inject('servers') as unknown as ServersInfo | null | undefined;
  if (provided) servers = provided;
  else {
    const own = await startAllServers();
    servers = own;
    stopOwn = own.stop;
  }
});

afterAll(async () => {
  await stopOwn?.();
  await rm(scratch, { recursive: true, force: true });
});

/** LockConfig as vendir writes it (the parts these tests read). */
interface LockConfig {
  apiVersion: string;
  kind: string;
  directories: { path: string; contents: ({ path: string } & Record<string, unknown>)[] }[];
}

/**
 * Writes `vendir.yml` with one directory `vendor` holding one content `src`, runs
 * `vendir sync` in a fresh dir, and returns the dir, the lock and vendir's output.
 * @throws Error with vendir's stderr when the sync fails.
 */
async function sync(content: Record<string, unknown>, name: string) {
  const dir = path.join(scratch, name);
  await mkdir(dir, { recursive: true });
  const config = {
    apiVersion: 'vendir.k14s.io/v1alpha1',
    kind: 'Config',
    minimumRequiredVersion: '0.44.0',
    directories: [{ path: 'vendor', contents: [{ path: 'src', ...content }] }],
  };
  await writeFile(path.join(dir, 'vendir.yml'), stringify(config));
  const home = path.join(dir, 'home');
  await mkdir(home);
  const res = await run([toolBin('vendir'), 'sync', '--chdir', dir], { env: toolEnv({ home }) });
  const lock = parseYaml(await readFile(path.join(dir, 'vendir.lock.yml'), 'utf8')) as LockConfig;
  expect(lock.apiVersion).toBe('vendir.k14s.io/v1alpha1');
  expect(lock.kind).toBe('LockConfig');
  expect(lock.directories.map((d) => [d.path, d.contents.map((c) => c.path)])).toEqual([['vendor', ['src']]]);
  return { out: path.join(dir, 'vendor', 'src'), lock: lock.directories[0]?.contents[0], stdout: res.stdout };
}

describe('vendir sync', () => {
  it('git: ref origin/develop with subPath config-step-2-template, as kapp-controller asks', async () => {
    const repo = servers.git.repos['k8s-simple-app-example'];
    // kapp-controller turns `git.subPath: X` into includePaths [X/**/*] + newRootPath X
    const { out, lock } = await sync(
      {
        git: { url: repo?.url, ref: 'origin/develop' },
        includePaths: ['config-step-2-template/**/*'],
        newRootPath: 'config-step-2-template',
      },
      'git',
    );
    expect(await readTree(out)).toEqual(await readTree(STEP2));
    expect(lock?.git).toEqual({ sha: repo?.commitSha, commitTitle: 'k8s-simple-app-example' });
  });

  it('git: follows a branch that moved, and a tag', async () => {
    const first = await createRepo(servers.git, 'vendir/moving', STEP2, { branch: 'develop', tags: ['v1.0.0'] });
    const second = await createRepo(
      servers.git,
      'vendir/moving',
      { 'values.yml': '#@data/values\n---\nhello_msg: moved\n' },
      { branch: 'develop', message: 'second', tags: ['v2.0.0'] },
    );
    const head = await sync({ git: { url: second.url, ref: 'origin/develop' } }, 'git-moved');
    expect(await readTree(head.out)).toEqual({ 'values.yml': '#@data/values\n---\nhello_msg: moved\n' });
    expect(head.lock?.git).toEqual({ sha: second.commitSha, tags: ['v2.0.0'], commitTitle: 'second' });
    const tagged = await sync({ git: { url: first.url, ref: 'v1.0.0' } }, 'git-tag');
    expect(await readTree(tagged.out)).toEqual(await readTree(STEP2));
    expect(tagged.lock?.git).toEqual({ sha: first.commitSha, tags: ['v1.0.0'], commitTitle: 'fixture: vendir/moving' });
  });

  it('git: fails for a ref the server does not have', async () => {
    const repo = servers.git.repos['k8s-simple-app-example'];
    await expect(sync({ git: { url: repo?.url, ref: 'origin/master' } }, 'git-missing')).rejects.toThrow(
      /Git \[fetch origin master\]: exit status 128 \(stderr: fatal: couldn't find remote ref master/,
    );
  });

  it('helmChart: podinfo from the local helm repo equals the chart fixture', async () => {
    const helmRepo = servers.http.helmRepo;
    const chart = helmRepo?.charts.find((c) => c.name === 'podinfo');
    const chartYaml = parseYaml(await readFile(path.join(PODINFO, 'Chart.yaml'), 'utf8')) as {
      version: string;
      appVersion: string;
    };
    expect(chart?.version).toBe(chartYaml.version);
    const { out, lock } = await sync(
      { helmChart: { name: 'podinfo', version: chartYaml.version, repository: { url: helmRepo?.url } } },
      'helm',
    );
    // `helm package` re-serializes Chart.yaml (sorted keys, its own quoting); every other file
    // is the fixture byte for byte
    const { 'Chart.yaml': gotChart, ...got } = await readTree(out);
    const { 'Chart.yaml': wantChart, ...want } = await readTree(PODINFO);
    expect(got).toEqual(want);
    expect(Object.keys(got)).toHaveLength(28);
    expect(parseYaml(gotChart ?? '')).toEqual(parseYaml(wantChart ?? ''));
    expect(lock?.helmChart).toEqual({ version: chartYaml.version, appVersion: chartYaml.appVersion });
  });

  it('helmChart: fails for a version the repo does not have', async () => {
    await expect(
      sync(
        { helmChart: { name: 'podinfo', version: '0.0.1', repository: { url: servers.http.helmRepo?.url } } },
        'helm-missing',
      ),
    ).rejects.toThrow(/podinfo/);
  });

  it('imgpkgBundle: the kctrl-example-pkg stand-in, locked by digest', async () => {
    const bundle = servers.registry.bundles['k8slt/kctrl-example-pkg:v1.0.0'];
    const { out, lock } = await sync({ imgpkgBundle: { image: bundle?.ref } }, 'bundle');
    const e2eBundle = fixturePath('kapp-controller', 'test', 'e2e', 'assets', 'kappctrl-e2e-bundle');
    expect(await readTree(out)).toEqual({
      ...(await readTree(STEP2)),
      '.imgpkg/bundle.yml': await readFile(path.join(e2eBundle, '.imgpkg', 'bundle.yml'), 'utf8'),
      '.imgpkg/images.yml': await readFile(path.join(e2eBundle, '.imgpkg', 'images.yml'), 'utf8'),
    });
    expect(lock?.imgpkgBundle).toEqual({ image: bundle?.digestRef, tag: 'v1.0.0' });
  });

  it('imgpkgBundle: a freshly pushed bundle by digest', async () => {
    const pushed = await pushBundle(servers.registry, 'vendir/fresh:v1', { 'config.yml': 'kind: ConfigMap\n' });
    const { out, lock } = await sync({ imgpkgBundle: { image: pushed.digestRef } }, 'bundle-digest');
    expect(await readTree(out)).toEqual({
      '.imgpkg/images.yml': '---\napiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n',
      'config.yml': 'kind: ConfigMap\n',
    });
    expect(lock?.imgpkgBundle).toEqual({ image: pushed.digestRef });
  });

  it('http: k8s-simple-app-example-master.zip with subPath, as examples/simple-app-http.yml', async () => {
    const zip = servers.http.files['k8s-simple-app-example-master.zip'];
    const { out, lock } = await sync(
      {
        http: { url: zip?.url, sha256: zip?.sha256 },
        includePaths: ['k8s-simple-app-example-master/config-step-2-template/**/*'],
        newRootPath: 'k8s-simple-app-example-master/config-step-2-template',
      },
      'http-zip',
    );
    expect(await readTree(out)).toEqual(await readTree(STEP2));
    expect(lock?.http).toEqual({});
  });

  it('http: the tgz unpacks to the whole fixture', async () => {
    const tgz = servers.http.files['k8s-simple-app-example-master.tgz'];
    const { out } = await sync({ http: { url: tgz?.url } }, 'http-tgz');
    expect(await readTree(out)).toEqual(
      Object.fromEntries(
        Object.entries(await readTree(SIMPLE_APP)).map(([k, v]) => [`k8s-simple-app-example-master/${k}`, v]),
      ),
    );
  });

  it('http: rejects a wrong sha256', async () => {
    const zip = servers.http.files['k8s-simple-app-example-master.zip'];
    await expect(sync({ http: { url: zip?.url, sha256: '0'.repeat(64) } }, 'http-badsum')).rejects.toThrow(
      /sha256|SHA256/,
    );
  });
});

const TOOLS = ['vendir', 'helm', 'imgpkg'];

/** A tmp root as the functions have one (Lambda: `/tmp`): scratch and tool run directories. */
async function stage(name: string): Promise<{ tmpRoot: string; deps: PipelineDeps }> {
  const tmpRoot = path.join(scratch, name);
  await mkdir(tmpRoot);
  const tools = { allow: TOOLS, resolveBin: toolBin, tmpDir: tmpRoot };
  const deps: PipelineDeps = {
    clusters: undefined as unknown as PipelineDeps['clusters'],
    store: new MemoryStore(),
    runner: createCommandRunner({ ...tools, baseEnv: stageToolEnv('fetch', tools) }),
    now: () => new Date(),
    log: memoryLogger(),
    config: { tmpRoot, toolVersions: { vendir: '0.44.0' }, controllerVersion: 'v0.53.1' },
  };
  return { tmpRoot, deps };
}

/**
 * Issue 7 §3 for vendir: the fetch stage's own vendir runs (`fetchWithVendir` with the real
 * command runner) keep no cache. Upstream's `VENDIR_CACHE_DIR` (`<tmp>/vendir-cache/apps/<uid>`)
 * outlived every run, and vendir keys a bundle there by digest alone: a second run for the same
 * App naming that digest on an unreachable registry was served from it.
 */
describe('the fetch stage runs vendir with no cache between runs', () => {
  // Fetches with no Secret or ConfigMap reference read nothing through the view.
  const noKube = new Proxy({} as FetchView, {
    get: (_t, name) => () => {
      throw new Error(`the fetch read ${String(name)} from the cluster`);
    },
  });
  const app = (fetch: AppFetch[]) =>
    ({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'simple', namespace: 'ns', uid: 'same-app-uid' },
      spec: { fetch },
    }) as unknown as App;

  const fetchOnce = async (deps: PipelineDeps, fetch: AppFetch[]) =>
    await fetchWithVendir(app(fetch), deps, noKube, undefined, secretMaskOf(deps), new AbortController().signal);

  it('leaves nothing in the tmp root after a git, a bundle or a failed fetch', async () => {
    const { tmpRoot, deps } = await stage('no-leftovers');
    const bundle = servers.registry.bundles['k8slt/kctrl-example-pkg:v1.0.0'];
    const fetches: [AppFetch[], boolean][] = [
      [[{ git: { url: servers.git.repos['k8s-simple-app-example']?.url, ref: 'origin/develop' } }], true],
      [[{ imgpkgBundle: { image: bundle?.digestRef } }], true],
      [[{ git: { url: servers.git.repos['k8s-simple-app-example']?.url, ref: 'origin/no-such-branch' } }], false],
    ];
    for (const [fetch, ok] of fetches) {
      const r = await fetchOnce(deps, fetch);
      expect(r.toolRuns).toBe(1);
      expect(r.result.error === undefined).toBe(ok);
      expect(await readdir(tmpRoot)).toEqual([]);
    }
  });

  it('a second run for the same App is not served the bundle the first run fetched', async () => {
    const pushed = await pushBundle(servers.registry, 'vendir/no-cache:v1', { 'config.yml': 'kind: ConfigMap\n' });
    // The same digest on a registry nobody listens on: only a cache could serve it.
    const unreachable = `127.0.0.1:${await freePort()}/nothing@${pushed.digest}`;

    // Control: with upstream's cache directory kept between runs, the second run succeeds.
    const control = await stage('control');
    const cacheDir = path.join(control.tmpRoot, 'vendir-cache', 'apps', 'same-app-uid');
    await mkdir(cacheDir, { recursive: true });
    const upstreamRun = async (image: string) => {
      const work = await mkdtemp(path.join(control.tmpRoot, 'fetch-'));
      const plan = planVendirSync({ fetch: [{ imgpkgBundle: { image } }], namespace: 'ns', refs: refObjectsFrom({}) });
      const r = await control.deps.runner.run({
        cmd: 'vendir',
        args: plan.command.args,
        stdin: plan.stdin,
        cwd: work,
        env: { ...plan.command.env, VENDIR_CACHE_DIR: cacheDir },
      });
      await rm(work, { recursive: true });
      return r;
    };
    expect((await upstreamRun(pushed.digestRef)).exitCode).toBe(0);
    expect((await upstreamRun(unreachable)).exitCode).toBe(0);

    const { tmpRoot, deps } = await stage('same-app');
    const first = await fetchOnce(deps, [{ imgpkgBundle: { image: pushed.digestRef } }]);
    expect(first.result.error).toBeUndefined();
    const second = await fetchOnce(deps, [{ imgpkgBundle: { image: unreachable } }]);
    expect(second.result.error).toBe('Fetching resources: Error (see .status.usefulErrorMessage for details)');
    expect(second.result.stderr).toMatch(/connection refused/);
    expect(await readdir(tmpRoot)).toEqual([]);
  });
});

/**
 * Issue 7: image layer entries named with backslashes. On Linux `\` is an ordinary character,
 * so Go's `GODEBUG=tarinsecurepath=0` lets `..\x` through, but imgpkg (and vendir, which links
 * its extraction) splits such a name on `\` (`hydrateFilepath`, for images made on Windows): the
 * unpatched v0.46.1 wrote `..\x` to `<output>/../x`, and through `fetchWithVendir` a layer entry
 * climbing to an absolute directory wrote there while the fetch succeeded. The pinned builds
 * carry `patchImgpkgLayerPaths` (`layers/gobuild.ts`): the pull fails naming the entry and
 * nothing is written outside.
 */
describe('image layer entries named with backslashes', () => {
  /**
   * A layer whose entries climb out by backslashes: one level (`..\x`, `a\..\..\y`) and to the
   * absolute directory `target` (writable by every uid, so a tool run under its own uid could
   * write there: only the refusal keeps it empty).
   */
  async function hostileTree(target: string): Promise<Record<string, string>> {
    await mkdir(target, { recursive: true });
    await chmod(target, 0o777);
    const climb = `${'..\\'.repeat(30)}${target.slice(1).split('/').join('\\')}\\escaped.txt`;
    return {
      [climb]: 'escaped\n',
      '..\\x': 'one up\n',
      'a\\..\\..\\y': 'one up too\n',
      'config.yml': 'kind: ConfigMap\n',
    };
  }

  it('imgpkg pull fails naming the entry and writes nothing outside its output', async () => {
    const target = path.join(scratch, 'pull-target');
    const pushed = await pushImage(servers.registry, 'backslash/pull:v1', await hostileTree(target));
    const parent = path.join(scratch, 'pull');
    await mkdir(path.join(parent, 'home'), { recursive: true });
    const res = await run([toolBin('imgpkg'), 'pull', '-i', pushed.digestRef, '-o', path.join(parent, 'out')], {
      env: { ...toolEnv({ home: path.join(parent, 'home') }), GODEBUG: 'tarinsecurepath=0,zipinsecurepath=0' },
    }).catch((e: Error) => e);
    expect(res).toBeInstanceOf(Error);
    expect(String(res)).toMatch(
      /Refusing layer entry "(\.\.\\\\){30}.*escaped\.txt": its path leaves the output directory/,
    );
    // imgpkg may have made its output directory; the unpatched one wrote `x` and `y` beside it.
    expect((await readdir(parent)).filter((n) => n !== 'out')).toEqual(['home']);
    expect(await readdir(target)).toEqual([]);
  });

  it.each<[string, (ref: string) => AppFetch]>([
    ['image', (ref) => ({ image: { url: ref } })],
    ['imgpkgBundle', (ref) => ({ imgpkgBundle: { image: ref } })],
  ])(
    'the fetch stage (%s): Fetching resources fails naming the entry; nothing outside, nothing left',
    async (kind, fetchOf) => {
      const target = path.join(scratch, `${kind}-target`);
      const tree = await hostileTree(target);
      const pushed =
        kind === 'image'
          ? await pushImage(servers.registry, 'backslash/image:v1', tree)
          : await pushBundle(servers.registry, 'backslash/bundle:v1', tree);
      const { tmpRoot, deps } = await stage(`backslash-${kind}`);
      const app = {
        apiVersion: 'kappctrl.k14s.io/v1alpha1',
        kind: 'App',
        metadata: { name: 'hostile', namespace: 'ns', uid: 'hostile-uid' },
        spec: { fetch: [fetchOf(pushed.digestRef)] },
      } as unknown as App;
      const r = await fetchWithVendir(
        app,
        deps,
        {} as FetchView,
        undefined,
        secretMaskOf(deps),
        new AbortController().signal,
      );
      expect(r.fetchKey).toBeUndefined();
      expect(r.result.error).toBe('Fetching resources: Error (see .status.usefulErrorMessage for details)');
      expect(r.result.stderr).toMatch(/Refusing layer entry ".*": its path leaves the output directory/);
      expect(await readdir(target)).toEqual([]);
      expect(await readdir(tmpRoot)).toEqual([]);
    },
  );
});
