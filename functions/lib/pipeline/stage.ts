/**
 * The stage frame: how every stage of a run opens and closes, written once (style.md §1, Flux's
 * deferred summarize-and-patch; kapp-controller's `updateStatus` / `flushUpdateStatus` in
 * `pkg/app/app.go`). A stage calls {@link openStage}, does only its own work, and hands its
 * parts and result to {@link closeStage}, which applies the one write policy:
 *
 * - a failure (or the run's last stage) writes the final status (`ReconcileSucceeded` /
 *   `ReconcileFailed`) with every part of the run; for a kind that
 *   {@link StageKind.quietWhenUnchanged} (the App), a success that says nothing new but stage
 *   times writes nothing;
 * - a run the status announced (`Reconciling`: the spec changed) writes the parts now;
 * - otherwise the parts are deferred: the next stage's event carries them, except that a part
 *   longer than an event may carry is written now (the final write keeps it, see
 *   `../reconcile/status.ts` `summarizeStatus`);
 * - a write that finds the object gone or with a newer spec ends the stage with that outcome.
 *
 * The object a stage works for is described by a {@link StageKind}: the App (`APP_KIND` of
 * `./app/kind.ts`), a PackageRepository (`PKGR_KIND` of `./repo/index-repo.ts`, whose status is
 * the App's without `inspect`, so the same summarizer, bounds and write serve both) or a
 * PackageInstall (`PKGI_KIND` of `./install/install.ts`, its own status and bounds).
 *
 * Both ends of a run are framed in `./run.ts` ({@link openRun} is the first step of every object
 * event; {@link openDelete} and {@link closeDelete} frame a delete path); what a run reports (THE
 * App status write, the stage-run log line, the observer, a failed run's Event text) is
 * `./report.ts`.
 */

import type { ObjectEventData, ObjectRef, StageRun } from '../../../events/schema.js';
import type { AppStatus, ParseResult } from '../api/index.js';
import type { FetchView, KubeObject, KubeReader, ResourceRef } from '../kube/port.js';
import type { KnownObject, RunFence, StatusWriteResult } from '../kube/status-write.js';
import type { StageOutcome } from '../log.js';
import type { ReconcileObserver } from '../observe/reconcile.js';
import type { StageResult } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import {
  cutForEvent,
  type RunParts,
  type StagePart,
  summarizeStatus,
  unchangedButRunTimes,
  writesImmediately,
} from '../reconcile/status.js';
import { syncModeOf, type TimerConfig } from '../reconcile/timer.js';
import { type PipelineDeps, secretMaskOf } from './deps.js';
import { eventErrorText, observerOf, stageTimer, writeAppStatus } from './report.js';
import { type LoadedApp, objectKey } from './stage-inputs.js';

/** Why a stage stops without work: the object is gone or recreated, has a newer spec, or is paused. */
export type StageStop = 'gone' | 'stale' | 'paused';

/** Tolerance for a resync event that arrives a little before the timer says due, ms. */
export const RESYNC_EARLY_TOLERANCE_MS = 1000;

/** What {@link StageKind.due} decides on. */
export interface DueInput<L> {
  /** The object as read. */
  loaded: L;
  /** Why the event was sent (`added`, `ref-changed`, `resync`, ...). */
  reason: ObjectEventData['reason'];
  /** The spec changed since the status last observed it (`generation != observedGeneration`). */
  specChanged: boolean;
  /** The object's generation. */
  generation: number;
  /** The object's log key ({@link objectKey}). */
  key: string;
  /** The view the run holds (a kind may read what the object references). */
  kube: KubeReader;
  /** Now plus the resync tolerance: a resync event that arrives a little early is due. */
  soon: Date;
  /** The pipeline's config and log. */
  deps: Pick<PipelineDeps, 'config' | 'log'>;
}

/**
 * What a stage frame needs to know about the kind of object it works for.
 *
 * @typeParam L - the object as read (raw for status writes, parsed for decisions).
 * @typeParam S - the object's status (the App's for Apps and PackageRepositories).
 */
export interface StageKind<L extends { raw: KubeObject }, S = AppStatus> {
  /** The Kubernetes reference of the object an event refers to. */
  ref(object: Pick<ObjectRef, 'namespace' | 'name'>): ResourceRef;
  /**
   * Reads and parses the object. `invalid`: the API server accepted it but our schema rejects it
   * (only possible with a CRD older than ours), with the field path; a later stage stops on it as
   * `gone`, {@link openRun} writes it as a failed reconcile.
   */
  load(
    kube: KubeReader,
    ref: ResourceRef,
  ): Promise<{ kind: 'ok'; loaded: L } | { kind: 'gone' } | { kind: 'invalid'; raw: KubeObject; message: string }>;
  /** Parses an object already in hand (a run's copy, {@link RunCopy}); `undefined` when it does not fit. */
  parse(raw: KubeObject): L | undefined;
  /** True when the object's spec holds its reconcile (paused, canceled). */
  held(loaded: L): boolean;
  /**
   * The status a held object shows for `generation` (`observedGeneration` + the kind's
   * paused text, conditions kept): what a reconcile of the held spec writes.
   */
  markHeld(status: S | undefined, generation: number): S;
  /** The object's status as read (the write policy asks whether it announced the run). */
  status(loaded: L): S | undefined;
  /**
   * The status of an object our schema rejects ({@link load} `invalid`): a failed reconcile with
   * the schema's message, so it gets a status instead of a crash on every event.
   */
  invalid(status: S | undefined, generation: number, message: string): S;
  /** The finalizers that make a deletion ours (the delete path runs); with none of them on it the object is gone for us. */
  finalizers: readonly string[];
  /**
   * Whether the hold is checked before the deletion (a PackageRepository: paused takes precedence,
   * `pkg/pkgrepository/app_reconcile.go`); else the deletion is first (`pkg/app/app_reconcile.go`).
   */
  holdsDelete?: boolean;
  /**
   * Whether an event means a run now: forced (a spec change, `added`, ...) or due by the kind's
   * resync timer (reference §3.3); a no-op otherwise (no tool, no write).
   */
  due(input: DueInput<L>): boolean | Promise<boolean>;
  /**
   * `Reconciling` for a spec change, written as the run starts (upstream's `setReconciling`
   * before the fetch), with `alongside` written while the run goes on (the run awaits it before
   * its next write: {@link OpenRun} `reconciling`). Without it (a PackageInstall) the status is
   * written once, at the end of the run, as upstream's deferred `updateStatus`.
   */
  reconciling?: { mark(status: S | undefined, generation: number): S; alongside?: boolean };
  /**
   * Whether the run's one log line is the open step's, closed by the caller at the run's end (a
   * PackageInstall: one invocation, status written once); else {@link openRun} closes the open
   * step's line at once (`succeeded` / `deleted`), the run's stages log their own, and counts the
   * attempt (`observe.started`).
   */
  keepsRunLine?: boolean;
  /**
   * Whether a successful run whose final status says nothing new writes none
   * ({@link closeStage}, `unchangedButRunTimes` of `../reconcile/status.ts`): its watchers must
   * not wait for a status write after each reconcile (the forwarder's `WatchedKind.settled`).
   * Kinds without it write their final status on every run, as upstream.
   */
  quietWhenUnchanged?: boolean;
  /**
   * The error text of the `DeleteFailed` Event ({@link closeDelete}); default
   * {@link eventErrorText}.
   */
  deleteEventText?(result: StageResult, mask: SecretMask): string;
  /**
   * THE status write of the kind, fenced by the run (see `writeStatus`), with its size bounds:
   * {@link writeAppStatus} for Apps and PackageRepositories.
   *
   * @param mask - masks every string of the status (kinds whose status carries no tool output may ignore it).
   * @param read - the object as just read, planned on instead of a first GET.
   */
  write(
    kube: FetchView,
    ref: ResourceRef,
    fence: RunFence,
    mutate: (current: S | undefined) => S,
    mask?: SecretMask,
    read?: KnownObject,
  ): Promise<StatusWriteResult>;
}

/**
 * `load` and `parse` of a kind read through its schema parser (`../api/parse.ts`): a read that
 * finds nothing is `gone`; one the parser rejects is `invalid` with the parser's message.
 *
 * @param wrap - the loaded shape of a raw object and its parsed form.
 */
export function parsedReads<L extends { raw: KubeObject }, T>(
  parse: (raw: KubeObject) => ParseResult<T>,
  wrap: (raw: KubeObject, parsed: T) => L,
): Pick<StageKind<L, unknown>, 'load' | 'parse'> {
  return {
    load: async (kube, ref) => {
      const raw = await kube.getObject(ref);
      if (!raw) return { kind: 'gone' };
      const parsed = parse(raw);
      return parsed.success
        ? { kind: 'ok', loaded: wrap(raw, parsed.data) }
        : { kind: 'invalid', raw, message: parsed.error.message };
    },
    parse: (raw) => {
      const parsed = parse(raw);
      return parsed.success ? wrap(raw, parsed.data) : undefined;
    },
  };
}

/** The log line of one stage run (`stageTimer`). */
export type StageDone = ReturnType<typeof stageTimer>;

/** An open stage: the object as read, the run fence, the view the stage holds, its mask and log line. */
export interface StageFrame<V extends FetchView, L extends { raw: KubeObject } = LoadedApp> {
  /** The view of the object's cluster the stage holds (fetch or deploy view). */
  kube: V;
  /** The object's Kubernetes reference. */
  ref: ResourceRef;
  /** The object as the event refers to it. */
  object: ObjectRef;
  /** The run's fence: the uid and generation every write of the run is checked against. */
  fence: RunFence;
  /** The object as read when the stage opened. */
  loaded: L;
  /** The kind of object (re-reads of a held object at the final write). */
  kind: StageKind<L>;
  /** The run's Secret values (added to as the stage reads Secrets), masked in all it writes. */
  mask: SecretMask;
  /** Logs the stage run once, with its outcome. */
  done: StageDone;
  /** Metrics and Events of the run (`../observe/reconcile.ts`): phase times here, the outcome at the final write. */
  observe: ReconcileObserver;
  /** Seconds since the run started (its `run.startedAt`), when known: the overall time. */
  runSeconds: () => number | undefined;
  /** Seconds since `since` (the stage's clock): a phase's time. */
  secondsSince: (since: Date) => number;
  /**
   * The object as this stage last read or wrote it, when known ({@link writeFrameStatus} plans on
   * it instead of reading the object again, and keeps it current). `undefined`: the next write reads.
   */
  latest?: KubeObject;
  /** The cluster's timer settings (its sync mode decides whether an unchanged run writes status). */
  timer?: TimerConfig;
}

/** What {@link openStage} takes. */
export interface OpenStageInput<V extends FetchView, L extends { raw: KubeObject }> {
  /** Stage name, for the log line (`fetch`, `template`, `deploy`, ...). */
  stage: string;
  /** The object the event refers to. */
  object: ObjectRef;
  /** The run's generation (the fence is `object.uid` + this). */
  generation: number;
  /** The view the stage holds, for the object's cluster. */
  view: (clusterId: string) => V;
  /** The kind of object. */
  kind: StageKind<L>;
  /** The object as the caller just read it in this invocation (the run's first stage): not read again. */
  loaded?: L;
  /** When the run started (`run.startedAt`), for the overall time of its final stage. */
  runStartedAt?: string;
  /**
   * With `loaded`: the object as stored now, when the caller knows it (its own status write's
   * answer, or `loaded.raw` when it wrote nothing): the stage's first write plans on it.
   */
  latest?: KubeObject;
}

/**
 * Opens a stage: re-reads the object (functions never trust an event's copy), fences it on
 * uid + generation and stops on stale, gone or paused, logging the stop.
 *
 * A run whose object was paused or canceled since it started (a newer generation that holds the
 * object, same uid) goes on, on the object as read now: upstream's running reconcile is not
 * affected by `paused`, and `canceled` only stops kapp (reference §3.10). Its writes land through
 * {@link closeStage}'s held path; the held spec's own event marks `Canceled/paused` as well.
 *
 * @returns the frame, or the stop outcome (already logged).
 * @throws KubeApiError when the read fails (the transport retries the stage).
 */
export async function openStage<V extends FetchView, L extends { raw: KubeObject } = LoadedApp>(
  deps: PipelineDeps,
  input: OpenStageInput<V, L>,
): Promise<{ frame: StageFrame<V, L>; stop?: undefined } | { stop: StageStop }> {
  const { object, generation } = input;
  const kube = input.view(object.clusterId);
  const ref = input.kind.ref(object);
  const fence = { uid: object.uid, generation };
  const done = stageTimer(deps, input.stage, objectKey(object), generation);
  let loaded = input.loaded;
  let latest = loaded ? input.latest : undefined;
  if (!loaded) {
    const copy = runCopyOf(deps, input.kind, object, fence);
    if (copy) [loaded, latest] = [copy, copy.raw];
  }
  if (!loaded) {
    const read = await input.kind.load(kube, ref);
    const state = checkFence(read.kind === 'ok' ? read.loaded.raw : undefined, fence);
    const heldSince = read.kind === 'ok' && state === 'stale' && input.kind.held(read.loaded);
    if (read.kind !== 'ok' || (state !== 'ok' && !heldSince)) {
      const stop = state === 'ok' ? 'gone' : state;
      done(stop);
      return { stop };
    }
    loaded = read.loaded;
    latest = read.loaded.raw;
    if (heldSince) return { frame: frameOf(deps, input, { kube, ref, fence, done, loaded, latest }) };
  }
  if (input.kind.held(loaded)) {
    done('paused');
    return { stop: 'paused' };
  }
  return { frame: frameOf(deps, input, { kube, ref, fence, done, loaded, latest }) };
}

/** The frame of a stage {@link openStage} lets run (kept as the run's copy, when the driver keeps one). */
function frameOf<V extends FetchView, L extends { raw: KubeObject }>(
  deps: PipelineDeps,
  input: OpenStageInput<V, L>,
  opened: Pick<StageFrame<V, L>, 'kube' | 'ref' | 'fence' | 'done' | 'loaded' | 'latest'>,
): StageFrame<V, L> {
  const secondsSince = (since: Date) => Math.max(0, (deps.now().getTime() - since.getTime()) / 1000);
  const runStartedAt = input.runStartedAt ? new Date(input.runStartedAt) : undefined;
  const frame: StageFrame<V, L> = {
    ...opened,
    object: input.object,
    kind: input.kind,
    mask: secretMaskOf(deps),
    observe: observerOf(deps, input.object, input.kind.status(opened.loaded)),
    ...(deps.config.timer ? { timer: deps.config.timer } : {}),
    runSeconds: () => (runStartedAt ? secondsSince(runStartedAt) : undefined),
    secondsSince,
  };
  if (deps.runCopy) deps.runCopy.frame = frame;
  return frame;
}

/**
 * The object as the run's previous stage last knew it ({@link RunCopy}), parsed, when the driver
 * keeps one, no event about the object waits, and it is the run's object (uid, namespace, name,
 * generation); else `undefined` (the stage reads it).
 */
function runCopyOf<L extends { raw: KubeObject }>(
  deps: PipelineDeps,
  kind: StageKind<L>,
  object: ObjectRef,
  fence: RunFence,
): L | undefined {
  const copy = deps.runCopy?.frame?.latest;
  if (!copy || deps.runCopy?.superseded()) return undefined;
  const same = copy.metadata.name === object.name && (copy.metadata.namespace ?? '') === object.namespace;
  if (!same || checkFence(copy, fence) !== 'ok') return undefined;
  return kind.parse(copy);
}

/**
 * THE status write of an open stage: {@link writeAppStatus} with the frame's mask, planned on the
 * frame's {@link StageFrame.latest} copy (no GET while the stage's own read or last write is the
 * stored object; a copy that moved costs a 409 and the usual re-read), which it then keeps
 * current. kapp-controller plans its status writes on its own copy the same way, reading again
 * only on a conflict.
 *
 * @param fence - default the frame's fence.
 * @returns what `writeStatus` returns.
 * @throws what `writeStatus` throws.
 */
export async function writeFrameStatus<L extends { raw: KubeObject }>(
  frame: StageFrame<FetchView, L>,
  mutate: (current: AppStatus | undefined) => AppStatus,
  fence: RunFence = frame.fence,
): Promise<StatusWriteResult> {
  const read = frame.latest ? { object: frame.latest, kept: true } : undefined;
  const w = await writeAppStatus(frame.kube, frame.ref, fence, mutate, frame.mask, read);
  frame.latest = w.object;
  return w;
}

/** What a stage hand-off event (`TemplateStageData`, `DeployStageData`, ...) opens the next stage with. */
export interface HandOff {
  /** The object the run is for. */
  object: ObjectRef;
  /** The run that handed off: the next stage is fenced on its generation; its start times the run. */
  run: Pick<StageRun, 'generation'> & Partial<Pick<StageRun, 'startedAt'>>;
}

/**
 * Opens the stage a hand-off event is for: {@link openStage} fenced on the run that handed off
 * (`object.uid` + `run.generation`), the object read again. Every stage after a run's first opens
 * this way.
 *
 * @param stage - stage name, for the log line.
 * @param view - the view the stage holds, for the object's cluster.
 * @returns what {@link openStage} returns.
 * @throws KubeApiError when the read fails (the transport retries the stage).
 */
export function openHandOff<V extends FetchView, L extends { raw: KubeObject } = LoadedApp>(
  deps: PipelineDeps,
  stage: string,
  handOff: HandOff,
  view: (clusterId: string) => V,
  kind: StageKind<L>,
): Promise<{ frame: StageFrame<V, L>; stop?: undefined } | { stop: StageStop }> {
  return openStage(deps, {
    stage,
    object: handOff.object,
    generation: handOff.run.generation,
    view,
    kind,
    ...(handOff.run.startedAt ? { runStartedAt: handOff.run.startedAt } : {}),
  });
}

/** Why a later stage stops without work: the object is gone, recreated, or has a newer spec. */
export type FenceResult = 'ok' | 'gone' | 'stale';

/** Checks that the live object is the one (uid) and the spec (generation) a run started for. */
export function checkFence(raw: KubeObject | undefined, fence: RunFence): FenceResult {
  if (!raw || raw.metadata.uid !== fence.uid) return 'gone';
  if (raw.metadata.generation !== fence.generation) return 'stale';
  return 'ok';
}

/** The Event text of a run whose status was too large to write (the status says more). */
const TOO_LARGE_EVENT = 'the status was too large to write';

/** What {@link closeStage} takes. */
export interface CloseStageInput {
  /** Every part of the run so far: those carried by the event and the stage's own. */
  parts: RunParts;
  /** The stage's own part: deferred unless it is longer than an event may carry. */
  own?: StagePart;
  /** The stage's result (`error` set: the run failed here). */
  result: StageResult;
  /** The run's last stage: the final status is written whatever the result. */
  last?: boolean;
  /**
   * A failure a later stage ends the run with (`DeployStageData.afterFailure`: the deploy
   * function's inspect): no final status here; the parts are written now under the usual rules.
   */
  handsOnFailure?: boolean;
  /** The outcome logged when the stage succeeded (`cached` when no tool ran). */
  success: 'succeeded' | 'cached';
  /** Tool runs and time of the stage, for the log line. */
  tools: { runs: number; ms: number };
  /**
   * Keeps the run's receipt once its final status is written (`receiptOnEnd`, `./app/receipts.ts`),
   * with the run's error text as the status says it; run alongside the run's Events, after the
   * status write, so a receipt never delays the status.
   */
  receipt?: (end: { error?: string }) => Promise<void>;
}

/**
 * Closes a stage with the one write policy (see the module comment) and logs its outcome.
 *
 * Every write also lands when the object was canceled or paused meanwhile (a run that goes on,
 * see {@link openStage}): upstream's running reconcile always writes its result then (the
 * generation bumped), and its follow-up marks `Canceled/paused` for the new generation, leaving
 * the condition. Here both land in one write (the held spec's own event writes the same again),
 * so the status is final whichever comes first. Any other spec change is the next run's.
 *
 * @returns `next: true` when the run goes on to the next stage; false when it ended here
 *   (final status written, or stale/gone).
 * @throws what the status write throws (the transport retries the stage).
 */
export async function closeStage<L extends { raw: KubeObject }>(
  frame: StageFrame<FetchView, L>,
  input: CloseStageInput,
): Promise<{ next: boolean }> {
  const { fence, mask, done, loaded } = frame;
  const { parts, result, tools } = input;
  if ((result.error && !input.handsOnFailure) || input.last) {
    const final = (cur: AppStatus | undefined) => summarizeStatus(cur, fence.generation, parts, result);
    let w = quietEnd(frame, final, result) ?? (await writeFrameStatus(frame, final));
    if (w.outcome === 'stale') w = await writeHeld(frame, final, w);
    const outcome: StageOutcome =
      w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : result.error || w.tooLarge ? 'failed' : input.success;
    const ended = outcome !== 'stale' && outcome !== 'gone';
    done(outcome, { ...(result.error ? { error: mask.redact(result.error) } : {}), tools });
    if (ended) {
      const error =
        result.error !== undefined ? eventErrorText(result, mask) : w.tooLarge ? TOO_LARGE_EVENT : undefined;
      await Promise.all([
        frame.observe.completed(
          error !== undefined ? { error } : w.outcome === 'unchanged' ? { unchanged: true } : {},
          frame.runSeconds(),
        ),
        input.receipt?.(error === undefined ? {} : { error }),
      ]);
    }
    return { next: false };
  }
  if (writesImmediately(frame.kind.status(loaded)) || (input.own && cutForEvent(input.own))) {
    const now = (cur: AppStatus | undefined) => summarizeStatus(cur, fence.generation, parts);
    let w = await writeFrameStatus(frame, now);
    if (w.outcome === 'stale') w = await writeHeld(frame, now, w);
    if (w.outcome === 'stale' || w.outcome === 'gone') {
      done(w.outcome, { tools });
      return { next: false };
    }
  }
  if (result.error) done('failed', { error: mask.redact(result.error), tools });
  else done(input.success, { tools });
  return { next: true };
}

/**
 * The end of a run that changed nothing, for a kind that {@link StageKind.quietWhenUnchanged}:
 * when the run succeeded and its final status, planned on the stage's copy of the object, differs
 * from the stored one only in stage times and `consecutiveReconcileSuccesses`
 * (`unchangedButRunTimes`), nothing is written (no request, and an optimistic run checks no
 * lease) and the outcome is `unchanged`. Upstream writes conditions and times on every sync; a
 * fleet of idle Apps would otherwise write its whole status once per sync period (README, "Where
 * it differs from kapp-controller"). `kubectl get apps`, kapp's wait rule and `kctrl app status`
 * read the conditions, `friendlyDescription` and `observedGeneration`, which stay as they are.
 *
 * @returns the `unchanged` outcome, or `undefined` when the status is to be written.
 */
function quietEnd<L extends { raw: KubeObject }>(
  frame: StageFrame<FetchView, L>,
  final: (cur: AppStatus | undefined) => AppStatus,
  result: StageResult,
): StatusWriteResult | undefined {
  const copy = frame.latest;
  if (!frame.kind.quietWhenUnchanged || result.error !== undefined || !copy) return undefined;
  // `periodic` is upstream's behaviour exactly: status (and its times) written every sync.
  if (syncModeOf(copy.metadata.annotations, frame.timer) === 'periodic') return undefined;
  if (checkFence(copy, frame.fence) !== 'ok' || copy.metadata.deletionTimestamp) return undefined;
  const current = copy.status as AppStatus | undefined;
  if (!unchangedButRunTimes(current, frame.mask.deep(final(structuredClone(current))))) return undefined;
  return { outcome: 'unchanged', resourceVersion: copy.metadata.resourceVersion, attempts: 0, object: copy };
}

/**
 * A write again, fenced on the live generation, when the object was only canceled or paused
 * since the run started: the run's status, then marked held for the live generation.
 */
async function writeHeld<L extends { raw: KubeObject }>(
  frame: StageFrame<FetchView, L>,
  final: (cur: AppStatus | undefined) => AppStatus,
  stale: StatusWriteResult,
): Promise<StatusWriteResult> {
  const live = await frame.kind.load(frame.kube, frame.ref);
  if (live.kind !== 'ok' || live.loaded.raw.metadata.uid !== frame.fence.uid || !frame.kind.held(live.loaded)) {
    return stale;
  }
  const fence = { uid: frame.fence.uid, generation: live.loaded.raw.metadata.generation ?? 0 };
  frame.latest = live.loaded.raw;
  return await writeFrameStatus(frame, (cur) => frame.kind.markHeld(final(cur), fence.generation), fence);
}

/**
 * Closes a stage whose success hands an artifact to the next stage (fetch → template →
 * deploy): without its artifact the run always carries its error, so it is then the run's
 * last stage (a guard), unless `inspectAfter` hands the failure on to the deploy function's
 * inspect ({@link CloseStageInput.handsOnFailure}); the logged success is `cached` when no tool ran.
 *
 * @returns `artifact` when the next stage runs with the artifact (the stage succeeded, the run
 *   is still current and the artifact exists), `failure` when the failure is handed on (the run
 *   is still current), else `undefined` (the run ended here).
 */
export async function closeHandingOn<L extends { raw: KubeObject }>(
  frame: StageFrame<FetchView, L>,
  input: Omit<CloseStageInput, 'last' | 'success' | 'handsOnFailure'> & {
    artifactKey: string | undefined;
    cached: boolean;
    inspectAfter?: boolean;
  },
): Promise<'artifact' | 'failure' | undefined> {
  const { artifactKey, cached, inspectAfter, ...rest } = input;
  const handsOnFailure = Boolean(inspectAfter && rest.result.error !== undefined);
  const closed = await closeStage(frame, {
    ...rest,
    last: !artifactKey && !handsOnFailure,
    handsOnFailure,
    success: cached ? 'cached' : 'succeeded',
  });
  if (!closed.next) return undefined;
  if (handsOnFailure) return 'failure';
  return artifactKey !== undefined ? 'artifact' : undefined;
}
