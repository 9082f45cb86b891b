/**
 * The `-f` path rules shared by ytt and kbld (`addPaths` in kapp-controller `pkg/template/ytt.go`
 * and `pkg/template/kbld.go`).
 *
 * @module
 */

import { InvalidPathError, scopedPath } from '../paths.js';
import { KappControllerError } from '../reconcile/errors.js';
import { STDIN_UNAVAILABLE_MESSAGE } from './step.js';
import { STDIN_PATH } from './values.js';

/**
 * `-f` arguments for a ytt or kbld step:
 * - explicit `paths`: each becomes `-f <absolute scoped path>`, or `-f -` for `-` (which needs a
 *   stream);
 * - no `paths` and a stream: `-f -`;
 * - no `paths`, no stream: `-f <templateRoot>`.
 *
 * @param paths - the step's `paths`
 * @param templateRoot - absolute template root
 * @param hasStdin - whether the step gets the previous step's stdout
 * @returns the arguments, e.g. `['-f', '/t/config', '-f', '-']`
 * @throws {KappControllerError} {@link STDIN_UNAVAILABLE_MESSAGE} for `-` without a stream;
 *   `Checking path: Invalid path: <p>` for a path escaping the root
 */
export function fileArgs(paths: readonly string[] | undefined, templateRoot: string, hasStdin: boolean): string[] {
  const args: string[] = [];
  if (paths && paths.length > 0) {
    for (const p of paths) {
      if (p === STDIN_PATH) {
        if (!hasStdin) throw new KappControllerError(STDIN_UNAVAILABLE_MESSAGE);
        args.push('-f', p);
      } else {
        try {
          args.push('-f', scopedPath(templateRoot, p));
        } catch (err) {
          if (err instanceof InvalidPathError)
            throw new KappControllerError(`Checking path: ${err.message}`, { cause: err });
          throw err;
        }
      }
    }
    return args;
  }
  return hasStdin ? ['-f', STDIN_PATH] : ['-f', templateRoot];
}
