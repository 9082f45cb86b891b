/**
 * The placeholder Secret of a PackageRepository (reference §3.12 step 2, upstream
 * `pkg/pkgrepository/reconciler.go` `ReconcileFetchPlaceholderSecrets`): an `image` or
 * `imgpkgBundle` fetch without `secretRef` gets `<name>-fetch-0`
 * (`../../packaging/placeholder-secrets.ts`, the same Secret a PackageInstall gets, owned by the
 * repository), which secretgen-controller fills with the registry credentials exported to the
 * namespace; the fetch then authenticates with them.
 *
 * One departure, invisible in what the fetch does: upstream always names the placeholder in
 * the fetch, kapp-lambda only once it holds credentials. An unfilled placeholder
 * (`{"auths":{}}`) makes vendir fetch anonymously, exactly as no Secret does, but a fetch that
 * names a Secret is private (sealed per cluster, never shared), so naming it would take every
 * public bundle repository out of the fleet-wide index (docs/decisions.md D7).
 *
 * @module
 */
import type { PackageRepository } from '../../api/index.js';
import { placeholderSecretName, wantsPlaceholder } from '../../api/refs.js';
import type { KubeReader } from '../../kube/port.js';
import { isUnfilledPlaceholder, placeholderSecrets, withPlaceholderRefs } from '../../packaging/placeholder-secrets.js';
import type { PipelineDeps } from '../deps.js';

/**
 * Creates the repository's placeholder Secret when its fetch wants one (idempotently; errors are
 * only logged, as upstream ignores them), then returns the repository as its fetch sees it: with
 * `spec.fetch.<source>.secretRef` naming the placeholder when that holds credentials, otherwise
 * unchanged. A copy; `pkgr` is not modified.
 *
 * @param clusterId - the cluster the repository lives in (its install view creates the Secret).
 * @param kube - reads the placeholder back.
 * @throws KubeApiError when reading the placeholder fails (an infrastructure error: retried).
 */
export async function withRepoPlaceholder(
  pkgr: PackageRepository,
  clusterId: string,
  kube: Pick<KubeReader, 'getSecret'>,
  deps: Pick<PipelineDeps, 'clusters' | 'log'>,
): Promise<PackageRepository> {
  const fetch = pkgr.spec.fetch;
  if (!wantsPlaceholder(fetch)) return pkgr;
  const namespace = pkgr.metadata.namespace ?? '';
  const name = placeholderSecretName(pkgr.metadata.name ?? '', 0);
  try {
    const writer = deps.clusters.installView?.(clusterId);
    for (const secret of placeholderSecrets({ kind: 'PackageRepository', metadata: pkgr.metadata }, [fetch])) {
      await writer?.createSecret(secret);
    }
  } catch (err) {
    deps.log.warn({ secret: `${namespace}/${name}`, error: String(err) }, 'placeholder Secret not created');
  }
  return await withFilledPlaceholder(pkgr, kube);
}

/**
 * The repository as its fetch sees it (see {@link withRepoPlaceholder}), without creating the
 * placeholder: `spec.fetch.<source>.secretRef` names it when it holds credentials. Read again
 * before each fetch retry (`../app/fetch.ts`), where the placeholder being filled meanwhile is what
 * upstream's retry waits for.
 *
 * @throws KubeApiError when reading the placeholder fails.
 */
export async function withFilledPlaceholder(
  pkgr: PackageRepository,
  kube: Pick<KubeReader, 'getSecret'>,
): Promise<PackageRepository> {
  const fetch = pkgr.spec.fetch;
  if (!wantsPlaceholder(fetch)) return pkgr;
  const secret = await kube.getSecret(
    pkgr.metadata.namespace ?? '',
    placeholderSecretName(pkgr.metadata.name ?? '', 0),
  );
  if (!secret || isUnfilledPlaceholder(secret)) return pkgr;
  const [withRef] = withPlaceholderRefs(pkgr.metadata.name ?? '', [fetch]);
  return { ...pkgr, spec: { ...pkgr.spec, fetch: withRef ?? fetch } };
}

/**
 * Whether a change of a Secret the repository references (the forwarder's `ref-changed`) can
 * change its fetch, so that it forces a reconcile. False only when the single Secret it
 * references is its own placeholder and that exists unfilled: the placeholder this function just
 * created (its creation would otherwise fetch every new repository twice), or one emptied again
 * (a fetch with it stays anonymous; the next timed reconcile runs as always). Every other change
 * forces, as upstream's Secret handler does: a user `secretRef`, a filled placeholder, a deleted
 * one (recreated by the forced run, as upstream's every reconcile recreates it).
 *
 * @throws KubeApiError when reading the placeholder fails.
 */
export async function refChangeMatters(pkgr: PackageRepository, kube: Pick<KubeReader, 'getSecret'>): Promise<boolean> {
  if (!wantsPlaceholder(pkgr.spec.fetch)) return true;
  const secret = await kube.getSecret(
    pkgr.metadata.namespace ?? '',
    placeholderSecretName(pkgr.metadata.name ?? '', 0),
  );
  return !secret || !isUnfilledPlaceholder(secret);
}
