/**
 * App (and PackageRepository) status: the stage parts, the transitions and THE summarizer that
 * turns a run's parts and result into status, as pure functions that return new objects.
 *
 * Mirrors kapp-controller:
 * - `pkg/app/app_reconcile.go` (`setReconciling`, `setReconcileCompleted`, `setDeleting`,
 *   `setDeleteCompleted`, `setUsefulErrorMessage`, `updateLastDeploy`, `reconcileInspect`, the
 *   paused/canceled branch of `Reconcile`) and its PackageRepository copy
 *   `pkg/pkgrepository/app_reconcile.go` (friendly text `Paused`);
 * - `pkg/app/app.go` `updateStatus` / `flushUpdateStatus`: {@link writesImmediately};
 * - `pkg/apis/kappctrl/v1alpha1/status.go` (condition types, `status: "True"`, `message` omitted
 *   when empty) and `types.go` (`omitempty`: {@link omitEmptyStatusFields});
 * - `pkg/deploy/kapp.go` (the `" ---- applying "` switch).
 *
 * The command result these read is in `./result.ts`; bounding and redaction in `./redact.ts`.
 * Beyond upstream: every text stored in status is redacted, `template.stderr` is bounded like
 * the fields PR #1840 covers, and each part has a second, smaller bound for the stage hand-off
 * events ({@link toEventPart}). Reference §3.2, §3.4, §3.5, §3.9, §3.10.
 *
 * @module
 */
import { isDeepStrictEqual } from 'node:util';
import type { AppStatus, ConditionType, StageStatusSummary } from '../api/index.js';
import {
  boundedStatusText,
  MAX_STATUS_TEXT_BYTES,
  redactSecrets,
  TRUNCATION_PREFIX,
  truncateTail,
  truncateTailEncoded,
} from './redact.js';
import { type StageResult, withCAHint, withFriendlyYAMLStrings } from './result.js';
import type {
  AppStatusLike,
  Condition,
  DeployStatus,
  FetchStatus,
  InspectStatus,
  KappDeployStatus,
  TemplateStatus,
} from './types.js';

// ---------------------------------------------------------------------------------------------
// Strings

/** `friendlyDescription` values (`app_reconcile.go`, `pkgrepository/app_reconcile.go`). */
export const FRIENDLY = {
  reconciling: 'Reconciling',
  reconcileSucceeded: 'Reconcile succeeded',
  deleting: 'Deleting',
  /** App: `spec.canceled` or `spec.paused`. */
  canceledOrPaused: 'Canceled/paused',
  /** PackageRepository: `spec.paused`. */
  paused: 'Paused',
} as const;

/**
 * `friendlyDescription` after a failed reconcile.
 *
 * @param err - The stage-prefixed error string.
 * @returns `Reconcile failed: <err>`.
 */
export function friendlyReconcileFailed(err: string): string {
  return `Reconcile failed: ${err}`;
}

/**
 * `friendlyDescription` after a failed delete.
 *
 * @param err - The stage-prefixed error string.
 * @returns `Delete failed: <err>`.
 */
export function friendlyDeleteFailed(err: string): string {
  return `Delete failed: ${err}`;
}

/**
 * Text in kapp's stdout that means kapp started changing the cluster; from then on every
 * progress update is written (`pkg/deploy/kapp.go` `trackCmdOutput`).
 */
export const KAPP_APPLYING_MARKER = ' ---- applying ';

// ---------------------------------------------------------------------------------------------
// Stage status blocks

/**
 * `metav1.Time` serialization: RFC 3339 in UTC with whole seconds.
 *
 * @param t - A time.
 * @returns e.g. `2024-01-02T03:04:05Z`.
 */
export function formatStatusTime(t: Date): string {
  return `${t.toISOString().slice(0, 19)}Z`;
}

/** Sets `key` only for a non-empty string, like Go's `omitempty`. */
function putText<T extends object>(obj: T, key: keyof T & string, value: string): void {
  if (value !== '') (obj as Record<string, unknown>)[key] = value;
}

/**
 * `status.fetch` after a fetch (`reconcileFetchTemplateDeploy`): stdout (vendir's lock config),
 * stderr (with {@link withCAHint} applied), exit code and error; stdout and stderr redacted and
 * bounded.
 *
 * @param result - The fetch result.
 * @param times - `startedAt` (when the fetch began) and `updatedAt` (now).
 */
export function fetchStatus(result: StageResult, times: { startedAt: Date | string; updatedAt: Date }): FetchStatus {
  const r = withCAHint(result);
  const out: FetchStatus = { exitCode: r.exitCode };
  putText(out, 'stderr', boundedStatusText(r.stderr));
  putText(out, 'stdout', boundedStatusText(r.stdout));
  putText(out, 'error', redactSecrets(r.error ?? ''));
  out.startedAt = typeof times.startedAt === 'string' ? times.startedAt : formatStatusTime(times.startedAt);
  out.updatedAt = formatStatusTime(times.updatedAt);
  return out;
}

/**
 * `status.template` after templating: stderr, exit code and error. The template's stdout (the
 * manifests) is never stored.
 *
 * @param result - The template result.
 * @param times - `updatedAt` (now).
 */
export function templateStatus(result: StageResult, times: { updatedAt: Date }): TemplateStatus {
  const out: TemplateStatus = { exitCode: result.exitCode };
  putText(out, 'stderr', boundedStatusText(result.stderr));
  putText(out, 'error', redactSecrets(result.error ?? ''));
  out.updatedAt = formatStatusTime(times.updatedAt);
  return out;
}

/**
 * `status.deploy` from kapp's (possibly still running) deploy or delete (`updateLastDeploy`):
 * {@link withFriendlyYAMLStrings}, then redacted and bounded stdout and stderr; `finished` and
 * `exitCode` are always present.
 *
 * @param result - The kapp result so far.
 * @param times - `startedAt` (kapp start) and `updatedAt` (now).
 * @param kapp - `associatedResources` from kapp's app metadata, when known.
 */
export function deployStatus(
  result: StageResult,
  times: { startedAt: Date | string; updatedAt: Date },
  kapp?: KappDeployStatus,
): DeployStatus {
  const r = withFriendlyYAMLStrings(result);
  const out: DeployStatus = { finished: r.finished, exitCode: r.exitCode };
  putText(out, 'stdout', boundedStatusText(r.stdout));
  putText(out, 'stderr', boundedStatusText(r.stderr));
  putText(out, 'error', redactSecrets(r.error ?? ''));
  out.startedAt = typeof times.startedAt === 'string' ? times.startedAt : formatStatusTime(times.startedAt);
  out.updatedAt = formatStatusTime(times.updatedAt);
  if (kapp) out.kapp = kapp;
  return out;
}

/**
 * True when a result is the zero `CmdRunResult` (nothing ran): upstream then sets
 * `status.inspect` to nil.
 *
 * @param result - A stage result.
 */
export function isEmptyResult(result: StageResult): boolean {
  return (
    result.stdout === '' &&
    result.stderr === '' &&
    result.exitCode === 0 &&
    result.error === undefined &&
    !result.finished
  );
}

/**
 * `status.inspect` after `kapp inspect` (`reconcileInspect`): {@link withFriendlyYAMLStrings},
 * redacted and bounded; `undefined` (the field is dropped, as upstream's nil) when the result is
 * empty.
 *
 * @param result - The inspect result.
 * @param times - `updatedAt` (now).
 */
export function inspectStatus(result: StageResult, times: { updatedAt: Date }): InspectStatus | undefined {
  const r = withFriendlyYAMLStrings(result);
  if (isEmptyResult(r)) return undefined;
  const out: InspectStatus = { exitCode: r.exitCode };
  putText(out, 'stdout', boundedStatusText(r.stdout));
  putText(out, 'stderr', boundedStatusText(r.stderr));
  putText(out, 'error', redactSecrets(r.error ?? ''));
  out.updatedAt = formatStatusTime(times.updatedAt);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Transitions

function condition(type: ConditionType, message = ''): Condition {
  return message === '' ? { type, status: 'True' } : { type, status: 'True', message };
}

function base<S extends AppStatusLike>(status: S | null | undefined): S {
  return { ...(status ?? {}) } as S;
}

/**
 * `setUsefulErrorMessage`: the failing step's stderr if non-empty, otherwise the error text;
 * redacted and bounded to 1 MiB.
 *
 * @param err - The stage-prefixed error text.
 * @param stderr - The failing step's stderr.
 */
export function usefulErrorMessage(err: string, stderr = ''): string {
  return boundedStatusText(stderr !== '' ? stderr : err);
}

/**
 * Start of a deploy reconcile (`reconcileDeploy`: `markObservedLatest` + `setReconciling`):
 * observedGeneration, conditions `[Reconciling]`, friendly `Reconciling`.
 *
 * @param status - Current status.
 * @param generation - `metadata.generation`.
 */
export function markReconciling<S extends AppStatusLike>(status: S | null | undefined, generation: number): S {
  return {
    ...base(status),
    observedGeneration: generation,
    conditions: [condition('Reconciling')],
    friendlyDescription: FRIENDLY.reconciling,
  };
}

/**
 * `setReconcileCompleted` without error: conditions `[ReconcileSucceeded]` (no message),
 * successes + 1, failures 0, friendly `Reconcile succeeded`, usefulErrorMessage cleared.
 *
 * @param status - Current status.
 */
export function markSucceeded<S extends AppStatusLike>(status: S | null | undefined): S {
  const s = base(status);
  return {
    ...s,
    conditions: [condition('ReconcileSucceeded')],
    consecutiveReconcileSuccesses: (s.consecutiveReconcileSuccesses ?? 0) + 1,
    consecutiveReconcileFailures: 0,
    friendlyDescription: FRIENDLY.reconcileSucceeded,
    usefulErrorMessage: '',
  };
}

/**
 * `setReconcileCompleted` with an error: conditions `[ReconcileFailed message=err]`, failures + 1,
 * successes 0, friendly `Reconcile failed: <err>`, usefulErrorMessage = stderr || err. All text
 * is redacted.
 *
 * @param status - Current status.
 * @param err - The stage-prefixed error text (e.g. from {@link attachError}).
 * @param stderr - The failing step's stderr.
 */
export function markFailed<S extends AppStatusLike>(status: S | null | undefined, err: string, stderr = ''): S {
  const s = base(status);
  const msg = redactSecrets(err);
  return {
    ...s,
    conditions: [condition('ReconcileFailed', msg)],
    consecutiveReconcileFailures: (s.consecutiveReconcileFailures ?? 0) + 1,
    consecutiveReconcileSuccesses: 0,
    friendlyDescription: friendlyReconcileFailed(msg),
    usefulErrorMessage: usefulErrorMessage(err, stderr),
  };
}

/**
 * `setReconcileCompleted(result)`: {@link markSucceeded} or {@link markFailed} by whether the
 * result carries an error.
 *
 * @param status - Current status.
 * @param result - The outcome of fetch-template-deploy.
 */
export function markReconcileCompleted<S extends AppStatusLike>(status: S | null | undefined, result: StageResult): S {
  return result.error === undefined ? markSucceeded(status) : markFailed(status, result.error, result.stderr);
}

/**
 * Start of a delete (`reconcileDelete`: `markObservedLatest` + `setDeleting`): observedGeneration,
 * conditions `[Deleting]`, friendly `Deleting`.
 *
 * @param status - Current status.
 * @param generation - `metadata.generation`.
 */
export function markDeleting<S extends AppStatusLike>(status: S | null | undefined, generation: number): S {
  return {
    ...base(status),
    observedGeneration: generation,
    conditions: [condition('Deleting')],
    friendlyDescription: FRIENDLY.deleting,
  };
}

/**
 * `setDeleteCompleted` with an error: conditions `[DeleteFailed message=err]`, failures + 1,
 * successes 0, friendly `Delete failed: <err>`, usefulErrorMessage = stderr || err.
 *
 * @param status - Current status.
 * @param err - The stage-prefixed error text.
 * @param stderr - The failing step's stderr.
 */
export function markDeleteFailed<S extends AppStatusLike>(status: S | null | undefined, err: string, stderr = ''): S {
  const s = base(status);
  const msg = redactSecrets(err);
  return {
    ...s,
    conditions: [condition('DeleteFailed', msg)],
    consecutiveReconcileFailures: (s.consecutiveReconcileFailures ?? 0) + 1,
    consecutiveReconcileSuccesses: 0,
    friendlyDescription: friendlyDeleteFailed(msg),
    usefulErrorMessage: usefulErrorMessage(err, stderr),
  };
}

/**
 * `setDeleteCompleted(result)`: on error {@link markDeleteFailed}; on success the status is left
 * as is (the object disappears once the finalizer is removed).
 *
 * @param status - Current status.
 * @param result - The outcome of the delete.
 */
export function markDeleteCompleted<S extends AppStatusLike>(status: S | null | undefined, result: StageResult): S {
  return result.error === undefined ? base(status) : markDeleteFailed(status, result.error, result.stderr);
}

/**
 * The paused/canceled branch of `Reconcile`: observedGeneration and friendly text only;
 * conditions are left unchanged. App: `Canceled/paused`; PackageRepository: `Paused`.
 *
 * @param status - Current status.
 * @param generation - `metadata.generation`.
 * @param kind - Defaults to `App`.
 */
export function markPausedOrCanceled<S extends AppStatusLike>(
  status: S | null | undefined,
  generation: number,
  kind: 'App' | 'PackageRepository' = 'App',
): S {
  return {
    ...base(status),
    observedGeneration: generation,
    friendlyDescription: kind === 'PackageRepository' ? FRIENDLY.paused : FRIENDLY.canceledOrPaused,
  };
}

// ---------------------------------------------------------------------------------------------
// Stage parts: one type, two bounds

/**
 * A stage part as it crosses a stage hand-off: `status.fetch` or `status.template` (the
 * template part is the same shape without `stdout` and `startedAt`).
 */
export type StagePart = FetchStatus | TemplateStatus;

/**
 * Bounds of each text of a stage part, UTF-8 bytes, by where the part is kept: `status`, the
 * stored part (1 MiB per output, upstream PR #1840; the error is not cut), or `event`, the copy a
 * hand-off event carries (15 KiB per output and 4000 for the error, below the 16 Ki / 4 Ki
 * character limits of `api/status.ts` `StageStatusSummarySchema`; counted both raw and
 * JSON-escaped, so escape-heavy output keeps the event under its limit). Both keep the tail.
 */
export const PART_BOUNDS = {
  status: { output: MAX_STATUS_TEXT_BYTES, error: Number.POSITIVE_INFINITY },
  event: { output: 15 * 1024, error: 4000 },
} as const;

/**
 * The event copy of a stored part ({@link PART_BOUNDS} `event`): what a hand-off event carries
 * so that a deferred status can be written by a later stage. `updatedAt` and `exitCode` are
 * always present (the summary requires them).
 */
export function toEventPart(part: StagePart): StageStatusSummary {
  const b = PART_BOUNDS.event;
  const s: StageStatusSummary = {
    updatedAt: part.updatedAt ?? new Date(0).toISOString(),
    exitCode: part.exitCode ?? 0,
  };
  const p = part as FetchStatus;
  if (p.startedAt) s.startedAt = p.startedAt;
  if (p.error) s.error = eventText(p.error, b.error);
  if (p.stdout) s.stdout = eventText(p.stdout, b.output);
  if (p.stderr) s.stderr = eventText(p.stderr, b.output);
  return s;
}

/**
 * A text of an event part: its UTF-8 tail ({@link truncateTail}) when that also fits `maxBytes`
 * JSON-escaped, else its tail bounded by the escaped size ({@link truncateTailEncoded}). Events
 * are JSON, where each control character (ANSI escapes, git sideband) takes 6 bytes: bounding
 * raw bytes only would let such output push an event past its 256 KiB limit.
 */
function eventText(text: string, maxBytes: number): string {
  const cut = truncateTail(text, maxBytes);
  return Buffer.byteLength(JSON.stringify(cut)) - 2 <= maxBytes ? cut : truncateTailEncoded(text, maxBytes);
}

/** The part an event carried, back in its stored shape (`undefined` when none was carried). */
export function fromEventPart(s: StageStatusSummary | undefined): FetchStatus | undefined {
  if (!s) return undefined;
  const out: FetchStatus = { exitCode: s.exitCode, updatedAt: s.updatedAt };
  if (s.startedAt) out.startedAt = s.startedAt;
  if (s.error) out.error = s.error;
  if (s.stdout) out.stdout = s.stdout;
  if (s.stderr) out.stderr = s.stderr;
  return out;
}

/**
 * True when the event copy of `part` cuts one of its texts: the stored part then holds more
 * than an event can carry, so a stage writes it at once rather than deferring it to a later
 * stage that only has the event copy (`closeStage` in `../pipeline/stage.ts`).
 */
export function cutForEvent(part: StagePart): boolean {
  const e = toEventPart(part);
  const p = part as FetchStatus;
  return e.stdout !== p.stdout || e.stderr !== p.stderr || e.error !== p.error;
}

/** Whether `carried` text is `stored` text or its event-bound tail. */
function sameOrTail(carried: string | undefined, stored: string | undefined): boolean {
  if (carried === stored) return true;
  if (carried === undefined || stored === undefined || !carried.startsWith(TRUNCATION_PREFIX)) return false;
  return stored.endsWith(carried.slice(TRUNCATION_PREFIX.length));
}

/**
 * True when `carried` (a part rebuilt from an event) is the event copy of the `stored` part of
 * the same stage run: same times and exit code, each text equal or its cut tail. The stored one
 * is then kept, so the final write never replaces a stored 1 MiB output by its 15 KiB copy.
 */
function isEventCopyOf(carried: StagePart, stored: AppStatus['fetch'] | AppStatus['template']): boolean {
  if (!stored) return false;
  const c = carried as FetchStatus;
  const s = stored as NonNullable<AppStatus['fetch']>;
  return (
    c.updatedAt === s.updatedAt &&
    c.startedAt === s.startedAt &&
    c.exitCode === s.exitCode &&
    sameOrTail(c.stdout, s.stdout) &&
    sameOrTail(c.stderr, s.stderr) &&
    sameOrTail(c.error, s.error)
  );
}

/**
 * `status.fetch` from a fetch result ({@link fetchStatus}, bounded and redacted).
 *
 * @param startedAt - when the fetch began; `now` - its end.
 */
export function fetchPart(result: StageResult, startedAt: Date, now: Date): FetchStatus {
  return fetchStatus(result, { startedAt, updatedAt: now });
}

/** `status.template` from a template result (stderr only; the manifest is never stored). */
export function templatePart(result: StageResult, now: Date): TemplateStatus {
  return templateStatus(result, { updatedAt: now });
}

// ---------------------------------------------------------------------------------------------
// The summarizer and the write policy

/**
 * True when the live status announced this run (condition `Reconciling`, written when the spec
 * changed): each stage then writes its part at once, as `app.go` `updateStatus` does; otherwise
 * the parts wait for the run's end (`flushUpdateStatus`).
 */
export function writesImmediately(status: AppStatus | undefined): boolean {
  return status?.conditions?.some((c) => c.type === 'Reconciling') ?? false;
}

/** The status parts a run has produced so far (any may be absent; `inspect: null` removes it). */
export interface RunParts {
  fetch?: FetchStatus;
  template?: TemplateStatus;
  deploy?: DeployStatus;
  inspect?: InspectStatus | null;
}

/**
 * The failure of a run's failed fetch or template stage, rebuilt from its status part, for the
 * stage that writes that run's final status later (the deploy function's inspect after a failed
 * stage, `DeployStageData.afterFailure`): `error` and `stderr` as the part holds them, which
 * {@link markFailed} turns into the same condition and `usefulErrorMessage` as the failed
 * stage's own result (the part's texts are that result's, redacted and bounded, and both steps
 * are idempotent). The stored part is used when `carried` is its event copy, so output longer
 * than an event carries is not cut.
 *
 * @param carried - the part the event carried (`fromEventPart`).
 * @param stored - the same part as the live status holds it.
 * @returns a failed result; its error is `Failed` when the part names none (not expected).
 */
export function failedPartResult(
  carried: FetchStatus | TemplateStatus | undefined,
  stored: AppStatus['fetch'] | AppStatus['template'],
): StageResult {
  const part = (carried && isEventCopyOf(carried, stored) ? stored : carried) as FetchStatus | undefined;
  return {
    stdout: '',
    stderr: part?.stderr ?? '',
    exitCode: part?.exitCode ?? -1,
    error: part?.error || 'Failed',
    finished: true,
  };
}

/**
 * THE status summarizer: merges a run's parts into the current status and, when `result` is
 * given, completes the reconcile (`ReconcileSucceeded`/`ReconcileFailed`, counters,
 * friendlyDescription, usefulErrorMessage), as `pkg/app/app_reconcile.go` does after
 * `reconcileFetchTemplateDeploy`. `observedGeneration` is the run's generation. A fetch or
 * template part that is the event copy of the one already stored leaves the stored one in place.
 */
export function summarizeStatus(
  current: AppStatus | undefined,
  generation: number,
  parts: RunParts,
  result?: StageResult,
): AppStatus {
  let next: AppStatus = { ...(current ?? {}), observedGeneration: generation };
  if (parts.fetch && !isEventCopyOf(parts.fetch, current?.fetch)) next.fetch = parts.fetch;
  if (parts.template && !isEventCopyOf(parts.template, current?.template)) next.template = parts.template;
  if (parts.deploy) next.deploy = parts.deploy;
  if (parts.inspect === null) delete next.inspect;
  else if (parts.inspect) next.inspect = parts.inspect;
  if (result) next = markReconcileCompleted(next, result);
  return next;
}

/** The stage parts whose times a run that changed nothing moves. */
const TIMED_PARTS = ['fetch', 'template', 'deploy', 'inspect'] as const;

/**
 * A status without what a run that changed nothing moves: each part's `startedAt` and
 * `updatedAt`, and `consecutiveReconcileSuccesses` (upstream adds one on every sync), with
 * upstream's `omitempty` fields dropped ({@link omitEmptyStatusFields}).
 */
function withoutRunTimes(status: AppStatus): AppStatus {
  const out: Record<string, unknown> = { ...omitEmptyStatusFields(status) };
  for (const key of TIMED_PARTS) {
    const part = out[key] as Record<string, unknown> | undefined;
    if (!part) continue;
    const { startedAt: _s, updatedAt: _u, ...rest } = part;
    out[key] = rest;
  }
  delete out.consecutiveReconcileSuccesses;
  return out as AppStatus;
}

/**
 * True when `next`, a run's final status, says nothing `current` does not: the same conditions
 * (type, status, reason, message), `observedGeneration`, `friendlyDescription`,
 * `usefulErrorMessage`, failure count, and the same output (`exitCode`, `stdout`, `stderr`,
 * `error`, `finished`, kapp's associated resources) of every stage, differing only in the stage
 * times and `consecutiveReconcileSuccesses`. Such a run (a resync whose fetch and template gave
 * the same outputs and whose deploy changed nothing) writes no status (`closeStage` in
 * `../pipeline/stage.ts`), unlike upstream, which rewrites conditions and times on every sync.
 * A first reconcile, a new generation, a failure or a deploy that applied changes never passes
 * (kapp lists what it applied in its output).
 */
export function unchangedButRunTimes(current: AppStatus | undefined, next: AppStatus): boolean {
  if (!current) return false;
  // JSON first: `undefined` members are dropped, as the API server would store them.
  const json = (st: AppStatus) => JSON.parse(JSON.stringify(withoutRunTimes(st))) as unknown;
  return isDeepStrictEqual(json(current), json(next));
}

/**
 * Drops the status fields upstream declares `omitempty` when they hold their zero value
 * (`usefulErrorMessage` "", `consecutiveReconcileSuccesses` 0, `consecutiveReconcileFailures` 0;
 * `pkg/apis/kappctrl/v1alpha1/types.go` `AppStatus`, `GenericStatus`), so the stored status has
 * kapp-controller's shape: no `usefulErrorMessage: ""` after a success. Readers treat a missing
 * counter as 0.
 */
export function omitEmptyStatusFields(status: AppStatus): AppStatus {
  const out = { ...status };
  if (out.usefulErrorMessage === '') delete out.usefulErrorMessage;
  if (out.consecutiveReconcileSuccesses === 0) delete out.consecutiveReconcileSuccesses;
  if (out.consecutiveReconcileFailures === 0) delete out.consecutiveReconcileFailures;
  return out;
}
