/**
 * The artifact root key of the Lambda functions: where it is (a Secrets Manager secret or a
 * file, never the key itself) is read from the environment at init, apart from the parsed
 * configuration, which stays free of secrets. Kept apart from the composition root so the
 * entry's cold path (`./main.ts`) checks it and starts reading the key before loading the rest.
 *
 * @module
 */
import path from 'node:path';
import type { SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { PipelineStage } from '../api/functions.js';
import { type LazyKeyring, lazyKeyring, rootKeyFromBase64 } from '../artifact/keyring.js';
import { ConfigError, type LambdaConfig } from './config.js';

/**
 * The variable naming where the fleet's artifact root key is (never the key itself: a
 * function's variables are readable by anyone with `lambda:GetFunctionConfiguration`): the
 * ARN or name of an AWS Secrets Manager secret whose `SecretString` is the key in base64 (32+
 * bytes), or `file:///<absolute path>` of a file holding that text (local setups and tests).
 */
export const ARTIFACT_ROOT_KEY_SECRET_ENV = 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET';

/** The variable that held the key itself before {@link ARTIFACT_ROOT_KEY_SECRET_ENV}; refused now. */
export const LEGACY_ARTIFACT_ROOT_KEY_ENV = 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY';

/** A Secrets Manager `SecretId`: an ARN, or a secret name (AWS's character set, 1–512). */
const SECRET_ID =
  /^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+|[A-Za-z0-9/_+=.@-]{1,512})$/;

/**
 * Whether a function seals or opens private artifacts, and so needs {@link ARTIFACT_ROOT_KEY_SECRET_ENV}:
 * every function with the artifact store, not install (it only talks to API servers: it
 * writes an App and placeholder Secrets, never an artifact), which then runs without the key.
 */
export function usesArtifactKey(stage: PipelineStage): boolean {
  return stage !== 'install';
}

/** What the keyring needs of a Secrets Manager client. */
type SecretsClient = Pick<SecretsManagerClient, 'send'>;

/**
 * The keyring of the functions: per-cluster keys derived (HKDF) from the fleet's root key, read
 * from where {@link ARTIFACT_ROOT_KEY_SECRET_ENV} says (Secrets Manager `GetSecretValue` with the
 * function role, or a file) once per process: {@link LazyKeyring.warm} at cold start, kept for
 * the process's life, read again after a failed read. The same secret for the fetch, template,
 * deploy and index-repo functions of a fleet. The key never enters the function's variables or
 * the parsed configuration (which stays loggable).
 *
 * Production design, not built yet: a KMS data key per cluster (GenerateDataKey under the
 * fleet's CMK, the wrapped key kept with the cluster's registry entry, Decrypt allowed by the
 * function roles only), so that one leaked root key does not open every cluster's artifacts.
 *
 * @param secrets - the Secrets Manager client (`createSecretsManagerClient` of `./secrets-client.ts`),
 *   or a function giving it on first use (the entry's cold path, which does not load the AWS SDK
 *   before the configuration is checked); unused for a file.
 * @throws ConfigError when the variable is missing or malformed, or when the retired
 *   {@link LEGACY_ARTIFACT_ROOT_KEY_ENV} is set (values are never quoted). A secret that cannot be
 *   read, or is not base64 of 32+ bytes, fails the first stage that needs a key (retried).
 */
export function artifactKeyringFromEnv(
  stage: LambdaConfig['stage'],
  env: Readonly<Record<string, string | undefined>>,
  secrets: SecretsClient | (() => Promise<SecretsClient>),
): LazyKeyring {
  const where = (env[ARTIFACT_ROOT_KEY_SECRET_ENV] ?? '').trim();
  const problems: string[] = [];
  if ((env[LEGACY_ARTIFACT_ROOT_KEY_ENV] ?? '').trim() !== '') {
    problems.push(
      `${LEGACY_ARTIFACT_ROOT_KEY_ENV}: a key in the function's variables is no longer read; put it in a secret and set ${ARTIFACT_ROOT_KEY_SECRET_ENV}`,
    );
  }
  let read: (() => Promise<string>) | undefined;
  if (where.startsWith('file://')) {
    const file = where.slice('file://'.length);
    if (path.isAbsolute(file)) {
      read = async () => {
        const { DirSecretStore } = await import('../kube/bearer.js');
        return await new DirSecretStore(path.dirname(file)).read(path.basename(file));
      };
    }
  } else if (SECRET_ID.test(where)) {
    read = async () => {
      // Loaded on first use: bearer.ts brings the AWS SDK (the Lambda runtime's).
      const { SecretsManagerSecretStore } = await import('../kube/bearer.js');
      const client = typeof secrets === 'function' ? await secrets() : secrets;
      return await new SecretsManagerSecretStore(client).read(where);
    };
  }
  if (!read) {
    problems.push(
      `${ARTIFACT_ROOT_KEY_SECRET_ENV}: ${where ? 'expected' : 'required:'} a Secrets Manager secret ARN or name, or file:///absolute/path`,
    );
  }
  if (!read || problems.length > 0) throw new ConfigError(stage, problems);
  const load = read;
  return lazyKeyring(async () => rootKeyFromBase64(await load(), `${ARTIFACT_ROOT_KEY_SECRET_ENV} (${where})`));
}
