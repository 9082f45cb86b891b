/**
 * The shared tool cache (`layers/toolcache.ts`): setup's flags and environment, the image tag,
 * the checks that run before any pulled binary does, and the lock file, with a stand-in imgpkg
 * (a shell script keeping images as directories) so no registry is needed.
 */
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { binDir, componentKey } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import {
  binarySums,
  openToolCache,
  readToolCacheLock,
  SUMS_FILE,
  sumsOf,
  toolCacheTag,
  verifyLocked,
  verifyPulled,
  writeToolCacheLock,
} from '../../layers/toolcache.js';
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
    expect(parseSetupArgs(['--pull-cache', REPO], { KAPP_LAMBDA_TOOL_CACHE_LOCK: '/x/lock.json' }).lockFile).toBe(
      '/x/lock.json',
    );
  });

  it('refuses an unknown flag and a flag without its repository', () => {
    expect(() => parseSetupArgs(['--push'], {})).toThrow("Unknown option '--push'");
    expect(() => parseSetupArgs(['--pull-cache'], {})).toThrow("Option '--pull-cache <value>' argument missing");
    expect(() => parseSetupArgs(['--cache', REPO], {})).toThrow("Unknown option '--cache'");
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

describe('the tool cache lock', () => {
  const kapp = component('kapp');
  const tag = toolCacheTag(kapp);
  let dir: string;
  let lockFile: string;
  let registry: string;
  let imgpkg: string;
  let marker: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'toolcache-lock-'));
    lockFile = path.join(dir, 'toolcache.lock.json');
    registry = path.join(dir, 'registry');
    marker = path.join(dir, 'forged-binary-ran');
    await mkdir(path.join(registry, 'images'), { recursive: true });
    // A stand-in imgpkg: an image is a directory named by its tag; every call is recorded.
    imgpkg = path.join(dir, 'imgpkg');
    await writeFile(
      imgpkg,
      [
        '#!/bin/sh',
        'reg="$FAKE_REGISTRY"',
        'echo "$*" >> "$reg/calls"',
        't=$(echo "$3" | cut -d: -f2)',
        'case "$1" in',
        '  tag) ls "$reg/images" ;;',
        // A layer with a whiteout entry `.wh...`: imgpkg removes <output>/.. (Go's filepath.Join,
        // lexical: the output's parent) before anything is checked.
        '  pull) if [ -e "$reg/images/$t/.wh..." ]; then rm -rf "$(dirname "$5")"; fi',
        '        mkdir -p "$5" && cp -R "$reg/images/$t/." "$5/" ;;',
        '  push) mkdir -p "$reg/images/$t" && cp -R "$5/." "$reg/images/$t/" ;;',
        'esac',
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /** Puts an image for kapp's tag in the stand-in registry: a script that leaves the marker, with matching in-image sums. */
  async function forgeImage(): Promise<Record<string, string>> {
    const image = path.join(registry, 'images', tag);
    await mkdir(image, { recursive: true });
    const script = `#!/bin/sh\necho ran >> '${marker}'\necho "kapp version ${kapp.version.replace(/^v/, '')}"\n`;
    await writeFile(path.join(image, 'kapp'), script, { mode: 0o755 });
    await writeFile(path.join(image, SUMS_FILE), await sumsOf(kapp, image));
    return await binarySums(kapp, image);
  }

  const open = (root: string) =>
    openToolCache({ repo: 'registry.invalid/tools', imgpkg, root, lockFile, env: { FAKE_REGISTRY: registry } });
  const calls = async () => (await readFile(path.join(registry, 'calls'), 'utf8')).trim().split('\n');

  it('reads a missing file as empty, writes sorted and reads back, and refuses a malformed one', async () => {
    expect(await readToolCacheLock(lockFile)).toEqual({ version: 1, images: {} });
    const sum = (c: string) => c.repeat(64);
    await writeToolCacheLock(lockFile, { version: 1, images: { 'z-tag': { b: sum('b'), a: sum('a') }, 'a-tag': {} } });
    expect(Object.keys(JSON.parse(await readFile(lockFile, 'utf8')).images)).toEqual(['a-tag', 'z-tag']);
    expect(await readToolCacheLock(lockFile)).toEqual({
      version: 1,
      images: { 'a-tag': {}, 'z-tag': { a: sum('a'), b: sum('b') } },
    });
    await writeFile(lockFile, JSON.stringify({ version: 1, images: { t: { kapp: 'not-hex' } } }));
    await expect(readToolCacheLock(lockFile)).rejects.toThrow(`${lockFile}: t kapp: not a sha256: not-hex`);
    await writeFile(lockFile, JSON.stringify({ images: {} }));
    await expect(readToolCacheLock(lockFile)).rejects.toThrow(`${lockFile}: not a version 1 tool cache lock`);
  });

  it('verifyLocked accepts the recorded sha256 and refuses another or a missing one', async () => {
    const sums = await forgeImage();
    const image = path.join(registry, 'images', tag);
    await expect(verifyLocked(kapp, image, sums)).resolves.toBeUndefined();
    await expect(verifyLocked(kapp, image, { kapp: '0'.repeat(64) })).rejects.toThrow(
      /^kapp: kapp has sha256 [0-9a-f]{64}, the tool cache lock records 0{64}$/,
    );
    await expect(verifyLocked(kapp, image, {})).rejects.toThrow('kapp: the tool cache lock records no sha256 for kapp');
  });

  it('does not ask the registry for a tag the lock does not list', async () => {
    await forgeImage();
    const root = path.join(dir, 'cache');
    expect(await (await open(root)).pull(kapp, () => undefined)).toBe('unlocked');
    expect(await calls()).toEqual(['tag list -i registry.invalid/tools --tty=false']);
    expect(existsSync(marker)).toBe(false);
  });

  it('refuses a forged image whose own sums match but the lock does not, running nothing and leaving nothing', async () => {
    await forgeImage();
    await writeToolCacheLock(lockFile, { version: 1, images: { [tag]: { kapp: 'a'.repeat(64) } } });
    const root = path.join(dir, 'cache');
    const err = await (await open(root))
      .pull(kapp, () => undefined)
      .then(
        () => undefined,
        (e: Error) => e,
      );
    expect(err?.message).toBe(`pull kapp from registry.invalid/tools:${tag}`);
    expect(String((err?.cause as Error | undefined)?.message)).toMatch(
      /^kapp: kapp has sha256 [0-9a-f]{64}, the tool cache lock records a{64}$/,
    );
    expect(existsSync(marker)).toBe(false);
    expect(existsSync(path.join(root, 'bin'))).toBe(false);
    expect(await readdir(path.join(root, 'tmp'))).toEqual([]);
  });

  it("a whiteout entry removing the pull's parent directory leaves the cache's other components alone", async () => {
    const image = path.join(registry, 'images', tag);
    await mkdir(image, { recursive: true });
    await writeFile(path.join(image, '.wh...'), '');
    await writeToolCacheLock(lockFile, { version: 1, images: { [tag]: { kapp: 'a'.repeat(64) } } });
    const root = path.join(dir, 'cache');
    const ytt = binDir(component('ytt'), root);
    await mkdir(ytt, { recursive: true });
    await writeFile(path.join(ytt, 'ytt'), 'an hour of building');
    await expect((await open(root)).pull(kapp, () => undefined)).rejects.toThrow(`pull kapp from`);
    expect(await readFile(path.join(ytt, 'ytt'), 'utf8')).toBe('an hour of building');
    expect(await readdir(path.join(root, 'tmp'))).toEqual([]);
  });

  it('pulls an image the lock records (its version check runs it) and a push records its tag in the lock', async () => {
    const sums = await forgeImage();
    await writeToolCacheLock(lockFile, { version: 1, images: { [tag]: sums } });
    const root = path.join(dir, 'cache');
    const cache = await open(root);
    expect(await cache.pull(kapp, () => undefined)).toBe('pulled');
    expect(await readFile(marker, 'utf8')).toBe('ran\n');
    expect((await readdir(binDir(kapp, root))).sort()).toEqual(['.complete', 'kapp']);

    // Pushed again from that cache into an empty lock and registry: the lock records the tag.
    await rm(path.join(registry, 'images', tag), { recursive: true });
    await writeToolCacheLock(lockFile, { version: 1, images: {} });
    expect(await (await open(root)).push(kapp, () => undefined)).toBe('pushed');
    expect(await readToolCacheLock(lockFile)).toEqual({ version: 1, images: { [tag]: sums } });
    expect(await (await open(root)).push(kapp, () => undefined)).toBe('present');
  });
});
