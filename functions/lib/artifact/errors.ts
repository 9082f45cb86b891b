/**
 * The artifact tarball's error (`./tarball.ts` throws it), apart from the tarball code: what
 * catches it (`../reconcile/result.ts`, loaded by every function at start) does not load the
 * `tar` package with it, so a function that never packs or unpacks a tarball (install) does not
 * pay for `tar` at cold start (issue 24 item 7). No imports.
 *
 * @module
 */

/** Why an artifact operation was refused. */
export type ArtifactErrorCode =
  | 'too-large'
  | 'too-many-entries'
  | 'unsafe-path'
  | 'unsafe-symlink'
  | 'unsupported-entry'
  | 'duplicate-entry'
  | 'bad-archive'
  | 'destination-not-empty'
  /** The unpacked tar stream is not the one the artifact's key names (tampered, or not the artifact). */
  | 'digest-mismatch'
  | 'io';

/**
 * Error thrown by the tarball module (`./tarball.ts`, which re-exports it). `code` says why;
 * `path` is the offending entry's relative path when there is one. I/O failures are `code: 'io'`
 * with the original error as `cause`.
 */
export class ArtifactError extends Error {
  override readonly name = 'ArtifactError';
  constructor(
    readonly code: ArtifactErrorCode,
    message: string,
    readonly path?: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}
