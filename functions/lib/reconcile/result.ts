/**
 * A stage's result, shaped like kapp-controller's `exec.CmdRunResult` (`pkg/exec/cmd_run_result.go`:
 * `AttachErrorf`, `NewCmdRunResultWithErr`, `ErrorStr`, `WithFriendlyYAMLStrings`; the x509 CA
 * hint of `pkg/app/app_fetch.go`), the user-facing error type, and the one classifier that
 * decides what happens next for anything a stage throws ({@link outcomeOf}).
 *
 * @module
 */
import { GENERIC_ERROR_DETAIL } from '../api/constants.js';
import { ArtifactError } from '../artifact/errors.js';

export { GENERIC_ERROR_DETAIL };

/** The stderr text that triggers {@link CA_HINT}. */
export const X509_UNKNOWN_AUTHORITY = 'x509: certificate signed by unknown authority';

/** Hint appended to fetch stderr when the CA is unknown (`app_fetch.go`). */
export const CA_HINT =
  '(hint: The CA Certificate from URL is unknown/invalid. Add valid CA certificate to the kapp-controller configuration to reconcile successfully)';

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
 * @param prefix - The stage's upstream error prefix, e.g. `Fetching resources: ` (`FETCH_RUN_ERROR_PREFIX`,
 *   `../fetch/vendir.ts`), `Templating dir: ` (`../template/step.ts`), `Deploying: ` (`KAPP_ERROR_PREFIX`,
 *   `../deploy/kapp.ts`); or `''`.
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
 * @param prefix - The stage's upstream error prefix, e.g. `Fetching resources: ` (`FETCH_RUN_ERROR_PREFIX`,
 *   `../fetch/vendir.ts`), `Templating dir: ` (`../template/step.ts`), `Deploying: ` (`KAPP_ERROR_PREFIX`,
 *   `../deploy/kapp.ts`); or `''`.
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
  if (result.stderr.includes(CA_HINT)) return result; // applied already (idempotent)
  const sep = result.stderr.endsWith('\n') ? '' : '\n';
  return { ...result, stderr: `${result.stderr}${sep}${CA_HINT}` };
}

// ---------------------------------------------------------------------------------------------
// Errors and what happens next

/**
 * An error whose message is exactly what upstream would show to the user in
 * `status.<stage>.error` (and, for the failing stage, the ReconcileFailed condition message).
 * The process exit code for such errors is `-1` upstream (no process ran).
 */
export class KappControllerError extends Error {
  /**
   * @param message - the exact upstream status text
   * @param options - `cause`: the underlying error, if any
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'KappControllerError';
  }
}

/**
 * An artifact a stage was handed (the fetch tarball, the rendered manifest) is not in the
 * object store any more (expired, or deleted by hand): only a run from fetch can make it again.
 */
export class MissingArtifactError extends Error {
  override readonly name = 'MissingArtifactError';
  /**
   * @param what - `fetch artifact` or `manifest`.
   * @param key - the object-store key.
   */
  constructor(
    what: string,
    readonly key: string,
  ) {
    super(`${what} ${key} is missing from the object store`);
  }
}

/**
 * What happens next after an error (style.md: one function maps an error to a result, as
 * Flux's `Stalling`/`Waiting`/`Generic`):
 * - `user`: the user can fix it; the stage ends with the message in status (`ReconcileFailed`);
 * - `retry`: transient or infrastructure; the stage throws and its transport retries it, up to
 *   the bound of `../pipeline/retry-bound.ts`;
 * - `restart`: an input of an earlier stage is gone; only a run from fetch can recover.
 */
export type ErrorOutcome = 'user' | 'retry' | 'restart';

/**
 * THE error classifier of the stages: {@link KappControllerError} (and its subclasses, e.g. a
 * URL refused by the fetch policy) and a refused fetch directory (`ArtifactError` other than
 * `io`) are `user`; {@link MissingArtifactError} is `restart`; anything else (API server, object
 * store, I/O, bugs) is `retry`.
 *
 * A `restart` error is still thrown by the stage today: the transport retries it, the last
 * attempt writes `ReconcileFailed` (`failRunAfterRetries`), and the resync timer's failure
 * backoff then runs the App again from fetch.
 */
export function outcomeOf(err: unknown): ErrorOutcome {
  if (err instanceof KappControllerError) return 'user';
  if (err instanceof ArtifactError) return err.code === 'io' ? 'retry' : 'user';
  if (err instanceof MissingArtifactError) return 'restart';
  return 'retry';
}
