/**
 * The fetch run (upstream `pkg/fetch`, which `pkg/app/app_fetch.go` delegates to): plan vendir's
 * config under the URL policy from the Secrets and ConfigMaps the fetch names, download its http
 * sources, run `vendir sync` in a scratch directory, pack the tree and store it (shared by
 * content digest, or sealed for the run's cluster when the fetch uses a Secret), and retry as
 * upstream retries an image or imgpkgBundle fetch. The planner is `./vendir.ts`; the fetch stage
 * (`../pipeline/app/fetch.ts`) and the index-repo function (`../pipeline/repo/index-repo.ts`) decide when
 * to run it, the fetch cache and what the result means for their object.
 *
 * @module
 */
import { rename } from 'node:fs/promises';
import { setTimeout as sleepFor } from 'node:timers/promises';
import { type App, type AppFetch, fetchIsPrivate, type RefObjects } from '../api/index.js';
import { fetchArtifactKey } from '../artifact/keys.js';
import { type ArtifactScope, type PrivateArtifactsDeps, privateArtifacts } from '../artifact/sealed.js';
import { ArtifactError, type PackedDir, packDir, tarSha256 } from '../artifact/tarball.js';
import type { CommandRunner } from '../exec/runner.js';
import { makeScratch, removeScratch } from '../exec/scratch.js';
import type { FetchView, KubeReader } from '../kube/port.js';
import { freshReads } from '../kube/views.js';
import type { Logger } from '../log.js';
import type { ClusterControllerConfig } from '../reconcile/controller-config.js';
import { infraStep } from '../reconcile/infra-step.js';
import { attachError, outcomeOf, resultFromError, type StageResult } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { absentIfUnreadable } from '../store/port.js';
import { proxyEnv, trustEnv } from './cluster-trust.js';
import type { HttpDownloader } from './http-download.js';
import { prepareHttpSources, restoreHttpLock } from './http-source.js';
import { DEFAULT_MAX_INLINE_BYTES, readRefsWithinLimit } from './inline-limit.js';
import type { StallRule } from './stall.js';
import { GIT_SUBMODULE_LOCKDOWN_ENV, type UrlPolicy, UrlPolicyChecker, UrlPolicyError } from './url-policy.js';
import {
  buildVendirConfig,
  FETCH_RUN_ERROR_PREFIX,
  hasImageOrImgpkgBundle,
  planVendirSync,
  type VendirPlan,
  type VendirPlanInput,
  vendirResourceRefs,
} from './vendir.js';

/**
 * What a fetch run uses of the stage's dependencies (a `PipelineDeps` fits): narrow, so that
 * this module does not import the pipeline.
 */
export interface FetchRunDeps extends PrivateArtifactsDeps {
  /** The one command runner (allow-listed tools). */
  runner: CommandRunner;
  /** Downloads `http` sources. Default: the http-source module's own downloader. */
  download?: HttpDownloader;
  /** The cluster's `kapp-controller-config`: its CA bundle and proxy reach the tools. */
  clusterConfig?: ClusterControllerConfig;
  /** The function deadline: the retry waits end when it fires. */
  deadline?: AbortSignal;
  /** Waits between retry checks, or less when the signal fires. Default: a timer. */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  log: Logger;
  config: PrivateArtifactsDeps['config'] & {
    /** Where scratch directories are made. */
    tmpRoot: string;
    /** `dangerousSkipTLSVerify` of `kapp-controller-config`: comma-separated hosts. */
    dangerousSkipTLSVerify?: string;
    /** Kill a tool after this long, ms. Default: the runner's default. */
    toolTimeoutMs?: number;
    /** The runtime's URL policy, checked before anything is fetched. Absent: none. */
    urlPolicy?: UrlPolicy;
    /**
     * Cap on an App's inline content (`paths` and `pathsFrom`), bytes. Default
     * `DEFAULT_MAX_INLINE_BYTES` (64 MiB) of `./inline-limit.ts`.
     */
    maxInlineBytes?: number;
    /**
     * The progress rule of the fetch's http downloads (`./stall.ts`; the tools' connections
     * get it at the egress proxy). Default `DEFAULT_STALL_RULE` (4 KiB in 60 s).
     */
    fetchStall?: StallRule;
  };
}

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
   * placeholder Secret in the fetch only once the Secret holds credentials (`../pipeline/repo/repo-placeholder.ts`),
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
  /**
   * The shared artifact's entity tag as this fetch stored or verified it (`ObjectStore.head`'s
   * `etag`), when {@link fetchKey} is a shared key and the store reports one: a record naming
   * the key keeps it, so that a later replacement of the object reads as a miss.
   */
  fetchEtag?: string;
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
 * read through `kube` one at a time under the inline cap (upstream `AddDir` and `ConfigBytes`;
 * the cap is ours, `./inline-limit.ts`). A user error (a missing Secret, a refused git ref or
 * URL, inline content over the cap, ...) comes back as the fetch's failed result.
 *
 * @throws on infrastructure failures (API reads)
 */
async function planFetch(
  fetch: readonly AppFetch[],
  namespace: string,
  deps: FetchRunDeps,
  kube: KubeReader,
  mask: SecretMask,
): Promise<PlannedFetch | { result: StageResult }> {
  const policy = deps.config.urlPolicy ? new UrlPolicyChecker(deps.config.urlPolicy) : undefined;
  try {
    if (policy) await policy.checkFetch(fetch);
    const config = buildVendirConfig(fetch, { dangerousSkipTLSVerify: deps.config.dangerousSkipTLSVerify });
    // One object at a time under the inline cap: an App over it fails before vendir runs.
    const maxInline = deps.config.maxInlineBytes ?? DEFAULT_MAX_INLINE_BYTES;
    const refs = await readRefsWithinLimit(kube, namespace, config, vendirResourceRefs(config), maxInline, mask);
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
  deps: FetchRunDeps,
  kube: FetchView,
  scope: ArtifactScope | undefined,
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
  deps: FetchRunDeps,
  scope: ArtifactScope | undefined,
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
  // ./http-source.ts), so vendir never unpacks an archive itself.
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
      ...(deps.config.fetchStall ? { stall: deps.config.fetchStall } : {}),
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
    const { key: fetchKey, etag } = sealed
      ? { key: await storeSealed(deps, sealed, packed) }
      : await storeShared(deps, fetchArtifactKey(packed.sha256), packed, scope);
    const kept =
      keepAt !== undefined &&
      (await rename(work, keepAt).then(
        () => true,
        () => false, // the caller unpacks the stored artifact instead
      ));
    return {
      result,
      fetchKey,
      ...(etag !== undefined ? { fetchEtag: etag } : {}),
      toolMs: run.durationMs,
      toolRuns: 1,
      retryable: false,
      ...(kept ? { kept } : {}),
    };
  } finally {
    await removeScratch(prep);
    await removeScratch(work);
  }
}

/** Stores a packed fetch sealed for `scope` (`put`, not `putIfAbsent`: each write restarts its expiry). */
async function storeSealed(deps: FetchRunDeps, scope: ArtifactScope, packed: PackedDir): Promise<string> {
  const priv = privateArtifacts(deps);
  const key = await priv.keyFor(scope, 'fetch', packed.sha256);
  await infraStep('storing the fetch artifact', () => priv.put(scope, key, packed.tgz));
  return key;
}

/**
 * Stores a packed fetch under its shared key `key`, unless it is there already. What is there
 * is not trusted: any run of the fleet may write the shared prefixes, so an existing object is
 * read back and must be the same tar stream (the same bytes, or another gzip of them); one that
 * is not (or is over the store's read bound, or is gone) was replaced (tampering, logged) and
 * the run keeps its own copy sealed for `scope`, whose key it hands on. So a run of another
 * cluster can cost this one a private copy, never the content nor the fetch. The shared
 * object's entity tag, as created (a HEAD after the write) or as verified (the read back's),
 * goes with the key: the pinned fetch's record keeps it (`../pipeline/app/fetch.ts`). An object
 * this process created or verified is checked again by a HEAD only, while its entity tag is the
 * same.
 * @returns the key the fetch is stored under (`key`, or the sealed copy's) and, for `key`, its
 *   entity tag when the store reports one.
 * @throws Error when the shared object is bad and there is no scope to seal a copy for.
 */
async function storeShared(
  deps: FetchRunDeps,
  key: string,
  packed: PackedDir,
  scope: ArtifactScope | undefined,
): Promise<{ key: string; etag?: string }> {
  const verified = verifiedShared(deps.store);
  const put = await infraStep('storing the fetch artifact', () => deps.store.putIfAbsent(key, packed.tgz));
  if (put === 'created') {
    const etag = (await infraStep('reading the fetch artifact back', () => deps.store.head(key)))?.etag;
    if (etag !== undefined) remember(verified, key, etag);
    return etag !== undefined ? { key, etag } : { key };
  }
  // Verified before by this process under the entity tag it still has: the same object (a
  // replacement has another tag), so no download (every resync of an App on a moving source).
  const seen = verified.get(key);
  if (seen !== undefined) {
    const head = await infraStep('reading the fetch artifact back', () => deps.store.head(key));
    if (head?.etag === seen) return { key, etag: seen };
  }
  // Over the read bound: planted (any run of the fleet may write the key), so not intact.
  const there = await infraStep('reading the fetch artifact back', () =>
    absentIfUnreadable(() => deps.store.getVersioned(key)),
  );
  const intact =
    there !== undefined &&
    (there.body.equals(packed.tgz) || (await tarSha256(there.body).catch(() => undefined)) === packed.sha256);
  if (intact && there.etag) remember(verified, key, there.etag);
  if (intact) return there.etag ? { key, etag: there.etag } : { key };
  deps.log.warn({ key }, 'shared artifact does not match the digest its key names: tampered, not used');
  if (!scope) throw new Error(`the shared fetch artifact ${key} was tampered with, and the fetch has no private scope`);
  return { key: await storeSealed(deps, scope, packed) };
}

/** Most shared fetch artifacts {@link verifiedShared} remembers per store; the oldest goes first. */
const MAX_VERIFIED_SHARED = 1024;

/** Per store: the shared fetch artifacts this process verified (key → the entity tag it read). */
const VERIFIED_SHARED = new WeakMap<object, Map<string, string>>();

/** The verified shared artifacts of `store` ({@link storeShared}); per store, so no test or store trusts another's. */
function verifiedShared(store: object): Map<string, string> {
  let map = VERIFIED_SHARED.get(store);
  if (!map) {
    map = new Map();
    VERIFIED_SHARED.set(store, map);
  }
  return map;
}

/** Records `key` verified under `etag`, dropping the oldest entry past {@link MAX_VERIFIED_SHARED}. */
function remember(verified: Map<string, string>, key: string, etag: string): void {
  verified.delete(key);
  verified.set(key, etag);
  if (verified.size > MAX_VERIFIED_SHARED) verified.delete(verified.keys().next().value as string);
}

/** `deps.sleep`, or an abortable timer when the caller gave none. */
function sleepOf(deps: Pick<FetchRunDeps, 'sleep'>): (ms: number, signal?: AbortSignal) => Promise<void> {
  return (
    deps.sleep ??
    (async (ms, signal) => {
      await sleepFor(ms, undefined, signal ? { signal } : {}).catch(() => undefined);
    })
  );
}
