import { describe, expect, it } from 'vitest';
import { KubeApiClient } from '../../functions/lib/kube/client.js';
import type { RestRequest, RestResponse, RestTransport, WatchTransport } from '../../functions/lib/kube/http.js';
import {
  type BucketClock,
  ClusterRateLimits,
  DEFAULT_KUBE_API_BURST,
  DEFAULT_KUBE_API_QPS,
  rateLimited,
  TokenBucket,
} from '../../functions/lib/kube/rate-limit.js';

/** A virtual clock: `sleep` resolves when {@link advance} passes its end; nothing real waits. */
class FakeClock implements BucketClock {
  t = 0;
  readonly #timers: Array<{ at: number; resolve: () => void }> = [];
  now = (): number => this.t;
  sleep = (ms: number): Promise<void> =>
    new Promise((resolve) => {
      this.#timers.push({ at: this.t + ms, resolve });
    });
  /** Moves to `to` ms, firing due timers in order and letting their continuations run. */
  async advance(to: number): Promise<void> {
    for (;;) {
      await new Promise((r) => setImmediate(r));
      this.#timers.sort((a, b) => a.at - b.at);
      const next = this.#timers[0];
      if (!next || next.at > to) break;
      this.#timers.shift();
      this.t = next.at;
      next.resolve();
    }
    this.t = to;
    await new Promise((r) => setImmediate(r));
  }
}

/** Records the virtual time of each request it is handed; answers 404. */
class TimedRest implements RestTransport {
  readonly sentAt: number[] = [];
  constructor(private readonly clock: FakeClock) {}
  async send(_request: RestRequest): Promise<RestResponse> {
    this.sentAt.push(this.clock.t);
    return { statusCode: 404, body: { kind: 'Status', reason: 'NotFound', code: 404 } };
  }
}

/** Records the virtual time each watch is opened; the stream ends at once. */
class TimedWatch implements WatchTransport {
  readonly openedAt: number[] = [];
  constructor(private readonly clock: FakeClock) {}
  async stream(): Promise<void> {
    this.openedAt.push(this.clock.t);
  }
}

function clientOf(clusterId: string, limits: ClusterRateLimits, clock: FakeClock) {
  const rest = new TimedRest(clock);
  const watch = new TimedWatch(clock);
  const client = new KubeApiClient({
    ...rateLimited(clusterId, { rest, watch }, limits),
    apiServer: { server: 'https://x' },
  });
  return { client, rest, watch };
}

describe('client-side limit per cluster (client-go token bucket)', () => {
  it("defaults to kapp-controller's client rate: controller-runtime's 20 QPS, burst 30", () => {
    expect([DEFAULT_KUBE_API_QPS, DEFAULT_KUBE_API_BURST]).toEqual([20, 30]);
    expect(new ClusterRateLimits().bucket('c').rate).toEqual({ qps: 20, burst: 30 });
  });

  it('sends the burst at once, then each request waits 1/QPS after the one before (none refused)', async () => {
    const clock = new FakeClock();
    const limits = new ClusterRateLimits(clock);
    limits.setDefault({ qps: 10, burst: 3 });
    const { client, rest } = clientOf('a', limits, clock);
    const all = Promise.all(Array.from({ length: 6 }, (_, i) => client.getConfigMap('ns', `cm${i}`)));
    await clock.advance(1000);
    expect(await all).toEqual([undefined, undefined, undefined, undefined, undefined, undefined]);
    expect(rest.sentAt).toEqual([0, 0, 0, 100, 200, 300]);
  });

  it('refills at QPS up to the burst while idle', async () => {
    const clock = new FakeClock();
    const limits = new ClusterRateLimits(clock);
    limits.setDefault({ qps: 10, burst: 2 });
    const { client, rest } = clientOf('a', limits, clock);
    await Promise.all([client.getConfigMap('ns', 'a'), client.getConfigMap('ns', 'b')]);
    await clock.advance(10_000); // idle far longer than burst/qps: only 2 tokens come back
    const later = Promise.all([1, 2, 3].map((i) => client.getConfigMap('ns', `c${i}`)));
    await clock.advance(20_000);
    await later;
    expect(rest.sentAt).toEqual([0, 0, 10_000, 10_000, 10_100]);
  });

  it('two clusters do not share a bucket; two clients of one cluster do', async () => {
    const clock = new FakeClock();
    const limits = new ClusterRateLimits(clock);
    limits.setDefault({ qps: 1, burst: 1 });
    const a = clientOf('a', limits, clock);
    const b = clientOf('b', limits, clock);
    const a2 = clientOf('a', limits, clock); // a client rebuilt for the same cluster id
    const all = Promise.all([
      a.client.getConfigMap('ns', 'x'),
      b.client.getConfigMap('ns', 'x'),
      a2.client.getConfigMap('ns', 'x'),
    ]);
    await clock.advance(5000);
    await all;
    expect(a.rest.sentAt).toEqual([0]);
    expect(b.rest.sentAt).toEqual([0]);
    expect(a2.rest.sentAt).toEqual([1000]);
    expect(limits.bucket('a')).not.toBe(limits.bucket('b'));
  });

  it('a watch takes one token when opened', async () => {
    const clock = new FakeClock();
    const limits = new ClusterRateLimits(clock);
    limits.setDefault({ qps: 2, burst: 1 });
    const { rest, watch } = clientOf('a', limits, clock);
    const limited = rateLimited('a', { rest, watch }, limits);
    const opened = limited.watch.stream('/api/v1/configmaps', { watch: true }, () => {});
    const read = limited.rest.send({ method: 'GET', path: '/api/v1/namespaces/ns/configmaps/x' });
    await clock.advance(2000);
    await Promise.all([opened, read]);
    expect(watch.openedAt).toEqual([0]);
    expect(rest.sentAt).toEqual([500]);
  });

  it("a cluster's own rate replaces the default; without it the default applies again", async () => {
    const clock = new FakeClock();
    const limits = new ClusterRateLimits(clock);
    limits.bucket('a');
    limits.configure('a', { qps: 5, burst: 2 });
    limits.setDefault({ qps: 50, burst: 100 });
    expect(limits.bucket('a').rate).toEqual({ qps: 5, burst: 2 });
    expect(limits.bucket('b').rate).toEqual({ qps: 50, burst: 100 });
    limits.configure('a', undefined);
    expect(limits.bucket('a').rate).toEqual({ qps: 50, burst: 100 });
  });

  it('QPS 0 is no limit; unusable rates are refused', async () => {
    const clock = new FakeClock();
    const bucket = new TokenBucket({ qps: 0, burst: 1 }, clock);
    for (let i = 0; i < 100; i += 1) expect(await bucket.take()).toBe(0);
    expect(() => new TokenBucket({ qps: -1, burst: 1 }, clock)).toThrow(RangeError);
    expect(() => new TokenBucket({ qps: 1, burst: 0 }, clock)).toThrow(RangeError);
    expect(() => new TokenBucket({ qps: 1, burst: 1.5 }, clock)).toThrow(RangeError);
  });
});
