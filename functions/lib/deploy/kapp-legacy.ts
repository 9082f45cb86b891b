/**
 * A guard before a PackageRepository's `kapp delete` (`../pipeline/repo/index-repo.ts`): what
 * kapp would have to delete, or write, that its identity `kapp-lambda-pkgr` may not, because the
 * repository's kapp app is, or took over, the legacy app `<name>-ctrl` (kapp-controller's name
 * before v0.39, `kapp --prev-app`).
 *
 * The admission policy bounding that identity (`infra/rbac/package-repository-kapp.yml`) lets it
 * write kapp's records of `<name>.pkgr` and only delete the legacy ones. Two cases then stop a
 * delete every time it is tried:
 *
 * - the record is still `<name>-ctrl` (never renamed by a deploy: the repository was deleted
 *   before one reached kapp): `kapp delete --prev-app` then deletes that app as such, recording
 *   the change as `<name>-ctrl-change-*` and updating `<name>-ctrl`, both refused;
 * - ConfigMaps carrying the app's label `kapp.k14s.io/app=<value>` that are not kapp's records (a
 *   legacy app's objects, e.g. of an App `<name>` whose own legacy record had this name): kapp
 *   deletes every object with the label it can list, and the policy refuses those.
 *
 * Upstream runs this kapp as the controller, which may do both, so its delete goes through; when
 * a delete fails there, the finalizer stays and the delete is retried with the failure backoff
 * until kapp succeeds (nothing gives up on its own). kapp-lambda keeps that rule (the finalizer
 * stays while objects remain that the repository's kapp was to delete), but does not run kapp
 * into the refusal: the status names what an admin must delete, and the first retry after that
 * runs kapp, which then succeeds, and the repository goes. Deleting the app record instead also
 * ends it (kapp finds no app and deletes nothing), leaving its objects behind.
 *
 * @module
 */
import type { DeployView, KubeConfigMap } from '../kube/port.js';
import { KAPP_APP_LABEL_KEY, KAPP_IS_APP_LABEL_KEY } from './kapp-record.js';

/** The label kapp puts on its change records (`kapp.k14s.io/is-app-change`, value `""`). */
const KAPP_IS_CHANGE_LABEL_KEY = 'kapp.k14s.io/is-app-change';
/** The app a change record belongs to (`kapp.k14s.io/app-change-app`), when it fits a label. */
const KAPP_CHANGE_APP_LABEL_KEY = 'kapp.k14s.io/app-change-app';
/** How many ConfigMaps a refusal names before `and <n> more`. */
const NAMED_AT_MOST = 10;

/**
 * Whether the admission policy lets `kapp-lambda-pkgr` delete `cm`: a kapp record of a
 * repository's app or of a legacy app (its `oldIsOwn || oldIsLegacy`, for ConfigMaps).
 */
function pkgrMayDelete(cm: KubeConfigMap): boolean {
  const labels = cm.metadata.labels ?? {};
  const name = cm.metadata.name ?? '';
  const isApp = labels[KAPP_IS_APP_LABEL_KEY] === '';
  const isChange = labels[KAPP_IS_CHANGE_LABEL_KEY] === '';
  if (!isApp && !isChange) return false;
  if (isApp && !/^.+(\.pkgr|-ctrl)(\.apps\.k14s\.io)?$/.test(name)) return false;
  if (!isChange) return true;
  const app = labels[KAPP_CHANGE_APP_LABEL_KEY];
  return (
    /^.+(\.pkgr|-ctrl)-change-[a-z0-9]+$/.test(name) &&
    (app === undefined || app === '' || (/^.+(\.pkgr|-ctrl)$/.test(app) && name.startsWith(`${app}-change-`)))
  );
}

/** The `labelValue` of a record kapp wrote (`kapp.k14s.io/app=<number>`), or `undefined`. */
function labelValueOf(cm: KubeConfigMap): string | undefined {
  try {
    const meta = JSON.parse(cm.data.spec ?? '') as { labelKey?: unknown; labelValue?: unknown };
    return meta.labelKey === KAPP_APP_LABEL_KEY &&
      typeof meta.labelValue === 'string' &&
      /^[0-9]+$/.test(meta.labelValue)
      ? meta.labelValue
      : undefined;
  } catch {
    return undefined;
  }
}

/** `ns/a, ns/b` and, past {@link NAMED_AT_MOST}, `and <n> more`. */
function named(cms: KubeConfigMap[]): string {
  const names = cms.map((cm) => `${cm.metadata.namespace}/${cm.metadata.name}`).sort();
  const more = names.length - NAMED_AT_MOST;
  return `${names.slice(0, NAMED_AT_MOST).join(', ')}${more > 0 ? ` and ${more} more` : ''}`;
}

/**
 * Why `kapp delete` of the repository `name` in `namespace` cannot complete as
 * `kapp-lambda-pkgr` (see the module comment), or `undefined` when it may run. A record kapp did
 * not write is not judged here (`plantedKappRecord` refuses it).
 *
 * @returns the refusal, naming the legacy record or the ConfigMaps an admin must delete
 * @throws KubeApiError when a record cannot be read or the labelled ConfigMaps listed
 */
export async function pkgrDeleteBlocker(
  kube: Pick<DeployView, 'getConfigMap' | 'listConfigMaps'>,
  namespace: string,
  name: string,
): Promise<string | undefined> {
  const legacyApp = `${name}-ctrl`;
  const names = [`${name}.pkgr.apps.k14s.io`, `${name}.pkgr`, `${legacyApp}.apps.k14s.io`, legacyApp];
  const records = await Promise.all(names.map((n) => kube.getConfigMap(namespace, n)));
  const at = records.findIndex((cm) => cm !== undefined);
  const record = records[at];
  if (!record) return undefined; // no app: kapp deletes nothing
  const recordName = names[at]!;
  if (at >= 2) {
    return `the kapp app record ConfigMap ${namespace}/${recordName} is the legacy app ${legacyApp} (kapp-controller's name for this repository's app before v0.39), never renamed to ${name}.pkgr: kapp would delete it as ${legacyApp}, recording changes kapp-lambda-pkgr may not write. An admin must delete that app, with \`kapp delete -a ${legacyApp} -n ${namespace}\` as an identity that may (its objects and its record), or the ConfigMap ${namespace}/${recordName} alone (its objects then stay); the PackageRepository is deleted at the next retry`;
  }
  const value = labelValueOf(record);
  if (value === undefined) return undefined;
  // kapp lists the app's namespaced objects in the repository's namespace only
  // (--dangerous-scope-to-fallback-allowed-namespaces; `plantedKappRecord` refuses other lastChange namespaces).
  // Only the blocking ConfigMaps of the namespace are kept, without their data, as the pages come
  // (any tenant can label its ConfigMaps with the value, 1 MiB each, in any namespace).
  const blocked = await kube.listConfigMaps(`${KAPP_APP_LABEL_KEY}=${value}`, (cm) =>
    cm.metadata.namespace === namespace && !pkgrMayDelete(cm) ? { ...cm, data: {}, binaryData: {} } : undefined,
  );
  if (blocked.length === 0) return undefined;
  return `kapp would delete ConfigMap ${named(blocked)}, labelled ${KAPP_APP_LABEL_KEY}=${value} as the app ${recordName}'s objects (a legacy app's, taken over from ${legacyApp}), which kapp-lambda-pkgr may not delete (only kapp's records): an admin must delete them, or the app record ConfigMap ${namespace}/${recordName} (kapp then deletes nothing: the app's Packages stay); the PackageRepository is deleted at the next retry`;
}
