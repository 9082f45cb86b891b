/**
 * Values of a PackageInstall into the App it generates (reference §3.11.4, upstream
 * `pkg/packageinstall/app.go` `NewApp`): `spec.values` go only to the **first** ytt or
 * helmTemplate step; the `ext.packaging.carvel.dev/*` annotations add Secrets and names to the
 * first step of their kind. Pure.
 *
 * @module
 */

import { Annotation } from '../api/constants.js';
import type { AppSpec } from '../api/index.js';
import type { PackageInstallValues } from '../api/packaging.js';

/**
 * The Secret names of annotation `key` and its `key.<suffix>` variants, ordered by suffix
 * (the bare key's empty suffix first), as upstream `secretNamesFromAnn` (`sort.Strings`).
 */
export function secretNamesFromAnnotation(annotations: Record<string, string>, key: string): string[] {
  const bySuffix: Array<[string, string]> = [];
  for (const [ann, name] of Object.entries(annotations)) {
    if (ann === key) bySuffix.push(['', name]);
    else if (ann.startsWith(`${key}.`)) bySuffix.push([ann.slice(key.length + 1), name]);
  }
  // Byte order, as Go's sort.Strings.
  bySuffix.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return bySuffix.map(([, name]) => name);
}

/**
 * Injects values into `spec.template` in place:
 * - first helmTemplate step: `helm-template-name` / `-namespace` overrides, then a `valuesFrom`
 *   Secret per `helm-template-values-from-secret-name[.<suffix>]`;
 * - first ytt step: an `inline.pathsFrom` Secret per `ytt-paths-from-secret-name[.<suffix>]`;
 * - the first ytt or helmTemplate step (whichever comes first) gets every `spec.values[].secretRef`
 *   as a `valuesFrom` Secret (after the annotation ones), or, for ytt with
 *   `ytt-data-values-overlays`, as `inline.pathsFrom` Secrets. `secretRef.key` is ignored: every
 *   key of the Secret is a values file.
 */
export function injectValues(
  spec: AppSpec,
  values: readonly PackageInstallValues[],
  ann: Record<string, string>,
): void {
  let valuesApplied = false;
  let yttPathsApplied = false;
  let helmPathsApplied = false;
  const names = values.map((v) => v.secretRef?.name ?? '');
  for (const step of spec.template ?? []) {
    const helm = step.helmTemplate;
    if (helm) {
      if (!helmPathsApplied) {
        helmPathsApplied = true;
        if (ann[Annotation.HelmTemplateName] !== undefined) helm.name = ann[Annotation.HelmTemplateName];
        if (ann[Annotation.HelmTemplateNamespace] !== undefined) helm.namespace = ann[Annotation.HelmTemplateNamespace];
        for (const name of secretNamesFromAnnotation(ann, Annotation.HelmTemplateValuesFromSecretName)) {
          helm.valuesFrom = [...(helm.valuesFrom ?? []), { secretRef: { name } }];
        }
      }
      if (!valuesApplied) {
        valuesApplied = true;
        for (const name of names) helm.valuesFrom = [...(helm.valuesFrom ?? []), { secretRef: { name } }];
      }
    }
    const ytt = step.ytt;
    if (ytt) {
      if (!yttPathsApplied) {
        yttPathsApplied = true;
        for (const name of secretNamesFromAnnotation(ann, Annotation.YttPathsFromSecretName)) {
          ytt.inline = { ...ytt.inline, pathsFrom: [...(ytt.inline?.pathsFrom ?? []), { secretRef: { name } }] };
        }
      }
      if (!valuesApplied) {
        valuesApplied = true;
        for (const name of names) {
          if (ann[Annotation.YttDataValuesOverlays] !== undefined) {
            ytt.inline = { ...ytt.inline, pathsFrom: [...(ytt.inline?.pathsFrom ?? []), { secretRef: { name } }] };
          } else {
            ytt.valuesFrom = [...(ytt.valuesFrom ?? []), { secretRef: { name } }];
          }
        }
      }
    }
  }
}
