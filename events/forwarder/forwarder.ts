/**
 * The in-cluster forwarder's state machine: watches App (and, by configuration, PackageInstall
 * and PackageRepository) plus the Secrets and ConfigMaps they reference ({@link RefIndex}) and
 * the Namespaces an App being deleted waits on, and turns changes into coalesced object events
 * for the functions ({@link Outbox}). It never writes to the cluster.
 *
 * The event rules (live, after a restart, after 410 Gone), the coalescing and what is kept in
 * memory are written once, in `README.md` beside this file ("Event rules", "Memory"); the code
 * below carries them out.
 *
 * @module
 */
import { setMaxListeners } from 'node:events';
import { KappLambdaConditionType } from '../../functions/lib/api/constants.js';
import type { KubeObject, ObjectWatcher, ResourceKind } from '../../functions/lib/kube/port.js';
import { MIN_SYNC_PERIOD_MS } from '../../functions/lib/reconcile/timer.js';
import {
  API_VERSIONS,
  type HealthData,
  healthEvent,
  healthMessage,
  type Kind,
  type ObjectEvent,
  type ObjectEventData,
  type ObjectRef,
  type Reason,
  subjectOf,
} from '../schema.js';
import { type BackoffOptions, resyncRetryDelay } from './backoff.js';
import { type Clock, MAX_TIMER_MS, sleep, systemClock, type TimerHandle } from './clock.js';
import { CONTROLLER_CONFIG_SELECTOR, controllerConfigHandler } from './controller-config.js';
import { DriftWatches, KAPP_APP_LABEL } from './drift.js';
import { DueHeap, type HeapItem } from './due-heap.js';
import type { AppHealth } from './health.js';
import { appKind, NO_REFS, observedGeneration, rateLimitedRequeueMs, type WatchedKind } from './kinds.js';
import { type ForwarderLogger, silentLogger } from './log.js';
import { Outbox, toCloudEvent } from './outbox.js';
import { inFlight } from './quiet.js';
import { NamespacedMap, REF_CONFIG_MAP, REF_SECRET, REF_SERVICE_ACCOUNT, RefIndex, type RefType } from './ref-index.js';
import { type ListMode, Reflector, type ReflectorHandler } from './reflector.js';
import type { StatusObserver } from './status-metrics.js';
import type { Transport } from './transport.js';

/** Options of {@link Forwarder}. Times in milliseconds unless named otherwise. */
export interface ForwarderOptions {
  /** Id of this cluster, carried by every event. */
  clusterId: string;
  /** List/watch port (read-only). */
  watcher: ObjectWatcher;
  /** Where events go. */
  transport: Transport;
  /** Watched kinds. Default `[appKind()]`; see `watchedKinds(['App', 'PackageInstall', ...])`. */
  kinds?: readonly WatchedKind[];
  /** Namespaces to watch; empty or omitted: all namespaces (one cluster-wide watch per kind). */
  namespaces?: readonly string[];
  /** Time and timers. Default {@link systemClock}. */
  clock?: Clock;
  /** Uniform `[0, 1)` source for jitter. Default `Math.random`. */
  random?: () => number;
  /** Logger. Default silent. */
  logger?: ForwarderLogger;
  /** Envelope builder. Default {@link toCloudEvent}. */
  buildEvent?: (data: ObjectEventData, now: number, cause?: string) => ObjectEvent;
  /**
   * List page size for watched kinds. Default 100: a page is held in memory while it is
   * processed, and an App's status may carry up to 1 MiB per output field.
   */
  pageSize?: number;
  /** List page size for Secrets and ConfigMaps (their data is parsed, then dropped). Default 100. */
  refPageSize?: number;
  /** Server-side watch timeout, seconds (each watch uses `[t, 2t)`). Default 300. */
  watchTimeoutSeconds?: number;
  /**
   * Watchdog: restart a watch that delivered nothing, not even a bookmark, for this long.
   * Default 90 000 (the API server sends a bookmark about every minute).
   */
  stallTimeoutMs?: number;
  /** Coalescing window per object, ms (none for a new object's `added`). Default 200. */
  coalesceWindowMs?: number;
  /** Largest batch per `Transport.send`. Default 100. */
  batchSize?: number;
  /**
   * How long an object may stay "due" by its status after the forwarder asked for a reconcile
   * (`added`, `modified` or `resync`) before `resync` is emitted again; each further re-ask of
   * the same status waits twice as long, up to 16 times this ({@link resyncRetryDelay}).
   * Default 300 000.
   */
  resyncRetryMs?: number;
  /**
   * Secrets and ConfigMaps are listed after the watched kinds' first lists (so the refs are
   * known and changes made while the forwarder was away can be told); this bounds the wait
   * when a kind cannot be listed (e.g. its CRD is missing). Default 30 000.
   */
  refStartTimeoutMs?: number;
  /** Retry backoff of list, watch and send failures. */
  backoff?: BackoffOptions;
  /**
   * Watch this cluster's `kapp-controller-config` Secret and ConfigMap (reference §1.3) in
   * `namespace`, one object each (field selector `metadata.name=kapp-controller-config`, so
   * the watch costs nothing when the namespace holds many Secrets), and call `onChange` when
   * either is created, changed (new resourceVersion) or deleted, and after each first list (a
   * change made while the forwarder was away). Upstream's controller reloads its config the
   * same way. No event is sent for it: the caller drops what it cached (the embedded runtime's
   * per-cluster config). `onChange` must not throw (a throw is logged and ignored).
   */
  controllerConfig?: { namespace: string; onChange: () => void };
  /**
   * Watch Namespaces (one cluster-wide watch, whatever `namespaces` says: an App deploys into
   * others) so that an object waiting on their termination ({@link WatchedKind.waitsOnNamespaces}:
   * an App being deleted whose ServiceAccount may be gone) is asked to reconcile as soon as the
   * last of them terminates, not at its next retry. Keeps each namespace's name and whether it is
   * terminating, nothing else. Needs get/list/watch on `namespaces` (`infra/forwarder/rbac.yml`).
   * Default true when a watched kind waits on namespaces (App); false turns it off.
   */
  watchNamespaces?: boolean;
  /**
   * Watch what each object deployed (`drift.ts`: by kapp's app label, metadata only, one
   * cluster-wide list+watch per deployed kind) and send `ref-changed` with cause `drift: ...`
   * for a hand edit or deletion. Needs list/watch on those kinds (`infra/forwarder/rbac.yml`).
   * Default true when a watched kind has {@link WatchedKind.deployed} (App); without it every
   * App keeps upstream's periodic timer.
   */
  driftWatch?: boolean;
  /**
   * Track the health of what each App deployed (`health.ts`: its Deployments, StatefulSets,
   * DaemonSets and Jobs, read whole by the drift watches) and send `dev.kapp-lambda.health.v1`
   * to the fetch function when an App that is not reconciling has a health other than its
   * `kapp-lambda.carvel.dev/Healthy` condition says (a stateless rule: a restarted forwarder sends
   * what is missing again). Default true when drift watches run; false keeps them metadata only.
   */
  health?: boolean;
  /** Wait between a health change and its check, ms (a rollout's burst of changes sends once). Default 1000. */
  healthDebounceMs?: number;
  /**
   * Called with each drift's cause (`drift: ...`) as it is sent: the embedded runtime counts it
   * (`kapp_lambda_drift_total`). Must not throw (a throw is logged and ignored).
   */
  onDrift?: (cause: string) => void;
  /**
   * Told each watched object as first seen and at each new resourceVersion, and when it goes:
   * the program derives kapp-controller's per-object `kappctrl_*` series from the status changes
   * (`status-metrics.ts`). Must not throw (a throw is logged and ignored).
   */
  statusObserver?: StatusObserver;
}

/** Counters and sizes, for tests, metrics and the memory benchmark. */
export interface ForwarderStats {
  /** Objects of watched kinds known. */
  objects: number;
  /** Referenced Secrets + ConfigMaps tracked. */
  refs: number;
  /** Objects with a pending timer. */
  scheduled: number;
  /** Events emitted, by reason, before coalescing. */
  emitted: Record<Reason, number>;
  /** Events accepted by the transport (after coalescing). */
  sent: number;
  /** Failed `Transport.send` calls. */
  sendErrors: number;
  /** Events dropped because their envelope did not validate. */
  invalid: number;
  /** Events waiting in the outbox. */
  pending: number;
  /** Completed lists (initial + relists). */
  lists: number;
  /** 410 Gone seen (each relists). */
  gone: number;
  /** Watches started. */
  watches: number;
  /** Watches ended by the watchdog. */
  stalls: number;
  /** Failed list/watch calls other than 410. */
  watchErrors: number;
  /** Drift seen in deployed objects (each sent as `ref-changed`). */
  drift: number;
  /** Times an object's sync period came and it stayed quiet (reconcile by exception). */
  quiet: number;
  /** Deployed kinds watched for drift. */
  driftKinds: number;
  /** Of {@link driftKinds}, those whose watches are through their first list. */
  driftListed: number;
  /** Health events queued (one per App whose computed health differed from its condition). */
  health: number;
}

/** Options of {@link Forwarder.stop}. */
export interface StopOptions {
  /** Send what is waiting (windows end at once) before stopping. Default false. */
  drain?: boolean;
  /** Upper bound of the drain and of waiting for the loops to end. Default 10 000. */
  timeoutMs?: number;
}

/** Per-object state: a reference and a schedule, never the object. */
interface ObjState extends HeapItem {
  readonly kindIx: number;
  readonly namespace: string;
  readonly name: string;
  uid: string;
  generation: number;
  rv: string;
  deleting: boolean;
  /**
   * Last reconcile per status, in whole seconds since the epoch (status times have second
   * precision; seconds stay small integers, which V8 stores unboxed); {@link NEVER} when never.
   */
  handledAt: number;
  /**
   * The `handledAt` for which a reconcile was asked and not yet answered by a status that is
   * no longer due; {@link NOT_ASKED} when none is outstanding.
   */
  asked: number;
  /**
   * How many times in a row a reconcile of the same status (`asked`) was asked for, minus one:
   * a resync retry's cause (`retry-<n>`), so it keeps an id distinct from the first ask.
   */
  retries: number;
  /** Referenced Secret names (shared empty array when none). */
  secrets: readonly string[];
  /** Referenced ConfigMap names (shared empty array when none). */
  configMaps: readonly string[];
  /** Referenced ServiceAccount names (shared empty array when none). */
  serviceAccounts: readonly string[];
  /** List mark (relist diff). */
  mark: number;
  /** The kind's {@link WatchedKind.changeKey} as last seen (absent for most kinds). */
  changeKey?: string;
  /**
   * Rate-limited requeues counted while the status shows a failure returned as an error
   * ({@link WatchedKind.failedWithError}); {@link NOT_FAILING} otherwise.
   */
  failures: number;
  /** {@link WatchedKind.waitsOnNamespaces} as last seen (interned names); absent for most objects. */
  waitsOn?: readonly string[];
  /** The status shows a reconcile or delete running (`Reconciling`/`Deleting` True). */
  running: boolean;
  /** {@link WatchedKind.quietUntil} as last computed; `NaN` when the object is periodic. */
  quietAt: number;
  /**
   * {@link WatchedKind.settled} as last seen: a reconcile may end without a status write, so an
   * ask is answered when sent ({@link Forwarder.ask}).
   */
  settled: boolean;
  /**
   * When the object, settled, was last asked to reconcile since its status last moved, in whole
   * seconds since the epoch (a no-op reconcile writes no status); {@link NEVER} when not since.
   * Its due times then count from here instead of from its status.
   */
  ranAt: number;
  /** The timer's due time less the last reconcile when last settled (sync period + jitter, ms); -1 before. */
  periodMs: number;
  /** {@link quietAt} less the last reconcile when last settled (safety period + jitter, ms); -1: periodic. */
  quietMs: number;
  /**
   * A 32-bit hash of the App's `kapp-lambda.carvel.dev/Healthy` condition (status, reason,
   * message) as last seen; `NaN` when it has none (or the kind is not App).
   */
  healthKey: number;
  /** {@link healthKey} of the health last sent since the object last changed; `NaN` when none. */
  healthSent: number;
}

const NAMESPACE: ResourceKind = { apiVersion: 'v1', kind: 'Namespace' };
const SECRET: ResourceKind = { apiVersion: 'v1', kind: 'Secret' };
const CONFIG_MAP: ResourceKind = { apiVersion: 'v1', kind: 'ConfigMap' };
const SERVICE_ACCOUNT: ResourceKind = { apiVersion: 'v1', kind: 'ServiceAccount' };
/** The watched resource of each {@link RefType}. */
const REF_RESOURCES: readonly ResourceKind[] = [SECRET, CONFIG_MAP, SERVICE_ACCOUNT];

/** {@link ObjState.handledAt} of an object never reconciled. */
const NEVER = -1;
/** {@link ObjState.asked} when no reconcile is outstanding. */
const NOT_ASKED = -2;
/** {@link ObjState.failures} of an object whose status shows no failure returned as an error. */
const NOT_FAILING = -1;

function handledAtOf(kind: WatchedKind, obj: KubeObject): number {
  const ms = kind.handledAt(obj);
  return ms === undefined || Number.isNaN(ms) ? NEVER : Math.floor(ms / 1000);
}

/**
 * One cluster's forwarder: {@link start}, {@link synced}, {@link stop}; see the module comment
 * and `README.md` ("Event rules") for what it sends when.
 */
export class Forwarder {
  private readonly clusterId: string;
  private readonly kinds: readonly WatchedKind[];
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly logger: ForwarderLogger;
  private readonly resyncRetryMs: number;
  private readonly objects: NamespacedMap<ObjState>[];
  private readonly refs = new RefIndex<ObjState>({
    changed: (st, cause) => this.emit(st, 'ref-changed', cause),
    firstSeen: (st, cause, written) => {
      if (st.asked !== NOT_ASKED) return; // a reconcile was already asked for
      if (Number.isNaN(written) || st.handledAt === NEVER || written >= st.handledAt * 1000) {
        this.emit(st, 'ref-changed', cause);
      }
    },
  });
  /** One string per namespace name, shared by every object in it. */
  private readonly namespaceNames = new Map<string, string>();
  private readonly heap = new DueHeap<ObjState>();
  private readonly outbox: Outbox;
  private readonly primary: Reflector[] = [];
  private readonly secondary: Reflector[] = [];
  private readonly configWatches: Reflector[] = [];
  /** The drift watches' reflectors (started by {@link DriftWatches} as kinds appear). */
  private readonly deployedWatches: Reflector[] = [];
  /**
   * Namespace name (interned) → whether it is terminating (`deletionTimestamp` set), filled by the
   * Namespace watch ({@link ForwarderOptions.watchNamespaces}); a name not in it is gone once
   * {@link namespacesListed}.
   */
  private readonly namespaceStates = new Map<string, boolean>();
  private namespacesListed = false;
  /** Objects with {@link ObjState.waitsOn} (Apps being deleted: few). */
  private readonly namespaceWaiters = new Set<ObjState>();
  private readonly runs: Promise<void>[] = [];
  private timer: TimerHandle | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private epoch = 0;
  private ac: AbortController | undefined;
  private syncedPromise: Promise<void> | undefined;
  private readonly emitted: Record<Reason, number> = {
    added: 0,
    modified: 0,
    deleted: 0,
    resync: 0,
    'ref-changed': 0,
  };
  private sent = 0;
  private sendErrors = 0;
  private invalid = 0;
  private driftSeen = 0;
  private quieted = 0;
  private healthQueued = 0;
  /** Apps whose health may have changed, checked after {@link ForwarderOptions.healthDebounceMs}. */
  private readonly healthDirty = new Set<ObjState>();
  private healthTimer: TimerHandle | undefined;
  /** Drift watches of what objects deployed; absent when turned off or no kind deploys. */
  private readonly drift: DriftWatches<ObjState> | undefined;
  /** When every watch of objects and their inputs had completed its first list (ms); +∞ before. */
  private inputsListedAt = Number.POSITIVE_INFINITY;

  /** @param opts - See {@link ForwarderOptions}. */
  constructor(private readonly opts: ForwarderOptions) {
    this.clusterId = opts.clusterId;
    this.kinds = opts.kinds ?? [appKind()];
    this.clock = opts.clock ?? systemClock;
    this.random = opts.random ?? Math.random;
    this.logger = opts.logger ?? silentLogger;
    this.resyncRetryMs = opts.resyncRetryMs ?? 300_000;
    this.objects = this.kinds.map(() => new NamespacedMap<ObjState>());
    this.outbox = new Outbox({
      transport: opts.transport,
      build: opts.buildEvent ?? toCloudEvent,
      clock: this.clock,
      random: this.random,
      windowMs: opts.coalesceWindowMs ?? 200,
      batchSize: Math.max(1, opts.batchSize ?? 100),
      ...(opts.backoff ? { backoff: opts.backoff } : {}),
      logger: this.logger,
      onSent: (events) => {
        this.sent += events.length;
      },
      onSendError: () => {
        this.sendErrors++;
      },
      onInvalid: () => {
        this.invalid++;
      },
    });
    if (opts.driftWatch ?? this.kinds.some((k) => k.deployed)) {
      this.drift = new DriftWatches<ObjState>({
        watcher: opts.watcher,
        scopes: opts.namespaces ?? [],
        watch: (kind, ns, handler, full) => {
          const ac = this.ac;
          if (!ac || ac.signal.aborted) return () => undefined;
          // Its own signal: the kind is released when no App deploys it any more.
          const own = new AbortController();
          const onAbort = () => own.abort();
          ac.signal.addEventListener('abort', onAbort, { once: true });
          const r = this.reflector(kind, ns, this.opts.refPageSize ?? 100, handler, {
            labelSelector: KAPP_APP_LABEL,
            metadataOnly: !full,
          });
          this.deployedWatches.push(r);
          this.runs.push(r.run(own.signal));
          return () => {
            ac.signal.removeEventListener('abort', onAbort);
            own.abort();
          };
        },
        onDrift: (st, cause) => {
          this.driftSeen++;
          this.logger.info(
            { clusterId: this.clusterId, namespace: st.namespace, name: st.name, cause },
            'drift in deployed objects; asking for a reconcile',
          );
          this.emit(st, 'ref-changed', cause);
          try {
            this.opts.onDrift?.(cause);
          } catch (err) {
            this.logger.warn({ err }, 'onDrift failed');
          }
        },
        reconciling: (st) => st.running,
        ...(opts.health === false ? {} : { onHealth: (st: ObjState) => this.markHealth(st) }),
        onUncovered: () => this.wakeQuiet((st) => this.drift?.coveredSince(st) === undefined),
        handledAtMs: (st) => (st.handledAt === NEVER ? Number.NaN : st.handledAt * 1000),
        clock: this.clock,
        logger: this.logger,
      });
    }
  }

  /**
   * Starts listing and watching. Returns at once; loops run until {@link stop}.
   *
   * @throws Error `forwarder already started` on a second call.
   */
  start(): void {
    if (this.ac) throw new Error('forwarder already started');
    const ac = new AbortController();
    // Every list/watch loop (one per kind and namespace) listens on this one signal.
    setMaxListeners(0, ac.signal);
    this.ac = ac;
    const scopes: (string | undefined)[] = this.opts.namespaces?.length
      ? [...new Set(this.opts.namespaces)]
      : [undefined];
    for (let k = 0; k < this.kinds.length; k++) {
      for (const ns of scopes) {
        this.primary.push(
          this.reflector(this.kinds[k]!.resource, ns, this.opts.pageSize ?? 100, this.objectHandler(k, ns)),
        );
      }
    }
    const cc = this.opts.controllerConfig;
    if (cc) {
      for (const resource of [SECRET, CONFIG_MAP]) {
        this.configWatches.push(
          this.reflector(
            resource,
            cc.namespace,
            1,
            controllerConfigHandler(
              resource,
              () => {
                this.inputsChanged();
                cc.onChange();
              },
              this.logger,
              this.clusterId,
            ),
            { fieldSelector: CONTROLLER_CONFIG_SELECTOR },
          ),
        );
      }
    }
    if (this.opts.watchNamespaces ?? this.kinds.some((k) => k.waitsOnNamespaces)) {
      this.configWatches.push(
        this.reflector(NAMESPACE, undefined, this.opts.refPageSize ?? 100, this.namespaceHandler()),
      );
    }
    const refTypes: RefType[] = [];
    if (this.kinds.some((k) => k.tracksSecrets)) refTypes.push(REF_SECRET);
    if (this.kinds.some((k) => k.tracksConfigMaps)) refTypes.push(REF_CONFIG_MAP);
    if (this.kinds.some((k) => k.tracksServiceAccounts)) refTypes.push(REF_SERVICE_ACCOUNT);
    for (const t of refTypes) {
      for (const ns of scopes) {
        this.secondary.push(
          this.reflector(REF_RESOURCES[t]!, ns, this.opts.refPageSize ?? 100, this.refs.handler(t, ns)),
        );
      }
    }
    this.logger.info(
      {
        clusterId: this.clusterId,
        kinds: this.kinds.map((k) => k.resource.kind),
        namespaces: scopes[0] === undefined ? 'all' : scopes,
      },
      'forwarder starting',
    );
    for (const r of [...this.primary, ...this.configWatches]) this.runs.push(r.run(ac.signal));
    const primaryListed = Promise.all(this.primary.map((r) => r.listed));
    const gateTimer = new AbortController();
    ac.signal.addEventListener('abort', () => gateTimer.abort(), { once: true });
    const gate = Promise.race([
      primaryListed,
      sleep(this.clock, this.opts.refStartTimeoutMs ?? 30_000, gateTimer.signal),
    ]);
    const refsStarted = gate.then(() => {
      gateTimer.abort();
      if (ac.signal.aborted) return;
      for (const r of this.secondary) this.runs.push(r.run(ac.signal));
    });
    const waited = [...this.secondary, ...this.configWatches].map((r) => r.listed);
    this.syncedPromise = Promise.all([primaryListed, refsStarted, ...waited]).then(() => {
      this.inputsListedAt = this.clock.now();
    });
  }

  /**
   * Resolves once every watch (watched kinds, then Secrets and ConfigMaps) completed its first
   * list. Never rejects; never resolves if a list never succeeds.
   *
   * @throws Error `forwarder not started` when called before {@link start}.
   */
  synced(): Promise<void> {
    if (!this.syncedPromise) throw new Error('forwarder not started');
    return this.syncedPromise;
  }

  /**
   * Stops the loops and timers. With `drain`, events still waiting are sent first (bounded by
   * `timeoutMs`); without it they are dropped: a restarted forwarder re-derives what matters
   * from the objects' status (`README.md`, "Event rules"). Idempotent.
   *
   * @returns false when `drain` was asked and events were still waiting or in flight at the
   *   bound (they are dropped); true otherwise.
   */
  async stop(options: StopOptions = {}): Promise<boolean> {
    const timeoutMs = options.timeoutMs ?? 10_000;
    this.ac?.abort();
    this.drift?.stop();
    if (this.healthTimer !== undefined) this.clock.clearTimeout(this.healthTimer);
    this.healthTimer = undefined;
    this.healthDirty.clear();
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    const bound = new AbortController();
    const deadline = sleep(this.clock, timeoutMs, bound.signal);
    await Promise.race([Promise.all(this.runs), deadline]);
    let drained = true;
    if (options.drain) {
      this.outbox.flushNow();
      drained = await Promise.race([this.outbox.idle().then(() => true), deadline.then(() => false)]);
    }
    bound.abort();
    this.outbox.close();
    return drained;
  }

  /** A snapshot of counters and sizes. */
  stats(): ForwarderStats {
    const all = [...this.primary, ...this.secondary, ...this.configWatches, ...this.deployedWatches].map(
      (r) => r.counters,
    );
    const sum = (f: (c: Reflector['counters']) => number) => all.reduce((n, c) => n + f(c), 0);
    return {
      objects: this.objects.reduce((n, m) => n + m.size, 0),
      refs: this.refs.size,
      scheduled: this.heap.size,
      emitted: { ...this.emitted },
      sent: this.sent,
      sendErrors: this.sendErrors,
      invalid: this.invalid,
      pending: this.outbox.size,
      lists: sum((c) => c.lists),
      gone: sum((c) => c.gone),
      watches: sum((c) => c.watches),
      stalls: sum((c) => c.stalls),
      watchErrors: sum((c) => c.errors),
      drift: this.driftSeen,
      quiet: this.quieted,
      driftKinds: this.drift?.size.kinds ?? 0,
      driftListed: this.drift?.size.listed ?? 0,
      health: this.healthQueued,
    };
  }

  /**
   * When the forwarder will next emit `resync` for an object on its own (ms since the epoch),
   * or `undefined` when no timer is set (unknown object, paused, PackageInstall handled).
   */
  dueAt(kind: ResourceKind, namespace: string, name: string): number | undefined {
    const k = this.kinds.findIndex((w) => w.resource.apiVersion === kind.apiVersion && w.resource.kind === kind.kind);
    const st = k < 0 ? undefined : this.objects[k]!.get(namespace, name);
    return st && st.heapIndex >= 0 ? st.due : undefined;
  }

  private reflector(
    resource: ResourceKind,
    namespace: string | undefined,
    pageSize: number,
    handler: ReflectorHandler,
    selection: { fieldSelector?: string; labelSelector?: string; metadataOnly?: boolean } = {},
  ) {
    return new Reflector(
      {
        watcher: this.opts.watcher,
        resource,
        ...(namespace === undefined ? {} : { namespace }),
        ...selection,
        pageSize,
        watchTimeoutSeconds: this.opts.watchTimeoutSeconds ?? 300,
        stallTimeoutMs: this.opts.stallTimeoutMs ?? 90_000,
        ...(this.opts.backoff ? { backoff: this.opts.backoff } : {}),
        clock: this.clock,
        random: this.random,
        logger: this.logger,
      },
      handler,
    );
  }

  // ---- Namespaces (noop delete once every namespace of an App is terminating) ----------------

  /**
   * Keeps each namespace's name and terminating flag. A namespace that starts terminating, or
   * goes away without having been seen terminating, is {@link namespaceEnded}; after the first
   * list every waiter whose namespaces are all terminating already is asked once (a change made
   * while the forwarder was away).
   */
  private namespaceHandler(): ReflectorHandler {
    let seen = new Set<string>();
    return {
      listStart: () => {
        seen = new Set();
      },
      listItem: (obj) => {
        const name = this.intern(obj.metadata.name);
        seen.add(name);
        this.onNamespace(name, Boolean(obj.metadata.deletionTimestamp), obj.metadata.resourceVersion);
      },
      listEnd: (mode) => {
        for (const name of [...this.namespaceStates.keys()]) {
          if (!seen.has(name)) this.onNamespaceGone(name, 'relist');
        }
        seen = new Set();
        this.namespacesListed = true;
        if (mode !== 'initial') return;
        for (const st of this.namespaceWaiters) {
          if (this.allTerminating(st)) this.emit(st, 'ref-changed', `Namespace/${st.waitsOn!.join(',')}@terminating`);
        }
      },
      event: (e) => {
        const name = this.intern(e.object.metadata.name);
        if (e.type === 'DELETED') this.onNamespaceGone(name, e.object.metadata.resourceVersion);
        else this.onNamespace(name, Boolean(e.object.metadata.deletionTimestamp), e.object.metadata.resourceVersion);
      },
    };
  }

  private onNamespace(name: string, terminating: boolean, rv: string): void {
    const before = this.namespaceStates.get(name);
    this.namespaceStates.set(name, terminating);
    if (terminating && before !== true) this.namespaceEnded(name, `Namespace/${name}@${rv}`);
  }

  private onNamespaceGone(name: string, rv: string): void {
    const before = this.namespaceStates.get(name);
    this.namespaceStates.delete(name);
    // One already seen terminating asked its waiters then.
    if (before !== true) this.namespaceEnded(name, `Namespace/${name}@gone-${rv}`);
  }

  /** Asks each object waiting on `name` whose namespaces are now all terminating or gone. */
  private namespaceEnded(name: string, cause: string): void {
    if (!this.namespacesListed) return; // the first list's end asks
    for (const st of this.namespaceWaiters) {
      if (st.waitsOn!.includes(name) && this.allTerminating(st)) this.emit(st, 'ref-changed', cause);
    }
  }

  /** Every namespace `st` waits on is terminating (true) or gone (absent). */
  private allTerminating(st: ObjState): boolean {
    return st.waitsOn!.every((ns) => this.namespaceStates.get(ns) !== false);
  }

  /** Records what `st` waits on ({@link WatchedKind.waitsOnNamespaces}). */
  private trackNamespaces(kind: WatchedKind, st: ObjState, obj: KubeObject): void {
    const names = kind.waitsOnNamespaces?.(obj);
    if (!names?.length) {
      if (st.waitsOn) {
        delete st.waitsOn;
        this.namespaceWaiters.delete(st);
      }
      return;
    }
    st.waitsOn = names.map((n) => this.intern(n));
    this.namespaceWaiters.add(st);
  }

  // ---- watched kinds ------------------------------------------------------------------------

  private objectHandler(kindIx: number, ns: string | undefined): ReflectorHandler {
    let mark = 0;
    return {
      listStart: () => {
        mark = ++this.epoch;
      },
      listItem: (obj, mode) => this.onObject(kindIx, obj, mode, mark),
      listEnd: () => this.sweepObjects(kindIx, ns, mark),
      event: (ev) => {
        if (ev.type === 'DELETED') this.onObjectDeleted(kindIx, ev.object);
        else this.onObject(kindIx, ev.object, 'watch', 0);
      },
    };
  }

  private onObject(kindIx: number, obj: KubeObject, source: ListMode | 'watch', mark: number): void {
    const kind = this.kinds[kindIx]!;
    const map = this.objects[kindIx]!;
    const m = obj.metadata;
    const namespace = this.intern(m.namespace ?? '');
    const now = this.clock.now();
    let st = map.get(namespace, m.name);
    if (st && st.uid !== m.uid) {
      this.forget(st);
      this.emit(st, 'deleted');
      st = undefined;
    }
    if (!st) {
      const refs = kind.refs(obj);
      st = {
        kindIx,
        namespace,
        name: m.name,
        uid: m.uid,
        generation: m.generation ?? 0,
        rv: m.resourceVersion,
        deleting: Boolean(m.deletionTimestamp),
        handledAt: handledAtOf(kind, obj),
        asked: NOT_ASKED,
        retries: 0,
        secrets: refs.secrets.length ? refs.secrets : NO_REFS.secrets,
        configMaps: refs.configMaps.length ? refs.configMaps : NO_REFS.configMaps,
        serviceAccounts: refs.serviceAccounts?.length ? refs.serviceAccounts : NO_REFS.configMaps,
        mark,
        due: Number.POSITIVE_INFINITY,
        heapIndex: -1,
        failures: NOT_FAILING,
        running: inFlight(obj),
        quietAt: Number.NaN,
        settled: false,
        ranAt: NEVER,
        periodMs: -1,
        quietMs: -1,
        healthKey: healthConditionKey(kind, obj),
        healthSent: Number.NaN,
      };
      const key = kind.changeKey?.(obj);
      if (key !== undefined) st.changeKey = key;
      map.set(namespace, st.name, st);
      this.refs.add(st);
      this.trackNamespaces(kind, st, obj);
      this.drift?.track(st, kind.deployed?.(obj));
      this.markHealth(st);
      this.observeStatus(kind, obj);
      const due = this.timing(kind, st, obj, now);
      const reason = source === 'initial' ? this.startupReason(obj, due, now) : 'added';
      if (reason) this.ask(st, reason, now);
      else this.schedule(st, this.quietDue(st, this.withRequeue(kind, st, obj, due, now), now));
      return;
    }
    if (mark) st.mark = mark;
    if (st.rv === m.resourceVersion) return;
    this.observeStatus(kind, obj);
    this.notifyController(kind, obj);
    const generation = m.generation ?? 0;
    const deleting = Boolean(m.deletionTimestamp);
    const changeKey = kind.changeKey?.(obj);
    const reason: Reason | undefined =
      generation !== st.generation || (deleting && !st.deleting) || changeKey !== st.changeKey ? 'modified' : undefined;
    if (changeKey === undefined) delete st.changeKey;
    else st.changeKey = changeKey;
    st.rv = m.resourceVersion;
    st.generation = generation;
    st.deleting = deleting;
    const handledAt = handledAtOf(kind, obj);
    if (handledAt !== st.handledAt) st.ranAt = NEVER; // the status moved: its times count again
    st.handledAt = handledAt;
    const wasRunning = st.running;
    st.running = inFlight(obj);
    const statusDue = this.timing(kind, st, obj, now);
    this.refs.update(st, kind.refs(obj));
    this.trackNamespaces(kind, st, obj);
    this.drift?.track(st, kind.deployed?.(obj));
    if (wasRunning && !st.running) this.drift?.settled(st);
    // Any new state of the App (its condition written or dropped, a reconcile ended) is checked
    // again: what was sent before may not have been written (a reconcile ran meanwhile).
    st.healthKey = healthConditionKey(kind, obj);
    st.healthSent = Number.NaN;
    this.markHealth(st);
    if (reason) {
      this.ask(st, reason, now);
      return;
    }
    const due = this.quietDue(st, this.withRequeue(kind, st, obj, statusDue, now), now);
    if (st.running && st.asked === st.handledAt) {
      // The run asked for is in flight (`Reconciling` on the basis it was asked at): its end is
      // the answer, waited for under the ask's retry timer. Scheduling the in-flight status's
      // due time instead (the sync period + jitter from the previous reconcile, so at once for
      // an object failing at its sync period) asked again during any run longer than the
      // jitter: one more message behind it per retry, run as a no-op.
      return;
    }
    if (due === null || due > now) {
      st.asked = NOT_ASKED;
      this.schedule(st, due);
    } else if (st.asked !== st.handledAt) {
      this.ask(st, 'resync', now);
    }
    // else: a reconcile of exactly this status was asked for; its retry timer stays.
  }

  /**
   * The object's due time per its status ({@link WatchedKind.dueAt}) and its quiet time
   * ({@link WatchedKind.quietUntil}, into {@link ObjState.quietAt}), both moved to count from the
   * last ask when the object is settled and was asked since its status last moved
   * ({@link ObjState.ranAt}): a reconcile that changed nothing wrote no status, so the status's
   * times are older than the reconcile. Records the intervals an ask schedules with.
   */
  private timing(kind: WatchedKind, st: ObjState, obj: KubeObject, now: number): number | null {
    const due = kind.dueAt(obj, now);
    const quietAt = kind.quietUntil?.(obj, this.random) ?? Number.NaN;
    const handledMs = st.handledAt * 1000;
    st.settled = st.handledAt !== NEVER && due !== null && kind.settled?.(obj) === true;
    if (st.settled && due !== null) {
      st.periodMs = Math.max(0, due - handledMs);
      st.quietMs = quietAt > handledMs ? quietAt - handledMs : -1;
    }
    // Asked since the status last moved (so asked settled: the intervals are known). A status
    // that shows the run in flight with the same times keeps that schedule too.
    if (st.ranAt === NEVER || due === null) {
      st.quietAt = quietAt;
      return due;
    }
    st.quietAt = st.settled && st.quietMs >= 0 ? st.ranAt * 1000 + st.quietMs : Number.NaN;
    return st.ranAt * 1000 + st.periodMs;
  }

  /**
   * A known object changed or was deleted: its controller, when it is a watched object of the
   * same namespace with the owner's uid, gets `ref-changed` (it reconciles on its owned
   * object's changes, e.g. a PackageInstall mirroring its App's status).
   */
  private notifyController(kind: WatchedKind, obj: KubeObject): void {
    const owner = kind.controlledBy?.(obj);
    if (!owner) return;
    const ix = this.kinds.findIndex(
      (k) => k.resource.kind === owner.resource.kind && k.resource.apiVersion === owner.resource.apiVersion,
    );
    if (ix < 0) return;
    const st = this.objects[ix]!.get(obj.metadata.namespace ?? '', owner.name);
    if (st && st.uid === owner.uid) {
      this.emit(st, 'ref-changed', `${kind.resource.kind}/${obj.metadata.name}@${obj.metadata.resourceVersion}`);
    }
  }

  /**
   * The due time of an object, with controller-runtime's rate-limited requeue when its status
   * shows a failure returned as an error ({@link WatchedKind.failedWithError}): the next requeue
   * is `rateLimitedRequeueMs(n)` after this status was seen, `n` counting the failed reconciles
   * since the last success (this status's own included, as upstream's `AddRateLimited` counts
   * each). Any other status resets the count (`Forget`). In memory only, as upstream's work
   * queue: a restarted forwarder starts again at 5 ms.
   */
  private withRequeue(kind: WatchedKind, st: ObjState, obj: KubeObject, due: number | null, now: number) {
    if (!kind.failedWithError?.(obj)) {
      st.failures = NOT_FAILING;
      return due;
    }
    st.failures = Math.max(st.failures, 0);
    const requeue = now + rateLimitedRequeueMs(st.failures++);
    return due === null ? requeue : Math.min(due, requeue);
  }

  /**
   * Reconcile by exception: a due time at or before `now` moves to the object's safety due time
   * ({@link ObjState.quietAt}) while it may stay quiet: it is eligible (`quiet.ts`), no reconcile
   * is outstanding, not failing, and every watch it needs (its own kind's, its inputs', its
   * deployed kinds') has run without a gap since before its last reconcile, so nothing it
   * depends on can have changed unseen. Any other due time is returned unchanged.
   */
  private quietDue(st: ObjState, due: number | null, now: number): number | null {
    if (due === null || due > now || !(st.quietAt > now)) return due;
    if (st.asked !== NOT_ASKED || st.failures !== NOT_FAILING || st.handledAt === NEVER) return due;
    // A reconcile asked since the status last moved covers what changed before it was asked.
    const handledMs = Math.max(st.handledAt, st.ranAt) * 1000;
    const covered = this.drift?.coveredSince(st);
    if (covered === undefined || covered > handledMs || this.inputsListedAt > handledMs) return due;
    this.quieted++;
    return st.quietAt;
  }

  /**
   * An input of every reconcile changed (the cluster's `kapp-controller-config`: CA bundle, proxy,
   * kapp options), which upstream applies at each App's next sync: quiet objects are no longer
   * covered and are asked within the shortest sync period (30 s, spread), not at once.
   */
  private inputsChanged(): void {
    if (this.inputsListedAt === Number.POSITIVE_INFINITY) return; // the first list: nothing quiet yet
    this.inputsListedAt = this.clock.now();
    this.wakeQuiet(() => true);
  }

  /**
   * Quiet objects (due at their safety due time) that `uncovered` picks are asked within the
   * shortest sync period (30 s, spread), as their sync period would have: something they depend
   * on may change unseen (an input of every reconcile changed, a drift watch they need is down).
   */
  private wakeQuiet(uncovered: (st: ObjState) => boolean): void {
    const now = this.clock.now();
    for (const map of this.objects) {
      for (const [, , st] of map.entries()) {
        if (st.heapIndex >= 0 && st.due === st.quietAt && uncovered(st))
          this.schedule(st, now + Math.floor(this.random() * MIN_SYNC_PERIOD_MS));
      }
    }
  }

  /** The rule for an object seen for the first time by a first list (after a restart). */
  private startupReason(obj: KubeObject, due: number | null, now: number): Reason | undefined {
    const og = observedGeneration(obj);
    if (og === undefined) return 'added';
    if (og !== (obj.metadata.generation ?? 0)) return 'modified';
    if (due !== null && due <= now) return 'resync';
    // A run that was in flight when the previous runtime died (status still `Reconciling` or
    // `Deleting`) may be lost: reconcile it now (`added` is not timer-gated, as kapp-controller's
    // restart reconciles every object) instead of after the sync period. On the SQS transport the
    // event queues behind a run still in flight for the object (one message group per object).
    if (inFlight(obj)) return 'added';
    return undefined;
  }

  private onObjectDeleted(kindIx: number, obj: KubeObject): void {
    const st = this.objects[kindIx]!.get(obj.metadata.namespace ?? '', obj.metadata.name);
    if (st) {
      this.forget(st);
      if (st.uid !== obj.metadata.uid) this.emit(st, 'deleted');
    }
    const kind = this.kinds[kindIx]!;
    this.emitData({
      clusterId: this.clusterId,
      kind: kind.resource.kind as Kind,
      apiVersion: kind.resource.apiVersion,
      namespace: obj.metadata.namespace ?? '',
      name: obj.metadata.name,
      uid: obj.metadata.uid,
      generation: obj.metadata.generation ?? 0,
      resourceVersion: obj.metadata.resourceVersion,
      reason: 'deleted',
    });
    this.notifyController(kind, obj);
  }

  private sweepObjects(kindIx: number, ns: string | undefined, mark: number): void {
    for (const [, , st] of this.objects[kindIx]!.entries(ns)) {
      if (st.mark === mark) continue;
      this.forget(st);
      this.emit(st, 'deleted');
    }
  }

  /** Tells {@link ForwarderOptions.statusObserver} about `obj` (a throw is logged, never raised). */
  private observeStatus(kind: WatchedKind, obj: KubeObject): void {
    const observer = this.opts.statusObserver;
    if (!observer) return;
    try {
      observer.seen(kind.resource.kind as Kind, obj);
    } catch (err) {
      this.logger.warn({ error: (err as Error).message }, 'status observer failed');
    }
  }

  private forget(st: ObjState): void {
    try {
      this.opts.statusObserver?.gone(this.kinds[st.kindIx]!.resource.kind as Kind, st.namespace, st.name);
    } catch (err) {
      this.logger.warn({ error: (err as Error).message }, 'status observer failed');
    }
    this.drift?.untrack(st);
    this.heap.delete(st);
    this.refs.remove(st);
    this.namespaceWaiters.delete(st);
    this.objects[st.kindIx]!.delete(st.namespace, st.name);
  }

  // ---- health after deploy -----------------------------------------------------------------

  /** `st`'s health may have changed: checked once the debounce ends ({@link flushHealth}). */
  private markHealth(st: ObjState): void {
    if (!this.drift?.tracks(st) || this.opts.health === false || this.kinds[st.kindIx]!.resource.kind !== 'App') return;
    this.healthDirty.add(st);
    if (this.healthTimer !== undefined || !this.ac || this.ac.signal.aborted) return;
    this.healthTimer = this.clock.setTimeout(() => {
      this.healthTimer = undefined;
      this.flushHealth();
    }, this.opts.healthDebounceMs ?? 1000);
  }

  /**
   * Sends the health of each marked App that has settled (reconciled, no reconcile or delete
   * running) when it differs from its condition and was not sent since the App last changed.
   */
  private flushHealth(): void {
    const dirty = [...this.healthDirty];
    this.healthDirty.clear();
    for (const st of dirty) {
      if (this.objects[st.kindIx]!.get(st.namespace, st.name) !== st) continue; // gone
      if (st.running || st.deleting || st.handledAt === NEVER) continue; // its settling marks it again
      const health = this.drift?.healthOf(st);
      if (!health) continue; // not known yet: a judged kind's first list marks it again
      const data = this.healthData(st, health);
      const key = conditionKey(data.status, data.reason, healthMessage(data));
      if (key === st.healthKey || key === st.healthSent) continue;
      st.healthSent = key;
      this.healthQueued++;
      this.logger.info(
        { clusterId: this.clusterId, namespace: st.namespace, name: st.name, status: data.status, reason: data.reason },
        'health of deployed workloads changed; sending it',
      );
      const subject = subjectOf(data.object);
      this.outbox.enqueueEvent(`health\u0000${subject}`, (now) => healthEvent(data, { time: new Date(now) }));
    }
  }

  /** The health event's data of `st` at its current state. */
  private healthData(st: ObjState, health: AppHealth): HealthData {
    return {
      object: this.refOf(st),
      status: health.status,
      reason: health.reason,
      unhealthy: health.unhealthy.map((u) => ({
        kind: u.kind,
        namespace: u.namespace,
        name: u.name,
        why: u.why.slice(0, 256),
      })),
    };
  }

  // ---- emission and the resync timer -------------------------------------------------------

  /**
   * Emits a reason that asks for a reconcile and arms the "no answer" retry, which doubles with
   * each re-ask of the same status ({@link resyncRetryDelay}). Asking again about the same
   * status (a retry) carries `retry-<n>` as its cause: same resourceVersion, new id.
   *
   * A settled object ({@link ObjState.settled}) is answered when asked: its reconcile may change
   * nothing and then writes no status, so no answer is waited for; its next due time counts from
   * now ({@link ObjState.ranAt}), as upstream's requeue counts from its reconcile. Asking again
   * at the same status carries `<reason>-at-<unix seconds>`, so each ask has an id of its own.
   */
  private ask(st: ObjState, reason: Reason, now: number): void {
    if (st.settled) {
      const again = st.ranAt !== NEVER;
      st.ranAt = Math.floor(now / 1000);
      st.asked = NOT_ASKED;
      st.quietAt = st.quietMs < 0 ? Number.NaN : now + st.quietMs;
      this.emit(st, reason, again ? `${reason}-at-${st.ranAt}` : undefined);
      this.schedule(st, now + st.periodMs);
      return;
    }
    st.retries = st.asked === st.handledAt ? st.retries + 1 : 0;
    this.emit(st, reason, st.retries > 0 ? `retry-${st.retries}` : undefined);
    st.asked = st.handledAt;
    this.schedule(st, now + resyncRetryDelay(st.retries, this.resyncRetryMs));
  }

  /** Emits one event for `st` at its current state; `cause` as in {@link Outbox.enqueue}. */
  private emit(st: ObjState, reason: Reason, cause?: string): void {
    this.emitData({ ...this.refOf(st), reason }, cause);
  }

  /** A reference to `st` at its current state. */
  private refOf(st: ObjState): ObjectRef {
    const kind = this.kinds[st.kindIx]!;
    return {
      clusterId: this.clusterId,
      kind: kind.resource.kind as Kind,
      apiVersion: kind.resource.apiVersion,
      namespace: st.namespace,
      name: st.name,
      uid: st.uid,
      generation: st.generation,
      resourceVersion: st.rv,
    };
  }

  private emitData(data: ObjectEventData, cause?: string): void {
    this.emitted[data.reason]++;
    this.outbox.enqueue(data, cause);
  }

  private schedule(st: ObjState, due: number | null): void {
    if (due === null || !Number.isFinite(due)) {
      this.heap.delete(st);
      st.due = Number.POSITIVE_INFINITY;
      return;
    }
    this.heap.set(st, due);
    this.armTimer();
  }

  private armTimer(): void {
    if (!this.ac || this.ac.signal.aborted) return;
    const top = this.heap.peek();
    if (!top || (this.timer !== undefined && this.timerAt <= top.due)) return;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timerAt = top.due;
    const delay = Math.min(MAX_TIMER_MS, Math.max(0, top.due - this.clock.now()));
    this.timer = this.clock.setTimeout(() => this.onTimer(), delay);
  }

  private onTimer(): void {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    const now = this.clock.now();
    for (let st = this.heap.popDue(now); st; st = this.heap.popDue(now)) {
      if (st.failures === NOT_FAILING) {
        const quiet = this.quietDue(st, now, now);
        if (quiet !== null && quiet > now) this.schedule(st, quiet);
        else this.ask(st, 'resync', now);
        continue;
      }
      // A rate-limited requeue: a run that fails again writes the same status (no watch event),
      // so the next one is scheduled now; a run that succeeds changes the status and resets it.
      // Its ordinal is the cause: each requeue at one resourceVersion has an id of its own (one
      // id for all of them was dropped by SQS FIFO deduplication for 5 minutes after the first).
      this.emit(st, 'resync', `requeue-${st.failures}`);
      this.schedule(st, now + rateLimitedRequeueMs(st.failures++));
    }
    this.armTimer();
  }

  /** One string per namespace name ({@link namespaceNames}). */
  private intern(namespace: string): string {
    let s = this.namespaceNames.get(namespace);
    if (s === undefined) {
      s = namespace;
      this.namespaceNames.set(s, s);
    }
    return s;
  }
}

/** FNV-1a 32-bit hash of a condition's status, reason and message (what is compared, not kept). */
function conditionKey(status: string, reason: string, message: string): number {
  let h = 0x811c9dc5;
  const text = `${status}\u0000${reason}\u0000${message}`;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** {@link ObjState.healthKey} of `obj`: the hash of its Healthy condition; `NaN` for none or another kind. */
function healthConditionKey(kind: WatchedKind, obj: KubeObject): number {
  if (kind.resource.kind !== 'App' || kind.resource.apiVersion !== API_VERSIONS.App) return Number.NaN;
  const conditions = (obj.status as { conditions?: unknown } | undefined)?.conditions;
  if (!Array.isArray(conditions)) return Number.NaN;
  const c = conditions.find(
    (x: unknown) => (x as { type?: unknown } | null)?.type === KappLambdaConditionType.Healthy,
  ) as { status?: unknown; reason?: unknown; message?: unknown } | undefined;
  if (!c) return Number.NaN;
  const str = (v: unknown) => (typeof v === 'string' ? v : '');
  return conditionKey(str(c.status), str(c.reason), str(c.message));
}
