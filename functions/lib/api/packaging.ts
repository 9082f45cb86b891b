/**
 * `PackageInstall` and `PackageRepository` (`packaging.carvel.dev/v1alpha1`, namespaced).
 *
 * Mirrors `pkg/apis/packaging/v1alpha1/package_install.go` and `package_repository.go`.
 *
 * @module
 */
import * as z from 'zod';
import { AppClusterSchema } from './app.js';
import { DurationSchema, GenericStatusShape, ObjectMetaSchema, VersionSelectionSemverSchema } from './common.js';
import {
  AppFetchGitSchema,
  AppFetchHTTPSchema,
  AppFetchImageSchema,
  AppFetchImgpkgBundleSchema,
  AppFetchInlineSchema,
} from './fetch.js';
import { PackageInstallResource, PackageRepositoryResource } from './resources.js';
import {
  AppStatusDeploySchema,
  AppStatusFetchSchema,
  AppStatusTemplateSchema,
  ReconcileCountersShape,
} from './status.js';

/**
 * Which Package to install (`PackageRef`): Packages with `spec.refName == refName`, narrowed by
 * `versionSelection`. `versionSelection` is required at reconcile time
 * (`Expected non-empty version selection`); `{}` selects the highest non-prerelease version.
 */
export const PackageRefSchema = z.object({
  refName: z.string().describe("The Package's spec.refName (the PackageMetadata name)").optional(),
  versionSelection: VersionSelectionSemverSchema.optional(),
});

/** Package reference of a PackageInstall. */
export type PackageRef = z.infer<typeof PackageRefSchema>;

/**
 * The Secret providing values (`PackageInstallValuesSecretRef`). `key` is accepted but ignored by
 * upstream: every key of the Secret becomes a values file.
 */
export const PackageInstallValuesSecretRefSchema = z.object({
  name: z.string().optional(),
  key: z.string().describe('Ignored by upstream: every key of the secret is used').optional(),
});

/** Values secret reference. */
export type PackageInstallValuesSecretRef = z.infer<typeof PackageInstallValuesSecretRefSchema>;

/**
 * One `spec.values[]` entry (`PackageInstallValues`). `secretRef` is required at reconcile time
 * (`Invalid fields: spec.values[i].secretRef: Required value`). Values go only to the first ytt
 * or helmTemplate step of the Package's template.
 */
export const PackageInstallValuesSchema = z.object({
  secretRef: PackageInstallValuesSecretRefSchema.optional(),
});

/** One values source of a PackageInstall. */
export type PackageInstallValues = z.infer<typeof PackageInstallValuesSchema>;

/**
 * `PackageInstall.spec` (`PackageInstallSpec`). `serviceAccountName`, `cluster`, `paused`,
 * `canceled`, `syncPeriod`, `noopDelete` and `defaultNamespace` are copied to the generated App.
 */
export const PackageInstallSpecSchema = z.object({
  serviceAccountName: z
    .string()
    .describe('Specifies service account that will be used to install underlying package contents')
    .optional(),
  cluster: AppClusterSchema.describe(
    'Specifies that Package should be deployed to destination cluster; by default, cluster is same as where this resource resides (optional)',
  ).optional(),
  packageRef: PackageRefSchema.describe('Specifies the name of the package to install (required)').optional(),
  values: z
    .array(PackageInstallValuesSchema)
    .describe(
      "Values to be included in package's templating step (currently only included in the first templating step) (optional)",
    )
    .optional(),
  paused: z
    .boolean()
    .describe(
      'Paused when set to true will ignore all pending changes, once it set back to false, pending changes will be applied',
    )
    .optional(),
  canceled: z.boolean().describe('Canceled when set to true will stop all active changes').optional(),
  syncPeriod: DurationSchema.describe(
    'Controls frequency of App reconciliation in time + unit format. Always >= 30s. If value below 30s is specified, 30s will be used. (optional; default=10m)',
  ).optional(),
  noopDelete: z
    .boolean()
    .describe(
      "When NoopDelete set to true, PackageInstall deletion should delete PackageInstall/App CR but preserve App's associated resources.",
    )
    .optional(),
  defaultNamespace: z
    .string()
    .describe(
      'Specifies the default namespace to install the Package resources, by default this is same as the PackageInstall namespace (optional; v0.48.0+)',
    )
    .optional(),
});

/** The desired state of a PackageInstall. */
export type PackageInstallSpec = z.infer<typeof PackageInstallSpecSchema>;

/** `PackageInstall.status` (`PackageInstallStatus` with `GenericStatus` inlined). */
export const PackageInstallStatusSchema = z.object({
  ...GenericStatusShape,
  version: z
    .string()
    .describe(
      'The desired version resolved from the constraints (not necessarily deployed); set as soon as a version is selected',
    )
    .optional(),
  lastAttemptedVersion: z
    .string()
    .describe(
      'LastAttemptedVersion specifies what version was last attempted to be installed. It does _not_ indicate it was successfully installed. Used for downgrade protection',
    )
    .optional(),
});

/** The observed state of a PackageInstall. */
export type PackageInstallStatus = z.infer<typeof PackageInstallStatusSchema>;

/** A whole `PackageInstall` object (`packaging.carvel.dev/v1alpha1`). */
export const PackageInstallSchema = z.object({
  apiVersion: z.literal(PackageInstallResource.apiVersion),
  kind: z.literal(PackageInstallResource.kind),
  metadata: ObjectMetaSchema,
  spec: PackageInstallSpecSchema,
  status: PackageInstallStatusSchema.optional(),
});

/** A PackageInstall custom resource. */
export type PackageInstall = z.infer<typeof PackageInstallSchema>;

/**
 * Where a PackageRepository's bundle comes from (`PackageRepositoryFetch`): exactly one of the
 * App fetch sources below (no `helmChart`, no `path`).
 */
export const PackageRepositoryFetchSchema = z.object({
  image: AppFetchImageSchema.describe(
    'Image url; unqualified, tagged, or digest references supported (required)',
  ).optional(),
  http: AppFetchHTTPSchema.describe('Uses http library to fetch file containing packages').optional(),
  git: AppFetchGitSchema.describe('Uses git to clone repository containing package list').optional(),
  imgpkgBundle: AppFetchImgpkgBundleSchema.describe('Pulls imgpkg bundle from Docker/OCI registry').optional(),
  inline: AppFetchInlineSchema.describe(
    'Pull content from within this resource; or other resources in the cluster (v0.31.0+)',
  ).optional(),
});

/** Fetch source of a PackageRepository. */
export type PackageRepositoryFetch = z.infer<typeof PackageRepositoryFetchSchema>;

/** `PackageRepository.spec` (`PackageRepositorySpec`); `fetch` is required by the CRD. */
export const PackageRepositorySpecSchema = z.object({
  paused: z
    .boolean()
    .describe(
      'Paused when set to true will ignore all pending changes, once it set back to false, pending changes will be applied. Takes precedence over deletion',
    )
    .optional(),
  syncPeriod: DurationSchema.describe(
    'Controls frequency of PackageRepository reconciliation (optional; default=10m; values below 30s become 30s)',
  ).optional(),
  fetch: PackageRepositoryFetchSchema,
});

/** The desired state of a PackageRepository. */
export type PackageRepositorySpec = z.infer<typeof PackageRepositorySpecSchema>;

/**
 * `PackageRepository.status` (`PackageRepositoryStatus`): the App stage shapes without `inspect`,
 * plus counters and `GenericStatus`.
 */
export const PackageRepositoryStatusSchema = z.object({
  fetch: AppStatusFetchSchema.optional(),
  template: AppStatusTemplateSchema.optional(),
  deploy: AppStatusDeploySchema.optional(),
  ...ReconcileCountersShape,
  ...GenericStatusShape,
});

/** The observed state of a PackageRepository. */
export type PackageRepositoryStatus = z.infer<typeof PackageRepositoryStatusSchema>;

/** A whole `PackageRepository` object (`packaging.carvel.dev/v1alpha1`). */
export const PackageRepositorySchema = z.object({
  apiVersion: z.literal(PackageRepositoryResource.apiVersion),
  kind: z.literal(PackageRepositoryResource.kind),
  metadata: ObjectMetaSchema,
  spec: PackageRepositorySpecSchema,
  status: PackageRepositoryStatusSchema.optional(),
});

/** A PackageRepository custom resource. */
export type PackageRepository = z.infer<typeof PackageRepositorySchema>;
