/**
 * Whether the packaging global namespace's Packages may be trusted: the namespace must be the
 * one the cluster's admin install created, proven by its `metadata.uid`, not by a label.
 *
 * Upstream kapp-controller trusts whatever namespace carries the configured name. Where a tenant
 * may create namespaces (Capsule, HNC: the creator becomes the namespace's admin), a tenant who
 * creates `kapp-controller-packaging-global` before the install (`kubectl apply` of the release
 * then adopts it, the tenant's RoleBindings inside kept), or after an admin deleted it, publishes
 * Packages that every other tenant's PackageInstall selects. A label proves nothing (the tenant
 * sets it too); a uid is assigned by the API server at creation and never reused, so the uid
 * recorded when the install created the namespace names that one namespace for its whole life.
 *
 * Where the record lives, written only by the cluster's admin: the cloud mode's registry document
 * (`packagingGlobalNamespaceUid`, written by `npm run cluster -- join` after it applied the
 * release), and for clusters without a document (the embedded and in-cluster runtimes) the
 * cluster's `kapp-controller-config` key {@link GLOBAL_NAMESPACE_UID_KEY} in the `kapp-lambda`
 * namespace, which only the admin writes. The trust rule ({@link globalTrustOf}):
 * - recorded and equal to the live namespace's uid: trusted;
 * - recorded and different: not trusted; the resolver treats the namespace's Packages as absent
 *   and a PackageInstall that then finds no Package says why ({@link untrustedNote});
 * - nothing recorded (a cluster joined before the record existed, a runtime whose admin has not
 *   set the key): trusted, as before, with a warning logged once per cluster and process:
 *   refusing would take every global Package from running PackageInstalls at an upgrade.
 *
 * @module
 */
import type { KubeReader } from '../kube/port.js';
import { GLOBAL_NAMESPACE_UID_KEY } from '../reconcile/controller-config.js';

/** The verdict on a packaging global namespace. */
export type GlobalTrust =
  /**
   * `recorded` false: nothing was recorded, the namespace is trusted unchecked. `absent`: a uid
   * is recorded and no namespace of that name exists: nothing to list, and nothing may be (one
   * created after the check is not the recorded one).
   */
  | { readonly trusted: true; readonly recorded: boolean; readonly absent?: true }
  /** `reason`: why, one clause naming both uids, for the PackageInstall's status. */
  | { readonly trusted: false; readonly reason: string };

/**
 * The trust rule (see the module comment). A namespace that does not exist has no Packages, so
 * it is trusted, and marked `absent`: the caller lists nothing, since a namespace of that name
 * created between this check and a list (a tenant's, with a new uid) would be listed unchecked. Uids compare case-insensitively (the API server
 * writes them in lower case; an admin may paste them otherwise).
 *
 * @param namespace - the global namespace's name, for the reason's text
 * @param recordedUid - the uid the admin install recorded; `undefined`: none
 * @param liveUid - the live namespace's uid; `undefined`: it does not exist
 */
export function globalTrustOf(
  namespace: string,
  recordedUid: string | undefined,
  liveUid: string | undefined,
): GlobalTrust {
  if (recordedUid === undefined) return { trusted: true, recorded: false };
  if (liveUid === undefined) return { trusted: true, recorded: true, absent: true };
  if (liveUid.toLowerCase() === recordedUid.toLowerCase()) return { trusted: true, recorded: true };
  return {
    trusted: false,
    reason: `namespace ${namespace} has uid ${liveUid}, not the uid ${recordedUid} recorded when kapp-lambda was installed (created by someone else, or deleted and created again)`,
  };
}

/**
 * {@link globalTrustOf} of the live namespace `namespace`.
 *
 * @throws KubeApiError when reading the namespace fails other than with 404.
 */
export async function checkGlobalNamespace(
  kube: Pick<KubeReader, 'getNamespace'>,
  namespace: string,
  recordedUid: string | undefined,
): Promise<GlobalTrust> {
  if (recordedUid === undefined) return { trusted: true, recorded: false };
  const live = await kube.getNamespace(namespace);
  return globalTrustOf(namespace, recordedUid, live?.metadata.uid);
}

/**
 * The note a PackageInstall's selection error gets when the global namespace was not trusted,
 * naming the fix: `; the Packages of the global namespace were not trusted: <reason>; if the
 * namespace is the cluster's own, record its uid again (npm run cluster -- join --replace
 * --adopt-global-namespace, or kapp-controller-config key kappLambdaPackagingGlobalNamespaceUID)`.
 */
export function untrustedNote(reason: string): string {
  return `; the Packages of the global namespace were not trusted: ${reason}; if the namespace is the cluster's own, record its uid again (npm run cluster -- join --replace --adopt-global-namespace, or kapp-controller-config key ${GLOBAL_NAMESPACE_UID_KEY})`;
}
