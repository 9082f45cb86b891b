/**
 * Unit prices of the AWS services a reconcile uses (US East, N. Virginia), shared by the
 * per-reconcile receipt's cost estimate (`./receipt.ts`) and the fleet cost model of the
 * benchmarks (`bench/scenarios/cost.ts`), so both state the same figures and the function
 * bundles do not import benchmark code. Sources and dates: bench/README.md, "Fleet cost model".
 *
 * @module
 */

/** US dollars per unit, by service and request class. */
export const AWS_PRICES_USD = Object.freeze({
  /** One Lambda invocation. */
  lambdaRequest: 0.2 / 1e6,
  /** One GB-second of Lambda duration (first tier), by architecture. */
  lambdaGbSecond: Object.freeze({ x86_64: 0.0000166667, arm64: 0.0000133334 }),
  /** One GB-second of Lambda ephemeral storage above the free 512 MB. */
  lambdaEphemeralGbSecond: 0.0000000309,
  /** One SQS FIFO request (send, receive, delete). */
  sqsFifoRequest: 0.5 / 1e6,
  /** One S3 Standard PUT, COPY, POST or LIST request. */
  s3Put: 0.005 / 1000,
  /** One S3 Standard GET, HEAD or other request. */
  s3Get: 0.0004 / 1000,
  /** One GB-month of S3 Standard storage (first 50 TB). */
  s3StorageGbMonth: 0.023,
  /** One customer-managed KMS key for a month. */
  kmsKeyMonth: 1,
  /** One KMS request. */
  kmsRequest: 0.03 / 10_000,
});

/**
 * Memory of each stage's function, MiB: the cloud stack's sizing (`STAGE_SIZING` of
 * `infra/aws/stages.ts` reads it from here), which the receipt's estimate prices a stage's time at.
 */
export const STAGE_MEMORY_MIB = Object.freeze({
  fetch: 1024,
  template: 2048,
  deploy: 1024,
  'index-repo': 2048,
  install: 512,
});
