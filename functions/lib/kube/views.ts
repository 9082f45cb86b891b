/**
 * Capability views of a {@link KubeClient}. Each returns a new frozen object holding only
 * the view's methods (bound to the client), so a stage handed a {@link FetchView} cannot
 * reach `serviceAccountToken` or `addFinalizer` even by a cast: the credential boundary
 * of kapp-controller's fetch/template sidecar, enforced in process.
 *
 * @module
 */

import type {
  DeployView,
  FetchView,
  InstallView,
  KubeClient,
  KubeConfigMap,
  KubeReader,
  KubeSecret,
  LeaseView,
  WatchView,
} from './port.js';

/** The four reads every view but the Lease view has, bound to the client. */
function readsOf(client: KubeClient): KubeReader {
  return {
    getObject: client.getObject.bind(client),
    getSecret: client.getSecret.bind(client),
    getConfigMap: client.getConfigMap.bind(client),
    getNamespace: client.getNamespace.bind(client),
  };
}

/** Read + status write only (fetch and template stages). Pure. */
export function fetchViewOf(client: KubeClient): FetchView {
  return Object.freeze({
    ...readsOf(client),
    updateStatus: client.updateStatus.bind(client),
  });
}

/**
 * The same view, with each Secret and ConfigMap read at most once: a later read of the same
 * namespace and name returns the first read's result (a failed read is not kept, so it is
 * tried again). For one fetch run: the Secrets that decide the fetch-cache identity are then
 * the ones vendir gets, read once, as kapp-controller reads them once to build vendir's config
 * (`pkg/fetch/vendir.go`). Everything else (the App, status writes) goes straight through.
 * {@link freshReads} gives the view back without the memo (a fetch retry re-reads them).
 */
export function readingRefsOnce(view: FetchView): FetchView {
  const secrets = new Map<string, Promise<KubeSecret | undefined>>();
  const configMaps = new Map<string, Promise<KubeConfigMap | undefined>>();
  const once = <T>(memo: Map<string, Promise<T>>, key: string, read: () => Promise<T>): Promise<T> => {
    let result = memo.get(key);
    if (!result) {
      result = read();
      memo.set(key, result);
      result.catch(() => memo.delete(key));
    }
    return result;
  };
  // Everything but the two reads is the view's own (its prototype), so a wider view keeps its
  // other capabilities and a narrow test fake needs no method it never serves. Defined, not
  // assigned: the views are frozen, and a frozen prototype's method cannot be assigned over.
  const memoized = Object.freeze(
    Object.create(view, {
      getSecret: {
        value: (ns: string, name: string) => once(secrets, `${ns}/${name}`, () => view.getSecret(ns, name)),
      },
      getConfigMap: {
        value: (ns: string, name: string) => once(configMaps, `${ns}/${name}`, () => view.getConfigMap(ns, name)),
      },
    }),
  ) as FetchView;
  unmemoized.set(memoized, view);
  return memoized;
}

/** Each view made by {@link readingRefsOnce} → the view it wraps. */
const unmemoized = new WeakMap<object, FetchView>();

/**
 * The view `view` wraps when {@link readingRefsOnce} made it (its Secret and ConfigMap reads go
 * to the API server again), else `view` itself. For the fetch retry (`../pipeline/app/fetch.ts`),
 * which, as upstream's, regenerates vendir's config from the objects as they are now.
 */
export function freshReads<V extends object>(view: V): V {
  return (unmemoized.get(view) as V | undefined) ?? view;
}

/**
 * Read, status, finalizers and credentials (deploy and delete), and the label-selected list of
 * ConfigMaps (kapp's records). No other list, no watch. Pure.
 */
export function deployViewOf(client: KubeClient): DeployView {
  return Object.freeze({
    ...readsOf(client),
    listConfigMaps: client.listConfigMaps.bind(client),
    updateStatus: client.updateStatus.bind(client),
    addFinalizer: client.addFinalizer.bind(client),
    removeFinalizer: client.removeFinalizer.bind(client),
    serviceAccountToken: client.serviceAccountToken.bind(client),
    ...(client.cachedServiceAccountToken
      ? { cachedServiceAccountToken: client.cachedServiceAccountToken.bind(client) }
      : {}),
    serverVersion: client.serverVersion.bind(client),
    apiGroupVersions: client.apiGroupVersions.bind(client),
    apiServer: client.apiServer.bind(client),
  });
}

/**
 * Read, list, PackageInstall status and finalizers, App and placeholder Secret writes, server
 * version (the install function). No tokens, no watch. Pure.
 */
export function installViewOf(client: KubeClient): InstallView {
  return Object.freeze({
    ...readsOf(client),
    list: client.list.bind(client),
    updateStatus: client.updateStatus.bind(client),
    addFinalizer: client.addFinalizer.bind(client),
    removeFinalizer: client.removeFinalizer.bind(client),
    createApp: client.createApp.bind(client),
    updateApp: client.updateApp.bind(client),
    deleteApp: client.deleteApp.bind(client),
    createSecret: client.createSecret.bind(client),
    serverVersion: client.serverVersion.bind(client),
  });
}

/** Read, list and watch (the forwarder). No writes, no tokens. Pure. */
export function watchViewOf(client: KubeClient): WatchView {
  return Object.freeze({
    ...readsOf(client),
    list: client.list.bind(client),
    watch: client.watch.bind(client),
    discover: client.discover.bind(client),
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
