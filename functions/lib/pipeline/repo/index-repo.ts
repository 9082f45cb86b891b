/**
 * The index-repo function (kapp-controller `pkg/pkgrepository/*`, reference §2.2, §3.12): one
 * invocation reconciles one PackageRepository — fetch, template and deploy in a row, as its
 * in-memory App does upstream (`NewPackageRepoApp`), on the shared stage frame (`../stage.ts`).
 *
 * Order (`pkg/pkgrepository/app_reconcile.go` `Reconcile`): **paused** first (observedGeneration
 * and `Paused`; paused takes precedence over deletion), then **deletion** (`kapp delete
 * <name>.pkgr`, then the finalizers go), then **forced or due** by the PackageRepository timer
 * (10m default, ≤30s becomes 30s), else a no-op.
 *
 * - Fetch: vendir with the single entry `[spec.fetch]` into directory `0`, through the App
 *   fetch (`fetchWithVendir`: URL policy, http sources, Secret reads and masking, and the retry
 *   that waits for the placeholder Secret to be filled, as upstream's); the fetched
 *   tree is stored by digest (shared by every cluster that fetches the same content) and
 *   unpacked again for the template.
 * - Template: the fixed repository pipeline `templateRepository` (`../../packaging/repo-template.ts`).
 * - Deploy: the finalizer, then `kapp deploy` of `<name>.pkgr`, `--wait=false`, as the
 *   ServiceAccount `kapp-lambda-pkgr` of the runtime's namespace (a TokenRequest token; its RBAC
 *   covers Packages, PackageMetadatas and kapp's ConfigMaps only; upstream: the controller's own
 *   ServiceAccount); `status.deploy` without `associatedResources`, and no inspect.
 *
 * @module
 */
import path from 'node:path';
import type { ObjectEvent, ObjectEventData, ObjectRef, RepoIndexedEvent } from '../../../../events/schema.js';
import {
  type App,
  type AppStatus,
  Finalizer,
  type PackageRepository,
  parsePackageRepository,
} from '../../api/index.js';
import { wantsPlaceholder } from '../../api/refs.js';
import {
  BLOCKING_FOR_DEPLOY_PREFIX,
  KAPP_ERROR_PREFIX,
  legacyKappAppName,
  PKGR_SUFFIX,
  packageRepositoryDeleteCommand,
  packageRepositoryDeployCommand,
  packageRepositoryKapp,
} from '../../deploy/kapp.js';
import { pkgrDeleteBlocker } from '../../deploy/kapp-legacy.js';
import { plantedKappRecord } from '../../deploy/kapp-record.js';
import { pkgrAdmissionProblem } from '../../deploy/pkgr-admission.js';
import { type KappProgress, packageRepositoryKubeconfig, runKapp } from '../../deploy/run.js';
import { fetchWithVendir } from '../../fetch/run.js';
import {
  APP_API_VERSION,
  type DeployView,
  type KubeObject,
  PACKAGING_API_VERSION,
  type ResourceRef,
} from '../../kube/port.js';
import type { StatusWriteResult } from '../../kube/status-write.js';
import { freshReads } from '../../kube/views.js';
import { type RepoIndexHit, type RepoVersions, withRepositoryRef } from '../../packaging/repo-index.js';
import { templateRepository as defaultTemplateRepository } from '../../packaging/repo-template.js';
import { type AbortWatch, watchForAbort } from '../../reconcile/abort-watch.js';
import { DEFAULT_CONTROLLER_CONFIG_NAMESPACE } from '../../reconcile/controller-config.js';
import {
  attachError,
  KappControllerError,
  resultFromError,
  type StageResult,
  withFriendlyYAMLStrings,
} from '../../reconcile/result.js';
import type { SecretMask } from '../../reconcile/secret-mask.js';
import {
  deployStatus,
  fetchPart,
  markPausedOrCanceled,
  markReconciling,
  type RunParts,
  summarizeStatus,
  templatePart,
} from '../../reconcile/status.js';
import { isReadyAt } from '../../reconcile/timer.js';
import { scopeOf, unpackArtifact } from '../artifacts.js';
import type { IndexRepoDeps } from '../deps.js';
import { invalidAppStatus, writeAppStatus } from '../report.js';
import { infraStep } from '../retry-bound.js';
import { closeDelete, type OpenedRun, openDelete, openRun } from '../run.js';
import {
  leaveSource,
  memberDeployed,
  memberIndexed,
  polledSourceOf,
  type TrackedSource,
  trackSource,
} from '../source-poll.js';
import { closeStage, openStage, parsedReads, type StageFrame, type StageKind } from '../stage.js';
import { makeScratch, removeScratch } from '../stage-inputs.js';
import {
  cachedResult,
  findFetchedIndex,
  findPinnedIndex,
  indexDigestOf,
  planRepoIndex,
  type RepoIndexPlan,
  storeIndex,
} from './index-repo-cache.js';
import { announceRepoChanges, type DeployedVersions } from './index-repo-changes.js';
import { refChangeMatters, withFilledPlaceholder, withRepoPlaceholder } from './repo-placeholder.js';

/** The PackageRepository as read, raw (for status writes) and parsed (for decisions). */
export interface LoadedRepo {
  raw: KubeObject;
  pkgr: PackageRepository;
}

/** The Kubernetes reference of the PackageRepository an event refers to. */
export function packageRepositoryRef(ref: Pick<ObjectRef, 'namespace' | 'name'>): ResourceRef {
  return { apiVersion: PACKAGING_API_VERSION, kind: 'PackageRepository', namespace: ref.namespace, name: ref.name };
}

/**
 * The PackageRepository as a {@link StageKind}: read with `parsePackageRepository`, held by
 * `spec.paused` (it has no `canceled`). Its status is the App status without `inspect`, so the
 * App status write and bounds serve it.
 */
export const PKGR_KIND: StageKind<LoadedRepo> = {
  ref: packageRepositoryRef,
  ...parsedReads(parsePackageRepository, (raw, pkgr) => ({ raw, pkgr })),
  held: ({ pkgr }) => Boolean(pkgr.spec.paused),
  markHeld: (status, generation) => markPausedOrCanceled(status, generation, 'PackageRepository'),
  status: ({ pkgr }) => pkgr.status as AppStatus | undefined,
  invalid: invalidAppStatus,
  finalizers: [Finalizer.PackageRepository, Finalizer.PackageRepositoryLegacy],
  holdsDelete: true,
  due: async ({ loaded: { pkgr }, reason, specChanged, kube, soon }) => {
    const forced =
      specChanged ||
      reason === 'added' ||
      // A polled source's ref-changed is the fleet poll's poke (a new digest): always a run. Otherwise
      // it is a Secret change, which matters unless it is the placeholder still unfilled.
      (reason === 'ref-changed' &&
        (polledSourceOf(pkgr.spec.fetch) !== undefined || (await refChangeMatters(pkgr, kube))));
    return forced || isReadyAt(pkgr, soon, { kind: 'PackageRepository' });
  },
  // Written while the run plans and fetches, and awaited before anything else is written or
  // deployed (`reconcileRepository`): no second GET of a repository that may hold ~1 MB inline.
  reconciling: { mark: (status, generation) => markReconciling(status, generation), alongside: true },
  deleteEventText: (result, mask) => mask.redact(result.error ?? ''),
  write: (kube, ref, fence, mutate, mask, read) => writeAppStatus(kube, ref, fence, mutate, mask, read),
};

/** The in-memory App upstream builds for a PackageRepository (`NewPackageRepoApp`); never stored. */
export function packageRepositoryApp(pkgr: PackageRepository): App {
  return {
    apiVersion: APP_API_VERSION,
    kind: 'App',
    metadata: pkgr.metadata,
    spec: {
      fetch: [pkgr.spec.fetch],
      template: [],
      deploy: [{ kapp: packageRepositoryKapp() }],
      ...(pkgr.spec.paused ? { paused: true } : {}),
    },
  } as App;
}

/**
 * The kapp progress callback of a repository's deploy or delete: `status.deploy` as kapp runs
 * (a PackageRepository's status is the App status without `inspect`, so the App write serves).
 */
function deployProgress(
  kube: DeployView,
  ref: ResourceRef,
  fence: { uid: string; generation: number },
  mask: SecretMask,
  startedAt: Date,
  deps: Pick<IndexRepoDeps, 'now'>,
  phase: 'deploy' | 'delete',
) {
  return async (tick: KappProgress): Promise<void> => {
    const { stdout, stderr } = tick;
    const progress = deployStatus(mask.result({ stdout, stderr, exitCode: 0, finished: false }), {
      startedAt,
      updatedAt: deps.now(),
    });
    // Planned on the object kapp's poll has just read: one GET per tick of a repository that
    // may hold ~1 MB inline, not two.
    await writeAppStatus(
      kube,
      ref,
      fence,
      (cur) => {
        const next = summarizeStatus(cur, fence.generation, { deploy: progress });
        // A deploy's progress says `Reconciling` as upstream's every sync does by now: a resync
        // wrote none at its start. A delete's keeps its `Deleting`.
        return phase === 'deploy' ? markReconciling(next, fence.generation) : next;
      },
      mask,
      'live' in tick ? { object: tick.live } : undefined,
    );
  };
}

/**
 * Handles an object event for a PackageRepository (the index-repo function's entry point). The
 * reconcile happens in this one invocation; what is handed on is the `repo.indexed` event of a
 * successful deploy or delete that added or removed versions (`./index-repo-changes.ts`), for
 * the install function.
 *
 * @returns that event, or `undefined`.
 * @throws KubeApiError / StoreError on infrastructure failures: the transport retries the event.
 */
export async function runIndexRepo(event: ObjectEvent, deps: IndexRepoDeps): Promise<RepoIndexedEvent | undefined> {
  const opened = await openRun(deps, {
    stage: 'reconcile',
    event: event.data,
    view: (id) => deps.clusters.deployView(id),
    kind: PKGR_KIND,
  });
  if (opened.state === 'deleting') return await deleteRepository(event.data, opened.run, deps);
  if (opened.state !== 'run') return;
  const { run, reconciling } = opened;
  const stage = await openStage(deps, {
    stage: 'index-repo',
    object: run.object,
    generation: run.fence.generation,
    view: () => run.kube,
    kind: PKGR_KIND,
    loaded: run.loaded,
    runStartedAt: run.startedAt.toISOString(),
  });
  if (stage.stop) {
    await reconciling;
    return;
  }
  return await reconcileRepository(stage.frame, deps, reconciling);
}

/** One repository run: what its steps share (they add to `parts` and `tools` as they go). */
interface RepoRun {
  /** The open stage (the PackageRepository as read, its deploy view, mask and log line). */
  frame: StageFrame<DeployView, LoadedRepo>;
  deps: IndexRepoDeps;
  /** The `Reconciling` write, awaited once the fetch is done ({@link reconcilingEnded}). */
  reconciling: Promise<StatusWriteResult> | undefined;
  /** The fleet's polled source this repository follows, when its fetch is a tag or branch. */
  tracked: TrackedSource | undefined;
  /** The repository as fetched: pinned to the fleet's digest when tracked, before the placeholder. */
  polled: PackageRepository;
  /** The in-memory App of the repository (`NewPackageRepoApp`), the placeholder read. */
  app: App;
  /** Where the index of this fetch is cached, when it may be shared. */
  index: RepoIndexPlan | undefined;
  /** Fires when the PackageRepository is deleted: the tools are killed. */
  watch: AbortWatch;
  /** The run's scratch directory. */
  work: string;
  /** The run's parts so far. */
  parts: RunParts;
  /** Tool runs and time, for the log line. */
  tools: { runs: number; ms: number };
}

/** What the fetch step hands the template: the pinned index found, or the fetched artifact. */
interface RepoFetched {
  /** The index of the pinned source, already stored: no fetch ran. */
  pinnedHit?: RepoIndexHit;
  /** The fetched artifact, when vendir ran. */
  fetchKey?: string;
  /** vendir's lock config of the fetch (`''` for a pinned hit). */
  fetchStdout: string;
  /** vendir's own directory was kept in the scratch ({@link renderRepository}). */
  treeKept: boolean;
}

/** What the template step hands the deploy. */
interface RepoTemplated {
  /** The manifest kapp deploys. */
  manifest: string;
  /** The versions it deploys (`./index-repo-changes.ts`). */
  deployedVersions: DeployedVersions;
  /** The index being stored while kapp deploys (a rendered index only). */
  stored?: Promise<unknown>;
  /** This run pokes the source's members once its index is stored (it rendered a new digest). */
  pokesWhenIndexed: boolean;
}

/**
 * Fetch, template and deploy of one run, as ordered steps ({@link fetchRepository},
 * {@link templateOrReuseIndex}, {@link deployAndAnnounce}); writes the final status through
 * `closeStage`.
 * @returns the `repo.indexed` event of a successful deploy that changed versions.
 */
async function reconcileRepository(
  frame: StageFrame<DeployView, LoadedRepo>,
  deps: IndexRepoDeps,
  reconciling: Promise<StatusWriteResult> | undefined,
): Promise<RepoIndexedEvent | undefined> {
  const { kube, object } = frame;
  // A tag or branch polled for the fleet is fetched pinned to the digest the fleet resolved
  // (`../source-poll.ts`), so an indexed digest runs kapp only.
  const tracked = await infraStep('tracking the repository source', () => trackSource(frame.loaded.pkgr, object, deps));
  const polled = tracked
    ? { ...frame.loaded.pkgr, spec: { ...frame.loaded.pkgr.spec, fetch: tracked.fetch } }
    : frame.loaded.pkgr;
  // §3.12 step 2: the placeholder Secret, and the fetch as it reads it (`./repo-placeholder.ts`).
  const pkgr = await withRepoPlaceholder(polled, object.clusterId, kube, deps);
  const app = packageRepositoryApp(pkgr);
  // Deleting the PackageRepository kills the tools, as it kills kapp during a deploy.
  const watch = watchForAbort(kube, frame.ref, object.uid, deps);
  const work = await makeScratch(deps, 'index-repo');
  try {
    const index = await planRepoIndex(pkgr, object, deps);
    const tools = { runs: 0, ms: 0 };
    const run: RepoRun = { frame, deps, reconciling, tracked, polled, app, index, watch, work, parts: {}, tools };
    const fetched = await fetchRepository(run);
    if (!fetched || (await reconcilingEnded(run))) return;
    const templated = await templateOrReuseIndex(run, fetched);
    if (!templated) return;
    return await deployAndAnnounce(run, fetched, templated);
  } finally {
    await watch.stop();
    await removeScratch(work);
  }
}

/** Closes the run with its final status. */
async function closeRepository(run: RepoRun, result: StageResult): Promise<void> {
  await closeStage(run.frame, { parts: run.parts, result, last: true, success: 'succeeded', tools: run.tools });
}

/** Awaits the `Reconciling` write; true (the run ended) when the object went or changed meanwhile. */
async function reconcilingEnded(run: RepoRun): Promise<boolean> {
  const w = await run.reconciling;
  if (w?.outcome !== 'gone' && w?.outcome !== 'stale') return false;
  run.frame.done(w.outcome, { tools: run.tools });
  return true;
}

/**
 * The fetch, skipped for a pinned source already indexed.
 * @returns what the template needs; `undefined` when the run ended (stale, or its failure written).
 */
async function fetchRepository(run: RepoRun): Promise<RepoFetched | undefined> {
  const { deps, frame, parts } = run;
  const fetchStarted = deps.now();
  const pinnedHit = await findPinnedIndex(run.index, deps);
  if (pinnedHit) {
    parts.fetch = fetchPart(cachedResult({ stdout: pinnedHit.fetchStdout }), fetchStarted, deps.now());
    frame.observe.phase('fetch', frame.secondsSince(fetchStarted));
    return { pinnedHit, fetchStdout: '', treeKept: false };
  }
  const fetched = await vendirFetch(run);
  run.tools = { runs: fetched.toolRuns, ms: fetched.toolMs };
  if (run.watch.signal.aborted) {
    frame.done('stale', { tools: run.tools });
    return undefined;
  }
  const fetchResult = frame.mask.result(fetched.result);
  parts.fetch = fetchPart(fetchResult, fetchStarted, deps.now());
  frame.observe.phase('fetch', frame.secondsSince(fetchStarted));
  const { fetchKey } = fetched;
  if (fetchResult.error || !fetchKey) {
    if (!(await reconcilingEnded(run))) await closeRepository(run, fetchResult);
    return undefined;
  }
  return { fetchKey, fetchStdout: fetchResult.stdout, treeKept: fetched.kept === true };
}

/**
 * vendir into the run's scratch (`fetchWithVendir`, its tree kept there); a fetch the deletion
 * aborted is a result, not a throw.
 */
async function vendirFetch(run: RepoRun): Promise<Awaited<ReturnType<typeof fetchWithVendir>>> {
  const { deps, frame, polled, watch } = run;
  const { kube } = frame;
  try {
    return await fetchWithVendir(run.app, deps, kube, scopeOf(frame.object), frame.mask, watch.signal, {
      keepAt: fetchedTree(run.work),
      // Upstream's retry waits for the placeholder to be filled: here that changes the fetch.
      ...(wantsPlaceholder(polled.spec.fetch)
        ? {
            refetch: async () =>
              packageRepositoryApp(await withFilledPlaceholder(polled, freshReads(kube))).spec.fetch ?? [],
          }
        : {}),
    });
  } catch (err) {
    if (!watch.signal.aborted) throw err;
    return { result: resultFromError(err), toolMs: 0, toolRuns: 0 };
  }
}

/**
 * The template, skipped for fetched content already indexed.
 * @returns what the deploy needs; `undefined` when the run ended (stale, or its failure written).
 */
async function templateOrReuseIndex(run: RepoRun, fetched: RepoFetched): Promise<RepoTemplated | undefined> {
  const { deps, frame } = run;
  const { fetchKey } = fetched;
  const templateStarted = deps.now();
  const hit =
    fetched.pinnedHit ??
    (fetchKey ? await findFetchedIndex(run.index, fetchKey, fetched.fetchStdout, deps) : undefined);
  if (hit) {
    run.parts.template = templatePart(cachedResult({ stderr: frame.mask.text(hit.templateStderr) }), deps.now());
    frame.observe.phase('template', frame.secondsSince(templateStarted));
    const manifest = withRepositoryRef(hit, `${frame.object.namespace}/${frame.object.name}`);
    return { manifest, deployedVersions: { index: hit.index }, pokesWhenIndexed: false };
  }
  // Unreachable: without a pinned hit the fetch either stored an artifact or closed the run.
  if (!fetchKey) return undefined;
  const rendered = await renderRepository(
    frame,
    { fetchKey, kept: fetched.treeKept },
    run.work,
    run.watch.signal,
    deps,
  );
  if (run.watch.signal.aborted) {
    frame.done('stale', { tools: run.tools });
    return undefined;
  }
  const templateResult = frame.mask.result(rendered.result);
  run.parts.template = templatePart(templateResult, deps.now());
  frame.observe.phase('template', frame.secondsSince(templateStarted));
  if (templateResult.error || rendered.manifest === undefined) {
    await closeRepository(
      run,
      templateResult.error ? templateResult : resultFromError('templating produced no manifest', 'Templating dir: '),
    );
    return undefined;
  }
  return storeRendered(run, fetchKey, {
    manifest: rendered.manifest,
    versions: rendered.versions,
    fetchStdout: fetched.fetchStdout,
    templateStderr: templateResult.stderr,
  });
}

/**
 * Starts storing a rendered index while kapp deploys (awaited before the final status: a store
 * failure retries the run). Once stored, the fleet's other repositories on the polled source
 * are reconciled at once (they find this index and run kapp only), not after this run's deploy.
 */
function storeRendered(
  run: RepoRun,
  fetchKey: string,
  rendered: { manifest: string; versions: RepoVersions | undefined; fetchStdout: string; templateStderr: string },
): RepoTemplated {
  const { deps, index, tracked } = run;
  const { object } = run.frame;
  const { manifest, versions, fetchStdout, templateStderr } = rendered;
  const digest = index && indexDigestOf(index, fetchKey);
  const deployedVersions = { ...(digest ? { index: digest } : {}), versions: versions ?? {} };
  const pokesWhenIndexed = tracked !== undefined && digest !== undefined && index?.source !== undefined;
  const stored = storeIndex(index, fetchKey, { manifest, versions, fetchStdout, templateStderr }, deps).then(() =>
    pokesWhenIndexed && tracked
      ? infraStep('reconciling the repositories behind on the source', () => memberIndexed(tracked, object, deps))
      : undefined,
  );
  stored.catch(() => {});
  return { manifest, deployedVersions, stored, pokesWhenIndexed };
}

/**
 * The deploy (runKapp polls the repository itself while kapp runs: one poll, not two, of an
 * object that holds the whole inline repository), then the version changes announced and the
 * source member recorded, both before the final status.
 * @returns the `repo.indexed` event of a successful deploy that changed versions.
 */
async function deployAndAnnounce(
  run: RepoRun,
  fetched: RepoFetched,
  templated: RepoTemplated,
): Promise<RepoIndexedEvent | undefined> {
  const { deps, frame, tracked } = run;
  const { object } = frame;
  await run.watch.stop();
  const deployStarted = deps.now();
  const deployed = await deployRepository(frame, templated.manifest, run.work, deps);
  frame.observe.phase('deploy', frame.secondsSince(deployStarted));
  await templated.stored;
  run.tools = { runs: run.tools.runs + deployed.runs, ms: run.tools.ms + deployed.ms };
  run.parts.deploy = deployed.part;
  // Before the final status: a store failure retries the run rather than losing the change.
  const indexed = deployed.result.error
    ? undefined
    : await announceRepoChanges(object, templated.deployedVersions, deps);
  // Also before it: a deploy not recorded would leave the member out of the record or behind it
  // (never poked, or the fleet's pokes waiting for the poll), so the run is retried instead.
  if (tracked && !deployed.result.error) {
    await infraStep('recording the deployed source digest', () =>
      memberDeployed(tracked, object, !fetched.pinnedHit && !templated.pokesWhenIndexed, deps),
    );
  }
  await closeRepository(run, deployed.result);
  return indexed;
}

/**
 * Where the run's fetched tree lies in its scratch `work`: vendir's directory, moved there by
 * `fetchWithVendir`, or else the stored artifact unpacked there.
 */
function fetchedTree(work: string): string {
  return path.join(work, 'fetched');
}

/**
 * The fixed template pipeline over the fetched tree `fetched.fetchKey`: vendir's own directory
 * when this run fetched it and kept it (`fetched.kept`: the tree that was packed, so no read and
 * unpack of what was just stored, ~0.5 s for 100 files here), else the artifact unpacked in the
 * run's scratch.
 */
async function renderRepository(
  frame: StageFrame<DeployView, LoadedRepo>,
  fetched: { fetchKey: string; kept: boolean },
  work: string,
  signal: AbortSignal,
  deps: IndexRepoDeps,
): ReturnType<typeof defaultTemplateRepository> {
  const { object } = frame;
  const { pkgr } = frame.loaded;
  // The template tools get the run's scratch itself, with the fetched tree inside, as the App
  // template stage does: under uid isolation a tool can reach only the directories handed to
  // it, and a directory inside this 0700 scratch would be out of its reach.
  const fetchedDir = fetchedTree(work);
  if (!fetched.kept) {
    // A shared tarball is checked against its key as it is unpacked (tampered: MissingArtifactError).
    await unpackArtifact(deps, scopeOf(object), fetched.fetchKey, fetchedDir, 'fetch');
  }
  const template = deps.templateRepository ?? defaultTemplateRepository;
  return await template(
    {
      root: path.join(fetchedDir, '0'),
      name: pkgr.metadata.name ?? object.name,
      namespace: pkgr.metadata.namespace ?? object.namespace,
      bundle: Boolean(pkgr.spec.fetch.imgpkgBundle),
      scratch: work,
      signal,
    },
    deps,
  );
}

/** The kapp apps a PackageRepository's kapp runs read: `--app <N>.pkgr` and `--prev-app <N>-ctrl`. */
function pkgrKappApps(name: string): string[] {
  return [`${name}${PKGR_SUFFIX}`, legacyKappAppName(name)];
}

/**
 * The kubeconfig of a repository's kapp run ({@link packageRepositoryKubeconfig}: the runtime
 * namespace's `kapp-lambda-pkgr`), or the run's failure when it cannot be had. No token is
 * requested while the admission policy bounding that identity is not in force on the cluster
 * (`../../deploy/pkgr-admission.ts`; the answer kept per cluster by `deps.pkgrAdmission`).
 */
async function repositoryKubeconfig(
  kube: DeployView,
  object: Pick<ObjectRef, 'clusterId' | 'namespace'>,
  mask: SecretMask,
  deps: Pick<IndexRepoDeps, 'config' | 'pinServer' | 'pkgrAdmission'>,
): Promise<{ yaml: string } | { error: Error }> {
  const { namespace } = object;
  const unbounded = deps.pkgrAdmission
    ? await deps.pkgrAdmission.check(object.clusterId, kube)
    : await pkgrAdmissionProblem(kube);
  if (unbounded !== undefined) return { error: new KappControllerError(unbounded) };
  const runtimeNamespace = deps.config.controllerConfigNamespace ?? DEFAULT_CONTROLLER_CONFIG_NAMESPACE;
  try {
    return { yaml: await packageRepositoryKubeconfig(kube, runtimeNamespace, namespace, mask, deps.pinServer) };
  } catch (error) {
    // An API server host that does not resolve is the runtime's problem: retried, not a status.
    if (!(error instanceof KappControllerError)) throw error;
    return { error };
  }
}

/**
 * The finalizer, the kapp records checked ({@link plantedKappRecord}) and the kapp identity's
 * token, then `kapp deploy <name>.pkgr` with the manifest on stdin. The records are read here,
 * right before kapp reads them, not while the run fetches and templates: whoever may write
 * ConfigMaps in the repository's namespace would otherwise have the whole fetch and template
 * (timed by a source they serve) to swap a checked record for a planted one.
 */
async function deployRepository(
  frame: StageFrame<DeployView, LoadedRepo>,
  manifest: string,
  work: string,
  deps: IndexRepoDeps,
): Promise<{ result: StageResult; part: RunParts['deploy']; runs: number; ms: number }> {
  const { kube, mask, fence, object } = frame;
  const startedAt = deps.now();
  // The finalizer before kapp runs (upstream `blockDeletion` in `deploy`), so a repository
  // deleted meanwhile still has its packages removed.
  const [finalizer, records, kubeconfig] = await Promise.allSettled([
    kube.addFinalizer(frame.ref, Finalizer.PackageRepository, { uid: object.uid }),
    plantedKappRecord(kube, object.namespace, pkgrKappApps(object.name)),
    repositoryKubeconfig(kube, object, mask, deps),
  ]);
  if (finalizer.status === 'rejected') {
    const result = resultFromError(finalizer.reason, BLOCKING_FOR_DEPLOY_PREFIX);
    return { result, part: deployStatus(result, { startedAt, updatedAt: deps.now() }), runs: 0, ms: 0 };
  }
  if (records.status === 'rejected') throw records.reason;
  if (kubeconfig.status === 'rejected') throw kubeconfig.reason;
  const refused = records.value ?? ('error' in kubeconfig.value ? kubeconfig.value.error : undefined);
  if (refused !== undefined || !('yaml' in kubeconfig.value)) {
    const result = mask.result(resultFromError(refused, KAPP_ERROR_PREFIX.deploy));
    return { result, part: deployStatus(result, { startedAt, updatedAt: deps.now() }), runs: 0, ms: 0 };
  }
  const cmd = packageRepositoryDeployCommand({
    name: object.name,
    namespace: object.namespace,
    metadataFile: path.join(work, 'app-metadata.yml'),
    kubeconfigYaml: kubeconfig.value.yaml,
  });
  let flushAll = false;
  const progress = deployProgress(kube, frame.ref, fence, mask, startedAt, deps, 'deploy');
  const run = await runKapp(
    cmd,
    manifest,
    deps,
    { kube, ref: frame.ref, uid: object.uid, cancelOnDelete: true },
    async (out) => {
      // Progress is written only once kapp starts changing the cluster (`trackCmdOutput`).
      flushAll ||= out.applying;
      if (flushAll) await progress(out);
    },
    [work],
  );
  // upstream `updateLastDeploy` returns the friendly result, so usefulErrorMessage is kapp's
  // stderr trimmed and without whitespace before newlines, as status.deploy.stderr
  const result = withFriendlyYAMLStrings(mask.result(attachError(KAPP_ERROR_PREFIX.deploy, run)));
  return { result, part: deployStatus(result, { startedAt, updatedAt: deps.now() }), runs: 1, ms: run.durationMs };
}

/**
 * The delete path: `Deleting`, `kapp delete <name>.pkgr` (the repository's Packages and
 * PackageMetadatas, and only its), then both finalizers are removed; on failure
 * `DeleteFailed` and the finalizers stay (retried with the failure backoff). What kapp's identity
 * would be refused (a legacy `<name>-ctrl` app never renamed, or its objects that are not kapp's
 * records: `pkgrDeleteBlocker`) fails the same way before kapp runs, naming what an admin must
 * delete; the first retry after that deletes the repository. Opens and closes on the frame
 * (`openDelete`, `closeDelete`).
 *
 * @param event - the event (the object of the `repo.indexed` event is its reference, with the
 *   live uid and generation)
 * @param run - the run {@link openRun} opened: of the two finalizers only those the repository
 *   had when read are removed (nothing adds the legacy one later)
 * @returns the `repo.indexed` event removing every version it deployed, after a successful delete.
 */
async function deleteRepository(
  event: ObjectEventData,
  run: OpenedRun<DeployView, LoadedRepo>,
  deps: IndexRepoDeps,
): Promise<RepoIndexedEvent | undefined> {
  const { kube, ref, fence, loaded } = run;
  const object: ObjectRef = { ...event, uid: fence.uid, generation: fence.generation };
  // `Deleting` is written while kapp's records are checked and while kapp runs: kapp waits for
  // the check only (a GET of two small ConfigMaps), not for a status write of an object that
  // holds the whole inline repository (~0.5 s on a busy API server). The write is awaited before
  // kapp's first progress write and before the final status, so the status goes through
  // `Deleting` first as upstream's (`reconcileDelete` writes it before `kapp delete`).
  const frame = openDelete(deps, PKGR_KIND, { kube, ref, object, raw: loaded.raw, observe: run.observe });
  const { mask, startedAt } = frame;
  const [planted, blocked, kubeconfig] = await Promise.all([
    plantedKappRecord(kube, object.namespace, pkgrKappApps(object.name)),
    // What kapp would be refused (a legacy app's objects, or its record never renamed): named
    // for an admin rather than run into, the finalizer staying until they are gone.
    pkgrDeleteBlocker(kube, object.namespace, object.name),
    repositoryKubeconfig(kube, object, mask, deps),
  ]);
  const refused = planted
    ? new Error(planted)
    : 'error' in kubeconfig
      ? kubeconfig.error
      : blocked
        ? new Error(blocked)
        : undefined;
  const progress = deployProgress(kube, ref, fence, mask, startedAt, deps, 'delete');
  const kapp =
    refused !== undefined || !('yaml' in kubeconfig)
      ? { stdout: '', stderr: '', durationMs: 0, error: refused }
      : await runKapp(
          packageRepositoryDeleteCommand({
            name: object.name,
            namespace: object.namespace,
            kubeconfigYaml: kubeconfig.yaml,
          }),
          undefined,
          deps,
          { kube, ref, uid: object.uid, cancelOnDelete: false },
          async (tick) => {
            await frame.deleting;
            await progress(tick);
          },
        );
  await frame.deleting;
  let indexed: RepoIndexedEvent | undefined;
  // raw, unlike the deploy: upstream's reconcileDelete hands `delete()`'s own result to
  // setDeleteCompleted (status.deploy is friendly as always)
  const result = mask.result(attachError(KAPP_ERROR_PREFIX.delete, kapp));
  await closeDelete(frame, {
    result,
    deploy: () => deployStatus(result, { startedAt, updatedAt: deps.now() }),
    tools: { runs: refused === undefined ? 1 : 0, ms: kapp.durationMs },
    finalize: async () => {
      // Its Packages are gone: the PackageInstalls that used them reconcile (and fail) at once.
      indexed = await announceRepoChanges(object, 'deleted', deps);
      await infraStep('leaving the source poll record', () => leaveSource(loaded.pkgr.spec.fetch, object, deps));
      for (const f of [Finalizer.PackageRepository, Finalizer.PackageRepositoryLegacy]) {
        if (loaded.raw.metadata.finalizers?.includes(f)) await kube.removeFinalizer(ref, f, { uid: object.uid });
      }
    },
  });
  return indexed;
}
