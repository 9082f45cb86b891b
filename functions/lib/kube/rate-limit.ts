/**
 * The client-side limit on API requests to a cluster, as kapp-controller's client has one: a
 * token bucket per cluster id, shared by everything in the process that talks to that cluster
 * (the stages, the forwarder's lists and watches, the lease), so a fleet's burst (a forwarder
 * restart, a moved source used by many Apps) reaches a cluster's control plane at a bounded rate.
 *
 * Upstream: kapp-controller builds its one client with controller-runtime's
 * `config.GetConfigOrDie()` (`cmd/controller/run.go`), which sets QPS 20 and Burst 30 when the
 * kubeconfig sets none (`sigs.k8s.io/controller-runtime/pkg/client/config/config.go`,
 * "kubernetes controller manager defaults"); client-go's own defaults (`rest.DefaultQPS` 5,
 * `rest.DefaultBurst` 10) therefore never apply. Only its aggregated API server's client is
 * raised to QPS 60 / Burst 90 ("to facilitate creation of many packages at once from a larger
 * PKGR"); here the Package API is served by the kube-apiserver itself (CRDs), so that client has
 * no counterpart. The kapp processes the deploy stage runs are not behind this bucket: kapp has
 * its own limiter (`--kube-api-qps` / `--kube-api-burst`, `functions/lib/deploy/kapp.ts`), as
 * upstream's kapp subprocesses are not behind the controller's.
 *
 * Semantics are client-go's `flowcontrol.NewTokenBucketRateLimiter` (golang.org/x/time/rate):
 * a request waits for a token, it is never refused; the bucket holds at most `burst` tokens and
 * gains `qps` per second; waiters are served in the order they asked. A watch takes one token
 * when it is opened (client-go limits the request, not the stream). A request the transport
 * repeats after a dropped connection (`sendRepeatingDrops`) takes no second token.
 *
 * Scope: one process. In the embedded runtime every stage and forwarder of a cluster share it;
 * in Lambda each function instance has its own bucket per cluster, so the bound on a cluster is
 * this limit times the instances serving it at once (the functions' reserved concurrency).
 *
 * @module
 */

import type { RestRequest, RestResponse, RestTransport, WatchTransport } from './http.js';

/** kapp-controller's client QPS: controller-runtime's default when the kubeconfig sets none. */
export const DEFAULT_KUBE_API_QPS = 20;

/** kapp-controller's client burst: controller-runtime's default when the kubeconfig sets none. */
export const DEFAULT_KUBE_API_BURST = 30;

/**
 * Least QPS a cluster's `kapp-controller-config` may set, other than 0 (no limit): 1. Every
 * cluster of a fleet shares the functions, and a request waits for its token without regard to
 * the invocation's deadline: at 0.001 QPS one request waited 1,000 s, so one record of the cluster
 * held a Lambda invocation to its time limit and failed the other clusters' records in its batch
 * (below about 5e-7 QPS the wait overflowed `setTimeout` and became no limit at all). At 1 QPS a
 * reconcile's few dozen requests beyond the burst wait under a minute. Upstream has no such key.
 */
export const MIN_CLUSTER_KUBE_API_QPS = 1;

/**
 * A client-side rate: `qps` tokens per second (`0`: no limit, every request goes at once), at
 * most `burst` (≥ 1) kept. Differs from client-go, where a QPS of 0 means its default of 5.
 */
export interface KubeApiRate {
  qps: number;
  burst: number;
}

/** kapp-controller's rate ({@link DEFAULT_KUBE_API_QPS} / {@link DEFAULT_KUBE_API_BURST}). */
export const DEFAULT_KUBE_API_RATE: Readonly<KubeApiRate> = Object.freeze({
  qps: DEFAULT_KUBE_API_QPS,
  burst: DEFAULT_KUBE_API_BURST,
});

/** The clock of a {@link TokenBucket}: the time in ms and a wait (tests pass fakes). */
export interface BucketClock {
  now: () => number;
  sleep: (ms: number) => Promise<void>;
}

const realClock: BucketClock = {
  now: () => performance.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
};

/**
 * A rate is usable: `qps` finite and ≥ 0, `burst` an integer ≥ 1.
 *
 * @throws RangeError naming the bad field.
 */
export function checkKubeApiRate(rate: KubeApiRate): KubeApiRate {
  if (!Number.isFinite(rate.qps) || rate.qps < 0) throw new RangeError(`kube API qps must be ≥ 0, got ${rate.qps}`);
  if (!Number.isInteger(rate.burst) || rate.burst < 1) {
    throw new RangeError(`kube API burst must be an integer ≥ 1, got ${rate.burst}`);
  }
  return rate;
}

/**
 * A token bucket with reservation, as golang.org/x/time/rate's `Limiter.Wait`: {@link take}
 * takes a token at once, letting the count go negative, and waits until the time that token
 * would have been earned; so the n-th request beyond the burst waits n/qps seconds, and order
 * is kept without a queue.
 */
export class TokenBucket {
  #rate: KubeApiRate;
  #tokens: number;
  #at: number;
  readonly #clock: BucketClock;

  /**
   * @param rate - see {@link KubeApiRate}; starts full.
   * @param clock - default `performance.now()` and `setTimeout`.
   * @throws RangeError when the rate is not usable ({@link checkKubeApiRate}).
   */
  constructor(rate: KubeApiRate, clock: BucketClock = realClock) {
    this.#rate = { ...checkKubeApiRate(rate) };
    this.#clock = clock;
    this.#tokens = rate.burst;
    this.#at = clock.now();
  }

  /** The current rate. */
  get rate(): Readonly<KubeApiRate> {
    return this.#rate;
  }

  /**
   * Changes the rate from now on (a cluster's `kapp-controller-config` read after its first
   * requests); tokens earned so far are kept, capped at the new burst.
   *
   * @throws RangeError when the rate is not usable.
   */
  setRate(rate: KubeApiRate): void {
    checkKubeApiRate(rate);
    if (rate.qps === this.#rate.qps && rate.burst === this.#rate.burst) return;
    this.#refill();
    this.#rate = { ...rate };
    this.#tokens = Math.min(this.#tokens, rate.burst);
  }

  #refill(): void {
    const now = this.#clock.now();
    this.#tokens = Math.min(this.#rate.burst, this.#tokens + ((now - this.#at) / 1000) * this.#rate.qps);
    this.#at = now;
  }

  /**
   * Takes one token, waiting until it is earned. Resolves at once with no limit (`qps` 0).
   *
   * @returns the ms waited (0 when a token was there).
   */
  async take(): Promise<number> {
    if (this.#rate.qps === 0) return 0;
    this.#refill();
    this.#tokens -= 1;
    if (this.#tokens >= 0) return 0;
    const waitMs = (-this.#tokens / this.#rate.qps) * 1000;
    await this.#clock.sleep(waitMs);
    return waitMs;
  }
}

/**
 * The buckets of a process, one per cluster id, made on first use at the default rate and kept
 * for the life of the process (a cluster's client may be rebuilt, its bucket is not: a rebuilt
 * client must not bring a fresh burst).
 */
export class ClusterRateLimits {
  readonly #buckets = new Map<string, TokenBucket>();
  /** Cluster ids whose rate {@link configure} set (a default change leaves them alone). */
  readonly #configured = new Set<string>();
  readonly #clock: BucketClock | undefined;
  #default: KubeApiRate = { ...DEFAULT_KUBE_API_RATE };

  /** @param clock - of every bucket; default the real one. */
  constructor(clock?: BucketClock) {
    this.#clock = clock;
  }

  /**
   * The rate of clusters no {@link configure} call named (the runtime-wide setting, from the
   * environment or the embedded runtime's options); applies to buckets made later and to those
   * still at the old default.
   *
   * @throws RangeError when the rate is not usable.
   */
  setDefault(rate: KubeApiRate): void {
    checkKubeApiRate(rate);
    const old = this.#default;
    this.#default = { ...rate };
    for (const [id, bucket] of this.#buckets) {
      if (!this.#configured.has(id) && bucket.rate.qps === old.qps && bucket.rate.burst === old.burst) {
        bucket.setRate(rate);
      }
    }
  }

  /**
   * Sets one cluster's rate (its `kapp-controller-config`), or with `undefined` puts it back to
   * the default.
   *
   * @throws RangeError when the rate is not usable.
   */
  configure(clusterId: string, rate: KubeApiRate | undefined): void {
    if (rate) this.#configured.add(clusterId);
    else this.#configured.delete(clusterId);
    this.bucket(clusterId).setRate(rate ?? this.#default);
  }

  /** The bucket of a cluster id (made at the default rate on first use). */
  bucket(clusterId: string): TokenBucket {
    let bucket = this.#buckets.get(clusterId);
    if (!bucket) {
      bucket = new TokenBucket(this.#default, this.#clock);
      this.#buckets.set(clusterId, bucket);
    }
    return bucket;
  }
}

/**
 * The process's buckets. Entry files set its default from their configuration; the pipeline
 * sets each cluster's rate from its `kapp-controller-config`; clients take from it by cluster id.
 */
export const CLUSTER_RATE_LIMITS = new ClusterRateLimits();

/** A {@link RestTransport} that takes a token of `bucket` before each request it passes on. */
export class RateLimitedRestTransport implements RestTransport {
  readonly #inner: RestTransport;
  readonly #bucket: TokenBucket;

  /** @param inner - the transport that sends. @param bucket - the cluster's bucket. */
  constructor(inner: RestTransport, bucket: TokenBucket) {
    this.#inner = inner;
    this.#bucket = bucket;
  }

  /** {@inheritDoc RestTransport.send} */
  async send(request: RestRequest): Promise<RestResponse> {
    await this.#bucket.take();
    return this.#inner.send(request);
  }

  /** Closes the inner transport's connections when it has any to close. */
  close(): void {
    (this.#inner as { close?: () => void }).close?.();
  }
}

/** A {@link WatchTransport} that takes one token of `bucket` when a watch is opened. */
export class RateLimitedWatchTransport implements WatchTransport {
  readonly #inner: WatchTransport;
  readonly #bucket: TokenBucket;

  /** @param inner - the transport that streams. @param bucket - the cluster's bucket. */
  constructor(inner: WatchTransport, bucket: TokenBucket) {
    this.#inner = inner;
    this.#bucket = bucket;
  }

  /** {@inheritDoc WatchTransport.stream} */
  async stream(
    path: string,
    query: Record<string, string | number | boolean | undefined>,
    onLine: (type: string, object: unknown) => void,
    signal?: AbortSignal,
    accept?: string,
  ): Promise<void> {
    await this.#bucket.take();
    return this.#inner.stream(path, query, onLine, signal, accept);
  }
}

/**
 * A cluster's transports behind its bucket in `limits` (default {@link CLUSTER_RATE_LIMITS}).
 *
 * @param clusterId - the bucket's key: every client of one cluster id in the process shares it.
 */
export function rateLimited(
  clusterId: string,
  transports: { rest: RestTransport; watch: WatchTransport },
  limits: ClusterRateLimits = CLUSTER_RATE_LIMITS,
): { rest: RestTransport; watch: WatchTransport } {
  const bucket = limits.bucket(clusterId);
  return {
    rest: new RateLimitedRestTransport(transports.rest, bucket),
    watch: new RateLimitedWatchTransport(transports.watch, bucket),
  };
}
