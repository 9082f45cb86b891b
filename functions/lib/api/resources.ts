/**
 * Identity of each kind: group, version, kind, plural and the other names Kubernetes serves it
 * under. Used by kube clients (paths are `/apis/<group>/<version>/namespaces/<ns>/<plural>`) and
 * by the CRD generator (`infra/crds/generate.ts`).
 *
 * Names follow upstream's `config/config/crds.yml` for App, PackageInstall and PackageRepository,
 * and upstream's aggregated API (`pkg/apiserver/registry/datapackaging/*_crd_rest.go`) for
 * Package and PackageMetadata.
 *
 * @module
 */

/** How a kind is addressed and named. All five kinds are namespaced. */
export interface ResourceIdentity {
  /** API group, e.g. `kappctrl.k14s.io`. */
  readonly group: string;
  /** API version within the group (always `v1alpha1`). */
  readonly version: string;
  /** `<group>/<version>`, the object's `apiVersion`. */
  readonly apiVersion: string;
  /** The object's `kind`. */
  readonly kind: string;
  /** `kind` of a list response. */
  readonly listKind: string;
  /** Resource name in URLs (lowercase plural). */
  readonly plural: string;
  /** Lowercase singular name (kubectl). */
  readonly singular: string;
  /** kubectl short names. */
  readonly shortNames: readonly string[];
  /** kubectl categories (`kubectl get carvel`). */
  readonly categories: readonly string[];
}

/** `apps.kappctrl.k14s.io` (no short names upstream). */
export const AppResource = {
  group: 'kappctrl.k14s.io',
  version: 'v1alpha1',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  kind: 'App',
  listKind: 'AppList',
  plural: 'apps',
  singular: 'app',
  shortNames: [],
  categories: ['carvel'],
} as const satisfies ResourceIdentity;

/** `packageinstalls.packaging.carvel.dev` (short name `pkgi`). */
export const PackageInstallResource = {
  group: 'packaging.carvel.dev',
  version: 'v1alpha1',
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  kind: 'PackageInstall',
  listKind: 'PackageInstallList',
  plural: 'packageinstalls',
  singular: 'packageinstall',
  shortNames: ['pkgi'],
  categories: ['carvel'],
} as const satisfies ResourceIdentity;

/** `packagerepositories.packaging.carvel.dev` (short name `pkgr`). */
export const PackageRepositoryResource = {
  group: 'packaging.carvel.dev',
  version: 'v1alpha1',
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  kind: 'PackageRepository',
  listKind: 'PackageRepositoryList',
  plural: 'packagerepositories',
  singular: 'packagerepository',
  shortNames: ['pkgr'],
  categories: ['carvel'],
} as const satisfies ResourceIdentity;

/**
 * `packages.data.packaging.carvel.dev` (short name `pkg`). Upstream serves it from an aggregated
 * API server; kapp-lambda serves it as a CRD in the same group (see `infra/crds/generate.ts`).
 */
export const PackageResource = {
  group: 'data.packaging.carvel.dev',
  version: 'v1alpha1',
  apiVersion: 'data.packaging.carvel.dev/v1alpha1',
  kind: 'Package',
  listKind: 'PackageList',
  plural: 'packages',
  singular: 'package',
  shortNames: ['pkg'],
  categories: ['carvel'],
} as const satisfies ResourceIdentity;

/** `packagemetadatas.data.packaging.carvel.dev` (short name `pkgm`); a CRD here, as {@link PackageResource}. */
export const PackageMetadataResource = {
  group: 'data.packaging.carvel.dev',
  version: 'v1alpha1',
  apiVersion: 'data.packaging.carvel.dev/v1alpha1',
  kind: 'PackageMetadata',
  listKind: 'PackageMetadataList',
  plural: 'packagemetadatas',
  singular: 'packagemetadata',
  shortNames: ['pkgm'],
  categories: ['carvel'],
} as const satisfies ResourceIdentity;
