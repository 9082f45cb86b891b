/**
 * The shared prefixes (`artifacts/*`, `cache/*`) under a run of another cluster that writes them
 * (notes: shared-prefixes, Fix 1): blobs are verified against their keys, records are checked,
 * and a writer that finds a bad blob under its key keeps its own sealed copy. Through the fetch
 * and template stages over a memory store, the fake runner (vendir, ytt) and a real keyring;
 * the attacker is a direct write to the store.
 */
import { mkdir, mkdtemp, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { templateEvent } from '../../events/schema.js';
import type { App } from '../../functions/lib/api/index.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import {
  FETCH_KEY_PATTERN,
  PRIVATE_FETCH_KEY_PATTERN,
  PRIVATE_TEMPLATE_KEY_PATTERN,
  sha256Hex,
  TEMPLATE_KEY_PATTERN,
  templateArtifactKey,
} from '../../functions/lib/artifact/keys.js';
import { packDir } from '../../functions/lib/artifact/tarball.js';
import type { HttpDownloader } from '../../functions/lib/fetch/http-download.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { fleetFlight, readArtifact, scopeOf } from '../../functions/lib/pipeline/artifacts.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { contentEtag, type ObjectHead, StoreError } from '../../functions/lib/store/port.js';
import { rawTgz } from '../harness/fixtures.js';
import { appObject, appWorld, NOW, putFetchArtifact, REF, RUN, SUCCEEDED_BEFORE } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('shared-prefix-tamper-');
const keyring = () => new DerivedKeyring(Buffer.alloc(32, 7));
const TAMPERED = 'shared artifact does not match the digest its key names: tampered, not used';
const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
const EVIL = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: evil\n';

/** A tarball of one `config.yml` holding `body`: another artifact than the fetch's. */
async function otherTgz(body: string): Promise<Buffer> {
  const dir = await mkdtemp(path.join(tempDir(), 'other-'));
  await writeFile(path.join(dir, 'config.yml'), body);
  return (await packDir(dir)).tgz;
}

const CTX = { clusterId: REF.clusterId, ref: REF, run: RUN };
const tgz = rawTgz({ 'a.yml': 'a: 1\n' });

/**
 * A pinned http fetch (the poll resolved its hash) over `store`, and the template of its
 * artifact, whose ytt reports the `config.yml` it was given.
 */
function pinnedWorld(store = new MemoryStore()) {
  const app = appObject({ spec: { fetch: [{ http: { url: 'http://h/app.tgz' } }] } }) as App;
  const download: HttpDownloader = { download: async () => ({ body: tgz, sha256: sha256Hex(tgz) }) };
  const w = appWorld({
    app,
    store,
    tmpRoot: tempDir(),
    extra: { download, resolveSource: async () => sha256Hex(tgz), keyring: keyring() },
  });
  w.runner.on('vendir', async (req) => {
    // Entry 0's directory, which the template reads.
    await mkdir(path.join(req.cwd ?? '', '0'));
    await writeFile(path.join(req.cwd ?? '', '0', 'config.yml'), 'a: 1\n');
    return { stdout: 'lock: vendir\n' };
  });
  const rendered: string[] = [];
  w.runner.on('ytt', async (req) => {
    for (const arg of req.args) {
      if (!(await stat(arg).catch(() => undefined))?.isDirectory()) continue;
      for (const f of await readdir(arg, { recursive: true })) {
        if (path.basename(f) === 'config.yml') rendered.push(await readFile(path.join(arg, f), 'utf8'));
      }
    }
    return { stdout: MANIFEST };
  });
  const run = async () =>
    (await runFetch(CTX, { raw: structuredClone(app) as never, app: structuredClone(app) }, w.deps)).template?.artifacts
      .fetchKey;
  const template = (fetchKey: string) =>
    dispatchEvent(
      templateEvent(
        { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: { exitCode: 0, updatedAt: NOW } },
        { time: new Date(NOW) },
      ),
      w.deps,
    );
  const record = async () => (await store.list('cache/fetch/'))[0] as string;
  return { ...w, run, template, record, rendered };
}

/** Read bound of {@link BoundedReadStore}: stands for the stores' 512 MiB (S3 itself has none). */
const READ_BOUND = 64 * 1024;
/** An object over {@link READ_BOUND}, as a run of another cluster could put under a shared key. */
const OVERSIZE = Buffer.alloc(2 * READ_BOUND, 0x61);

/**
 * A memory store whose reads are bounded by {@link READ_BOUND} unless the caller bounds them
 * (writes are not: S3 takes an object of any size), and whose GETs of `failing` keys fail as a
 * store outage would.
 */
class BoundedReadStore extends MemoryStore {
  readonly failing = new Set<string>();
  /** Keys whose reads S3 answers 400, as it does an object planted under a customer key (SSE-C). */
  readonly customerKeyed = new Set<string>();
  override async get(key: string, opts?: Parameters<MemoryStore['get']>[1]): Promise<Buffer | undefined> {
    if (this.failing.has(key)) throw new StoreError(`failed to get object "${key}"`, 'get', key);
    if (this.customerKeyed.has(key)) {
      const cause = Object.assign(new Error('InvalidRequest'), { $metadata: { httpStatusCode: 400 } });
      throw new StoreError(`failed to get object "${key}"`, 'get', key, { cause });
    }
    return await super.get(key, { maxBytes: opts?.maxBytes ?? READ_BOUND });
  }
}

describe('fetch: the pinned record and the shared tarball', () => {
  it('an unparsable record is a miss: vendir runs again, the stage does not throw', async () => {
    const w = pinnedWorld();
    const first = await w.run();
    const record = await w.record();
    await w.store.put(record, 'not json{');
    expect(await w.run()).toBe(first);
    expect(w.tools()).toEqual(['vendir', 'vendir']);
  });

  it('a record naming anything but a fetch artifact is a miss, even when that object exists', async () => {
    const w = pinnedWorld();
    await w.run();
    const record = await w.record();
    const manifestKey = templateArtifactKey(sha256Hex(EVIL));
    await w.store.put(manifestKey, EVIL);
    await w.store.put(record, JSON.stringify({ fetchKey: manifestKey, stdout: 'spoofed' }));
    const key = await w.run();
    expect(key).toMatch(FETCH_KEY_PATTERN);
    expect(w.tools()).toEqual(['vendir', 'vendir']);
  });

  it('a writer that finds another tarball under its key keeps a sealed copy and hands that key on', async () => {
    const w = pinnedWorld();
    const shared = (await w.run()) as string;
    const evil = await otherTgz('kind: Evil\n');
    await w.store.put(shared, evil);
    await w.store.delete(await w.record());
    const handed = await w.run();
    expect(handed).toMatch(PRIVATE_FETCH_KEY_PATTERN);
    // The shared object is left as it is; no shared record names the sealed copy.
    expect(await w.store.get(shared)).toEqual(evil);
    expect(await w.store.list('cache/fetch/')).toEqual([]);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === shared)).toBe(true);
    // The sealed copy opens for this App's scope: the fetched tree, not the planted one.
    const sealed = await readArtifact(w.deps, scopeOf(REF), handed as string);
    expect(sealed?.equals(evil)).toBe(false);
  });

  it('a writer that finds the same tar stream under its key (another gzip of it) shares it', async () => {
    const w = pinnedWorld();
    const shared = (await w.run()) as string;
    const regzipped = gzipSync(gunzipSync((await w.store.get(shared)) as Buffer), { level: 1 });
    await w.store.put(shared, regzipped);
    await w.store.delete(await w.record());
    expect(await w.run()).toBe(shared);
    expect(await w.store.get(shared)).toEqual(regzipped);
    expect(w.log.records.some((r) => r.msg === TAMPERED)).toBe(false);
  });

  it('a writer that finds an object over the read bound under its key keeps a sealed copy, run after run', async () => {
    // A run of another cluster fetched the same public source (so knows its key) and planted it.
    const shared = (await pinnedWorld().run()) as string;
    const store = new BoundedReadStore();
    await store.put(shared, OVERSIZE);
    const w = pinnedWorld(store);
    const handed = await w.run();
    expect(handed).toMatch(PRIVATE_FETCH_KEY_PATTERN);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === shared)).toBe(true);
    expect(await w.run()).toBe(handed);
    // The sealed copy is the fetched tree: it renders.
    expect((await w.template(handed as string))?.type).toBe('dev.kapp-lambda.stage.deploy.v1');
    expect(w.rendered).toEqual(['a: 1\n']);
  });

  it('a writer that finds an object it may not read (planted under a customer key: 400) keeps a sealed copy', async () => {
    const shared = (await pinnedWorld().run()) as string;
    const store = new BoundedReadStore();
    await store.put(shared, tgz);
    store.customerKeyed.add(shared);
    const w = pinnedWorld(store);
    const handed = await w.run();
    expect(handed).toMatch(PRIVATE_FETCH_KEY_PATTERN);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === shared)).toBe(true);
    expect((await w.template(handed as string))?.type).toBe('dev.kapp-lambda.stage.deploy.v1');
  });

  it('a store that fails reading the shared tarball back is an infrastructure error, not tampering', async () => {
    const shared = (await pinnedWorld().run()) as string;
    const store = new BoundedReadStore();
    await store.put(shared, OVERSIZE);
    store.failing.add(shared);
    const w = pinnedWorld(store);
    await expect(w.run()).rejects.toThrow('reading the fetch artifact back failed');
    expect(await store.list('private/')).toEqual([]);
  });
});

/**
 * A memory store whose HEAD reports an entity tag, as S3's does (the memory store's reports
 * none), and that counts the HEADs and GETs of each key.
 */
class TaggingStore extends MemoryStore {
  readonly heads: string[] = [];
  readonly gets: string[] = [];
  override async head(key: string): Promise<ObjectHead | undefined> {
    this.heads.push(key);
    const h = await super.head(key);
    const body = h && (await super.get(key));
    return h && body ? { ...h, etag: contentEtag(body) } : h;
  }
  override async get(key: string, opts?: Parameters<MemoryStore['get']>[1]): Promise<Buffer | undefined> {
    this.gets.push(key);
    return await super.get(key, opts);
  }
}

describe('fetch: the pinned record keeps the tarball entity tag', () => {
  const recordOf = async (w: ReturnType<typeof pinnedWorld>) => JSON.parse(String(await w.store.get(await w.record())));

  it('a tarball replaced behind a valid record is a miss: vendir runs once, template renders the sealed copy', async () => {
    const store = new TaggingStore();
    const w = pinnedWorld(store);
    const shared = (await w.run()) as string;
    expect(shared).toMatch(FETCH_KEY_PATTERN);
    expect((await recordOf(w)).etag).toBe((await store.head(shared))?.etag);
    await store.put(shared, await otherTgz('#@ load("evil")\n'));
    // The template refuses the replaced tarball: the run restarts from fetch.
    await expect(w.template(shared)).rejects.toThrow(`fetch artifact ${shared} is missing from the object store`);
    const handed = (await w.run()) as string;
    expect(w.tools()).toEqual(['vendir', 'vendir']);
    expect(handed).toMatch(PRIVATE_FETCH_KEY_PATTERN);
    expect(w.log.records.some((r) => r.msg === 'fetch artifact replaced since its pinned record: fetching again')).toBe(
      true,
    );
    const next = await w.template(handed);
    expect(next?.type).toBe('dev.kapp-lambda.stage.deploy.v1');
    expect(w.rendered).toEqual(['a: 1\n']);
    // The App's scope keeps its own record of the sealed copy: the next run finds it, no vendir.
    expect(await w.run()).toBe(handed);
    expect(w.tools()).toEqual(['vendir', 'vendir', 'ytt']);
  });

  it('an unchanged tarball is a hit: one HEAD of it, no GET, vendir does not run again', async () => {
    const store = new TaggingStore();
    const w = pinnedWorld(store);
    const shared = (await w.run()) as string;
    store.heads.length = 0;
    store.gets.length = 0;
    expect(await w.run()).toBe(shared);
    expect(w.tools()).toEqual(['vendir']);
    expect(store.heads.filter((k) => k === shared)).toHaveLength(1);
    expect(store.gets.filter((k) => k === shared)).toEqual([]);
  });

  it('an unpinned fetch that finds the tarball it verified before: one HEAD, no GET; a replaced one is read and refused', async () => {
    const store = new TaggingStore();
    const w = pinnedWorld(store);
    const shared = (await w.run()) as string;
    // No pinned record (an unpinned source, or a resync after the record expired): vendir runs
    // again and its artifact is already stored under the same key.
    await store.delete(await w.record());
    store.heads.length = 0;
    store.gets.length = 0;
    expect(await w.run()).toBe(shared);
    expect(store.gets.filter((k) => k === shared)).toEqual([]);
    // Replaced under the same key: another tag, so the bytes are read, found foreign, and sealed.
    await store.put(shared, await otherTgz('kind: Evil\n'));
    await store.delete(await w.record());
    store.gets.length = 0;
    expect(await w.run()).toMatch(PRIVATE_FETCH_KEY_PATTERN);
    expect(store.gets.filter((k) => k === shared)).toHaveLength(1);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === shared)).toBe(true);
  });

  it('a record without a tag (written before tags were kept) is checked for existence only', async () => {
    const store = new TaggingStore();
    const w = pinnedWorld(store);
    const shared = (await w.run()) as string;
    const key = await w.record();
    const { etag: _, ...old } = await recordOf(w);
    await store.put(key, JSON.stringify(old));
    expect(await w.run()).toBe(shared);
    expect(w.tools()).toEqual(['vendir']);
  });
});

describe('template: the shared tarball, the render record and the shared manifest', () => {
  function world(store: MemoryStore) {
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE }),
      store,
      tmpRoot: path.join(tempDir(), 'scratch'),
      extra: { keyring: keyring() },
    });
    w.runner.on('ytt', { stdout: MANIFEST });
    return w;
  }
  async function template(store: MemoryStore, fetchKey: string) {
    const w = world(store);
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: { exitCode: 0, updatedAt: NOW } };
    const next = await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
    return {
      w,
      manifestKey: next?.type === 'dev.kapp-lambda.stage.deploy.v1' ? next.data.artifacts.manifestKey : undefined,
    };
  }
  const renderRecord = async (store: MemoryStore) => (await store.list('cache/render/'))[0] as string;

  it.each([
    {
      what: 'a tarball replaced under its key never renders: the stage throws missing (restart), ytt does not run',
      store: () => new MemoryStore(),
      planted: () => otherTgz('#@ load("evil")\n'),
    },
    {
      what: 'a tarball over the read bound under its key never renders: missing (restart), logged as tampering',
      store: () => new BoundedReadStore(),
      planted: async () => OVERSIZE,
    },
  ])('$what', async ({ store: makeStore, planted }) => {
    const store = makeStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    await store.put(fetchKey, await planted());
    const w = world(store);
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: { exitCode: 0, updatedAt: NOW } };
    await expect(dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps)).rejects.toThrow(
      `fetch artifact ${fetchKey} is missing from the object store`,
    );
    expect(w.tools()).toEqual([]);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === fetchKey)).toBe(true);
  });

  it('an unparsable or mis-keyed render record is a miss: ytt runs, the stage does not throw', async () => {
    const store = new MemoryStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const genuine = (await template(store, fetchKey)).manifestKey;
    expect(genuine).toMatch(TEMPLATE_KEY_PATTERN);
    const record = await renderRecord(store);
    await store.put(record, '{"manifestKey":');
    const again = await template(store, fetchKey);
    expect([again.manifestKey, again.w.tools()]).toEqual([genuine, ['ytt']]);
    // A record naming the fetch tarball (it exists) as the manifest.
    await store.put(record, JSON.stringify({ manifestKey: fetchKey, stderr: 'spoofed' }));
    const third = await template(store, fetchKey);
    expect([third.manifestKey, third.w.tools()]).toEqual([genuine, ['ytt']]);
  });

  it('a manifest replaced under its key is never handed to deploy: rendered again, kept sealed, key handed on', async () => {
    const store = new MemoryStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const genuine = (await template(store, fetchKey)).manifestKey as string;
    expect(genuine).toMatch(TEMPLATE_KEY_PATTERN);
    await store.put(genuine, EVIL);
    const { w, manifestKey } = await template(store, fetchKey);
    expect(w.tools()).toEqual(['ytt']);
    expect(manifestKey).toMatch(PRIVATE_TEMPLATE_KEY_PATTERN);
    expect((await readArtifact(w.deps, scopeOf(REF), manifestKey as string))?.toString()).toBe(MANIFEST);
    expect((await store.get(genuine))?.toString()).toBe(EVIL);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === genuine)).toBe(true);
    // The next run finds its sealed render: no tool.
    const next = await template(store, fetchKey);
    expect([next.manifestKey, next.w.tools()]).toEqual([manifestKey, []]);
  });

  it('deploy reads a shared manifest only when its bytes are its key: a replaced one reads as absent', async () => {
    const store = new MemoryStore();
    const w = world(store);
    const key = templateArtifactKey(sha256Hex(MANIFEST));
    await store.put(key, MANIFEST);
    expect((await readArtifact(w.deps, scopeOf(REF), key))?.toString()).toBe(MANIFEST);
    await store.put(key, EVIL);
    expect(await readArtifact(w.deps, scopeOf(REF), key)).toBeUndefined();
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === key)).toBe(true);
  });

  it('a manifest over the read bound under its key is a miss: rendered again, kept sealed, run after run', async () => {
    const store = new BoundedReadStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const genuine = (await template(store, fetchKey)).manifestKey as string;
    expect(genuine).toMatch(TEMPLATE_KEY_PATTERN);
    await store.put(genuine, OVERSIZE);
    const { w, manifestKey } = await template(store, fetchKey);
    expect(w.tools()).toEqual(['ytt']);
    expect(manifestKey).toMatch(PRIVATE_TEMPLATE_KEY_PATTERN);
    expect((await readArtifact(w.deps, scopeOf(REF), manifestKey as string))?.toString()).toBe(MANIFEST);
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === genuine)).toBe(true);
    const next = await template(store, fetchKey);
    expect([next.manifestKey, next.w.tools()]).toEqual([manifestKey, []]);
  });

  it('a render record over the read bound is a miss: ytt runs, the shared manifest is handed on', async () => {
    const store = new BoundedReadStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const genuine = (await template(store, fetchKey)).manifestKey as string;
    const record = await renderRecord(store);
    await store.put(record, OVERSIZE);
    const again = await template(store, fetchKey);
    expect([again.manifestKey, again.w.tools()]).toEqual([genuine, ['ytt']]);
    expect(again.w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === record)).toBe(true);
  });

  it('deploy reads a shared manifest over the read bound as absent; a store that fails still throws', async () => {
    const store = new BoundedReadStore();
    const w = world(store);
    const key = templateArtifactKey(sha256Hex(MANIFEST));
    await store.put(key, OVERSIZE);
    expect(await readArtifact(w.deps, scopeOf(REF), key)).toBeUndefined();
    expect(w.log.records.some((r) => r.msg === TAMPERED && r.obj.key === key)).toBe(true);
    store.failing.add(key);
    await expect(readArtifact(w.deps, scopeOf(REF), key)).rejects.toThrow(StoreError);
  });
});

describe('the fleet single-flight of the stages', () => {
  it('is bounded by the time the function deadline fires, when the stage has one', () => {
    const w = appWorld({ tmpRoot: tempDir() });
    const key = `cache/render/sha256/${'a'.repeat(64)}.json`;
    const signal = new AbortController().signal;
    expect(fleetFlight({ ...w.deps, deadlineAt: 1_234 }, key, 'r1', signal).deadlineAt).toBe(1_234);
    // The embedded runtime has none: only the tool timeout bounds a wait, as before.
    expect(fleetFlight(w.deps, key, 'r1', signal).deadlineAt).toBeUndefined();
  });
});
