/**
 * A guard on kapp's app record before kapp runs for a PackageRepository (its deploy and delete,
 * `../pipeline/repo/index-repo.ts`), with the identity kapp-lambda gives those runs.
 *
 * kapp finds an app's resources by the label selector its record ConfigMap holds
 * (`<app>.apps.k14s.io`, or `<app>` as older kapp named it; `data.spec` is JSON with `labelKey`
 * and `labelValue`, kapp `pkg/kapp/app/app_meta.go`), and prunes (deploy) or deletes every
 * resource that matches it, in every namespace its identity can list. kapp writes
 * `kapp.k14s.io/app=<UnixNano>` there, but anyone who may create ConfigMaps in the namespace can
 * create the record first:
 *
 * - a record with a selector of its own choosing: a PackageRepository named `foo` next to a
 *   planted `foo.pkgr.apps.k14s.io` with `{"labelKey":"app","labelValue":"nginx"}` would have
 *   kapp delete every `app=nginx` object it can reach. Refused unless the selector is the one
 *   kapp writes (`kapp.k14s.io/app=<number>`) and its `lastChange.namespaces` (where kapp also
 *   lists and prunes) name the repository's namespace only;
 * - a record that copies another kapp app's own value (`kapp.k14s.io/app=<that app's number>`):
 *   kapp would prune or delete that app's objects as if they were the repository's. Refused when
 *   any other ConfigMap of the cluster labelled `kapp.k14s.io/is-app` (what kapp labels every
 *   app record with, `KappIsAppLabelKey`) holds the same `labelValue`.
 *
 * Upstream kapp-controller has the same exposure (its ServiceAccount); kapp-lambda refuses to run
 * kapp on such a record. The copy check refuses the original as well as the copy (which one came
 * first cannot be told reliably: kapp's own renames make a new ConfigMap with an old value), so a
 * tenant who copies a repository's value into a ConfigMap of its own stops that repository until
 * the copy is deleted; the error names both ConfigMaps.
 *
 * @module
 */
import type { DeployView, KubeConfigMap } from '../kube/port.js';

/** The label key kapp writes in every record it creates (`kappAppLabelKey`). */
export const KAPP_APP_LABEL_KEY = 'kapp.k14s.io/app';

/** The label kapp puts on every app record ConfigMap (`KappIsAppLabelKey`, value `""`). */
export const KAPP_IS_APP_LABEL_KEY = 'kapp.k14s.io/is-app';

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
 * The namespaces a record's `lastChange.namespaces` names, under every pair of keys Go's
 * `json.Unmarshal` reads as them (kapp lists the app's resources there too, `ResourceNamespaces`).
 */
function lastChangeNamespaces(meta: object): unknown[] {
  return Object.entries(meta).flatMap(([key, change]) =>
    goFoldsTo(key, 'lastchange') && change !== null && typeof change === 'object' && !Array.isArray(change)
      ? Object.entries(change).flatMap(([k, v]) => (goFoldsTo(k, 'namespaces') ? (Array.isArray(v) ? v : [v]) : []))
      : [],
  );
}

/**
 * Why kapp must not act on the record `cm` of a repository in `namespace`, or `undefined`. Go's
 * `json.Unmarshal` matches keys case-insensitively and the last match wins, so a record with any
 * key other than exactly `labelKey`/`labelValue` that folds to one of them is refused too. Its
 * `lastChange.namespaces` may name the repository's namespace only (all a repository deploys
 * to): kapp also lists, prunes and deletes in the namespaces named there.
 */
function recordProblem(spec: string | undefined, namespace: string): string | undefined {
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
  const elsewhere = lastChangeNamespaces(meta).find((ns) => ns !== namespace);
  if (elsewhere !== undefined) return `its lastChange.namespaces names ${JSON.stringify(elsewhere)}`;
  return undefined;
}

/**
 * The `labelValue`s a record's `data.spec` holds, as Go's `json.Unmarshal` could read them: the
 * string value of every key that folds to `labelValue` (none when it is not a JSON object).
 */
function labelValuesOf(spec: string | undefined): string[] {
  let meta: unknown;
  try {
    meta = JSON.parse(spec ?? '');
  } catch {
    return [];
  }
  if (meta === null || typeof meta !== 'object' || Array.isArray(meta)) return [];
  return Object.entries(meta).flatMap(([key, value]) =>
    goFoldsTo(key, 'labelvalue') && typeof value === 'string' ? [value] : [],
  );
}

/**
 * Checks the records kapp reads for the apps `apps` in `namespace` (each as `<app>.apps.k14s.io`
 * and `<app>`; pass the `--app` and the `--prev-app` names): each present one must hold the
 * selector kapp writes, and, when one is present, no other app record of the cluster (a
 * ConfigMap labelled {@link KAPP_IS_APP_LABEL_KEY}, listed in every namespace) may hold its
 * `labelValue`. The four names themselves may share it (kapp's rename of the `--prev-app` record).
 *
 * @returns the refusal (`kapp app record ConfigMap <ns>/<cm> was not written by kapp (<why>): ...`,
 *   or `kapp app record ConfigMap <ns>/<cm> shares its label kapp.k14s.io/app=<v> with the kapp
 *   app record ConfigMap <ns2>/<cm2>: ...`), or `undefined` when kapp may run
 * @throws KubeApiError when a ConfigMap cannot be read or the records cannot be listed
 */
export async function plantedKappRecord(
  kube: Pick<DeployView, 'getConfigMap' | 'listConfigMaps'>,
  namespace: string,
  apps: readonly string[],
): Promise<string | undefined> {
  // Read in parallel (before every repository's kapp run), judged in order.
  const names = apps.flatMap((app) => [`${app}${APP_SUFFIX}`, app]);
  const records = await Promise.all(names.map((name) => kube.getConfigMap(namespace, name)));
  const present: Array<{ name: string; value: string }> = [];
  for (const [i, name] of names.entries()) {
    const cm = records[i];
    if (cm) {
      const why = recordProblem(cm.data.spec, namespace);
      if (why) {
        return `kapp app record ConfigMap ${namespace}/${name} was not written by kapp (${why}): kapp would act on its selector with the controller's identity; delete the ConfigMap`;
      }
      present.push({ name, value: (JSON.parse(cm.data.spec ?? '') as { labelValue: string }).labelValue });
    }
  }
  if (present.length === 0) return undefined; // kapp makes a new record, with a new value
  // As the pages come, a record is kept only when it holds one of the values, and then as its
  // name and the first of them it holds (in `present`'s order, so the first refusal below is the
  // same): any tenant can label its ConfigMaps (1 MiB each) as app records, and the list spans
  // the cluster.
  const others = await kube.listConfigMaps(KAPP_IS_APP_LABEL_KEY, (cm) => {
    if (cm.metadata.namespace === namespace && names.includes(cm.metadata.name ?? '')) return undefined;
    const values = labelValuesOf(cm.data.spec);
    const held = present.find((p) => values.includes(p.value))?.value;
    if (held === undefined) return undefined;
    const { name, namespace: ns, uid, resourceVersion } = cm.metadata;
    const metadata = { name, uid, resourceVersion, ...(ns === undefined ? {} : { namespace: ns }) };
    return { metadata, data: { spec: JSON.stringify({ labelValue: held }) }, binaryData: {} };
  });
  for (const { name, value } of present) {
    const holder = others.find((cm: KubeConfigMap) => labelValuesOf(cm.data.spec).includes(value));
    if (holder) {
      return `kapp app record ConfigMap ${namespace}/${name} shares its label ${KAPP_APP_LABEL_KEY}=${value} with the kapp app record ConfigMap ${holder.metadata.namespace}/${holder.metadata.name}: kapp would act on that app's resources too; delete the ConfigMap that was copied`;
    }
  }
  return undefined;
}
