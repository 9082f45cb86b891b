/**
 * {@link ObjectStore} over a local directory: the embedded runtime's object storage.
 */
import { randomBytes } from 'node:crypto';
import { link, lstat, mkdir, open, readdir, rename, stat, unlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { DEFAULT_LOCK_STALE_MS, withFileLock } from './file-lock.js';
import {
  type ConditionalPutResult,
  contentEtag,
  DEFAULT_MAX_OBJECT_BYTES,
  type GetOptions,
  type ListOptions,
  listLimit,
  type ObjectBody,
  type ObjectHead,
  type ObjectStore,
  ObjectTooLargeError,
  StoreError,
  type StoreOp,
  sortKeys,
  toBuffer,
  type VersionedObject,
  validateKey,
  validatePrefix,
  withContentEtag,
} from './port.js';

/** Options of {@link LocalDirStore}. */
export interface LocalDirStoreOptions {
  /** Largest object read or written, in bytes. Default {@link DEFAULT_MAX_OBJECT_BYTES} (512 MiB). */
  readonly maxObjectBytes?: number;
  /** fsync each file before it becomes visible (durable across power loss). Default true. */
  readonly fsync?: boolean;
  /**
   * Age after which the lock file of a `putIfMatch` whose writer stopped refreshing it (a dead
   * process) is broken, ms. Default {@link DEFAULT_LOCK_STALE_MS} (15 s).
   */
  readonly lockStaleMs?: number;
}

/**
 * Temp files carry `~`, which keys cannot contain, so they never collide with a key and
 * {@link LocalDirStore.list} skips them.
 */
const TEMP_MARK = '.~tmp-';
/** Suffix of the lock file of {@link LocalDirStore.putIfMatch} (has `~`, like temp files). */
const LOCK_MARK = '.~lock';

/**
 * The conditional puts of this process in flight on each target path (any store instance): how
 * many, and the version the last of their writes left. A writer whose version was replaced by
 * one of them while it waited answers 'conflict' without taking the lock (a valid answer: the
 * object was at another version during its call). Dropped when none is in flight.
 */
const inFlight = new Map<string, { calls: number; writes: number; etag?: string }>();

function code(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

/**
 * Stores each object as the file `<rootDir>/<key>`.
 *
 * - Writes go to a temp file in the target's directory (same file system), are fsync'ed,
 *   then appear atomically: `put` renames over the key, `putIfAbsent` hard-links the temp
 *   file to the key, which fails with `EEXIST` for all but one of concurrent creators.
 * - Keys are validated (no `..`, not absolute, `[A-Za-z0-9._/-]` only) so no key leaves
 *   `rootDir`. A key cannot also be a "directory" of other keys (`a` and `a/b` cannot
 *   coexist, unlike S3); that write fails with a {@link StoreError}.
 * - `rootDir` is created on the first write; a missing root lists as empty.
 * - `putIfMatch` answers `'conflict'` at once when the current body already differs from
 *   `ifMatch`; otherwise it holds the lock `<key>.~lock` ({@link withFileLock}: writers of this
 *   process queue in order, other processes' writers wait on the lock file, which its holder
 *   keeps fresh and a dead writer's goes stale) while it compares again and renames the new body
 *   in. It waits for the lock as long as a live writer holds it, so it only ever answers
 *   `'written'` or `'conflict'`, or throws for a filesystem error. Versions are content
 *   hashes, so a rewrite of the same bytes keeps its version (harmless for the records this
 *   serves: the same content).
 * - Directories emptied by `delete` are left in place (removing them would race with writers).
 *
 * Errors: see {@link ObjectStore}; filesystem errors are wrapped in {@link StoreError} with the
 * original error as `cause`.
 */
export class LocalDirStore implements ObjectStore {
  private readonly maxObjectBytes: number;
  private readonly fsync: boolean;
  private readonly lockStaleMs: number;

  /**
   * @param rootDir directory holding the objects (absolute path recommended).
   */
  constructor(
    readonly rootDir: string,
    opts: LocalDirStoreOptions = {},
  ) {
    this.maxObjectBytes = opts.maxObjectBytes ?? DEFAULT_MAX_OBJECT_BYTES;
    this.fsync = opts.fsync ?? true;
    this.lockStaleMs = opts.lockStaleMs ?? DEFAULT_LOCK_STALE_MS;
  }

  private pathOf(key: string): string {
    return join(this.rootDir, ...key.split('/'));
  }

  /** {@inheritDoc ObjectStore.get} */
  async get(key: string, opts: GetOptions = {}): Promise<Buffer | undefined> {
    validateKey(key, 'get');
    const max = opts.maxBytes ?? this.maxObjectBytes;
    let fh: Awaited<ReturnType<typeof open>>;
    try {
      fh = await open(this.pathOf(key), 'r');
    } catch (e) {
      if (code(e) === 'ENOENT' || code(e) === 'ENOTDIR' || code(e) === 'EISDIR') return undefined;
      throw new StoreError(`failed to get object "${key}"`, 'get', key, { cause: e });
    }
    try {
      const st = await fh.stat();
      if (!st.isFile()) return undefined;
      // Objects are replaced by rename, never modified in place, so the open file's size holds.
      if (st.size > max) throw new ObjectTooLargeError('get', key, max);
      const buf = Buffer.allocUnsafe(st.size);
      let off = 0;
      while (off < st.size) {
        const { bytesRead } = await fh.read(buf, off, st.size - off, off);
        if (bytesRead === 0) break;
        off += bytesRead;
      }
      return off === st.size ? buf : buf.subarray(0, off);
    } catch (e) {
      if (e instanceof StoreError) throw e;
      throw new StoreError(`failed to get object "${key}"`, 'get', key, { cause: e });
    } finally {
      await fh.close().catch(() => undefined);
    }
  }

  /** {@inheritDoc ObjectStore.head} */
  async head(key: string): Promise<ObjectHead | undefined> {
    validateKey(key, 'head');
    try {
      const st = await stat(this.pathOf(key));
      if (!st.isFile()) return undefined;
      return { size: st.size, lastModified: st.mtime };
    } catch (e) {
      if (code(e) === 'ENOENT' || code(e) === 'ENOTDIR') return undefined;
      throw new StoreError(`failed to head object "${key}"`, 'head', key, { cause: e });
    }
  }

  /** {@inheritDoc ObjectStore.putIfAbsent} */
  async putIfAbsent(key: string, body: ObjectBody): Promise<'created' | 'exists'> {
    validateKey(key, 'putIfAbsent');
    const buf = this.checkSize('putIfAbsent', key, body);
    const target = this.pathOf(key);
    try {
      // Cheap early answer for the common "already stored" case; link() below is the real test.
      if ((await lstat(target).catch(() => undefined))?.isFile()) return 'exists';
      const tmp = await this.writeTemp(target, buf);
      try {
        await link(tmp, target);
        return 'created';
      } catch (e) {
        if (code(e) === 'EEXIST') return 'exists';
        throw e;
      } finally {
        await unlink(tmp).catch(() => undefined);
      }
    } catch (e) {
      throw new StoreError(`failed to create object "${key}"`, 'putIfAbsent', key, { cause: e });
    }
  }

  /** {@inheritDoc ObjectStore.getVersioned} */
  async getVersioned(key: string, opts: GetOptions = {}): Promise<VersionedObject | undefined> {
    return withContentEtag(await this.get(key, opts));
  }

  /** {@inheritDoc ObjectStore.putIfMatch} */
  async putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined): Promise<ConditionalPutResult> {
    validateKey(key, 'putIfMatch');
    const buf = this.checkSize('putIfMatch', key, body);
    const target = this.pathOf(key);
    const stale = (cur: Buffer | undefined) =>
      ifMatch === undefined ? cur !== undefined : !cur || contentEtag(cur) !== ifMatch;
    const at = resolve(target);
    const mine = inFlight.get(at) ?? { calls: 0, writes: 0 };
    inFlight.set(at, mine);
    mine.calls += 1;
    const writesBefore = mine.writes;
    try {
      // A writer that already lost needs no lock (most of them, when many update one record).
      if (stale(await this.get(key))) return 'conflict';
      await mkdir(dirname(target), { recursive: true, mode: 0o700 });
      return await withFileLock<ConditionalPutResult>(
        `${target}${LOCK_MARK}`,
        async () => {
          if (stale(await this.get(key))) return 'conflict';
          await this.replace(target, buf);
          mine.writes += 1;
          mine.etag = contentEtag(buf);
          return 'written';
        },
        {
          staleMs: this.lockStaleMs,
          skip: () => (mine.writes !== writesBefore && mine.etag !== ifMatch ? 'conflict' : undefined),
        },
      );
    } catch (e) {
      if (e instanceof ObjectTooLargeError) throw e;
      throw new StoreError(`failed to put object "${key}" conditionally`, 'putIfMatch', key, { cause: e });
    } finally {
      mine.calls -= 1;
      if (mine.calls === 0) inFlight.delete(at);
    }
  }

  /** {@inheritDoc ObjectStore.put} */
  async put(key: string, body: ObjectBody): Promise<void> {
    validateKey(key, 'put');
    const buf = this.checkSize('put', key, body);
    try {
      await this.replace(this.pathOf(key), buf);
    } catch (e) {
      throw new StoreError(`failed to put object "${key}"`, 'put', key, { cause: e });
    }
  }

  /** {@inheritDoc ObjectStore.list} */
  async list(prefix: string, opts?: ListOptions): Promise<string[]> {
    validatePrefix(prefix);
    const limit = listLimit(opts);
    const slash = prefix.lastIndexOf('/');
    const baseKey = slash >= 0 ? prefix.slice(0, slash) : '';
    const keys: string[] = [];
    const walk = async (dirKey: string): Promise<void> => {
      let names: string[];
      try {
        names = await readdir(dirKey ? this.pathOf(dirKey) : this.rootDir);
      } catch (e) {
        if (code(e) === 'ENOENT' || code(e) === 'ENOTDIR') return;
        throw e;
      }
      for (const name of names) {
        if (name.includes('~')) continue;
        const key = dirKey ? `${dirKey}/${name}` : name;
        // Descend only where keys with the prefix can be.
        if (!key.startsWith(prefix) && !prefix.startsWith(`${key}/`)) continue;
        const st = await lstat(this.pathOf(key)).catch(() => undefined);
        if (st?.isDirectory()) await walk(key);
        else if (st?.isFile() && key.startsWith(prefix)) keys.push(key);
      }
    };
    try {
      await walk(baseKey);
    } catch (e) {
      throw new StoreError(`failed to list objects under "${prefix}"`, 'list', prefix, { cause: e });
    }
    const after = opts?.startAfter;
    return sortKeys(keys)
      .filter((k) => after === undefined || k > after)
      .slice(0, limit);
  }

  /** {@inheritDoc ObjectStore.delete} */
  async delete(key: string): Promise<void> {
    validateKey(key, 'delete');
    try {
      await unlink(this.pathOf(key));
    } catch (e) {
      if (code(e) === 'ENOENT' || code(e) === 'ENOTDIR') return;
      throw new StoreError(`failed to delete object "${key}"`, 'delete', key, { cause: e });
    }
  }

  private checkSize(op: StoreOp, key: string, body: ObjectBody): Buffer {
    const buf = toBuffer(body);
    if (buf.length > this.maxObjectBytes) throw new ObjectTooLargeError(op, key, this.maxObjectBytes);
    return buf;
  }

  /** Replaces the file `target` with `buf` atomically (a temp file renamed over it). */
  private async replace(target: string, buf: Buffer): Promise<void> {
    const tmp = await this.writeTemp(target, buf);
    try {
      await rename(tmp, target);
    } catch (e) {
      await unlink(tmp).catch(() => undefined);
      throw e;
    }
  }

  /** Writes `buf` to a fresh temp file next to `target` (creating parents) and returns its path. */
  private async writeTemp(target: string, buf: Buffer): Promise<string> {
    const dir = dirname(target);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const tmp = join(dir, `${TEMP_MARK}${randomBytes(8).toString('hex')}`);
    // Artifacts may hold rendered Secrets: readable by the runtime's user only.
    const fh = await open(tmp, 'wx', 0o600);
    try {
      await fh.writeFile(buf);
      if (this.fsync) await fh.sync();
    } catch (e) {
      await fh.close().catch(() => undefined);
      await unlink(tmp).catch(() => undefined);
      throw e;
    }
    await fh.close();
    return tmp;
  }
}
