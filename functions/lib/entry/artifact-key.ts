/**
 * The artifact root key of the Lambda functions, read from the environment at init (apart from
 * the parsed configuration, which stays free of secrets): light on purpose, so the entry's
 * cold path (`./main.ts`) checks it before loading the composition root.
 *
 * @module
 */
import { type ClusterKeyring, DerivedKeyring, rootKeyFromBase64 } from '../artifact/keyring.js';
import type { PipelineStage } from '../transport/port.js';
import { ConfigError, type LambdaConfig } from './config.js';

/** The variable holding the fleet's artifact root key (base64, at least 32 bytes). */
export const ARTIFACT_ROOT_KEY_ENV = 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY';

/**
 * Whether a function seals or opens private artifacts, and so needs {@link ARTIFACT_ROOT_KEY_ENV}:
 * every function with the artifact store, not install (it only talks to API servers: it
 * writes an App and placeholder Secrets, never an artifact), which then runs without the key.
 */
export function usesArtifactKey(stage: PipelineStage): boolean {
  return stage !== 'install';
}

/**
 * The keyring of the functions: per-cluster keys derived (HKDF) from the fleet's root key in
 * `KAPP_LAMBDA_ARTIFACT_ROOT_KEY` (base64 of 32+ random bytes; set it from AWS Secrets Manager,
 * the same value for the fetch, template and deploy functions of a fleet). Read apart from
 * `parseLambdaEnv` so the parsed configuration stays free of secrets and loggable.
 *
 * Production design, not built yet: a KMS data key per cluster (GenerateDataKey under the
 * fleet's CMK, the wrapped key kept with the cluster's registry entry, Decrypt allowed by the
 * function roles only), so that one leaked root key does not open every cluster's artifacts.
 *
 * @throws ConfigError when the variable is missing or not base64 of at least 32 bytes (the
 *   value is never quoted).
 */
export function artifactKeyringFromEnv(
  stage: LambdaConfig['stage'],
  env: Readonly<Record<string, string | undefined>>,
): ClusterKeyring {
  try {
    return new DerivedKeyring(rootKeyFromBase64(env[ARTIFACT_ROOT_KEY_ENV], ARTIFACT_ROOT_KEY_ENV));
  } catch (err) {
    throw new ConfigError(stage, [(err as Error).message]);
  }
}
