/**
 * Capability views of a {@link KubeClient}. Each returns a new frozen object holding only
 * the view's methods (bound to the client), so a stage handed a {@link FetchView} cannot
 * reach `serviceAccountToken` or `addFinalizer` even by a cast: the credential boundary
 * of kapp-controller's fetch/template sidecar, enforced in process.
 *
 * @module
 */

import type { DeployView, FetchView, KubeClient, LeaseView, WatchView } from './port.js';

/** Read + status write only (fetch and template stages). Pure. */
export function fetchViewOf(client: KubeClient): FetchView {
  return Object.freeze({
    getObject: client.getObject.bind(client),
    getSecret: client.getSecret.bind(client),
    getConfigMap: client.getConfigMap.bind(client),
    getNamespace: client.getNamespace.bind(client),
    updateStatus: client.updateStatus.bind(client),
  });
}

/** Read, status, finalizers and credentials (deploy and delete). No list/watch. Pure. */
export function deployViewOf(client: KubeClient): DeployView {
  return Object.freeze({
    getObject: client.getObject.bind(client),
    getSecret: client.getSecret.bind(client),
    getConfigMap: client.getConfigMap.bind(client),
    getNamespace: client.getNamespace.bind(client),
    updateStatus: client.updateStatus.bind(client),
    addFinalizer: client.addFinalizer.bind(client),
    removeFinalizer: client.removeFinalizer.bind(client),
    serviceAccountToken: client.serviceAccountToken.bind(client),
    serverVersion: client.serverVersion.bind(client),
    apiGroupVersions: client.apiGroupVersions.bind(client),
    apiServer: client.apiServer.bind(client),
  });
}

/** Read, list and watch (the forwarder). No writes, no tokens. Pure. */
export function watchViewOf(client: KubeClient): WatchView {
  return Object.freeze({
    getObject: client.getObject.bind(client),
    getSecret: client.getSecret.bind(client),
    getConfigMap: client.getConfigMap.bind(client),
    getNamespace: client.getNamespace.bind(client),
    list: client.list.bind(client),
    watch: client.watch.bind(client),
  });
}

/** Get, create and update of Leases only (leader election). No object reads, no status. Pure. */
export function leaseViewOf(client: KubeClient): LeaseView {
  return Object.freeze({
    getLease: client.getLease.bind(client),
    createLease: client.createLease.bind(client),
    updateLease: client.updateLease.bind(client),
  });
}
