/**
 * Path scoping for user-supplied paths (template `paths`, `valuesFrom.path`, helm `path`,
 * inline file names, Secret keys written as files).
 *
 * Mirrors kapp-controller `pkg/memdir/scoped.go` (`ScopedPath`). Pure string work on POSIX paths:
 * no file system access, so symlinks inside the root are not resolved (upstream does not resolve
 * them either).
 *
 * @module
 */
import { posix } from 'node:path';

/**
 * A user path that resolves outside its root. `message` is exactly kapp-controller's text,
 * `Invalid path: <userPath>` (the user's path as given, not the resolved one).
 */
export class InvalidPathError extends Error {
  /** The user-supplied path, as given. */
  readonly userPath: string;

  /** @param userPath - the rejected path, as the user wrote it */
  constructor(userPath: string) {
    super(`Invalid path: ${userPath}`);
    this.name = 'InvalidPathError';
    this.userPath = userPath;
  }
}

/**
 * Joins `userPath` onto `root` and returns the cleaned absolute path, rejecting any result that is
 * neither `root` itself nor inside it.
 *
 * Semantics (Go `filepath.Join` + `filepath.Abs`, as upstream):
 * - `..` segments are resolved lexically: `a/../b` is fine, `../x` and `a/../../x` escape.
 * - An absolute `userPath` does not escape: it is joined like a relative one
 *   (`scopedPath('/r', '/etc/passwd')` is `/r/etc/passwd`), exactly as Go's `filepath.Join` does.
 * - `''` and `'.'` resolve to `root`.
 *
 * `root` must be absolute; it is normalised first (upstream compares against the raw root, so a
 * root with a trailing `/` would reject every path there; callers here always pass clean roots).
 *
 * @param root - absolute directory the result must stay in
 * @param userPath - path supplied by the user (relative to `root`)
 * @returns the absolute, cleaned path inside `root`
 * @throws {InvalidPathError} `Invalid path: <userPath>` when the result escapes `root`
 * @throws {TypeError} when `root` is not absolute (a programming error, not a user error)
 */
export function scopedPath(root: string, userPath: string): string {
  if (!posix.isAbsolute(root)) {
    throw new TypeError(`scopedPath: expected an absolute root, got '${root}'`);
  }
  const cleanRoot = posix.resolve(root);
  const joined = posix.resolve(posix.join(cleanRoot, userPath));
  const prefix = cleanRoot === '/' ? '/' : `${cleanRoot}/`;
  if (joined !== cleanRoot && !joined.startsWith(prefix)) {
    throw new InvalidPathError(userPath);
  }
  return joined;
}

/**
 * Whether `userPath` stays inside any root once joined, judged lexically and independently of the
 * root's name. Stricter than {@link scopedPath} in one corner: `../<rootName>/x` re-enters a root
 * called `<rootName>` (so `scopedPath` accepts it there) but is rejected here.
 *
 * @param userPath - path supplied by the user, relative to some root
 * @returns `true` when the path never climbs above its root
 */
export function isScopedPath(userPath: string): boolean {
  const normalised = posix.normalize(userPath.replace(/^\/+/, '') || '.');
  return normalised !== '..' && !normalised.startsWith('../');
}
