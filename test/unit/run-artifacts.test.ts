/**
 * `carryingArtifacts` (`functions/lib/pipeline/run-artifacts.ts`): a run's store that answers
 * reads of the artifacts the run stored from memory, and nothing else.
 */
import { describe, expect, it } from 'vitest';
import {
  fetchArtifactKey,
  fetchCacheKey,
  inflightKey,
  renderCacheKey,
  sha256Hex,
  templateArtifactKey,
} from '../../functions/lib/artifact/keys.js';
import { carryingArtifacts, MAX_CARRIED_ARTIFACT_BYTES } from '../../functions/lib/pipeline/run-artifacts.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { GetOptions, ObjectHead } from '../../functions/lib/store/port.js';

/** A memory store that counts reads by key. */
class Counting extends MemoryStore {
  reads: string[] = [];
  override async get(key: string, opts?: GetOptions): Promise<Buffer | undefined> {
    this.reads.push(key);
    return await super.get(key, opts);
  }
  override async head(key: string): Promise<ObjectHead | undefined> {
    this.reads.push(key);
    return await super.head(key);
  }
}

const TGZ = fetchArtifactKey(sha256Hex('tgz'));
const YAML = templateArtifactKey(sha256Hex('yaml'));
const PRIVATE_TGZ = `private/${'a'.repeat(32)}/${'b'.repeat(32)}/fetch/${'c'.repeat(64)}.tgz`;

describe('carryingArtifacts', () => {
  it('reads of artifacts the run stored make no request; records and markers are always read', async () => {
    const inner = new Counting();
    const carry = new Map<string, Buffer>();
    const store = carryingArtifacts(inner, carry);
    await store.putIfAbsent(TGZ, Buffer.from('tgz'));
    await store.put(PRIVATE_TGZ, 'sealed');
    const record = fetchCacheKey(sha256Hex('identity'));
    await store.put(record, '{}');
    await store.putIfMatch(inflightKey(renderCacheKey(sha256Hex('x'))), '{}', undefined);

    expect((await store.get(TGZ))?.toString()).toBe('tgz');
    expect((await store.get(PRIVATE_TGZ))?.toString()).toBe('sealed');
    expect(inner.reads).toEqual([]);
    expect((await store.get(record))?.toString()).toBe('{}');
    expect(inner.reads).toEqual([record]);
    expect([...carry.keys()].sort()).toEqual([PRIVATE_TGZ, TGZ].sort());
    // The render stored: the tarballs are no longer held (the deploy reads only the manifest).
    await store.put(YAML, 'yaml');
    expect((await store.get(YAML))?.toString()).toBe('yaml');
    expect(await store.head(YAML)).toEqual({ size: 4 });
    expect([...carry.keys()]).toEqual([YAML]);
    expect(inner.reads).toEqual([record]);
    expect((await store.get(TGZ))?.toString()).toBe('tgz');
    expect(inner.reads).toEqual([record, TGZ]);
  });

  it('an artifact stored before the run, a deleted one, or one past the size bound is read from the store', async () => {
    const inner = new Counting();
    await inner.put(TGZ, 'before');
    const store = carryingArtifacts(inner, new Map());
    expect((await store.get(TGZ))?.toString()).toBe('before');
    await store.put(YAML, 'yaml');
    await store.delete(YAML);
    expect(await store.get(YAML)).toBeUndefined();
    const big = templateArtifactKey(sha256Hex('big'));
    await store.put(big, Buffer.alloc(MAX_CARRIED_ARTIFACT_BYTES + 1));
    await store.get(big);
    expect(inner.reads).toEqual([TGZ, YAML, big]);
  });

  it("a read bounded below a carried artifact's size goes to the store (which refuses it)", async () => {
    const inner = new Counting();
    const store = carryingArtifacts(inner, new Map());
    await store.put(YAML, 'yaml');
    await expect(store.get(YAML, { maxBytes: 2 })).rejects.toThrow();
    expect(inner.reads).toEqual([YAML]);
  });
});
