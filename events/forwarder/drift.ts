/**
 * Drift watches: what each App deployed, watched by kapp's app label (metadata only, but for the
 * four workload kinds whose health is judged), so a hand edit or deletion reaches the runtime as
 * an event at once instead of at the next sync period (upstream's only way to notice it: `kapp
 * deploy` on every sync, which reverts it).
 *
 * An App's deploy leaves `status.deploy.kapp.associatedResources` (`label:
 * kapp.k14s.io/app=<id>`, `groupKinds`, `namespaces`: kapp's app metadata, reference §3.8.4).
 * For every group/kind any App deployed, one list+watch (per forwarder scope) of the objects
 * carrying the label, discovered once per kind ({@link ObjectWatcher.discover}), metadata only
 * (`PartialObjectMetadata`): no spec, data or status is ever read or kept. The exception is
 * health after deploy (`health.ts`): `apps` Deployments, StatefulSets and DaemonSets and `batch`
 * Jobs are watched whole (the same one watch), their health computed in the handler and the
 * object dropped: only the verdict of a workload that is not healthy is kept
 * ({@link HealthIndex}), never a spec (a pod template may hold inline env values). Per label value the
 * number of objects is kept per namespace (a relist after 410 Gone tells a deletion made while
 * the watch was away from the count), nothing per object. Only objects in a namespace the App
 * deployed into count as its own (cluster-scoped ones always do).
 *
 * What is drift (reported once per change, `drift: <apiVersion> <Kind> <ns>/<name> <what>`):
 * - a `DELETED` event of a labelled object, while its App is not reconciling (kapp's own
 *   deletions happen while the App's status says `Reconciling`);
 * - a write by anyone but kapp and the controllers ({@link CONTROLLER_MANAGERS}) seen while the
 *   App reconciles: held, and reported when the reconcile ends ({@link DriftWatches.settled});
 * - an `ADDED` or `MODIFIED` event of an object written outside `status` since the App's last
 *   reconcile by another manager than kapp ({@link writtenSince}: any `managedFields` entry of
 *   another manager at or after it): a status-only write (a Deployment's controller) is not
 *   drift, as kapp ignores `status` when it diffs; a write under kapp's name clearly after it
 *   is held for {@link KAPP_WRITE_HOLD_MS} and reported unless a status of a reconcile at that
 *   time arrives meanwhile (the run's own kapp, its status still on the way);
 * - after 410 Gone, a relisted object with such a write, or fewer objects under a label than
 *   before (deleted while the watch was away).
 * A write that leaves no `managedFields` (a client may clear them with `[{}]`) is drift: who
 * wrote it cannot be told.
 *
 * {@link DriftWatches.coveredSince} says since when every watch an App needs has been running
 * without a gap; the forwarder keeps an App quiet at its sync period only when that is before the
 * App's last reconcile (`README.md`, "Reconcile by exception"). While one of those watches fails
 * or stalls, its Apps are not covered and fall back to their sync period
 * ({@link DriftOptions.onUncovered}); once it works again (resumed from its resourceVersion, or
 * relisted and judged after 410) they are covered again as before, so a recovery alone sends
 * nothing for Apps whose objects did not change.
 *
 * @module
 */

import { KAPP_FIELD_MANAGER } from '../../functions/lib/api/constants.js';
import type { DiscoveredKind, KubeObject, ObjectWatcher } from '../../functions/lib/kube/port.js';
import { DRIFT_CAUSE_PREFIX } from '../schema.js';
import type { Clock, TimerHandle } from './clock.js';
import { type AppHealth, appHealth, HealthIndex, isHealthKind, resourceHealth } from './health.js';
import type { ForwarderLogger } from './log.js';
import type { ListMode, ReflectorHandler } from './reflector.js';

/** kapp's app label key: every object kapp deploys carries `kapp.k14s.io/app=<app id>`. */
export const KAPP_APP_LABEL = 'kapp.k14s.io/app';

/** A group and kind as kapp records them (`metav1.GroupKind`; `''` is the core group). */
export interface GroupKind {
  readonly group: string;
  readonly kind: string;
}

/** What an App deployed, from its status: kapp's label value, kinds and namespaces. */
export interface Deployed {
  /** The value of {@link KAPP_APP_LABEL} on every object of the App. */
  readonly label: string;
  /** Kinds kapp applied (`usedGKs`). */
  readonly groupKinds: readonly GroupKind[];
  /** Namespaces it deployed into; `(cluster)` for cluster-scoped objects. */
  readonly namespaces: readonly string[];
}

/** Longest cause carried by an event (the names in it come from the cluster: bounded). */
const MAX_CAUSE = 480;

/**
 * How far a `managedFields` time may lie ahead of the forwarder's clock (5 minutes); an entry
 * further ahead was written by a client (an update may carry any `managedFields`) and is not
 * believed, so it can neither hide later writes nor make every event drift.
 */
export const MAX_FIELDS_CLOCK_LEAD_MS = 300_000;

/**
 * How long after the App's last reconcile a write under kapp's own field manager name is still
 * taken as that reconcile's (5 s: the API server's clock may run ahead of the runtime's).
 */
export const KAPP_WRITE_SKEW_MS = 5_000;

/**
 * How long a write under kapp's field manager name that the App's last status does not explain
 * is held for a status that does (30 s), before it is reported as drift. A reconcile that reverts
 * drift, re-renders a changed input or deploys a moved source starts without a `Reconciling`
 * status (a resync never writes it, and the source poll's pokes do not pass the forwarder), and
 * its kapp's writes can reach the forwarder before its status: judged at once, the runtime's own
 * deploy was drift and the App reconciled once more for nothing. A hand edit under kapp's name
 * (`--field-manager=kapp` is anyone's) is reported when no status explains it in time: 30 s
 * later than another manager's edit, within upstream's 30 s sync period.
 */
export const KAPP_WRITE_HOLD_MS = 30_000;

/**
 * Whether `obj` was written outside `status` since `sinceMs` (the App's last reconcile, second
 * precision; `NaN` when never) by anyone but kapp during a reconcile: any entry of another field
 * manager at or after it, or one under kapp's name more than {@link KAPP_WRITE_SKEW_MS} after it
 * (kapp only writes inside a reconcile, before its status; `--field-manager=kapp` is anyone's).
 * Every entry is judged, not only the newest: an update may set `managedFields` itself, so a
 * forged newest entry would otherwise hide the write. No `managedFields` at all (cleared with
 * `[{}]` by the write itself) is a write by someone unknown: drift.
 */
export function writtenSince(
  obj: KubeObject,
  sinceMs: number,
  nowMs: number,
  skipManagers: ReadonlySet<string> = NO_MANAGERS,
): boolean {
  const fields = obj.metadata.managedFields;
  if (!Array.isArray(fields) || fields.length === 0) return true;
  for (const f of fields as Array<{ manager?: unknown; time?: unknown; subresource?: unknown } | null>) {
    if (f === null || typeof f !== 'object' || f.subresource === 'status') continue;
    const t = typeof f.time === 'string' ? Date.parse(f.time) : Number.NaN;
    if (Number.isNaN(t) || t > nowMs + MAX_FIELDS_CLOCK_LEAD_MS) continue;
    if (typeof f.manager === 'string' && skipManagers.has(f.manager)) continue;
    if (f.manager === KAPP_FIELD_MANAGER) {
      if (!Number.isNaN(sinceMs) && t > sinceMs + KAPP_WRITE_SKEW_MS) return true;
    } else if (Number.isNaN(sinceMs) || t >= sinceMs) {
      return true;
    }
  }
  return false;
}

const NO_MANAGERS: ReadonlySet<string> = new Set();
const KAPP_ONLY: ReadonlySet<string> = new Set([KAPP_FIELD_MANAGER]);

/**
 * The latest time (ms) of a `managedFields` entry under kapp's name outside `status`, entries
 * dated more than {@link MAX_FIELDS_CLOCK_LEAD_MS} ahead of `nowMs` not believed; `NaN` for none.
 */
export function lastKappWrite(obj: KubeObject, nowMs: number): number {
  let latest = Number.NaN;
  const fields = obj.metadata.managedFields;
  if (!Array.isArray(fields)) return latest;
  for (const f of fields as Array<{ manager?: unknown; time?: unknown; subresource?: unknown } | null>) {
    if (f === null || typeof f !== 'object' || f.subresource === 'status' || f.manager !== KAPP_FIELD_MANAGER) continue;
    const t = typeof f.time === 'string' ? Date.parse(f.time) : Number.NaN;
    if (t <= nowMs + MAX_FIELDS_CLOCK_LEAD_MS && !(t <= latest)) latest = t;
  }
  return latest;
}

/**
 * Field managers whose writes during a reconcile are the cluster's own reaction to kapp's apply
 * (the Deployment controller's `deployment.kubernetes.io/revision` annotation), not a hand edit:
 * not held for after the reconcile ({@link DriftWatches.settled}).
 */
export const CONTROLLER_MANAGERS: ReadonlySet<string> = new Set([KAPP_FIELD_MANAGER, 'kube-controller-manager']);

/** Options of {@link DriftWatches}. Times in milliseconds. */
export interface DriftOptions<T> {
  /** Discovery, list and watch (read-only). */
  watcher: ObjectWatcher;
  /**
   * Starts a list+watch of `kind`'s objects carrying {@link KAPP_APP_LABEL}, metadata only
   * unless `full` (a kind whose health is judged, {@link isHealthKind}), in `namespace`
   * (`undefined`: all); runs until the returned function is called (no owner deploys the kind any
   * more) or the forwarder stops.
   */
  watch: (kind: DiscoveredKind, namespace: string | undefined, handler: ReflectorHandler, full: boolean) => () => void;
  /**
   * The health of what `owner` deployed may have changed ({@link DriftWatches.healthOf}): a
   * workload's verdict moved, or a judged kind it deployed completed its first list. Must not
   * throw. Absent: health is not tracked (the watches stay metadata only).
   */
  onHealth?: (owner: T) => void;
  /** Namespaces the forwarder watches; empty: all. */
  scopes: readonly string[];
  /** One change of an owner's deployed objects that is drift. */
  onDrift: (owner: T, cause: string) => void;
  /** Whether the owner's status says a reconcile or delete is running (its kapp's own writes). */
  reconciling: (owner: T) => boolean;
  /** The owner's last reconcile, ms since the epoch (second precision); `NaN` when never. */
  handledAtMs: (owner: T) => number;
  /**
   * A watch some owners need stopped working (a failed list or watch, a stall): owners it
   * covered are no longer {@link DriftWatches.coveredSince covered} until it works again, so
   * quiet ones must fall back to their sync period. Must not throw.
   */
  onUncovered?: () => void;
  /** Wait before discovering a kind again that was not served or failed. Default 60 000. */
  rediscoverMs?: number;
  clock: Clock;
  logger: ForwarderLogger;
}

/** One group/kind's watches. */
interface KindWatch {
  readonly key: string;
  readonly gk: GroupKind;
  /** Its objects' health is judged (read whole; {@link DriftOptions.onHealth} set). */
  readonly health: boolean;
  /** `discovering` until discovery answers; `missing` when not served (or it failed). */
  state: 'discovering' | 'watching' | 'missing';
  /** When discovery last failed or found nothing (ms), for {@link DriftOptions.rediscoverMs}. */
  missingAt: number;
  /** The kind's scope: namespaced (one watch per forwarder scope) or not. */
  namespaced: boolean;
  /** Watches not yet through their first list. */
  unlisted: number;
  /** When the last of its watches completed its first list (ms); +∞ before. */
  listedAt: number;
  /** Watches currently failing or stalled ({@link ReflectorHandler.health}). */
  down: number;
  /** Owners whose deploy lists the kind; at 0 the kind is released. */
  users: number;
  /** Stop its running watches. */
  stops: (() => void)[];
}

/** See the module comment. */
export class DriftWatches<T> {
  /**
   * Label value → the owners whose status names it: one in a cluster that nobody tampers with
   * (kapp makes a label per app). The status is writable by whoever may patch `apps/status`, so
   * an App may name another App's label; a label named by two owners belongs to neither
   * ({@link soleOwner}): neither is covered (both keep their sync period) and its objects' drift
   * goes to nobody, rather than to the last one to name it (another tenant's object names in its
   * `DriftDetected` Events, and the real owner uncovered).
   */
  private readonly owners = new Map<string, Set<T>>();
  private readonly deployed = new Map<T, Deployed>();
  private readonly kinds = new Map<string, KindWatch>();
  /**
   * Owner → the first foreign write seen while it reconciled: kapp may have applied before it,
   * so it is reported when the reconcile ends ({@link settled}).
   */
  private readonly held = new Map<T, string>();
  /**
   * Owner → the latest write under kapp's name its status did not explain when seen, held for
   * {@link KAPP_WRITE_HOLD_MS} ({@link holdKappWrite}).
   */
  private readonly kappHeld = new Map<T, { at: number; cause: string; timer: TimerHandle }>();
  private readonly rediscoverMs: number;
  /** Workloads that are not healthy (only with {@link DriftOptions.onHealth}). */
  private readonly healthIndex = new HealthIndex();
  private stopped = false;

  /** @param opts - See {@link DriftOptions}. */
  constructor(private readonly opts: DriftOptions<T>) {
    this.rediscoverMs = opts.rediscoverMs ?? 60_000;
  }

  /** Kinds watched, of them the ones through their first list, and label values known, for stats. */
  get size(): { kinds: number; listed: number; owners: number } {
    let listed = 0;
    for (const w of this.kinds.values()) if (w.state === 'watching' && w.unlisted === 0) listed++;
    return { kinds: this.kinds.size, listed, owners: this.owners.size };
  }

  /**
   * Records what `owner` deployed (its latest status), starting the watches of kinds not yet
   * watched; `undefined` forgets it.
   */
  track(owner: T, deployed: Deployed | undefined): void {
    const before = this.deployed.get(owner);
    if (before && (!deployed || before.label !== deployed.label)) {
      const named = this.owners.get(before.label);
      named?.delete(owner);
      if (named?.size === 0) this.owners.delete(before.label);
    }
    // Count the new kinds' users before releasing the old ones: a kind in both stays watched.
    const kept = new Set<string>();
    if (deployed) {
      this.deployed.set(owner, deployed);
      const named = this.owners.get(deployed.label) ?? new Set<T>();
      named.add(owner);
      this.owners.set(deployed.label, named);
      for (const gk of deployed.groupKinds) {
        const key = keyOf(gk);
        if (kept.has(key)) continue;
        kept.add(key);
        this.ensure(gk).users++;
      }
    } else {
      this.deployed.delete(owner);
    }
    for (const key of before ? new Set(before.groupKinds.map(keyOf)) : []) {
      const w = this.kinds.get(key);
      if (w && --w.users <= 0) this.release(w);
    }
  }

  /**
   * No owner deploys `w`'s kind any more: its watches stop and it is forgotten (an owner that
   * deploys it again starts a new list+watch, and is covered once that listed).
   */
  private release(w: KindWatch): void {
    this.kinds.delete(w.key);
    for (const stop of w.stops) stop();
    w.stops = [];
    this.opts.logger.info({ kind: w.key }, 'no App deploys this kind any more; its drift watch stops');
  }

  /** Forgets `owner` (deleted). */
  untrack(owner: T): void {
    this.held.delete(owner);
    this.dropKappWrite(owner);
    this.track(owner, undefined);
  }

  /**
   * `owner`'s reconcile ended (its status no longer says it runs): a hand edit seen during it,
   * which that reconcile's kapp may have applied before, is reported now (`... during a
   * reconcile`). Without this it would be older than the new last reconcile and never judged.
   */
  settled(owner: T): void {
    const cause = this.held.get(owner);
    if (cause === undefined) return;
    this.held.delete(owner);
    this.opts.onDrift(owner, cause);
  }

  /**
   * Since when (ms) every watch `owner`'s deployed objects need has run without a gap: the latest
   * first-list time of its kinds; `0` when it deployed nothing; `undefined` when something is
   * not watched (no deploy recorded, a kind not served or not yet listed, a namespace or a
   * cluster-scoped kind outside the forwarder's scopes).
   */
  coveredSince(owner: T): number | undefined {
    const d = this.deployed.get(owner);
    if (!d || this.soleOwner(d.label) !== owner) return undefined;
    const scoped = this.opts.scopes.length > 0;
    if (scoped && d.namespaces.some((ns) => ns === '(cluster)' || !this.opts.scopes.includes(ns))) return undefined;
    let since = 0;
    for (const gk of d.groupKinds) {
      const w = this.kinds.get(keyOf(gk));
      if (w?.state !== 'watching' || w.unlisted > 0 || w.down > 0) return undefined;
      if (scoped && !w.namespaced) return undefined;
      since = Math.max(since, w.listedAt);
    }
    return since;
  }

  /** Stops starting watches (the forwarder's own stop ends the running ones) and drops held writes. */
  stop(): void {
    this.stopped = true;
    for (const owner of [...this.kappHeld.keys()]) this.dropKappWrite(owner);
  }

  private ensure(gk: GroupKind): KindWatch {
    const key = keyOf(gk);
    let w = this.kinds.get(key);
    if (w && (w.state !== 'missing' || this.opts.clock.now() - w.missingAt < this.rediscoverMs)) return w;
    if (!w) {
      w = {
        key,
        gk: { group: gk.group, kind: gk.kind },
        health: this.opts.onHealth !== undefined && isHealthKind(gk),
        state: 'discovering',
        missingAt: 0,
        namespaced: true,
        unlisted: 0,
        listedAt: Number.POSITIVE_INFINITY,
        down: 0,
        users: 0,
        stops: [],
      };
      this.kinds.set(key, w);
    }
    w.state = 'discovering';
    const watch = w;
    this.opts.watcher.discover(gk.group, gk.kind).then(
      (kind) => this.discovered(watch, kind),
      (err: unknown) => {
        this.opts.logger.warn(
          { err, kind: key },
          'discovering a deployed kind failed; Apps using it keep their sync period',
        );
        this.discovered(watch, undefined);
      },
    );
    return w;
  }

  private discovered(w: KindWatch, kind: DiscoveredKind | undefined): void {
    if (this.stopped || this.kinds.get(w.key) !== w) return; // stopped, or released meanwhile
    if (!kind) {
      w.state = 'missing';
      w.missingAt = this.opts.clock.now();
      return;
    }
    w.state = 'watching';
    w.namespaced = kind.type.namespaced;
    const scopes: (string | undefined)[] =
      kind.type.namespaced && this.opts.scopes.length > 0 ? [...this.opts.scopes] : [undefined];
    if (!kind.type.namespaced && this.opts.scopes.length > 0) return; // not covered (coveredSince)
    w.unlisted = scopes.length;
    for (const ns of scopes) w.stops.push(this.opts.watch(kind, ns, this.handler(w, kind, ns), w.health));
  }

  /** One scope's handler; its label counts are its own (a relist replaces them). */
  private handler(w: KindWatch, kind: DiscoveredKind, ns: string | undefined): ReflectorHandler {
    let counts = new Map<string, number>();
    let next = new Map<string, number>();
    let listedOnce = false;
    let healthy = true;
    /** Keys of the objects this list found not healthy (the rest of the index's are gone or fine). */
    let notOkSeen = new Set<string>();
    return {
      health: (ok: boolean) => {
        if (ok === healthy) return;
        healthy = ok;
        w.down += ok ? -1 : 1;
        // Back up: nothing to do. The watch resumed from its resourceVersion (or relisted after
        // 410 and judged every object against the owners' last reconciles), so a change made
        // while it was down is reported as drift, and an unchanged owner stays quiet: no burst.
        if (!ok && w.down === 1) this.opts.onUncovered?.();
      },
      listStart: () => {
        next = new Map();
        notOkSeen = new Set();
      },
      listItem: (obj: KubeObject, mode: ListMode) => {
        const label = obj.metadata.labels?.[KAPP_APP_LABEL];
        if (label === undefined) return;
        if (w.health && this.judgeHealth(w, obj, label)) notOkSeen.add(HealthIndex.keyOf(w.gk, obj));
        const key = countKey(obj, label);
        next.set(key, (next.get(key) ?? 0) + 1);
        if (mode === 'relist') this.judgeWrite(kind, obj, 'modified while the watch was away');
      },
      listEnd: (mode: ListMode) => {
        if (mode === 'relist') this.judgeCounts(kind, counts, next);
        counts = next;
        next = new Map();
        if (w.health) {
          this.healthChanged(this.healthIndex.sweep(w.gk, ns, notOkSeen));
          notOkSeen = new Set();
        }
        if (!listedOnce) {
          listedOnce = true;
          w.unlisted--;
          if (w.unlisted === 0) {
            w.listedAt = this.opts.clock.now();
            if (w.health) this.kindListed(w);
          }
        }
      },
      event: (e) => {
        const label = e.object.metadata.labels?.[KAPP_APP_LABEL];
        if (w.health) {
          if (e.type === 'DELETED' || label === undefined) {
            const m = e.object.metadata;
            this.healthChanged(this.healthIndex.delete(w.gk, m.namespace ?? '', m.name));
          } else {
            this.judgeHealth(w, e.object, label);
          }
        }
        if (label === undefined) return;
        const key = countKey(e.object, label);
        const n = counts.get(key) ?? 0;
        if (e.type === 'DELETED') {
          if (n <= 1) counts.delete(key);
          else counts.set(key, n - 1);
          const owner = this.ownerOf(label, e.object.metadata.namespace);
          if (owner !== undefined && !this.opts.reconciling(owner)) {
            this.opts.onDrift(owner, causeOf(kind, e.object, 'deleted'));
          }
          return;
        }
        if (e.type === 'ADDED') counts.set(key, n + 1);
        this.judgeWrite(kind, e.object, e.type === 'ADDED' ? 'created' : 'modified');
      },
    };
  }

  /**
   * The health of what `owner` deployed ({@link appHealth}), from the workloads it deployed that
   * are not healthy, in the namespaces it deployed into; `undefined` while it cannot be told: no
   * deploy recorded, its label also named by another owner, or a judged kind it deployed not
   * served, not yet listed, or outside the forwarder's scopes. A watch that is down keeps its
   * last verdicts (its Apps fall back to their sync period meanwhile, `coveredSince`).
   */
  healthOf(owner: T): AppHealth | undefined {
    const d = this.deployed.get(owner);
    if (!d || !this.opts.onHealth || this.soleOwner(d.label) !== owner) return undefined;
    const scoped = this.opts.scopes.length > 0;
    for (const gk of d.groupKinds) {
      if (!isHealthKind(gk)) continue;
      const w = this.kinds.get(keyOf(gk));
      if (w?.state !== 'watching' || w.unlisted > 0) return undefined;
      if (scoped && d.namespaces.some((ns) => !this.opts.scopes.includes(ns))) return undefined;
    }
    return appHealth(this.healthIndex.notOk(d.label, d.namespaces));
  }

  /** Whether a deploy of `owner` is recorded (its status names what it deployed). */
  tracks(owner: T): boolean {
    return this.deployed.has(owner);
  }

  /** Judges one workload into the index; true when it is not healthy. */
  private judgeHealth(w: KindWatch, obj: KubeObject, label: string): boolean {
    const verdict = resourceHealth(w.gk, obj);
    if (!verdict) return false;
    this.healthChanged(this.healthIndex.set(label, w.gk, obj, verdict));
    return verdict.health !== 'ok';
  }

  /** Tells {@link DriftOptions.onHealth} the owners of `labels`. */
  private healthChanged(labels: readonly string[]): void {
    for (const label of labels) {
      const owner = this.soleOwner(label);
      if (owner !== undefined) this.opts.onHealth?.(owner);
    }
  }

  /** A judged kind is listed: every owner that deployed it may now have a health. */
  private kindListed(w: KindWatch): void {
    for (const [owner, d] of this.deployed) {
      if (d.groupKinds.some((gk) => keyOf(gk) === w.key)) this.opts.onHealth?.(owner);
    }
  }

  /** The one owner whose status names `label`; `undefined` for none or several (see {@link owners}). */
  private soleOwner(label: string): T | undefined {
    const named = this.owners.get(label);
    return named?.size === 1 ? named.values().next().value : undefined;
  }

  /**
   * The App whose deployed objects carry `label`, when an object in `namespace` (`undefined`:
   * cluster-scoped) can be one of them: a namespace it deployed into. Anyone may put the label on
   * an object in their own namespace; it must not make another tenant's App reconcile.
   */
  private ownerOf(label: string | undefined, namespace: string | undefined): T | undefined {
    const owner = label === undefined ? undefined : this.soleOwner(label);
    if (owner === undefined || !namespace) return owner;
    const namespaces = this.deployed.get(owner)?.namespaces ?? [];
    return namespaces.length === 0 || namespaces.includes(namespace) ? owner : undefined;
  }

  /** Reports `obj`'s latest write when it is drift (see the module comment). */
  private judgeWrite(kind: DiscoveredKind, obj: KubeObject, what: string): void {
    const owner = this.ownerOf(obj.metadata.labels?.[KAPP_APP_LABEL], obj.metadata.namespace);
    if (owner === undefined) return;
    const handled = this.opts.handledAtMs(owner);
    const now = this.opts.clock.now();
    if (this.opts.reconciling(owner)) {
      if (!this.held.has(owner) && writtenSince(obj, handled, now, CONTROLLER_MANAGERS)) {
        this.held.set(owner, causeOf(kind, obj, `${what} during a reconcile`));
      }
      return;
    }
    if (writtenSince(obj, handled, now, KAPP_ONLY)) {
      this.opts.onDrift(owner, causeOf(kind, obj, what));
      return;
    }
    const kappAt = lastKappWrite(obj, now);
    if (!Number.isNaN(handled) && kappAt > handled + KAPP_WRITE_SKEW_MS) {
      this.holdKappWrite(owner, kappAt, causeOf(kind, obj, what));
    }
  }

  /**
   * A write under kapp's name after the last status's reconcile (+ skew): a reconcile whose
   * status has not arrived yet, or a hand edit under kapp's name. Reported after
   * {@link KAPP_WRITE_HOLD_MS} unless a status explains it by then (its reconcile at or after the
   * write, less the skew); one hold per owner, its latest write.
   */
  private holdKappWrite(owner: T, at: number, cause: string): void {
    const cur = this.kappHeld.get(owner);
    if (cur) {
      if (at > cur.at) Object.assign(cur, { at, cause });
      return;
    }
    const timer = this.opts.clock.setTimeout(() => this.releaseKappWrite(owner), KAPP_WRITE_HOLD_MS);
    this.kappHeld.set(owner, { at, cause, timer });
  }

  private releaseKappWrite(owner: T): void {
    const held = this.kappHeld.get(owner);
    if (!held || this.stopped) return;
    this.kappHeld.delete(owner);
    if (!(held.at > this.opts.handledAtMs(owner) + KAPP_WRITE_SKEW_MS)) return; // a status explains it
    if (this.opts.reconciling(owner)) {
      // A run started meanwhile: reported when it ends, as a hand edit seen during it.
      if (!this.held.has(owner)) this.held.set(owner, held.cause);
      return;
    }
    this.opts.onDrift(owner, held.cause);
  }

  private dropKappWrite(owner: T): void {
    const held = this.kappHeld.get(owner);
    if (!held) return;
    this.opts.clock.clearTimeout(held.timer);
    this.kappHeld.delete(owner);
  }

  /** After a relist: a label with fewer objects than before lost some while the watch was away. */
  private judgeCounts(kind: DiscoveredKind, before: Map<string, number>, after: Map<string, number>): void {
    for (const [key, n] of before) {
      const slash = key.indexOf('/');
      const owner = this.ownerOf(key.slice(slash + 1), key.slice(0, slash));
      if (owner === undefined || (after.get(key) ?? 0) >= n || this.opts.reconciling(owner)) continue;
      this.opts.onDrift(owner, `${DRIFT_CAUSE_PREFIX}${kind.apiVersion} ${kind.kind} deleted while the watch was away`);
    }
  }
}

/** A label count's key: `<namespace>/<label value>` (neither holds a `/`). */
function countKey(obj: KubeObject, label: string): string {
  return `${obj.metadata.namespace ?? ''}/${label}`;
}

function keyOf(gk: GroupKind): string {
  return `${gk.group}/${gk.kind}`;
}

function causeOf(kind: DiscoveredKind, obj: KubeObject, what: string): string {
  const ns = obj.metadata.namespace;
  const text = `${DRIFT_CAUSE_PREFIX}${kind.apiVersion} ${kind.kind} ${ns ? `${ns}/` : ''}${obj.metadata.name} ${what}`;
  return text.length > MAX_CAUSE ? text.slice(0, MAX_CAUSE) : text;
}
