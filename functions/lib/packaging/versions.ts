/**
 * Version selection exactly as kapp-controller does it for a PackageInstall (reference §2.5,
 * §3.11.2): vendir's `HighestConstrainedVersionWithAdditionalConstraints`
 * (`carvel.dev/vendir/pkg/vendir/versions/selector.go`, `semvers.go`) over carvel's blang fork
 * (`./semver.ts`), plus kapp-controller's single-exact-prerelease rule
 * (`pkg/packageinstall/packageinstall.go`).
 *
 * @module
 */
import { Annotation } from '../api/constants.js';
import {
  compare,
  parseRangeExpr,
  parseTolerantVersion,
  parseVersion,
  type Range,
  SemverError,
  type Version,
} from './semver.js';

/**
 * `spec.packageRef.versionSelection` (vendir `VersionSelectionSemver`). `constraints`: a blang range,
 * empty or absent = any. `prereleases`: undefined/null = drop every prerelease; `{}` (or empty
 * `identifiers`) = keep all; `{identifiers}` = keep a prerelease when one of its dot-parts equals one.
 */
export interface VersionSelectionSemver {
  constraints?: string;
  prereleases?: { identifiers?: string[] } | null;
}

/**
 * A named extra filter (vendir `ConstraintCallback`), run after the prerelease filter and before the
 * constraints; `name` appears in the error details as `after-<name>=N` (kapp-controller uses
 * `kubernetes-version-check` and `kapp-controller-version-check`). `check` gets the candidate as
 * written (leading `v` kept).
 */
export interface ConstraintCallback {
  name: string;
  check: (version: string) => boolean;
}

/** No candidate survived the filters; `message` is vendir's, details included. */
export class VersionSelectionError extends Error {
  override name = 'VersionSelectionError';
}

/** vendir `SemverWrap`: the parsed version and the candidate as written. */
interface Candidate {
  readonly version: Version;
  readonly original: string;
}

/** vendir `NewRelaxedSemver`: one leading `v` is dropped, then strict blang parse; undefined if it fails. */
function parseRelaxed(original: string): Candidate | undefined {
  try {
    return { version: parseVersion(original.startsWith('v') ? original.slice(1) : original), original };
  } catch (err) {
    if (err instanceof SemverError) return undefined;
    throw err;
  }
}

/** vendir `FilterPrereleases`. */
function keepPrerelease(v: Version, prereleases: VersionSelectionSemver['prereleases']): boolean {
  if (v.pre.length === 0) return true;
  if (prereleases === undefined || prereleases === null) return false;
  const ids = prereleases.identifiers ?? [];
  if (ids.length === 0) return true;
  return v.pre.some((p) => p.str.length > 0 && ids.includes(p.str));
}

/**
 * Picks the highest candidate: relaxed parse (unparseable candidates silently dropped), the
 * prerelease filter, each callback in order, then `constraints` when non-empty; ordered by the
 * fork's compare (build metadata counts). Among equal versions (`1.0.0` and `v1.0.0`) the one listed
 * last wins, as vendir's stable sort does.
 *
 * @param candidates - e.g. the `spec.version`s of the Packages with the wanted `refName`
 * @returns the chosen candidate exactly as given (a `v` prefix kept)
 * @throws VersionSelectionError `Expected to find at least one version, but did not (details: all=N
 *   -> after-prereleases-filter=N -> after-<callback>=N ... [-> after-constraints-filter=N])`, the
 *   last step present only when constraints are non-empty
 * @throws VersionSelectionError `Selecting versions: Parsing version constraint '<c>': <blang error>`
 *   when the constraints do not parse (checked whatever the candidates)
 */
export function highestConstrainedVersion(
  candidates: readonly string[],
  selection: VersionSelectionSemver,
  callbacks: readonly ConstraintCallback[] = [],
): string {
  let matched = candidates.map(parseRelaxed).filter((c): c is Candidate => c !== undefined);
  const details = [`all=${matched.length}`];
  matched = matched.filter((c) => keepPrerelease(c.version, selection.prereleases));
  details.push(`after-prereleases-filter=${matched.length}`);
  for (const cb of callbacks) {
    matched = matched.filter((c) => cb.check(c.original));
    details.push(`after-${cb.name}=${matched.length}`);
  }
  const constraints = selection.constraints ?? '';
  if (constraints.length > 0) {
    let range: Range;
    try {
      range = parseRangeExpr(constraints);
    } catch (err) {
      if (!(err instanceof SemverError)) throw err;
      throw new VersionSelectionError(
        `Selecting versions: Parsing version constraint '${constraints}': ${err.message}`,
        { cause: err },
      );
    }
    matched = matched.filter((c) => range(c.version));
    details.push(`after-constraints-filter=${matched.length}`);
  }
  let best: Candidate | undefined;
  for (const c of matched) if (best === undefined || compare(c.version, best.version) >= 0) best = c;
  if (best === undefined) {
    throw new VersionSelectionError(
      `Expected to find at least one version, but did not (details: ${details.join(' -> ')})`,
    );
  }
  return best.original;
}

/**
 * kapp-controller's single-exact-prerelease rule (reference §2.5, §3.11.2): when `constraints` is
 * one strict version (no operator, no `v`) with a prerelease and `prereleases` is absent, the
 * selection keeps all prereleases, so `constraints: 3.0.0-rc.1` finds `3.0.0-rc.1` without
 * `prereleases: {}`.
 *
 * @returns a new selection with `prereleases: {}`, or `selection` itself when the rule does not apply
 */
export function withExactPrereleaseRule(selection: VersionSelectionSemver): VersionSelectionSemver {
  const c = selection.constraints ?? '';
  if (c.length === 0 || (selection.prereleases !== undefined && selection.prereleases !== null)) return selection;
  try {
    if (parseVersion(c).pre.length > 0) return { ...selection, prereleases: {} };
  } catch (err) {
    if (!(err instanceof SemverError)) throw err;
  }
  return selection;
}

/**
 * The fork's `Version.Compare` of two strict versions (no `v`): prerelease below release, build
 * metadata compared (none below some, numeric parts below alphanumeric).
 *
 * @returns -1, 0 or 1
 * @throws SemverError (blang's parse error) when either is not strict semver
 */
export function compareVersions(a: string, b: string): number {
  return compare(parseVersion(a), parseVersion(b));
}

/**
 * blang `ParseRange`. The returned predicate takes a strict version (no `v`) and throws SemverError
 * when it does not parse.
 *
 * @throws SemverError with upstream's text, e.g. `Could not parse Range ">v1.5.3": Could not parse
 *   comparator ">v" in ">v1.5.3"`
 */
export function parseRange(constraints: string): (version: string) => boolean {
  const range = parseRangeExpr(constraints);
  return (version) => range(parseVersion(version));
}

/** kapp-controller `parseAndScrubVersion`: blang ParseTolerant, then prerelease and build dropped. */
function scrubbed(version: string): Version {
  return { ...parseTolerantVersion(version), pre: [], build: [] };
}

/** What a candidate Package contributes to the version checks (from its `spec`). */
export interface PackageVersionConstraints {
  /** `spec.version`, as passed to {@link highestConstrainedVersion}. */
  version: string;
  /** `spec.kubernetesVersionSelection.constraints`; absent or empty = no constraint. */
  kubernetesConstraints?: string | undefined;
  /** `spec.kappControllerVersionSelection.constraints`; absent or empty = no constraint. */
  kappControllerConstraints?: string | undefined;
}

/** Whether some candidate has a Kubernetes constraint, i.e. whether upstream asks the cluster its version at all. */
export function requiresKubernetesVersion(packages: readonly PackageVersionConstraints[]): boolean {
  return packages.some((p) => (p.kubernetesConstraints ?? '') !== '');
}

/** Options of {@link packageVersionCallbacks}. */
export interface PackageVersionCallbackOptions {
  /** The PackageInstall's annotations: `packaging.carvel.dev/ignore-kubernetes-version-selection` and `…/ignore-kapp-controller-version-selection` (any value) switch a check off. */
  annotations?: Readonly<Record<string, string>> | undefined;
  /** The cluster's server version as discovery reports it (`v1.29.2+k3s1`); needed only when {@link requiresKubernetesVersion}. */
  kubernetesVersion?: string | undefined;
  /** The controller's own version (`v0.50.0`); when it does not parse (`develop`), every Package with a kapp-controller constraint is refused, as upstream. */
  kappControllerVersion: string;
}

/**
 * kapp-controller's `PackageFinder.Find` callbacks (reference §3.11.2 steps 5–6):
 * `kubernetes-version-check` only when some candidate has a Kubernetes constraint, then always
 * `kapp-controller-version-check`. Each passes a candidate whose Package has no such constraint,
 * or when the PackageInstall carries the ignore annotation; otherwise the Package's range must
 * match the version (ParseTolerant, prerelease and build dropped). Deviation: a Package range that
 * does not parse refuses the candidate (upstream ignores the parse error and would call a nil range).
 *
 * @throws VersionSelectionError `Unable to get kubernetes version: …` when the Kubernetes check is
 *   needed and `kubernetesVersion` is absent or does not parse
 */
export function packageVersionCallbacks(
  packages: readonly PackageVersionConstraints[],
  options: PackageVersionCallbackOptions,
): ConstraintCallback[] {
  const byVersion = new Map(packages.map((p) => [p.version, p]));
  const annotations = options.annotations ?? {};
  const satisfies = (constraints: string | undefined, version: Version | undefined): boolean => {
    if ((constraints ?? '') === '') return true;
    if (version === undefined) return false;
    try {
      return parseRangeExpr(constraints ?? '')(version);
    } catch (err) {
      if (err instanceof SemverError) return false;
      throw err;
    }
  };
  const callbacks: ConstraintCallback[] = [];
  if (requiresKubernetesVersion(packages)) {
    let k8s: Version;
    try {
      if (options.kubernetesVersion === undefined) throw new SemverError('no kubernetes version given');
      k8s = scrubbed(options.kubernetesVersion);
    } catch (err) {
      if (!(err instanceof SemverError)) throw err;
      throw new VersionSelectionError(`Unable to get kubernetes version: ${err.message}`, { cause: err });
    }
    const ignore = Object.hasOwn(annotations, Annotation.IgnoreKubernetesVersionSelection);
    callbacks.push({
      name: 'kubernetes-version-check',
      check: (v) => ignore || satisfies(byVersion.get(v)?.kubernetesConstraints, k8s),
    });
  }
  let kc: Version | undefined;
  try {
    kc = scrubbed(options.kappControllerVersion);
  } catch (err) {
    if (!(err instanceof SemverError)) throw err;
  }
  const ignoreKc = Object.hasOwn(annotations, Annotation.IgnoreKappControllerVersionSelection);
  callbacks.push({
    name: 'kapp-controller-version-check',
    check: (v) => ignoreKc || satisfies(byVersion.get(v)?.kappControllerConstraints, kc),
  });
  return callbacks;
}
