/**
 * Shapes shared by the templater planners: the context a step is planned in and the planned steps
 * the I/O layer executes.
 *
 * @module
 */
import type { PlannedFile, ValuesContext } from './values.js';

/**
 * Upstream's prefix for ytt, kbld and cue process failures (`AttachErrorf("Templating dir: %s")`);
 * kapp-lambda's kustomize step uses it too.
 */
export const TEMPLATING_DIR_ERROR_PREFIX = 'Templating dir: ';

/** Upstream's prefix for helm process failures. */
export const TEMPLATING_HELM_ERROR_PREFIX = 'Templating helm chart: ';

/** Upstream's prefix for sops failures while walking and decrypting. */
export const DECRYPTING_DIR_ERROR_PREFIX = 'Decrypting dir: ';

/**
 * The http proxy of template tools that must reach no network (kustomize, sops): the discard port
 * of loopback, where nothing listens, so a request they try fails with `connection refused`.
 */
export const DEAD_PROXY = 'http://127.0.0.1:9';

/**
 * The proxy environment of such a tool: `HTTP(S)_PROXY` (both cases) at {@link DEAD_PROXY},
 * `NO_PROXY` empty (no host exempt), and `KL_PROXY_LOOPBACK=1`, so a tool built with
 * kapp-lambda's patched httpproxy (`proxyLoopback` in layers/manifest.ts) sends loopback URLs
 * there too rather than straight to e.g. the Lambda Runtime API (stock Go never proxies them).
 */
export const DEAD_PROXY_ENV: Readonly<Record<string, string>> = Object.freeze({
  HTTP_PROXY: DEAD_PROXY,
  HTTPS_PROXY: DEAD_PROXY,
  http_proxy: DEAD_PROXY,
  https_proxy: DEAD_PROXY,
  NO_PROXY: '',
  no_proxy: '',
  KL_PROXY_LOOPBACK: '1',
});

/** Upstream: `Expected stdin to be available when using it as path, but was not`. */
export const STDIN_UNAVAILABLE_MESSAGE = 'Expected stdin to be available when using it as path, but was not';

/** Everything a templater planner needs. */
export interface StepContext extends ValuesContext {
  /** App name (helm release name default). */
  appName: string;
  /** App namespace (helm namespace default). */
  appNamespace: string;
  /** Index of the step in `spec.template`. */
  index: number;
  /** Absolute scratch directory for this step's files (outside the template root). */
  scratchDir: string;
  /** Whether the step reads the previous step's stdout (upstream `TemplateStream`). */
  hasStdin: boolean;
}

/** A step that runs one tool process whose stdout is the next stream. */
export interface RunStep {
  /** `run`. */
  kind: 'run';
  /** Index in `spec.template`. */
  index: number;
  /** Which templater. */
  templater: 'ytt' | 'kbld' | 'helmTemplate' | 'cue' | 'kustomize';
  /** Binary to run. */
  bin: 'ytt' | 'kbld' | 'helm' | 'cue' | 'kustomize';
  /** Exact argv after the binary. */
  args: string[];
  /** Environment additions (helm: `KUBERNETES_SERVICE_HOST/PORT=not-real`). */
  env: Record<string, string>;
  /** Working directory, when upstream sets one (cue: the template root). */
  cwd?: string;
  /** `previous`: feed the previous step's stdout on stdin; `none`: no stdin. */
  stdin: 'previous' | 'none';
  /** Files to write before running (values, inline files), in order; create parent directories. */
  files: PlannedFile[];
  /**
   * Directories that must exist before running even if no file lands in them (ytt's inline
   * directory is passed as `-f <dir>` when `inline` has no files).
   */
  dirs: string[];
  /**
   * Prefix for a failed run's error text (`Templating dir: ` or `Templating helm chart: `); the
   * runner appends the process error, and `exit status 1` becomes
   * `Error (see .status.usefulErrorMessage for details)`.
   */
  errorPrefix: string;
  /**
   * kustomize only: the directory whose kustomization tree `checkKustomizeTree` must accept
   * before the tool starts (remote or out-of-root references are refused with `errorPrefix`).
   */
  kustomizeRoot?: string;
  /**
   * When a failed run's stderr contains `stderrIncludes`, the error is `errorPrefix + message`
   * instead of the generic one (the tool's stderr stays in usefulErrorMessage): cue's failure to
   * fetch a module dependency, which kapp-lambda's cue is not allowed to (`./cue.ts`).
   */
  failureHint?: { stderrIncludes: string; message: string };
}

/**
 * A sops step: decrypt `*.sops.yml` / `*.sops.yaml` files in place (the stream, if any, is not
 * touched and no stream is produced). The I/O layer walks `targets` (see `sopsWalk` helpers).
 */
export interface SopsStep {
  /** `sops`. */
  kind: 'sops';
  /** Index in `spec.template`. */
  index: number;
  /** Binary. */
  bin: 'sops';
  /**
   * Absolute paths to process. With no `paths` in the spec, just the template root (walked
   * recursively). With `paths`, each one: a directory is walked, a file is decrypted if it is a
   * sops file; a missing path fails the step (`Decrypting dir: <stat error>`).
   */
  targets: string[];
  /** Whether `targets` came from the user's `paths` (then each must exist). */
  explicitPaths: boolean;
  /** Arguments before `--decrypt <file>`: `--config=<empty config>`. */
  args: string[];
  /** `GNUPGHOME=<dir>` (pgp) or `SOPS_AGE_KEY_FILE=<dir>/key.txt` (age). */
  env: Record<string, string>;
  /** Key material and the empty config, written before the walk. Sensitive. */
  files: PlannedFile[];
  /** {@link DECRYPTING_DIR_ERROR_PREFIX}. */
  errorPrefix: string;
}

/** A step that fails without running anything; `message` is the exact upstream error text. */
export interface FailStep {
  /** `fail`. */
  kind: 'fail';
  /** Index in `spec.template` (or 0 for pipeline-level errors). */
  index: number;
  /** Exact `status.template.error` text. */
  message: string;
}

/** One planned templating step. */
export type TemplateStep = RunStep | SopsStep | FailStep;
