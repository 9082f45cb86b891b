/**
 * The stage function's side of the dispatcher (`./dispatch.ts`, docs/decisions.md D15): the
 * stage function, in Lambda's tenant isolation mode, takes a {@link DispatchedBatch} instead of
 * the queue's event, and its SDK clients sign with the run session's credentials the batch
 * carries (its own execution role holds logs and nothing else). Wired by `lambdaEntry` (`./main.ts`)
 * when `KAPP_LAMBDA_DISPATCHED=true`.
 *
 * @module
 */

import type { AwsCredentialIdentity, AwsCredentialIdentityProvider } from '@smithy/types';
import {
  isSourcePollEvent,
  objectRefOf,
  parseEvent,
  SOURCE_POLL_EVENT_TYPE,
  type SourcePollEvent,
} from '../../../events/schema.js';
import type { ClusterKeyring, ClusterKeys } from '../artifact/keyring.js';
import { type BearerSource, type BearerToken, EKS_TOKEN_PREFIX } from '../kube/bearer.js';
import { CLUSTER_ID_PATTERN } from '../kube/cluster-doc.js';
import { errorText, type Logger } from '../log.js';
import { type ClusterRolloutView, clusterRolloutViewSchema, type RolloutReports } from '../rollout/access.js';
import type { ObjectStore } from '../store/port.js';
import type { MessageRequeuer, RequeuedMessage } from '../transport/port.js';
import { type DispatchedBatch, SOURCE_POLL_RECORDS_PREFIX, type WireClusterKeys } from './dispatch.js';
import type { LambdaContext, SqsBatchResponse, SqsEvent, SqsHandler } from './stage-handler.js';

/**
 * A provider the SDK calls on every signing, as-is: `memoized` tells the SDK (`@aws-sdk/core`'s
 * `normalizeCredentialProvider`) not to wrap it in its cache, which would keep a session's
 * credentials until 5 minutes before they expire and so sign a later invocation's requests with
 * an earlier session's.
 */
export type UnmemoizedCredentialProvider = AwsCredentialIdentityProvider & { memoized: true };

/**
 * The run credentials, sealing keys and EKS token of the one cluster an execution environment
 * serves: what the stage function's SDK clients ({@link RunCredentialHolder.credentials}), its
 * sealed store ({@link RunCredentialHolder.keyring}) and its registry's `eks` clusters
 * ({@link RunCredentialHolder.eksToken}) read, set by each dispatched invocation before its records
 * run ({@link RunCredentialHolder.accept}). One per process.
 *
 * Tenant isolation gives an environment to one tenant for its life, so the first cluster the
 * holder serves is its only one: a batch of another cluster means the function was invoked
 * without its `TenantId` or by something other than the dispatcher, and is refused.
 */
export class RunCredentialHolder {
  private tenant: string | undefined;
  private current: AwsCredentialIdentity | undefined;
  private keys: ClusterKeys | undefined;
  private eks: BearerToken | undefined;
  private view: ClusterRolloutView | undefined;

  /**
   * The SDK clients' `credentials`: the last accepted batch's.
   * @throws Error (rejects) before any batch was accepted: the function's own role reaches no
   *   cluster, so there is nothing to fall back on.
   */
  readonly credentials: UnmemoizedCredentialProvider = Object.assign(
    async (): Promise<AwsCredentialIdentity> => {
      if (!this.current) throw new Error('no run credentials: the function runs only batches of its dispatcher');
      return this.current;
    },
    { memoized: true as const },
  );

  /**
   * The keyring of the sealed store: the accepted cluster's keys, and only its.
   * `keysFor` rejects for another cluster, or before a batch carried keys.
   */
  readonly keyring: ClusterKeyring = {
    keysFor: async (clusterId) => {
      if (clusterId !== this.tenant || !this.keys) {
        throw new Error(`no sealing keys for cluster ${clusterId} in this environment`);
      }
      return this.keys;
    },
  };

  /**
   * The `eks` cluster's bearer token (`StoreClusterRegistryOptions.eksTokens`): the one the last
   * accepted batch carried, minted by the dispatcher (`DispatchedBatch.eksToken`). The stage never
   * signs one: its run session's role is no cluster's access entry, and a token it signed would
   * name whatever cluster it chose.
   *
   * The token is the run's until {@link EKS_TOKEN_EXPIRY_MARGIN_MS} before it expires, whatever
   * validity is asked (`minValidityMs` is ignored): no newer token can be had mid-run, and the
   * dispatcher signs it just before the invoke, so its 15 minutes outlive the longest stage run
   * (870 s, the timeout; 30 s to spare). Honouring the registry's asks (10 minutes before a record,
   * 60 s before a request) would fail the records of a run's last minutes instead.
   *
   * @throws Error (rejects) when the batch carried no token (the dispatcher did not find an `eks`
   *   cluster) or it is within the margin of its expiry; the message never holds the token.
   */
  readonly eksToken: BearerSource = {
    token: async () => {
      if (!this.eks) {
        throw new Error(
          `no EKS token for cluster ${this.tenant ?? '(none yet)'}: behind the dispatcher an eks cluster's token comes in its batch, and the stage signs none`,
        );
      }
      if (this.eks.expiresAt.getTime() - this.now().getTime() < EKS_TOKEN_EXPIRY_MARGIN_MS) {
        throw new Error(`the dispatcher's EKS token for cluster ${this.tenant} has expired`);
      }
      return this.eks;
    },
  };

  /** @param now - clock of {@link eksToken}'s expiry; default `() => new Date()`. */
  constructor(private readonly now: () => Date = () => new Date()) {}

  /** The cluster this environment serves; `undefined` before the first batch. */
  get clusterId(): string | undefined {
    return this.tenant;
  }

  /**
   * The served cluster's keyring tag (32 hex), which names its sharing domain (`d/<tag>/`,
   * `../store/domain.ts`); `undefined` before a batch carried sealing keys.
   */
  get domainTag(): string | undefined {
    return this.keys?.tag;
  }

  /**
   * Takes a batch's credentials, keys and EKS token (a batch without one drops the last's),
   * after checking it is this environment's cluster's.
   * @throws Error when the batch is malformed (no cluster id, credentials or records, a `poll`
   *   that is not `true`, a poll with records, an EKS token without the `k8s-aws-v1.` prefix or
   *   an expiry), names another cluster than the first one served,
   *   or holds a record whose event names another cluster: nothing of it is taken.
   */
  accept(batch: DispatchedBatch): void {
    const refuse = (why: string) => new Error(`refused a dispatched batch: ${why}`);
    if (typeof batch?.clusterId !== 'string' || !CLUSTER_ID_PATTERN.test(batch.clusterId)) {
      throw refuse('no valid cluster id');
    }
    if (this.tenant !== undefined && batch.clusterId !== this.tenant) {
      throw refuse(`it is for cluster ${batch.clusterId}, this environment serves ${this.tenant}`);
    }
    const c = batch.credentials;
    const expiration = new Date(typeof c?.expiration === 'string' ? c.expiration : Number.NaN);
    if (
      typeof c?.accessKeyId !== 'string' ||
      typeof c.secretAccessKey !== 'string' ||
      typeof c.sessionToken !== 'string' ||
      Number.isNaN(expiration.getTime())
    ) {
      throw refuse('no valid credentials');
    }
    if (!Array.isArray(batch.records)) throw refuse('no records');
    if (batch.poll !== undefined && batch.poll !== true) throw refuse('`poll` is neither true nor absent');
    if (batch.poll === true && batch.records.length > 0) throw refuse('a source poll carries no records');
    for (const r of batch.records) {
      const parsed = parseEvent(typeof r?.body === 'string' ? r.body : '');
      if (parsed.ok && objectRefOf(parsed.event).clusterId !== batch.clusterId) {
        throw refuse(`a record is of another cluster than ${batch.clusterId}`);
      }
    }
    const keys = batch.sealingKeys === undefined ? undefined : clusterKeys(batch.sealingKeys);
    if (batch.sealingKeys !== undefined && !keys) throw refuse('malformed sealing keys');
    const eks = batch.eksToken === undefined ? undefined : bearerToken(batch.eksToken);
    if (batch.eksToken !== undefined && !eks) throw refuse('malformed EKS token');
    const view = batch.rollouts === undefined ? undefined : clusterRolloutViewSchema.safeParse(batch.rollouts);
    if (view && !view.success) throw refuse('malformed rollouts view');
    this.tenant = batch.clusterId;
    this.current = {
      accessKeyId: c.accessKeyId,
      secretAccessKey: c.secretAccessKey,
      sessionToken: c.sessionToken,
      expiration,
    };
    this.keys = keys;
    this.eks = eks;
    this.view = view?.data;
  }

  /**
   * The fleet's rollouts narrowed to the served cluster, as the current batch brought them
   * (`DispatchedBatch.rollouts`); `undefined` when it brought none (no policy: not gated).
   */
  get rolloutView(): ClusterRolloutView | undefined {
    return this.view;
  }
}

/**
 * How long before its expiry the stage stops using the dispatcher's EKS token
 * ({@link RunCredentialHolder.eksToken}): 5 s, for a request's flight and clock skew.
 */
export const EKS_TOKEN_EXPIRY_MARGIN_MS = 5_000;

/** A batch's `eksToken` as a {@link BearerToken}; `undefined` when malformed. */
function bearerToken(w: DispatchedBatch['eksToken']): BearerToken | undefined {
  const expiresAt = new Date(typeof w?.expiresAt === 'string' ? w.expiresAt : Number.NaN);
  if (typeof w?.token !== 'string' || !w.token.startsWith(EKS_TOKEN_PREFIX) || Number.isNaN(expiresAt.getTime())) {
    return undefined;
  }
  return { token: w.token, expiresAt };
}

/** {@link WireClusterKeys} as `ClusterKeys`; `undefined` when malformed. */
function clusterKeys(w: WireClusterKeys): ClusterKeys | undefined {
  const key = (s: unknown) => (typeof s === 'string' ? Buffer.from(s, 'base64') : Buffer.alloc(0));
  const [encKey, macKey] = [key(w?.encKey), key(w?.macKey)];
  if (typeof w?.tag !== 'string' || !/^[0-9a-f]{32}$/.test(w.tag) || encKey.length !== 32 || macKey.length !== 32) {
    return undefined;
  }
  return { tag: w.tag, encKey, macKey };
}

/**
 * The stage's {@link MessageRequeuer} behind the dispatcher: it sends nothing (a copy must come
 * from the dispatcher's role to pass the sender check, which holds a run role to what its stage
 * emits; a run of fetch, deploy, index-repo or install may send its own queue only the events its
 * stage emits there, e.g. follow-ups), it only notes the message ids of the records the function deadline held
 * back, which {@link dispatchedHandler} returns as the answer's `requeue` for the dispatcher to
 * send. One per process; an environment runs one invocation at a time.
 */
export class CollectingRequeuer implements MessageRequeuer {
  private ids: string[] = [];

  /** Notes the messages' ids, in order; never throws. */
  async requeue(messages: readonly RequeuedMessage[]): Promise<void> {
    for (const m of messages) this.ids.push(m.messageId);
  }

  /** The ids noted since the last call, in the order they were requeued; empties the list. */
  take(): string[] {
    const taken = this.ids;
    this.ids = [];
    return taken;
  }
}

/**
 * Whether `store` holds any source poll record (one `list` of at most one key under
 * `cache/source-poll/sha256/`): a dispatched fetch or index-repo run's `pollMember`. Pass the
 * stage's own store, so in `cluster` sharing the listing is of its cluster's domain.
 * @throws StoreError when the prefix cannot be listed.
 */
export async function hasSourcePollRecords(store: Pick<ObjectStore, 'list'>): Promise<boolean> {
  return (await store.list(SOURCE_POLL_RECORDS_PREFIX, { limit: 1 })).length > 0;
}

/** The handler of a stage function behind its dispatcher ({@link dispatchedHandler}). */
export type DispatchedStageHandler = (
  payload: DispatchedBatch | SqsEvent | SourcePollEvent,
  context?: LambdaContext,
) => Promise<SqsBatchResponse>;

/** The options of {@link dispatchedHandler}. */
export interface DispatchedHandlerOptions {
  /** The stage handler's requeuer (`EntryDeps.requeuer`), whose ids become the answer's `requeue`. */
  requeued?: CollectingRequeuer;
  /** Where a refused payload (error) and a failed `pollMember` (warning) are logged; never credentials or keys. */
  log?: Pick<Logger, 'error' | 'warn'>;
  /**
   * The answer's `pollMember` after each batch and poll (fetch and index-repo,
   * `POLL_MEMBER_STAGES` of `./dispatch.ts`: {@link hasSourcePollRecords} over the stage's store).
   * Default none: the answer has none. A throw leaves it out (logged).
   */
  pollMember?: () => Promise<boolean>;
  /**
   * The install stage's rollout reports (`ReportingRollouts` of `../rollout/access.ts`): the
   * answer's `rollouts` are what the batch's runs noted. Default none.
   */
  rolloutReports?: RolloutReports;
}

/** Why `payload` is not a dispatcher's batch at all, or `undefined` when it may be one. */
function notDispatched(payload: unknown): string | undefined {
  const only = "a dispatched function runs only its dispatcher's batches";
  if (isSourcePollEvent(payload))
    return `refused a source poll event: ${only} (the schedule must target the dispatcher)`;
  if (typeof payload === 'object' && payload !== null && 'Records' in payload && !('clusterId' in payload)) {
    return `refused a raw SQS event: ${only} (a direct invoke, or an event source mapping left on the function)`;
  }
  return undefined;
}

/**
 * The stage function's handler behind the dispatcher: takes the batch's credentials and keys
 * into `holder` ({@link RunCredentialHolder.accept}, which refuses another cluster's batch: the
 * invocation then fails and the dispatcher fails its records) and runs the records through the
 * stage handler `inner` (`makeStageHandler`) as the queue's event. A batch with `poll` set (and
 * no records) runs `inner` on the {@link SourcePollEvent} instead, under the cluster's session:
 * the registry is narrowed to the holder's cluster (`tenantClusterRegistry`), so the poll pokes
 * only that cluster's members of the fleet's records (index-repo; another stage drops it). A raw
 * SQS event or a bare source poll event is refused the same way, before anything of it is read:
 * whoever sends one bypasses the dispatcher's checks, and the function holds no credentials to
 * run it with.
 *
 * The stage handler's edge work that the dispatcher takes over, so `inner`'s `EntryDeps` leaves
 * it out: the record proof (`prover`: the run's session holds no SQS right but `SendMessage`, and
 * the records came from the dispatcher, not the queue), the sender check (`checkSender`, against
 * the registry the dispatcher reads), the fair shares (`shares`: the session holds no
 * `state/shares/` key, D15) and the early delete of a finished message group (`deleter`). What
 * stays in the stage: the event and message-group checks (cheap, and the routing of its own
 * events), the run leases, the retry bound, the deadline, and the hand-off to the next stage.
 * The records the deadline held back are not sent by the stage: `opts.requeued` collects them
 * and the answer's `requeue` names them (never a record also in `batchItemFailures`). With
 * `opts.pollMember` (fetch, index-repo) the answer of a batch or a poll carries `pollMember`, read
 * after the run: the dispatcher keeps it as the cluster's poll membership in `cluster` sharing.
 *
 * @throws Error (rejects) when the payload is refused, logged to `opts.log`; else `inner`'s answer.
 */
export function dispatchedHandler(
  inner: SqsHandler,
  holder: RunCredentialHolder,
  opts: DispatchedHandlerOptions = {},
): DispatchedStageHandler {
  const refuse = (why: string, err: Error = new Error(why)): never => {
    opts.log?.error({ outcome: 'refused' }, why);
    throw err;
  };
  /** `answer` with `pollMember` when `opts.pollMember` answers. */
  const withPollMember = async (answer: SqsBatchResponse): Promise<SqsBatchResponse> => {
    if (!opts.pollMember) return answer;
    try {
      return { ...answer, pollMember: await opts.pollMember() };
    } catch (err) {
      opts.log?.warn({ error: errorText(err) }, 'could not list the source poll records; the answer has no pollMember');
      return answer;
    }
  };
  return async (payload, context) => {
    const why = notDispatched(payload);
    if (why) refuse(why);
    const batch = payload as DispatchedBatch;
    try {
      holder.accept(batch);
    } catch (err) {
      refuse(err instanceof Error ? err.message : 'refused a dispatched batch', err as Error);
    }
    // What an earlier invocation collected and did not return (it threw) is not this one's.
    opts.requeued?.take();
    opts.rolloutReports?.take();
    // The cluster's source poll: the stage handler's poll, its registry narrowed to this cluster.
    if (batch.poll === true) return await withPollMember(await inner({ type: SOURCE_POLL_EVENT_TYPE }, context));
    const answer = await inner({ Records: [...batch.records] }, context);
    const failed = new Set(answer.batchItemFailures.map((f) => f.itemIdentifier));
    const requeue = opts.requeued?.take().filter((id) => !failed.has(id)) ?? [];
    const rollouts = opts.rolloutReports?.take();
    return await withPollMember({
      ...answer,
      ...(requeue.length > 0 ? { requeue } : {}),
      ...(rollouts ? { rollouts } : {}),
    });
  };
}
