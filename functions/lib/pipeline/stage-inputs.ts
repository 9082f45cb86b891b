/**
 * What a stage works from, shared by every stage handler: the object an event refers to (its
 * reference, log key and read: {@link appRef}, {@link objectKey}, {@link loadApp}), the
 * Secrets and ConfigMaps it references, read into the planners' shapes ({@link readRefs}), and
 * the scratch directory it works in. The stage frame (open, fence, close with the write policy)
 * is `./stage.ts`, both ends of a run `./run.ts`, the status write, the log line and the
 * observer `./report.ts`; the status summarizer and the abort watch are in `../reconcile/`.
 */
import type { ObjectRef } from '../../../events/schema.js';
import { type App, parseApp } from '../api/index.js';
import { APP_API_VERSION, type KubeObject, type KubeReader, type ResourceRef } from '../kube/port.js';

export { makeScratch, removeScratch } from '../exec/scratch.js';
// Below the pipeline, where the planners' runs (`../fetch/run.ts`) use them too.
export { readRefs } from '../kube/refs.js';

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
