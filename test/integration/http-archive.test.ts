/**
 * http fetch sources with the real vendir (pinned), served by the harness's static server on
 * loopback. The fetch stage's path (download + safe unpack + vendir `directory` source, see
 * functions/lib/fetch/http-source.ts) against vendir's own http source:
 * - a hostile .tgz and .zip (an entry `../../../../../pwned-*`, which from vendir's
 *   `<work>/.vendir-tmp-*\/incoming/http` lands in this test's temp root) escape with vendir
 *   alone, and fail with the entry named, nothing written outside, through the stage's path;
 * - good .tgz and .zip archives give the same files and the same vendir stdout (LockConfig)
 *   both ways.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { zipSync } from 'fflate';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AppFetch, refObjectsFrom } from '../../functions/lib/api/index.js';
import { prepareHttpSources, restoreHttpLock } from '../../functions/lib/fetch/http-source.js';
import { planVendirSync } from '../../functions/lib/fetch/vendir.js';
import type { StageResult } from '../../functions/lib/reconcile/result.js';
import { run } from '../../layers/gobuild.js';
import { publishFile, rawTgz, readTree, toolBin, toolEnv } from '../harness/fixtures.js';
import { type HttpServer, startHttpServer } from '../harness/servers.js';

let http: HttpServer;
let scratch: string;

const ESCAPE = '../../../../../';

const zipOf = (entries: Record<string, string>) =>
  Buffer.from(zipSync(Object.fromEntries(Object.entries(entries).map(([k, v]) => [k, Buffer.from(v)]))));

const GOOD = { 'app/config/a.yml': 'a: 1\n', 'app/config/sub/b.yml': 'b: 2\n', 'app/README.md': '# app\n' };

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'http-archive-'));
  http = await startHttpServer();
  await publishFile(http, 'evil.tgz', rawTgz({ 'ok.yml': 'a: 1\n', [`${ESCAPE}pwned-tgz`]: 'pwned' }));
  await publishFile(http, 'evil.zip', zipOf({ 'ok.yml': 'a: 1\n', [`${ESCAPE}pwned-zip`]: 'pwned' }));
  await publishFile(http, 'good.tgz', rawTgz(GOOD));
  await publishFile(http, 'good.zip', zipOf(GOOD));
  await publishFile(http, 'plain.yml', 'kind: ConfigMap\n');
});

afterAll(async () => {
  await http?.stop();
  await rm(scratch, { recursive: true, force: true });
});

/** A fresh root with the vendir working directory two levels down: `<root>/w/work`. */
async function freshRoot(name: string): Promise<{ root: string; work: string }> {
  const root = path.join(scratch, name);
  const work = path.join(root, 'w', 'work');
  await mkdir(work, { recursive: true });
  return { root, work };
}

async function vendirSync(work: string, stdin: string): Promise<{ stdout: string; stderr: string; code: number }> {
  const cfg = path.join(path.dirname(work), 'vendir-config.yml');
  await writeFile(cfg, stdin);
  const home = path.join(path.dirname(work), 'home');
  await mkdir(home, { recursive: true });
  return await run([toolBin('vendir'), 'sync', '-f', cfg, '--lock-file', '/dev/null'], {
    cwd: work,
    env: toolEnv({ home }),
  }).catch((e: Error & { stdout?: string; stderr?: string; code?: number }) => ({
    stdout: e.stdout ?? '',
    stderr: e.stderr ?? e.message,
    code: e.code ?? 1,
  }));
}

const planFor = (fetch: AppFetch[], preparedHttp?: Map<number, string>) =>
  planVendirSync({
    fetch,
    namespace: 'ns',
    refs: refObjectsFrom({}),
    preparedHttp,
  });

/** vendir with its own http source (upstream's path). */
async function upstream(name: string, fetch: AppFetch[]) {
  const { root, work } = await freshRoot(name);
  const res = await vendirSync(work, planFor(fetch).stdin);
  return { root, work, ...res };
}

/** The fetch stage's path: prepare, then vendir with `directory` sources. */
async function ours(
  name: string,
  fetch: AppFetch[],
): Promise<{ root: string; work: string; result?: StageResult; stdout?: string }> {
  const { root, work } = await freshRoot(name);
  const prep = path.join(root, 'prep');
  await mkdir(prep);
  const prepared = await prepareHttpSources({ fetch, refs: refObjectsFrom({}), root: prep });
  if ('result' in prepared) return { root, work, result: prepared.result };
  const res = await vendirSync(work, planFor(fetch, prepared.dirs).stdin);
  expect(res.code).toBe(0);
  await rm(prep, { recursive: true });
  return { root, work, stdout: restoreHttpLock(res.stdout, prepared.urls) };
}

/** Every file under `root` that is not under `root/w/work` or `root/w/<config, home>`. */
async function filesOutside(root: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (dir: string) => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      const rel = path.relative(root, p);
      if (
        rel === path.join('w', 'work') ||
        rel === path.join('w', 'home') ||
        rel === path.join('w', 'vendir-config.yml')
      ) {
        continue;
      }
      if (e.isDirectory()) await walk(p);
      else out.push(rel);
    }
  };
  await walk(root);
  return out.sort();
}

describe('http archives: hostile entries', () => {
  it.each([
    ['tgz', 'evil.tgz', 'pwned-tgz'],
    ['zip', 'evil.zip', 'pwned-zip'],
  ])('%s: vendir alone writes outside; the fetch stage refuses it, naming the entry', async (kind, file, pwned) => {
    const fetch: AppFetch[] = [{ http: { url: `${http.baseUrl}/${file}` } }];

    // Witness: the archive really escapes when vendir unpacks it (vendir v0.44 reports success).
    const up = await upstream(`up-evil-${kind}`, fetch);
    expect(up.code).toBe(0);
    expect(await filesOutside(up.root)).toEqual([pwned]);
    expect(await readFile(path.join(up.root, pwned), 'utf8')).toBe('pwned');

    const got = await ours(`ours-evil-${kind}`, fetch);
    const msg = `Syncing directory '0': Syncing directory '.' with HTTP contents: Unpacking archive: archive entry "${ESCAPE}${pwned}" escapes the fetch directory`;
    expect(got.result).toEqual({
      stdout: '',
      stderr: msg,
      exitCode: -1,
      error: `Fetching resources: ${msg}`,
      finished: true,
    });
    expect(await filesOutside(got.root)).toEqual([]);
    expect(await readdir(got.work)).toEqual([]);
  });
});

describe('http archives: good content keeps the upstream layout and lock', () => {
  it.each([
    ['tgz', [{ http: { url: 'good.tgz' } }]],
    ['zip with subPath', [{ http: { url: 'good.zip', subPath: 'app/config' } }]],
    ['plain file', [{ http: { url: 'plain.yml' } }]],
    [
      'two entries with paths',
      [
        { path: 'x', http: { url: 'good.zip' } },
        { path: 'y', http: { url: 'good.tgz', subPath: 'app' } },
      ],
    ],
  ] as [string, AppFetch[]][])('%s', async (name, spec) => {
    const fetch = spec.map((f) => ({ ...f, http: { ...f.http, url: `${http.baseUrl}/${f.http?.url}` } }));
    const key = name.replace(/\W+/g, '-');
    const up = await upstream(`up-${key}`, fetch);
    expect(up.code).toBe(0);
    const got = await ours(`ours-${key}`, fetch);
    expect(got.result).toBeUndefined();
    expect(await readTree(got.work)).toEqual(await readTree(up.work));
    expect(Object.keys(await readTree(got.work)).length).toBeGreaterThan(0);
    expect(got.stdout).toBe(up.stdout);
    expect(got.stdout).toContain('http: {}');
  });
});
