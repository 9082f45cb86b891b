/**
 * The read-modify-write loop of the compare-and-swap contract tests, without vitest, so the
 * writer processes of the local store's cross-process test (`local-store-writer.ts`) run it too.
 */
import type { ObjectStore } from '../../functions/lib/store/index.js';

/**
 * Adds `entries` entries to the JSON array at `key` one at a time, each by a read-modify-write
 * under `putIfMatch` retried on conflict (as the source poll's record updates are).
 * @returns every result `putIfMatch` gave (a result other than 'written'/'conflict' is a defect).
 */
export async function appendUnderCas(store: ObjectStore, key: string, entries: readonly string[]): Promise<string[]> {
  const results: string[] = [];
  for (const entry of entries) {
    for (;;) {
      const cur = await store.getVersioned(key);
      const list = cur ? (JSON.parse(cur.body.toString()) as string[]) : [];
      const r = await store.putIfMatch(key, JSON.stringify([...list, entry]), cur?.etag);
      results.push(r);
      if (r === 'written') break;
      await new Promise((res) => setTimeout(res, Math.random() * 5));
    }
  }
  return results;
}
