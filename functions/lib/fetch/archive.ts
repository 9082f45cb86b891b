/**
 * Safe unpacking of an http fetch source, laid out exactly as vendir v0.44 lays it out
 * (`pkg/vendir/fetch/archive.go` `Archive.Unpack`), but refusing every entry that could write
 * outside the destination.
 *
 * vendir joins each entry name onto its directory (`filepath.Join(dst, name)`) without a
 * check, so an entry `../../x` lands outside the fetch directory. Here the archive is parsed
 * and written by this module only: every name is checked before anything is written, only
 * plain files and directories are ever created (never a symlink, hard link or device), and
 * nothing follows a link, so a write outside `destDir` is impossible by construction.
 *
 * Layout kept from vendir, so a good archive gives the same files as upstream:
 * - the content is tried as zip (central directory found by Go's rule), then gzip'd tar, then
 *   tar; anything else is written as one plain file named after the URL's last path segment
 *   (`content` when empty);
 * - only regular files are written; directory entries and empty directories are not created;
 *   pax global headers are skipped; file modes are not kept (vendir's `os.Create`: 0666 less
 *   the umask), intermediate directories are 0700;
 * - a tar whose entries include another type (symlink, hard link, device, FIFO) is, as in
 *   vendir, "not this format": the next format is tried and finally the plain-file fallback,
 *   keeping what was written before. Such an entry is refused outright instead when it is
 *   unsafe (a link whose target leaves the directory, a device or FIFO).
 *
 * @module
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { posix } from 'node:path';
import { gunzipSync, inflateRawSync } from 'node:zlib';
import { Header, Pax } from 'tar';
import { DEFAULT_MAX_ARTIFACT_BYTES, DEFAULT_MAX_ARTIFACT_ENTRIES } from '../artifact/tarball.js';

/** Bounds for {@link unpackHttpContent}. */
export interface UnpackLimits {
  /** Maximum total bytes written (also caps gzip and deflate output). Default 512 MiB. */
  readonly maxBytes?: number;
  /** Maximum number of archive entries. Default 100 000. */
  readonly maxEntries?: number;
}

/**
 * An archive refused by {@link unpackHttpContent}. `entry` is the offending entry name as
 * stored in the archive (absent for whole-archive bounds); the message names it, e.g.
 * `archive entry "../../x" escapes the fetch directory`.
 */
export class UnsafeArchiveError extends Error {
  override readonly name = 'UnsafeArchiveError';
  constructor(
    message: string,
    readonly entry?: string,
  ) {
    super(message);
  }
}

/** A format-level failure that vendir reports as final (mirrors its error text). */
class FinalArchiveError extends Error {}

/** Result of {@link unpackHttpContent}. */
export interface UnpackedHttpContent {
  /** How the content was read: as vendir would have read it. */
  readonly format: 'zip' | 'tgz' | 'tar' | 'plain';
  /** Regular files written (a file written twice counts twice, as vendir writes it twice). */
  readonly files: number;
  /** Bytes written. */
  readonly bytes: number;
}

const quote = (s: string): string => JSON.stringify(s);

/**
 * Why writing a regular file named `name` under a directory is unsafe, or `undefined` when it
 * stays inside. Absolute names are refused although Go's `filepath.Join` would keep them
 * inside: no good archive has them and GNU tar strips them.
 */
export function entryNameProblem(name: string): string | undefined {
  if (name.includes('\0')) return `archive entry ${quote(name)} has an invalid name`;
  if (name.startsWith('/')) return `archive entry ${quote(name)} is an absolute path`;
  const cleaned = posix.normalize(`./${name}`);
  if (cleaned === '..' || cleaned.startsWith('../')) {
    return `archive entry ${quote(name)} escapes the fetch directory`;
  }
  return undefined;
}

/** Why a link entry (`name` → `target`) is unsafe, or `undefined` when it stays inside. */
function linkProblem(name: string, target: string, hard: boolean): string | undefined {
  const kind = hard ? 'hard link' : 'symlink';
  if (target.startsWith('/')) return `archive entry ${quote(name)} is a ${kind} to an absolute path ${quote(target)}`;
  // A symlink resolves from its own directory, a hard link from the archive root.
  const base = hard ? '.' : posix.dirname(posix.normalize(`./${name}`));
  const cleaned = posix.normalize(`${base}/${target}`);
  if (cleaned === '..' || cleaned.startsWith('../')) {
    return `archive entry ${quote(name)} is a ${kind} to ${quote(target)}, outside the fetch directory`;
  }
  return undefined;
}

class Budget {
  entries = 0;
  bytes = 0;
  files = 0;
  constructor(
    readonly maxBytes: number,
    readonly maxEntries: number,
  ) {}
  entry(name: string): void {
    this.entries += 1;
    if (this.entries > this.maxEntries) {
      throw new UnsafeArchiveError(`archive has more than ${this.maxEntries} entries (at ${quote(name)})`, name);
    }
  }
  write(name: string, size: number): void {
    this.bytes += size;
    if (this.bytes > this.maxBytes) {
      throw new UnsafeArchiveError(`archive content exceeds ${this.maxBytes} bytes (at ${quote(name)})`, name);
    }
  }
}

async function writeEntry(destDir: string, name: string, data: Uint8Array, budget: Budget): Promise<void> {
  const problem = entryNameProblem(name);
  if (problem) throw new UnsafeArchiveError(problem, name);
  budget.write(name, data.length);
  const path = posix.join(destDir, name);
  // Failures here (a file where a directory is needed, a name that is a directory) end the
  // unpack as vendir's do, with its wording, instead of escaping as an I/O error.
  const why = (err: unknown) => ((err as NodeJS.ErrnoException).code ?? String(err)).toString();
  try {
    await mkdir(posix.dirname(path), { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new FinalArchiveError(`Making intermediate dir: ${why(err)} (entry ${quote(name)})`);
  }
  try {
    // Go's os.Create: truncate, mode 0666 less the umask.
    await writeFile(path, data, { mode: 0o666 });
  } catch (err) {
    throw new FinalArchiveError(`Creating dst file: ${why(err)} (entry ${quote(name)})`);
  }
  budget.files += 1;
}

// ---------------------------------------------------------------------------------------------
// zip (Go archive/zip reader rules, as far as they decide which entries exist)

interface ZipEntry {
  name: string;
  method: number;
  compressedSize: number;
  localOffset: number;
  externalAttrs: number;
  creatorOS: number;
}

const EOCD_SIG = 0x06054b50;
const CDH_SIG = 0x02014b50;
const LFH_SIG = 0x04034b50;
const EOCD_LEN = 22;

/** Go's `findSignatureInBlock` over the last 64 KiB + 22 bytes: the last EOCD whose comment fits. */
function findEocd(buf: Buffer): number {
  const start = Math.max(0, buf.length - (0xffff + EOCD_LEN));
  for (let i = buf.length - EOCD_LEN; i >= start; i--) {
    if (buf.readUInt32LE(i) === EOCD_SIG) {
      const commentLen = buf.readUInt16LE(i + EOCD_LEN - 2);
      return commentLen + EOCD_LEN + i > buf.length ? -1 : i;
    }
  }
  return -1;
}

/** The central directory, or `undefined` where Go's `zip.NewReader` fails (vendir then tries tgz). */
function readZipDirectory(buf: Buffer): ZipEntry[] | undefined {
  if (buf.length < EOCD_LEN) return undefined;
  const eocd = findEocd(buf);
  if (eocd < 0) return undefined;
  const records = buf.readUInt16LE(eocd + 10);
  const cdSize = buf.readUInt32LE(eocd + 12);
  const cdOffset = buf.readUInt32LE(eocd + 16);
  if (records === 0xffff || cdSize === 0xffffffff || cdOffset === 0xffffffff) {
    throw new UnsafeArchiveError('zip64 archives are not supported');
  }
  let base = eocd - cdSize - cdOffset;
  if (base < 0) base = 0;
  let off = base + cdOffset;
  if (off < 0 || off >= buf.length) return undefined;
  const entries: ZipEntry[] = [];
  while (off + 46 <= buf.length && buf.readUInt32LE(off) === CDH_SIG) {
    const nameLen = buf.readUInt16LE(off + 28);
    const extraLen = buf.readUInt16LE(off + 30);
    const commentLen = buf.readUInt16LE(off + 32);
    const end = off + 46 + nameLen + extraLen + commentLen;
    if (end > buf.length) return undefined;
    entries.push({
      name: buf.toString('utf8', off + 46, off + 46 + nameLen),
      method: buf.readUInt16LE(off + 10),
      compressedSize: buf.readUInt32LE(off + 20),
      localOffset: base + buf.readUInt32LE(off + 42),
      externalAttrs: buf.readUInt32LE(off + 38),
      creatorOS: buf.readUInt8(off + 5),
    });
    off = end;
  }
  if ((entries.length & 0xffff) !== records) return undefined;
  return entries;
}

function zipEntryData(buf: Buffer, e: ZipEntry, budget: Budget): Buffer {
  const lfh = e.localOffset;
  if (lfh < 0 || lfh + 30 > buf.length || buf.readUInt32LE(lfh) !== LFH_SIG) {
    throw new FinalArchiveError('Opening zip file: zip: not a valid zip file');
  }
  const start = lfh + 30 + buf.readUInt16LE(lfh + 26) + buf.readUInt16LE(lfh + 28);
  const raw = buf.subarray(start, start + e.compressedSize);
  if (raw.length !== e.compressedSize) throw new FinalArchiveError('Opening zip file: unexpected EOF');
  const room = Math.max(0, budget.maxBytes - budget.bytes);
  if (e.method === 0) return raw;
  if (e.method === 8) {
    try {
      return inflateRawSync(raw, { maxOutputLength: room + 1 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE') {
        throw new UnsafeArchiveError(`archive content exceeds ${budget.maxBytes} bytes (at ${quote(e.name)})`, e.name);
      }
      throw new FinalArchiveError('Copying into dst file: flate: corrupt input');
    }
  }
  throw new FinalArchiveError('Opening zip file: zip: unsupported compression algorithm');
}

async function unpackZip(buf: Buffer, entries: ZipEntry[], destDir: string, budget: Budget): Promise<void> {
  // Check every name first: nothing is written for a refused archive.
  for (const e of entries) {
    budget.entry(e.name);
    const problem = entryNameProblem(e.name);
    if (problem) throw new UnsafeArchiveError(problem, e.name);
  }
  for (const e of entries) {
    if (e.name.endsWith('/')) continue;
    const data = zipEntryData(buf, e, budget);
    // A Unix symlink entry: vendir writes its target as a file's content; one that points
    // outside is refused like a tar symlink.
    if (e.creatorOS === 3 && ((e.externalAttrs >>> 16) & 0o170000) === 0o120000) {
      const problem = linkProblem(e.name, data.toString('utf8'), false);
      if (problem) throw new UnsafeArchiveError(problem, e.name);
    }
    await writeEntry(destDir, e.name, data, budget);
  }
}

// ---------------------------------------------------------------------------------------------
// tar (Go archive/tar reader rules: ustar/GNU/pax names, two zero blocks end it)

interface TarEntry {
  name: string;
  type: string;
  linkpath: string;
  data: Buffer;
}

/** Entries until the end or the first read error (`error`: Go's `Reading next tar header` case). */
function readTar(buf: Buffer): { entries: TarEntry[]; error?: string } {
  const entries: TarEntry[] = [];
  let off = 0;
  let longName: string | undefined;
  let longLink: string | undefined;
  let pax: Pax | undefined;
  const bad = (msg: string) => ({ entries, error: msg });
  while (true) {
    if (off + 512 > buf.length) return off === buf.length ? { entries } : bad('unexpected EOF');
    const block = buf.subarray(off, off + 512);
    if (block.every((b) => b === 0)) return { entries };
    const h = new Header(block);
    if (!h.cksumValid) return bad('archive/tar: invalid tar header');
    const size = h.size ?? 0;
    const dataStart = off + 512;
    const dataEnd = dataStart + size;
    if (size < 0 || dataEnd > buf.length) return bad('unexpected EOF');
    const data = buf.subarray(dataStart, dataEnd);
    off = dataStart + Math.ceil(size / 512) * 512;
    const type: string = h.type ?? 'Unsupported';
    if (type === 'NextFileHasLongPath' || type === 'OldGnuLongPath') {
      longName = data.toString('utf8').replace(/\0.*$/s, '');
      continue;
    }
    if (type === 'NextFileHasLongLinkpath') {
      longLink = data.toString('utf8').replace(/\0.*$/s, '');
      continue;
    }
    if (type === 'ExtendedHeader') {
      pax = Pax.parse(data.toString('utf8'), pax);
      continue;
    }
    let name = pax?.path ?? longName ?? h.path ?? '';
    const linkpath = pax?.linkpath ?? longLink ?? h.linkpath ?? '';
    // The header already reads a NUL type flag as a file, or a directory for a name ending in '/'.
    const kind = type === 'OldFile' ? 'File' : type;
    if (kind === 'GlobalExtendedHeader') name = h.path ?? name;
    entries.push({ name, type: kind, linkpath, data });
    longName = undefined;
    longLink = undefined;
    pax = undefined;
  }
}

/** Refuses what must never be accepted in a tar, whatever vendir would make of it. */
function checkTarEntries(entries: TarEntry[], budget: Budget): void {
  for (const e of entries) {
    budget.entry(e.name);
    if (e.type === 'GlobalExtendedHeader') continue;
    const problem = entryNameProblem(e.name);
    if (problem) throw new UnsafeArchiveError(problem, e.name);
    if (e.type === 'SymbolicLink' || e.type === 'Link') {
      const lp = linkProblem(e.name, e.linkpath, e.type === 'Link');
      if (lp) throw new UnsafeArchiveError(lp, e.name);
    } else if (e.type === 'CharacterDevice' || e.type === 'BlockDevice' || e.type === 'FIFO') {
      const what = e.type === 'FIFO' ? 'a FIFO' : e.type === 'BlockDevice' ? 'a block device' : 'a character device';
      throw new UnsafeArchiveError(`archive entry ${quote(e.name)} is ${what}`, e.name);
    }
  }
}

/** vendir's `tryTarWithGzip` after the reader is open. @returns whether the result is final. */
async function unpackTar(buf: Buffer, destDir: string, budget: Budget): Promise<boolean> {
  const { entries, error } = readTar(buf);
  checkTarEntries(entries, budget);
  let read = false;
  for (const e of entries) {
    read = true;
    if (e.type === 'Directory' || e.type === 'GlobalExtendedHeader') continue;
    if (e.type === 'File' || e.type === 'ContiguousFile') {
      await writeEntry(destDir, e.name, e.data, budget);
      continue;
    }
    // vendir: `Unknown file` → not this format; what was written stays.
    return false;
  }
  if (error) {
    if (read) throw new FinalArchiveError(`Reading next tar header: ${error}`);
    return false;
  }
  return true;
}

function isGzip(buf: Buffer): boolean {
  return buf.length >= 10 && buf[0] === 0x1f && buf[1] === 0x8b && buf[2] === 8;
}

/**
 * The plain-file name vendir uses: the last segment of the URL's (percent-decoded, not
 * dot-normalised) path, `content` when empty. Mirrors `tryPlain` (`url.Parse(u).Path`).
 */
export function plainFileName(url: string): string {
  const afterScheme = url.replace(/^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/, '');
  const rawPath = afterScheme.split(/[?#]/, 1)[0] ?? '';
  let path: string;
  try {
    path = decodeURIComponent(rawPath);
  } catch {
    path = rawPath;
  }
  const segs = path.split('/');
  return segs[segs.length - 1] || 'content';
}

/**
 * Unpacks a downloaded http source into `destDir` (which should be empty) as vendir v0.44
 * does, refusing anything that could write outside it.
 *
 * @param content - the downloaded bytes
 * @param destDir - absolute directory to write into (created if missing)
 * @param url - the source URL (names the file of a non-archive download)
 * @param limits - bounds on entries and bytes written
 * @throws {UnsafeArchiveError} for an entry name that is absolute or climbs out with `..`, a
 *   symlink or hard link whose target leaves the directory, a device or FIFO entry, or an
 *   archive past the limits; the message names the entry. Nothing is written outside
 *   `destDir` in any case (some files may be written inside it before the error).
 * @throws Error with vendir's text (`Reading next tar header: ...`, `Opening zip file: ...`)
 *   for a corrupt archive that vendir also fails on.
 */
export async function unpackHttpContent(
  content: Uint8Array,
  destDir: string,
  url: string,
  limits: UnpackLimits = {},
): Promise<UnpackedHttpContent> {
  const budget = new Budget(
    limits.maxBytes ?? DEFAULT_MAX_ARTIFACT_BYTES,
    limits.maxEntries ?? DEFAULT_MAX_ARTIFACT_ENTRIES,
  );
  const buf = Buffer.from(content.buffer, content.byteOffset, content.byteLength);
  await mkdir(destDir, { recursive: true, mode: 0o700 });
  const done = (format: UnpackedHttpContent['format']): UnpackedHttpContent => ({
    format,
    files: budget.files,
    bytes: budget.bytes,
  });

  const zip = readZipDirectory(buf);
  if (zip) {
    await unpackZip(buf, zip, destDir, budget);
    return done('zip');
  }
  if (isGzip(buf)) {
    let tar: Buffer | undefined;
    try {
      tar = gunzipSync(buf, { maxOutputLength: budget.maxBytes + 1024 * 1024 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE') {
        throw new UnsafeArchiveError(`archive content exceeds ${budget.maxBytes} bytes`);
      }
      tar = undefined;
    }
    if (tar && (await unpackTar(tar, destDir, budget))) return done('tgz');
  }
  if (await unpackTar(buf, destDir, budget)) return done('tar');
  const name = plainFileName(url);
  await writeEntry(destDir, name, buf, budget);
  return done('plain');
}

/** True for the errors of {@link unpackHttpContent} that vendir reports as its own. */
export function isVendirArchiveError(err: unknown): err is Error {
  return err instanceof FinalArchiveError;
}
