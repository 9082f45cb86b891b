/**
 * Per-stage status shapes of an App (also used by PackageRepository, which has no `inspect`).
 *
 * Mirrors `pkg/apis/kappctrl/v1alpha1/types.go` (`Fetch`, `Template`, `Deploy`, `Inspect`,
 * `KappDeployStatus`, `AssociatedResources`). Upstream keeps `exitCode` and `finished` present
 * even when zero or false (no `omitempty`); the schemas accept them absent because a status may be
 * empty before the first reconcile.
 *
 * Also the bounded copy of a fetch or template part that stage hand-off events carry
 * ({@link StageStatusSummarySchema}), and the event contract's time schema ({@link TimestampSchema}).
 *
 * @module
 */
import * as z from 'zod';
import { IntSchema, TimeSchema } from './common.js';

const EXIT_CODE = 'Process exit code; -1 when the error has no exit code (process killed, or a pre-exec error)';

/** Result of the fetch stage (vendir) as stored in `status.fetch`. */
export const AppStatusFetchSchema = z.object({
  stderr: z.string().optional(),
  stdout: z.string().describe("vendir's output; contains the lock config (kind: LockConfig)").optional(),
  exitCode: IntSchema.describe(EXIT_CODE).optional(),
  error: z.string().optional(),
  startedAt: TimeSchema.optional(),
  updatedAt: TimeSchema.optional(),
});

/** `status.fetch`. */
export type AppStatusFetch = z.infer<typeof AppStatusFetchSchema>;

/** Result of the template stage as stored in `status.template` (stdout is never stored). */
export const AppStatusTemplateSchema = z.object({
  stderr: z.string().optional(),
  exitCode: IntSchema.describe(EXIT_CODE).optional(),
  error: z.string().optional(),
  updatedAt: TimeSchema.optional(),
});

/** `status.template`. */
export type AppStatusTemplate = z.infer<typeof AppStatusTemplateSchema>;

/** `metav1.GroupKind`: both fields required, as upstream's CRD says. */
export const GroupKindSchema = z.object({
  group: z.string(),
  kind: z.string(),
});

/** A group and kind without a version (`metav1.GroupKind`). */
export type GroupKind = z.infer<typeof GroupKindSchema>;

/** What kapp deployed for the App (`AssociatedResources`). */
export const AssociatedResourcesSchema = z.object({
  label: z.string().describe('kapp app label, e.g. kapp.k14s.io/app=1600000000000000000').optional(),
  namespaces: z.array(z.string()).optional(),
  groupKinds: z
    .array(
      GroupKindSchema.describe(
        'GroupKind specifies a Group and a Kind, but does not force a version.  This is useful for identifying concepts during lookup stages without having partially valid types',
      ),
    )
    .optional(),
});

/** Resources associated with the App's kapp app. */
export type AssociatedResources = z.infer<typeof AssociatedResourcesSchema>;

/** `KappDeployStatus`: `status.deploy.kapp`. */
export const KappDeployStatusSchema = z.object({
  associatedResources: AssociatedResourcesSchema.describe(
    'AssociatedResources contains the associated App label, namespaces and GKs',
  ).optional(),
});

/** kapp-specific deploy status. */
export type KappDeployStatus = z.infer<typeof KappDeployStatusSchema>;

/** Result of the deploy (or delete) stage as stored in `status.deploy`. */
export const AppStatusDeploySchema = z.object({
  stdout: z.string().describe("kapp's output, written as it streams once kapp starts applying changes").optional(),
  stderr: z.string().optional(),
  finished: z.boolean().describe('True once a result is attached').optional(),
  exitCode: IntSchema.describe(EXIT_CODE).optional(),
  error: z.string().optional(),
  startedAt: TimeSchema.optional(),
  updatedAt: TimeSchema.optional(),
  kapp: KappDeployStatusSchema.describe('KappDeployStatus contains the associated AppCR deployed resources').optional(),
});

/** `status.deploy`. */
export type AppStatusDeploy = z.infer<typeof AppStatusDeploySchema>;

/** Result of `kapp inspect` as stored in `status.inspect` (only when `deploy[].kapp.inspect` is set). */
export const AppStatusInspectSchema = z.object({
  stdout: z.string().optional(),
  stderr: z.string().optional(),
  exitCode: IntSchema.describe(EXIT_CODE).optional(),
  error: z.string().optional(),
  updatedAt: TimeSchema.optional(),
});

/** `status.inspect`. */
export type AppStatusInspect = z.infer<typeof AppStatusInspectSchema>;

/** Reconcile counters shared by App and PackageRepository status. */
export const ReconcileCountersShape = {
  consecutiveReconcileSuccesses: IntSchema.describe(
    'Incremented on ReconcileSucceeded; reset to 0 on ReconcileFailed or DeleteFailed',
  ).optional(),
  consecutiveReconcileFailures: IntSchema.describe(
    'Incremented on ReconcileFailed or DeleteFailed; reset to 0 on ReconcileSucceeded. Drives the 2^n s failure backoff',
  ).optional(),
} as const;

/**
 * An RFC 3339 time with seconds and an offset or `Z`: {@link TimeSchema} with the error text
 * an event's validation reports (`expected an RFC 3339 timestamp`). The event contract
 * (`events/schema.ts`) uses it for every time it carries.
 */
export const TimestampSchema = z.iso.datetime({ offset: true, error: 'expected an RFC 3339 timestamp' });

/** Longest `stdout`/`stderr` in a {@link StageStatusSummary}: 16 KiB characters each. */
export const MAX_SUMMARY_OUTPUT_CHARS = 16 * 1024;
/** Longest `error` in a {@link StageStatusSummary}: 4 KiB characters. */
export const MAX_SUMMARY_ERROR_CHARS = 4 * 1024;

/**
 * Bounded summary of a finished stage, shaped like kapp-controller's `status.fetch` /
 * `status.template` (`{ startedAt?, updatedAt, exitCode, error?, stdout?, stderr? }`); the
 * producer truncates outputs to their limits and redacts secrets before putting them here.
 * The copy of a stage part that the stage hand-off events (`events/schema.ts`) carry; it lives
 * with the status shapes so the status summarizer (`reconcile/status.ts` `toEventPart`) needs
 * no import of the event contract.
 *
 * @see kapp-controller `pkg/apis/kappctrl/v1alpha1/types_status.go` (AppStatusFetch, AppStatusTemplate).
 */
export const StageStatusSummarySchema = z.strictObject({
  startedAt: TimestampSchema.optional(),
  updatedAt: TimestampSchema,
  exitCode: z.number().int(),
  error: z.string().max(MAX_SUMMARY_ERROR_CHARS).optional(),
  stdout: z.string().max(MAX_SUMMARY_OUTPUT_CHARS).optional(),
  stderr: z.string().max(MAX_SUMMARY_OUTPUT_CHARS).optional(),
});
/** See {@link StageStatusSummarySchema}. */
export type StageStatusSummary = z.infer<typeof StageStatusSummarySchema>;
