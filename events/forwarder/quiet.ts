/**
 * Reconcile by exception, the App's side: when an App may stay quiet at its sync period, and
 * what it deployed (for the drift watches, `drift.ts`).
 *
 * Upstream reconciles every App every `syncPeriod` (30 s by default) because that is its only
 * way to notice drift, a moved source or a changed input. The forwarder watches all three for
 * an App whose inputs it can see, so such an App's sync period sends nothing; a full reconcile
 * still runs once per safety period (default 10 minutes). Everything else keeps upstream's
 * timer exactly: an App that failed, whose spec is not yet reconciled, that deploys to another
 * cluster (`spec.cluster`: its objects are out of sight), that fetches a source that can move
 * and that the fleet's source poll does not follow (a source with a Secret, a helm chart version
 * constraint: see `sourceTracked`; a git branch, tag or `refSelection`, an image or bundle by tag
 * or `tagSelection`, http without `sha256` and a helm chart version without a Secret are polled
 * for the fleet, which sends the App `ref-changed` when they move,
 * `functions/lib/pipeline/source-poll.ts`), that
 * runs kbld on anything but an imgpkg bundle (kbld resolves tags at render time; over a bundle it
 * reads the bundle's own `.imgpkg/images.yml` lock, and the bundle is pinned or polled), that
 * decrypts with sops (its key Secret is not tracked), or that asks for it (annotation or cluster
 * setting below). Not tracked either, so only the safety period notices a change to it: the
 * RBAC behind the App's ServiceAccount (the ServiceAccount itself is a tracked ref).
 *
 * PackageRepositories follow the same rule ({@link packageRepositoryQuietUntil}), and a
 * PackageInstall has no timer of its own (upstream reconciles it on its App's status writes), so
 * its App's rule is its rule; the App carries the PackageInstall's sync-mode annotations
 * (`functions/lib/packaging/app-from-package.ts`).
 *
 * @module
 */
import { Annotation } from '../../functions/lib/api/constants.js';
import { tryParseDuration } from '../../functions/lib/api/duration.js';
import { sourcePinned, sourceTracked } from '../../functions/lib/api/pin-rule.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import {
  applyJitter,
  hasFailedCondition,
  hasTrueCondition,
  lastReconcileTime,
  syncModeOf,
  syncPeriod,
  type TimerConfig,
} from '../../functions/lib/reconcile/timer.js';
import type { TimedObject } from '../../functions/lib/reconcile/types.js';
import type { Deployed, GroupKind } from './drift.js';

/**
 * App and PackageRepository annotation (a PackageInstall's is copied to its App) choosing how its sync period behaves: `periodic` (upstream's: a reconcile every
 * `syncPeriod`) or `exception` (quiet while nothing changed); overrides the cluster's
 * {@link TimerConfig.syncMode}.
 */
export const SYNC_MODE_ANNOTATION = Annotation.SyncMode;

/** App annotation: its safety period (Go duration), overriding the cluster's. */
export const SAFETY_SYNC_PERIOD_ANNOTATION = Annotation.SafetySyncPeriod;

/** Default safety period: a quiet App still reconciles fully this often (10 minutes). */
export const DEFAULT_SAFETY_SYNC_PERIOD_MS = 600_000;

/** How an App's sync period behaves (see {@link SYNC_MODE_ANNOTATION}). */
export type SyncMode = 'periodic' | 'exception';

type Loose = Record<string, unknown> | undefined;

function rec(v: unknown): Loose {
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/**
 * Whether one `spec.fetch[]` entry's content changes only with what sends the App an event:
 * inline (its `pathsFrom` Secrets and ConfigMaps are watched refs), a pinned source
 * ({@link sourcePinned}), or a source the fleet's poll follows ({@link sourceTracked}: the App
 * fetch stage joins it to the poll by the same rule, and a move sends `ref-changed`). Anything
 * else can move behind the spec's back.
 */
export function fetchEntryFixed(entry: unknown): boolean {
  return rec(rec(entry)?.inline) !== undefined || sourcePinned(entry) || sourceTracked(entry);
}

/**
 * Whether the App's render can change only with its spec and the objects the forwarder
 * watches (see the module comment).
 */
export function appInputsFixed(spec: Loose): boolean {
  const fetch = spec?.fetch;
  if (!Array.isArray(fetch) || fetch.length === 0 || !fetch.every(fetchEntryFixed)) return false;
  const template = Array.isArray(spec?.template) ? spec.template : [];
  // sops reads its private keys from a Secret the forwarder does not track (upstream's SecretRefs
  // leaves it out too): a key rotation must reach the App within its sync period.
  if (template.some((t) => rec(t)?.sops !== undefined)) return false;
  // A downwardAPI value reads the App's own metadata (labels and annotations change with no new
  // generation) and the cluster's version and API groups: upstream picks a change up at the next
  // sync, and no watch here tells of one.
  if (template.some(readsDownwardAPI)) return false;
  const kbld = template.some((t) => rec(t)?.kbld !== undefined);
  // kbld resolves image tags against registries; a bundle pinned by digest brings its lock.
  return !kbld || fetch.every((f) => rec(rec(f)?.imgpkgBundle) !== undefined);
}

/** Whether a template step (any tool's) has a `valuesFrom` entry with `downwardAPI`. */
function readsDownwardAPI(step: unknown): boolean {
  return Object.values(rec(step) ?? {}).some((tool) => {
    const from = rec(tool)?.valuesFrom;
    return Array.isArray(from) && from.some((v) => rec(v)?.downwardAPI !== undefined);
  });
}

/**
 * Whether the status says the last reconcile succeeded and none is running: `ReconcileSucceeded`
 * True and no `Reconciling` or `Deleting` True. A run that died mid-way (a function timeout)
 * leaves `Reconciling` beside the previous deploy; its drift is not judged while it shows, so
 * such an App keeps its sync period.
 */
function succeeded(obj: KubeObject): boolean {
  return hasTrueCondition(rec(obj.status)?.conditions, 'ReconcileSucceeded') && !inFlight(obj);
}

/** Whether the status shows a reconcile or delete in progress (`Reconciling`/`Deleting` True). */
export function inFlight(obj: KubeObject): boolean {
  const conditions = rec(obj.status)?.conditions;
  return hasTrueCondition(conditions, 'Reconciling') || hasTrueCondition(conditions, 'Deleting');
}

/**
 * Whether an App's reconcile may end without a status write (`functions/lib/pipeline/stage.ts`
 * `closeStage`: a resync that changed nothing writes no status): its last reconcile succeeded
 * for its current generation, none is running, and it is neither deleted, paused nor canceled.
 * The forwarder then counts an ask as answered when it is sent (`forwarder.ts` `ask`), since no
 * status write may follow.
 *
 * @param obj - An App as watched (not validated).
 */
export function appSettled(obj: KubeObject): boolean {
  const spec = rec(obj.spec);
  if (obj.metadata.deletionTimestamp || spec?.paused || spec?.canceled) return false;
  return rec(obj.status)?.observedGeneration === (obj.metadata.generation ?? 0) && succeeded(obj);
}

/**
 * Most distinct kinds an App's status may name for its drift watches: 512. kapp records the kinds
 * it applied, so a real App names at most the kinds its cluster serves (a large platform bundle:
 * some hundred); but the status is writable by whoever may patch `apps/status`, and each kind
 * named is a discovery (two requests) and, when served, a list+watch of the cluster by the
 * forwarder. A status naming more is not believed: the App has no drift watches and keeps its
 * sync period, as one whose status names no label.
 */
export const MAX_DEPLOYED_GROUP_KINDS = 512;

/**
 * What the App deployed, from `status.deploy.kapp.associatedResources` (`label:
 * kapp.k14s.io/app=<id>`, `groupKinds`, `namespaces`), or `undefined` without a label or with
 * more than {@link MAX_DEPLOYED_GROUP_KINDS} distinct kinds.
 *
 * @param obj - An App as watched (not validated).
 */
export function appDeployed(obj: KubeObject): Deployed | undefined {
  const assoc = rec(rec(rec(rec(obj.status)?.deploy)?.kapp)?.associatedResources);
  const label = typeof assoc?.label === 'string' ? assoc.label : '';
  const eq = label.indexOf('=');
  if (eq < 0 || label.slice(0, eq) !== 'kapp.k14s.io/app' || eq === label.length - 1) return undefined;
  const groupKinds: GroupKind[] = [];
  const distinct = new Set<string>();
  for (const gk of Array.isArray(assoc?.groupKinds) ? assoc.groupKinds : []) {
    const g = rec(gk);
    if (typeof g?.kind === 'string' && g.kind !== '') {
      const group = typeof g.group === 'string' ? g.group : '';
      groupKinds.push({ group, kind: g.kind });
      distinct.add(`${group}/${g.kind}`);
      if (distinct.size > MAX_DEPLOYED_GROUP_KINDS) return undefined;
    }
  }
  const namespaces = (Array.isArray(assoc?.namespaces) ? assoc.namespaces : []).filter(
    (n): n is string => typeof n === 'string' && n !== '',
  );
  return { label: label.slice(eq + 1), groupKinds, namespaces };
}

/**
 * The sync mode and safety period in force for `obj` (its annotations over the cluster's
 * settings over the defaults): the safety period in ms, or `undefined` when it keeps upstream's
 * periodic timer (mode `periodic`, or a safety period not longer than `syncPeriodMs`).
 */
function safetyPeriod(obj: KubeObject, config: TimerConfig | undefined, syncPeriodMs: number): number | undefined {
  const annotations = obj.metadata.annotations ?? {};
  if (syncModeOf(annotations, config) !== 'exception') return undefined;
  const fromAnnotation = annotations[SAFETY_SYNC_PERIOD_ANNOTATION];
  const safety =
    (fromAnnotation === undefined ? undefined : tryParseDuration(fromAnnotation)) ??
    config?.safetySyncPeriodMs ??
    DEFAULT_SAFETY_SYNC_PERIOD_MS;
  return safety > syncPeriodMs ? safety : undefined;
}

/**
 * The safety due time of an object whose status says it succeeded for its current generation and
 * is not running or failing: its last reconcile plus the safety period in force
 * ({@link safetyPeriod}) plus the timer's jitter; `undefined` otherwise.
 */
function safetyDueAt(
  obj: KubeObject,
  config: TimerConfig | undefined,
  syncPeriodMs: number,
  rand: () => number,
): number | undefined {
  const status = rec(obj.status);
  if (status?.observedGeneration !== (obj.metadata.generation ?? 0)) return undefined;
  const timed = obj as unknown as TimedObject;
  if (hasFailedCondition(timed) || !succeeded(obj)) return undefined;
  const last = lastReconcileTime(timed);
  const safety = safetyPeriod(obj, config, syncPeriodMs);
  return last && safety !== undefined ? last.getTime() + applyJitter(safety, rand) : undefined;
}

/**
 * The time (ms since the epoch) until which an App may stay quiet, its safety due time: the last
 * reconcile plus the safety period plus the timer's jitter; `undefined` when it keeps
 * upstream's periodic timer (see the module comment), including when the safety period is not
 * longer than its sync period.
 *
 * @param obj - An App as watched.
 * @param config - The cluster's timer settings (`kapp-controller-config`).
 * @param rand - Jitter source on `[0, 1)`.
 */
export function appQuietUntil(
  obj: KubeObject,
  config: TimerConfig | undefined,
  rand: () => number,
): number | undefined {
  const spec = rec(obj.spec);
  if (!appSettled(obj) || rec(spec?.cluster)) return undefined;
  if (!rec(rec(rec(obj.status)?.deploy)?.kapp) || !appInputsFixed(spec)) return undefined;
  return safetyDueAt(obj, config, syncPeriod(obj as unknown as TimedObject, { config }), rand);
}

/**
 * Whether a PackageRepository's content can change only with its spec, the Secrets the forwarder
 * watches for it, or a poke: `inline` without `pathsFrom` (upstream tracks no `pathsFrom` of a
 * repository, nor does the forwarder), a pinned source ({@link sourcePinned}), or a source the
 * fleet source poll tracks ({@link sourceTracked}: a moved tag or branch sends it
 * `ref-changed`, `functions/lib/pipeline/source-poll.ts`) other than http, which a repository's
 * run fetches as written (`trackSource`).
 *
 * @param fetch - The repository's `spec.fetch`, as watched.
 */
export function repositoryInputsFixed(fetch: unknown): boolean {
  const inline = rec(rec(fetch)?.inline);
  if (inline) return !Array.isArray(inline.pathsFrom) || inline.pathsFrom.length === 0;
  // http without sha256: the repository run does not join the poll (`trackSource`), so only its
  // timer notices a new body.
  return sourcePinned(fetch) || (sourceTracked(fetch) && rec(fetch)?.http === undefined);
}

/**
 * {@link appQuietUntil} for a PackageRepository (its timer: `pkg/pkgrepository/reconcile_timer.go`,
 * default 10m, so with the default safety period only a shorter `syncPeriod` is ever quiet): its
 * last reconcile succeeded for its generation and deployed, it is not paused or being deleted,
 * and {@link repositoryInputsFixed}. The forwarder also needs drift watches covering the
 * Packages and PackageMetadatas it deployed with kapp, which it finds in
 * `status.deploy.kapp.associatedResources` ({@link appDeployed}); a repository's status has none
 * (as upstream's), so today a repository stays periodic at the forwarder.
 *
 * @param obj - A PackageRepository as watched.
 * @param config - The cluster's timer settings (only the sync mode and safety period apply).
 * @param rand - Jitter source on `[0, 1)`.
 */
export function packageRepositoryQuietUntil(
  obj: KubeObject,
  config: TimerConfig | undefined,
  rand: () => number,
): number | undefined {
  const spec = rec(obj.spec);
  if (obj.metadata.deletionTimestamp || spec?.paused || !rec(rec(obj.status)?.deploy)) return undefined;
  if (!repositoryInputsFixed(spec?.fetch)) return undefined;
  return safetyDueAt(obj, config, syncPeriod(obj as unknown as TimedObject, { kind: 'PackageRepository' }), rand);
}
