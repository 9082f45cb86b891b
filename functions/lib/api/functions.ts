/**
 * The functions of kapp-lambda: which ones exist, and the name of each one's queue variable.
 * Ground floor, because everything above names a function: the event contract
 * (`events/schema.ts`, whose `FunctionName` is {@link PipelineStage}), the transport port, the
 * Lambda configuration, the layers, the infrastructure and the forwarder's routing.
 *
 * Pure: no I/O.
 *
 * @module
 */

/**
 * The functions that have their own queue (and, on Lambda, their own SQS-triggered function,
 * `functions/<name>/index.ts`): the App pipeline's fetch, template and deploy, `index-repo`
 * (PackageRepository) and `install` (PackageInstall). THE list: the event contract's
 * `FunctionName`, the Lambda configuration (queue variables), the layers, the forwarder's routing
 * and the SQS handler all derive from it, so a new function is added here, with its tools
 * (a row's `stages` in the tool table `layers/tools.ts`, which its layer follows), its cluster
 * access (`FUNCTION_ACCESS`) and its entry file; every step: `docs/extending.md` (d).
 */
export const PIPELINE_STAGES = ['fetch', 'template', 'deploy', 'index-repo', 'install'] as const;
/** One of {@link PIPELINE_STAGES}. */
export type PipelineStage = (typeof PIPELINE_STAGES)[number];

/**
 * Whether a name (an event's `targetFunction`, or any string read from outside) is one of the
 * {@link PIPELINE_STAGES}, i.e. has a queue. Every `targetFunction` is one today (the event
 * contract's `FunctionName` is {@link PipelineStage}); the guard lets the forwarder skip an
 * event a newer contract routes elsewhere instead of blocking its batch.
 */
export function isPipelineStage(fn: string): fn is PipelineStage {
  return (PIPELINE_STAGES as readonly string[]).includes(fn);
}

/**
 * The variable holding a function's queue URL: `KAPP_LAMBDA_QUEUE_URL_` + the function's name
 * in upper case with `-` as `_` (`index-repo` → `KAPP_LAMBDA_QUEUE_URL_INDEX_REPO`: a hyphen is
 * not a valid name for a shell or CloudFormation variable). The functions
 * (`functions/lib/entry/config.ts`) and the forwarder program (`events/forwarder/config.ts`)
 * read the same names.
 */
export function queueUrlEnv(stage: PipelineStage): string {
  return `KAPP_LAMBDA_QUEUE_URL_${stage.toUpperCase().replaceAll('-', '_')}`;
}
