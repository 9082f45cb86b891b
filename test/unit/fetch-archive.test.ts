/**
 * The http-source extractor (functions/lib/fetch/archive.ts) with hostile archives built
 * here: each refusal has its exact message and leaves nothing outside the destination (the
 * destination sits two levels below a fresh temp root, so `../../x` would land in the root).
 * Good archives keep vendir v0.44's layout.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { gzipSync } from 'node:zlib';
import { zipSync } from 'fflate';
import { Header } from 'tar';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  entryNameProblem,
  isVendirArchiveError,
  plainFileName,
  UnsafeArchiveError,
  unpackHttpContent,
} from '../../functions/lib/fetch/archive.js';

let root: string;
let dest: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), 'fetch-archive-'));
  dest = join(root, 'a', 'b', 'dest');
  await mkdir(join(root, 'a', 'b'), { recursive: true });
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

/** Every path under `root`, relative, files and directories. */
async function tree(dir = root): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    out.push(relative(root, p) + (e.isDirectory() ? '/' : ''));
    if (e.isDirectory()) out.push(...(await tree(p)));
  }
  return out.sort();
}

/** Nothing exists outside `dest` but its parents. */
async function expectNothingOutside(): Promise<void> {
  for (const p of await tree()) {
    expect(p === 'a/' || p === 'a/b/' || p.startsWith('a/b/dest')).toBe(true);
  }
}

interface TarSpec {
  path: string;
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'CharacterDevice' | 'BlockDevice' | 'FIFO';
  linkpath?: string;
  body?: string;
}

/** A tar stream, headers encoded as written (no sanitising). */
function tarOf(entries: TarSpec[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? '');
    const h = new Header({
      path: e.path,
      type: e.type ?? 'File',
      size: e.type && e.type !== 'File' ? 0 : body.length,
      mode: 0o644,
      uid: 0,
      gid: 0,
      mtime: new Date(0),
      linkpath: e.linkpath ?? '',
    });
    const block = Buffer.alloc(512);
    h.encode(block, 0);
    blocks.push(block);
    if (!e.type || e.type === 'File') {
      blocks.push(body, Buffer.alloc((512 - (body.length % 512)) % 512));
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

const URL_TGZ = 'http://127.0.0.1:1/dl/app.tgz';

async function expectRefused(content: Uint8Array, message: string, entry?: string): Promise<void> {
  const err = await unpackHttpContent(content, dest, URL_TGZ).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(UnsafeArchiveError);
  expect((err as UnsafeArchiveError).message).toBe(message);
  expect((err as UnsafeArchiveError).entry).toBe(entry);
  await expectNothingOutside();
}

describe('unpackHttpContent refuses hostile archives', () => {
  const cases: [string, TarSpec[], string, string][] = [
    ['../x', [{ path: '../x', body: 'pwned' }], 'archive entry "../x" escapes the fetch directory', '../x'],
    [
      '../../x after a good file',
      [
        { path: 'ok.yml', body: 'a: 1' },
        { path: '../../x', body: 'pwned' },
      ],
      'archive entry "../../x" escapes the fetch directory',
      '../../x',
    ],
    ['/abs', [{ path: '/tmp/abs-x', body: 'pwned' }], 'archive entry "/tmp/abs-x" is an absolute path', '/tmp/abs-x'],
    [
      'a/../../x',
      [{ path: 'a/../../x', body: 'pwned' }],
      'archive entry "a/../../x" escapes the fetch directory',
      'a/../../x',
    ],
    [
      'symlink to outside, then a file through it',
      [
        { path: 'l', type: 'SymbolicLink', linkpath: '../../..' },
        { path: 'l/x', body: 'pwned' },
      ],
      'archive entry "l" is a symlink to "../../..", outside the fetch directory',
      'l',
    ],
    [
      'symlink to an absolute path',
      [{ path: 'kubeconfig', type: 'SymbolicLink', linkpath: '/root/.kube/config' }],
      'archive entry "kubeconfig" is a symlink to an absolute path "/root/.kube/config"',
      'kubeconfig',
    ],
    [
      'hard link to outside',
      [{ path: 'h', type: 'Link', linkpath: '../../etc/passwd' }],
      'archive entry "h" is a hard link to "../../etc/passwd", outside the fetch directory',
      'h',
    ],
    [
      'hard link to an absolute path',
      [{ path: 'h', type: 'Link', linkpath: '/etc/passwd' }],
      'archive entry "h" is a hard link to an absolute path "/etc/passwd"',
      'h',
    ],
    [
      'character device',
      [{ path: 'null', type: 'CharacterDevice' }],
      'archive entry "null" is a character device',
      'null',
    ],
    ['block device', [{ path: 'sda', type: 'BlockDevice' }], 'archive entry "sda" is a block device', 'sda'],
    ['FIFO', [{ path: 'p', type: 'FIFO' }], 'archive entry "p" is a FIFO', 'p'],
  ];

  it.each(cases)('tgz: %s', async (_name, entries, message, entry) => {
    await expectRefused(gzipSync(tarOf(entries)), message, entry);
  });

  it.each(cases)('tar: %s', async (_name, entries, message, entry) => {
    await expectRefused(tarOf(entries), message, entry);
  });

  it('tgz: a name that climbs out only after going down (a/b/../../../x)', async () => {
    await expectRefused(
      gzipSync(tarOf([{ path: 'a/b/../../../x', body: 'pwned' }])),
      'archive entry "a/b/../../../x" escapes the fetch directory',
      'a/b/../../../x',
    );
  });

  it('zip: ../x', async () => {
    await expectRefused(
      zipSync({ 'ok.yml': Buffer.from('a: 1'), '../x': Buffer.from('pwned') }),
      'archive entry "../x" escapes the fetch directory',
      '../x',
    );
  });

  it('zip: ../../x, stored (not deflated)', async () => {
    await expectRefused(
      zipSync({ '../../x': [Buffer.from('pwned'), { level: 0 }] }),
      'archive entry "../../x" escapes the fetch directory',
      '../../x',
    );
  });

  it('zip: absolute name', async () => {
    await expectRefused(
      zipSync({ '/tmp/zip-abs': Buffer.from('pwned') }),
      'archive entry "/tmp/zip-abs" is an absolute path',
      '/tmp/zip-abs',
    );
  });

  it('zip: a Unix symlink entry pointing outside', async () => {
    const attrs = (0o120777 << 16) >>> 0;
    await expectRefused(
      zipSync({ link: [Buffer.from('../../../etc'), { os: 3, attrs }] }),
      'archive entry "link" is a symlink to "../../../etc", outside the fetch directory',
      'link',
    );
  });

  it('too many entries', async () => {
    const entries = Array.from({ length: 11 }, (_, i) => ({ path: `f${i}`, body: 'x' }));
    const err = await unpackHttpContent(gzipSync(tarOf(entries)), dest, URL_TGZ, { maxEntries: 10 }).catch((e) => e);
    expect(err).toBeInstanceOf(UnsafeArchiveError);
    expect(err.message).toBe('archive has more than 10 entries (at "f10")');
    await expectNothingOutside();
  });

  it('content over the byte bound (a gzip bomb is cut while decompressing)', async () => {
    const big = tarOf([{ path: 'big', body: 'x'.repeat(4 * 1024 * 1024) }]);
    const err = await unpackHttpContent(gzipSync(big), dest, URL_TGZ, { maxBytes: 1024 }).catch((e) => e);
    expect(err).toBeInstanceOf(UnsafeArchiveError);
    expect(err.message).toBe('archive content exceeds 1024 bytes');
    const err2 = await unpackHttpContent(big, dest, URL_TGZ, { maxBytes: 1024 }).catch((e) => e);
    expect(err2.message).toBe('archive content exceeds 1024 bytes (at "big")');
    const err3 = await unpackHttpContent(zipSync({ big: Buffer.alloc(1 << 20) }), dest, URL_TGZ, {
      maxBytes: 1024,
    }).catch((e) => e);
    expect(err3.message).toBe('archive content exceeds 1024 bytes (at "big")');
    await expectNothingOutside();
  });

  it('a plain file whose URL ends in ..', async () => {
    const err = await unpackHttpContent(Buffer.from('not an archive'), dest, 'http://h/x/%2e%2e').catch((e) => e);
    expect(err.message).toBe('archive entry ".." escapes the fetch directory');
    await expectNothingOutside();
  });
});

describe('unpackHttpContent keeps vendir layout for good content', () => {
  it('tgz: regular files at their paths, no directory entries, no exec bits', async () => {
    const content = gzipSync(
      tarOf([
        { path: 'top/', type: 'Directory' },
        { path: 'top/empty/', type: 'Directory' },
        { path: 'top/config.yml', body: 'a: 1\n' },
        { path: 'top/sub/values.yml', body: 'b: 2\n' },
        { path: 'top/./same.yml', body: 'c' },
      ]),
    );
    const r = await unpackHttpContent(content, dest, URL_TGZ);
    expect(r).toEqual({ format: 'tgz', files: 3, bytes: 11 });
    expect(await tree(dest)).toEqual([
      'a/b/dest/top/',
      'a/b/dest/top/config.yml',
      'a/b/dest/top/same.yml',
      'a/b/dest/top/sub/',
      'a/b/dest/top/sub/values.yml',
    ]);
    expect(await readFile(join(dest, 'top/sub/values.yml'), 'utf8')).toBe('b: 2\n');
    expect((await stat(join(dest, 'top/config.yml'))).mode & 0o111).toBe(0);
  });

  it('zip: files written, directory entries skipped', async () => {
    const r = await unpackHttpContent(zipSync({ 'r/': {}, 'r/x.yml': Buffer.from('x') }), dest, URL_TGZ);
    expect(r.format).toBe('zip');
    expect(await tree(dest)).toEqual(['a/b/dest/r/', 'a/b/dest/r/x.yml']);
  });

  it('a plain file is named after the URL path (query ignored), "content" when none', async () => {
    expect((await unpackHttpContent(Buffer.from('kind: X\n'), dest, 'http://h/d/app%20cfg.yml?x=1')).format).toBe(
      'plain',
    );
    expect(await readFile(join(dest, 'app cfg.yml'), 'utf8')).toBe('kind: X\n');
    expect(plainFileName('http://h/')).toBe('content');
    expect(plainFileName('http://h')).toBe('content');
  });

  it('a tgz with an in-tree symlink is not a tgz for vendir: files before it, then the archive as a plain file', async () => {
    const content = gzipSync(
      tarOf([
        { path: 'a.yml', body: 'a' },
        { path: 'l', type: 'SymbolicLink', linkpath: 'a.yml' },
        { path: 'b.yml', body: 'b' },
      ]),
    );
    const r = await unpackHttpContent(content, dest, URL_TGZ);
    expect(r.format).toBe('plain');
    expect(await tree(dest)).toEqual(['a/b/dest/a.yml', 'a/b/dest/app.tgz']);
    expect(Buffer.compare(await readFile(join(dest, 'app.tgz')), content)).toBe(0);
  });

  it('a file where a directory is needed ends the unpack with a vendir-style error, not an I/O throw', async () => {
    const err = await unpackHttpContent(
      gzipSync(
        tarOf([
          { path: 'a', body: 'file' },
          { path: 'a/b', body: 'below a file' },
        ]),
      ),
      dest,
      URL_TGZ,
    ).catch((e) => e);
    expect(isVendirArchiveError(err)).toBe(true);
    expect(err.message).toBe('Making intermediate dir: EEXIST (entry "a/b")');
    await expectNothingOutside();
  });

  it('entryNameProblem accepts names that stay inside', () => {
    expect(entryNameProblem('a/../b')).toBeUndefined();
    expect(entryNameProblem('./a')).toBeUndefined();
    expect(entryNameProblem('..a/b..')).toBeUndefined();
    expect(entryNameProblem('a/..')).toBeUndefined();
  });
});
