/**
 * The lock of LocalDirStore's compare-and-swap (`functions/lib/store/file-lock.ts`): writers in
 * other processes, a live holder that outlasts the stale age, a dead writer's lock, and a
 * holder whose lock was broken.
 */
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, unlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { withFileLock } from '../../functions/lib/store/file-lock.js';
import { LocalDirStore } from '../../functions/lib/store/index.js';
import { appendUnderCas } from '../harness/store-cas-append.js';

const REPO_ROOT = resolve(import.meta.dirname, '../..');

let tmp: string;
beforeEach(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'store-lock-test-'));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

/** Runs `test/harness/local-store-writer.ts` and resolves to the results it prints. */
function writerProcess(root: string, key: string, name: string, instances: number, entries: number) {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      join(REPO_ROOT, 'test/harness/local-store-writer.ts'),
      root,
      key,
      name,
      String(instances),
      String(entries),
    ],
    { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr.on('data', (d: Buffer) => {
    err += d.toString();
  });
  return new Promise<string[]>((res, rej) => {
    child.on('error', rej);
    child.on('exit', (code) =>
      code === 0 ? res(JSON.parse(out) as string[]) : rej(new Error(`writer ${name} exited ${code}: ${err}`)),
    );
  });
}

const entriesOf = (name: string, instances: number, entries: number) =>
  Array.from({ length: instances }, (_, i) => Array.from({ length: entries }, (_, n) => `${name}-${i}-${n}`)).flat();

describe('LocalDirStore.putIfMatch lock', () => {
  it('loses no update of writers in 3 processes and this one, answering only written or conflict', async () => {
    const root = join(tmp, 'root');
    const key = 'cache/source-poll/sha256/shared.json';
    const [a, b, c, here] = await Promise.all([
      writerProcess(root, key, 'p1', 6, 3),
      writerProcess(root, key, 'p2', 6, 3),
      writerProcess(root, key, 'p3', 6, 3),
      Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          appendUnderCas(
            new LocalDirStore(root),
            key,
            Array.from({ length: 3 }, (_, n) => `here-${i}-${n}`),
          ),
        ),
      ),
    ]);
    expect(new Set([...a, ...b, ...c, ...here.flat()])).toEqual(new Set(['written', 'conflict']));
    const stored = JSON.parse((await new LocalDirStore(root).get(key))?.toString() ?? '[]') as string[];
    expect(stored.sort()).toEqual(['p1', 'p2', 'p3', 'here'].flatMap((name) => entriesOf(name, 6, 3)).sort());
    // No lock, grave or temp file left behind.
    expect(await readdir(join(root, 'cache/source-poll/sha256'))).toEqual(['shared.json']);
  }, 120_000);

  it('waits for a live holder however long it holds the lock, past the stale age', async () => {
    const root = join(tmp, 'root');
    // A stale age far above the refresh period below: the refresher shares this event loop with
    // the waiter, and a pause of the loop longer than the age less one period (a loaded machine:
    // 180 ms with an age of 200 ms) would let the waiter see a live lock as stale.
    const store = new LocalDirStore(root, { lockStaleMs: 1000 });
    await store.put('r/k', 'base');
    const base = await store.getVersioned('r/k');
    // Another process's holder: its lock file, refreshed as its holder does.
    const lock = join(root, 'r', 'k.~lock');
    await writeFile(lock, 'another-writer');
    const refresh = setInterval(() => {
      const now = new Date();
      utimes(lock, now, now).catch(() => undefined);
    }, 20);
    let settled = false;
    const put = store.putIfMatch('r/k', 'mine', base?.etag).finally(() => {
      settled = true;
    });
    try {
      // Two stale ages of the holder's work.
      for (let i = 0; i < 20; i++) {
        await new Promise((r) => setTimeout(r, 100));
        expect(settled).toBe(false);
        expect(await readFile(lock, 'utf8')).toBe('another-writer');
      }
      expect((await store.get('r/k'))?.toString()).toBe('base');
    } finally {
      clearInterval(refresh);
      await unlink(lock);
    }
    expect(await put).toBe('written');
    expect((await store.get('r/k'))?.toString()).toBe('mine');
  });

  it("breaks a dead writer's lock and leaves nothing of it", async () => {
    const root = join(tmp, 'root');
    const store = new LocalDirStore(root);
    await store.put('r/k', 'base');
    const base = await store.getVersioned('r/k');
    const lock = join(root, 'r', 'k.~lock');
    await writeFile(lock, 'dead-writer');
    const longAgo = new Date(Date.now() - 60_000);
    await utimes(lock, longAgo, longAgo);
    const results = await Promise.all(['one', 'two', 'three'].map((b) => store.putIfMatch('r/k', b, base?.etag)));
    expect(results.filter((r) => r === 'written')).toHaveLength(1);
    expect(results.filter((r) => r === 'conflict')).toHaveLength(2);
    expect(await readdir(join(root, 'r'))).toEqual(['k']);
  });

  it('answers conflict without taking the lock when the version read is already replaced', async () => {
    const root = join(tmp, 'root');
    const store = new LocalDirStore(root, { lockStaleMs: 60_000 });
    await store.put('r/k', 'v1');
    const v1 = await store.getVersioned('r/k');
    await store.put('r/k', 'v2');
    // A live writer holds the lock: a stale version is answered at once all the same.
    await writeFile(join(root, 'r', 'k.~lock'), 'another-writer');
    expect(await store.putIfMatch('r/k', 'late', v1?.etag)).toBe('conflict');
    expect(await store.putIfMatch('r/k', 'late', undefined)).toBe('conflict');
  });
});

describe('withFileLock', () => {
  it('runs the writers of one process one at a time, in arrival order', async () => {
    await mkdir(join(tmp, 'd'));
    const lock = join(tmp, 'd', 'x.~lock');
    const order: string[] = [];
    let inside = 0;
    await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        withFileLock(lock, async () => {
          inside += 1;
          expect(inside).toBe(1);
          order.push(`start-${i}`);
          await new Promise((r) => setTimeout(r, 1));
          order.push(`end-${i}`);
          inside -= 1;
        }),
      ),
    );
    expect(order).toEqual(Array.from({ length: 8 }, (_, i) => [`start-${i}`, `end-${i}`]).flat());
    expect(await readdir(join(tmp, 'd'))).toEqual([]);
  });

  it("leaves the lock file to the writer that took it after this holder's was broken", async () => {
    await mkdir(join(tmp, 'd'));
    const lock = join(tmp, 'd', 'x.~lock');
    // While this holder was frozen, its lock went stale, was broken and taken by another writer.
    await withFileLock(lock, async () => {
      await writeFile(lock, 'the-next-holder');
    });
    expect(await readFile(lock, 'utf8')).toBe('the-next-holder');
  });

  it('passes on what the locked function throws, and releases the lock', async () => {
    await mkdir(join(tmp, 'd'));
    const lock = join(tmp, 'd', 'x.~lock');
    await expect(
      withFileLock(lock, async () => {
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect(await withFileLock(lock, async () => 'next')).toBe('next');
    expect(await readdir(join(tmp, 'd'))).toEqual([]);
  });
});
