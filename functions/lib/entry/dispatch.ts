/**
 * The dispatcher of a stage in the shared mode (docs/decisions.md D15), its pure core: one
 * function per stage that consumes the stage's queue in place of the stage function, runs no
 * tool, and hands each cluster's records to the stage function in an invocation of their own,
 * with credentials that reach that cluster only (the stage's run role assumed under
 * `runSessionPolicy`, `infra/aws/run-policy.ts`) and that cluster's sealing keys; the stage
 * function runs in Lambda's tenant isolation mode with `TenantId` = the cluster id, so a warm
 * environment never serves two clusters. The stage's answer (`batchItemFailures`) becomes the
 * dispatcher's, record by record.
 *
 * Not yet deployed: no function of the stack runs this yet (the dispatcher functions, the run
 * roles and `TenancyConfig` are still to be added to `infra/aws/stack.ts`), and the edge work the
 * stage handler does today (the record proof, the sender and message-group checks, the fair
 * shares, `./stage-handler.ts`) moves here in the wiring step; this core splits, invokes and maps
 * answers back. The AWS adapters of its ports: `./dispatch-aws.ts`; the stage side:
 * `./dispatched.ts`.
 *
 * @module
 */
import { objectRefOf, parseEvent } from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { ClusterKeyring } from '../artifact/keyring.js';
import { errorText, type Logger } from '../log.js';
import { usesArtifactKey } from './artifact-key.js';
import type { SqsBatchResponse, SqsEvent, SqsRecord } from './stage-handler.js';

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

/** The ports of {@link makeDispatcher}. */
export interface DispatcherDeps {
  credentials: RunCredentials;
  invoker: StageInvoker;
  /** The fleet's per-cluster keys (`DerivedKeyring` over the artifact root key): the tag and the sealing keys. */
  keyring: ClusterKeyring;
  log: Logger;
}

/** The records of one cluster, in batch order. */
interface ClusterBatch {
  readonly clusterId: string;
  readonly records: SqsRecord[];
}

/**
 * Splits a batch by cluster: one {@link ClusterBatch} per cluster id the records' events name,
 * in the order of each cluster's first record, each keeping its records in batch order (so the
 * records of one message group, which are all of one object and so of one cluster, stay
 * together and in order). A record whose body is not a valid event names no cluster.
 *
 * @returns the clusters' batches and the records that name no cluster.
 */
export function splitByCluster(records: readonly SqsRecord[]): {
  clusters: ClusterBatch[];
  invalid: SqsRecord[];
} {
  const clusters = new Map<string, SqsRecord[]>();
  const invalid: SqsRecord[] = [];
  for (const record of records) {
    const parsed = parseEvent(typeof record.body === 'string' ? record.body : '');
    if (!parsed.ok) {
      invalid.push(record);
      continue;
    }
    const { clusterId } = objectRefOf(parsed.event);
    const batch = clusters.get(clusterId);
    if (batch) batch.push(record);
    else clusters.set(clusterId, [record]);
  }
  return { clusters: [...clusters].map(([clusterId, rs]) => ({ clusterId, records: rs })), invalid };
}

/** `ClusterKeys` as {@link WireClusterKeys}. */
function wireKeys(keys: { tag: string; encKey: Buffer; macKey: Buffer }): WireClusterKeys {
  return { tag: keys.tag, encKey: keys.encKey.toString('base64'), macKey: keys.macKey.toString('base64') };
}

/**
 * Builds the dispatcher of `stage`: the handler of the stage queue's event source mapping. Each
 * cluster's records ({@link splitByCluster}) go to the stage function in one synchronous invoke
 * ({@link StageInvoker}, `TenantId` = the cluster id) with that cluster's run credentials and
 * sealing keys; the clusters' invokes run side by side. A record the stage names in its
 * `batchItemFailures` fails; an invoke that fails, or whose credentials or keys could not be
 * had, fails exactly the records it carried; the other clusters' records keep their outcomes.
 * A record whose body is no valid event is dropped (acknowledged and logged, the stage handler's
 * `invalid`): it names no cluster to run it for.
 *
 * The stage's answer may name only records it was given: an identifier it was not is ignored
 * (logged), so one cluster's run cannot fail, and so hold back, another cluster's records.
 *
 * @returns the handler; it never rejects (every problem ends in its records' failures).
 */
export function makeDispatcher(
  stage: PipelineStage,
  deps: DispatcherDeps,
): (event: SqsEvent) => Promise<SqsBatchResponse> {
  const runCluster = async ({ clusterId, records }: ClusterBatch): Promise<Set<string>> => {
    const log = deps.log.child({ stage, clusterId });
    const carried = new Set(records.map((r) => r.messageId));
    let answer: SqsBatchResponse;
    try {
      const keys = await deps.keyring.keysFor(clusterId);
      const c = await deps.credentials.forRun(stage, clusterId, keys.tag);
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
      };
      answer = await deps.invoker.invoke(stage, clusterId, payload);
    } catch (err) {
      log.error(
        { outcome: 'failed', records: records.length, error: errorText(err) },
        "could not run the cluster's records in the stage function; they will be retried",
      );
      return carried;
    }
    const failed = new Set<string>();
    for (const { itemIdentifier } of answer.batchItemFailures) {
      if (carried.has(itemIdentifier)) failed.add(itemIdentifier);
      else
        log.warn(
          { itemIdentifier: String(itemIdentifier).slice(0, 128) },
          'the stage failed a record it was not given; ignored',
        );
    }
    return failed;
  };

  return async (event) => {
    const received = Array.isArray(event.Records) ? event.Records : [];
    const { clusters, invalid } = splitByCluster(received);
    for (const r of invalid) {
      deps.log
        .child({ messageId: String(r.messageId).slice(0, 128) })
        .warn({ stage, outcome: 'invalid' }, 'invalid event (no cluster to run it for); dropped');
    }
    const failed = new Set<string>();
    for (const ids of await Promise.all(clusters.map(runCluster))) for (const id of ids) failed.add(id);
    return {
      batchItemFailures: received.filter((r) => failed.has(r.messageId)).map((r) => ({ itemIdentifier: r.messageId })),
    };
  };
}
