/**
 * Minimal structural shapes of the status and object fields the timer and status functions
 * read and write. Field names follow kapp-controller's JSON exactly
 * (`pkg/apis/kappctrl/v1alpha1/types.go` `AppStatus*`, `pkg/apis/kappctrl/v1alpha1/status.go`
 * `GenericStatus` / `AppCondition`; reference §2.1.5). They are deliberately loose (optional
 * fields, `string` condition types) so that the zod-inferred `App` / `PackageRepository` types
 * in `functions/lib/api/` are assignable to them.
 *
 * @module
 */

/** Condition types an App, PackageInstall or PackageRepository can carry (`status.go`). */
export type ConditionType = 'Reconciling' | 'ReconcileSucceeded' | 'ReconcileFailed' | 'Deleting' | 'DeleteFailed';

/** `AppCondition`: `reason` is never set by kapp-controller; `message` only on failure types. */
export interface Condition {
  type: string;
  status: string;
  reason?: string;
  message?: string;
}

/**
 * `metav1.Time` as serialized: RFC 3339 with second precision (`2024-01-02T03:04:05Z`), or
 * `null` for the zero time.
 */
export type StatusTime = string | null;

/** `status.fetch` (`AppStatusFetch`): vendir's output. */
export interface FetchStatus {
  stderr?: string;
  stdout?: string;
  exitCode: number;
  error?: string;
  startedAt?: StatusTime;
  updatedAt?: StatusTime;
}

/** `status.template` (`AppStatusTemplate`): the template's stdout is never stored. */
export interface TemplateStatus {
  stderr?: string;
  exitCode: number;
  error?: string;
  updatedAt?: StatusTime;
}

/** `metav1.GroupKind`. */
export interface GroupKind {
  group: string;
  kind: string;
}

/** `status.deploy.kapp` (`KappDeployStatus`). */
export interface KappDeployStatus {
  associatedResources: {
    label?: string;
    namespaces?: string[];
    groupKinds?: GroupKind[];
  };
}

/** `status.deploy` (`AppStatusDeploy`): kapp's deploy or delete output. */
export interface DeployStatus {
  stdout?: string;
  stderr?: string;
  finished: boolean;
  exitCode: number;
  error?: string;
  startedAt?: StatusTime;
  updatedAt?: StatusTime;
  kapp?: KappDeployStatus;
}

/** `status.inspect` (`AppStatusInspect`): `kapp inspect` output. */
export interface InspectStatus {
  stdout?: string;
  stderr?: string;
  exitCode: number;
  error?: string;
  updatedAt?: StatusTime;
}

/** `GenericStatus` fields shared by App, PackageInstall and PackageRepository status. */
export interface GenericStatusLike {
  observedGeneration?: number;
  conditions?: Condition[] | null;
  friendlyDescription?: string;
  usefulErrorMessage?: string;
}

/** `AppStatus` (and the PackageRepository status, which has the same fields minus `inspect`). */
export interface AppStatusLike extends GenericStatusLike {
  managedAppName?: string;
  fetch?: FetchStatus | null;
  template?: TemplateStatus | null;
  deploy?: DeployStatus | null;
  inspect?: InspectStatus | null;
  consecutiveReconcileSuccesses?: number;
  consecutiveReconcileFailures?: number;
}

/**
 * What the reconcile timer reads from an App or PackageRepository: generation, pause/cancel
 * flags, syncPeriod and the status counters and timestamps.
 */
export interface TimedObject {
  metadata: {
    name?: string;
    namespace?: string;
    uid?: string;
    generation?: number;
    deletionTimestamp?: string | null;
  };
  spec?: {
    /** Go duration text (`metav1.Duration`), e.g. `30s`, `10m`. */
    syncPeriod?: string | null;
    paused?: boolean | null;
    /** App only; PackageRepository has no `canceled`. */
    canceled?: boolean | null;
  } | null;
  status?: {
    observedGeneration?: number;
    conditions?: Condition[] | null;
    consecutiveReconcileFailures?: number;
    fetch?: { updatedAt?: StatusTime } | null;
    template?: { updatedAt?: StatusTime } | null;
    deploy?: { updatedAt?: StatusTime } | null;
  } | null;
}
