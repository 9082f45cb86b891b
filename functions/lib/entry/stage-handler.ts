/**
 * The shared SQS handler of the stage functions: the edge checks of each record, its run lease
 * (`RunGate`, `../lease/gate.ts`), its stage under the retry bound, the next stage's event handed
 * on, and partial batch failures so one bad record fails only itself. Records of different FIFO
 * message groups run side by side (up to `EntryDeps.recordConcurrency`), each group's in order,
 * and a group whose records all succeeded is deleted from the queue at once. Per-record
 * outcomes, FIFO ordering, the function deadline and the lease protocol: `docs/lambda-runtime.md`.
 *
 * @module
 */

import pMap from 'p-map';
import {
  isSourcePollEvent,
  type KappEvent,
  objectRefOf,
  type SourcePollEvent,
  subjectOf,
  targetFunction,
} from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import { DeadlineError, withDeadline } from '../exec/deadline.js';
import { RunGate } from '../lease/gate.js';
import type { RunLeases } from '../lease/run-leases.js';
import type { StageShares } from '../lease/shares.js';
import { errorText, type Logger } from '../log.js';
import { DEFAULT_MAX_ATTEMPTS } from '../pipeline/attempts.js';
import type { DispatchDeps, PipelineDeps } from '../pipeline/deps.js';
import type { dispatchWithRetryBound as DispatchWithRetryBound } from '../pipeline/retry-bound.js';
import type { FunctionRoute } from '../pipeline/routes/route.js';
import { SecretMask } from '../reconcile/secret-mask.js';
import type { EventSender, MessageDeleter, MessageRequeuer, RecordProver, RequeuedMessage } from '../transport/port.js';
import {
  admit,
  type EdgeChecks,
  MAX_POSTPONEMENTS,
  messageGroupLanes,
  postponementsOf,
  provenRecords,
  type RecordOutcome,
  receiveCountOf,
  type SenderCheck,
  type SqsBatchResponse,
  type SqsEvent,
  type SqsRecord,
  shareUntil,
  takeShare,
} from './edge.js';
import { sendingAs } from './sender.js';

export {
  MAX_POSTPONEMENTS,
  PROOF_VISIBILITY_MARGIN_SECONDS,
  type RecordOutcome,
  SHARE_HOLD_MARGIN_MS,
  type SqsBatchResponse,
  type SqsEvent,
  type SqsRecord,
} from './edge.js';

/**
 * The retry bound (`../pipeline/retry-bound.ts`: the final status writers, which bring the
 * stages' error prefixes and status code), loaded on the first record, not at the cold start.
 */
const retryBound = () => import('../pipeline/retry-bound.js');

/** `infraStep` of the retry bound, loaded on first use. */
async function infraStep<T>(action: string, step: () => Promise<T>): Promise<T> {
  return await (await retryBound()).infraStep(action, step);
}

/** `dispatchWithRetryBound` of the retry bound, loaded on first use. */
async function dispatchWithRetryBound<D extends PipelineDeps>(
  ...args: Parameters<typeof DispatchWithRetryBound<D>>
): ReturnType<typeof DispatchWithRetryBound<D>> {
  return await (await retryBound()).dispatchWithRetryBound<D>(...args);
}

/** The fields of Lambda's context object the handler reads (all optional: tests pass none). */
export interface LambdaContext {
  /** Invocation id, added to every log line of the invocation. */
  awsRequestId?: string;
  /** Milliseconds left before the invocation's time limit; arms the function deadline. */
  getRemainingTimeInMillis?: () => number;
}

/**
 * A Lambda handler for SQS event source mappings; the index-repo function's also takes the
 * {@link SourcePollEvent} of its schedule.
 */
export type SqsHandler = (event: SqsEvent | SourcePollEvent, context?: LambdaContext) => Promise<SqsBatchResponse>;

/** Everything {@link makeStageHandler} needs, built once per process by the deps factory. */
export interface EntryDeps {
  /** Ports and configuration of the stage handlers. */
  pipeline: DispatchDeps;
  /** Where the next stage's event goes. */
  sender: EventSender;
  /** The function's logger (the handler adds `messageId` and `awsRequestId` bindings). */
  log: Logger;
  /**
   * Runs one stage; default the route's (`dispatchEvent` through `makeSqsHandler`; unit tests of
   * this module replace it).
   */
  dispatch?: (event: KappEvent, deps: DispatchDeps) => Promise<KappEvent | undefined>;
  /**
   * Called with the event's cluster id before its stage runs, inside the retry bound: the Lambda
   * composition root loads the record's cluster from the fleet registry. Default none.
   */
  prepare?: (clusterId: string) => Promise<void>;
  /**
   * The queue's redrive `maxReceiveCount`: a record received this many times is on its last
   * attempt, and a stage failing then ends the run with a final failed status instead of
   * going silently to the dead-letter queue. Default {@link DEFAULT_MAX_ATTEMPTS} (5).
   */
  maxAttempts?: number;
  /**
   * How long before the invocation's time limit the function deadline cancels the running tool,
   * ms: the time left for the stage's final status write. Default
   * {@link DEFAULT_DEADLINE_MARGIN_MS}; at most half the time the invocation had at its start.
   */
  deadlineMarginMs?: number;
  /**
   * Whether the record's sender may send its event (`./sender.ts`: name the event's cluster, and
   * be a sender of such events): `undefined` when it may, else why not; the record is then
   * dropped and logged (`refused`). A throw fails the record (retried). Default: no check (the
   * local and emulator setups; a fleet on AWS sets `KAPP_LAMBDA_SENDER_CHECK=registry`).
   */
  checkSender?: SenderCheck;
  /** The key of each cluster's message groups (`EdgeChecks.groupKeyOf`, `./edge.ts`). Default none. */
  groupKeyOf?: EdgeChecks['groupKeyOf'];
  /** Takes a keyed cluster's record in its unkeyed group too (`EdgeChecks.acceptUnkeyed`). Default false. */
  acceptUnkeyed?: boolean;
  /**
   * The run leases of Apps (`../lease/`): at most one run per App across the stage functions,
   * events meanwhile coalesced into one follow-up. Default none (every record runs: unit tests,
   * and functions whose objects run in one function only). The Lambda composition root gives
   * one to fetch, template and deploy.
   */
  leases?: RunLeases;
  /**
   * How many records of one batch run at once, at most (records of one message group never do:
   * they run one after another, in batch order). Default {@link DEFAULT_RECORD_CONCURRENCY};
   * the Lambda composition root passes the stage's (`KAPP_LAMBDA_RECORD_CONCURRENCY`).
   */
  recordConcurrency?: number;
  /**
   * Deletes the messages of a message group whose records all succeeded while other records of
   * the batch still run, so that the group's next events are not held by a slow neighbour (a
   * FIFO group with a message in flight delivers nothing more). Default none: the event source
   * mapping deletes them when the invocation returns. A failed delete is logged only.
   */
  deleter?: MessageDeleter;
  /**
   * Proves that each record is a message of the function's own queue, in flight for it now
   * (`SqsRecordProver` of `../transport/sqs.ts`: a visibility change by receipt handle on the
   * queue URL the function is configured with), before anything of the record is read. Why: the
   * sender check and the message-group check trust `SenderId` and `MessageGroupId`, which SQS sets
   * on what it delivers, but a direct `lambda:Invoke` hands the function whatever SQS-shaped event
   * its caller wrote. A record not proven (a made-up or foreign receipt handle, none, or one given
   * twice) is dropped before its body is parsed and logged (`refused`: its message id and why, not
   * its handle); when the queue cannot answer, every record of the batch fails (retried). Default
   * none: every record is taken as delivered by the event source mapping (unit tests, the local
   * and emulator setups, the embedded runtime, which has no queue); the Lambda composition root
   * gives one whenever the sender check is on (`./lambda.ts`).
   */
  prover?: RecordProver;
  /**
   * Sends the records the function deadline held back to the function's own queue as copies
   * (`SqsMessageRequeuer` of `../transport/sqs.ts`), so they run in a later invocation without
   * spending one of their receives ({@link postponeHeld}). Default none: they go back through
   * `batchItemFailures`. The Lambda composition root gives one whenever it has the function's own
   * queue URL (`./lambda.ts`).
   *
   * A record cut while it still ran ({@link cutAfterDeadline}) is not stopped: its promise goes on
   * until Lambda freezes the process when the invocation returns, and again whenever the same
   * execution environment is invoked next, while its copy may already run in another one. That
   * copy is the same event, so the run lease of Apps (`../lease/run-leases.ts`) treats both as one
   * run and fences neither; it fences them once another run took the App, and the stages are
   * idempotent, their hand-offs deduplicated by event id. The same holds today for the record
   * returned through `batchItemFailures`, only later (at the end of its visibility timeout).
   */
  requeuer?: MessageRequeuer;
  /**
   * The fair shares of the function's slots (`../lease/shares.ts`): a record whose cluster (or
   * namespace within it) already runs its share of records, fleet-wide, is parked and
   * acknowledged (`postponed`) instead of holding a slot while it waits, and sent back to the
   * function's queue when a record of its cluster ends. Taken after the edge checks, before the run
   * lease; released when the record ends, whatever its outcome. Default none: every record runs
   * (unit tests, the local and emulator setups, the embedded runtime, whose `KeyedQueue` is fair
   * already); the Lambda composition root gives one to every stage function.
   */
  shares?: StageShares;
}

/** Default {@link EntryDeps.recordConcurrency}: 1, the records of a batch one after another. */
export const DEFAULT_RECORD_CONCURRENCY = 1;

/** Default {@link EntryDeps.deadlineMarginMs}: 30 s (a status write, retried on conflicts, with room). */
export const DEFAULT_DEADLINE_MARGIN_MS = 30_000;

/**
 * Arms the function deadline of one invocation: a signal aborted with a {@link DeadlineError}
 * `margin` before the time limit (`margin` at most half the remaining time, so a short limit
 * still runs its records, and at least 0). When no time is left before the margin (`remaining`
 * 0 or negative) the signal is aborted at once, so no record starts (they go back to the queue)
 * instead of starting one whose tool is canceled before it runs.
 *
 * @returns the signal, when it fires (`at`, ms since the epoch) and `dispose`, which clears the
 *   timer (call it when the invocation ends);
 *   `undefined` (no deadline) when `remainingMs` is not a finite number.
 */
function armDeadline(
  remainingMs: number,
  marginMs: number,
): { signal: AbortSignal; at: number; marginMs: number; dispose: () => void } | undefined {
  if (!Number.isFinite(remainingMs)) return undefined;
  const margin = Math.max(0, Math.min(marginMs, Math.floor(remainingMs / 2)) || 0);
  const abort = new AbortController();
  const delay = remainingMs - margin;
  const at = Date.now() + Math.max(0, delay);
  if (delay <= 0) {
    abort.abort(new DeadlineError(margin));
    return { signal: abort.signal, at, marginMs: margin, dispose: () => {} };
  }
  const timer = setTimeout(() => abort.abort(new DeadlineError(margin)), delay);
  timer.unref?.();
  return { signal: abort.signal, at, marginMs: margin, dispose: () => clearTimeout(timer) };
}

/**
 * Resolves `true` once `cutMs` have passed after `deadline` fired and `batch` has still not
 * ended, `false` when `batch` ends first. Why: the deadline cancels tools only; a record blocked
 * elsewhere (a cluster's API server that holds each request to the client's 120 s bound, the
 * install function's whole timeout) would keep the invocation until Lambda kills it, and then
 * every record of the batch, every cluster's, went back to the queue and spent a receive.
 */
async function cutAfterDeadline(batch: Promise<void>, deadline: AbortSignal, cutMs: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let onAbort: (() => void) | undefined;
  const cut = new Promise<boolean>((resolve) => {
    const arm = () => {
      timer = setTimeout(() => resolve(true), cutMs);
      timer.unref?.();
    };
    if (deadline.aborted) arm();
    else {
      onAbort = arm;
      deadline.addEventListener('abort', arm, { once: true });
    }
  });
  try {
    return await Promise.race([batch.then(() => false), cut]);
  } finally {
    clearTimeout(timer);
    if (onAbort) deadline.removeEventListener('abort', onAbort);
  }
}

/** Memoizes an async loader; a rejected load is forgotten, so the next call tries again. */
function once<T>(load: () => T | Promise<T>, onError: (err: unknown) => Error): () => Promise<T> {
  let value: Promise<T> | undefined;
  return () => {
    if (!value) {
      value = Promise.resolve()
        .then(load)
        .catch((err: unknown) => {
          value = undefined;
          throw onError(err);
        });
    }
    return value;
  };
}

/**
 * Builds the SQS handler of one stage function.
 *
 * @param stage - the function this handler runs as: events for any other function are dropped.
 * @param depsFactory - builds the dependencies; called on the first invocation and cached for
 *   the life of the process (a factory that throws is called again on the next invocation).
 * @param loadRoute - the function's route (`../pipeline/routes/<stage>.ts`, a dynamic import in
 *   the Lambda entry files), called when the first record or poll needs it and cached likewise.
 * @returns the handler. It rejects only when `depsFactory` or `loadRoute` fails (Lambda then
 *   retries the whole batch); every per-record problem ends in the record's outcome.
 */
export function makeStageHandler(
  stage: PipelineStage,
  depsFactory: () => EntryDeps | Promise<EntryDeps>,
  loadRoute: () => Promise<FunctionRoute>,
): SqsHandler {
  // Every send of the function is checked against what it sends (`sendingAs`, `./sender.ts`).
  const getDeps = once(
    async () => {
      const d = await depsFactory();
      return { ...d, sender: sendingAs(stage, d.sender) };
    },
    (err) => new Error(`failed to initialize the ${stage} function`, { cause: err }),
  );
  const getRoute = once(loadRoute, (err) => new Error(`failed to load the ${stage} function's stage`, { cause: err }));

  return async (event, context) => {
    const d = await getDeps();
    const log = context?.awsRequestId ? d.log.child({ awsRequestId: context.awsRequestId }) : d.log;
    const remaining = context?.getRemainingTimeInMillis?.();
    const deadline =
      remaining === undefined ? undefined : armDeadline(remaining, d.deadlineMarginMs ?? DEFAULT_DEADLINE_MARGIN_MS);
    if (isSourcePollEvent(event)) {
      // The schedule's poll: only the index-repo function polls; a failure fails the
      // invocation (the schedule's retry policy, then the next period, runs it again).
      if (stage !== 'index-repo') {
        log.warn({ stage }, 'source poll event sent to a function that does not poll; dropped');
        deadline?.dispose();
        return { batchItemFailures: [] };
      }
      // The function deadline cuts the members still read (each also has its own, far shorter)
      // and starts no source after it: the poll returns with its summary, the next one goes on.
      try {
        const poll = (await getRoute()).pollSources;
        if (!poll) throw new Error(`the ${stage} function's route has no source poll`);
        log.info(
          { stage, ...(await poll({ ...d.pipeline, ...(deadline ? { deadline: deadline.signal } : {}) })) },
          'source poll',
        );
      } finally {
        deadline?.dispose();
      }
      return { batchItemFailures: [] };
    }
    const failed = new Set<string>();
    const settled = new Set<string>();
    // The records the deadline held back: failed unless postponed ({@link postponeHeld}).
    const held = new Map<string, HoldReason>();
    const holdBack = (record: SqsRecord, why: HoldReason) => {
      failed.add(record.messageId);
      if (d.requeuer) held.set(record.messageId, why);
      else logHeld(log, stage, record, why);
    };
    let cutOff = false;
    const received = Array.isArray(event.Records) ? event.Records : [];
    try {
      const records = d.prover
        ? await provenRecords(stage, received, d.prover, remaining, log, (r) => failed.add(r.messageId))
        : received;
      const batch = runBatch(records, d.recordConcurrency ?? DEFAULT_RECORD_CONCURRENCY, {
        mayStart: startWindow(remaining, deadline?.signal, d.maxAttempts ?? DEFAULT_MAX_ATTEMPTS),
        run: (record, rlog) =>
          processRecord(
            stage,
            record,
            // The stages' single-flight waits are bounded by the time left (`fleetFlight`).
            deadline ? { ...d, pipeline: { ...d.pipeline, deadlineAt: deadline.at } } : d,
            getRoute,
            rlog,
            deadline?.signal,
            shareUntil(remaining),
          ),
        fail: (record) => {
          if (!cutOff) failed.add(record.messageId);
        },
        hold: (record, why) => {
          if (!cutOff) holdBack(record, why);
        },
        settle: (record) => settled.add(record.messageId),
        cutOff: () => cutOff,
        log: (record) => log.child({ messageId: record.messageId }),
        stage,
        ...(d.deleter ? { deleter: d.deleter } : {}),
        batchLog: log,
      });
      // Half the margin after the deadline (the cut tools' final status writes), the invocation
      // returns whatever still runs: those records, and the ones behind them in their groups, go
      // back to the queue alone, and every other record of the batch keeps its own outcome.
      if (deadline && (await cutAfterDeadline(batch, deadline.signal, deadline.marginMs / 2))) {
        cutOff = true;
        for (const record of records) if (!settled.has(record.messageId)) holdBack(record, STILL_RUNNING);
      } else await batch;
      if (d.requeuer && held.size > 0) {
        const postponing = { requeuer: d.requeuer, budgetMs: (deadline?.marginMs ?? 0) / 4 };
        await postponeHeld(stage, records, held, { ...d, ...postponing }, log, (r) => failed.delete(r.messageId));
      }
    } finally {
      deadline?.dispose();
    }
    return {
      batchItemFailures: received.filter((r) => failed.has(r.messageId)).map((r) => ({ itemIdentifier: r.messageId })),
    };
  };
}

/**
 * Whether a record may still start: not once the function deadline has come, nor once less than
 * half of the time the invocation had at its start is left, so a record started beside others
 * has at least half the function timeout (less the deadline margin) for its tools; a record
 * started later would likely be cut by the deadline and fail (`ReconcileFailed`), where going
 * back to the queue runs it in full in a later invocation. Always true without a time limit.
 *
 * Except when the record or a later one of its lane is on its last receive (`ApproximateReceiveCount`
 * at least `maxAttempts`): going back would send that one to the dead-letter queue with no status
 * at all, its receives spent behind slower records of its group, so the record starts while the
 * deadline has not come, and a stage cut by the deadline then ends its run with a failed status
 * (the retry bound's last attempt).
 *
 * @returns whether the first of `rest` (the lane's records from the one to start on) may start.
 */
function startWindow(
  remainingMs: number | undefined,
  deadline: AbortSignal | undefined,
  maxAttempts: number,
): (rest: readonly SqsRecord[]) => boolean {
  if (remainingMs === undefined || !Number.isFinite(remainingMs)) return () => !deadline?.aborted;
  const startBy = Date.now() + remainingMs / 2;
  return (rest) => !deadline?.aborted && (Date.now() <= startBy || rest.some((r) => receiveCountOf(r) >= maxAttempts));
}

/** What {@link runBatch} does with each record. */
interface BatchSteps {
  /** Whether the first of a lane's remaining records may start now ({@link startWindow}). */
  mayStart: (rest: readonly SqsRecord[]) => boolean;
  /** Runs one record ({@link processRecord}); never throws. */
  run: (record: SqsRecord, log: Logger) => Promise<RecordOutcome>;
  /** Reports a record in `batchItemFailures`. */
  fail: (record: SqsRecord) => void;
  /** Holds a record back for the function deadline: failed, or postponed ({@link postponeHeld}); logs it. */
  hold: (record: SqsRecord, why: HoldReason) => void;
  /** The record's outcome is decided (whatever it is). */
  settle: (record: SqsRecord) => void;
  /** Whether the invocation already returned without this batch (a cut, {@link cutAfterDeadline}): no early delete then. */
  cutOff: () => boolean;
  /** The record's logger. */
  log: (record: SqsRecord) => Logger;
  stage: PipelineStage;
  deleter?: MessageDeleter;
  /** The invocation's logger (a failed early delete). */
  batchLog: Logger;
}

/**
 * Runs a batch: `concurrency` workers each take the next lane ({@link messageGroupLanes}) and run
 * its records one after another, so records of different groups overlap and a group's never do.
 * Once a record of a lane fails, the lane's later records are failed without running
 * (`skipped`): SQS returns them in order, and running them would let a newer event of the object
 * overtake an older one (Powertools' `SqsFifoPartialProcessor` with `skipGroupOnError`, per lane).
 * A record that did not start (the deadline) is held back with the lane's later records
 * (`steps.hold`: failed likewise, or postponed together, {@link postponeHeld}). A lane whose records all succeeded while other lanes still run
 * is deleted from the queue at once (`steps.deleter`): its message group then delivers its next
 * events to another invocation instead of waiting for this one to return.
 */
async function runBatch(records: readonly SqsRecord[], concurrency: number, steps: BatchSteps): Promise<void> {
  const lanes = messageGroupLanes(records);
  let unfinished = lanes.length;
  const deletes: Promise<void>[] = [];
  const runLane = async (lane: SqsRecord[]): Promise<void> => {
    let laneFailed = false;
    let laneHeld = false;
    let laneAcknowledged = true;
    for (const [i, record] of lane.entries()) {
      const rlog = steps.log(record);
      if (steps.cutOff()) return;
      if (laneHeld) {
        steps.settle(record);
        steps.hold(record, BEHIND_HELD);
        continue;
      }
      if (laneFailed) {
        steps.settle(record);
        steps.fail(record);
        rlog.warn(
          { stage: steps.stage, outcome: 'skipped' satisfies RecordOutcome },
          'earlier event of this object failed; retried after it',
        );
        continue;
      }
      if (!steps.mayStart(lane.slice(i))) {
        steps.settle(record);
        steps.hold(record, NOT_STARTED);
        laneFailed = laneHeld = true;
        continue;
      }
      const outcome = await steps.run(record, rlog);
      if (steps.cutOff()) return;
      steps.settle(record);
      if (outcome === 'failed') {
        steps.fail(record);
        laneFailed = true;
      } else if (outcome === 'ended') {
        // The run is over (its final status says why), so the object's later records still
        // run; this one is failed on its last receive so that the redrive policy keeps it in
        // the dead-letter queue, whose alarm tells the operator the infrastructure failed.
        steps.fail(record);
        laneAcknowledged = false;
      }
    }
    unfinished--;
    const handles = lane.map((r) => r.receiptHandle);
    if (
      steps.deleter &&
      !steps.cutOff() &&
      unfinished > 0 &&
      !laneFailed &&
      laneAcknowledged &&
      handles.every((h) => h !== undefined)
    ) {
      deletes.push(
        steps.deleter.delete(handles as string[]).catch((err: unknown) => {
          steps.batchLog.warn(
            { stage: steps.stage, messageIds: lane.map((r) => r.messageId), error: errorText(err) },
            'could not delete handled events early; the event source mapping deletes them when the invocation returns',
          );
        }),
      );
    }
  };
  await pMap(lanes, runLane, { concurrency: Math.max(1, concurrency) });
  await Promise.all(deletes);
}

/**
 * Why the function deadline held a record back: its outcome and log message when it goes back
 * through `batchItemFailures` (no requeuer, or not postponed: {@link postponeHeld}).
 */
interface HoldReason {
  readonly outcome: 'deadline' | 'skipped';
  readonly msg: string;
}

/** A record not started: the deadline came, or the start window closed ({@link startWindow}). */
const NOT_STARTED: HoldReason = { outcome: 'deadline', msg: 'function deadline reached; not started' };

/** A record behind one {@link NOT_STARTED} in its lane. */
const BEHIND_HELD: HoldReason = { outcome: 'skipped', msg: 'earlier event of this object failed; retried after it' };

/** A record still running, or behind one in its lane, when the invocation was cut ({@link cutAfterDeadline}). */
const STILL_RUNNING: HoldReason = {
  outcome: 'deadline',
  msg: 'still running, or behind a running record of its group, at the function deadline; returned to the queue',
};

/** Logs a held record that goes back through `batchItemFailures`; `why` says why it was not postponed. */
function logHeld(log: Logger, stage: PipelineStage, record: SqsRecord, held: HoldReason, why?: string): void {
  log
    .child({ messageId: record.messageId })
    .warn({ stage, outcome: held.outcome satisfies RecordOutcome, ...(why ? { notPostponed: why } : {}) }, held.msg);
}

/**
 * Postpones the records the function deadline held back ({@link EntryDeps.requeuer}): each lane
 * of them ({@link postponeLane}) sent back in one requeue, the lanes side by side; a record sent
 * back is acknowledged (`unfail`) and logged `postponed`, the others keep their failure and are
 * logged as {@link HoldReason} says. Lanes not done within `d.budgetMs` (a quarter of the
 * deadline margin: the cut leaves half of it before Lambda ends the invocation) keep their failures,
 * so a queue that does not answer cannot hold the invocation until Lambda kills it and returns
 * every record of the batch.
 *
 * @param records - the batch, in order: the held records' lanes keep it.
 * @param held - the held records by message id, and why.
 */
async function postponeHeld(
  stage: PipelineStage,
  records: readonly SqsRecord[],
  held: ReadonlyMap<string, HoldReason>,
  d: EntryDeps & { requeuer: MessageRequeuer; budgetMs: number },
  log: Logger,
  unfail: (record: SqsRecord) => void,
): Promise<void> {
  const lanes = messageGroupLanes(records.filter((r) => held.has(r.messageId)));
  const done = new Set<SqsRecord[]>();
  let open = true;
  const work = lanes.map(async (lane) => {
    const result = await postponeLane(stage, lane, d, log).catch((err: unknown) => errorText(err));
    if (!open) return;
    done.add(lane);
    if (typeof result === 'string') {
      for (const r of lane) logHeld(log, stage, r, held.get(r.messageId) as HoldReason, result);
      return;
    }
    for (const r of result.dropped) unfail(r);
    for (const [i, r] of result.postponed.entries()) {
      unfail(r);
      log.child({ messageId: r.messageId }).info(
        {
          stage,
          outcome: 'postponed' satisfies RecordOutcome,
          held: held.get(r.messageId)?.outcome,
          postponements: result.messages[i]?.postponements,
        },
        'held back by the function deadline; sent back to its queue without spending a receive',
      );
    }
  });
  await settledWithin(Promise.all(work), d.budgetMs);
  open = false;
  for (const lane of lanes.filter((l) => !done.has(l))) {
    for (const r of lane)
      logHeld(log, stage, r, held.get(r.messageId) as HoldReason, 'the requeue did not end in time');
  }
}

/** Resolves once `work` settled or `ms` passed, whichever is first. */
async function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, ms);
    timer.unref?.();
  });
  try {
    await Promise.race([work.then(() => undefined), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Sends one lane's held records back to the function's queue in lane order, in one requeue, all or
 * none: a record of the lane that went back through `batchItemFailures` would come back ahead of
 * the copies of the records before it (its message keeps its place in the group), so one that may
 * not be postponed sends the whole lane back that way. A lane is postponed only when each record
 * stays within {@link MAX_POSTPONEMENTS}, has its message group, and passes the edge checks again
 * ({@link admit}); why those here: a record not started was never checked, and its copy's sender
 * is the function itself, which the sender check accepts for any event of its queue
 * (`./sender.ts`), so a record another sender may not send must not be laundered into one. A
 * record the checks drop is dropped now, as it would be on its next receive.
 *
 * Copies join the end of their message group: they come after the group's messages not received
 * with this batch, which then run first (each stage is idempotent, and App runs are fenced by the
 * run lease).
 *
 * @returns the records postponed, their copies and those dropped, or why the lane was not
 *   postponed. Never throws.
 */
async function postponeLane(
  stage: PipelineStage,
  lane: readonly SqsRecord[],
  d: EntryDeps & { requeuer: MessageRequeuer },
  log: Logger,
): Promise<{ postponed: SqsRecord[]; messages: RequeuedMessage[]; dropped: SqsRecord[] } | string> {
  if (lane.some((r) => postponementsOf(r) >= MAX_POSTPONEMENTS)) {
    return `postponed ${MAX_POSTPONEMENTS} times already (MAX_POSTPONEMENTS)`;
  }
  if (lane.some((r) => r.attributes?.MessageGroupId === undefined)) return 'the record has no message group';
  const postponed: SqsRecord[] = [];
  const dropped: SqsRecord[] = [];
  for (const record of lane) {
    const admitted = await admit(stage, record, d, log.child({ messageId: record.messageId }));
    if (admitted === 'failed') return 'its sender could not be checked';
    if (typeof admitted === 'string') dropped.push(record);
    else postponed.push(record);
  }
  const messages = postponed.map((r) => ({
    messageId: r.messageId,
    body: r.body,
    messageGroupId: r.attributes?.MessageGroupId as string,
    postponements: postponementsOf(r) + 1,
  }));
  try {
    if (messages.length > 0) await d.requeuer.requeue(messages);
  } catch (err) {
    return `the requeue failed: ${errorText(err)}`;
  }
  return { postponed, messages, dropped };
}

/**
 * One record: its edge checks ({@link admit}), its share of the function's slots
 * ({@link EntryDeps.shares}, released when the record ends), then its run ({@link runAdmitted}).
 *
 * @returns the record's outcome (logged). Never throws.
 */
async function processRecord(
  stage: PipelineStage,
  record: SqsRecord,
  d: EntryDeps,
  getRoute: () => Promise<FunctionRoute>,
  log: Logger,
  deadline?: AbortSignal,
  holdUntil: number = shareUntil(undefined),
): Promise<RecordOutcome> {
  const admitted = await admit(stage, record, d, log);
  if (typeof admitted === 'string') return admitted;
  const event = admitted;
  const elog = log.child({ subject: subjectOf(objectRefOf(event)), eventId: event.id });
  const share = d.shares ? await takeShare(stage, record, event, d.shares, holdUntil, elog) : undefined;
  if (share === 'postponed' || share === 'failed') return share;
  try {
    return await runAdmitted(stage, record, event, d, getRoute, elog, deadline);
  } finally {
    if (share) await share.release();
  }
}

/**
 * A record past its edge checks and its share: its run lease (`RunGate`, `../lease/gate.ts`) and
 * its stage under the retry bound, the next stage's event handed on through the gate.
 *
 * @returns the record's outcome (logged). Never throws.
 */
async function runAdmitted(
  stage: PipelineStage,
  record: SqsRecord,
  event: KappEvent,
  d: EntryDeps,
  getRoute: () => Promise<FunctionRoute>,
  elog: Logger,
  deadline?: AbortSignal,
): Promise<RecordOutcome> {
  const receiveCount = receiveCountOf(record) || undefined;
  const maxAttempts = d.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  // Per record (one run of one object): the values of the Secrets the stage reads.
  const secretMask = new SecretMask();
  let gate: RunGate | undefined;
  try {
    const begun = await RunGate.begin(event, {
      leases: d.leases,
      sender: d.sender,
      now: () => d.pipeline.now(),
      step: infraStep,
      stage,
      log: elog,
    });
    if (typeof begun === 'string') return begun;
    gate = begun;
    // The deadline reaches every tool through the runner of the stage's deps.
    const runner = deadline ? withDeadline(d.pipeline.runner, deadline) : d.pipeline.runner;
    const dispatch = d.dispatch ?? (await getRoute()).dispatch;
    const prepare = d.prepare;
    const r = await dispatchWithRetryBound(
      gate.event,
      { ...gate.ports({ ...d.pipeline, runner }), log: elog, ...(deadline ? { deadline } : {}) },
      { attempt: receiveCount ?? 0, maxAttempts },
      {
        secretMask,
        ...(prepare ? { prepare } : {}),
        dispatch: gate.guard(async (e, deps) => {
          const next = await dispatch(e, deps);
          if (deadline?.aborted) elog.warn({ stage, type: e.type }, 'function deadline reached while the stage ran');
          return next;
        }),
        forward: (next) => begun.forward(next),
      },
    );
    const restarted = await gate.restart();
    if (restarted) return restarted;
    if (!r.next) await gate.end();
    if (r.ended) {
      elog.warn(
        { stage, outcome: 'ended' satisfies RecordOutcome, type: event.type, receiveCount },
        'run ended with a failed status on its last attempt; the event goes to the dead-letter queue',
      );
      return 'ended';
    }
    if (!r.next) {
      elog.info({ stage, outcome: 'done' satisfies RecordOutcome, type: event.type }, 'event handled');
      return 'done';
    }
    const [next, to] = [r.next, targetFunction(r.next)];
    elog.info(
      { stage, outcome: 'forwarded' satisfies RecordOutcome, type: event.type, next: next.type, to, nextId: next.id },
      'event handled; next stage queued',
    );
    return 'forwarded';
  } catch (err) {
    const restarted = await gate?.restart();
    if (restarted) return restarted;
    const last = receiveCount !== undefined && receiveCount >= maxAttempts;
    elog.error(
      {
        stage,
        outcome: 'failed' satisfies RecordOutcome,
        type: event.type,
        error: secretMask.redact(errorText(err)),
        ...(err instanceof Error && err.cause !== undefined ? { cause: secretMask.redact(errorText(err.cause)) } : {}),
        receiveCount,
      },
      last ? 'event failed on its last attempt; it goes to the dead-letter queue' : 'event failed; will be retried',
    );
    // A failed stage does not hold its App: the follow-up (if any) runs now, the retry after it
    // (the embedded runtime's rule: a newer event replaces a run waiting for its retry).
    await gate?.abandon();
    return 'failed';
  } finally {
    gate?.close();
  }
}
