/**
 * Test support of the infra project: a function's variables as the template holds them, made
 * concrete the way CloudFormation would resolve them, for the functions' own configuration parser.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { ARTIFACT_ROOT_KEY_SECRET_ENV } from '../../functions/lib/entry/lambda.js';
import { stageAssets } from '../../infra/aws/assets.js';
import { HARDEN_ADDON_NAME } from '../../layers/native.js';

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

/**
 * Small stand-ins of the functions' code and layer directories under `dir` (one handler, the
 * hardening addon's file), the same for every stage: for tests that check how the stack wires
 * them, not what they hold (`stack.test.ts` synthesizes the real bundles).
 */
export async function standInAssets(dir: string): Promise<ReturnType<typeof stageAssets>> {
  const code = path.join(dir, 'code');
  const layer = path.join(dir, 'layer');
  await mkdir(code, { recursive: true });
  await writeFile(path.join(code, 'index.mjs'), 'export const handler = async () => ({});\n');
  await mkdir(path.join(layer, 'lib'), { recursive: true });
  await writeFile(path.join(layer, 'lib', HARDEN_ADDON_NAME), 'stand-in for the hardening addon\n');
  const dirs = (d: string) => Object.fromEntries(PIPELINE_STAGES.map((s) => [s, d])) as Record<PipelineStage, string>;
  return stageAssets(dirs(code), dirs(layer));
}
