/**
 * Which Package a PackageInstall installs (reference §3.11.2, upstream
 * `pkg/packageinstall/packageinstall.go` `referencedPkgVersion`): the Packages visible in its
 * namespace through THE resolver (`./resolver.ts`: global namespace, local override, exclusion
 * annotation), narrowed by `spec.packageRef.versionSelection` with carvel's semver
 * (`./versions.ts`) and the Kubernetes and kapp-controller version checks.
 *
 * @module
 */
import { Annotation } from '../api/constants.js';
import type { Package } from '../api/datapackaging.js';
import type { PackageInstall } from '../api/packaging.js';
import { KappControllerError } from '../reconcile/result.js';
import { listPackages, type PackagingReader, type ResolverOptions } from './resolver.js';
import { type ConstraintCallback, highestConstrainedVersion, parseRange, withExactPrereleaseRule } from './versions.js';

/**
 * The kapp-controller version kapp-lambda declares itself compatible with, for Packages'
 * `kappControllerVersionSelection`: the upstream release whose behaviour it mirrors (the one
 * `npm run bench` compares with, `layers/manifest.ts`). Its own version (0.1.0) would reject
 * every Package that requires a recent kapp-controller. The downward API's
 * `kappControllerVersion` (`CONTROLLER_VERSION`, `../entry/config.ts`) reports the same.
 */
export const COMPATIBLE_KAPP_CONTROLLER_VERSION = '0.53.1';

/** Name of the Kubernetes version callback (its count appears in the selection error). */
export const KUBERNETES_VERSION_CHECK = 'kubernetes-version-check';
/** Name of the kapp-controller version callback. */
export const KAPP_CONTROLLER_VERSION_CHECK = 'kapp-controller-version-check';

/** A selection error a user can fix (status `ReconcileFailed`, no retry). */
export class PackageSelectionError extends KappControllerError {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'PackageSelectionError';
  }
}

/** What {@link selectPackage} needs besides the cluster. */
export interface SelectOptions extends ResolverOptions {
  /**
   * The cluster's Kubernetes version, `major.minor.patch` (pre-release and build stripped);
   * asked only when a candidate declares `kubernetesVersionSelection`.
   */
  kubernetesVersion: () => Promise<string>;
  /** The kapp-controller version Packages are checked against. Default {@link COMPATIBLE_KAPP_CONTROLLER_VERSION}. */
  kappControllerVersion?: string;
}

/** `true` when `version` satisfies the range `constraints`; an unparsable range satisfies nothing (upstream). */
function satisfies(constraints: string, version: string): boolean {
  try {
    return parseRange(constraints)(version);
  } catch {
    return false;
  }
}

/**
 * The Packages `pkgi` may install, listed once, and the choice among them: the highest version
 * its selection and the version checks allow, narrowed further by `extra` callbacks (the
 * rollout gate, `../rollout/gate.ts`), which run after kapp-controller's own. Listing once lets
 * the install function choose without and then with the gate.
 */
export interface PackageSelection {
  /**
   * The Package chosen.
   * @throws PackageSelectionError the version selection's message (an `after-<extra>=N` step
   *   per extra callback), or `Package <refName> not found`
   */
  choose(extra?: readonly ConstraintCallback[]): Package;
}

/**
 * The Package `pkgi` installs.
 *
 * @throws PackageSelectionError `Expected non nil PackageRef`, `Expected non-empty version
 *   selection`, `Package <refName> not found` (no Package at all in the namespace),
 *   `Unable to get kubernetes version: <err>`, or the version selection's own message
 *   (`Expected to find at least one version, but did not (details: ...)`, or a constraint
 *   parse error).
 * @throws KubeApiError when listing fails (retried).
 */
export async function selectPackage(
  kube: PackagingReader,
  pkgi: PackageInstall,
  opts: SelectOptions,
): Promise<Package> {
  return (await packageSelection(kube, pkgi, opts)).choose();
}

/**
 * {@link selectPackage} in two steps: the list and the version checks now, the choice later
 * ({@link PackageSelection}).
 *
 * @throws PackageSelectionError and KubeApiError as {@link selectPackage}, for what happens
 *   before the choice
 */
export async function packageSelection(
  kube: PackagingReader,
  pkgi: PackageInstall,
  opts: SelectOptions,
): Promise<PackageSelection> {
  const packageRef = pkgi.spec.packageRef;
  if (!packageRef) throw new PackageSelectionError('Expected non nil PackageRef');
  const selection = packageRef.versionSelection;
  if (!selection) throw new PackageSelectionError('Expected non-empty version selection');
  const refName = packageRef.refName ?? '';
  const all = await listPackages(kube, pkgi.metadata.namespace ?? '', opts);
  if (all.length === 0) throw new PackageSelectionError(`Package ${refName} not found`);
  const byVersion = new Map<string, Package>();
  for (const pkg of all) if (pkg.spec.refName === refName) byVersion.set(pkg.spec.version ?? '', pkg);

  const annotations = pkgi.metadata.annotations ?? {};
  const callbacks: ConstraintCallback[] = [];
  const candidates = [...byVersion.values()];
  if (
    annotations[Annotation.IgnoreKubernetesVersionSelection] === undefined &&
    candidates.some((p) => p.spec.kubernetesVersionSelection?.constraints)
  ) {
    let k8s: string;
    try {
      k8s = await opts.kubernetesVersion();
    } catch (err) {
      throw new PackageSelectionError(
        `Unable to get kubernetes version: ${err instanceof Error ? err.message : String(err)}`,
        { cause: err },
      );
    }
    callbacks.push({
      name: KUBERNETES_VERSION_CHECK,
      check: (v) => {
        const c = byVersion.get(v)?.spec.kubernetesVersionSelection?.constraints;
        return !c || satisfies(c, k8s);
      },
    });
  }
  if (annotations[Annotation.IgnoreKappControllerVersionSelection] === undefined) {
    const kc = opts.kappControllerVersion ?? COMPATIBLE_KAPP_CONTROLLER_VERSION;
    callbacks.push({
      name: KAPP_CONTROLLER_VERSION_CHECK,
      check: (v) => {
        const c = byVersion.get(v)?.spec.kappControllerVersionSelection?.constraints;
        return !c || satisfies(c, kc);
      },
    });
  }
  const choose = (extra: readonly ConstraintCallback[] = []): Package => {
    let chosen: string;
    try {
      chosen = highestConstrainedVersion(
        [...byVersion.keys()],
        withExactPrereleaseRule({
          ...(selection.constraints === undefined ? {} : { constraints: selection.constraints }),
          ...(selection.prereleases === undefined ? {} : { prereleases: selection.prereleases }),
        }),
        [...callbacks, ...extra],
      );
    } catch (err) {
      throw new PackageSelectionError(err instanceof Error ? err.message : String(err), { cause: err });
    }
    const pkg = byVersion.get(chosen);
    if (!pkg) throw new PackageSelectionError(`Package ${refName} not found`);
    return pkg;
  };
  return { choose };
}
