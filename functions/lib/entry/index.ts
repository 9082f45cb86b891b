/**
 * Shared code of the Lambda entry files: configuration ({@link parseLambdaEnv}), the SQS
 * handler factory ({@link makeSqsHandler}), the composition root ({@link createLambdaDeps})
 * and the Runtime API bootstrap ({@link lambdaBootstrap}).
 *
 * @module
 */

export { createAwsClients, type SdkClients } from './aws-clients.js';
export {
  CONTROLLER_VERSION,
  ConfigError,
  type LambdaConfig,
  LOG_LEVELS,
  NEXT_STAGES,
  parseLambdaEnv,
} from './config.js';
export {
  type EntryDeps,
  type LambdaContext,
  makeSqsHandler,
  type RecordOutcome,
  type SqsBatchResponse,
  type SqsEvent,
  type SqsHandler,
  type SqsRecord,
} from './handler.js';
export {
  type AwsClients,
  createLambdaDeps,
  createLambdaLogger,
  FUNCTION_ACCESS,
  type FunctionAccess,
  fleetClusterRegistry,
  kubeconfigClusterRegistry,
  type LambdaDepsOverrides,
  lazyAwsClients,
  lazySendClient,
  stageClusterRegistry,
} from './lambda.js';
export { lambdaEntry } from './main.js';
export {
  type Bootstrap,
  errorBody,
  type Invocation,
  type InvocationContext,
  isMainModule,
  lambdaBootstrap,
  MAX_RESPONSE_BYTES,
  RUNTIME_API_VERSION,
  RuntimeApiClient,
  RuntimeApiError,
  type RuntimeLoopOptions,
  runRuntimeLoop,
} from './runtime-api.js';
export { makeStageHandler } from './stage-handler.js';
