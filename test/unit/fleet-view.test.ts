/**
 * The fleet view (`functions/lib/fleet/view.ts`) from a memory store laid out as the install
 * function and the rollouts write it, and the embedded HTTP server's fleet routes
 * (`functions/embedded/metrics-server.ts`): the page with its CSP, the JSON view, 404 and 405.
 */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { startMetricsServer } from '../../functions/embedded/metrics-server.js';
import { FLEET_PAGE_HTML, fleetPageCsp } from '../../functions/lib/fleet/page.js';
import {
  buildFleetView,
  FLEET_INDEX_PREFIX,
  FleetViewCache,
  FleetViewSource,
  MAX_INSTALLS_PER_CLUSTER,
  RECEIPT_RELIST_MS,
  ROLLOUTS_PREFIX,
} from '../../functions/lib/fleet/view.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { main as fleetMain } from '../../scripts/fleet.js';
import { formatFleetStatus } from '../../scripts/fleet-status.js';
import { putReceipt } from '../harness/receipt-fixture.js';

const NOW = Date.parse('2026-12-07T10:00:00Z');
const index = (cluster: string, name: string, doc: Record<string, unknown>) =>
  [`${FLEET_INDEX_PREFIX}${cluster}/default/${name}.json`, JSON.stringify(doc)] as const;

const HELLO_A = { clusterId: 'kind-a', namespace: 'default', name: 'hello' };

/** Cluster kind-a's index entry: upgraded, unhealthy. */
const KIND_A = {
  refName: 'hello.example.com',
  version: '2.0.0',
  lastAttemptedVersion: '2.0.0',
  reconcile: 'succeeded',
  health: 'False',
  wave: 'canary',
  at: '2026-12-07T09:59:00Z',
};

/** {@link KIND_A} as the view shows it: the condition's status as a boolean. */
const { health: _health, ...KIND_A_FIELDS } = KIND_A;
const KIND_A_SHOWN = { ...KIND_A_FIELDS, healthy: false };

async function fleetStore(): Promise<MemoryStore> {
  const store = new MemoryStore();
  const docs = [
    index('kind-b', 'hello', {
      refName: 'hello.example.com',
      version: '1.0.0',
      reconcile: 'succeeded',
      health: 'True',
      wave: 'rest',
    }),
    index('kind-a', 'hello', KIND_A),
    // Not JSON, a body naming another identity, a wrongly shaped key: left out or keyed by the key.
    [`${FLEET_INDEX_PREFIX}kind-c/default/broken.json`, '{not json'],
    index('kind-c', 'liar', { clusterId: 'kind-a', namespace: 'x', version: '9.9.9', health: 'yes' }),
    [`${FLEET_INDEX_PREFIX}kind-c/too/deep/x.json`, '{}'],
    [
      `${ROLLOUTS_PREFIX}default/hello.example.com.json`,
      JSON.stringify({
        target: '2.0.0',
        from: '1.0.0',
        status: 'stopped',
        cause: 'kind-a/default/hello: unhealthy',
        waves: [{ name: 'canary', releasedAt: '2026-12-07T09:58:00Z' }, { name: 'rest' }, { nope: 1 }],
        history: [{ at: '2026-12-07T09:58:00Z', what: 'wave canary released' }, { at: 5 }],
      }),
    ],
    [`${ROLLOUTS_PREFIX}default/no-target.json`, '{}'],
  ] as const;
  for (const [key, body] of docs) await store.put(key, body);
  await putReceipt(store, HELLO_A, '20261207-095800-000-aaaaaaaa', {
    startedAt: '2026-12-07T09:57:00Z',
    endedAt: '2026-12-07T09:57:30Z',
    usd: 0.5,
  });
  await putReceipt(store, HELLO_A, '20261207-095900-000-bbbbbbbb', {
    startedAt: '2026-12-07T09:59:00Z',
    endedAt: '2026-12-07T09:59:02.500Z',
    usd: 0.000125,
  });
  return store;
}

describe('buildFleetView', () => {
  it('reads the index, the rollouts and each install’s newest receipt; keeps identities from keys; skips what does not parse', async () => {
    const store = await fleetStore();
    const view = await buildFleetView(store, { clusters: ['kind-z'], now: () => NOW });
    expect(view.generatedAt).toBe('2026-12-07T10:00:00.000Z');
    expect(view.clusters).toEqual(['kind-a', 'kind-b', 'kind-c', 'kind-z']);
    expect(view.installs).toEqual([
      {
        clusterId: 'kind-a',
        namespace: 'default',
        name: 'hello',
        ...KIND_A_SHOWN,
        lastReconcile: {
          outcome: 'succeeded',
          endedAt: '2026-12-07T09:59:02.500Z',
          durationMs: 2500,
          costUsd: 0.000125,
        },
      },
      {
        clusterId: 'kind-b',
        namespace: 'default',
        name: 'hello',
        refName: 'hello.example.com',
        version: '1.0.0',
        reconcile: 'succeeded',
        healthy: true,
        wave: 'rest',
      },
      // The body's identity is ignored, a non-boolean health dropped.
      { clusterId: 'kind-c', namespace: 'default', name: 'liar', version: '9.9.9' },
    ]);
    expect(view.rollouts).toEqual([
      {
        policy: 'default',
        refName: 'hello.example.com',
        target: '2.0.0',
        from: '1.0.0',
        status: 'stopped',
        cause: 'kind-a/default/hello: unhealthy',
        waves: [{ name: 'canary', releasedAt: '2026-12-07T09:58:00Z' }, { name: 'rest' }],
        history: [{ at: '2026-12-07T09:58:00Z', what: 'wave canary released' }],
      },
    ]);
  });

  it('reads a receipt once, and lists receipts again only when the entry changed or a minute passed', async () => {
    const store = await fleetStore();
    const cache = new FleetViewCache();
    const gets: string[] = [];
    const lists: string[] = [];
    const counting = Object.assign(Object.create(store) as MemoryStore, {
      get: (key: string, opts?: Parameters<MemoryStore['get']>[1]) => {
        gets.push(key);
        return store.get(key, opts);
      },
      list: (prefix: string, opts?: Parameters<MemoryStore['list']>[1]) => {
        lists.push(prefix);
        return store.list(prefix, opts);
      },
    });
    const receiptLists = () => lists.filter((p) => p.startsWith('receipts/')).length;
    let now = NOW;
    await buildFleetView(counting, { cache, now: () => now });
    const firstLists = receiptLists();
    await buildFleetView(counting, { cache, now: () => now });
    expect(gets.filter((k) => k.startsWith('receipts/'))).toHaveLength(1);
    expect(receiptLists()).toBe(firstLists);

    // A receipt of a reconcile that left the entry as it was: shown once a minute has passed.
    await putReceipt(store, HELLO_A, '20261207-100000-000-cccccccc', {
      startedAt: '2026-12-07T10:00:00Z',
      endedAt: '2026-12-07T10:00:01Z',
      usd: 0.25,
    });
    now += RECEIPT_RELIST_MS - 1;
    expect((await buildFleetView(counting, { cache, now: () => now })).installs[0]?.lastReconcile).toMatchObject({
      costUsd: 0.000125,
    });
    now += 1;
    expect((await buildFleetView(counting, { cache, now: () => now })).installs[0]?.lastReconcile).toMatchObject({
      durationMs: 1000,
      costUsd: 0.25,
    });

    // A reconcile that rewrote the entry: its receipt is shown at the next build.
    await putReceipt(store, HELLO_A, '20261207-100100-000-dddddddd', {
      startedAt: '2026-12-07T10:01:00Z',
      endedAt: '2026-12-07T10:01:03Z',
      usd: 0.75,
    });
    await store.put(...index('kind-a', 'hello', { ...KIND_A, at: '2026-12-07T10:01:04Z' }));
    expect((await buildFleetView(counting, { cache, now: () => now })).installs[0]?.lastReconcile).toMatchObject({
      durationMs: 3000,
      costUsd: 0.75,
    });
  });

  it('lists no receipts again for an unchanged entry in a fleet of more PackageInstalls than the receipt cache holds', async () => {
    const store = new MemoryStore();
    const n = FleetViewCache.MAX_RECEIPTS + 1;
    const entry = JSON.stringify({ refName: 'r', reconcile: 'succeeded', at: '2026-12-07T10:00:00Z' });
    // Over four clusters: one cluster is read up to MAX_INSTALLS_PER_CLUSTER entries.
    for (let i = 0; i < n; i++) await store.put(`${FLEET_INDEX_PREFIX}c${i % 4}/ns/pi-${i}.json`, entry);
    let receiptLists = 0;
    const counting = Object.assign(Object.create(store) as MemoryStore, {
      list: (prefix: string, opts?: Parameters<MemoryStore['list']>[1]) => {
        if (prefix.startsWith('receipts/')) receiptLists++;
        return store.list(prefix, opts);
      },
    });
    const cache = new FleetViewCache();
    await buildFleetView(counting, { cache, now: () => NOW });
    expect(receiptLists).toBe(n);
    await buildFleetView(counting, { cache, now: () => NOW + 1000 });
    // Before: the oldest listing was evicted for the last one, and each build's misses evicted
    // listings it was about to use (at twice the cap, every listing missed at every build).
    expect(receiptLists).toBe(n);
  }, 60_000);

  it('keeps at most `reads` store requests in flight, whatever the number of entries', async () => {
    const store = await fleetStore();
    for (let i = 0; i < 40; i++) {
      await store.put(
        `${FLEET_INDEX_PREFIX}c${i}/ns/pi.json`,
        JSON.stringify({
          clusterId: `c${i}`,
          namespace: 'ns',
          name: 'pi',
          refName: 'r',
          reconcile: 'succeeded',
          at: '2026-12-07T10:00:00Z',
        }),
      );
    }
    let inFlight = 0;
    let most = 0;
    const tracked = <T>(p: () => Promise<T>) => {
      inFlight++;
      most = Math.max(most, inFlight);
      return new Promise<void>((r) => setImmediate(r)).then(p).finally(() => inFlight--);
    };
    const counting = Object.assign(Object.create(store) as MemoryStore, {
      get: (key: string, opts?: Parameters<MemoryStore['get']>[1]) => tracked(() => store.get(key, opts)),
      list: (prefix: string, opts?: Parameters<MemoryStore['list']>[1]) => tracked(() => store.list(prefix, opts)),
    });
    const view = await buildFleetView(counting, { reads: 4 });
    expect(view.installs.filter((i) => /^c\d+$/.test(i.clusterId))).toHaveLength(40);
    // Each of the 4 workers holds one request at a time (an entry's GET, then its receipts' LIST).
    expect(most).toBeLessThanOrEqual(4 + 2);
    expect(most).toBeGreaterThan(1);
  });
});

describe('a cluster with too many index entries', () => {
  it('reads at most MAX_INSTALLS_PER_CLUSTER of its entries, marks it, and leaves the other clusters whole', async () => {
    const store = await fleetStore();
    const entry = JSON.stringify({ refName: 'r', reconcile: 'succeeded', at: '2026-12-07T10:00:00Z' });
    for (let i = 0; i < MAX_INSTALLS_PER_CLUSTER + 3; i++) {
      await store.put(`${FLEET_INDEX_PREFIX}noisy/ns/pi-${String(i).padStart(5, '0')}.json`, entry);
    }
    const gets: string[] = [];
    const counting = Object.assign(Object.create(store) as MemoryStore, {
      get: (key: string, opts?: Parameters<MemoryStore['get']>[1]) => {
        gets.push(key);
        return store.get(key, opts);
      },
    });
    const view = await buildFleetView(counting, { now: () => NOW });
    expect(view.installs.filter((i) => i.clusterId === 'noisy')).toHaveLength(MAX_INSTALLS_PER_CLUSTER);
    expect(gets.filter((k) => k.startsWith(`${FLEET_INDEX_PREFIX}noisy/`))).toHaveLength(MAX_INSTALLS_PER_CLUSTER);
    expect(view.truncated).toEqual(['noisy']);
    expect(view.installs.filter((i) => i.clusterId === 'kind-a')).toHaveLength(1);
    expect(formatFleetStatus(view)).toContain(
      `clusters with more than ${MAX_INSTALLS_PER_CLUSTER} PackageInstalls, the first ${MAX_INSTALLS_PER_CLUSTER} shown: noisy`,
    );
    expect((await buildFleetView(await fleetStore(), { now: () => NOW })).truncated).toBeUndefined();
  }, 60_000);
});

describe('FleetViewSource', () => {
  /** A store whose listings wait for `gate` while one is set and fail while `broken`; counts listings. */
  class GatedStore extends MemoryStore {
    lists = 0;
    broken = false;
    gate: Promise<void> | undefined;
    override async list(prefix: string, opts?: Parameters<MemoryStore['list']>[1]): Promise<string[]> {
      this.lists++;
      const broken = this.broken;
      if (this.gate) await this.gate;
      if (broken) throw new Error('NoSuchBucket');
      return super.list(prefix, opts);
    }
  }

  it('builds one view at a time: requests during a build share it and its outcome, a failure included', async () => {
    const store = new GatedStore();
    let release = () => {};
    store.gate = new Promise<void>((r) => {
      release = r;
    });
    store.broken = true;
    const source = new FleetViewSource(store, { maxAgeMs: 0 });
    const first = source.view();
    const second = source.view();
    const listed = store.lists;
    store.broken = false;
    store.gate = undefined;
    release();
    await expect(first).rejects.toThrow('NoSuchBucket');
    await expect(second).rejects.toThrow('NoSuchBucket');
    expect(store.lists).toBe(listed);
    // A failure is not kept: the next request builds again, and reads the store back.
    expect((await source.view()).clusters).toEqual([]);
  });

  it('reuses a built view for maxAgeMs from its build start, then builds again', async () => {
    const store = await fleetStore();
    const counted = new GatedStore();
    for (const key of await store.list('')) await counted.put(key, (await store.get(key)) as Buffer);
    let now = 1_000_000;
    const source = new FleetViewSource(counted, { maxAgeMs: 1000, now: () => now, clusters: () => ['idle'] });
    const a = await source.view();
    expect(a.clusters).toContain('idle');
    const lists = counted.lists;
    now += 999;
    expect(await source.view()).toBe(a);
    expect(counted.lists).toBe(lists);
    now += 1;
    const b = await source.view();
    expect(b).not.toBe(a);
    expect(counted.lists).toBeGreaterThan(lists);
  });
});

describe('npm run fleet -- status', () => {
  it('says why an empty store shows no cluster, and says nothing of it once one reported', async () => {
    const empty = formatFleetStatus(await buildFleetView(new MemoryStore(), { now: () => NOW }));
    expect(empty).toContain(
      'no PackageInstall has reported yet: a cluster shows here once a PackageInstall of it has reconciled',
    );
    expect(formatFleetStatus(await buildFleetView(await fleetStore(), { now: () => NOW }))).not.toContain(
      'reported yet',
    );
  });

  it('prints each rollout, then clusters × PackageInstalls with health, wave and the last reconcile', async () => {
    const view = await buildFleetView(await fleetStore(), { clusters: ['kind-z'], now: () => NOW });
    expect(formatFleetStatus(view).split('\n')).toEqual([
      'ROLLOUT default/hello.example.com 1.0.0 -> 2.0.0 stopped waves 1/2 (kind-a/default/hello: unhealthy)',
      '',
      'CLUSTER  PACKAGEINSTALL  PACKAGE            VERSION  HEALTH     WAVE    LAST RECONCILE',
      'kind-a   default/hello   hello.example.com  2.0.0    unhealthy  canary  succeeded 58s ago, 2.5s, $0.000125',
      'kind-b   default/hello   hello.example.com  1.0.0    healthy    rest    -',
      'kind-c   default/liar    -                  9.9.9    unknown    -       -',
      '',
      'clusters without a PackageInstall: kind-z',
      '',
    ]);
  });
});

describe('npm run fleet -- status, the command line', () => {
  it('prints the table from the store it is given, or the view as JSON with -o json', async () => {
    const store = await fleetStore();
    const out: string[] = [];
    const io = {
      store: () => store,
      readFile: async () => '',
      out: (t: string) => void out.push(t),
      err: (t: string) => void out.push(`err: ${t}`),
      now: () => new Date(NOW),
    };
    expect(await fleetMain(['status', '--store', 'file:///unused'], {}, io)).toBe(0);
    expect(out.join('')).toBe(formatFleetStatus(await buildFleetView(store, { now: () => NOW })));
    out.length = 0;
    expect(await fleetMain(['status', '-o', 'json'], {}, io)).toBe(0);
    expect((JSON.parse(out.join('')) as { clusters: string[] }).clusters).toEqual(['kind-a', 'kind-b', 'kind-c']);
    expect(await fleetMain(['status', 'extra'], {}, io)).toBe(2);
    out.length = 0;
    expect(await fleetMain(['status', '--store', '/tmp/not-a-url'], {}, io)).toBe(2);
    expect(out.join('')).toContain('--store "/tmp/not-a-url": expected s3://bucket/prefix or file:///absolute/dir');
  });
});

describe('the fleet routes of the runtime HTTP server', () => {
  it('serves the page under its CSP, the view as JSON, 404 elsewhere, 405 for other methods', async () => {
    const store = await fleetStore();
    const server = await startMetricsServer(new Registry(), '127.0.0.1:0', {
      fleet: () => buildFleetView(store, { now: () => NOW }),
    });
    const base = `http://127.0.0.1:${server.address.port}`;
    try {
      const page = await fetch(`${base}/`);
      expect(page.status).toBe(200);
      expect(page.headers.get('content-security-policy')).toBe(fleetPageCsp());
      expect(await page.text()).toBe(FLEET_PAGE_HTML);
      const api = await fetch(`${base}/api/fleet`);
      expect(api.headers.get('content-type')).toBe('application/json');
      expect(((await api.json()) as { clusters: string[] }).clusters).toEqual(['kind-a', 'kind-b', 'kind-c']);
      expect((await fetch(`${base}/metrics`)).status).toBe(200);
      expect((await fetch(`${base}/elsewhere`)).status).toBe(404);
      expect((await fetch(`${base}/api/fleet`, { method: 'POST' })).status).toBe(405);
    } finally {
      await server.close();
    }
    // Without the fleet, only /metrics.
    const bare = await startMetricsServer(new Registry(), '127.0.0.1:0');
    try {
      expect((await fetch(`http://127.0.0.1:${bare.address.port}/`)).status).toBe(404);
    } finally {
      await bare.close();
    }
  });

  it("the CSP allows the page's own style and script only", () => {
    const csp = fleetPageCsp();
    expect(csp).toMatch(
      /^default-src 'none'; style-src 'sha256-[A-Za-z0-9+/]+='; script-src 'sha256-[A-Za-z0-9+/]+='; connect-src 'self'/,
    );
    expect(FLEET_PAGE_HTML).not.toMatch(/ style="|<script src|<link /);
  });
});
