/**
 * The `App` kind (`kappctrl.k14s.io/v1alpha1`, namespaced).
 *
 * Mirrors `pkg/apis/kappctrl/v1alpha1/types.go` (spec, cluster, status) with the pieces from
 * `types_fetch.go`, `types_template.go`, `types_deploy.go` and `status.go`.
 *
 * @module
 */
import * as z from 'zod';
import { DurationSchema, GenericStatusShape, ObjectMetaSchema } from './common.js';
import { DEFAULT_KUBECONFIG_SECRET_KEY } from './defaults.js';
import { AppDeploySchema } from './deploy.js';
import { AppFetchSchema } from './fetch.js';
import { AppResource } from './resources.js';
import {
  AppStatusDeploySchema,
  AppStatusFetchSchema,
  AppStatusInspectSchema,
  AppStatusTemplateSchema,
  ReconcileCountersShape,
} from './status.js';
import { AppTemplateSchema } from './template.js';

/**
 * Secret holding the destination cluster's kubeconfig (`AppClusterKubeconfigSecretRef`). `key`
 * defaults to `value` (`DEFAULT_KUBECONFIG_SECRET_KEY`, applied by `deploy/kubeconfig.ts`); a missing key fails with
 * `Expected to find key '<k>' in secret (keys: ...)`.
 */
export const AppClusterKubeconfigSecretRefSchema = z.object({
  name: z.string().describe("Specifies secret name within app's namespace (required)").optional(),
  key: z
    .string()
    .describe(
      `Specifies key that contains kubeconfig (optional; default ${JSON.stringify(DEFAULT_KUBECONFIG_SECRET_KEY)})`,
    )
    .optional(),
});

/** Kubeconfig secret reference. */
export type AppClusterKubeconfigSecretRef = z.infer<typeof AppClusterKubeconfigSecretRefSchema>;

/**
 * Destination cluster (`AppCluster`). Ignored when `serviceAccountName` is set (the service
 * account takes precedence). `namespace` is passed to kapp as both `--namespace` and
 * `--app-namespace`.
 */
export const AppClusterSchema = z.object({
  namespace: z.string().describe('Specifies namespace in destination cluster (optional)').optional(),
  kubeconfigSecretRef: AppClusterKubeconfigSecretRefSchema.describe(
    'Specifies secret containing kubeconfig (required)',
  ).optional(),
});

/** Destination cluster of an App or PackageInstall. */
export type AppCluster = z.infer<typeof AppClusterSchema>;

/**
 * `App.spec` (`AppSpec`). Also the shape of a Package's `spec.template.spec`.
 *
 * Reconcile-time rules (not schema rules, so the error lands in status as upstream's does):
 * at least one fetch (`Expected at least one fetch option`), at least one template
 * (`Expected at least one template option`), exactly one deploy (`Expected exactly one deploy option`).
 */
export const AppSpecSchema = z.object({
  serviceAccountName: z
    .string()
    .describe(
      'Specifies that app should be deployed authenticated via given service account, found in this namespace (optional; v0.6.0+); takes precedence over cluster',
    )
    .optional(),
  cluster: AppClusterSchema.describe(
    'Specifies that app should be deployed to destination cluster; by default, cluster is same as where this resource resides (optional; v0.5.0+)',
  ).optional(),
  fetch: z.array(AppFetchSchema).describe('Where to fetch configuration from (at least one)').optional(),
  template: z.array(AppTemplateSchema).describe('How to template the fetched configuration (at least one)').optional(),
  deploy: z.array(AppDeploySchema).describe('How to deploy the templated configuration (exactly one kapp)').optional(),
  paused: z
    .boolean()
    .describe(
      'Pauses _future_ reconciliation; does _not_ affect currently running reconciliation (optional; default=false)',
    )
    .optional(),
  canceled: z.boolean().describe('Cancels current and future reconciliations (optional; default=false)').optional(),
  syncPeriod: DurationSchema.describe(
    'Specifies the length of time to wait, in time + unit format, before reconciling. Always >= 30s. If value below 30s is specified, 30s will be used. (optional; v0.9.0+; default=30s)',
  ).optional(),
  noopDelete: z
    .boolean()
    .describe(
      'Deletion requests for the App will result in the App CR being deleted, but its associated resources will not be deleted (optional; default=false; v0.18.0+)',
    )
    .optional(),
  defaultNamespace: z
    .string()
    .describe(
      "Specifies the default namespace to install the App resources, by default this is same as the App's namespace (optional; v0.48.0+)",
    )
    .optional(),
});

/** The desired state of an App. */
export type AppSpec = z.infer<typeof AppSpecSchema>;

/** `App.status` (`AppStatus` with `GenericStatus` inlined). */
export const AppStatusSchema = z.object({
  managedAppName: z.string().describe('Legacy; no longer written by kapp-controller').optional(),
  fetch: AppStatusFetchSchema.optional(),
  template: AppStatusTemplateSchema.optional(),
  deploy: AppStatusDeploySchema.optional(),
  inspect: AppStatusInspectSchema.optional(),
  ...ReconcileCountersShape,
  ...GenericStatusShape,
});

/** The observed state of an App. */
export type AppStatus = z.infer<typeof AppStatusSchema>;

/**
 * A whole `App` object. `apiVersion` and `kind` must be `kappctrl.k14s.io/v1alpha1` and `App`;
 * unknown fields outside `metadata` are dropped, as the API server prunes them.
 */
export const AppSchema = z.object({
  apiVersion: z.literal(AppResource.apiVersion),
  kind: z.literal(AppResource.kind),
  metadata: ObjectMetaSchema,
  spec: AppSpecSchema,
  status: AppStatusSchema.optional(),
});

/** An App custom resource. */
export type App = z.infer<typeof AppSchema>;
