/**
 * Tag → digest without vendir, against the real servers: one manifest `HEAD` of the local
 * docker-registry gives the digest imgpkg's push reported, and a new push under the same tag
 * gives the new one; `git ls-remote` through the project's command runner (the system git,
 * resolved as the embedded runtime resolves it) gives the commit a branch or tag names on the
 * local git server. Under an enforcing URL policy the loopback registry is refused before any
 * request. Tag selections (`tagSelection`, `refSelection`) resolve over the tags pushed, to the
 * digest or commit of the highest matching one, and move when a higher tag is pushed. An http
 * source resolves to the sha256 the static server's file has, and a helm chart to the version and
 * digest `helm repo index` wrote for it, each following a republish.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { sourcePinned } from '../../functions/lib/api/pin-rule.js';
import { createCommandRunner, createToolMetrics } from '../../functions/lib/exec/index.js';
import { GitResolveError, resolveGitRef } from '../../functions/lib/fetch/git-ls-remote.js';
import { RegistryResolveError, resolveImageDigest } from '../../functions/lib/fetch/registry-digest.js';
import { pinnedFetchOf, polledSourceOf, resolveSource } from '../../functions/lib/fetch/source-resolve.js';
import { CLOUD_URL_POLICY, UrlPolicyChecker, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { buildHelmRepo, createRepo, publishFile, pushBundle, toolBin, toolEnv } from '../harness/fixtures.js';
import {
  type GitServer,
  type HttpServer,
  type RegistryServer,
  startGitServer,
  startHttpServer,
  startRegistry,
} from '../harness/servers.js';

const execFileP = promisify(execFile);

let registry: RegistryServer;
let git: GitServer;
let http: HttpServer;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'source-resolve-'));
  [registry, git, http] = await Promise.all([startRegistry(), startGitServer(), startHttpServer()]);
});

afterAll(async () => {
  await Promise.all([registry?.stop(), git?.stop(), http?.stop()]);
  await rm(scratch, { recursive: true, force: true });
});

/** The project's command runner with the system git, as the embedded runtime resolves it. */
const gitRunner = () =>
  createCommandRunner({
    allow: ['git'],
    resolveBin: cacheBinResolver(cacheRoot()),
    home: scratch,
    tmpDir: scratch,
    metrics: createToolMetrics(),
  });

const packages = (version: string) => ({ [`packages/a.corp.com/${version}.yml`]: `version: ${version}\n` });

describe('registry HEAD', () => {
  it('resolves a tag to the digest imgpkg pushed, and follows the tag when it moves', async () => {
    const v1 = await pushBundle(registry, 'resolve/repo:latest', packages('1.0.0'));
    const requests: string[] = [];
    const checkUrl = async (url: string) => {
      requests.push(url);
    };
    expect(await resolveImageDigest(v1.ref, { checkUrl })).toBe(v1.digest);
    // One request: the anonymous HEAD of the manifest.
    expect(requests).toEqual([`http://${registry.host}/v2/resolve/repo/manifests/latest`]);

    const v2 = await pushBundle(registry, 'resolve/repo:latest', packages('2.0.0'));
    expect(v2.digest).not.toBe(v1.digest);
    expect(await resolveImageDigest(v1.ref)).toBe(v2.digest);
  });

  it('reports a missing tag, and an enforcing URL policy refuses the loopback registry before any request', async () => {
    await expect(resolveImageDigest(`${registry.host}/resolve/none:v9`)).rejects.toThrow(
      new RegistryResolveError('HEAD manifest resolve/none:v9 answered 404'),
    );
    const policy = new UrlPolicyChecker(CLOUD_URL_POLICY);
    let sent = 0;
    const fetchImpl: typeof fetch = async (...args) => {
      sent += 1;
      return await fetch(...args);
    };
    await expect(
      resolveImageDigest(`${registry.host}/resolve/repo:latest`, { checkUrl: (u) => policy.checkUrl(u), fetchImpl }),
    ).rejects.toBeInstanceOf(UrlPolicyError);
    expect(sent).toBe(0);
  });
});

describe('git ls-remote', () => {
  it('resolves a branch, a tag and origin/<branch> to commits through the command runner', async () => {
    const runner = gitRunner();
    const first = await createRepo(git, 'resolve/repo', packages('1.0.0'), { tags: ['v1.0.0'] });
    const second = await createRepo(git, 'resolve/repo', packages('2.0.0'));
    expect(await resolveGitRef(runner, first.url, 'main')).toBe(second.commitSha);
    expect(await resolveGitRef(runner, first.url, 'origin/main')).toBe(second.commitSha);
    expect(await resolveGitRef(runner, first.url, 'v1.0.0')).toBe(first.commitSha);
    await expect(resolveGitRef(runner, first.url, 'v9')).rejects.toThrow(
      new GitResolveError('git remote has no ref "v9"'),
    );
  });
});

describe('tag selections', () => {
  const runnerOf = gitRunner;

  it('an imgpkgBundle tagSelection resolves to <tag>@<digest> of the highest matching tag, and moves with a higher push', async () => {
    const image = `${registry.host}/select/repo`;
    await pushBundle(registry, 'select/repo:1.0.0', packages('1.0.0'));
    const v11 = await pushBundle(registry, 'select/repo:1.1.0', packages('1.1.0'));
    const rc = await pushBundle(registry, 'select/repo:2.0.0-rc.1', packages('2.0.0-rc.1'));
    await pushBundle(registry, 'select/repo:latest', packages('latest'));
    const resolve = async (semver: { constraints?: string; prereleases?: object }) => {
      const source = polledSourceOf({ imgpkgBundle: { image, tagSelection: { semver } } });
      if (!source) throw new Error('not polled');
      return await resolveSource(source, { runner: runnerOf() });
    };
    expect(await resolve({ constraints: '>=1.0.0' })).toBe(`1.1.0@${v11.digest}`);
    expect(await resolve({ constraints: '>=1.0.0', prereleases: {} })).toBe(`2.0.0-rc.1@${rc.digest}`);
    await expect(resolve({ constraints: '>=3.0.0' })).rejects.toThrow('Determining tag selection: Expected to find');

    const v12 = await pushBundle(registry, 'select/repo:1.2.0', packages('1.2.0'));
    expect(await resolve({ constraints: '>=1.0.0' })).toBe(`1.2.0@${v12.digest}`);
    expect(await resolve({ constraints: '<1.2.0' })).toBe(`1.1.0@${v11.digest}`);
  });

  it('a git refSelection resolves to the commit of the highest matching tag, and moves with a higher tag', async () => {
    const first = await createRepo(git, 'select/repo', packages('1.0.0'), { tags: ['v1.0.0'] });
    const second = await createRepo(git, 'select/repo', packages('1.1.0'), { tags: ['v1.1.0'] });
    const rc = await createRepo(git, 'select/repo', packages('2.0.0-rc.1'), { tags: ['v2.0.0-rc.1', 'nightly'] });
    const resolve = async (semver: { constraints?: string; prereleases?: object }) => {
      const source = polledSourceOf({ git: { url: first.url, refSelection: { semver } } });
      if (!source) throw new Error('not polled');
      return await resolveSource(source, { runner: runnerOf() });
    };
    expect(await resolve({})).toBe(second.commitSha);
    expect(await resolve({ prereleases: { identifiers: ['rc'] } })).toBe(rc.commitSha);
    expect(await resolve({ constraints: '<1.1.0' })).toBe(first.commitSha);

    const third = await createRepo(git, 'select/repo', packages('1.2.0'), { tags: ['v1.2.0'] });
    expect(await resolve({})).toBe(third.commitSha);
  });
  it("the pinned fetch gives vendir's lock (status.fetch) of the selection or tag itself: digest and the tag", async () => {
    const image = `${registry.host}/locked/repo`;
    await pushBundle(registry, 'locked/repo:1.0.0', packages('1.0.0'));
    await pushBundle(registry, 'locked/repo:1.1.0', packages('1.1.0'));
    const selected = { imgpkgBundle: { image, tagSelection: { semver: { constraints: '>=1.0.0' } } } };
    const source = polledSourceOf(selected);
    if (!source) throw new Error('not polled');
    const pinned = pinnedFetchOf(selected, await resolveSource(source, { runner: runnerOf() }));
    expect(sourcePinned(pinned)).toBe(true);
    const lockOf = async (bundle: object) => {
      const dir = await mkdtemp(path.join(scratch, 'vendir-'));
      const config = {
        apiVersion: 'vendir.k14s.io/v1alpha1',
        kind: 'Config',
        directories: [{ path: 'd', contents: [{ path: '.', imgpkgBundle: bundle }] }],
      };
      await writeFile(path.join(dir, 'vendir.yml'), JSON.stringify(config));
      await execFileP(toolBin('vendir'), ['sync', '-f', 'vendir.yml', '--lock-file', 'lock.yml'], {
        cwd: dir,
        env: toolEnv({ home: dir }),
      });
      return await readFile(path.join(dir, 'lock.yml'), 'utf8');
    };
    const upstream = await lockOf(selected.imgpkgBundle);
    expect(upstream).toContain('tag: 1.1.0');
    expect(await lockOf(pinned.imgpkgBundle)).toBe(upstream);

    // A tag the user wrote (no selection): the lock keeps `tag:` too.
    const tagged = { imgpkgBundle: { image: `${image}:1.0.0` } };
    const taggedSource = polledSourceOf(tagged);
    if (!taggedSource) throw new Error('not polled');
    const pinnedTag = pinnedFetchOf(tagged, await resolveSource(taggedSource, { runner: runnerOf() }));
    expect(pinnedTag.imgpkgBundle.image).toMatch(/:1\.0\.0@sha256:[0-9a-f]{64}$/);
    const upstreamTag = await lockOf(tagged.imgpkgBundle);
    expect(upstreamTag).toContain('tag: 1.0.0');
    expect(await lockOf(pinnedTag.imgpkgBundle)).toBe(upstreamTag);
  });
});

describe('http GET hashed, and a helm chart repository index', () => {
  const runner = gitRunner;

  it("resolves an http source to its file's sha256, and follows a new file under the URL", async () => {
    const first = await publishFile(http, 'resolve/app.yml', 'a: 1\n');
    const source = { kind: 'http' as const, url: first.url, ref: '' };
    expect(await resolveSource(source, { runner: runner() })).toBe(first.sha256);
    const second = await publishFile(http, 'resolve/app.yml', 'a: 2\n');
    expect(await resolveSource(source, { runner: runner() })).toBe(second.sha256);
  });

  /** A chart `resolve` at `version` whose ConfigMap holds `value`. */
  async function chart(version: string, value: string): Promise<string> {
    const dir = path.join(scratch, `chart-${version}-${value}`, 'resolve');
    await mkdir(path.join(dir, 'templates'), { recursive: true });
    await writeFile(path.join(dir, 'Chart.yaml'), `apiVersion: v2\nname: resolve\nversion: ${version}\n`);
    await writeFile(
      path.join(dir, 'templates', 'cm.yaml'),
      `apiVersion: v1\nkind: ConfigMap\ndata:\n  a: "${value}"\n`,
    );
    return dir;
  }

  it('resolves the latest stable chart version to the digest helm indexed, a given version, and a republished one', async () => {
    const repo = await buildHelmRepo(
      http,
      [await chart('1.0.0', 'x'), await chart('1.1.0', 'x'), await chart('2.0.0-rc.1', 'x')],
      { repoPath: 'resolve-charts' },
    );
    const digest = (v: string) => repo.charts.find((c) => c.version === v)?.digest;
    const latest = { kind: 'helmChart' as const, url: repo.url, ref: 'resolve' };
    expect(await resolveSource(latest, { runner: runner() })).toBe(`1.1.0@sha256:${digest('1.1.0')}`);
    expect(await resolveSource({ ...latest, version: '1.0.0' }, { runner: runner() })).toBe(
      `1.0.0@sha256:${digest('1.0.0')}`,
    );
    // The same version packaged again with other content: a new digest in a new index.
    const again = await buildHelmRepo(http, [await chart('1.1.0', 'y')], { repoPath: 'resolve-charts' });
    const republished = again.charts.find((c) => c.version === '1.1.0')?.digest;
    expect(republished).not.toBe(digest('1.1.0'));
    expect(await resolveSource({ ...latest, version: '1.1.0' }, { runner: runner() })).toBe(
      `1.1.0@sha256:${republished}`,
    );
  });
});
