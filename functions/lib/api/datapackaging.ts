/**
 * `Package` and `PackageMetadata` (`data.packaging.carvel.dev/v1alpha1`, namespaced).
 *
 * Mirrors `pkg/apiserver/apis/datapackaging/v1alpha1/types.go` (same specs as the internal CRDs
 * of `pkg/apis/internalpackaging/v1alpha1/types.go`). Neither kind has a status.
 *
 * Upstream's aggregated API also validates on create/update
 * (`pkg/apiserver/apis/datapackaging/validation/validations.go`): `spec.refName` is a DNS-1123
 * subdomain with at least three dot-separated segments, `spec.version` is strict semver, and a
 * Package's `metadata.name` is `<refName>.<version>`. Those are semantic checks for the
 * repository indexer and the install resolver; these schemas only check shapes.
 *
 * @module
 */
import { z } from 'zod';
import { AppSpecSchema } from './app.js';
import { ObjectMetaSchema, TimeSchema } from './common.js';
import { PackageMetadataResource, PackageResource } from './resources.js';

/** The App template of a Package (`AppTemplateSpec`); `spec` is required by the CRD. */
export const PackageTemplateSchema = z.object({
  spec: AppSpecSchema.describe('An App spec; copied into the App generated for a PackageInstall'),
});

/** A Package's App template. */
export type PackageTemplate = z.infer<typeof PackageTemplateSchema>;

/**
 * Free-form OpenAPI v3 schema of a Package's values (`ValuesSchema`). Informational only: values
 * are not validated against it at install time.
 */
export const ValuesSchemaSchema = z.object({
  openAPIv3: z
    .record(z.string(), z.unknown())
    .nullable()
    .meta({ 'x-kubernetes-preserve-unknown-fields': true })
    .optional(),
});

/** A Package's values schema. */
export type ValuesSchema = z.infer<typeof ValuesSchemaSchema>;

/** One piece of software a Package contains (`IncludedSoftware`). */
export const IncludedSoftwareSchema = z.object({
  displayName: z.string().optional(),
  version: z.string().optional(),
  description: z.string().optional(),
});

/** Included software entry. */
export type IncludedSoftware = z.infer<typeof IncludedSoftwareSchema>;

/**
 * A version range a Package requires of the cluster or of kapp-controller (`VersionSelection` in
 * datapackaging): blang semver range syntax, validated with `semver.ParseRange` at install time.
 */
export const PackageVersionSelectionSchema = z.object({
  constraints: z.string().optional(),
});

/** A Package's Kubernetes or kapp-controller version constraint. */
export type PackageVersionSelection = z.infer<typeof PackageVersionSelectionSchema>;

/** `Package.spec` (`PackageSpec`). */
export const PackageSpecSchema = z.object({
  refName: z
    .string()
    .describe(
      'The name of the PackageMetadata associated with this version Must be a valid PackageMetadata name (see PackageMetadata CR for details) Cannot be empty',
    )
    .optional(),
  version: z
    .string()
    .describe('Package version; Referenced by PackageInstall; Must be valid semver (required) Cannot be empty')
    .optional(),
  licenses: z
    .array(z.string())
    .describe('Description of the licenses that apply to the package software (optional; Array of strings)')
    .optional(),
  releasedAt: TimeSchema.nullable().describe('Timestamp of release (iso8601 formatted string; optional)').optional(),
  capacityRequirementsDescription: z
    .string()
    .describe(
      'System requirements needed to install the package. Note: these requirements will not be verified by kapp-controller on installation. (optional; string)',
    )
    .optional(),
  releaseNotes: z.string().describe('Version release notes (optional; string)').optional(),
  template: PackageTemplateSchema.optional(),
  valuesSchema: ValuesSchemaSchema.describe(
    'valuesSchema can be used to show template values that can be configured by users when a Package is installed in an OpenAPI schema format.',
  ).optional(),
  includedSoftware: z
    .array(IncludedSoftwareSchema.describe('IncludedSoftware contains the underlying Software Contents of a Package'))
    .describe(
      'IncludedSoftware can be used to show the software contents of a Package. This is especially useful if the underlying versions do not match the Package version',
    )
    .optional(),
  kappControllerVersionSelection: PackageVersionSelectionSchema.describe(
    'KappControllerVersionSelection specifies the versions of kapp-controller which can install this package',
  ).optional(),
  kubernetesVersionSelection: PackageVersionSelectionSchema.describe(
    'KubernetesVersionSelection specifies the versions of k8s which this package can be installed on',
  ).optional(),
});

/** The content of a Package. */
export type PackageSpec = z.infer<typeof PackageSpecSchema>;

/** A whole `Package` object (`data.packaging.carvel.dev/v1alpha1`). */
export const PackageSchema = z.object({
  apiVersion: z.literal(PackageResource.apiVersion),
  kind: z.literal(PackageResource.kind),
  metadata: ObjectMetaSchema,
  spec: PackageSpecSchema,
});

/** A Package (one version of a package). */
export type Package = z.infer<typeof PackageSchema>;

/** A package maintainer (`Maintainer`); only `name` is supported. */
export const MaintainerSchema = z.object({
  name: z.string().optional(),
});

/** Package maintainer. */
export type Maintainer = z.infer<typeof MaintainerSchema>;

/** `PackageMetadata.spec` (`PackageMetadataSpec`); all fields are informational. */
export const PackageMetadataSpecSchema = z.object({
  displayName: z.string().describe('Human friendly name of the package (optional; string)').optional(),
  longDescription: z.string().describe('Long description of the package (optional; string)').optional(),
  shortDescription: z.string().describe('Short desription of the package (optional; string)').optional(),
  iconSVGBase64: z.string().describe('Base64 encoded icon (optional; string)').optional(),
  providerName: z.string().describe('Name of the entity distributing the package (optional; string)').optional(),
  maintainers: z
    .array(MaintainerSchema)
    .describe(
      'List of maintainer info for the package. Currently only supports the name key. (optional; array of maintner info)',
    )
    .optional(),
  categories: z.array(z.string()).describe('Classifiers of the package (optional; Array of strings)').optional(),
  supportDescription: z
    .string()
    .describe('Description of the support available for the package (optional; string)')
    .optional(),
});

/** Descriptive information about a package (all its versions). */
export type PackageMetadataSpec = z.infer<typeof PackageMetadataSpecSchema>;

/** A whole `PackageMetadata` object (`data.packaging.carvel.dev/v1alpha1`); `metadata.name` is the refName. */
export const PackageMetadataSchema = z.object({
  apiVersion: z.literal(PackageMetadataResource.apiVersion),
  kind: z.literal(PackageMetadataResource.kind),
  metadata: ObjectMetaSchema,
  spec: PackageMetadataSpecSchema,
});

/** A PackageMetadata. */
export type PackageMetadata = z.infer<typeof PackageMetadataSchema>;
