import { describe, expect, it } from 'vitest';
import { domainKey, domainScopedStore } from '../../functions/lib/store/domain.js';
import { InvalidKeyError, MemoryStore } from '../../functions/lib/store/index.js';

const TAG_A = 'a'.repeat(32);
const TAG_B = 'b'.repeat(32);

async function rejection(p: Promise<unknown>): Promise<Error> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: Error) => e,
  );
}

/** A raw store and two domains' views of it. */
function views() {
  const raw = new MemoryStore();
  return { raw, a: domainScopedStore(raw, () => TAG_A), b: domainScopedStore(raw, () => TAG_B) };
}

const SCOPED = [
  'cache/render/sha256/1.json',
  'cache/fetch/sha256/2.json',
  'cache/source-poll/sha256/3.json',
  'inflight/cache/render/sha256/1.json',
  'artifacts/index/sha256/4.yaml',
];
const SHARED = [
  'artifacts/fetch/sha256/5.tgz',
  'artifacts/template/sha256/6.yaml',
  'artifacts/indexes/x',
  'private/t/x',
  'state/shares/c.json',
  'cachex/y',
  'd/other/cache/z',
];

describe('domainKey', () => {
  it.each(SCOPED)('puts %s under d/<tag>/', (key) => {
    expect(domainKey(TAG_A, key)).toBe(`d/${TAG_A}/${key}`);
  });
  it.each(SHARED)('leaves %s as it is', (key) => {
    expect(domainKey(TAG_A, key)).toBe(key);
  });
  it.each(['', 'a/b', '..', 'x'.repeat(65)])('refuses the tag %j', (tag) => {
    expect(() => domainKey(tag, 'cache/x')).toThrow(InvalidKeyError);
  });
});

describe('domainScopedStore', () => {
  it.each(SCOPED)('writes, reads, heads and deletes %s under d/<tag>/ only', async (key) => {
    const { raw, a, b } = views();
    await a.put(key, 'A');
    expect((await raw.get(`d/${TAG_A}/${key}`))?.toString()).toBe('A');
    expect(await raw.get(key)).toBeUndefined();
    expect((await a.get(key))?.toString()).toBe('A');
    expect(await b.get(key)).toBeUndefined();
    expect((await a.head(key))?.size).toBe(1);
    expect(await b.head(key)).toBeUndefined();
    expect((await a.getVersioned(key))?.body.toString()).toBe('A');
    await b.delete(key);
    expect((await a.get(key))?.toString()).toBe('A');
    await a.delete(key);
    expect(await raw.get(`d/${TAG_A}/${key}`)).toBeUndefined();
  });

  it.each(SHARED)('reaches %s unchanged, the same object for every domain', async (key) => {
    const { raw, a, b } = views();
    expect(await a.putIfAbsent(key, 'A')).toBe('created');
    expect(await b.putIfAbsent(key, 'B')).toBe('exists');
    expect((await raw.get(key))?.toString()).toBe('A');
    expect((await b.get(key))?.toString()).toBe('A');
    expect(raw.writes).toBe(1);
  });

  it('creates once per domain with putIfAbsent', async () => {
    const { raw, a, b } = views();
    const key = SCOPED[0] as string;
    expect(await a.putIfAbsent(key, 'A')).toBe('created');
    expect(await a.putIfAbsent(key, 'A2')).toBe('exists');
    expect(await b.putIfAbsent(key, 'B')).toBe('created');
    expect((await raw.get(`d/${TAG_B}/${key}`))?.toString()).toBe('B');
  });

  it('compares and swaps in the domain: another domain neither sees nor conflicts with it', async () => {
    const { raw, a, b } = views();
    const key = 'cache/source-poll/sha256/k.json';
    expect(await a.putIfMatch(key, 'one', undefined)).toBe('written');
    expect(await b.putIfMatch(key, 'other', undefined)).toBe('written');
    const v = await a.getVersioned(key);
    expect(await a.putIfMatch(key, 'two', v?.etag)).toBe('written');
    expect(await a.putIfMatch(key, 'three', v?.etag)).toBe('conflict');
    expect((await raw.get(`d/${TAG_A}/${key}`))?.toString()).toBe('two');
    expect((await raw.get(`d/${TAG_B}/${key}`))?.toString()).toBe('other');
    expect(await raw.get(key)).toBeUndefined();
  });

  it('lists a scoped prefix from d/<tag>/ and maps the keys back, paging by the unmapped keys', async () => {
    const { raw, a } = views();
    await raw.put('cache/render/sha256/fleet.json', 'x');
    await raw.put(`d/${TAG_B}/cache/render/sha256/b.json`, 'x');
    for (const k of ['cache/render/sha256/1.json', 'cache/render/sha256/2.json', 'cache/render/sha256/3.json']) {
      await a.put(k, 'x');
    }
    await a.put('cache/fetch/sha256/9.json', 'x');
    expect(await a.list('cache/render/')).toEqual([
      'cache/render/sha256/1.json',
      'cache/render/sha256/2.json',
      'cache/render/sha256/3.json',
    ]);
    expect(await a.list('cache/', { limit: 2 })).toEqual(['cache/fetch/sha256/9.json', 'cache/render/sha256/1.json']);
    expect(await a.list('cache/', { startAfter: 'cache/render/sha256/1.json', limit: 1 })).toEqual([
      'cache/render/sha256/2.json',
    ]);
    // A startAfter outside the area sorts before or after all of its keys.
    expect(await a.list('cache/render/', { startAfter: 'art' })).toHaveLength(3);
    expect(await a.list('cache/render/', { startAfter: 'd' })).toEqual([]);
    expect(await a.list('cache/render/sha256/2')).toEqual(['cache/render/sha256/2.json']);
  });

  it('lists other prefixes unchanged', async () => {
    const { raw, a } = views();
    await raw.put('artifacts/fetch/sha256/1.tgz', 'x');
    await raw.put('receipts/o/1.json', 'x');
    await a.put('artifacts/index/sha256/1.json', 'x');
    expect(await a.list('artifacts/fetch/')).toEqual(['artifacts/fetch/sha256/1.tgz']);
    expect(await a.list('receipts/')).toEqual(['receipts/o/1.json']);
    expect(await a.list(`d/${TAG_A}/`)).toEqual([`d/${TAG_A}/artifacts/index/sha256/1.json`]);
  });

  it.each(['', 'cache', 'ca', 'artifacts/', 'artifacts/in', 'inflight'])(
    'refuses the list prefix %j, which spans scoped and shared keys',
    async (prefix) => {
      const { a } = views();
      const err = await rejection(a.list(prefix));
      expect(err).toBeInstanceOf(InvalidKeyError);
      expect(err.message).toContain('spans sharing-domain keys and shared keys');
    },
  );

  it('checks keys before mapping them, as the store would', async () => {
    const { a } = views();
    expect(await rejection(a.get('cache/../private/x'))).toBeInstanceOf(InvalidKeyError);
    expect(await rejection(a.put('/cache/x', 'x'))).toBeInstanceOf(InvalidKeyError);
    expect(await rejection(a.list('cache//'))).toBeInstanceOf(InvalidKeyError);
    await expect(a.list('cache/', { limit: 0 })).rejects.toThrow(RangeError);
  });

  it('reads the tag on each operation, and rejects (never throws) when there is none yet', async () => {
    const raw = new MemoryStore();
    let tag: string | undefined;
    const s = domainScopedStore(raw, () => {
      if (tag === undefined) throw new Error('no sharing domain tag yet');
      return tag;
    });
    const pending = s.get('cache/x');
    await expect(pending).rejects.toThrow('no sharing domain tag yet');
    await expect(s.list('inflight/')).rejects.toThrow('no sharing domain tag yet');
    // Keys outside the domain need no tag.
    await s.put('artifacts/fetch/sha256/1.tgz', 'x');
    tag = TAG_A;
    await s.put('cache/x', 'A');
    expect((await raw.get(`d/${TAG_A}/cache/x`))?.toString()).toBe('A');
  });
});
