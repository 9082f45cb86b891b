/**
 * How the stages keep and read private artifacts (made from Secrets, sealed per cluster and
 * expiring: `../artifact/sealed.ts`) beside the shared ones (fleet-wide, content-addressed:
 * `../artifact/keys.ts`). Which inputs make an artifact private is decided by `fetchIsPrivate`
 * and `templateIsPrivate` (`../api/refs.ts`) and by `manifestHasSecret` (`./manifest-secret.ts`).
 */

import { ArtifactError } from '../artifact/errors.js';
import { FETCH_KEY_PATTERN, sha256Hex, TEMPLATE_KEY_PATTERN } from '../artifact/keys.js';
import { type ArtifactScope, isPrivateKey, privateArtifacts } from '../artifact/sealed.js';
import { type FlightOptions, type FlightOutcome, type FlightRun, singleFlight } from '../artifact/single-flight.js';
import type { UnpackResult } from '../artifact/tarball.js';
import { DEFAULT_TIMEOUT_MS } from '../exec/runner.js';
import type { KubeReader, ResourceRef } from '../kube/port.js';
import { watchForAbort } from '../reconcile/abort-watch.js';
import { MissingArtifactError } from '../reconcile/result.js';
import { absentIfUnreadable } from '../store/port.js';
import type { PipelineDeps } from './deps.js';
import { infraStep } from './retry-bound.js';

// The render's own test, beside the inputs' (`fetchIsPrivate`, `templateIsPrivate`).
export { manifestHasSecret } from './manifest-secret.js';

// Below the pipeline, where the planners' runs (`../fetch/run.ts`) open private artifacts too.
export { privateArtifacts };

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
 * Reads an artifact a hand-off named: private keys are opened with the run's cluster key
 * (and refused for another scope), shared keys are read as they are, and a shared manifest
 * (`artifacts/template/sha256/<hex>.yaml`) only when its bytes hash to `<hex>`: any run of the
 * fleet may write the shared prefixes, so a manifest replaced under its key reads as absent
 * (logged as tampering), never deployed. A shared fetch tarball is checked as it is unpacked
 * ({@link unpackArtifact}), not here. A shared object over the store's read bound
 * (`ObjectTooLargeError`) was planted too: absent, logged as tampering.
 * @returns the bytes, or `undefined` when absent (or, for a private artifact, expired; for a
 *   shared manifest, not the one its key names; for a shared key, over the read bound).
 * @throws SealError for a private key of another scope or that does not open.
 */
export async function readArtifact(deps: PipelineDeps, scope: ArtifactScope, key: string): Promise<Buffer | undefined> {
  if (isPrivateKey(key)) return await privateArtifacts(deps).get(scope, key);
  // Over the read bound: planted by a run of the fleet (tampering), absent like a wrong digest.
  const body = await absentIfUnreadable(
    () => deps.store.get(key),
    () => logTampered(deps, key),
  );
  const hex = TEMPLATE_KEY_PATTERN.exec(key)?.[1];
  if (body === undefined || hex === undefined || sha256Hex(body) === hex) return body;
  logTampered(deps, key);
  return undefined;
}

/**
 * A cache record's fields (`{ manifestKey, stderr }`, `{ fetchKey, stdout }`), or `undefined`
 * for anything that is not a JSON object: a record a run of the fleet overwrote with garbage is
 * a cache miss, not a stage that throws. The caller still checks each field it uses.
 */
export function parseCacheRecord(body: Buffer | undefined): Record<string, unknown> | undefined {
  if (!body) return undefined;
  try {
    const rec: unknown = JSON.parse(body.toString('utf8'));
    return rec !== null && typeof rec === 'object' && !Array.isArray(rec)
      ? (rec as Record<string, unknown>)
      : undefined;
  } catch {
    return undefined;
  }
}

/** Logs a shared artifact found not to be what its key names (replaced by a run of the fleet). */
export function logTampered(deps: Pick<PipelineDeps, 'log'>, key: string): void {
  deps.log.warn({ key }, 'shared artifact does not match the digest its key names: tampered, not used');
}

/**
 * Reads the fetch artifact `key` ({@link readArtifact}) and unpacks it into `dest`; a shared
 * one (`artifacts/fetch/sha256/<hex>.tgz`) only when its tar stream hashes to `<hex>`, checked
 * during the unpack itself (`unpackTarball`'s `sha256`). A tarball replaced under its key is
 * logged as tampering and reads as absent: nothing of it is left at `dest`, nothing renders.
 * @param what - how {@link MissingArtifactError} names it (`fetch artifact`, `fetch`).
 * @throws MissingArtifactError when the artifact is absent or tampered; ArtifactError for an
 *   unsafe archive (of a private key); what the read throws.
 */
export async function unpackArtifact(
  deps: PipelineDeps,
  scope: ArtifactScope,
  key: string,
  dest: string,
  what: string,
): Promise<UnpackResult> {
  const tgz = await infraStep('reading the fetch artifact', () => readArtifact(deps, scope, key));
  if (!tgz) throw new MissingArtifactError(what, key);
  const sha256 = FETCH_KEY_PATTERN.exec(key)?.[1];
  try {
    // Loaded here: the deploy bundle, which unpacks no tarball, carries no tar (a cold start's cost).
    const { unpackTarball } = await import('../artifact/tarball.js');
    return await unpackTarball(tgz, dest, sha256 ? { sha256 } : {});
  } catch (err) {
    if (!(err instanceof ArtifactError) || err.code !== 'digest-mismatch') throw err;
    logTampered(deps, key);
    throw new MissingArtifactError(what, key);
  }
}

/**
 * The fleet single-flight options of a stage (`../artifact/single-flight.ts`) for the shared
 * cache record `key`: the marker names the run, a wait ends with the App's abort `signal` or the
 * function deadline, and lasts at most the tool timeout (a holder's own run cannot last longer)
 * and at most half the time left before the deadline (`deps.deadlineAt`), so a runner whose
 * holder never delivers (a marker kept alive by a run of another cluster) still has the other
 * half to run the tool itself. Only for shared keys: content made from Secrets never waits on
 * another cluster's run.
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
    ...(deps.deadlineAt !== undefined ? { deadlineAt: deps.deadlineAt } : {}),
    step: infraStep,
  };
}

/** What {@link cachedStageRun} looks up, watches and runs. */
export interface CachedStageRunOptions<T> {
  /**
   * The fleet-wide cache: `read` reads its record and heads the artifact the record names
   * (`undefined` when either is missing). Only for inputs that may be shared: the run then goes
   * through the fleet single-flight on `key` ({@link fleetFlight}), whose waiters `read` again.
   */
  shared?: { key: string; read: () => Promise<T | undefined> };
  /** Reads this scope's sealed record and heads its artifact, when the shared cache missed. */
  sealed?: () => Promise<T | undefined>;
  /** The object whose deletion kills the run: its reader, reference and uid. */
  watch: { kube: KubeReader; ref: ResourceRef; uid: string };
  /** The run's id (the single-flight marker names it). */
  runId: string;
  /**
   * Makes the artifact in its own scratch directory and stores it with its record, shared or
   * sealed (`shared: true` only for the former: the fleet's waiters then find it). `signal`
   * fires when the object is deleted.
   */
  run: (signal: AbortSignal) => Promise<FlightRun<T>>;
}

/**
 * What {@link cachedStageRun} did: a cached artifact was `found` (here, or made meanwhile by the
 * fleet run this one waited for), this stage `ran` (success or failure: the value says), or the
 * object was deleted meanwhile (`aborted`: the delete owns it now, the stage writes no status).
 */
export type CachedStageOutcome<T> = { kind: 'found'; value: T } | { kind: 'ran'; value: T } | { kind: 'aborted' };

/**
 * The cache step of the fetch and template stages: same inputs are not made twice. In order:
 * reads the shared record (and heads its artifact), then the sealed one; on a miss arms the
 * object's abort watch and, for shared inputs, the fleet single-flight, and runs (`opts.run`
 * makes its scratch directory and stores what it made); stops the watch whatever happened.
 * Deleting the object kills the tools, as it kills kapp during a deploy; canceling does not
 * (only kapp is cancellable upstream, reference §3.10).
 *
 * @throws what the reads, the single-flight's store steps or `opts.run` throw (infrastructure)
 */
export async function cachedStageRun<T>(
  deps: PipelineDeps,
  opts: CachedStageRunOptions<T>,
): Promise<CachedStageOutcome<T>> {
  const { shared } = opts;
  const hit = (await shared?.read()) ?? (await opts.sealed?.());
  if (hit !== undefined) return { kind: 'found', value: hit };
  const watch = watchForAbort(opts.watch.kube, opts.watch.ref, opts.watch.uid, deps, { abortOnCancel: false });
  let flight: FlightOutcome<T, T>;
  try {
    // Shared inputs are made once for the fleet: the same run elsewhere waits for this one.
    flight = shared
      ? await singleFlight(fleetFlight(deps, shared.key, opts.runId, watch.signal), shared.read, () =>
          opts.run(watch.signal),
        )
      : { kind: 'ran', result: (await opts.run(watch.signal)).result, role: 'solo' };
  } finally {
    await watch.stop();
  }
  if (flight.kind === 'aborted' || watch.signal.aborted) return { kind: 'aborted' };
  return flight.kind === 'found' ? { kind: 'found', value: flight.value } : { kind: 'ran', value: flight.result };
}
