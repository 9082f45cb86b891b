/**
 * The pipeline's side of reconcile receipts (`../../receipt/receipt.ts`) and of the rollback that
 * deploys a receipt's render:
 *
 * - each stage adds its measure (`deps.meter`) to the trail its hand-off event carries;
 * - the stage that writes the run's final status then keeps the receipt (`closeStage` calls
 *   {@link receiptOnEnd}'s callback after the status write, alongside the run's Events): one
 *   PUT and one LIST, never before the status and never failing the reconcile;
 * - a run that succeeded without running any tool (the no-op resync: pinned fetch and render
 *   cache hits, no drift so no kapp) keeps no receipt, so it adds no store request: its render
 *   is the one of the latest receipt already;
 * - an App annotated {@link ROLLBACK_TO_ANNOTATION} for its current generation
 *   ({@link ROLLBACK_GENERATION_ANNOTATION}) is deployed from that receipt's render, without
 *   fetch or template, until its spec changes or the annotations are removed
 *   (`npm run receipts -- rollback`).
 *
 * @module
 */
import type { ObjectRef, StageRun } from '../../../../events/schema.js';
import { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION } from '../../api/constants.js';
import { parseArtifactKey } from '../../artifact/keys.js';
import { isPrivateKey } from '../../artifact/sealed.js';
import type { KubeObject } from '../../kube/port.js';
import {
  addRequests,
  buildReceipt,
  keepReceipt,
  MAX_TOOL_RUNS_PER_STAGE,
  type ReceiptStage,
  type ReceiptTrail,
  type StageMeasure,
} from '../../receipt/receipt.js';
import type { PipelineDeps } from '../deps.js';

export { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION };

/** Most measures a trail carries; later ones (deploy continuations) are added to the last. */
const MAX_TRAIL_STAGES = 16;

/**
 * The trail a hand-off carries on: `prior` (the event's) with this stage's measure so far.
 * @returns `undefined` when the runtime meters nothing (no `deps.meter`).
 */
export function trailWith(
  deps: PipelineDeps,
  prior: ReceiptTrail | undefined,
  stage: ReceiptStage,
  extra: Partial<Omit<ReceiptTrail, 'stages'>> = {},
): ReceiptTrail | undefined {
  if (!deps.meter) return prior;
  const stages = [...(prior?.stages ?? [])];
  const own = deps.meter.measure(stage);
  const last = stages.at(-1);
  if (stages.length >= MAX_TRAIL_STAGES && last) stages[stages.length - 1] = merged(last, own);
  else stages.push(own);
  return { ...prior, ...extra, stages };
}

function merged(a: StageMeasure, b: StageMeasure): StageMeasure {
  return {
    stage: b.stage,
    ms: a.ms + b.ms,
    tools: [...a.tools, ...b.tools].slice(0, MAX_TOOL_RUNS_PER_STAGE),
    store: addRequests(a.store, b.store),
  };
}

/** What the stage that may end a run knows for its receipt. */
export interface ReceiptContext {
  object: ObjectRef;
  run: StageRun;
  stage: ReceiptStage;
  /** The trail the stage's event carried. */
  trail?: ReceiptTrail;
  fetchKey?: string;
  manifestKey?: string;
  /** Set by the stage once known (template: the render-input hash of a shared render). */
  renderInputHash?: string;
}

/**
 * The callback `closeStage` calls once the run's final status is written: keeps the run's
 * receipt (see the module comment for when none is kept). Never throws.
 */
export function receiptOnEnd(deps: PipelineDeps, ctx: ReceiptContext): (end: { error?: string }) => Promise<void> {
  return async (end) => {
    const trail = trailWith(
      deps,
      ctx.trail,
      ctx.stage,
      ctx.renderInputHash ? { renderInputHash: ctx.renderInputHash } : {},
    );
    if (!trail) return;
    const ranTools = trail.stages.some((s) => s.tools.length > 0);
    if (end.error === undefined && !ranTools) return;
    try {
      const receipt = buildReceipt({
        owner: ctx.object,
        uid: ctx.object.uid,
        generation: ctx.run.generation,
        runId: ctx.run.runId,
        startedAt: new Date(ctx.run.startedAt),
        endedAt: deps.now(),
        ...(end.error !== undefined ? { error: end.error } : {}),
        trail,
        ...(ctx.fetchKey ? { fetch: artifactRef(ctx.fetchKey) } : {}),
        ...(ctx.manifestKey ? { render: artifactRef(ctx.manifestKey) } : {}),
        ...(trail.rollbackOf ? { rollbackOf: trail.rollbackOf } : {}),
      });
      await keepReceipt(deps.store, receipt, deps.log);
    } catch (err) {
      deps.log.warn(
        { object: `${ctx.object.namespace}/${ctx.object.name}`, err: (err as Error).message },
        'receipt not kept',
      );
    }
  };
}

function artifactRef(key: string): { key: string; digest?: string; private: boolean } {
  const digest = parseArtifactKey(key)?.sha256;
  return { key, ...(digest ? { digest } : {}), private: isPrivateKey(key) };
}

/**
 * Whether the App carries {@link ROLLBACK_TO_ANNOTATION} at all (a rollback, or one cleared to
 * `""` by `npm run receipts -- rollback --clear`): only then does a `modified` event with the spec
 * unchanged run at once (the annotations changed), so duplicated events of other Apps stay no-ops.
 */
export function hasRollbackAnnotation(raw: KubeObject): boolean {
  return raw.metadata.annotations?.[ROLLBACK_TO_ANNOTATION] !== undefined;
}

/**
 * The receipt id the App is rolled back to, when its rollback annotations ask for one for its
 * current generation; `undefined` otherwise (none, cleared, or the spec changed since).
 */
export function activeRollback(raw: KubeObject): string | undefined {
  const a = raw.metadata.annotations ?? {};
  const id = a[ROLLBACK_TO_ANNOTATION];
  if (!id) return undefined;
  return a[ROLLBACK_GENERATION_ANNOTATION] === String(raw.metadata.generation ?? 0) ? id : undefined;
}
