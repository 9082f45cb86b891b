/**
 * `Package` and `PackageMetadata` (`data.packaging.carvel.dev/v1alpha1`, namespaced).
 *
 * Mirrors `pkg/apiserver/apis/datapackaging/v1alpha1/types.go` (same specs as the internal CRDs
 * of `pkg/apis/internalpackaging/v1alpha1/types.go`). Neither kind has a status.
 *
 * Upstream's aggregated API validates on create and update
 * (`pkg/apiserver/apis/datapackaging/validation/validations.go`): `spec.refName` is a DNS-1123
 * subdomain with at least three dot-separated segments, `spec.version` is strict semver, and a
 * Package's `metadata.name` is `<refName>.<version>`. kapp-lambda serves both kinds as plain CRDs,
 * so the same rules are CEL validation rules (`x-kubernetes-validations`) of the generated CRDs,
 * enforced by the API server on every write: {@link PackageValidationMessage} holds their texts,
 * {@link PACKAGE_OBJECT_RULES} and {@link PACKAGE_METADATA_OBJECT_RULES} the object-level rules;
 * the field-level ones sit on the fields below.
 *
 * **Package names and build metadata.** A Kubernetes object name is a lowercase DNS-1123
 * subdomain, so it cannot hold the `+` of semver build metadata (`2.2.0+kadras.2`) nor uppercase
 * letters. A Package's `metadata.name` is therefore {@link packageObjectName}: `<refName>.<version>`
 * with every `+` written as `--` ({@link PACKAGE_NAME_PLUS}); `spec.refName` and `spec.version`
 * stay exact. The encoding is one-to-one because versions containing `--`, `-+` or `+-` (legal but
 * odd semver) are refused, and versions with uppercase letters are refused rather than lowercased
 * (semver precedence is case-sensitive, so lowercasing could merge two versions). Upstream stores
 * such names base32hex-encoded behind its aggregated API instead (reference §3.13).
 *
 * @module
 */
import * as z from 'zod';
import { AppSpecSchema } from './app.js';
import { ObjectMetaSchema, TimeSchema } from './common.js';
import { DNS1123_SUBDOMAIN_MAX, DNS1123_SUBDOMAIN_MESSAGE, DNS1123_SUBDOMAIN_REGEX } from './names.js';
import { PackageMetadataResource, PackageResource } from './resources.js';

/**
 * Upstream's validation messages (`validations.go`, and `IsDNS1123Subdomain` of
 * k8s.io/apimachinery), verbatim where CEL can say the same; the API server prefixes them with the
 * field path and `Invalid value` / `Required value` as upstream's `field.Error`s.
 */
export const PackageValidationMessage = {
  /** `spec.refName` missing or empty (upstream `field.Required(..., "can not be empty")`). */
  refNameEmpty: 'can not be empty',
  /** `spec.version` missing or empty (upstream `field.Invalid(..., "cannot be empty")`). */
  versionEmpty: 'cannot be empty',
  /** `spec.refName` or a PackageMetadata name that is not a DNS-1123 subdomain. */
  notSubdomain: DNS1123_SUBDOMAIN_MESSAGE,
  /** `spec.refName` or a PackageMetadata name with fewer than three segments. */
  fewSegments: 'should be a domain with at least three segments separated by dots',
  /**
   * `spec.version` is not strict semver. Upstream appends blang/semver's parse error
   * (`must be valid semver: <error>`), which CEL cannot reproduce; this names the expected form.
   */
  notSemver:
    "must be valid semver: expected <major>.<minor>.<patch>[-<prerelease>][+<build>] without a 'v' prefix or leading zeroes",
  /** `metadata.name` of a Package is not {@link packageObjectName} of its spec (upstream's text, plus the encoding). */
  nameMismatch: "must be <spec.refName> + '.' + <spec.version> (with each '+' of spec.version written as '--')",
  /** kapp-lambda only: an uppercase version cannot be part of a Kubernetes name. */
  versionUppercase:
    "must not contain uppercase letters: metadata.name is <spec.refName> + '.' + <spec.version> and Kubernetes names are lowercase",
  /** kapp-lambda only: these sequences would make the `+` → `--` encoding ambiguous. */
  versionAmbiguous:
    "must not contain '--', '-+' or '+-': metadata.name writes each '+' of spec.version as '--', which must stay unambiguous",
} as const;

/** What a `+` of `spec.version` becomes in a Package's `metadata.name` (see {@link packageObjectName}). */
export const PACKAGE_NAME_PLUS = '--';

/** Version substrings refused because they would make the {@link PACKAGE_NAME_PLUS} encoding ambiguous. */
const AMBIGUOUS_IN_VERSION = ['--', '-+', '+-'] as const;

/**
 * Strict semver 2.0.0 (semver.org's regex, RE2- and JS-compatible): what blang/semver's `Parse`
 * (upstream's `versions.NewSemver`) accepts: no `v` prefix, no leading zeroes in numeric parts,
 * prerelease and build metadata allowed.
 */
export const STRICT_SEMVER_REGEX =
  /^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$/;

/** At least three dot-separated segments (upstream `len(strings.Split(name, ".")) < 3` is an error). */
const THREE_SEGMENTS_REGEX = /^[^.]*\.[^.]*\./;

/** A CRD validation rule (`ValidationRule` of apiextensions.k8s.io/v1). */
export interface CelRule {
  /** CEL expression; `self` is the node the rule sits on. */
  readonly rule: string;
  /** Error text when the rule is false. */
  readonly message: string;
  /** Where the error is reported, relative to the node (e.g. `.metadata.name`). */
  readonly fieldPath?: string;
  /** `FieldValueInvalid` (default), `FieldValueRequired`, `FieldValueForbidden` or `FieldValueDuplicate`. */
  readonly reason?: 'FieldValueRequired';
}

/** A CEL string literal (CEL accepts JSON's escapes). */
const cel = (text: string): string => JSON.stringify(text);

/** The CEL form of the {@link PACKAGE_NAME_PLUS} encoding applied to a version expression. */
const celEncodedVersion = (version: string): string => `${version}.replace('+', ${cel(PACKAGE_NAME_PLUS)})`;

/** Rules of a refName: `spec.refName`, and (through the object rules) a PackageMetadata name. */
const REF_NAME_RULES: readonly CelRule[] = [
  {
    rule: `self == '' || self.matches(${cel(DNS1123_SUBDOMAIN_REGEX.source)})`,
    message: PackageValidationMessage.notSubdomain,
  },
  {
    rule: `!self.matches(${cel(DNS1123_SUBDOMAIN_REGEX.source)}) || self.matches(${cel(THREE_SEGMENTS_REGEX.source)})`,
    message: PackageValidationMessage.fewSegments,
  },
];

/** Rules of `spec.version`. */
const VERSION_RULES: readonly CelRule[] = [
  {
    rule: `self == '' || self.matches(${cel(STRICT_SEMVER_REGEX.source)})`,
    message: PackageValidationMessage.notSemver,
  },
  { rule: `!self.matches('[A-Z]')`, message: PackageValidationMessage.versionUppercase },
  {
    rule: AMBIGUOUS_IN_VERSION.map((s) => `!self.contains(${cel(s)})`).join(' && '),
    message: PackageValidationMessage.versionAmbiguous,
  },
];

/** Rules of `Package.spec`: both fields required and non-empty, reported on the field. */
const PACKAGE_SPEC_RULES: readonly CelRule[] = [
  {
    rule: "has(self.refName) && self.refName != ''",
    message: PackageValidationMessage.refNameEmpty,
    fieldPath: '.refName',
    reason: 'FieldValueRequired',
  },
  {
    rule: "has(self.version) && self.version != ''",
    message: PackageValidationMessage.versionEmpty,
    fieldPath: '.version',
  },
];

/**
 * Object-level rules of a Package (they need `metadata.name`, which only the root can see):
 * the name is {@link packageObjectName} of the spec.
 */
export const PACKAGE_OBJECT_RULES: readonly CelRule[] = [
  {
    rule: `!has(self.spec.refName) || !has(self.spec.version) || self.metadata.name == self.spec.refName + '.' + ${celEncodedVersion('self.spec.version')}`,
    message: PackageValidationMessage.nameMismatch,
    fieldPath: '.metadata.name',
  },
];

/**
 * Object-level rules of a PackageMetadata: its name is a refName with at least three segments.
 * The API server itself already requires a DNS-1123 subdomain (with upstream's message), and
 * runs these rules even when that fails, so the segment rule holds for a name that is not one:
 * upstream's `IsFullyQualifiedName` answers one message, the first check that fails.
 */
export const PACKAGE_METADATA_OBJECT_RULES: readonly CelRule[] = [
  {
    rule: `size(self.metadata.name) > ${DNS1123_SUBDOMAIN_MAX} || !self.metadata.name.matches(${cel(DNS1123_SUBDOMAIN_REGEX.source)}) || self.metadata.name.matches(${cel(THREE_SEGMENTS_REGEX.source)})`,
    message: PackageValidationMessage.fewSegments,
    fieldPath: '.metadata.name',
  },
];

/** Rules on one field, as zod metadata the CRD generator copies into the schema. */
const rules = (list: readonly CelRule[]) => ({ 'x-kubernetes-validations': list.map((r) => ({ ...r })) });

/**
 * A refName or version that no Package `metadata.name` can represent (see
 * {@link packageObjectName}). `message` is `spec.version: Invalid value: "<version>": <reason>`.
 */
export class PackageNameError extends Error {
  /** The offending field, e.g. `spec.version`. */
  readonly field: string;
  /** The offending value. */
  readonly value: string;
  constructor(field: string, value: string, reason: string) {
    super(`${field}: Invalid value: ${JSON.stringify(value)}: ${reason}`);
    this.name = 'PackageNameError';
    this.field = field;
    this.value = value;
  }
}

/**
 * The `metadata.name` of the Package with `refName` and `version`: `<refName>.<version>` with each
 * `+` written as `--` (`crossplane.packages.kadras.io` + `2.2.0+kadras.2` →
 * `crossplane.packages.kadras.io.2.2.0--kadras.2`); the identity for every version without `+`.
 * The CRD's CEL rule accepts exactly this name; `spec` keeps refName and version exact. Upstream
 * names the object `<refName>.<version>` verbatim and stores it base32hex-encoded (§3.13).
 *
 * Pure. Does not check that `version` is semver or `refName` a valid refName: the API server's
 * CEL rules do, with upstream's messages.
 *
 * @throws {PackageNameError} when `version` has uppercase letters ({@link PackageValidationMessage}
 *   `versionUppercase`) or contains `--`, `-+` or `+-` (`versionAmbiguous`): no name could stand
 *   for it without colliding with another version.
 */
export function packageObjectName(refName: string, version: string): string {
  if (/[A-Z]/.test(version)) {
    throw new PackageNameError('spec.version', version, PackageValidationMessage.versionUppercase);
  }
  if (AMBIGUOUS_IN_VERSION.some((s) => version.includes(s))) {
    throw new PackageNameError('spec.version', version, PackageValidationMessage.versionAmbiguous);
  }
  return `${refName}.${version.replaceAll('+', PACKAGE_NAME_PLUS)}`;
}

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
export const PackageSpecSchema = z
  .object({
    refName: z
      .string()
      .describe(
        'The name of the PackageMetadata associated with this version Must be a valid PackageMetadata name (see PackageMetadata CR for details) Cannot be empty',
      )
      .max(DNS1123_SUBDOMAIN_MAX)
      .meta(rules(REF_NAME_RULES))
      .optional(),
    version: z
      .string()
      .describe('Package version; Referenced by PackageInstall; Must be valid semver (required) Cannot be empty')
      .max(DNS1123_SUBDOMAIN_MAX)
      .meta(rules(VERSION_RULES))
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
  })
  .meta(rules(PACKAGE_SPEC_RULES));

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
