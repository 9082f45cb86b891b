/**
 * kbld step planning. Mirrors kapp-controller `pkg/template/kbld.go`.
 *
 * @module
 */
import type { AppTemplateKbld } from '../api/template.js';
import { fileArgs } from './paths-arg.js';
import { type RunStep, type StepContext, TEMPLATING_DIR_ERROR_PREFIX } from './step.js';

/**
 * Plans a kbld step: `kbld <-f path>... --build=false` (building images is never allowed).
 * `-f` arguments follow {@link fileArgs}.
 *
 * @param opts - the step's `kbld` spec
 * @param ctx - step context
 * @throws {KappControllerError} {@link fileArgs} errors
 */
export function planKbld(opts: AppTemplateKbld, ctx: StepContext): RunStep {
  return {
    kind: 'run',
    index: ctx.index,
    templater: 'kbld',
    bin: 'kbld',
    args: [...fileArgs(opts.paths, ctx.templateRoot, ctx.hasStdin), '--build=false'],
    env: {},
    stdin: ctx.hasStdin ? 'previous' : 'none',
    files: [],
    dirs: [],
    errorPrefix: TEMPLATING_DIR_ERROR_PREFIX,
  };
}
