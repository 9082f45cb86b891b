/**
 * Defaults kapp-controller applies when a field is absent, as constants only. The CRDs carry no
 * `default:` (as upstream's), so stored objects keep exactly what the user wrote; the planner
 * that reads a field applies its default (`fetch/vendir.ts` the git depth and the fetch
 * directory, `deploy/kubeconfig.ts` the secret key, `template/helm.ts` the release name and
 * namespace, `reconcile/timer.ts` the sync periods).
 *
 * Sources: `pkg/fetch/vendir.go` (git depth), `pkg/kubeconfig/kubeconfig_secrets.go` (secret key),
 * `pkg/template/helm_template.go` (helm name and namespace), `pkg/config/config.go` and
 * `pkg/pkgrepository/app.go` (sync periods).
 *
 * @module
 */
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
