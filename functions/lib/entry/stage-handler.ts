/**
 * The shared SQS handler of the stage functions: validate each record at the edge, run the
 * stage with the function's route (`../pipeline/routes/`, loaded on the first record that needs
 * it, so a cold start with nothing to run loads no stage), hand the next stage's event to the
 * {@link EventSender}, and report partial batch failures so one bad record fails only itself.
 * `./handler.ts` gives it every route (`dispatchEvent`) for the tests and local runs.
 *
 * Per record:
 *
 * | record | outcome | redelivered |
 * |---|---|---|
 * | body is not a valid stage event | logged with the field path, dropped | no (it never will be valid) |
 * | valid, but for another function | logged, dropped | no |
 * | its `MessageGroupId` is not its object's ordering key (or absent while `checkSender` is on; `messageGroupRefusal`, `./sender.ts`) | logged (`refused`), dropped | no |
 * | its sender may not name its cluster, or never sends such an event (`checkSender`, `./sender.ts`) | logged, dropped | no |
 * | the sender check could not be made (registry unreadable) | logged, `batchItemFailures` | yes |
 * | stage ran, returned a next event | sent to the next stage's queue | no |
 * | stage ran, run ended | done | no |
 * | stage or send threw (infrastructure), receive count below `maxAttempts` | `batchItemFailures` | yes (SQS retry) |
 * | the same on the last attempt (`ApproximateReceiveCount` ≥ `maxAttempts`) | final `ReconcileFailed` written (`retry-bound.ts`), `batchItemFailures` | no: SQS moves it to the DLQ (the operator's alarm; a redrive re-runs it) |
 * | the same, and that status write failed too | logged, `batchItemFailures` | SQS moves it to the DLQ |
 * | not started: the function deadline had come | logged, `batchItemFailures` | yes (a later invocation runs it) |
 * | an App event whose run lease another run holds ({@link EntryDeps.leases}) | coalesced into the lease's one follow-up, acknowledged | no (the holder sends the follow-up when its run ends) |
 * | an optimistic run (a resync holding no lease) another run started beside | stopped before its next write, acknowledged; a `resync` from the start coalesced into the lease (or sent when free) | no |
 * | a stage event whose run's lease moved past it (`fenced`: e.g. a crashed deploy's retry after its lease expired and another run took it) | nothing run or written, acknowledged (`fenced`); a forcing object event from the start coalesced into the lease (or sent when free) | no |
 *
 * FIFO ordering: records are processed one at a time in batch order, and once a record of a
 * message group fails, the later records of that group are failed without running (Lambda
 * returns them to the queue in order; running them would let a newer event overtake an older
 * one). Other groups continue. This is Powertools' `SqsFifoPartialProcessor` with
 * `skipGroupOnError`.
 *
 * The function deadline: when Lambda's context gives `getRemainingTimeInMillis`, a signal fires
 * {@link EntryDeps.deadlineMarginMs} (30 s) before the invocation's time limit, leaving time for
 * the final status write. It cancels every tool the stage runs (the runner of the stage's deps is
 * wrapped by `withDeadline`, `../exec/deadline.ts`): the tool is killed cleanly before the
 * platform kills the process, and the stage records the failure like a tool timeout
 * (`ReconcileFailed`, `<stage prefix>Process was canceled: cut by the function deadline (30 s
 * before the time limit of the invocation)`, masked and bounded as any tool error); the record is
 * then done and the App runs again after the failure backoff. Except `kapp deploy`: the deploy
 * stage writes its progress (still `Reconciling`) and returns its own continuation, queued to the
 * deploy function like any next event, so a deploy longer than one invocation goes on in the next
 * (`../pipeline/deploy.ts`). Records not started once the deadline has come go back to the queue
 * without running.
 *
 * The run lease (fetch, template, deploy): an App event takes its App's lease before its stage
 * runs (`../lease/`), renews it while the stage runs, passes it to the next stage's event before
 * sending that, and ends it when the run ends (or the stage fails), sending the follow-up the
 * events coalesced meanwhile became. So one App has at most one run across the three functions,
 * as in the embedded runtime. A `resync` that finds the lease free runs optimistic instead
 * (`OptimisticRun`, `../lease/`): it writes nothing to the lease while its stages only read, its
 * writes gated (`./lease-gate.ts`: the first tool, store write or finalizer change claims the
 * lease; a status write is checked against the lease and refused on a 409), and when another run
 * started meanwhile it stops, acknowledged, and the App runs again from the start through the
 * lease (outcome `coalesced`). A stage event whose run no longer has the lease (it expired and
 * another run took it, or another run held and freed it since: `RunLeases.acquire` `fenced`) runs
 * nothing: no tool, artifact, finalizer or status write; it is acknowledged (outcome `fenced`) and
 * the App runs again from the start through the lease (`fencedRestartOf`), so its latest spec is
 * still reconciled. The retry of a crashed stage whose lease nobody took goes on as its run.
 *
 * @module
 */
import {
  EVENT_TYPES,
  isSourcePollEvent,
  type KappEvent,
  objectRefOf,
  orderingKey,
  parseEvent,
  type SourcePollEvent,
  subjectOf,
  targetFunction,
} from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import { DeadlineError, withDeadline } from '../exec/deadline.js';
import {
  type AcquireResult,
  fencedRestartOf,
  type HeldLease,
  leaseSubject,
  type OptimisticRun,
  type RunLeases,
} from '../lease/index.js';
import type { Logger } from '../log.js';
import { DEFAULT_MAX_ATTEMPTS } from '../pipeline/attempts.js';
import type { PipelineDeps } from '../pipeline/deps.js';
import type { DispatchDeps } from '../pipeline/dispatch.js';
import type { dispatchWithRetryBound as DispatchWithRetryBound } from '../pipeline/retry-bound.js';
import type { FunctionRoute } from '../pipeline/routes/route.js';
import { SecretMask } from '../reconcile/secret-mask.js';
import type { EventSender } from '../transport/port.js';
import { gatedPorts } from './lease-gate.js';
import { messageGroupRefusal, sendingAs } from './sender.js';

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

/** One SQS record as Lambda's event source mapping delivers it (the fields used here). */
export interface SqsRecord {
  /** SQS message id; what `batchItemFailures` names. */
  messageId: string;
  /** The message body: a structured-mode CloudEvent. */
  body: string;
  /**
   * System attributes; `MessageGroupId` is set for FIFO queues, `SenderId` is the IAM principal
   * that sent the message (`<role id>:<session>` for a role), set by SQS.
   */
  attributes?: {
    MessageGroupId?: string;
    ApproximateReceiveCount?: string;
    SenderId?: string;
    [name: string]: string | undefined;
  };
  /** ARN of the queue. */
  eventSourceARN?: string;
}

/** The event Lambda passes for an SQS event source mapping. */
export interface SqsEvent {
  Records: SqsRecord[];
}

/**
 * The partial batch response (the mapping must enable `ReportBatchItemFailures`): records
 * named here return to the queue, the others are deleted. Empty: the whole batch succeeded.
 */
export interface SqsBatchResponse {
  batchItemFailures: { itemIdentifier: string }[];
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
  checkSender?: (event: KappEvent, senderId: string | undefined) => Promise<string | undefined>;
  /**
   * The run leases of Apps (`../lease/`): at most one run per App across the stage functions,
   * events meanwhile coalesced into one follow-up. Default none (every record runs: unit tests,
   * and functions whose objects run in one function only). The Lambda composition root gives
   * one to fetch, template and deploy.
   */
  leases?: RunLeases;
}

/** Default {@link EntryDeps.deadlineMarginMs}: 30 s (a status write, retried on conflicts, with room). */
export const DEFAULT_DEADLINE_MARGIN_MS = 30_000;

/** What happened to one record (logged as `outcome`). */
export type RecordOutcome =
  | 'invalid'
  | 'misrouted'
  | 'refused'
  | 'done'
  | 'forwarded'
  | 'failed'
  | 'skipped'
  | 'ended'
  | 'deadline'
  | 'coalesced'
  | 'fenced';

/**
 * Arms the function deadline of one invocation: a signal aborted with a {@link DeadlineError}
 * `margin` before the time limit (`margin` at most half the remaining time, so a short limit
 * still runs its records, and at least 0). When no time is left before the margin (`remaining`
 * 0 or negative) the signal is aborted at once, so no record starts (they go back to the queue)
 * instead of starting one whose tool is canceled before it runs.
 *
 * @returns the signal and `dispose`, which clears the timer (call it when the invocation ends);
 *   `undefined` (no deadline) when `remainingMs` is not a finite number.
 */
function armDeadline(remainingMs: number, marginMs: number): { signal: AbortSignal; dispose: () => void } | undefined {
  if (!Number.isFinite(remainingMs)) return undefined;
  const margin = Math.max(0, Math.min(marginMs, Math.floor(remainingMs / 2)) || 0);
  const abort = new AbortController();
  const delay = remainingMs - margin;
  if (delay <= 0) {
    abort.abort(new DeadlineError(margin));
    return { signal: abort.signal, dispose: () => {} };
  }
  const timer = setTimeout(() => abort.abort(new DeadlineError(margin)), delay);
  timer.unref?.();
  return { signal: abort.signal, dispose: () => clearTimeout(timer) };
}

function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : typeof err;
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
    const failures: { itemIdentifier: string }[] = [];
    const failedGroups = new Set<string>();
    if (isSourcePollEvent(event)) {
      // The schedule's poll: only the index-repo function polls; a failure fails the
      // invocation (the schedule's retry policy, then the next period, runs it again).
      if (stage !== 'index-repo') {
        log.warn({ stage }, 'source poll event sent to a function that does not poll; dropped');
        return { batchItemFailures: [] };
      }
      const poll = (await getRoute()).pollSources;
      if (!poll) throw new Error(`the ${stage} function's route has no source poll`);
      log.info({ stage, ...(await poll(d.pipeline)) }, 'source poll');
      return { batchItemFailures: [] };
    }
    const remaining = context?.getRemainingTimeInMillis?.();
    const deadline =
      remaining === undefined ? undefined : armDeadline(remaining, d.deadlineMarginMs ?? DEFAULT_DEADLINE_MARGIN_MS);
    try {
      for (const record of event.Records ?? []) {
        const group = record.attributes?.MessageGroupId;
        const rlog = log.child({ messageId: record.messageId });
        if (group !== undefined && failedGroups.has(group)) {
          failures.push({ itemIdentifier: record.messageId });
          rlog.warn(
            { stage, outcome: 'skipped' satisfies RecordOutcome },
            'earlier event of this object failed; retried after it',
          );
          continue;
        }
        if (deadline?.signal.aborted) {
          failures.push({ itemIdentifier: record.messageId });
          if (group !== undefined) failedGroups.add(group);
          rlog.warn({ stage, outcome: 'deadline' satisfies RecordOutcome }, 'function deadline reached; not started');
          continue;
        }
        const outcome = await processRecord(stage, record, d, getRoute, rlog, deadline?.signal);
        if (outcome === 'failed') {
          failures.push({ itemIdentifier: record.messageId });
          if (group !== undefined) failedGroups.add(group);
        } else if (outcome === 'ended') {
          // The run is over (its final status says why), so the object's later records still
          // run; this one is failed on its last receive so that the redrive policy keeps it in
          // the dead-letter queue, whose alarm tells the operator the infrastructure failed.
          failures.push({ itemIdentifier: record.messageId });
        }
      }
    } finally {
      deadline?.dispose();
    }
    return { batchItemFailures: failures };
  };
}

async function processRecord(
  stage: PipelineStage,
  record: SqsRecord,
  d: EntryDeps,
  getRoute: () => Promise<FunctionRoute>,
  log: Logger,
  deadline?: AbortSignal,
): Promise<RecordOutcome> {
  const parsed = parseEvent(typeof record.body === 'string' ? record.body : '');
  if (!parsed.ok) {
    log.warn({ stage, outcome: 'invalid' satisfies RecordOutcome, error: parsed.error }, 'invalid event; dropped');
    return 'invalid';
  }
  const event = parsed.event;
  const subject = subjectOf(objectRefOf(event));
  // Every function an event can target has a queue (`FunctionName` is `PipelineStage`, the one
  // list in `api/functions.ts`).
  const target = targetFunction(event);
  if (target !== stage) {
    log.warn(
      { stage, outcome: 'misrouted' satisfies RecordOutcome, type: event.type, subject, target },
      'event is for another function; dropped',
    );
    return 'misrouted';
  }
  const groupRefusal = messageGroupRefusal(
    orderingKey(objectRefOf(event)),
    record.attributes?.MessageGroupId,
    d.checkSender !== undefined,
  );
  if (groupRefusal !== undefined) {
    log.warn(
      {
        stage,
        outcome: 'refused' satisfies RecordOutcome,
        type: event.type,
        subject,
        clusterId: objectRefOf(event).clusterId,
        messageGroupId: record.attributes?.MessageGroupId,
        reason: groupRefusal,
      },
      "event's message group is not its object's; dropped",
    );
    return 'refused';
  }
  if (d.checkSender) {
    const senderId = record.attributes?.SenderId;
    let refusal: string | undefined;
    const { clusterId } = objectRefOf(event);
    try {
      refusal = await d.checkSender(event, senderId);
    } catch (err) {
      log.error(
        { stage, outcome: 'failed' satisfies RecordOutcome, type: event.type, subject, error: errorText(err) },
        "the event's sender could not be checked; will be retried",
      );
      return 'failed';
    }
    if (refusal !== undefined) {
      log.warn(
        {
          stage,
          outcome: 'refused' satisfies RecordOutcome,
          type: event.type,
          subject,
          clusterId,
          senderId,
          reason: refusal,
        },
        'event from a sender that may not send it (its cluster or its kind); dropped',
      );
      return 'refused';
    }
  }
  const elog = log.child({ subject, eventId: event.id });
  const receiveCount = Number(record.attributes?.ApproximateReceiveCount ?? 0) || undefined;
  const maxAttempts = d.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  // Per record (one run of one object): the values of the Secrets the stage reads.
  const secretMask = new SecretMask();
  let lease: HeldLease | undefined;
  let stopRenewing: (() => void) | undefined;
  let optimistic: OptimisticRun | undefined;
  try {
    let run = event;
    if (d.leases && leaseSubject(event)) {
      const leases = d.leases;
      optimistic = await infraStep('reading the run lease', () => leases.start(event));
      if (!optimistic) {
        const got = await infraStep('taking the run lease', () => leases.acquire(event));
        if (got.kind === 'coalesced') {
          elog.info(
            { stage, outcome: 'coalesced' satisfies RecordOutcome, type: event.type, holder: got.holder },
            'another run of this object holds its lease; coalesced into its follow-up',
          );
          return 'coalesced';
        }
        if (got.kind === 'fenced') return await dropFenced(event, got, d, stage, elog);
        if (got.tookOver) elog.warn({ stage, lease: got.lease.key }, 'run lease had expired; taken over');
        ({ lease, event: run } = got);
        stopRenewing = got.lease.keepAlive(elog);
      }
    }
    const opt = optimistic;
    /** Claims the lease of an optimistic run before its first real work (`./lease-gate.ts`). */
    const claim = async (): Promise<void> => {
      if (!opt || lease) return;
      const held = await infraStep('taking the run lease', () => opt.claim());
      lease = held;
      stopRenewing = held.keepAlive(elog);
    };
    // The deadline reaches every tool through the runner of the stage's deps.
    const runner = deadline ? withDeadline(d.pipeline.runner, deadline) : d.pipeline.runner;
    const ports = { ...d.pipeline, runner };
    const dispatch = d.dispatch ?? (await getRoute()).dispatch;
    const prepare = d.prepare;
    const r = await dispatchWithRetryBound(
      run,
      { ...(opt ? gatedPorts(ports, opt, claim) : ports), log: elog, ...(deadline ? { deadline } : {}) },
      { attempt: receiveCount ?? 0, maxAttempts },
      {
        secretMask,
        ...(prepare ? { prepare } : {}),
        dispatch: async (e, deps) => {
          let next: KappEvent | undefined;
          try {
            next = await dispatch(e, deps);
          } catch (err) {
            // An optimistic run that must stop is no failure: it ends here (see below).
            if (opt?.stopped) return undefined;
            throw err;
          }
          if (deadline?.aborted) elog.warn({ stage, type: e.type }, 'function deadline reached while the stage ran');
          return opt?.stopped ? undefined : next;
        },
        forward: async (next) => {
          const to = targetFunction(next);
          // An optimistic run goes on without the lease while it only reads; any other hand-off
          // (the delete path) is real work.
          if (opt && !lease && !carriesRunLease(next)) await claim();
          const sent = withRunLease(next, lease ? undefined : opt?.seen);
          // The run keeps its lease: passed to the next stage's event before that is sent.
          const held = lease;
          if (held) await infraStep('passing the run lease on', () => held.handOff(sent));
          await infraStep(`queueing the ${to} stage`, () => d.sender.send(to, sent));
        },
      },
    );
    if (opt?.stopped) return await restartOptimistic(opt, d, stage, elog);
    const held = lease;
    if (!r.next && held) {
      lease = undefined;
      await endRun(held, d, elog);
    }
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
    elog.info(
      {
        stage,
        outcome: 'forwarded' satisfies RecordOutcome,
        type: event.type,
        next: r.next.type,
        to: targetFunction(r.next),
        nextId: r.next.id,
      },
      'event handled; next stage queued',
    );
    return 'forwarded';
  } catch (err) {
    if (optimistic?.stopped) return await restartOptimistic(optimistic, d, stage, elog);
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
    if (lease) {
      await endRun(lease, d, elog).catch((endErr: unknown) =>
        elog.warn({ stage, error: errorText(endErr) }, 'run lease not ended; it expires'),
      );
    }
    return 'failed';
  } finally {
    stopRenewing?.();
  }
}

/** Whether an optimistic run may pass `next` on without the lease: a template or deploy hand-off. */
function carriesRunLease(next: KappEvent): boolean {
  return next.type === EVENT_TYPES.template || next.type === EVENT_TYPES.deploy;
}

/**
 * `next` with `run.lease` set to `seen` (an optimistic run's hand-off), or without it (`seen`
 * undefined: a run holding the lease, whose next stage takes it as before).
 */
function withRunLease(next: KappEvent, seen: string | undefined): KappEvent {
  if (!carriesRunLease(next) || !('run' in next.data)) return next;
  const { lease: _dropped, ...run } = next.data.run;
  return { ...next, data: { ...next.data, run: seen === undefined ? run : { ...run, lease: seen } } } as KappEvent;
}

/**
 * Ends an optimistic run that had to stop (another run of its App started meanwhile): the
 * record is acknowledged, and the App runs again from the start through the lease, as any
 * object event (`OptimisticRun.restartEvent`: coalesced into the holder's follow-up, or sent to
 * the fetch function with the lease reserved for it). Nothing is restarted when the event
 * itself is the lease's follow-up already.
 *
 * @returns `coalesced`; `failed` when the lease or the send failed (logged; the record is
 *   retried, stops again and sends the same restart). Never throws.
 */
async function restartOptimistic(
  run: OptimisticRun,
  d: EntryDeps,
  stage: PipelineStage,
  log: Logger,
): Promise<RecordOutcome> {
  try {
    if (run.stopped === 'restart') await restartThroughLease(run.restartEvent(d.pipeline.now()), d);
  } catch (err) {
    log.error(
      { stage, outcome: 'failed' satisfies RecordOutcome, type: run.event.type, error: errorText(err) },
      'optimistic run stopped, but its restart could not be queued; will be retried',
    );
    return 'failed';
  }
  log.info(
    { stage, outcome: 'coalesced' satisfies RecordOutcome, type: run.event.type, restarted: run.stopped === 'restart' },
    'another run of this object started while this one held no lease; it runs again after it',
  );
  return 'coalesced';
}

/**
 * Sends `again`, an object event that runs the App from the start, through the lease as any
 * object event: coalesced into the holder's follow-up, or (the lease free or expired) sent to the
 * fetch function with the lease taken for it.
 * @throws InfraError when the lease or the send fails.
 */
async function restartThroughLease(again: KappEvent, d: EntryDeps): Promise<void> {
  const leases = d.leases as RunLeases;
  const got = await infraStep('taking the run lease', () => leases.acquire(again));
  if (got.kind !== 'acquired') return;
  const next = got.event;
  await infraStep('passing the run lease on', () => got.lease.handOff(next));
  const to = targetFunction(next);
  await infraStep(`queueing the ${to} stage`, () => d.sender.send(to, next));
}

/**
 * Drops a stage event whose run's lease moved past it (`fenced`): its stage does not run, and the
 * App runs again from the start ({@link restartThroughLease} of `fencedRestartOf`).
 *
 * @returns `fenced`; `failed` when the restart could not be queued (logged; the record is retried,
 *   is fenced again and sends the same restart). Never throws.
 */
async function dropFenced(
  event: KappEvent,
  got: Extract<AcquireResult, { kind: 'fenced' }>,
  d: EntryDeps,
  stage: PipelineStage,
  log: Logger,
): Promise<RecordOutcome> {
  const restart = fencedRestartOf(event, d.pipeline.now());
  try {
    await restartThroughLease(restart, d);
  } catch (err) {
    log.error(
      { stage, outcome: 'failed' satisfies RecordOutcome, type: event.type, error: errorText(err) },
      "stage event of a run that lost its lease dropped, but the App's restart could not be queued; will be retried",
    );
    return 'failed';
  }
  log.warn(
    {
      stage,
      outcome: 'fenced' satisfies RecordOutcome,
      type: event.type,
      ...(got.holder ? { holder: got.holder } : {}),
      ...(got.last ? { last: got.last } : {}),
      restartId: restart.id,
    },
    'run lease moved past this run (another run took it); stage not run, the App runs again from the start',
  );
  return 'fenced';
}

/**
 * Ends a run's lease and sends the follow-up coalesced meanwhile, if any.
 * @throws InfraError when the lease or the send fails (the record is retried; a follow-up not
 *   sent runs once the lease reserved for it expires and the next event takes it over).
 */
async function endRun(lease: HeldLease, d: EntryDeps, log: Logger): Promise<void> {
  const followUp = await infraStep('ending the run lease', () => lease.end());
  if (!followUp) return;
  const to = targetFunction(followUp);
  await infraStep(`queueing the ${to} follow-up`, () => d.sender.send(to, followUp));
  log.info({ to, type: followUp.type, followUpId: followUp.id }, 'run ended; coalesced follow-up queued');
}
