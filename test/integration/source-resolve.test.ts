/**
 * Tag → digest without vendir, against the real servers: one manifest `HEAD` of the local
 * docker-registry gives the digest imgpkg's push reported, and a new push under the same tag
 * gives the new one; `git ls-remote` through the project's command runner (the system git,
 * resolved as the embedded runtime resolves it) gives the commit a branch or tag names on the
 * local git server. Under an enforcing URL policy the loopback registry is refused before any
 * request.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { createCommandRunner, createToolMetrics } from '../../functions/lib/exec/index.js';
import { GitResolveError, resolveGitRef } from '../../functions/lib/fetch/git-ls-remote.js';
import { RegistryResolveError, resolveImageDigest } from '../../functions/lib/fetch/registry-digest.js';
import { CLOUD_URL_POLICY, UrlPolicyChecker, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { createRepo, pushBundle } from '../harness/fixtures.js';
import { type GitServer, type RegistryServer, startGitServer, startRegistry } from '../harness/servers.js';

let registry: RegistryServer;
let git: GitServer;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'source-resolve-'));
  [registry, git] = await Promise.all([startRegistry(), startGitServer()]);
});

afterAll(async () => {
  await Promise.all([registry?.stop(), git?.stop()]);
  await rm(scratch, { recursive: true, force: true });
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
    const runner = createCommandRunner({
      allow: ['git'],
      resolveBin: cacheBinResolver(cacheRoot()),
      home: scratch,
      tmpDir: scratch,
      metrics: createToolMetrics(),
    });
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
