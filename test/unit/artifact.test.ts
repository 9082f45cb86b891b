import {
  chmod,
  cp,
  link,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  readlink,
  rename,
  rm,
  stat,
  symlink,
  utimes,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { Header, Parser, Pax, type ReadEntry } from 'tar';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  ArtifactError,
  type ArtifactErrorCode,
  packDir,
  sha256Hex,
  tarSha256,
  unpackTarball,
} from '../../functions/lib/artifact/index.js';

let tmp: string;
beforeEach(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'artifact-test-'));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

/** Writes a small tree: nested dirs, an executable, an empty dir, a symlink, a long path. */
async function makeTree(root: string, order: 'forward' | 'reverse' = 'forward'): Promise<void> {
  const longName = `${'x'.repeat(120)}.yaml`;
  const steps: Array<() => Promise<unknown>> = [
    () => mkdir(join(root, 'config/sub'), { recursive: true }),
    () => writeFile(join(root, 'config/sub/app.yaml'), 'kind: ConfigMap\n'),
    () => writeFile(join(root, 'config/values.yml'), '#@data/values\n---\nreplicas: 1\n', { mode: 0o600 }),
    () => writeFile(join(root, 'run.sh'), '#!/bin/sh\necho hi\n', { mode: 0o700 }),
    () => mkdir(join(root, 'empty'), { recursive: true }),
    () => writeFile(join(root, 'config', longName), 'long: true\n'),
    () => symlink('config/sub/app.yaml', join(root, 'link.yaml')),
  ];
  if (order === 'reverse') {
    // Create in another order (so directory order on disk may differ), parents first.
    await steps[0]!();
    await steps[4]!();
    for (const s of [...steps.slice(1)].reverse()) if (s !== steps[4]) await s();
  } else {
    for (const s of steps) await s();
  }
}

interface ListedEntry {
  path: string;
  type: string;
  mode: number | undefined;
  uid: number | undefined;
  gid: number | undefined;
  uname: string | undefined;
  gname: string | undefined;
  mtime: number | undefined;
  atime: Date | undefined;
  ctime: Date | undefined;
  size: number;
  linkpath: string | undefined;
}

/** Lists a tarball's entries with their header fields (pax applied). */
async function list(tgz: Buffer): Promise<{ entries: ListedEntry[]; paxBodies: string[] }> {
  const entries: ListedEntry[] = [];
  const paxBodies: string[] = [];
  const parser = new Parser({
    onReadEntry: (e: ReadEntry) => {
      entries.push({
        path: e.path,
        type: e.type,
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        uname: e.uname,
        gname: e.gname,
        mtime: e.mtime?.getTime(),
        atime: e.atime,
        ctime: e.ctime,
        size: e.size,
        linkpath: e.linkpath || undefined,
      });
      e.resume();
    },
  });
  // Collect raw pax bodies too, to check no atime/ctime/uid records sneak in.
  const raw = gunzipSync(tgz);
  for (let off = 0; off + 512 <= raw.length; ) {
    const h = new Header(raw, off);
    if (h.nullBlock) break;
    const size = h.size ?? 0;
    if (h.type === 'ExtendedHeader') paxBodies.push(raw.subarray(off + 512, off + 512 + size).toString());
    off += 512 + Math.ceil(size / 512) * 512;
  }
  await new Promise<void>((resolve, reject) => {
    parser.on('end', resolve);
    parser.on('error', reject);
    parser.end(tgz);
  });
  return { entries, paxBodies };
}

/** Deterministic incompressible bytes (xorshift32). */
function noise(size: number): Buffer {
  const buf = Buffer.alloc(size);
  let x = 2463534242;
  for (let i = 0; i + 4 <= size; i += 4) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    buf.writeUInt32LE(x >>> 0, i);
  }
  return buf;
}

/** A pax record `"<len> key=value\n"`, where len counts the whole record including itself. */
function paxRecord(key: string, value: string): string {
  const rest = ` ${key}=${value}\n`;
  let len = rest.length + 1;
  while (String(len).length + rest.length !== len) len = String(len).length + rest.length;
  return `${len}${rest}`;
}

async function expectArtifactError(p: Promise<unknown>, code: ArtifactErrorCode, message: string, path?: unknown) {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ArtifactError);
  expect({
    code: (err as ArtifactError).code,
    message: (err as ArtifactError).message,
    path: (err as ArtifactError).path,
  }).toEqual({
    code,
    message,
    path,
  });
}

describe('packDir', () => {
  it('is deterministic: twice, after touching mtimes and modes, and from a copy elsewhere', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const first = await packDir(a);
    const second = await packDir(a);
    expect(second.tgz.equals(first.tgz)).toBe(true);
    expect(second.sha256).toBe(first.sha256);

    const future = new Date('2031-05-06T07:08:09Z');
    for (const p of ['config/sub/app.yaml', 'config', 'run.sh', 'empty', '.']) await utimes(join(a, p), future, future);
    const touched = await packDir(a);
    expect(touched.tgz.equals(first.tgz)).toBe(true);

    // Same tree built in another order, at another path; 0600/0700 files become 0644/0755.
    const b = join(tmp, 'elsewhere', 'deeper', 'b');
    await makeTree(b, 'reverse');
    const other = await packDir(b);
    expect(other.tgz.equals(first.tgz)).toBe(true);
    expect(other.sha256).toBe(first.sha256);

    // A recursive copy (new inodes, new times) too.
    const c = join(tmp, 'copy');
    await cp(a, c, { recursive: true, verbatimSymlinks: true });
    expect((await packDir(c)).tgz.equals(first.tgz)).toBe(true);

    expect(first.entries).toBe(8);
    expect(first.sha256).toMatch(/^[0-9a-f]{64}$/);
  });

  it('changes digest when content, names or the exec bit change', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const base = (await packDir(a)).sha256;
    await writeFile(join(a, 'config/sub/app.yaml'), 'kind: Secret\n');
    const content = (await packDir(a)).sha256;
    expect(content).not.toBe(base);
    await writeFile(join(a, 'config/sub/app.yaml'), 'kind: ConfigMap\n');
    expect((await packDir(a)).sha256).toBe(base);
    await chmod(join(a, 'config/sub/app.yaml'), 0o755);
    expect((await packDir(a)).sha256).not.toBe(base);
    await chmod(join(a, 'config/sub/app.yaml'), 0o644);
    await rename(join(a, 'run.sh'), join(a, 'run2.sh'));
    expect((await packDir(a)).sha256).not.toBe(base);
  });

  it('writes sorted entries with zeroed times and owners, normalized modes and no atime/ctime', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const packed = await packDir(a);
    // gzip header: no mtime, OS byte 3.
    expect([...packed.tgz.subarray(4, 8)]).toEqual([0, 0, 0, 0]);
    expect(packed.tgz[9]).toBe(3);

    const { entries, paxBodies } = await list(packed.tgz);
    const longName = `config/${'x'.repeat(120)}.yaml`;
    expect(entries.map((e) => [e.path, e.type, e.mode, e.size, e.linkpath])).toEqual([
      ['config/', 'Directory', 0o755, 0, undefined],
      ['config/sub/', 'Directory', 0o755, 0, undefined],
      ['config/sub/app.yaml', 'File', 0o644, 16, undefined],
      ['config/values.yml', 'File', 0o644, 30, undefined],
      [longName, 'File', 0o644, 11, undefined],
      ['empty/', 'Directory', 0o755, 0, undefined],
      ['link.yaml', 'SymbolicLink', 0o777, 0, 'config/sub/app.yaml'],
      ['run.sh', 'File', 0o755, 18, undefined],
    ]);
    for (const e of entries) {
      expect([e.uid, e.gid, e.uname, e.gname, e.mtime, e.atime, e.ctime]).toEqual([
        0,
        0,
        '',
        '',
        0,
        undefined,
        undefined,
      ]);
    }
    // Only the name whose last segment is over 100 bytes needs pax, and only for its path.
    expect(paxBodies).toEqual([paxRecord('path', longName)]);
    expect(await tarSha256(packed.tgz)).toBe(packed.sha256);
  });

  it('uses a pax header with only the path when a name does not fit ustar', async () => {
    const a = join(tmp, 'a');
    const name = `${'n'.repeat(150)}.yaml`;
    await mkdir(a);
    await writeFile(join(a, name), 'x\n');
    const { entries, paxBodies } = await list((await packDir(a)).tgz);
    expect(entries.map((e) => e.path)).toEqual([name]);
    expect(paxBodies).toEqual([paxRecord('path', name)]);
    expect(paxRecord('path', name)).toBe(`165 path=${name}\n`);
  });

  it('stores hard links as regular files (same bytes as a copy)', async () => {
    const a = join(tmp, 'a');
    const b = join(tmp, 'b');
    await mkdir(a);
    await mkdir(b);
    await writeFile(join(a, 'one.yaml'), 'same\n');
    await link(join(a, 'one.yaml'), join(a, 'two.yaml'));
    await writeFile(join(b, 'one.yaml'), 'same\n');
    await writeFile(join(b, 'two.yaml'), 'same\n');
    expect((await packDir(a)).tgz.equals((await packDir(b)).tgz)).toBe(true);
  });

  it.each<[string, string, string]>([
    ['absolute', '/etc/passwd', 'symlink absolute target'],
    ['escaping', '../../outside', 'symlink target escapes the directory'],
    ['dangling', 'missing.yaml', 'symlink target does not exist'],
  ])('refuses a %s symlink', async (_name, target, message) => {
    const a = join(tmp, 'a');
    await mkdir(join(a, 'd'), { recursive: true });
    await symlink(target, join(a, 'd', 'l'));
    await expectArtifactError(packDir(a), 'unsafe-symlink', message, 'd/l');
  });

  it('refuses a symlink that resolves outside through another symlink', async () => {
    const a = join(tmp, 'a');
    await mkdir(a);
    await writeFile(join(tmp, 'secret'), 's');
    await symlink('.', join(a, 'self'));
    // Lexically inside (self/../secret → secret), really <tmp>/secret.
    await symlink('self/../../secret', join(a, 'z'));
    await expectArtifactError(packDir(a), 'unsafe-symlink', 'symlink target escapes the directory', 'z');
  });

  it('enforces entry and byte limits before reading contents', async () => {
    const a = join(tmp, 'a');
    await mkdir(a);
    for (const n of ['a', 'b', 'c']) await writeFile(join(a, n), '12345');
    await expectArtifactError(
      packDir(a, { maxEntries: 2 }),
      'too-many-entries',
      'more than 2 entries',
      expect.any(String),
    );
    await expectArtifactError(
      packDir(a, { maxBytes: 14 }),
      'too-large',
      'file contents exceed 14 bytes',
      expect.any(String),
    );
    expect((await packDir(a, { maxBytes: 15, maxEntries: 3 })).entries).toBe(3);
  });

  it('wraps a missing directory as an io error with cause', async () => {
    const err = await packDir(join(tmp, 'nope')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ArtifactError);
    expect((err as ArtifactError).code).toBe('io');
    expect(((err as ArtifactError).cause as NodeJS.ErrnoException).code).toBe('ENOENT');
  });
});

/** One raw tar entry for hand-built (possibly malicious) archives. */
interface RawEntry {
  path: string;
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'FIFO';
  body?: string;
  linkpath?: string;
  mode?: number;
  /** Size to claim in the header (defaults to the body's). */
  size?: number;
}

function rawTar(entries: RawEntry[], opts: { gzip?: boolean; end?: boolean } = {}): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? '');
    const h = new Header({
      path: e.path,
      type: e.type ?? 'File',
      mode: e.mode ?? (e.type === 'Directory' ? 0o755 : 0o644),
      size: e.size ?? body.length,
      linkpath: e.linkpath ?? '',
      uid: 0,
      gid: 0,
      mtime: new Date(0),
    });
    const block = Buffer.alloc(512);
    if (h.encode(block, 0)) blocks.push(new Pax({ path: e.path, linkpath: e.linkpath }).encode());
    blocks.push(block, body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  if (opts.end !== false) blocks.push(Buffer.alloc(1024));
  const tar = Buffer.concat(blocks);
  return opts.gzip === false ? tar : gzipSync(tar);
}

async function treeOf(dir: string, rel = ''): Promise<string[]> {
  const out: string[] = [];
  for (const name of (await readdir(join(dir, rel))).sort()) {
    const p = rel ? `${rel}/${name}` : name;
    const st = await lstat(join(dir, p));
    if (st.isSymbolicLink()) out.push(`${p} -> ${await readlink(join(dir, p))}`);
    else if (st.isDirectory()) out.push(`${p}/ ${(st.mode & 0o777).toString(8)}`, ...(await treeOf(dir, p)));
    else out.push(`${p} ${(st.mode & 0o777).toString(8)} ${await readFile(join(dir, p), 'utf8')}`);
  }
  return out;
}

describe('unpackTarball', () => {
  it('round-trips packDir: same tree, normalized modes, symlinks kept', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const packed = await packDir(a);
    const out = join(tmp, 'out');
    expect(await unpackTarball(packed.tgz, out)).toEqual({
      entries: 8,
      bytes: 16 + 30 + 11 + 18,
      sha256: packed.sha256,
    });
    expect(await treeOf(out)).toEqual([
      'config/ 755',
      'config/sub/ 755',
      'config/sub/app.yaml 644 kind: ConfigMap\n',
      'config/values.yml 644 #@data/values\n---\nreplicas: 1\n',
      `config/${'x'.repeat(120)}.yaml 644 long: true\n`,
      'empty/ 755',
      'link.yaml -> config/sub/app.yaml',
      'run.sh 755 #!/bin/sh\necho hi\n',
    ]);
    expect((await stat(out)).mode & 0o777).toBe(0o755);
    expect((await packDir(out)).tgz.equals(packed.tgz)).toBe(true);
    // Nothing left behind next to the destination.
    expect((await readdir(tmp)).sort()).toEqual(['a', 'out']);
  });

  it('accepts plain tar, ./-prefixed paths, a root entry and missing parent directories', async () => {
    const archive = rawTar(
      [
        { path: './', type: 'Directory' },
        { path: './deep/er/file.txt', body: 'hi' },
        { path: './deep/x', type: 'SymbolicLink', linkpath: 'er/file.txt' },
      ],
      { gzip: false },
    );
    const out = join(tmp, 'out');
    await mkdir(out); // an existing empty directory is fine
    expect(await unpackTarball(archive, out)).toEqual({ entries: 2, bytes: 2, sha256: sha256Hex(archive) });
    expect(await treeOf(out)).toEqual([
      'deep/ 755',
      'deep/er/ 755',
      'deep/er/file.txt 644 hi',
      'deep/x -> er/file.txt',
    ]);
  });

  it.each<[string, RawEntry[], ArtifactErrorCode, string, string]>([
    ['an absolute path', [{ path: '/etc/cron.d/x', body: 'x' }], 'unsafe-path', 'absolute path', '/etc/cron.d/x'],
    ['a .. path', [{ path: 'a/../../x', body: 'x' }], 'unsafe-path', 'path traversal (..)', 'a/../../x'],
    ['a leading ..', [{ path: '../x', body: 'x' }], 'unsafe-path', 'path traversal (..)', '../x'],
    ['a backslash', [{ path: 'a\\..\\x', body: 'x' }], 'unsafe-path', 'invalid character in path', 'a\\..\\x'],
    ['an empty segment', [{ path: 'a//x', body: 'x' }], 'unsafe-path', 'non-normalized path', 'a//x'],
    [
      'an absolute symlink',
      [{ path: 'l', type: 'SymbolicLink', linkpath: '/etc' }],
      'unsafe-symlink',
      'symlink absolute target',
      'l',
    ],
    [
      'an escaping symlink',
      [{ path: 'd/l', type: 'SymbolicLink', linkpath: '../../etc/passwd' }],
      'unsafe-symlink',
      'symlink target escapes the directory',
      'd/l',
    ],
    [
      'a symlink leaving and re-entering',
      [{ path: 'l', type: 'SymbolicLink', linkpath: '../out/x' }],
      'unsafe-symlink',
      'symlink target escapes the directory',
      'l',
    ],
    [
      'a write through a symlink',
      [
        { path: 'l', type: 'SymbolicLink', linkpath: 'd' },
        { path: 'l/f', body: 'x' },
      ],
      'unsafe-path',
      'entry below a symlink',
      'l/f',
    ],
    [
      'an entry below a file',
      [
        { path: 'f', body: 'x' },
        { path: 'f/g', body: 'y' },
      ],
      'unsafe-path',
      'entry below a non-directory',
      'f/g',
    ],
    [
      'a hard link',
      [{ path: 'h', type: 'Link', linkpath: '/etc/passwd' }],
      'unsupported-entry',
      'unsupported entry type Link',
      'h',
    ],
    ['a FIFO', [{ path: 'p', type: 'FIFO' }], 'unsupported-entry', 'unsupported entry type FIFO', 'p'],
    [
      'a duplicate path',
      [
        { path: 'f', body: 'x' },
        { path: 'f', body: 'y' },
      ],
      'duplicate-entry',
      'duplicate entry',
      'f',
    ],
    [
      'a file replacing an implied directory',
      [
        { path: 'd/f', body: 'x' },
        { path: 'd', body: 'y' },
      ],
      'duplicate-entry',
      'duplicate entry',
      'd',
    ],
  ])('refuses %s and leaves nothing behind', async (_name, entries, code, message, path) => {
    const out = join(tmp, 'out');
    await expectArtifactError(unpackTarball(rawTar(entries), out), code, message, path);
    expect(await readdir(tmp)).toEqual([]);
  });

  it('refuses a symlink that only escapes through another symlink (checked after writing)', async () => {
    await writeFile(join(tmp, 'secret'), 's');
    const archive = rawTar([
      { path: 'd/up', type: 'SymbolicLink', linkpath: '..' },
      // Lexically inside (d/up/../secret → d/secret) but d/up is the root, so really <parent>/secret.
      { path: 'd/s', type: 'SymbolicLink', linkpath: 'up/../secret' },
    ]);
    await expectArtifactError(
      unpackTarball(archive, join(tmp, 'out')),
      'unsafe-symlink',
      'symlink target escapes the directory',
      'd/s',
    );
    expect(await readdir(tmp)).toEqual(['secret']);
  });

  it('refuses a dangling symlink', async () => {
    await expectArtifactError(
      unpackTarball(rawTar([{ path: 'l', type: 'SymbolicLink', linkpath: 'missing' }]), join(tmp, 'out')),
      'unsafe-symlink',
      'symlink target does not exist',
      'l',
    );
  });

  it('enforces the entry and byte limits from headers, before writing data', async () => {
    const three = rawTar([
      { path: 'a', body: '12345' },
      { path: 'b', body: '12345' },
      { path: 'c', body: '12345' },
    ]);
    await expectArtifactError(
      unpackTarball(three, join(tmp, 'o1'), { maxEntries: 2 }),
      'too-many-entries',
      'more than 2 entries',
      'c',
    );
    await expectArtifactError(
      unpackTarball(three, join(tmp, 'o2'), { maxBytes: 14 }),
      'too-large',
      'file contents exceed 14 bytes',
      'c',
    );
    // A header claiming 600 MiB (over the 512 MiB default) is refused on the header alone.
    const liar = rawTar([{ path: 'big', body: '', size: 600 * 1024 * 1024 }], { end: false });
    await expectArtifactError(
      unpackTarball(liar, join(tmp, 'o3')),
      'too-large',
      'file contents exceed 536870912 bytes',
      'big',
    );
    expect(await readdir(tmp)).toEqual([]);
    expect(await unpackTarball(three, join(tmp, 'o4'), { maxEntries: 3, maxBytes: 15 })).toMatchObject({
      entries: 3,
      bytes: 15,
    });
  });

  it('reports garbage and truncated archives as bad-archive', async () => {
    await expectArtifactError(
      unpackTarball(Buffer.from('not a tarball at all'), join(tmp, 'o1')),
      'bad-archive',
      'failed to read tarball',
    );
    const good = rawTar([{ path: 'f', body: 'x'.repeat(2000) }], { gzip: false });
    await expectArtifactError(
      unpackTarball(good.subarray(0, 1200), join(tmp, 'o2')),
      'bad-archive',
      'failed to read tarball',
    );
    // Cut or corrupted in the middle of a file's data (gzip): fails, does not hang.
    const src = join(tmp, 'src');
    await mkdir(src);
    await writeFile(join(src, 'noise.bin'), noise(2 * 1024 * 1024));
    const { tgz } = await packDir(src);
    await rm(src, { recursive: true });
    await expectArtifactError(
      unpackTarball(tgz.subarray(0, tgz.length >> 1), join(tmp, 'o3')),
      'bad-archive',
      'failed to read tarball',
    );
    const corrupt = Buffer.from(tgz);
    corrupt[corrupt.length >> 1] = (corrupt[corrupt.length >> 1] ?? 0) ^ 0xff;
    await expectArtifactError(unpackTarball(corrupt, join(tmp, 'o4')), 'bad-archive', 'failed to read tarball');
    expect(await readdir(tmp)).toEqual([]);
  });

  it('unpacks an archive whose tar stream has the expected sha256, hashed while unpacking', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const packed = await packDir(a);
    // Another gzip of the same tar stream (another zlib build) is the same artifact.
    const regzipped = gzipSync(gunzipSync(packed.tgz), { level: 1 });
    const out = join(tmp, 'out');
    expect(await unpackTarball(regzipped, out, { sha256: packed.sha256 })).toMatchObject({ sha256: packed.sha256 });
    expect((await treeOf(out)).length).toBeGreaterThan(0);
  });

  it('refuses, leaving nothing, an archive that is not the one its digest names (a tampered artifact)', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const genuine = await packDir(a);
    const b = join(tmp, 'b');
    await mkdir(b);
    await writeFile(join(b, 'config.yml'), 'kind: ConfigMap\n');
    const tampered = (await packDir(b)).tgz;
    await rm(a, { recursive: true });
    await rm(b, { recursive: true });
    const out = join(tmp, 'out');
    await expectArtifactError(
      unpackTarball(tampered, out, { sha256: genuine.sha256 }),
      'digest-mismatch',
      `tar stream is not sha256 ${genuine.sha256}`,
    );
    // An unsafe archive in its place fails as tampered too, not with what it holds.
    const unsafe = rawTar([{ path: '../escape', body: 'x' }]);
    await expectArtifactError(
      unpackTarball(unsafe, out, { sha256: genuine.sha256 }),
      'digest-mismatch',
      `tar stream is not sha256 ${genuine.sha256}`,
    );
    expect(await readdir(tmp)).toEqual([]);
  });

  it('hashes the whole tar stream, past the end-of-archive blocks: a tail added to the artifact is refused', async () => {
    const a = join(tmp, 'a');
    await makeTree(a);
    const genuine = await packDir(a);
    await rm(a, { recursive: true });
    const tail = gzipSync(Buffer.concat([gunzipSync(genuine.tgz), Buffer.alloc(4 * 1024 * 1024, 0)]));
    await expectArtifactError(
      unpackTarball(tail, join(tmp, 'out'), { sha256: genuine.sha256 }),
      'digest-mismatch',
      `tar stream is not sha256 ${genuine.sha256}`,
    );
    // Without an expected digest it unpacks (the parser ignores what follows the end), hashed whole.
    const r = await unpackTarball(tail, join(tmp, 'out'));
    expect(r.sha256).toBe(sha256Hex(gunzipSync(tail)));
  });

  it('refuses a non-empty destination without touching it', async () => {
    const out = join(tmp, 'out');
    await mkdir(out);
    await writeFile(join(out, 'keep'), 'k');
    await expectArtifactError(
      unpackTarball(rawTar([{ path: 'f', body: 'x' }]), out),
      'destination-not-empty',
      'destination directory is not empty',
    );
    expect(await readdir(out)).toEqual(['keep']);
  });

  it('unpacks a large file in bounded chunks', async () => {
    const a = join(tmp, 'a');
    await mkdir(a);
    const big = noise(8 * 1024 * 1024);
    await writeFile(join(a, 'big.bin'), big);
    const packed = await packDir(a);
    await unpackTarball(packed.tgz, join(tmp, 'out'));
    expect(sha256Hex(await readFile(join(tmp, 'out', 'big.bin')))).toBe(sha256Hex(big));
  });
});

describe('tarSha256', () => {
  it('refuses to decompress past maxBytes and rejects non-gzip data', async () => {
    const a = join(tmp, 'a');
    await mkdir(a);
    await writeFile(join(a, 'f'), 'x'.repeat(10_000));
    const { tgz } = await packDir(a);
    await expectArtifactError(tarSha256(tgz, { maxBytes: 4096 }), 'too-large', 'tar stream exceeds 4096 bytes');
    await expectArtifactError(tarSha256(Buffer.from('plain')), 'bad-archive', 'failed to decompress tarball');
  });
});
