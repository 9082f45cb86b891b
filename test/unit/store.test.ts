import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  InvalidKeyError,
  keyProblem,
  LocalDirStore,
  MemoryStore,
  type ObjectStore,
  ObjectTooLargeError,
  StoreError,
} from '../../functions/lib/store/index.js';
import { casContract } from '../harness/store-cas-contract.js';

let tmp: string;
beforeEach(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'store-test-'));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

async function rejection(p: Promise<unknown>): Promise<Error> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: Error) => e,
  );
}

describe('keyProblem', () => {
  it.each<[string, string | undefined]>([
    ['artifacts/fetch/sha256/abc.tgz', undefined],
    ['a', undefined],
    ['A-z_0.9/x', undefined],
    ['', 'key is empty'],
    ['/abs', 'key is absolute'],
    ['a/../b', 'key has a "." or ".." segment'],
    ['..', 'key has a "." or ".." segment'],
    ['./a', 'key has a "." or ".." segment'],
    ['a//b', 'key has an empty segment'],
    ['a/', 'key has an empty segment'],
    ['a b', 'key has characters outside [A-Za-z0-9._/-]'],
    ['a\\b', 'key has characters outside [A-Za-z0-9._/-]'],
    ['a~b', 'key has characters outside [A-Za-z0-9._/-]'],
    ['ü', 'key has characters outside [A-Za-z0-9._/-]'],
    ['a\0', 'key has characters outside [A-Za-z0-9._/-]'],
    ['x'.repeat(901), 'key is longer than 900 characters'],
  ])('%j → %s', (key, problem) => {
    expect(keyProblem(key)).toBe(problem);
  });
});

/** Adapter name, its factory, and (local store) a factory of more instances on the same storage. */
const adapters: Array<[string, () => ObjectStore, ((store: ObjectStore) => ObjectStore) | undefined]> = [
  ['LocalDirStore', () => new LocalDirStore(join(tmp, 'root')), (s) => new LocalDirStore((s as LocalDirStore).rootDir)],
  ['MemoryStore', () => new MemoryStore(), undefined],
];

describe.each(adapters)('%s (ObjectStore contract)', (_name, make, another) => {
  let store: ObjectStore;
  beforeEach(() => {
    store = make();
  });

  it('puts, gets, heads, overwrites and deletes', async () => {
    expect(await store.get('a/b.txt')).toBeUndefined();
    expect(await store.head('a/b.txt')).toBeUndefined();
    await store.put('a/b.txt', 'hello');
    expect(await store.get('a/b.txt')).toEqual(Buffer.from('hello'));
    expect((await store.head('a/b.txt'))?.size).toBe(5);
    await store.put('a/b.txt', new Uint8Array([1, 2, 3]));
    expect(await store.get('a/b.txt')).toEqual(Buffer.from([1, 2, 3]));
    await store.delete('a/b.txt');
    expect(await store.get('a/b.txt')).toBeUndefined();
    await store.delete('a/b.txt'); // absent: still fine
    await store.delete('never/was');
  });

  it('stores empty objects', async () => {
    expect(await store.putIfAbsent('empty', Buffer.alloc(0))).toBe('created');
    expect(await store.get('empty')).toEqual(Buffer.alloc(0));
    expect((await store.head('empty'))?.size).toBe(0);
  });

  it('putIfAbsent creates once and keeps the first body', async () => {
    expect(await store.putIfAbsent('k/x', 'first')).toBe('created');
    expect(await store.putIfAbsent('k/x', 'second')).toBe('exists');
    expect((await store.get('k/x'))?.toString()).toBe('first');
  });

  it('lets exactly one of many concurrent putIfAbsent calls create', async () => {
    const bodies = Array.from({ length: 24 }, (_, i) => `body-${i}-${'x'.repeat(i * 1000)}`);
    const results = await Promise.all(bodies.map((b) => store.putIfAbsent('race/key', b)));
    expect(results.filter((r) => r === 'created')).toHaveLength(1);
    expect(results.filter((r) => r === 'exists')).toHaveLength(bodies.length - 1);
    const winner = bodies[results.indexOf('created')];
    expect((await store.get('race/key'))?.toString()).toBe(winner);
  });

  casContract(() => store, another ? { writer: () => another(store) } : {});

  it('concurrent puts leave one whole body, never a mix', async () => {
    const bodies = Array.from({ length: 16 }, (_, i) => String.fromCharCode(97 + i).repeat(64 * 1024));
    await Promise.all(bodies.map((b) => store.put('same', b)));
    expect(bodies).toContain((await store.get('same'))?.toString());
  });

  it('lists sorted keys by prefix with limit and startAfter', async () => {
    for (const k of ['b/2', 'a/1', 'a/10', 'a/2', 'ab', 'a-x/1', 'c']) await store.put(k, k);
    expect(await store.list('')).toEqual(['a-x/1', 'a/1', 'a/10', 'a/2', 'ab', 'b/2', 'c']);
    expect(await store.list('a/')).toEqual(['a/1', 'a/10', 'a/2']);
    expect(await store.list('a')).toEqual(['a-x/1', 'a/1', 'a/10', 'a/2', 'ab']);
    expect(await store.list('a/1')).toEqual(['a/1', 'a/10']);
    expect(await store.list('nope/')).toEqual([]);
    expect(await store.list('', { limit: 2 })).toEqual(['a-x/1', 'a/1']);
    expect(await store.list('', { limit: 2, startAfter: 'a/1' })).toEqual(['a/10', 'a/2']);
    expect(await store.list('a/', { startAfter: 'a/2' })).toEqual([]);
  });

  it.each<[string, (s: ObjectStore) => Promise<unknown>, string]>([
    ['get', (s) => s.get('../etc/passwd'), 'invalid object key: key has a "." or ".." segment'],
    ['head', (s) => s.head('/abs'), 'invalid object key: key is absolute'],
    ['put', (s) => s.put('a b', 'x'), 'invalid object key: key has characters outside [A-Za-z0-9._/-]'],
    ['putIfAbsent', (s) => s.putIfAbsent('', 'x'), 'invalid object key: key is empty'],
    ['delete', (s) => s.delete('a//b'), 'invalid object key: key has an empty segment'],
    ['list', (s) => s.list('../'), 'invalid list prefix: prefix has an empty, "." or ".." segment'],
    ['list', (s) => s.list('/a'), 'invalid list prefix: prefix is absolute'],
  ])('%s rejects an invalid key with InvalidKeyError', async (op, call, message) => {
    const e = await rejection(call(store));
    expect(e).toBeInstanceOf(InvalidKeyError);
    expect(e).toBeInstanceOf(StoreError);
    expect(e.message).toBe(message);
    expect((e as StoreError).op).toBe(op);
  });

  it('rejects a bad list limit with RangeError', async () => {
    expect(await rejection(store.list('', { limit: 0 }))).toEqual(
      new RangeError('list limit must be an integer in 1..1000'),
    );
    expect(await rejection(store.list('', { limit: 1001 }))).toBeInstanceOf(RangeError);
  });

  it('enforces get maxBytes', async () => {
    await store.put('big', Buffer.alloc(100));
    const e = await rejection(store.get('big', { maxBytes: 99 }));
    expect(e).toBeInstanceOf(ObjectTooLargeError);
    expect(e.message).toBe('object "big" exceeds 99 bytes');
    expect((e as ObjectTooLargeError).limit).toBe(99);
    expect(await store.get('big', { maxBytes: 100 })).toHaveLength(100);
  });
});

describe('size limits from options', () => {
  it.each<[string, (max: number) => ObjectStore]>([
    ['LocalDirStore', (max) => new LocalDirStore(join(tmp, 'root'), { maxObjectBytes: max })],
    ['MemoryStore', (max) => new MemoryStore({ maxObjectBytes: max })],
  ])('%s refuses to write or read past maxObjectBytes', async (_name, make) => {
    const store = make(10);
    expect(await rejection(store.put('k', Buffer.alloc(11)))).toEqual(new ObjectTooLargeError('put', 'k', 10));
    expect(await rejection(store.putIfAbsent('k', 'x'.repeat(11)))).toBeInstanceOf(ObjectTooLargeError);
    await store.put('k', Buffer.alloc(10));
    expect(await store.get('k')).toHaveLength(10);
    expect(await store.list('')).toEqual(['k']);
  });
});

describe('LocalDirStore specifics', () => {
  it('stores each key as a file under the root, creating the root lazily', async () => {
    const root = join(tmp, 'lazy', 'root');
    const store = new LocalDirStore(root);
    expect(await store.list('')).toEqual([]);
    expect(await store.get('x')).toBeUndefined();
    await store.put('artifacts/fetch/sha256/abc.tgz', 'tgz');
    expect(await readFile(join(root, 'artifacts/fetch/sha256/abc.tgz'), 'utf8')).toBe('tgz');
    expect((await store.head('artifacts/fetch/sha256/abc.tgz'))?.lastModified).toBeInstanceOf(Date);
  });

  it('leaves no temp files behind, and never lists them', async () => {
    const root = join(tmp, 'root');
    const store = new LocalDirStore(root, { fsync: false });
    await Promise.all(Array.from({ length: 10 }, () => store.putIfAbsent('d/k', 'same')));
    await Promise.all(Array.from({ length: 10 }, (_, i) => store.put('d/p', `v${i}`)));
    expect((await readdir(join(root, 'd'))).sort()).toEqual(['k', 'p']);
    // A crashed writer's temp file is invisible to list and get.
    await writeFile(join(root, 'd', '.~tmp-deadbeef'), 'partial');
    expect(await store.list('d/')).toEqual(['d/k', 'd/p']);
  });

  it('treats directories as absent objects', async () => {
    const root = join(tmp, 'root');
    await mkdir(join(root, 'dir/sub'), { recursive: true });
    const store = new LocalDirStore(root);
    expect(await store.get('dir')).toBeUndefined();
    expect(await store.head('dir')).toBeUndefined();
    expect(await store.list('')).toEqual([]);
    expect(await store.get('dir/sub/missing')).toBeUndefined();
  });

  it('wraps filesystem errors in StoreError with the cause (a key that is also a "directory")', async () => {
    const store = new LocalDirStore(join(tmp, 'root'));
    await store.put('a', 'file');
    const e = await rejection(store.put('a/b', 'x'));
    expect(e).toBeInstanceOf(StoreError);
    expect(e.message).toBe('failed to put object "a/b"');
    expect(((e as StoreError).cause as NodeJS.ErrnoException).code).toBe('EEXIST'); // mkdir of a path that is a file
    const e2 = await rejection(store.putIfAbsent('a/c', 'x'));
    expect(e2.message).toBe('failed to create object "a/c"');
    expect(await store.get('a/b')).toBeUndefined();
    await store.delete('a/b');
  });

  it('never escapes the root even for keys that look like paths', async () => {
    const root = join(tmp, 'root');
    const store = new LocalDirStore(root);
    await store.put('..a/b..', 'ok'); // dots inside a segment are just characters
    expect(await readdir(tmp)).toEqual(['root']);
    expect(await store.list('')).toEqual(['..a/b..']);
  });
});

describe('MemoryStore specifics', () => {
  it('copies bodies in and out and counts writes', async () => {
    const store = new MemoryStore({ now: () => new Date('2025-01-01T00:00:00Z') });
    const body = Buffer.from('abc');
    await store.put('k', body);
    body[0] = 0x7a;
    const got = await store.get('k');
    expect(got?.toString()).toBe('abc');
    got![1] = 0x7a;
    expect((await store.get('k'))?.toString()).toBe('abc');
    expect(await store.putIfAbsent('k', 'x')).toBe('exists');
    expect(store.writes).toBe(1);
    expect(await store.head('k')).toEqual({ size: 3, lastModified: new Date('2025-01-01T00:00:00Z') });
  });
});
