/**
 * Which artifacts are private (made from Secrets) and how the stages read them
 * (`../artifact/sealed.ts`). Shared artifacts keep the fleet-wide content-addressed keys of
 * `../artifact/keys.ts`; private ones are sealed per cluster and expire.
 */
import type { AppFetch, AppTemplate } from '../api/index.js';
import { referencedSecrets } from '../api/refs.js';
import { type ArtifactScope, isPrivateKey, PrivateArtifacts } from '../artifact/sealed.js';
import type { FlightOptions } from '../artifact/single-flight.js';
import { DEFAULT_TIMEOUT_MS } from '../exec/runner.js';
import type { PipelineDeps } from './deps.js';
import { infraStep } from './retry-bound.js';

/**
 * Least life, ms, a cached private object must have left to be reused (1 hour), so the next
 * stage can still read what a cache hit hands it.
 */
export const PRIVATE_REUSE_MARGIN_MS = 60 * 60 * 1000;

/** The scope of a run's private artifacts: its cluster and the App's namespace. */
export function scopeOf(ref: { clusterId: string; namespace: string }): ArtifactScope {
  return { clusterId: ref.clusterId, namespace: ref.namespace };
}

/**
 * The private artifact store of `deps`.
 * @throws Error when no keyring is configured: secret material is never stored unsealed or
 *   shared instead (fail closed).
 */
export function privateArtifacts(deps: PipelineDeps): PrivateArtifacts {
  if (!deps.keyring) throw new Error('no artifact keyring is configured: cannot store content made from Secrets');
  return new PrivateArtifacts(deps.store, deps.keyring, {
    now: deps.now,
    ...(deps.config.privateArtifactTtlMs ? { ttlMs: deps.config.privateArtifactTtlMs } : {}),
  });
}

/**
 * True when a fetch uses a Secret: a source with a `secretRef` (credentials of a private
 * source) or an inline `pathsFrom` Secret. ConfigMaps alone keep a fetch shared.
 */
export function fetchIsPrivate(fetch: readonly AppFetch[]): boolean {
  return referencedSecrets({ fetch }).length > 0 || namesSecret(fetch);
}

/**
 * True when any object in `value` has a `secretRef` (or `...SecretRef`) field: the
 * conservative net under the upstream-shaped walk of `referencedSecrets`, which reads only
 * the first source of an entry.
 */
function namesSecret(value: unknown): boolean {
  if (Array.isArray(value)) return value.some(namesSecret);
  if (value === null || typeof value !== 'object') return false;
  return Object.entries(value).some(
    ([k, v]) => ((k === 'secretRef' || k.endsWith('SecretRef')) && v != null) || namesSecret(v),
  );
}

/**
 * True when a render's own inputs include a Secret: a ytt inline `pathsFrom` Secret, a
 * `valuesFrom` Secret of ytt, helmTemplate or cue, or any sops step (its output is decrypted
 * secret material). A private fetch artifact makes the render private too (checked by the caller).
 */
export function templateIsPrivate(templates: readonly AppTemplate[]): boolean {
  return (
    templates.some((t) => t.sops) || referencedSecrets({ template: templates }).length > 0 || namesSecret(templates)
  );
}

// A `kind: Secret` line in YAML (top level, in a list item, or indented in a List) or a
// `"kind": "Secret"` member in JSON. Over-matching (e.g. a `secretRef` whose kind is Secret)
// only makes a render private, never the reverse.
const SECRET_KIND_YAML = /^[ \t-]*kind:[ \t]*["']?Secret["']?[ \t]*(?:#.*)?$/m;
const SECRET_KIND_JSON = /"kind"\s*:\s*"Secret"/;

/** True when a rendered manifest may contain a Secret object (its values must not be shared). */
export function manifestHasSecret(manifest: string): boolean {
  return SECRET_KIND_YAML.test(manifest) || SECRET_KIND_JSON.test(manifest);
}

/**
 * Reads an artifact a hand-off named: private keys are opened with the run's cluster key
 * (and refused for another scope), shared keys are read as they are.
 * @returns the bytes, or `undefined` when absent (or, for a private artifact, expired).
 * @throws SealError for a private key of another scope or that does not open.
 */
export async function readArtifact(deps: PipelineDeps, scope: ArtifactScope, key: string): Promise<Buffer | undefined> {
  if (isPrivateKey(key)) return await privateArtifacts(deps).get(scope, key);
  return await deps.store.get(key);
}

/**
 * The fleet single-flight options of a stage (`../artifact/single-flight.ts`) for the shared
 * cache record `key`: the marker names the run, a wait ends with the App's abort `signal` or the
 * function deadline, and lasts at most the tool timeout (a holder's own run cannot last longer).
 * Only for shared keys: content made from Secrets never waits on another cluster's run.
 */
export function fleetFlight(deps: PipelineDeps, key: string, runId: string, signal: AbortSignal): FlightOptions {
  return {
    store: deps.store,
    key,
    label: `run:${runId}`,
    now: deps.now,
    log: deps.log,
    maxWaitMs: deps.config.toolTimeoutMs ?? DEFAULT_TIMEOUT_MS,
    signal,
    ...(deps.deadline ? { deadline: deps.deadline } : {}),
    step: infraStep,
  };
}
