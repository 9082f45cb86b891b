/**
 * PLACEHOLDER of the dispatcher function (docs/decisions.md D15), in the `infra` branch only so
 * the CDK stack has a bundle to point at; the dispatcher helper's branch holds the real one,
 * which replaces this file on merge.
 *
 * @module
 */

/** Refuses every invocation: the dispatcher is not built in this branch. */
export const handler = async (): Promise<never> => {
  throw new Error('not built');
};
