/**
 * A git repository whose `.gitmodules` names a URL the policy never checked (the Lambda Runtime
 * API on loopback): vendir runs `git submodule update --init --recursive`, so before this change
 * git cloned it (vendir 0.44 + git 2.39 requested `/submod/info/refs` from a loopback server).
 * Under an enforced policy vendir now runs with {@link GIT_SUBMODULE_LOCKDOWN_ENV}. The first test
 * checks the stage passes it; the second shows with the system git, on local repositories only,
 * that it refuses a submodule clone while the top-level clone still works.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { GIT_SAFETY_ENV } from '../../functions/lib/fetch/git-env.js';
import { GIT_SUBMODULE_LOCKDOWN_ENV } from '../../functions/lib/fetch/url-policy.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { appObject, REF } from './support/app-world.js';
import { FakeCluster } from './support/fake-cluster.js';
import { stageDeps } from './support/stage-deps.js';

const run = promisify(execFile);
let tmp: string;
beforeEach(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'attack-git-submodules-'));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

const APP = appObject({ spec: { fetch: [{ git: { url: 'https://git.example/r.git', ref: 'origin/main' } }] } });

async function vendirEnv(mode: 'enforce' | 'off'): Promise<Record<string, string> | undefined> {
  const runner = new FakeCommandRunner().on('vendir', async (req) => {
    await writeFile(join(req.cwd ?? '', 'a.yml'), 'a: 1\n');
    return { stdout: '' };
  });
  const { deps } = stageDeps(new FakeCluster().put(APP as never), {
    runner,
    tmpRoot: tmp,
    extra: { download: { download: async () => ({ body: Buffer.alloc(0), sha256: '' }) } },
    // allow-listed by name, so the check needs no DNS
    config: { urlPolicy: { mode, allow: ['git.example'] } },
  });
  const ctx = { clusterId: 'c1', ref: REF, run: { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' } };
  await runFetch(ctx, { raw: APP as never, app: APP }, deps);
  // The branch is resolved first (git ls-remote, the fleet's source poll); then vendir runs.
  const vendir = runner.calls.filter((c) => c.cmd === 'vendir');
  expect(vendir).toHaveLength(1);
  return vendir[0]?.env as Record<string, string> | undefined;
}

async function git(cwd: string, env: Record<string, string>, ...args: string[]): Promise<string> {
  const { stdout } = await run('git', args, {
    cwd,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: join(tmp, 'home'), GIT_TERMINAL_PROMPT: '0', ...env },
  });
  return stdout;
}

describe('git submodules under an enforced URL policy', () => {
  it('vendir runs with protocol.<t>.allow=user (others never) when the policy is enforced, and without it when off; never following a redirect', async () => {
    expect(await vendirEnv('enforce')).toMatchObject({
      GIT_CONFIG_COUNT: '6',
      GIT_CONFIG_KEY_0: 'http.followRedirects',
      GIT_CONFIG_VALUE_0: 'false',
      GIT_CONFIG_KEY_1: 'protocol.allow',
      GIT_CONFIG_VALUE_1: 'never',
      GIT_CONFIG_KEY_2: 'protocol.https.allow',
      GIT_CONFIG_VALUE_2: 'user',
      GIT_CONFIG_KEY_5: 'protocol.git.allow',
      GIT_CONFIG_VALUE_5: 'user',
    });
    const off = await vendirEnv('off');
    expect(off).toMatchObject({ ...GIT_SAFETY_ENV });
    expect(off).not.toHaveProperty('GIT_CONFIG_KEY_1');
  });

  it('with that environment git clones the named repository but refuses its submodule', async () => {
    await mkdir(join(tmp, 'home'));
    const id = { GIT_AUTHOR_NAME: 'a', GIT_AUTHOR_EMAIL: 'a@b', GIT_COMMITTER_NAME: 'a', GIT_COMMITTER_EMAIL: 'a@b' };
    const sub = join(tmp, 'sub');
    const top = join(tmp, 'top');
    for (const d of [sub, top]) {
      await mkdir(d);
      await git(d, id, 'init', '-q', '-b', 'main');
      await writeFile(join(d, 'a.yml'), 'a: 1\n');
      await git(d, id, 'add', 'a.yml');
      await git(d, id, 'commit', '-qm', 'a');
    }
    // What a hostile repository would hold: a submodule on a URL nobody checked.
    // (`git://127.0.0.1:1/`: a transport git allows by default, on a port where nothing listens.)
    const head = (await git(sub, {}, 'rev-parse', 'HEAD')).trim();
    await writeFile(join(top, '.gitmodules'), '[submodule "s"]\n\tpath = s\n\turl = git://127.0.0.1:1/r\n');
    await git(top, id, 'add', '.gitmodules');
    await git(top, id, 'update-index', '--add', '--cacheinfo', `160000,${head},s`);
    await git(top, id, 'commit', '-qm', 'sub');

    const clone = join(tmp, 'clone');
    // A local path is the file transport, which the lockdown refuses (the policy never lets an
    // App name one): allowed here for this clone only, on git's command line.
    await git(tmp, GIT_SUBMODULE_LOCKDOWN_ENV, '-c', 'protocol.file.allow=always', 'clone', '-q', top, clone);
    expect(await readFile(join(clone, 'a.yml'), 'utf8')).toBe('a: 1\n');
    const err = await git(clone, GIT_SUBMODULE_LOCKDOWN_ENV, 'submodule', 'update', '--init', '--recursive').then(
      () => undefined,
      (e: { stderr: string }) => e.stderr,
    );
    expect(err).toMatch(/transport 'git' not allowed/);
    // Without the setting git connects to the submodule's host (the behaviour vendir had).
    const open = await git(clone, {}, 'submodule', 'update', '--init', '--recursive').then(
      () => undefined,
      (e: { stderr: string }) => e.stderr,
    );
    expect(open).toMatch(/unable to connect to 127\.0\.0\.1/);
    expect(open).not.toMatch(/not allowed/);
  });

  it('with that environment git refuses ext:: and file:// as the named repository too', async () => {
    const mark = join(tmp, 'ext-ran');
    const ext = await git(tmp, GIT_SUBMODULE_LOCKDOWN_ENV, 'ls-remote', `ext::sh -c touch% ${mark}`).then(
      () => undefined,
      (e: { stderr: string }) => e.stderr,
    );
    expect(ext).toMatch(/transport 'ext' not allowed/);
    await expect(readFile(mark)).rejects.toThrow();
    const file = await git(tmp, GIT_SUBMODULE_LOCKDOWN_ENV, 'ls-remote', `file://${tmp}`).then(
      () => undefined,
      (e: { stderr: string }) => e.stderr,
    );
    expect(file).toMatch(/transport 'file' not allowed/);
  });
});
