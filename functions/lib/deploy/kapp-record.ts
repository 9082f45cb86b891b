/**
 * A guard on kapp's app record before kapp runs with the runtime's own identity (the
 * PackageRepository deploy and delete, `../pipeline/index-repo.ts`).
 *
 * kapp finds an app's resources by the label selector its record ConfigMap holds
 * (`<app>.apps.k14s.io`, or `<app>` as older kapp named it; `data.spec` is JSON with `labelKey`
 * and `labelValue`, kapp `pkg/kapp/app/app_meta.go`), and prunes (deploy) or deletes every
 * resource that matches it, in every namespace its identity can list. kapp writes
 * `kapp.k14s.io/app=<UnixNano>` there, but anyone who may create ConfigMaps in the namespace can
 * create the record first: a PackageRepository named `foo` next to a planted
 * `foo.pkgr.apps.k14s.io` with `{"labelKey":"app","labelValue":"nginx"}` would have kapp delete
 * every `app=nginx` object of the cluster with the controller's identity. Upstream
 * kapp-controller has the same exposure (its ServiceAccount); kapp-lambda refuses to run kapp on
 * such a record.
 *
 * Not covered (documented in the README): a planted record that copies another kapp app's
 * `kapp.k14s.io/app` value.
 *
 * @module
 */
import type { KubeReader } from '../kube/port.js';

/** The label key kapp writes in every record it creates (`kappAppLabelKey`). */
export const KAPP_APP_LABEL_KEY = 'kapp.k14s.io/app';

/** kapp's record ConfigMap suffix (`AppSuffix`). */
const APP_SUFFIX = '.apps.k14s.io';

/** Go `strings.EqualFold` to an ASCII lowercase name (the Kelvin sign folds to `k`, long s to `s`). */
function goFoldsTo(key: string, lower: string): boolean {
  return (
    key
      .replace(/\u212a/g, 'k')
      .replace(/\u017f/g, 's')
      .toLowerCase() === lower
  );
}

/**
 * Why kapp must not act on the record `cm`, or `undefined`. Go's `json.Unmarshal` matches keys
 * case-insensitively and the last match wins, so a record with any key other than exactly
 * `labelKey`/`labelValue` that folds to one of them is refused too.
 */
function recordProblem(spec: string | undefined): string | undefined {
  let meta: unknown;
  try {
    meta = JSON.parse(spec ?? '');
  } catch {
    return 'its data.spec is not JSON';
  }
  if (meta === null || typeof meta !== 'object' || Array.isArray(meta)) return 'its data.spec is not a JSON object';
  for (const key of Object.keys(meta)) {
    const exact = key === 'labelKey' || key === 'labelValue';
    if (!exact && (goFoldsTo(key, 'labelkey') || goFoldsTo(key, 'labelvalue'))) return `its data.spec has key '${key}'`;
  }
  const { labelKey, labelValue } = meta as { labelKey?: unknown; labelValue?: unknown };
  if (labelKey !== KAPP_APP_LABEL_KEY || typeof labelValue !== 'string' || !/^[0-9]+$/.test(labelValue)) {
    return `its label selector is not ${KAPP_APP_LABEL_KEY}=<number>`;
  }
  return undefined;
}

/**
 * Checks the records kapp reads for the apps `apps` in `namespace` (each as `<app>.apps.k14s.io`
 * and `<app>`; pass the `--app` and the `--prev-app` names).
 *
 * @returns the refusal (`kapp app record ConfigMap <ns>/<cm> was not written by kapp (<why>): ...`),
 *   or `undefined` when every record present is one kapp writes
 * @throws KubeApiError when a ConfigMap cannot be read
 */
export async function plantedKappRecord(
  kube: Pick<KubeReader, 'getConfigMap'>,
  namespace: string,
  apps: readonly string[],
): Promise<string | undefined> {
  // Read in parallel (before every repository's kapp run), judged in order.
  const names = apps.flatMap((app) => [`${app}${APP_SUFFIX}`, app]);
  const records = await Promise.all(names.map((name) => kube.getConfigMap(namespace, name)));
  for (const [i, name] of names.entries()) {
    const cm = records[i];
    if (cm) {
      const why = recordProblem(cm.data.spec);
      if (why) {
        return `kapp app record ConfigMap ${namespace}/${name} was not written by kapp (${why}): kapp would act on its selector with the controller's identity; delete the ConfigMap`;
      }
    }
  }
  return undefined;
}
