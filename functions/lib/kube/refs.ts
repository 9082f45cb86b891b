/**
 * Reading the Secrets and ConfigMaps an App refers to into the planners' lookup
 * ({@link RefObjects}), with a digest of each (the cache keys of fetch and template cover them).
 * Below the pipeline so that the planners' runs (`../fetch/run.ts`) read them as the stages do.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { ConfigMapLike, RefObjects, SecretLike } from '../api/index.js';
import type { KubeReader, KubeSecret } from './port.js';

/**
 * Where the values of the Secrets read go: the run's `SecretMask` (`../reconcile/secret-mask.ts`,
 * a floor above this one, so only the one method is named here).
 */
export interface SecretValueSink {
  /** Adds every data value of a Secret as read (decoded bytes). */
  addSecretData(data: KubeSecret['data']): void;
}

/**
 * Reads the named Secrets and ConfigMaps of a namespace into the planners' lookup. Missing
 * objects are simply absent (the planners then fail with the API server's not-found text).
 *
 * @param mask - when given, every data value of every Secret read is added to it, so that what
 *   the stage writes for the App never shows them (`../reconcile/secret-mask.ts`).
 * @throws KubeApiError when a read fails for another reason.
 */
export async function readRefs(
  kube: KubeReader,
  namespace: string,
  secrets: readonly string[],
  configMaps: readonly string[],
  mask?: SecretValueSink,
): Promise<RefObjects & { digests: Record<string, string> }> {
  const digests: Record<string, string> = {};
  const secretsRead = new Map<string, SecretLike>();
  const configMapsRead = new Map<string, ConfigMapLike>();
  for (const name of [...new Set(secrets)].filter(Boolean)) {
    const s = await kube.getSecret(namespace, name);
    if (s) {
      mask?.addSecretData(s.data);
      secretsRead.set(name, s);
    }
    // Digest of the wire form (type, base64 data), so fetch-cache keys stay what they were.
    const wire = s && Object.fromEntries(Object.entries(s.data).map(([k, v]) => [k, v.toString('base64')]));
    digests[`secret/${name}`] = s
      ? createHash('sha256')
          .update(JSON.stringify([s.type, wire]))
          .digest('hex')
      : '-';
  }
  for (const name of [...new Set(configMaps)].filter(Boolean)) {
    const c = await kube.getConfigMap(namespace, name);
    if (c) configMapsRead.set(name, c);
    digests[`configmap/${name}`] = c
      ? createHash('sha256')
          .update(JSON.stringify([c.data, Object.keys(c.binaryData)]))
          .digest('hex')
      : '-';
  }
  return { secret: (name) => secretsRead.get(name), configMap: (name) => configMapsRead.get(name), digests };
}
