/**
 * The shared tool cache (`layers/toolcache.ts`) against the local docker-registry: two small
 * components of the real cache pushed, then pulled into an empty cache root, where setup's
 * `buildComponent` finds them `cached` and builds nothing; an image whose binary does not match
 * its recorded sha256 is refused before anything in it runs, and leaves nothing in the cache.
 */
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { binDir, buildComponent, run } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { openToolCache, SUMS_FILE, sumsOf, toolCacheTag } from '../../layers/toolcache.js';
import { toolBin, toolEnv } from '../harness/fixtures.js';
import { type RegistryServer, startRegistry } from '../harness/servers.js';

const SMALL = [component('age'), component('ytt')];

let registry: RegistryServer;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'tool-cache-oci-'));
  registry = await startRegistry();
});

afterAll(async () => {
  await registry?.stop();
  await rm(scratch, { recursive: true, force: true });
});

describe('tool cache through an OCI registry', () => {
  it('pushes two built components and pulls them into an empty cache, which then reports them cached', async () => {
    const repo = `${registry.host}/kapp-lambda/tools`;
    const opts = { repo, imgpkg: toolBin('imgpkg'), env: toolEnv({ home: scratch }) };
    const source = await openToolCache(opts);
    expect(source.tags.size).toBe(0);
    const log: string[] = [];
    for (const c of SMALL) expect(await source.push(c, (m) => log.push(m))).toBe('pushed');
    expect(await source.push(SMALL[0] ?? component('age'), (m) => log.push(m))).toBe('present');

    const empty = path.join(scratch, 'empty-cache');
    const target = await openToolCache({ ...opts, root: empty });
    expect([...target.tags].sort()).toEqual(SMALL.map((c) => toolCacheTag(c)).sort());
    for (const c of SMALL) expect(await target.pull(c, (m) => log.push(m))).toBe('pulled');
    expect(await target.pull(component('kbld'), (m) => log.push(m))).toBe('absent');

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

  it('refuses an image whose binary does not match its recorded sha256 and leaves nothing behind', async () => {
    const age = component('age');
    const repo = `${registry.host}/kapp-lambda/tampered`;
    const stage = path.join(scratch, 'tampered');
    await mkdir(stage, { recursive: true });
    await writeFile(path.join(stage, 'age'), '#!/bin/sh\necho v1.2.1\n', { mode: 0o755 });
    await writeFile(path.join(stage, 'age-keygen'), '#!/bin/sh\necho v1.2.1\n', { mode: 0o755 });
    const sums = await sumsOf(age, stage);
    await writeFile(path.join(stage, SUMS_FILE), sums);
    await writeFile(path.join(stage, 'age'), '#!/bin/sh\necho tampered\n', { mode: 0o755 });
    const env = toolEnv({ home: scratch });
    await run([toolBin('imgpkg'), 'push', '-i', `${repo}:${toolCacheTag(age)}`, '-f', stage, '--tty=false'], { env });

    const root = path.join(scratch, 'empty-cache-2');
    const target = await openToolCache({ repo, imgpkg: toolBin('imgpkg'), env, root });
    const err = await target
      .pull(age, () => undefined)
      .then(
        () => undefined,
        (e: Error) => e,
      );
    expect(err?.message).toBe(`pull age from ${repo}:${toolCacheTag(age)}`);
    expect(String((err?.cause as Error | undefined)?.message)).toMatch(
      /^age: age has sha256 [0-9a-f]{64}, \.kapp-lambda-sha256sums records [0-9a-f]{64}$/,
    );
    expect(existsSync(path.join(root, 'bin'))).toBe(true);
    expect(await readdir(path.join(root, 'bin'))).toEqual([]);
  });
});
