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
import { mkdir } from 'node:fs/promises';
import type { ObjectRef, StageRun, TemplateStageData } from '../../../events/schema.js';
import type { App, AppFetch, RefObjects } from '../api/index.js';
import { canonicalJson, fetchArtifactKey, sha256Hex } from '../artifact/keys.js';
import { ArtifactError, packDir } from '../artifact/tarball.js';
import { prepareHttpSources, restoreHttpLock } from '../fetch/http-source.js';
import { fetchSourceIdentity } from '../fetch/pinned.js';
import { GIT_SUBMODULE_LOCKDOWN_ENV, UrlPolicyChecker, UrlPolicyError } from '../fetch/url-policy.js';
import { buildVendirConfig, FETCH_RUN_ERROR_PREFIX, planVendirSync, vendirResourceRefs } from '../fetch/vendir.js';
import { readingRefsOnce } from '../kube/views.js';
import { KappControllerError } from '../reconcile/errors.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { attachError, redactSecrets, resultFromError, type StageResult } from '../reconcile/status.js';
import { fetchIsPrivate, PRIVATE_REUSE_MARGIN_MS, privateArtifacts, scopeOf } from './artifacts.js';
import {
  appRef,
  fetchPart,
  type LoadedApp,
  makeScratch,
  objectKey,
  readRefs,
  removeScratch,
  stageTimer,
  summarize,
  summarizeStatus,
  watchForAbort,
  writeAppStatus,
  writesImmediately,
} from './common.js';
import { type PipelineDeps, secretMaskOf } from './deps.js';
import { infraStep } from './retry-bound.js';

/** The object and run a stage works for (everything a hand-off event carries). */
export interface RunContext {
  clusterId: string;
  ref: ObjectRef;
  run: StageRun;
}

/** What a stage hands on: at most one of the next stage's inputs. */
export interface StageOutput {
  template?: TemplateStageData;
  deploy?: import('../../../events/schema.js').DeployStageData;
  delete?: RunContext;
}

/** Prefix of the keys that map a set of pinned sources to their fetch artifact. */
export const PINNED_FETCH_PREFIX = 'cache/fetch/sha256/';

/**
 * Identity of a whole `spec.fetch` when every entry is pinned, else `undefined`. Covers the
 * directory each entry lands in and the vendir version (a vendir upgrade may lay files out
 * differently). Inline entries without `pathsFrom` are pinned by their content.
 */
export function pinnedFetchIdentity(
  fetch: readonly AppFetch[],
  vendirVersion: string,
  credentials: Readonly<Record<string, string>> = {},
): string | undefined {
  if (fetch.length === 0) return undefined;
  const parts: unknown[] = [];
  for (const [i, entry] of fetch.entries()) {
    if (entry.inline) {
      if (entry.inline.pathsFrom?.length) return undefined;
      parts.push({ i, path: entry.path ?? null, inline: { ...(entry.inline.paths ?? {}) } });
      continue;
    }
    const id = fetchSourceIdentity(entry);
    if (!id?.pinned) return undefined;
    // The credentials are part of the identity: an App may reuse a private artifact only
    // with the same credentials that fetched it (upstream re-fetches with each App's own).
    const secret = fetchSecretName(entry);
    parts.push({ i, path: entry.path ?? null, id: id.cacheKey, cred: secret ? (credentials[secret] ?? '-') : null });
  }
  return sha256Hex(canonicalJson({ v: 1, vendir: vendirVersion, parts }));
}

/** The Secret holding a fetch entry's credentials, if it names one. */
export function fetchSecretName(entry: AppFetch): string | undefined {
  return (
    entry.git?.secretRef?.name ??
    entry.http?.secretRef?.name ??
    entry.image?.secretRef?.name ??
    entry.imgpkgBundle?.secretRef?.name ??
    entry.helmChart?.repository?.secretRef?.name ??
    undefined
  );
}

/**
 * Plans and runs vendir, and stores the tarball: shared by content digest, or, when `scope` is
 * given (a fetch that used a Secret), sealed under the cluster's private key. Planning errors (a
 * missing Secret, a refused git ref or URL, ...) end the fetch with their message before vendir
 * starts.
 *
 * @param app - the App
 * @param deps - runner, store, config
 * @param kube - reads the Secrets and ConfigMaps the fetch refers to
 * @param scope - the private scope when the fetch used a Secret
 * @returns the stage result, the artifact key on success, tool time (ms) and run count
 * @throws on infrastructure failures (API reads, object store)
 */
export async function fetchWithVendir(
  app: App,
  deps: PipelineDeps,
  kube: ReturnType<PipelineDeps['clusters']['fetchView']>,
  scope: ReturnType<typeof scopeOf> | undefined,
  mask: SecretMask,
  signal: AbortSignal,
): Promise<{ result: StageResult; fetchKey?: string; toolMs: number; toolRuns: number }> {
  const ns = app.metadata.namespace ?? '';
  const policy = deps.config.urlPolicy ? new UrlPolicyChecker(deps.config.urlPolicy) : undefined;
  let plan: ReturnType<typeof planVendirSync> & { input: Parameters<typeof planVendirSync>[0]; refs: RefObjects };
  try {
    if (policy) await policy.checkFetch(app.spec.fetch ?? []);
    const config = buildVendirConfig(app.spec.fetch ?? [], {
      dangerousSkipTLSVerify: deps.config.dangerousSkipTLSVerify,
    });
    const refNames = vendirResourceRefs(config);
    const refs = await readRefs(
      kube,
      ns,
      refNames.filter((r) => r.kind === 'Secret').map((r) => r.name),
      refNames.filter((r) => r.kind === 'ConfigMap').map((r) => r.name),
      mask,
    );
    const input = {
      fetch: app.spec.fetch ?? [],
      namespace: ns,
      refs,
      dangerousSkipTLSVerify: deps.config.dangerousSkipTLSVerify,
      cacheDir: `${deps.config.tmpRoot}/vendir-cache/apps/${app.metadata.uid}`,
    };
    plan = { ...planVendirSync(input), input, refs };
  } catch (err) {
    if (err instanceof UrlPolicyError) {
      return { result: resultFromError(err, FETCH_RUN_ERROR_PREFIX), toolMs: 0, toolRuns: 0 };
    }
    if (err instanceof KappControllerError) return { result: resultFromError(err), toolMs: 0, toolRuns: 0 };
    throw err;
  }
  const work = await makeScratch(deps, 'fetch');
  // http sources are downloaded and unpacked here, outside vendir's directory (see
  // ../fetch/http-source.ts), so vendir never unpacks an archive itself.
  const prep = await makeScratch(deps, 'fetch-http');
  try {
    const cacheDir = plan.command.env.VENDIR_CACHE_DIR;
    if (cacheDir) await mkdir(cacheDir, { recursive: true });
    const prepared = await prepareHttpSources({
      fetch: app.spec.fetch ?? [],
      refs: plan.refs,
      root: prep,
      downloader: deps.download,
      ...(policy ? { urlPolicy: policy } : {}),
      timeoutMs: deps.config.toolTimeoutMs,
      signal,
    });
    if ('result' in prepared) return { result: prepared.result, toolMs: 0, toolRuns: 0 };
    const toRun = prepared.dirs.size > 0 ? planVendirSync({ ...plan.input, preparedHttp: prepared.dirs }) : plan;
    const run = await deps.runner.run({
      cmd: toRun.command.bin,
      args: toRun.command.args,
      stdin: toRun.stdin,
      cwd: work,
      // Under an enforced URL policy git refuses submodule clones (their URLs are never checked).
      env:
        policy?.policy.mode === 'enforce' ? { ...toRun.command.env, ...GIT_SUBMODULE_LOCKDOWN_ENV } : toRun.command.env,
      // vendir writes the fetch directory and its cache, and reads the unpacked http sources.
      writable: cacheDir ? [work, prep, cacheDir] : [work, prep],
      timeoutMs: deps.config.toolTimeoutMs,
      signal,
    });
    // Masked as soon as vendir returns, before anything cuts or copies its output.
    const result = mask.result(attachError(FETCH_RUN_ERROR_PREFIX, run));
    if (prepared.dirs.size > 0) result.stdout = restoreHttpLock(result.stdout, prepared.urls);
    if (result.error) return { result, toolMs: run.durationMs, toolRuns: 1 };
    let packed: Awaited<ReturnType<typeof packDir>>;
    try {
      packed = await packDir(work);
    } catch (err) {
      // What vendir left is refused (a symlink out of the directory, too many files, ...):
      // a fetch failure in status rather than a stage that throws and is retried forever.
      if (!(err instanceof ArtifactError) || err.code === 'io') throw err;
      const detail = err.path ? `${err.message}: ${JSON.stringify(err.path)}` : err.message;
      return {
        result: { ...resultFromError(new Error(detail), FETCH_RUN_ERROR_PREFIX), stdout: result.stdout },
        toolMs: run.durationMs,
        toolRuns: 1,
      };
    }
    let fetchKey: string;
    if (scope) {
      const priv = privateArtifacts(deps);
      const key = await priv.keyFor(scope, 'fetch', packed.sha256);
      // put, not putIfAbsent: each write restarts the expiry of the sealed artifact.
      await infraStep('storing the fetch artifact', () => priv.put(scope, key, packed.tgz));
      fetchKey = key;
    } else {
      const key = fetchArtifactKey(packed.sha256);
      await infraStep('storing the fetch artifact', () => deps.store.putIfAbsent(key, packed.tgz));
      fetchKey = key;
    }
    return { result, fetchKey, toolMs: run.durationMs, toolRuns: 1 };
  } finally {
    await removeScratch(prep);
    await removeScratch(work);
  }
}

/**
 * Runs the fetch stage for a run the reconcile step started.
 *
 * @returns the template stage's input on success; nothing after a failure (the final status
 *   is written here) or when the run went stale.
 * @throws on infrastructure failures (API, object store): the transport retries the event.
 */
export async function runFetch(ctx: RunContext, loaded: LoadedApp, deps: PipelineDeps): Promise<StageOutput> {
  const { app } = loaded;
  // The credential digests and vendir read the same Secrets: one read each per run.
  const kube = readingRefsOnce(deps.clusters.fetchView(ctx.clusterId));
  const kref = appRef(ctx.ref);
  const fence = { uid: ctx.ref.uid, generation: ctx.run.generation };
  const done = stageTimer(deps, 'fetch', objectKey(ctx.ref), ctx.run.generation);
  const startedAt = deps.now();

  let fetchKey: string | undefined;
  let result: StageResult | undefined;
  let tools = { runs: 0, ms: 0 };
  const fetchSpec = app.spec.fetch ?? [];
  const secretNames = fetchSpec.map(fetchSecretName).filter((n): n is string => Boolean(n));
  const credentials: Record<string, string> = {};
  const mask = secretMaskOf(deps);
  if (secretNames.length) {
    const refs = await readRefs(kube, app.metadata.namespace ?? '', secretNames, [], mask);
    for (const n of secretNames) credentials[n] = refs.digests[`secret/${n}`] ?? '-';
  }
  const pinned = pinnedFetchIdentity(fetchSpec, deps.config.toolVersions.vendir ?? '', credentials);
  // A fetch that used a Secret (credentials of a private source, inline pathsFrom Secrets) is
  // private: sealed for this cluster and namespace, never in the fleet-wide cache.
  const scope = fetchIsPrivate(fetchSpec) ? scopeOf(ctx.ref) : undefined;
  const priv = scope ? privateArtifacts(deps) : undefined;
  const recordKey = pinned
    ? scope && priv
      ? await priv.keyFor(scope, 'fetch-cache', pinned)
      : `${PINNED_FETCH_PREFIX}${pinned}.json`
    : undefined;
  if (recordKey) {
    const hit = await infraStep('reading the fetch cache', () =>
      scope && priv ? priv.get(scope, recordKey, PRIVATE_REUSE_MARGIN_MS) : deps.store.get(recordKey),
    );
    if (hit) {
      const rec = JSON.parse(hit.toString('utf8')) as { fetchKey?: string; stdout?: string };
      if (rec.fetchKey && (await infraStep('reading the fetch cache', () => deps.store.head(rec.fetchKey!)))) {
        fetchKey = rec.fetchKey;
        // vendir's lock config of the fetch that made the artifact: status.fetch.stdout as upstream.
        result = { stdout: rec.stdout ?? '', stderr: '', exitCode: 0, finished: true };
      }
    }
  }
  const cached = fetchKey !== undefined;
  if (!cached) {
    // Deleting (or canceling) the App kills the fetch, as it kills kapp during a deploy.
    const watch = watchForAbort(kube, kref, ctx.ref.uid, deps);
    let r: Awaited<ReturnType<typeof fetchWithVendir>>;
    try {
      r = await fetchWithVendir(app, deps, kube, scope, mask, watch.signal);
    } catch (err) {
      if (!watch.signal.aborted) throw err;
      r = { result: resultFromError(err), toolMs: 0, toolRuns: 0 };
    } finally {
      await watch.stop();
    }
    if (watch.signal.aborted) {
      // The delete (or the canceled spec's run) owns the App now: no fetch status for it.
      done('stale', { tools: { runs: r.toolRuns, ms: r.toolMs } });
      return {};
    }
    result = mask.result(r.result);
    fetchKey = r.fetchKey;
    tools = { runs: r.toolRuns, ms: r.toolMs };
    if (recordKey && fetchKey) {
      const rec = JSON.stringify({ fetchKey, stdout: redactSecrets(result.stdout) });
      await infraStep('storing the fetch cache record', async () => {
        if (scope && priv) await priv.put(scope, recordKey, rec);
        else await deps.store.put(recordKey, rec);
      });
    }
  }
  const part = fetchPart(result!, startedAt, deps.now());
  if (result!.error || !fetchKey) {
    const w = await writeAppStatus(
      kube,
      kref,
      fence,
      (cur) => summarizeStatus(cur, ctx.run.generation, { fetch: part }, result),
      mask,
    );
    done(w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : 'failed', {
      error: result!.error && mask.redact(result!.error),
      tools,
    });
    return {};
  }
  if (writesImmediately(app.status)) {
    const w = await writeAppStatus(
      kube,
      kref,
      fence,
      (cur) => summarizeStatus(cur, ctx.run.generation, { fetch: part }),
      mask,
    );
    if (w.outcome === 'stale' || w.outcome === 'gone') {
      done(w.outcome, { tools });
      return {};
    }
  }
  done(cached ? 'cached' : 'succeeded', { tools });
  return {
    template: { object: ctx.ref, run: ctx.run, artifacts: { fetchKey }, fetchStatus: summarize(part) },
  };
}
