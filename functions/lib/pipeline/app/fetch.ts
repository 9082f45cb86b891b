/**
 * The fetch stage (`pkg/app/app_fetch.go`): run `vendir sync` for `spec.fetch` into a scratch
 * directory laid out as kapp-controller does (entry i in `"<i>"` or its `path`), pack the
 * result as a deterministic tarball stored by sha256, and hand the template stage its key. The
 * run itself (planning, http sources, vendir, retries, storing) is `../../fetch/run.ts`; this file
 * decides the cache and what the result means for the App.
 *
 * Same inputs are not fetched twice: when every source is pinned (a commit sha, an image
 * digest, an http sha256, or inline paths) and the artifact for those pins exists, vendir
 * does not run (outcome `cached`).
 *
 * Fetch holds only a {@link FetchView}: it reads the App and the Secrets/ConfigMaps the
 * sources reference, and writes status; vendir itself gets no kubeconfig.
 */
import { fetchIsPrivate } from '../../api/index.js';
import { fetchCacheKey } from '../../artifact/keys.js';
import { inspectsAfterFailure } from '../../deploy/kapp.js';
import { fetchSecretName, pinnedFetchIdentity } from '../../fetch/pinned.js';
import { fetchPassesUrlPolicy, fetchWithVendir, type VendirFetch } from '../../fetch/run.js';
import type { KubeObject } from '../../kube/port.js';
import { readingRefsOnce } from '../../kube/views.js';
import { fetchConfigDigest } from '../../reconcile/controller-config.js';
import { redactSecrets } from '../../reconcile/redact.js';
import { resultFromError, type StageResult, withCAHint } from '../../reconcile/result.js';
import { fetchPart, toEventPart } from '../../reconcile/status.js';
import { cachedStageRun, PRIVATE_REUSE_MARGIN_MS, privateArtifacts, scopeOf } from '../artifacts.js';
import type { PipelineDeps, RunContext, StageOutput } from '../deps.js';
import { infraStep } from '../retry-bound.js';
import { closeHandingOn, openStage } from '../stage.js';
import { type LoadedApp, readRefs } from '../stage-inputs.js';
import { APP_KIND } from './kind.js';
import { receiptOnEnd, trailWith } from './receipts.js';

/** A fetch's outcome: vendir's result (or the cached record's) and the artifact, on success. */
type Fetched = { result: StageResult; fetchKey?: string };

/** The record of a pinned fetch: its artifact and vendir's lock config (`status.fetch.stdout`). */
interface PinnedFetchRecord {
  fetchKey?: string;
  stdout?: string;
}

/**
 * Runs the fetch stage for a run the reconcile step started (the App as it just read it).
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
  const { kube, mask } = frame;
  const { app } = loaded;
  const startedAt = deps.now();

  let tools = { runs: 0, ms: 0 };
  const fetchSpec = app.spec.fetch ?? [];
  const secretNames = fetchSpec.map(fetchSecretName).filter((n): n is string => Boolean(n));
  const credentials: Record<string, string> = {};
  if (secretNames.length) {
    const refs = await readRefs(kube, app.metadata.namespace ?? '', secretNames, [], mask);
    for (const n of secretNames) credentials[n] = refs.digests[`secret/${n}`] ?? '-';
  }
  // A cluster's CA bundle, proxy and skipped hosts decide what its fetch may reach: a pinned
  // fetch made under one configuration is not reused by a cluster configured otherwise.
  const configDigest = deps.clusterConfig ? fetchConfigDigest(deps.clusterConfig) : '';
  const pinned = pinnedFetchIdentity(fetchSpec, deps.config.toolVersions.vendir ?? '', credentials, configDigest);
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
  /** The pinned fetch's artifact, when its record and the artifact it names exist. */
  const readPinned = async (): Promise<Fetched | undefined> => {
    if (!recordKey) return undefined;
    const hit = await infraStep('reading the fetch cache', () =>
      scope && priv ? priv.get(scope, recordKey, PRIVATE_REUSE_MARGIN_MS) : deps.store.get(recordKey),
    );
    const rec = hit ? (JSON.parse(hit.toString('utf8')) as PinnedFetchRecord) : undefined;
    const fetchKey = rec?.fetchKey;
    if (!fetchKey || !(await infraStep('reading the fetch cache', () => deps.store.head(fetchKey)))) return undefined;
    // vendir's lock config of the fetch that made the artifact: status.fetch.stdout as upstream.
    return { fetchKey, result: { stdout: rec?.stdout ?? '', stderr: '', exitCode: 0, finished: true } };
  };
  const cache = await cachedStageRun<Fetched>(deps, {
    // A pinned shared fetch runs once for the fleet: the same request elsewhere waits for it.
    ...(usable && !scope ? { shared: { key: recordKey, read: readPinned } } : {}),
    ...(usable && scope ? { sealed: readPinned } : {}),
    watch: { kube, ref: frame.ref, uid: ctx.ref.uid },
    runId: ctx.run.runId,
    run: async (signal) => {
      let r: VendirFetch;
      try {
        r = await fetchWithVendir(app, deps, kube, scopeOf(ctx.ref), mask, signal);
      } catch (err) {
        if (!signal.aborted) throw err;
        r = { result: resultFromError(err), toolMs: 0, toolRuns: 0 };
      }
      tools = { runs: r.toolRuns, ms: r.toolMs };
      const done = { result: mask.result(r.result), fetchKey: r.fetchKey };
      // A deleted App's fetch leaves no record: its run ends stale, with no status. Nor does a
      // retry's with Secrets other than those `recordKey` was computed from (its next run has
      // the key of the Secrets it used).
      if (signal.aborted || !recordKey || !r.fetchKey || r.refreshed) return { result: done, shared: false };
      const rec = JSON.stringify({ fetchKey: r.fetchKey, stdout: redactSecrets(done.result.stdout) });
      await infraStep('storing the fetch cache record', async () => {
        if (scope && priv) await priv.put(scope, recordKey, rec);
        else await deps.store.put(recordKey, rec);
      });
      return { result: done, shared: !scope };
    },
  });
  if (cache.kind === 'aborted') {
    // The delete owns the App now: no fetch status for it.
    frame.done('stale', { tools });
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
    tools,
    inspectAfter: inspectsAfterFailure(app),
    receipt: receiptOnEnd(deps, { object: ctx.ref, run: ctx.run, stage: 'fetch', ...(fetchKey ? { fetchKey } : {}) }),
  });
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
