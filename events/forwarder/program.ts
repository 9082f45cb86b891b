/**
 * The forwarder as a long-running program (`main.ts` wires it to the real cluster and SQS):
 * leader election through a Lease and, while leading, a {@link Forwarder} whose events go to the
 * functions' queues; an HTTP server with liveness, readiness and Prometheus metrics; and a clean
 * stop.
 *
 * - `GET /healthz`: 200 `ok` while the process serves requests (liveness: only a wedged event
 *   loop fails it).
 * - `GET /readyz`: 200 when leading with every watch's first list done, or standing by (not
 *   leading: nothing to sync); 503 while leading and still listing, and once stopping.
 * - `GET /metrics`: Prometheus text format (prom-client): the forwarder's counters summed over
 *   leadership terms, its sizes, leadership, readiness, the Node process defaults, and, while
 *   leading, kapp-controller's per-object `kappctrl_*` series derived from the watched status
 *   changes (`status-metrics.ts`; removed when a term ends, so only the leader serves them).
 *
 * {@link ForwarderProgram.stop} (SIGTERM): readiness turns 503, the watches stop, what the outbox
 * holds is sent within `shutdownTimeoutMs` (still as leader: the Lease keeps being renewed
 * meanwhile), then the Lease is released (a standby replica takes over on its next try, about
 * 2 s, instead of after the 15 s lease duration) and the HTTP server closes.
 *
 * Two replicas never both forward: only the Lease holder runs a forwarder. A change the old and
 * the new leader both announce around a hand-over has one event id (`objectEventId`), so the
 * FIFO queue's deduplication drops the second copy.
 *
 * @module
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { Counter, collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import type { KubeReader, LeaseView, ObjectWatcher } from '../../functions/lib/kube/port.js';
import { describeControllerConfig, readControllerConfig } from '../../functions/lib/reconcile/controller-config.js';
import type { TimerConfig } from '../../functions/lib/reconcile/timer.js';
import { REASONS } from '../schema.js';
import type { ForwarderProgramSettings } from './config.js';
import { forwarderOptions } from './config.js';
import { Forwarder, type ForwarderStats } from './forwarder.js';
import { ClusterLeadership } from './leadership.js';
import type { ForwarderLogger } from './log.js';
import { ReconcileSeries } from './reconcile-series.js';
import { StatusMetrics, type StatusObserver } from './status-metrics.js';
import type { Transport } from './transport.js';

/** Scrapes of `/metrics` served at once; more answer 429 (Prometheus retries at its next interval). */
export const MAX_CONCURRENT_SCRAPES = 2;

/** A `/metrics` response idle this long (a client that stopped reading) is cut, ms. */
export const SCRAPE_TIMEOUT_MS = 30_000;

/**
 * The most one `/metrics` response may take in all, ms, however steadily its client reads: the
 * idle {@link SCRAPE_TIMEOUT_MS} alone let a client reading a few bytes every few seconds hold
 * one of the {@link MAX_CONCURRENT_SCRAPES} slots for as long as it liked (two such clients and
 * Prometheus met 429 at every scrape). Tens of MB (50,000 objects) read in seconds on a cluster
 * network, and Prometheus gives up on a scrape after its `scrape_timeout` (10 s by default).
 */
export const SCRAPE_DEADLINE_MS = 60_000;

/**
 * Bounds one `/metrics` response: destroyed when idle {@link SCRAPE_TIMEOUT_MS} or
 * {@link SCRAPE_DEADLINE_MS} after this call, whichever comes first (its slot is freed on
 * `close`). The deadline timer goes with the response and keeps no process alive.
 */
export function boundScrape(res: Pick<http.ServerResponse, 'setTimeout' | 'destroy' | 'once'>): void {
  res.setTimeout(SCRAPE_TIMEOUT_MS, () => res.destroy());
  const deadline = setTimeout(() => res.destroy(), SCRAPE_DEADLINE_MS);
  deadline.unref();
  res.once('close', () => clearTimeout(deadline));
}

/** What the program runs on (the entry file builds the real ones; tests may pass others). */
export interface ForwarderProgramDeps {
  /** List/watch of the cluster (read-only). */
  watcher: ObjectWatcher;
  /** Lease access for the election. */
  lease: LeaseView;
  /** Where the leader's events go (the SQS queues of the functions). */
  transport: Transport;
  /** This replica's identity in the Lease, unique per process. */
  identity: string;
  logger: ForwarderLogger;
  /** Election timings (ms); defaults are client-go's 15 s / 10 s / 2 s. */
  election?: { leaseDurationMs?: number; renewDeadlineMs?: number; retryPeriodMs?: number };
  /**
   * Reads the cluster's `kapp-controller-config` (Secret first, then ConfigMap, as upstream's
   * `Config.Reload`). When given, the forwarder watches both objects and the App timer takes
   * their `appDefaultSyncPeriod`/`appMinimumSyncPeriod` over the `FORWARDER_APP_*` settings,
   * re-read on every change (upstream reloads its config the same way). Without it the settings
   * alone apply.
   */
  configReader?: Pick<KubeReader, 'getSecret' | 'getConfigMap'>;
}

/** A running program. */
export interface ForwarderProgram {
  /** The HTTP server's address (the port, when 0 was asked for). */
  readonly address: AddressInfo;
  /** Whether `/readyz` answers 200 now. */
  ready(): boolean;
  /** Whether this replica leads now. */
  isLeader(): boolean;
  /** The Prometheus exposition of `/metrics`. */
  metrics(): Promise<string>;
  /**
   * Stops as described in the module comment. Never throws (failures are logged); idempotent.
   * @returns whether the outbox was emptied within the bound (false: events were dropped, a
   *   restarted leader re-derives them from the objects).
   */
  stop(): Promise<boolean>;
}

type CounterKey = Exclude<
  keyof ForwarderStats,
  'objects' | 'refs' | 'scheduled' | 'pending' | 'emitted' | 'driftKinds' | 'driftListed'
>;

/** Counters of {@link ForwarderStats} exported as `kapp_lambda_forwarder_<name>_total`. */
const COUNTERS: ReadonlyArray<[CounterKey, string, string]> = [
  ['sent', 'events_sent', 'Events accepted by the queues (after coalescing).'],
  ['sendErrors', 'send_errors', 'Failed sends of a batch (each is retried).'],
  ['invalid', 'invalid_events', 'Events dropped because they did not validate.'],
  ['lists', 'lists', 'Completed lists (initial and relists).'],
  ['gone', 'watch_gone', '410 Gone answers (each relists).'],
  ['watches', 'watches', 'Watches started.'],
  ['stalls', 'watch_stalls', 'Watches ended by the watchdog.'],
  ['watchErrors', 'watch_errors', 'Failed list or watch calls other than 410.'],
  ['drift', 'drift', 'Hand edits and deletions of deployed objects seen (each sent as ref-changed).'],
  ['quiet', 'quiet_sync_periods', 'Sync periods that passed without an event (reconcile by exception).'],
  [
    'health',
    'health_events',
    "Apps' health sent to fetch (each a change of their kapp-lambda.carvel.dev/Healthy condition).",
  ],
];

/** Sums a forwarder's counters over leadership terms (each term has a new forwarder). */
class TermTotals {
  private readonly base: Record<string, number> = {};
  private last: Forwarder | undefined;

  /** Totals of ended terms plus `current`'s. */
  totals(current: Forwarder | undefined): Record<string, number> {
    if (this.last && this.last !== current) this.fold(this.last.stats());
    this.last = current;
    const out = { ...this.base };
    if (current) add(out, current.stats());
    return out;
  }

  private fold(s: ForwarderStats): void {
    add(this.base, s);
  }
}

function add(into: Record<string, number>, s: ForwarderStats): void {
  for (const [key] of COUNTERS) into[key] = (into[key] ?? 0) + s[key];
  for (const r of REASONS) into[`emitted:${r}`] = (into[`emitted:${r}`] ?? 0) + s.emitted[r];
}

/**
 * Sets a counter to a total kept elsewhere (the forwarder's own counters; they only grow, so
 * the exported series does too).
 */
function setTotal(c: Counter, value: number): void {
  c.reset();
  c.inc(value);
}

/**
 * Starts the election, the HTTP server and (while leading) the forwarder.
 *
 * @param settings - Parsed by `parseForwarderProgramEnv`.
 * @param deps - The ports.
 * @throws Error when the HTTP server cannot listen (e.g. the port is taken); nothing is left running.
 */
export async function startForwarderProgram(
  settings: ForwarderProgramSettings,
  deps: ForwarderProgramDeps,
): Promise<ForwarderProgram> {
  const { logger } = deps;
  let stopping = false;
  let synced = false;
  let term: Forwarder | undefined;
  // The cluster's kapp-controller-config sync periods, over the settings' (undefined: not read yet).
  let clusterTimer: TimerConfig | undefined;
  const timer = () => (clusterTimer ? { ...settings.forwarder.timer, ...clusterTimer } : settings.forwarder.timer);
  const maxObjects = settings.reconcileMetricsMaxObjects;
  const series = new ReconcileSeries();
  const statusMetrics =
    maxObjects === 0
      ? undefined
      : new StatusMetrics(series, {
          clusterId: settings.forwarder.clusterId,
          ...(maxObjects === undefined ? {} : { maxObjects }),
        });
  const reader = deps.configReader;
  const namespace = settings.forwarder.controllerConfigNamespace;
  let reading = Promise.resolve();
  const followControllerConfig = () => {
    if (!reader) return;
    // Reads in order: a change seen after a slower earlier read must win.
    reading = reading.then(async () => {
      try {
        const cc = await readControllerConfig(reader, namespace);
        clusterTimer = cc.timer;
        logger.info({ namespace, ...describeControllerConfig(cc) }, 'kapp-controller-config read for the App timer');
      } catch (err) {
        logger.warn(
          { namespace, error: (err as Error).message },
          'reading kapp-controller-config for the App timer failed; the previous sync periods apply',
        );
      }
    });
  };
  const leadership = new ClusterLeadership({
    clusterId: settings.forwarder.clusterId,
    election: {
      lease: deps.lease,
      namespace: settings.lease.namespace,
      name: settings.lease.name,
      identity: deps.identity,
      logger,
      ...deps.election,
    },
    makeForwarder: (transport) => {
      synced = false;
      // A new term lists every object again: its series start over (the last term's may be stale).
      statusMetrics?.reset();
      // Only this term's forwarder feeds the series: an ended term's last list, still running,
      // must not write into the new term's (or a standby's) store.
      const sm = statusMetrics;
      const termObserver: StatusObserver | undefined = sm && {
        seen: (kind, obj) => {
          if (term === f) sm.seen(kind, obj);
        },
        gone: (kind, ns, name) => {
          if (term === f) sm.gone(kind, ns, name);
        },
      };
      const f: Forwarder = new Forwarder({
        ...forwarderOptions(settings.forwarder, timer),
        ...(termObserver ? { statusObserver: termObserver } : {}),
        watcher: deps.watcher,
        transport,
        logger,
        ...(reader ? { controllerConfig: { namespace, onChange: followControllerConfig } } : {}),
      });
      term = f;
      // synced() needs a started forwarder: ClusterLeadership starts it right after this returns.
      queueMicrotask(() => {
        void f.synced().then(() => {
          if (term === f) {
            synced = true;
            logger.info({ clusterId: settings.forwarder.clusterId }, 'forwarder synced');
          }
        });
      });
      return f;
    },
    onTermEnded: () => {
      // A standby serves no per-object series (the new leader does): they go when the term
      // does, and the ended term's forwarder, still stopping, feeds them no more.
      term = undefined;
      statusMetrics?.reset();
    },
    transport: deps.transport,
    logger,
  });

  const isLeader = () => leadership.isLeader();
  const ready = () => !stopping && (isLeader() ? synced && leadership.forwarder !== undefined : true);

  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const totals = new TermTotals();
  const counters = new Map<CounterKey, Counter>();
  for (const [key, name, help] of COUNTERS) {
    counters.set(key, new Counter({ name: `kapp_lambda_forwarder_${name}_total`, help, registers: [registry] }));
  }
  const emitted = new Counter({
    name: 'kapp_lambda_forwarder_events_emitted_total',
    help: 'Events emitted by reason, before coalescing.',
    labelNames: ['reason'],
    registers: [registry],
  });
  const election = {
    acquired: new Counter({
      name: 'kapp_lambda_forwarder_leader_acquired_total',
      help: 'Leadership terms started.',
      registers: [registry],
    }),
    lost: new Counter({
      name: 'kapp_lambda_forwarder_leader_lost_total',
      help: 'Leadership terms ended.',
      registers: [registry],
    }),
    failures: new Counter({
      name: 'kapp_lambda_forwarder_lease_failures_total',
      help: 'Failed Lease tries (API errors, timeouts, conflicts).',
      registers: [registry],
    }),
  };
  const gauge = (name: string, help: string, value: () => number) =>
    new Gauge({
      name: `kapp_lambda_forwarder_${name}`,
      help,
      registers: [registry],
      collect() {
        this.set(value());
      },
    });
  gauge('leader', '1 while this replica holds the Lease.', () => (isLeader() ? 1 : 0));
  gauge('ready', '1 while /readyz answers 200.', () => (ready() ? 1 : 0));
  gauge('objects', 'Watched objects known (leader only).', () => leadership.forwarder?.stats().objects ?? 0);
  gauge('refs', 'Referenced Secrets and ConfigMaps tracked.', () => leadership.forwarder?.stats().refs ?? 0);
  gauge('pending_events', 'Events waiting in the outbox.', () => leadership.forwarder?.stats().pending ?? 0);
  gauge(
    'reconcile_metrics_objects',
    'Objects with kappctrl_* series (leader only).',
    () => statusMetrics?.objects ?? 0,
  );
  gauge(
    'reconcile_metrics_skipped_objects',
    'Objects without kappctrl_* series because FORWARDER_RECONCILE_METRICS_MAX_OBJECTS was reached.',
    () => statusMetrics?.skipped ?? 0,
  );
  const refreshCounters = () => {
    const t = totals.totals(leadership.forwarder);
    for (const [key, c] of counters) setTotal(c, t[key] ?? 0);
    emitted.reset();
    for (const r of REASONS) emitted.inc({ reason: r }, t[`emitted:${r}`] ?? 0);
    const e = leadership.elector.stats();
    setTotal(election.acquired, e.acquired);
    setTotal(election.lost, e.lost);
    setTotal(election.failures, e.failures);
  };
  const ownMetrics = async () => {
    refreshCounters();
    return await registry.metrics();
  };
  /** The whole text: the registry's, then the per-object series (written in chunks to HTTP). */
  function* exposition(own: string): Generator<string> {
    yield own;
    if (statusMetrics) {
      yield '\n';
      yield* series.chunks();
    }
  }
  const metrics = async () => [...exposition(await ownMetrics())].join('');

  let scraping = 0;
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const answer = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return answer(405, 'method not allowed\n');
    if (path === '/healthz') return answer(200, 'ok\n');
    if (path === '/readyz') {
      if (ready()) return answer(200, isLeader() ? 'ok: leading, watches synced\n' : 'ok: standby\n');
      return answer(503, stopping ? 'stopping\n' : 'leading, watches not synced yet\n');
    }
    if (path === '/metrics') {
      // A few scrapes at a time, bounded in time: at 50,000 objects a scrape is tens of MB of
      // text, and a client that never reads, or reads a trickle, would hold its buffers and its
      // slot (anyone the release's NetworkPolicy admits can connect).
      if (scraping >= MAX_CONCURRENT_SCRAPES) return answer(429, 'a scrape is in progress\n');
      scraping++;
      res.once('close', () => scraping--);
      boundScrape(res);
      ownMetrics().then(
        (own) => {
          res.writeHead(200, { 'content-type': registry.contentType, 'cache-control': 'no-store' });
          Readable.from(exposition(own)).pipe(res);
        },
        (e: unknown) => answer(500, `metrics failed: ${e instanceof Error ? e.message : String(e)}\n`),
      );
      return;
    }
    answer(404, 'not found\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(settings.http.port, settings.http.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  logger.info({ host: address.address, port: address.port }, 'serving /healthz, /readyz and /metrics');
  leadership.start();

  let stopped: Promise<boolean> | undefined;
  const stop = async (): Promise<boolean> => {
    stopping = true;
    const started = Date.now();
    let drained = true;
    const f = leadership.forwarder;
    if (f) {
      // Still the leader: the term's transport keeps sending while the outbox drains.
      drained = await f.stop({ drain: true, timeoutMs: settings.shutdownTimeoutMs });
    }
    await leadership.stop();
    refreshCounters();
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
    logger.info({ drained, ms: Date.now() - started }, 'forwarder stopped; lease released');
    return drained;
  };
  return {
    address,
    ready,
    isLeader,
    metrics,
    stop: () => {
      stopped ??= stop().catch((e: unknown) => {
        logger.warn({ error: e instanceof Error ? e.message : String(e) }, 'stop failed');
        return false;
      });
      return stopped;
    },
  };
}
