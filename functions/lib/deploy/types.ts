/**
 * The App types the deploy planner reads (upstream `types.go`, `types_deploy.go`), re-exported from
 * the zod schemas in `functions/lib/api/`.
 *
 * @module
 */
import type * as api from '../api/index.js';

/** `AppDeployKapp`: `intoNs`, `mapNs`, `rawOptions`, `inspect` (unset: no inspect), `delete`. */
export type AppDeployKapp = api.AppDeployKapp;

/** One `spec.deploy[]` entry (`kapp`). */
export type AppDeploy = api.AppDeploy;

/** `AppCluster`: `namespace`, `kubeconfigSecretRef.{name,key}` (key default `value`). */
export type AppCluster = api.AppCluster;

/** The spec fields that decide credentials, namespaces and the kapp invocation. */
export type AppDeploySpec = Pick<api.AppSpec, 'serviceAccountName' | 'cluster' | 'defaultNamespace' | 'deploy'>;
