/**
 * The registry classes that need no HTTP library: {@link ViewsClusterRegistry} (a registry
 * serving each cluster's capability views) and {@link MapClusterRegistry} (over given clients).
 * Apart from `./registry.ts` (the `@kubernetes/client-node` kubeconfig registry) so the fleet
 * registry of the Lambda functions (`./fleet-registry.ts`) can build on them without bundling
 * client-node.
 *
 * @module
 */

import {
  type ClusterRegistry,
  type DeployView,
  type EventWriter,
  type FetchView,
  type InstallView,
  type KubeClient,
  type LeaseView,
  UnknownClusterError,
  type WatchView,
} from './port.js';
import { deployViewOf, fetchViewOf, installViewOf, leaseViewOf, watchViewOf } from './views.js';

/** A cluster's client and its capability views, built once per client. */
export interface ClusterViews {
  client: KubeClient;
  fetch: FetchView;
  deploy: DeployView;
  watch: WatchView;
  lease: LeaseView;
  install: InstallView;
  events: EventWriter;
}

/** The views of a client (each a distinct frozen object, see `views.ts`). */
export function clusterViewsOf(client: KubeClient): ClusterViews {
  return {
    client,
    fetch: fetchViewOf(client),
    deploy: deployViewOf(client),
    watch: watchViewOf(client),
    lease: leaseViewOf(client),
    install: installViewOf(client),
    events: Object.freeze({ writeEvent: client.writeEvent.bind(client) }),
  };
}

/**
 * A {@link ClusterRegistry} that serves each cluster's {@link ClusterViews}; subclasses say where
 * a cluster's views come from.
 */
export abstract class ViewsClusterRegistry implements ClusterRegistry {
  /**
   * The views of a known cluster.
   *
   * @throws UnknownClusterError
   */
  protected abstract views(clusterId: string): ClusterViews;

  /** {@inheritDoc ClusterRegistry.clusterIds} */
  abstract clusterIds(): string[];

  /** {@inheritDoc ClusterRegistry.client} */
  client(clusterId: string): KubeClient {
    return this.views(clusterId).client;
  }

  /** {@inheritDoc ClusterRegistry.fetchView} */
  fetchView(clusterId: string): FetchView {
    return this.views(clusterId).fetch;
  }

  /** {@inheritDoc ClusterRegistry.deployView} */
  deployView(clusterId: string): DeployView {
    return this.views(clusterId).deploy;
  }

  /** {@inheritDoc ClusterRegistry.watchView} */
  watchView(clusterId: string): WatchView {
    return this.views(clusterId).watch;
  }

  /** {@inheritDoc ClusterRegistry.installView} */
  installView(clusterId: string): InstallView {
    return this.views(clusterId).install;
  }

  /** {@inheritDoc ClusterRegistry.eventWriter} */
  eventWriter(clusterId: string): EventWriter {
    return this.views(clusterId).events;
  }
}

/** A {@link ClusterRegistry} over given clients; views are built once per cluster. */
export class MapClusterRegistry extends ViewsClusterRegistry {
  readonly #entries = new Map<string, ClusterViews>();

  /** @param clients cluster id → client (iteration order does not matter; ids are sorted). */
  constructor(clients: ReadonlyMap<string, KubeClient> | Readonly<Record<string, KubeClient>>) {
    super();
    const pairs = clients instanceof Map ? [...clients.entries()] : Object.entries(clients);
    for (const [id, client] of pairs) this.#entries.set(id, clusterViewsOf(client));
  }

  /** {@inheritDoc ViewsClusterRegistry.views} */
  protected views(clusterId: string): ClusterViews {
    const entry = this.#entries.get(clusterId);
    if (!entry) throw new UnknownClusterError(clusterId);
    return entry;
  }

  /** {@inheritDoc ClusterRegistry.clusterIds} */
  clusterIds(): string[] {
    return [...this.#entries.keys()].sort();
  }

  /**
   * The Lease view of a cluster, for the leader election of a runtime that hosts forwarders
   * (`events/forwarder/leader.ts`). Not part of {@link ClusterRegistry}: stage functions
   * (and the Lambda entry files' registries) never elect and never get it.
   *
   * @throws UnknownClusterError
   */
  leaseView(clusterId: string): LeaseView {
    return this.views(clusterId).lease;
  }
}
