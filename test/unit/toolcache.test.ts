/**
 * The shared tool cache's pure parts (`layers/toolcache.ts`): setup's flags and environment,
 * the image tag, and the check that runs before any pulled binary does.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { componentKey } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { SUMS_FILE, sumsOf, toolCacheTag, verifyPulled } from '../../layers/toolcache.js';
import { parseSetupArgs } from '../../scripts/setup-plan.js';

const REPO = 'ghcr.io/team/kapp-lambda-tools';

describe('parseSetupArgs', () => {
  it('reads names, --pull-cache, --push-cache (which wins and pushes) and the environment', () => {
    expect(parseSetupArgs(['ytt', 'kbld'], {})).toEqual({ profile: 'full', names: ['ytt', 'kbld'], push: false });
    expect(parseSetupArgs(['--pull-cache', REPO], {})).toEqual({
      profile: 'full',
      names: [],
      cacheRepo: REPO,
      push: false,
    });
    expect(parseSetupArgs([`--push-cache=${REPO}`, 'age'], {})).toEqual({
      profile: 'full',
      names: ['age'],
      cacheRepo: REPO,
      push: true,
    });
    expect(parseSetupArgs([], { KAPP_LAMBDA_TOOL_CACHE_REGISTRY: REPO })).toEqual({
      profile: 'full',
      names: [],
      cacheRepo: REPO,
      push: false,
    });
    expect(parseSetupArgs(['--pull-cache', 'r/a'], { KAPP_LAMBDA_TOOL_CACHE_REGISTRY: REPO }).cacheRepo).toBe('r/a');
  });

  it('refuses an unknown flag and a flag without its repository', () => {
    expect(() => parseSetupArgs(['--push'], {})).toThrow('--push needs a registry/repository');
    expect(() => parseSetupArgs(['--pull-cache'], {})).toThrow('--pull-cache needs a registry/repository');
    expect(() => parseSetupArgs(['--cache', REPO], {})).toThrow(
      'unknown option --cache (known: --for full|demo|start, --pull-cache <repo>, --push-cache <repo>, --help)',
    );
  });
});

describe('toolCacheTag', () => {
  it('is the cache key and the Go platform name', () => {
    const age = component('age');
    expect(toolCacheTag(age, 'linux', 'x64')).toBe(`${componentKey(age)}-linux-amd64`);
    expect(toolCacheTag(age, 'darwin', 'arm64')).toMatch(/^age-v1\.2\.1-[0-9a-f]{10}-darwin-arm64$/);
  });
});

describe('verifyPulled', () => {
  const age = component('age');
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'toolcache-unit-'));
    await writeFile(path.join(dir, 'age'), 'age binary');
    await writeFile(path.join(dir, 'age-keygen'), 'age-keygen binary');
    await writeFile(path.join(dir, SUMS_FILE), await sumsOf(age, dir));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('accepts exactly the binaries with their recorded sha256', async () => {
    await expect(verifyPulled(age, dir)).resolves.toBeUndefined();
  });

  it('refuses a changed binary, a missing one, an extra file and a missing sums file', async () => {
    await writeFile(path.join(dir, 'age-keygen'), 'changed');
    await expect(verifyPulled(age, dir)).rejects.toThrow(/^age: age-keygen has sha256 [0-9a-f]{64}, /);
    await rm(path.join(dir, 'age-keygen'));
    await expect(verifyPulled(age, dir)).rejects.toThrow('age: pulled image has no age-keygen');
    await writeFile(path.join(dir, 'run-me'), 'x');
    await chmod(path.join(dir, 'run-me'), 0o755);
    await expect(verifyPulled(age, dir)).rejects.toThrow('age: pulled image holds unexpected run-me');
    await rm(path.join(dir, SUMS_FILE));
    await expect(verifyPulled(age, dir)).rejects.toThrow(`age: pulled image has no ${SUMS_FILE}`);
  });
});
