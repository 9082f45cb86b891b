/**
 * Defaults kapp-controller applies when a field is absent. The CRDs carry no `default:` (as
 * upstream's), so stored objects keep exactly what the user wrote; code reads the effective
 * value through these helpers.
 *
 * Sources: `pkg/fetch/vendir.go` (git depth), `pkg/kubeconfig/kubeconfig_secrets.go` (secret key),
 * `pkg/template/helm_template.go` (helm name and namespace), `pkg/config/config.go` and
 * `pkg/pkgrepository/app.go` (sync periods).
 *
 * @module
 */
import type { AppClusterKubeconfigSecretRef } from './app.js';
import type { ObjectMeta } from './common.js';
import type { AppFetch, AppFetchGit } from './fetch.js';
import type { AppTemplateHelmTemplate } from './template.js';

/** `spec.fetch[].git.depth` when absent: only the latest commit. `0` means full history. */
export const DEFAULT_GIT_DEPTH = 1;

/** `spec.cluster.kubeconfigSecretRef.key` when absent or empty. */
export const DEFAULT_KUBECONFIG_SECRET_KEY = 'value';

/** App `spec.syncPeriod` when absent (controller config `appDefaultSyncPeriod`, default 30s). */
export const DEFAULT_APP_SYNC_PERIOD = '30s';

/**
 * PackageInstall `spec.syncPeriod` when absent (controller config
 * `packageInstallDefaultSyncPeriod`, default 10m); copied to the generated App.
 */
export const DEFAULT_PACKAGE_INSTALL_SYNC_PERIOD = '10m';

/** PackageRepository `spec.syncPeriod` when absent. */
export const DEFAULT_PACKAGE_REPOSITORY_SYNC_PERIOD = '10m';

/** Shortest effective sync period: shorter values are raised to this (`appMinimumSyncPeriod` floor). */
export const MINIMUM_SYNC_PERIOD = '30s';

/** Effective git clone depth: `git.depth`, or {@link DEFAULT_GIT_DEPTH} (1) when absent; 0 = full history. */
export function gitDepth(git: AppFetchGit): number {
  return git.depth ?? DEFAULT_GIT_DEPTH;
}

/** Effective kubeconfig key: `ref.key`, or {@link DEFAULT_KUBECONFIG_SECRET_KEY} (`value`) when absent or empty. */
export function kubeconfigSecretKey(ref: AppClusterKubeconfigSecretRef): string {
  return ref.key ? ref.key : DEFAULT_KUBECONFIG_SECRET_KEY;
}

/** Effective `helm template` release name: `helmTemplate.name`, or the App's name when absent or empty. */
export function helmTemplateName(helm: AppTemplateHelmTemplate, app: { metadata: ObjectMeta }): string {
  return helm.name ? helm.name : (app.metadata.name ?? '');
}

/** Effective `helm template --namespace`: `helmTemplate.namespace`, or the App's namespace when absent or empty. */
export function helmTemplateNamespace(helm: AppTemplateHelmTemplate, app: { metadata: ObjectMeta }): string {
  return helm.namespace ? helm.namespace : (app.metadata.namespace ?? '');
}

/** Directory a fetch entry lands in: `fetch.path`, or its zero-based `index` (`"0"`, `"1"`, ...) when absent or empty. */
export function fetchDirectoryName(fetch: AppFetch, index: number): string {
  return fetch.path ? fetch.path : String(index);
}
