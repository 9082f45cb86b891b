/**
 * Deterministic tarballs of a directory, and bounded, traversal-safe unpacking.
 *
 * This module reads and writes the local filesystem (a stage's scratch directory); it does
 * no network I/O and has no clock. Packing and unpacking are bounded by {@link ArtifactLimits}.
 *
 * @see fluxcd/pkg `tar` (bounded untar) and vendir `pkg/vendir/directory` (symlink checks).
 */
import { createHash, type Hash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import {
  chmod,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  readlink,
  realpath,
  rename,
  rm,
  symlink,
} from 'node:fs/promises';
import { basename, dirname, join, sep } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import { createGunzip, gunzip, gzip, constants as zlibConstants } from 'node:zlib';
import { Header, Parser, Pax, type ReadEntry } from 'tar';
import { ArtifactError } from './errors.js';
import { sha256Hex } from './keys.js';

const gzipAsync = promisify(gzip);
const gunzipAsync = promisify(gunzip);

/** Default cap on the total bytes of file content packed or unpacked: 512 MiB. */
export const DEFAULT_MAX_ARTIFACT_BYTES = 512 * 1024 * 1024;
/** Default cap on the number of entries (files, directories, symlinks): 100 000. */
export const DEFAULT_MAX_ARTIFACT_ENTRIES = 100_000;

/** Bounds for {@link packDir}, {@link unpackTarball} and {@link tarSha256}. */
export interface ArtifactLimits {
  /** Maximum total bytes of file content (for {@link tarSha256}: of the tar stream). Default {@link DEFAULT_MAX_ARTIFACT_BYTES}. */
  readonly maxBytes?: number;
  /** Maximum number of entries. Default {@link DEFAULT_MAX_ARTIFACT_ENTRIES}. */
  readonly maxEntries?: number;
}

// The error lives in ./errors.ts (no `tar` import): the reconcile results (`../reconcile/result.ts`),
// which every function loads at start, classify it without loading `tar`.
export { ArtifactError, type ArtifactErrorCode } from './errors.js';

/** Result of {@link packDir}. */
export interface PackedDir {
  /** The gzip-compressed tarball. */
  readonly tgz: Buffer;
  /**
   * Lowercase hex sha256 of the *uncompressed* tar stream: the artifact's identity, used in
   * its key (`fetchArtifactKey`). It does not depend on the gzip implementation, so two
   * hosts with different zlib builds agree on it even if their `.tgz` bytes differ.
   */
  readonly sha256: string;
  /** Size of the uncompressed tar stream in bytes. */
  readonly tarBytes: number;
  /** Number of entries (files, directories and symlinks; the root itself is not an entry). */
  readonly entries: number;
}

const BLOCK = 512;
const EPOCH = new Date(0);

interface WalkEntry {
  rel: string;
  abs: string;
  type: 'File' | 'Directory' | 'SymbolicLink';
  mode: number;
  linkpath?: string;
}

function limitsOf(l: ArtifactLimits | undefined): { maxBytes: number; maxEntries: number } {
  return {
    maxBytes: l?.maxBytes ?? DEFAULT_MAX_ARTIFACT_BYTES,
    maxEntries: l?.maxEntries ?? DEFAULT_MAX_ARTIFACT_ENTRIES,
  };
}

function ioError(action: string, cause: unknown, path?: string): ArtifactError {
  return new ArtifactError('io', action, path, { cause });
}

function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

function isInside(root: string, p: string): boolean {
  return p === root || p.startsWith(root.endsWith(sep) ? root : root + sep);
}

/**
 * Lexically checks a symlink target: relative, and resolving from the link's directory never
 * leaves the root, not even in the middle (`../root/x` is refused).
 * @returns an error message, or undefined when the target is acceptable.
 */
function symlinkTargetProblem(linkRel: string, target: string): string | undefined {
  if (target === '' || target.includes('\0')) return 'empty or invalid target';
  if (target.startsWith('/') || target.includes('\\') || /^[A-Za-z]:/.test(target)) return 'absolute target';
  let depth = linkRel.split('/').length - 1;
  for (const seg of target.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..') {
      depth -= 1;
      if (depth < 0) return 'target escapes the directory';
    } else {
      depth += 1;
    }
  }
  return undefined;
}

/**
 * Packs `dir` into a deterministic gzip tarball.
 *
 * Determinism: entries sorted by UTF-8 byte order of their relative path (directories as
 * `name/`, before their contents); mtime 0; uid/gid 0; uname/gname empty; mode 0755 for
 * directories and for files with any execute bit, 0644 for other files, 0777 for symlinks;
 * no atime/ctime/dev/ino and no pax header unless a path or link target does not fit ustar
 * (then a pax header carrying only `path`/`linkpath`); hard links are stored as regular
 * files; gzip level 6 with a zero gzip mtime and the OS byte fixed to 3 (Unix). The same
 * tree packed anywhere, at any path, at any time gives the same {@link PackedDir.sha256}.
 *
 * Symlinks are kept only when their target is relative, stays inside `dir` and exists
 * (vendir refuses the same ones). Sockets, FIFOs and devices are refused.
 *
 * @param dir directory to pack (not included as an entry itself).
 * @throws ArtifactError `too-large` / `too-many-entries` past the limits (checked before
 *   file contents are read), `unsafe-symlink`, `unsupported-entry`, or `io` (with `cause`)
 *   when the directory cannot be read.
 */
export async function packDir(dir: string, limits?: ArtifactLimits): Promise<PackedDir> {
  const { maxBytes, maxEntries } = limitsOf(limits);
  let root: string;
  try {
    root = await realpath(dir);
  } catch (cause) {
    throw ioError('failed to resolve directory to pack', cause);
  }
  const walk: Walk = { root, entries: [], bytes: 0, maxBytes, maxEntries };
  await walkDir(walk, root, '');
  const { entries } = walk;
  entries.sort((a, b) => byteOrder(tarPath(a), tarPath(b)));
  const tar = await tarOf(entries, maxBytes);
  const tgz = await gzipAsync(tar, { level: 6, strategy: zlibConstants.Z_DEFAULT_STRATEGY });
  // RFC 1952 OS byte: fixed so macOS and Linux hosts emit the same header.
  tgz[9] = 3;
  return { tgz, sha256: sha256Hex(tar), tarBytes: tar.length, entries: entries.length };
}

/** A walk of the tree {@link packDir} packs: the entries found so far and the file bytes they hold. */
interface Walk {
  /** The real path of the directory packed. */
  root: string;
  entries: WalkEntry[];
  /** File bytes, as stat'ed. */
  bytes: number;
  maxBytes: number;
  maxEntries: number;
}

/** An entry's path in the tar (directories as `name/`, which is also their sort key). */
function tarPath(e: WalkEntry): string {
  return e.type === 'Directory' ? `${e.rel}/` : e.rel;
}

/**
 * Adds the entries of `absDir` (at `relDir` in the tar, `''` for the root) to the walk,
 * depth first, each directory before its contents; the limits hold as entries are found.
 * @throws ArtifactError as {@link packDir} documents.
 */
async function walkDir(w: Walk, absDir: string, relDir: string): Promise<void> {
  let names: string[];
  try {
    names = await readdir(absDir);
  } catch (cause) {
    throw ioError('failed to read directory', cause, relDir || '.');
  }
  for (const name of names) {
    const rel = relDir ? `${relDir}/${name}` : name;
    const abs = join(absDir, name);
    if (w.entries.length >= w.maxEntries) {
      throw new ArtifactError('too-many-entries', `more than ${w.maxEntries} entries`, rel);
    }
    let st: Awaited<ReturnType<typeof lstat>>;
    try {
      st = await lstat(abs);
    } catch (cause) {
      throw ioError('failed to stat entry', cause, rel);
    }
    if (st.isDirectory()) {
      w.entries.push({ rel, abs, type: 'Directory', mode: 0o755 });
      await walkDir(w, abs, rel);
    } else if (st.isFile()) {
      w.bytes += st.size;
      if (w.bytes > w.maxBytes) {
        throw new ArtifactError('too-large', `file contents exceed ${w.maxBytes} bytes`, rel);
      }
      w.entries.push({ rel, abs, type: 'File', mode: st.mode & 0o111 ? 0o755 : 0o644 });
    } else if (st.isSymbolicLink()) {
      w.entries.push(await symlinkEntry(w.root, abs, rel));
    } else {
      throw new ArtifactError('unsupported-entry', 'not a file, directory or symlink', rel);
    }
  }
}

/**
 * The entry of the symlink at `abs`, kept only when its target is relative, stays inside `root`
 * and exists (vendir refuses the same ones).
 * @throws ArtifactError `unsafe-symlink`, or `io` when the link cannot be read.
 */
async function symlinkEntry(root: string, abs: string, rel: string): Promise<WalkEntry> {
  let target: string;
  try {
    target = await readlink(abs);
  } catch (cause) {
    throw ioError('failed to read symlink', cause, rel);
  }
  const problem = symlinkTargetProblem(rel, target);
  if (problem) throw new ArtifactError('unsafe-symlink', `symlink ${problem}`, rel);
  let resolved: string;
  try {
    resolved = await realpath(abs);
  } catch {
    throw new ArtifactError('unsafe-symlink', 'symlink target does not exist', rel);
  }
  if (!isInside(root, resolved)) {
    throw new ArtifactError('unsafe-symlink', 'symlink target escapes the directory', rel);
  }
  return { rel, abs, type: 'SymbolicLink', mode: 0o777, linkpath: target };
}

/**
 * The uncompressed tar of the sorted `entries`, with the fixed headers {@link packDir}
 * documents; file contents are read here, and the limit holds on what is read.
 * @throws ArtifactError `too-large`, or `io` when a file cannot be read.
 */
async function tarOf(entries: readonly WalkEntry[], maxBytes: number): Promise<Buffer> {
  const blocks: Buffer[] = [];
  let written = 0;
  for (const e of entries) {
    let body: Buffer | undefined;
    if (e.type === 'File') {
      try {
        body = await readFile(e.abs);
      } catch (cause) {
        throw ioError('failed to read file', cause, e.rel);
      }
      written += body.length;
      // The file may have grown since it was stat'ed; the limit holds on what is packed.
      if (written > maxBytes) throw new ArtifactError('too-large', `file contents exceed ${maxBytes} bytes`, e.rel);
    }
    const header = new Header({
      path: tarPath(e),
      mode: e.mode,
      uid: 0,
      gid: 0,
      size: body?.length ?? 0,
      mtime: EPOCH,
      type: e.type,
      linkpath: e.linkpath ?? '',
      uname: '',
      gname: '',
      devmaj: 0,
      devmin: 0,
    });
    const block = Buffer.alloc(BLOCK);
    // A path or link target that does not fit ustar gets a pax header with just that field.
    if (header.encode(block, 0)) blocks.push(new Pax({ path: tarPath(e), linkpath: e.linkpath }).encode());
    blocks.push(block);
    if (body && body.length > 0) {
      blocks.push(body);
      const pad = (BLOCK - (body.length % BLOCK)) % BLOCK;
      if (pad) blocks.push(Buffer.alloc(pad));
    }
  }
  blocks.push(Buffer.alloc(BLOCK * 2));
  return Buffer.concat(blocks);
}

/**
 * Hex sha256 of the uncompressed tar stream inside `tgz`: recomputes {@link PackedDir.sha256}
 * to verify an artifact read back from storage against its key.
 * @param limits only `maxBytes` applies: the cap on the decompressed size (default 512 MiB).
 * @throws ArtifactError `too-large` when decompressing exceeds `maxBytes`, `bad-archive` when
 *   `tgz` is not gzip data.
 */
export async function tarSha256(tgz: Uint8Array, limits?: ArtifactLimits): Promise<string> {
  const { maxBytes } = limitsOf(limits);
  try {
    return sha256Hex(await gunzipAsync(tgz, { maxOutputLength: maxBytes }));
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE') {
      throw new ArtifactError('too-large', `tar stream exceeds ${maxBytes} bytes`, undefined, { cause });
    }
    throw new ArtifactError('bad-archive', 'failed to decompress tarball', undefined, { cause });
  }
}

/** Options of {@link unpackTarball}: the limits, and the digest the tar stream must have. */
export interface UnpackOptions extends ArtifactLimits {
  /**
   * Lowercase hex sha256 the *uncompressed* tar stream must have ({@link PackedDir.sha256}: the
   * digest a shared fetch artifact's key names). Hashed while unpacking, not in a second pass;
   * a different stream (a tampered artifact) fails the unpack with `digest-mismatch`, and then
   * nothing appears at the destination, whatever the archive held. Absent: not checked.
   */
  readonly sha256?: string;
}

/** Result of {@link unpackTarball}. */
export interface UnpackResult {
  /** Entries written (files, directories, symlinks; a `./` root entry is not counted). */
  readonly entries: number;
  /** Total bytes of file content written. */
  readonly bytes: number;
  /** Hex sha256 of the uncompressed tar stream (of the bytes as given for a plain tar). */
  readonly sha256: string;
}

/** Largest ratio of decompressed to compressed bytes accepted: 1000, as the `tar` parser's own. */
const MAX_DECOMPRESSION_RATIO = 1000;

/**
 * Validates and normalizes an entry path: relative, `/`-separated, no `.`/`..`/empty
 * segments, no backslash or NUL. A leading `./` is dropped (GNU tar `-C dir .` archives).
 * @returns the normalized path, `''` for the root entry, or an error message.
 */
function normalizeEntryPath(raw: string): { path: string } | { problem: string } {
  let p = raw;
  while (p.startsWith('./')) p = p.slice(2);
  while (p.endsWith('/')) p = p.slice(0, -1);
  if (p === '' || p === '.') return { path: '' };
  if (p.includes('\0') || p.includes('\\')) return { problem: 'invalid character in path' };
  if (p.startsWith('/') || /^[A-Za-z]:/.test(p)) return { problem: 'absolute path' };
  for (const seg of p.split('/')) {
    if (seg === '..') return { problem: 'path traversal (..)' };
    if (seg === '' || seg === '.') return { problem: 'non-normalized path' };
  }
  return { path: p };
}

async function isEmptyOrMissingDir(dir: string): Promise<boolean> {
  try {
    return (await readdir(dir)).length === 0;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return true;
    throw ioError('failed to read destination directory', e);
  }
}

/**
 * Unpacks a tarball (gzip or plain tar) into `destDir`, refusing anything unsafe.
 *
 * Refused (the whole unpack fails, nothing appears at `destDir`): absolute paths, `..` or
 * non-normalized segments, backslashes; hard links, devices, FIFOs; duplicate paths; entries
 * below a symlink; symlinks that are absolute, leave the directory lexically, or resolve
 * (after everything is written) outside it or to nothing. Modes are normalized as
 * {@link packDir} writes them (0755 directories and executables, 0644 other files);
 * owners and times are not restored.
 *
 * Atomic: entries are written into a temporary sibling directory that is renamed to
 * `destDir` at the end, so `destDir` must not exist or be an empty directory. Memory use is
 * bounded: file data is streamed to disk in small chunks.
 *
 * With `opts.sha256` the archive is checked against it (see {@link UnpackOptions.sha256}): an
 * archive that is not the expected one fails with `digest-mismatch` rather than with what its
 * content would have caused (an unsafe path a tampered archive holds is its tampering).
 *
 * @throws ArtifactError `too-large` / `too-many-entries` (limits are checked on each entry's
 *   header, before its data is written), `unsafe-path`, `unsafe-symlink`,
 *   `unsupported-entry`, `duplicate-entry`, `bad-archive` (not a tar, truncated, bad
 *   checksum, decompression ratio above 1000), `digest-mismatch`, `destination-not-empty`,
 *   or `io` with `cause`.
 */
export async function unpackTarball(archive: Uint8Array, destDir: string, opts?: UnpackOptions): Promise<UnpackResult> {
  const { maxBytes, maxEntries } = limitsOf(opts);
  if (!(await isEmptyOrMissingDir(destDir))) {
    throw new ArtifactError('destination-not-empty', 'destination directory is not empty');
  }
  const parent = dirname(destDir);
  let tmp: string;
  try {
    await mkdir(parent, { recursive: true });
    tmp = await mkdtemp(join(parent, `.${basename(destDir)}.~unpack-`));
  } catch (cause) {
    throw ioError('failed to create temporary directory', cause);
  }
  try {
    const result = await extractChecked(archive, tmp, maxBytes, maxEntries, opts?.sha256);
    try {
      // mkdtemp creates 0700; the unpacked root gets the directory mode entries get.
      await chmod(tmp, 0o755);
      await rename(tmp, destDir);
    } catch (cause) {
      if ((cause as NodeJS.ErrnoException).code === 'ENOTEMPTY' || (cause as NodeJS.ErrnoException).code === 'EEXIST') {
        throw new ArtifactError('destination-not-empty', 'destination directory is not empty', undefined, { cause });
      }
      throw ioError('failed to move unpacked directory into place', cause);
    }
    return result;
  } catch (e) {
    await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
}

/**
 * {@link extractInto}, then the digest check: a mismatch, or a failed extraction of an archive
 * that is not the expected one (hashed once more, only on that failure path, within the
 * limits), is `digest-mismatch`.
 */
async function extractChecked(
  archive: Uint8Array,
  root: string,
  maxBytes: number,
  maxEntries: number,
  expected: string | undefined,
): Promise<UnpackResult> {
  const mismatch = () => new ArtifactError('digest-mismatch', `tar stream is not sha256 ${expected}`);
  let result: UnpackResult;
  try {
    result = await extractInto(archive, root, maxBytes, maxEntries);
  } catch (e) {
    if (expected === undefined || (e instanceof ArtifactError && e.code === 'io')) throw e;
    const actual = await tarSha256(archive, { maxBytes: maxBytes * 2 }).catch(() => undefined);
    throw actual === expected ? e : mismatch();
  }
  if (expected !== undefined && result.sha256 !== expected) throw mismatch();
  return result;
}

/**
 * Extracts `archive` into the empty directory `root` (the temporary sibling of
 * {@link unpackTarball}): entries are checked as the parser reads them ({@link EntryLedger}),
 * written one after the other in archive order, then the symlinks are made and checked last
 * ({@link finishTree}). The tar stream is hashed as it is fed (`sha256` of the result).
 * @throws ArtifactError as {@link unpackTarball} documents; the first failure wins.
 */
async function extractInto(
  archive: Uint8Array,
  root: string,
  maxBytes: number,
  maxEntries: number,
): Promise<UnpackResult> {
  const ledger = new EntryLedger(maxBytes, maxEntries);
  const x: Extraction = {
    root,
    parser: new Parser({ strict: true, noResume: true }),
    chain: Promise.resolve(),
    symlinks: [],
  };
  x.parser.on('entry', (entry: ReadEntry) => onEntry(x, ledger, entry));
  x.parser.on('eof', () => {
    x.eof = true;
  });
  const done = parserSettled(x);
  const hash = createHash('sha256');
  await feedParser(x, archive, hash);
  if (!x.failure) x.parser.end();
  await done;
  await x.chain;
  if (x.failure) throw x.failure;
  await finishTree(root, x.symlinks, ledger.implicitDirs);
  return { entries: ledger.entries, bytes: ledger.bytes, sha256: hash.digest('hex') };
}

/** One extraction: what the parser's callbacks and the writes they queue share. */
interface Extraction {
  /** The directory entries are written into. */
  root: string;
  parser: Parser;
  /** The first failure: later entries are skipped and the parser is aborted. */
  failure?: Error;
  /** The queued writes, run one after the other in archive order. */
  chain: Promise<void>;
  /**
   * The file entry being streamed to disk: ended by hand when the parser fails mid-entry,
   * since the parser then never ends it and the write would wait forever.
   */
  current?: ReadEntry;
  /** The symlinks read, made last ({@link finishTree}). */
  symlinks: { path: string; target: string }[];
  /**
   * The parser read the end-of-archive blocks: what follows is only hashed, not written to it
   * (the parser would keep it all in one buffer, concatenated chunk after chunk).
   */
  eof?: boolean;
}

/** Records the first failure and aborts the parser (later failures are dropped). */
function failExtraction(x: Extraction, e: Error): void {
  if (x.failure) return;
  x.failure = e;
  x.parser.abort(e);
}

/**
 * The parser's `entry` callback: checks the entry, then queues its directory or file write, or
 * keeps a symlink for the end. Entries after a failure are drained unread.
 */
function onEntry(x: Extraction, ledger: EntryLedger, entry: ReadEntry): void {
  if (x.failure) {
    entry.resume();
    return;
  }
  const problem = ledger.check(entry);
  if (problem) {
    failExtraction(x, problem);
    entry.resume();
    return;
  }
  const norm = normalizeEntryPath(entry.path) as { path: string };
  const rel = norm.path;
  if (rel === '' || entry.type === 'Directory') {
    entry.resume();
    if (rel === '') return;
    x.chain = x.chain.then(async () => {
      if (x.failure) return;
      try {
        await mkdir(join(x.root, rel), { recursive: true, mode: 0o755 });
        await chmod(join(x.root, rel), 0o755);
      } catch (cause) {
        failExtraction(x, ioError('failed to create directory', cause, rel));
      }
    });
    return;
  }
  if (entry.type === 'SymbolicLink') {
    entry.resume();
    x.symlinks.push({ path: rel, target: entry.linkpath ?? '' });
    return;
  }
  x.chain = x.chain.then(() => writeFileEntry(x, entry, rel));
}

/** Streams a file entry to `rel` (created exclusively), with the mode {@link packDir} would give it. */
async function writeFileEntry(x: Extraction, entry: ReadEntry, rel: string): Promise<void> {
  const abs = join(x.root, rel);
  const mode = (entry.mode ?? 0o644) & 0o111 ? 0o755 : 0o644;
  if (x.failure) {
    entry.resume();
    return;
  }
  try {
    await mkdir(dirname(abs), { recursive: true, mode: 0o755 });
    x.current = entry;
    if (x.failure) throw x.failure;
    await pipeline(entry, createWriteStream(abs, { flags: 'wx', mode }));
    await chmod(abs, mode);
  } catch (cause) {
    entry.resume();
    failExtraction(x, ioError('failed to write file', cause, rel));
  } finally {
    x.current = undefined;
  }
}

/**
 * The paths an archive's entries take, checked as each entry's header is read: limits, types,
 * duplicates, entries below a symlink or a non-directory, lexical symlink targets.
 */
class EntryLedger {
  /** Entries counted so far (the root entry is not). */
  entries = 0;
  /** File bytes counted so far (from the headers). */
  bytes = 0;
  /** Directories only implied as parents of other entries (their mode is set at the end). */
  readonly implicitDirs = new Set<string>();
  private readonly seen = new Set<string>();
  private readonly symlinkPaths = new Set<string>();
  private readonly dirPaths = new Set<string>();

  constructor(
    private readonly maxBytes: number,
    private readonly maxEntries: number,
  ) {}

  /** @returns the entry's problem, or `undefined` when it may be written. */
  check(entry: ReadEntry): ArtifactError | undefined {
    const { maxBytes, maxEntries, seen, implicitDirs, symlinkPaths, dirPaths } = this;
    const norm = normalizeEntryPath(entry.path);
    if ('problem' in norm) return new ArtifactError('unsafe-path', norm.problem, entry.path);
    const rel = norm.path;
    if (rel === '') {
      return entry.type === 'Directory'
        ? undefined
        : new ArtifactError('unsafe-path', 'root entry is not a directory', entry.path);
    }
    const kind = entry.type;
    if (
      kind !== 'File' &&
      kind !== 'OldFile' &&
      kind !== 'ContiguousFile' &&
      kind !== 'Directory' &&
      kind !== 'SymbolicLink'
    ) {
      return new ArtifactError('unsupported-entry', `unsupported entry type ${kind}`, rel);
    }
    this.entries += 1;
    if (this.entries > maxEntries) return new ArtifactError('too-many-entries', `more than ${maxEntries} entries`, rel);
    if (kind !== 'Directory' && kind !== 'SymbolicLink') {
      this.bytes += entry.size ?? 0;
      if (this.bytes > maxBytes) return new ArtifactError('too-large', `file contents exceed ${maxBytes} bytes`, rel);
    }
    if (seen.has(rel) || (kind !== 'Directory' && implicitDirs.has(rel))) {
      return new ArtifactError('duplicate-entry', 'duplicate entry', rel);
    }
    const parts = rel.split('/');
    for (let i = 1; i < parts.length; i++) {
      const ancestor = parts.slice(0, i).join('/');
      if (symlinkPaths.has(ancestor)) return new ArtifactError('unsafe-path', 'entry below a symlink', rel);
      if (seen.has(ancestor) && !dirPaths.has(ancestor)) {
        return new ArtifactError('unsafe-path', 'entry below a non-directory', rel);
      }
      implicitDirs.add(ancestor);
    }
    seen.add(rel);
    if (kind === 'Directory') dirPaths.add(rel);
    if (kind === 'SymbolicLink') {
      symlinkPaths.add(rel);
      const lp = symlinkTargetProblem(rel, entry.linkpath ?? '');
      if (lp) return new ArtifactError('unsafe-symlink', `symlink ${lp}`, rel);
    }
    return undefined;
  }
}

/**
 * Settles when the parser ends, fails or is aborted; a parse error becomes `bad-archive`
 * (unless a failure came first), and the file being written is ended with the failure.
 */
function parserSettled(x: Extraction): Promise<void> {
  return new Promise<void>((resolve) => {
    x.parser.on('error', (e: Error) => {
      if (!x.failure) x.failure = new ArtifactError('bad-archive', 'failed to read tarball', undefined, { cause: e });
      x.current?.destroy(x.failure);
      resolve();
    });
    x.parser.on('end', () => resolve());
    x.parser.on('abort', () => {
      x.current?.destroy(x.failure);
      resolve();
    });
  });
}

/** The archive in slices of 64 KiB (views, no copies). */
function* slicesOf(archive: Uint8Array): Generator<Buffer> {
  const CHUNK = 64 * 1024;
  const buf = Buffer.from(archive.buffer, archive.byteOffset, archive.byteLength);
  for (let off = 0; off < buf.length; off += CHUNK) yield buf.subarray(off, off + CHUNK);
}

/**
 * Feeds the tar stream to the parser, adding it to `hash` as it goes: a gzip archive is
 * decompressed here (so the hash sees the tar stream itself, in the same pass), anything else
 * is fed as it is. Stops at the extraction's first failure.
 */
async function feedParser(x: Extraction, archive: Uint8Array, hash: Hash): Promise<void> {
  if (archive[0] !== 0x1f || archive[1] !== 0x8b) {
    for (const slice of slicesOf(archive)) {
      if (x.failure) return;
      hash.update(slice);
      await writeToParser(x, slice);
    }
    return;
  }
  let compressed = 0;
  let plain = 0;
  const counted = function* () {
    for (const slice of slicesOf(archive)) {
      compressed += slice.length;
      yield slice;
    }
  };
  try {
    await pipeline(Readable.from(counted()), createGunzip(), async (tar: AsyncIterable<Buffer>) => {
      for await (const chunk of tar) {
        if (x.failure) return;
        plain += chunk.length;
        if (plain / compressed > MAX_DECOMPRESSION_RATIO) {
          failExtraction(x, new ArtifactError('bad-archive', `decompression ratio above ${MAX_DECOMPRESSION_RATIO}`));
          return;
        }
        hash.update(chunk);
        await writeToParser(x, chunk);
      }
    });
  } catch (cause) {
    // Worded as the parser words a bad tar: to the App, either is a broken artifact.
    if (!x.failure) failExtraction(x, new ArtifactError('bad-archive', 'failed to read tarball', undefined, { cause }));
  }
}

/** Writes a chunk to the parser and waits while it asks for a pause (not once it failed). */
async function writeToParser(x: Extraction, chunk: Buffer): Promise<void> {
  const { parser } = x;
  if (x.failure || x.eof || parser.write(chunk) || x.failure || x.eof) return;
  await new Promise<void>((resolve) => {
    const finish = () => {
      parser.off('drain', finish);
      parser.off('abort', finish);
      parser.off('error', finish);
      resolve();
    };
    parser.on('drain', finish);
    parser.on('abort', finish);
    parser.on('error', finish);
  });
}

/**
 * Once every file and directory is written: makes the symlinks (last, so nothing is ever
 * written through one), gives implied directories the mode listed ones get, and checks that
 * every symlink resolves inside `root`.
 */
async function finishTree(
  root: string,
  symlinks: readonly { path: string; target: string }[],
  implicitDirs: ReadonlySet<string>,
): Promise<void> {
  for (const l of symlinks) {
    try {
      await mkdir(dirname(join(root, l.path)), { recursive: true, mode: 0o755 });
      await symlink(l.target, join(root, l.path));
    } catch (cause) {
      throw ioError('failed to create symlink', cause, l.path);
    }
  }
  // Directories created only as parents of other entries get the mode listed ones get
  // (mkdir's mode is subject to the process umask).
  for (const d of implicitDirs) {
    try {
      await chmod(join(root, d), 0o755);
    } catch (cause) {
      throw ioError('failed to set directory mode', cause, d);
    }
  }
  if (symlinks.length > 0) {
    const realRoot = await realpath(root);
    for (const l of symlinks) {
      let resolved: string;
      try {
        resolved = await realpath(join(root, l.path));
      } catch {
        throw new ArtifactError('unsafe-symlink', 'symlink target does not exist', l.path);
      }
      if (!isInside(realRoot, resolved)) {
        throw new ArtifactError('unsafe-symlink', 'symlink target escapes the directory', l.path);
      }
    }
  }
}
