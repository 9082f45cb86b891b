/**
 * The session policy of one stage run for one cluster (docs/decisions.md D15): what the
 * dispatcher passes to `sts:AssumeRole` (`Policy`) when it hands a stage function credentials for
 * a record of cluster C. The run role's own policy is the fleet's (every cluster, as
 * `STAGE_OBJECTS` of `./stages.ts` and the cluster access grant give the shared functions today);
 * the session's permissions are the intersection of that and this document, so this document
 * narrows every resource that has a cluster in it to C's and may stay loose where the role's own
 * policy is already exact (queues, the artifact key).
 *
 * Pure and free of CDK, like `./stages.ts`, so the dispatcher's bundle can build it at run time
 * from the same tables the cells' roles are synthesized from (`cellObjectGrants`).
 *
 * @module
 */
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { PRIVATE_PREFIX } from '../../functions/lib/artifact/sealed.js';
import { NEXT_STAGES } from '../../functions/lib/entry/config.js';
import { CLUSTER_ID_PATTERN, clusterDocKey } from '../../functions/lib/kube/cluster-doc.js';
import { SHARES_PREFIX } from '../../functions/lib/lease/index.js';
import { DOMAIN_ROOT, SHARING_MODES, type Sharing } from '../../functions/lib/store/domain.js';
import {
  cellObjectGrants,
  type ObjectAction,
  type ObjectGrant,
  PER_CLUSTER_PREFIXES,
  STAGE_OBJECTS,
  sharingGrants,
  tokenSecretPattern,
} from './stages.js';

/**
 * Longest inline session policy STS takes, characters: 2,048 (`AssumeRole`'s `Policy`). STS also
 * packs the policy and the session tags into a binary form with its own limit, reported as
 * `PackedPolicySize` (a percentage) in the answer; that one is known only to STS.
 */
export const SESSION_POLICY_MAX_CHARS = 2048;

/** Where the fleet's resources are: the parts of their ARNs a run session's policy names. */
export interface RunPolicyTarget {
  /** `aws`, `aws-cn`, `aws-us-gov`, … */
  readonly partition: string;
  readonly region: string;
  /** 12 digits. */
  readonly account: string;
  /** The artifact bucket's name. */
  readonly bucket: string;
  /** The cluster registry: its bucket and key prefix (`''` or ending in `/`). */
  readonly registry: { readonly bucket: string; readonly prefix: string };
  /**
   * Who shares the runs' claims (docs/decisions.md D17): `cluster`, each run only its cluster's
   * (`d/<tag>/…`); `fleet` (the default), every cluster (`cache/…`, `inflight/…`, `artifacts/index/…`).
   */
  readonly sharing?: Sharing;
}

/** One statement of an IAM policy document (only what this module writes). */
export interface PolicyStatement {
  readonly Effect: 'Allow';
  readonly Action: readonly string[];
  readonly Resource: readonly string[];
  readonly Condition?: Readonly<Record<string, Readonly<Record<string, readonly string[]>>>>;
}

/** An IAM policy document. */
export interface PolicyDocument {
  readonly Version: '2012-10-17';
  readonly Statement: readonly PolicyStatement[];
}

/** `private/<cluster tag>/…`: 32 lowercase hex characters (`ClusterKeys.tag`). */
const CLUSTER_TAG_PATTERN = /^[0-9a-f]{32}$/;
/** An S3 bucket name (general purpose): 3..63 of lowercase letters, digits, `.` and `-`. */
const BUCKET_PATTERN = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
/** Every object action of `ObjectGrant`, in a fixed order. */
const OBJECT_ACTIONS: readonly ObjectAction[] = ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'];
/** A registry prefix: `''` or path segments ending in `/`, with no character IAM reads as a wildcard or variable. */
const REGISTRY_PREFIX_PATTERN = /^([A-Za-z0-9._-]+\/)*$/;

/**
 * Checks every value this module writes into an ARN: one that held `*`, `?` or `${…}` would be
 * read by IAM as a wildcard or a policy variable and widen the session beyond one cluster.
 */
function checkInputs(stage: PipelineStage, clusterId: string, clusterTag: string, t: RunPolicyTarget): void {
  const bad = (what: string, value: string) =>
    new TypeError(`run policy for ${stage}: ${what} ${JSON.stringify(value)}`);
  if (!CLUSTER_ID_PATTERN.test(clusterId)) throw bad('cluster id is not a DNS-1123 label:', clusterId);
  if (!CLUSTER_TAG_PATTERN.test(clusterTag)) throw bad('cluster tag is not 32 lowercase hex characters:', clusterTag);
  if (!/^aws(-[a-z]+)*$/.test(t.partition)) throw bad('partition', t.partition);
  if (!/^[a-z]{2}(-[a-z]+)+-\d+$/.test(t.region)) throw bad('region', t.region);
  if (!/^\d{12}$/.test(t.account)) throw bad('account', t.account);
  if (!BUCKET_PATTERN.test(t.bucket)) throw bad('bucket', t.bucket);
  if (!BUCKET_PATTERN.test(t.registry.bucket)) throw bad('registry bucket', t.registry.bucket);
  if (!REGISTRY_PREFIX_PATTERN.test(t.registry.prefix)) throw bad('registry prefix', t.registry.prefix);
  if (t.sharing !== undefined && !SHARING_MODES.includes(t.sharing)) throw bad('sharing', String(t.sharing));
}

/**
 * The cell grants a run's session keeps: all but the fair shares (`state/shares/<stage>/…`,
 * `functions/lib/lease/shares.ts`). Why: the share is taken and released by the dispatcher
 * before and after it invokes the stage (it decides whether the record runs now or is parked),
 * never by the stage run itself, which a taken-over tool could otherwise use to park or wake
 * its own cluster's records out of turn; and each share prefix costs about 260 of STS's 2,048
 * characters at the longest id.
 */
function runGrants(stage: PipelineStage, clusterId: string, sharing: Sharing): ObjectGrant[] {
  return sharingGrants(
    cellObjectGrants(stage, clusterId).filter((g) => !g.keys.startsWith(SHARES_PREFIX)),
    sharing,
  );
}

/**
 * A stage's object grants for one cluster's run: {@link cellObjectGrants} (the per-cluster
 * prefixes narrowed to the id) under `sharing` (`sharingGrants`), each `private/*` grant narrowed
 * to `private/<clusterTag>/*` and each sharing domain's (`d/*`) to `d/<clusterTag>/…`. A cell
 * cannot do this at synth (the tag derives from its root key); the dispatcher can, since it
 * derives the run's keys itself.
 */
export function runObjectGrants(
  stage: PipelineStage,
  clusterId: string,
  clusterTag: string,
  sharing: Sharing = 'fleet',
): ObjectGrant[] {
  const any = [`${PRIVATE_PREFIX}*/`, `${DOMAIN_ROOT}*/`];
  return runGrants(stage, clusterId, sharing).map((g) => {
    const root = any.find((r) => g.keys.startsWith(r));
    return root
      ? {
          ...g,
          keys: `${root.slice(0, -2)}${clusterTag}/${g.keys.slice(root.length)}`,
          why: `${g.why}, of this cluster only`,
        }
      : g;
  });
}

/**
 * The artifact-bucket keys of a run's session: each of {@link runObjectGrants}' patterns, but a
 * pattern with no cluster in it (the shared, content-addressed `artifacts/`, and in `fleet`
 * sharing the fleet's claims, `cache/`, `inflight/`) widened to its first segment (`artifacts/*`),
 * the cluster's sealed keys to `private/<clusterTag>/*` and, in `cluster` sharing, its domain's
 * claims to `d/<clusterTag>/*`. The session only fences the cluster; which keys
 * and actions a stage may use is the run role's own policy, exact, and the session gets the
 * intersection of both. A first segment that per-cluster keys also start with (`state/`,
 * `receipts/`, `private/`, `d/`) is never widened. Kept short because STS takes 2,048 characters.
 */
export function runSessionKeys(
  stage: PipelineStage,
  clusterId: string,
  clusterTag: string,
  sharing: Sharing = 'fleet',
): string[] {
  const fenced = [...PER_CLUSTER_PREFIXES, PRIVATE_PREFIX, DOMAIN_ROOT].map((p) => p.slice(0, p.indexOf('/') + 1));
  const owns = [`${PRIVATE_PREFIX}${clusterTag}/`, `${DOMAIN_ROOT}${clusterTag}/`];
  const keys = runObjectGrants(stage, clusterId, clusterTag, sharing).map((g) => {
    const own = owns.find((o) => g.keys.startsWith(o));
    if (own) return `${own}*`;
    const first = g.keys.slice(0, g.keys.indexOf('/') + 1);
    return first && !fenced.includes(first) ? `${first}*` : g.keys;
  });
  return [...new Set(keys)];
}

/**
 * The fleet-shared, content-addressed blobs (`artifacts/fetch/`, `artifacts/template/`): a run may
 * read and create them, never list them. No stage lists them, and a listing would hand every run
 * the other clusters' unsealed blobs' names (their digests), hence their content. Reading a key
 * that is not there is then answered 403, not 404 ({@link sessionReadsKey}).
 */
export const SHARED_BLOBS_PREFIX = 'artifacts/';

/**
 * The source poll records' listing in `fleet` sharing (`SOURCE_POLL_PREFIX` of
 * `functions/lib/pipeline/source-poll.ts`, spelt out: this module is in the dispatcher's bundle,
 * which holds no pipeline code).
 */
const LISTED_POLL_RECORDS = 'cache/source-poll/*';

/**
 * The listing a run session may make of its keys: none of the shared blobs
 * ({@link SHARED_BLOBS_PREFIX}); of the fleet's claims (`fleet` sharing's `cache/*` and
 * `inflight/*`), the source poll records only, the one claim prefix a run lists (the poll's own
 * walk): the render and fetch records under `cache/` name every cluster's blob keys.
 */
function listedKeys(keys: readonly string[]): string[] {
  return keys.flatMap((k) => {
    if (k.startsWith(SHARED_BLOBS_PREFIX) || k === 'inflight/*') return [];
    return k === 'cache/*' ? [LISTED_POLL_RECORDS] : [k];
  });
}

/**
 * Whether `key` (from the artifact bucket's root) is one a `stage` run of `clusterId` may read:
 * it matches a pattern of {@link runSessionKeys}. Why: S3 answers a `GetObject` or `HeadObject` of
 * a missing key with 403 AccessDenied, not 404, to a principal without `s3:ListBucket` for it, as
 * the session is for {@link SHARED_BLOBS_PREFIX} (and, by how S3 evaluates a `s3:prefix`-conditioned
 * listing for that answer, possibly for every key). A denial of a key the session grants can then
 * only mean the key is missing (or the run role lacks the grant, which the next write shows), so
 * the stage's store reads it as absent (`S3StoreOptions.absentWhenDenied`).
 */
export function sessionReadsKey(
  stage: PipelineStage,
  clusterId: string,
  clusterTag: string,
  sharing: Sharing = 'fleet',
): (key: string) => boolean {
  const patterns = runSessionKeys(stage, clusterId, clusterTag, sharing);
  return (key) => patterns.some((p) => (p.endsWith('*') ? key.startsWith(p.slice(0, -1)) : key === p));
}

/**
 * The inline session policy of a `stage` run for cluster `clusterId` (compact JSON is what STS
 * counts): the stage's object actions on {@link runSessionKeys} of the artifact bucket (under
 * `target.sharing` `cluster`, its claims under `d/<clusterTag>/*` only, none of the fleet's);
 * `s3:ListBucket` only under those keys but {@link SHARED_BLOBS_PREFIX} (a listing would otherwise
 * name other clusters' receipts and leases, hence their namespaces and Apps, or their unsealed
 * blobs); the cluster's registry document; its
 * token secret of this stage (`kapp-lambda/<id>/<stage>-??????`); `sqs:SendMessage` (a stage
 * that sends) and the artifact key's `kms:Decrypt` (and `kms:GenerateDataKey` for a stage that
 * writes) on any queue or key of the account, since the run role names the exact queues and key.
 * Never the artifact root key's secret: every cluster's keys derive from it, so the dispatcher
 * derives the run's and hands them over itself.
 *
 * @param clusterTag - the cluster's `private/` segment (`ClusterKeys.tag`, 32 hex characters).
 * @throws TypeError when an input is malformed or holds `*`, `?` or `${` (see {@link checkInputs});
 *   RangeError when the document exceeds {@link SESSION_POLICY_MAX_CHARS}.
 */
export function runSessionPolicy(
  stage: PipelineStage,
  clusterId: string,
  clusterTag: string,
  target: RunPolicyTarget,
): PolicyDocument {
  checkInputs(stage, clusterId, clusterTag, target);
  const { partition: p, region: r, account: a, bucket } = target;
  const grants = STAGE_OBJECTS[stage];
  const keys = runSessionKeys(stage, clusterId, clusterTag, target.sharing);
  const actions = OBJECT_ACTIONS.filter((x) => grants.some((g) => g.actions.includes(x)));
  const statements: PolicyStatement[] = [];
  const listed = listedKeys(keys);
  if (keys.length > 0) {
    statements.push({ Effect: 'Allow', Action: actions, Resource: keys.map((k) => `arn:${p}:s3:::${bucket}/${k}`) });
  }
  if (listed.length > 0) {
    statements.push({
      Effect: 'Allow',
      Action: ['s3:ListBucket'],
      Resource: [`arn:${p}:s3:::${bucket}`],
      Condition: { StringLike: { 's3:prefix': listed } },
    });
  }
  statements.push(
    {
      Effect: 'Allow',
      Action: ['s3:GetObject'],
      Resource: [`arn:${p}:s3:::${target.registry.bucket}/${target.registry.prefix}${clusterDocKey(clusterId)}`],
    },
    {
      Effect: 'Allow',
      Action: ['secretsmanager:GetSecretValue'],
      Resource: [`arn:${p}:secretsmanager:${r}:${a}:secret:${tokenSecretPattern(stage, clusterId)}-??????`],
    },
  );
  if ((NEXT_STAGES[stage] ?? []).length > 0) {
    statements.push({ Effect: 'Allow', Action: ['sqs:SendMessage'], Resource: [`arn:${p}:sqs:${r}:${a}:*`] });
  }
  const writes = actions.includes('s3:PutObject');
  statements.push({
    Effect: 'Allow',
    Action: writes ? ['kms:Decrypt', 'kms:GenerateDataKey'] : ['kms:Decrypt'],
    Resource: [`arn:${p}:kms:${r}:${a}:key/*`],
  });
  const doc: PolicyDocument = { Version: '2012-10-17', Statement: statements };
  const chars = JSON.stringify(doc).length;
  if (chars > SESSION_POLICY_MAX_CHARS) {
    throw new RangeError(
      `run policy for ${stage} of ${clusterId}: ${chars} characters, over STS's ${SESSION_POLICY_MAX_CHARS}`,
    );
  }
  return doc;
}
