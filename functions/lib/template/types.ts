/**
 * Minimal structural shapes for `spec.template[]` (`AppTemplate`), with upstream's JSON names
 * (`pkg/apis/kappctrl/v1alpha1/types_template.go`). Every field is optional, as in the CRD, so
 * the zod-inferred types of `functions/lib/api/` are assignable to these.
 *
 * @module
 */
import type { AppFetchInline } from '../fetch/types.js';

/** `AppTemplateValuesSourceRef`: a Secret or ConfigMap whose every key becomes a values file. */
export interface ValuesSourceRef {
  /** Object name (App namespace). */
  name?: string;
}

/** `AppTemplateValuesDownwardAPIItem`: one value taken from the App or the cluster. */
export interface DownwardAPIItem {
  /** Key in the values file; `.` separates nested keys (fieldPath only), `\.` is a literal dot. */
  name?: string;
  /** Relaxed JSONPath over `{metadata: {name, namespace, uid, labels, annotations}}`. */
  fieldPath?: string;
  /** Kubernetes version; `version` unset means the live cluster's. */
  kubernetesVersion?: { version?: string };
  /** Controller version; `version` unset means the running one. */
  kappControllerVersion?: { version?: string };
  /** API group/versions; `groupVersions` unset means the live cluster's. */
  kubernetesAPIs?: { groupVersions?: string[] };
}

/** `AppTemplateValuesSource`: exactly one of the fields. */
export interface ValuesSource {
  /** Secret whose keys become values files. */
  secretRef?: ValuesSourceRef;
  /** ConfigMap whose keys become values files. */
  configMapRef?: ValuesSourceRef;
  /** File relative to the template root; `-` means stdin. */
  path?: string;
  /** Values taken from the App or the cluster. */
  downwardAPI?: { items?: DownwardAPIItem[] };
}

/** `AppTemplateYtt`. */
export interface AppTemplateYtt {
  /** `--ignore-unknown-comments`. */
  ignoreUnknownComments?: boolean;
  /** Accepted but unused upstream (no `--strict` is passed). */
  strict?: boolean;
  /** Files written to a separate directory and passed as one more `-f`. */
  inline?: AppFetchInline;
  /** Paths relative to the template root; `-` means stdin. */
  paths?: string[];
  /** `--file-mark` values. */
  fileMarks?: string[];
  /** `--data-values-file` sources. */
  valuesFrom?: ValuesSource[];
}

/** `AppTemplateKbld`. */
export interface AppTemplateKbld {
  /** Paths relative to the template root; `-` means stdin. */
  paths?: string[];
}

/** `AppTemplateHelmTemplate`. */
export interface AppTemplateHelmTemplate {
  /** Release name (default: App name). */
  name?: string;
  /** Release namespace (default: App namespace). */
  namespace?: string;
  /** Chart directory relative to the template root (default: the root). */
  path?: string;
  /** `--values` sources. */
  valuesFrom?: ValuesSource[];
  /** `--kube-version`; see `planHelmTemplate` for how `version` is used. */
  kubernetesVersion?: { version?: string };
  /** `--api-versions`; see `planHelmTemplate` for how `groupVersions` is used. */
  kubernetesAPIs?: { groupVersions?: string[] };
}

/** `AppTemplateSopsPrivateKeysSecretRef`. */
export interface SopsPrivateKeysSecretRef {
  /** Secret name (App namespace); every value is a private key. */
  name?: string;
}

/** `AppTemplateSops`. */
export interface AppTemplateSops {
  /** PGP keys (armored private key block). */
  pgp?: { privateKeysSecretRef?: SopsPrivateKeysSecretRef };
  /** age keys (`AGE-SECRET-KEY-...` lines). */
  age?: { privateKeysSecretRef?: SopsPrivateKeysSecretRef };
  /** Files or directories (relative to the template root) to decrypt; default: the root. */
  paths?: string[];
}

/** `AppTemplateCue`. */
export interface AppTemplateCue {
  /** Inputs relative to the template root (default `.`), passed as given after a scope check. */
  paths?: string[];
  /** Positional values files. */
  valuesFrom?: ValuesSource[];
  /** `--path <inputExpression>` (where values are placed). */
  inputExpression?: string;
  /** `--expression <outputExpression>`. */
  outputExpression?: string;
}

/** One `spec.template[]` entry: exactly one templater. */
export interface AppTemplate {
  /** ytt. */
  ytt?: AppTemplateYtt;
  /** kbld (never builds). */
  kbld?: AppTemplateKbld;
  /** `helm template`. */
  helmTemplate?: AppTemplateHelmTemplate;
  /** sops decryption (rewrites the directory, emits no stream). */
  sops?: AppTemplateSops;
  /** `cue export`. */
  cue?: AppTemplateCue;
  /** Declared but not implemented upstream (`Unsupported way to template`). */
  kustomize?: Record<string, unknown>;
  /** Declared but not implemented upstream (`Unsupported way to template`). */
  jsonnet?: Record<string, unknown>;
}
