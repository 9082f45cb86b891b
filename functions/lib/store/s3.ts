/**
 * {@link ObjectStore} over S3 or any S3-compatible server (versitygw in tests).
 */
import type { GetObjectCommandOutput, S3Client } from '@aws-sdk/client-s3';
import {
  type ConditionalPutResult,
  DEFAULT_MAX_OBJECT_BYTES,
  type GetOptions,
  keyProblem,
  type ListOptions,
  listLimit,
  type ObjectBody,
  type ObjectHead,
  type ObjectStore,
  ObjectTooLargeError,
  StoreError,
  type StoreOp,
  toBuffer,
  type VersionedObject,
  validateKey,
  validatePrefix,
} from './port.js';

/** Options of {@link S3Store}. */
export interface S3StoreOptions {
  /**
   * The S3 client, created once per process by the entry file (region, credentials,
   * endpoint and `forcePathStyle` for S3-compatible servers are its business).
   */
  readonly client: Pick<S3Client, 'send'>;
  /** Bucket name. */
  readonly bucket: string;
  /**
   * Key prefix inside the bucket, e.g. `kapp-lambda/`; a missing trailing `/` is added.
   * Default `''` (keys at the bucket root). Must itself be a valid key.
   */
  readonly prefix?: string;
  /** Largest object read or written, in bytes. Default {@link DEFAULT_MAX_OBJECT_BYTES} (512 MiB). */
  readonly maxObjectBytes?: number;
  /**
   * Keys (without the prefix) whose 403 `AccessDenied` on `get`, `getVersioned` and `head` means
   * absent. S3 answers a read of a missing key with 403 to a principal that may not list it; a
   * dispatched stage's run session may read, not list, the shared blobs (`sessionReadsKey`,
   * `infra/aws/run-policy.ts`). Default none: a denial is an error.
   */
  readonly absentWhenDenied?: (key: string) => boolean;
}

let sdkModule: Promise<typeof import('@aws-sdk/client-s3')> | undefined;

/**
 * The S3 SDK's command classes, loaded on the first call (not when this module is imported): a
 * Lambda function's cold start does not pay for the SDK it may not use on its first call.
 */
function sdk(): Promise<typeof import('@aws-sdk/client-s3')> {
  sdkModule ??= import('@aws-sdk/client-s3');
  return sdkModule;
}

interface SdkError {
  name?: string;
  $metadata?: { httpStatusCode?: number };
}

function status(e: unknown): number | undefined {
  return (e as SdkError | undefined)?.$metadata?.httpStatusCode;
}

function errName(e: unknown): string | undefined {
  return (e as SdkError | undefined)?.name;
}

function isNotFound(e: unknown): boolean {
  const n = errName(e);
  return n === 'NoSuchKey' || n === 'NotFound' || status(e) === 404;
}

/**
 * A 403 that can mean a missing key (S3's answer to a reader that may not list it); not one
 * naming KMS (the object is there, its key's use was refused: a grant to fix, not a miss).
 */
function isDenied(e: unknown): boolean {
  if (errName(e) !== 'AccessDenied' && status(e) !== 403) return false;
  return !/\bkms\b/i.test((e as Error | undefined)?.message ?? '');
}

/**
 * Stores each object as `<prefix><key>` in one bucket.
 *
 * - `putIfAbsent` is `PutObject` with `If-None-Match: *`: `412 PreconditionFailed` (the key
 *   exists) and `409 ConditionalRequestConflict` (a concurrent conditional write to the key
 *   is in flight; for content-addressed keys it carries the same bytes) both mean `'exists'`.
 * - `putIfMatch` is `PutObject` with `If-Match: <etag>` (or `If-None-Match: *` to create):
 *   `412`, `409` and a `404` (the object went away) are `'conflict'`.
 * - `get` streams the body and stops at the size limit (checking `Content-Length` first),
 *   aborting the request, so an oversized object is never read whole.
 * - `list` pages through `ListObjectsV2` until it has `limit` keys.
 *
 * Errors: see {@link ObjectStore}; SDK errors are wrapped in {@link StoreError} with the SDK
 * error as `cause` (its `$metadata.httpStatusCode` and `name` say what happened).
 */
export class S3Store implements ObjectStore {
  private readonly client: Pick<S3Client, 'send'>;
  /** Bucket name. */
  readonly bucket: string;
  /** Normalized key prefix (`''` or ending in `/`). */
  readonly prefix: string;
  private readonly maxObjectBytes: number;
  private readonly absentWhenDenied: (key: string) => boolean;

  /**
   * @throws InvalidKeyError when `opts.prefix` is not a valid key.
   */
  constructor(opts: S3StoreOptions) {
    this.client = opts.client;
    this.bucket = opts.bucket;
    let prefix = opts.prefix ?? '';
    if (prefix !== '') {
      const bare = prefix.endsWith('/') ? prefix.slice(0, -1) : prefix;
      validateKey(bare, 'list');
      prefix = `${bare}/`;
    }
    this.prefix = prefix;
    this.maxObjectBytes = opts.maxObjectBytes ?? DEFAULT_MAX_OBJECT_BYTES;
    this.absentWhenDenied = opts.absentWhenDenied ?? (() => false);
  }

  /** Whether a read's SDK error means the key is absent (`S3StoreOptions.absentWhenDenied`). */
  private absent(key: string, e: unknown): boolean {
    return isNotFound(e) || (isDenied(e) && this.absentWhenDenied(key));
  }

  private full(key: string): string {
    return this.prefix + key;
  }

  /** {@inheritDoc ObjectStore.get} */
  async get(key: string, opts: GetOptions = {}): Promise<Buffer | undefined> {
    return (await this.getVersioned(key, opts))?.body;
  }

  /** {@inheritDoc ObjectStore.getVersioned} */
  async getVersioned(key: string, opts: GetOptions = {}): Promise<VersionedObject | undefined> {
    validateKey(key, 'get');
    const max = opts.maxBytes ?? this.maxObjectBytes;
    const abort = new AbortController();
    try {
      let res: GetObjectCommandOutput;
      try {
        res = await this.client.send(new (await sdk()).GetObjectCommand({ Bucket: this.bucket, Key: this.full(key) }), {
          abortSignal: abort.signal,
        });
      } catch (e) {
        if (this.absent(key, e)) return undefined;
        throw e;
      }
      const body = res.Body as (AsyncIterable<Uint8Array> & { destroy?: () => void }) | undefined;
      if (res.ContentLength !== undefined && res.ContentLength > max) {
        body?.destroy?.();
        abort.abort();
        throw new ObjectTooLargeError('get', key, max);
      }
      const etag = res.ETag ?? '';
      if (!body) return { body: Buffer.alloc(0), etag };
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of body) {
        size += chunk.byteLength;
        if (size > max) {
          body.destroy?.();
          abort.abort();
          throw new ObjectTooLargeError('get', key, max);
        }
        chunks.push(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
      }
      return { body: Buffer.concat(chunks, size), etag };
    } catch (e) {
      if (e instanceof StoreError) throw e;
      throw new StoreError(`failed to get object "${key}"`, 'get', key, { cause: e });
    }
  }

  /** {@inheritDoc ObjectStore.head} */
  async head(key: string): Promise<ObjectHead | undefined> {
    validateKey(key, 'head');
    try {
      const res = await this.client.send(
        new (await sdk()).HeadObjectCommand({ Bucket: this.bucket, Key: this.full(key) }),
      );
      return {
        size: res.ContentLength ?? 0,
        ...(res.LastModified ? { lastModified: res.LastModified } : {}),
        ...(res.ETag ? { etag: res.ETag } : {}),
      };
    } catch (e) {
      if (this.absent(key, e)) return undefined;
      throw new StoreError(`failed to head object "${key}"`, 'head', key, { cause: e });
    }
  }

  /** {@inheritDoc ObjectStore.putIfAbsent} */
  async putIfAbsent(key: string, body: ObjectBody): Promise<'created' | 'exists'> {
    validateKey(key, 'putIfAbsent');
    const buf = this.checkSize('putIfAbsent', key, body);
    return (await this.conditionalPut('putIfAbsent', key, buf, { IfNoneMatch: '*' })) ? 'created' : 'exists';
  }

  /** {@inheritDoc ObjectStore.putIfMatch} */
  async putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined): Promise<ConditionalPutResult> {
    validateKey(key, 'putIfMatch');
    const buf = this.checkSize('putIfMatch', key, body);
    const condition = ifMatch === undefined ? { IfNoneMatch: '*' } : { IfMatch: ifMatch };
    return (await this.conditionalPut('putIfMatch', key, buf, condition)) ? 'written' : 'conflict';
  }

  /**
   * `PutObject` under a precondition: `true` when written, `false` when the precondition failed
   * (`412`, a concurrent conditional write `409`, or a `404` for `If-Match` on a missing key).
   */
  private async conditionalPut(
    op: StoreOp,
    key: string,
    buf: Buffer,
    condition: { IfNoneMatch: string } | { IfMatch: string },
  ): Promise<boolean> {
    try {
      await this.client.send(
        new (await sdk()).PutObjectCommand({
          Bucket: this.bucket,
          Key: this.full(key),
          Body: buf,
          ContentLength: buf.length,
          ...condition,
        }),
      );
      return true;
    } catch (e) {
      const n = errName(e);
      const s = status(e);
      if (n === 'PreconditionFailed' || n === 'ConditionalRequestConflict' || s === 412 || s === 409) return false;
      if ('IfMatch' in condition && isNotFound(e)) return false;
      const what = op === 'putIfAbsent' ? 'create object' : 'put object';
      throw new StoreError(`failed to ${what} "${key}"${op === 'putIfAbsent' ? '' : ' conditionally'}`, op, key, {
        cause: e,
      });
    }
  }

  /** {@inheritDoc ObjectStore.put} */
  async put(key: string, body: ObjectBody): Promise<void> {
    validateKey(key, 'put');
    const buf = this.checkSize('put', key, body);
    try {
      await this.client.send(
        new (await sdk()).PutObjectCommand({
          Bucket: this.bucket,
          Key: this.full(key),
          Body: buf,
          ContentLength: buf.length,
        }),
      );
    } catch (e) {
      throw new StoreError(`failed to put object "${key}"`, 'put', key, { cause: e });
    }
  }

  /** {@inheritDoc ObjectStore.list} */
  async list(prefix: string, opts?: ListOptions): Promise<string[]> {
    validatePrefix(prefix);
    const limit = listLimit(opts);
    const keys: string[] = [];
    let token: string | undefined;
    try {
      do {
        const res = await this.client.send(
          new (await sdk()).ListObjectsV2Command({
            Bucket: this.bucket,
            Prefix: this.full(prefix),
            MaxKeys: limit - keys.length,
            ...(token
              ? { ContinuationToken: token }
              : opts?.startAfter !== undefined
                ? { StartAfter: this.full(opts.startAfter) }
                : {}),
          }),
        );
        for (const o of res.Contents ?? []) {
          // A key this store could not have written (characters outside its rules) is left out:
          // no caller could read it, and as a page's last key it would refuse the next `startAfter`.
          const rel = o.Key?.startsWith(this.prefix) ? o.Key.slice(this.prefix.length) : undefined;
          if (rel !== undefined && keyProblem(rel) === undefined) keys.push(rel);
        }
        token = res.IsTruncated ? res.NextContinuationToken : undefined;
      } while (token && keys.length < limit);
    } catch (e) {
      throw new StoreError(`failed to list objects under "${prefix}"`, 'list', prefix, { cause: e });
    }
    return keys.slice(0, limit);
  }

  /** {@inheritDoc ObjectStore.delete} */
  async delete(key: string): Promise<void> {
    validateKey(key, 'delete');
    try {
      await this.client.send(new (await sdk()).DeleteObjectCommand({ Bucket: this.bucket, Key: this.full(key) }));
    } catch (e) {
      if (isNotFound(e)) return;
      throw new StoreError(`failed to delete object "${key}"`, 'delete', key, { cause: e });
    }
  }

  private checkSize(op: StoreOp, key: string, body: ObjectBody): Buffer {
    const buf = toBuffer(body);
    if (buf.length > this.maxObjectBytes) throw new ObjectTooLargeError(op, key, this.maxObjectBytes);
    return buf;
  }
}
