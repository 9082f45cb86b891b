/**
 * The fetch stage (`pkg/app/app_fetch.go`): run `vendir sync` for `spec.fetch` into a scratch
 * directory laid out as kapp-controller does (entry i in `"<i>"` or its `path`), pack the
 * result as a deterministic tarball stored by sha256, and hand the template stage its key. The
 * run itself (planning, http sources, vendir, retries, storing) is `../../fetch/run.ts`; this file
 * decides the cache and what the result means for the App.
 *
 * Same inputs are not fetched twice: when every source is pinned (a commit sha, an image
 * digest, an http sha256, or inline paths) and the artifact for those pins exists, vendir
 * does not run (outcome `cached`). A git branch or tag, or an image or bundle by tag, that the
 * fleet's source poll follows (`../source-poll.ts`, rule `sourceTracked` of `../../api/pin-rule.ts`)
 * is fetched pinned to what the poll resolved, and the App joins the source's record: Apps on
 * one source share one pinned fetch, and a move of the source sends them `ref-changed`.
 * `status.fetch` is vendir's lock config of the pinned fetch, which names the same commit or
 * digest (and no tag) as the fetch by ref would.
 *
 * Fetch holds only a {@link FetchView}: it reads the App and the Secrets/ConfigMaps the
 * sources reference, and writes status; vendir itself gets no kubeconfig.
 */
import { type App, fetchIsPrivate } from '../../api/index.js';
import { FETCH_KEY_PATTERN, fetchCacheKey, PRIVATE_FETCH_KEY_PATTERN } from '../../artifact/keys.js';
import { type ArtifactScope, isPrivateKey, type PrivateArtifacts } from '../../artifact/sealed.js';
import type { FlightRun } from '../../artifact/single-flight.js';
import { inspectsAfterFailure } from '../../deploy/kapp.js';
import { DEFAULT_MAX_INLINE_BYTES, referencedLimit } from '../../fetch/inline-limit.js';
import { fetchSecretName, pinnedFetchIdentity } from '../../fetch/pinned.js';
import { fetchWithVendir, type VendirFetch } from '../../fetch/run.js';
import { fetchPassesUrlPolicy } from '../../fetch/url-policy.js';
import type { FetchView, KubeObject } from '../../kube/port.js';
import { readingRefsOnce } from '../../kube/views.js';
import { fetchConfigDigest } from '../../reconcile/controller-config.js';
import { redactSecrets } from '../../reconcile/redact.js';
import { KappControllerError, resultFromError, type StageResult, withCAHint } from '../../reconcile/result.js';
import { fetchPart, toEventPart } from '../../reconcile/status.js';
import type { FetchStatus } from '../../reconcile/types.js';
import {
  type CachedStageOutcome,
  cachedStageRun,
  PRIVATE_REUSE_MARGIN_MS,
  parseCacheRecord,
  privateArtifacts,
  scopeOf,
} from '../artifacts.js';
import type { PipelineDeps, RunContext, StageOutput } from '../deps.js';
import { infraStep } from '../retry-bound.js';
import { trackAppSources } from '../source-poll.js';
import { closeHandingOn, openStage, type StageFrame } from '../stage.js';
import { type LoadedApp, objectKey, readRefs } from '../stage-inputs.js';
import { APP_KIND } from './kind.js';
import { receiptOnEnd, trailWith } from './receipts.js';

/** A fetch's outcome: vendir's result (or the cached record's) and the artifact, on success. */
type Fetched = { result: StageResult; fetchKey?: string };

/**
 * What one fetch run works from, decided before vendir runs: the steps of {@link runFetch}
 * share it.
 */
interface FetchRun {
  /** The run the reconcile step started. */
  ctx: RunContext;
  deps: PipelineDeps;
  /** The open stage (the App as read, its view, mask and log line). */
  frame: StageFrame<FetchView>;
  /** The App as fetched: its polled sources pinned to the fleet's resolution (else as read). */
  app: App;
  /**
   * The App as read, when {@link app} pins an http source to the hash the poll resolved: fetched
   * instead, unshared, when that pin fails the hash check ({@link runVendir}).
   */
  asWritten?: App;
  /** Key of the pinned fetch's record, when every source is pinned; sealed with {@link scope}. */
  recordKey?: string;
  /** The pins' identity, when every source is pinned and the fetch is shared (no {@link scope}). */
  pinned?: string;
  /** The App's cluster and namespace, when the fetch used a Secret (it is then sealed there). */
  scope?: ArtifactScope;
  /** The sealed store, with {@link scope}. */
  priv?: PrivateArtifacts;
  /** The record may be read: the fetch is pinned and every source passes the URL policy. */
  usable: boolean;
  /** Tool runs and time, for the log line (set once vendir ran). */
  tools: { runs: number; ms: number };
  /**
   * The Secrets the sources name are over the referenced cap (`referencedLimit`): the run ends
   * with this error as its result, no vendir and no cache.
   */
  refused?: KappControllerError;
}

/**
 * Runs the fetch stage for a run the reconcile step started (the App as it just read it):
 * decides the cache ({@link prepareFetch}), fetches once for it ({@link fetchOnce}), closes the
 * stage and hands template its artifact or deploy the failure ({@link fetchOutput}).
 *
 * @param latest - the App as stored now, when the reconcile step knows it (its `Reconciling`
 *   write's answer, or `loaded.raw` when it wrote nothing): the stage's status write plans on it.
 * @returns the template stage's input on success; nothing after a failure (the final status
 *   is written here) or when the run went stale.
 * @throws on infrastructure failures (API, object store): the transport retries the event.
 */
export async function runFetch(
  ctx: RunContext,
  loaded: LoadedApp,
  deps: PipelineDeps,
  latest?: KubeObject,
): Promise<StageOutput> {
  const opened = await openStage(deps, {
    stage: 'fetch',
    object: ctx.ref,
    generation: ctx.run.generation,
    // The credential digests and vendir read the same Secrets: one read each per run.
    view: (id) => readingRefsOnce(deps.clusters.fetchView(id)),
    kind: APP_KIND,
    loaded,
    runStartedAt: ctx.run.startedAt,
    ...(latest ? { latest } : {}),
  });
  if (opened.stop) return {};
  const { frame } = opened;
  const startedAt = deps.now();
  const run = await prepareFetch(ctx, deps, frame);
  const cache = await fetchOnce(run);
  if (cache.kind === 'aborted') {
    // The delete owns the App now: no fetch status for it.
    frame.done('stale', { tools: run.tools });
    return {};
  }
  const cached = cache.kind === 'found';
  const { fetchKey } = cache.value;
  // The hint is part of the fetch's stderr (app_fetch.go), hence of usefulErrorMessage too.
  const result = withCAHint(cache.value.result);
  const part = fetchPart(result, startedAt, deps.now());
  frame.observe.phase('fetch', frame.secondsSince(startedAt));
  const next = await closeHandingOn(frame, {
    parts: { fetch: part },
    own: part,
    result,
    artifactKey: fetchKey,
    cached,
    tools: run.tools,
    inspectAfter: inspectsAfterFailure(loaded.app),
    receipt: receiptOnEnd(deps, { object: ctx.ref, run: ctx.run, stage: 'fetch', ...(fetchKey ? { fetchKey } : {}) }),
  });
  return fetchOutput(run, part, next, fetchKey);
}

/**
 * Decides where a pinned fetch is cached: digests the Secrets its sources name (one read each,
 * their values join the mask), keys the record by the pins, vendir's version, those digests and
 * the cluster's fetch configuration, sealed for the App's scope when a Secret was used, and
 * checks the sources against the URL policy (a refused source never reuses a record).
 * @throws on infrastructure failures (API reads).
 */
async function prepareFetch(ctx: RunContext, deps: PipelineDeps, frame: StageFrame<FetchView>): Promise<FetchRun> {
  const { kube, mask } = frame;
  // Tags and branches the fleet polls are fetched pinned to what it resolved (`../source-poll.ts`).
  const polled = await infraStep('tracking the App sources', () => trackAppSources(frame.loaded.app, ctx.ref, deps));
  const app =
    polled.tracked.length > 0
      ? { ...frame.loaded.app, spec: { ...frame.loaded.app.spec, fetch: polled.fetch } }
      : frame.loaded.app;
  const fetchSpec = app.spec.fetch ?? [];
  const secretNames = fetchSpec.map(fetchSecretName).filter((n): n is string => Boolean(n));
  const credentials: Record<string, string> = {};
  if (secretNames.length) {
    let refs: Awaited<ReturnType<typeof readRefs>>;
    try {
      refs = await readRefs(
        kube,
        app.metadata.namespace ?? '',
        secretNames,
        [],
        mask,
        referencedLimit('Fetching', deps.config.maxInlineBytes ?? DEFAULT_MAX_INLINE_BYTES),
      );
    } catch (err) {
      if (!(err instanceof KappControllerError)) throw err;
      return { ctx, deps, frame, app, usable: false, tools: { runs: 0, ms: 0 }, refused: err };
    }
    for (const n of secretNames) credentials[n] = refs.digests[`secret/${n}`] ?? '-';
  }
  // A cluster's CA bundle, proxy and skipped hosts decide what its fetch may reach: a pinned
  // fetch made under one configuration is not reused by a cluster configured otherwise.
  const configDigest = deps.clusterConfig ? fetchConfigDigest(deps.clusterConfig) : '';
  // A helm chart is pinned only by the digest its poll resolved (`../../fetch/pinned.ts`).
  const resolved = new Map(polled.tracked.map((t) => [t.fetch, t.resolved]));
  const pinned = pinnedFetchIdentity(
    fetchSpec,
    deps.config.toolVersions.vendir ?? '',
    credentials,
    configDigest,
    resolved,
  );
  // A fetch that used a Secret (credentials of a private source, inline pathsFrom Secrets) is
  // private: sealed for this cluster and namespace, never in the fleet-wide cache.
  const scope = fetchIsPrivate(fetchSpec) ? scopeOf(ctx.ref) : undefined;
  const priv = scope ? privateArtifacts(deps) : undefined;
  const recordKey = pinned
    ? scope && priv
      ? await priv.keyFor(scope, 'fetch-cache', pinned)
      : fetchCacheKey(pinned)
    : undefined;
  const usable = recordKey !== undefined && (await fetchPassesUrlPolicy(fetchSpec, deps));
  const pinsHttp = polled.tracked.some((t) => t.fetch.http !== undefined);
  return {
    ctx,
    deps,
    frame,
    app,
    ...(pinsHttp ? { asWritten: frame.loaded.app } : {}),
    ...(recordKey ? { recordKey } : {}),
    ...(pinned && !scope ? { pinned } : {}),
    ...(scope ? { scope } : {}),
    ...(priv ? { priv } : {}),
    usable,
    tools: { runs: 0, ms: 0 },
  };
}

/**
 * Fetches once for the run: the pinned fetch's artifact when its record and artifact exist
 * (shared, or sealed for the scope), else vendir runs ({@link runVendir}), through the fleet
 * single-flight for a pinned shared fetch.
 */
async function fetchOnce(run: FetchRun): Promise<CachedStageOutcome<Fetched>> {
  const { ctx, deps, frame, recordKey, scope, priv } = run;
  if (run.refused) return { kind: 'ran', value: { result: frame.mask.result(resultFromError(run.refused)) } };
  const readPinned = () => readPinnedFetch(deps, recordKey, scope, priv);
  // A shared fetch whose shared tarball was replaced is kept sealed for the App's scope, with
  // its record there (runVendir): found after the shared record missed.
  const readOwn = async () => {
    const own = await ownRecord(run);
    return own && (await readPinnedFetch(deps, own.key, own.scope, own.priv));
  };
  return await cachedStageRun<Fetched>(deps, {
    // A pinned shared fetch runs once for the fleet: the same request elsewhere waits for it.
    ...(run.usable && recordKey !== undefined && !scope
      ? { shared: { key: recordKey, read: readPinned }, sealed: readOwn }
      : {}),
    ...(run.usable && scope ? { sealed: readPinned } : {}),
    watch: { kube: frame.kube, ref: frame.ref, uid: ctx.ref.uid },
    runId: ctx.run.runId,
    run: (signal) => runVendir(run, signal),
  });
}

/**
 * The pinned fetch's artifact, when its record and the artifact it names exist. A record that
 * does not parse, or names anything but a fetch artifact (a shared record: a shared fetch key
 * only; a sealed one: a shared or a private fetch key), is a miss: any run of the fleet may
 * write the shared records. So is an artifact whose entity tag is not the one the record keeps
 * (the object was replaced since the fetch stored or verified it): template would refuse it
 * and restart the run from fetch, which would hit the same record again, forever; vendir runs
 * instead and its writer keeps a sealed copy when the shared object is bad. A record without a
 * tag (written before tags were kept), or a store whose HEAD reports none (the local directory
 * store), is checked for existence only.
 */
async function readPinnedFetch(
  deps: PipelineDeps,
  recordKey: string | undefined,
  scope: ArtifactScope | undefined,
  priv: PrivateArtifacts | undefined,
): Promise<Fetched | undefined> {
  if (!recordKey) return undefined;
  const hit = await infraStep('reading the fetch cache', () =>
    scope && priv ? priv.get(scope, recordKey, PRIVATE_REUSE_MARGIN_MS) : deps.store.get(recordKey),
  );
  const rec = parseCacheRecord(hit);
  const fetchKey = rec?.fetchKey;
  const named =
    typeof fetchKey === 'string' &&
    (FETCH_KEY_PATTERN.test(fetchKey) || (scope !== undefined && PRIVATE_FETCH_KEY_PATTERN.test(fetchKey)));
  if (!named) return undefined;
  const head = await infraStep('reading the fetch cache', () => deps.store.head(fetchKey));
  if (!head) return undefined;
  if (typeof rec?.etag === 'string' && head.etag !== undefined && head.etag !== rec.etag) {
    deps.log.warn({ key: fetchKey }, 'fetch artifact replaced since its pinned record: fetching again');
    return undefined;
  }
  // vendir's lock config of the fetch that made the artifact: status.fetch.stdout as upstream.
  const stdout = typeof rec?.stdout === 'string' ? rec.stdout : '';
  return { fetchKey, result: { stdout, stderr: '', exitCode: 0, finished: true } };
}

/**
 * The App's scope's own record of a shared pinned fetch (sealed, keyed by the pins), which
 * names the sealed copy the writer kept when the shared tarball was replaced; none for a
 * private fetch (its record is sealed already), an unpinned one, or without a keyring.
 */
async function ownRecord(
  run: FetchRun,
): Promise<{ key: string; scope: ArtifactScope; priv: PrivateArtifacts } | undefined> {
  if (run.scope || !run.pinned || !run.deps.keyring) return undefined;
  const scope = scopeOf(run.ctx.ref);
  const priv = privateArtifacts(run.deps);
  return { key: await priv.keyFor(scope, 'fetch-cache', run.pinned), scope, priv };
}

/**
 * Runs vendir (`../../fetch/run.ts`) and keeps the pinned fetch's record, sealed or shared.
 * An abort (the App deleted) during the run is a result, not a throw.
 */
async function runVendir(run: FetchRun, signal: AbortSignal): Promise<FlightRun<Fetched>> {
  const { ctx, deps, frame, recordKey, scope, priv } = run;
  const vendir = async (app: App): Promise<VendirFetch> => {
    try {
      return await fetchWithVendir(app, deps, frame.kube, scopeOf(ctx.ref), frame.mask, signal);
    } catch (err) {
      if (!signal.aborted) throw err;
      return { result: resultFromError(err), toolMs: 0, toolRuns: 0 };
    }
  };
  let r = await vendir(run.app);
  let tools = { runs: r.toolRuns, ms: r.toolMs };
  // An http body that is not the one the poll hashed (it changed since, or it changes on every
  // request): fetch what the URL answers now, as upstream does, and keep no shared record, whose
  // key names the polled hash. Without this an App on a URL whose body embeds a timestamp
  // failed every run, where upstream's fetches it.
  if (run.asWritten && !signal.aborted && httpPinMismatch(r.result)) {
    deps.log.info({ object: objectKey(ctx.ref) }, 'http source changed since the poll; fetching it as written');
    r = await vendir(run.asWritten);
    tools = { runs: tools.runs + r.toolRuns, ms: tools.ms + r.toolMs };
    run.tools = tools;
    return { result: { result: frame.mask.result(r.result), fetchKey: r.fetchKey }, shared: false };
  }
  run.tools = tools;
  const done = { result: frame.mask.result(r.result), fetchKey: r.fetchKey };
  // A deleted App's fetch leaves no record: its run ends stale, with no status. Nor does a
  // retry's with Secrets other than those `recordKey` was computed from (its next run has
  // the key of the Secrets it used).
  if (signal.aborted || !recordKey || !r.fetchKey || r.refreshed) return { result: done, shared: false };
  // The shared artifact's entity tag as stored or verified: a later replacement reads as a miss.
  const rec = JSON.stringify({
    fetchKey: r.fetchKey,
    stdout: redactSecrets(done.result.stdout),
    ...(r.fetchEtag !== undefined ? { etag: r.fetchEtag } : {}),
  });
  // A shared fetch whose shared artifact was tampered with was kept sealed for this run's scope
  // (`../../fetch/run.ts`): no shared record names it (no other scope could open it), the
  // scope's own record does, so the next runs find it without vendir.
  const own = !scope && isPrivateKey(r.fetchKey) ? await ownRecord(run) : undefined;
  if (!scope && isPrivateKey(r.fetchKey) && !own) return { result: done, shared: false };
  await infraStep('storing the fetch cache record', async () => {
    if (own) await own.priv.put(own.scope, own.key, rec);
    else if (scope && priv) await priv.put(scope, recordKey, rec);
    else await deps.store.put(recordKey, rec);
  });
  return { result: done, shared: !scope && !own };
}

/** Whether a failed fetch failed an http download's hash check (`../../fetch/http-source.ts`). */
function httpPinMismatch(result: StageResult): boolean {
  return result.exitCode !== 0 && /Expected digest to match 'sha256:/.test(`${result.stderr}\n${result.error ?? ''}`);
}

/**
 * The next stage's input once the stage closed: template's with the artifact on success,
 * deploy's with the failure when `next` hands it on (its inspect), else nothing.
 */
function fetchOutput(
  run: FetchRun,
  part: FetchStatus,
  next: 'artifact' | 'failure' | undefined,
  fetchKey: string | undefined,
): StageOutput {
  const { ctx, deps } = run;
  const receipt = trailWith(deps, undefined, 'fetch');
  if (next === 'failure') {
    // The deploy function inspects and ends the run (upstream inspects after any failure once deployed).
    return {
      deploy: {
        object: ctx.ref,
        run: ctx.run,
        artifacts: {},
        fetchStatus: toEventPart(part),
        afterFailure: 'fetch',
        ...(receipt ? { receipt } : {}),
      },
    };
  }
  if (!next || !fetchKey) return {};
  return {
    template: {
      object: ctx.ref,
      run: ctx.run,
      artifacts: { fetchKey },
      fetchStatus: toEventPart(part),
      ...(receipt ? { receipt } : {}),
    },
  };
}
