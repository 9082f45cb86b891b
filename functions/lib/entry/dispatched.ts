/**
 * The stage function's side of the dispatcher (`./dispatch.ts`, docs/decisions.md D15): the
 * stage function, in Lambda's tenant isolation mode, takes a {@link DispatchedBatch} instead of
 * the queue's event, and its SDK clients sign with the run session's credentials the batch
 * carries (its own execution role holds logs and nothing else). Not yet deployed.
 *
 * @module
 */
import type { AwsCredentialIdentity, AwsCredentialIdentityProvider } from '@smithy/types';
import { objectRefOf, parseEvent } from '../../../events/schema.js';
import type { ClusterKeyring, ClusterKeys } from '../artifact/keyring.js';
import { CLUSTER_ID_PATTERN } from '../kube/cluster-doc.js';
import type { DispatchedBatch, WireClusterKeys } from './dispatch.js';
import type { LambdaContext, SqsBatchResponse, SqsHandler } from './stage-handler.js';

/**
 * A provider the SDK calls on every signing, as-is: `memoized` tells the SDK (`@aws-sdk/core`'s
 * `normalizeCredentialProvider`) not to wrap it in its cache, which would keep a session's
 * credentials until 5 minutes before they expire and so sign a later invocation's requests with
 * an earlier session's.
 */
export type UnmemoizedCredentialProvider = AwsCredentialIdentityProvider & { memoized: true };

/**
 * The run credentials and sealing keys of the one cluster an execution environment serves: what
 * the stage function's SDK clients ({@link RunCredentialHolder.credentials}) and its sealed store
 * ({@link RunCredentialHolder.keyring}) read, set by each dispatched invocation before its records
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

  /** The cluster this environment serves; `undefined` before the first batch. */
  get clusterId(): string | undefined {
    return this.tenant;
  }

  /**
   * Takes a batch's credentials and keys, after checking it is this environment's cluster's.
   * @throws Error when the batch is malformed (no cluster id, credentials or records), names
   *   another cluster than the first one served, or holds a record whose event names another
   *   cluster: nothing of it is taken.
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
    for (const r of batch.records) {
      const parsed = parseEvent(typeof r?.body === 'string' ? r.body : '');
      if (parsed.ok && objectRefOf(parsed.event).clusterId !== batch.clusterId) {
        throw refuse(`a record is of another cluster than ${batch.clusterId}`);
      }
    }
    const keys = batch.sealingKeys === undefined ? undefined : clusterKeys(batch.sealingKeys);
    if (batch.sealingKeys !== undefined && !keys) throw refuse('malformed sealing keys');
    this.tenant = batch.clusterId;
    this.current = {
      accessKeyId: c.accessKeyId,
      secretAccessKey: c.secretAccessKey,
      sessionToken: c.sessionToken,
      expiration,
    };
    this.keys = keys;
  }
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
 * The stage function's handler behind the dispatcher: takes the batch's credentials and keys
 * into `holder` ({@link RunCredentialHolder.accept}, which refuses another cluster's batch: the
 * invocation then fails and the dispatcher fails its records) and runs the records through the
 * stage handler `inner` (`makeStageHandler`) as the queue's event.
 *
 * The stage handler's edge work that the dispatcher takes over, so `inner`'s `EntryDeps` leaves
 * it out: the record proof (`prover`: the run's session holds no SQS right but `SendMessage`, and
 * the records came from the dispatcher, not the queue), the sender check (`checkSender`, against
 * the registry the dispatcher reads), the fair shares (`shares`: the session holds no
 * `state/shares/` key, D15) and the early delete of a finished message group (`deleter`). What
 * stays in the stage: the event and message-group checks (cheap, and the routing of its own
 * events), the run leases, the retry bound, the deadline, and the hand-off to the next stage.
 * The existing handler is unchanged; this wiring is the next step.
 *
 * @throws Error (rejects) when the batch is refused; else `inner`'s answer.
 */
export function dispatchedHandler(
  inner: SqsHandler,
  holder: RunCredentialHolder,
): (batch: DispatchedBatch, context?: LambdaContext) => Promise<SqsBatchResponse> {
  return async (batch, context) => {
    holder.accept(batch);
    return await inner({ Records: [...batch.records] }, context);
  };
}
