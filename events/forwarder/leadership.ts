/**
 * One cluster's leadership: the Lease election (`./leader.ts`) and, while this process leads,
 * the cluster's forwarder. Per cluster, a {@link ClusterLeadership} runs one
 * {@link LeaderElector}; only while it leads does that cluster's forwarder run. Used by the
 * forwarder program (`./program.ts`, one replica per Lease) and by the embedded runtime
 * (`functions/embedded/runtime.ts`, which also gates its stages on it with
 * `leaderGatedRegistry` of `functions/embedded/leadership.ts`). Two processes pointed at one
 * cluster (two `npm start`, a rolling restart, a forgotten terminal) therefore never forward the
 * same objects at once; the other one waits and takes over within the lease duration when the
 * leader goes away (at once when it stops cleanly and releases the Lease).
 *
 * On losing the lease, at once: the forwarder's transport refuses that cluster's events (its
 * outbox holds them while the term may still be renewed; then the forwarder is stopped and what
 * it held dropped), and the term signal ({@link ClusterLeadership.termSignal}) is aborted with a
 * {@link NotLeaderError}, which cancels whatever runs under it (the embedded runtime's stages).
 *
 * RBAC: the identity of the process needs `get`, `create` and `update` on
 * `coordination.k8s.io` `leases` in the lease namespace (default {@link DEFAULT_LEASE_NAMESPACE};
 * the Role in `infra/forwarder/rbac.yml`), and the namespace must exist.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { Forwarder, StopOptions } from './forwarder.js';
import { LeaderElector, type LeaderElectorOptions } from './leader.js';
import type { ForwarderLogger } from './log.js';
import type { Transport } from './transport.js';

/**
 * Namespace of the Lease by default: the namespace `infra/forwarder/rbac.yml` puts the
 * forwarder's ServiceAccount in, so the Lease needs only a Role there (no write access to
 * `kube-system`, which holds the control plane's own leases).
 */
export const DEFAULT_LEASE_NAMESPACE = 'kapp-lambda';

/** Base name of the Lease (the forwarder's name, as its ServiceAccount and ClusterRole). */
export const LEASE_BASE_NAME = 'kapp-lambda-forwarder';

/**
 * The Lease name for a watch scope: {@link LEASE_BASE_NAME} when watching all namespaces,
 * else `<base>-<first 10 hex of sha256 of the sorted, deduplicated namespaces joined by ','>`.
 * Runtimes serving the same scope contend for one Lease; runtimes serving disjoint namespace
 * sets of one cluster (a fleet of ids over one API server, test files) do not block each other.
 * Scopes that overlap without being equal are not protected from each other: serve one cluster
 * with one scope. Pure.
 */
export function leaseNameFor(namespaces: readonly string[] | undefined): string {
  const scope = [...new Set(namespaces ?? [])].sort();
  if (scope.length === 0) return LEASE_BASE_NAME;
  return `${LEASE_BASE_NAME}-${createHash('sha256').update(scope.join(',')).digest('hex').slice(0, 10)}`;
}

/** A stage or write for a cluster this runtime does not lead (anymore). */
export class NotLeaderError extends Error {
  /** The cluster. */
  readonly clusterId: string;
  constructor(clusterId: string) {
    super(`not the leader of cluster ${JSON.stringify(clusterId)}: another runtime holds its lease`);
    this.name = 'NotLeaderError';
    this.clusterId = clusterId;
  }
}

/** An already aborted controller: the term signal while not leading. */
function abortedController(clusterId: string): AbortController {
  const c = new AbortController();
  c.abort(new NotLeaderError(clusterId));
  return c;
}

/** Options of {@link ClusterLeadership}. */
export interface ClusterLeadershipOptions {
  /** The cluster. */
  clusterId: string;
  /** The election (its `onStartedLeading`/`onStoppedLeading` are this class's). */
  election: Omit<LeaderElectorOptions, 'onStartedLeading' | 'onStoppedLeading'>;
  /** A new, not yet started forwarder for one term, sending to `transport`. */
  makeForwarder: (transport: Transport) => Forwarder;
  /** Where the leader's forwarder sends (the pipeline). */
  transport: Transport;
  /**
   * Called when a term starts (this runtime leads the cluster again), after its forwarder
   * started: the runtime re-queues the stages it parked while not leading. Default none.
   */
  onTermStarted?: () => void;
  /**
   * Called when a term ends because this runtime stopped leading (the Lease lost, taken over or
   * released), after the term's forwarder was told to stop (it may still be stopping): what the
   * runtime held only for the leader is dropped here. Not called by {@link
   * ClusterLeadership.stopForwarding}, which keeps the Lease. Default none.
   */
  onTermEnded?: () => void;
  /** How a forwarder is stopped when a term ends. Default `{ drain: false, timeoutMs: 5000 }`. */
  stopOptions?: StopOptions;
  logger?: ForwarderLogger;
}

/**
 * One cluster's election and, while leading, its forwarder: a new forwarder per term (it
 * starts from a list and derives due times from status), whose transport forwards only while
 * that term lasts, so nothing it still holds reaches the pipeline after a loss.
 */
export class ClusterLeadership {
  /** The cluster. */
  readonly clusterId: string;
  /** The election. */
  readonly elector: LeaderElector;
  private current: Forwarder | undefined;
  private term = 0;
  private termAbort: AbortController;
  private forwarding = true;
  private readonly stopping = new Set<Promise<void>>();

  /** @param opts - See {@link ClusterLeadershipOptions}. */
  constructor(private readonly opts: ClusterLeadershipOptions) {
    this.clusterId = opts.clusterId;
    this.termAbort = abortedController(opts.clusterId);
    this.elector = new LeaderElector({
      ...opts.election,
      onStartedLeading: () => {
        this.termAbort = new AbortController();
        this.startTerm();
        this.opts.onTermStarted?.();
      },
      onStoppedLeading: () => {
        // First the running stages (their tools killed, their writes refused), then the forwarder.
        this.termAbort.abort(new NotLeaderError(this.clusterId));
        this.endTerm();
        this.opts.onTermEnded?.();
      },
    });
  }

  /**
   * The signal of the current term, for a stage starting now: aborted, with a
   * {@link NotLeaderError} as reason, the moment this runtime stops leading the cluster (the
   * Lease lost, taken over or released); already aborted when it does not lead. A new term
   * gets a new signal, so a stage of an earlier term stays aborted. {@link stopForwarding}
   * does not abort it (running stages may end while the Lease is kept).
   */
  get termSignal(): AbortSignal {
    return this.termAbort.signal;
  }

  /** The forwarder of the current term, when leading. */
  get forwarder(): Forwarder | undefined {
    return this.current;
  }

  /** Whether this runtime leads the cluster now ({@link LeaderElector.isLeader}). */
  isLeader(): boolean {
    return this.elector.isLeader();
  }

  /** Starts the election. */
  start(): void {
    this.elector.start();
  }

  /**
   * Stops the forwarder and starts none again, but keeps the Lease (so the runtime can let its
   * running stages end before another takes over). Resolves when the forwarder has stopped.
   */
  async stopForwarding(): Promise<void> {
    this.forwarding = false;
    this.endTerm();
    await Promise.all(this.stopping);
  }

  /** {@link stopForwarding}, then stops the election and releases the Lease. */
  async stop(): Promise<void> {
    await this.stopForwarding();
    await this.elector.stop();
  }

  private startTerm(): void {
    if (!this.forwarding) return;
    const term = ++this.term;
    const transport: Transport = {
      send: async (events) => {
        // A batch from an ended term is dropped (resolving, so the outbox does not retry it):
        // the next term's forwarder lists and derives that work again from status.
        if (term !== this.term) return;
        // The term has not ended, but a renewal is overdue (its deadline timer has not fired
        // yet, e.g. the event loop was busy): refuse, so the outbox retries the batch until the
        // renewal lands or the term ends (its forwarder and outbox are then stopped). Dropping it
        // here, as before, lost it while the forwarder went on as if it had been sent: a `resync`
        // or `added` was asked again only after `resyncRetryMs` (5 min), a `ref-changed` never.
        if (!this.elector.isLeader()) throw new NotLeaderError(this.clusterId);
        await this.opts.transport.send(events);
      },
    };
    const forwarder = this.opts.makeForwarder(transport);
    this.current = forwarder;
    forwarder.start();
  }

  private endTerm(): void {
    this.term++;
    const f = this.current;
    this.current = undefined;
    if (!f) return;
    const p = f
      .stop(this.opts.stopOptions ?? { drain: false, timeoutMs: 5000 })
      .then(() => undefined)
      .catch((error: unknown) =>
        this.opts.logger?.warn(
          { clusterId: this.clusterId, error: error instanceof Error ? error.message : String(error) },
          'stopping the forwarder failed',
        ),
      )
      .finally(() => this.stopping.delete(p));
    this.stopping.add(p);
  }
}
