/**
 * `spec.fetch[]` of an App (and the sources a PackageRepository can fetch from).
 *
 * Mirrors `pkg/apis/kappctrl/v1alpha1/types_fetch.go`. kapp-controller maps each entry to one
 * vendir directory (`pkg/fetch/vendir.go`); set exactly one source per entry (checked at
 * reconcile time, `Fetching (i): Unsupported way to fetch templates`, not by the schema).
 *
 * Secret key conventions (implemented by vendir, not validated by kapp-controller):
 * image and imgpkgBundle take `username` + `password`, or `token`, or a `.dockerconfigjson`
 * secret; git takes `ssh-privatekey`, `ssh-knownhosts`, `username` + `password`; http and
 * helmChart take `username` + `password`.
 *
 * @module
 */
import * as z from 'zod';
import { Int64Schema, LocalRefSchema, VersionSelectionSchema } from './common.js';
import { DEFAULT_GIT_DEPTH } from './defaults.js';

/**
 * A Secret or ConfigMap whose data keys become files `<directoryPath>/<key>`
 * (`AppFetchInlineSourceRef`).
 */
export const AppFetchInlineSourceRefSchema = z.object({
  directoryPath: z.string().describe('Specifies where to place files found in secret (optional)').optional(),
  name: z.string().optional(),
});

/** Reference to a Secret or ConfigMap providing inline files. */
export type AppFetchInlineSourceRef = z.infer<typeof AppFetchInlineSourceRefSchema>;

/** One `pathsFrom` entry: a Secret or a ConfigMap (`AppFetchInlineSource`). */
export const AppFetchInlineSourceSchema = z.object({
  secretRef: AppFetchInlineSourceRefSchema.optional(),
  configMapRef: AppFetchInlineSourceRefSchema.optional(),
});

/** One inline content source. */
export type AppFetchInlineSource = z.infer<typeof AppFetchInlineSourceSchema>;

/**
 * Content from the resource itself or from Secrets/ConfigMaps (`AppFetchInline`; vendir `inline`).
 * Also used by `template[].ytt.inline`.
 */
export const AppFetchInlineSchema = z.object({
  paths: z
    .record(z.string(), z.string())
    .describe(
      'Specifies mapping of paths to their content; not recommended for sensitive values as CR is not encrypted (optional)',
    )
    .optional(),
  pathsFrom: z
    .array(AppFetchInlineSourceSchema)
    .describe(
      'Specifies content via secrets and config maps; data values are recommended to be placed in secrets (optional)',
    )
    .optional(),
});

/** Inline fetch source. */
export type AppFetchInline = z.infer<typeof AppFetchInlineSchema>;

/** Description of the registry secret shared by `image` and `imgpkgBundle`. */
const REGISTRY_SECRET =
  'Secret may include one or more keys: username, password, token. By default anonymous access is used for authentication.';

/** Description of `tagSelection` shared by `image` and `imgpkgBundle`. */
const TAG_SELECTION =
  'Specifies a strategy to choose a tag (optional; v0.24.0+) if specified, do not include a tag in url key';

/** An OCI image whose layers hold the content (`AppFetchImage`; vendir `image`). */
export const AppFetchImageSchema = z.object({
  url: z
    .string()
    .describe(
      'Docker image url; unqualified, tagged, or digest references supported (required) Example: username/app1-config:v0.1.0',
    )
    .optional(),
  tagSelection: VersionSelectionSchema.describe(TAG_SELECTION).optional(),
  secretRef: LocalRefSchema.describe(REGISTRY_SECRET).optional(),
  subPath: z.string().describe('Grab only portion of image (optional); becomes vendir newRootPath').optional(),
});

/** Image fetch source. */
export type AppFetchImage = z.infer<typeof AppFetchImageSchema>;

/** A file downloaded over HTTP(S) (`AppFetchHTTP`; vendir `http`). */
export const AppFetchHTTPSchema = z.object({
  url: z
    .string()
    .describe(
      'URL can point to one of following formats: text, tgz, zip http and https url are supported; plain file, tgz and tar types are supported (required)',
    )
    .optional(),
  sha256: z.string().describe('Checksum to verify after download (optional)').optional(),
  secretRef: LocalRefSchema.describe(
    'Secret to provide auth details (optional) Secret may include one or more keys: username, password',
  ).optional(),
  subPath: z.string().describe('Grab only portion of download (optional); becomes vendir newRootPath').optional(),
});

/** HTTP fetch source. */
export type AppFetchHTTP = z.infer<typeof AppFetchHTTPSchema>;

/** A git repository (`AppFetchGit`; vendir `git`). */
export const AppFetchGitSchema = z.object({
  url: z.string().describe('http or ssh urls are supported (required)').optional(),
  ref: z.string().describe('Branch, tag, commit; origin is the name of the remote (optional)').optional(),
  refSelection: VersionSelectionSchema.describe(
    'Specifies a strategy to resolve to an explicit ref (optional; v0.24.0+)',
  ).optional(),
  secretRef: LocalRefSchema.describe(
    'Secret with auth details. allowed keys: ssh-privatekey, ssh-knownhosts, username, password (optional) (if ssh-knownhosts is not specified, git will not perform strict host checking)',
  ).optional(),
  subPath: z.string().describe('Grab only portion of repository (optional)').optional(),
  lfsSkipSmudge: z.boolean().describe('Skip lfs download (optional; default false)').optional(),
  forceHTTPBasicAuth: z
    .boolean()
    .describe('Force the usage of HTTP Basic Auth when Basic Auth is provided (optional; default false)')
    .optional(),
  depth: Int64Schema.describe(
    `depth of commits to fetch; ${DEFAULT_GIT_DEPTH} (default) means only latest commit, 0 means everything (optional)`,
  ).optional(),
});

/** Git fetch source. `depth` defaults to 1 (`DEFAULT_GIT_DEPTH`, applied by `fetch/vendir.ts`). */
export type AppFetchGit = z.infer<typeof AppFetchGitSchema>;

/** The chart repository of a `helmChart` fetch (`AppFetchHelmChartRepo`). */
export const AppFetchHelmChartRepoSchema = z.object({
  url: z
    .string()
    .describe('Repository url; scheme of oci:// will fetch experimental helm oci chart (v0.19.0+) (required)')
    .optional(),
  secretRef: LocalRefSchema.describe('Secret with keys username, password (optional)').optional(),
});

/** Helm chart repository. */
export type AppFetchHelmChartRepo = z.infer<typeof AppFetchHelmChartRepoSchema>;

/** A Helm chart (`AppFetchHelmChart`; vendir `helmChart`). */
export const AppFetchHelmChartSchema = z.object({
  name: z.string().describe('Example: stable/redis').optional(),
  version: z.string().optional(),
  repository: AppFetchHelmChartRepoSchema.optional(),
});

/** Helm chart fetch source. */
export type AppFetchHelmChart = z.infer<typeof AppFetchHelmChartSchema>;

/** An imgpkg bundle (`AppFetchImgpkgBundle`; vendir `imgpkgBundle`). */
export const AppFetchImgpkgBundleSchema = z.object({
  image: z
    .string()
    .describe('Docker image url; unqualified, tagged, or digest references supported (required)')
    .optional(),
  tagSelection: VersionSelectionSchema.describe(TAG_SELECTION).optional(),
  secretRef: LocalRefSchema.describe(REGISTRY_SECRET).optional(),
});

/** imgpkg bundle fetch source. */
export type AppFetchImgpkgBundle = z.infer<typeof AppFetchImgpkgBundleSchema>;

/**
 * One `spec.fetch[]` entry (`AppFetch`): exactly one source plus an optional `path`. The fetched
 * content lands in directory `<path>` or, by default, `"<index>"` (see `fetchDirectoryName` in
 * `fetch/vendir.ts`).
 */
export const AppFetchSchema = z.object({
  inline: AppFetchInlineSchema.describe(
    'Pulls content from within this resource; or other resources in the cluster',
  ).optional(),
  image: AppFetchImageSchema.describe('Pulls content from Docker/OCI registry').optional(),
  http: AppFetchHTTPSchema.describe('Uses http library to fetch file').optional(),
  git: AppFetchGitSchema.describe('Uses git to clone repository').optional(),
  helmChart: AppFetchHelmChartSchema.describe('Uses helm fetch to fetch specified chart').optional(),
  imgpkgBundle: AppFetchImgpkgBundleSchema.describe(
    'Pulls imgpkg bundle from Docker/OCI registry (v0.17.0+)',
  ).optional(),
  path: z
    .string()
    .describe('Relative path to place the fetched artifacts (optional; default is the entry index, e.g. "0")')
    .optional(),
});

/** One fetch step of an App. */
export type AppFetch = z.infer<typeof AppFetchSchema>;
