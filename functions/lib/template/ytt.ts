/**
 * ytt step planning. Mirrors kapp-controller `pkg/template/ytt.go`.
 *
 * @module
 */
import { posix } from 'node:path';
import type { AppTemplateYtt } from '../api/template.js';
import { inlineFiles } from './inline.js';
import { fileArgs } from './paths-arg.js';
import { type RunStep, type StepContext, TEMPLATING_DIR_ERROR_PREFIX } from './step.js';
import { planValues } from './values.js';

/**
 * Plans a ytt step:
 * `ytt [--ignore-unknown-comments] <-f path>... [-f <inlineDir>] [--file-mark=<m>]... [--data-values-file f]...`.
 *
 * - `-f` arguments follow {@link fileArgs};
 * - `inline` files go to `<scratchDir>/inline` (so they sit at the root of ytt's file list);
 * - `valuesFrom` files go to `<scratchDir>/values/<j>/` (see `planValues`); a `-` values path is
 *   passed as `--data-values-file -`;
 * - `strict` is ignored, as upstream (no `--strict` flag is passed);
 * - `fileMarks` are attached with `=` (upstream passes `--file-mark <m>`), so a mark can never be
 *   read as a flag of its own; every `-f` value is an absolute scoped path or `-`.
 *
 * Errors are raised in upstream's order: paths, inline, values.
 *
 * @param opts - the step's `ytt` spec
 * @param ctx - step context
 * @returns the run step, plus warnings from values planning
 * @throws {KappControllerError} path, inline and values errors with upstream's exact texts
 */
export function planYtt(opts: AppTemplateYtt, ctx: StepContext): { step: RunStep; warnings: string[] } {
  const args: string[] = [];
  if (opts.ignoreUnknownComments) args.push('--ignore-unknown-comments');
  args.push(...fileArgs(opts.paths, ctx.templateRoot, ctx.hasStdin));
  const files = [];
  const dirs: string[] = [];
  if (opts.inline) {
    const inlineDir = posix.join(ctx.scratchDir, 'inline');
    files.push(...inlineFiles(opts.inline, inlineDir, ctx.refs));
    dirs.push(inlineDir);
    args.push('-f', inlineDir);
  }
  for (const mark of opts.fileMarks ?? []) args.push(`--file-mark=${mark}`);
  const values = planValues(opts.valuesFrom ?? [], posix.join(ctx.scratchDir, 'values'), ctx);
  files.push(...values.files);
  for (const p of values.paths) args.push('--data-values-file', p);
  return {
    step: {
      kind: 'run',
      index: ctx.index,
      templater: 'ytt',
      bin: 'ytt',
      args,
      env: {},
      stdin: ctx.hasStdin ? 'previous' : 'none',
      files,
      dirs,
      errorPrefix: TEMPLATING_DIR_ERROR_PREFIX,
    },
    warnings: values.warnings,
  };
}
