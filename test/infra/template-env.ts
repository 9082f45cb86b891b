/**
 * Test support of the infra project: a function's variables as the template holds them, made
 * concrete the way CloudFormation would resolve them, for the functions' own configuration parser.
 */
import { ARTIFACT_ROOT_KEY_SECRET_ENV } from '../../functions/lib/entry/lambda.js';

/**
 * The stand-in of a role's `RoleId` (`Fn::GetAtt [<logical id>, RoleId]`): `AROA` and the
 * logical id's letters and digits, upper-cased and padded to the 12 characters a role id has
 * at least, so each role keeps an id of its own.
 */
export function standInRoleId(logicalId: string): string {
  return `AROA${logicalId
    .toUpperCase()
    .replace(/[^A-Z0-9]/g, '')
    .padEnd(12, '0')}`;
}

/**
 * A template value as CloudFormation would resolve it: strings as they are, `Fn::Join` of
 * resolvable parts, a role's `RoleId` as {@link standInRoleId}; `undefined` for anything else.
 */
function resolve(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (typeof v !== 'object' || v === null) return undefined;
  const join = (v as { 'Fn::Join'?: [string, unknown[]] })['Fn::Join'];
  if (join) {
    const parts = join[1].map(resolve);
    return parts.every((p) => p !== undefined) ? parts.join(join[0]) : undefined;
  }
  const att = (v as { 'Fn::GetAtt'?: [string, string] })['Fn::GetAtt'];
  if (att?.[1] === 'RoleId') return standInRoleId(att[0]);
  return undefined;
}

/**
 * `env` with every unresolved value replaced by a stand-in of its kind: the registry location,
 * the bucket name, a secret ARN; role ids (alone or joined, as in `KAPP_LAMBDA_FUNCTION_SENDERS`)
 * as {@link standInRoleId}; else a queue URL.
 */
export function concreteEnv(env: Readonly<Record<string, unknown>>): Record<string, string> {
  const standIn: Record<string, string> = {
    KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://kapp-lambda-bucket/registry/',
    KAPP_LAMBDA_BUCKET: 'kapp-lambda-bucket',
    [ARTIFACT_ROOT_KEY_SECRET_ENV]: 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:ArtifactRootKey-AbCdEf',
  };
  return Object.fromEntries(
    Object.entries(env).map(([k, v]) => [
      k,
      typeof v === 'string'
        ? v
        : (standIn[k] ?? resolve(v) ?? 'https://sqs.eu-west-1.amazonaws.com/123456789012/q.fifo'),
    ]),
  );
}
