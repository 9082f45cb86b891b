/**
 * The edge work of a record from a stage's queue, shared by the stage handler
 * (`./stage-handler.ts`, which runs the stage in the same function) and the dispatcher of the
 * shared mode (`./dispatch.ts`, docs/decisions.md D15, which hands the record to the stage
 * function): the record proof, the edge checks (body, target, message group, sender), the fair
 * share's slot, and what a record says of its receives and postponements. Free of the pipeline
 * and of any tool, so the dispatcher's bundle carries none.
 *
 * @module
 */

import {
  type KappEvent,
  objectRefOf,
  orderingKey,
  parseEvent,
  subjectOf,
  targetFunction,
} from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { StageShares } from '../lease/shares.js';
import { errorText, type Logger } from '../log.js';
import type { RolloutReport } from '../rollout/access.js';
import { POSTPONED_ATTRIBUTE, type RecordProver } from '../transport/port.js';
import { messageGroupId } from '../transport/sqs.js';
import { messageGroupRefusal } from './sender.js';

/**
 * Whether the record's sender may send `event` (`./sender.ts`): `undefined` when it may, else
 * why not. A throw means it could not be checked (the record fails and is retried).
 */
export type SenderCheck = (event: KappEvent, senderId: string | undefined) => Promise<string | undefined>;

/** What {@link admit} checks a record with (`EntryDeps.checkSender`; none: every sender may). */
export interface EdgeChecks {
  checkSender?: SenderCheck;
  /**
   * The event key of a cluster (the registry document's `eventKey`): the key of its objects'
   * message groups (`messageGroupId`, `../transport/sqs.ts`), which a record's group must match.
   * `undefined` from it: the plain ordering key (a cluster registered without a key). Default none:
   * every group is the ordering key (the local and emulator setups). A rejection fails the record
   * (retried), as a sender check that cannot be made does.
   */
  groupKeyOf?: (clusterId: string) => Promise<Uint8Array | undefined>;
  /**
   * Whether a keyed cluster's record is also taken in its object's unkeyed group (the ordering
   * key), as senders of earlier releases send it: `KAPP_LAMBDA_UNKEYED_GROUPS=accept`, for the
   * time an upgrade takes. Default false.
   */
  acceptUnkeyed?: boolean;
}

/** One SQS record as Lambda's event source mapping delivers it (the fields used here). */
export interface SqsRecord {
  /** SQS message id; what `batchItemFailures` names. */
  messageId: string;
  /** The handle of this receive of the message: what an early delete (`EntryDeps.deleter` of `./stage-handler.ts`) names. */
  receiptHandle?: string;
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
  /**
   * Message attributes the sender set; read here: `POSTPONED_ATTRIBUTE` (`../transport/port.ts`),
   * how many times the function postponed the record (a Number attribute, as a string).
   */
  messageAttributes?: Record<string, { stringValue?: string; dataType?: string } | undefined>;
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
  /**
   * The stage function's answer in the dispatched mode only (docs/decisions.md D15): the message
   * ids, in send order, of records the stage held back at its deadline, which the dispatcher sends
   * back to the queue as postponed copies (`MessageRequeuer`); a copy not accepted fails its record.
   * Never in an answer to Lambda's event source mapping, which reads `batchItemFailures` only.
   */
  requeue?: string[];
  /**
   * The dispatched fetch or index-repo stage's answer only (`POLL_MEMBER_STAGES` of
   * `./dispatch.ts`): whether the run's cluster's domain holds source poll records after the run
   * (`hasSourcePollRecords` of `./dispatched.ts`); absent when that could not be listed. The
   * dispatcher keeps it as the cluster's poll membership in `cluster` sharing (`PollMembers`).
   */
  pollMember?: boolean;
  /**
   * The dispatched install stage's answer only: what its runs reported of the fleet's rollouts
   * (`RolloutReport` of `../rollout/access.ts`), for the install dispatcher to start, evaluate
   * and store them (`./dispatch-rollouts.ts`). Absent when no run touched a rollout.
   */
  rollouts?: RolloutReport;
}

/**
 * How many times a record is postponed at most (`EntryDeps.requeuer`): past it the record
 * goes back through `batchItemFailures`, spending its receives. Why a bound: a record that never
 * fits in one invocation (a stage longer than the function timeout, a cluster that never
 * answers) would otherwise be postponed for ever, never reaching its last receive, where the
 * retry bound ends its run with a failed status (`../pipeline/retry-bound.ts`) before the
 * dead-letter queue takes it. With it, such a record still ends with a status, at most this many
 * invocations later.
 */
export const MAX_POSTPONEMENTS = 3;

/**
 * Margin over the time an invocation has left of the visibility a proven record is given
 * (`EntryDeps.prover`), seconds: the queue's own margin over the function timeout
 * (`VISIBILITY_MARGIN_SECONDS` of `infra/aws/stages.ts`), so the proof keeps the message hidden
 * as long as its receive did.
 */
export const PROOF_VISIBILITY_MARGIN_SECONDS = 60;

/** The visibility of a proven record when the invocation has no time limit (tests): 15 minutes, Lambda's longest. */
const UNTIMED_VISIBILITY_SECONDS = 900;

/**
 * Margin over the invocation's time limit of a record's slot (`EntryDeps.shares`), ms: a
 * crashed invocation's slots free themselves this long after its time limit. Shorter than the
 * queue's visibility margin (`PROOF_VISIBILITY_MARGIN_SECONDS`), so the crashed record's own
 * message, back after its visibility timeout, finds the slot freed (it takes its own back anyway:
 * same message id).
 */
export const SHARE_HOLD_MARGIN_MS = 30_000;

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
  | 'fenced'
  | 'postponed';

/**
 * The records of a batch that are proven messages of the function's own queue
 * (`EntryDeps.prover`); the others are dropped and logged (`refused`), with no other effect.
 * A receipt handle given to two records proves neither: the queue issues one per receive.
 *
 * @param remainingMs - the time the invocation has left (the visibility given is this plus
 *   {@link PROOF_VISIBILITY_MARGIN_SECONDS}); `undefined`: {@link UNTIMED_VISIBILITY_SECONDS}.
 * @param fail - reports a record in `batchItemFailures`: every record when the queue could not
 *   answer (then none is returned).
 */
export async function provenRecords(
  stage: PipelineStage,
  records: readonly SqsRecord[],
  prover: RecordProver,
  remainingMs: number | undefined,
  log: Logger,
  fail: (record: SqsRecord) => void,
): Promise<SqsRecord[]> {
  const handleOf = (r: SqsRecord) =>
    typeof r.receiptHandle === 'string' && r.receiptHandle !== '' ? r.receiptHandle : undefined;
  const uses = new Map<string, number>();
  for (const r of records) {
    const h = handleOf(r);
    if (h !== undefined) uses.set(h, (uses.get(h) ?? 0) + 1);
  }
  const candidates = records.filter((r) => {
    const h = handleOf(r);
    return h !== undefined && uses.get(h) === 1;
  });
  const seconds =
    remainingMs !== undefined && Number.isFinite(remainingMs)
      ? Math.ceil(Math.max(0, remainingMs) / 1000) + PROOF_VISIBILITY_MARGIN_SECONDS
      : UNTIMED_VISIBILITY_SECONDS + PROOF_VISIBILITY_MARGIN_SECONDS;
  let answers: readonly boolean[];
  try {
    answers =
      candidates.length === 0
        ? []
        : await prover.prove(
            candidates.map((r) => handleOf(r) as string),
            seconds,
          );
  } catch (err) {
    log.error(
      { stage, outcome: 'failed' satisfies RecordOutcome, records: records.length, error: errorText(err) },
      "could not prove the records are messages of this function's queue; will be retried",
    );
    records.forEach(fail);
    return [];
  }
  const proven = new Set(candidates.filter((_, i) => answers[i] === true));
  for (const r of records) {
    if (proven.has(r)) continue;
    const h = handleOf(r);
    log.child({ messageId: typeof r.messageId === 'string' ? r.messageId.slice(0, 128) : typeof r.messageId }).warn(
      {
        stage,
        outcome: 'refused' satisfies RecordOutcome,
        reason:
          h === undefined
            ? 'the record has no receipt handle'
            : uses.get(h) !== 1
              ? 'the record shares its receipt handle with another record'
              : "the queue refused the record's receipt handle",
      },
      "record is not an in-flight message of this function's queue (a direct invoke?); dropped",
    );
  }
  return records.filter((r) => proven.has(r));
}

/** The record's `ApproximateReceiveCount`, 0 when absent or not a number. */
export function receiveCountOf(record: SqsRecord): number {
  return Number(record.attributes?.ApproximateReceiveCount ?? 0) || 0;
}

/**
 * The records of one batch in lanes, one per message group (a record without a group is a lane
 * of its own), each lane's records in batch order; lanes in the order of their first record.
 */
export function messageGroupLanes(records: readonly SqsRecord[]): SqsRecord[][] {
  const lanes = new Map<string, SqsRecord[]>();
  records.forEach((record, i) => {
    const group = record.attributes?.MessageGroupId;
    const key = group === undefined ? `record ${i}` : `group ${group}`;
    const lane = lanes.get(key);
    if (lane) lane.push(record);
    else lanes.set(key, [record]);
  });
  return [...lanes.values()];
}

/** How many times the record was postponed already ({@link POSTPONED_ATTRIBUTE}): 0 when absent or not a count. */
export function postponementsOf(record: SqsRecord): number {
  const n = Number(record.messageAttributes?.[POSTPONED_ATTRIBUTE]?.stringValue ?? 0);
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

/**
 * The edge checks of one record, before anything of its run: the body is a valid stage event
 * for this function, its message group is its object's, and its sender may send it
 * (`./sender.ts`).
 *
 * @returns the event, or the record's outcome when it stops here (logged): `invalid`,
 *   `misrouted`, `refused`, or `failed` when the sender could not be checked (retried).
 */
export async function admit(
  stage: PipelineStage,
  record: SqsRecord,
  d: EdgeChecks,
  log: Logger,
): Promise<KappEvent | RecordOutcome> {
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
  const ref = objectRefOf(event);
  let key: Uint8Array | undefined;
  try {
    key = await d.groupKeyOf?.(ref.clusterId);
  } catch (err) {
    log.error(
      { stage, outcome: 'failed' satisfies RecordOutcome, type: event.type, subject, error: errorText(err) },
      "the event's cluster's event key could not be read; the record is retried",
    );
    return 'failed';
  }
  const unkeyed = orderingKey(ref);
  const group = record.attributes?.MessageGroupId;
  const groupRefusal =
    d.acceptUnkeyed === true && group === unkeyed
      ? undefined
      : messageGroupRefusal(
          messageGroupId(key, ref),
          group,
          d.checkSender !== undefined,
          key === undefined ? undefined : { clusterId: ref.clusterId, unkeyed },
        );
  if (groupRefusal !== undefined) {
    log.warn(
      {
        stage,
        outcome: 'refused' satisfies RecordOutcome,
        type: event.type,
        subject,
        clusterId: ref.clusterId,
        messageGroupId: record.attributes?.MessageGroupId,
        reason: groupRefusal,
      },
      "event's message group is not its object's; dropped",
    );
    return 'refused';
  }
  return (await senderRefusal(stage, record, event, d, log)) ?? event;
}

/**
 * Whether the record's sender may send `event` (`EntryDeps.checkSender`; none: every sender may).
 *
 * @returns `undefined` when it may; else the record's outcome (logged): `refused`, or `failed`
 *   when the check could not be made (retried).
 */
async function senderRefusal(
  stage: PipelineStage,
  record: SqsRecord,
  event: KappEvent,
  d: EdgeChecks,
  log: Logger,
): Promise<RecordOutcome | undefined> {
  if (!d.checkSender) return undefined;
  const subject = subjectOf(objectRefOf(event));
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
  return undefined;
}

/**
 * The epoch ms a record's slot (`EntryDeps.shares`) frees itself at if the invocation
 * crashes: its time limit plus {@link SHARE_HOLD_MARGIN_MS} (without a limit, Lambda's longest,
 * 15 minutes).
 */
export function shareUntil(remainingMs: number | undefined): number {
  const left = remainingMs !== undefined && Number.isFinite(remainingMs) ? Math.max(0, remainingMs) : 900_000;
  return Date.now() + left + SHARE_HOLD_MARGIN_MS;
}

/**
 * Takes the record's slot of its cluster's and namespace's share (`EntryDeps.shares`).
 *
 * @returns the slot (release it when the record ends); `postponed` when the record was parked
 *   (acknowledged: it comes back when a record of its cluster ends); `failed` when the shares
 *   could not be read or written, or the record was over its share and may not be parked (past
 *   {@link MAX_POSTPONEMENTS}, or its cluster's parked records at their bound): retried the usual
 *   way, spending a receive. Logged.
 */
export async function takeShare(
  stage: PipelineStage,
  record: SqsRecord,
  event: KappEvent,
  shares: StageShares,
  until: number,
  log: Logger,
): Promise<{ release: () => Promise<void> } | 'postponed' | 'failed'> {
  const ref = objectRefOf(event);
  const subject = { clusterId: ref.clusterId, namespace: ref.namespace };
  const postponements = postponementsOf(record) + 1;
  try {
    const got = await shares.acquire(stage, subject, {
      id: record.messageId,
      until,
      eventId: event.id,
      message: {
        messageId: record.messageId,
        body: record.body,
        messageGroupId: record.attributes?.MessageGroupId ?? orderingKey(ref),
        postponements,
      },
      // Each copy starts its receive count again, so a record parked without bound (one that
      // fails each time it runs and finds its cluster at its share at each retry) would never
      // reach its last receive, where the retry bound ends its run: past MAX_POSTPONEMENTS it
      // waits in the queue instead, spending a receive.
      park: postponements <= MAX_POSTPONEMENTS,
    });
    if (got === 'turned-away') {
      log.warn(
        {
          stage,
          outcome: 'failed' satisfies RecordOutcome,
          type: event.type,
          clusterId: ref.clusterId,
          postponements: postponements - 1,
        },
        `cluster or namespace over its share of the function's slots, and the record may not be parked (postponed ${MAX_POSTPONEMENTS} times already, or its cluster has the most parked records); will be retried`,
      );
      return 'failed';
    }
    if (got === 'over-share') {
      log.info(
        {
          stage,
          outcome: 'postponed' satisfies RecordOutcome,
          type: event.type,
          clusterId: ref.clusterId,
          postponements,
        },
        "cluster or namespace over its share of the function's slots; parked until a record of its cluster ends",
      );
      return 'postponed';
    }
  } catch (err) {
    log.error(
      { stage, outcome: 'failed' satisfies RecordOutcome, type: event.type, error: errorText(err) },
      "could not take the record's share of the function's slots; will be retried",
    );
    return 'failed';
  }
  return {
    release: () =>
      shares.release(stage, subject, record.messageId).catch((err: unknown) => {
        log.warn(
          { stage, clusterId: ref.clusterId, error: errorText(err) },
          "could not release the record's share of the function's slots; it frees itself after the invocation's time limit",
        );
      }),
  };
}
