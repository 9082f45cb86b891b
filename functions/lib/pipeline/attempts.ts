/**
 * The attempt bound of a stage, alone in its module so a Lambda entry's configuration reads it
 * without loading the retry bound's status writers (`./retry-bound.ts`) at start.
 *
 * @module
 */

/**
 * Attempts of one stage of one run before the final failed status: 5. On Lambda this must equal
 * the `maxReceiveCount` of the queue's redrive policy, so the last attempt is the one that
 * writes the status rather than a silent move to the dead-letter queue.
 */
export const DEFAULT_MAX_ATTEMPTS = 5;
