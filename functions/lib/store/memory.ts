/**
 * In-memory {@link ObjectStore}: the fake for unit tests at the object-store port. Same key
 * rules, size limits, conditional-create and list semantics as the real adapters.
 */
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
  type StoreOp,
  sortKeys,
  toBuffer,
  type VersionedObject,
  validateKey,
  validatePrefix,
  withContentEtag,
} from './port.js';

/** Options of {@link MemoryStore}. */
export interface MemoryStoreOptions {
  /** Largest object read or written, in bytes. Default {@link DEFAULT_MAX_OBJECT_BYTES} (512 MiB). */
  readonly maxObjectBytes?: number;
  /** Clock for `lastModified` (the core reads no clock itself). Default: `() => new Date(0)`. */
  readonly now?: () => Date;
}

/**
 * Keeps objects in a Map (copies in and out, so callers cannot mutate stored bytes).
 * `writes` counts successful `put`/`putIfAbsent` creations so tests can assert no-ops.
 */
export class MemoryStore implements ObjectStore {
  private readonly objects = new Map<string, { body: Buffer; lastModified: Date }>();
  private readonly maxObjectBytes: number;
  private readonly now: () => Date;
  /** Number of objects written (created or replaced) so far. */
  writes = 0;

  /** @param opts size limit and clock; see {@link MemoryStoreOptions}. */
  constructor(opts: MemoryStoreOptions = {}) {
    this.maxObjectBytes = opts.maxObjectBytes ?? DEFAULT_MAX_OBJECT_BYTES;
    this.now = opts.now ?? (() => new Date(0));
  }

  /** {@inheritDoc ObjectStore.get} */
  async get(key: string, opts: GetOptions = {}): Promise<Buffer | undefined> {
    validateKey(key, 'get');
    const o = this.objects.get(key);
    if (!o) return undefined;
    const max = opts.maxBytes ?? this.maxObjectBytes;
    if (o.body.length > max) throw new ObjectTooLargeError('get', key, max);
    return Buffer.from(o.body);
  }

  /** {@inheritDoc ObjectStore.head} */
  async head(key: string): Promise<ObjectHead | undefined> {
    validateKey(key, 'head');
    const o = this.objects.get(key);
    return o ? { size: o.body.length, lastModified: o.lastModified } : undefined;
  }

  /** {@inheritDoc ObjectStore.putIfAbsent} */
  async putIfAbsent(key: string, body: ObjectBody): Promise<'created' | 'exists'> {
    validateKey(key, 'putIfAbsent');
    const buf = this.checkSize('putIfAbsent', key, body);
    if (this.objects.has(key)) return 'exists';
    this.store(key, buf);
    return 'created';
  }

  /** {@inheritDoc ObjectStore.getVersioned} */
  async getVersioned(key: string, opts: GetOptions = {}): Promise<VersionedObject | undefined> {
    return withContentEtag(await this.get(key, opts));
  }

  /** {@inheritDoc ObjectStore.putIfMatch} */
  async putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined): Promise<ConditionalPutResult> {
    validateKey(key, 'putIfMatch');
    const buf = this.checkSize('putIfMatch', key, body);
    const cur = this.objects.get(key);
    if (ifMatch === undefined ? cur !== undefined : !cur || contentEtag(cur.body) !== ifMatch) return 'conflict';
    this.store(key, buf);
    return 'written';
  }

  /** {@inheritDoc ObjectStore.put} */
  async put(key: string, body: ObjectBody): Promise<void> {
    validateKey(key, 'put');
    this.store(key, this.checkSize('put', key, body));
  }

  /** {@inheritDoc ObjectStore.list} */
  async list(prefix: string, opts?: ListOptions): Promise<string[]> {
    validatePrefix(prefix);
    const limit = listLimit(opts);
    const after = opts?.startAfter;
    return sortKeys([...this.objects.keys()].filter((k) => k.startsWith(prefix)))
      .filter((k) => after === undefined || k > after)
      .slice(0, limit);
  }

  /** {@inheritDoc ObjectStore.delete} */
  async delete(key: string): Promise<void> {
    validateKey(key, 'delete');
    this.objects.delete(key);
  }

  private store(key: string, buf: Buffer): void {
    this.objects.set(key, { body: Buffer.from(buf), lastModified: this.now() });
    this.writes += 1;
  }

  private checkSize(op: StoreOp, key: string, body: ObjectBody): Buffer {
    const buf = toBuffer(body);
    if (buf.length > this.maxObjectBytes) throw new ObjectTooLargeError(op, key, this.maxObjectBytes);
    return buf;
  }
}
