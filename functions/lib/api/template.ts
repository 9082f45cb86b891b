/**
 * `spec.template[]` of an App.
 *
 * Mirrors `pkg/apis/kappctrl/v1alpha1/types_template.go`. Each entry sets exactly one templater
 * (checked at reconcile time: `Unsupported way to template`). `kustomize` and `jsonnet` exist in
 * the API but are not implemented upstream (they fail the reconcile with that error).
 *
 * @module
 */
import * as z from 'zod';
import { LocalRefSchema } from './common.js';
import { AppFetchInlineSchema } from './fetch.js';

/**
 * A version value that may be left empty (`Version`): empty means "ask the live cluster" (or the
 * running controller, for `kappControllerVersion`).
 */
export const VersionValueSchema = z.object({
  version: z.string().optional(),
});

/** An optional explicit version. */
export type VersionValue = z.infer<typeof VersionValueSchema>;

/** API group/versions such as `apps/v1` (`KubernetesAPIs`); absent means the cluster's. */
export const KubernetesAPIsSchema = z.object({
  groupVersions: z.array(z.string()).optional(),
});

/** A list of API group/versions. */
export type KubernetesAPIs = z.infer<typeof KubernetesAPIsSchema>;

/**
 * One downward API value (`AppTemplateValuesDownwardAPIItem`): `name` is the data-value key
 * (nested keys separated by `.`, `\` escapes a dot) and exactly one of the other fields says
 * where the value comes from.
 */
export const AppTemplateValuesDownwardAPIItemSchema = z.object({
  name: z.string().optional(),
  fieldPath: z
    .string()
    .describe('Required: Selects a field of the app: only annotations, labels, uid, name and namespace are supported.')
    .optional(),
  kubernetesVersion: VersionValueSchema.describe(
    'Optional: Get running Kubernetes version from cluster, defaults (empty) to retrieving the version from the cluster. Can be manually supplied instead.',
  ).optional(),
  kappControllerVersion: VersionValueSchema.describe(
    'Optional: Get running KappController version, defaults (empty) to retrieving the current running version.. Can be manually supplied instead.',
  ).optional(),
  kubernetesAPIs: KubernetesAPIsSchema.describe(
    'Optional: Get running KubernetesAPIs from cluster, defaults (empty) to retrieving the APIs from the cluster. Can be manually supplied instead, e.g ["group/version", "group2/version2"]',
  ).optional(),
});

/** One downward API item. */
export type AppTemplateValuesDownwardAPIItem = z.infer<typeof AppTemplateValuesDownwardAPIItemSchema>;

/** Values from the App itself and the cluster (`AppTemplateValuesDownwardAPI`). */
export const AppTemplateValuesDownwardAPISchema = z.object({
  items: z.array(AppTemplateValuesDownwardAPIItemSchema).optional(),
});

/** Downward API values. */
export type AppTemplateValuesDownwardAPI = z.infer<typeof AppTemplateValuesDownwardAPISchema>;

/**
 * One `valuesFrom` entry (`AppTemplateValuesSource`, shared by ytt, helmTemplate and cue):
 * exactly one of a Secret, a ConfigMap (every data key becomes a values file, keys sorted), a
 * `path` relative to the template root (`-` means the previous step's output), or downward API
 * values.
 */
export const AppTemplateValuesSourceSchema = z.object({
  secretRef: LocalRefSchema.optional(),
  configMapRef: LocalRefSchema.optional(),
  path: z.string().optional(),
  downwardAPI: AppTemplateValuesDownwardAPISchema.optional(),
});

/** One values source. */
export type AppTemplateValuesSource = z.infer<typeof AppTemplateValuesSourceSchema>;

/** `ytt` templating (`AppTemplateYtt`). */
export const AppTemplateYttSchema = z.object({
  ignoreUnknownComments: z
    .boolean()
    .describe("Ignores comments that ytt doesn't recognize (optional; default=false)")
    .optional(),
  strict: z
    .boolean()
    .describe(
      'Forces strict mode https://github.com/k14s/ytt/blob/develop/docs/strict.md (optional; default=false). Accepted but ignored by upstream',
    )
    .optional(),
  inline: AppFetchInlineSchema.describe('Specify additional files, including data values (optional)').optional(),
  paths: z
    .array(z.string())
    .describe(
      'Lists paths to provide to ytt explicitly (optional; default: the previous step\'s output, or the template root for the first step; "-" means the previous step\'s output)',
    )
    .optional(),
  fileMarks: z
    .array(z.string())
    .describe(
      'Control metadata about input files passed to ytt (optional; v0.18.0+) see https://carvel.dev/ytt/docs/latest/file-marks/ for more details',
    )
    .optional(),
  valuesFrom: z
    .array(AppTemplateValuesSourceSchema)
    .describe("Provide values via ytt's --data-values-file (optional; v0.19.0-alpha.9)")
    .optional(),
});

/** ytt step. */
export type AppTemplateYtt = z.infer<typeof AppTemplateYttSchema>;

/** `kbld` image resolution (`AppTemplateKbld`); always run with `--build=false`. */
export const AppTemplateKbldSchema = z.object({
  paths: z
    .array(z.string())
    .describe(
      'Paths to resolve (optional; default: the previous step\'s output, or the template root for the first step; "-" means the previous step\'s output)',
    )
    .optional(),
});

/** kbld step. */
export type AppTemplateKbld = z.infer<typeof AppTemplateKbldSchema>;

/**
 * `helm template` (`AppTemplateHelmTemplate`). `name` defaults to the App's name, `namespace` to
 * the App's namespace and `path` to the template root (applied by `template/helm.ts`).
 */
export const AppTemplateHelmTemplateSchema = z.object({
  name: z.string().describe("Set name explicitly, default is App CR's name (optional; v0.13.0+)").optional(),
  namespace: z
    .string()
    .describe("Set namespace explicitly, default is App CR's namespace (optional; v0.13.0+)")
    .optional(),
  path: z.string().describe('Path to chart (optional; v0.13.0+; default: the template root)').optional(),
  valuesFrom: z
    .array(AppTemplateValuesSourceSchema)
    .describe('One or more secrets, config maps, paths that provide values (optional)')
    .optional(),
  kubernetesVersion: VersionValueSchema.describe(
    'Optional: Get Kubernetes version, defaults (empty) to retrieving the version from the cluster. Can be manually overridden to a value instead.',
  ).optional(),
  kubernetesAPIs: KubernetesAPIsSchema.describe(
    'Optional: Use kubernetes group/versions resources available in the live cluster',
  ).optional(),
});

/** helm template step. */
export type AppTemplateHelmTemplate = z.infer<typeof AppTemplateHelmTemplateSchema>;

/** `kustomize` (`AppTemplateKustomize`): an empty struct; not implemented upstream. */
export const AppTemplateKustomizeSchema = z.object({});

/** kustomize step (unsupported). */
export type AppTemplateKustomize = z.infer<typeof AppTemplateKustomizeSchema>;

/** `jsonnet` (`AppTemplateJsonnet`): an empty struct; not implemented upstream. */
export const AppTemplateJsonnetSchema = z.object({});

/** jsonnet step (unsupported). */
export type AppTemplateJsonnet = z.infer<typeof AppTemplateJsonnetSchema>;

/** The Secret holding sops private keys (`AppTemplateSopsPrivateKeysSecretRef`). */
export const AppTemplateSopsPrivateKeysSecretRefSchema = z.object({
  name: z.string().optional(),
});

/** Secret reference for sops keys. */
export type AppTemplateSopsPrivateKeysSecretRef = z.infer<typeof AppTemplateSopsPrivateKeysSecretRefSchema>;

/** sops PGP keys (`AppTemplateSopsPGP`). */
export const AppTemplateSopsPGPSchema = z.object({
  privateKeysSecretRef: AppTemplateSopsPrivateKeysSecretRefSchema.describe(
    'Secret with private armored PGP private keys (required)',
  ).optional(),
});

/** sops PGP configuration. */
export type AppTemplateSopsPGP = z.infer<typeof AppTemplateSopsPGPSchema>;

/** sops age keys (`AppTemplateSopsAge`). */
export const AppTemplateSopsAgeSchema = z.object({
  privateKeysSecretRef: AppTemplateSopsPrivateKeysSecretRefSchema.describe(
    'Secret with age private keys (required)',
  ).optional(),
});

/** sops age configuration. */
export type AppTemplateSopsAge = z.infer<typeof AppTemplateSopsAgeSchema>;

/**
 * `sops` decryption of `*.sops.yml`/`*.sops.yaml` in place (`AppTemplateSops`): one of `pgp` or
 * `age`.
 */
export const AppTemplateSopsSchema = z.object({
  pgp: AppTemplateSopsPGPSchema.describe('Use PGP to decrypt files (required)').optional(),
  age: AppTemplateSopsAgeSchema.describe('Use age to decrypt files').optional(),
  paths: z.array(z.string()).describe('Lists paths to decrypt explicitly (optional; v0.13.0+)').optional(),
});

/** sops step. */
export type AppTemplateSops = z.infer<typeof AppTemplateSopsSchema>;

/** `cue export` (`AppTemplateCue`), run with the template root as working directory. */
export const AppTemplateCueSchema = z.object({
  paths: z.array(z.string()).describe('Explicit list of files/directories (optional)').optional(),
  valuesFrom: z.array(AppTemplateValuesSourceSchema).describe('Provide values (optional)').optional(),
  inputExpression: z
    .string()
    .describe('Cue expression for single path component, can be used to unify ValuesFrom into a given field (optional)')
    .optional(),
  outputExpression: z
    .string()
    .describe('Cue expression to output, default will export all visible fields (optional)')
    .optional(),
});

/** cue step. */
export type AppTemplateCue = z.infer<typeof AppTemplateCueSchema>;

/** One `spec.template[]` entry (`AppTemplate`): exactly one templater. */
export const AppTemplateSchema = z.object({
  ytt: AppTemplateYttSchema.describe('Use ytt to template configuration').optional(),
  kbld: AppTemplateKbldSchema.describe('Use kbld to resolve image references to use digests').optional(),
  helmTemplate: AppTemplateHelmTemplateSchema.describe('Use helm template command to render helm chart').optional(),
  kustomize: AppTemplateKustomizeSchema.describe('TODO implement kustomize').optional(),
  jsonnet: AppTemplateJsonnetSchema.describe('TODO implement jsonnet').optional(),
  sops: AppTemplateSopsSchema.describe('Use sops to decrypt *.sops.yml files (optional; v0.11.0+)').optional(),
  cue: AppTemplateCueSchema.optional(),
});

/** One template step of an App. */
export type AppTemplate = z.infer<typeof AppTemplateSchema>;
