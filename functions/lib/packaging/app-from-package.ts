/**
 * The App a PackageInstall generates from its selected Package (reference §3.11.3, upstream
 * `pkg/packageinstall/app.go` `NewApp` and `packageinstall.go` `reconcileFetchPlaceholderSecrets`
 * / `pkgWithPlaceholderSecrets`). Pure: the install function (`../pipeline/install/install.ts`) reads
 * and writes.
 *
 * @module
 */
import { isDeepStrictEqual } from 'node:util';
import { Annotation } from '../api/constants.js';
import type { Package } from '../api/datapackaging.js';
import { formatDuration, parseDuration } from '../api/duration.js';
import type { AppSpec } from '../api/index.js';
import type { PackageInstall } from '../api/packaging.js';
import { APP_API_VERSION, type KubeObject, type NewSecret } from '../kube/port.js';
import { KappControllerError } from '../reconcile/result.js';
import { packageInstallDefaultSyncPeriod } from '../reconcile/timer.js';
import { injectValues } from './install-values.js';
import {
  ownerRefTo,
  type PlaceholderOwner,
  placeholderSecrets as sharedPlaceholderSecrets,
  withPlaceholderRefs,
} from './placeholder-secrets.js';

/** A PackageInstall as the owner of its placeholder Secrets. */
function asOwner(pkgi: PackageInstall): PlaceholderOwner {
  return { kind: 'PackageInstall', metadata: pkgi.metadata };
}

/** The controller reference of an App to its PackageInstall (`controllerutil.SetControllerReference`). */
export function controllerRefTo(pkgi: PackageInstall): NonNullable<KubeObject['metadata']['ownerReferences']>[number] {
  return { ...ownerRefTo(asOwner(pkgi)), controller: true, blockOwnerDeletion: true };
}

/**
 * The placeholder Secrets of a Package's fetch steps (`reconcileFetchPlaceholderSecrets`, shared
 * with PackageRepositories: `./placeholder-secrets.ts`), owned by the PackageInstall.
 */
export function placeholderSecrets(pkgi: PackageInstall, pkg: Package): NewSecret[] {
  return sharedPlaceholderSecrets(asOwner(pkgi), pkg.spec.template?.spec.fetch ?? []);
}

/**
 * The Package with each placeholder Secret set as the `secretRef` of its fetch step
 * (`pkgWithPlaceholderSecrets`). A copy.
 */
export function withPlaceholderSecrets(pkgi: PackageInstall, pkg: Package): Package {
  const copy = structuredClone(pkg);
  const spec = copy.spec.template?.spec;
  if (spec?.fetch) spec.fetch = withPlaceholderRefs(pkgi.metadata.name ?? '', spec.fetch);
  return copy;
}

/** Options of {@link newApp}. */
export interface NewAppOptions {
  /** `packageInstallDefaultSyncPeriod` of the controller configuration, ms (unset: 10m). */
  defaultSyncPeriodMs?: number;
}

/** An App as the install function reads and writes it: raw, so unknown metadata is kept. */
export type RawApp = KubeObject & { spec?: AppSpec };

/** Raised when the App of the same name is controlled by another object (`SetControllerReference`). */
export class AlreadyOwnedError extends KappControllerError {
  constructor(app: RawApp, owner: { kind: string; name: string }) {
    super(
      `Object ${app.metadata.namespace}/${app.metadata.name} is already owned by another ${owner.kind} controller ${owner.name}`,
    );
    this.name = 'AlreadyOwnedError';
  }
}

/** `ext.packaging.carvel.dev/fetch-<i>-secret-name` overrides `secretRef` of fetch step `i`. */
function applyFetchSecretOverrides(spec: AppSpec, annotations: Record<string, string>): void {
  (spec.fetch ?? []).forEach((fetch, i) => {
    const name = annotations[`${Annotation.FetchSecretNamePrefix}${i}-secret-name`];
    if (name === undefined) return;
    const secretRef = { name };
    if (fetch.image) fetch.image.secretRef = secretRef;
    else if (fetch.http) fetch.http.secretRef = secretRef;
    else if (fetch.git) fetch.git.secretRef = secretRef;
    else if (fetch.helmChart?.repository) fetch.helmChart.repository.secretRef = secretRef;
    else if (fetch.imgpkgBundle) fetch.imgpkgBundle.secretRef = secretRef;
  });
}

/** `metav1.Duration` as Go serializes it (`10m0s`): the PackageInstall's, else the configured default. */
function syncPeriodOf(pkgi: PackageInstall, opts: NewAppOptions): string {
  const ms =
    pkgi.spec.syncPeriod === undefined
      ? packageInstallDefaultSyncPeriod(opts.defaultSyncPeriodMs)
      : parseDuration(pkgi.spec.syncPeriod);
  return formatDuration(ms);
}

/** kapp-lambda's annotations that steer an App's sync period (`events/forwarder/quiet.ts`). */
const SYNC_MODE_ANNOTATIONS = [Annotation.SyncMode, Annotation.SafetySyncPeriod] as const;

/**
 * Sets the App's {@link SYNC_MODE_ANNOTATIONS} to the PackageInstall's (removing those it does
 * not carry). Upstream reconciles a PackageInstall on each status write of its App, not on a timer
 * of its own, so its App's sync mode is the PackageInstall's: `sync-mode: periodic` on a
 * PackageInstall must make its App (and so itself) reconcile every `syncPeriod`. Upstream copies
 * no annotations and has none of these.
 */
function mirrorSyncMode(app: Record<string, string>, pkgi: Record<string, string>): void {
  for (const key of SYNC_MODE_ANNOTATIONS) {
    const value = pkgi[key];
    if (value === undefined) delete app[key];
    else app[key] = value;
  }
}

/**
 * The desired App for `pkgi` installing `pkg` (`NewApp`): the existing App (or a new one) with
 * - nothing changed when it carries {@link Annotation.ManuallyControlled};
 * - the PackageInstall's name and namespace, and the annotations `package-ref-name` and
 *   `package-version` merged into its own;
 * - `spec` = the Package's `template.spec`, with `serviceAccountName`, `syncPeriod` (default
 *   10m, or `packageInstallDefaultSyncPeriod`), `noopDelete`, `paused`, `canceled`, `cluster` and
 *   `defaultNamespace` from the PackageInstall;
 * - a controller ownerReference to the PackageInstall (an App without a controller is taken
 *   over; other owner references stay);
 * - the fetch secret overrides and the values injection (`./install-values.ts`);
 * - ours: the PackageInstall's sync-mode annotations ({@link mirrorSyncMode}).
 *
 * @param existing - the App of the same name as read, or `undefined` to create one.
 * @param pkg - the selected Package, with placeholder Secrets applied ({@link withPlaceholderSecrets}).
 * @throws AlreadyOwnedError when another object controls the existing App.
 */
export function newApp(
  existing: RawApp | undefined,
  pkgi: PackageInstall,
  pkg: Package,
  opts: NewAppOptions = {},
): RawApp {
  const desired: RawApp = existing
    ? structuredClone(existing)
    : { apiVersion: APP_API_VERSION, kind: 'App', metadata: { name: '', uid: '', resourceVersion: '' } };
  if (existing?.metadata.annotations?.[Annotation.ManuallyControlled] !== undefined) return desired;
  const meta = desired.metadata;
  meta.name = pkgi.metadata.name ?? '';
  meta.namespace = pkgi.metadata.namespace ?? '';
  meta.annotations = {
    ...meta.annotations,
    [Annotation.PackageRefName]: pkg.spec.refName ?? '',
    [Annotation.PackageVersion]: pkg.spec.version ?? '',
  };
  const spec: AppSpec = structuredClone(pkg.spec.template?.spec ?? {});
  const put = <K extends keyof AppSpec>(key: K, value: AppSpec[K]) => {
    if (value === undefined) delete spec[key];
    else spec[key] = value;
  };
  put('serviceAccountName', pkgi.spec.serviceAccountName);
  put('syncPeriod', syncPeriodOf(pkgi, opts));
  put('noopDelete', pkgi.spec.noopDelete);
  put('paused', pkgi.spec.paused);
  put('canceled', pkgi.spec.canceled);
  put('cluster', pkgi.spec.cluster);
  put('defaultNamespace', pkgi.spec.defaultNamespace);
  desired.spec = spec;
  setControllerReference(desired, pkgi);
  const annotations = pkgi.metadata.annotations ?? {};
  mirrorSyncMode(meta.annotations, annotations);
  applyFetchSecretOverrides(spec, annotations);
  injectValues(spec, pkgi.spec.values ?? [], annotations);
  if (!existing) {
    delete (meta as Partial<typeof meta>).uid;
    delete (meta as Partial<typeof meta>).resourceVersion;
  }
  return desired;
}

/** `controllerutil.SetControllerReference`: upsert by group/kind/name; refuse another controller. */
function setControllerReference(app: RawApp, pkgi: PackageInstall): void {
  const ref = controllerRefTo(pkgi);
  const group = (apiVersion: string) => apiVersion.split('/')[0];
  const refs = app.metadata.ownerReferences ?? [];
  const other = refs.find(
    (r) =>
      r.controller && !(group(r.apiVersion) === group(ref.apiVersion) && r.kind === ref.kind && r.name === ref.name),
  );
  if (other) throw new AlreadyOwnedError(app, other);
  const at = refs.findIndex(
    (r) => group(r.apiVersion) === group(ref.apiVersion) && r.kind === ref.kind && r.name === ref.name,
  );
  app.metadata.ownerReferences = at === -1 ? [...refs, ref] : refs.map((r, i) => (i === at ? ref : r));
}

/** JSON-normalized (drops `undefined`), for {@link sameApp}. */
function normalized(value: unknown): unknown {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

/**
 * Whether `desired` equals `existing` in everything {@link newApp} sets (upstream compares the
 * whole objects with `equality.Semantic.DeepEqual`; {@link newApp} starts from a copy of
 * `existing`, so only these can differ).
 */
export function sameApp(desired: RawApp, existing: RawApp): boolean {
  const pick = (a: RawApp) =>
    normalized({
      annotations: a.metadata.annotations ?? {},
      ownerReferences: a.metadata.ownerReferences ?? [],
      spec: a.spec ?? {},
    });
  return isDeepStrictEqual(pick(desired), pick(existing));
}
