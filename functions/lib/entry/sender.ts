/**
 * Who may name which cluster (issue 11 item 6d): an SQS message's sender is the IAM principal
 * SQS authenticated (`SenderId` of the record's attributes, `<role id>:<session name>` for a
 * role's credentials; no sender can set it). An event naming cluster C is taken only when
 *
 * - a function of the fleet sent it (its role id is in {@link SenderPolicy.functionSenders}:
 *   hand-offs between stages, follow-ups; a function only ever sends events for the cluster of
 *   an event it took), or
 * - C's forwarder sent it: the role id in C's registry document (`forwarder.roleId`,
 *   `../kube/cluster-doc.ts`), the per-cluster role the CDK app creates (`ForwarderRoleId<Id>`).
 *
 * A function of a cell (the CDK stack's `isolation: cell`: one set of functions per cluster,
 * `KAPP_LAMBDA_CELL_CLUSTER`) takes only events naming its own cluster
 * ({@link SenderPolicy.cell}), whoever sent them: its role may read only that cluster's
 * document and tokens, so an event for another cluster could not run anyway, and refusing it
 * here keeps it from failing five times into the dead-letter queue.
 *
 * Anything else (another cluster's forwarder, a cluster whose registry entry has no forwarder
 * role id, an unregistered cluster, a message without `SenderId`) is dropped and logged by the
 * handler (`refused`, with the reason): it never becomes valid by redelivery. A registered
 * cluster without a forwarder role id is refused with a reason of its own: its events are lost
 * until the document names the role (`npm run cluster -- add` asks for `--forwarder-role-id`).
 *
 * Why the sender id, not per-cluster queues or signed envelopes: SQS sets it from the
 * credentials, so no forwarder can forge it; it needs no key to distribute or rotate and no
 * queue per cluster (queues, alarms and event source mappings would grow with the fleet); and
 * the registry document, which the fleet's administrators already write, is where a cluster's
 * forwarder is named.
 *
 * @module
 */

/** A registered cluster's forwarder: its role id (`AROA…`), none when its document names none. */
export interface RegisteredForwarder {
  readonly roleId?: string;
}

/** Where a {@link senderRefusal} looks up who may speak for a cluster. */
export interface SenderPolicy {
  /** Role ids (`AROA…`) of the fleet's functions that send to this function's queue. */
  readonly functionSenders: ReadonlySet<string>;
  /** The one cluster id events may name (a cell's function); unset: any registered cluster. */
  readonly cell?: string;
  /**
   * A cluster's forwarder as its registry document names it; `undefined` when the cluster is
   * not registered. May throw (registry unreadable): the record then fails and is retried.
   */
  forwarderOf(clusterId: string): Promise<RegisteredForwarder | undefined>;
}

/** The principal part of an SQS `SenderId`: the role id of `AROA…:session`, else the whole id. */
export function senderPrincipal(senderId: string): string {
  const colon = senderId.indexOf(':');
  return colon < 0 ? senderId : senderId.slice(0, colon);
}

/**
 * Whether the sender of a record may name `clusterId` (and, in a cell, whether it is the cell's).
 *
 * @param senderId - the record's `attributes.SenderId`.
 * @returns `undefined` when it may, else why not (for the log: ids only, no secret).
 * @throws whatever {@link SenderPolicy.forwarderOf} throws.
 */
export async function senderRefusal(
  policy: SenderPolicy,
  clusterId: string,
  senderId: string | undefined,
): Promise<string | undefined> {
  if (policy.cell !== undefined && clusterId !== policy.cell) {
    return `this function is the cell of cluster ${policy.cell} and serves no other cluster`;
  }
  if (!senderId) return 'the message has no SenderId';
  const principal = senderPrincipal(senderId);
  if (policy.functionSenders.has(principal)) return undefined;
  const forwarder = await policy.forwarderOf(clusterId);
  if (forwarder === undefined) return `cluster ${clusterId} is not registered`;
  if (forwarder.roleId === undefined) {
    return `the registry entry of cluster ${clusterId} has no forwarder role id, so no forwarder may send for it (npm run cluster -- add ${clusterId} --replace … --forwarder-role-id <ForwarderRoleId>)`;
  }
  if (principal !== forwarder.roleId) return `sender ${principal} is not the forwarder of cluster ${clusterId}`;
  return undefined;
}

/**
 * Whether a record's FIFO message group is the one the fleet's senders give its event: every
 * sender (the forwarder, stage hand-offs, follow-ups, the repo.indexed fan-out; all through
 * `sendMessageInput`, `../transport/sqs.ts`) sets `MessageGroupId` = `orderingKey(objectRefOf(event))`.
 * SQS lets the sender choose the group, and the sender check above reads only the body, so
 * without this a cluster's forwarder could queue its own events in another cluster's object's
 * group and hold that object's events behind them (and behind their retries).
 *
 * @param expected - `orderingKey(objectRefOf(event))` of the record's event.
 * @param group - the record's `attributes.MessageGroupId`; absent on non-FIFO deliveries.
 * @param required - whether a record without a group is refused (the sender check is on: the
 *   fleet's queues are FIFO, so every genuine record has one).
 * @returns `undefined` when the group is acceptable, else why not (for the log).
 */
export function messageGroupRefusal(
  expected: string,
  group: string | undefined,
  required: boolean,
): string | undefined {
  if (group === undefined) return required ? 'the message has no MessageGroupId' : undefined;
  if (group !== expected) return `message group ${group} is not the event's object's (${expected})`;
  return undefined;
}
