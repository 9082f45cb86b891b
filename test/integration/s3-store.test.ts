/**
 * S3Store against a real S3-compatible server (versitygw, started here on 127.0.0.1).
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { S3Client } from '@aws-sdk/client-s3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_VERSIONS, deployEvent, type KappEvent, objectEvent } from '../../events/schema.js';
import { fetchArtifactKey, packDir, tarSha256, templateArtifactKey } from '../../functions/lib/artifact/index.js';
import { DEFAULT_LEASE_TTL_MS, leaseKey, parseLease, RunLeases } from '../../functions/lib/lease/index.js';
import { InvalidKeyError, ObjectTooLargeError, S3Store, StoreError } from '../../functions/lib/store/index.js';
import { type S3Server, s3Client, startS3Server } from '../harness/servers.js';
import { casContract } from '../harness/store-cas-contract.js';

const BUCKET = 'store-test';

let server: S3Server;
let client: S3Client;
let store: S3Store;

beforeAll(async () => {
  server = await startS3Server({ bucket: BUCKET });
  client = s3Client(server);
  store = new S3Store({ client, bucket: BUCKET, prefix: 'kapp-lambda' });
});

afterAll(async () => {
  client?.destroy();
  await server?.stop();
});

async function rejection(p: Promise<unknown>): Promise<Error> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: Error) => e,
  );
}

describe('S3Store on versitygw', () => {
  it('normalizes the prefix', () => {
    expect(store.prefix).toBe('kapp-lambda/');
    expect(new S3Store({ client, bucket: BUCKET }).prefix).toBe('');
    expect(() => new S3Store({ client, bucket: BUCKET, prefix: '../x' })).toThrow(InvalidKeyError);
  });

  it('puts, gets, heads, overwrites and deletes', async () => {
    expect(await store.get('crud/a.txt')).toBeUndefined();
    expect(await store.head('crud/a.txt')).toBeUndefined();
    await store.put('crud/a.txt', 'hello');
    expect(await store.get('crud/a.txt')).toEqual(Buffer.from('hello'));
    const head = await store.head('crud/a.txt');
    expect(head?.size).toBe(5);
    expect(head?.etag).toMatch(/^"[0-9a-f]{32}"$/);
    expect(head?.lastModified).toBeInstanceOf(Date);
    await store.put('crud/a.txt', Buffer.from([0, 1, 2, 255]));
    expect(await store.get('crud/a.txt')).toEqual(Buffer.from([0, 1, 2, 255]));
    await store.delete('crud/a.txt');
    expect(await store.get('crud/a.txt')).toBeUndefined();
    await store.delete('crud/a.txt');
    await store.delete('crud/never-was');
  });

  it('stores under the prefix, invisible to a store with another prefix', async () => {
    await store.put('iso/k', 'mine');
    const root = new S3Store({ client, bucket: BUCKET });
    expect(await root.get('kapp-lambda/iso/k')).toEqual(Buffer.from('mine'));
    const other = new S3Store({ client, bucket: BUCKET, prefix: 'other/' });
    expect(await other.get('iso/k')).toBeUndefined();
    expect(await other.list('')).toEqual([]);
  });

  it('putIfAbsent: created, then exists with the first body kept', async () => {
    expect(await store.putIfAbsent('cond/x', 'first')).toBe('created');
    expect(await store.putIfAbsent('cond/x', 'second')).toBe('exists');
    expect((await store.get('cond/x'))?.toString()).toBe('first');
  });

  it('lets exactly one of many concurrent putIfAbsent calls create', async () => {
    const bodies = Array.from({ length: 12 }, (_, i) => `body-${i}-${'x'.repeat(i * 4096)}`);
    for (let round = 0; round < 5; round++) {
      const key = `race/key-${round}`;
      const results = await Promise.all(bodies.map((b) => store.putIfAbsent(key, b)));
      expect(results.filter((r) => r === 'created')).toHaveLength(1);
      expect(results.filter((r) => r === 'exists')).toHaveLength(bodies.length - 1);
      expect((await store.get(key))?.toString()).toBe(bodies[results.indexOf('created')]);
    }
  });

  // 8 loops: each lost round is a request pair to the real server (20 took about a minute here).
  casContract(() => store, { writers: 8 });

  it('lists sorted keys by prefix, paging with limit and startAfter', async () => {
    for (const k of ['b/2', 'a/1', 'a/10', 'a/2', 'ab', 'a-x/1', 'c']) await store.put(`list/${k}`, k);
    expect(await store.list('list/')).toEqual([
      'list/a-x/1',
      'list/a/1',
      'list/a/10',
      'list/a/2',
      'list/ab',
      'list/b/2',
      'list/c',
    ]);
    expect(await store.list('list/a/')).toEqual(['list/a/1', 'list/a/10', 'list/a/2']);
    expect(await store.list('list/a/1')).toEqual(['list/a/1', 'list/a/10']);
    expect(await store.list('list/', { limit: 2 })).toEqual(['list/a-x/1', 'list/a/1']);
    expect(await store.list('list/', { limit: 3, startAfter: 'list/a/1' })).toEqual([
      'list/a/10',
      'list/a/2',
      'list/ab',
    ]);
    expect(await store.list('list/nope/')).toEqual([]);
  });

  it('pages through more keys than one response holds', async () => {
    const small = new S3Store({ client, bucket: BUCKET, prefix: 'paging' });
    const keys = Array.from({ length: 25 }, (_, i) => `k${String(i).padStart(2, '0')}`);
    await Promise.all(keys.map((k) => small.put(k, k)));
    const page1 = await small.list('', { limit: 10 });
    const page2 = await small.list('', { limit: 10, startAfter: page1.at(-1) });
    const page3 = await small.list('', { limit: 10, startAfter: page2.at(-1) });
    expect([...page1, ...page2, ...page3]).toEqual(keys);
    expect(page3).toHaveLength(5);
  });

  it('stops reading at the size limit', async () => {
    await store.put('big/blob', Buffer.alloc(1024 * 1024, 7));
    const e = await rejection(store.get('big/blob', { maxBytes: 1000 }));
    expect(e).toBeInstanceOf(ObjectTooLargeError);
    expect(e.message).toBe('object "big/blob" exceeds 1000 bytes');
    expect((await store.get('big/blob'))?.equals(Buffer.alloc(1024 * 1024, 7))).toBe(true);
    const tiny = new S3Store({ client, bucket: BUCKET, prefix: 'kapp-lambda', maxObjectBytes: 10 });
    expect(await rejection(tiny.put('big/other', Buffer.alloc(11)))).toBeInstanceOf(ObjectTooLargeError);
    expect(await rejection(tiny.get('big/blob'))).toBeInstanceOf(ObjectTooLargeError);
  });

  it('rejects invalid keys before any request', async () => {
    const e = await rejection(store.put('../escape', 'x'));
    expect(e).toBeInstanceOf(InvalidKeyError);
    expect(await store.list('')).not.toContain('escape');
  });

  it('wraps server errors in StoreError with the SDK error as cause', async () => {
    const missing = new S3Store({ client, bucket: 'no-such-bucket' });
    const e = await rejection(missing.put('k', 'x'));
    expect(e).toBeInstanceOf(StoreError);
    expect(e.message).toBe('failed to put object "k"');
    expect((e as StoreError).op).toBe('put');
    expect((e.cause as { name?: string }).name).toBe('NoSuchBucket');
    const l = await rejection(missing.list(''));
    expect(l.message).toBe('failed to list objects under ""');
  });

  it('stores a packed artifact once under its content key and reads it back intact', async () => {
    const dir = await mkdtemp(join(tmpdir(), 's3-artifact-'));
    try {
      await mkdir(join(dir, 'config'));
      await writeFile(join(dir, 'config', 'app.yaml'), 'kind: ConfigMap\n');
      const packed = await packDir(dir);
      const key = fetchArtifactKey(packed.sha256);
      expect(await store.putIfAbsent(key, packed.tgz)).toBe('created');
      expect(await store.putIfAbsent(key, (await packDir(dir)).tgz)).toBe('exists');
      const back = await store.get(key);
      expect(back?.equals(packed.tgz)).toBe(true);
      expect(await tarSha256(back!)).toBe(packed.sha256);
      expect(await store.list('artifacts/fetch/')).toEqual([key]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('the run lease of an App on versitygw (issue 11 item 6b)', () => {
  const ref = { clusterId: 'c1', kind: 'App' as const, namespace: 'ns', name: 'lease-app' };
  const change = (resourceVersion: string) =>
    objectEvent({ ...ref, apiVersion: API_VERSIONS.App, uid: 'u1', generation: 1, resourceVersion }, 'resync', {
      time: '2025-01-01T00:00:00Z',
    });

  it('lets exactly one of many events at once run; the others become its one follow-up, sent when it ends', async () => {
    const leases = new RunLeases({ store });
    const events = Array.from({ length: 6 }, (_, i) => change(String(i + 1)));
    const results = await Promise.all(events.map((e) => leases.acquire(e)));
    const held = results.flatMap((r) => (r.kind === 'acquired' ? [r] : []));
    expect(held).toHaveLength(1);
    expect(results.filter((r) => r.kind === 'coalesced')).toHaveLength(5);
    const followUp = await held[0]?.lease.end();
    expect(followUp?.type).toBe('dev.kapp-lambda.object.v1');
    expect(followUp?.id).not.toBe(held[0]?.event.id);
    const stored = parseLease(await store.get(leaseKey(ref)));
    expect(stored.holder).toBe(`event:${followUp?.id}`);
    const next = await leases.acquire(followUp as KappEvent);
    expect(next.kind).toBe('acquired');
    if (next.kind === 'acquired') expect(await next.lease.end()).toBeUndefined();
    expect(parseLease(await store.get(leaseKey(ref)))).toEqual({
      seq: expect.any(Number),
      last: `event:${followUp?.id}`,
    });
  });

  it('an optimistic resync sees the lease moved once another run took it and freed it again (issue 13 item 8)', async () => {
    const leases = new RunLeases({ store });
    const other = { ...ref, name: 'optimistic-app' };
    const resync = (rv: string) =>
      objectEvent({ ...other, apiVersion: API_VERSIONS.App, uid: 'u2', generation: 1, resourceVersion: rv }, 'resync', {
        time: '2025-01-01T00:00:00Z',
      });
    // A first run leaves the lease free: the next resync runs optimistic from that version.
    const first = await leases.acquire(resync('1'));
    if (first.kind !== 'acquired') throw new Error('the first run did not get the lease');
    await first.lease.end();
    const optimistic = await leases.start(resync('2'));
    if (!optimistic) throw new Error('a resync of a free lease did not run optimistic');
    // Another run takes the lease and frees it: the same record but for its write count and run.
    const real = await leases.acquire(resync('3'));
    if (real.kind !== 'acquired') throw new Error('the real run did not get the lease');
    await real.lease.end();
    expect((await leases.read(leaseKey(other))).version).not.toBe(optimistic.seen);
    await expect(optimistic.verify()).rejects.toThrow(/another run of the App started/);
    expect(optimistic.stopped).toBe('restart');
    // A resync that starts now claims the lease with one conditional write, and holds it.
    const next = await leases.start(resync('4'));
    if (!next) throw new Error('a resync of a free lease did not run optimistic');
    const held = await next.claim();
    expect(parseLease(await store.get(leaseKey(other))).holder).toBe(held.holder);
    expect(await leases.acquire(resync('5'))).toMatchObject({ kind: 'coalesced' });
  });

  it("fences a crashed run's stage retried after another run took its expired lease; its own retry goes on otherwise", async () => {
    const clock = { t: Date.parse('2025-01-01T00:00:00Z') };
    const leases = new RunLeases({ store, now: () => new Date(clock.t) });
    const other = { ...ref, name: 'fenced-app' };
    const object = { ...other, apiVersion: API_VERSIONS.App, uid: 'u3', generation: 1, resourceVersion: '1' };
    const time = '2025-01-01T00:00:00Z';
    const deployOf = (runId: string) =>
      deployEvent(
        {
          object,
          run: { generation: 1, runId, startedAt: time },
          artifacts: { manifestKey: templateArtifactKey('e'.repeat(64)) },
        },
        { time },
      );
    // Run 1's deploy takes the lease and crashes (never renews nor ends it).
    const first = await leases.acquire(deployOf('run-1'));
    expect(first).toMatchObject({ kind: 'acquired', tookOver: false });
    // Its retry before the lease expired, and after it expired with nobody since: the same run.
    clock.t += DEFAULT_LEASE_TTL_MS / 5;
    expect(await leases.acquire(deployOf('run-1'))).toMatchObject({ kind: 'acquired', tookOver: false });
    clock.t += DEFAULT_LEASE_TTL_MS + 1;
    expect(await leases.acquire(deployOf('run-1'))).toMatchObject({ kind: 'acquired', tookOver: false });
    // It crashes again; after the expiry a newer run takes the lease over, and ends.
    clock.t += DEFAULT_LEASE_TTL_MS + 1;
    const newer = await leases.acquire(objectEvent(object, 'ref-changed', { time }));
    if (newer.kind !== 'acquired') throw new Error('the newer run did not get the expired lease');
    expect(newer.tookOver).toBe(true);
    const stored = await store.getVersioned(leaseKey(other));
    // Run 1's retry is fenced while the newer run holds it, and after it ended; nothing written.
    expect(await leases.acquire(deployOf('run-1'))).toEqual({ kind: 'fenced', holder: newer.lease.holder });
    expect((await store.getVersioned(leaseKey(other)))?.etag).toBe(stored?.etag);
    await newer.lease.end();
    expect(await leases.acquire(deployOf('run-1'))).toEqual({ kind: 'fenced', last: newer.lease.holder });
  });
});
