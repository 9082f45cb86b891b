/**
 * Test support of the infra project: a function's variables as the template holds them, made
 * concrete the way CloudFormation would resolve them, for the functions' own configuration parser.
 */
import { ARTIFACT_ROOT_KEY_SECRET_ENV } from '../../functions/lib/entry/lambda.js';

/**
 * `env` with every unresolved value (a `Ref`, `Fn::Join`, `Fn::GetAtt`) replaced by a stand-in of
 * its kind: the registry location, role ids, the bucket name, a secret ARN, else a queue URL.
 */
export function concreteEnv(env: Readonly<Record<string, unknown>>): Record<string, string> {
  const standIn: Record<string, string> = {
    KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://kapp-lambda-bucket/registry/',
    KAPP_LAMBDA_FUNCTION_SENDERS: 'AROAFETCHFUNCTION0001,AROATEMPLATEFUNCTION1',
    KAPP_LAMBDA_BUCKET: 'kapp-lambda-bucket',
    [ARTIFACT_ROOT_KEY_SECRET_ENV]: 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:ArtifactRootKey-AbCdEf',
  };
  return Object.fromEntries(
    Object.entries(env).map(([k, v]) => [
      k,
      typeof v === 'string' ? v : (standIn[k] ?? 'https://sqs.eu-west-1.amazonaws.com/123456789012/q.fifo'),
    ]),
  );
}
