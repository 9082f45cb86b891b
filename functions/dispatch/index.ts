/**
 * The dispatcher of a stage in the shared mode (docs/decisions.md D15), on AWS Lambda: one
 * bundle for the five dispatcher functions, each told its stage by `KAPP_LAMBDA_DISPATCH_STAGE`.
 * It consumes the stage's queue (SQS FIFO event source mapping with `ReportBatchItemFailures`)
 * in place of the stage function, does each record's edge work (record proof, sender check,
 * fair share, early delete) and runs each cluster's records in the stage function, invoked
 * synchronously as that cluster's tenant with that cluster's run session and sealing keys
 * (`functions/lib/entry/dispatch.ts`). The index-repo dispatcher also takes the source poll
 * schedule's `{"type":"dev.kapp-lambda.source.poll.v1"}` and runs it in each member cluster; the
 * install dispatcher coordinates the fleet's rollouts (`functions/lib/entry/dispatch-rollouts.ts`)
 * and takes the `{"type":"dev.kapp-lambda.rollout.check.v1"}` schedule.
 * Configuration: `parseDispatcherEnv` of `functions/lib/entry/config.ts`.
 *
 * It runs no tool and has no layer; its bundle holds none of the pipeline, and the AWS SDK is the
 * Node managed runtime's (`layers/bundle.ts`).
 *
 * @module
 */
import { dispatcherEntry } from '../lib/entry/dispatch-entry.js';

/** Handler: `(SqsEvent | SourcePollEvent | RolloutCheckEvent) => { batchItemFailures }` (see `makeDispatcher`). */
export const handler = dispatcherEntry(import.meta.url, process.argv[1], process.env);
