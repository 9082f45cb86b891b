/**
 * The rollback run: an App annotated `kapp-lambda.carvel.dev/rollback-to: <receipt id>` for its
 * current generation (`./receipts.ts` {@link activeRollback}) is deployed from that receipt's
 * rendered manifest, straight to the deploy stage: no fetch, no template. The status keeps
 * kapp-controller's shape: `status.fetch` and `status.template` stay as the last run left them,
 * `status.deploy` and the conditions are the deploy's, as for any run. A receipt that is gone,
 * or whose render expired, fails the reconcile (`ReconcileFailed`) with `Rolling back: …`.
 *
 * @module
 */

import type { ObjectRef } from '../../../../events/schema.js';
import { PRIVATE_TEMPLATE_KEY_PATTERN, TEMPLATE_KEY_PATTERN } from '../../artifact/keys.js';
import type { KubeObject } from '../../kube/port.js';
import { readReceipt } from '../../receipt/receipt.js';
import { KappControllerError, resultFromError } from '../../reconcile/result.js';
import type { ObjectStore } from '../../store/port.js';
import type { PipelineDeps, RunContext, StageOutput } from '../deps.js';
import { infraStep } from '../retry-bound.js';
import { closeStage, openStage } from '../stage.js';
import type { LoadedApp } from '../stage-inputs.js';
import { APP_KIND } from './kind.js';
import { activeRollback, ROLLBACK_TO_ANNOTATION, receiptOnEnd, trailWith } from './receipts.js';

/** A receipt of the App, or `undefined` when it is gone or unreadable (`TypeError`: bad JSON). */
function storedReceipt(store: ObjectStore, ref: ObjectRef, id: string) {
  return readReceipt(store, ref, id).catch((err: unknown) => {
    if (err instanceof TypeError) return undefined;
    throw err;
  });
}

/** A shared or sealed rendered manifest's key: the only keys a deploy event may name. */
function isRenderedManifestKey(key: string): boolean {
  return TEMPLATE_KEY_PATTERN.test(key) || PRIVATE_TEMPLATE_KEY_PATTERN.test(key);
}

/** Prefix of a rollback's own failure (no receipt, no render). */
export const ROLLBACK_ERROR_PREFIX = 'Rolling back: ';

/**
 * Starts the rollback run of the App to receipt `receiptId` (the reconcile step has decided the
 * run is due).
 *
 * @returns the deploy hand-off, or nothing when the run ended here (failed status written, stale).
 * @throws StoreError / KubeApiError on infrastructure failures: the transport retries the event.
 */
export async function runRollback(
  ctx: RunContext,
  loaded: LoadedApp,
  receiptId: string,
  deps: PipelineDeps,
  latest?: import('../../kube/port.js').KubeObject,
): Promise<StageOutput> {
  const receipt = await infraStep('reading the receipt', () => storedReceipt(deps.store, ctx.ref, receiptId));
  const rendered = receipt?.inputs.render?.key;
  // A receipt is the App's cluster's to write (a tenant's run may plant one): a key that is no
  // rendered manifest (any object of the bucket) is refused here, as the deploy event's schema
  // would refuse it by throwing, run after run.
  const manifestKey = rendered && isRenderedManifestKey(rendered) ? rendered : undefined;
  const present = manifestKey ? await infraStep('reading the receipt', () => deps.store.head(manifestKey)) : undefined;
  if (receipt && manifestKey && present) {
    const trail = trailWith(deps, undefined, 'fetch', { rollbackOf: receipt.id });
    const fetchKey = receipt.inputs.fetch?.key;
    return {
      deploy: {
        object: ctx.ref,
        run: ctx.run,
        artifacts: { ...(fetchKey ? { fetchKey } : {}), manifestKey },
        rollbackOf: receipt.id,
        ...(trail ? { receipt: trail } : {}),
      },
    };
  }
  const opened = await openStage(deps, {
    stage: 'fetch',
    object: ctx.ref,
    generation: ctx.run.generation,
    view: (id) => deps.clusters.fetchView(id),
    kind: APP_KIND,
    loaded,
    runStartedAt: ctx.run.startedAt,
    ...(latest ? { latest } : {}),
  });
  if (opened.stop) return {};
  const why = !receipt
    ? `receipt "${receiptId}" of this App not found`
    : !rendered
      ? `receipt "${receiptId}" has no rendered manifest (its reconcile failed before the render)`
      : !manifestKey
        ? `receipt "${receiptId}" names no rendered manifest`
        : `the rendered manifest of receipt "${receiptId}" is no longer stored`;
  await closeStage(opened.frame, {
    parts: {},
    result: resultFromError(new KappControllerError(why), ROLLBACK_ERROR_PREFIX),
    last: true,
    success: 'succeeded',
    tools: { runs: 0, ms: 0 },
    receipt: receiptOnEnd(deps, { object: ctx.ref, run: ctx.run, stage: 'fetch' }),
  });
  return {};
}

/**
 * Why the deploy function must not apply a rollback hand-off (`rollbackOf`, `manifestKey`), or
 * `undefined` when it may: the App (as just read) must still ask for that receipt for its current
 * generation, and the receipt must hold that render. The fetch function hands deploy no other
 * manifest (the sender check binds it to this shape), so a fetch function that was taken over
 * cannot make deploy apply an arbitrary manifest to an App that asked for no rollback.
 *
 * @throws StoreError when the receipt cannot be read (the transport retries the event)
 */
export async function rollbackRefusal(
  raw: KubeObject,
  ref: ObjectRef,
  rollbackOf: string,
  manifestKey: string,
  store: ObjectStore,
): Promise<string | undefined> {
  if (activeRollback(raw) !== rollbackOf) {
    return `the App's ${ROLLBACK_TO_ANNOTATION} does not name receipt ${rollbackOf} for its generation`;
  }
  const receipt = await storedReceipt(store, ref, rollbackOf);
  if (receipt?.inputs.render?.key !== manifestKey) {
    return `receipt ${rollbackOf} does not hold the manifest the rollback names`;
  }
  return undefined;
}
