/**
 * The cap on an App's inline fetch content (`spec.fetch[].inline`: `paths`, and the Secrets and
 * ConfigMaps of `pathsFrom`), and the read of the objects vendir is given under it.
 *
 * kapp-controller has no such cap: it reads every referenced object and hands them all to vendir
 * on stdin. Here one fleet serves many tenants, so one App's inline content must not take a
 * function's memory: 200 MiB of `pathsFrom` Secrets took the embedded runtime from 0.3 to 2.1 GB
 * (each byte is held decoded, base64-encoded, in vendir's YAML stdin and in the run's mask). The
 * objects are read one at a time and the running total checked after each, so a fetch over the
 * cap fails holding at most the cap plus one object (the API server's limit, about 1 MiB), and
 * reads nothing after the object that passed it.
 *
 * @module
 */
import type { ConfigMapLike, RefObjects, SecretLike } from '../api/index.js';
import type { KubeReader } from '../kube/port.js';
import { contentBytes, type RefsLimit, type SecretValueSink } from '../kube/refs.js';
import { KappControllerError } from '../reconcile/result.js';
import type { VendirConfig, VendirResourceRef } from './vendir.js';

/**
 * Default cap on an App's inline fetch content, bytes: 64 MiB, the order of the runtime's other
 * bounds on what one run holds in memory (a templating tool's output, a helm `index.yaml`).
 * Setting: `KAPP_LAMBDA_MAX_INLINE_BYTES` (`maxInlineBytes` of the pipeline configuration).
 */
export const DEFAULT_MAX_INLINE_BYTES = 64 * 1024 * 1024;

/** Largest cap a setting may choose, bytes: 1 GiB (the fetch function has 1 GiB of memory). */
export const MAX_INLINE_BYTES_CEILING = 1024 * 1024 * 1024;

/**
 * The cap on the Secrets and ConfigMaps a stage reads for an App besides its inline content
 * (`readRefs`: the fetch's credentials Secrets; the template's `valuesFrom` Secrets and
 * ConfigMaps and sops key Secrets), the inline cap's size: an App names as many as its spec
 * holds. Over it: `<stage>: secret "<name>" brings the App's referenced Secrets and ConfigMaps to
 * <n> bytes, over the limit of <max> bytes` (a KappControllerError: the stage's status).
 *
 * @param stage - `Fetching` or `Templating`, the status text's prefix
 * @param maxBytes - the cap ({@link DEFAULT_MAX_INLINE_BYTES} by default)
 */
export function referencedLimit(stage: 'Fetching' | 'Templating', maxBytes: number): RefsLimit {
  return {
    maxBytes,
    overLimit: (what, total, max) =>
      new KappControllerError(
        `${stage}: ${what} brings the App's referenced Secrets and ConfigMaps to ${total} bytes, over the limit of ${max} bytes`,
      ),
  };
}

/** The exact status text of a fetch over the cap; names the source, never its content. */
function overLimit(index: number, source: string, total: number, max: number): KappControllerError {
  return new KappControllerError(
    `Fetching (${index}): inline ${source} brings the App's inline content to ${total} bytes, over the limit of ${max} bytes`,
  );
}

/**
 * Reads the Secrets and ConfigMaps a vendir config refers to (`refs`, from `vendirResourceRefs`)
 * under the inline cap: first the `paths` of every inline entry are counted (no read), then each
 * `pathsFrom` object is read in `spec.fetch` and `pathsFrom` order and its content counted once
 * per reference (vendir writes it once per reference), then the credentials Secrets of the other
 * sources, counted apart under {@link referencedLimit} (the same size). A missing object is
 * absent from the lookup, as `readRefs` leaves it (the planner then fails with the API server's
 * not-found text).
 *
 * @param kube - reads one object at a time (never a List)
 * @param namespace - the App's namespace
 * @param config - the App's vendir config (`buildVendirConfig`): directory i is `spec.fetch[i]`
 * @param refs - the objects it refers to (`vendirResourceRefs(config)`)
 * @param maxBytes - the cap, bytes ({@link DEFAULT_MAX_INLINE_BYTES} by default)
 * @param mask - every data value of every Secret read is added to it
 * @returns the lookup the planner reads
 * @throws KappControllerError `Fetching (<i>): inline paths brings the App's inline content to
 *   <n> bytes, over the limit of <max> bytes` (or `inline pathsFrom secret "<name>"` /
 *   `configmap "<name>"`) as soon as the total passes `maxBytes`; `Fetching: secret "<name>"
 *   brings the App's referenced Secrets and ConfigMaps to ...` ({@link referencedLimit}) once the
 *   credentials Secrets pass it; KubeApiError when a read fails.
 */
export async function readRefsWithinLimit(
  kube: KubeReader,
  namespace: string,
  config: VendirConfig,
  refs: readonly VendirResourceRef[],
  maxBytes: number,
  mask: SecretValueSink,
): Promise<RefObjects> {
  const secrets = new Map<string, SecretLike | undefined>();
  const configMaps = new Map<string, ConfigMapLike | undefined>();
  const read = async (ref: VendirResourceRef): Promise<number> => {
    if (!ref.name) return 0; // the planner reports it as not found, as upstream
    if (ref.kind === 'Secret') {
      if (!secrets.has(ref.name)) {
        const s = await kube.getSecret(namespace, ref.name);
        if (s) mask.addSecretData(s.data);
        secrets.set(ref.name, s);
      }
      return contentBytes(secrets.get(ref.name)?.data);
    }
    if (!configMaps.has(ref.name)) configMaps.set(ref.name, await kube.getConfigMap(namespace, ref.name));
    const cm = configMaps.get(ref.name);
    return contentBytes(cm?.data, cm?.binaryData);
  };
  const inline = config.directories.flatMap((dir, index) => {
    const c = dir.contents[0].inline;
    return c ? [{ index, c }] : [];
  });
  let total = 0;
  for (const { index, c } of inline) {
    total += contentBytes(c.paths);
    if (total > maxBytes) throw overLimit(index, 'paths', total, maxBytes);
  }
  for (const { index, c } of inline) {
    for (const src of c.pathsFrom ?? []) {
      // The same precedence as vendirResourceRefs: a secretRef wins over a configMapRef.
      const ref: VendirResourceRef | undefined = src.secretRef
        ? { kind: 'Secret', name: src.secretRef.name }
        : src.configMapRef
          ? { kind: 'ConfigMap', name: src.configMapRef.name }
          : undefined;
      if (!ref) continue;
      total += await read(ref);
      if (total > maxBytes) {
        throw overLimit(index, `pathsFrom ${ref.kind.toLowerCase()} ${JSON.stringify(ref.name)}`, total, maxBytes);
      }
    }
  }
  // The credentials Secrets of the other sources, under the referenced cap (the fetch stage read
  // them under it for the cache key; a retry reads them again, past that memo, and the tenant may
  // have grown them meanwhile). An object an inline source names was counted above.
  const counted = new Set(
    inline.flatMap(({ c }) =>
      (c.pathsFrom ?? []).map((src) =>
        src.secretRef ? `Secret/${src.secretRef.name}` : `ConfigMap/${src.configMapRef?.name}`,
      ),
    ),
  );
  const referenced = referencedLimit('Fetching', maxBytes);
  let credentials = 0;
  for (const ref of refs) {
    const bytes = await read(ref);
    if (counted.has(`${ref.kind}/${ref.name}`)) continue;
    counted.add(`${ref.kind}/${ref.name}`);
    credentials += bytes;
    if (credentials > maxBytes) {
      throw referenced.overLimit(`${ref.kind.toLowerCase()} ${JSON.stringify(ref.name)}`, credentials, maxBytes);
    }
  }
  return { secret: (name) => secrets.get(name), configMap: (name) => configMaps.get(name) };
}
