/**
 * Status transitions and the user-facing error surface of App and PackageRepository status, as
 * pure functions that return new objects.
 *
 * Mirrors kapp-controller:
 * - `pkg/app/app_reconcile.go` (`markObservedLatest`, `setReconciling`, `setReconcileCompleted`,
 *   `setDeleting`, `setDeleteCompleted`, `setUsefulErrorMessage`, `updateLastDeploy`,
 *   `reconcileInspect`, the paused/canceled branch of `Reconcile`) and its PackageRepository copy
 *   `pkg/pkgrepository/app_reconcile.go` (friendly text `Paused`);
 * - `pkg/apis/kappctrl/v1alpha1/status.go` (condition types, `status: "True"`, `message` omitted
 *   when empty);
 * - `pkg/exec/cmd_run_result.go` (`AttachErrorf`, `NewCmdRunResultWithErr`, `ErrorStr`,
 *   `WithFriendlyYAMLStrings`);
 * - `pkg/app/app_fetch.go` (the x509 CA hint), `pkg/app/app.go` (`updateStatus` /
 *   `flushUpdateStatus` write throttling), `pkg/deploy/kapp.go` (the `" ---- applying "` switch);
 * - upstream PR #1840: 1 MiB tail truncation with an `[output truncated]\n` prefix.
 *
 * Beyond upstream: every text stored in status passes through {@link redactSecrets}, and
 * `template.stderr` is bounded like the fields PR #1840 covers. Reference §3.2, §3.4, §3.5,
 * §3.9, §3.10.
 *
 * @module
 */
import type {
  AppStatusLike,
  Condition,
  ConditionType,
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

/** What `AttachErrorf` puts in place of the error when a tool exits with `exit status 1`. */
export const GENERIC_ERROR_DETAIL = 'Error (see .status.usefulErrorMessage for details)';

/**
 * Stage prefixes of error strings (reference §3.5), each ending in `": "` so that
 * `prefix + detail` gives the stored text. Use with {@link attachError} or {@link resultFromError}.
 */
export const STAGE_PREFIX = {
  /** vendir failed (`app_fetch.go` `runVendir`). */
  fetching: 'Fetching resources: ',
  /** Building the vendir config failed, e.g. a referenced secret is missing. */
  fetchingConfig: 'Fetching: ',
  /** ytt, kbld or cue failed. */
  templatingDir: 'Templating dir: ',
  /** helm template failed. */
  templatingHelmChart: 'Templating helm chart: ',
  /** Reading `valuesFrom` failed. */
  preparingTemplateValues: 'Preparing template values: ',
  /** cue: writing values failed. */
  writingValues: 'Writing values: ',
  /** sops: decrypting failed. */
  decryptingDir: 'Decrypting dir: ',
  /** sops: building its config failed. */
  buildingConfig: 'Building config: ',
  /** kapp deploy failed. */
  deploying: 'Deploying: ',
  /** Building kapp's credentials or options failed. */
  preparingKapp: 'Preparing kapp: ',
  /** Adding the finalizer failed. */
  blockingForDeploy: 'Blocking for deploy: ',
  /** kapp delete failed. */
  deleting: 'Deleting: ',
  /** Removing the finalizer failed. */
  unblockingForDeploy: 'Unblocking for deploy: ',
  /** kapp inspect failed. */
  inspecting: 'Inspecting: ',
} as const;

/**
 * Prefix for an unsupported or invalid fetch entry (`app_fetch.go`: `Fetching (%d): `).
 *
 * @param index - Index into `spec.fetch`.
 * @returns `Fetching (<index>): `.
 */
export function fetchingIndexPrefix(index: number): string {
  return `Fetching (${index}): `;
}

/** Fixed error details used by the stages (reference §3.5, §3.10). */
export const STAGE_ERROR = {
  unsupportedFetch: 'Unsupported way to fetch templates',
  unsupportedTemplate: 'Unsupported way to template',
  unsupportedDeploy: 'Unsupported way to deploy',
  processCanceled: 'Process was canceled',
  alreadyCanceled: 'Already canceled',
} as const;

/** The stderr text that triggers {@link CA_HINT}. */
export const X509_UNKNOWN_AUTHORITY = 'x509: certificate signed by unknown authority';

/** Hint appended to fetch stderr when the CA is unknown (`app_fetch.go`). */
export const CA_HINT =
  '(hint: The CA Certificate from URL is unknown/invalid. Add valid CA certificate to the kapp-controller configuration to reconcile successfully)';

/** Bound of each status text field: 1 MiB (upstream PR #1840). */
export const MAX_STATUS_TEXT_BYTES = 1024 * 1024;

/** Prefix of a field cut by {@link truncateTail} (upstream PR #1840). */
export const TRUNCATION_PREFIX = '[output truncated]\n';

/**
 * Text in kapp's stdout that means kapp started changing the cluster; from then on every
 * progress update is written (`pkg/deploy/kapp.go` `trackCmdOutput`).
 */
export const KAPP_APPLYING_MARKER = ' ---- applying ';

// ---------------------------------------------------------------------------------------------
// Command results (CmdRunResult)

/**
 * A stage's outcome, shaped like kapp-controller's `exec.CmdRunResult` with the error already
 * rendered to its string (`ErrorStr()`): `error` is set iff the stage failed.
 */
export interface StageResult {
  stdout: string;
  stderr: string;
  /** Process exit code, or -1 when the error has none (killed, or failed before exec). */
  exitCode: number;
  /** The stage-prefixed error text; absent on success. */
  error?: string;
  /** True once a result (success or error) is attached. */
  finished: boolean;
}

/**
 * What {@link attachError} needs from a command run: the command runner's `RunResult` fits.
 * `error.exitCode` (a number), when present, is the process exit code; an error without one
 * (timeout, cancellation, spawn failure) yields -1, like Go's non-`*exec.ExitError` case.
 */
export interface RunOutcome {
  stdout?: string;
  stderr?: string;
  error?: (Error & { exitCode?: number }) | null;
}

/**
 * The message of anything thrown, for status text.
 *
 * @param err - An `Error` or any thrown value.
 * @returns `err.message`, or `String(err)`.
 */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * `CmdRunResult.AttachErrorf(prefix + "%s", err)`: marks the result finished and, on error, sets
 * the exit code (the process's, or -1) and the error text `prefix + detail`, where detail is
 * {@link GENERIC_ERROR_DETAIL} when the error is exactly `exit status 1` and the error message
 * otherwise.
 *
 * @param prefix - A {@link STAGE_PREFIX} value (or `''`).
 * @param run - The command's output and error.
 * @returns The stage result; `exitCode` 0 on success.
 */
export function attachError(prefix: string, run: RunOutcome): StageResult {
  const result: StageResult = { stdout: run.stdout ?? '', stderr: run.stderr ?? '', exitCode: 0, finished: true };
  const err = run.error;
  if (err) {
    result.exitCode = typeof err.exitCode === 'number' && err.exitCode >= 0 ? err.exitCode : -1;
    result.error = prefix + (err.message === 'exit status 1' ? GENERIC_ERROR_DETAIL : err.message);
  }
  return result;
}

/**
 * `NewCmdRunResultWithErr`: a failed result with no output and exit code -1, for errors that
 * happen outside a tool (e.g. `Preparing kapp: <err>`).
 *
 * @param err - The error (its message is used).
 * @param prefix - A {@link STAGE_PREFIX} value (or `''`).
 * @returns The stage result.
 */
export function resultFromError(err: unknown, prefix = ''): StageResult {
  const message = errorMessage(err);
  return {
    stdout: '',
    stderr: '',
    exitCode: -1,
    error: prefix + (message === 'exit status 1' ? GENERIC_ERROR_DETAIL : message),
    finished: true,
  };
}

const TRAILING_SPACE = /\s+\n/g;

/**
 * `WithFriendlyYAMLStrings`: trims stdout and stderr and removes whitespace before each newline
 * (regex `\s+\n` → `\n`), so YAML renders them as block strings. Used for deploy and inspect.
 *
 * @param result - The stage result.
 * @returns A new result.
 */
export function withFriendlyYAMLStrings(result: StageResult): StageResult {
  return {
    ...result,
    stdout: result.stdout.trim().replace(TRAILING_SPACE, '\n'),
    stderr: result.stderr.trim().replace(TRAILING_SPACE, '\n'),
  };
}

/**
 * Appends {@link CA_HINT} to a failed fetch's stderr when it contains
 * {@link X509_UNKNOWN_AUTHORITY} (`app_fetch.go`), on its own line.
 *
 * @param result - The fetch result.
 * @returns A new result, or the same one when no hint applies.
 */
export function withCAHint(result: StageResult): StageResult {
  if (result.error === undefined || !result.stderr.includes(X509_UNKNOWN_AUTHORITY)) return result;
  const sep = result.stderr.endsWith('\n') ? '' : '\n';
  return { ...result, stderr: `${result.stderr}${sep}${CA_HINT}` };
}

// ---------------------------------------------------------------------------------------------
// Bounding and redaction

/**
 * Keeps the last bytes of `text` so that the result, including {@link TRUNCATION_PREFIX}, is at
 * most `maxBytes` UTF-8 bytes (upstream PR #1840 keeps the tail because kapp's summary and errors
 * come last). The cut never splits a character.
 *
 * @param text - Any text.
 * @param maxBytes - Bound in bytes; defaults to {@link MAX_STATUS_TEXT_BYTES}.
 * @returns `text` when it fits, else `[output truncated]\n<tail>`.
 */
export function truncateTail(text: string, maxBytes: number = MAX_STATUS_TEXT_BYTES): string {
  // Every UTF-16 unit is at most 3 UTF-8 bytes: skip the encode for short strings.
  if (text.length * 3 <= maxBytes) return text;
  const buf = Buffer.from(text, 'utf8');
  if (buf.length <= maxBytes) return text;
  const keep = Math.max(0, maxBytes - Buffer.byteLength(TRUNCATION_PREFIX));
  let start = buf.length - keep;
  while (start < buf.length && ((buf[start] ?? 0) & 0xc0) === 0x80) start++;
  return TRUNCATION_PREFIX + buf.subarray(start).toString('utf8');
}

const REDACTED = '***';

/** A private key block, complete or cut off at the end of the text. */
const PEM_PRIVATE_KEY = /-----BEGIN ([A-Z0-9 ]{0,40}PRIVATE KEY)-----(?:[\s\S]*?-----END \1-----|[\s\S]*$)/g;
/** age identities. */
const AGE_SECRET_KEY = /AGE-SECRET-KEY-1[0-9A-Z]+/g;
/** `scheme://userinfo@`: everything up to the last `@` of the authority. */
const URL_USERINFO = /(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{0,31}:\/\/)[^\s/?#@]*(?:@[^\s/?#@]*)*@/g;
/** `Authorization: <scheme> <credentials>` in headers, JSON or YAML. */
const AUTHORIZATION =
  /\b((?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?)(?:(bearer|basic|token|digest|negotiate|aws4-hmac-sha256)[ \t]+)?[^\s"',;]+/gi;
/** A bare bearer token (8+ token characters, so prose like "Bearer token" is left alone). */
const BEARER = /\b(Bearer[ \t]+)[A-Za-z0-9\-._~+/]{8,}=*/g;
/** Docker config `"auth": "<base64 user:pass>"`. */
const DOCKER_AUTH = /("auth"[ \t]*:[ \t]*)"[^"\n]*"/g;
/** Secret-named keys: `token: x`, `password=x`, `"apiKey": "x"`, `accessToken=x`, `client_secret: x`. */
const SECRET_KEY_VALUE =
  /(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]{0,64}?(?:token|password|passwd|secret[_-]?key|api[_-]?key|access[_-]?key|private[_-]?key|client[_-]?secret)["']?[ \t]*[:=][ \t]*)("[^"\n]*"|'[^'\n]*'|[^\s"',;&]+)/gi;
/** Secret-named CLI flags with a separate value: `--password x`, `--token x`. */
const SECRET_FLAG = /(?<![A-Za-z0-9_-])(--?[A-Za-z0-9-]{0,64}?(?:token|password|passwd)[ \t]+)(?!-)(\S+)/gi;

/**
 * Replaces credentials in free text with `***`: URL userinfo (`https://user:pass@host` →
 * `https://***@host`), `Authorization` headers (scheme kept), bearer tokens, docker config
 * `auth`, secret-named keys (`token: …`, `password=…`, `"apiKey": "…"`, `client_secret=…`),
 * secret-named CLI flags, PEM private keys and age secret keys.
 *
 * Every pattern is bounded so that megabytes of tool output are scanned in linear time.
 *
 * @param text - Any text headed for status, logs or events.
 * @returns The text with secrets replaced.
 */
export function redactSecrets(text: string): string {
  if (text === '') return text;
  return text
    .replace(PEM_PRIVATE_KEY, (_m, label: string) => `-----BEGIN ${label}-----\n${REDACTED}\n-----END ${label}-----`)
    .replace(AGE_SECRET_KEY, `AGE-SECRET-KEY-${REDACTED}`)
    .replace(URL_USERINFO, `$1${REDACTED}@`)
    .replace(AUTHORIZATION, (_m, head: string, scheme: string | undefined) =>
      scheme ? `${head}${scheme} ${REDACTED}` : `${head}${REDACTED}`,
    )
    .replace(BEARER, `$1${REDACTED}`)
    .replace(DOCKER_AUTH, `$1"${REDACTED}"`)
    .replace(SECRET_KEY_VALUE, (_m, head: string, value: string) => {
      const q = value[0];
      return q === '"' || q === "'" ? `${head}${q}${REDACTED}${q}` : `${head}${REDACTED}`;
    })
    .replace(SECRET_FLAG, `$1${REDACTED}`);
}

/**
 * Prepares text for a bounded status field: {@link redactSecrets}, then {@link truncateTail}
 * (redaction first, so a cut never leaves half a secret unrecognized).
 *
 * @param text - Any text.
 * @param maxBytes - Bound in bytes; defaults to {@link MAX_STATUS_TEXT_BYTES}.
 */
export function boundedStatusText(text: string, maxBytes: number = MAX_STATUS_TEXT_BYTES): string {
  return truncateTail(redactSecrets(text), maxBytes);
}

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
 * `markObservedLatest`: `observedGeneration = generation`.
 *
 * @param status - Current status (absent before the first write).
 * @param generation - `metadata.generation`.
 */
export function markObserved<S extends AppStatusLike>(status: S | null | undefined, generation: number): S {
  return { ...base(status), observedGeneration: generation };
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
// Equality and diff

/**
 * Drops what Go's zero values and `omitempty` make indistinguishable on the wire: `undefined`,
 * `null`, `''` and empty arrays (as object members). Numbers and booleans are kept, zero or not.
 */
function normalize(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(normalize);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v === undefined || v === null || v === '' || (Array.isArray(v) && v.length === 0)) continue;
      out[key] = normalize(v);
    }
    return out;
  }
  return value;
}

function diffInto(a: unknown, b: unknown, path: string, out: string[]): void {
  if (Object.is(a, b)) return;
  const aObj = a !== null && typeof a === 'object';
  const bObj = b !== null && typeof b === 'object';
  if (Array.isArray(a) && Array.isArray(b)) {
    const n = Math.max(a.length, b.length);
    for (let i = 0; i < n; i++) diffInto(a[i], b[i], `${path}[${i}]`, out);
    return;
  }
  if (aObj && bObj && !Array.isArray(a) && !Array.isArray(b)) {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    for (const k of [...keys].sort()) {
      diffInto((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], path ? `${path}.${k}` : k, out);
    }
    return;
  }
  out.push(path || '.');
}

/**
 * The paths at which two statuses differ, treating absent, `null`, `''` and `[]` as equal (Go
 * zero values with `omitempty`). Paths are dotted, with `[i]` for array items, e.g.
 * `conditions[0].type`, `deploy.stdout`.
 *
 * @param a - One status (or any JSON value).
 * @param b - The other.
 * @returns Sorted paths; empty when equal.
 */
export function statusDiff(a: unknown, b: unknown): string[] {
  const out: string[] = [];
  diffInto(normalize(a ?? {}), normalize(b ?? {}), '', out);
  return out;
}

/**
 * Whether two statuses are equal in the sense of {@link statusDiff}: the check upstream does
 * with `reflect.DeepEqual` before `UpdateStatus` (`pkg/app/crd_app.go`), so an unchanged status
 * is not written.
 *
 * @param a - One status.
 * @param b - The other.
 */
export function statusEqual(a: unknown, b: unknown): boolean {
  return statusDiff(a, b).length === 0;
}

// ---------------------------------------------------------------------------------------------
// Write discipline (pkg/app/app.go updateStatus / flushUpdateStatus)

/** State of the status-write throttle during one reconcile. */
export interface StatusWritePlan {
  /** `metadata.generation` of the object being reconciled. */
  readonly generation: number;
  /** `status.observedGeneration` as it was when this reconcile started. */
  readonly observedGenerationAtStart: number;
  /** Switched on once kapp's stdout contains {@link KAPP_APPLYING_MARKER}. */
  readonly flushAll: boolean;
  /** A status change has been recorded but not written. */
  readonly pending: boolean;
}

/** A plan step's outcome: the new plan and whether to write the status now. */
export interface StatusWriteStep {
  plan: StatusWritePlan;
  write: boolean;
}

/**
 * The decision itself (§3.4): write immediately when the spec changed (generation differs from
 * the observedGeneration at the start of this reconcile) or once flush-all is on; otherwise defer
 * to the end of the reconcile.
 *
 * @param input - Generation, observedGeneration at start, flush-all flag.
 * @returns `immediate` or `deferred`.
 */
export function decideStatusWrite(input: {
  generation: number;
  observedGenerationAtStart: number;
  flushAll: boolean;
}): 'immediate' | 'deferred' {
  return input.flushAll || input.generation !== input.observedGenerationAtStart ? 'immediate' : 'deferred';
}

/**
 * A fresh plan at the start of a reconcile.
 *
 * @param generation - `metadata.generation`.
 * @param observedGenerationAtStart - `status.observedGeneration` before this reconcile touched it.
 */
export function startStatusWritePlan(generation: number, observedGenerationAtStart: number): StatusWritePlan {
  return { generation, observedGenerationAtStart, flushAll: false, pending: false };
}

/**
 * `updateStatus`: a status change was made; write now or mark it pending.
 *
 * @param plan - The current plan.
 */
export function onStatusChange(plan: StatusWritePlan): StatusWriteStep {
  if (decideStatusWrite(plan) === 'immediate') return { plan: { ...plan, pending: false }, write: true };
  return { plan: { ...plan, pending: true }, write: false };
}

/**
 * True when kapp's stdout shows it started changing the cluster.
 *
 * @param kappStdout - kapp's stdout so far.
 */
export function kappStartedApplying(kappStdout: string): boolean {
  return kappStdout.includes(KAPP_APPLYING_MARKER);
}

/**
 * `trackCmdOutput` → `startFlushingAllStatusUpdates`: the first time kapp's stdout contains
 * {@link KAPP_APPLYING_MARKER}, flush-all switches on and any pending change is written.
 *
 * @param plan - The current plan.
 * @param kappStdout - kapp's stdout so far.
 */
export function onKappOutput(plan: StatusWritePlan, kappStdout: string): StatusWriteStep {
  if (plan.flushAll || !kappStartedApplying(kappStdout)) return { plan, write: false };
  return { plan: { ...plan, flushAll: true, pending: false }, write: plan.pending };
}

/**
 * `flushUpdateStatus` at the end of `Reconcile`: write once if anything is pending.
 *
 * @param plan - The current plan.
 */
export function onReconcileEnd(plan: StatusWritePlan): StatusWriteStep {
  return { plan: { ...plan, pending: false }, write: plan.pending };
}
