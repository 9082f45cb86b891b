/**
 * Minimal structural shapes for the parts of an App (and of Secrets and ConfigMaps) that the
 * fetch planner reads. Field names are exactly upstream's JSON names
 * (`pkg/apis/kappctrl/v1alpha1/types_fetch.go`, `k8s.io/api/core/v1`). Every field is optional, as
 * in the CRD, so the zod-inferred types of `functions/lib/api/` are assignable to these.
 *
 * @module
 */

import type * as api from '../api/index.js';

/** `AppFetchLocalRef`: a reference to a Secret in the App's namespace (`name`). */
export type LocalRef = api.LocalRef;

/** vendir `VersionSelection` (`semver.constraints`, `semver.prereleases.identifiers`). */
export type VersionSelection = api.VersionSelection;

/** `AppFetchInlineSourceRef`: a Secret or ConfigMap (`name`) whose keys go to `directoryPath`. */
export type InlineSourceRef = api.AppFetchInlineSourceRef;

/** `AppFetchInline`: `paths` (file to content) and `pathsFrom` (Secrets/ConfigMaps). */
export type AppFetchInline = api.AppFetchInline;

/** `AppFetchImage`: `url`, `tagSelection`, `secretRef`, `subPath`. */
export type AppFetchImage = api.AppFetchImage;

/** `AppFetchHTTP`: `url`, `sha256`, `secretRef`, `subPath`. */
export type AppFetchHTTP = api.AppFetchHTTP;

/**
 * `AppFetchGit`: `url`, `ref`, `refSelection`, `secretRef`, `subPath`, `lfsSkipSmudge`,
 * `forceHTTPBasicAuth`, `depth` (unset means 1, 0 means the full history).
 */
export type AppFetchGit = api.AppFetchGit;

/** `AppFetchHelmChart`: `name`, `version`, `repository.{url,secretRef}`. */
export type AppFetchHelmChart = api.AppFetchHelmChart;

/** `AppFetchImgpkgBundle`: `image`, `tagSelection`, `secretRef`. */
export type AppFetchImgpkgBundle = api.AppFetchImgpkgBundle;

/** One `spec.fetch[]` entry (`AppFetch`): exactly one source plus an optional `path`. */
export type AppFetch = api.AppFetch;

/** The metadata fields the planners read from an App. */
export interface AppMetadataLike {
  /** App name. */
  name?: string;
  /** App namespace. */
  namespace?: string;
  /** App UID (vendir cache key, downward API `metadata.uid`). */
  uid?: string;
  /** Labels (downward API). */
  labels?: Record<string, string>;
  /** Annotations (downward API). */
  annotations?: Record<string, string>;
}

/**
 * A Secret as read from the API server (`data` values are base64). Only the fields below are
 * ever used or forwarded.
 */
export interface SecretLike {
  /** `v1`. */
  apiVersion?: string;
  /** `Secret`. */
  kind?: string;
  /** Object metadata; `name` identifies the Secret. */
  metadata?: { name?: string; namespace?: string };
  /** Secret type, e.g. `kubernetes.io/dockerconfigjson`. */
  type?: string;
  /** Key to base64-encoded value. */
  data?: Record<string, string>;
}

/** A ConfigMap as read from the API server. */
export interface ConfigMapLike {
  /** `v1`. */
  apiVersion?: string;
  /** `ConfigMap`. */
  kind?: string;
  /** Object metadata; `name` identifies the ConfigMap. */
  metadata?: { name?: string; namespace?: string };
  /** Key to UTF-8 value. */
  data?: Record<string, string>;
  /** Key to base64 value (forwarded to vendir, never used for template values, as upstream). */
  binaryData?: Record<string, string>;
}

/**
 * Secrets and ConfigMaps of the App's namespace, looked up by name. `undefined` means not found
 * (the planners then fail with the API server's text, e.g. `secrets "x" not found`).
 */
export interface RefObjects {
  /** Looks up a Secret by name. */
  secret(name: string): SecretLike | undefined;
  /** Looks up a ConfigMap by name. */
  configMap(name: string): ConfigMapLike | undefined;
}

/**
 * Builds a {@link RefObjects} from lists of objects (keyed by `metadata.name`; later duplicates
 * win). Lookups use a `Map`, so names like `__proto__` are safe.
 *
 * @param objects - the Secrets and ConfigMaps the caller fetched
 * @returns a lookup over them
 */
export function refObjectsFrom(objects: { secrets?: SecretLike[]; configMaps?: ConfigMapLike[] }): RefObjects {
  const secrets = new Map<string, SecretLike>();
  const configMaps = new Map<string, ConfigMapLike>();
  for (const s of objects.secrets ?? []) if (s.metadata?.name !== undefined) secrets.set(s.metadata.name, s);
  for (const c of objects.configMaps ?? []) if (c.metadata?.name !== undefined) configMaps.set(c.metadata.name, c);
  return {
    secret: (name) => secrets.get(name),
    configMap: (name) => configMaps.get(name),
  };
}

/** The API server's NotFound text for a Secret: `secrets "<name>" not found`. */
export function secretNotFoundMessage(name: string): string {
  return `secrets "${name}" not found`;
}

/** The API server's NotFound text for a ConfigMap: `configmaps "<name>" not found`. */
export function configMapNotFoundMessage(name: string): string {
  return `configmaps "${name}" not found`;
}

/** The user-facing error type (`../reconcile/result.ts`), re-exported for the planners. */
export { KappControllerError } from '../reconcile/result.js';

/** What upstream substitutes for `exit status 1` in status error texts. */
export const SEE_USEFUL_ERROR_MESSAGE = 'Error (see .status.usefulErrorMessage for details)';

/**
 * The status error text for a failed tool run, as upstream's `CmdRunResult.AttachErrorf`
 * (`pkg/exec/cmd_run_result.go`): `<prefix><processError>`, except that a plain `exit status 1`
 * becomes {@link SEE_USEFUL_ERROR_MESSAGE}.
 *
 * @param prefix - stage prefix, e.g. `Fetching resources: `, `Templating dir: `, `Deploying: `
 * @param processError - Go-style process error text (`exit status 2`, `signal: killed`, ...)
 */
export function attachErrorf(prefix: string, processError: string): string {
  return `${prefix}${processError === 'exit status 1' ? SEE_USEFUL_ERROR_MESSAGE : processError}`;
}
