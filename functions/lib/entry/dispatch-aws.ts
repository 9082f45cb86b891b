/**
 * The AWS adapters of the dispatcher's ports (`./dispatch.ts`, docs/decisions.md D15): run
 * credentials from STS `AssumeRole`, and the stage function's synchronous invoke in tenant
 * isolation mode.
 *
 * Each adapter takes the one SDK call it makes as a function typed by the fields it uses of the
 * SDK's command input and output (`@aws-sdk/client-sts` `AssumeRoleCommand`,
 * `@aws-sdk/client-lambda` `InvokeCommand`, 3.1178.0: `InvocationRequest.TenantId` is the
 * `X-Amz-Tenant-Id` header), so that the wiring is one line each
 * (`(input) => sts.send(new AssumeRoleCommand(input))`, `./dispatch-clients.ts`) and this module
 * loads no SDK (the dispatcher's composition loads it on the first call, `./dispatch-entry.ts`).
 *
 * @module
 */

import { type RunPolicyTarget, runSessionPolicy } from '../../../infra/aws/run-policy.js';
import type { PipelineStage } from '../api/functions.js';
import { rolloutReportSchema } from '../rollout/access.js';
import type { DispatchedBatch, RunCredentials, RunSessionCredentials, StageInvoker } from './dispatch.js';
import { runSessionName } from './sender.js';
import type { SqsBatchResponse } from './stage-handler.js';

/** The fields of STS `AssumeRoleRequest` {@link StsRunCredentials} sets. */
export interface AssumeRoleInput {
  RoleArn: string;
  /** {@link runSessionName} of the cluster id: CloudTrail, and SQS's `SenderId` (`<role id>:<session name>`), name the cluster. */
  RoleSessionName: string;
  /** The inline session policy, compact JSON (at most 2,048 characters). */
  Policy: string;
  DurationSeconds: number;
}

/** The fields of STS `AssumeRoleResponse` {@link StsRunCredentials} reads. */
export interface AssumeRoleOutput {
  Credentials?: {
    AccessKeyId?: string;
    SecretAccessKey?: string;
    SessionToken?: string;
    Expiration?: Date;
  };
}

/** How long a run session lasts, seconds: an hour (the run role's `MaxSessionDuration` must allow it). */
export const RUN_SESSION_SECONDS = 3600;

/**
 * How long before its expiration a cached run session is replaced, ms: 20 minutes, Lambda's
 * longest invocation (15 minutes, so credentials handed to a stage outlive any run of it) plus 5
 * minutes of slack for clocks. A session is so reused for its first 40 minutes.
 */
export const RUN_SESSION_REFRESH_MS = 20 * 60_000;

/** The options of {@link StsRunCredentials}. */
export interface StsRunCredentialsOptions {
  /** `sts:AssumeRole` (`(input) => sts.send(new AssumeRoleCommand(input))`). */
  assumeRole: (input: AssumeRoleInput) => Promise<AssumeRoleOutput>;
  /** The run role of each stage (the role whose own policy says what the stage may do). */
  roleArn: (stage: PipelineStage) => string;
  /** Where the fleet's resources are (`runSessionPolicy`'s target). */
  target: RunPolicyTarget;
  /** Epoch ms; default `Date.now`. */
  now?: () => number;
  /** Default {@link RUN_SESSION_REFRESH_MS}. */
  refreshMs?: number;
}

/**
 * {@link RunCredentials} from STS: the stage's run role assumed with `RoleSessionName` = the
 * cluster id and `Policy` = `runSessionPolicy(stage, clusterId, clusterTag, target)`, for
 * {@link RUN_SESSION_SECONDS}. A session is cached per (stage, cluster) until
 * {@link RUN_SESSION_REFRESH_MS} before it expires; concurrent asks share one `AssumeRole`, and a
 * failed one is not cached. `AssumeRole` costs nothing but takes tens of ms.
 */
export class StsRunCredentials implements RunCredentials {
  private readonly cache = new Map<string, Promise<RunSessionCredentials>>();

  constructor(private readonly o: StsRunCredentialsOptions) {}

  /**
   * {@inheritDoc RunCredentials.forRun}
   * @throws TypeError or RangeError from `runSessionPolicy` (a malformed id or tag, a document
   *   over 2,048 characters); the STS error wrapped (`assume the run role …`); Error when STS
   *   answers without credentials.
   */
  async forRun(stage: PipelineStage, clusterId: string, clusterTag: string): Promise<RunSessionCredentials> {
    const key = `${stage}\0${clusterId}\0${clusterTag}`;
    const now = this.o.now ?? Date.now;
    const cached = this.cache.get(key);
    if (cached) {
      const c = await cached.catch(() => undefined);
      if (c && c.expiration.getTime() - now() > (this.o.refreshMs ?? RUN_SESSION_REFRESH_MS)) return c;
      if (this.cache.get(key) !== cached) return await this.forRun(stage, clusterId, clusterTag);
    }
    const fresh = this.assume(stage, clusterId, clusterTag);
    this.cache.set(key, fresh);
    fresh.catch(() => {
      if (this.cache.get(key) === fresh) this.cache.delete(key);
    });
    return await fresh;
  }

  private async assume(stage: PipelineStage, clusterId: string, clusterTag: string): Promise<RunSessionCredentials> {
    const input: AssumeRoleInput = {
      RoleArn: this.o.roleArn(stage),
      RoleSessionName: runSessionName(clusterId),
      Policy: JSON.stringify(runSessionPolicy(stage, clusterId, clusterTag, this.o.target)),
      DurationSeconds: RUN_SESSION_SECONDS,
    };
    let out: AssumeRoleOutput;
    try {
      out = await this.o.assumeRole(input);
    } catch (err) {
      throw new Error(`assume the run role of ${stage} for cluster ${clusterId}`, { cause: err });
    }
    const c = out.Credentials;
    if (!c?.AccessKeyId || !c.SecretAccessKey || !c.SessionToken || !(c.Expiration instanceof Date)) {
      throw new Error(`assume the run role of ${stage} for cluster ${clusterId}: STS answered without credentials`);
    }
    return {
      accessKeyId: c.AccessKeyId,
      secretAccessKey: c.SecretAccessKey,
      sessionToken: c.SessionToken,
      expiration: c.Expiration,
    };
  }
}

/** The fields of Lambda `InvocationRequest` {@link LambdaStageInvoker} sets. */
export interface InvokeInput {
  FunctionName: string;
  InvocationType: 'RequestResponse';
  /** The tenant of a function in tenant isolation mode (`TenancyConfig: PER_TENANT`). */
  TenantId: string;
  /** JSON of the {@link DispatchedBatch}. */
  Payload: Uint8Array;
}

/** The fields of Lambda `InvocationResponse` {@link LambdaStageInvoker} reads. */
export interface InvokeOutput {
  StatusCode?: number;
  /** Set when the function failed (`Unhandled`, …); the payload then holds the error. */
  FunctionError?: string;
  Payload?: Uint8Array;
}

/** The options of {@link LambdaStageInvoker}. */
export interface LambdaStageInvokerOptions {
  /** `lambda:InvokeFunction` (`(input) => lambda.send(new InvokeCommand(input))`). */
  invoke: (input: InvokeInput) => Promise<InvokeOutput>;
  /** The stage function's name or ARN. */
  functionName: (stage: PipelineStage) => string;
}

/**
 * {@link StageInvoker} on Lambda: a synchronous `Invoke` (`RequestResponse`) with `TenantId`, the
 * stage function's answer parsed as a batch response. Lambda's invoke error (a throttle, a
 * payload too large), a `FunctionError` (the handler rejected, or the function timed out or ran
 * out of memory) and an answer that is no `{ batchItemFailures: [{ itemIdentifier }] }` all throw.
 * The function's error payload is not quoted (it may hold the run's text).
 */
export class LambdaStageInvoker implements StageInvoker {
  constructor(private readonly o: LambdaStageInvokerOptions) {}

  /** {@inheritDoc StageInvoker.invoke} */
  async invoke(stage: PipelineStage, tenantId: string, payload: DispatchedBatch): Promise<SqsBatchResponse> {
    const what = `invoke the ${stage} function for cluster ${tenantId}`;
    let out: InvokeOutput;
    try {
      out = await this.o.invoke({
        FunctionName: this.o.functionName(stage),
        InvocationType: 'RequestResponse',
        TenantId: tenantId,
        Payload: new TextEncoder().encode(JSON.stringify(payload)),
      });
    } catch (err) {
      throw new Error(what, { cause: err });
    }
    if (out.FunctionError !== undefined) throw new Error(`${what}: the function failed (${out.FunctionError})`);
    const answer = parseBatchResponse(out.Payload, new Set(payload.records.map((r) => r.messageId)));
    if (!answer) throw new Error(`${what}: the answer is not a batch response`);
    return answer;
  }
}

/**
 * A stage's answer as a batch response; `undefined` when it is not one. Its `requeue`
 * (`SqsBatchResponse.requeue`, the dispatched stage's held records) is kept when it is a list of
 * strings, with only the ids of records `given` (in the stage's order, each once); absent or
 * empty after that, it is left out. A `requeue` that is not a list of strings makes the answer
 * none (the stage is not the one this dispatcher speaks to). A boolean `pollMember` is kept;
 * any other is left out. `rollouts` (the install runs' `RolloutReport`) is kept when it has its
 * shape within `rolloutReportSchema`'s bounds, else left out: a run cannot fail its own answer
 * with it, nor hand the dispatcher unbounded work.
 */
export function parseBatchResponse(
  payload: Uint8Array | undefined,
  given: ReadonlySet<string>,
): SqsBatchResponse | undefined {
  let v: unknown;
  try {
    v = JSON.parse(new TextDecoder().decode(payload ?? new Uint8Array()));
  } catch {
    return undefined;
  }
  const {
    batchItemFailures: failures,
    requeue,
    pollMember,
    rollouts,
  } = (v ?? {}) as { batchItemFailures?: unknown; requeue?: unknown; pollMember?: unknown; rollouts?: unknown };
  if (!Array.isArray(failures)) return undefined;
  if (!failures.every((f) => typeof (f as { itemIdentifier?: unknown } | null)?.itemIdentifier === 'string')) {
    return undefined;
  }
  if (requeue !== undefined && !(Array.isArray(requeue) && requeue.every((id) => typeof id === 'string'))) {
    return undefined;
  }
  const kept = [...new Set((requeue ?? []) as string[])].filter((id) => given.has(id));
  const report = rollouts === undefined ? undefined : rolloutReportSchema.safeParse(rollouts);
  return {
    batchItemFailures: failures.map((f) => ({ itemIdentifier: (f as { itemIdentifier: string }).itemIdentifier })),
    ...(kept.length > 0 ? { requeue: kept } : {}),
    ...(typeof pollMember === 'boolean' ? { pollMember } : {}),
    ...(report?.success ? { rollouts: report.data } : {}),
  };
}
