/**
 * The reconcile timer: when an App or PackageRepository is due for its next reconcile, computed
 * from the object alone (spec, generation and status), so a restarted forwarder resumes without
 * state.
 *
 * Mirrors kapp-controller `pkg/app/reconcile_timer.go` (App) and its copy
 * `pkg/pkgrepository/reconcile_timer.go` (PackageRepository), plus the sync-period floors in
 * `pkg/config/config.go` (`AppDefaultSyncPeriod`, `AppMinimumSyncPeriod`,
 * `PackageInstallDefaultSyncPeriod`) and the PackageRepository default in
 * `pkg/pkgrepository/package_repo_app.go`. Reference §3.3.
 *
 * All durations are milliseconds. Nothing here reads the clock or a random source of its own:
 * `now` and `rand` are passed in.
 *
 * @module
 */

import { Annotation } from '../api/constants.js';
import {
  DEFAULT_PACKAGE_INSTALL_SYNC_PERIOD,
  DEFAULT_PACKAGE_REPOSITORY_SYNC_PERIOD,
  MINIMUM_SYNC_PERIOD,
} from '../api/defaults.js';
import { DurationParseError, parseDuration, tryParseDuration } from '../api/duration.js';
import type { Condition, TimedObject } from './types.js';

export type { TimedObject } from './types.js';

/** Lowest sync period anything may use: 30s (`reconcile_timer.go`, `config.go`), {@link MINIMUM_SYNC_PERIOD}. */
export const MIN_SYNC_PERIOD_MS = parseDuration(MINIMUM_SYNC_PERIOD);

/** Upper bound of the success jitter: requeue after `syncPeriod + U[0, 5s)` (`applyJitter`). */
export const APP_JITTER_MS = 5_000;

/**
 * Default sync period of a PackageRepository's in-memory App: 10m (`package_repo_app.go`),
 * {@link DEFAULT_PACKAGE_REPOSITORY_SYNC_PERIOD}.
 */
export const PKGR_DEFAULT_SYNC_PERIOD_MS = parseDuration(DEFAULT_PACKAGE_REPOSITORY_SYNC_PERIOD);

/**
 * Default sync period of the App a PackageInstall creates: 10m (`config.go`),
 * {@link DEFAULT_PACKAGE_INSTALL_SYNC_PERIOD}.
 */
export const PKGI_DEFAULT_SYNC_PERIOD_MS = parseDuration(DEFAULT_PACKAGE_INSTALL_SYNC_PERIOD);

/**
 * Consecutive failures at or above which the failure backoff is no longer computed (it would
 * overflow in Go) and the sync period is used instead (`failureSyncPeriod`).
 */
export const MAX_BACKOFF_FAILURES = 30;

/** Which upstream timer to mirror. PackageRepository has no `canceled` and a 10m default. */
export type TimerKind = 'App' | 'PackageRepository';

/**
 * Controller-config sync periods (`kapp-controller-config` keys), already parsed to
 * milliseconds. Absent or ≤30s values fall back to 30s, as in `config.go`.
 */
export interface TimerConfig {
  /** `appDefaultSyncPeriod`: used when an App has no `spec.syncPeriod`. */
  appDefaultSyncPeriodMs?: number;
  /** `appMinimumSyncPeriod`: the lowest sync period any App uses. */
  appMinimumSyncPeriodMs?: number;
  /**
   * `kappLambdaSyncMode` (ours; upstream ignores unknown keys): `periodic` keeps upstream's
   * timer for every App of the cluster; `exception` (the default) lets an App whose inputs the
   * forwarder watches stay quiet at its sync period (`events/forwarder/quiet.ts`).
   */
  syncMode?: 'periodic' | 'exception';
  /** `kappLambdaSafetySyncPeriod` (ours): how often a quiet App still reconciles fully; default 10m. */
  safetySyncPeriodMs?: number;
}

/**
 * The sync mode in force for an object: its `kapp-lambda.carvel.dev/sync-mode` annotation when
 * present (any value but `exception` means `periodic`: a mistyped value keeps upstream's
 * behaviour), else the cluster's {@link TimerConfig.syncMode}, else `exception`. One rule for the forwarder (whether the object may stay quiet) and the pipeline
 * (whether a run that changed nothing may skip its status write: in `periodic` mode it writes
 * every sync, as upstream, so whatever reads the status times sees them move).
 *
 * @param annotations - The object's `metadata.annotations` (absent: none).
 * @param config - The cluster's timer settings.
 */
export function syncModeOf(
  annotations: Readonly<Record<string, string>> | undefined,
  config: TimerConfig | undefined,
): 'periodic' | 'exception' {
  const own = annotations?.[Annotation.SyncMode];
  if (own !== undefined) return own === 'exception' ? 'exception' : 'periodic';
  return config?.syncMode ?? 'exception';
}

/** Options shared by the timer functions. */
export interface TimerOptions {
  /** Defaults to `App`. */
  kind?: TimerKind;
  /** Controller config; ignored for PackageRepository (upstream does not apply it there). */
  config?: TimerConfig;
}

/** A uniform random source on `[0, 1)`, like `Math.random`; injected so tests are deterministic. */
export type RandomSource = () => number;

/**
 * `Config.AppDefaultSyncPeriod()`: the configured value if it is above 30s, else 30s.
 *
 * @param config - Parsed controller config.
 * @returns Milliseconds, ≥ 30000.
 */
export function appDefaultSyncPeriod(config?: TimerConfig): number {
  const v = config?.appDefaultSyncPeriodMs;
  return v !== undefined && v > MIN_SYNC_PERIOD_MS ? v : MIN_SYNC_PERIOD_MS;
}

/**
 * `Config.AppMinimumSyncPeriod()`: the configured value if it is above 30s, else 30s.
 *
 * @param config - Parsed controller config.
 * @returns Milliseconds, ≥ 30000.
 */
export function appMinimumSyncPeriod(config?: TimerConfig): number {
  const v = config?.appMinimumSyncPeriodMs;
  return v !== undefined && v > MIN_SYNC_PERIOD_MS ? v : MIN_SYNC_PERIOD_MS;
}

/**
 * `Config.PackageInstallDefaultSyncPeriod()`: 10m when unset or zero; otherwise the configured
 * value, floored at 30s.
 *
 * @param configuredMs - Parsed `packageInstallDefaultSyncPeriod`, if any.
 * @returns Milliseconds.
 */
export function packageInstallDefaultSyncPeriod(configuredMs?: number): number {
  if (configuredMs === undefined || configuredMs === 0) return PKGI_DEFAULT_SYNC_PERIOD_MS;
  return Math.max(configuredMs, MIN_SYNC_PERIOD_MS);
}

/** Raw `kapp-controller-config` duration keys, as strings from the Secret or ConfigMap. */
export interface ControllerSyncConfigData {
  appDefaultSyncPeriod?: string;
  appMinimumSyncPeriod?: string;
  packageInstallDefaultSyncPeriod?: string;
  /** `periodic` or `exception` ({@link TimerConfig.syncMode}). */
  kappLambdaSyncMode?: string;
  kappLambdaSafetySyncPeriod?: string;
}

/** Parsed form of {@link ControllerSyncConfigData}. */
export interface ControllerSyncConfig extends TimerConfig {
  packageInstallDefaultSyncPeriodMs?: number;
}

/**
 * Parses the sync-period keys of `kapp-controller-config` like `Config.addDataToConfig`
 * (`pkg/config/config.go`): empty values are ignored; the floors are applied later by the
 * accessor functions.
 *
 * @param data - The raw config data.
 * @returns Parsed milliseconds per key that was set.
 * @throws {Error} `Unmarshaling <key> as duration: <Go error>` (with the {@link DurationParseError}
 *   as `cause`) for an unparseable value.
 */
export function parseControllerSyncConfig(data: ControllerSyncConfigData): ControllerSyncConfig {
  const out: ControllerSyncConfig = {};
  const parse = (key: keyof ControllerSyncConfigData): number | undefined => {
    const raw = data[key];
    if (raw === undefined || raw.length === 0) return undefined;
    try {
      return parseDuration(raw);
    } catch (cause) {
      const msg = cause instanceof DurationParseError ? cause.message : String(cause);
      throw new Error(`Unmarshaling ${key} as duration: ${msg}`, { cause });
    }
  };
  const def = parse('appDefaultSyncPeriod');
  if (def !== undefined) out.appDefaultSyncPeriodMs = def;
  const pkgi = parse('packageInstallDefaultSyncPeriod');
  if (pkgi !== undefined) out.packageInstallDefaultSyncPeriodMs = pkgi;
  const min = parse('appMinimumSyncPeriod');
  if (min !== undefined) out.appMinimumSyncPeriodMs = min;
  const safety = parse('kappLambdaSafetySyncPeriod');
  if (safety !== undefined) out.safetySyncPeriodMs = safety;
  const mode = data.kappLambdaSyncMode;
  if (mode !== undefined && mode.length > 0) {
    if (mode !== 'periodic' && mode !== 'exception') {
      throw new Error(
        `Unmarshaling kappLambdaSyncMode: expected periodic or exception, got ${JSON.stringify(mode.slice(0, 64))}`,
      );
    }
    out.syncMode = mode;
  }
  return out;
}

/**
 * The sync period an object reconciles at.
 *
 * - App: `max(spec.syncPeriod ?? appDefaultSyncPeriod, appMinimumSyncPeriod)`, both config values
 *   floored at 30s.
 * - PackageRepository: `spec.syncPeriod ?? 10m`; anything ≤30s becomes 30s.
 *
 * A `spec.syncPeriod` that is not a valid Go duration is treated as absent (the API schema
 * rejects it; upstream would not even decode such an object, and a stray one must not stall the
 * timer).
 *
 * @param obj - The App or PackageRepository.
 * @param opts - Kind and controller config.
 * @returns Milliseconds, ≥ 30000.
 */
export function syncPeriod(obj: Pick<TimedObject, 'spec'>, opts: TimerOptions = {}): number {
  const raw = obj.spec?.syncPeriod;
  const spec = raw === undefined || raw === null ? undefined : tryParseDuration(raw);
  if ((opts.kind ?? 'App') === 'PackageRepository') {
    const sp = spec ?? PKGR_DEFAULT_SYNC_PERIOD_MS;
    return Math.max(sp, MIN_SYNC_PERIOD_MS);
  }
  const sp = spec ?? appDefaultSyncPeriod(opts.config);
  return Math.max(sp, appMinimumSyncPeriod(opts.config));
}

/**
 * `failureSyncPeriod`: `2^n` seconds for `0 < n < 30` when that is below the sync period,
 * otherwise the sync period. No jitter.
 *
 * @param consecutiveFailures - `status.consecutiveReconcileFailures`.
 * @param syncPeriodMs - The object's sync period ({@link syncPeriod}).
 * @returns Milliseconds.
 */
export function failurePeriod(consecutiveFailures: number, syncPeriodMs: number): number {
  if (consecutiveFailures > 0 && consecutiveFailures < MAX_BACKOFF_FAILURES) {
    const d = Math.trunc(2 ** consecutiveFailures) * 1000;
    if (d < syncPeriodMs) return d;
  }
  return syncPeriodMs;
}

/**
 * The backoff of an object after failures: {@link failurePeriod} of its
 * `status.consecutiveReconcileFailures` and {@link syncPeriod}.
 *
 * @param obj - The App or PackageRepository.
 * @param opts - Kind and controller config.
 * @returns Milliseconds.
 */
export function objectFailurePeriod(obj: Pick<TimedObject, 'spec' | 'status'>, opts: TimerOptions = {}): number {
  return failurePeriod(obj.status?.consecutiveReconcileFailures ?? 0, syncPeriod(obj, opts));
}

function parseStatusTime(t: string | null | undefined): number | undefined {
  if (t === undefined || t === null || t === '') return undefined;
  const ms = Date.parse(t);
  return Number.isNaN(ms) ? undefined : ms;
}

/**
 * `lastReconcileTime`: the latest of `status.fetch.updatedAt`, `status.template.updatedAt` and
 * `status.deploy.updatedAt`.
 *
 * @param obj - The App or PackageRepository.
 * @returns The time, or `undefined` when none is set (never reconciled; upstream's
 *   "could not determine time of last reconcile").
 */
export function lastReconcileTime(obj: Pick<TimedObject, 'status'>): Date | undefined {
  const s = obj.status;
  let latest: number | undefined;
  for (const t of [s?.fetch?.updatedAt, s?.template?.updatedAt, s?.deploy?.updatedAt]) {
    const ms = parseStatusTime(t);
    if (ms !== undefined && ms > 0 && (latest === undefined || ms > latest)) latest = ms;
  }
  return latest === undefined ? undefined : new Date(latest);
}

function hasCondition(conditions: Condition[] | null | undefined, type: string): boolean {
  return (conditions ?? []).some((c) => c.type === type);
}

/**
 * Whether `conditions` hold `type` with status `True`. Reads loosely (a watched object's status
 * is not validated): anything but an array of such entries is `false`. The one test of "the last
 * reconcile succeeded" for the forwarder's quiet rule, the run's Events and the source poll.
 */
export function hasTrueCondition(conditions: unknown, type: string): boolean {
  return (
    Array.isArray(conditions) &&
    conditions.some(
      (c) =>
        c !== null &&
        typeof c === 'object' &&
        (c as { type?: unknown }).type === type &&
        (c as { status?: unknown }).status === 'True',
    )
  );
}

/**
 * True when the object carries a `ReconcileFailed` or `DeleteFailed` condition
 * (`hasReconcileStatus`), i.e. the failure backoff applies.
 *
 * @param obj - The App or PackageRepository.
 */
export function hasFailedCondition(obj: Pick<TimedObject, 'status'>): boolean {
  const c = obj.status?.conditions;
  return hasCondition(c, 'ReconcileFailed') || hasCondition(c, 'DeleteFailed');
}

function isHeld(obj: Pick<TimedObject, 'spec'>, kind: TimerKind): boolean {
  if (obj.spec?.paused) return true;
  return kind === 'App' && Boolean(obj.spec?.canceled);
}

/**
 * `IsReadyAt`: whether a timer-driven reconcile should run at `now`.
 *
 * True when the spec changed (`status.observedGeneration != metadata.generation`); false when
 * paused or canceled (PackageRepository: paused only); true when never reconciled; true when
 * failed and the failure backoff has elapsed since the last reconcile; true when the sync period
 * has elapsed.
 *
 * @param obj - The App or PackageRepository.
 * @param now - The current time.
 * @param opts - Kind and controller config.
 */
export function isReadyAt(obj: TimedObject, now: Date, opts: TimerOptions = {}): boolean {
  const kind = opts.kind ?? 'App';
  if ((obj.status?.observedGeneration ?? 0) !== (obj.metadata.generation ?? 0)) return true;
  if (isHeld(obj, kind)) return false;
  const last = lastReconcileTime(obj);
  if (last === undefined) return true;
  const elapsed = now.getTime() - last.getTime();
  const sp = syncPeriod(obj, opts);
  if (hasFailedCondition(obj) && elapsed >= failurePeriod(obj.status?.consecutiveReconcileFailures ?? 0, sp)) {
    return true;
  }
  return elapsed >= sp;
}

/**
 * `applyJitter`: `t - 5s + wait.Jitter(5s, 1.0)`, i.e. `t + U[0, 5s)`, truncated to whole
 * milliseconds.
 *
 * @param ms - The base delay.
 * @param rand - Uniform source on `[0, 1)`.
 * @returns Milliseconds in `[ms, ms + 5000)`.
 */
export function applyJitter(ms: number, rand: RandomSource): number {
  return ms + Math.floor(rand() * APP_JITTER_MS);
}

/**
 * `DurationUntilReady`: the requeue delay after a reconcile. With an error, or a
 * `ReconcileFailed` / `DeleteFailed` condition: the failure backoff (no jitter). Otherwise the sync
 * period plus `U[0, 5s)`.
 *
 * @param obj - The object as it is after the reconcile (its new status).
 * @param err - The infrastructure error the reconcile returned, if any (a failed fetch, template
 *   or deploy is not an error here; it shows as the `ReconcileFailed` condition).
 * @param rand - Uniform source on `[0, 1)` for the jitter.
 * @param opts - Kind and controller config.
 * @returns Milliseconds.
 */
export function durationUntilReady(
  obj: Pick<TimedObject, 'spec' | 'status'>,
  err: unknown,
  rand: RandomSource,
  opts: TimerOptions = {},
): number {
  if ((err !== undefined && err !== null) || hasFailedCondition(obj)) return objectFailurePeriod(obj, opts);
  return applyJitter(syncPeriod(obj, opts), rand);
}

/** FNV-1a over a string, as a fraction in `[0, 1)`: a stable stand-in for a random draw. */
function stableFraction(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h / 2 ** 32;
}

/** Options of {@link nextDueAt}. */
export interface NextDueOptions extends TimerOptions {
  /**
   * Source of the success jitter. Defaults to a stable value derived from the object's uid (or
   * namespace/name) and its last reconcile time, so the due time is a pure function of the
   * object and a restarted forwarder computes the same one.
   */
  rand?: RandomSource;
}

/**
 * The absolute time an object is next due for a timer-driven reconcile, computed from the object
 * alone (the forwarder uses it to rebuild its schedule after a restart).
 *
 * - spec changed (`observedGeneration != generation`) or never reconciled: due now;
 * - paused or canceled (PackageRepository: paused only): `null`, never by timer;
 * - failed (`ReconcileFailed` / `DeleteFailed`): last reconcile + failure backoff;
 * - otherwise: last reconcile + sync period + jitter in `[0, 5s)`.
 *
 * This equals upstream's behaviour: the requeue after a reconcile is `DurationUntilReady` from
 * its end (≈ the last `updatedAt`), and at that time `IsReadyAt` holds.
 *
 * @param obj - The App or PackageRepository.
 * @param now - The current time; returned when the object is due now. When omitted, "due now"
 *   is expressed as the Unix epoch (a time that is always in the past).
 * @param opts - Kind, controller config and jitter source.
 * @returns The due time, or `null` when the timer never fires (only a spec change, which bumps
 *   the generation, makes it due again).
 */
export function nextDueAt(obj: TimedObject, now?: Date, opts: NextDueOptions = {}): Date | null {
  const kind = opts.kind ?? 'App';
  const dueNow = () => now ?? new Date(0);
  if ((obj.status?.observedGeneration ?? 0) !== (obj.metadata.generation ?? 0)) return dueNow();
  if (isHeld(obj, kind)) return null;
  const last = lastReconcileTime(obj);
  if (last === undefined) return dueNow();
  if (hasFailedCondition(obj)) return new Date(last.getTime() + objectFailurePeriod(obj, opts));
  const identity = obj.metadata.uid ?? `${obj.metadata.namespace ?? ''}/${obj.metadata.name ?? ''}`;
  const rand = opts.rand ?? (() => stableFraction(`${identity}@${last.toISOString()}`));
  return new Date(last.getTime() + applyJitter(syncPeriod(obj, opts), rand));
}
