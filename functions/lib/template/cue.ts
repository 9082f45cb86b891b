/**
 * `cue export` step planning. Mirrors kapp-controller `pkg/template/cue.go`.
 *
 * @module
 */
import { posix } from 'node:path';
import { KappControllerError } from '../fetch/types.js';
import { InvalidPathError, scopedPath } from '../paths.js';
import { type RunStep, type StepContext, TEMPLATING_DIR_ERROR_PREFIX } from './step.js';
import type { AppTemplateCue } from './types.js';
import { planValues } from './values.js';

/** Upstream's text when cue would have to read a stream. */
export const CUE_STREAM_UNSUPPORTED_MESSAGE = 'Templating stream is not supported';

/**
 * Plans a cue step (directory input only):
 * `cue export --out yaml <paths | .> [--path <inputExpression>] <values files...> [--expression <outputExpression>]`
 * with cwd = the template root.
 *
 * `paths` are checked to stay in the root but passed as written (relative to the cwd), as upstream.
 * Values files go to `<scratchDir>/values/<j>/` and are passed positionally (absolute).
 *
 * @param opts - the step's `cue` spec
 * @param ctx - step context (must not have stdin; the pipeline turns that case into
 *   {@link CUE_STREAM_UNSUPPORTED_MESSAGE})
 * @returns the run step, plus warnings from values planning
 * @throws {KappControllerError} `Checking path: Invalid path: <p>`; `Writing values: <values error>`
 */
export function planCue(opts: AppTemplateCue, ctx: StepContext): { step: RunStep; warnings: string[] } {
  const args = ['export', '--out', 'yaml'];
  if (opts.paths && opts.paths.length > 0) {
    for (const p of opts.paths) {
      try {
        scopedPath(ctx.templateRoot, p);
      } catch (err) {
        if (err instanceof InvalidPathError)
          throw new KappControllerError(`Checking path: ${err.message}`, { cause: err });
        throw err;
      }
    }
    args.push(...opts.paths);
  } else {
    args.push('.');
  }
  let values: ReturnType<typeof planValues>;
  try {
    values = planValues(opts.valuesFrom ?? [], posix.join(ctx.scratchDir, 'values'), ctx);
  } catch (err) {
    if (err instanceof KappControllerError)
      throw new KappControllerError(`Writing values: ${err.message}`, { cause: err });
    throw err;
  }
  if (opts.inputExpression) args.push('--path', opts.inputExpression);
  args.push(...values.paths);
  if (opts.outputExpression) args.push('--expression', opts.outputExpression);
  return {
    step: {
      kind: 'run',
      index: ctx.index,
      templater: 'cue',
      bin: 'cue',
      args,
      env: {},
      cwd: ctx.templateRoot,
      stdin: 'none',
      files: values.files,
      dirs: [],
      errorPrefix: TEMPLATING_DIR_ERROR_PREFIX,
    },
    warnings: values.warnings,
  };
}
