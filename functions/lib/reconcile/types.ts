/**
 * The status and object shapes the timer and status functions read and write, taken from the
 * zod-inferred API types in `functions/lib/api/` (field names as kapp-controller's JSON:
 * `pkg/apis/kappctrl/v1alpha1/types.go` `AppStatus*`, `status.go` `GenericStatus` /
 * `AppCondition`; reference §2.1.5).
 *
 * The builders in `status.ts` return the stage blocks with `exitCode` (and `finished` for deploy)
 * always present, as upstream serializes them without `omitempty`.
 *
 * @module
 */
import type {
  AppStatus,
  AppStatusDeploy,
  AppStatusFetch,
  AppStatusInspect,
  AppStatusTemplate,
  Condition,
  GroupKind,
  KappDeployStatus,
  PackageRepositoryStatus,
} from '../api/index.js';

export type { Condition, GroupKind, KappDeployStatus };

/** `metav1.Time` as serialized: RFC 3339 (kapp-controller writes whole seconds in UTC). */
export type StatusTime = string;

/** `status.fetch` as written: vendir's output, `exitCode` always present. */
export type FetchStatus = AppStatusFetch & { exitCode: number };

/** `status.template` as written (the template's stdout is never stored). */
export type TemplateStatus = AppStatusTemplate & { exitCode: number };

/** `status.deploy` as written: kapp's deploy or delete output, `finished` and `exitCode` always present. */
export type DeployStatus = AppStatusDeploy & { finished: boolean; exitCode: number };

/** `status.inspect` as written: `kapp inspect` output. */
export type InspectStatus = AppStatusInspect & { exitCode: number };

/**
 * A status the transitions in `status.ts` accept: `App.status` or `PackageRepository.status`
 * (which has the same fields minus `inspect`).
 */
export type AppStatusLike = AppStatus | PackageRepositoryStatus;

/**
 * What the reconcile timer reads from an App or PackageRepository: generation, pause/cancel
 * flags, syncPeriod and the status counters and timestamps. `App` and `PackageRepository` from
 * `functions/lib/api/` are assignable to it.
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
    fetch?: { updatedAt?: string | null } | null;
    template?: { updatedAt?: string | null } | null;
    deploy?: { updatedAt?: string | null } | null;
  } | null;
}
