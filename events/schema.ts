/**
 * The event contract between the forwarder and the functions, and between stages.
 *
 * Every event is a CloudEvents 1.0 structured-mode JSON envelope whose `data` *references* an
 * object (cluster, kind, namespace, name, uid, generation, resourceVersion); functions re-read
 * the latest object before acting, so an event never carries spec, status or secrets. Stage
 * hand-offs add the run being continued and (template, deploy) the keys of the artifacts
 * produced so far. This module owns every event type: {@link parseEvent} is the one parser of
 * a queue body or forwarder event, with errors whose paths start at the envelope root.
 *
 * | type | producer → consumer | data |
 * |---|---|---|
 * | `dev.kapp-lambda.object.v1` | forwarder → fetch (App), install (PackageInstall), index-repo (PackageRepository) | {@link ObjectEventData} |
 * | `dev.kapp-lambda.stage.template.v1` | fetch → template | {@link TemplateStageData} |
 * | `dev.kapp-lambda.stage.deploy.v1` | template → deploy; deploy → deploy (continuation); fetch or template → deploy (inspect after a failure, `afterFailure`); fetch → deploy (a rollback, `rollbackOf`) | {@link DeployStageData} |
 * | `dev.kapp-lambda.stage.delete.v1` | fetch → deploy (an App being deleted) | {@link DeleteStageData} |
 * | `dev.kapp-lambda.repo.indexed.v1` | index-repo → install | {@link RepoIndexedData} |
 * | `dev.kapp-lambda.health.v1` | forwarder → fetch (App) | {@link HealthData} |
 *
 * Functions send object events too: fetch, template and deploy an App's (the run lease's
 * follow-up, a restart) to fetch, index-repo a PackageRepository's `ref-changed` (the source
 * poll) to index-repo, install a PackageInstall's `ref-changed` (the `repo.indexed` fan-out) to
 * install. Who may send which event, and why, is `EMITS` (`functions/lib/entry/sender.ts`),
 * which the functions' sender check enforces.
 *
 * Pure: no I/O, no clock (callers pass `time`), no randomness (ids are derived by hashing).
 *
 * @see https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md
 * @see kapp-controller `pkg/app/app_reconcile.go` (fetch → template → deploy) and
 *   `pkg/reconciler/unique_reconciler.go` (one reconcile per object: the ordering key).
 */
import { createHash } from 'node:crypto';
import * as z from 'zod';
import type { PipelineStage } from '../functions/lib/api/functions.js';
import { formatPath } from '../functions/lib/api/issue-path.js';
import { DNS1123_LABEL_MAX, DNS1123_LABEL_REGEX } from '../functions/lib/api/names.js';
import { StageStatusSummarySchema, TimestampSchema } from '../functions/lib/api/status.js';
import {
  FETCH_KEY_PATTERN,
  INDEX_KEY_PATTERN,
  PRIVATE_FETCH_KEY_PATTERN,
  PRIVATE_TEMPLATE_KEY_PATTERN,
  TEMPLATE_KEY_PATTERN,
} from '../functions/lib/artifact/keys.js';
import { RECEIPT_ID_PATTERN, ReceiptTrailSchema } from '../functions/lib/receipt/receipt.js';

/** Kinds the forwarder watches. */
export const KINDS = ['App', 'PackageInstall', 'PackageRepository'] as const;
/** A watched kind. */
export type Kind = (typeof KINDS)[number];

/** apiVersion of each kind, as served by kapp-controller's CRDs. */
export const API_VERSIONS: Readonly<Record<Kind, string>> = {
  App: 'kappctrl.k14s.io/v1alpha1',
  PackageInstall: 'packaging.carvel.dev/v1alpha1',
  PackageRepository: 'packaging.carvel.dev/v1alpha1',
};

/**
 * Why the forwarder emitted an object event: a watch `added`/`modified`/`deleted`, a timer
 * `resync` (syncPeriod elapsed or backoff expired), or `ref-changed` (something the object
 * refers to changed, e.g. a values Secret or a new Package version).
 */
export const REASONS = ['added', 'modified', 'deleted', 'resync', 'ref-changed'] as const;
/** An object event reason. */
export type Reason = (typeof REASONS)[number];

/**
 * Rank of each {@link Reason} when two events for one object merge into one (the forwarder's
 * outbox and the embedded runtime's coalescer): the higher rank is kept
 * (`deleted` 4 > `added` 3 > `ref-changed` 2 > `modified` 1 > `resync` 0), see
 * {@link strongerReason}.
 *
 * Why this order: the merged event must still make the pipeline do everything either event
 * asked for. `deleted` is never lost to anything. `added` and `ref-changed` force a run even
 * when the spec is unchanged and the App is not due (`pipeline/app/reconcile.ts`), `modified` and
 * `resync` do not (a spec change is seen by comparing `observedGeneration` with the live
 * object, whatever the reason), so a forcing reason must outrank a non-forcing one: a status-only
 * `modified` arriving behind a `ref-changed` must not turn a changed Secret into a no-op.
 */
export const REASON_RANK: Readonly<Record<Reason, number>> = Object.freeze({
  resync: 0,
  modified: 1,
  'ref-changed': 2,
  added: 3,
  deleted: 4,
});

/**
 * The reason kept when a pending event for an object merges with a newer one: the
 * higher-ranked by {@link REASON_RANK}, and `next` on a tie.
 */
export function strongerReason(pending: Reason, next: Reason): Reason {
  return REASON_RANK[pending] > REASON_RANK[next] ? pending : next;
}

/** CloudEvents `type` of every event kapp-lambda emits. */
export const EVENT_TYPES = {
  object: 'dev.kapp-lambda.object.v1',
  template: 'dev.kapp-lambda.stage.template.v1',
  deploy: 'dev.kapp-lambda.stage.deploy.v1',
  delete: 'dev.kapp-lambda.stage.delete.v1',
  repoIndexed: 'dev.kapp-lambda.repo.indexed.v1',
  health: 'dev.kapp-lambda.health.v1',
} as const;
/** One of {@link EVENT_TYPES}. */
export type EventType = (typeof EVENT_TYPES)[keyof typeof EVENT_TYPES];

/**
 * `type` of the source poll event: the index-repo function resolves the fleet's polled
 * PackageRepository sources whose record is older than the poll period and reconciles the
 * repositories behind (`functions/lib/pipeline/source-poll.ts`). Not a {@link KappEvent} (it is
 * about no object and never goes through a queue): on Lambda an EventBridge Scheduler schedule
 * invokes the index-repo function directly with the constant input {@link SourcePollEvent},
 * e.g. `rate(1 minute)`.
 */
export const SOURCE_POLL_EVENT_TYPE = 'dev.kapp-lambda.source.poll.v1';

/** The source poll event, `{ "type": "dev.kapp-lambda.source.poll.v1" }`. */
export interface SourcePollEvent {
  readonly type: typeof SOURCE_POLL_EVENT_TYPE;
}

/** Whether a Lambda invocation's payload is the {@link SourcePollEvent}. */
export function isSourcePollEvent(payload: unknown): payload is SourcePollEvent {
  return isScheduledInput(payload, SOURCE_POLL_EVENT_TYPE);
}

/**
 * Whether `payload` is a schedule's constant input of `type` (`{ "type": … }`), not an SQS
 * batch (which has `Records`): the one shape every direct invocation of a schedule has.
 */
function isScheduledInput(payload: unknown, type: string): boolean {
  return (
    typeof payload === 'object' &&
    payload !== null &&
    (payload as { type?: unknown }).type === type &&
    !('Records' in payload)
  );
}

/**
 * `type` of the rollout check event (issue 28, the cloud mode): the install dispatcher
 * evaluates the fleet's moving rollouts (`state/rollouts/…`) against the fleet index
 * (`state/fleet/…`), records a wave's release, soak or end by compare-and-swap, and pokes the
 * PackageInstalls it concerns (`ref-changed` to its own install queue). What a paused, resumed or
 * aborted rollout (the CLI writes only the record) and a soak that ended with no event after it
 * need. Not a {@link KappEvent} (it is about no object and never goes through a queue): on Lambda
 * an EventBridge Scheduler schedule of the shared stack invokes the install dispatcher directly
 * with the constant input {@link RolloutCheckEvent} every minute; cells have none (their installs
 * are not gated).
 */
export const ROLLOUT_CHECK_EVENT_TYPE = 'dev.kapp-lambda.rollout.check.v1';

/** The rollout check event, `{ "type": "dev.kapp-lambda.rollout.check.v1" }`. */
export interface RolloutCheckEvent {
  readonly type: typeof ROLLOUT_CHECK_EVENT_TYPE;
}

/** Whether a Lambda invocation's payload is the {@link RolloutCheckEvent}. */
export function isRolloutCheckEvent(payload: unknown): payload is RolloutCheckEvent {
  return isScheduledInput(payload, ROLLOUT_CHECK_EVENT_TYPE);
}

/**
 * Functions events are delivered to: {@link PipelineStage}, the one list of functions
 * (`PIPELINE_STAGES` in `functions/lib/api/functions.ts`), so every event's target has a queue.
 */
export type FunctionName = PipelineStage;

/** The function an object event of each kind goes to (the entry of its pipeline). */
export const KIND_FUNCTION: Readonly<Record<Kind, FunctionName>> = Object.freeze({
  App: 'fetch',
  PackageInstall: 'install',
  PackageRepository: 'index-repo',
});

/** Largest serialized event {@link parseEvent} accepts: 256 KiB (the SQS and Lambda async payload limit). */
export const MAX_EVENT_BYTES = 256 * 1024;
/** Longest ordering key: SQS FIFO `MessageGroupId` allows 128 characters. */
export const MAX_ORDERING_KEY_CHARS = 128;

// ---------------------------------------------------------------------------------------
// Field schemas

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const TOKEN = /^[A-Za-z0-9][A-Za-z0-9._:-]*$/;

const dnsLabel = z.string().max(DNS1123_LABEL_MAX).regex(DNS1123_LABEL_REGEX, { error: 'expected a DNS-1123 label' });
const dnsSubdomain = z.string().max(253).regex(DNS_SUBDOMAIN, { error: 'expected a DNS-1123 subdomain' });
const token = (max: number) =>
  z.string().min(1).max(max).regex(TOKEN, { error: 'expected letters, digits and ._:- only' });
const generation = z.number().int().min(0);

/**
 * A reference to one watched object in one cluster. Shape:
 * `{ clusterId, kind, apiVersion, namespace, name, uid, generation, resourceVersion }`.
 *
 * - `clusterId`: DNS-1123 label naming the cluster in the fleet (≤ 63 chars);
 * - `apiVersion` must be {@link API_VERSIONS}`[kind]`;
 * - `namespace`: DNS-1123 label; `name`: DNS-1123 subdomain (≤ 253 chars);
 * - `uid`: `metadata.uid` (≤ 128 chars of `[A-Za-z0-9._:-]`);
 * - `generation`: `metadata.generation`, integer ≥ 0;
 * - `resourceVersion`: opaque `metadata.resourceVersion` (≤ 128 chars of `[A-Za-z0-9._:-]`).
 */
export const ObjectRefSchema = z.strictObject({
  clusterId: dnsLabel,
  kind: z.enum(KINDS),
  apiVersion: z.string().min(1).max(128),
  namespace: dnsLabel,
  name: dnsSubdomain,
  uid: token(128),
  generation,
  resourceVersion: token(128),
});
/** See {@link ObjectRefSchema}. */
export type ObjectRef = z.infer<typeof ObjectRefSchema>;

/** The fields of an {@link ObjectRef} that identify the object (see {@link orderingKey}). */
export type ObjectIdentity = Pick<ObjectRef, 'clusterId' | 'kind' | 'namespace' | 'name'>;

/**
 * How an object event's `cause` starts when the forwarder saw drift in what the object deployed
 * (`events/forwarder/drift.ts`): `drift: <apiVersion> <Kind> <ns>/<name> <modified|deleted|...>`.
 * The reconcile it asks for logs it and writes Event `DriftDetected`.
 */
export const DRIFT_CAUSE_PREFIX = 'drift: ';

/**
 * How an App's `ref-changed` `cause` starts when the fleet's source poll saw a source it fetches
 * move (`functions/lib/pipeline/source-poll.ts`): `source moved: <kind> <url> <ref>@<commit or
 * digest>`. The reconcile it asks for logs it.
 */
export const SOURCE_MOVED_CAUSE_PREFIX = 'source moved: ';

/**
 * How an App's `ref-changed` `cause` starts when the fleet's source poll could not resolve a
 * source it fetches (`functions/lib/pipeline/source-poll.ts`): `source poll failed: <kind> <url>
 * <ref>`. The run then resolves the source itself and, failing too, fetches by ref and reports
 * the failure in status, as upstream's next sync would.
 */
export const SOURCE_FAILED_CAUSE_PREFIX = 'source poll failed: ';

/**
 * `data` of `dev.kapp-lambda.object.v1`: an {@link ObjectRef} plus the {@link Reason} and, when
 * the forwarder knows one, the `cause` beyond the object's own state (≤ 512 characters, e.g.
 * `drift: apps/v1 Deployment ns/name modified`, `Secret/<name>@<rv>`), which the reconcile logs
 * and reports. Optional: events of forwarders that do not send it stay valid.
 */
export const ObjectEventDataSchema = ObjectRefSchema.extend({
  reason: z.enum(REASONS),
  cause: z.string().min(1).max(512).optional(),
});
/** See {@link ObjectEventDataSchema}. */
export type ObjectEventData = z.infer<typeof ObjectEventDataSchema>;

/**
 * The reconcile run a stage event continues: `{ generation, runId, startedAt }`.
 *
 * - `generation`: the object's generation the run started for (fencing: a run whose
 *   generation is older than the live object's must not overwrite newer status);
 * - `runId`: ≤ 128 chars of `[A-Za-z0-9._:-]`, the same for every stage of one run;
 * - `startedAt`: RFC 3339 time the run's first stage started;
 * - `lease` (Lambda): set while the run is optimistic, holding no run lease: the version of the
 *   App's free lease its first stage saw (`functions/lib/lease/` `OptimisticRun`), ≤ 256 printable
 *   ASCII characters (an S3 ETag, or `absent`).
 */
export const StageRunSchema = z.strictObject({
  generation,
  runId: token(128),
  startedAt: TimestampSchema,
  lease: z
    .string()
    .regex(/^[\x21-\x7e]{1,256}$/)
    .optional(),
});
/** See {@link StageRunSchema}. */
export type StageRun = z.infer<typeof StageRunSchema>;

// Shared (fleet-wide, content-addressed) or private (sealed per cluster, artifact/sealed.ts) keys.
const fetchKey = z.string().refine((k) => FETCH_KEY_PATTERN.test(k) || PRIVATE_FETCH_KEY_PATTERN.test(k), {
  error: 'expected artifacts/fetch/sha256/<hex>.tgz or a private fetch key',
});
const manifestKey = z.string().refine((k) => TEMPLATE_KEY_PATTERN.test(k) || PRIVATE_TEMPLATE_KEY_PATTERN.test(k), {
  error: 'expected artifacts/template/sha256/<hex>.yaml or a private template key',
});
const indexKey = z.string().regex(INDEX_KEY_PATTERN, { error: 'expected artifacts/index/sha256/<hex>.json' });

/**
 * `data` of `dev.kapp-lambda.stage.template.v1` (fetch → template):
 * `{ object, run, artifacts: { fetchKey }, fetchStatus? }`. `object.kind` must be `App`.
 * `fetchKey` is the `artifacts/fetch/sha256/<hex>.tgz` key of the fetched tarball, or its
 * `private/<cluster tag>/<namespace tag>/fetch/<mac>.tgz` key when a Secret went into it.
 */
export const TemplateStageDataSchema = z.strictObject({
  object: ObjectRefSchema,
  run: StageRunSchema,
  artifacts: z.strictObject({ fetchKey }),
  fetchStatus: StageStatusSummarySchema.optional(),
  receipt: ReceiptTrailSchema.optional(),
});
/** See {@link TemplateStageDataSchema}. */
export type TemplateStageData = z.infer<typeof TemplateStageDataSchema>;

/**
 * Most follow-up invocations of one deploy ({@link DeployStageData} `continuation.count`): 1000,
 * a guard only (kapp's cumulative `--wait-timeout` ends a deploy long before: 1000 continuations
 * of a 15-minute function are about ten days).
 */
export const MAX_DEPLOY_CONTINUATIONS = 1000;

/** The stages whose failure an App run may hand to the deploy function for `kapp inspect` ({@link DeployStageData} `afterFailure`). */
export const INSPECT_AFTER_STAGES = ['fetch', 'template'] as const;

/**
 * `data` of `dev.kapp-lambda.stage.deploy.v1` (template → deploy, deploy → deploy to continue, or fetch/template → deploy to inspect after a failure):
 * `{ object, run, artifacts: { fetchKey?, manifestKey? }, fetchStatus?, templateStatus?, continuation?, afterFailure?, rollbackOf? }`.
 * `object.kind` must be `App`. `manifestKey` is the `artifacts/template/sha256/<hex>.yaml` key
 * of the rendered manifest (or its private `private/.../template/<mac>.yaml` key); `fetchKey`
 * is kept for receipts. `receipt` (here and in {@link TemplateStageDataSchema}) is what the run's
 * stages measured so far (`ReceiptTrailSchema`, `functions/lib/receipt/receipt.ts`), for the
 * receipt the run's last stage keeps. `continuation` is set on the deploy function's own follow-up, when the
 * function deadline stopped kapp while it waited: `count` (1-based) of follow-ups so far (at most
 * {@link MAX_DEPLOY_CONTINUATIONS}), `deployStartedAt` when the run's first kapp started (the
 * `status.deploy.startedAt` kept, and the start of kapp's wait budget).
 *
 * `afterFailure` (fetch → deploy, template → deploy; then no `manifestKey` and no continuation):
 * the run failed at that stage after an earlier deploy, and only the deploy function holds the
 * cluster access `kapp inspect` needs. Upstream's `reconcileDeploy` inspects whenever
 * `status.deploy` exists, whatever stage failed (reference §3.2, §3.8.4), and writes the failure
 * and `status.inspect` in one final status: the deploy function runs inspect only and writes that
 * final status, its failure read from the failed stage's part (`fetchStatus`/`templateStatus`).
 *
 * `rollbackOf` (fetch → deploy, `functions/lib/pipeline/app/rollback.ts`): the run rolls the App back
 * to that receipt's render, `manifestKey`; the deploy function applies it only while the App's
 * `kapp-lambda.carvel.dev/rollback-to` names that receipt and the receipt holds that render, since
 * the fetch function hands on no other manifest.
 */
export const DeployStageDataSchema = z
  .strictObject({
    object: ObjectRefSchema,
    run: StageRunSchema,
    artifacts: z.strictObject({ fetchKey: fetchKey.optional(), manifestKey: manifestKey.optional() }),
    fetchStatus: StageStatusSummarySchema.optional(),
    templateStatus: StageStatusSummarySchema.optional(),
    receipt: ReceiptTrailSchema.optional(),
    continuation: z
      .strictObject({ count: z.number().int().min(1).max(MAX_DEPLOY_CONTINUATIONS), deployStartedAt: TimestampSchema })
      .optional(),
    afterFailure: z.enum(INSPECT_AFTER_STAGES).optional(),
    rollbackOf: z.string().regex(RECEIPT_ID_PATTERN).optional(),
  })
  .refine((d) => d.rollbackOf === undefined || d.artifacts.manifestKey !== undefined, {
    error: "a rollback deploys a receipt's manifest: expected artifacts.manifestKey",
  })
  .refine((d) => (d.afterFailure === undefined) !== (d.artifacts.manifestKey === undefined), {
    error: 'expected artifacts.manifestKey (a deploy) or afterFailure (an inspect after a failed stage), not both',
  })
  .refine((d) => d.afterFailure === undefined || d.continuation === undefined, {
    error: 'an inspect after a failed stage has no continuation',
  });
/** See {@link DeployStageDataSchema}. */
export type DeployStageData = z.infer<typeof DeployStageDataSchema>;

/**
 * `data` of `dev.kapp-lambda.stage.delete.v1` (the fetch function's reconcile step → deploy),
 * for an App whose deletion started and that carries our finalizer: `{ object, run }`.
 * `object.kind` must be `App`. It goes to the deploy function because only that function
 * holds the credentials `kapp delete` needs.
 */
export const DeleteStageDataSchema = z.strictObject({
  object: ObjectRefSchema,
  run: StageRunSchema,
});
/** See {@link DeleteStageDataSchema}. */
export type DeleteStageData = z.infer<typeof DeleteStageDataSchema>;

/** Most refNames one `repo.indexed` event lists; a larger change omits `changes` (everything changed). */
export const MAX_INDEXED_CHANGES = 1000;
/** Most versions one refName of a `repo.indexed` event lists. */
export const MAX_INDEXED_VERSIONS = 200;

/**
 * `data` of `dev.kapp-lambda.repo.indexed.v1` (index-repo → install): a repository reconcile
 * deployed Packages that differ from what it deployed before,
 * `{ object, run, artifacts: { indexKey? }, changes? }`. `object.kind` must be
 * `PackageRepository`; `indexKey` is `artifacts/index/sha256/<hex>.json` of the index deployed
 * (absent for a repository fetched with a Secret, never indexed for the fleet, and for a
 * deleted one); `changes` lists each refName whose versions were added or removed, with those
 * versions (at most {@link MAX_INDEXED_CHANGES} refNames of {@link MAX_INDEXED_VERSIONS}
 * versions; absent: treat every refName as changed). The install function sends a
 * `ref-changed` object event to every PackageInstall in scope these changes may move
 * (`functions/lib/pipeline/install/install-fanout.ts`).
 */
export const RepoIndexedDataSchema = z.strictObject({
  object: ObjectRefSchema,
  run: StageRunSchema,
  artifacts: z.strictObject({ indexKey: indexKey.optional() }),
  changes: z
    .array(
      z.strictObject({
        refName: dnsSubdomain,
        versions: z.array(z.string().min(1).max(256)).min(1).max(MAX_INDEXED_VERSIONS),
      }),
    )
    .max(MAX_INDEXED_CHANGES)
    .optional(),
});
/** See {@link RepoIndexedDataSchema}. */
export type RepoIndexedData = z.infer<typeof RepoIndexedDataSchema>;

/** Most unhealthy resources one `health` event names ({@link HealthDataSchema}). */
export const MAX_HEALTH_UNHEALTHY = 5;

/** `status` values of a `health` event: the App's `kapp-lambda.carvel.dev/Healthy` condition status. */
export const HEALTH_STATUSES = ['True', 'False', 'Unknown'] as const;
/** `reason` values of a `health` event, one per {@link HEALTH_STATUSES} value in that order. */
export const HEALTH_REASONS = ['Healthy', 'Unhealthy', 'Progressing'] as const;

/**
 * `data` of `dev.kapp-lambda.health.v1` (forwarder → fetch): the health of what an App deployed,
 * as the forwarder's watches of its workloads judge it (`events/forwarder/health.ts`),
 * `{ object, status, reason, unhealthy }`. `object.kind` must be `App` (its `generation` fences
 * the condition write: a newer spec's health is not known yet); `status` `True` (reason `Healthy`),
 * `False` (`Unhealthy`: a workload failed) or `Unknown` (`Progressing`: one is still rolling out);
 * `unhealthy`: at most {@link MAX_HEALTH_UNHEALTHY} workloads that are not healthy, failed ones
 * first, each `{ kind, namespace ('' when cluster-scoped), name, why }` (`why` ≤ 256
 * characters, e.g. `Available=False (MinimumReplicasUnavailable)`). Names a resource of the
 * App's own cluster, never a spec or status value beyond the workload's conditions' reasons.
 */
export const HealthDataSchema = z
  .strictObject({
    object: ObjectRefSchema,
    status: z.enum(HEALTH_STATUSES),
    reason: z.enum(HEALTH_REASONS),
    unhealthy: z
      .array(
        z.strictObject({
          kind: z.string().min(1).max(63),
          namespace: z.union([z.literal(''), dnsLabel]),
          name: dnsSubdomain,
          why: z.string().min(1).max(256),
        }),
      )
      .max(MAX_HEALTH_UNHEALTHY),
  })
  .refine((d) => HEALTH_REASONS[HEALTH_STATUSES.indexOf(d.status)] === d.reason, {
    error: 'expected reason Healthy for True, Unhealthy for False, Progressing for Unknown',
  })
  .refine((d) => (d.status === 'True') === (d.unhealthy.length === 0), {
    error: 'expected unhealthy resources exactly when status is not True',
  });
/** See {@link HealthDataSchema}. */
export type HealthData = z.infer<typeof HealthDataSchema>;

/**
 * The message of the App condition a {@link HealthData} is written as: `all workloads healthy`,
 * or the unhealthy resources, `; `-joined, each `<Kind> <ns>/<name>: <why>`. One function for the
 * forwarder (which compares it with the App's current condition before it sends) and the fetch
 * function (which writes it), so both agree on when the condition changed.
 */
export function healthMessage(data: Pick<HealthData, 'unhealthy'>): string {
  if (data.unhealthy.length === 0) return 'all workloads healthy';
  return data.unhealthy.map((u) => `${u.kind} ${u.namespace ? `${u.namespace}/` : ''}${u.name}: ${u.why}`).join('; ');
}

// ---------------------------------------------------------------------------------------
// Envelope

/** CloudEvents extension attribute names: lowercase letters and digits, at most 20. */
const EXTENSION_NAME = /^[a-z0-9]{1,20}$/;
const extensionValue = z.union([z.string().max(1024), z.number().int(), z.boolean()]);

function envelope<T extends EventType, D extends z.ZodType>(type: T, data: D) {
  return z
    .object({
      specversion: z.literal('1.0'),
      id: token(128),
      source: z.string().min(1).max(1024).regex(/^\S+$/, { error: 'expected a URI-reference without whitespace' }),
      type: z.literal(type),
      time: TimestampSchema,
      datacontenttype: z.literal('application/json'),
      subject: z.string().min(1).max(1024),
      dataschema: z.url().max(1024).optional(),
      data,
    })
    .catchall(extensionValue);
}

const ObjectEventSchema = envelope(EVENT_TYPES.object, ObjectEventDataSchema);
const TemplateStageEventSchema = envelope(EVENT_TYPES.template, TemplateStageDataSchema);
const DeployStageEventSchema = envelope(EVENT_TYPES.deploy, DeployStageDataSchema);
const DeleteStageEventSchema = envelope(EVENT_TYPES.delete, DeleteStageDataSchema);
const RepoIndexedEventSchema = envelope(EVENT_TYPES.repoIndexed, RepoIndexedDataSchema);
const HealthEventSchema = envelope(EVENT_TYPES.health, HealthDataSchema);

/**
 * The CloudEvents 1.0 structured-mode envelope shared by every event. Extension attributes
 * (`[a-z0-9]{1,20}` → string | integer | boolean) are accepted and kept by {@link parseEvent}
 * but not part of the static type; read them with a cast.
 */
export interface EventEnvelope<T extends EventType, D> {
  /** Always `1.0`. */
  readonly specversion: '1.0';
  /** Unique per event from one source (≤ 128 chars of `[A-Za-z0-9._:-]`); usable as a dedup id. */
  readonly id: string;
  /** URI-reference of the producer, e.g. `/kapp-lambda/functions/fetch`. */
  readonly source: string;
  /** One of {@link EVENT_TYPES}; selects the shape of `data`. */
  readonly type: T;
  /** RFC 3339 time the event was produced. */
  readonly time: string;
  /** Always `application/json`. */
  readonly datacontenttype: 'application/json';
  /** {@link subjectOf} the referenced object. */
  readonly subject: string;
  /** Optional URL of the data schema. */
  readonly dataschema?: string;
  /** The payload: a reference to the object (and, for stage events, the run and artifact keys). */
  readonly data: D;
}

/** `dev.kapp-lambda.object.v1`: forwarder → entry function of the object's kind. */
export type ObjectEvent = EventEnvelope<typeof EVENT_TYPES.object, ObjectEventData>;
/** `dev.kapp-lambda.stage.template.v1`: fetch → template. */
export type TemplateStageEvent = EventEnvelope<typeof EVENT_TYPES.template, TemplateStageData>;
/** `dev.kapp-lambda.stage.deploy.v1`: template → deploy. */
export type DeployStageEvent = EventEnvelope<typeof EVENT_TYPES.deploy, DeployStageData>;
/** `dev.kapp-lambda.stage.delete.v1`: fetch → deploy, for an App being deleted. */
export type DeleteStageEvent = EventEnvelope<typeof EVENT_TYPES.delete, DeleteStageData>;
/** `dev.kapp-lambda.repo.indexed.v1`: index-repo → install. */
export type RepoIndexedEvent = EventEnvelope<typeof EVENT_TYPES.repoIndexed, RepoIndexedData>;
/** `dev.kapp-lambda.health.v1`: forwarder → fetch, an App's health after deploy. */
export type HealthEvent = EventEnvelope<typeof EVENT_TYPES.health, HealthData>;
/** Any kapp-lambda event. Narrow on `type`. */
export type KappEvent =
  | ObjectEvent
  | TemplateStageEvent
  | DeployStageEvent
  | DeleteStageEvent
  | RepoIndexedEvent
  | HealthEvent;

/** The object an event's `data` refers to (flat in object events, `data.object` otherwise). */
export function objectRefOf(event: KappEvent): ObjectRef {
  if (event.type === EVENT_TYPES.object) {
    const { reason: _reason, ...ref } = event.data;
    return ref;
  }
  return event.data.object;
}

/** Cross-field rules (all reported with their path from the event root). */
function crossCheck(event: KappEvent, ctx: z.RefinementCtx): void {
  for (const key of Object.keys(event)) {
    if (!KNOWN_ATTRIBUTES.has(key) && !EXTENSION_NAME.test(key)) {
      ctx.addIssue({ code: 'custom', path: [key], message: 'unrecognized key' });
    }
  }
  const isObject = event.type === EVENT_TYPES.object;
  const ref = objectRefOf(event);
  // Zod runs this even when fields failed; cross-field rules only make sense on a valid ref.
  if (!ObjectRefSchema.safeParse(ref).success) return;
  const refPath = isObject ? ['data'] : ['data', 'object'];
  const wantKind: Kind | undefined =
    event.type === EVENT_TYPES.template ||
    event.type === EVENT_TYPES.deploy ||
    event.type === EVENT_TYPES.delete ||
    event.type === EVENT_TYPES.health
      ? 'App'
      : event.type === EVENT_TYPES.repoIndexed
        ? 'PackageRepository'
        : undefined;
  if (wantKind && ref.kind !== wantKind) {
    ctx.addIssue({
      code: 'custom',
      path: [...refPath, 'kind'],
      message: `expected "${wantKind}", received "${ref.kind}"`,
    });
  }
  const wantApi = API_VERSIONS[ref.kind];
  if (ref.apiVersion !== wantApi) {
    ctx.addIssue({
      code: 'custom',
      path: [...refPath, 'apiVersion'],
      message: `expected "${wantApi}" for kind ${ref.kind}, received ${describe(ref.apiVersion)}`,
    });
  }
  const wantSubject = subjectOf(ref);
  if (event.subject !== wantSubject) {
    ctx.addIssue({
      code: 'custom',
      path: ['subject'],
      message: `expected "${wantSubject}" (cluster/kind/namespace/name of the object)`,
    });
  }
}

const KNOWN_ATTRIBUTES = new Set([
  'specversion',
  'id',
  'source',
  'type',
  'time',
  'datacontenttype',
  'subject',
  'dataschema',
  'data',
]);

/**
 * Zod schema of any kapp-lambda event (discriminated on `type`), with the cross-field rules:
 * stage events (template, deploy, delete) refer to an `App`, repo.indexed to a `PackageRepository`; `apiVersion` matches
 * the kind; `subject` is {@link subjectOf} the object; extension attributes are named
 * `[a-z0-9]{1,20}` and hold a string, integer or boolean. Prefer {@link parseEvent}, which
 * never throws and formats errors.
 */
export const KappEventSchema = z
  .discriminatedUnion('type', [
    ObjectEventSchema,
    TemplateStageEventSchema,
    DeployStageEventSchema,
    DeleteStageEventSchema,
    RepoIndexedEventSchema,
    HealthEventSchema,
  ])
  .superRefine((e, ctx) => crossCheck(e as KappEvent, ctx));

// ---------------------------------------------------------------------------------------
// Identity helpers

/**
 * `clusterId/kind/namespace/name`, e.g. `prod-eu-1/App/default/simple-app`: the CloudEvents
 * `subject` of every event about the object. Unambiguous: no component contains `/`.
 */
export function subjectOf(ref: ObjectIdentity): string {
  return `${ref.clusterId}/${ref.kind}/${ref.namespace}/${ref.name}`;
}

/**
 * The ordering key of an object: events with the same key are delivered one at a time, in
 * order (the transport's message group; kapp-controller's UniqueReconciler key plus the
 * cluster). It is {@link subjectOf} when that fits {@link MAX_ORDERING_KEY_CHARS} (128) and
 * otherwise `sha256-<64 hex of the subject>`, so it is always a valid SQS `MessageGroupId`.
 */
export function orderingKey(ref: ObjectIdentity): string {
  const s = subjectOf(ref);
  if (s.length <= MAX_ORDERING_KEY_CHARS) return s;
  return `sha256-${createHash('sha256').update(s).digest('hex')}`;
}

/**
 * The function an event is delivered to: object events go to the entry function of their
 * kind (App → `fetch`, PackageInstall → `install`, PackageRepository → `index-repo`), stage
 * events to their stage, the delete hand-off to `deploy` (the function that holds the
 * credentials `kapp delete` needs), repo.indexed to `install`, health to `fetch` (the one
 * function that writes App status).
 */
export function targetFunction(event: KappEvent): FunctionName {
  switch (event.type) {
    case EVENT_TYPES.object:
      return KIND_FUNCTION[event.data.kind];
    case EVENT_TYPES.template:
      return 'template';
    case EVENT_TYPES.deploy:
    case EVENT_TYPES.delete:
      return 'deploy';
    case EVENT_TYPES.repoIndexed:
      return 'install';
    case EVENT_TYPES.health:
      return 'fetch';
  }
}

// ---------------------------------------------------------------------------------------
// Parsing

/** Result of {@link parseEvent}. */
export type ParseEventResult = { ok: true; event: KappEvent } | { ok: false; error: string };

/** How many problems {@link parseEvent} lists before summarizing the rest. */
const MAX_REPORTED_ISSUES = 5;

/**
 * Validates an event at the edge. Never throws, whatever `input` is.
 *
 * @param input the parsed JSON value, or its serialized form as a string, `Buffer` or
 *   `Uint8Array` (UTF-8, at most {@link MAX_EVENT_BYTES}).
 * @returns `{ ok: true, event }`, or `{ ok: false, error }` where `error` names each bad
 *   field by its path from the event root, e.g. `data.generation: expected number, received
 *   string`; several problems are joined with `; ` (at most 5, then `(+N more)`). Problems
 *   with the input as a whole use the path `(root)`. Values are never echoed except short
 *   enum-like strings, so errors are safe to log.
 */
export function parseEvent(input: unknown): ParseEventResult {
  try {
    let value = input;
    if (typeof value === 'string' || value instanceof Uint8Array) {
      const size = typeof value === 'string' ? value.length : value.byteLength;
      // A string's UTF-8 size is at least its length, so this also bounds the work below.
      if (size > MAX_EVENT_BYTES || (typeof value === 'string' && Buffer.byteLength(value) > MAX_EVENT_BYTES)) {
        return { ok: false, error: `(root): event exceeds ${MAX_EVENT_BYTES} bytes` };
      }
      const text = typeof value === 'string' ? value : Buffer.from(value).toString('utf8');
      try {
        value = JSON.parse(text);
      } catch {
        return { ok: false, error: '(root): not valid JSON' };
      }
    }
    const r = KappEventSchema.safeParse(value, { reportInput: true });
    if (r.success) return { ok: true, event: r.data as KappEvent };
    return { ok: false, error: formatIssues(r.error.issues, value) };
  } catch (e) {
    // Hostile inputs (throwing getters, revoked proxies) end up here.
    return { ok: false, error: `(root): could not be read (${e instanceof Error ? e.name : typeof e})` };
  }
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number' && Number.isNaN(v)) return 'NaN';
  if (typeof v === 'string' && v.length <= 64 && /^[\x20-\x7e]*$/.test(v)) return JSON.stringify(v);
  return typeof v;
}

function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number' && Number.isNaN(v)) return 'NaN';
  return typeof v;
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v = root;
  for (const seg of path) {
    if (v === null || typeof v !== 'object') return undefined;
    v = (v as Record<PropertyKey, unknown>)[seg];
  }
  return v;
}

function issueMessage(iss: z.core.$ZodIssue, root: unknown): string {
  const received = valueAt(root, iss.path);
  switch (iss.code) {
    case 'invalid_type':
      if (iss.expected === 'int') return `expected integer, received ${typeName(received)}`;
      return `expected ${iss.expected}, received ${typeName(received)}`;
    case 'invalid_value': {
      const vals = iss.values.map((v) => JSON.stringify(v)).join(' | ');
      return `expected ${iss.values.length === 1 ? vals : `one of ${vals}`}, received ${describe(received)}`;
    }
    case 'invalid_union':
      if ('discriminator' in iss || iss.errors.length === 0) {
        const opts = (iss as { options?: unknown[] }).options;
        const list = Array.isArray(opts) ? opts.map((o) => JSON.stringify(o)).join(' | ') : 'a known value';
        return `expected one of ${list}, received ${describe(received)}`;
      }
      {
        // A union of primitive types (extension attributes): name every accepted type.
        const expected = iss.errors.flatMap((branch) =>
          branch
            .filter((b) => b.code === 'invalid_type' && b.path.length === 0)
            .map((b) => (b as { expected: string }).expected),
        );
        const list = expected.length > 0 ? [...new Set(expected)].join(' | ') : 'a matching value';
        return `expected ${list}, received ${typeName(received)}`;
      }
    case 'too_big':
    case 'too_small': {
      const bound = iss.code === 'too_big' ? iss.maximum : iss.minimum;
      const word = iss.code === 'too_big' ? 'at most' : 'at least';
      const plural = Number(bound) === 1 ? '' : 's';
      if (iss.origin === 'string') return `expected ${word} ${String(bound)} character${plural}`;
      if (iss.origin === 'array') return `expected ${word} ${String(bound)} item${plural}`;
      return `expected ${iss.code === 'too_big' ? '<=' : '>='} ${String(bound)}, received ${String(received)}`;
    }
    default:
      return iss.message;
  }
}

function formatIssues(issues: readonly z.core.$ZodIssue[], root: unknown): string {
  const lines: string[] = [];
  const seen = new Set<string>();
  // One problem per field: the first (a too-long name is not also reported as malformed).
  const add = (path: string, message: string) => {
    if (seen.has(path)) return;
    seen.add(path);
    lines.push(`${path}: ${message}`);
  };
  for (const iss of issues) {
    if (iss.code === 'unrecognized_keys') {
      for (const k of iss.keys) add(formatPath([...iss.path, k]), 'unrecognized key');
    } else {
      add(formatPath(iss.path) || '(root)', issueMessage(iss, root));
    }
  }
  const shown = lines.slice(0, MAX_REPORTED_ISSUES).join('; ');
  return lines.length > MAX_REPORTED_ISSUES ? `${shown}; (+${lines.length - MAX_REPORTED_ISSUES} more)` : shown;
}

// ---------------------------------------------------------------------------------------
// Builders

/** Envelope options for the builders. */
export interface EventOptions {
  /** Event time (CloudEvents `time`): a Date, or an RFC 3339 string used as is. Required: builders read no clock. */
  readonly time: Date | string;
  /**
   * CloudEvents `id`. Default: derived from the event's content (first 32 hex chars of a
   * sha256), so a retried producer emits the same id and transports can deduplicate.
   */
  readonly id?: string;
  /**
   * Object events only: what made the producer emit the event beyond the object's own state
   * (e.g. `Secret/creds@4711`, the referenced object and its resourceVersion, or a resync's
   * retry ordinal); part of the derived id, so two distinct causes at one resourceVersion keep
   * distinct ids while the same cause seen twice (a second replica, a restart) does not.
   * Default: none.
   */
  readonly cause?: string;
  /** CloudEvents `source`. Default: `/kapp-lambda/clusters/<clusterId>/forwarder` for object events, `/kapp-lambda/functions/<producer>` for the others. */
  readonly source?: string;
  /** CloudEvents extension attributes (e.g. `{ traceparent: '00-…' }`). */
  readonly extensions?: Readonly<Record<string, string | number | boolean>>;
}

/** Thrown by the builders when their input does not make a valid event; `message` is as {@link parseEvent}'s `error`. */
export class EventValidationError extends Error {
  override readonly name = 'EventValidationError';
}

function deriveId(parts: readonly unknown[]): string {
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex').slice(0, 32);
}

/**
 * The derived id of an object event: the first 32 hex chars of a sha256 over type, subject,
 * uid, resourceVersion, reason and `cause`, **without the time**, so the same object change
 * announced twice (by a second forwarder replica, or again after a restart) gets the same id
 * and an SQS FIFO queue (`MessageDeduplicationId`) drops the copy within its 5-minute window.
 *
 * @param ref - The object (identity, uid and resourceVersion are read).
 * @param reason - Why it is announced.
 * @param cause - See {@link EventOptions.cause}; `undefined` and `''` are the same.
 */
export function objectEventId(ref: ObjectRef, reason: Reason, cause?: string): string {
  return deriveId([EVENT_TYPES.object, subjectOf(ref), ref.uid, ref.resourceVersion, reason, cause ?? '']);
}

function build<E extends KappEvent>(
  type: E['type'],
  ref: ObjectIdentity,
  data: E['data'],
  source: string,
  idParts: unknown[] | string,
  opts: EventOptions,
): E {
  const time = typeof opts.time === 'string' ? opts.time : opts.time.toISOString();
  const candidate = {
    ...opts.extensions,
    specversion: '1.0',
    id: opts.id ?? (typeof idParts === 'string' ? idParts : deriveId([type, subjectOf(ref), time, ...idParts])),
    source: opts.source ?? source,
    type,
    time,
    datacontenttype: 'application/json',
    subject: subjectOf(ref),
    data,
  };
  const r = parseEvent(candidate);
  if (!r.ok) throw new EventValidationError(r.error);
  return r.event as E;
}

/**
 * Builds a `dev.kapp-lambda.object.v1` event (forwarder → pipeline).
 * The derived id is {@link objectEventId}: type, subject, uid, resourceVersion, reason and
 * `opts.cause`, not the time (stage hand-offs below keep the time in theirs: a run id makes
 * them unique already).
 * @throws EventValidationError when `ref`, `reason` or `opts` make an invalid event.
 */
export function objectEvent(ref: ObjectRef, reason: Reason, opts: EventOptions): ObjectEvent {
  const data: ObjectEventData = { ...pickRef(ref), reason, ...(opts.cause ? { cause: opts.cause.slice(0, 512) } : {}) };
  return build<ObjectEvent>(
    EVENT_TYPES.object,
    ref,
    data,
    `/kapp-lambda/clusters/${ref.clusterId}/forwarder`,
    objectEventId(ref, reason, opts.cause),
    opts,
  );
}

/**
 * Builds a `dev.kapp-lambda.stage.template.v1` event (fetch → template).
 * The derived id covers type, subject, time, runId and the artifact keys.
 * @throws EventValidationError when `data` or `opts` make an invalid event.
 */
export function templateEvent(data: TemplateStageData, opts: EventOptions): TemplateStageEvent {
  return build<TemplateStageEvent>(
    EVENT_TYPES.template,
    data.object,
    { ...data, object: pickRef(data.object) },
    '/kapp-lambda/functions/fetch',
    [data.run.runId, data.artifacts],
    opts,
  );
}

/**
 * Builds a `dev.kapp-lambda.stage.deploy.v1` event (template → deploy, or the deploy function's
 * continuation, whose `source` is then the deploy function).
 * The derived id covers type, subject, time, runId, the artifact keys and the continuation count.
 * @throws EventValidationError when `data` or `opts` make an invalid event.
 */
export function deployEvent(data: DeployStageData, opts: EventOptions): DeployStageEvent {
  return build<DeployStageEvent>(
    EVENT_TYPES.deploy,
    data.object,
    { ...data, object: pickRef(data.object) },
    data.continuation ? '/kapp-lambda/functions/deploy' : '/kapp-lambda/functions/template',
    [data.run.runId, data.artifacts, ...(data.continuation ? [data.continuation.count] : [])],
    opts,
  );
}

/**
 * Builds a `dev.kapp-lambda.stage.delete.v1` event (fetch → deploy, for an App being deleted).
 * The derived id covers type, subject, time and runId.
 * @throws EventValidationError when `data` or `opts` make an invalid event.
 */
export function deleteEvent(data: DeleteStageData, opts: EventOptions): DeleteStageEvent {
  return build<DeleteStageEvent>(
    EVENT_TYPES.delete,
    data.object,
    { ...data, object: pickRef(data.object) },
    '/kapp-lambda/functions/fetch',
    [data.run.runId],
    opts,
  );
}

/**
 * Builds a `dev.kapp-lambda.repo.indexed.v1` event (index-repo → install).
 * The derived id covers type, subject, time, runId and the index key.
 * @throws EventValidationError when `data` or `opts` make an invalid event.
 */
export function repoIndexedEvent(data: RepoIndexedData, opts: EventOptions): RepoIndexedEvent {
  return build<RepoIndexedEvent>(
    EVENT_TYPES.repoIndexed,
    data.object,
    { ...data, object: pickRef(data.object) },
    '/kapp-lambda/functions/index-repo',
    [data.run.runId, data.artifacts],
    opts,
  );
}

/**
 * Builds a `dev.kapp-lambda.health.v1` event (forwarder → fetch). The derived id covers type,
 * subject, the App's uid and resourceVersion, status, reason and message, not the time: a second
 * forwarder replica's or a restarted forwarder's copy of the same verdict about the same App
 * state is dropped by the queue's deduplication, and a verdict that changes back and forth
 * meanwhile is a new App state (the condition write moves the resourceVersion).
 * @throws EventValidationError when `data` or `opts` make an invalid event.
 */
export function healthEvent(data: HealthData, opts: EventOptions): HealthEvent {
  const ref = pickRef(data.object);
  return build<HealthEvent>(
    EVENT_TYPES.health,
    ref,
    { ...data, object: ref },
    `/kapp-lambda/clusters/${ref.clusterId}/forwarder`,
    deriveId([EVENT_TYPES.health, subjectOf(ref), ref.uid, ref.resourceVersion, data.status, healthMessage(data)]),
    opts,
  );
}

/** Copies exactly the ObjectRef fields, so a caller may pass a wider object (e.g. ObjectEventData). */
function pickRef(r: ObjectRef): ObjectRef {
  return {
    clusterId: r.clusterId,
    kind: r.kind,
    apiVersion: r.apiVersion,
    namespace: r.namespace,
    name: r.name,
    uid: r.uid,
    generation: r.generation,
    resourceVersion: r.resourceVersion,
  };
}

/**
 * Serializes an event to its structured-mode JSON body (`application/cloudevents+json`).
 * @throws EventValidationError when the result would exceed {@link MAX_EVENT_BYTES}.
 */
export function serializeEvent(event: KappEvent): string {
  const body = JSON.stringify(event);
  const size = Buffer.byteLength(body);
  if (size > MAX_EVENT_BYTES) {
    throw new EventValidationError(`(root): event exceeds ${MAX_EVENT_BYTES} bytes (${size})`);
  }
  return body;
}
