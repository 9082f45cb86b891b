/**
 * Minimal structural shapes for the parts of an App the deploy planner reads, with upstream's JSON
 * names (`pkg/apis/kappctrl/v1alpha1/types.go`, `types_deploy.go`). Every field is optional, as in
 * the CRD, so the zod-inferred types of `functions/lib/api/` are assignable to these.
 *
 * @module
 */

/** `AppDeployKapp`. */
export interface AppDeployKapp {
  /** `--into-ns <ns>`. */
  intoNs?: string;
  /** `--map-ns <src:dst>` each. */
  mapNs?: string[];
  /** Extra `kapp deploy` flags (`--name=value`, deploy allow-list). */
  rawOptions?: string[];
  /** `null`/unset: no inspect; `{}`: inspect after each deploy. */
  inspect?: { rawOptions?: string[] } | null;
  /** Extra `kapp delete` flags (delete allow-list). */
  delete?: { rawOptions?: string[] } | null;
}

/** One `spec.deploy[]` entry. */
export interface AppDeploy {
  /** The only supported deployer. */
  kapp?: AppDeployKapp;
}

/** `AppCluster`: deploy to another cluster through a kubeconfig Secret. */
export interface AppCluster {
  /** Namespace in the destination cluster (`--namespace` and `--app-namespace`). */
  namespace?: string;
  /** Secret (App namespace) holding the kubeconfig. */
  kubeconfigSecretRef?: {
    /** Secret name. */
    name?: string;
    /** Key holding the kubeconfig YAML (default `value`). */
    key?: string;
  };
}

/** The spec fields that decide credentials, namespaces and the kapp invocation. */
export interface AppDeploySpec {
  /** ServiceAccount in the App namespace (wins over `cluster`). */
  serviceAccountName?: string;
  /** Destination cluster via kubeconfig Secret. */
  cluster?: AppCluster | null;
  /** Default namespace for resources without one (`--namespace`). */
  defaultNamespace?: string;
  /** Exactly one entry with `kapp`. */
  deploy?: AppDeploy[];
}
