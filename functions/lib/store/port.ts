/**
 * The object store port: the only way the core reaches object storage (artifacts, render
 * cache, repository indexes, receipts). Adapters: {@link LocalDirStore} (embedded runtime),
 * `S3Store` (cloud and S3-compatible servers), `MemoryStore` (unit-test fake).
 *
 * Keys are `/`-separated relative paths over `[A-Za-z0-9._/-]`; see {@link validateKey}.
 *
 * @see fluxcd/pkg `artifact/storage` (atomic, content-addressed writes).
 */
import { createHash } from 'node:crypto';

/** Default cap on the size of one object read or written: 512 MiB. */
export const DEFAULT_MAX_OBJECT_BYTES = 512 * 1024 * 1024;
/** Default and maximum number of keys one {@link ObjectStore.list} call returns: 1000. */
export const DEFAULT_LIST_LIMIT = 1000;
/** Longest key, in bytes (S3's limit is 1024 including the adapter's prefix). */
export const MAX_KEY_LENGTH = 900;

/** Object body accepted by writes; strings are stored as UTF-8. */
export type ObjectBody = Buffer | Uint8Array | string;

/** Metadata returned by {@link ObjectStore.head}. */
export interface ObjectHead {
  /** Size in bytes. */
  readonly size: number;
  /** Last modification time, when the backend reports one. */
  readonly lastModified?: Date;
  /** Backend entity tag (S3 ETag, quotes included), when there is one. */
  readonly etag?: string;
}

/** Options of {@link ObjectStore.get}. */
export interface GetOptions {
  /** Largest body to read, in bytes; default: the adapter's `maxObjectBytes` (512 MiB unless configured). */
  readonly maxBytes?: number;
}

/** An object's body and its version, from {@link ObjectStore.getVersioned}. */
export interface VersionedObject {
  /** The body. */
  readonly body: Buffer;
  /**
   * Opaque version of this body, for {@link ObjectStore.putIfMatch}: the S3 ETag (quotes
   * included), or the quoted sha256 of the body for the local and memory stores.
   */
  readonly etag: string;
}

/** Outcome of {@link ObjectStore.putIfMatch}: written, or the object was not at the version expected. */
export type ConditionalPutResult = 'written' | 'conflict';

/** Options of {@link ObjectStore.list}. */
export interface ListOptions {
  /** Return at most this many keys (1..1000, default 1000). */
  readonly limit?: number;
  /** Return only keys sorted after this key (exclusive): pass the last key of a page to get the next. */
  readonly startAfter?: string;
}

/**
 * Object storage, as the core needs it. All methods reject (never throw synchronously):
 * {@link InvalidKeyError} for a bad key or prefix, {@link ObjectTooLargeError} past a size
 * limit, `RangeError` for a `list` limit outside 1..1000, and {@link StoreError} (with the
 * backend error as `cause`) for everything else.
 * Absent objects are not errors: `get`/`head` resolve `undefined`, `delete` succeeds.
 */
export interface ObjectStore {
  /**
   * Reads a whole object.
   * @returns the body, or `undefined` when there is no such key.
   * @throws ObjectTooLargeError when the object is larger than `opts.maxBytes`; the read
   *   stops at the limit.
   */
  get(key: string, opts?: GetOptions): Promise<Buffer | undefined>;
  /** Reads an object's metadata; `undefined` when there is no such key. */
  head(key: string): Promise<ObjectHead | undefined>;
  /**
   * Creates the object only if the key is absent (S3 `If-None-Match: *`). Readers never see a
   * partial body. Of concurrent creators exactly one gets `'created'`; the others get
   * `'exists'` and the object keeps the winner's body. Meant for content-addressed keys,
   * where every writer holds the same bytes.
   * @throws ObjectTooLargeError when the body is larger than the adapter's `maxObjectBytes`.
   */
  putIfAbsent(key: string, body: ObjectBody): Promise<'created' | 'exists'>;
  /**
   * Reads a whole object with its version (for a later {@link ObjectStore.putIfMatch}).
   * @returns the body and its `etag`, or `undefined` when there is no such key.
   * @throws ObjectTooLargeError as {@link ObjectStore.get}.
   */
  getVersioned(key: string, opts?: GetOptions): Promise<VersionedObject | undefined>;
  /**
   * Compare-and-swap: replaces the object only if its current version is `ifMatch` (an `etag`
   * of {@link ObjectStore.getVersioned}), or, with `ifMatch` `undefined`, creates it only if the
   * key is absent (S3 `If-Match` / `If-None-Match: *`). Of concurrent writers holding the same
   * version exactly one gets `'written'`; the others get `'conflict'` and should read again.
   * Meant for small mutable records shared by many writers (the fleet's source poll records).
   * @throws ObjectTooLargeError when the body is larger than the adapter's `maxObjectBytes`.
   */
  putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined): Promise<ConditionalPutResult>;
  /**
   * Creates or replaces the object atomically: readers see the old or the new body, never
   * a mix. Last writer wins.
   * @throws ObjectTooLargeError when the body is larger than the adapter's `maxObjectBytes`.
   */
  put(key: string, body: ObjectBody): Promise<void>;
  /**
   * Keys starting with `prefix` (`''` for all), sorted ascending by byte value, at most
   * `opts.limit` (default 1000) per call; page with `opts.startAfter`.
   * @throws InvalidKeyError when `prefix` has characters keys cannot have, or `..`.
   */
  list(prefix: string, opts?: ListOptions): Promise<string[]>;
  /** Deletes the object; deleting an absent key succeeds. */
  delete(key: string): Promise<void>;
}

/** Store operation names, as recorded on {@link StoreError}. */
export type StoreOp = 'get' | 'head' | 'putIfAbsent' | 'putIfMatch' | 'put' | 'list' | 'delete';

/**
 * A store operation failed. `op` and `key` (or the list prefix) say which; `cause` is the
 * backend's error. The message is a lowercase action, e.g. `failed to put object "a/b"`.
 */
export class StoreError extends Error {
  override readonly name: string = 'StoreError';
  constructor(
    message: string,
    readonly op: StoreOp,
    readonly key: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** A key or prefix broke the rules of {@link validateKey}. Never retryable. */
export class InvalidKeyError extends StoreError {
  override readonly name = 'InvalidKeyError';
}

/** An object is larger than the limit in force (`limit`, bytes). Never retryable. */
export class ObjectTooLargeError extends StoreError {
  override readonly name = 'ObjectTooLargeError';
  constructor(
    op: StoreOp,
    key: string,
    readonly limit: number,
    options?: ErrorOptions,
  ) {
    super(`object "${key}" exceeds ${limit} bytes`, op, key, options);
  }
}

/**
 * What `read` answers, or `undefined` (after `onTooLarge`, if given) when it throws
 * {@link ObjectTooLargeError} or the store answered 400 (an object no reader can read as asked:
 * one written under a customer-provided key, SSE-C). For a blob any run of the fleet may write
 * (`artifacts/fetch/…`, `artifacts/template/…`, fleet cache records), such an object was
 * planted, not a store that fails: it reads as absent, like one whose digest does not match. Any
 * other error (network, 5xx, throttling, a bad key) propagates.
 */
export async function absentIfUnreadable<T>(
  read: () => Promise<T | undefined>,
  onTooLarge?: () => void,
): Promise<T | undefined> {
  try {
    return await read();
  } catch (err) {
    const status = (err as { cause?: { $metadata?: { httpStatusCode?: number } } }).cause?.$metadata?.httpStatusCode;
    if (!(err instanceof ObjectTooLargeError) && !(err instanceof StoreError && status === 400)) throw err;
    onTooLarge?.();
    return undefined;
  }
}

const KEY_CHARS = /^[A-Za-z0-9._/-]*$/;

/**
 * Why `key` is not a valid object key, or `undefined` when it is. Valid keys are 1..900
 * bytes of `[A-Za-z0-9._/-]`, do not start or end with `/`, and have no empty, `.` or `..`
 * segment, so every key is also a safe relative file path.
 */
export function keyProblem(key: unknown): string | undefined {
  if (typeof key !== 'string') return 'key must be a string';
  if (key.length === 0) return 'key is empty';
  if (key.length > MAX_KEY_LENGTH) return `key is longer than ${MAX_KEY_LENGTH} characters`;
  if (!KEY_CHARS.test(key)) return 'key has characters outside [A-Za-z0-9._/-]';
  if (key.startsWith('/')) return 'key is absolute';
  for (const seg of key.split('/')) {
    if (seg === '') return 'key has an empty segment';
    if (seg === '.' || seg === '..') return 'key has a "." or ".." segment';
  }
  return undefined;
}

/**
 * Checks a key (see {@link keyProblem}).
 * @throws InvalidKeyError naming the problem.
 */
export function validateKey(key: string, op: StoreOp): void {
  const p = keyProblem(key);
  if (p) throw new InvalidKeyError(`invalid object key: ${p}`, op, String(key));
}

/**
 * Checks a list prefix: `''`, or a string of key characters without a leading `/`, `//`,
 * or a complete `.`/`..` segment (a trailing partial segment such as `artifacts/fe` is fine).
 * @throws InvalidKeyError naming the problem.
 */
export function validatePrefix(prefix: string): void {
  let p: string | undefined;
  if (typeof prefix !== 'string') p = 'prefix must be a string';
  else if (prefix.length > MAX_KEY_LENGTH) p = `prefix is longer than ${MAX_KEY_LENGTH} characters`;
  else if (!KEY_CHARS.test(prefix)) p = 'prefix has characters outside [A-Za-z0-9._/-]';
  else if (prefix.startsWith('/')) p = 'prefix is absolute';
  else {
    const segs = prefix.split('/');
    const complete = segs.slice(0, -1);
    if (complete.some((s) => s === '' || s === '.' || s === '..')) p = 'prefix has an empty, "." or ".." segment';
  }
  if (p) throw new InvalidKeyError(`invalid list prefix: ${p}`, 'list', String(prefix));
}

/**
 * Checks list options.
 * @returns the effective limit (1..1000).
 * @throws InvalidKeyError for a bad `startAfter`; RangeError for a bad `limit`.
 */
export function listLimit(opts: ListOptions | undefined): number {
  const limit = opts?.limit ?? DEFAULT_LIST_LIMIT;
  if (!Number.isInteger(limit) || limit < 1 || limit > DEFAULT_LIST_LIMIT) {
    throw new RangeError(`list limit must be an integer in 1..${DEFAULT_LIST_LIMIT}`);
  }
  if (opts?.startAfter !== undefined && !KEY_CHARS.test(opts.startAfter)) {
    throw new InvalidKeyError('invalid startAfter: characters outside [A-Za-z0-9._/-]', 'list', opts.startAfter);
  }
  return limit;
}

/** The body as a Buffer (no copy for Buffers; strings encoded as UTF-8). */
export function toBuffer(body: ObjectBody): Buffer {
  if (Buffer.isBuffer(body)) return body;
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/**
 * Sorts keys ascending by byte value. Keys are ASCII, so this is plain code-unit order.
 * Exported for adapters.
 */
export function sortKeys(keys: string[]): string[] {
  return keys.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/** The version tag the local and memory stores give a body: its quoted sha256. */
export function contentEtag(body: Buffer): string {
  return `"${createHash('sha256').update(body).digest('hex')}"`;
}

/** `body` with its {@link contentEtag} (the local and memory stores' `getVersioned`). */
export function withContentEtag(body: Buffer | undefined): VersionedObject | undefined {
  return body && { body, etag: contentEtag(body) };
}
