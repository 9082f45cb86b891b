/**
 * The deploy stage (`pkg/app/app_deploy.go`, `pkg/deploy/kapp.go`): with the delete path
 * (`./delete.ts`), the only stage holding a {@link DeployView}. It adds the finalizer
 * before kapp runs (as upstream, so issue #114 behaves the same), mints a short-lived
 * TokenRequest token for the App's ServiceAccount (or reads its kubeconfig Secret), runs
 * `kapp deploy` with the manifest on stdin, streams kapp's output into `status.deploy`
 * every 2 s once kapp starts applying, kills kapp when the App is canceled or deleted, runs
 * `kapp inspect` when asked, and writes the run's final status. The cluster access and the kapp
 * run (progress, cancellation) are `../../deploy/run.ts`; this file orchestrates them.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { type DeployStageData, MAX_DEPLOY_CONTINUATIONS, type ObjectRef } from '../../../../events/schema.js';
import { type AppDeployKapp, type AppStatus, Finalizer } from '../../api/index.js';
import { sha256Hex } from '../../artifact/keys.js';
import {
  appKappDeploy,
  associatedResources,
  BLOCKING_FOR_DEPLOY_PREFIX,
  type BudgetedKappCommand,
  type ClusterAccess,
  fleetWaitCutNote,
  KAPP_ERROR_PREFIX,
  type KappCommand,
  kappDeployCommand,
  kappInspectCommand,
  MAX_CONTINUED_WAIT_MS,
  NOT_ONE_DEPLOY_MESSAGE,
  parseKappAppMeta,
  wantsInspect,
  withKappWaitBudget,
} from '../../deploy/index.js';
import {
  checkLive,
  type DeployRecord,
  deploySpecDigest,
  parseDeployRecord,
  type RecordInput,
  recordLive,
  reuseBlocker,
} from '../../deploy/live-record.js';
import { cachedClusterAccess, runKapp } from '../../deploy/run.js';
import { CommandDeadlineError } from '../../exec/deadline.js';
import { CommandCanceledError, type RunResult } from '../../exec/runner.js';
import { UrlPolicyError } from '../../fetch/url-policy.js';
import type { DeployView } from '../../kube/port.js';
import { TRUNCATION_PREFIX } from '../../reconcile/redact.js';
import {
  attachError,
  MissingArtifactError,
  outcomeOf,
  resultFromError,
  type StageResult,
  withFriendlyYAMLStrings,
} from '../../reconcile/result.js';
import {
  deployStatus,
  failedPartResult,
  formatStatusTime,
  fromEventPart,
  inspectStatus,
  KAPP_APPLYING_MARKER,
  markReconciling,
  type RunParts,
  summarizeStatus,
} from '../../reconcile/status.js';
import type { DeployStatus } from '../../reconcile/types.js';
import { privateArtifacts, readArtifact, scopeOf } from '../artifacts.js';
import { type PipelineDeps, secretMaskOf } from '../deps.js';
import { stageTimer, writeAppStatus } from '../report.js';
import { infraStep } from '../retry-bound.js';
import { closeStage, openHandOff, type StageFrame, writeFrameStatus } from '../stage.js';
import { appRef, loadApp, makeScratch, objectKey, removeScratch } from '../stage-inputs.js';
import { APP_KIND } from './kind.js';
import { policedClusterAccess } from './kubeconfig-policy.js';
import { receiptOnEnd, trailWith } from './receipts.js';
import { rollbackRefusal } from './rollback.js';

/**
 * Adds the finalizer before kapp runs (`blockDeletion`), deciding on the stage's copy of the App
 * as upstream decides on its own (no request when the finalizer is on it), and keeps the copy
 * current (the finalizer and the new resourceVersion; the status is untouched by the change).
 * @returns an error result when that fails.
 */
async function blockDeletion(frame: StageFrame<DeployView>, uid: string): Promise<StageResult | undefined> {
  const known = frame.latest;
  try {
    const added = await frame.kube.addFinalizer(frame.ref, Finalizer.App, { uid, ...(known ? { object: known } : {}) });
    if (!known || !added.changed || added.resourceVersion === undefined) {
      frame.latest = added.changed ? undefined : known;
      return undefined;
    }
    const finalizers = [...(known.metadata.finalizers ?? []), Finalizer.App];
    frame.latest = { ...known, metadata: { ...known.metadata, finalizers, resourceVersion: added.resourceVersion } };
    return undefined;
  } catch (err) {
    frame.latest = undefined;
    return resultFromError(err, BLOCKING_FOR_DEPLOY_PREFIX);
  }
}

/**
 * One deploy run: what its steps share. The steps set the fields below `canceled` as they go,
 * so a failure midway keeps what was learnt before it (the cluster access, the tool time).
 */
interface DeployRun {
  /** The hand-off from template (or the continuation). */
  data: DeployStageData;
  deps: PipelineDeps;
  /** The open stage (the App as read, its deploy view, mask and log line). */
  frame: StageFrame<DeployView>;
  /** The manifest to apply ({@link manifestKeyOf}). */
  manifestKey: string;
  /** The run's parts so far: those the event carries, then deploy's and inspect's. */
  parts: RunParts;
  /** kapp's first start: status.deploy.startedAt and kapp's wait budget (a continuation keeps it). */
  startedAt: Date;
  /**
   * Canceled since the run started (`openStage` lets such a run go on): kapp answers `Already
   * canceled` without starting, and a resync's unchanged deploy is not reused (upstream calls kapp).
   */
  canceled: boolean;
  /** `status.deploy.kapp`: the stored one, until kapp's metadata names the associated resources. */
  kappStatus: NonNullable<AppStatus['deploy']>['kapp'];
  /** Tool runs and time, for the log line. */
  tools: { runs: number; ms: number };
  /** The cluster access prepared for kapp (inspect reuses it). */
  access?: ClusterAccess;
  /** Set when a resync found nothing changed since the last deploy: that deploy's status. */
  reused?: DeployStatus;
  /** kapp's output when the function deadline stopped it. */
  cut?: { stdout: string; stderr: string };
}

/**
 * Runs the deploy stage for a hand-off from template, or for its own continuation: adds the
 * finalizer ({@link blockDeletion}), deploys or finds nothing changed ({@link deployOnce}) and
 * ends the run or continues it ({@link endDeploy}).
 *
 * The function deadline (Lambda: `withDeadline` on the runner, `../../exec/deadline.ts`) may stop
 * `kapp deploy` while it waits for resources: the stage then writes the progress so far
 * (`status.deploy` unfinished with kapp's output, conditions `Reconciling`) and returns the
 * continuation, which the deploy function sends to its own queue. The follow-up runs
 * `kapp deploy` again with the same manifest: kapp applies nothing new and waits for what is not
 * ready yet (a kept resource that is not done is waited for), within what is left of its
 * `--wait-timeout` ({@link withKappWaitBudget}). So a deploy longer than one invocation ends like
 * upstream's single kapp process: `ReconcileSucceeded`, or kapp's own timeout. A canceled App
 * ends the continuation as upstream's cancel ends its waiting kapp ({@link endCanceledContinuation});
 * paused, deleted or changed Apps stop it when it opens (and the running kapp, through the abort
 * watch), as any later stage. The embedded runtime has no deadline: it never continues.
 *
 * @returns the continuation's data when the deadline stopped kapp, else `undefined` (the run
 *   ended: final status written, or stale/gone/paused).
 * @throws on infrastructure failures: the transport retries the event.
 */
export async function runDeploy(data: DeployStageData, deps: PipelineDeps): Promise<DeployStageData | undefined> {
  if (data.continuation && (await endCanceledContinuation(data, data.continuation, deps))) return undefined;
  const ref = data.object;
  const opened = await openHandOff(deps, 'deploy', data, (id) => deps.clusters.deployView(id), APP_KIND);
  if (opened.stop) return undefined;
  const { frame } = opened;
  if (data.afterFailure) {
    await inspectAfterFailure(frame, data, data.afterFailure, deps);
    return undefined;
  }
  const manifestKey = manifestKeyOf(data);
  if (data.rollbackOf !== undefined) {
    const why = await rollbackRefusal(frame.loaded.raw, ref, data.rollbackOf, manifestKey, deps.store);
    if (why) {
      // A stale rollback (the annotation changed since) or a forged one: nothing is applied.
      deps.log.warn({ app: `${ref.namespace}/${ref.name}`, receipt: data.rollbackOf, why }, 'rollback refused');
      return undefined;
    }
  }
  const { app } = frame.loaded;
  const run: DeployRun = {
    data,
    deps,
    frame,
    manifestKey,
    parts: { fetch: fromEventPart(data.fetchStatus), template: fromEventPart(data.templateStatus) },
    startedAt: data.continuation ? new Date(data.continuation.deployStartedAt) : deps.now(),
    canceled: Boolean(app.spec.canceled),
    kappStatus: app.status?.deploy?.kapp,
    tools: { runs: 0, ms: 0 },
  };
  const blocked = await blockDeletion(frame, ref.uid);
  const result = blocked ?? (await deployOnce(run));
  return await endDeploy(run, result);
}

/**
 * Deploys the manifest, unless a resync finds nothing changed since the last deploy
 * ({@link checkReuse}): then that deploy's output is the result. User errors (a missing
 * ServiceAccount, a refused kubeconfig URL, a bad deploy spec) are the result too.
 * @throws on infrastructure failures.
 */
async function deployOnce(run: DeployRun): Promise<StageResult> {
  const record = await deployRecordOf(run.frame, run.data, run.deps);
  try {
    const kapp = appKappDeploy(run.frame.loaded.app.spec);
    await checkReuse(run, record);
    if (run.reused || !run.access) {
      return { stdout: run.reused?.stdout ?? '', stderr: run.reused?.stderr ?? '', exitCode: 0, finished: true };
    }
    return await applyManifest(run, kapp, run.access, record);
  } catch (err) {
    if (outcomeOf(err) !== 'user') throw err;
    // A refused kubeconfig URL is reported as kapp's own failure would be (`Deploying: `).
    return resultFromError(err, err instanceof UrlPolicyError ? KAPP_ERROR_PREFIX.deploy : '');
  }
}

/**
 * Decides whether the deploy record lets this run end without kapp (sets `run.reused`), and
 * prepares the cluster access kapp needs otherwise (sets `run.access`).
 */
async function checkReuse(run: DeployRun, record: RecordState): Promise<void> {
  const { deps, frame } = run;
  const { kube, mask } = frame;
  const { app } = frame.loaded;
  // The check lists as the App with the token last minted for it, when fresh: no read of
  // its ServiceAccount (the list fails if that is gone, and the full path below reads it).
  const reusable = run.canceled ? undefined : record.reusable;
  const quick = reusable ? cachedClusterAccess(app, kube, mask) : undefined;
  run.reused = quick && reusable ? await unchangedSince(frame, reusable, quick, deps) : undefined;
  if (!run.reused) run.access = await policedClusterAccess(app, kube, mask, deps.config.urlPolicy, deps.egressProxyUrl);
  if (!run.reused && !quick && reusable && run.access) {
    run.reused = await unchangedSince(frame, reusable, run.access, deps);
  }
}

/**
 * Runs `kapp deploy` with the rendered manifest in a scratch directory (removed after), reads
 * the associated resources from kapp's app metadata and keeps the deploy record of a success.
 * @throws MissingArtifactError when the manifest is gone; infrastructure failures as they come.
 */
async function applyManifest(
  run: DeployRun,
  kapp: AppDeployKapp,
  access: ClusterAccess,
  record: RecordState,
): Promise<StageResult> {
  const { data, deps, frame } = run;
  // A private manifest opens only with this run's cluster key (and for the App's namespace).
  const manifest = await infraStep('reading the rendered manifest', () =>
    readArtifact(deps, scopeOf(data.object), run.manifestKey),
  );
  if (!manifest) throw new MissingArtifactError('manifest', run.manifestKey);
  const work = await makeScratch(deps, 'deploy');
  try {
    const metadataFile = path.join(work, 'app-metadata.yml');
    const planned = kappDeployCommand({
      kapp,
      access,
      metadataFile,
      controllerRawOptions: deps.config.kappDeployRawOptions,
    });
    const maxWaitMs = deps.config.maxDeployWaitMs ?? MAX_CONTINUED_WAIT_MS;
    const budget = data.continuation
      ? withKappWaitBudget(planned, deps.now().getTime() - run.startedAt.getTime(), maxWaitMs)
      : firstKappBudget(planned, maxWaitMs);
    const kappStartedAt = deps.now();
    const kappRun = await runKappDeploy(run, budget.cmd, manifest.toString('utf8'), work);
    // The fleet's cut of a longer wait says so where kapp's own timeout is read.
    const cutNote = budget.capped && kappRun.error ? fleetWaitCutNote(kappRun.stderr, maxWaitMs) : undefined;
    const ran = cutNote ? { ...kappRun, stderr: `${kappRun.stderr.replace(/\n?$/, '\n')}${cutNote}\n` } : kappRun;
    run.tools = { runs: 1, ms: ran.durationMs };
    if (ran.error instanceof CommandDeadlineError) run.cut = { stdout: ran.stdout, stderr: ran.stderr };
    // upstream's updateLastDeploy returns the friendly result, which setReconcileCompleted then
    // reads: usefulErrorMessage is kapp's stderr as status.deploy shows it
    const result = withFriendlyYAMLStrings(frame.mask.result(attachError(KAPP_ERROR_PREFIX.deploy, ran)));
    const meta = parseKappAppMeta(await readFile(metadataFile, 'utf8').catch(() => ''));
    run.kappStatus = associatedResources(meta) ? { associatedResources: associatedResources(meta) } : run.kappStatus;
    if (!result.error && !run.cut && record.key && meta && access.kubeconfigYaml && changedCluster(ran.stdout)) {
      // What kapp applied is taken as kapp's only once a later run of kapp finds nothing to
      // change: a write under kapp's field manager name while kapp runs (`--field-manager=kapp`
      // is anyone's) would otherwise become the baseline every later resync ends on without kapp.
      // The next resync runs kapp once more; when it applies nothing, that run keeps the record.
      deps.log.info(
        { object: objectKey(frame.object), stage: 'deploy' },
        'deploy record not kept: kapp changed the cluster; the next resync runs kapp to confirm what it left',
      );
      if (record.stored) await deps.store.delete(record.key).catch(() => {});
    } else if (!result.error && !run.cut && record.key && meta && access.kubeconfigYaml) {
      await keepDeployRecord(frame, record.key, deps, access.kubeconfigYaml, {
        generation: frame.fence.generation,
        manifestKey: run.manifestKey,
        specDigest: record.specDigest,
        manifest: manifest.toString('utf8'),
        meta,
        defaultNamespace: access.namespace || (frame.loaded.app.metadata.namespace ?? ''),
        ...(kapp.intoNs ? { intoNs: kapp.intoNs } : {}),
        ...(kapp.mapNs?.length ? { mapNs: kapp.mapNs } : {}),
        kappStartedAt,
      });
    }
    return result;
  } finally {
    await removeScratch(work);
  }
}

/**
 * The first kapp of a run (not a continuation): the App's own command, unless it asks to wait
 * longer than the fleet's maximum (or without limit, `--wait-timeout=0s`); then its wait is cut
 * to that maximum already, as a continuation's would be. Without it a fleet whose maximum is below
 * the deploy function's timeout would let the first kapp wait until the function deadline, past
 * the maximum `KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS` promises. A wait within the maximum keeps the
 * App's argv as upstream runs it.
 */
function firstKappBudget(planned: KappCommand, maxWaitMs: number): BudgetedKappCommand {
  const cut = withKappWaitBudget(planned, 0, maxWaitMs);
  return cut.capped ? cut : { cmd: planned, capped: false };
}

/**
 * Runs `kapp deploy` with `manifest` on stdin, killed when the App is deleted or canceled, and
 * streams its output into `status.deploy` once kapp starts changing the cluster.
 */
async function runKappDeploy(run: DeployRun, cmd: KappCommand, manifest: string, work: string): Promise<RunResult> {
  const { deps, frame } = run;
  const { kube, mask, fence } = frame;
  // Progress is written only once kapp starts changing the cluster (`trackCmdOutput`).
  let flushAll = false;
  return await runKapp(
    cmd,
    manifest,
    deps,
    { kube, ref: frame.ref, uid: run.data.object.uid, cancelOnDelete: true, canceled: run.canceled },
    async ({ stdout, stderr, applying }) => {
      flushAll ||= applying;
      if (!flushAll) return;
      const progress = deployStatus(
        mask.result({ stdout, stderr, exitCode: 0, finished: false }),
        { startedAt: run.startedAt, updatedAt: deps.now() },
        run.kappStatus,
      );
      // Conditions `Reconciling` as upstream's every sync has them by now: a run that did not
      // start with a spec change wrote none, and kapp's wait rule must not read the last
      // `ReconcileSucceeded` beside an unfinished deploy.
      await writeFrameStatus(frame, (cur) =>
        markReconciling(summarizeStatus(cur, fence.generation, { ...run.parts, deploy: progress }), fence.generation),
      );
    },
    [work],
  );
}

/**
 * Ends the deploy: the reused deploy's status (outcome `cached`), the continuation when the
 * deadline stopped kapp ({@link continueDeploy}), else kapp's status and inspect's in the
 * run's final status.
 */
async function endDeploy(run: DeployRun, result: StageResult): Promise<DeployStageData | undefined> {
  const { data, deps, frame, parts, startedAt } = run;
  if (run.reused) {
    parts.deploy = run.reused;
    frame.observe.phase('deploy', frame.secondsSince(startedAt));
    await closeStage(frame, {
      parts,
      result,
      last: true,
      success: 'cached',
      tools: run.tools,
      receipt: deployReceipt(deps, data),
    });
    return undefined;
  }
  const count = (data.continuation?.count ?? 0) + 1;
  if (run.cut && count <= MAX_DEPLOY_CONTINUATIONS) return await continueDeploy(run, run.cut, count);
  parts.deploy = deployStatus(result, { startedAt, updatedAt: deps.now() }, run.kappStatus);
  frame.observe.phase('deploy', frame.secondsSince(startedAt));

  // Inspect after every deploy attempt (status.deploy is now always set), as upstream's
  // `inspect()`, with cluster access prepared afresh unless the deploy prepared it.
  const inspected = await runInspect(frame, deps, {
    canceled: run.canceled,
    ...(run.access ? { access: run.access } : {}),
  });
  if (inspected.part !== undefined) parts.inspect = inspected.part;
  const tools = { runs: run.tools.runs + inspected.tools.runs, ms: run.tools.ms + inspected.tools.ms };
  await closeStage(frame, {
    parts,
    result,
    last: true,
    success: 'succeeded',
    tools,
    receipt: deployReceipt(deps, data),
  });
  return undefined;
}

/** The receipt callback of a deploy run's final status (`./receipts.ts`). */
function deployReceipt(deps: PipelineDeps, data: DeployStageData) {
  return receiptOnEnd(deps, {
    object: data.object,
    run: data.run,
    stage: 'deploy',
    ...(data.receipt ? { trail: data.receipt } : {}),
    ...(data.artifacts.fetchKey ? { fetchKey: data.artifacts.fetchKey } : {}),
    ...(data.artifacts.manifestKey ? { manifestKey: data.artifacts.manifestKey } : {}),
  });
}

/**
 * The manifest a deploy event names (the schema requires it unless `afterFailure` is set).
 * @throws Error when the event names none (an event built in code without one).
 */
function manifestKeyOf(data: DeployStageData): string {
  if (!data.artifacts.manifestKey) throw new Error('deploy event without artifacts.manifestKey');
  return data.artifacts.manifestKey;
}

/**
 * Upstream's `inspect()` (`pkg/app/app_deploy.go`), run at the end of a reconcile whenever
 * `status.deploy` exists: the deploy entry is checked first (two entries, or one without kapp,
 * fail inspect too, asked for or not), then `kapp inspect` runs only when `inspect` is set.
 * Cluster access is prepared afresh unless given (a credential error fails inspect as it
 * failed deploy: the error, without `Inspecting: `, which kapp's own failures get).
 *
 * @returns `part`: `status.inspect` (`null`: remove it; `undefined`: leave it), and the tool time.
 * @throws on infrastructure failures (the transport retries the stage).
 */
async function runInspect(
  frame: StageFrame<DeployView>,
  deps: PipelineDeps,
  opts: { canceled: boolean; access?: ClusterAccess },
): Promise<{ part?: RunParts['inspect']; tools: { runs: number; ms: number } }> {
  const { app } = frame.loaded;
  const { kube, mask } = frame;
  const entries = app.spec.deploy ?? [];
  const entryError =
    entries.length !== 1 ? NOT_ONE_DEPLOY_MESSAGE : entries[0]?.kapp ? undefined : 'Unsupported way to inspect';
  const none = { runs: 0, ms: 0 };
  if (entryError) {
    return { part: inspectStatus(resultFromError(entryError), { updatedAt: deps.now() }) ?? null, tools: none };
  }
  const kappSpec = entries[0]!.kapp!;
  if (!wantsInspect(kappSpec)) return { tools: none };
  let inspect: StageResult;
  let tools = none;
  try {
    const access =
      opts.access ?? (await policedClusterAccess(app, kube, mask, deps.config.urlPolicy, deps.egressProxyUrl));
    const cmd = kappInspectCommand({ kapp: kappSpec, access });
    const run = await runKapp(
      cmd,
      undefined,
      deps,
      { kube, ref: frame.ref, uid: frame.object.uid, cancelOnDelete: true, canceled: opts.canceled },
      async () => {},
    );
    tools = { runs: 1, ms: run.durationMs };
    inspect = mask.result(attachError(KAPP_ERROR_PREFIX.inspect, run));
  } catch (err) {
    if (outcomeOf(err) !== 'user') throw err;
    inspect = resultFromError(err);
  }
  return { part: inspectStatus(inspect, { updatedAt: deps.now() }) ?? null, tools };
}

/**
 * The end of a run that failed at fetch or template after an earlier deploy (`afterFailure`,
 * `DeployStageData`): upstream's `reconcileDeploy` then still runs `inspect()` (its
 * `status.deploy != nil` check holds after any earlier deploy attempt, reference §3.2) and
 * writes the failure and `status.inspect` in one final status. No finalizer change, no kapp
 * deploy; the failure is the failed stage's part as stored ({@link failedPartResult}).
 *
 * @throws on infrastructure failures (the transport retries the stage).
 */
async function inspectAfterFailure(
  frame: StageFrame<DeployView>,
  data: DeployStageData,
  failedAt: NonNullable<DeployStageData['afterFailure']>,
  deps: PipelineDeps,
): Promise<void> {
  const parts: RunParts = {
    fetch: fromEventPart(data.fetchStatus),
    ...(data.templateStatus ? { template: fromEventPart(data.templateStatus) } : {}),
  };
  const stored = frame.loaded.app.status;
  const result = failedPartResult(
    failedAt === 'fetch' ? parts.fetch : parts.template,
    failedAt === 'fetch' ? stored?.fetch : stored?.template,
  );
  const inspected = await runInspect(frame, deps, { canceled: Boolean(frame.loaded.app.spec.canceled) });
  if (inspected.part !== undefined) parts.inspect = inspected.part;
  await closeStage(frame, {
    parts,
    result,
    last: true,
    success: 'succeeded',
    tools: inspected.tools,
    receipt: deployReceipt(deps, data),
  });
}

/** The App's deploy record, when this runtime keeps one, and whether this run may reuse it. */
interface RecordState {
  /** The record's store key (sealed for the App's cluster and namespace, named by its name and uid). */
  key?: string;
  /** {@link deploySpecDigest} of the App as read. */
  specDigest: string;
  /** The record, when it matches this run (see {@link reuseBlocker}). */
  reusable?: DeployRecord;
  /**
   * Whether the run's read found anything under {@link key} (a record, or one this runtime does
   * not read): only then is there one to remove. Runs of one App are one at a time (the FIFO
   * group, the embedded queue), so nothing else writes it between the read and the deploy's end:
   * a first deploy, which finds none, sends no DELETE.
   */
  stored?: boolean;
}

/** Key of the deploy record of the App `ref` (per cluster, namespace, name and uid); the delete path removes it. */
export function deployRecordKey(deps: PipelineDeps, ref: ObjectRef): Promise<string> {
  return privateArtifacts(deps).keyFor(scopeOf(ref), 'deploy-record', sha256Hex(`${ref.name}/${ref.uid}`));
}

/**
 * Reads the App's deploy record and decides whether this run may end without kapp once its
 * resources are checked. No record is kept without an artifact keyring (it is sealed) or an
 * App reader (`PipelineDeps.appReader`), nor for an App deploying to another cluster through
 * its kubeconfig Secret (`spec.cluster`): the stage's own process would then connect to a server
 * the App names, which only kapp does today; such Apps run kapp on every resync, as upstream.
 * @throws on store failures (the transport retries the event).
 */
async function deployRecordOf(
  frame: StageFrame<DeployView>,
  data: DeployStageData,
  deps: PipelineDeps,
): Promise<RecordState> {
  const { app } = frame.loaded;
  const specDigest = deploySpecDigest(app, deps.config);
  if (!deps.keyring || !deps.appReader || app.spec.cluster) return { specDigest };
  const key = await deployRecordKey(deps, data.object);
  const body = await infraStep('reading the deploy record', () =>
    privateArtifacts(deps).get(scopeOf(data.object), key),
  );
  const record = parseDeployRecord(body);
  const blocker = reuseBlocker(record, {
    generation: frame.fence.generation,
    manifestKey: manifestKeyOf(data),
    specDigest,
    continuation: Boolean(data.continuation),
    inspect: app.spec.deploy?.[0]?.kapp ? wantsInspect(app.spec.deploy[0].kapp) : false,
    lastDeploy: app.status?.deploy,
  });
  const stored = body !== undefined;
  if (blocker || !record) {
    deps.log.debug({ object: objectKey(data.object), stage: 'deploy' }, `kapp runs: ${blocker}`);
    return { key, specDigest, stored };
  }
  return { key, specDigest, stored, reusable: record };
}

/**
 * The no-op resync: lists the recorded resources as the App (its kapp kubeconfig) and compares
 * them with the record.
 *
 * @returns when nothing drifted, `status.deploy` as upstream's successful kapp run leaves it:
 *   the last deploy's (kapp's own output of that run, its `startedAt` and associated
 *   resources: no kapp output is made up) with `updatedAt` now, the time of this reconcile,
 *   which the resync timer counts from; else `undefined` (kapp runs and reverts the drift).
 */
async function unchangedSince(
  frame: StageFrame<DeployView>,
  record: DeployRecord,
  access: ClusterAccess,
  deps: PipelineDeps,
): Promise<DeployStatus | undefined> {
  const last = frame.loaded.app.status?.deploy;
  if (!access.kubeconfigYaml || !deps.appReader || !last) return undefined;
  const drift = await checkLive(deps.appReader(access.kubeconfigYaml), record);
  if (drift) {
    deps.log.info({ object: objectKey(frame.object), stage: 'deploy' }, `kapp runs: ${drift}`);
    return undefined;
  }
  return { ...last, finished: true, exitCode: 0, updatedAt: formatStatusTime(deps.now()) };
}

/**
 * Whether a kapp deploy's output says it applied changes: its ` ---- applying ` line, or output
 * whose head was dropped (the line may have been in it: taken as applied).
 */
function changedCluster(stdout: string): boolean {
  return stdout.includes(KAPP_APPLYING_MARKER) || stdout.startsWith(TRUNCATION_PREFIX);
}

/**
 * Records what a successful deploy left (`recordLive`) under `key`, or removes the record when
 * none may be kept. Never fails the deploy: without a record the next resync runs kapp.
 */
async function keepDeployRecord(
  frame: StageFrame<DeployView>,
  key: string,
  deps: PipelineDeps,
  kubeconfigYaml: string,
  input: RecordInput,
): Promise<void> {
  const scope = scopeOf(frame.object);
  const log = { object: objectKey(frame.object), stage: 'deploy' };
  try {
    const out = await recordLive((deps.appReader as NonNullable<PipelineDeps['appReader']>)(kubeconfigYaml), input);
    if ('refused' in out) {
      deps.log.info(log, `deploy record not kept: ${out.refused}`);
      await deps.store.delete(key);
      return;
    }
    await privateArtifacts(deps).put(scope, key, JSON.stringify(out.record));
  } catch (err) {
    deps.log.warn(log, `deploy record not kept: ${(err as Error).message}`);
    await deps.store.delete(key).catch(() => {});
  }
}

/**
 * The deadline stopped kapp: writes the progress so far (`status.deploy` unfinished with kapp's
 * output, fenced on the run, conditions `Reconciling`: the reconcile is still going on) and
 * returns the continuation (its `count`-th). A write that finds the App gone or with a newer
 * spec ends the run.
 */
async function continueDeploy(
  run: DeployRun,
  cut: { stdout: string; stderr: string },
  count: number,
): Promise<DeployStageData | undefined> {
  const { data, deps, frame, startedAt, tools } = run;
  const { fence, mask } = frame;
  const progress = deployStatus(
    mask.result({ stdout: cut.stdout, stderr: cut.stderr, exitCode: 0, finished: false }),
    { startedAt, updatedAt: deps.now() },
    run.kappStatus,
  );
  const w = await writeFrameStatus(frame, (cur) =>
    markReconciling(summarizeStatus(cur, fence.generation, { ...run.parts, deploy: progress }), fence.generation),
  );
  if (w.outcome === 'stale' || w.outcome === 'gone') {
    frame.done(w.outcome, { tools });
    return undefined;
  }
  frame.done('continued', { tools });
  // The follow-up's receipt counts this invocation too.
  const receipt = trailWith(deps, data.receipt, 'deploy');
  return {
    ...data,
    ...(receipt ? { receipt } : {}),
    continuation: { count, deployStartedAt: formatStatusTime(startedAt) },
  };
}

/**
 * A continuation whose App was canceled meanwhile (`spec.canceled`, same uid): upstream's kapp
 * was still waiting then, and its cancel watch killed it (reference §3.10: `Deploying: Process
 * was canceled`, exit code -1, `ReconcileFailed`). Here no kapp runs between invocations, so the
 * stage writes that final status itself, without running kapp: kapp's output so far (the
 * progress the cut wrote), the first kapp's start, fenced on the live generation as the final
 * write of a run canceled meanwhile (`closeStage`). The canceled spec's own reconcile then marks
 * `Canceled/paused` and leaves the condition, as upstream's next reconcile does.
 *
 * @returns true when the App was canceled and the run is ended (status written, or the App
 *   changed again meanwhile); false when the continuation goes on as usual.
 * @throws on infrastructure failures: the transport retries the event.
 */
async function endCanceledContinuation(
  data: DeployStageData,
  continuation: NonNullable<DeployStageData['continuation']>,
  deps: PipelineDeps,
): Promise<boolean> {
  const kube = deps.clusters.deployView(data.object.clusterId);
  const kref = appRef(data.object);
  const read = await loadApp(kube, kref);
  if (read.kind !== 'ok' || read.loaded.raw.metadata.uid !== data.object.uid || !read.loaded.app.spec.canceled) {
    return false;
  }
  const done = stageTimer(deps, 'deploy', objectKey(data.object), data.run.generation);
  const mask = secretMaskOf(deps);
  const progress = read.loaded.app.status?.deploy;
  const result = withFriendlyYAMLStrings(
    mask.result(
      attachError(KAPP_ERROR_PREFIX.deploy, {
        stdout: progress?.stdout ?? '',
        stderr: progress?.stderr ?? '',
        error: new CommandCanceledError('kapp', true, 'the App was canceled'),
      }),
    ),
  );
  const parts: RunParts = {
    fetch: fromEventPart(data.fetchStatus),
    template: fromEventPart(data.templateStatus),
    deploy: deployStatus(
      result,
      { startedAt: new Date(continuation.deployStartedAt), updatedAt: deps.now() },
      progress?.kapp,
    ),
  };
  const fence = { uid: data.object.uid, generation: read.loaded.raw.metadata.generation ?? 0 };
  const w = await writeAppStatus(
    kube,
    kref,
    fence,
    (cur) => summarizeStatus(cur, data.run.generation, parts, result),
    mask,
  );
  const outcome = w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : 'failed';
  done(outcome, { error: mask.redact(result.error ?? ''), tools: { runs: 0, ms: 0 } });
  return true;
}
