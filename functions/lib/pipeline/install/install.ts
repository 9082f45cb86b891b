/**
 * The install function (kapp-controller `pkg/packageinstall/packageinstall.go`, reference §2.3,
 * §3.9, §3.11): one invocation reconciles one PackageInstall. It selects the Package, writes the
 * App generated from it, and mirrors that App's status; the App then flows through the App
 * pipeline (fetch → template → deploy) unchanged, and every change of it brings the
 * PackageInstall back here (the forwarder's `controlledBy`, `events/forwarder/kinds.ts`).
 *
 * Main flow (§3.11.1): deletion first; the finalizer; `observedGeneration` and `Reconciling`;
 * `spec.values[].secretRef` validated; the Package selected (`../../packaging/select.ts`);
 * `status.version`; the downgrade guard; `status.lastAttemptedVersion`; then the App is created
 * (with its placeholder Secrets) or updated, and its status mirrored (§3.11.5). The status is
 * written once, at the end, as upstream's deferred `updateStatus`.
 *
 * Errors: a user error (selection, validation, an App owned by another controller, an App the
 * API server refuses with 4xx) and an infrastructure error (5xx, conflict, network) alike end
 * the run with `ReconcileFailed <err>` and friendly text `Reconcile failed: <first line, 80
 * chars>...`, and the event is done. Upstream returns both as the reconcile's error, which
 * controller-runtime requeues with its per-object rate limiter; here the forwarder does that from
 * the status (`failedWithError`, `rateLimitedRequeueMs` in `events/forwarder/kinds.ts`: 5 ms ·
 * 2^n, at most 1000 s), one queue message per retry. Thrown (so the transport retries the event)
 * only when that status write fails: nothing is recorded then, so nothing else would retry it.
 * Throwing after a written status, as before, made two retry drivers: SQS's redelivery held the
 * object's FIFO message group for the visibility timeout (180 s, up to 5 receives) while the
 * forwarder's requeues piled up behind it, each retried as often in turn.
 *
 * Deletion (§3.9): the App of the same name is updated with the PackageInstall's
 * `serviceAccountName`, `cluster`, `noopDelete`, `paused`, `canceled` and `defaultNamespace`
 * (so a fixed ServiceAccount reaches it), then deleted; its `Deleting` / `DeleteFailed` is
 * mirrored; once it is gone the finalizer is removed.
 *
 * @module
 */
import type { ObjectEvent, ObjectRef } from '../../../../events/schema.js';
import type { Condition } from '../../api/common.js';
import {
  Annotation,
  DEFAULT_PACKAGING_GLOBAL_NAMESPACE,
  Finalizer,
  KappLambdaConditionType,
} from '../../api/constants.js';
import type { Package } from '../../api/datapackaging.js';
import type { PackageInstall, PackageInstallStatus } from '../../api/packaging.js';
import { parsePackageInstall } from '../../api/parse.js';
import {
  ConflictError,
  GoneError,
  type InstallView,
  type KubeObject,
  PACKAGING_API_VERSION,
  type ResourceRef,
} from '../../kube/port.js';
import { type StatusBounds, writeStatus } from '../../kube/status-write.js';
import {
  newApp,
  placeholderSecrets,
  type RawApp,
  sameApp,
  withPlaceholderSecrets,
} from '../../packaging/app-from-package.js';
import { checkGlobalNamespace, untrustedNote } from '../../packaging/global-trust.js';
import { type PackageSelection, PackageSelectionError, packageSelection } from '../../packaging/select.js';
import { compareVersions } from '../../packaging/versions.js';
import { GLOBAL_NAMESPACE_UID_KEY } from '../../reconcile/controller-config.js';
import { GENERIC_ERROR_DETAIL, KappControllerError } from '../../reconcile/result.js';
import { FRIENDLY } from '../../reconcile/status.js';
import { fitStatus, statusBudgetFor, tooLargeStatus } from '../../reconcile/status-budget.js';
import { type RolloutAccess, StoreRollouts } from '../../rollout/access.js';
import { endCause, releaseCause } from '../../rollout/evaluate.js';
import { planRolloutRecord, type RolloutGate, type RolloutPlan, rolloutGate } from '../../rollout/gate.js';
import { deleteFleetEntry } from '../../rollout/state.js';
import { type PipelineDeps, secretMaskOf } from '../deps.js';
import { type OpenedRun, openRun, writeRunStatus } from '../run.js';
import { parsedReads, type StageKind } from '../stage.js';
import { appRef } from '../stage-inputs.js';
import { rollbackReceipt, withRollback } from './rollback.js';
import { pokeInstalls, waveMembers } from './rollout-pokes.js';

/** Attempts of the App write when it conflicts (upstream's finalizer and status writes retry 5 times). */
const APP_WRITE_ATTEMPTS = 5;

/** The Kubernetes reference of the PackageInstall an event refers to. */
export function packageInstallRef(ref: Pick<ObjectRef, 'namespace' | 'name'>): ResourceRef {
  return { apiVersion: PACKAGING_API_VERSION, kind: 'PackageInstall', namespace: ref.namespace, name: ref.name };
}

/** The install view of a cluster. @throws Error when the registry offers none (a runtime without the install function). */
export function installView(deps: PipelineDeps, clusterId: string): InstallView {
  if (!deps.clusters.installView)
    throw new Error('this runtime has no install view (PackageInstall events unsupported)');
  return deps.clusters.installView(clusterId);
}

/**
 * `friendlyErrMsg` (`pkg/reconciler/status.go`): the first line; longer than 80 characters:
 * its first 80 and `...`; more lines: the first line and `...`.
 */
export function friendlyErrMsg(msg: string): string {
  const [first = '', ...rest] = msg.split('\n');
  if (first.length > 80) return `${first.slice(0, 80)}...`;
  return rest.length > 0 ? `${first}...` : first;
}

const condition = (type: Condition['type'], message?: string): Condition =>
  message === undefined ? { type, status: 'True' } : { type, status: 'True', message };

/** `SetReconciling` (observedGeneration, `[Reconciling]`) with usefulErrorMessage cleared (§3.11.1). */
export function pkgiReconciling(cur: PackageInstallStatus | undefined, generation: number): PackageInstallStatus {
  const { usefulErrorMessage: _cleared, ...rest } = cur ?? {};
  return {
    ...rest,
    observedGeneration: generation,
    conditions: [condition('Reconciling')],
    friendlyDescription: FRIENDLY.reconciling,
  };
}

/** `SetReconcileCompleted(err)`: `[ReconcileSucceeded]`, or `[ReconcileFailed err]` with the friendly first line. */
export function pkgiCompleted(s: PackageInstallStatus, err?: string): PackageInstallStatus {
  if (err === undefined) {
    const { usefulErrorMessage: _cleared, ...rest } = s;
    return { ...rest, conditions: [condition('ReconcileSucceeded')], friendlyDescription: FRIENDLY.reconcileSucceeded };
  }
  return {
    ...s,
    conditions: [condition('ReconcileFailed', err)],
    friendlyDescription: friendlyErrMsg(`Reconcile failed: ${err}`),
  };
}

/** `SetDeleting`: observedGeneration, `[Deleting]`, friendly `Deleting`. */
function pkgiDeleting(cur: PackageInstallStatus | undefined, generation: number): PackageInstallStatus {
  return {
    ...cur,
    observedGeneration: generation,
    conditions: [condition('Deleting')],
    friendlyDescription: FRIENDLY.deleting,
  };
}

/** `SetDeleteCompleted(err)` with the App's usefulErrorMessage. */
function pkgiDeleteFailed(s: PackageInstallStatus, useful: string | undefined): PackageInstallStatus {
  return {
    ...s,
    conditions: [condition('DeleteFailed', GENERIC_ERROR_DETAIL)],
    friendlyDescription: friendlyErrMsg(`Delete failed: ${GENERIC_ERROR_DETAIL}`),
    ...(useful ? { usefulErrorMessage: useful } : {}),
  };
}

/**
 * The size discipline of every PackageInstall status write, as Apps' (`appStatusBounds`): the
 * status is fitted to the object's budget (an error quoting a 1 MB `constraints` string would
 * otherwise make the object larger than etcd stores, and the write would fail on every retry),
 * and a status still rejected as too large becomes `tooLargeStatus`'s one condition and message,
 * keeping `version` and `lastAttemptedVersion` (a PackageInstall has no failure counters).
 */
export function pkgiStatusBounds(generation: number): StatusBounds<PackageInstallStatus> {
  return {
    fit: (status, object) =>
      fitStatus(status, statusBudgetFor(object as unknown as Record<string, unknown>), generation),
    tooLarge: (current, attempted, error) => {
      const t = tooLargeStatus(current, attempted, generation, error.message);
      const { version, lastAttemptedVersion } = attempted;
      return {
        observedGeneration: generation,
        conditions: t.conditions,
        friendlyDescription: t.friendlyDescription,
        usefulErrorMessage: t.usefulErrorMessage,
        ...(version === undefined ? {} : { version }),
        ...(lastAttemptedVersion === undefined ? {} : { lastAttemptedVersion }),
      };
    },
  };
}

/** The downgrade guard's usefulErrorMessage (`packageinstall.go`), verbatim. */
export function downgradeMessage(version: string, lastAttempted: string): string {
  return (
    `Stopped installing matched version '${version}' since last attempted version '${lastAttempted}' is higher.\n` +
    `hint: Add annotation ${Annotation.Downgradable}: "" to PackageInstall to proceed with downgrade`
  );
}

/** The App's conditions, by type. */
function hasCondition(app: RawApp, type: string): boolean {
  const conditions = (app.status as { conditions?: Condition[] } | undefined)?.conditions ?? [];
  return conditions.some((c) => c.type === type && c.status === 'True');
}

/**
 * The PackageInstall status mirrored from its App (§3.11.5): a spec not yet observed or
 * `Reconciling` → `[Reconciling]`; `ReconcileSucceeded` → succeeded; `ReconcileFailed` →
 * `[ReconcileFailed "Error (see .status.usefulErrorMessage for details)"]` with the App's
 * usefulErrorMessage; anything else (a new App without status) leaves `[Reconciling]`.
 *
 * Ours, after upstream's: the App's `kapp-lambda.carvel.dev/Healthy` condition (health after
 * deploy, `../app/health.ts`) is copied after the PackageInstall's own conditions, never first
 * (upstream's condition stays `conditions[0]`), and only while the App has one and the
 * PackageInstall has a condition before it; otherwise an earlier copy is removed (the App
 * reconciles again, or its health is not known yet).
 */
export function mirrorAppStatus(s: PackageInstallStatus, app: RawApp): PackageInstallStatus {
  const mirrored = mirrorAppReconcile(s, app);
  const conditions = mirrored.conditions ?? [];
  const own = conditions.filter((c) => c.type !== KappLambdaConditionType.Healthy);
  const health = ((app.status as { conditions?: Condition[] } | undefined)?.conditions ?? []).find(
    (c) => c.type === KappLambdaConditionType.Healthy,
  );
  if (health && own.length > 0) return { ...mirrored, conditions: [...own, { ...health }] };
  return own.length === conditions.length ? mirrored : { ...mirrored, conditions: own };
}

/** {@link mirrorAppStatus}'s upstream part: the App's reconcile outcome. */
function mirrorAppReconcile(s: PackageInstallStatus, app: RawApp): PackageInstallStatus {
  const status = app.status as { observedGeneration?: number; usefulErrorMessage?: string } | undefined;
  if ((app.metadata.generation ?? 0) !== (status?.observedGeneration ?? 0)) return s;
  if (hasCondition(app, 'Reconciling')) return s;
  if (hasCondition(app, 'ReconcileSucceeded')) return pkgiCompleted(s);
  if (hasCondition(app, 'ReconcileFailed')) {
    return pkgiCompleted(
      { ...s, ...(status?.usefulErrorMessage ? { usefulErrorMessage: status.usefulErrorMessage } : {}) },
      GENERIC_ERROR_DETAIL,
    );
  }
  return s;
}

/** The `error` text of a thrown error. */
function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** The PackageInstall as read, raw (for status writes) and parsed (for decisions). */
export interface LoadedInstall {
  raw: KubeObject;
  pkgi: PackageInstall;
}

/**
 * The PackageInstall as a {@link StageKind}: its own status and bounds ({@link pkgiStatusBounds},
 * no Secret masking: nothing of a tool's output reaches it); always due (an event is a reconcile,
 * as upstream's requeue); nothing holds it here (`paused` and `canceled` are copied onto its App,
 * whose pipeline holds); no `Reconciling` at the start (the status is written once, at the end,
 * as upstream's deferred `updateStatus`), so the run's one log line is the open step's.
 */
export const PKGI_KIND: StageKind<LoadedInstall, PackageInstallStatus> = {
  ref: packageInstallRef,
  ...parsedReads(parsePackageInstall, (raw, pkgi) => ({ raw, pkgi })),
  held: () => false,
  markHeld: (status, generation) => ({ ...status, observedGeneration: generation }),
  status: ({ pkgi }) => pkgi.status,
  invalid: (status, generation, message) => pkgiCompleted(pkgiReconciling(status, generation), message),
  finalizers: [Finalizer.PackageInstall],
  due: () => true,
  keepsRunLine: true,
  write: (kube, ref, fence, mutate, _mask, read) =>
    writeStatus<PackageInstallStatus>(kube, ref, fence, mutate, pkgiStatusBounds(fence.generation), read),
};

/**
 * Handles an object event for a PackageInstall (the install function's entry point). Everything
 * happens in this one invocation; nothing is handed on.
 *
 * @throws KubeApiError when the run could not record its outcome (reading the object, the
 *   finalizer, the status write): the transport retries the event. A reconcile that failed
 *   with its status written returns; the forwarder requeues it from that status.
 */
export async function runInstall(event: ObjectEvent, deps: PipelineDeps): Promise<void> {
  const opened = await openRun(deps, {
    stage: 'install',
    event: event.data,
    view: (id) => installView(deps, id),
    kind: PKGI_KIND,
  });
  if (opened.state === 'deleting') return await deleteInstall(opened.run, deps, event.data.clusterId);
  if (opened.state !== 'run') return;
  const { run } = opened;
  const { kube, done, observe, fence } = run;
  const { pkgi } = run.loaded;
  try {
    await kube.addFinalizer(run.ref, Finalizer.PackageInstall, { uid: fence.uid });
  } catch (err) {
    if (err instanceof GoneError) {
      done('gone');
      return;
    }
    throw err;
  }
  const startedAt = deps.now();
  await observe.started();
  let outcome: 'succeeded' | 'failed' = 'succeeded';
  let error: string | undefined;
  // Kept up to date by the reconcile: `version` is reported even when a later step fails.
  const state: InstallState = { status: pkgiReconciling(pkgi.status, fence.generation) };
  const clusterId = event.data.clusterId;
  try {
    await reconcileInstall(kube, pkgi, state, deps, clusterId);
    const first = state.status.conditions?.[0];
    if (first?.type === 'ReconcileFailed') {
      outcome = 'failed';
      error = first.message;
    }
  } catch (err) {
    // A user error and an infrastructure error alike: the written status is the retry (see the
    // module comment); a status write that throws below leaves the event to the transport.
    outcome = 'failed';
    error = messageOf(err);
    state.status = pkgiCompleted(state.status, error);
  }
  const plan = await planRollout(deps, clusterId, pkgi, state);
  const final = plan?.status ?? state.status;
  const w = await writeRunStatus(run, () => final);
  done(w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : outcome, error ? { error } : {});
  if (plan && w.outcome !== 'stale' && w.outcome !== 'gone') await recordRun(deps, plan);
  if (w.outcome !== 'stale' && w.outcome !== 'gone') {
    // The outcome is the one the status shows (still `Reconciling` while its App runs).
    const shown = final.conditions?.[0];
    await observe.completed(
      shown?.type === 'ReconcileFailed'
        ? { error: secretMaskOf(deps).redact(shown.message ?? '') }
        : { pending: shown?.type !== 'ReconcileSucceeded' },
      (deps.now().getTime() - startedAt.getTime()) / 1000,
    );
  }
}

/** What {@link reconcileInstall} keeps up to date: the status to write and the rollout gate it met. */
interface InstallState {
  status: PackageInstallStatus;
  gate?: RolloutGate;
  /** The generation of the App whose status was mirrored (the fleet entry's last good one). */
  appGeneration?: number;
}

/**
 * The run's fleet index entry and rollout step (`../../rollout/gate.ts`), with the status to
 * write (the Rollout condition appended when a rollout gates it). A store that cannot be read
 * leaves the status as the reconcile made it (logged): the fleet index is a view, never a
 * reason to fail a PackageInstall.
 */
async function planRollout(
  deps: PipelineDeps,
  clusterId: string,
  pkgi: PackageInstall,
  state: InstallState,
): Promise<RolloutPlan | undefined> {
  try {
    return await planRolloutRecord(
      rolloutsOf(deps),
      deps.now(),
      clusterId,
      pkgi,
      state.status,
      state.gate,
      state.appGeneration,
    );
  } catch (err) {
    warnFleetOnce(deps, clusterId, 'the rollout step could not read the store', err);
    return undefined;
  }
}

/**
 * Stores the run's fleet entry and the rollout's next state ({@link recordRollout}), then pokes
 * the PackageInstalls of the waves it released (`./rollout-pokes.ts`); failures are logged (the
 * next event of any member, or the rollout check, evaluates again).
 */
async function recordRun(deps: PipelineDeps, plan: RolloutPlan): Promise<void> {
  try {
    const { released, ended } = await rolloutsOf(deps).record(plan, deps.now());
    const record = plan.gate?.record;
    if (!record || !plan.gate) return;
    for (const i of released) {
      deps.log.info(
        { rollout: `${record.policy}/${record.refName}`, wave: record.waves[i]?.name },
        'rollout wave released',
      );
      await pokeInstalls(deps, waveMembers(record, plan.gate.policy, plan.members, i), releaseCause(record, i));
    }
    // A version held behind the rollout that just ended starts its own now, not at a timer.
    if (ended) await pokeInstalls(deps, plan.members, endCause(record));
  } catch (err) {
    warnFleetOnce(deps, plan.entry.clusterId, 'the run could not record its entry or the rollout', err);
  }
}

/**
 * The run's {@link RolloutAccess}: the runtime's (`PipelineDeps.rollouts`), else the run's store,
 * its policies cached on the cluster registry (which lives as long as the runtime; the store is
 * wrapped per run).
 */
function rolloutsOf(deps: PipelineDeps): RolloutAccess {
  return deps.rollouts ?? new StoreRollouts(deps.store, deps.clusters);
}

/** The fleet-index failures this process has warned about, by cluster and what failed (once each). */
const warnedFleet = new Set<string>();

/**
 * Logs a failure of the fleet index or the rollout store (a warning the first time per cluster
 * and what failed in this process, then at debug): a runtime whose store refuses these keys (the
 * install function in the cloud holds no grant for them yet) would otherwise warn on every run.
 */
function warnFleetOnce(deps: PipelineDeps, clusterId: string, what: string, err: unknown): void {
  const key = `${clusterId}\n${what}`;
  const level = warnedFleet.has(key) ? 'debug' : 'warn';
  warnedFleet.add(key);
  deps.log[level]({ clusterId, err: messageOf(err) }, `fleet index: ${what}`);
}

/**
 * The rollout gate of the PackageInstall (`../../rollout/gate.ts`), its policies cached on the
 * cluster registry (which lives as long as the runtime; the store is wrapped per run). A store
 * that cannot be read fails open: the PackageInstall is not gated, and the failure is logged
 * ({@link warnFleetOnce}), so a runtime without access to the rollout keys behaves as before.
 */
async function gateOf(
  deps: PipelineDeps,
  clusterId: string,
  pkgi: PackageInstall,
  selection: PackageSelection,
): Promise<RolloutGate | undefined> {
  try {
    return await rolloutGate(rolloutsOf(deps), deps.now(), clusterId, pkgi, () => ungatedVersion(selection));
  } catch (err) {
    warnFleetOnce(deps, clusterId, 'the rollout policies could not be read; not gated', err);
    return undefined;
  }
}

/**
 * The PackageInstall's selection, with the global namespace's trust named in a selection error:
 * the resolver left an untrusted global namespace out, so the admin knows the fix.
 */
async function withTrustNote<T>(
  kube: InstallView,
  global: string,
  recordedUid: string | undefined,
  select: () => Promise<T> | T,
): Promise<T> {
  try {
    return await select();
  } catch (err) {
    if (!(err instanceof PackageSelectionError) || !recordedUid) throw err;
    const trust = await checkGlobalNamespace(kube, global, recordedUid);
    if (trust.trusted) throw err;
    throw new PackageSelectionError(`${err.message}${untrustedNote(trust.reason)}`, { cause: err });
  }
}

/** The version `selection` would choose without the rollout gate; `undefined` when it chooses none. */
function ungatedVersion(selection: PackageSelection): string | undefined {
  try {
    return selection.choose().spec.version;
  } catch {
    return undefined;
  }
}

/**
 * The reconcile proper, from `[Reconciling]` to the status to write (§3.11.1), kept in
 * `run.status` as it goes. A rollout policy gating the refName (`../../rollout/gate.ts`) caps
 * the version selected and is kept in `run.gate`.
 *
 * @throws PackageSelectionError, KappControllerError, AlreadyOwnedError (user errors) and
 *   KubeApiError.
 */
async function reconcileInstall(
  kube: InstallView,
  pkgi: PackageInstall,
  run: InstallState,
  deps: PipelineDeps,
  clusterId: string,
): Promise<void> {
  (pkgi.spec.values ?? []).forEach((v, i) => {
    if (!v.secretRef) throw new KappControllerError(`Invalid fields: spec.values[${i}].secretRef: Required value`);
  });
  const global = deps.config.packagingGlobalNamespace ?? DEFAULT_PACKAGING_GLOBAL_NAMESPACE;
  const recordedUid = recordedGlobalNamespaceUid(deps, clusterId);
  const selection = await withTrustNote(kube, global, recordedUid, () =>
    packageSelection(kube, pkgi, {
      globalNamespace: global,
      ...(recordedUid ? { globalNamespaceUid: recordedUid } : {}),
      kubernetesVersion: () => kube.serverVersion(),
      ...(deps.config.kappControllerCompatibleVersion
        ? { kappControllerVersion: deps.config.kappControllerCompatibleVersion }
        : {}),
    }),
  );
  const gate = await gateOf(deps, clusterId, pkgi, selection);
  if (gate) run.gate = gate;
  const pkg: Package = await withTrustNote(kube, global, recordedUid, () => selection.choose(gate?.callbacks));
  const version = pkg.spec.version ?? '';
  run.status = { ...run.status, version };
  const last = pkgi.status?.lastAttemptedVersion;
  const downgradable = pkgi.metadata.annotations?.[Annotation.Downgradable] !== undefined;
  // A rollout's rollback goes down on purpose: to the version the PackageInstall was last healthy at.
  const rollingBack = gate?.rollback?.version === version ? gate.rollback : undefined;
  if (!downgradable && !rollingBack && last && isLower(version, last)) {
    // No requeue upstream: the user adds the annotation or changes the constraints.
    run.status = pkgiCompleted(
      { ...run.status, usefulErrorMessage: downgradeMessage(version, last) },
      GENERIC_ERROR_DETAIL,
    );
    return;
  }
  run.status = { ...run.status, lastAttemptedVersion: version };
  const aref = appRef({ namespace: pkgi.metadata.namespace ?? '', name: pkgi.metadata.name ?? '' });
  for (const secret of placeholderSecrets(pkgi, pkg)) await kube.createSecret(secret);
  const pkgWithSecrets: Package = withPlaceholderSecrets(pkgi, pkg);
  const opts = { defaultSyncPeriodMs: deps.config.timer?.packageInstallDefaultSyncPeriodMs };
  // The App pipeline writes the App's status and finalizer meanwhile, each a new
  // resourceVersion: a conflicting write is computed again from a fresh read, as finalizer
  // changes are, instead of failing the PackageInstall for a moment.
  for (let attempt = 1; ; attempt++) {
    try {
      const existing = await kube.getObject<RawApp>(aref);
      if (!existing) {
        // The new App has no status yet: the PackageInstall stays `Reconciling` until it has one.
        await kube.createApp(newApp(undefined, pkgi, pkgWithSecrets, opts));
        return;
      }
      let desired = newApp(existing, pkgi, pkgWithSecrets, opts);
      if (rollingBack) {
        const owner = { clusterId, namespace: pkgi.metadata.namespace ?? '', name: pkgi.metadata.name ?? '' };
        const receipt = await rollbackReceipt(deps.store, owner, rollingBack.appGeneration);
        if (receipt) {
          rollingBack.receipt = receipt;
          desired = withRollback(desired, existing, receipt);
        }
      }
      const current = sameApp(desired, existing) ? existing : await kube.updateApp(withoutStatus(desired));
      run.status = mirrorAppStatus(run.status, current);
      if (current.metadata.generation !== undefined) run.appGeneration = current.metadata.generation;
      return;
    } catch (err) {
      if (!(err instanceof ConflictError) || attempt >= APP_WRITE_ATTEMPTS) throw err;
    }
  }
}

/** The clusters whose unrecorded global namespace this process has warned about (once each). */
const warnedUnrecorded = new Set<string>();

/**
 * The recorded uid of `clusterId`'s packaging global namespace (`../../packaging/global-trust.ts`):
 * its registry document's, else its `kapp-controller-config`'s. None: the global Packages are
 * trusted unchecked (clusters joined before the record existed), and a warning is logged, once
 * per cluster and process, naming how to record it.
 */
function recordedGlobalNamespaceUid(deps: PipelineDeps, clusterId: string): string | undefined {
  const uid = deps.clusters.packagingGlobalNamespaceUid?.(clusterId) ?? deps.clusterConfig?.packagingGlobalNamespaceUid;
  if (uid === undefined && !warnedUnrecorded.has(clusterId)) {
    warnedUnrecorded.add(clusterId);
    deps.log.warn(
      { clusterId },
      `the packaging global namespace's uid is not recorded: its Packages are trusted unchecked (record it: on the embedded runtime, kapp-controller-config key ${GLOBAL_NAMESPACE_UID_KEY}; in a cloud fleet, npm run cluster -- join --replace)`,
    );
  }
  return uid;
}

/** `version < last` by carvel semver; a version that does not parse is a user error (as upstream's `NewSemver`). */
function isLower(version: string, last: string): boolean {
  try {
    return compareVersions(version, last) < 0;
  } catch (err) {
    throw new KappControllerError(messageOf(err), { cause: err });
  }
}

/** An App to PUT: the status subresource is not written through the main resource. */
function withoutStatus(app: RawApp): RawApp {
  const { status: _status, ...rest } = app;
  return rest as RawApp;
}

/** The PackageInstall fields copied onto its App before deleting it (`reconcileDelete`). */
const DELETE_PROPAGATED = [
  'serviceAccountName',
  'cluster',
  'noopDelete',
  'paused',
  'canceled',
  'defaultNamespace',
] as const;

/**
 * The delete path (§3.9): the App first, then the finalizer, then its fleet index entry. {@link openRun} checked the
 * finalizer (without it the PackageInstall is gone for us) and kept the run's log line open.
 *
 * @throws KubeApiError on infrastructure failures (retried).
 */
async function deleteInstall(
  run: OpenedRun<InstallView, LoadedInstall, PackageInstallStatus>,
  deps: PipelineDeps,
  clusterId: string,
): Promise<void> {
  const { kube, ref, fence, done } = run;
  const { pkgi } = run.loaded;
  const aref = appRef({ namespace: pkgi.metadata.namespace ?? '', name: pkgi.metadata.name ?? '' });
  const app = await kube.getObject<RawApp>(aref);
  if (!app) {
    await kube.removeFinalizer(ref, Finalizer.PackageInstall, { uid: fence.uid });
    done('deleted');
    await deleteFleetEntry(deps.store, clusterId, aref.namespace ?? '', aref.name).catch((err: unknown) => {
      deps.log.warn({ clusterId, err: messageOf(err) }, 'fleet index: the deleted entry could not be removed');
    });
    return;
  }
  let current = app;
  const spec = { ...(app.spec ?? {}) } as Record<string, unknown>;
  let changed = false;
  for (const key of DELETE_PROPAGATED) {
    const value = pkgi.spec[key];
    if (JSON.stringify(spec[key]) === JSON.stringify(value)) continue;
    changed = true;
    if (value === undefined) delete spec[key];
    else spec[key] = value;
  }
  if (changed) current = await kube.updateApp(withoutStatus({ ...app, spec }));
  let status: (cur: PackageInstallStatus | undefined) => PackageInstallStatus = (cur) =>
    pkgiDeleting(cur, fence.generation);
  if (!current.metadata.deletionTimestamp) {
    await kube.deleteApp(aref.namespace ?? '', aref.name, { uid: current.metadata.uid });
  } else if (hasCondition(current, 'DeleteFailed')) {
    const useful = (current.status as { usefulErrorMessage?: string } | undefined)?.usefulErrorMessage;
    status = (cur) => pkgiDeleteFailed(pkgiDeleting(cur, fence.generation), useful);
  }
  const w = await writeRunStatus(run, status);
  done(w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : 'deleted');
}
