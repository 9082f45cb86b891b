/**
 * Issue 7: image layer entries named with backslashes. On Linux `\` is an ordinary character,
 * so Go's `GODEBUG=tarinsecurepath=0` lets `..\x` through, but imgpkg (and vendir, which links
 * its extraction) splits such a name on `\` (`hydrateFilepath`, for images made on Windows) and
 * wrote `..\x` to `<output>/../x`: with enough `..` anywhere the tool's uid may write (seen with
 * the unpatched v0.46.1: `imgpkg pull -o out` of a layer holding `a\..\..\x` made `out/../x`).
 * The pinned builds carry `patchImgpkgLayerPaths` (`layers/gobuild.ts`): the pull fails naming
 * the entry, nothing is written outside. Real imgpkg and vendir, real registry, the fetch
 * stage's own vendir run (`fetchWithVendir`, real command runner).
 */
import { spawnSync } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { App, AppFetch } from '../../functions/lib/api/index.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import type { FetchView } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { toolEnv as stageToolEnv } from '../../functions/lib/pipeline/compose.js';
import { type PipelineDeps, secretMaskOf } from '../../functions/lib/pipeline/deps.js';
import { fetchWithVendir } from '../../functions/lib/pipeline/fetch.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { pushBundle, pushImage, toolBin } from '../harness/fixtures.js';
import { type ServersInfo, startAllServers } from '../harness/servers.js';

let servers: ServersInfo;
let stopOwn: (() => Promise<void>) | undefined;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'imgpkg-backslash-'));
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

/**
 * A layer whose entries climb out by backslashes: one level (`..\x`, `a\..\..\x`) and to an
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

describe('layer entries named with backslashes', () => {
  it('imgpkg pull fails naming the entry and writes nothing outside its output', async () => {
    const target = path.join(scratch, 'pull-target');
    const pushed = await pushImage(servers.registry, 'backslash/pull:v1', await hostileTree(target));
    const parent = path.join(scratch, 'pull');
    await mkdir(path.join(parent, 'home'), { recursive: true });
    const res = spawnSync(toolBin('imgpkg'), ['pull', '-i', pushed.digestRef, '-o', path.join(parent, 'out')], {
      env: { PATH: '/usr/bin:/bin', HOME: path.join(parent, 'home'), GODEBUG: 'tarinsecurepath=0,zipinsecurepath=0' },
      encoding: 'utf8',
    });
    expect(res.status).not.toBe(0);
    expect(res.stderr).toMatch(
      /Refusing layer entry "(\.\.\\\\){30}.*escaped\.txt": its path leaves the output directory/,
    );
    expect((await readdir(parent)).sort()).toEqual(['home', 'out']);
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
      const tmpRoot = path.join(scratch, `${kind}-tmp`);
      await mkdir(tmpRoot);
      const tools = { allow: ['vendir', 'imgpkg', 'helm'], resolveBin: toolBin, tmpDir: tmpRoot };
      const deps: PipelineDeps = {
        clusters: undefined as unknown as PipelineDeps['clusters'],
        store: new MemoryStore(),
        runner: createCommandRunner({ ...tools, baseEnv: stageToolEnv('fetch', tools) }),
        now: () => new Date(),
        log: memoryLogger(),
        config: { tmpRoot, toolVersions: { vendir: '0.44.0' }, controllerVersion: 'v0.53.1' },
      };
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
