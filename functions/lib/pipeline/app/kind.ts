/**
 * The App as a {@link StageKind} of the frame (`../stage.ts`).
 */

import { Finalizer, parseApp } from '../../api/index.js';
import { markPausedOrCanceled, markReconciling, writesImmediately } from '../../reconcile/status.js';
import { isReadyAt } from '../../reconcile/timer.js';
import { invalidAppStatus, writeAppStatus } from '../report.js';
import { parsedReads, type StageKind } from '../stage.js';
import { appRef, type LoadedApp } from '../stage-inputs.js';
import { hasRollbackAnnotation } from './receipts.js';
/**
 * The App as a {@link StageKind}: `spec.paused` or `spec.canceled` hold it; the deletion is
 * checked first; forced by a spec change, `added`, `ref-changed` (a referenced Secret/ConfigMap
 * changed, upstream's force flag), `modified` of an App with the rollback annotations of
 * `./receipts.ts` (they changed), or a run left `Reconciling` where none can be in flight
 * (`config.oneRunPerObject`, the embedded queue: that run was lost); else due by the App timer.
 * `resync` relies on the timer, so a duplicated resync event after a run is a no-op.
 */
export const APP_KIND: StageKind<LoadedApp> = {
  ref: appRef,
  ...parsedReads(parseApp, (raw, app) => ({ raw, app })),
  held: ({ app }) => Boolean(app.spec.canceled || app.spec.paused),
  markHeld: (status, generation) => markPausedOrCanceled(status, generation),
  status: ({ app }) => app.status,
  invalid: invalidAppStatus,
  finalizers: [Finalizer.App],
  due: ({ loaded: { raw, app }, reason, specChanged, generation, key, soon, deps }) => {
    // Only where no other run of this App can be in flight (`oneRunPerObject`): its run was lost.
    const lostRun = !specChanged && deps.config.oneRunPerObject === true && writesImmediately(app.status);
    if (lostRun) deps.log.warn({ object: key, generation, reason }, 'run left in flight (Reconciling); running again');
    // `modified` with the spec unchanged on an App with rollback annotations: they changed (the
    // forwarder's App change key), so the App is deployed from (or back off) a receipt's render at
    // once. For any other App a `modified` of the same generation is a duplicate: no run.
    const forced =
      specChanged ||
      lostRun ||
      reason === 'added' ||
      reason === 'ref-changed' ||
      (reason === 'modified' && hasRollbackAnnotation(raw));
    return forced || isReadyAt(app, soon, { config: deps.config.timer });
  },
  reconciling: { mark: (status, generation) => markReconciling(status, generation) },
  // A resync that changed nothing writes no status (the forwarder's `appSettled` counts on it).
  quietWhenUnchanged: true,
  write: (kube, ref, fence, mutate, mask, read) => writeAppStatus(kube, ref, fence, mutate, mask, read),
};
