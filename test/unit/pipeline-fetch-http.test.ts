/**
 * runFetch with an http source, faked at the ports (kube, runner, store, downloader): vendir
 * is never handed an http source (it gets the safely unpacked directory), a hostile archive
 * fails the fetch with the entry named without starting vendir, and a symlink vendir leaves
 * pointing out of the directory fails the fetch in status instead of throwing.
 */

import { mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { Header } from 'tar';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ObjectRef as EventObjectRef } from '../../events/schema.js';
import type { App } from '../../functions/lib/api/index.js';
import { sha256Hex } from '../../functions/lib/artifact/keys.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import type { HttpDownloader } from '../../functions/lib/fetch/http-download.js';
import type { FetchView, KubeObject } from '../../functions/lib/kube/port.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { runFetch } from '../../functions/lib/pipeline/fetch.js';
import { stageDeps } from './support/stage-deps.js';

let tmp: string;
beforeEach(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'pipeline-fetch-http-'));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

const REF: EventObjectRef = {
  clusterId: 'c1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'ns',
  name: 'app',
  uid: 'uid-1',
  generation: 1,
  resourceVersion: '1',
};

function appWith(fetch: unknown[]): App {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name: 'app', namespace: 'ns', uid: 'uid-1', generation: 1, resourceVersion: '1' },
    spec: { fetch, template: [{ ytt: {} }], deploy: [{ kapp: {} }] },
  } as unknown as App;
}

/** The App as stored, and every status written. */
function fakeKube(app: App): FetchView & { statuses: Record<string, unknown>[] } {
  const statuses: Record<string, unknown>[] = [];
  let current: KubeObject = structuredClone(app) as unknown as KubeObject;
  let rv = 1;
  return {
    statuses,
    async getObject() {
      return structuredClone(current) as never;
    },
    async updateStatus(_ref, _pre, status) {
      statuses.push(status as Record<string, unknown>);
      rv += 1;
      current = { ...current, status, metadata: { ...current.metadata, resourceVersion: String(rv) } } as KubeObject;
      return { resourceVersion: String(rv) };
    },
    async getSecret() {
      return undefined;
    },
    async getConfigMap() {
      return undefined;
    },
    async getNamespace() {
      return undefined;
    },
  } as FetchView & { statuses: Record<string, unknown>[] };
}

function tgzOf(entries: Record<string, string>): Buffer {
  const blocks: Buffer[] = [];
  for (const [name, text] of Object.entries(entries)) {
    const body = Buffer.from(text);
    const block = Buffer.alloc(512);
    new Header({ path: name, type: 'File', size: body.length, mode: 0o644, mtime: new Date(0) }).encode(block, 0);
    blocks.push(block, body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return gzipSync(Buffer.concat(blocks));
}

function depsWith(kube: FetchView, runner: FakeCommandRunner, body: Buffer): PipelineDeps {
  const download: HttpDownloader = { download: async () => ({ body, sha256: sha256Hex(body) }) };
  return stageDeps(kube, { runner, tmpRoot: tmp, extra: { download } }).deps;
}

const CTX = { clusterId: 'c1', ref: REF, run: { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' } };
const LOCK = (kind: string) =>
  `apiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n- contents:\n  - ${kind}: {}\n    path: .\n  path: "0"\nkind: LockConfig\n`;

describe('runFetch with an http source', () => {
  it('hands vendir the unpacked directory, never the URL, and reports the upstream lock', async () => {
    const app = appWith([{ http: { url: 'http://h/app.tgz' } }]);
    const kube = fakeKube(app);
    const runner = new FakeCommandRunner().on('vendir', async (req) => {
      await writeFile(join(req.cwd ?? '', 'marker'), 'x');
      return { stdout: LOCK('directory') };
    });
    const out = await runFetch(CTX, { raw: app as never, app }, depsWith(kube, runner, tgzOf({ 'a.yml': 'a: 1\n' })));
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
    const kube = fakeKube(app);
    const runner = new FakeCommandRunner();
    const out = await runFetch(
      CTX,
      { raw: app as never, app },
      depsWith(kube, runner, tgzOf({ 'ok.yml': 'a', '../../x': 'pwned' })),
    );
    expect(out).toEqual({});
    expect(runner.calls).toEqual([]);
    const last = kube.statuses.at(-1) as { fetch?: { error?: string }; usefulErrorMessage?: string };
    expect(last.fetch?.error).toBe(
      "Fetching resources: Syncing directory '0': Syncing directory '.' with HTTP contents: Unpacking archive: archive entry \"../../x\" escapes the fetch directory",
    );
  });

  it('a symlink left pointing out of the directory fails the fetch in status (packDir refuses it)', async () => {
    const app = appWith([{ inline: { paths: { 'a.yml': 'a' } } }]);
    const kube = fakeKube(app);
    const runner = new FakeCommandRunner().on('vendir', async (req) => {
      await symlink('/etc/passwd', join(req.cwd ?? '', 'passwd'));
      return { stdout: LOCK('inline') };
    });
    const out = await runFetch(CTX, { raw: app as never, app }, depsWith(kube, runner, Buffer.alloc(0)));
    expect(out).toEqual({});
    const last = kube.statuses.at(-1) as { fetch?: { error?: string; stdout?: string } };
    expect(last.fetch?.error).toBe('Fetching resources: symlink absolute target: "passwd"');
  });
});
