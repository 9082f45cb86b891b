/**
 * The delete path of an App (`pkg/app/app_reconcile.go` `reconcileDelete`, `app_deploy.go`
 * `delete`), run by the deploy function for the `delete` hand-off of the reconcile step: on the
 * stage frame's delete ends (`../stage.ts` `openDelete`, `closeDelete`), `Deleting`, then
 * `kapp delete` (skipped for `noopDelete` and for namespaces being deleted), then the finalizer
 * is removed.
 */
import { type App, Finalizer } from '../../api/index.js';
import { appKappDeploy, KAPP_ERROR_PREFIX, kappDeleteCommand, UNSUPPORTED_DEPLOY_MESSAGE } from '../../deploy/index.js';
import { runKapp } from '../../deploy/run.js';
import { UrlPolicyError } from '../../fetch/url-policy.js';
import type { DeployView } from '../../kube/port.js';
import {
  attachError,
  KappControllerError,
  outcomeOf,
  resultFromError,
  type StageResult,
} from '../../reconcile/result.js';
import { deployStatus, summarizeStatus } from '../../reconcile/status.js';
import type { PipelineDeps, RunContext } from '../deps.js';
import { observerOf, stageTimer, writeAppStatus } from '../report.js';
import { closeDelete, openDelete } from '../run.js';
import { leaveSource } from '../source-poll.js';
import { appRef, loadApp, objectKey } from '../stage-inputs.js';
import { deployRecordKey } from './deploy.js';
import { APP_KIND } from './kind.js';
import { policedClusterAccess } from './kubeconfig-policy.js';

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
 * The delete path (`reconcileDelete` + `app_deploy.go` `delete`): only for an App with a
 * `deletionTimestamp` and our finalizer (else `gone`, nothing written, no tool); `Deleting`, then
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
  // Only an App being deleted is deleted (the rule of the reconcile step): a delete event for a
  // live App (a forged or misrouted hand-off) stops here, whatever generation it names.
  if (!app.metadata.deletionTimestamp || !(app.metadata.finalizers ?? []).includes(Finalizer.App)) {
    done('gone');
    return;
  }
  const observe = observerOf(deps, ctx.ref, app.status);
  observe.init();
  // The App was just read: the `Deleting` write plans on it.
  const frame = openDelete(deps, APP_KIND, { kube, ref: kref, object: ctx.ref, raw, observe, done });
  const { fence, mask, startedAt } = frame;
  await frame.deleting;

  let result: StageResult;
  let tools = { runs: 0, ms: 0 };
  if (app.spec.noopDelete || (await noopDeleteDueToTerminatingNamespaces(app, kube))) {
    result = { stdout: '', stderr: '', exitCode: 0, finished: true };
  } else {
    try {
      const kapp = appKappDeploy(app.spec);
      const access = await policedClusterAccess(app, kube, mask, deps.config.urlPolicy, deps.egressProxyUrl);
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
            (cur) => summarizeStatus(cur, fence.generation, { deploy: progress }),
            mask,
          );
        },
      );
      tools = { runs: 1, ms: run.durationMs };
      result = mask.result(attachError(KAPP_ERROR_PREFIX.delete, run));
    } catch (err) {
      if (outcomeOf(err) !== 'user') throw err;
      // `Deleting: ` is added only to kapp's own failures (`pkg/deploy/kapp.go`); the delete
      // path says `delete` where the deploy path says `deploy`.
      result = resultFromError(
        err instanceof Error && err.message === UNSUPPORTED_DEPLOY_MESSAGE
          ? new KappControllerError('Unsupported way to delete')
          : err,
        err instanceof UrlPolicyError ? KAPP_ERROR_PREFIX.delete : '',
      );
    }
  }
  const failed = result;
  await closeDelete(frame, {
    result,
    deploy: () => deployStatus(failed, { startedAt, updatedAt: deps.now() }, app.status?.deploy?.kapp),
    tools,
    finalize: async () => {
      await kube.removeFinalizer(kref, Finalizer.App, { uid: ctx.ref.uid });
      if (deps.keyring) await deps.store.delete(await deployRecordKey(deps, ctx.ref)).catch(() => {});
      // Its polled sources forget it now rather than at their next move (`../source-poll.ts`).
      await leaveSource(app.spec.fetch ?? [], ctx.ref, deps).catch((err: unknown) =>
        deps.log.warn({ err: (err as Error).message }, 'leaving the source poll records failed'),
      );
    },
  });
}
