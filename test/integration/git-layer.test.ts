/**
 * git on Lambda, with only what the fetch function ships: the fetch layer laid out as it is
 * deployed (`assembleStageLayer`: vendir, imgpkg, helm, `kl-launch`, and the relocated git of
 * `layers/git.ts`), and vendir run through the project's command runner as the Lambda entry runs
 * it, with `PATH` = the layer's `bin/` alone (no host git, no `/usr/bin`). vendir fetches a git
 * source from the local git server and reports the commit and tag in its lock output; the source
 * poll's `git ls-remote` resolves the same ref with the layer's git.
 *
 * Redirects: a server answering every request with a 302 to the git server stands in for a
 * hostile git server redirecting to a URL the URL policy refuses. git follows such a redirect
 * by default (the control case, with the host git); vendir's git and `git ls-remote` run with
 * `GIT_SAFETY_ENV` and fail instead, without a request to the redirect's target.
 */
import { lstat, mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { type IncomingMessage, request, type ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { refObjectsFrom } from '../../functions/lib/api/refs.js';
import {
  type CommandRunner,
  createCommandRunner,
  dirBinResolver,
  STAGE_TOOLS,
} from '../../functions/lib/exec/runner.js';
import { GitResolveError, resolveGitRef } from '../../functions/lib/fetch/git-ls-remote.js';
import { GIT_SUBMODULE_LOCKDOWN_ENV } from '../../functions/lib/fetch/url-policy.js';
import { planVendirSync } from '../../functions/lib/fetch/vendir.js';
import { assembleStageLayer, type StageLayer } from '../../layers/build.js';
import { run } from '../../layers/gobuild.js';
import { LAUNCHER_NAME } from '../../layers/native.js';
import { createRepo, type GitRepo } from '../harness/fixtures.js';
import { type GitServer, isolatedGitEnv, startGitServer } from '../harness/servers/git.js';
import { type LoopbackHttpService, makeTempDir, startLoopbackHttp } from '../harness/servers/process.js';

let scratch: string;
let layer: StageLayer;
let git: GitServer;
let repo: GitRepo;
let redirector: LoopbackHttpService;
/** Requests the git server answered (a redirect followed would show here). */
const served: string[] = [];
let proxy: LoopbackHttpService;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'git-layer-'));
  layer = await assembleStageLayer('fetch', path.join(scratch, 'layer'), () => {});
  git = await startGitServer();
  repo = await createRepo(git, 'org/app', { 'config/cm.yml': 'kind: ConfigMap\n' }, { tags: ['v1.2.0'] });
  // The git server behind a counting proxy, and a redirector pointing at that proxy.
  const target = new URL(git.baseUrl);
  proxy = await startLoopbackHttp('counting proxy', await makeTempDir('proxy'), (req, res) => {
    served.push(req.url ?? '');
    forward(target, req, res);
  });
  redirector = await startLoopbackHttp('redirector', await makeTempDir('redirect'), (req, res) => {
    res.writeHead(302, { location: `${proxy.baseUrl}${req.url ?? '/'}` }).end();
  });
});

afterAll(async () => {
  await Promise.all([git?.stop(), redirector?.stop(), proxy?.stop()]);
  await rm(scratch, { recursive: true, force: true });
});

/** Forwards one request to `target` (method, path, headers, body) and streams the answer back. */
function forward(target: URL, req: IncomingMessage, res: ServerResponse): void {
  const out = request(
    { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    },
  );
  out.on('error', () => res.writeHead(502).end());
  req.pipe(out);
}

/** The fetch function's runner over the layer: its allow-list, `PATH` = the layer's `bin/` only. */
async function layerRunner(allow: readonly string[]): Promise<{ runner: CommandRunner; home: string }> {
  const home = await mkdtemp(path.join(scratch, 'home-'));
  return {
    home,
    runner: createCommandRunner({
      allow,
      resolveBin: dirBinResolver(layer.binDir),
      baseEnv: { PATH: layer.binDir, HOME: home, TMPDIR: home },
      tmpDir: home,
      launcher: path.join(layer.binDir, LAUNCHER_NAME),
    }),
  };
}

async function vendirGit(url: string, ref: string) {
  const { runner, home } = await layerRunner(STAGE_TOOLS.fetch);
  const work = path.join(home, 'work');
  await mkdir(work);
  const plan = planVendirSync({
    fetch: [{ git: { url, ref } }],
    namespace: 'ns',
    refs: refObjectsFrom({}),
  });
  const r = await runner.run({
    cmd: plan.command.bin,
    args: plan.command.args,
    // As the fetch stage runs it under the cloud mode's enforced URL policy.
    env: { ...plan.command.env, ...GIT_SUBMODULE_LOCKDOWN_ENV },
    stdin: plan.stdin,
    cwd: work,
  });
  return { ...r, work };
}

describe('the fetch layer', () => {
  it('carries git as the layer launcher, with its own loader and libraries', async () => {
    expect(layer.tools).toEqual(['vendir', 'imgpkg', 'helm', 'git']);
    const bin = await lstat(path.join(layer.binDir, 'git'));
    expect(bin.isFile()).toBe(true);
    for (const f of ['git/real/git', 'git/real/git-remote-http', 'git/lib/ld.so', 'git/lib/libc.so.6']) {
      expect((await lstat(path.join(layer.binDir, '..', f))).isFile()).toBe(true);
    }
    const { stdout } = await run([path.join(layer.binDir, 'git'), '--version'], { env: { PATH: layer.binDir } });
    expect(stdout).toMatch(/^git version 2\.\d+\.\d+/);
  });

  it('vendir fetches a git source with PATH = the layer alone, and reports the commit and tag', async () => {
    const r = await vendirGit(repo.url, 'v1.2.0');
    expect(r.error, r.stderr).toBeUndefined();
    expect(await readFile(path.join(r.work, '0', 'config', 'cm.yml'), 'utf8')).toBe('kind: ConfigMap\n');
    // vendir's lock output: what the App's status shows for a git source.
    expect(r.stdout).toContain(`sha: ${repo.commitSha}`);
    expect(r.stdout).toContain('tags:\n      - v1.2.0');
  });

  it("the source poll's git ls-remote resolves the ref with the layer's git", async () => {
    const { runner } = await layerRunner(['git']);
    expect(await resolveGitRef(runner, repo.url, 'v1.2.0')).toBe(repo.commitSha);
  });
});

describe('git follows no redirect', () => {
  it('control: git without the setting follows the redirect to the git server', async () => {
    const before = served.length;
    const { stdout } = await run(['git', 'ls-remote', '--', `${redirector.baseUrl}/org/app`], {
      env: isolatedGitEnv(),
    });
    expect(stdout).toContain(`${repo.commitSha}\trefs/tags/v1.2.0`);
    expect(served.length).toBeGreaterThan(before);
  });

  it("vendir's git fails on the redirect and never reaches its target", async () => {
    const before = served.length;
    const r = await vendirGit(`${redirector.baseUrl}/org/app`, 'v1.2.0');
    expect(r.error).toBeDefined();
    expect(r.stderr).toMatch(/returned error: 302|redirect/i);
    expect(served.length).toBe(before);
  });

  it('git ls-remote fails on the redirect and never reaches its target', async () => {
    const before = served.length;
    const { runner } = await layerRunner(['git']);
    const err = await resolveGitRef(runner, `${redirector.baseUrl}/org/app`, 'v1.2.0').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GitResolveError);
    expect((err as Error).message).toMatch(/302|redirect/i);
    expect(served.length).toBe(before);
  });
});
