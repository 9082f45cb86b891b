/**
 * The deploy stage (`pkg/app/app_deploy.go`, `pkg/deploy/kapp.go`) and the delete path
 * (`reconcileDelete`): the only stage holding a {@link DeployView}. It adds the finalizer
 * before kapp runs (as upstream, so issue #114 behaves the same), mints a short-lived
 * TokenRequest token for the App's ServiceAccount (or reads its kubeconfig Secret), runs
 * `kapp deploy` with the manifest on stdin, streams kapp's output into `status.deploy`
 * every 2 s once kapp starts applying, kills kapp when the App is canceled or deleted, runs
 * `kapp inspect` when asked, and writes the run's final status.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import type { DeployStageData } from '../../../events/schema.js';
import { type App, type AppStatus, Finalizer } from '../api/index.js';
import {
  appClusterAccess,
  appKappDeploy,
  associatedResources,
  type ClusterAccess,
  type CredentialMaterial,
  credentialSource,
  KAPP_ERROR_PREFIX,
  type KappCommand,
  kappDeleteCommand,
  kappDeployCommand,
  kappInspectCommand,
  parseKappAppMeta,
  UNSUPPORTED_DEPLOY_MESSAGE,
  wantsInspect,
} from '../deploy/index.js';
import { TextTail } from '../exec/tail.js';
import type { DeployView, ResourceRef } from '../kube/port.js';
import { KappControllerError } from '../reconcile/errors.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import {
  attachError,
  deployStatus,
  inspectStatus,
  KAPP_APPLYING_MARKER,
  markDeleteCompleted,
  markDeleting,
  resultFromError,
  type StageResult,
} from '../reconcile/status.js';
import { markTruncated } from '../reconcile/status-budget.js';
import { readArtifact, scopeOf } from './artifacts.js';
import {
  appRef,
  loadApp,
  loadFenced,
  makeScratch,
  objectKey,
  partFromSummary,
  type RunParts,
  removeScratch,
  stageTimer,
  summarizeStatus,
  watchForAbort,
  writeAppStatus,
} from './common.js';
import { type PipelineDeps, secretMaskOf } from './deps.js';
import type { RunContext } from './fetch.js';
import { infraStep } from './retry-bound.js';

/**
 * Gathers credentials and builds kapp's cluster access (`pkg/kubeconfig`).
 * @param mask - when given, the minted token and every value of the kubeconfig Secret are
 *   added to it, so kapp's output can never show them in status.
 * @throws KappControllerError `Preparing kapp: …` for user-fixable problems (missing SA or Secret).
 */
export async function clusterAccessFor(app: App, kube: DeployView, mask?: SecretMask): Promise<ClusterAccess> {
  const ns = app.metadata.namespace ?? '';
  const source = credentialSource(app.spec, ns);
  let material: CredentialMaterial;
  if (source.kind === 'serviceAccount') {
    let token: string;
    try {
      token = (await kube.serviceAccountToken(ns, source.serviceAccountName)).token;
      mask?.addValue(token);
    } catch (err) {
      throw new KappControllerError(`Preparing kapp: ${(err as Error).message}`, { cause: err });
    }
    const api = kube.apiServer();
    material = {
      kind: 'serviceAccount',
      token,
      caCert: api.caData ? Buffer.from(api.caData, 'base64') : '',
      server: api.server,
    };
  } else {
    const secret = await kube.getSecret(ns, source.secretName);
    if (!secret) {
      throw new KappControllerError(
        `Preparing kapp: Getting kubeconfig secret: secrets "${source.secretName}" not found`,
      );
    }
    mask?.addSecretData(secret.data, { structured: false });
    material = { kind: 'kubeconfigSecret', secret };
  }
  return appClusterAccess({ name: app.metadata.name ?? '', namespace: ns, spec: app.spec }, material);
}

/**
 * Bound of kapp's output kept in memory, per stream: 2 MiB for the runner's result, 1 Mi code
 * units for the progress copy. Both are above what status keeps (the status budget cuts
 * further, with the `[output truncated]` marker), so the most useful tail always survives.
 */
export const KAPP_OUTPUT_BYTES = 2 * 1024 * 1024;
/** See {@link KAPP_OUTPUT_BYTES}. */
export const KAPP_PROGRESS_CHARS = 1024 * 1024;

/** kapp's output so far, as handed to a progress callback. */
export interface KappProgress {
  /** The kept tail of stdout, behind `[output truncated]\n` when its head was dropped. */
  stdout: string;
  /** The kept tail of stderr, likewise. */
  stderr: string;
  /** Whether kapp's stdout ever contained {@link KAPP_APPLYING_MARKER}. */
  applying: boolean;
}

/**
 * Runs a kapp command with cancellation (App canceled or deleted) and progress streaming.
 * `onProgress` is called at most every `intervalMs` with kapp's output so far. What is kept of
 * kapp's output is bounded ({@link KAPP_OUTPUT_BYTES}, {@link KAPP_PROGRESS_CHARS}); a result
 * whose head was dropped carries the truncation marker.
 */
async function runKapp(
  cmd: KappCommand,
  stdin: string | undefined,
  deps: PipelineDeps,
  watch: { kube: DeployView; ref: ResourceRef; uid: string; cancelOnDelete: boolean },
  onProgress: (progress: KappProgress) => Promise<void>,
  writable: readonly string[] = [],
) {
  const stdout = new TextTail(KAPP_PROGRESS_CHARS, KAPP_APPLYING_MARKER);
  const stderr = new TextTail(KAPP_PROGRESS_CHARS);
  const watcher = watchForAbort(watch.kube, watch.ref, watch.uid, deps, {
    intervalMs: deps.config.deployProgressIntervalMs ?? 2000,
    abortOnDelete: watch.cancelOnDelete,
    failureMessage: 'deploy progress update failed',
    onTick: () =>
      onProgress({
        stdout: markTruncated(stdout.text(), stdout.truncated),
        stderr: markTruncated(stderr.text(), stderr.truncated),
        applying: stdout.seen,
      }),
  });
  try {
    const run = await deps.runner.run({
      cmd: cmd.bin,
      args: cmd.args,
      env: cmd.env,
      stdin,
      writable,
      signal: watcher.signal,
      timeoutMs: deps.config.toolTimeoutMs,
      maxOutputBytes: KAPP_OUTPUT_BYTES,
      onOutput: (chunk, stream) => {
        if (stream === 'stdout') stdout.push(chunk);
        else stderr.push(chunk);
      },
    });
    return {
      ...run,
      stdout: markTruncated(run.stdout, run.truncated.stdout),
      stderr: markTruncated(run.stderr, run.truncated.stderr),
    };
  } finally {
    // A progress write still in flight must land before the caller writes the final status,
    // or it would overwrite it with `finished: false`.
    await watcher.stop();
  }
}

/** Adds the finalizer before kapp runs (`blockDeletion`). @returns an error result when that fails. */
async function blockDeletion(kube: DeployView, ref: ResourceRef, uid: string): Promise<StageResult | undefined> {
  try {
    await kube.addFinalizer(ref, Finalizer.App, { uid });
    return undefined;
  } catch (err) {
    return resultFromError(err, 'Blocking for deploy: ');
  }
}

/**
 * Runs the deploy stage for a hand-off from template.
 *
 * @throws on infrastructure failures: the transport retries the event.
 */
export async function runDeploy(data: DeployStageData, deps: PipelineDeps): Promise<void> {
  const ref = data.object;
  const kube = deps.clusters.deployView(ref.clusterId);
  const kref = appRef(ref);
  const fence = { uid: ref.uid, generation: data.run.generation };
  const done = stageTimer(deps, 'deploy', objectKey(ref), data.run.generation);
  const fenced = await loadFenced(kube, kref, fence);
  if (fenced.stop) {
    done(fenced.stop);
    return;
  }
  const { app } = fenced.loaded;
  const mask = secretMaskOf(deps);
  const parts: RunParts = {
    fetch: partFromSummary(data.fetchStatus),
    template: partFromSummary(data.templateStatus),
  };
  const startedAt = deps.now();
  let tools = { runs: 0, ms: 0 };
  let result: StageResult;
  let kappStatus = app.status?.deploy?.kapp;
  let access: ClusterAccess | undefined;

  const blocked = await blockDeletion(kube, kref, ref.uid);
  if (blocked) {
    result = blocked;
  } else {
    // A private manifest opens only with this run's cluster key (and for the App's namespace).
    const manifest = await infraStep('reading the rendered manifest', () =>
      readArtifact(deps, scopeOf(ref), data.artifacts.manifestKey),
    );
    if (!manifest) throw new Error(`manifest ${data.artifacts.manifestKey} is missing from the object store`);
    const work = await makeScratch(deps, 'deploy');
    try {
      const kapp = appKappDeploy(app.spec);
      access = await clusterAccessFor(app, kube, mask);
      const metadataFile = path.join(work, 'app-metadata.yml');
      const cmd = kappDeployCommand({
        kapp,
        access,
        metadataFile,
        controllerRawOptions: deps.config.kappDeployRawOptions,
      });
      let flushAll = false;
      const run = await runKapp(
        cmd,
        manifest.toString('utf8'),
        deps,
        { kube, ref: kref, uid: ref.uid, cancelOnDelete: true },
        async ({ stdout, stderr, applying }) => {
          flushAll ||= applying;
          if (!flushAll) return;
          const progress = deployStatus(
            mask.result({ stdout, stderr, exitCode: 0, finished: false }),
            { startedAt, updatedAt: deps.now() },
            kappStatus,
          );
          await writeAppStatus(
            kube,
            kref,
            fence,
            (cur) => summarizeStatus(cur, fence.generation, { ...parts, deploy: progress as Record<string, unknown> }),
            mask,
          );
        },
        [work],
      );
      tools = { runs: 1, ms: run.durationMs };
      result = mask.result(attachError(KAPP_ERROR_PREFIX.deploy, run));
      const meta = parseKappAppMeta(await readFile(metadataFile, 'utf8').catch(() => ''));
      kappStatus = associatedResources(meta) ? { associatedResources: associatedResources(meta) } : kappStatus;
    } catch (err) {
      if (!(err instanceof KappControllerError)) throw err;
      result = resultFromError(err);
    } finally {
      await removeScratch(work);
    }
  }
  parts.deploy = deployStatus(result, { startedAt, updatedAt: deps.now() }, kappStatus) as Record<string, unknown>;

  // Inspect after every deploy attempt when asked (status.deploy is now always set).
  const kappSpec = app.spec.deploy?.[0]?.kapp;
  if (kappSpec && wantsInspect(kappSpec) && access) {
    let inspect: StageResult;
    try {
      const cmd = kappInspectCommand({ kapp: kappSpec, access });
      const run = await runKapp(
        cmd,
        undefined,
        deps,
        { kube, ref: kref, uid: ref.uid, cancelOnDelete: true },
        async () => {},
      );
      tools = { runs: tools.runs + 1, ms: tools.ms + run.durationMs };
      inspect = mask.result(attachError(KAPP_ERROR_PREFIX.inspect, run));
    } catch (err) {
      if (!(err instanceof KappControllerError)) throw err;
      // `Inspecting: ` is added only to kapp's own failures (`pkg/deploy/kapp.go`).
      inspect = resultFromError(err);
    }
    parts.inspect = (inspectStatus(inspect, { updatedAt: deps.now() }) as Record<string, unknown>) ?? null;
  }

  const final = (cur: AppStatus | undefined) => summarizeStatus(cur, fence.generation, parts, result);
  let w = await writeAppStatus(kube, kref, fence, final, mask);
  if (w.outcome === 'stale') {
    // Upstream's running reconcile always writes its result, also when the App was canceled
    // or paused meanwhile (that bumps the generation); the follow-up then only marks
    // `Canceled/paused` and leaves the condition. Any other spec change is the next run's.
    const live = await loadApp(kube, kref);
    const held = live.kind === 'ok' && (live.loaded.app.spec.canceled || live.loaded.app.spec.paused);
    if (live.kind === 'ok' && held && live.loaded.raw.metadata.uid === ref.uid) {
      w = await writeAppStatus(
        kube,
        kref,
        { uid: ref.uid, generation: live.loaded.raw.metadata.generation ?? 0 },
        final,
        mask,
      );
    }
  }
  const outcome =
    w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : result.error || w.tooLarge ? 'failed' : 'succeeded';
  done(outcome, { error: result.error && mask.redact(result.error), tools });
}

/** A namespace that is being deleted or already gone. */
async function terminating(kube: DeployView, name: string): Promise<boolean> {
  const ns = await kube.getNamespace(name);
  return !ns || ns.phase === 'Terminating' || Boolean(ns.metadata.deletionTimestamp);
}

/**
 * `noopDeleteDueToTerminatingNamespaces` (`pkg/app/app.go`, v0.40+): skip `kapp delete` when
 * the App deployed with a ServiceAccount, its namespace is terminating or gone, and so is every
 * namespace its resources live in (none cluster-scoped), so namespace deletion is not blocked
 * once the ServiceAccount is gone.
 */
export async function noopDeleteDueToTerminatingNamespaces(app: App, kube: DeployView): Promise<boolean> {
  const kapp = app.status?.deploy?.kapp;
  if (!kapp || !app.spec.serviceAccountName) return false;
  if (!(await terminating(kube, app.metadata.namespace ?? ''))) return false;
  for (const ns of kapp.associatedResources?.namespaces ?? []) {
    if (ns === '(cluster)' || !(await terminating(kube, ns))) return false;
  }
  return true;
}

/**
 * The delete path (`reconcileDelete` + `app_deploy.go` `delete`): `Deleting`, then
 * `kapp delete` (skipped for `noopDelete`), then the finalizer is removed; on failure
 * `DeleteFailed` and the finalizer stays (retried with the failure backoff).
 *
 * @throws on infrastructure failures: the transport retries the event.
 */
export async function runDelete(ctx: RunContext, deps: PipelineDeps): Promise<void> {
  const kube = deps.clusters.deployView(ctx.clusterId);
  const kref = appRef(ctx.ref);
  const done = stageTimer(deps, 'delete', objectKey(ctx.ref), ctx.run.generation);
  const loaded = await loadApp(kube, kref);
  if (loaded.kind !== 'ok' || loaded.loaded.raw.metadata.uid !== ctx.ref.uid) {
    done('gone');
    return;
  }
  const { app, raw } = loaded.loaded;
  if (!(app.metadata.finalizers ?? []).includes(Finalizer.App)) {
    done('gone');
    return;
  }
  const fence = { uid: raw.metadata.uid, generation: raw.metadata.generation ?? 0 };
  const startedAt = deps.now();
  const mask = secretMaskOf(deps);
  await writeAppStatus(kube, kref, fence, (cur) => markDeleting(cur, fence.generation) as AppStatus);

  let result: StageResult;
  let tools = { runs: 0, ms: 0 };
  if (app.spec.noopDelete || (await noopDeleteDueToTerminatingNamespaces(app, kube))) {
    result = { stdout: '', stderr: '', exitCode: 0, finished: true };
  } else {
    try {
      const kapp = appKappDeploy(app.spec);
      const access = await clusterAccessFor(app, kube, mask);
      const cmd = kappDeleteCommand({ kapp, access });
      const run = await runKapp(
        cmd,
        undefined,
        deps,
        { kube, ref: kref, uid: ctx.ref.uid, cancelOnDelete: false },
        async ({ stdout, stderr }) => {
          const progress = deployStatus(
            mask.result({ stdout, stderr, exitCode: 0, finished: false }),
            { startedAt, updatedAt: deps.now() },
            app.status?.deploy?.kapp,
          );
          await writeAppStatus(
            kube,
            kref,
            fence,
            (cur) => summarizeStatus(cur, fence.generation, { deploy: progress as Record<string, unknown> }),
            mask,
          );
        },
      );
      tools = { runs: 1, ms: run.durationMs };
      result = mask.result(attachError(KAPP_ERROR_PREFIX.delete, run));
    } catch (err) {
      if (!(err instanceof KappControllerError)) throw err;
      // `Deleting: ` is added only to kapp's own failures (`pkg/deploy/kapp.go`); the delete
      // path says `delete` where the deploy path says `deploy`.
      result = resultFromError(
        err.message === UNSUPPORTED_DEPLOY_MESSAGE ? new KappControllerError('Unsupported way to delete') : err,
      );
    }
  }
  if (!result.error) {
    await kube.removeFinalizer(kref, Finalizer.App, { uid: ctx.ref.uid });
    done('deleted', { tools });
    return;
  }
  const deploy = deployStatus(result, { startedAt, updatedAt: deps.now() }, app.status?.deploy?.kapp);
  await writeAppStatus(
    kube,
    kref,
    fence,
    (cur) => {
      const next = summarizeStatus(cur, fence.generation, { deploy: deploy as Record<string, unknown> });
      return markDeleteCompleted(next, result) as AppStatus;
    },
    mask,
  );
  done('failed', { error: result.error && mask.redact(result.error), tools });
}
