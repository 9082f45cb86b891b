/**
 * The table of kinds the forwarder watches. Adding PackageInstall or PackageRepository (or a
 * future kind) is configuration: pick entries by name with {@link watchedKinds}, or pass any
 * {@link WatchedKind}; the forwarder has no per-kind code.
 *
 * Each entry says where the objects live (apiVersion/kind for the watch port,
 * group/version/plural for RBAC and docs), when an object is due for a timer-driven resync
 * (from the object alone, kapp-controller `pkg/app/reconcile_timer.go`), which Secrets and
 * ConfigMaps in its namespace it references (kapp-controller `pkg/app/app.go`
 * `SecretRefs`/`ConfigMapRefs`, `pkg/pkgrepository/reconciler.go`; reference §3.1), and when it
 * was last reconciled.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import { GENERIC_ERROR_DETAIL } from '../../functions/lib/api/constants.js';
import type { AppFetch } from '../../functions/lib/api/index.js';
import {
  type AppRefsSpec,
  placeholderSecretName,
  referencedConfigMaps,
  referencedSecrets,
  wantsPlaceholder,
} from '../../functions/lib/api/refs.js';
import type { KubeObject, ResourceKind } from '../../functions/lib/kube/port.js';
import {
  lastReconcileTime,
  nextDueAt,
  type TimedObject,
  type TimerConfig,
} from '../../functions/lib/reconcile/timer.js';
import { soakingUntil } from '../../functions/lib/rollout/condition.js';
import { type BackoffOptions, backoffDelay } from './backoff.js';
import type { Deployed } from './drift.js';
import { appDeployed, appQuietUntil, appSettled, packageRepositoryQuietUntil } from './quiet.js';

/** Names of Secrets and ConfigMaps (in the object's own namespace) an object reads. */
export interface ObjectRefs {
  /** Secret names, sorted, without duplicates. */
  readonly secrets: readonly string[];
  /** ConfigMap names, sorted, without duplicates. */
  readonly configMaps: readonly string[];
  /** ServiceAccount names (an App's `spec.serviceAccountName`); absent or empty when none. */
  readonly serviceAccounts?: readonly string[];
}

/** One watched kind. All functions are pure and must not throw on odd shapes. */
export interface WatchedKind {
  /** `apiVersion` and `kind`, as the watch port takes them. */
  readonly resource: ResourceKind;
  /** REST coordinates, for RBAC (`infra/forwarder/rbac.yml`) and logs. */
  readonly group: string;
  /** API version within the group. */
  readonly version: string;
  /** Lowercase plural resource name. */
  readonly plural: string;
  /**
   * When the object is next due for a timer-driven reconcile, from the object alone.
   *
   * @param obj - The object as watched.
   * @param now - Current time, ms since the epoch.
   * @returns Milliseconds since the epoch (≤ `now` means due now), or `null` for never by timer.
   */
  dueAt(obj: KubeObject, now: number): number | null;
  /** Whether {@link WatchedKind.refs} can name Secrets (the forwarder then watches Secrets). */
  readonly tracksSecrets: boolean;
  /** Whether {@link WatchedKind.refs} can name ConfigMaps (the forwarder then watches ConfigMaps). */
  readonly tracksConfigMaps: boolean;
  /** Whether {@link WatchedKind.refs} can name ServiceAccounts (the forwarder then watches them). */
  readonly tracksServiceAccounts?: boolean;
  /** Secrets and ConfigMaps the object references (§3.1); empty while it is being deleted. */
  refs(obj: KubeObject): ObjectRefs;
  /**
   * When the object was last reconciled, per its status (ms since the epoch), or `undefined`
   * when never. Used after a restart to tell whether a referenced Secret changed since.
   */
  handledAt(obj: KubeObject): number | undefined;
  /**
   * The watched object that controls this one and reconciles when it changes (upstream: a
   * controller-runtime `Watches` of the owned kind with `EnqueueRequestForOwner`), or
   * `undefined`. Kinds without it notify nobody.
   */
  controlledBy?(obj: KubeObject): ControllerOwner | undefined;
  /**
   * A short fingerprint of what, besides the spec (generation) and deletion, makes a change of
   * the object `modified`; `undefined` when nothing else does. Kinds without it react to spec
   * changes only.
   */
  changeKey?(obj: KubeObject): string | undefined;
  /**
   * Whether the object's status shows a reconcile that upstream's controller ended by returning
   * an error, which controller-runtime requeues with its per-object rate limiter
   * ({@link CONTROLLER_RATE_LIMIT}) until a reconcile succeeds. Kinds without it are never
   * requeued that way (their timers come from status, {@link WatchedKind.dueAt}).
   */
  failedWithError?(obj: KubeObject): boolean;
  /**
   * The namespaces whose termination can turn the object's pending deletion into a noop
   * (kapp-controller `noopDeleteDueToTerminatingNamespaces`, reference §3.9): once every one of
   * them is terminating or gone, the object is asked to reconcile (`ref-changed`, cause
   * `Namespace/<name>@<rv>`). `undefined` when none can (the common case: not being deleted).
   * Kinds without it never wait on namespaces, and the forwarder then watches none.
   */
  waitsOnNamespaces?(obj: KubeObject): readonly string[] | undefined;
  /**
   * What the object deployed (kapp's label value, kinds, namespaces), which the forwarder's drift
   * watches follow (`drift.ts`); `undefined` when nothing is known. Kinds without it have no
   * drift watch.
   */
  deployed?(obj: KubeObject): Deployed | undefined;
  /**
   * Until when (ms since the epoch) the object may stay quiet at its sync period while every
   * watch it needs has run without a gap since its last reconcile (`quiet.ts`); `undefined` when
   * it keeps upstream's periodic timer. Kinds without it are always periodic.
   *
   * @param rand - Jitter source on `[0, 1)`.
   */
  quietUntil?(obj: KubeObject, rand: () => number): number | undefined;
  /**
   * Whether a reconcile of the object may end without writing its status (it changed nothing):
   * an ask for it is then counted as answered when sent, and its next due time counts from the
   * ask instead of from the status. Kinds without it always write status when they reconcile.
   */
  settled?(obj: KubeObject): boolean;
}

/**
 * controller-runtime's default per-object rate limiter (`workqueue.DefaultControllerRateLimiter`,
 * its `ItemExponentialFailureRateLimiter(5ms, 1000s)`), as {@link backoffDelay} options: the
 * n-th requeue of a failing object (n from 0) waits `min(5 ms · 2^n, 1000 s)`, no jitter; the
 * count resets when a reconcile succeeds (`Forget`). So about 10 retries in the first 5 s, then
 * 10 s, 20 s, … and every 16 min 40 s from the 18th on. (The limiter's overall 10 qps bucket is
 * not reproduced: the fan-out of events is bounded by the outbox and the queues.)
 */
export const CONTROLLER_RATE_LIMIT: Readonly<Required<BackoffOptions>> = Object.freeze({
  initialMs: 5,
  maxMs: 1_000_000,
  factor: 2,
  jitter: 0,
});

/** The wait before requeue number `n` (from 0) of {@link CONTROLLER_RATE_LIMIT}, ms. */
export function rateLimitedRequeueMs(n: number): number {
  return backoffDelay(n, () => 0, CONTROLLER_RATE_LIMIT);
}

/** The controller of an object, from its `metadata.ownerReferences` entry with `controller: true`. */
export interface ControllerOwner {
  /** The owner's `apiVersion` and `kind`. */
  readonly resource: ResourceKind;
  /** The owner's name (same namespace as the object). */
  readonly name: string;
  /** The owner's uid: a recreated owner of the same name is not notified. */
  readonly uid: string;
}

/** Refs of an object that references nothing. Shared, frozen. */
export const NO_REFS: ObjectRefs = Object.freeze({ secrets: Object.freeze([]), configMaps: Object.freeze([]) });

type Loose = Record<string, unknown> | undefined;

function rec(v: unknown): Loose {
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

function deleting(obj: KubeObject): boolean {
  return Boolean(obj.metadata.deletionTimestamp);
}

/** Drops the empty name (a ref without a name matches no object); exact-size arrays, shared empties. */
function named(names: readonly string[]): readonly string[] {
  if (names.length === 0) return NO_REFS.secrets;
  // `filter` would over-allocate the result's backing store; this runs per object and event.
  if (!names.includes('')) return names;
  const out = names.filter((n) => n.length > 0);
  return out.length === 0 ? NO_REFS.secrets : out.slice();
}

function refsOf(secrets: readonly string[], configMaps: readonly string[]): ObjectRefs {
  const s = named(secrets);
  const c = named(configMaps);
  if (s.length === 0 && c.length === 0) return NO_REFS;
  return { secrets: s, configMaps: c };
}

/**
 * Secrets and ConfigMaps an App references: `referencedSecrets` / `referencedConfigMaps` of
 * `functions/lib/api/refs.ts` (kapp-controller `pkg/app/app.go` `SecretRefs` /
 * `ConfigMapRefs`, reference §3.1), plus its `spec.serviceAccountName` (ours: upstream applies a
 * ServiceAccount change at its next sync; an App quiet at its sync period is asked at once
 * instead). An App being deleted references nothing (upstream drops its refs); a spec the walk
 * cannot read (the API server's schema makes that unlikely) references no Secret or ConfigMap
 * rather than stopping the forwarder.
 *
 * @param obj - An App as watched (not validated).
 */
export function appRefs(obj: KubeObject): ObjectRefs {
  if (deleting(obj)) return NO_REFS;
  const spec = (rec(obj.spec) ?? {}) as AppRefsSpec;
  let refs: ObjectRefs;
  try {
    refs = refsOf(referencedSecrets(spec), referencedConfigMaps(spec));
  } catch {
    refs = NO_REFS;
  }
  const sa = rec(obj.spec)?.serviceAccountName;
  return typeof sa === 'string' && sa !== '' ? { ...refs, serviceAccounts: [sa] } : refs;
}

/**
 * Secrets a PackageRepository references: `spec.fetch.{image, imgpkgBundle, http, git}.secretRef`,
 * and for an `image` or `imgpkgBundle` fetch without one its placeholder Secret `<name>-fetch-0`
 * (kapp-controller `pkg/pkgrepository/reconciler.go`: the refs of the in-memory App, placeholder
 * set, so secretgen-controller filling it reconciles the repository; `inline.pathsFrom` and
 * ConfigMaps are not tracked upstream, reference §3.1). Empty while it is being deleted.
 *
 * @param obj - A PackageRepository as watched.
 */
export function packageRepositoryRefs(obj: KubeObject): ObjectRefs {
  if (deleting(obj)) return NO_REFS;
  const fetch = rec(rec(obj.spec)?.fetch);
  const names = new Set<string>();
  for (const src of ['image', 'imgpkgBundle', 'http', 'git'] as const) {
    const name = rec(rec(fetch?.[src])?.secretRef)?.name;
    if (typeof name === 'string') names.add(name);
  }
  if (wantsPlaceholder(fetch as AppFetch | undefined)) names.add(placeholderSecretName(obj.metadata.name, 0));
  return refsOf([...names].sort(), []);
}

function observedGenerationOf(obj: KubeObject): number | undefined {
  const og = rec(obj.status)?.observedGeneration;
  return typeof og === 'number' ? og : undefined;
}

/**
 * Sync periods for the App timer: fixed, or read at each computation (the embedded runtime
 * follows its cluster's `kapp-controller-config`, which may change while the forwarder runs).
 */
export type TimerConfigSource = TimerConfig | (() => TimerConfig | undefined);

function currentConfig(config: TimerConfigSource | undefined): () => TimerConfig | undefined {
  return typeof config === 'function' ? config : () => config;
}

function timedDueAt(kind: 'App' | 'PackageRepository', config: TimerConfigSource | undefined) {
  const current = currentConfig(config);
  return (obj: KubeObject, now: number): number | null => {
    const d = nextDueAt(obj as unknown as TimedObject, new Date(now), { kind, config: current() });
    return d === null ? null : d.getTime();
  };
}

function timedHandledAt(obj: KubeObject): number | undefined {
  return lastReconcileTime(obj as unknown as TimedObject)?.getTime();
}

const PACKAGE_INSTALL_RESOURCE: ResourceKind = Object.freeze({
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  kind: 'PackageInstall',
});

/**
 * App (`kappctrl.k14s.io/v1alpha1`, `apps`): due per {@link nextDueAt} (sync period + jitter
 * after success, 2^n s after failure, never while paused/canceled), refs per {@link appRefs};
 * quiet at its sync period per {@link appQuietUntil}, its deployed objects per {@link appDeployed};
 * a reconcile of it may end without a status write once {@link appSettled}.
 *
 * @param config - Controller-config sync periods (`appDefaultSyncPeriod`, `appMinimumSyncPeriod`),
 *   fixed or read at each due-time computation.
 */
export function appKind(config?: TimerConfigSource): WatchedKind {
  return {
    resource: { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' },
    group: 'kappctrl.k14s.io',
    version: 'v1alpha1',
    plural: 'apps',
    dueAt: timedDueAt('App', config),
    tracksSecrets: true,
    tracksConfigMaps: true,
    tracksServiceAccounts: true,
    refs: appRefs,
    handledAt: timedHandledAt,
    controlledBy: appControllingPackageInstall,
    waitsOnNamespaces: appNoopDeleteNamespaces,
    changeKey: appRollbackChangeKey,
    deployed: appDeployed,
    quietUntil: (obj, rand) => appQuietUntil(obj, currentConfig(config)(), rand),
    settled: appSettled,
  };
}

/**
 * The namespaces an App being deleted waits on (reference §3.9, kapp-controller v0.40+
 * `noopDeleteDueToTerminatingNamespaces`): its own and each of
 * `status.deploy.kapp.associatedResources.namespaces`, sorted, when it has a `deletionTimestamp`,
 * a `serviceAccountName` and a `status.deploy.kapp`, and deployed nothing cluster-scoped
 * (`(cluster)`); otherwise `undefined`. Once all of them are terminating or gone its delete is a
 * noop; upstream notices only at its next retry (nothing there watches Namespaces), this
 * forwarder at once, whichever namespace terminates last.
 *
 * @param obj - An App as watched (not validated).
 */
export function appNoopDeleteNamespaces(obj: KubeObject): readonly string[] | undefined {
  if (!deleting(obj)) return undefined;
  if (typeof rec(obj.spec)?.serviceAccountName !== 'string' || rec(obj.spec)?.serviceAccountName === '')
    return undefined;
  const kapp = rec(rec(rec(obj.status)?.deploy)?.kapp);
  if (!kapp) return undefined;
  const listed = rec(kapp.associatedResources)?.namespaces;
  const names = new Set<string>([obj.metadata.namespace ?? '']);
  if (Array.isArray(listed)) {
    for (const ns of listed) {
      if (ns === '(cluster)') return undefined;
      if (typeof ns === 'string' && ns !== '') names.add(ns);
    }
  }
  return [...names].sort();
}

/**
 * The App's rollback annotations (`kapp-lambda.carvel.dev/rollback-to` and `…/rollback-generation`,
 * set and removed by `npm run receipts -- rollback`), joined; `undefined` when neither is set. A
 * change is `modified`, which the reconcile step runs at once (`functions/lib/pipeline/app/reconcile.ts`),
 * so a rollback and its clearing take effect without waiting for the sync period.
 *
 * @param obj - An App as watched.
 */
export function appRollbackChangeKey(obj: KubeObject): string | undefined {
  const a = obj.metadata.annotations ?? {};
  const to = a['kapp-lambda.carvel.dev/rollback-to'];
  const generation = a['kapp-lambda.carvel.dev/rollback-generation'];
  return to === undefined && generation === undefined ? undefined : `${to ?? ''}@${generation ?? ''}`;
}

/**
 * The PackageInstall controlling an App (its controller ownerReference of kind
 * `PackageInstall` in group `packaging.carvel.dev`), or `undefined`. Upstream's PackageInstall
 * controller watches the Apps it owns and reconciles the owner on every change of one (status
 * included, reference §3.9 step 5, §3.11.5): that is how the PackageInstall mirrors its App's
 * status and removes its finalizer once the App is gone.
 *
 * @param obj - An App as watched.
 */
export function appControllingPackageInstall(obj: KubeObject): ControllerOwner | undefined {
  const refs = obj.metadata.ownerReferences;
  if (!Array.isArray(refs)) return undefined;
  const ref = refs.find(
    (r) =>
      r?.controller === true &&
      r.kind === 'PackageInstall' &&
      typeof r.apiVersion === 'string' &&
      r.apiVersion.split('/')[0] === 'packaging.carvel.dev',
  );
  if (!ref || typeof ref.name !== 'string' || typeof ref.uid !== 'string') return undefined;
  return { resource: PACKAGE_INSTALL_RESOURCE, name: ref.name, uid: ref.uid };
}

/**
 * PackageRepository (`packaging.carvel.dev/v1alpha1`, `packagerepositories`): due per the
 * PackageRepository timer (`pkg/pkgrepository/reconcile_timer.go`: default 10m, floor 30s),
 * refs per {@link packageRepositoryRefs}; quiet at its sync period per
 * {@link packageRepositoryQuietUntil} once its deployed Packages are known ({@link appDeployed}).
 *
 * @param config - The cluster's settings: only the sync mode and safety period apply (upstream
 *   applies no controller-config sync period to repositories).
 */
export function packageRepositoryKind(config?: TimerConfigSource): WatchedKind {
  return {
    resource: { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageRepository' },
    group: 'packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'packagerepositories',
    dueAt: timedDueAt('PackageRepository', undefined),
    tracksSecrets: true,
    tracksConfigMaps: false,
    refs: packageRepositoryRefs,
    handledAt: timedHandledAt,
    deployed: appDeployed,
    quietUntil: (obj, rand) => packageRepositoryQuietUntil(obj, currentConfig(config)(), rand),
  };
}

/**
 * PackageInstall (`packaging.carvel.dev/v1alpha1`, `packageinstalls`). Upstream has **no**
 * periodic timer for it (periodicity comes from its App's sync, reference §3.1): due only while
 * `status.observedGeneration != metadata.generation`, otherwise never, except that a reconcile
 * failed with an error of its own is requeued with controller-runtime's rate limiter
 * ({@link packageInstallFailedWithError}). References nothing (its values Secrets are read by
 * the App it creates, which tracks them). Every change of an App it controls asks for its
 * reconcile ({@link appControllingPackageInstall}). A change of its annotations is `modified`
 * ({@link packageInstallChangeKey}).
 */
export function packageInstallKind(): WatchedKind {
  return {
    resource: PACKAGE_INSTALL_RESOURCE,
    group: 'packaging.carvel.dev',
    version: 'v1alpha1',
    plural: 'packageinstalls',
    dueAt: packageInstallDueAt,
    tracksSecrets: false,
    tracksConfigMaps: false,
    refs: () => NO_REFS,
    handledAt: () => undefined,
    changeKey: packageInstallChangeKey,
    failedWithError: packageInstallFailedWithError,
  };
}

/**
 * A PackageInstall's due time: now for a spec not yet reconciled; else the end of the soak its
 * `kapp-lambda.carvel.dev/Rollout` condition announces (`Soaking … until T`), so the run that
 * releases a rollout's next wave comes at T without a poll (from status alone: a restarted
 * forwarder keeps it); else never by timer.
 */
export function packageInstallDueAt(obj: KubeObject, now: number): number | null {
  if ((observedGenerationOf(obj) ?? 0) !== (obj.metadata.generation ?? 0)) return now;
  const conditions = rec(obj.status)?.conditions;
  return (Array.isArray(conditions) && soakingUntil(conditions as { type: string }[])) || null;
}

/**
 * Whether a PackageInstall's last reconcile returned an error upstream (`pkg/packageinstall/
 * packageinstall.go`: `return reconcile.Result{Requeue: true}, err`, which controller-runtime
 * requeues rate-limited): its status for the current generation is `ReconcileFailed` (or
 * `DeleteFailed`) with a message of its own, e.g. `Package <refName> not found` or `Expected to
 * find at least one version, but did not (...)`. Not the failures upstream ends without an error,
 * whose message is `Error (see .status.usefulErrorMessage for details)`: the App's failure
 * mirrored (the App's own timer retries, and each App change reconciles the PackageInstall) and
 * the refused downgrade (fixed by the user's change).
 *
 * @param obj - A PackageInstall as watched.
 */
export function packageInstallFailedWithError(obj: KubeObject): boolean {
  if ((observedGenerationOf(obj) ?? -1) !== (obj.metadata.generation ?? 0)) return false;
  const conditions = rec(obj.status)?.conditions;
  if (!Array.isArray(conditions)) return false;
  return conditions.some((c) => {
    const cond = rec(c);
    return (
      (cond?.type === 'ReconcileFailed' || cond?.type === 'DeleteFailed') &&
      cond.status === 'True' &&
      typeof cond.message === 'string' &&
      cond.message !== '' &&
      cond.message !== GENERIC_ERROR_DETAIL
    );
  });
}

/** Annotation kubectl rewrites with every `apply` (it mirrors the spec, which generation covers). */
const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';

/**
 * The fingerprint of a PackageInstall's annotations (sha256, base64url, 16 bytes: small for
 * the forwarder's per-object state), `undefined` without any. Upstream's PackageInstall
 * controller reconciles on every update, and annotations steer that reconcile without changing
 * the generation: `packaging.carvel.dev/downgradable` is how a user lets a refused downgrade
 * proceed, the `ignore-*-version-selection` annotations lift a version check, and the
 * `ext.packaging.carvel.dev/*` ones change the App it writes. Adding one must act at once, as
 * upstream, not at the next timer.
 */
export function packageInstallChangeKey(obj: KubeObject): string | undefined {
  const annotations = Object.entries(obj.metadata.annotations ?? {}).filter(([k]) => k !== LAST_APPLIED);
  if (annotations.length === 0) return undefined;
  annotations.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return createHash('sha256').update(JSON.stringify(annotations)).digest('base64url').slice(0, 22);
}

/** Names accepted by {@link watchedKinds}. */
export type WatchedKindName = 'App' | 'PackageInstall' | 'PackageRepository';

/**
 * Builds the watched-kind table from names (e.g. from a `FORWARDER_KINDS=App,PackageRepository`
 * setting read by an entry file).
 *
 * @param names - Kinds to watch, in order; duplicates are dropped. Default `['App']`.
 * @param config - Controller-config sync periods for the App timer.
 * @throws TypeError `unknown watched kind "<name>"` for any other name.
 */
export function watchedKinds(names: readonly string[] = ['App'], config?: TimerConfigSource): WatchedKind[] {
  const out: WatchedKind[] = [];
  for (const name of new Set(names)) {
    switch (name) {
      case 'App':
        out.push(appKind(config));
        break;
      case 'PackageInstall':
        out.push(packageInstallKind());
        break;
      case 'PackageRepository':
        out.push(packageRepositoryKind(config));
        break;
      default:
        throw new TypeError(`unknown watched kind ${JSON.stringify(name)}`);
    }
  }
  return out;
}

/**
 * `status.observedGeneration` of any kapp-controller kind (`GenericStatus`), or `undefined`
 * when the object was never reconciled (no status written yet).
 */
export function observedGeneration(obj: KubeObject): number | undefined {
  return observedGenerationOf(obj);
}
