/**
 * The one answer to "which Packages and PackageMetadatas are visible in namespace N": what
 * everything that resolves packages (the PackageInstall function) reads through.
 *
 * Upstream answers it in its aggregated API server (reference §3.13,
 * `pkg/apiserver/registry/datapackaging/package_crd_rest.go` and `package_metadata_crd_rest.go`):
 * the packaging global namespace (default {@link DEFAULT_PACKAGING_GLOBAL_NAMESPACE}) provides
 * its packages to every namespace; a local object overrides a global one with the same identity
 * (Package: `spec.refName + '.' + spec.version`; PackageMetadata: `metadata.name`); a namespace
 * annotated `kapp-controller.carvel.dev/exclude-global-packages` sees none; global items are
 * presented with `metadata.namespace = N`. kapp-lambda serves both kinds as plain CRDs, so the API
 * server lists only N's own objects and this module does the merge, over the Kubernetes port.
 *
 * Deviations: upstream treats any error reading namespace N as "no global packages"; here a
 * failure other than 404 is thrown, so a transient API error is retried instead of turning into
 * `Package <refName> not found`. And given the global namespace's recorded uid
 * ({@link ResolverOptions.globalNamespaceUid}), the global namespace is seen only while its live
 * uid is that one (`./global-trust.ts`): a namespace a tenant created first, or created again,
 * provides no Packages.
 *
 * @module
 */
import { Annotation, DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../api/constants.js';
import { type Package, type PackageMetadata, PackageNameError, packageObjectName } from '../api/datapackaging.js';
import { type ParseResult, parsePackage, parsePackageMetadata } from '../api/parse.js';
import { PackageMetadataResource, PackageResource } from '../api/resources.js';
import type { KubeObject, KubeReader, ObjectWatcher, ResourceKind } from '../kube/port.js';
import { checkGlobalNamespace } from './global-trust.js';

/** What the resolver needs of a cluster: GET objects and namespaces, LIST. No writes. */
export type PackagingReader = Pick<KubeReader, 'getObject' | 'getNamespace'> & Pick<ObjectWatcher, 'list'>;

/** Options shared by the resolver's functions. */
export interface ResolverOptions {
  /** The packaging global namespace. Default {@link DEFAULT_PACKAGING_GLOBAL_NAMESPACE} (upstream `-packaging-global-namespace`). */
  readonly globalNamespace?: string;
  /**
   * The global namespace's `metadata.uid` recorded by the admin install (`./global-trust.ts`):
   * its Packages are seen only while the live namespace has it. Absent: not checked.
   */
  readonly globalNamespaceUid?: string;
}

/** Options of {@link listPackages}. */
export interface ListPackagesOptions extends ResolverOptions {
  /** Only Packages with this `spec.refName` (upstream's field selector `spec.refName`). */
  readonly refName?: string;
}

/**
 * The global namespace whose packages `namespace` sees, or `undefined` when it sees none: when
 * `namespace` is empty, is the global namespace itself, does not exist, or carries the annotation
 * {@link Annotation.ExcludeGlobalPackages} (any value). Mirrors upstream `shouldFetchGlobal`;
 * besides, with {@link ResolverOptions.globalNamespaceUid}, none when the global namespace is not
 * trusted or does not exist ({@link checkGlobalNamespace}).
 *
 * @throws KubeApiError when reading the namespace fails other than with 404.
 */
export async function visibleGlobalNamespace(
  kube: Pick<KubeReader, 'getNamespace'>,
  namespace: string,
  options: ResolverOptions = {},
): Promise<string | undefined> {
  const global = options.globalNamespace ?? DEFAULT_PACKAGING_GLOBAL_NAMESPACE;
  if (namespace === '' || namespace === global) return undefined;
  const ns = await kube.getNamespace(namespace);
  if (!ns || ns.metadata.annotations?.[Annotation.ExcludeGlobalPackages] !== undefined) return undefined;
  const trust = await checkGlobalNamespace(kube, global, options.globalNamespaceUid);
  // Absent at the check: listing it anyway would read one a tenant created since, unchecked.
  if (!trust.trusted || trust.absent) return undefined;
  return global;
}

/**
 * Every object of `kind` in `namespace` (`undefined`: all namespaces), all pages, parsed; objects
 * that do not parse are skipped.
 * @throws KubeApiError when a list fails.
 */
export async function listAll<T>(
  kube: Pick<ObjectWatcher, 'list'>,
  kind: ResourceKind,
  namespace: string | undefined,
  parse: (input: unknown) => ParseResult<T>,
): Promise<T[]> {
  const out: T[] = [];
  let next: string | undefined;
  do {
    const page = await kube.list(kind, {
      ...(namespace === undefined ? {} : { namespace }),
      ...(next ? { continue: next } : {}),
    });
    for (const item of page.items) {
      const parsed = parse(item);
      // The CRD validates on write, so only an object written before its rules existed can fail;
      // it cannot be installed, and must not hide the rest of the namespace's packages.
      if (parsed.success) out.push(parsed.data);
    }
    next = page.continue;
  } while (next);
  return out;
}

/** `item` as seen from `namespace` (a copy; global items are presented there, as upstream). */
function presentedIn<T extends { metadata: { namespace?: string | undefined } }>(item: T, namespace: string): T {
  return { ...item, metadata: { ...item.metadata, namespace } };
}

/**
 * Global items then local ones, a local item replacing the global item with the same identity in
 * place (upstream's order: `List` appends locals that override nothing).
 */
async function mergedList<T extends { metadata: { namespace?: string | undefined } }>(
  kube: PackagingReader,
  namespace: string,
  options: ResolverOptions,
  kind: ResourceKind,
  parse: (input: unknown) => ParseResult<T>,
  identity: (item: T) => string,
): Promise<T[]> {
  const global = await visibleGlobalNamespace(kube, namespace, options);
  const merged = global ? (await listAll(kube, kind, global, parse)).map((item) => presentedIn(item, namespace)) : [];
  const index = new Map(merged.map((item, i) => [identity(item), i]));
  for (const item of await listAll(kube, kind, namespace, parse)) {
    const at = index.get(identity(item));
    if (at === undefined) merged.push(item);
    else merged[at] = item;
  }
  return merged;
}

/** A Package's identity across namespaces: `spec.refName + '.' + spec.version` (exact, `+` kept). */
export function packageIdentity(pkg: Package): string {
  return `${pkg.spec.refName ?? ''}.${pkg.spec.version ?? ''}`;
}

/**
 * The Packages visible in `namespace` (global ∪ local, local wins; see the module comment),
 * optionally only those of one refName. Order: global ones first, as upstream's `List`.
 *
 * @throws KubeApiError when a list or the namespace read fails.
 */
export async function listPackages(
  kube: PackagingReader,
  namespace: string,
  options: ListPackagesOptions = {},
): Promise<Package[]> {
  const all = await mergedList(kube, namespace, options, PackageResource, parsePackage, packageIdentity);
  return options.refName === undefined ? all : all.filter((p) => p.spec.refName === options.refName);
}

/**
 * The PackageMetadatas visible in `namespace` (global ∪ local, local wins by `metadata.name`).
 *
 * @throws KubeApiError when a list or the namespace read fails.
 */
export async function listPackageMetadatas(
  kube: PackagingReader,
  namespace: string,
  options: ResolverOptions = {},
): Promise<PackageMetadata[]> {
  return mergedList(
    kube,
    namespace,
    options,
    PackageMetadataResource,
    parsePackageMetadata,
    (m) => m.metadata.name ?? '',
  );
}

/** GET `name` in `namespace`, else in the visible global namespace (upstream `Get`), parsed. */
async function getVisible<T extends { metadata: { namespace?: string | undefined } }>(
  kube: PackagingReader,
  namespace: string,
  options: ResolverOptions,
  kind: ResourceKind,
  name: string,
  parse: (input: unknown) => ParseResult<T>,
): Promise<T | undefined> {
  const parsedAt = async (ns: string) => {
    const found = await kube.getObject<KubeObject>({ ...kind, namespace: ns, name });
    const parsed = found ? parse(found) : undefined;
    return parsed?.success ? parsed.data : undefined;
  };
  const local = await parsedAt(namespace);
  if (local) return local;
  const global = await visibleGlobalNamespace(kube, namespace, options);
  const item = global ? await parsedAt(global) : undefined;
  return item ? presentedIn(item, namespace) : undefined;
}

/**
 * The Package `refName`/`version` visible in `namespace`: the local one, else the global one
 * (presented in `namespace`). Looked up by its object name {@link packageObjectName}, which the
 * CRD guarantees; a version no object name can hold resolves to `undefined`.
 *
 * @returns the Package, or `undefined` when neither namespace has it.
 * @throws KubeApiError when a read fails other than with 404.
 */
export async function getPackage(
  kube: PackagingReader,
  namespace: string,
  refName: string,
  version: string,
  options: ResolverOptions = {},
): Promise<Package | undefined> {
  let name: string;
  try {
    name = packageObjectName(refName, version);
  } catch (error) {
    if (error instanceof PackageNameError) return undefined;
    throw error;
  }
  const pkg = await getVisible(kube, namespace, options, PackageResource, name, parsePackage);
  return pkg && pkg.spec.refName === refName && pkg.spec.version === version ? pkg : undefined;
}

/**
 * The PackageMetadata `name` (a refName) visible in `namespace`: local, else global.
 *
 * @returns the PackageMetadata, or `undefined` when neither namespace has it.
 * @throws KubeApiError when a read fails other than with 404.
 */
export async function getPackageMetadata(
  kube: PackagingReader,
  namespace: string,
  name: string,
  options: ResolverOptions = {},
): Promise<PackageMetadata | undefined> {
  return getVisible(kube, namespace, options, PackageMetadataResource, name, parsePackageMetadata);
}

/**
 * The versions of `refName` visible in `namespace` (exact `spec.version` strings, each once, in
 * {@link listPackages} order): the candidates of PackageInstall version selection (reference §2.5).
 *
 * @throws KubeApiError when a list or the namespace read fails.
 */
export async function versionsOf(
  kube: PackagingReader,
  namespace: string,
  refName: string,
  options: ResolverOptions = {},
): Promise<string[]> {
  const packages = await listPackages(kube, namespace, { ...options, refName });
  return packages.map((p) => p.spec.version ?? '');
}
