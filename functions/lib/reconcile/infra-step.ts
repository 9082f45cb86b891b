/**
 * The infrastructure steps of a stage (object store, API server): what such a step throws is
 * wrapped in an {@link InfraError} that names the step, so that the final failed status of a
 * run that keeps failing (`../pipeline/retry-bound.ts`) says what the stage was doing. Here,
 * below the pipeline, so that the planners' own runs (`../fetch/run.ts`) name theirs too.
 *
 * @module
 */

/**
 * An infrastructure step of a stage failed: `<action> failed: <cause>`. Thrown at the
 * boundaries of the ports (object store, API server) so that the final status names what the
 * stage was doing, e.g. `storing the fetch artifact failed: 503 SlowDown`.
 */
export class InfraError extends Error {
  override readonly name = 'InfraError';
  /**
   * @param action - lowercase action, e.g. `storing the fetch artifact`.
   * @param cause - the port's error.
   */
  constructor(
    readonly action: string,
    cause: unknown,
  ) {
    super(`${action} failed`, { cause });
  }
}

/**
 * Runs one infrastructure step, wrapping what it throws in an {@link InfraError} named after
 * `action`.
 *
 * @throws InfraError with the original error as `cause`.
 */
export async function infraStep<T>(action: string, step: () => Promise<T>): Promise<T> {
  try {
    return await step();
  } catch (err) {
    if (err instanceof InfraError) throw err;
    throw new InfraError(action, err);
  }
}
