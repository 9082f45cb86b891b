/**
 * The http-source download (functions/lib/fetch/http-download.ts) against a loopback server,
 * and prepareHttpSources / restoreHttpLock (functions/lib/fetch/http-source.ts) with a fake
 * downloader: vendir's error texts, the refused-archive status, the lock rewrite.
 */

import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { refObjectsFrom } from '../../functions/lib/api/index.js';
import { sha256Hex } from '../../functions/lib/artifact/keys.js';
import {
  createHttpDownloader,
  HttpDownloadError,
  type HttpDownloader,
  redactUrl,
} from '../../functions/lib/fetch/http-download.js';
import { prepareHttpSources, restoreHttpLock } from '../../functions/lib/fetch/http-source.js';
import { rawTgz } from '../harness/fixtures.js';

type Handler = (req: IncomingMessage, res: ServerResponse) => void;
let server: Server;
let base: string;
let handler: Handler;
const seen: { url: string; auth?: string }[] = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    seen.push({ url: req.url ?? '', auth: req.headers.authorization });
    handler(req, res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server.close(r));
});
beforeEach(() => {
  seen.length = 0;
});

describe('createHttpDownloader', () => {
  const dl = createHttpDownloader();

  it('returns the body and its sha256, with basic auth', async () => {
    handler = (_req, res) => res.end('hello');
    const got = await dl.download({ url: `${base}/f.txt`, basicAuth: { username: 'u', password: 'p:w' } });
    expect(got.body.toString()).toBe('hello');
    expect(got.sha256).toBe(sha256Hex(Buffer.from('hello')));
    expect(seen).toEqual([{ url: '/f.txt', auth: `Basic ${Buffer.from('u:p:w').toString('base64')}` }]);
  });

  it("fails on a non-200 status with vendir's text", async () => {
    handler = (_req, res) => {
      res.statusCode = 404;
      res.end('nope');
    };
    await expect(dl.download({ url: `${base}/missing` })).rejects.toThrow(
      new HttpDownloadError("Expected 200 OK, but was '404 Not Found'"),
    );
  });

  it('follows redirects, keeps Authorization on the same host, stops after 10', async () => {
    handler = (req, res) => {
      const n = Number((req.url ?? '/0').slice(1));
      if (n < 3) {
        res.writeHead(302, { location: `/${n + 1}` });
        res.end();
      } else res.end(`at ${n}`);
    };
    const got = await dl.download({ url: `${base}/0`, basicAuth: { username: 'u', password: 'p' } });
    expect(got.body.toString()).toBe('at 3');
    expect(seen.map((s) => [s.url, Boolean(s.auth)])).toEqual([
      ['/0', true],
      ['/1', true],
      ['/2', true],
      ['/3', true],
    ]);
    handler = (_req, res) => {
      res.writeHead(302, { location: '/loop' });
      res.end();
    };
    await expect(dl.download({ url: `${base}/loop` })).rejects.toThrow(
      `Initiating URL download: Get "${base}/loop": stopped after 10 redirects`,
    );
  });

  it('drops the secret basic auth on a redirect to another host (as Go does)', async () => {
    const other = base.replace('127.0.0.1', 'localhost');
    handler = (req, res) => {
      if (req.url === '/start') {
        res.writeHead(302, { location: `${other}/there` });
        res.end();
      } else res.end('ok');
    };
    await dl.download({ url: `${base}/start`, basicAuth: { username: 'u', password: 'p' } });
    expect(seen.map((s) => [s.url, s.auth])).toEqual([
      ['/start', `Basic ${Buffer.from('u:p').toString('base64')}`],
      ['/there', undefined],
    ]);
  });

  it('bounds the body, declared or streamed', async () => {
    handler = (_req, res) => res.end('x'.repeat(100));
    await expect(dl.download({ url: `${base}/big`, maxBytes: 10 })).rejects.toThrow(
      'Writing downloaded content: body exceeds 10 bytes',
    );
    handler = (_req, res) => {
      res.write('x'.repeat(50));
      res.end('x'.repeat(50));
    };
    await expect(dl.download({ url: `${base}/chunked`, maxBytes: 10 })).rejects.toThrow(
      'Writing downloaded content: body exceeds 10 bytes',
    );
  });

  it('refuses other schemes without a request', async () => {
    await expect(dl.download({ url: 'file:///etc/passwd' })).rejects.toThrow(
      'Initiating URL download: Get "file:///etc/passwd": unsupported protocol scheme "file"',
    );
    expect(seen).toEqual([]);
  });

  it('redacts a URL password in messages', () => {
    expect(redactUrl('https://user:secret@h/x')).toBe('https://user:***@h/x');
    expect(redactUrl('https://h/x')).toBe('https://h/x');
  });
});

describe('prepareHttpSources', () => {
  let root: string;
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'http-source-'));
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const fake = (body: Buffer, calls: unknown[] = []): HttpDownloader => ({
    async download(req) {
      calls.push(req);
      return { body, sha256: sha256Hex(body) };
    },
  });
  const noRefs = refObjectsFrom({});

  it('unpacks each http entry into <root>/<i> and records its URL by vendir directory', async () => {
    const good = rawTgz({ 'cfg/a.yml': 'a: 1\n' });
    const out = await prepareHttpSources({
      fetch: [{ inline: { paths: { 'x.yml': 'x' } } }, { http: { url: 'http://h/a.tgz', sha256: sha256Hex(good) } }],
      refs: noRefs,
      root,
      downloader: fake(good),
    });
    expect('dirs' in out && [...out.dirs]).toEqual([[1, join(root, '1')]]);
    expect('urls' in out && [...out.urls]).toEqual([['1', 'http://h/a.tgz']]);
    expect(await readFile(join(root, '1', 'cfg', 'a.yml'), 'utf8')).toBe('a: 1\n');
  });

  it('a hostile archive fails with the entry named in the status error', async () => {
    const out = await prepareHttpSources({
      fetch: [{ http: { url: 'http://h/evil.tgz' } }],
      refs: noRefs,
      root,
      downloader: fake(rawTgz({ '../../x': 'pwned' })),
    });
    const msg =
      "Syncing directory '0': Syncing directory '.' with HTTP contents: Unpacking archive: archive entry \"../../x\" escapes the fetch directory";
    expect(out).toEqual({
      result: { stdout: '', stderr: msg, exitCode: -1, error: `Fetching resources: ${msg}`, finished: true },
    });
    expect(await readdir(root)).toEqual(['0']);
    expect(await readdir(join(root, '0'))).toEqual([]);
  });

  it("a sha256 mismatch keeps vendir's error shape", async () => {
    const body = Buffer.from('x');
    const out = await prepareHttpSources({
      fetch: [{ path: 'p', http: { url: 'http://h/a.tgz', sha256: '0'.repeat(64) } }],
      refs: noRefs,
      root,
      downloader: fake(body),
    });
    expect(out).toEqual({
      result: {
        stdout: '',
        stderr: `vendir: Error: Syncing directory 'p':\n  Syncing directory '.' with HTTP contents:\n    Downloading URL:\n      Expected digest to match 'sha256:${'0'.repeat(64)}', but was 'sha256:${sha256Hex(body)}'\n`,
        exitCode: 1,
        error: 'Fetching resources: Error (see .status.usefulErrorMessage for details)',
        finished: true,
      },
    });
  });

  it('sends the secret as basic auth and refuses unknown secret keys as vendir does', async () => {
    const bytes = (s: string) => Buffer.from(s);
    const secret = (data: Record<string, Buffer>) => ({
      apiVersion: 'v1' as const,
      kind: 'Secret' as const,
      metadata: { name: 's', namespace: 'ns' },
      data,
    });
    const calls: { basicAuth?: unknown }[] = [];
    await prepareHttpSources({
      fetch: [{ http: { url: 'http://h/a.txt', secretRef: { name: 's' } } }],
      refs: refObjectsFrom({ secrets: [secret({ username: bytes('u'), password: bytes('p') })] }),
      root,
      downloader: fake(Buffer.from('x'), calls),
    });
    expect(calls[0]?.basicAuth).toEqual({ username: 'u', password: 'p' });
    const out = await prepareHttpSources({
      fetch: [{ http: { url: 'http://h/b.txt', secretRef: { name: 's' } } }],
      refs: refObjectsFrom({ secrets: [secret({ token: bytes('t') })] }),
      root,
      downloader: fake(Buffer.from('x')),
    });
    expect('result' in out && out.result.stderr).toBe(
      "vendir: Error: Syncing directory '0':\n  Syncing directory '.' with HTTP contents:\n    Downloading URL:\n      Adding auth to request:\n        Unknown secret field 'token' in secret 's'\n",
    );
  });
});

describe('restoreHttpLock', () => {
  it("turns vendir's directory lock entries and Fetching lines back into http", () => {
    const stdout =
      'Fetching: 0 + . (directory)\n\nLock config\n\napiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n- contents:\n  - directory: {}\n    path: .\n  path: "0"\n- contents:\n  - inline: {}\n    path: .\n  path: "1"\nkind: LockConfig\n';
    expect(restoreHttpLock(stdout, new Map([['0', 'http://h/a.tgz']]))).toBe(
      'Fetching: 0 + . (http from http://h/a.tgz)\n\nLock config\n\napiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n- contents:\n  - http: {}\n    path: .\n  path: "0"\n- contents:\n  - inline: {}\n    path: .\n  path: "1"\nkind: LockConfig\n',
    );
  });
});
