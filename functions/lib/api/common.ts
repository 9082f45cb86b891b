/**
 * Shapes shared by every kind: Kubernetes object metadata (the subset the reconcilers read),
 * scalar helpers (int64, metav1.Time, metav1.Duration), `GenericStatus` and `Condition`, and
 * vendir's semver version selection.
 *
 * Schemas reflect upstream's CRD (`config/config/crds.yml`) and nothing stricter for fields the
 * API server stores as-is, so any object the API server accepts parses here; the only extra
 * checks are those upstream's Go decoding applies too (Go duration and RFC 3339 syntax), which
 * upstream turns into a decode failure and we turn into an error with the field's path.
 *
 * @module
 */
import * as z from 'zod';
import { invalidDurationMessage, isGoDuration } from './duration.js';

/**
 * A Go `int64` (JSON number without a fraction, within JS's safe-integer range). In the CRD it is
 * `type: integer, format: int64`.
 */
export const Int64Schema = z.int().meta({ format: 'int64' });

/**
 * A Go `int` (kapp-controller's exit codes and reconcile counters). In the CRD it is
 * `type: integer` without a format, as upstream.
 */
export const IntSchema = z.int();

/**
 * `metav1.Time`: an RFC 3339 timestamp with seconds and an offset or `Z`, e.g.
 * `2021-10-29T12:00:00Z` (fractional seconds allowed). In the CRD it is
 * `type: string, format: date-time`.
 */
export const TimeSchema = z.iso.datetime({ offset: true });

/** A `metav1.Time` value: an RFC 3339 string, see {@link TimeSchema}. */
export type Time = z.infer<typeof TimeSchema>;

/**
 * `metav1.Duration`: a Go duration string such as `30s`, `1m`, `1h30m` or `300ms` (no `d` unit),
 * validated by Go's `time.ParseDuration` rules (`./duration.js`); any rejection reads
 * `time: invalid duration "1d"`. In the CRD it is a plain `type: string`, as upstream; use
 * `parseDuration` from `./duration.js` to get milliseconds.
 */
export const DurationSchema = z.string().refine(isGoDuration, {
  error: (issue) => invalidDurationMessage(issue.input),
});

/** A `metav1.Duration` value: a Go duration string, see {@link DurationSchema}. */
export type Duration = z.infer<typeof DurationSchema>;

/** Converts a `Date` into Kubernetes' RFC 3339 form with whole seconds (`2021-01-02T03:04:05Z`). */
function dateToKubeTime(value: unknown): unknown {
  return value instanceof Date ? value.toISOString().replace(/\.\d+Z$/, 'Z') : value;
}

/**
 * `metav1.Time` inside `metadata`. Also accepts a JS `Date` (typed @kubernetes/client-node models
 * turn `creationTimestamp` into one) and normalises it to the RFC 3339 string.
 */
const MetaTimeSchema = z.preprocess(dateToKubeTime, TimeSchema);

/**
 * `metav1.OwnerReference` (k8s.io/apimachinery `pkg/apis/meta/v1/types.go`).
 */
export const OwnerReferenceSchema = z.looseObject({
  apiVersion: z.string(),
  kind: z.string(),
  name: z.string(),
  uid: z.string(),
  controller: z.boolean().optional(),
  blockOwnerDeletion: z.boolean().optional(),
});

/** An owner reference on an object's metadata. */
export type OwnerReference = z.infer<typeof OwnerReferenceSchema>;

/**
 * The subset of `metav1.ObjectMeta` the reconcilers read. Unknown metadata fields (managedFields,
 * ...) are kept, because the API server owns metadata and a read-modify-write must not drop them.
 * The CRDs declare `metadata` as a bare `type: object`, as every CRD does.
 */
export const ObjectMetaSchema = z.looseObject({
  name: z.string().optional(),
  generateName: z.string().optional(),
  namespace: z.string().optional(),
  uid: z.string().optional(),
  resourceVersion: z.string().optional(),
  /** Incremented by the API server on every spec change; compared with `status.observedGeneration`. */
  generation: Int64Schema.optional(),
  creationTimestamp: MetaTimeSchema.optional(),
  /** Set when deletion was requested; the object stays until its finalizers are removed. */
  deletionTimestamp: MetaTimeSchema.optional(),
  deletionGracePeriodSeconds: Int64Schema.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  annotations: z.record(z.string(), z.string()).optional(),
  finalizers: z.array(z.string()).optional(),
  ownerReferences: z.array(OwnerReferenceSchema).optional(),
});

/** Object metadata (subset of `metav1.ObjectMeta`; other keys are preserved untyped). */
export type ObjectMeta = z.infer<typeof ObjectMetaSchema>;

/**
 * A status condition (`pkg/apis/kappctrl/v1alpha1/status.go` `Condition`). kapp-controller
 * writes at most one, with `status: "True"` and no `reason`; see `ConditionType` in
 * `./constants.js` for the types.
 */
export const ConditionSchema = z.object({
  type: z.string().describe('ConditionType represents reconciler state'),
  status: z.string().describe('"True", "False" or "Unknown" (corev1.ConditionStatus)'),
  reason: z
    .string()
    .describe(
      "Unique, this should be a short, machine understandable string that gives the reason for condition's last transition. Never set by kapp-controller",
    )
    .optional(),
  message: z.string().describe('Human-readable message indicating details about last transition.').optional(),
});

/** One entry of `status.conditions`. */
export type Condition = z.infer<typeof ConditionSchema>;

/**
 * The status fields every kind shares (`pkg/apis/kappctrl/v1alpha1/status.go` `GenericStatus`,
 * inlined into each kind's status).
 */
export const GenericStatusShape = {
  observedGeneration: Int64Schema.describe(
    'Populated based on metadata.generation when controller observes a change to the resource; if this value is out of data, other status fields do not reflect latest state. Set at the start of every deploy, delete or paused reconcile; always serialized by upstream',
  ).optional(),
  conditions: z
    .array(ConditionSchema)
    .describe('At most one entry (Reconciling, ReconcileSucceeded, ReconcileFailed, Deleting or DeleteFailed)')
    .optional(),
  friendlyDescription: z
    .string()
    .describe(
      'Reconciling, Reconcile succeeded, Reconcile failed: <err>, Deleting, Delete failed: <err>, Canceled/paused (PackageRepository: Paused); always serialized by upstream',
    )
    .optional(),
  usefulErrorMessage: z
    .string()
    .describe("On failure the failing step's stderr if non-empty, otherwise the error; cleared on success")
    .optional(),
} as const;

/** `GenericStatus` on its own (`status.go`). */
export const GenericStatusSchema = z.object(GenericStatusShape);

/** Status fields shared by App, PackageInstall and PackageRepository. */
export type GenericStatus = z.infer<typeof GenericStatusSchema>;

/**
 * vendir `VersionSelectionSemverPrereleases` (`vendor/carvel.dev/vendir/pkg/vendir/versions/v1alpha1`).
 * Absent: prereleases are dropped. `{}`: all kept. `identifiers: [rc]`: kept when a dot-part
 * equals one of them.
 */
export const VersionSelectionSemverPrereleasesSchema = z.object({
  identifiers: z.array(z.string()).optional(),
});

/** Which prerelease versions take part in version selection. */
export type VersionSelectionSemverPrereleases = z.infer<typeof VersionSelectionSemverPrereleasesSchema>;

/**
 * vendir `VersionSelectionSemver`: blang/carvel semver `constraints` (e.g. `>=1.0.0 <2.0.0`; no
 * `^`/`~`; empty means any) plus the prerelease filter. Used by `tagSelection`, `refSelection`
 * and `packageRef.versionSelection`.
 */
export const VersionSelectionSemverSchema = z.object({
  constraints: z.string().optional(),
  prereleases: VersionSelectionSemverPrereleasesSchema.optional(),
});

/** A semver version selection. */
export type VersionSelectionSemver = z.infer<typeof VersionSelectionSemverSchema>;

/** vendir `VersionSelection`: only the `semver` strategy exists. */
export const VersionSelectionSchema = z.object({
  semver: VersionSelectionSemverSchema.optional(),
});

/** A version (tag or git ref) selection strategy. */
export type VersionSelection = z.infer<typeof VersionSelectionSchema>;

/**
 * A reference by name to an object (Secret or ConfigMap) in the same namespace as the owning
 * resource (`AppFetchLocalRef`, `AppTemplateValuesSourceRef`, ...).
 */
export const LocalRefSchema = z.object({
  name: z.string().describe('Object is expected to be within same namespace').optional(),
});

/** A same-namespace object reference. */
export type LocalRef = z.infer<typeof LocalRefSchema>;
