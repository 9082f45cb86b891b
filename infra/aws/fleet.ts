/**
 * The fleet settings of the CDK app, read once from CDK context (`cdk deploy -c key=value`, or
 * `context` in `infra/cdk.json`) and validated with zod. Values given on the command line
 * arrive as strings; numbers and JSON are parsed here.
 *
 * | context key | meaning | default |
 * |---|---|---|
 * | `clusterRegistryBucket` | a bucket of the account holding the cluster registry instead of the stack's artifact bucket | the artifact bucket |
 * | `clusterRegistryPrefix` | key prefix of the registry in that bucket: documents `<prefix>clusters/<id>.json` | `registry/` |
 * | `sourcePollMinutes` | period of the fleet source poll (the index-repo function's schedule), minutes | 1 |
 * | `maxDeployWaitMinutes` | the longest a deploy waits for its resources in all, over the invocations it continues in (the deploy function's `KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS`): an App's longer or unlimited `--wait-timeout` is cut there, and its status says so | 60 |
 * | `concurrency` | most concurrent invocations per function (the event source mapping's `maxConcurrency`, 2..1000): a number for every function, or JSON `{"deploy": 20}` per function | `STAGE_SIZING` (10; 5 for index-repo and install) |
 * | `clusterShare` | records of one cluster each function runs at once, fleet-wide (its fair share, `functions/lib/lease/shares.ts`; `KAPP_LAMBDA_CLUSTER_SHARE`, 1..10000): a number for every function, or JSON `{"fetch": 8}` per function; a record over it waits parked, holding no slot | `max(1, floor(concurrency × recordConcurrency / 2))`: fetch, template, deploy 5, index-repo 2, install 25 |
 * | `namespaceShare` | records of one namespace of a cluster each function runs at once, fleet-wide (`KAPP_LAMBDA_NAMESPACE_SHARE`, 1..10000, at most the function's `clusterShare`): a number or JSON per function | `max(1, ceil(clusterShare / 2))`: fetch, template, deploy 3, index-repo 1, install 13 |
 * | `logRetentionDays` | retention of the functions' log groups (a CloudWatch Logs retention value) | 30 |
 * | `artifactRetentionDays` | expiry of `artifacts/`, `cache/`, `d/` (the sharing domains' claims) and `receipts/` objects, days after their last write | 30 |
 * | `alarmTopicArn` | SNS topic notified by every alarm | none (alarms only change state) |
 * | `forwarders` | the way before `npm run cluster -- join` (which creates each cluster's forwarder role outside the stack, with the stack's `ForwarderPolicyArn`; a join changes no template), kept for existing deployments and for `isolation: cell`: JSON object: cluster id → `{"eksClusterArn": "arn:aws:eks:<region>:<account>:cluster/<name>"}`, one send-only forwarder role per cluster in the stack (two outputs each, so at most about 90 clusters under CloudFormation's 200 outputs), assumable through EKS Pod Identity by that cluster's `kapp-lambda/kapp-lambda-forwarder` ServiceAccount only | `{}` (no forwarder; `KappLambdaStack.addClusterForwarder` for other trust) |
 * | `isolation` | `shared`: one set of stage functions for every cluster of the fleet, dispatched (a dispatcher per stage consumes the queue and invokes the stage function per cluster, tenant-isolated, with a session of the stage's run role narrowed to that cluster: docs/decisions.md D15); `cell`: one set per cluster id of `forwarders` (a cell: its own functions, queues, artifact root key, and roles that read only that cluster's registry document and tokens; `KappLambdaStack.addCell`) | `shared` |
 * | `sharing` | who shares the runs' claims (render and fetch cache records, in-flight markers, repository indexes, source poll records; docs/decisions.md D17): `cluster`, each cluster its own, under `d/<cluster tag>/`, which only its run sessions may write, so a run taken over in one cluster cannot plant a claim another cluster trusts; `fleet`, every cluster (`cache/`, `inflight/`, `artifacts/index/`): more cache hits across clusters, for a fleet whose clusters trust each other. Content-addressed artifacts are shared either way. `isolation: shared` only | `cluster` (`isolation: shared`); `fleet` (`isolation: cell`, the only value there) |
 * | `unkeyedGroups` | `accept`, for the time an upgrade to keyed message groups takes (docs/upgrading.md): the record checks also take a keyed cluster's events in their object's unkeyed group, as forwarders of earlier releases send them (`KAPP_LAMBDA_UNKEYED_GROUPS`); any sender may name such a group, so deploy again with `refuse` once every forwarder is updated | `refuse` |
 * | `kmsKeyArn` | a customer managed KMS key (same account and region) for the artifact bucket, the artifact root key's secret, the functions' variables and, with `logEncryption`, their log groups, instead of the key the stack creates; its key policy must let the account's IAM policies grant it (the default key policy does) and, for `logEncryption`, CloudWatch Logs use it (docs/aws.md) | none: the stack creates `ArtifactKey` |
 * | `logEncryption` | encrypt the functions' log groups with the artifact key (`kmsKeyArn` or the stack's); the stack's own key gets the key policy statement CloudWatch Logs needs | `true` |
 * | `reservedConcurrency` | reserved concurrent executions per function (a number for every function, or JSON `{"deploy": 50}` per function), at least its `concurrency`: the fleet's functions keep that much of the account's concurrency whatever else runs, and never take more | none (unreserved) |
 * | `vpcId`, `subnetIds`, `securityGroupIds` | run every stage function in these subnets of this VPC (the dispatchers, which call AWS APIs only, stay outside), for clusters whose API servers are private (`subnetIds`: JSON array or comma list, required with `vpcId`; `securityGroupIds` optional, default one security group the stack creates with all egress and no ingress). The subnets need a route to S3, SQS, Secrets Manager, KMS, CloudWatch Logs and STS (a NAT gateway or VPC endpoints) and to the public sources Apps fetch | none: the functions run outside any VPC and reach public API servers only |
 * | `urlAllow` | the fleet's exceptions to the URL policy (`functions/lib/fetch/url-policy.ts`): a JSON array (or comma list) of `host`, `host:port` or CIDR entries, e.g. `["registry.corp:443", "10.20.0.0/16"]` for private registries, git servers or API servers; set as `KAPP_LAMBDA_URL_ALLOW` on the functions that fetch or deploy ({@link URL_POLICY_STAGES}); each entry is checked at synth with the runtime's own parser | `[]` (no exception: loopback, link-local and private addresses refused) |
 *
 * The functions find their clusters in the fleet's cluster registry
 * (`functions/lib/kube/fleet-registry.ts`, `npm run cluster -- add --registry s3://…`); the
 * stack's `clusterAccess` prop ({@link ClusterAccess}) is the hook for another source (one
 * without a registry turns the sender check off, and `forwarders` then fails the synth).
 *
 * @module
 */
import type { aws_iam as iam } from 'aws-cdk-lib';
import { z } from 'zod';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { MAX_CONTINUED_WAIT_MS } from '../../functions/lib/deploy/kapp.js';
import { parseUrlPolicy, UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';
import { CLUSTER_ID_PATTERN } from '../../functions/lib/kube/cluster-doc.js';
import { defaultClusterShare, defaultNamespaceShare } from '../../functions/lib/lease/shares.js';
import { SHARING_MODES, type Sharing } from '../../functions/lib/store/domain.js';
import { DEFAULT_ARTIFACT_RETENTION_DAYS, registryPrefixProblem, STAGE_SIZING } from './stages.js';

/** CloudWatch Logs retention values, in days (the API refuses others). */
export const LOG_RETENTION_DAYS = [
  1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
] as const;

/** Default of `clusterRegistryPrefix`: the registry's documents are `registry/clusters/<id>.json`. */
export const DEFAULT_CLUSTER_REGISTRY_PREFIX = 'registry/';

/** Default of `sourcePollMinutes`: the poll period of the functions' code (`DEFAULT_SOURCE_POLL_PERIOD_MS`). */
export const DEFAULT_SOURCE_POLL_MINUTES = 1;

/** Default of `logRetentionDays`. */
export const DEFAULT_LOG_RETENTION_DAYS = 30;

/** The validated settings; see the module comment for each. */
export interface FleetSettings {
  /** Bucket name; unset: the stack's artifact bucket. */
  clusterRegistryBucket?: string;
  /** `''` (the bucket root) or ending in `/`. */
  clusterRegistryPrefix: string;
  /** Minutes, 1..1440. */
  sourcePollMinutes: number;
  /** The deploy function's wait maximum, minutes (`KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS`). */
  maxDeployWaitMinutes: number;
  /** Per function, filled from `STAGE_SIZING` where the context names none. */
  concurrency: Record<PipelineStage, number>;
  /** Per function, its cluster fair share (`KAPP_LAMBDA_CLUSTER_SHARE`), filled from `defaultClusterShare`. */
  clusterShare: Record<PipelineStage, number>;
  /** Per function, its namespace fair share (`KAPP_LAMBDA_NAMESPACE_SHARE`), filled from `defaultNamespaceShare`. */
  namespaceShare: Record<PipelineStage, number>;
  logRetentionDays: (typeof LOG_RETENTION_DAYS)[number];
  artifactRetentionDays: number;
  alarmTopicArn?: string;
  /** Per cluster id, the EKS cluster whose forwarder may send events naming it. */
  forwarders: Record<string, ClusterForwarder>;
  /** URL policy exceptions (`host`, `host:port`, CIDR), each valid for the runtime's parser. */
  urlAllow: string[];
  /** One set of functions for the fleet, or one cell per cluster of `forwarders` ({@link ISOLATION_MODES}). */
  isolation: IsolationMode;
  /** Who shares the runs' claims (`KAPP_LAMBDA_SHARING`): each cluster its own, or the fleet. */
  sharing: Sharing;
  /** Whether the record checks take keyed clusters' events in unkeyed groups too (`KAPP_LAMBDA_UNKEYED_GROUPS`). */
  unkeyedGroups: 'refuse' | 'accept';
  /** A customer managed key instead of the stack's own `ArtifactKey`. */
  kmsKeyArn?: string;
  /** Whether the functions' log groups are encrypted with the artifact key. */
  logEncryption: boolean;
  /** Reserved concurrent executions of the functions that have one (each at least its `concurrency`). */
  reservedConcurrency: Partial<Record<PipelineStage, number>>;
  /** The VPC and subnets the functions run in (private API servers); unset: no VPC. */
  vpc?: FleetVpc;
}

/** Where the functions run when the fleet's API servers are private (context `vpcId`, `subnetIds`, `securityGroupIds`). */
export interface FleetVpc {
  /** `vpc-…`. */
  vpcId: string;
  /** `subnet-…`, at least one (two or more in different zones for availability). */
  subnetIds: string[];
  /** `sg-…`; empty: the stack creates one with all egress and no ingress. */
  securityGroupIds: string[];
}

/**
 * How the stack confines its functions: `shared`, one set of stage functions (and one artifact
 * root key) for every cluster; `cell`, one set per cluster, each able to act on its own cluster only.
 */
export const ISOLATION_MODES = ['shared', 'cell'] as const;

/** One of {@link ISOLATION_MODES}. */
export type IsolationMode = (typeof ISOLATION_MODES)[number];

/**
 * The functions that get `urlAllow` (as `KAPP_LAMBDA_URL_ALLOW`): those whose URL policy checks
 * something: fetch and index-repo fetch sources (and poll them), deploy checks an App's
 * kubeconfig Secret, and so does template, which reads the version and API groups of that
 * Secret's cluster (helm `kubernetesVersion`/`kubernetesAPIs`, downward API). Install contacts
 * no URL an App names.
 */
export const URL_POLICY_STAGES = [
  'fetch',
  'index-repo',
  'template',
  'deploy',
] as const satisfies readonly PipelineStage[];

/**
 * Why one `urlAllow` entry is invalid, by the parser the functions use on `KAPP_LAMBDA_URL_ALLOW`
 * (`parseUrlPolicy` and `UrlPolicyChecker`), or `undefined` when it is valid. A comma would
 * split the entry in the variable, so it is refused too.
 */
function urlAllowProblem(entry: string): string | undefined {
  const problem = `invalid entry ${JSON.stringify(entry)}: expected a host, host:port or CIDR (e.g. registry.corp:443, 10.20.0.0/16)`;
  if (entry.trim() === '' || entry.includes(',')) return problem;
  try {
    const policy = parseUrlPolicy('enforce', entry, 'enforce');
    new UrlPolicyChecker(policy);
    return policy.allow.length === 1 ? undefined : problem;
  } catch {
    return problem;
  }
}

/** A cluster's forwarder on EKS: the cluster its Pod Identity association is in. */
export interface ClusterForwarder {
  /** `arn:aws:eks:<region>:<account>:cluster/<name>`: the `eks-cluster-arn` session tag Pod Identity sets. */
  eksClusterArn: string;
}

/** A context value was invalid; `problems` holds one `<key>: <problem>` each. */
export class FleetContextError extends Error {
  override readonly name = 'FleetContextError';
  constructor(readonly problems: readonly string[]) {
    super(`invalid CDK context: ${problems.join('; ')}`);
  }
}

const fromText = (v: unknown): unknown => {
  if (typeof v !== 'string') return v;
  const t = v.trim();
  if (t === '') return undefined;
  if (/^[[{0-9]/.test(t)) {
    try {
      return JSON.parse(t);
    } catch {
      return t;
    }
  }
  return t;
};

/**
 * A per-function number of the context: one integer in `min..max` for every function, or a JSON
 * object of function → integer; either refused with one message naming the range.
 */
const perFunctionInt = (min: number, max: number) => {
  const error = `expected an integer from ${min} to ${max}, or a JSON object of function → integer`;
  const value = z.number({ error }).int({ error }).min(min, { error }).max(max, { error });
  return z.preprocess(fromText, z.union([value, z.partialRecord(z.enum(PIPELINE_STAGES), value)]).optional());
};
const arn = (service: string) =>
  z.string().regex(new RegExp(`^arn:aws[a-z-]*:${service}:[a-z0-9-]+:\\d{12}:.+$`), {
    error: `expected an ${service} ARN`,
  });

/** `arn:<partition>:eks:<region>:<account>:cluster/<name>`. */
const EKS_CLUSTER_ARN = /^arn:aws[a-z-]*:eks:[a-z0-9-]+:\d{12}:cluster\/[0-9A-Za-z][A-Za-z0-9_-]{0,99}$/;

/** A JSON array or a comma list of ids matching `pattern`. */
const idList = (pattern: RegExp, what: string) =>
  z.preprocess(
    (v) => {
      const t = fromText(v);
      return typeof t === 'string' ? t.split(',').map((e) => e.trim()) : t;
    },
    z
      .array(z.string().regex(pattern, { error: `expected ${what} ids` }), {
        error: `expected a JSON array of ${what} ids`,
      })
      .optional(),
  );

const ContextSchema = z.object({
  clusterRegistryBucket: z.preprocess(
    fromText,
    z
      .string()
      .regex(/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/, { error: 'expected an S3 bucket name' })
      .optional(),
  ),
  clusterRegistryPrefix: z.preprocess(
    fromText,
    z
      .string()
      .regex(/^([A-Za-z0-9._-]+\/)*[A-Za-z0-9._-]*$/, { error: 'expected a key prefix of [A-Za-z0-9._-] segments' })
      .transform((p) => (p === '' || p.endsWith('/') ? p : `${p}/`))
      .default(DEFAULT_CLUSTER_REGISTRY_PREFIX),
  ),
  sourcePollMinutes: z.preprocess(
    fromText,
    z.number().int().min(1).max(1440, { error: 'expected at most 1440 (a day)' }).default(DEFAULT_SOURCE_POLL_MINUTES),
  ),
  maxDeployWaitMinutes: z.preprocess(
    fromText,
    z
      .number()
      .int()
      .min(1)
      .max(1440, { error: 'expected at most 1440 (a day)' })
      .default(MAX_CONTINUED_WAIT_MS / 60_000),
  ),
  concurrency: perFunctionInt(2, 1000),
  clusterShare: perFunctionInt(1, 10_000),
  namespaceShare: perFunctionInt(1, 10_000),
  logRetentionDays: z.preprocess(
    fromText,
    z
      .number()
      .refine((d) => (LOG_RETENTION_DAYS as readonly number[]).includes(d), {
        error: `expected one of ${LOG_RETENTION_DAYS.join(', ')}`,
      })
      .default(DEFAULT_LOG_RETENTION_DAYS),
  ),
  artifactRetentionDays: z.preprocess(
    fromText,
    z.number().int().min(1).max(3650).default(DEFAULT_ARTIFACT_RETENTION_DAYS),
  ),
  alarmTopicArn: z.preprocess(fromText, arn('sns').optional()),
  forwarders: z.preprocess(
    fromText,
    z
      .record(
        z.string().regex(CLUSTER_ID_PATTERN, { error: 'expected cluster ids (DNS-1123 labels)' }),
        z.strictObject({
          eksClusterArn: z.string().regex(EKS_CLUSTER_ARN, { error: 'expected an EKS cluster ARN' }),
        }),
        { error: 'expected a JSON object of cluster id → {"eksClusterArn": …}' },
      )
      .default({}),
  ),
  isolation: z.preprocess(
    fromText,
    z.enum(ISOLATION_MODES, { error: `expected one of ${ISOLATION_MODES.join(', ')}` }).default('shared'),
  ),
  sharing: z.preprocess(
    fromText,
    z
      .enum(SHARING_MODES as [Sharing, ...Sharing[]], { error: `expected one of ${SHARING_MODES.join(', ')}` })
      .optional(),
  ),
  unkeyedGroups: z.preprocess(
    fromText,
    z.enum(['refuse', 'accept'], { error: 'expected refuse or accept' }).default('refuse'),
  ),
  kmsKeyArn: z.preprocess(
    fromText,
    z
      .string()
      .regex(/^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key\/[0-9a-f-]{36}$/, {
        error: 'expected a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>; not an alias)',
      })
      .optional(),
  ),
  logEncryption: z.preprocess(
    (v) => (v === 'true' ? true : v === 'false' ? false : fromText(v)),
    z.boolean({ error: 'expected true or false' }).default(true),
  ),
  reservedConcurrency: perFunctionInt(2, 10_000),
  vpcId: z.preprocess(
    fromText,
    z
      .string()
      .regex(/^vpc-[0-9a-f]{8,17}$/, { error: 'expected a VPC id (vpc-…)' })
      .optional(),
  ),
  subnetIds: idList(/^subnet-[0-9a-f]{8,17}$/, 'subnet'),
  securityGroupIds: idList(/^sg-[0-9a-f]{8,17}$/, 'security group'),
  urlAllow: z.preprocess(
    (v) => {
      const t = fromText(v);
      return typeof t === 'string' ? t.split(',').map((e) => e.trim()) : t;
    },
    z
      .array(z.string(), { error: 'expected a JSON array of host, host:port or CIDR entries' })
      .superRefine((entries, ctx) => {
        for (const [i, entry] of entries.entries()) {
          const problem = urlAllowProblem(entry);
          if (problem) ctx.addIssue({ code: 'custom', path: [i], message: problem });
        }
      })
      .default([]),
  ),
});

/** The context keys of {@link FleetSettings}. */
export const FLEET_CONTEXT_KEYS = Object.keys(ContextSchema.shape) as (keyof z.infer<typeof ContextSchema>)[];

/**
 * Reads the fleet settings.
 * @param context - looks up one context key (e.g. `(k) => app.node.tryGetContext(k)`).
 * @throws FleetContextError naming every invalid key.
 */
export function fleetSettings(context: (key: string) => unknown): FleetSettings {
  const raw = Object.fromEntries(FLEET_CONTEXT_KEYS.map((k) => [k, context(k)]));
  const r = ContextSchema.safeParse(raw);
  if (!r.success) {
    throw new FleetContextError(r.error.issues.map((i) => `${i.path.map(String).join('.')}: ${i.message}`));
  }
  const c = r.data;
  // In the artifact bucket, the registry must stay clear of every function's writable keys and
  // of the lifecycle rules (a cluster document must never expire).
  const clash = c.clusterRegistryBucket ? undefined : registryPrefixProblem(c.clusterRegistryPrefix);
  if (clash) throw new FleetContextError([`clusterRegistryPrefix: ${clash}`]);
  if (c.isolation === 'cell' && Object.keys(c.forwarders).length === 0) {
    throw new FleetContextError([
      'isolation: cell makes one cell per cluster id of forwarders, which names none (e.g. -c \'forwarders={"prod-eu-1":{"eksClusterArn":"arn:aws:eks:…:cluster/prod-eu-1"}}\')',
    ]);
  }
  // A domain is fenced by each run's session: only the dispatched functions of `isolation: shared` have one.
  if (c.isolation === 'cell' && c.sharing === 'cluster') {
    throw new FleetContextError([
      "sharing: cluster needs isolation: shared (a cell's functions run without the dispatcher's per-cluster sessions that fence a domain)",
    ]);
  }
  const vpcProblems = [
    ...(c.vpcId && !c.subnetIds?.length
      ? ['subnetIds: vpcId needs the subnets the functions run in (e.g. -c subnetIds=subnet-0a…,subnet-0b…)']
      : []),
    ...(!c.vpcId && (c.subnetIds?.length || c.securityGroupIds?.length)
      ? ['vpcId: subnetIds and securityGroupIds need the VPC they are in']
      : []),
  ];
  if (vpcProblems.length > 0) throw new FleetContextError(vpcProblems);
  const concurrency = Object.fromEntries(
    PIPELINE_STAGES.map((s) => [
      s,
      typeof c.concurrency === 'number' ? c.concurrency : (c.concurrency?.[s] ?? STAGE_SIZING[s].concurrency),
    ]),
  ) as Record<PipelineStage, number>;
  const perStage = (v: number | Partial<Record<PipelineStage, number>> | undefined, st: PipelineStage) =>
    typeof v === 'number' ? v : v?.[st];
  const clusterShare = Object.fromEntries(
    PIPELINE_STAGES.map((st) => [
      st,
      perStage(c.clusterShare, st) ?? defaultClusterShare(concurrency[st], STAGE_SIZING[st].recordConcurrency),
    ]),
  ) as Record<PipelineStage, number>;
  const namespaceShare = Object.fromEntries(
    PIPELINE_STAGES.map((st) => [st, perStage(c.namespaceShare, st) ?? defaultNamespaceShare(clusterShare[st])]),
  ) as Record<PipelineStage, number>;
  const over = PIPELINE_STAGES.filter((st) => namespaceShare[st] > clusterShare[st]);
  if (over.length > 0) {
    throw new FleetContextError(
      over.map((st) => `namespaceShare: ${st}: ${namespaceShare[st]} is above its clusterShare ${clusterShare[st]}`),
    );
  }
  const reservedConcurrency: Partial<Record<PipelineStage, number>> = Object.fromEntries(
    PIPELINE_STAGES.flatMap((st) => {
      const r = typeof c.reservedConcurrency === 'number' ? c.reservedConcurrency : c.reservedConcurrency?.[st];
      return r === undefined ? [] : [[st, r]];
    }),
  );
  // Below the event source mapping's maxConcurrency, SQS polling is throttled and records are
  // received again and again until they dead-letter.
  const short = PIPELINE_STAGES.filter((st) => (reservedConcurrency[st] ?? Infinity) < concurrency[st]);
  if (short.length > 0) {
    throw new FleetContextError(
      short.map(
        (st) =>
          `reservedConcurrency: ${st}: ${reservedConcurrency[st]} is below its concurrency ${concurrency[st]} (the queue's pollers would be throttled)`,
      ),
    );
  }
  return {
    ...(c.clusterRegistryBucket ? { clusterRegistryBucket: c.clusterRegistryBucket } : {}),
    clusterRegistryPrefix: c.clusterRegistryPrefix,
    sourcePollMinutes: c.sourcePollMinutes,
    maxDeployWaitMinutes: c.maxDeployWaitMinutes,
    concurrency,
    clusterShare,
    namespaceShare,
    logRetentionDays: c.logRetentionDays as FleetSettings['logRetentionDays'],
    artifactRetentionDays: c.artifactRetentionDays,
    ...(c.alarmTopicArn ? { alarmTopicArn: c.alarmTopicArn } : {}),
    forwarders: c.forwarders,
    urlAllow: c.urlAllow.map((e) => e.trim()),
    isolation: c.isolation,
    sharing: c.sharing ?? (c.isolation === 'shared' ? 'cluster' : 'fleet'),
    unkeyedGroups: c.unkeyedGroups,
    ...(c.kmsKeyArn ? { kmsKeyArn: c.kmsKeyArn } : {}),
    logEncryption: c.logEncryption,
    reservedConcurrency,
    ...(c.vpcId
      ? { vpc: { vpcId: c.vpcId, subnetIds: c.subnetIds ?? [], securityGroupIds: c.securityGroupIds ?? [] } }
      : {}),
  };
}

/**
 * How the functions find the clusters they serve. The stack's default is the fleet's cluster
 * registry (`registryClusterAccess` in `./stack.ts`): the variable that locates it and, per
 * function, read access to the documents and to its stage's tokens. The functions check an
 * event's sender against the registry only when `environment` locates one
 * (`KAPP_LAMBDA_CLUSTER_REGISTRY`); `KAPP_LAMBDA_SENDER_CHECK` and `KAPP_LAMBDA_FUNCTION_SENDERS`
 * are the stack's (the synth fails when `environment` sets them).
 */
export interface ClusterAccess {
  /** Variables every function gets (e.g. `KAPP_LAMBDA_CLUSTER_REGISTRY`). */
  readonly environment: Readonly<Record<string, string>>;
  /**
   * Grants one function's role what reading its clusters needs; called once per function. With
   * `clusterId` (a function of that cluster's cell, `isolation: cell`) what reading that one
   * cluster needs, and nothing of another.
   */
  grant(role: iam.Role, stage: PipelineStage, clusterId?: string): void;
}
