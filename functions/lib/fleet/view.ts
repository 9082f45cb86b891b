/**
 * The fleet at a glance (issue 28 item 5): clusters × PackageInstalls with version, health, wave
 * and last reconcile, and the fleet's rollouts, read from the object store alone, so the CLI
 * (`npm run fleet -- status`), the page `npm start` serves and its tests need no cluster
 * credentials and put no load on any API server.
 *
 * Sources, each read leniently (a document that does not parse is left out, never fails the view):
 * - the fleet index, one document per PackageInstall at `state/fleet/<cluster>/<ns>/<name>.json`,
 *   which the install function writes when it changes (`../rollout/state.ts`, {@link FLEET_INDEX_PREFIX});
 * - the rollouts, `state/rollouts/<policy>/<refName>.json` ({@link ROLLOUTS_PREFIX});
 * - each PackageInstall's App's newest receipt (`../receipt/receipt.ts`): the last reconcile's
 *   duration and cost. A receipt never changes once written, so a {@link FleetViewCache} keeps
 *   what it read, and lists a PackageInstall's receipts again when its entry changed or after
 *   {@link RECEIPT_RELIST_MS}.
 *
 * A build reads every index entry (a GET each) and lists the receipts of the PackageInstalls whose
 * entry changed, at most {@link FLEET_VIEW_READS} requests at once. The page polls every second, so
 * its servers build through a {@link FleetViewSource}: one build at a time for every reader of a
 * process, reused for a second, whatever the number of open pages.
 *
 * @module
 */
import pMap from 'p-map';
import { type Receipt, readReceipt, receiptPrefix } from '../receipt/receipt.js';
import { FLEET_PREFIX, ROLLOUT_PREFIX } from '../rollout/state.js';
import type { ObjectStore } from '../store/port.js';

/** Where the install function keeps one document per PackageInstall: `<cluster>/<ns>/<name>.json` under it. */
export const FLEET_INDEX_PREFIX = FLEET_PREFIX;
/** Where the rollouts are kept: `<policy>/<refName>.json` under it. */
export const ROLLOUTS_PREFIX = ROLLOUT_PREFIX;

/**
 * Most store requests a view build has in flight (default of {@link buildFleetView}): a fleet of
 * 50,000 PackageInstalls must not open 100,000 requests at once in one process (sockets, memory,
 * the bucket's request rate); 32 keep a build of 1,000 entries near a second against S3.
 */
export const FLEET_VIEW_READS = 32;

/** A PackageInstall's last reconcile, from its App's newest receipt. */
export interface FleetReconcile {
  /** `succeeded` or `failed`. */
  outcome: string;
  /** When it ended (RFC 3339). */
  endedAt: string;
  /** How long it ran, ms (start to end). */
  durationMs: number;
  /** What it cost (the receipt's estimate), USD. */
  costUsd: number;
}

/** One PackageInstall of one cluster, as the fleet index records it. */
export interface FleetInstall {
  clusterId: string;
  namespace: string;
  name: string;
  /** The package's refName (`spec.packageRef.refName`). */
  refName?: string;
  /** The version it runs (`status.version`). */
  version?: string;
  /** The version it last tried (`status.lastAttemptedVersion`). */
  lastAttemptedVersion?: string;
  /** `succeeded`, `failed` or `reconciling`. */
  reconcile?: string;
  /** Whether what it deployed is healthy: `true`, `false`, or absent when not known. */
  healthy?: boolean;
  /** Its wave in the rollout of its package, when a policy covers it. */
  wave?: string;
  /** When the index entry was written (RFC 3339). */
  at?: string;
  /** Its last reconcile, when its App has a receipt. */
  lastReconcile?: FleetReconcile;
}

/** One wave of a rollout. */
export interface FleetWave {
  name: string;
  releasedAt?: string;
  healthyAt?: string;
  completedAt?: string;
}

/** One rollout of a package version across the fleet. */
export interface FleetRollout {
  policy: string;
  refName: string;
  /** The version being rolled out. */
  target: string;
  /** The version it replaces, when known. */
  from?: string;
  /** `running`, `paused`, `stopped`, `aborted` or `completed`. */
  status: string;
  /** Why it stopped, when it did. */
  cause?: string;
  waves: FleetWave[];
  /** What happened, oldest first (the page's timeline). */
  history: { at: string; what: string }[];
}

/** The whole view ({@link buildFleetView}). */
export interface FleetView {
  /** When it was built (RFC 3339). */
  generatedAt: string;
  /** Every cluster id known: those given and those with an index entry, sorted. */
  clusters: string[];
  /** Sorted by cluster, namespace, name. */
  installs: FleetInstall[];
  /** Sorted by policy, refName. */
  rollouts: FleetRollout[];
  /**
   * Clusters with more index entries than {@link MAX_INSTALLS_PER_CLUSTER}: only that many of
   * theirs are shown (the first by key). Absent when none.
   */
  truncated?: string[];
}

/**
 * Most index entries of one cluster a view reads (5,000; a cluster runs tens of PackageInstalls,
 * rarely hundreds). In the cloud mode a cluster's runs write its own `state/fleet/<cluster>/`, so
 * a tenant could plant millions: each build would read them all, slowing every open page of the
 * fleet and billing the reads. The rest are listed, not read, and the cluster is marked.
 */
export const MAX_INSTALLS_PER_CLUSTER = 5000;

/**
 * How long a PackageInstall's receipt listing is reused while its index entry is unchanged, ms
 * (60 s). A reconcile that changes the PackageInstall rewrites its entry (its `at`), so the new
 * receipt is listed at the next build after its entry changed; one that changes nothing shows
 * within a minute. Without it every build listed every PackageInstall's receipts.
 */
export const RECEIPT_RELIST_MS = 60_000;

/**
 * What a {@link buildFleetView} keeps between builds: receipts by key (a receipt never changes),
 * and each PackageInstall's newest receipt key with the entry time it was listed for.
 */
export class FleetViewCache {
  readonly #receipts = new Map<string, Receipt | null>();
  readonly #newest = new Map<string, { at: string | undefined; listedAt: number; key: string | undefined }>();
  /** Most receipts kept; the oldest read goes first. */
  static readonly MAX_RECEIPTS = 10_000;

  /** The receipt under `key` (`id` of `owner`), read once. */
  async receipt(
    store: ObjectStore,
    owner: { clusterId: string; namespace: string; name: string },
    key: string,
    id: string,
  ): Promise<Receipt | undefined> {
    if (!this.#receipts.has(key)) {
      const r = await readReceipt(store, owner, id).catch(() => undefined);
      this.#receipts.set(key, r ?? null);
      if (this.#receipts.size > FleetViewCache.MAX_RECEIPTS) {
        this.#receipts.delete(this.#receipts.keys().next().value as string);
      }
    }
    return this.#receipts.get(key) ?? undefined;
  }

  /**
   * The newest receipt key under `prefix` (`undefined`: none), listed again only when `at` (the
   * index entry's time) differs from the last listing's or that listing is
   * {@link RECEIPT_RELIST_MS} old.
   */
  async newestReceipt(
    store: ObjectStore,
    prefix: string,
    at: string | undefined,
    now: number,
  ): Promise<string | undefined> {
    const memo = this.#newest.get(prefix);
    if (memo && memo.at === at && now - memo.listedAt < RECEIPT_RELIST_MS) return memo.key;
    // Receipt ids sort by time (`<yyyymmdd-hhmmss-mmm>-<8 hex>`): the last key is the newest.
    const key = (await store.list(prefix).catch(() => [] as string[])).filter((k) => k.endsWith('.json')).at(-1);
    this.#newest.set(prefix, { at, listedAt: now, key });
    return key;
  }

  /**
   * Forgets the listings of every prefix but `kept` (the PackageInstalls of the build that just
   * ended): the listings kept are as many as the index's entries, which a build holds anyway. A
   * fixed cap, evicting the oldest, missed every entry at each build once the fleet had more
   * PackageInstalls than it (a build reads them in the same order), listing every one's receipts.
   */
  forgetListingsBut(kept: ReadonlySet<string>): void {
    for (const prefix of this.#newest.keys()) if (!kept.has(prefix)) this.#newest.delete(prefix);
  }
}

const str = (v: unknown): string | undefined => (typeof v === 'string' && v.length <= 1024 ? v : undefined);

/** Every key under `prefix`, page after page. */
async function listAll(store: ObjectStore, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for (let page = await store.list(prefix); page.length > 0; ) {
    keys.push(...page);
    page = await store.list(prefix, { startAfter: page[page.length - 1] as string });
  }
  return keys;
}

/** The JSON document under `key`, or `undefined` when it is absent or no JSON object. */
async function readJson(store: ObjectStore, key: string): Promise<Record<string, unknown> | undefined> {
  const body = await store.get(key, { maxBytes: 1024 * 1024 }).catch(() => undefined);
  if (!body) return undefined;
  try {
    const v = JSON.parse(body.toString('utf8')) as unknown;
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** An index entry as a {@link FleetInstall}; its identity comes from its key, never its body. */
function installOf(key: string, doc: Record<string, unknown>): FleetInstall | undefined {
  const m = /^([^/]+)\/([^/]+)\/([^/]+)\.json$/.exec(key.slice(FLEET_INDEX_PREFIX.length));
  if (!m) return undefined;
  const [, clusterId, namespace, name] = m as unknown as [string, string, string, string];
  const out: FleetInstall = { clusterId, namespace, name };
  for (const f of ['refName', 'version', 'lastAttemptedVersion', 'reconcile', 'wave', 'at'] as const) {
    const v = str(doc[f]);
    if (v !== undefined) out[f] = v;
  }
  // The index's `health` is the App's Healthy condition status (`True`, `False`, `Unknown`).
  if (doc.health === 'True') out.healthy = true;
  if (doc.health === 'False') out.healthy = false;
  return out;
}

/** A rollout document as a {@link FleetRollout}; policy and refName come from its key. */
function rolloutOf(key: string, doc: Record<string, unknown>): FleetRollout | undefined {
  const m = /^([^/]+)\/([^/]+)\.json$/.exec(key.slice(ROLLOUTS_PREFIX.length));
  const target = str(doc.target);
  if (!m || target === undefined) return undefined;
  const waves = (Array.isArray(doc.waves) ? doc.waves : []).flatMap((w): FleetWave[] => {
    const o = (w ?? {}) as Record<string, unknown>;
    const name = str(o.name);
    if (name === undefined) return [];
    const wave: FleetWave = { name };
    for (const f of ['releasedAt', 'healthyAt', 'completedAt'] as const) {
      const v = str(o[f]);
      if (v !== undefined) wave[f] = v;
    }
    return [wave];
  });
  const history = (Array.isArray(doc.history) ? doc.history : []).flatMap((h) => {
    const o = (h ?? {}) as Record<string, unknown>;
    const at = str(o.at);
    const what = str(o.what);
    return at !== undefined && what !== undefined ? [{ at, what }] : [];
  });
  const from = str(doc.from);
  const cause = str(doc.cause);
  return {
    policy: m[1] as string,
    refName: m[2] as string,
    target,
    ...(from !== undefined ? { from } : {}),
    status: str(doc.status) ?? 'running',
    ...(cause !== undefined ? { cause } : {}),
    waves,
    history,
  };
}

/** The newest receipt of `install`'s App as its last reconcile, when there is one. */
async function lastReconcileOf(
  store: ObjectStore,
  cache: FleetViewCache,
  install: FleetInstall,
  now: number,
): Promise<FleetReconcile | undefined> {
  const owner = { clusterId: install.clusterId, namespace: install.namespace, name: install.name };
  const prefix = receiptPrefix(owner);
  const newest = await cache.newestReceipt(store, prefix, install.at, now);
  if (!newest) return undefined;
  const r = await cache.receipt(store, owner, newest, newest.slice(prefix.length, -'.json'.length));
  if (!r) return undefined;
  return {
    outcome: r.outcome,
    endedAt: r.endedAt,
    durationMs: Math.max(0, Date.parse(r.endedAt) - Date.parse(r.startedAt)),
    costUsd: r.cost.usd,
  };
}

/**
 * Builds the fleet view from `store` ({@link FleetView}).
 *
 * @param opts.clusters - cluster ids to show even without an index entry (the clusters a runtime
 *   serves, or the registry's): a cluster that has no PackageInstall yet is still on the page.
 * @param opts.cache - receipts read before; default a new one (every receipt read again).
 * @param opts.now - the clock; default `Date.now`.
 * @param opts.reads - most requests in flight at once; default {@link FLEET_VIEW_READS}.
 * @throws StoreError when a prefix cannot be listed (a document that cannot be read is left out).
 */
export async function buildFleetView(
  store: ObjectStore,
  opts: { clusters?: readonly string[]; cache?: FleetViewCache; now?: () => number; reads?: number } = {},
): Promise<FleetView> {
  const cache = opts.cache ?? new FleetViewCache();
  const now = (opts.now ?? Date.now)();
  const [indexKeys, rolloutKeys] = await Promise.all([
    listAll(store, FLEET_INDEX_PREFIX),
    listAll(store, ROLLOUTS_PREFIX),
  ]);
  const reads = opts.reads ?? FLEET_VIEW_READS;
  const perCluster = new Map<string, number>();
  const truncated = new Set<string>();
  const kept = indexKeys.filter((key) => {
    const cluster = key.slice(FLEET_INDEX_PREFIX.length).split('/')[0] as string;
    const n = (perCluster.get(cluster) ?? 0) + 1;
    perCluster.set(cluster, n);
    if (n <= MAX_INSTALLS_PER_CLUSTER) return true;
    truncated.add(cluster);
    return false;
  });
  const installs = (
    await pMap(
      kept,
      async (key) => {
        const doc = await readJson(store, key);
        const install = doc && installOf(key, doc);
        if (!install) return undefined;
        const last = await lastReconcileOf(store, cache, install, now);
        return last ? { ...install, lastReconcile: last } : install;
      },
      { concurrency: reads },
    )
  ).filter((i): i is FleetInstall => i !== undefined);
  cache.forgetListingsBut(new Set(installs.map((i) => receiptPrefix(i))));
  const rollouts = (
    await pMap(
      rolloutKeys,
      async (key) => {
        const doc = await readJson(store, key);
        return doc && rolloutOf(key, doc);
      },
      { concurrency: reads },
    )
  ).filter((r): r is FleetRollout => r !== undefined);
  const byName = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  installs.sort(
    (a, b) => byName(a.clusterId, b.clusterId) || byName(a.namespace, b.namespace) || byName(a.name, b.name),
  );
  rollouts.sort((a, b) => byName(a.policy, b.policy) || byName(a.refName, b.refName));
  const clusters = [...new Set([...(opts.clusters ?? []), ...installs.map((i) => i.clusterId)])].sort(byName);
  return {
    generatedAt: new Date(now).toISOString(),
    clusters,
    installs,
    rollouts,
    ...(truncated.size > 0 ? { truncated: [...truncated].sort(byName) } : {}),
  };
}

/**
 * The fleet view of one store for every reader of a process (the page's servers: `npm start`,
 * `npm run fleet -- serve`, the fleet page function): one build at a time, which every request
 * arriving meanwhile shares, and a built view reused for `maxAgeMs` from its build's start. Open
 * pages poll every second; without this each poll of each page was a whole build (two requests
 * per PackageInstall). A failed build is not kept: the next request builds again.
 */
export class FleetViewSource {
  /** Default age a built view is reused for, ms: the page's poll period. */
  static readonly DEFAULT_MAX_AGE_MS = 1000;
  readonly #store: ObjectStore;
  readonly #clusters: () => readonly string[];
  readonly #maxAgeMs: number;
  readonly #now: () => number;
  readonly #cache = new FleetViewCache();
  #last: { view: FleetView; startedAt: number } | undefined;
  #building: Promise<FleetView> | undefined;

  /**
   * @param opts.clusters - cluster ids to show without an index entry, asked at each build; default none.
   * @param opts.maxAgeMs - how long a view is reused, ms; default {@link FleetViewSource.DEFAULT_MAX_AGE_MS}.
   * @param opts.now - the clock; default `Date.now`.
   */
  constructor(
    store: ObjectStore,
    opts: { clusters?: () => readonly string[]; maxAgeMs?: number; now?: () => number } = {},
  ) {
    this.#store = store;
    this.#clusters = opts.clusters ?? (() => []);
    this.#maxAgeMs = opts.maxAgeMs ?? FleetViewSource.DEFAULT_MAX_AGE_MS;
    this.#now = opts.now ?? Date.now;
  }

  /**
   * The current view: the one being built, else the last one while younger than `maxAgeMs`,
   * else a new build. @throws what {@link buildFleetView} throws.
   */
  view(): Promise<FleetView> {
    if (this.#building) return this.#building;
    const last = this.#last;
    if (last && this.#now() - last.startedAt < this.#maxAgeMs) return Promise.resolve(last.view);
    const startedAt = this.#now();
    const building = buildFleetView(this.#store, { clusters: this.#clusters(), cache: this.#cache, now: this.#now });
    this.#building = building
      .then((view) => {
        this.#last = { view, startedAt };
        return view;
      })
      .finally(() => {
        this.#building = undefined;
      });
    return this.#building;
  }
}
