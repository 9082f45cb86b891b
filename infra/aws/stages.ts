/**
 * What each Lambda function of the fleet deployment is given, per stage (`PIPELINE_STAGES`):
 * its size, its queue's batching, the object-store keys it may touch, and which queues the
 * in-cluster forwarders send to. Pure data and pure functions: the stack (`./stack.ts`) turns
 * them into resources and the infrastructure test checks the template against them.
 *
 * @module
 */
import { API_VERSIONS, KINDS, objectEvent, targetFunction } from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { INFLIGHT_PREFIX } from '../../functions/lib/artifact/keys.js';
import { DEFAULT_PRIVATE_TTL_MS } from '../../functions/lib/artifact/sealed.js';
import { STAGE_RECORD_CONCURRENCY } from '../../functions/lib/entry/config.js';
import { POLL_MEMBER_STAGES, POLL_MEMBERS_PREFIX } from '../../functions/lib/entry/dispatch.js';
import { DEFAULT_DEADLINE_MARGIN_MS, PROOF_VISIBILITY_MARGIN_SECONDS } from '../../functions/lib/entry/handler.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { LEASE_PREFIX, SHARES_PREFIX } from '../../functions/lib/lease/index.js';
import { STAGE_MEMORY_MIB } from '../../functions/lib/receipt/prices.js';
import { RECEIPTS_PREFIX } from '../../functions/lib/receipt/receipt.js';
import { FLEET_PREFIX, POLICY_PREFIX, ROLLOUT_PREFIX } from '../../functions/lib/rollout/state.js';
import { DOMAIN_ROOT, DOMAIN_SCOPED_PREFIXES, type Sharing } from '../../functions/lib/store/domain.js';

/** Size and batching of one stage's function and event source mapping. */
export interface StageSizing {
  /** Function memory, MiB (CPU grows with it: one full vCPU at 1769 MiB). */
  readonly memoryMiB: number;
  /** `/tmp` size, MiB (512..10240): scratch trees, tarballs, tool caches. */
  readonly ephemeralMiB: number;
  /** Function timeout, seconds (at most 900, Lambda's limit). */
  readonly timeoutSeconds: number;
  /**
   * Records per invocation (a FIFO event source mapping takes 1..10, and no batching window:
   * it hands over what the queue has at once, so a batch fills only when records wait).
   */
  readonly batchSize: number;
  /**
   * Records of one batch run at once, at most (`KAPP_LAMBDA_RECORD_CONCURRENCY`, default
   * `STAGE_RECORD_CONCURRENCY` of `functions/lib/entry/config.ts`, which says why each); records
   * of one message group (one object) always run one after another.
   */
  readonly recordConcurrency: number;
  /** Default of the event source mapping's `maxConcurrency` (2..1000); context `concurrency` overrides it. */
  readonly concurrency: number;
}

/**
 * Sizing per stage, from what each stage runs:
 *
 * - fetch: vendir, imgpkg and helm download sources (network-bound); the fetched tree and its
 *   tarball sit in `/tmp` together, so storage is the large part;
 * - template: ytt, kbld, helm, cue, kustomize render (CPU-bound), so more memory for more CPU;
 * - deploy: kapp deploy waits for the resources it applies; the wait is what takes time, hence
 *   Lambda's full 15 minutes;
 * - index-repo: fetch, template and a kapp deploy of the repository's Packages in one run;
 * - install: no tool, only API calls (resolve a version, write an App): small and short, and a
 *   batch of 10 since each record takes seconds.
 *
 * The tool stages take one record per invocation: their tools share the function's uid, so two
 * Apps' runs must not overlap in one execution environment (`STAGE_RECORD_CONCURRENCY`), and in
 * series the function timeout would bound the sum of ten runs and a slow record would hold the
 * rest of its batch. install takes batches of 10 and runs them side by side (no tool), each
 * App's records in order, and deletes the records that succeeded at once, so a slow record holds
 * no neighbour's object (`functions/lib/entry/stage-handler.ts`). A burst of tool-stage events
 * (a forwarder restart) therefore still costs one invocation per event and stage; most of them
 * are resyncs answered from the caches in tens of ms.
 */
export const STAGE_SIZING: Readonly<Record<PipelineStage, StageSizing>> = {
  fetch: {
    memoryMiB: STAGE_MEMORY_MIB.fetch,
    ephemeralMiB: 4096,
    timeoutSeconds: 600,
    batchSize: 1,
    recordConcurrency: STAGE_RECORD_CONCURRENCY.fetch,
    concurrency: 10,
  },
  template: {
    memoryMiB: STAGE_MEMORY_MIB.template,
    ephemeralMiB: 2048,
    timeoutSeconds: 300,
    batchSize: 1,
    recordConcurrency: STAGE_RECORD_CONCURRENCY.template,
    concurrency: 10,
  },
  deploy: {
    memoryMiB: STAGE_MEMORY_MIB.deploy,
    ephemeralMiB: 1024,
    timeoutSeconds: 900,
    batchSize: 1,
    recordConcurrency: STAGE_RECORD_CONCURRENCY.deploy,
    concurrency: 10,
  },
  'index-repo': {
    memoryMiB: STAGE_MEMORY_MIB['index-repo'],
    ephemeralMiB: 4096,
    timeoutSeconds: 900,
    batchSize: 1,
    recordConcurrency: STAGE_RECORD_CONCURRENCY['index-repo'],
    concurrency: 5,
  },
  install: {
    memoryMiB: STAGE_MEMORY_MIB.install,
    ephemeralMiB: 512,
    timeoutSeconds: 120,
    batchSize: 10,
    recordConcurrency: STAGE_RECORD_CONCURRENCY.install,
    concurrency: 5,
  },
};

/**
 * Time kept between a tool's timeout (`KAPP_LAMBDA_TOOL_TIMEOUT_MS`) and the function timeout,
 * ms: twice the handler's deadline margin (`DEFAULT_DEADLINE_MARGIN_MS`, 30 s), so a tool that
 * runs into its timeout is killed by the runner and the stage writes `ReconcileFailed` with the
 * tool's error, rather than Lambda killing the process with no status written.
 */
export const TOOL_TIMEOUT_MARGIN_MS = 2 * DEFAULT_DEADLINE_MARGIN_MS;

/**
 * `KAPP_LAMBDA_TOOL_TIMEOUT_MS` of a stage: its function timeout less {@link TOOL_TIMEOUT_MARGIN_MS};
 * `undefined` for a stage that runs no tool (install).
 *
 * Deploy's is its function timeout less half the deadline margin (15 s): later than the function
 * deadline (30 s before the limit), which stops kapp while it waits and continues the deploy in
 * a follow-up invocation (`functions/lib/pipeline/app/deploy.ts`), so the tool timeout never ends a
 * long deploy as failed; it stays below the function timeout as the last guard.
 */
export function toolTimeoutMs(stage: PipelineStage, dispatched = false): number | undefined {
  if (STAGE_TOOLS[stage].length === 0) return undefined;
  const margin = stage === 'deploy' ? DEFAULT_DEADLINE_MARGIN_MS / 2 : TOOL_TIMEOUT_MARGIN_MS;
  return stageTimeoutSeconds(stage, dispatched) * 1000 - margin;
}

/**
 * Lambda's longest timeout, seconds: 900. A dispatcher waits for the stage it invokes
 * synchronously, so the stage's own timeout is at most this less {@link DISPATCH_MARGIN_SECONDS}.
 */
export const DISPATCHER_TIMEOUT_SECONDS = 900;

/**
 * Seconds a dispatcher keeps after the longest stage run it waits for: 30, the handler's
 * deadline margin (`DEFAULT_DEADLINE_MARGIN_MS`), for the stage's answer, the fair share's
 * release and the requeue of what the stage held at its deadline.
 */
export const DISPATCH_MARGIN_SECONDS = DEFAULT_DEADLINE_MARGIN_MS / 1000;

/**
 * A stage function's timeout, seconds: `STAGE_SIZING`'s, and when a dispatcher invokes it
 * (`dispatched`, the shared mode) at most {@link DISPATCHER_TIMEOUT_SECONDS} less
 * {@link DISPATCH_MARGIN_SECONDS} (deploy and index-repo: 870).
 */
export function stageTimeoutSeconds(stage: PipelineStage, dispatched = false): number {
  const t = STAGE_SIZING[stage].timeoutSeconds;
  return dispatched ? Math.min(t, DISPATCHER_TIMEOUT_SECONDS - DISPATCH_MARGIN_SECONDS) : t;
}

/**
 * Timeout of a stage's dispatcher (docs/decisions.md D15), seconds: its stage's dispatched
 * timeout plus {@link DISPATCH_MARGIN_SECONDS} (fetch 630, template 330, deploy and index-repo
 * 900, install 150). Not a flat 900: the queue's visibility timeout follows the consumer's, and a
 * record of a crashed run comes back only after it, so a short stage keeps its short retry.
 */
export function dispatcherTimeoutSeconds(stage: PipelineStage): number {
  return stageTimeoutSeconds(stage, true) + DISPATCH_MARGIN_SECONDS;
}

/** Memory of every dispatcher function, MiB: it runs no tool and holds a batch's records only. */
export const DISPATCHER_MEMORY_MIB = 128;

/**
 * A stage's {@link STAGE_OBJECTS} as its run role holds them in the shared mode (docs/decisions.md
 * D15): all but its fair shares (`state/shares/<stage>/…`), which its dispatcher takes and frees
 * ({@link dispatcherObjects}), so no stage run can park or wake records out of turn; under
 * `sharing` `cluster` its claims are in the sharing domains ({@link sharingGrants}, D17).
 */
export function runRoleObjects(stage: PipelineStage, sharing: Sharing = 'fleet'): ObjectGrant[] {
  return sharingGrants(
    STAGE_OBJECTS[stage].filter((g) => !g.keys.startsWith(SHARES_PREFIX)),
    sharing,
  );
}

/**
 * `grants` under `sharing` (docs/decisions.md D17): `fleet`, as they are; `cluster`, each grant of
 * a claim (a key under `cache/`, `inflight/` or `artifacts/index/`, `DOMAIN_SCOPED_PREFIXES` of
 * `functions/lib/store/domain.ts`) moved to the same keys in any sharing domain, `d/*` + its
 * keys, with the same actions. No grant of the fleet's claims is left: no run reads them then,
 * and none may plant one for a stack switched back to `fleet`. Each run's session narrows `d/*`
 * to its own cluster's tag (`runSessionKeys` of `./run-policy.ts`).
 */
export function sharingGrants(grants: readonly ObjectGrant[], sharing: Sharing): ObjectGrant[] {
  if (sharing === 'fleet') return [...grants];
  return grants.map((g) =>
    DOMAIN_SCOPED_PREFIXES.some((p) => g.keys.startsWith(p))
      ? { ...g, keys: `${DOMAIN_ROOT}*/${g.keys}`, why: `${g.why}, in its cluster's sharing domain` }
      : g,
  );
}

/**
 * The bucket keys a stage's dispatcher touches itself: its stage's fair shares ({@link sharesGrant}),
 * for index-repo the fleet's source poll records, read only: it lists their member clusters
 * (`sourcePollClusters` of `functions/lib/entry/dispatch.ts`) to run each one's poll in a session
 * of that cluster, which claims and writes the records itself; for fetch and index-repo
 * (`POLL_MEMBER_STAGES`) the poll members of `cluster` sharing (`state/poll-members/`, which no
 * run role holds): written and deleted from what each cluster's runs answer, listed by index-repo's;
 * and for install the fleet's rollouts ({@link ROLLOUT_GRANTS}), which it coordinates since no
 * run holds more than its own cluster's keys.
 */
export function dispatcherObjects(stage: PipelineStage): ObjectGrant[] {
  return [
    sharesGrant(stage),
    ...(POLL_MEMBER_STAGES.includes(stage)
      ? [
          {
            keys: `${POLL_MEMBERS_PREFIX}*`,
            actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] as const,
            why: "the source poll's member clusters in cluster sharing, from what each cluster's runs answer",
          },
        ]
      : []),
    ...(stage === 'index-repo'
      ? [
          {
            keys: 'cache/source-poll/*',
            actions: READ,
            why: "fleet source poll records (read only): whose clusters' polls it runs",
          },
        ]
      : []),
    ...(stage === 'install' ? ROLLOUT_GRANTS : []),
  ];
}

/**
 * Extra seconds of an SQS queue's visibility timeout over its function's timeout. AWS advises
 * six times the function timeout so that throttled invocations do not burn receives; here each
 * event source mapping has a `maxConcurrency` below the function's share of the account's
 * concurrency instead, and a record of a crashed invocation (and every later record of its FIFO
 * group, which waits behind it) comes back one minute after the timeout rather than 75 minutes
 * (6 × 15 min) later. The functions' record proof gives a proven message the same margin
 * (`PROOF_VISIBILITY_MARGIN_SECONDS`), so one number serves both.
 */
export const VISIBILITY_MARGIN_SECONDS = PROOF_VISIBILITY_MARGIN_SECONDS;

/** S3 permissions a stage may hold on a key prefix (HeadObject needs `s3:GetObject`). */
export type ObjectAction = 's3:GetObject' | 's3:PutObject' | 's3:DeleteObject';

/** One prefix of the artifact bucket a stage uses, and why. */
export interface ObjectGrant {
  /** Key pattern relative to the bucket root, ending in `*` (IAM's `*` also matches `/`). */
  readonly keys: string;
  readonly actions: readonly ObjectAction[];
  readonly why: string;
  /**
   * `s3:PutObject` only with `If-None-Match` (IAM condition `Null` `s3:if-none-match` `false`):
   * the grantee creates objects under the prefix, never overwrites one. For the fleet-shared
   * content-addressed blobs (`artifacts/fetch/`, `artifacts/template/`), written only by
   * `putIfAbsent`, so a run of one cluster cannot replace what another's reads (D17).
   */
  readonly createOnly?: true;
}

const READ: readonly ObjectAction[] = ['s3:GetObject'];
const WRITE: readonly ObjectAction[] = ['s3:GetObject', 's3:PutObject'];
const READ_WRITE_DELETE: readonly ObjectAction[] = ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'];
// Sealed objects are deleted by the reader that finds them expired (`PrivateArtifacts.get`).
const SEALED_READ: readonly ObjectAction[] = ['s3:GetObject', 's3:DeleteObject'];
const SEALED_WRITE: readonly ObjectAction[] = ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'];

/**
 * Fleet in-flight markers (`functions/lib/artifact/single-flight.ts`): conditional writes
 * (If-None-Match, If-Match) while a tool runs, deleted by their holder once the artifact is stored.
 */
const IN_FLIGHT: readonly ObjectAction[] = ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'];

/**
 * The run leases of Apps (`functions/lib/lease/`), which fetch, template and deploy share:
 * read and conditional writes (If-Match, If-None-Match) only; a lease is freed by a write, never deleted.
 */
const RUN_LEASE: ObjectGrant = {
  keys: 'state/leases/*',
  actions: WRITE,
  why: 'run leases of Apps (conditional writes: If-Match, If-None-Match)',
};

/**
 * A stage's fair shares (`functions/lib/lease/shares.ts`): per cluster one document
 * `state/shares/<stage>/<cluster>.json` (read and conditional writes) and the records parked over
 * the cluster's share, `state/shares/<stage>/<cluster>/parked/…` (written, read and deleted once
 * woken). Each function gets its own stage's only.
 */
export function sharesGrant(stage: PipelineStage): ObjectGrant {
  return {
    keys: `${SHARES_PREFIX}${stage}/*`,
    actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'],
    why: 'fair shares of its slots per cluster (conditional writes: If-Match, If-None-Match) and the records parked over them',
  };
}

/**
 * Reconcile receipts (`functions/lib/receipt/receipt.ts`, `receipts/<cluster>/<namespace>/<name>/…`):
 * the stage that ends a run writes its receipt and removes the App's oldest beyond the newest 20;
 * the fetch function reads one to roll an App back.
 */
const RECEIPTS: ObjectGrant = {
  keys: `${RECEIPTS_PREFIX}*`,
  actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'],
  why: 'reconcile receipts (one PUT per run, the oldest beyond 20 deleted; read for a rollback)',
};

/**
 * The install dispatcher's keys of the fleet's rollouts (issue 28, the cloud mode): the policies
 * (`state/rollout-policies/…`) and the fleet index (`state/fleet/<cluster>/…`, which each install
 * run writes for its own cluster), read and listed, to narrow each batch's view to its cluster
 * and evaluate the moving rollouts; the rollout records (`state/rollouts/<policy>/<refName>.json`),
 * read and written by compare-and-swap (If-Match, If-None-Match), never deleted: it creates one a
 * run asks for, and records each wave's release, soak, stop or end. No run role holds these but
 * its own cluster's fleet entries: a run taken over cannot advance, stop or start a rollout of
 * the fleet, nor read which clusters another wave names.
 */
export const ROLLOUT_GRANTS: readonly ObjectGrant[] = [
  {
    keys: `${POLICY_PREFIX}*`,
    actions: READ,
    why: 'rollout policies (read only): the waves that gate a PackageInstall, narrowed to its cluster in the batch',
  },
  {
    keys: `${FLEET_PREFIX}*`,
    actions: READ,
    why: "the fleet index (read only): each rollout's members and their health, as the runs write them",
  },
  {
    keys: `${ROLLOUT_PREFIX}*`,
    actions: WRITE,
    why: 'rollout records (conditional writes: If-Match, If-None-Match): created when a run asks, advanced or stopped as the fleet reports',
  },
];

/**
 * The artifact-bucket keys each stage reads and writes (layout: `functions/lib/artifact/keys.ts`
 * for shared keys, `functions/lib/artifact/sealed.ts` for `private/<cluster tag>/<namespace tag>/…`,
 * `functions/lib/packaging/repo-index.ts` for `state/package-repositories/…`, `functions/lib/lease/`
 * for `state/leases/…`, `functions/lib/artifact/single-flight.ts` for `inflight/…`). A stage gets
 * only these prefixes: template cannot overwrite a fetch artifact, deploy writes nothing but its
 * Apps' run leases, sealed deploy records and its fair shares, and install, which talks to the API
 * server and writes no artifact, has its PackageInstalls' fleet index entries, the receipts and
 * rendered manifests (read: a rollout's rollback finds the App's last good render that is still
 * stored) and its fair shares. Every stage has its
 * own fair shares (`state/shares/<stage>/…`).
 */
export const STAGE_OBJECTS: Readonly<Record<PipelineStage, readonly ObjectGrant[]>> = {
  fetch: [
    { keys: 'artifacts/fetch/*', actions: WRITE, why: 'stores fetched tarballs (putIfAbsent)', createOnly: true },
    { keys: 'cache/fetch/*', actions: WRITE, why: 'pinned-fetch records' },
    { keys: 'private/*/fetch/*', actions: SEALED_WRITE, why: 'sealed fetch tarballs and fetch records' },
    { keys: `${INFLIGHT_PREFIX}cache/fetch/*`, actions: IN_FLIGHT, why: 'fleet in-flight markers of pinned fetches' },
    { keys: 'cache/source-poll/*', actions: WRITE, why: "source poll records of Apps' sources (trackAppSources)" },
    { keys: 'artifacts/template/*', actions: READ, why: "a rollback checks the receipt's rendered manifest exists" },
    { keys: 'private/*/template/*', actions: READ, why: "a rollback checks the receipt's sealed manifest exists" },
    RUN_LEASE,
    RECEIPTS,
    sharesGrant('fetch'),
  ],
  template: [
    { keys: 'artifacts/fetch/*', actions: READ, why: 'reads the fetch hand-off' },
    { keys: 'private/*/fetch/*', actions: SEALED_READ, why: 'reads a sealed fetch hand-off' },
    { keys: 'artifacts/template/*', actions: WRITE, why: 'stores rendered manifests (putIfAbsent)', createOnly: true },
    { keys: 'cache/render/*', actions: WRITE, why: 'render cache records' },
    { keys: 'private/*/template/*', actions: SEALED_WRITE, why: 'sealed rendered manifests' },
    { keys: 'private/*/cache/render/*', actions: SEALED_WRITE, why: 'sealed render cache records' },
    { keys: `${INFLIGHT_PREFIX}cache/render/*`, actions: IN_FLIGHT, why: 'fleet in-flight markers of shared renders' },
    RUN_LEASE,
    RECEIPTS,
    sharesGrant('template'),
  ],
  deploy: [
    { keys: 'artifacts/template/*', actions: READ, why: 'reads the manifest to deploy' },
    { keys: 'private/*/template/*', actions: SEALED_READ, why: 'reads a sealed manifest to deploy' },
    {
      keys: 'private/*/state/deploy/*',
      actions: SEALED_WRITE,
      why: 'sealed deploy records: what the last deploy left, for the no-op resync',
    },
    RUN_LEASE,
    RECEIPTS,
    sharesGrant('deploy'),
  ],
  'index-repo': [
    {
      keys: 'artifacts/fetch/*',
      actions: WRITE,
      why: 'fetches the repository bundle (as fetch does)',
      createOnly: true,
    },
    { keys: 'cache/fetch/*', actions: WRITE, why: 'pinned-fetch records' },
    { keys: 'private/*/fetch/*', actions: SEALED_WRITE, why: 'a repository fetched with a Secret' },
    { keys: 'artifacts/index/*', actions: WRITE, why: 'repository indexes and their manifests' },
    { keys: 'cache/index/*', actions: WRITE, why: 'index lookup records' },
    {
      keys: 'cache/source-poll/*',
      actions: WRITE,
      why: 'fleet source poll records (conditional writes: If-Match, If-None-Match)',
    },
    {
      keys: 'state/package-repositories/*',
      actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'],
      why: 'the versions a repository last deployed (removed with the repository)',
    },
    sharesGrant('index-repo'),
  ],
  install: [
    {
      keys: `${FLEET_PREFIX}*`,
      actions: READ_WRITE_DELETE,
      why: "the fleet index: one entry per PackageInstall (written when it changes, removed with it), what the rollouts' waves and the fleet page read",
    },
    {
      keys: `${RECEIPTS_PREFIX}*`,
      actions: READ,
      why: "reconcile receipts (read only): a rollout's rollback finds the App's last good render",
    },
    {
      keys: 'artifacts/template/*',
      actions: READ,
      why: "a rollout's rollback checks the receipt's rendered manifest exists",
    },
    sharesGrant('install'),
  ],
};

/**
 * The prefixes of {@link STAGE_OBJECTS} whose next key segment is the cluster id (run leases
 * `state/leases/<cluster>/…`, receipts `receipts/<cluster>/…`, a repository's deployed versions
 * `state/package-repositories/<cluster>/…`, the fleet index `state/fleet/<cluster>/…`): a cell's
 * functions and a run's session (`./run-policy.ts`) get them for their own cluster only.
 */
export const PER_CLUSTER_PREFIXES = [
  LEASE_PREFIX,
  RECEIPTS_PREFIX,
  'state/package-repositories/',
  FLEET_PREFIX,
] as const;

/**
 * A stage's {@link STAGE_OBJECTS} for the functions of one cluster's cell: each grant of a
 * {@link PER_CLUSTER_PREFIXES} prefix narrowed to `<prefix><clusterId>/*`, the stage's fair shares
 * to its cluster's document and parked records (`state/shares/<stage>/<clusterId>.json` and
 * `…/<clusterId>/*`: IAM's `*` matches `/`, so `<clusterId>*` would also match a cluster whose id
 * begins with this one's), the rest as they are (the shared content-addressed artifacts and
 * caches, and `private/*`, whose next segment is a tag derived from the cell's own root key, not
 * known at synth).
 */
export function cellObjectGrants(stage: PipelineStage, clusterId: string): ObjectGrant[] {
  return STAGE_OBJECTS[stage].flatMap((g) => {
    const only = `${g.why}, of cluster ${clusterId} only`;
    if (g.keys === `${SHARES_PREFIX}${stage}/*`) {
      const at = `${SHARES_PREFIX}${stage}/${clusterId}`;
      return [
        { ...g, keys: `${at}.json`, why: only },
        { ...g, keys: `${at}/*`, why: only },
      ];
    }
    const prefix = PER_CLUSTER_PREFIXES.find((p) => g.keys === `${p}*`);
    return [prefix ? { ...g, keys: `${prefix}${clusterId}/*`, why: only } : g];
  });
}

/**
 * The name pattern of a token cluster's Secrets Manager secret of one stage (`npm run cluster`'s
 * default `kapp-lambda/<id>/<stage>`): of every cluster, or of `clusterId` only (a cell's or a run session's, `./run-policy.ts`).
 */
export function tokenSecretPattern(stage: PipelineStage, clusterId = '*'): string {
  return `kapp-lambda/${clusterId}/${stage}`;
}

/**
 * Days after its last write when a `private/` object is removed: a day after the sealed
 * objects' own expiry (`DEFAULT_PRIVATE_TTL_MS`, 7 days after each write, enforced on read), so
 * only what no reader will open again goes: 8.
 */
export const PRIVATE_EXPIRY_DAYS = DEFAULT_PRIVATE_TTL_MS / 86_400_000 + 1;

/**
 * Prefixes of the artifact bucket with a lifecycle expiry: `artifacts/`, `cache/`, the sharing
 * domains' claims (`d/`, D17) and `receipts/` after context `artifactRetentionDays` (a receipt
 * goes with the renders it names, at the latest), `private/` after {@link PRIVATE_EXPIRY_DAYS}.
 * A domain's in-flight markers (`d/<tag>/inflight/…`) go with `d/`: S3 lifecycle filters match
 * a literal prefix, never one with a wildcard (`d/<any tag>/inflight/`), and a leftover marker is free for the next runner anyway.
 */
export const EXPIRING_PREFIXES = ['artifacts/', 'cache/', DOMAIN_ROOT, 'private/', RECEIPTS_PREFIX] as const;

/**
 * Days after its last write when a run lease (`state/leases/…`, `functions/lib/lease/`) is
 * removed: 30. A held lease is written at least every 100 s (renewed every third of its 5-minute
 * TTL while a stage runs, and on every hand-off), and every event of an App (a resync each sync
 * period) takes it, so a lease unwritten for 30 days is long free: its App is gone, or has had
 * no event for a month. A pending follow-up in it is then moot (the next event of a live App
 * runs it afresh). Only `state/leases/` expires: the rest of `state/` (a repository's deployed
 * versions) is never expired.
 */
export const LEASE_EXPIRY_DAYS = 30;

/**
 * Days after its last write when a fleet in-flight marker (`inflight/…`,
 * `functions/lib/artifact/single-flight.ts`) is removed: 1, S3's shortest expiry. A marker lives
 * 30 s unless its holder renews it and is deleted when its artifact is stored; one left behind (a
 * crashed holder, a failed run's `failed` marker) is already free for the next runner, so the rule
 * only clears leftovers.
 */
export const INFLIGHT_EXPIRY_DAYS = 1;

/** Whether an IAM key pattern of {@link ObjectGrant} (`*` matches anything, `/` included) covers `key`. */
function keyPatternMatches(pattern: string, key: string): boolean {
  const re = pattern
    .split('*')
    .map((part) => part.replace(/[.+?^${}()|[\]\\]/g, '\\$&'))
    .join('.*');
  return new RegExp(`^${re}$`).test(key);
}

/**
 * Why a cluster registry at `prefix` of the artifact bucket would be unsafe, or `undefined`:
 * a cluster document (`<prefix>clusters/<id>.json`) a function could write (whoever writes one
 * points the functions' identities at any endpoint), or one a lifecycle rule would expire.
 */
export function registryPrefixProblem(prefix: string): string | undefined {
  const doc = `${prefix}clusters/x.json`;
  const expiring = [...EXPIRING_PREFIXES, LEASE_PREFIX, INFLIGHT_PREFIX].find((p) => doc.startsWith(p));
  if (expiring) return `the registry must not be under ${expiring}, which expires`;
  for (const [stage, grants] of Object.entries(STAGE_OBJECTS)) {
    const g = grants.find((g) => g.actions.some((a) => a !== 's3:GetObject') && keyPatternMatches(g.keys, doc));
    if (g) return `the ${stage} function may write ${g.keys}, which would hold the registry`;
  }
  return undefined;
}

/** Default of context `artifactRetentionDays`: 30. */
export const DEFAULT_ARTIFACT_RETENTION_DAYS = 30;

/**
 * The stages whose queues the forwarders send to: the `targetFunction` of an object event of
 * each watched kind (App → fetch, PackageInstall → install, PackageRepository → index-repo).
 * Computed from the event contract so a new kind or route cannot drift from the IAM grant.
 */
export const FORWARDER_STAGES: readonly PipelineStage[] = [
  ...new Set(
    KINDS.map((kind) =>
      targetFunction(
        objectEvent(
          {
            clusterId: 'c',
            kind,
            apiVersion: API_VERSIONS[kind],
            namespace: 'n',
            name: 'n',
            uid: 'u',
            generation: 1,
            resourceVersion: '1',
          },
          'resync',
          { time: new Date(0) },
        ),
      ),
    ),
  ),
];

/**
 * The ServiceAccount the forwarder runs as (`infra/forwarder/`): `<namespace>/<name>`. Here,
 * without CDK imports, so `npm run cluster -- join` builds the same trust without loading CDK.
 */
export const FORWARDER_SERVICE_ACCOUNT = { namespace: 'kapp-lambda', name: 'kapp-lambda-forwarder' } as const;

/** Who may assume a forwarder role on EKS, and how: see {@link podIdentityTrust}. */
export interface PodIdentityTrust {
  /** The service principal, EKS Pod Identity's agent. */
  readonly service: 'pods.eks.amazonaws.com';
  /** `sts:TagSession` too: Pod Identity tags the session, and a role that refuses the tags refuses the pod. */
  readonly actions: readonly ['sts:AssumeRole', 'sts:TagSession'];
  /** The condition block of the trust statement (IAM JSON: operator → key → value). */
  readonly conditions: { readonly StringEquals: Readonly<Record<string, string>> };
}

/**
 * The trust of a cluster's forwarder role on EKS: Pod Identity of `account`, for the
 * forwarder's ServiceAccount ({@link FORWARDER_SERVICE_ACCOUNT}) in the cluster `clusterArn`
 * only. The conditions are on the session tags Pod Identity sets (`eks-cluster-arn`,
 * `kubernetes-namespace`, `kubernetes-service-account`), so an association of another cluster
 * or another ServiceAccount with the role gets no credentials. One source for the stack's
 * `podIdentityForwarder` (CDK) and `npm run cluster -- join`'s role (the IAM SDK, no CDK).
 *
 * @param account - the account id (in the stack, its `account` token).
 * @param clusterArn - `arn:<partition>:eks:<region>:<account>:cluster/<name>`.
 */
export function podIdentityTrust(account: string, clusterArn: string): PodIdentityTrust {
  return {
    service: 'pods.eks.amazonaws.com',
    actions: ['sts:AssumeRole', 'sts:TagSession'],
    conditions: {
      StringEquals: {
        'aws:SourceAccount': account,
        'aws:RequestTag/eks-cluster-arn': clusterArn,
        'aws:RequestTag/kubernetes-namespace': FORWARDER_SERVICE_ACCOUNT.namespace,
        'aws:RequestTag/kubernetes-service-account': FORWARDER_SERVICE_ACCOUNT.name,
      },
    },
  };
}
