/**
 * What a stage works from, shared by every stage handler: the object an event refers to (its
 * reference, log key and read: {@link appRef}, {@link objectKey}, {@link loadApp}), the
 * Secrets and ConfigMaps it references, read into the planners' shapes ({@link readRefs}), and
 * the scratch directory it works in. The stage frame (open, fence, the status write, close with
 * the write policy, the log line and the observer) is `./stage.ts`; the status summarizer and
 * the abort watch are in `../reconcile/`.
 */
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type { ObjectRef } from '../../../events/schema.js';
import { type App, type ConfigMapLike, parseApp, type RefObjects, type SecretLike } from '../api/index.js';
import { RUN_DIR_PREFIX } from '../exec/sandbox.js';
import { APP_API_VERSION, type KubeObject, type KubeReader, type ResourceRef } from '../kube/port.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import type { PipelineDeps } from './deps.js';

/** The Kubernetes reference of the App an event refers to. */
export function appRef(ref: Pick<ObjectRef, 'namespace' | 'name'>): ResourceRef {
  return { apiVersion: APP_API_VERSION, kind: 'App', namespace: ref.namespace, name: ref.name };
}

/** `cluster/<kind>/namespace/name` (kind default `App`): the object key used in logs. */
export function objectKey(ref: Pick<ObjectRef, 'clusterId' | 'namespace' | 'name'> & { kind?: string }): string {
  return `${ref.clusterId}/${ref.kind ?? 'App'}/${ref.namespace}/${ref.name}`;
}

/** The App as read, raw (for status writes) and parsed (for decisions). */
export interface LoadedApp {
  raw: KubeObject;
  app: App;
}

/** Result of {@link loadApp}. */
export type LoadResult =
  | { kind: 'ok'; loaded: LoadedApp }
  | { kind: 'gone' }
  | { kind: 'invalid'; raw: KubeObject; message: string };

/**
 * Re-reads the App (functions never trust the event's copy: events are references).
 * An object the API server accepted but our schema rejects (only possible with a CRD older
 * than ours) is reported as `invalid` with the field path, so it can get a status, not a crash.
 *
 * @throws KubeApiError when the read fails (the run is retried).
 */
export async function loadApp(kube: KubeReader, ref: ResourceRef): Promise<LoadResult> {
  const raw = await kube.getObject(ref);
  if (!raw) return { kind: 'gone' };
  const parsed = parseApp(raw);
  if (!parsed.success) return { kind: 'invalid', raw, message: parsed.error.message };
  return { kind: 'ok', loaded: { raw, app: parsed.data } };
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
  mask?: SecretMask,
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

/** The names of the stages' scratch directories (`<prefix>-XXXXXX` under the tmp root). */
export const SCRATCH_PREFIXES = ['deploy', 'fetch', 'fetch-http', 'index-repo', 'template'] as const;

/**
 * Makes a fresh scratch directory under the configured tmp root; remove it with
 * {@link removeScratch} in a `finally`.
 */
export async function makeScratch(deps: PipelineDeps, prefix: (typeof SCRATCH_PREFIXES)[number]): Promise<string> {
  await mkdir(deps.config.tmpRoot, { recursive: true });
  return await mkdtemp(path.join(deps.config.tmpRoot, `${prefix}-`));
}

/** Removes a scratch directory; never throws (a leftover temp dir must not fail a run). */
export async function removeScratch(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true }).catch(() => undefined);
}

/** A name {@link makeScratch} or the runner's run directories (`../exec/sandbox.ts`) give. */
const LEFTOVER_NAME = new RegExp(
  `^(?:${[...SCRATCH_PREFIXES, RUN_DIR_PREFIX.slice(0, -1)].join('|')})-[A-Za-z0-9]{6}$`,
);

/**
 * Removes the scratch and tool run directories a previous process left under `tmpRoot`, for a
 * process that is the only one using it (a Lambda function at its cold start: one process per
 * execution environment, one invocation at a time). Every run removes its own directories when
 * it ends, but a process the platform ends mid-run (out of memory, killed at the time limit)
 * cannot, and Lambda may start the next process in the same environment with `/tmp` as it
 * was: its tools, which share the function's uid there, could then read another App's fetched
 * sources or rendered manifests. Only names this runtime makes are removed; never throws.
 *
 * @returns the names removed
 */
export async function removeLeftoverScratch(tmpRoot: string): Promise<string[]> {
  const names = await readdir(tmpRoot).catch(() => [] as string[]);
  const stale = names.filter((n) => LEFTOVER_NAME.test(n));
  await Promise.all(stale.map((n) => removeScratch(path.join(tmpRoot, n))));
  return stale;
}
