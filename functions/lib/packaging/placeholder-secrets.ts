/**
 * Placeholder Secrets `<owner>-fetch-<i>` for registry credentials, as kapp-controller creates
 * them for PackageInstalls (`pkg/packageinstall/packageinstall.go`
 * `reconcileFetchPlaceholderSecrets`, reference §3.11.3) and PackageRepositories
 * (`pkg/pkgrepository/reconciler.go` `ReconcileFetchPlaceholderSecrets`, §3.12 step 2): every
 * `image` or `imgpkgBundle` fetch without a `secretRef` gets a Secret that secretgen-controller
 * fills with the registry credentials exported to the namespace, and the fetch reads it. Pure:
 * the install and index-repo functions create and read them. Which steps get one and its name
 * (`wantsPlaceholder`, `placeholderSecretName`) are in `api/refs.ts`, beside the App's other
 * Secret references, since the forwarder tracks them too.
 *
 * @module
 */
import type { AppFetch } from '../api/index.js';
import { placeholderSecretName, wantsPlaceholder } from '../api/refs.js';
import { type KubeObject, type KubeSecret, type NewSecret, PACKAGING_API_VERSION } from '../kube/port.js';

/** Annotation of the placeholder Secrets: secretgen-controller fills them with registry credentials. */
export const IMAGE_PULL_SECRET_ANNOTATION = 'secretgen.carvel.dev/image-pull-secret';

/** The data of a placeholder Secret (`.dockerconfigjson` with no registries). */
export const PLACEHOLDER_DOCKERCONFIG = '{"auths":{}}';

/** The key of a `kubernetes.io/dockerconfigjson` Secret's data (`corev1.DockerConfigJsonKey`). */
const DOCKERCONFIG_KEY = '.dockerconfigjson';

/** The object a placeholder Secret belongs to: a PackageInstall or a PackageRepository. */
export interface PlaceholderOwner {
  /** `PackageInstall` or `PackageRepository` (both `packaging.carvel.dev/v1alpha1`). */
  kind: 'PackageInstall' | 'PackageRepository';
  metadata: { name?: string; namespace?: string; uid?: string };
}

/**
 * The owner reference naming a PackageInstall or PackageRepository
 * (`controllerutil.SetOwnerReference`: no controller flags).
 */
export function ownerRefTo(owner: PlaceholderOwner): NonNullable<KubeObject['metadata']['ownerReferences']>[number] {
  return {
    apiVersion: PACKAGING_API_VERSION,
    kind: owner.kind,
    name: owner.metadata.name ?? '',
    uid: owner.metadata.uid ?? '',
  };
}

/**
 * The placeholder Secrets of `fetches`: type `kubernetes.io/dockerconfigjson`, data
 * `{"auths":{}}`, the annotation {@link IMAGE_PULL_SECRET_ANNOTATION}, no labels, and an owner
 * reference to `owner` (so they are garbage-collected with it), exactly as upstream writes them.
 */
export function placeholderSecrets(owner: PlaceholderOwner, fetches: readonly AppFetch[]): NewSecret[] {
  return fetches.flatMap((fetch, i) =>
    wantsPlaceholder(fetch)
      ? [
          {
            metadata: {
              name: placeholderSecretName(owner.metadata.name ?? '', i),
              namespace: owner.metadata.namespace ?? '',
              annotations: { [IMAGE_PULL_SECRET_ANNOTATION]: '' },
              ownerReferences: [ownerRefTo(owner)],
            },
            type: 'kubernetes.io/dockerconfigjson',
            data: { [DOCKERCONFIG_KEY]: Buffer.from(PLACEHOLDER_DOCKERCONFIG) },
          },
        ]
      : [],
  );
}

/**
 * A copy of `fetches` with each placeholder set as the `secretRef` of its step
 * (`pkgWithPlaceholderSecrets`). `only` narrows which steps get it (default: all that want one).
 */
export function withPlaceholderRefs(
  ownerName: string,
  fetches: readonly AppFetch[],
  only: (index: number) => boolean = () => true,
): AppFetch[] {
  return fetches.map((fetch, i) => {
    if (!wantsPlaceholder(fetch) || !only(i)) return fetch;
    const secretRef = { name: placeholderSecretName(ownerName, i) };
    if (fetch.imgpkgBundle) return { ...fetch, imgpkgBundle: { ...fetch.imgpkgBundle, secretRef } };
    return { ...fetch, image: { ...fetch.image, secretRef } } as AppFetch;
  });
}

/**
 * True when a placeholder Secret still holds no credentials: its only data is
 * `.dockerconfigjson` with an empty `auths` and nothing else (as created, before
 * secretgen-controller filled it). A fetch with such a Secret runs anonymously, exactly as one
 * without it; anything else (filled, or edited by hand) counts as credentials.
 */
export function isUnfilledPlaceholder(secret: Pick<KubeSecret, 'data'>): boolean {
  const keys = Object.keys(secret.data ?? {});
  if (keys.length !== 1 || keys[0] !== DOCKERCONFIG_KEY) return false;
  try {
    const config = JSON.parse(Buffer.from(secret.data?.[DOCKERCONFIG_KEY] ?? '').toString('utf8')) as unknown;
    if (config === null || typeof config !== 'object' || Array.isArray(config)) return false;
    const entries = Object.entries(config);
    const auths = (config as { auths?: unknown }).auths;
    return (
      entries.length === 1 &&
      auths !== null &&
      typeof auths === 'object' &&
      !Array.isArray(auths) &&
      Object.keys(auths).length === 0
    );
  } catch {
    return false;
  }
}
