/**
 * `helm template` step planning. Mirrors kapp-controller `pkg/template/helm_template.go`.
 *
 * @module
 */
import { posix } from 'node:path';
import type { AppTemplateHelmTemplate } from '../api/template.js';
import { dns1123LabelError, helmReleaseNameError, quoteValue } from '../argv-values.js';
import { InvalidPathError, scopedPath } from '../paths.js';
import { KappControllerError } from '../reconcile/result.js';
import type { ClusterInfo } from './downward-api.js';
import { type RunStep, STDIN_UNAVAILABLE_MESSAGE, type StepContext, TEMPLATING_HELM_ERROR_PREFIX } from './step.js';
import { planValues, STDIN_PATH } from './values.js';

/**
 * Environment helm runs with: the in-cluster service variables are overridden so that
 * `helm template` can never reach a cluster.
 */
export const HELM_TEMPLATE_ENV: Readonly<Record<string, string>> = Object.freeze({
  KUBERNETES_SERVICE_HOST: 'not-real',
  KUBERNETES_SERVICE_PORT: 'not-real',
});

function liveValue<T>(value: T | Error | undefined, what: string): T {
  if (value instanceof Error) throw new KappControllerError(value.message, { cause: value });
  if (value === undefined) {
    throw new TypeError(`helmTemplate: ${what} is needed but was not provided (see requiredClusterInfo)`);
  }
  return value;
}

/**
 * The `--kube-version` value for a step with `kubernetesVersion` set: its explicit `version`, or
 * the live cluster version. Upstream always uses the live version here, ignoring `version`
 * (documented as "can be manually supplied"); this port honours it.
 */
export function helmKubeVersion(opts: AppTemplateHelmTemplate, cluster: ClusterInfo): string | undefined {
  if (!opts.kubernetesVersion) return undefined;
  return opts.kubernetesVersion.version || liveValue(cluster.kubernetesVersion, 'kubernetesVersion');
}

/**
 * The `--api-versions` group/versions for a step with `kubernetesAPIs` set: its explicit
 * `groupVersions`, or the live ones (upstream ignores the explicit list here; this port honours it).
 */
export function helmApiVersions(opts: AppTemplateHelmTemplate, cluster: ClusterInfo): string[] | undefined {
  if (!opts.kubernetesAPIs) return undefined;
  return opts.kubernetesAPIs.groupVersions ?? liveValue(cluster.kubernetesAPIs, 'kubernetesAPIs');
}

/**
 * Checks the release name and namespace a helm step will use (see {@link planHelmTemplate}).
 *
 * @throws {KappControllerError} `helmTemplate.name "<v>" is not a valid release name: <helm's
 *   text>` (helm's own `ValidateReleaseName`, which `helm template` applies too; the field is
 *   `metadata.name` when the name defaulted to the App's); `helmTemplate.namespace "<v>" is not a
 *   valid namespace: <Kubernetes' DNS-1123 label texts>`
 */
function checkReleaseNameAndNamespace(opts: AppTemplateHelmTemplate, name: string, namespace: string): void {
  const nameError = helmReleaseNameError(name);
  if (nameError !== undefined) {
    const field = opts.name ? 'helmTemplate.name' : 'metadata.name (the default helmTemplate.name)';
    throw new KappControllerError(`${field} ${quoteValue(name)} is not a valid release name: ${nameError}`);
  }
  const nsError = dns1123LabelError(namespace);
  if (nsError !== undefined) {
    const field = opts.namespace ? 'helmTemplate.namespace' : 'metadata.namespace (the default helmTemplate.namespace)';
    throw new KappControllerError(`${field} ${quoteValue(namespace)} is not a valid namespace: ${nsError}`);
  }
}

/**
 * Plans a helm step:
 * `helm template --namespace=<ns> --include-crds [--kube-version=<v>] [--api-versions=<a,b>] [--values=<f>]... -- <name> <chartPath>`
 * with env {@link HELM_TEMPLATE_ENV}.
 *
 * - `name` defaults to the App name, `namespace` to the App namespace;
 * - `chartPath` is `path` resolved under the template root (default: the root);
 * - `valuesFrom` files go to `<scratchDir>/values/<j>/`; `-` (stdin) needs a stream.
 *
 * Unlike upstream (`helm template <name> <chart> --namespace <ns> ...`), every flag value is
 * attached with `=` and the positionals follow `--`, so no user value can be read as a flag (a
 * release name `--post-renderer=sh` would otherwise run a program); and the release name and
 * namespace are checked before helm starts.
 *
 * @param opts - the step's `helmTemplate` spec
 * @param ctx - step context
 * @returns the run step, plus warnings from values planning
 * @throws {KappControllerError} `Invalid path: <path>` (bare, as upstream) for a chart path out of
 *   scope; the release name and namespace errors of `checkReleaseNameAndNamespace`; values
 *   errors; {@link STDIN_UNAVAILABLE_MESSAGE}; a failed live lookup's message
 */
export function planHelmTemplate(
  opts: AppTemplateHelmTemplate,
  ctx: StepContext,
): { step: RunStep; warnings: string[] } {
  let chartPath = ctx.templateRoot;
  if (opts.path) {
    try {
      chartPath = scopedPath(ctx.templateRoot, opts.path);
    } catch (err) {
      if (err instanceof InvalidPathError) throw new KappControllerError(err.message, { cause: err });
      throw err;
    }
  }
  const name = opts.name || ctx.appName;
  const namespace = opts.namespace || ctx.appNamespace;
  checkReleaseNameAndNamespace(opts, name, namespace);
  const args = ['template', `--namespace=${namespace}`, '--include-crds'];
  const kubeVersion = helmKubeVersion(opts, ctx.cluster);
  if (kubeVersion !== undefined) args.push(`--kube-version=${kubeVersion}`);
  const apiVersions = helmApiVersions(opts, ctx.cluster);
  if (apiVersions !== undefined) args.push(`--api-versions=${apiVersions.join(',')}`);
  const values = planValues(opts.valuesFrom ?? [], posix.join(ctx.scratchDir, 'values'), ctx);
  for (const p of values.paths) {
    if (p === STDIN_PATH && !ctx.hasStdin) throw new KappControllerError(STDIN_UNAVAILABLE_MESSAGE);
    args.push(`--values=${p}`);
  }
  args.push('--', name, chartPath);
  return {
    step: {
      kind: 'run',
      index: ctx.index,
      templater: 'helmTemplate',
      bin: 'helm',
      args,
      env: { ...HELM_TEMPLATE_ENV },
      stdin: ctx.hasStdin ? 'previous' : 'none',
      files: values.files,
      dirs: [],
      errorPrefix: TEMPLATING_HELM_ERROR_PREFIX,
    },
    warnings: values.warnings,
  };
}
