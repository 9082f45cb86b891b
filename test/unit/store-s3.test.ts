/**
 * S3Store request shapes and error mapping, with a fake S3 client (the SDK boundary).
 * The real-server behaviour is covered by test/integration/s3-store.test.ts.
 */
import {
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  type S3Client,
} from '@aws-sdk/client-s3';
import { describe, expect, it } from 'vitest';
import { ObjectTooLargeError, S3Store, StoreError } from '../../functions/lib/store/index.js';

type Sent = { command: string; input: Record<string, unknown>; aborted: () => boolean };
type Responder = (command: string, input: Record<string, unknown>) => unknown;

function sdkError(name: string, status: number): Error {
  return Object.assign(new Error(name), { name, $metadata: { httpStatusCode: status } });
}

function fakeClient(respond: Responder): { client: S3Client; sent: Sent[] } {
  const sent: Sent[] = [];
  const client = {
    async send(cmd: { input: Record<string, unknown> }, opts?: { abortSignal?: AbortSignal }) {
      const command = cmd.constructor.name;
      sent.push({ command, input: cmd.input, aborted: () => opts?.abortSignal?.aborted ?? false });
      const r = respond(command, cmd.input);
      if (r instanceof Error) throw r;
      return r;
    },
  } as unknown as S3Client;
  return { client, sent };
}

async function rejection(p: Promise<unknown>): Promise<Error> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: Error) => e,
  );
}

/** A body stream that counts how many chunks were pulled. */
function chunks(n: number, size: number) {
  const state = { pulled: 0, destroyed: false };
  const body = {
    async *[Symbol.asyncIterator]() {
      for (let i = 0; i < n; i++) {
        state.pulled++;
        yield new Uint8Array(size).fill(i);
      }
    },
    destroy() {
      state.destroyed = true;
    },
  };
  return { body, state };
}

describe('S3Store requests', () => {
  it('putIfAbsent sends PutObject with If-None-Match: * under the prefix', async () => {
    const { client, sent } = fakeClient(() => ({}));
    const store = new S3Store({ client, bucket: 'bkt', prefix: 'pre' });
    expect(await store.putIfAbsent('a/b', 'xyz')).toBe('created');
    expect(sent.map((s) => [s.command, s.input])).toEqual([
      [
        PutObjectCommand.name,
        { Bucket: 'bkt', Key: 'pre/a/b', Body: Buffer.from('xyz'), ContentLength: 3, IfNoneMatch: '*' },
      ],
    ]);
  });

  it.each([
    ['412 PreconditionFailed', sdkError('PreconditionFailed', 412)],
    ['409 ConditionalRequestConflict', sdkError('ConditionalRequestConflict', 409)],
  ])('putIfAbsent maps %s to exists', async (_name, err) => {
    const { client } = fakeClient(() => err);
    expect(await new S3Store({ client, bucket: 'bkt' }).putIfAbsent('k', 'x')).toBe('exists');
  });

  it('put sends an unconditional PutObject', async () => {
    const { client, sent } = fakeClient(() => ({}));
    await new S3Store({ client, bucket: 'bkt' }).put('k', Buffer.from([1, 2]));
    expect(sent[0]?.input).toEqual({ Bucket: 'bkt', Key: 'k', Body: Buffer.from([1, 2]), ContentLength: 2 });
  });

  it('wraps other errors with op, key and cause', async () => {
    const cause = sdkError('AccessDenied', 403);
    const { client } = fakeClient(() => cause);
    const store = new S3Store({ client, bucket: 'bkt' });
    for (const [call, message, op] of [
      [() => store.putIfAbsent('k', 'x'), 'failed to create object "k"', 'putIfAbsent'],
      [() => store.put('k', 'x'), 'failed to put object "k"', 'put'],
      [() => store.get('k'), 'failed to get object "k"', 'get'],
      [() => store.head('k'), 'failed to head object "k"', 'head'],
      [() => store.delete('k'), 'failed to delete object "k"', 'delete'],
      [() => store.list('p/'), 'failed to list objects under "p/"', 'list'],
    ] as const) {
      const e = await rejection(call());
      expect(e).toBeInstanceOf(StoreError);
      expect([e.message, (e as StoreError).op, e.cause]).toEqual([message, op, cause]);
    }
  });

  it('maps not-found to undefined for get and head, and to success for delete', async () => {
    const { client } = fakeClient((cmd) =>
      cmd === HeadObjectCommand.name ? sdkError('NotFound', 404) : sdkError('NoSuchKey', 404),
    );
    const store = new S3Store({ client, bucket: 'bkt' });
    expect(await store.get('k')).toBeUndefined();
    expect(await store.head('k')).toBeUndefined();
    await store.delete('k');
  });

  it('reads a 403 as absent only for the keys absentWhenDenied names (a session that may read, not list, them)', async () => {
    const denied = sdkError('AccessDenied', 403);
    const { client, sent } = fakeClient(() => denied);
    const store = new S3Store({ client, bucket: 'b', absentWhenDenied: (key) => key.startsWith('artifacts/') });
    expect(await store.get('artifacts/fetch/sha256/x.tgz')).toBeUndefined();
    expect(await store.getVersioned('artifacts/fetch/sha256/x.tgz')).toBeUndefined();
    expect(await store.head('artifacts/template/sha256/y.yaml')).toBeUndefined();
    expect(sent.map((s) => s.command)).toEqual(['GetObjectCommand', 'GetObjectCommand', 'HeadObjectCommand']);
    // Any other key: a denial stays an error, as without the option.
    for (const read of [() => store.get('private/t/x'), () => store.head('state/shares/x')]) {
      const err = await rejection(read());
      expect(err).toBeInstanceOf(StoreError);
      expect((err as StoreError).cause).toBe(denied);
    }
    // A denial of the key's KMS use is not a miss: the object is there.
    const kms = Object.assign(
      new Error('User: arn:aws:sts::1:assumed-role/r/a is not authorized to perform: kms:Decrypt'),
      { name: 'AccessDenied', $metadata: { httpStatusCode: 403 } },
    );
    const kmsStore = new S3Store({ client: fakeClient(() => kms).client, bucket: 'b', absentWhenDenied: () => true });
    expect(await rejection(kmsStore.get('artifacts/fetch/sha256/x.tgz'))).toBeInstanceOf(StoreError);
    const plain = new S3Store({ client, bucket: 'b' });
    expect(await rejection(plain.get('artifacts/fetch/sha256/x.tgz'))).toBeInstanceOf(StoreError);
  });

  it('head returns size, lastModified and etag', async () => {
    const lastModified = new Date('2025-01-01T00:00:00Z');
    const { client, sent } = fakeClient(() => ({ ContentLength: 42, LastModified: lastModified, ETag: '"abc"' }));
    expect(await new S3Store({ client, bucket: 'bkt', prefix: 'p/' }).head('k')).toEqual({
      size: 42,
      lastModified,
      etag: '"abc"',
    });
    expect(sent[0]?.input).toEqual({ Bucket: 'bkt', Key: 'p/k' });
  });

  it('get refuses on Content-Length alone, without reading the body', async () => {
    const { body, state } = chunks(10, 100);
    const { client, sent } = fakeClient(() => ({ ContentLength: 1000, Body: body }));
    const e = await rejection(new S3Store({ client, bucket: 'bkt' }).get('k', { maxBytes: 999 }));
    expect(e).toEqual(new ObjectTooLargeError('get', 'k', 999));
    expect(state).toEqual({ pulled: 0, destroyed: true });
    expect(sent[0]?.aborted()).toBe(true);
  });

  it('get stops streaming at the limit when the length is unknown', async () => {
    const { body, state } = chunks(1000, 1024);
    const { client, sent } = fakeClient(() => ({ Body: body }));
    const store = new S3Store({ client, bucket: 'bkt', maxObjectBytes: 4096 });
    expect(await rejection(store.get('k'))).toEqual(new ObjectTooLargeError('get', 'k', 4096));
    expect(state).toEqual({ pulled: 5, destroyed: true });
    expect(sent[0]?.aborted()).toBe(true);
  });

  it('get concatenates the streamed chunks', async () => {
    const { body } = chunks(3, 2);
    const { client, sent } = fakeClient(() => ({ Body: body }));
    expect(await new S3Store({ client, bucket: 'bkt', prefix: 'x' }).get('k')).toEqual(Buffer.from([0, 0, 1, 1, 2, 2]));
    expect([sent[0]?.command, sent[0]?.input]).toEqual([GetObjectCommand.name, { Bucket: 'bkt', Key: 'x/k' }]);
  });

  it('list pages with continuation tokens, strips the prefix and stops at the limit', async () => {
    const pages: Record<string, unknown> = {
      first: { Contents: [{ Key: 'p/a/1' }, { Key: 'p/a/2' }], IsTruncated: true, NextContinuationToken: 't1' },
      t1: { Contents: [{ Key: 'p/a/3' }], IsTruncated: true, NextContinuationToken: 't2' },
      t2: { Contents: [{ Key: 'p/a/4' }, { Key: 'p/a/5' }], IsTruncated: false },
    };
    const { client, sent } = fakeClient((_cmd, input) => pages[(input.ContinuationToken as string) ?? 'first']);
    const store = new S3Store({ client, bucket: 'bkt', prefix: 'p' });
    expect(await store.list('a/', { startAfter: 'a/0' })).toEqual(['a/1', 'a/2', 'a/3', 'a/4', 'a/5']);
    expect(sent.map((s) => [s.command, s.input])).toEqual([
      [ListObjectsV2Command.name, { Bucket: 'bkt', Prefix: 'p/a/', MaxKeys: 1000, StartAfter: 'p/a/0' }],
      [ListObjectsV2Command.name, { Bucket: 'bkt', Prefix: 'p/a/', MaxKeys: 998, ContinuationToken: 't1' }],
      [ListObjectsV2Command.name, { Bucket: 'bkt', Prefix: 'p/a/', MaxKeys: 997, ContinuationToken: 't2' }],
    ]);
    sent.length = 0;
    expect(await store.list('a/', { limit: 2 })).toEqual(['a/1', 'a/2']);
    expect(sent).toHaveLength(1);
  });

  it('delete sends DeleteObject under the prefix', async () => {
    const { client, sent } = fakeClient(() => ({}));
    await new S3Store({ client, bucket: 'bkt', prefix: 'p/' }).delete('k');
    expect(sent.map((s) => [s.command, s.input])).toEqual([[DeleteObjectCommand.name, { Bucket: 'bkt', Key: 'p/k' }]]);
  });

  it('validates keys before sending anything', async () => {
    const { client, sent } = fakeClient(() => ({}));
    const store = new S3Store({ client, bucket: 'bkt' });
    await rejection(store.put('../x', 'x'));
    await rejection(store.get('/x'));
    expect(sent).toEqual([]);
  });
});
