/**
 * runFetch with an http source, faked at the ports (kube, runner, store, downloader): vendir
 * is never handed an http source (it gets the safely unpacked directory), a hostile archive
 * fails the fetch with the entry named without starting vendir, and a symlink vendir leaves
 * pointing out of the directory fails the fetch in status instead of throwing.
 */

import { symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { App } from '../../functions/lib/api/index.js';
import { sha256Hex } from '../../functions/lib/artifact/keys.js';
import type { HttpDownloader } from '../../functions/lib/fetch/http-download.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { rawTgz } from '../harness/fixtures.js';
import { appObject, appWorld, NOW, REF } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-fetch-http-');

/** The table App fetching from `fetch`. */
const appWith = (fetch: unknown[]): App => appObject({ spec: { fetch } });

/** `app` in the table world, whose downloader serves `body`. */
function worldWith(app: App, body: Buffer) {
  const download: HttpDownloader = { download: async () => ({ body, sha256: sha256Hex(body) }) };
  return appWorld({ app, tmpRoot: tempDir(), extra: { download } });
}

const CTX = { clusterId: 'c1', ref: REF, run: { generation: 1, runId: 'r1', startedAt: NOW } };
const LOCK = (kind: string) =>
  `apiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n- contents:\n  - ${kind}: {}\n    path: .\n  path: "0"\nkind: LockConfig\n`;

describe('runFetch with an http source', () => {
  it('hands vendir the unpacked directory, never the URL, and reports the upstream lock', async () => {
    const app = appWith([{ http: { url: 'http://h/app.tgz' } }]);
    const { deps, runner } = worldWith(app, rawTgz({ 'a.yml': 'a: 1\n' }));
    runner.on('vendir', async (req) => {
      await writeFile(join(req.cwd ?? '', 'marker'), 'x');
      return { stdout: LOCK('directory') };
    });
    const out = await runFetch(CTX, { raw: app as never, app }, deps);
    expect(runner.calls).toHaveLength(1);
    const stdin = runner.calls[0]?.stdin ?? '';
    expect(stdin).not.toContain('http:');
    expect(stdin).not.toContain('http://h/app.tgz');
    expect(stdin).toMatch(
      /^apiVersion: vendir\.k14s\.io\/v1alpha1\ndirectories:\n {2}- contents:\n {6}- directory:\n {10}path: \/\S+\/fetch-http-\w+\/0\n {8}path: \.\n {4}path: "0"\nkind: Config\n$/,
    );
    expect(out.template?.fetchStatus?.stdout).toBe(LOCK('http'));
  });

  it('a hostile archive fails the fetch with the entry named; vendir never runs', async () => {
    const app = appWith([{ http: { url: 'http://h/evil.tgz' } }]);
    const { deps, runner, statuses } = worldWith(app, rawTgz({ 'ok.yml': 'a', '../../x': 'pwned' }));
    const out = await runFetch(CTX, { raw: app as never, app }, deps);
    expect(out).toEqual({});
    expect(runner.calls).toEqual([]);
    const last = statuses().at(-1) as { fetch?: { error?: string }; usefulErrorMessage?: string };
    expect(last.fetch?.error).toBe(
      "Fetching resources: Syncing directory '0': Syncing directory '.' with HTTP contents: Unpacking archive: archive entry \"../../x\" escapes the fetch directory",
    );
  });

  it('a symlink left pointing out of the directory fails the fetch in status (packDir refuses it)', async () => {
    const app = appWith([{ inline: { paths: { 'a.yml': 'a' } } }]);
    const { deps, runner, statuses } = worldWith(app, Buffer.alloc(0));
    runner.on('vendir', async (req) => {
      await symlink('/etc/passwd', join(req.cwd ?? '', 'passwd'));
      return { stdout: LOCK('inline') };
    });
    const out = await runFetch(CTX, { raw: app as never, app }, deps);
    expect(out).toEqual({});
    const last = statuses().at(-1) as { fetch?: { error?: string; stdout?: string } };
    expect(last.fetch?.error).toBe('Fetching resources: symlink absolute target: "passwd"');
  });
});
