/**
 * One runtime acting per cluster: the embedded runtime's use of the Lease election. Per cluster,
 * a `ClusterLeadership` (`events/forwarder/leadership.ts`, with the lease names and
 * {@link NotLeaderError}) runs one `LeaderElector`; only while it leads does that cluster's
 * forwarder run and do stages for that cluster start ({@link leaderGatedRegistry}). Two
 * runtimes pointed at one cluster (two `npm start`, a rolling restart, a forgotten terminal)
 * therefore never reconcile the same App at once; the other one waits and takes over within the lease duration when the leader
 * goes away (at once when it stops cleanly and releases the Lease).
 *
 * On losing the lease, a runtime at once: stops handing that cluster's events to the pipeline
 * (the forwarder's transport refuses them, so its outbox holds them while the term may still be
 * renewed; then the forwarder is stopped and what it held dropped), and refuses to start a
 * stage for that cluster or write through its views ({@link NotLeaderError}, which the
 * pipeline's queue treats as a crash: the run is retried with backoff and goes through once
 * this runtime leads again, or is dropped when it stops). Stages already running are aborted:
 * each stage runs with its cluster's term signal (`ClusterLeadership.termSignal`, the
 * embedded pipeline's `stageSignal`), which cancels its tools as the function deadline and an
 * App's deletion do, so a kapp deploy is killed at once (not left to run beside the new
 * leader's), and whatever the stage writes after that is refused, its status included.
 *
 * RBAC: the identity of the runtime needs `get`, `create` and `update` on
 * `coordination.k8s.io` `leases` in the lease namespace (default `DEFAULT_LEASE_NAMESPACE`;
 * the Role in `infra/forwarder/rbac.yml`), and the namespace must exist.
 *
 * @module
 */
import { NotLeaderError } from '../../events/forwarder/leadership.js';
import type {
  ClusterRegistry,
  DeployView,
  EventWriter,
  FetchView,
  InstallView,
  KubeClient,
  WatchView,
} from '../lib/kube/port.js';

/**
 * A {@link ClusterRegistry} for the pipeline that refuses to act for clusters this runtime does
 * not lead: `fetchView`, `deployView`, `installView` and `client` throw {@link NotLeaderError} when
 * `acting(clusterId)` is false (every stage gets its view first, so no stage starts), and the
 * views' writes (`updateStatus`, finalizers, `serviceAccountToken`, App and Secret writes) check again on every call
 * (a stage that was running when the lease was lost writes nothing more). Reads pass through.
 * Views are built once per cluster.
 *
 * @param inner - The registry to guard.
 * @param acting - Whether this runtime leads the cluster now.
 */
export function leaderGatedRegistry(inner: ClusterRegistry, acting: (clusterId: string) => boolean): ClusterRegistry {
  const check = (clusterId: string) => {
    if (!acting(clusterId)) throw new NotLeaderError(clusterId);
  };
  const guard =
    <A extends unknown[], R>(clusterId: string, fn: (...args: A) => Promise<R>) =>
    async (...args: A): Promise<R> => {
      check(clusterId);
      return await fn(...args);
    };
  /** One view per cluster, built on first use. */
  const memo = <V>(build: (clusterId: string) => V) => {
    const views = new Map<string, V>();
    return (clusterId: string): V => {
      check(clusterId);
      let view = views.get(clusterId);
      if (!view) {
        view = build(clusterId);
        views.set(clusterId, view);
      }
      return view;
    };
  };
  /** What both stage views share: reads pass through, the status write is guarded. */
  const readAndStatus = (clusterId: string, v: FetchView) => ({
    getObject: v.getObject.bind(v),
    getSecret: v.getSecret.bind(v),
    getConfigMap: v.getConfigMap.bind(v),
    getNamespace: v.getNamespace.bind(v),
    updateStatus: guard(clusterId, v.updateStatus.bind(v)),
  });
  const gatedInstallView = (clusterId: string): InstallView => {
    const v = (inner.installView as (id: string) => InstallView)(clusterId);
    return Object.freeze({
      ...readAndStatus(clusterId, v),
      list: v.list.bind(v),
      addFinalizer: guard(clusterId, v.addFinalizer.bind(v)),
      removeFinalizer: guard(clusterId, v.removeFinalizer.bind(v)),
      createApp: guard(clusterId, v.createApp.bind(v)),
      updateApp: guard(clusterId, v.updateApp.bind(v)),
      deleteApp: guard(clusterId, v.deleteApp.bind(v)),
      createSecret: guard(clusterId, v.createSecret.bind(v)),
      serverVersion: v.serverVersion.bind(v),
    });
  };
  return Object.freeze({
    clusterIds: () => inner.clusterIds(),
    client(clusterId: string): KubeClient {
      check(clusterId);
      return inner.client(clusterId);
    },
    fetchView: memo((clusterId): FetchView => Object.freeze(readAndStatus(clusterId, inner.fetchView(clusterId)))),
    deployView: memo((clusterId): DeployView => {
      const v = inner.deployView(clusterId);
      return Object.freeze({
        ...readAndStatus(clusterId, v),
        listConfigMaps: v.listConfigMaps.bind(v),
        addFinalizer: guard(clusterId, v.addFinalizer.bind(v)),
        removeFinalizer: guard(clusterId, v.removeFinalizer.bind(v)),
        serviceAccountToken: guard(clusterId, v.serviceAccountToken.bind(v)),
        ...(v.cachedServiceAccountToken ? { cachedServiceAccountToken: v.cachedServiceAccountToken.bind(v) } : {}),
        serverVersion: v.serverVersion.bind(v),
        apiGroupVersions: v.apiGroupVersions.bind(v),
        apiServer: v.apiServer.bind(v),
      });
    }),
    watchView: (clusterId: string): WatchView => inner.watchView(clusterId),
    ...(inner.packagingGlobalNamespaceUid
      ? { packagingGlobalNamespaceUid: inner.packagingGlobalNamespaceUid.bind(inner) }
      : {}),
    ...(inner.installView ? { installView: memo((clusterId) => gatedInstallView(clusterId)) } : {}),
    ...(inner.eventWriter
      ? {
          eventWriter: memo((clusterId): EventWriter => {
            const w = (inner.eventWriter as (id: string) => EventWriter)(clusterId);
            return Object.freeze({ writeEvent: guard(clusterId, w.writeEvent.bind(w)) });
          }),
        }
      : {}),
  });
}
