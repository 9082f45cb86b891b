/**
 * Pieces every stage handler shares: re-reading the App an event refers to, the run fence,
 * reading referenced Secrets/ConfigMaps into the planners' shapes, scratch directories, and
 * the single function that turns a run's results into status (style.md §1: steps never set
 * conditions themselves).
 */
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import path from 'node:path';
import type { ObjectRef, StageStatusSummary } from '../../../events/schema.js';
import {
  type App,
  type AppStatus,
  type ConfigMapLike,
  parseApp,
  type RefObjects,
  type SecretLike,
} from '../api/index.js';
import { APP_API_VERSION, type FetchView, type KubeObject, type KubeReader, type ResourceRef } from '../kube/port.js';
import { type RunFence, type StatusBounds, type StatusWriteResult, writeStatus } from '../kube/status-write.js';
import { logStageRun, type StageOutcome } from '../log.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import {
  fetchStatus,
  formatStatusTime,
  MAX_STATUS_TEXT_BYTES,
  markReconcileCompleted,
  type StageResult,
  templateStatus,
  truncateTail,
} from '../reconcile/status.js';
import { fitStatus, statusBudgetFor, tooLargeStatus } from '../reconcile/status-budget.js';
import type { AppStatusLike } from '../reconcile/types.js';
import type { PipelineDeps } from './deps.js';

/** The Kubernetes reference of the App an event refers to. */
export function appRef(ref: Pick<ObjectRef, 'namespace' | 'name'>): ResourceRef {
  return { apiVersion: APP_API_VERSION, kind: 'App', namespace: ref.namespace, name: ref.name };
}

/** `cluster/App/namespace/name`: the object key used in logs and as the queue key. */
export function objectKey(ref: Pick<ObjectRef, 'clusterId' | 'namespace' | 'name'>): string {
  return `${ref.clusterId}/App/${ref.namespace}/${ref.name}`;
}

/** The App as read, raw (for status writes) and parsed (for decisions). */
export interface LoadedApp {
  raw: KubeObject;
  app: App;
}

/** Result of {@link loadApp}. */
export type LoadResult =
  | { kind: 'ok'; loaded: LoadedApp }
  | { kind: 'gone' }
  | { kind: 'invalid'; raw: KubeObject; message: string };

/**
 * Re-reads the App (functions never trust the event's copy: events are references).
 * An object the API server accepted but our schema rejects (only possible with a CRD older
 * than ours) is reported as `invalid` with the field path, so it can get a status, not a crash.
 *
 * @throws KubeApiError when the read fails (the run is retried).
 */
export async function loadApp(kube: KubeReader, ref: ResourceRef): Promise<LoadResult> {
  const raw = await kube.getObject(ref);
  if (!raw) return { kind: 'gone' };
  const parsed = parseApp(raw);
  if (!parsed.success) return { kind: 'invalid', raw, message: parsed.error.message };
  return { kind: 'ok', loaded: { raw, app: parsed.data } };
}

/**
 * Re-reads the App for a later stage and applies the run fence.
 * @returns the App, or why the stage must stop without work (`gone`: deleted, recreated or
 *   unparsable; `stale`: a newer spec exists and its own run will follow).
 * @throws KubeApiError when the read fails (the stage is retried).
 */
export async function loadFenced(
  kube: KubeReader,
  ref: ResourceRef,
  fence: RunFence,
): Promise<{ loaded: LoadedApp; stop?: undefined } | { stop: 'gone' | 'stale' }> {
  const result = await loadApp(kube, ref);
  const state = checkFence(result.kind === 'ok' ? result.loaded.raw : undefined, fence);
  if (result.kind !== 'ok' || state !== 'ok') return { stop: state === 'ok' ? 'gone' : state };
  return { loaded: result.loaded };
}

/** Why a later stage stops without work: the object is gone, recreated, or has a newer spec. */
export type FenceResult = 'ok' | 'gone' | 'stale';

/** Checks that the live object is the one (uid) and the spec (generation) a run started for. */
export function checkFence(raw: KubeObject | undefined, fence: RunFence): FenceResult {
  if (!raw || raw.metadata.uid !== fence.uid) return 'gone';
  if (raw.metadata.generation !== fence.generation) return 'stale';
  return 'ok';
}

/**
 * Reads the named Secrets and ConfigMaps of a namespace into the planners' lookup. Missing
 * objects are simply absent (the planners then fail with the API server's not-found text).
 *
 * @param mask - when given, every data value of every Secret read is added to it, so that what
 *   the stage writes for the App never shows them (`../reconcile/secret-mask.ts`).
 * @throws KubeApiError when a read fails for another reason.
 */
export async function readRefs(
  kube: KubeReader,
  namespace: string,
  secrets: readonly string[],
  configMaps: readonly string[],
  mask?: SecretMask,
): Promise<RefObjects & { digests: Record<string, string> }> {
  const { createHash } = await import('node:crypto');
  const digests: Record<string, string> = {};
  const secretsRead = new Map<string, SecretLike>();
  const configMapsRead = new Map<string, ConfigMapLike>();
  for (const name of [...new Set(secrets)].filter(Boolean)) {
    const s = await kube.getSecret(namespace, name);
    if (s) {
      mask?.addSecretData(s.data);
      secretsRead.set(name, s);
    }
    // Digest of the wire form (type, base64 data), so fetch-cache keys stay what they were.
    const wire = s && Object.fromEntries(Object.entries(s.data).map(([k, v]) => [k, v.toString('base64')]));
    digests[`secret/${name}`] = s
      ? createHash('sha256')
          .update(JSON.stringify([s.type, wire]))
          .digest('hex')
      : '-';
  }
  for (const name of [...new Set(configMaps)].filter(Boolean)) {
    const c = await kube.getConfigMap(namespace, name);
    if (c) configMapsRead.set(name, c);
    digests[`configmap/${name}`] = c
      ? createHash('sha256')
          .update(JSON.stringify([c.data, Object.keys(c.binaryData)]))
          .digest('hex')
      : '-';
  }
  return { secret: (name) => secretsRead.get(name), configMap: (name) => configMapsRead.get(name), digests };
}

/**
 * Makes a fresh scratch directory under the configured tmp root; remove it with
 * {@link removeScratch} in a `finally`.
 */
export async function makeScratch(deps: PipelineDeps, prefix: string): Promise<string> {
  await mkdir(deps.config.tmpRoot, { recursive: true });
  return await mkdtemp(path.join(deps.config.tmpRoot, `${prefix}-`));
}

/** Removes a scratch directory; never throws (a leftover temp dir must not fail a run). */
export async function removeScratch(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true }).catch(() => undefined);
}

/** Max characters of each output carried in a stage hand-off event (events/schema.ts limits). */
const SUMMARY_OUTPUT_BYTES = 15 * 1024;
const SUMMARY_ERROR_BYTES = 4000;

/**
 * Shrinks a status part into the bounded summary a hand-off event carries (the tail of each
 * output is kept, like the 1 MiB status truncation, but at event size).
 */
export function summarize(part: {
  startedAt?: string;
  updatedAt?: string;
  exitCode?: number;
  error?: string;
  stdout?: string;
  stderr?: string;
}): StageStatusSummary {
  const s: StageStatusSummary = {
    updatedAt: part.updatedAt ?? new Date(0).toISOString(),
    exitCode: part.exitCode ?? 0,
  };
  if (part.startedAt) s.startedAt = part.startedAt;
  if (part.error) s.error = truncateTail(part.error, SUMMARY_ERROR_BYTES);
  if (part.stdout) s.stdout = truncateTail(part.stdout, SUMMARY_OUTPUT_BYTES);
  if (part.stderr) s.stderr = truncateTail(part.stderr, SUMMARY_OUTPUT_BYTES);
  return s;
}

/** Builds `status.fetch` from a fetch result (bounded, redacted). */
export function fetchPart(result: StageResult, startedAt: Date, now: Date): NonNullable<AppStatus['fetch']> {
  return fetchStatus(result, { startedAt, updatedAt: now }) as NonNullable<AppStatus['fetch']>;
}

/** Builds `status.template` from a template result (stderr only; the manifest is never stored). */
export function templatePart(result: StageResult, now: Date): NonNullable<AppStatus['template']> {
  return templateStatus(result, { updatedAt: now }) as NonNullable<AppStatus['template']>;
}

/** A stored status part rebuilt from a hand-off summary. */
export function partFromSummary(s: StageStatusSummary | undefined): Record<string, unknown> | undefined {
  if (!s) return undefined;
  const out: Record<string, unknown> = { exitCode: s.exitCode, updatedAt: s.updatedAt };
  if (s.startedAt) out.startedAt = s.startedAt;
  if (s.error) out.error = s.error;
  if (s.stdout) out.stdout = s.stdout;
  if (s.stderr) out.stderr = s.stderr;
  return out;
}

/** True when the live status announced this run (condition `Reconciling`): each stage then writes at once. */
export function writesImmediately(status: AppStatus | undefined): boolean {
  return status?.conditions?.some((c) => c.type === 'Reconciling') ?? false;
}

/** The status parts a run has produced so far (any may be absent). */
export interface RunParts {
  fetch?: Record<string, unknown>;
  template?: Record<string, unknown>;
  deploy?: Record<string, unknown>;
  inspect?: Record<string, unknown> | null;
}

/**
 * THE status summarizer: merges a run's parts into the current status and, when `result` is
 * given, completes the reconcile (`ReconcileSucceeded`/`ReconcileFailed`, counters,
 * friendlyDescription, usefulErrorMessage), as `pkg/app/app_reconcile.go` does after
 * `reconcileFetchTemplateDeploy`. `observedGeneration` is the run's generation.
 */
export function summarizeStatus(
  current: AppStatus | undefined,
  generation: number,
  parts: RunParts,
  result?: StageResult,
): AppStatus {
  let next = { ...(current ?? {}) } as AppStatusLike & Record<string, unknown>;
  next.observedGeneration = generation;
  if (parts.fetch) next.fetch = parts.fetch;
  if (parts.template) next.template = parts.template;
  if (parts.deploy) next.deploy = parts.deploy;
  if (parts.inspect === null) delete next.inspect;
  else if (parts.inspect) next.inspect = parts.inspect;
  if (result) next = markReconcileCompleted(next, result) as typeof next;
  return next as AppStatus;
}

/**
 * Drops the status fields upstream declares `omitempty` when they hold their zero value
 * (`usefulErrorMessage` "", `consecutiveReconcileSuccesses` 0, `consecutiveReconcileFailures` 0;
 * `pkg/apis/kappctrl/v1alpha1/types.go` `AppStatus`, `GenericStatus`), so the stored status has
 * kapp-controller's shape: no `usefulErrorMessage: ""` after a success. Readers treat a missing
 * counter as 0.
 */
export function omitEmptyStatusFields(status: AppStatus): AppStatus {
  const out = { ...status } as AppStatus & Record<string, unknown>;
  if (out.usefulErrorMessage === '') delete out.usefulErrorMessage;
  if (out.consecutiveReconcileSuccesses === 0) delete out.consecutiveReconcileSuccesses;
  if (out.consecutiveReconcileFailures === 0) delete out.consecutiveReconcileFailures;
  return out;
}

/**
 * The size discipline of every App status write (`reconcile/status-budget.ts`): the status is
 * fitted to the object's budget ({@link statusBudgetFor}: 1 MiB, less when the spec is large),
 * and a status the API server still rejects as too large is replaced by
 * {@link tooLargeStatus} (`ReconcileFailed`, or `DeleteFailed` during a delete, with a short
 * message) instead of being retried.
 *
 * @param generation - `observedGeneration` of the fallback status (the run's generation).
 */
export function appStatusBounds(generation: number): StatusBounds<AppStatus> {
  return {
    fit: (status, object) =>
      fitStatus(status, statusBudgetFor(object as unknown as Record<string, unknown>), generation),
    tooLarge: (current, attempted, error) =>
      omitEmptyStatusFields(tooLargeStatus(current, attempted, generation, error.message)),
  };
}

/**
 * Writes a status computed from the current one, fenced by the run (see `writeStatus`), with
 * upstream's `omitempty` fields dropped when empty ({@link omitEmptyStatusFields}). THE one
 * path of App status writes: every status is bounded by {@link appStatusBounds} here, and,
 * with `mask`, every string of it has the run's Secret values masked (a last pass: stages mask
 * each tool result as it returns, before any cut, see `../reconcile/secret-mask.ts`).
 */
export async function writeAppStatus(
  kube: FetchView,
  ref: ResourceRef,
  fence: RunFence,
  mutate: (current: AppStatus | undefined) => AppStatus,
  mask?: SecretMask,
): Promise<StatusWriteResult> {
  return await writeStatus<AppStatus>(
    kube,
    ref,
    fence,
    (cur) => omitEmptyStatusFields(mask ? mask.deep(mutate(cur)) : mutate(cur)),
    appStatusBounds(fence.generation),
  );
}

/** Helper for one stage-run log line and its timing. */
export function stageTimer(deps: PipelineDeps, stage: string, object: string, generation: number) {
  const started = performance.now();
  return (outcome: StageOutcome, extra: { error?: string; tools?: { runs: number; ms: number } } = {}) =>
    logStageRun(deps.log, {
      object,
      stage,
      generation,
      durationMs: Math.round(performance.now() - started),
      outcome,
      ...extra,
    });
}

/** RFC 3339 with seconds precision, as metav1.Time. */
export const statusTime = formatStatusTime;

/** 1 MiB: the bound on each status text field (PR #1840). */
export const STATUS_TEXT_LIMIT = MAX_STATUS_TEXT_BYTES;

/** A running watch of an App for deletion or cancellation (see {@link watchForAbort}). */
export interface AbortWatch {
  /** Aborted once the App is deleted (`deletionTimestamp`, gone, or recreated) or canceled. */
  readonly signal: AbortSignal;
  /** Stops polling; resolves once a poll in flight has finished. */
  stop(): Promise<void>;
}

/** Options of {@link watchForAbort}. */
export interface AbortWatchOptions {
  /** Poll period, ms. Default `deps.config.abortPollIntervalMs`, else 2000. */
  intervalMs?: number;
  /** Abort when the App is deleted, not only when canceled. Default true. */
  abortOnDelete?: boolean;
  /** Runs after each poll that did not abort (deploy copies kapp's progress into status). */
  onTick?: () => Promise<void>;
  /** Log message of a failed poll or `onTick`. Default `App deletion poll failed`. */
  failureMessage?: string;
}

/**
 * Polls the App every `deps.config.abortPollIntervalMs` (default 2000 ms) while a fetch or
 * template tool runs, and aborts {@link AbortWatch.signal} when the App is deleted (its
 * `deletionTimestamp` set, gone, or another uid under the name) or `spec.canceled`: the tool is
 * killed, so the delete (queued behind this run for the same object) starts at once instead of
 * waiting for a long fetch. `runKapp` uses the same loop during a deploy (with `onTick` for its
 * progress writes). A failed poll is logged and the tool keeps running; `stop()` waits for a
 * poll or `onTick` in flight.
 *
 * @param kube - reader of the App.
 * @param ref - the App.
 * @param uid - the uid the run started from.
 */
export function watchForAbort(
  kube: KubeReader,
  ref: ResourceRef,
  uid: string,
  deps: PipelineDeps,
  opts: AbortWatchOptions = {},
): AbortWatch {
  const abort = new AbortController();
  let inflight: Promise<void> | undefined;
  let stopped = false;
  const tick = setInterval(
    () => {
      if (inflight || stopped || abort.signal.aborted) return;
      inflight = (async () => {
        try {
          const live = await kube.getObject<KubeObject & { spec?: { canceled?: boolean } }>(ref);
          const deleted = !live || live.metadata.uid !== uid || Boolean(live.metadata.deletionTimestamp);
          if (!stopped && (live?.spec?.canceled || ((opts.abortOnDelete ?? true) && deleted))) {
            abort.abort(new Error('App canceled or deleted'));
          } else if (!stopped) {
            await opts.onTick?.();
          }
        } catch (err) {
          deps.log.warn(
            { app: `${ref.namespace}/${ref.name}`, error: (err as Error).message },
            opts.failureMessage ?? 'App deletion poll failed',
          );
        } finally {
          inflight = undefined;
        }
      })();
    },
    opts.intervalMs ?? deps.config.abortPollIntervalMs ?? 2000,
  );
  return {
    signal: abort.signal,
    async stop() {
      stopped = true;
      clearInterval(tick);
      await inflight;
    },
  };
}
