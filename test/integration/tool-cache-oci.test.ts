/**
 * The shared tool cache (`layers/toolcache.ts`) against the local docker-registry: two small
 * components of the real cache pushed (recording them in a temporary lock), then pulled with that
 * lock into an empty cache root, where setup's `buildComponent` finds them `cached` and builds
 * nothing; a forged image whose own sums match but the lock's do not, and an image whose binary
 * does not match its own sums, are refused before anything in them runs, and leave nothing in
 * the cache.
 */
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { binDir, buildComponent, run } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { openToolCache, readToolCacheLock, SUMS_FILE, sumsOf, toolCacheTag } from '../../layers/toolcache.js';
import { toolBin, toolEnv } from '../harness/fixtures.js';
import { type RegistryServer, startRegistry } from '../harness/servers.js';

const SMALL = [component('age'), component('ytt')];

let registry: RegistryServer;
let scratch: string;
/** The lock the first test's push writes; the later ones pull against it. */
let lockFile: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'tool-cache-oci-'));
  lockFile = path.join(scratch, 'toolcache.lock.json');
  registry = await startRegistry();
});

afterAll(async () => {
  await registry?.stop();
  await rm(scratch, { recursive: true, force: true });
});

describe('tool cache through an OCI registry', () => {
  it('pushes two built components into a lock and pulls them with it into an empty cache, which then reports them cached', async () => {
    const repo = `${registry.host}/kapp-lambda/tools`;
    const opts = { repo, imgpkg: toolBin('imgpkg'), env: toolEnv({ home: scratch }), lockFile };
    const source = await openToolCache(opts);
    expect(source.tags.size).toBe(0);
    const log: string[] = [];
    for (const c of SMALL) expect(await source.push(c, (m) => log.push(m))).toBe('pushed');
    expect(await source.push(SMALL[0] ?? component('age'), (m) => log.push(m))).toBe('present');
    const lock = await readToolCacheLock(lockFile);
    expect(Object.keys(lock.images).sort()).toEqual(SMALL.map((c) => toolCacheTag(c)).sort());
    expect(Object.keys(lock.images[toolCacheTag(component('age'))] ?? {}).sort()).toEqual(['age', 'age-keygen']);

    const empty = path.join(scratch, 'empty-cache');
    const target = await openToolCache({ ...opts, root: empty });
    expect([...target.tags].sort()).toEqual(SMALL.map((c) => toolCacheTag(c)).sort());
    for (const c of SMALL) expect(await target.pull(c, (m) => log.push(m))).toBe('pulled');
    expect(await target.pull(component('kbld'), (m) => log.push(m))).toBe('unlocked');

    const said: string[] = [];
    for (const c of SMALL) {
      // Anything but `cached` would start a build: fail at its first progress line instead.
      await buildComponent(
        c,
        (m) => {
          said.push(m);
          if (!m.includes(': cached (')) throw new Error(`not cached: ${m}`);
        },
        empty,
      );
    }
    expect(said).toEqual(SMALL.map((c) => `${c.name} ${c.version}: cached (${binDir(c, empty)})`));
    expect((await readdir(binDir(component('age'), empty))).sort()).toEqual(['.complete', 'age', 'age-keygen']);
  });

  /**
   * Pushes what `stage` writes as age's image to `<registry>/kapp-lambda/<name>`, pulls it with
   * the first test's lock into an empty cache root and returns the refusal's cause, after checking
   * that the pull left nothing (no `*.pull-*` directory) in the cache.
   */
  async function refusedPull(name: string, stage: (dir: string) => Promise<void>): Promise<string> {
    const age = component('age');
    const repo = `${registry.host}/kapp-lambda/${name}`;
    const dir = path.join(scratch, name);
    await mkdir(dir, { recursive: true });
    await stage(dir);
    const env = toolEnv({ home: scratch });
    await run([toolBin('imgpkg'), 'push', '-i', `${repo}:${toolCacheTag(age)}`, '-f', dir, '--tty=false'], { env });

    const root = path.join(scratch, `empty-cache-${name}`);
    const target = await openToolCache({ repo, imgpkg: toolBin('imgpkg'), env, root, lockFile });
    const err = await target
      .pull(age, () => undefined)
      .then(
        () => undefined,
        (e: Error) => e,
      );
    expect(err?.message).toBe(`pull age from ${repo}:${toolCacheTag(age)}`);
    // Nothing in place and nothing left of the private pull directory.
    expect(existsSync(path.join(root, 'bin')) ? await readdir(path.join(root, 'bin')) : []).toEqual([]);
    expect(await readdir(path.join(root, 'tmp'))).toEqual([]);
    return String((err?.cause as Error | undefined)?.message);
  }

  it('refuses a forged image whose own sums match but the lock does not, running nothing and leaving nothing', async () => {
    const age = component('age');
    const marker = path.join(scratch, 'forged-binary-ran');
    // The lock (the first test's push) records the real binaries for the tag.
    const cause = await refusedPull('forged', async (stage) => {
      for (const bin of ['age', 'age-keygen']) {
        const script = `#!/bin/sh\necho ran >> '${marker}'\necho ${age.version}\n`;
        await writeFile(path.join(stage, bin), script, { mode: 0o755 });
      }
      await writeFile(path.join(stage, SUMS_FILE), await sumsOf(age, stage));
    });
    expect(cause).toMatch(/^age: age has sha256 [0-9a-f]{64}, the tool cache lock records [0-9a-f]{64}$/);
    expect(existsSync(marker)).toBe(false);
  });

  it('refuses an image whose binary does not match its recorded sha256 and leaves nothing behind', async () => {
    const cause = await refusedPull('tampered', async (stage) => {
      await writeFile(path.join(stage, 'age'), '#!/bin/sh\necho v1.2.1\n', { mode: 0o755 });
      await writeFile(path.join(stage, 'age-keygen'), '#!/bin/sh\necho v1.2.1\n', { mode: 0o755 });
      await writeFile(path.join(stage, SUMS_FILE), await sumsOf(component('age'), stage));
      await writeFile(path.join(stage, 'age'), '#!/bin/sh\necho tampered\n', { mode: 0o755 });
    });
    expect(cause).toMatch(/^age: age has sha256 [0-9a-f]{64}, \.kapp-lambda-sha256sums records [0-9a-f]{64}$/);
  });
});
