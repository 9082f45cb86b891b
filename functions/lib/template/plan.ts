/**
 * The template pipeline plan for an App: one planned step per `spec.template[]` entry, with exact
 * argv, files to write, stdin wiring, and the exact error text where upstream would fail before
 * running a tool.
 *
 * Mirrors kapp-controller `pkg/app/app_template.go` (`template`): step 1 works on the template
 * directory; after a stream-producing step (ytt, kbld, helm, cue, kustomize) every later step gets
 * the previous step's stdout on stdin; sops rewrites the directory and produces no stream, and
 * cannot follow a stream step (nor can cue or kustomize, which read a directory). kustomize is
 * kapp-lambda's own (upstream answers `Unsupported way to template`), placed like cue. The pipeline stops at the first failing step, so a planning
 * error for step *k* is a `fail` step at *k*: the executor runs the steps before it first, exactly
 * as upstream would have, and only then reports that error.
 *
 * @module
 */
import { posix } from 'node:path';
import type { RefObjects } from '../api/refs.js';
import type { AppTemplate, AppTemplateValuesSource } from '../api/template.js';
import { KappControllerError } from '../reconcile/result.js';
import { CUE_STREAM_UNSUPPORTED_MESSAGE, planCue } from './cue.js';
import type { AppMetadataLike, ClusterInfo } from './downward-api.js';
import { planHelmTemplate } from './helm.js';
import { planKbld } from './kbld.js';
import { planKustomize } from './kustomize.js';
import { planSops, SOPS_STREAM_UNSUPPORTED_MESSAGE } from './sops.js';
import type { StepContext, TemplateStep } from './step.js';
import { planYtt } from './ytt.js';

/** Upstream: `Expected at least one template option`. */
export const NO_TEMPLATE_MESSAGE = 'Expected at least one template option';

/** Upstream: `Unsupported way to template` (jsonnet, or an empty entry; upstream says it for kustomize too). */
export const UNSUPPORTED_TEMPLATE_MESSAGE = 'Unsupported way to template';

/** Input for {@link planTemplate}. */
export interface TemplatePlanInput {
  /** The App (metadata for defaults and the downward API; `spec.template`). */
  app: { metadata?: AppMetadataLike; spec?: { template?: readonly AppTemplate[] } };
  /** Absolute template root (the fetched directory, see `templateRootOf`). */
  templateRoot: string;
  /**
   * Absolute scratch directory for values, inline and key files; must not be inside
   * `templateRoot` (ytt and helm read the whole root). Step *i* uses `<scratchRoot>/<i>/`.
   */
  scratchRoot: string;
  /** Secrets and ConfigMaps of the App's namespace. */
  refs: RefObjects;
  /** Live cluster values, as {@link requiredClusterInfo} says are needed. */
  cluster?: ClusterInfo;
}

/** Result of {@link planTemplate}. */
export interface TemplatePlan {
  /**
   * Steps in order. The last one may be a `fail` step; none follow it. The manifests for deploy are
   * the stdout of the last `run` step when the last step is a `run` step (upstream passes an empty
   * stream when the pipeline ends with sops).
   */
  steps: TemplateStep[];
  /** Non-fatal findings (e.g. a dropped out-of-scope `valuesFrom.path`). */
  warnings: string[];
}

type TemplaterKind = 'ytt' | 'kbld' | 'helmTemplate' | 'sops' | 'cue' | 'kustomize';

/**
 * The templater an entry uses, in upstream's `switch` order (kustomize, which upstream does not
 * implement, after the others), or `undefined` if unsupported.
 */
export function templaterKind(tpl: AppTemplate): TemplaterKind | undefined {
  if (tpl.ytt) return 'ytt';
  if (tpl.kbld) return 'kbld';
  if (tpl.helmTemplate) return 'helmTemplate';
  if (tpl.sops) return 'sops';
  if (tpl.cue) return 'cue';
  if (tpl.kustomize) return 'kustomize';
  return undefined;
}

/**
 * Plans the template stage. Never throws for user errors: they become a terminal `fail` step.
 *
 * @param input - see {@link TemplatePlanInput}
 * @returns the plan
 * @throws {TypeError} for caller bugs: relative roots, a scratch root inside the template root, or
 *   a live cluster value needed but not provided in `input.cluster`
 */
export function planTemplate(input: TemplatePlanInput): TemplatePlan {
  const { templateRoot, scratchRoot } = input;
  if (!posix.isAbsolute(templateRoot) || !posix.isAbsolute(scratchRoot)) {
    throw new TypeError('planTemplate: templateRoot and scratchRoot must be absolute');
  }
  const rel = posix.relative(posix.resolve(templateRoot), posix.resolve(scratchRoot));
  if (rel === '' || (!rel.startsWith('..') && !posix.isAbsolute(rel))) {
    throw new TypeError('planTemplate: scratchRoot must not be inside templateRoot');
  }
  const templates = input.app.spec?.template ?? [];
  const metadata = input.app.metadata ?? {};
  const steps: TemplateStep[] = [];
  const warnings: string[] = [];
  if (templates.length === 0) {
    return { steps: [{ kind: 'fail', index: 0, message: NO_TEMPLATE_MESSAGE }], warnings };
  }
  let isStream = false;
  for (const [index, tpl] of templates.entries()) {
    const kind = templaterKind(tpl);
    if (!kind) {
      steps.push({ kind: 'fail', index, message: UNSUPPORTED_TEMPLATE_MESSAGE });
      break;
    }
    const ctx: StepContext = {
      appName: metadata.name ?? '',
      appNamespace: metadata.namespace ?? '',
      index,
      scratchDir: posix.join(scratchRoot, String(index)),
      hasStdin: isStream,
      templateRoot,
      metadata,
      refs: input.refs,
      cluster: input.cluster ?? {},
    };
    try {
      switch (kind) {
        case 'ytt': {
          const r = planYtt(tpl.ytt!, ctx);
          steps.push(r.step);
          warnings.push(...r.warnings);
          isStream = true;
          break;
        }
        case 'kbld':
          steps.push(planKbld(tpl.kbld!, ctx));
          isStream = true;
          break;
        case 'helmTemplate': {
          const r = planHelmTemplate(tpl.helmTemplate!, ctx);
          steps.push(r.step);
          warnings.push(...r.warnings);
          isStream = true;
          break;
        }
        case 'sops':
          if (isStream) throw new KappControllerError(SOPS_STREAM_UNSUPPORTED_MESSAGE);
          steps.push(planSops(tpl.sops!, ctx));
          isStream = false;
          break;
        case 'cue': {
          if (isStream) throw new KappControllerError(CUE_STREAM_UNSUPPORTED_MESSAGE);
          const r = planCue(tpl.cue!, ctx);
          steps.push(r.step);
          warnings.push(...r.warnings);
          isStream = true;
          break;
        }
        case 'kustomize':
          if (isStream) throw new KappControllerError(CUE_STREAM_UNSUPPORTED_MESSAGE);
          steps.push(planKustomize(tpl.kustomize!, ctx));
          isStream = true;
          break;
      }
    } catch (err) {
      if (!(err instanceof KappControllerError)) throw err;
      steps.push({ kind: 'fail', index, message: err.message });
      break;
    }
  }
  return { steps, warnings };
}

/** Which live cluster values a template spec needs (see {@link requiredClusterInfo}). */
export interface ClusterInfoNeeds {
  /** The live Kubernetes version. */
  kubernetesVersion: boolean;
  /** The live API group/versions. */
  kubernetesAPIs: boolean;
  /** The running controller version. */
  kappControllerVersion: boolean;
}

/**
 * Which live values the template stage will read, so the caller looks up only those (upstream
 * memoises the lookups per reconcile). Counts helm `kubernetesVersion`/`kubernetesAPIs` without an
 * explicit value, and downward API items without `fieldPath` and without an explicit value, in
 * ytt, helmTemplate and cue `valuesFrom`.
 *
 * @param templates - `spec.template`
 */
export function requiredClusterInfo(templates: readonly AppTemplate[]): ClusterInfoNeeds {
  const needs: ClusterInfoNeeds = { kubernetesVersion: false, kubernetesAPIs: false, kappControllerVersion: false };
  const scanValues = (valuesFrom: readonly AppTemplateValuesSource[] | undefined): void => {
    for (const v of valuesFrom ?? []) {
      if (v.secretRef || v.configMapRef || v.path || !v.downwardAPI) continue;
      for (const item of v.downwardAPI.items ?? []) {
        if (item.fieldPath) continue;
        if (item.kubernetesVersion) {
          if (!item.kubernetesVersion.version) needs.kubernetesVersion = true;
        } else if (item.kappControllerVersion) {
          if (!item.kappControllerVersion.version) needs.kappControllerVersion = true;
        } else if (item.kubernetesAPIs) {
          if (item.kubernetesAPIs.groupVersions === undefined || item.kubernetesAPIs.groupVersions === null) {
            needs.kubernetesAPIs = true;
          }
        }
      }
    }
  };
  for (const tpl of templates) {
    switch (templaterKind(tpl)) {
      case 'ytt':
        scanValues(tpl.ytt!.valuesFrom);
        break;
      case 'helmTemplate': {
        const h = tpl.helmTemplate!;
        if (h.kubernetesVersion && !h.kubernetesVersion.version) needs.kubernetesVersion = true;
        if (
          h.kubernetesAPIs &&
          (h.kubernetesAPIs.groupVersions === undefined || h.kubernetesAPIs.groupVersions === null)
        ) {
          needs.kubernetesAPIs = true;
        }
        scanValues(h.valuesFrom);
        break;
      }
      case 'cue':
        scanValues(tpl.cue!.valuesFrom);
        break;
      default:
        break;
    }
  }
  return needs;
}
