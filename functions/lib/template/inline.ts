/**
 * ytt's `inline` files (`paths` and `pathsFrom`), written to their own directory and passed as one
 * more `-f`. Mirrors kapp-controller `pkg/fetch/inline.go` (`Inline.Retrieve`), which ytt uses for
 * this.
 *
 * @module
 */
import { posix } from 'node:path';
import type { AppFetchInline } from '../api/fetch.js';
import { configMapNotFoundMessage, type RefObjects, secretNotFoundMessage } from '../api/refs.js';
import { InvalidPathError, scopedPath } from '../paths.js';
import { KappControllerError } from '../reconcile/result.js';
import type { PlannedFile } from './values.js';

/** Upstream: the text for an inline `pathsFrom` entry with neither ref. */
export const NO_INLINE_SOURCE_MESSAGE = 'Expected either secretRef or configMapRef as a source';

function keysSorted(obj: Record<string, unknown> | undefined): string[] {
  return Object.keys(obj ?? {}).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

function scoped(dir: string, sub: string): string {
  try {
    return scopedPath(dir, sub);
  } catch (err) {
    if (err instanceof InvalidPathError) throw new KappControllerError(err.message, { cause: err });
    throw err;
  }
}

/**
 * Files for an inline source under `dir`: `paths` entries first (sorted by path), then each
 * `pathsFrom` source in order, writing every data key as `<directoryPath>/<key>` (keys sorted).
 * Later files overwrite earlier ones with the same path, as upstream's write order does; the I/O
 * layer must write them in the returned order and create parent directories.
 *
 * @param inline - the inline spec
 * @param dir - absolute directory to write into
 * @param refs - Secrets and ConfigMaps of the App's namespace
 * @returns files to write
 * @throws {KappControllerError} with upstream's bare texts (no prefix): `Invalid path: <p>`,
 *   `secrets "x" not found`, `configmaps "x" not found`, {@link NO_INLINE_SOURCE_MESSAGE}
 */
export function inlineFiles(inline: AppFetchInline, dir: string, refs: RefObjects): PlannedFile[] {
  const files: PlannedFile[] = [];
  for (const p of keysSorted(inline.paths)) {
    files.push({ path: scoped(dir, p), content: inline.paths![p]!, sensitive: false });
  }
  for (const src of inline.pathsFrom ?? []) {
    if (src.secretRef) {
      const name = src.secretRef.name ?? '';
      const secret = refs.secret(name);
      if (!secret) throw new KappControllerError(secretNotFoundMessage(name));
      for (const key of keysSorted(secret.data)) {
        files.push({
          path: scoped(dir, posix.join(src.secretRef.directoryPath ?? '', key)),
          content: new Uint8Array(secret.data![key]!),
          sensitive: true,
        });
      }
    } else if (src.configMapRef) {
      const name = src.configMapRef.name ?? '';
      const cm = refs.configMap(name);
      if (!cm) throw new KappControllerError(configMapNotFoundMessage(name));
      for (const key of keysSorted(cm.data)) {
        files.push({
          path: scoped(dir, posix.join(src.configMapRef.directoryPath ?? '', key)),
          content: cm.data![key]!,
          sensitive: false,
        });
      }
    } else {
      throw new KappControllerError(NO_INLINE_SOURCE_MESSAGE);
    }
  }
  return files;
}
