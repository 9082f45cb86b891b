/**
 * Who may send what (docs/decisions.md D6): an SQS message's sender is the IAM principal
 * SQS authenticated (`SenderId` of the record's attributes, `<role id>:<session name>` for a
 * role's credentials; no sender can set it). An event naming cluster C is taken only when
 *
 * - a function of the fleet sent it (its role id is in {@link SenderPolicy.functionSenders},
 *   which names the function each role belongs to) and that function is one that sends such an
 *   event ({@link mayEmit}, the table {@link EMITS}): hand-offs between stages, follow-ups; a
 *   function only ever sends events for the cluster of an event it took; or
 * - C's forwarder sent it, and it is an object event or an App's health (what a forwarder sends,
 *   {@link EMITS}): the role
 *   id in C's registry document (`forwarder.roleId`, `../kube/cluster-doc.ts`), the per-cluster
 *   role the CDK app creates (`ForwarderRoleId<Id>`).
 *
 * A copy a function sends to its own queue (a record it postponed at its deadline,
 * `MessageRequeuer` of `../transport/port.ts`) comes with its own role as the sender, for any
 * event that queue delivers, including events the function never sends on ({@link EMITS}: the
 * template function's `template`, install's `repo.indexed`). Such a copy is taken from that role
 * ({@link SenderPolicy.receiver}) for any event whose target is the function. Why this is no
 * escalation: what a copy can make the function do, an event of its own queue, is what the
 * function's own code and role do; code that took over the function already holds that role and
 * runs that code (its tools, its credentials, the registry it reads), so sending itself an event
 * gives it nothing it did not hold, and reaches no other function (the rule is only for the
 * receiver's own queue, every other queue still holds the role to {@link EMITS}). An honest
 * function launders nothing through it: it postpones a record only once the record passed these
 * same checks (`postponeLane` of `./stage-handler.ts`), and a cell's function still takes only
 * its own cluster's events.
 *
 * A function of a cell (the CDK stack's `isolation: cell`: one set of functions per cluster,
 * `KAPP_LAMBDA_CELL_CLUSTER`) takes only events naming its own cluster
 * ({@link SenderPolicy.cell}), whoever sent them: its role may read only that cluster's
 * document and tokens, so an event for another cluster could not run anyway, and refusing it
 * here keeps it from failing five times into the dead-letter queue.
 *
 * Anything else (another cluster's forwarder, a cluster whose registry entry has no forwarder
 * role id, an unregistered cluster, a message without `SenderId`, an event its sender never
 * sends) is dropped and logged by the handler (`refused`, with the reason): it never becomes
 * valid by redelivery. A registered cluster without a forwarder role id is refused with a reason
 * of its own: its events are lost until the document names the role (`npm run cluster -- add`
 * asks for `--forwarder-role-id`).
 *
 * Why the sender id, not per-cluster queues or signed envelopes: SQS sets it from the
 * credentials, so no forwarder can forge it; it needs no key to distribute or rotate and no
 * queue per cluster (queues, alarms and event source mappings would grow with the fleet); and
 * the registry document, which the fleet's administrators already write, is where a cluster's
 * forwarder is named.
 *
 * @module
 */
import {
  EVENT_TYPES,
  type INSPECT_AFTER_STAGES,
  type KappEvent,
  KINDS,
  type Kind,
  objectRefOf,
  targetFunction,
} from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { EventSender } from '../transport/port.js';

/** Who sends events to the functions' queues: a function of the fleet, or a cluster's forwarder. */
export type EventSenderName = PipelineStage | 'forwarder';

/**
 * What one event is, as far as who may send it matters ({@link emittedShape}):
 *
 * - `object <Kind>`: an object event of that kind, any reason;
 * - `object <Kind> ref-changed`: one whose reason is `ref-changed`;
 * - `template`: the fetch → template hand-off (a fetched artifact to render);
 * - `deploy`: a deploy with `artifacts.manifestKey` and no `continuation` (a manifest to apply);
 * - `deploy continuation`: the same with `continuation` (the deploy function's own, past its deadline);
 * - `rollback`: a deploy with `rollbackOf` and no `continuation`: a receipt's manifest, which the
 *   deploy function applies only while the App asks for that receipt and the receipt holds it;
 * - `inspect after <stage> failure`: a deploy event with `afterFailure: <stage>` (no manifest: the
 *   deploy function only inspects and ends the run);
 * - `delete`: the delete hand-off (`kapp delete` of an App being deleted);
 * - `repo.indexed`: a repository's changed Package versions (install fans them out);
 * - `health`: an App's health after deploy, as the forwarder's watches judge it (the fetch
 *   function writes it as an added condition, `../pipeline/app/health.ts`).
 */
export type EmittedShape =
  | `object ${Kind}`
  | `object ${Kind} ref-changed`
  | 'template'
  | 'deploy'
  | 'deploy continuation'
  | 'rollback'
  | `inspect after ${(typeof INSPECT_AFTER_STAGES)[number]} failure`
  | 'delete'
  | 'repo.indexed'
  | 'health';

/**
 * The events each sender emits, from the emit sites in the code; every other event from that
 * sender is refused ({@link senderRefusal}).
 *
 * | sender | emits | where |
 * |---|---|---|
 * | forwarder | `object App`, `object PackageInstall`, `object PackageRepository` (any reason), `health` | `events/forwarder/outbox.ts`, `events/forwarder/forwarder.ts` |
 * | fetch | `template`, `inspect after fetch failure`, `rollback`, `delete`, `object App` | `../pipeline/app/fetch.ts`, `../pipeline/app/reconcile.ts`, `../pipeline/app/rollback.ts`; follow-ups and restarts |
 * | template | `deploy`, `inspect after template failure`, `object App` | `../pipeline/app/template.ts`; follow-ups and restarts |
 * | deploy | `deploy continuation`, `object App` | `../pipeline/routes/deploy.ts`; follow-ups and restarts |
 * | index-repo | `repo.indexed`, `object PackageRepository ref-changed`, `object App ref-changed` (the source poll's pokes of Apps on a moved source) | `../pipeline/repo/index-repo-changes.ts`, `../pipeline/source-poll.ts` |
 * | install | `object PackageInstall ref-changed` | `../pipeline/install/install-fanout.ts` |
 *
 * "Follow-ups and restarts": the function that ends an App's run sends the run lease's follow-up
 * (the pending object event, any reason), an optimistic run that must stop restarts its App
 * (`resync`), a fenced stage event restarts it (`ref-changed`) (`../lease/gate.ts`);
 * all are App object events to the fetch function, sent by fetch, template and deploy.
 *
 * Why: without it, any function role could send any function any event. Code that took over
 * the fetch function's process (it runs vendir on tenants' sources) could send the deploy
 * function a `deploy` naming a manifest it wrote itself, and deploy would apply it with the
 * App's credentials; fetch only ever sends an `inspect after fetch failure`, which names no
 * manifest. Likewise a forwarder (a tenant cluster's pod) sends only object events, which are
 * references the functions re-read, never artifacts to act on, and `health`, which at most sets
 * one added condition of one App of its own cluster (fenced on the App's generation, and only
 * while kapp-controller's condition says no reconcile runs). Object events of Apps stay open to
 * fetch, template and deploy: as any object event they name no artifact, and the functions act
 * on the App as they re-read it, so at most they make an App run again.
 */
export const EMITS: Readonly<Record<EventSenderName, readonly EmittedShape[]>> = Object.freeze({
  forwarder: [...KINDS.map((k) => `object ${k}` as const), 'health'],
  fetch: ['template', 'inspect after fetch failure', 'rollback', 'delete', 'object App'],
  template: ['deploy', 'inspect after template failure', 'object App'],
  deploy: ['deploy continuation', 'object App'],
  'index-repo': ['repo.indexed', 'object PackageRepository ref-changed', 'object App ref-changed'],
  install: ['object PackageInstall ref-changed'],
});

/**
 * What `event` is for {@link EMITS}: the most precise {@link EmittedShape} (an object event with
 * reason `ref-changed` is `object <Kind> ref-changed`, which `object <Kind>` covers too).
 */
export function emittedShape(event: KappEvent): EmittedShape {
  switch (event.type) {
    case EVENT_TYPES.object:
      return event.data.reason === 'ref-changed'
        ? `object ${event.data.kind} ref-changed`
        : `object ${event.data.kind}`;
    case EVENT_TYPES.template:
      return 'template';
    case EVENT_TYPES.deploy:
      if (event.data.afterFailure !== undefined) return `inspect after ${event.data.afterFailure} failure`;
      if (event.data.continuation) return 'deploy continuation';
      return event.data.rollbackOf === undefined ? 'deploy' : 'rollback';
    case EVENT_TYPES.delete:
      return 'delete';
    case EVENT_TYPES.repoIndexed:
      return 'repo.indexed';
    case EVENT_TYPES.health:
      return 'health';
  }
}

/** Whether `sender` is one that emits `event` ({@link EMITS}). */
export function mayEmit(sender: EventSenderName, event: KappEvent): boolean {
  const shape = emittedShape(event);
  const emits = EMITS[sender];
  if (emits.includes(shape)) return true;
  // `object <Kind> ref-changed` is also an `object <Kind>`.
  return event.type === EVENT_TYPES.object && emits.includes(`object ${event.data.kind}`);
}

/** Why `sender` may not send `event` ({@link mayEmit}), for a log line: names and the event type only. */
export function emitRefusal(sender: EventSenderName, event: KappEvent): string | undefined {
  if (mayEmit(sender, event)) return undefined;
  return `${sender === 'forwarder' ? 'a forwarder' : `the ${sender} function`} never sends ${named(event)}`;
}

/** `<type> (<shape>)`: the event as refusals name it. */
function named(event: KappEvent): string {
  return `${event.type} (${emittedShape(event)})`;
}

/**
 * `sender` as the `stage` function sends: an event that function never sends ({@link mayEmit})
 * is not sent; the send throws instead. The receiving function's check would drop it, so such an
 * event is a bug of {@link EMITS} or of the stage; failing the record makes it one the tests and
 * the logs show, rather than an event lost after it was queued; and it holds where no check runs
 * (the unit tests, the emulator), so they exercise the table against the stages' real events.
 *
 * @throws Error `the <stage> function never sends <type> (<shape>)` from `send`.
 */
export function sendingAs(stage: PipelineStage, sender: EventSender): EventSender {
  const check = (event: KappEvent) => {
    const refusal = emitRefusal(stage, event);
    if (refusal !== undefined) throw new Error(refusal);
  };
  return {
    async send(to, event) {
      check(event);
      await sender.send(to, event);
    },
    ...(sender.sendMany
      ? {
          async sendMany(to: PipelineStage, events: readonly KappEvent[]) {
            // Every event is checked before any is sent: a refused one sends none of the list.
            for (const event of events) check(event);
            await sender.sendMany?.(to, events);
          },
        }
      : {}),
  };
}

/** A registered cluster's forwarder: its role id (`AROA…`), none when its document names none. */
export interface RegisteredForwarder {
  readonly roleId?: string;
}

/** Where a {@link senderRefusal} looks up who may speak for a cluster. */
export interface SenderPolicy {
  /**
   * The fleet's functions that send to this function's queue: role id (`AROA…`) → the functions
   * (one, in the CDK app) running with it.
   */
  readonly functionSenders: ReadonlyMap<string, readonly PipelineStage[]>;
  /** The one cluster id events may name (a cell's function); unset: any registered cluster. */
  readonly cell?: string;
  /**
   * The function whose queue this is: its own role (a {@link SenderPolicy.functionSenders} entry naming it) may
   * send it any event whose target it is, its own postponed copies (see the module comment).
   * Unset: no such rule (each function only what it {@link EMITS}).
   */
  readonly receiver?: PipelineStage;
  /**
   * The role id (`AROA…`) of the dispatcher of this function's queue (the shared mode,
   * docs/decisions.md D15, `KAPP_LAMBDA_RECEIVER_ROLE_ID`): it sends the queue only copies of
   * records it took from there (parked and postponed ones), so it may send any event whose target
   * is {@link SenderPolicy.receiver}, and nothing else. Unset: no such role.
   */
  readonly receiverRoleId?: string;
  /**
   * Whether the roles of {@link SenderPolicy.functionSenders} are run roles (D15): each session
   * is one cluster's, named by its id (`RoleSessionName`, so SQS's `SenderId` is
   * `<run role id>:<cluster id>`), and an event a run sends must name that cluster. Why: the
   * run role itself may send any cluster's events; only the session name binds the run to its
   * cluster. Unset: function roles send for any cluster (the stage functions' own roles).
   */
  readonly runSessions?: boolean;
  /**
   * A cluster's forwarder as its registry document names it; `undefined` when the cluster is
   * not registered. May throw (registry unreadable): the record then fails and is retried.
   */
  forwarderOf(clusterId: string): Promise<RegisteredForwarder | undefined>;
}

/**
 * The STS session name of a run for `clusterId`: the id itself, and a one-character id followed
 * by `.`. Why: STS takes names of 2 to 64 characters (`[\w+=,.@-]`), a cluster id is a DNS-1123
 * label of 1 to 63, and `.` is in no cluster id, so no two clusters share a name. SQS's
 * `SenderId` of an event a run sends is `<run role id>:<this>` ({@link senderRefusal}).
 */
export function runSessionName(clusterId: string): string {
  return clusterId.length === 1 ? `${clusterId}.` : clusterId;
}

/** The principal part of an SQS `SenderId`: the role id of `AROA…:session`, else the whole id. */
export function senderPrincipal(senderId: string): string {
  const colon = senderId.indexOf(':');
  return colon < 0 ? senderId : senderId.slice(0, colon);
}

/**
 * Whether the sender of a record may send `event`: name its cluster (and, in a cell, whether
 * it is the cell's), and send an event of its kind ({@link mayEmit}).
 *
 * @param senderId - the record's `attributes.SenderId`.
 * @returns `undefined` when it may, else why not (for the log: ids, names and the event type
 *   only, no secret).
 * @throws whatever {@link SenderPolicy.forwarderOf} throws.
 */
export async function senderRefusal(
  policy: SenderPolicy,
  event: KappEvent,
  senderId: string | undefined,
): Promise<string | undefined> {
  const { clusterId } = objectRefOf(event);
  if (policy.cell !== undefined && clusterId !== policy.cell) {
    return `this function is the cell of cluster ${policy.cell} and serves no other cluster`;
  }
  if (!senderId) return 'the message has no SenderId';
  const principal = senderPrincipal(senderId);
  if (policy.receiverRoleId !== undefined && principal === policy.receiverRoleId) {
    if (policy.receiver !== undefined && targetFunction(event) === policy.receiver) return undefined;
    return `sender ${principal} is the dispatcher's role, which sends only copies of its own queue's events, not ${named(event)}`;
  }
  const stages = policy.functionSenders.get(principal);
  if (stages !== undefined) {
    if (policy.runSessions) {
      const session = senderId.slice(principal.length + 1);
      if (session !== runSessionName(clusterId)) {
        return `sender ${principal} is the run role of the ${stages.join(' and ')} function, and its session ${JSON.stringify(session.slice(0, 64))} is not cluster ${clusterId}'s`;
      }
    }
    if (stages.some((s) => mayEmit(s, event))) return undefined;
    // The own-queue rule is for the stage functions' own roles; a run role sends no copies (its
    // dispatcher does, {@link SenderPolicy.receiverRoleId}), so a run is held to what it emits.
    if (
      !policy.runSessions &&
      policy.receiver !== undefined &&
      stages.includes(policy.receiver) &&
      targetFunction(event) === policy.receiver
    ) {
      return undefined;
    }
    return `sender ${principal} is the role of the ${stages.join(' and ')} function, which never sends ${named(event)}`;
  }
  const forwarder = await policy.forwarderOf(clusterId);
  if (forwarder === undefined) return `cluster ${clusterId} is not registered`;
  if (forwarder.roleId === undefined) {
    return `the registry entry of cluster ${clusterId} has no forwarder role id, so no forwarder may send for it (npm run cluster -- add ${clusterId} --replace … --forwarder-role-id <ForwarderRoleId>)`;
  }
  if (principal !== forwarder.roleId) return `sender ${principal} is not the forwarder of cluster ${clusterId}`;
  if (!mayEmit('forwarder', event)) {
    return `sender ${principal} is the forwarder of cluster ${clusterId}, which never sends ${named(event)}`;
  }
  return undefined;
}

/**
 * Whether a record's FIFO message group is the one the fleet's senders give its event: every
 * sender (the forwarder, stage hand-offs, follow-ups, the repo.indexed fan-out; all through
 * `sendMessageInput`, `../transport/sqs.ts`) sets `MessageGroupId` = `messageGroupId(key,
 * objectRefOf(event))` under the event's cluster's event key. SQS lets the sender choose the group,
 * and the sender check above reads only the body, so without this a cluster's forwarder could
 * queue its own events in another cluster's object's group and hold that object's events behind
 * them (and behind their retries). The key is what keeps another cluster's messages out of the
 * group; this check refuses a message whose group does not match its body (a sender that holds the
 * key but mislabels, or a body copied into another group).
 *
 * @param expected - `messageGroupId(key, objectRefOf(event))` of the record's event.
 * @param group - the record's `attributes.MessageGroupId`; absent on non-FIFO deliveries.
 * @param required - whether a record without a group is refused (the sender check is on: the
 *   fleet's queues are FIFO, so every genuine record has one).
 * @param keyed - when the event's cluster has an event key: its id and the object's unkeyed
 *   ordering key, so a sender without the key is told apart in the reason.
 * @returns `undefined` when the group is acceptable, else why not (for the log).
 */
export function messageGroupRefusal(
  expected: string,
  group: string | undefined,
  required: boolean,
  keyed?: { clusterId: string; unkeyed: string },
): string | undefined {
  if (group === undefined) return required ? 'the message has no MessageGroupId' : undefined;
  if (group === expected) return undefined;
  // The two mistakes of a genuine sender, said so: the operator's fix is a key, not an attacker.
  if (keyed && group === keyed.unkeyed) {
    return `message group ${group} is not keyed, but cluster ${keyed.clusterId} has an event key: the sender does not hold it (a forwarder without FORWARDER_EVENT_KEY, or started before join or add wrote its Secret: restart it)`;
  }
  if (!keyed && new RegExp(`^${expected.split('/')[0]}/[0-9a-f]{64}$`).test(group)) {
    return `message group ${group} is keyed, but the registry document of its cluster has no event key (npm run cluster -- add … --replace keeps or makes one)`;
  }
  // A keyed group is not named: whoever reads the log could then queue in it.
  return keyed
    ? `message group ${group} is not the event's object's keyed group`
    : `message group ${group} is not the event's object's (${expected})`;
}
