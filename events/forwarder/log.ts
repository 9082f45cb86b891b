/**
 * Logging port of the forwarder (pino-compatible: `logger.warn({ ...fields }, 'message')`).
 * Fields never carry object contents, Secret data or credentials: only kinds, names,
 * resourceVersions, counts and errors.
 *
 * @module
 */

/** A structured logger; a pino instance satisfies it. */
export interface ForwarderLogger {
  /** Routine progress (list done, watch restarted). */
  info(fields: Record<string, unknown>, msg: string): void;
  /** Something failed and will be retried. */
  warn(fields: Record<string, unknown>, msg: string): void;
  /** Detail for debugging. */
  debug(fields: Record<string, unknown>, msg: string): void;
}

/** A logger that drops everything (the default). */
export const silentLogger: ForwarderLogger = {
  info: () => {},
  warn: () => {},
  debug: () => {},
};
