/**
 * The dispatcher of a stage in the shared mode (docs/decisions.md D15), its pure core: one
 * function per stage that consumes the stage's queue in place of the stage function, runs no
 * tool, and hands each cluster's records to the stage function in an invocation of their own,
 * with credentials that reach that cluster only (the stage's run role assumed under
 * `runSessionPolicy`, `infra/aws/run-policy.ts`), that cluster's sealing keys and, for an `eks`
 * cluster, an EKS token of the dispatcher's own role for that cluster only; the stage
 * function runs in Lambda's tenant isolation mode with `TenantId` = the cluster id, so a warm
 * environment never serves two clusters. The stage's answer (`batchItemFailures`) becomes the
 * dispatcher's, record by record.
 *
 * The edge work the stage handler does for a stage function that runs its own records
 * (`./stage-handler.ts`) is done here, before any invoke, with the same code (`./edge.ts`): the
 * record proof, the edge checks (body, target, message group, sender, and a run role's session
 * named by the event's cluster), the fair share's slot (taken before the invoke, freed and its
 * parked records woken after it returns, so the run's session holds no `state/shares/` key),
 * and the early delete of a cluster's finished message groups while other clusters still run.
 * The stage's `requeue` (records its deadline held back) is sent back to the queue here, as
 * postponed copies. The source poll event is run per member cluster ({@link makeDispatcher}).
 * The AWS adapters of its ports: `./dispatch-aws.ts`; the composition: `./dispatch-entry.ts`;
 * the stage side: `./dispatched.ts`.
 *
 * @module
 */

import pMap from 'p-map';
import {
  isRolloutCheckEvent,
  isSourcePollEvent,
  type KappEvent,
  objectRefOf,
  type RolloutCheckEvent,
  type SourcePollEvent,
  subjectOf,
} from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { ClusterKeyring } from '../artifact/keyring.js';
import { CLUSTER_ID_PATTERN } from '../kube/cluster-doc.js';
import type { StageShares } from '../lease/shares.js';
import { errorText, type Logger } from '../log.js';
import type { ClusterRolloutView, RolloutReport } from '../rollout/access.js';
import type { ObjectStore } from '../store/port.js';
import type { MessageDeleter, MessageRequeuer, RecordProver } from '../transport/port.js';
import { usesArtifactKey } from './artifact-key.js';
import {
  admit,
  type EdgeChecks,
  MAX_POSTPONEMENTS,
  messageGroupLanes,
  postponementsOf,
  provenRecords,
  type RecordOutcome,
  type SenderCheck,
  type SqsBatchResponse,
  type SqsEvent,
  type SqsRecord,
  shareUntil,
  takeShare,
} from './edge.js';
import type { LambdaContext } from './stage-handler.js';

/** Temporary credentials of one stage run of one cluster (an STS session's). Never logged. */
export interface RunSessionCredentials {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly sessionToken: string;
  /** When STS stops honouring them. */
  readonly expiration: Date;
}

/**
 * Where a stage run's credentials come from: the stage's run role assumed for one cluster
 * (`StsRunCredentials` of `./dispatch-aws.ts`).
 */
export interface RunCredentials {
  /**
   * Credentials of a `stage` run for cluster `clusterId` whose private artifacts are under
   * `private/<clusterTag>/`, valid long enough for a whole stage run.
   * @throws when they cannot be had (the cluster's records of this batch fail and are retried).
   */
  forRun(stage: PipelineStage, clusterId: string, clusterTag: string): Promise<RunSessionCredentials>;
}

/** A cluster's sealing keys in a payload: `ClusterKeys` with its keys in base64. Never logged. */
export interface WireClusterKeys {
  /** 32 lowercase hex characters (`ClusterKeys.tag`). */
  readonly tag: string;
  /** AES-256-GCM key, base64 of 32 bytes. */
  readonly encKey: string;
  /** HMAC-SHA256 key, base64 of 32 bytes. */
  readonly macKey: string;
}

/**
 * What the dispatcher sends the stage function in one invocation: the records of one cluster,
 * in the order the queue gave them, and what that cluster's run needs to reach its own objects
 * and nothing else. JSON; the credentials' expiration is an ISO 8601 string.
 */
export interface DispatchedBatch {
  /** The records, unchanged from the event source mapping's event; all of cluster `clusterId`. */
  readonly records: readonly SqsRecord[];
  /** The cluster every record names, and the invocation's `TenantId`. */
  readonly clusterId: string;
  /** The run session's credentials ({@link RunCredentials.forRun}). */
  readonly credentials: {
    readonly accessKeyId: string;
    readonly secretAccessKey: string;
    readonly sessionToken: string;
    readonly expiration: string;
  };
  /**
   * The cluster's sealing keys, derived by the dispatcher from the artifact root key, which the
   * run's session cannot read. Absent for a stage that seals nothing (`install`, `usesArtifactKey`).
   */
  readonly sealingKeys?: WireClusterKeys;
  /**
   * The cluster's EKS bearer token, for an `eks` cluster only: minted by the dispatcher with its
   * own role ({@link EksTokenMinter}), which the cluster's access entry maps, for this cluster's
   * EKS name only, so a run never signs one (a run role session could sign one for any cluster
   * mapping the role). `expiresAt` is ISO 8601, 15 minutes after signing. Secret: never logged.
   */
  readonly eksToken?: { readonly token: string; readonly expiresAt: string };
  /**
   * Set (with no records) for the source poll of this cluster (`SourcePollEvent`, index-repo
   * only): the stage runs `pollSources` with its registry narrowed to `clusterId`, so it pokes only
   * this cluster's members of the fleet's source poll records and reads no other cluster's
   * objects; each record's resolution is claimed once per period by compare-and-swap, so of the
   * clusters' polls one resolves each source. Absent: a batch of records.
   */
  readonly poll?: true;
  /**
   * The fleet's rollouts narrowed to `clusterId` (install batches only, when policies are applied):
   * the run gates its PackageInstalls with them and reports back (`SqsBatchResponse.rollouts`);
   * it never reads or writes a rollout record itself (`./dispatch-rollouts.ts`).
   */
  readonly rollouts?: ClusterRolloutView;
}

/**
 * How the dispatcher invokes the stage function: synchronously, in tenant isolation mode
 * (`LambdaStageInvoker` of `./dispatch-aws.ts`).
 */
export interface StageInvoker {
  /**
   * Runs `payload` in the stage function as tenant `tenantId` and waits for its answer.
   * @throws when the invoke fails (throttled, timed out, the function's error, an answer that is
   *   no batch response): every record of `payload` fails.
   */
  invoke(stage: PipelineStage, tenantId: string, payload: DispatchedBatch): Promise<SqsBatchResponse>;
}

/**
 * Mints the EKS token of a cluster's run (`eksTokenMinter` of `./dispatch-entry.ts`: the
 * cluster's registry document, signed with the dispatcher role's credentials).
 */
export interface EksTokenMinter {
  /**
   * A token for cluster `clusterId` signed now, or `undefined` when it is no `eks` cluster.
   * Signed for each invoke, never cached: it must outlive the whole run it is given to.
   * @throws when the document cannot be read or the token signed (the cluster's records fail).
   */
  tokenFor(clusterId: string): Promise<{ token: string; expiresAt: Date } | undefined>;
}

/** The ports of {@link makeDispatcher}; the optional ones are the edge work of `./edge.ts`. */
export interface DispatcherDeps {
  credentials: RunCredentials;
  invoker: StageInvoker;
  /** The fleet's per-cluster keys (`DerivedKeyring` over the artifact root key): the tag and the sealing keys. */
  keyring: ClusterKeyring;
  log: Logger;
  /** The EKS tokens of `eks` clusters' runs. Default none: every batch goes without one. */
  eksTokens?: EksTokenMinter;
  /**
   * Proves each record a message of the stage's queue in flight now (`EntryDeps.prover`), before
   * its `SenderId` is trusted. Default none (unit tests, emulators without the check).
   */
  prover?: RecordProver;
  /** The sender check (`EntryDeps.checkSender`, with `SenderPolicy.runSessions`). Default none. */
  checkSender?: SenderCheck;
  /** The key of each cluster's message groups (`EdgeChecks.groupKeyOf`, `./edge.ts`). Default none. */
  groupKeyOf?: EdgeChecks['groupKeyOf'];
  /** Takes a keyed cluster's record in its unkeyed group too (`EdgeChecks.acceptUnkeyed`). Default false. */
  acceptUnkeyed?: boolean;
  /** The fair shares of the stage's slots (`EntryDeps.shares`). Default none: every record is invoked. */
  shares?: StageShares;
  /**
   * Deletes a cluster's message groups whose records all ended while other clusters' invokes
   * still run (`EntryDeps.deleter`). Default none.
   */
  deleter?: MessageDeleter;
  /**
   * Sends the records the stage names in its `requeue` back to the queue as postponed copies.
   * Default none: they fail instead (back through `batchItemFailures`).
   */
  requeuer?: MessageRequeuer;
  /**
   * The clusters the source poll runs for ({@link sourcePollClusters}); a throw fails the poll's
   * invocation (the schedule runs it again). Default none: a poll event is dropped (logged).
   */
  pollClusters?: () => Promise<readonly string[]>;
  /**
   * The source poll's membership of each cluster in `cluster` sharing ({@link StorePollMembers}):
   * set from the `pollMember` a run of a {@link POLL_MEMBER_STAGES} stage answers, for the cluster
   * the dispatcher invoked. Default none: the answer's `pollMember` is ignored (`fleet` sharing,
   * where {@link sourcePollClusters} reads the fleet's records).
   */
  pollMembers?: PollMembers;
  /**
   * Whether a cluster is in the registry (its document is there). With {@link pollMembers}, a
   * member the registry no longer names (removed with `npm run cluster -- remove`) loses its
   * membership at the next poll instead of failing there every period. A throw keeps the member
   * and polls it. Default none: every member is polled.
   */
  registered?: (clusterId: string) => Promise<boolean>;
  /**
   * The rollout coordinator (install only, `RolloutCoordinator` of `./dispatch-rollouts.ts`): each
   * batch's view per cluster, what the runs reported after the batch, and the schedule's check
   * (`RolloutCheckEvent`). Default none: install batches carry no view (not gated).
   */
  rollouts?: {
    viewFor(clusterId: string): Promise<ClusterRolloutView | undefined>;
    afterBatch(reports: ReadonlyMap<string, RolloutReport>): Promise<void>;
    check(): Promise<void>;
  };
}

/**
 * The source poll membership the dispatcher keeps per cluster in `cluster` sharing
 * (`KAPP_LAMBDA_SHARING=cluster`), where each cluster's source poll records are in its own
 * domain and the dispatcher can read none of them.
 */
export interface PollMembers {
  /**
   * Records whether cluster `clusterId`'s domain holds source poll records.
   * @throws StoreError when the store fails; Error for a `clusterId` that is no cluster id.
   */
  set(clusterId: string, member: boolean): Promise<void>;
}

/** A record past its edge checks and holding its slot (if shares are on), to be invoked. */
interface Admitted {
  readonly record: SqsRecord;
  readonly event: KappEvent;
  readonly release?: () => Promise<void>;
}

/** How many clusters' source polls run at once ({@link makeDispatcher}): 8. */
export const POLL_INVOKE_CONCURRENCY = 8;

/**
 * Where the fleet's source poll records are (`SOURCE_POLL_PREFIX` of
 * `../pipeline/source-poll.ts`, repeated so the dispatcher's bundle carries none of the pipeline;
 * a unit test holds them equal).
 */
export const SOURCE_POLL_RECORDS_PREFIX = 'cache/source-poll/sha256/';

/**
 * Where the dispatcher keeps the source poll's member clusters in `cluster` sharing
 * ({@link StorePollMembers}): `state/poll-members/<cluster id>`, an empty JSON object each.
 * Only the dispatchers' roles hold it; no run session does.
 */
export const POLL_MEMBERS_PREFIX = 'state/poll-members/';

/**
 * The stages whose dispatched runs answer `pollMember` (`SqsBatchResponse.pollMember`): those
 * that write source poll records, index-repo (repositories, and the poll itself) and fetch (App
 * sources, `trackAppSources`).
 */
export const POLL_MEMBER_STAGES: readonly PipelineStage[] = Object.freeze(['fetch', 'index-repo']);

/** Every key under `prefix`, page after page. @throws StoreError when a page cannot be listed. */
async function listAll(store: ObjectStore, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for (let page = await store.list(prefix); ; ) {
    keys.push(...page);
    if (page.length < 1000) return keys;
    page = await store.list(prefix, { startAfter: page[page.length - 1] });
  }
}

/**
 * {@link PollMembers} in the artifact bucket, under {@link POLL_MEMBERS_PREFIX}, written only by
 * the dispatchers from what each cluster's own run answered: so a run of cluster A can neither
 * add nor drop cluster B (it names no cluster in its answer), and the dispatcher never trusts a
 * record any run could write to learn whom to poll.
 */
export class StorePollMembers implements PollMembers {
  constructor(private readonly store: ObjectStore) {}

  /**
   * Member: writes the cluster's document unless it is there (a HEAD, then one PUT the first
   * time); not a member: deletes it (deleting an absent key succeeds).
   * @throws StoreError when the store fails; Error for a `clusterId` that is no cluster id.
   */
  async set(clusterId: string, member: boolean): Promise<void> {
    if (!CLUSTER_ID_PATTERN.test(clusterId)) throw new Error(`not a cluster id: ${clusterId.slice(0, 64)}`);
    const key = `${POLL_MEMBERS_PREFIX}${clusterId}`;
    if (!member) return await this.store.delete(key);
    if (!(await this.store.head(key))) await this.store.put(key, '{}');
  }

  /**
   * The member clusters, sorted; a key that is no cluster id is ignored.
   * @throws StoreError when the prefix cannot be listed.
   */
  async list(): Promise<string[]> {
    return (await listAll(this.store, POLL_MEMBERS_PREFIX))
      .map((key) => key.slice(POLL_MEMBERS_PREFIX.length))
      .filter((id) => CLUSTER_ID_PATTERN.test(id))
      .sort();
  }
}

/** `ClusterKeys` as {@link WireClusterKeys}. */
function wireKeys(keys: { tag: string; encKey: Buffer; macKey: Buffer }): WireClusterKeys {
  return { tag: keys.tag, encKey: keys.encKey.toString('base64'), macKey: keys.macKey.toString('base64') };
}

/**
 * Whom the source poll is run for, sorted. `fleet` sharing: the clusters with members in the
 * fleet's source poll records (`cache/source-poll/sha256/*.json`,
 * `SourcePollRecord.members[].cluster`; a record that is not JSON is skipped, the poll itself logs
 * it; a member whose cluster is no cluster id is ignored). `cluster` sharing: the members the
 * dispatchers recorded ({@link StorePollMembers}), and no record is read: each cluster's records
 * are in its own domain, and a record any run can write must not say whom to poll.
 *
 * @throws StoreError when the records or members cannot be listed or read.
 */
export async function sourcePollClusters(
  store: ObjectStore,
  sharing: 'fleet' | 'cluster' = 'fleet',
): Promise<string[]> {
  if (sharing === 'cluster') return await new StorePollMembers(store).list();
  const keys = await listAll(store, SOURCE_POLL_RECORDS_PREFIX);
  const clusters = new Set<string>();
  await pMap(
    keys,
    async (key) => {
      const body = await store.get(key);
      let members: unknown;
      try {
        members = (JSON.parse(body?.toString('utf8') ?? 'null') as { members?: unknown } | null)?.members;
      } catch {
        return;
      }
      if (!Array.isArray(members)) return;
      for (const m of members) {
        const cluster = (m as { cluster?: unknown } | null)?.cluster;
        if (typeof cluster === 'string' && CLUSTER_ID_PATTERN.test(cluster)) clusters.add(cluster);
      }
    },
    { concurrency: POLL_INVOKE_CONCURRENCY },
  );
  return [...clusters].sort();
}

/** What one cluster's invoke answered, restricted to the records it carried. */
interface ClusterAnswer {
  /** Whether the stage answered (else every record carried failed). */
  readonly answered: boolean;
  /** The records the stage failed, or every record carried when the invoke failed. */
  readonly failed: ReadonlySet<string>;
  /** The records the stage held back, to be sent back as copies (in the stage's order; none failed). */
  readonly requeue: readonly string[];
  /** What the runs reported of the rollouts (install). */
  readonly rollouts?: RolloutReport;
}

/**
 * Builds the dispatcher of `stage`: the handler of the stage queue's event source mapping and of
 * the stage's source poll schedule.
 *
 * **A batch.** The records are proven messages of the queue (`deps.prover`), then, one message
 * group after another in batch order and the groups side by side, each passes the edge checks
 * (`admit` of `./edge.ts`; refused, invalid and misrouted records are dropped) and takes its
 * slot of the fair shares (`deps.shares`: a record over its cluster's or namespace's share is
 * parked and acknowledged, and is never invoked); a record that fails either fails the later
 * records of its group without checking them (`skipped`), as the stage handler does. Each
 * cluster's remaining records then go to the stage function in one synchronous invoke
 * ({@link StageInvoker}, `TenantId` = the cluster id) with that cluster's run credentials,
 * sealing keys and, for an `eks` cluster, an EKS token the dispatcher signs for it
 * (`deps.eksTokens`); the clusters' invokes run side by side. When an invoke returns or throws, its
 * records' slots are released (waking the cluster's parked records); the records the stage names
 * in `requeue` are sent back as postponed copies (one requeue per message group, all or none; a
 * group with a record past `MAX_POSTPONEMENTS` or without a message group, or a requeue that
 * fails, fails instead); and if other clusters still run, the cluster's message groups whose
 * records all ended are deleted early (`deps.deleter`). A record the stage names in its
 * `batchItemFailures` fails; an invoke that fails, or whose credentials or keys could not be
 * had, fails exactly the records it carried. The stage's answer may name only records it was
 * given: any other identifier is ignored (logged), so one cluster's run cannot fail, hold back or
 * requeue another cluster's records.
 *
 * **The source poll** (`SourcePollEvent`, index-repo only; another stage drops it): the poll
 * pokes the members of the fleet's source poll records after reading each member's object in its
 * cluster, which in the shared mode only a session of that cluster may do, and the dispatcher
 * itself holds no cluster's tokens and runs no resolver. So it invokes the stage once per
 * cluster with members (`deps.pollClusters`), {@link POLL_INVOKE_CONCURRENCY} at once, each a
 * {@link DispatchedBatch} with no records and `poll` set, under that cluster's session: each
 * poll pokes its own cluster's members only, and resolves the sources due (one resolution per
 * source per period fleet-wide: the records are claimed by compare-and-swap). A cluster whose
 * poll fails is logged and polled again at the next period; a failure to list the clusters fails
 * the invocation.
 *
 * **Rollouts** (install, `deps.rollouts`): each cluster's invoke carries the fleet's rollouts
 * narrowed to that cluster (`DispatchedBatch.rollouts`); the runs' `rollouts` answers, each kept
 * for the cluster invoked (never one the answer names), go to the coordinator once every cluster's
 * invoke ended; a `RolloutCheckEvent` runs its check (`./dispatch-rollouts.ts`).
 *
 * **Poll membership** (`cluster` sharing, `deps.pollMembers`): a fetch or index-repo run (a batch
 * or a poll) answers `pollMember`, whether its cluster's domain holds source poll records after
 * it; the dispatcher records it for the cluster it invoked (never another: the answer names
 * none), and a failure to record it is logged only.
 *
 * @returns the handler; it never rejects on a batch (every problem ends in its records'
 *   failures), and rejects a poll only when `deps.pollClusters` does.
 */
export function makeDispatcher(
  stage: PipelineStage,
  deps: DispatcherDeps,
): (event: SqsEvent | SourcePollEvent | RolloutCheckEvent, context?: LambdaContext) => Promise<SqsBatchResponse> {
  /** One cluster's invoke: `records` (none for a poll), mapped to what the stage may answer of them. */
  const invokeCluster = async (
    clusterId: string,
    records: readonly SqsRecord[],
    log: Logger,
    poll = false,
  ): Promise<ClusterAnswer> => {
    const carried = new Set(records.map((r) => r.messageId));
    let answer: SqsBatchResponse;
    try {
      const keys = await deps.keyring.keysFor(clusterId);
      const c = await deps.credentials.forRun(stage, clusterId, keys.tag);
      // Signed last, just before the invoke: its 15 minutes must cover the whole run.
      const eks = await deps.eksTokens?.tokenFor(clusterId);
      const rollouts = !poll && stage === 'install' ? await deps.rollouts?.viewFor(clusterId) : undefined;
      const payload: DispatchedBatch = {
        records,
        clusterId,
        credentials: {
          accessKeyId: c.accessKeyId,
          secretAccessKey: c.secretAccessKey,
          sessionToken: c.sessionToken,
          expiration: c.expiration.toISOString(),
        },
        ...(usesArtifactKey(stage) ? { sealingKeys: wireKeys(keys) } : {}),
        ...(eks ? { eksToken: { token: eks.token, expiresAt: eks.expiresAt.toISOString() } } : {}),
        ...(poll ? { poll: true as const } : {}),
        ...(rollouts ? { rollouts } : {}),
      };
      answer = await deps.invoker.invoke(stage, clusterId, payload);
    } catch (err) {
      log.error(
        { outcome: 'failed', records: records.length, ...(poll ? { poll } : {}), error: errorText(err) },
        poll
          ? "could not run the cluster's source poll in the stage function; the next poll runs it"
          : "could not run the cluster's records in the stage function; they will be retried",
      );
      return { answered: false, failed: carried, requeue: [] };
    }
    // Ids the stage named but was not given are ignored and counted, and logged once per answer
    // with the first of them: a taken-over run's answer of 200,000 made-up ids is one log line.
    const unknown: Record<string, number> = {};
    let firstUnknown: string | undefined;
    const given = (id: unknown, field: string): id is string => {
      if (typeof id === 'string' && carried.has(id)) return true;
      unknown[field] = (unknown[field] ?? 0) + 1;
      firstUnknown ??= String(id).slice(0, 128);
      return false;
    };
    const failed = new Set(
      answer.batchItemFailures.map((f) => f.itemIdentifier).filter((id) => given(id, 'batchItemFailures')),
    );
    const requeue = [...new Set(answer.requeue ?? [])].filter((id) => given(id, 'requeue') && !failed.has(id));
    if (firstUnknown !== undefined) {
      log.warn({ unknown, first: firstUnknown }, 'the stage named records it was not given; ignored');
    }
    // The run's answer sets the membership of the cluster invoked, the only one its session reaches.
    if (deps.pollMembers && POLL_MEMBER_STAGES.includes(stage) && typeof answer.pollMember === 'boolean') {
      await deps.pollMembers.set(clusterId, answer.pollMember).catch((err: unknown) => {
        log.warn(
          { pollMember: answer.pollMember, error: errorText(err) },
          "could not record the cluster's source poll membership; its next run records it",
        );
      });
    }
    const reported = stage === 'install' && answer.rollouts ? { rollouts: answer.rollouts } : {};
    return { answered: true, failed, requeue, ...reported };
  };

  /**
   * Sends the records `ids` (the stage's `requeue`, in its order) back to the queue, one requeue
   * per message group, all of a group or none.
   * @returns the ids not sent back (they fail). Never throws.
   */
  const requeueHeld = async (carried: readonly SqsRecord[], ids: readonly string[], log: Logger): Promise<string[]> => {
    const byId = new Map(carried.map((r) => [r.messageId, r]));
    const notSent: string[] = [];
    const lanes = messageGroupLanes(ids.map((id) => byId.get(id) as SqsRecord));
    await Promise.all(
      lanes.map(async (lane) => {
        const why =
          deps.requeuer === undefined
            ? 'the dispatcher has no requeuer'
            : lane.some((r) => postponementsOf(r) >= MAX_POSTPONEMENTS)
              ? `postponed ${MAX_POSTPONEMENTS} times already (MAX_POSTPONEMENTS)`
              : lane.some((r) => r.attributes?.MessageGroupId === undefined)
                ? 'the record has no message group'
                : await deps.requeuer
                    .requeue(
                      lane.map((r) => ({
                        messageId: r.messageId,
                        body: r.body,
                        messageGroupId: r.attributes?.MessageGroupId as string,
                        postponements: postponementsOf(r) + 1,
                      })),
                    )
                    .then(
                      () => undefined,
                      (err: unknown) => `the requeue failed: ${errorText(err)}`,
                    );
        for (const r of lane) {
          const rlog = log.child({ messageId: r.messageId });
          if (why === undefined) {
            rlog.info(
              { stage, outcome: 'postponed' satisfies RecordOutcome, postponements: postponementsOf(r) + 1 },
              'held back by the stage function; sent back to its queue without spending a receive',
            );
          } else {
            notSent.push(r.messageId);
            rlog.warn(
              { stage, outcome: 'deadline' satisfies RecordOutcome, notPostponed: why },
              'held back by the stage function; returned to the queue',
            );
          }
        }
      }),
    );
    return notSent;
  };

  const runPoll = async (log: Logger): Promise<void> => {
    if (stage !== 'index-repo' || !deps.pollClusters) {
      log.warn({ stage }, 'source poll event sent to a dispatcher that does not poll; dropped');
      return;
    }
    const clusters = await deps.pollClusters();
    let failed = 0;
    let dropped = 0;
    await pMap(
      clusters,
      async (clusterId) => {
        const clog = log.child({ stage, clusterId });
        if (deps.pollMembers && deps.registered && !(await deps.registered(clusterId).catch(() => true))) {
          await deps.pollMembers.set(clusterId, false).then(
            () => {
              dropped += 1;
              clog.info({}, 'cluster no longer registered: its source poll membership is dropped');
            },
            (err: unknown) =>
              clog.warn({ error: errorText(err) }, 'could not drop the membership of a removed cluster'),
          );
          return;
        }
        if (!(await invokeCluster(clusterId, [], clog, true)).answered) failed += 1;
      },
      { concurrency: POLL_INVOKE_CONCURRENCY },
    );
    log.info({ stage, clusters: clusters.length, failed, dropped }, 'source poll run in each member cluster');
  };

  return async (event, context) => {
    const log = context?.awsRequestId ? deps.log.child({ awsRequestId: context.awsRequestId }) : deps.log;
    if (isSourcePollEvent(event)) {
      await runPoll(log);
      return { batchItemFailures: [] };
    }
    if (isRolloutCheckEvent(event)) {
      if (deps.rollouts) await deps.rollouts.check();
      else log.warn({ stage }, 'rollout check event sent to a dispatcher that coordinates no rollouts; dropped');
      return { batchItemFailures: [] };
    }
    const received = Array.isArray(event.Records) ? event.Records : [];
    const remaining = context?.getRemainingTimeInMillis?.();
    const failed = new Set<string>();
    const fail = (r: SqsRecord) => failed.add(r.messageId);
    const records = deps.prover ? await provenRecords(stage, received, deps.prover, remaining, log, fail) : received;
    const until = shareUntil(remaining);
    const admitted = new Map<SqsRecord, Admitted>();
    const lanes = messageGroupLanes(records);
    await Promise.all(
      lanes.map(async (lane) => {
        let laneFailed = false;
        for (const record of lane) {
          const rlog = log.child({ messageId: record.messageId });
          if (laneFailed) {
            fail(record);
            rlog.warn(
              { stage, outcome: 'skipped' satisfies RecordOutcome },
              'earlier event of this object failed; retried after it',
            );
            continue;
          }
          const event = await admit(stage, record, deps, rlog);
          if (event === 'failed') laneFailed = true;
          if (typeof event === 'string') {
            if (event === 'failed') fail(record);
            continue;
          }
          const elog = rlog.child({ subject: subjectOf(objectRefOf(event)), eventId: event.id });
          const slot = deps.shares ? await takeShare(stage, record, event, deps.shares, until, elog) : undefined;
          if (slot === 'failed') {
            fail(record);
            laneFailed = true;
          } else if (slot !== 'postponed')
            admitted.set(record, { record, event, ...(slot ? { release: slot.release } : {}) });
        }
      }),
    );
    const byCluster = new Map<string, Admitted[]>();
    for (const r of records) {
      const a = admitted.get(r);
      if (!a) continue;
      const { clusterId } = objectRefOf(a.event);
      byCluster.set(clusterId, [...(byCluster.get(clusterId) ?? []), a]);
    }
    const carriedBy = new Map<string, string>();
    for (const [clusterId, as] of byCluster) for (const a of as) carriedBy.set(a.record.messageId, clusterId);
    let unfinished = byCluster.size;
    const deletes: Promise<void>[] = [];
    const reports = new Map<string, RolloutReport>();
    await Promise.all(
      [...byCluster].map(async ([clusterId, as]) => {
        const clog = log.child({ stage, clusterId });
        const carried = as.map((a) => a.record);
        let answer: ClusterAnswer;
        try {
          answer = await invokeCluster(clusterId, carried, clog);
        } finally {
          await Promise.all(as.map((a) => a.release?.()));
        }
        for (const id of answer.failed) failed.add(id);
        if (answer.rollouts) reports.set(clusterId, answer.rollouts);
        for (const id of await requeueHeld(carried, answer.requeue, clog)) failed.add(id);
        unfinished--;
        if (!deps.deleter || unfinished === 0) return;
        // The cluster's message groups whose records all ended (none failed, none carried by a
        // cluster still running): their next events need not wait for the other clusters' invokes.
        const done = lanes.filter(
          (lane) =>
            lane.some((r) => carriedBy.get(r.messageId) === clusterId) &&
            lane.every(
              (r) =>
                !failed.has(r.messageId) &&
                (carriedBy.get(r.messageId) ?? clusterId) === clusterId &&
                typeof r.receiptHandle === 'string',
            ),
        );
        if (done.length === 0) return;
        const deleter = deps.deleter;
        deletes.push(
          deleter.delete(done.flat().map((r) => r.receiptHandle as string)).catch((err: unknown) => {
            clog.warn(
              { messageIds: done.flat().map((r) => r.messageId), error: errorText(err) },
              'could not delete handled events early; the event source mapping deletes them when the invocation returns',
            );
          }),
        );
      }),
    );
    await Promise.all(deletes);
    // Once per batch, after every cluster's run: each touched rollout is evaluated once.
    if (deps.rollouts && reports.size > 0) await deps.rollouts.afterBatch(reports);
    return {
      batchItemFailures: received.filter((r) => failed.has(r.messageId)).map((r) => ({ itemIdentifier: r.messageId })),
    };
  };
}
