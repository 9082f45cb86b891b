/**
 * `cue export` step planning. Mirrors kapp-controller `pkg/template/cue.go`.
 *
 * @module
 */
import { posix } from 'node:path';
import type { AppTemplateCue } from '../api/template.js';
import { positionalPathError, quoteValue } from '../argv-values.js';
import { InvalidPathError, scopedPath } from '../paths.js';
import { KappControllerError } from '../reconcile/result.js';
import { type RunStep, type StepContext, TEMPLATING_DIR_ERROR_PREFIX } from './step.js';
import { planValues } from './values.js';

/** Upstream's text when cue would have to read a stream (kapp-lambda's kustomize step gives it too). */
export const CUE_STREAM_UNSUPPORTED_MESSAGE = 'Templating stream is not supported';

/**
 * The environment of every cue run: `CUE_REGISTRY=none`, so `cue export` fetches no module
 * dependency. cue (v0.9 and later) otherwise downloads the `deps` of a `cue.mod/module.cue` from a
 * module registry, by default `registry.cue.works`, with its own http client: the template stage
 * would reach the network with no URL policy check and no egress proxy (cue is not among the
 * proxied tools), and render from content no fetch recorded. Upstream's cue runs with the
 * controller's environment and fetches them. Packages vendored under `cue.mod/pkg` (with no
 * `deps` entry) still resolve.
 */
export const CUE_ENV: Readonly<Record<string, string>> = Object.freeze({ CUE_REGISTRY: 'none' });

/**
 * The error of a cue run that failed to fetch a module dependency (cue's stderr then holds
 * `cannot fetch <module>@<version>: module not found`, which this replaces as the status message).
 */
export const CUE_MODULE_FETCH_MESSAGE =
  'cue module dependencies are not fetched (cue runs with CUE_REGISTRY=none): list no deps in cue.mod/module.cue and vendor the packages under cue.mod/pkg (see .status.usefulErrorMessage for details)';

/**
 * Plans a cue step (directory input only):
 * `cue export --out yaml [--path=<inputExpression>] [--expression=<outputExpression>] -- <paths | .> <values files...>`
 * with cwd = the template root and {@link CUE_ENV} (no module registry).
 *
 * `paths` are checked to stay in the root but passed as written (relative to the cwd), as upstream.
 * Values files go to `<scratchDir>/values/<j>/` and are passed positionally (absolute).
 *
 * Unlike upstream (`cue export --out yaml <paths> --path <in> <values> --expression <out>`), flag
 * values are attached with `=` and every positional follows `--`, so no user value can be read as
 * a flag (a path `--outfile=/x` would otherwise make cue write a file); a path beginning with `-`
 * is refused before cue starts. cue applies `--path` and `--expression` to the whole command
 * whatever their position, so the output is the same.
 *
 * @param opts - the step's `cue` spec
 * @param ctx - step context (must not have stdin; the pipeline turns that case into
 *   {@link CUE_STREAM_UNSUPPORTED_MESSAGE})
 * @returns the run step, plus warnings from values planning
 * @throws {KappControllerError} `cue.paths[<j>] "<p>" is not a valid path: it must not begin with
 *   "-" (...)`; `Checking path: Invalid path: <p>`; `Writing values: <values error>`
 */
export function planCue(opts: AppTemplateCue, ctx: StepContext): { step: RunStep; warnings: string[] } {
  const positionals: string[] = [];
  if (opts.paths && opts.paths.length > 0) {
    for (const [j, p] of opts.paths.entries()) {
      const flagError = positionalPathError(p);
      if (flagError !== undefined) {
        throw new KappControllerError(`cue.paths[${j}] ${quoteValue(p)} is not a valid path: ${flagError}`);
      }
      try {
        scopedPath(ctx.templateRoot, p);
      } catch (err) {
        if (err instanceof InvalidPathError)
          throw new KappControllerError(`Checking path: ${err.message}`, { cause: err });
        throw err;
      }
    }
    positionals.push(...opts.paths);
  } else {
    positionals.push('.');
  }
  let values: ReturnType<typeof planValues>;
  try {
    values = planValues(opts.valuesFrom ?? [], posix.join(ctx.scratchDir, 'values'), ctx);
  } catch (err) {
    if (err instanceof KappControllerError)
      throw new KappControllerError(`Writing values: ${err.message}`, { cause: err });
    throw err;
  }
  const args = ['export', '--out', 'yaml'];
  if (opts.inputExpression) args.push(`--path=${opts.inputExpression}`);
  if (opts.outputExpression) args.push(`--expression=${opts.outputExpression}`);
  args.push('--', ...positionals, ...values.paths);
  return {
    step: {
      kind: 'run',
      index: ctx.index,
      templater: 'cue',
      bin: 'cue',
      args,
      env: { ...CUE_ENV },
      cwd: ctx.templateRoot,
      stdin: 'none',
      files: values.files,
      dirs: [],
      errorPrefix: TEMPLATING_DIR_ERROR_PREFIX,
      failureHint: { stderrIncludes: 'cannot fetch ', message: CUE_MODULE_FETCH_MESSAGE },
    },
    warnings: values.warnings,
  };
}
