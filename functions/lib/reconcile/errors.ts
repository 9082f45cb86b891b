/**
 * The user-facing error of every stage.
 *
 * @module
 */

/**
 * A planning error whose `message` is exactly the text kapp-controller would put into
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
