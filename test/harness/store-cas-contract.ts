/**
 * The compare-and-swap part of the ObjectStore contract (`getVersioned`, `putIfMatch`), shared by
 * the unit tests of the local and memory stores and the S3 store's test on the real server, so
 * every adapter is held to the same rules (the fleet's source poll record relies on them).
 */
import { expect, it } from 'vitest';
import type { ObjectStore } from '../../functions/lib/store/index.js';
import { appendUnderCas } from './store-cas-append.js';

/** Options of {@link casContract}. */
export interface CasContractOptions {
  /** The i-th of many concurrent writers (e.g. its own adapter instance on the same storage); default `store()`. */
  writer?: (i: number) => ObjectStore;
  /** Concurrent read-modify-write loops; default 20 (fewer against a real server: each costs requests). */
  writers?: number;
}

/** Defines the compare-and-swap tests in the calling `describe`, against `store()` at run time. */
export function casContract(store: () => ObjectStore, opts: CasContractOptions = {}): void {
  const { writer } = opts;
  it('putIfMatch creates only when absent, then replaces only at the version read', async () => {
    expect(await store().putIfMatch('cas/k', 'one', undefined)).toBe('written');
    expect(await store().putIfMatch('cas/k', 'again', undefined)).toBe('conflict');
    const v1 = await store().getVersioned('cas/k');
    expect(v1?.body.toString()).toBe('one');
    expect(await store().putIfMatch('cas/k', 'two', v1?.etag)).toBe('written');
    // The version read before the replacement no longer matches.
    expect(await store().putIfMatch('cas/k', 'three', v1?.etag)).toBe('conflict');
    expect((await store().get('cas/k'))?.toString()).toBe('two');
    expect(await store().putIfMatch('cas/absent', 'x', v1?.etag)).toBe('conflict');
    expect(await store().getVersioned('cas/absent')).toBeUndefined();
  });

  it('lets exactly one of many writers holding the same version replace the object', async () => {
    await store().put('cas/race', 'base');
    const base = await store().getVersioned('cas/race');
    const bodies = Array.from({ length: 12 }, (_, i) => `writer-${i}`);
    const results = await Promise.all(bodies.map((b) => store().putIfMatch('cas/race', b, base?.etag)));
    expect(results.filter((r) => r === 'written')).toHaveLength(1);
    expect((await store().get('cas/race'))?.toString()).toBe(bodies[results.indexOf('written')]);
  });

  const writers = opts.writers ?? 20;
  it(`loses no update of ${writers} concurrent read-modify-write loops, answering only written or conflict`, async () => {
    const each = 3;
    const results = await Promise.all(
      Array.from({ length: writers }, (_, w) =>
        appendUnderCas(
          writer?.(w) ?? store(),
          'cas/loops',
          Array.from({ length: each }, (_, n) => `w${w}-${n}`),
        ),
      ),
    );
    expect(new Set(results.flat())).toEqual(new Set(['written', 'conflict']));
    const stored = JSON.parse((await store().get('cas/loops'))?.toString() ?? '[]') as string[];
    expect(stored.sort()).toEqual(
      Array.from({ length: writers }, (_, w) => Array.from({ length: each }, (_, n) => `w${w}-${n}`))
        .flat()
        .sort(),
    );
  });
}
