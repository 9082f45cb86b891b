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
 * A cap on the bytes {@link readRefs} holds: the objects are read one at a time and the total
 * checked after each, so a read over the cap holds at most the cap plus one object (the API
 * server's limit, about 1 MiB) and reads nothing after it. An App names as many Secrets as its
 * spec holds; kapp-controller reads them all, but one function serves every tenant here.
 */
export interface RefsLimit {
  /** Most bytes: each key's UTF-8 length plus each value's (decoded) length. */
  maxBytes: number;
  /** The error thrown once the total passes `maxBytes`; `what` is `secret "<name>"` or `configmap "<name>"`. */
  overLimit: (what: string, total: number, maxBytes: number) => Error;
}

/** Bytes an object's maps hold: each key's UTF-8 length plus each value's length (decoded). */
export function contentBytes(...maps: Array<Readonly<Record<string, string | Buffer>> | undefined>): number {
  let n = 0;
  for (const m of maps) {
    for (const [k, v] of Object.entries(m ?? {})) n += Buffer.byteLength(k) + Buffer.byteLength(v);
  }
  return n;
}

/**
 * Reads the named Secrets and ConfigMaps of a namespace into the planners' lookup. Missing
 * objects are simply absent (the planners then fail with the API server's not-found text).
 *
 * @param mask - when given, every data value of every Secret read is added to it, so that what
 *   the stage writes for the App never shows them (`../reconcile/secret-mask.ts`).
 * @param limit - when given, the cap on what is read ({@link RefsLimit}); each name counts once.
 * @throws KubeApiError when a read fails for another reason; `limit.overLimit`'s error over the cap.
 */
export async function readRefs(
  kube: KubeReader,
  namespace: string,
  secrets: readonly string[],
  configMaps: readonly string[],
  mask?: SecretValueSink,
  limit?: RefsLimit,
): Promise<RefObjects & { digests: Record<string, string> }> {
  const digests: Record<string, string> = {};
  const secretsRead = new Map<string, SecretLike>();
  const configMapsRead = new Map<string, ConfigMapLike>();
  let total = 0;
  const count = (what: string, bytes: number) => {
    total += bytes;
    if (limit && total > limit.maxBytes) throw limit.overLimit(what, total, limit.maxBytes);
  };
  for (const name of [...new Set(secrets)].filter(Boolean)) {
    const s = await kube.getSecret(namespace, name);
    if (s) {
      mask?.addSecretData(s.data);
      count(`secret ${JSON.stringify(name)}`, contentBytes(s.data));
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
    if (c) {
      count(`configmap ${JSON.stringify(name)}`, contentBytes(c.data, c.binaryData));
      configMapsRead.set(name, c);
    }
    digests[`configmap/${name}`] = c
      ? createHash('sha256')
          .update(JSON.stringify([c.data, Object.keys(c.binaryData)]))
          .digest('hex')
      : '-';
  }
  return { secret: (name) => secretsRead.get(name), configMap: (name) => configMapsRead.get(name), digests };
}
