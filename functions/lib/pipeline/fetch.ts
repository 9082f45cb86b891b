/**
 * The fetch stage (`pkg/app/app_fetch.go`): run `vendir sync` for `spec.fetch` into a scratch
 * directory laid out as kapp-controller does (entry i in `"<i>"` or its `path`), pack the
 * result as a deterministic tarball stored by sha256, and hand the template stage its key.
 *
 * Same inputs are not fetched twice: when every source is pinned (a commit sha, an image
 * digest, an http sha256, or inline paths) and the artifact for those pins exists, vendir
 * does not run (outcome `cached`).
 *
 * Fetch holds only a {@link FetchView}: it reads the App and the Secrets/ConfigMaps the
 * sources reference, and writes status; vendir itself gets no kubeconfig.
 */
import { rename } from 'node:fs/promises';
import type { App, AppFetch, RefObjects } from '../api/index.js';
import { fetchArtifactKey, fetchCacheKey } from '../artifact/keys.js';
import { type FlightOutcome, type FlightRun, singleFlight } from '../artifact/single-flight.js';
import { ArtifactError, packDir } from '../artifact/tarball.js';
import { inspectsAfterFailure } from '../deploy/kapp.js';
import { proxyEnv, trustEnv } from '../fetch/cluster-trust.js';
import { prepareHttpSources, restoreHttpLock } from '../fetch/http-source.js';
import { fetchSecretName, pinnedFetchIdentity } from '../fetch/pinned.js';
import { GIT_SUBMODULE_LOCKDOWN_ENV, UrlPolicyChecker, UrlPolicyError } from '../fetch/url-policy.js';
import {
  buildVendirConfig,
  FETCH_RUN_ERROR_PREFIX,
  hasImageOrImgpkgBundle,
  planVendirSync,
  type VendirPlan,
  type VendirPlanInput,
  vendirResourceRefs,
} from '../fetch/vendir.js';
import type { KubeObject, KubeReader } from '../kube/port.js';
import { freshReads, readingRefsOnce } from '../kube/views.js';
import { watchForAbort } from '../reconcile/abort-watch.js';
import { fetchConfigDigest } from '../reconcile/controller-config.js';
import { redactSecrets } from '../reconcile/redact.js';
import { attachError, outcomeOf, resultFromError, type StageResult, withCAHint } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { fetchPart, toEventPart } from '../reconcile/status.js';
import { fetchIsPrivate, fleetFlight, PRIVATE_REUSE_MARGIN_MS, privateArtifacts, scopeOf } from './artifacts.js';
import { type PipelineDeps, type RunContext, type StageOutput, sleepOf } from './deps.js';
import { receiptOnEnd, trailWith } from './receipts.js';
import { infraStep } from './retry-bound.js';
import { APP_KIND, closeHandingOn, openStage } from './stage.js';
import { type LoadedApp, makeScratch, readRefs, removeScratch } from './stage-inputs.js';

/**
 * Upstream's fetch retry (`pkg/app/app_fetch.go` and `pkg/pkgrepository/app_fetch.go` `fetch`,
 * reference §3.6 step 4): after a failed vendir run of a fetch with an `image` or `imgpkgBundle`
 * source, this many more checks, {@link FETCH_RETRY_INTERVAL_MS} apart.
 */
export const FETCH_RETRIES = 3;

/** The pause before each retry check, ms (upstream `time.Sleep(2 * time.Second)`). */
export const FETCH_RETRY_INTERVAL_MS = 2_000;

/** Options of {@link fetchWithVendir}. */
export interface VendirFetchOptions {
  /**
   * After a successful fetch, vendir's directory (the tree exactly as packed, entry i in `"<i>"`)
   * is moved to this path, which must not exist and must be on the same file system as
   * `deps.config.tmpRoot` (the index-repo function templates it there instead of unpacking the
   * artifact it just stored). Omitted: the directory is removed.
   */
  keepAt?: string;
  /**
   * The fetch as it reads now, called before each retry check. The index-repo function names its
   * placeholder Secret in the fetch only once the Secret holds credentials (`./repo-placeholder.ts`),
   * so the placeholder being filled changes the fetch itself, where upstream (which always names
   * it) sees the Secret's bytes change. Omitted: the App's `spec.fetch`, which a run never changes.
   */
  refetch?: () => Promise<readonly AppFetch[]>;
}

/** What {@link fetchWithVendir} did. */
export interface VendirFetch {
  /** The stage result (of the last vendir run, or of the planning error). */
  result: StageResult;
  /** The stored artifact, on success. */
  fetchKey?: string;
  /** Tool time, ms, over every try. */
  toolMs: number;
  /** vendir runs, over every try. */
  toolRuns: number;
  /** The tree was moved to {@link VendirFetchOptions.keepAt}. */
  kept?: boolean;
  /**
   * The result is that of a retry run with other Secrets or ConfigMaps (or another fetch) than
   * the first try read: a cache identity computed from the first read does not describe it.
   */
  refreshed?: boolean;
}

/** A fetch planned from the Secrets and ConfigMaps as read: what vendir is given. */
interface PlannedFetch {
  fetch: readonly AppFetch[];
  input: VendirPlanInput;
  plan: VendirPlan;
  refs: RefObjects;
  policy?: UrlPolicyChecker;
}

/**
 * Plans a fetch: the URL policy, vendir's config, and the Secrets and ConfigMaps it refers to,
 * read through `kube` (upstream `AddDir` and `ConfigBytes`). A user error (a missing Secret, a
 * refused git ref or URL, ...) comes back as the fetch's failed result.
 *
 * @throws on infrastructure failures (API reads)
 */
async function planFetch(
  fetch: readonly AppFetch[],
  namespace: string,
  deps: PipelineDeps,
  kube: KubeReader,
  mask: SecretMask,
): Promise<PlannedFetch | { result: StageResult }> {
  const policy = deps.config.urlPolicy ? new UrlPolicyChecker(deps.config.urlPolicy) : undefined;
  try {
    if (policy) await policy.checkFetch(fetch);
    const config = buildVendirConfig(fetch, { dangerousSkipTLSVerify: deps.config.dangerousSkipTLSVerify });
    const refNames = vendirResourceRefs(config);
    const refs = await readRefs(
      kube,
      namespace,
      refNames.filter((r) => r.kind === 'Secret').map((r) => r.name),
      refNames.filter((r) => r.kind === 'ConfigMap').map((r) => r.name),
      mask,
    );
    const input = { fetch, namespace, refs, dangerousSkipTLSVerify: deps.config.dangerousSkipTLSVerify };
    return { fetch, input, plan: planVendirSync(input), refs, ...(policy ? { policy } : {}) };
  } catch (err) {
    if (outcomeOf(err) !== 'user') throw err;
    // A refused URL is reported as vendir's own failure would be (`Fetching resources: `).
    const prefix = err instanceof UrlPolicyError ? FETCH_RUN_ERROR_PREFIX : '';
    return { result: resultFromError(err, prefix) };
  }
}

/**
 * Plans and runs vendir, and stores the tarball: shared by content digest, or sealed under
 * `scope` when the fetch uses a Secret (`fetchIsPrivate`). Planning errors (a missing Secret, a
 * refused git ref or URL, ...) end the fetch with their message before vendir starts.
 *
 * When vendir fails and the fetch has an `image` or `imgpkgBundle` source, it is retried as
 * upstream retries it (reference §3.6 step 4, for Apps and PackageRepositories alike): up to
 * {@link FETCH_RETRIES} times, {@link FETCH_RETRY_INTERVAL_MS} apart (`deps.sleep`), the config
 * is planned again from the Secrets and ConfigMaps as they are now (read past any memo of
 * `kube`: {@link freshReads}), and vendir runs again only when what it would be given (its
 * stdin) differs from the first try's: a placeholder Secret was filled by secretgen-controller
 * meanwhile. A success ends the retries; a planning error then ends the fetch with that error
 * over the last run's output (upstream `AttachErrorf("Fetching: %v")`).
 *
 * Two departures, in time only: upstream compares the whole marshalled objects, so any write to
 * a referenced object (a label, an annotation) re-runs vendir; here only what vendir reads
 * counts (name, type, data), as that is all it is given. And a fetch that refers to no Secret or
 * ConfigMap (and has no `refetch`) ends at once, where upstream waits 6 s for bytes that cannot
 * change. The waits end early when `signal` or the function deadline fires (the last failure is
 * then the result).
 *
 * @param app - the App
 * @param deps - runner, store, config, sleep
 * @param kube - reads the Secrets and ConfigMaps the fetch refers to
 * @param scope - the run's private scope; needed when the fetch uses a Secret (else it throws)
 * @param signal - the App was deleted (vendir is killed, no more tries)
 * @returns the stage result, the artifact key on success, tool time (ms) and run count over
 *   every try, `kept: true` when the tree was moved to `keepAt`, and `refreshed`
 * @throws on infrastructure failures (API reads, object store)
 */
export async function fetchWithVendir(
  app: App,
  deps: PipelineDeps,
  kube: ReturnType<PipelineDeps['clusters']['fetchView']>,
  scope: ReturnType<typeof scopeOf> | undefined,
  mask: SecretMask,
  signal: AbortSignal,
  opts: VendirFetchOptions = {},
): Promise<VendirFetch> {
  const ns = app.metadata.namespace ?? '';
  const first = await planFetch(app.spec.fetch ?? [], ns, deps, kube, mask);
  if ('result' in first) return { result: first.result, toolMs: 0, toolRuns: 0 };
  let tried = await vendirTry(first, deps, scope, mask, signal, opts.keepAt);
  const tools = { ms: tried.toolMs, runs: tried.toolRuns };
  const canChange = opts.refetch !== undefined || first.plan.extraDocuments.length > 0;
  if (!tried.retryable || !canChange || !hasImageOrImgpkgBundle(first.fetch)) return withoutFlag(tried, tools);
  const fresh = freshReads(kube);
  const stop = deps.deadline ? AbortSignal.any([signal, deps.deadline]) : signal;
  let refreshed = false;
  for (let i = 1; i <= FETCH_RETRIES && !stop.aborted; i++) {
    await sleepOf(deps)(FETCH_RETRY_INTERVAL_MS, stop);
    if (stop.aborted) break;
    const fetch = opts.refetch ? await opts.refetch() : first.fetch;
    const again = await planFetch(fetch, ns, deps, fresh, mask);
    if ('result' in again) {
      return { result: { ...tried.result, error: again.result.error }, toolMs: tools.ms, toolRuns: tools.runs };
    }
    const changed = again.plan.stdin !== first.plan.stdin;
    deps.log.info({ namespace: ns, name: app.metadata.name, retry: i, changed }, 'fetch retry check');
    if (!changed) continue;
    tried = await vendirTry(again, deps, scope, mask, signal, opts.keepAt);
    tools.ms += tried.toolMs;
    tools.runs += tried.toolRuns;
    refreshed = true;
    if (!tried.retryable) break;
  }
  return { ...withoutFlag(tried, tools), ...(refreshed ? { refreshed } : {}) };
}

/** A try's outcome as {@link fetchWithVendir} returns it: tool counts over every try. */
function withoutFlag(tried: VendirFetch & { retryable: boolean }, tools: { ms: number; runs: number }): VendirFetch {
  const { retryable: _, ...rest } = tried;
  return { ...rest, toolMs: tools.ms, toolRuns: tools.runs };
}

/**
 * One try of a planned fetch: downloads its http sources, runs vendir, packs and stores the
 * tree. `retryable` when the source failed (vendir, or an http download, which upstream's vendir
 * would have made), not when what it fetched was refused.
 */
async function vendirTry(
  planned: PlannedFetch,
  deps: PipelineDeps,
  scope: ReturnType<typeof scopeOf> | undefined,
  mask: SecretMask,
  signal: AbortSignal,
  keepAt: string | undefined,
): Promise<VendirFetch & { retryable: boolean }> {
  const { policy } = planned;
  const sealed = fetchIsPrivate(planned.fetch) ? scope : undefined;
  // Content made with a Secret is never stored in the fleet-wide cache.
  if (fetchIsPrivate(planned.fetch) && !sealed) throw new Error('a fetch that uses a Secret needs a private scope');
  const work = await makeScratch(deps, 'fetch');
  // http sources are downloaded and unpacked here, outside vendir's directory (see
  // ../fetch/http-source.ts), so vendir never unpacks an archive itself.
  const prep = await makeScratch(deps, 'fetch-http');
  try {
    const cc = deps.clusterConfig;
    const prepared = await prepareHttpSources({
      fetch: planned.fetch,
      refs: planned.refs,
      root: prep,
      // Under an enforced URL policy the cluster's proxy is not used (its address is the
      // tenant's choice and would be reached unchecked), as for the tools below.
      ...(cc?.caCerts || cc?.proxy
        ? { trust: { caCerts: cc.caCerts, proxy: policy?.policy.mode === 'enforce' ? undefined : cc.proxy } }
        : {}),
      downloader: deps.download,
      ...(policy ? { urlPolicy: policy } : {}),
      timeoutMs: deps.config.toolTimeoutMs,
      signal,
    });
    if ('result' in prepared) return { result: prepared.result, toolMs: 0, toolRuns: 0, retryable: true };
    const toRun =
      prepared.dirs.size > 0 ? planVendirSync({ ...planned.input, preparedHttp: prepared.dirs }) : planned.plan;
    // The cluster's kapp-controller-config: its CA bundle for every tool vendir runs, its proxy
    // unless the URL policy is enforced (then the egress proxy is the tools' only proxy).
    const enforced = policy?.policy.mode === 'enforce';
    const clusterEnv = {
      ...(cc?.caCerts ? await trustEnv(prep, cc.caCerts) : {}),
      ...(enforced ? {} : proxyEnv(cc?.proxy)),
    };
    const run = await deps.runner.run({
      cmd: toRun.command.bin,
      args: toRun.command.args,
      stdin: toRun.stdin,
      cwd: work,
      // Under an enforced URL policy git refuses submodule clones (their URLs are never checked).
      env: enforced
        ? { ...toRun.command.env, ...clusterEnv, ...GIT_SUBMODULE_LOCKDOWN_ENV }
        : { ...toRun.command.env, ...clusterEnv },
      // vendir writes the fetch directory and reads the unpacked http sources; it keeps no
      // cache (see vendirSyncCommand), so nothing of this run outlives it.
      writable: [work, prep],
      timeoutMs: deps.config.toolTimeoutMs,
      signal,
    });
    // Masked as soon as vendir returns, before anything cuts or copies its output.
    const result = mask.result(attachError(FETCH_RUN_ERROR_PREFIX, run));
    if (prepared.dirs.size > 0) result.stdout = restoreHttpLock(result.stdout, prepared.urls);
    if (result.error) return { result, toolMs: run.durationMs, toolRuns: 1, retryable: true };
    let packed: Awaited<ReturnType<typeof packDir>>;
    try {
      packed = await packDir(work);
    } catch (err) {
      // What vendir left is refused (a symlink out of the directory, too many files, ...):
      // a fetch failure in status rather than a stage that throws and is retried forever.
      if (!(err instanceof ArtifactError) || outcomeOf(err) !== 'user') throw err;
      const detail = err.path ? `${err.message}: ${JSON.stringify(err.path)}` : err.message;
      return {
        result: { ...resultFromError(new Error(detail), FETCH_RUN_ERROR_PREFIX), stdout: result.stdout },
        toolMs: run.durationMs,
        toolRuns: 1,
        retryable: false,
      };
    }
    let fetchKey: string;
    if (sealed) {
      const priv = privateArtifacts(deps);
      const key = await priv.keyFor(sealed, 'fetch', packed.sha256);
      // put, not putIfAbsent: each write restarts the expiry of the sealed artifact.
      await infraStep('storing the fetch artifact', () => priv.put(sealed, key, packed.tgz));
      fetchKey = key;
    } else {
      const key = fetchArtifactKey(packed.sha256);
      await infraStep('storing the fetch artifact', () => deps.store.putIfAbsent(key, packed.tgz));
      fetchKey = key;
    }
    const kept =
      keepAt !== undefined &&
      (await rename(work, keepAt).then(
        () => true,
        () => false, // the caller unpacks the stored artifact instead
      ));
    return { result, fetchKey, toolMs: run.durationMs, toolRuns: 1, retryable: false, ...(kept ? { kept } : {}) };
  } finally {
    await removeScratch(prep);
    await removeScratch(work);
  }
}

/**
 * Whether every source of `fetch` passes this runtime's URL policy (`true` without a policy).
 * A cached artifact (pinned fetch record, repository index) is served only when it does: the
 * cache is shared by the fleet, and a cluster with a stricter policy must not reuse content
 * another cluster was allowed to fetch. A refused source then runs the real fetch, which fails
 * with the policy's message.
 *
 * @throws what the policy check throws for reasons other than a refusal (infrastructure)
 */
export async function fetchPassesUrlPolicy(
  fetch: readonly AppFetch[],
  deps: Pick<PipelineDeps, 'config'>,
): Promise<boolean> {
  if (!deps.config.urlPolicy) return true;
  try {
    await new UrlPolicyChecker(deps.config.urlPolicy).checkFetch(fetch);
    return true;
  } catch (err) {
    if (outcomeOf(err) !== 'user') throw err;
    return false;
  }
}

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
  let fetched = usable ? await readPinned() : undefined;
  let cached = fetched !== undefined;
  if (!fetched) {
    // Deleting the App kills the fetch, as it kills kapp during a deploy; canceling does not
    // (only kapp is cancellable upstream, reference §3.10).
    const watch = watchForAbort(kube, frame.ref, ctx.ref.uid, deps, { abortOnCancel: false });
    const vendir = async (): Promise<FlightRun<Fetched>> => {
      let r: VendirFetch;
      try {
        r = await fetchWithVendir(app, deps, kube, scopeOf(ctx.ref), mask, watch.signal);
      } catch (err) {
        if (!watch.signal.aborted) throw err;
        r = { result: resultFromError(err), toolMs: 0, toolRuns: 0 };
      }
      tools = { runs: r.toolRuns, ms: r.toolMs };
      const done = { result: mask.result(r.result), fetchKey: r.fetchKey };
      // A deleted App's fetch leaves no record: its run ends stale, with no status. Nor does a
      // retry's with Secrets other than those `recordKey` was computed from (its next run has
      // the key of the Secrets it used).
      if (watch.signal.aborted || !recordKey || !r.fetchKey || r.refreshed) return { result: done, shared: false };
      const rec = JSON.stringify({ fetchKey: r.fetchKey, stdout: redactSecrets(done.result.stdout) });
      await infraStep('storing the fetch cache record', async () => {
        if (scope && priv) await priv.put(scope, recordKey, rec);
        else await deps.store.put(recordKey, rec);
      });
      return { result: done, shared: !scope };
    };
    let flight: FlightOutcome<Fetched, Fetched>;
    try {
      // A pinned shared fetch runs once for the fleet: the same request elsewhere waits for it.
      flight =
        usable && !scope
          ? await singleFlight(fleetFlight(deps, recordKey, ctx.run.runId, watch.signal), readPinned, vendir)
          : { kind: 'ran', result: (await vendir()).result, role: 'solo' };
    } finally {
      await watch.stop();
    }
    if (flight.kind === 'aborted' || watch.signal.aborted) {
      // The delete owns the App now: no fetch status for it.
      frame.done('stale', { tools });
      return {};
    }
    if (flight.kind === 'found') cached = true;
    fetched = flight.kind === 'found' ? flight.value : flight.result;
  }
  const { fetchKey } = fetched;
  // The hint is part of the fetch's stderr (app_fetch.go), hence of usefulErrorMessage too.
  const result = withCAHint(fetched.result);
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
