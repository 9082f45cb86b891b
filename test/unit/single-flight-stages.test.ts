/**
 * Fleet single-flight in the fetch and template stages: many clusters running the same pinned
 * fetch or the same shared render at once share one object store, and the tool runs once; the
 * others hand on the artifact it made (outcome `cached`). Secret-derived content never takes an
 * in-flight marker. Faked at the ports: one fake cluster and runner per cluster id, one memory
 * store counting the marker operations.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setImmediate as tick } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { serializeEvent, templateEvent } from '../../events/schema.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { INFLIGHT_PREFIX } from '../../functions/lib/artifact/keys.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { ConditionalPutResult, GetOptions, ObjectBody, VersionedObject } from '../../functions/lib/store/port.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  type AppShape,
  appObject,
  appWorld,
  NOW,
  putFetchArtifact,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('single-flight-stages-');
const N = 10;
const PINNED = { fetch: [{ inline: { paths: { 'config.yml': 'a: 1\n' } } }] };
const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';

/** A memory store that counts reads of in-flight markers and records their writes. */
class MarkerCountingStore extends MemoryStore {
  markerReads = 0;
  readonly markerWrites: string[] = [];
  override async getVersioned(key: string, opts?: GetOptions): Promise<VersionedObject | undefined> {
    if (key.startsWith(INFLIGHT_PREFIX)) this.markerReads++;
    return await super.getVersioned(key, opts);
  }
  override async putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined): Promise<ConditionalPutResult> {
    if (key.startsWith(INFLIGHT_PREFIX)) this.markerWrites.push(key);
    return await super.putIfMatch(key, body, ifMatch);
  }
  /** Resolves once the markers were read `n` times (every runner has reached the flight). */
  async markersRead(n: number): Promise<void> {
    while (this.markerReads < n) await tick();
  }
}

/** `n` cluster ids with the same App, over one store. */
function fleet(n: number, store: MarkerCountingStore, shape: AppShape, extra = {}) {
  return Array.from({ length: n }, () =>
    appWorld({ app: appObject(shape), store, tmpRoot: path.join(tempDir(), 'scratch'), extra }),
  );
}

describe('fleet single-flight in the stages', () => {
  it(`${N} clusters fetching the same pinned sources at once run vendir once`, async () => {
    const store = new MarkerCountingStore();
    const worlds = fleet(N, store, { status: SUCCEEDED_BEFORE, spec: PINNED });
    for (const w of worlds) {
      // vendir returns only once every runner has reached the marker (the others are waiting).
      w.runner.on('vendir', async (req: RunRequest) => {
        await store.markersRead(N);
        await writeFile(path.join(req.cwd ?? '', 'config.yml'), 'a: 1\n');
        return { stdout: 'lock: vendir\n', exitCode: 0 };
      });
    }
    const outs = await Promise.all(
      worlds.map((w) => {
        const app = structuredClone(w.app()!);
        return runFetch({ clusterId: REF.clusterId, ref: REF, run: RUN }, { raw: app as never, app }, w.deps);
      }),
    );
    expect(worlds.flatMap((w) => w.tools())).toEqual(['vendir']);
    const fetchKeys = await store.list('artifacts/fetch/');
    expect(fetchKeys).toHaveLength(1);
    for (const out of outs) expect(out.template?.artifacts).toEqual({ fetchKey: fetchKeys[0] });
    // The waiters show vendir's lock output from the record, as a cache hit does.
    for (const out of outs) expect(out.template?.fetchStatus?.stdout).toBe('lock: vendir\n');
    const outcomes = worlds.flatMap((w) => w.outcomes().map(([, o]) => o));
    expect(outcomes.sort()).toEqual([...Array(N - 1).fill('cached'), 'succeeded']);
    expect(await store.list(INFLIGHT_PREFIX)).toEqual([]);
  });

  it(`${N} clusters rendering the same shared inputs at once run ytt once`, async () => {
    const store = new MarkerCountingStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const worlds = fleet(N, store, { status: SUCCEEDED_BEFORE });
    for (const w of worlds) {
      w.runner.on('ytt', async () => {
        await store.markersRead(N);
        return { stdout: MANIFEST };
      });
    }
    const data = { object: REF, run: RUN, artifacts: { fetchKey } };
    const nexts = await Promise.all(
      worlds.map((w) => dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps)),
    );
    expect(worlds.flatMap((w) => w.tools())).toEqual(['ytt']);
    const manifests = await store.list('artifacts/template/');
    expect(manifests).toHaveLength(1);
    for (const next of nexts) {
      expect(next?.data).toMatchObject({ artifacts: { fetchKey, manifestKey: manifests[0] } });
    }
    const outcomes = worlds.flatMap((w) => w.outcomes().map(([, o]) => o));
    expect(outcomes.sort()).toEqual([...Array(N - 1).fill('cached'), 'succeeded']);
    expect(await store.list(INFLIGHT_PREFIX)).toEqual([]);
  });

  it('a render whose holder fails (ytt exits 1): every waiter runs ytt itself and reports its own failure', async () => {
    const store = new MarkerCountingStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const worlds = fleet(4, store, { status: SUCCEEDED_BEFORE });
    worlds.forEach((w, i) => {
      w.runner.on('ytt', async () => {
        if (i === 0) await store.markersRead(4);
        return { stderr: `ytt: Error: cluster ${i}`, exitCode: 1 };
      });
    });
    const data = { object: REF, run: RUN, artifacts: { fetchKey } };
    await Promise.all(worlds.map((w) => dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps)));
    expect(worlds.map((w) => w.tools())).toEqual(Array(4).fill(['ytt']));
    worlds.forEach((w, i) => {
      expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(`ytt: Error: cluster ${i}`);
    });
  });

  it("the function deadline while waiting for another runner's render: no ytt, no status, the record is retried", async () => {
    const store = new MarkerCountingStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const [holder, waiter] = fleet(2, store, { status: SUCCEEDED_BEFORE });
    let release!: () => void;
    const released = new Promise<void>((r) => {
      release = r;
    });
    holder!.runner.on('ytt', async () => {
      await released;
      return { stdout: MANIFEST };
    });
    waiter!.runner.on('ytt', async () => ({ stdout: MANIFEST }));
    const data = { object: REF, run: RUN, artifacts: { fetchKey } };
    const held = dispatchEvent(templateEvent(data, { time: new Date(NOW) }), holder!.deps);
    while (store.markerWrites.length === 0) await tick();
    const handler = makeSqsHandler('template', () => ({
      pipeline: waiter!.deps,
      sender: new MemoryEventSender(),
      log: waiter!.log,
      deadlineMarginMs: 1000,
    }));
    // 3.1 s left: the deadline fires 2.1 s in, while the holder's ytt still runs (100 ms could pass
    // on a loaded machine before the waiter had started waiting).
    const body = serializeEvent(templateEvent(data, { time: new Date(NOW) }));
    const res = await handler(
      { Records: [{ messageId: 'm1', body }] },
      { awsRequestId: 'r1', getRemainingTimeInMillis: () => 3100 },
    );
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm1' }] });
    expect(waiter!.tools()).toEqual([]);
    expect(waiter!.statuses()).toEqual([]);
    const errors = waiter!.log.records.map((r) => JSON.stringify(r.obj.error ?? ''));
    expect(errors.some((e) => e.includes('the function deadline came while waiting for another runner'))).toBe(true);
    release();
    await held;
    expect(holder!.tools()).toEqual(['ytt']);
  });

  it('secret-derived content (a ytt values Secret) never takes a marker: each cluster renders its own', async () => {
    const store = new MarkerCountingStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const worlds = fleet(
      4,
      store,
      {
        status: SUCCEEDED_BEFORE,
        spec: { template: [{ ytt: { valuesFrom: [{ secretRef: { name: 'vals' } }] } }] },
      },
      { keyring: new DerivedKeyring(Buffer.alloc(32, 7)) },
    );
    for (const w of worlds) {
      w.cluster.secrets.set(`${REF.namespace}/vals`, {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'vals', namespace: REF.namespace },
        data: { 'v.yml': Buffer.from('p: 1\n').toString('base64') },
      } as never);
      w.runner.on('ytt', async () => ({ stdout: MANIFEST }));
    }
    const data = { object: REF, run: RUN, artifacts: { fetchKey } };
    await Promise.all(worlds.map((w) => dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps)));
    expect(worlds.flatMap((w) => w.tools())).toHaveLength(4);
    expect(store.markerReads).toBe(0);
    expect(store.markerWrites).toEqual([]);
  });
});
