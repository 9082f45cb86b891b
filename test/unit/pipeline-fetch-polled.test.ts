/**
 * runFetch with sources the fleet's source poll resolves (faked at `deps.resolveSource`, the
 * downloader and vendir): an http source without `sha256` is fetched pinned to the body hash the
 * poll resolved, and one whose body changed since the poll is fetched as written, unshared; a helm chart is fetched at the resolved version, and its
 * fetch is shared by the resolved digest, fetched anew when the chart is republished.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { App } from '../../functions/lib/api/index.js';
import { sha256Hex } from '../../functions/lib/artifact/keys.js';
import type { HttpDownloader } from '../../functions/lib/fetch/http-download.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { rawTgz } from '../harness/fixtures.js';
import { appObject, appWorld, NOW, REF } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-fetch-polled-');
const CTX = { clusterId: 'c1', ref: REF, run: { generation: 1, runId: 'r1', startedAt: NOW } };

/** A world of `fetch` whose poll resolves `resolved()` and whose downloader serves `body()`. */
function world(fetch: unknown[], resolved: () => string, body: () => Buffer = () => Buffer.alloc(0)) {
  const app = appObject({ spec: { fetch } }) as App;
  const downloads: string[] = [];
  const download: HttpDownloader = {
    download: async (req) => {
      downloads.push(req.url);
      const b = body();
      return { body: b, sha256: sha256Hex(b) };
    },
  };
  const w = appWorld({ app, tmpRoot: tempDir(), extra: { download, resolveSource: async () => resolved() } });
  w.runner.on('vendir', async (req) => {
    await writeFile(path.join(req.cwd ?? '', 'config.yml'), 'a: 1\n');
    return { stdout: 'lock: vendir\n' };
  });
  const run = async () =>
    await runFetch(CTX, { raw: structuredClone(app) as never, app: structuredClone(app) }, w.deps);
  const records = async () => (await w.store.list('')).filter((k) => k.startsWith('cache/fetch/'));
  return { ...w, run, downloads, records };
}

describe('an http source without sha256, polled', () => {
  const tgz = rawTgz({ 'a.yml': 'a: 1\n' });

  it('is fetched pinned to the resolved hash: the next fetch of the same hash reuses the artifact', async () => {
    const w = world(
      [{ http: { url: 'http://h/app.tgz' } }],
      () => sha256Hex(tgz),
      () => tgz,
    );
    expect((await w.run()).template).toBeDefined();
    expect(await w.records()).toHaveLength(1);
    expect((await w.run()).template).toBeDefined();
    expect(w.downloads).toEqual(['http://h/app.tgz']);
    expect(w.tools()).toEqual(['vendir']);
  });

  it('a body that changed since the poll (or changes on every request) is fetched as written, unshared', async () => {
    const polled = sha256Hex(Buffer.from('what the poll saw'));
    const w = world(
      [{ http: { url: 'http://h/app.tgz' } }],
      () => polled,
      () => tgz,
    );
    // The pinned try fails the hash check; the entry as written (no sha256) is fetched: the App
    // gets what the URL answers now, as upstream's fetch would.
    expect((await w.run()).template).toBeDefined();
    expect(w.downloads).toEqual(['http://h/app.tgz', 'http://h/app.tgz']);
    expect(w.statuses().some((s) => JSON.stringify(s).includes('Expected digest to match'))).toBe(false);
    // No shared record: its key names the polled hash, not these bytes.
    expect(await w.records()).toEqual([]);
  });
});

describe('a helm chart, polled', () => {
  const chart = { helmChart: { name: 'c', repository: { url: 'https://charts.example' } } };

  it('is fetched at the resolved version, shared by its digest, fetched anew when republished', async () => {
    let resolved = `1.2.3@sha256:${'a'.repeat(64)}`;
    const w = world([chart], () => resolved);
    expect((await w.run()).template).toBeDefined();
    expect(w.runner.calls[0]?.stdin).toContain('version: 1.2.3');
    expect(await w.records()).toHaveLength(1);
    expect((await w.run()).template).toBeDefined();
    expect(w.tools()).toEqual(['vendir']);
    resolved = `1.2.3@sha256:${'b'.repeat(64)}`;
    expect((await w.run()).template).toBeDefined();
    expect(w.tools()).toEqual(['vendir', 'vendir']);
    expect(await w.records()).toHaveLength(2);
  });
});
