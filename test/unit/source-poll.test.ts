/**
 * The fleet's source poll (`functions/lib/pipeline/source-poll.ts`), faked at its ports: the
 * object store (MemoryStore, compare-and-swap included), the source resolver, one fake cluster per
 * cluster id, a clock and the transport (`deps.emit`). Asserts the records written, how many
 * resolutions (registry requests) happen, and which `ref-changed` events go to which repository.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { KappEvent, ObjectRef } from '../../events/schema.js';
import { startSourcePoller } from '../../functions/embedded/source-poller.js';
import { parseApp, parsePackageRepository } from '../../functions/lib/api/index.js';
import { sourcePinned, sourceTracked } from '../../functions/lib/api/pin-rule.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import {
  LEADER_GRACE_MS,
  leaveSource,
  MAX_MEMBERS_PER_CLUSTER,
  MEMBER_DEADLINE_MS,
  memberDeployed,
  memberIndexed,
  type PolledSource,
  pinnedFetchOf,
  polledSourceOf,
  pollFreshSlackMs,
  pollSources,
  readSourcePoll,
  type SourcePollRecord,
  sourcePollKey,
  trackAppSources,
  trackSource,
  updateSourcePoll,
} from '../../functions/lib/pipeline/source-poll.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { type ObjectBody, StoreError } from '../../functions/lib/store/port.js';
import { FakeCluster } from './support/fake-cluster.js';

const IMAGE = 'registry.example/repo:latest';
const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const T0 = Date.parse('2025-01-01T00:00:00Z');
const PERIOD = 60_000;

/**
 * The store at its port, whose compare-and-swap writes fail on demand: the next `throwing` ones
 * throw a StoreError (an I/O error), the next `conflicting` ones answer 'conflict' (another writer
 * won, again and again).
 */
class FailingCasStore extends MemoryStore {
  throwing = 0;
  conflicting = 0;
  override async putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined) {
    if (this.throwing > 0) {
      this.throwing -= 1;
      throw new StoreError(`failed to put object "${key}" conditionally`, 'putIfMatch', key, {
        cause: new Error('lock busy'),
      });
    }
    if (this.conflicting > 0) {
      this.conflicting -= 1;
      return 'conflict' as const;
    }
    return await super.putIfMatch(key, body, ifMatch);
  }
}

/** A fleet of fake clusters sharing one store, with a controllable clock and resolver. */
function fleet(clusterIds: string[]) {
  const store = new FailingCasStore();
  const clusters = new Map(clusterIds.map((id) => [id, new FakeCluster()]));
  const state = { now: T0, digest: D1, resolutions: 0, emitted: [] as KappEvent[] };
  const deps: DispatchDeps = {
    clusters: {
      clusterIds: () => [...clusters.keys()],
      deployView: (id: string) => {
        const c = clusters.get(id);
        if (!c) throw new Error(`unknown cluster ${id}`);
        return c;
      },
    } as unknown as DispatchDeps['clusters'],
    store,
    runner: new FakeCommandRunner(),
    now: () => new Date(state.now),
    log: memoryLogger(),
    clusterInfo: async () => ({}),
    resolveSource: async () => {
      state.resolutions += 1;
      return state.digest;
    },
    emit: async (events) => {
      state.emitted.push(...events);
    },
    config: { tmpRoot: '/tmp', toolVersions: {}, controllerVersion: 'v0.53.1', sourcePollPeriodMs: PERIOD },
  };
  /** Creates the PackageRepository `ns/name` on `image` in `cluster`; returns its event ref. */
  const repo = (cluster: string, name: string, image = IMAGE): ObjectRef => {
    const raw = {
      apiVersion: 'packaging.carvel.dev/v1alpha1',
      kind: 'PackageRepository',
      metadata: { name, namespace: 'ns', uid: `uid-${cluster}-${name}`, generation: 1, resourceVersion: '7' },
      spec: { fetch: { imgpkgBundle: { image } } },
    };
    clusters.get(cluster)?.put(raw as never);
    return {
      clusterId: cluster,
      kind: 'PackageRepository',
      apiVersion: 'packaging.carvel.dev/v1alpha1',
      namespace: 'ns',
      name,
      uid: raw.metadata.uid,
      generation: 1,
      resourceVersion: '7',
    };
  };
  const pkgrOf = (cluster: string, name: string) => {
    const parsed = parsePackageRepository(clusters.get(cluster)?.get('PackageRepository', 'ns', name) as never);
    if (!parsed.success) throw new Error('bad repository');
    return parsed.data;
  };
  const key = sourcePollKey({ kind: 'imgpkgBundle', url: IMAGE, ref: 'latest' });
  const record = async () => (await readSourcePoll(store, key)) as SourcePollRecord;
  /** Each of `refs` runs (joins the record) and deploys; `fetcher` is the one that fetched. */
  const deployAll = async (refs: ObjectRef[], fetcher?: ObjectRef) => {
    for (const ref of refs) {
      const t = await trackSource(pkgrOf(ref.clusterId, ref.name), ref, deps);
      if (t) await memberDeployed(t, ref, ref === fetcher, deps);
    }
  };
  const poked = () =>
    state.emitted.map((e) =>
      e.type === 'dev.kapp-lambda.object.v1' ? `${e.data.clusterId}/${e.data.name}:${e.data.reason}` : e.type,
    );
  return { store, clusters, state, deps, repo, pkgrOf, key, record, poked, deployAll };
}

describe('polledSourceOf and pinnedFetchOf', () => {
  it.each([
    [{ imgpkgBundle: { image: IMAGE } }, { kind: 'imgpkgBundle', url: IMAGE, ref: 'latest' }],
    [{ image: { url: 'r.io/x:v2' } }, { kind: 'image', url: 'r.io/x:v2', ref: 'v2' }],
    [
      { git: { url: 'https://g.io/r', ref: 'origin/main' } },
      { kind: 'git', url: 'https://g.io/r', ref: 'origin/main' },
    ],
    [{ git: { url: 'git@g.io:o/r', ref: 'main' } }, { kind: 'git', url: 'git@g.io:o/r', ref: 'main' }],
    // One App spec.fetch[] entry (its path is not part of the source).
    [
      { git: { url: 'https://g.io/r', ref: 'v1.0.0' }, path: 'src' },
      { kind: 'git', url: 'https://g.io/r', ref: 'v1.0.0' },
    ],
    // Selections: the normalized selection is part of the source (and of its record key).
    [
      { imgpkgBundle: { image: 'r.io/x', tagSelection: { semver: { constraints: '>=1.0.0 <2.0.0' } } } },
      {
        kind: 'imgpkgBundle',
        url: 'r.io/x',
        ref: 'semver >=1.0.0 <2.0.0',
        selection: { constraints: '>=1.0.0 <2.0.0' },
      },
    ],
    [
      { image: { url: 'r.io/x', tagSelection: { semver: { prereleases: { identifiers: [] } } } } },
      { kind: 'image', url: 'r.io/x', ref: 'semver * prereleases', selection: { prereleases: {} } },
    ],
    [
      { git: { url: 'https://g.io/r', refSelection: { semver: { prereleases: { identifiers: ['rc'] } } } } },
      {
        kind: 'git',
        url: 'https://g.io/r',
        ref: 'semver * prereleases=rc',
        selection: { prereleases: { identifiers: ['rc'] } },
      },
    ],
    // http without sha256: one GET, the body's sha256.
    [{ http: { url: 'https://h.io/r.tgz', subPath: 'x' } }, { kind: 'http', url: 'https://h.io/r.tgz', ref: '' }],
    // helm charts: the repository's index.yaml (latest stable, or a full version), or an OCI tag.
    [
      { helmChart: { name: 'c', version: '1.0.0', repository: { url: 'https://charts.io' } } },
      { kind: 'helmChart', url: 'https://charts.io', ref: 'c', version: '1.0.0' },
    ],
    [
      { helmChart: { name: 'c', repository: { url: 'http://charts.io/stable' } } },
      { kind: 'helmChart', url: 'http://charts.io/stable', ref: 'c' },
    ],
    [
      { helmChart: { name: 'c', version: 'v2.0.0-rc.1+b', repository: { url: 'oci://r.io/charts' } } },
      { kind: 'helmChart', url: 'oci://r.io/charts', ref: 'c', version: 'v2.0.0-rc.1+b' },
    ],
  ])('polls %j, which the shared rule sourceTracked (the quiet rule) tracks', (fetch, want) => {
    expect(polledSourceOf(fetch)).toEqual(want);
    expect(sourceTracked(fetch)).toBe(true);
  });

  it.each([
    { imgpkgBundle: { image: `r.io/x@${D1}` } },
    { imgpkgBundle: { image: 'r.io/x:v1', secretRef: { name: 's' } } },
    { git: { url: 'https://g.io/r', ref: 'a'.repeat(40) } },
    // vendir lets a ref win over a selection: left as it is.
    { git: { url: 'https://g.io/r', ref: 'main', refSelection: { semver: {} } } },
    // A selection without the semver strategy (vendir refuses it), with a Secret, on a digest.
    { image: { url: 'r.io/x', tagSelection: {} } },
    { git: { url: 'https://g.io/r', refSelection: {} } },
    { imgpkgBundle: { image: 'r.io/x', tagSelection: { semver: {} }, secretRef: { name: 's' } } },
    { git: { url: 'https://g.io/r', refSelection: { semver: {} }, secretRef: { name: 's' } } },
    { image: { url: `r.io/x@${D1}`, tagSelection: { semver: {} } } },
    { http: { url: 'https://h.io/r.tgz', sha256: 'e'.repeat(64) } },
    { http: { url: 'https://h.io/r.tgz', secretRef: { name: 's' } } },
    // A user or a query in an http URL: a credential or a signed URL's token the record would keep.
    { http: { url: 'https://u:p@h.io/r.tgz' } },
    { http: { url: 'https://h.io/r.tgz?sig=abc' } },
    { http: { url: 'ftp://h.io/r.tgz' } },
    { inline: { paths: { a: 'b' } } },
    // Credentials in the URL (a password, or a token as the user of an http URL): the poll
    // record (stored, logged with its URL) would carry them, and the content is private.
    { git: { url: 'https://u:s3cret@g.io/r', ref: 'main' } },
    { git: { url: 'https://ghp_t0ken@g.io/r', ref: 'main' } },
    { git: { url: 'ssh://git:s3cret@g.io/r', ref: 'main' } },
    // helm charts with a Secret, a version constraint (helm resolves it against the index on
    // its own), no repository, or from OCI without a version (helm would list the tags).
    { helmChart: { name: 'c', repository: { url: 'https://charts.io', secretRef: { name: 's' } } } },
    { helmChart: { name: 'c', version: '~1.2', repository: { url: 'https://charts.io' } } },
    { helmChart: { name: 'c', version: '1.2', repository: { url: 'https://charts.io' } } },
    { helmChart: { name: 'c', version: '1.0.0' } },
    { helmChart: { name: 'c', repository: { url: 'oci://r.io/charts' } } },
    { git: { url: 'https://g.io/r', ref: 'main', secretRef: { name: 's' } } },
    { image: { url: 'r.io/x:v1', secretRef: { name: 's' } } },
  ])('does not poll %j, nor does sourceTracked track it', (fetch) => {
    expect(polledSourceOf(fetch as never)).toBeUndefined();
    expect(sourceTracked(fetch)).toBe(false);
  });

  it.each([
    // Constraints that do not parse (blang wants full versions): the App's own fetch fails
    // with vendir's message, which a fallback to the poll would hide.
    { imgpkgBundle: { image: 'r.io/x', tagSelection: { semver: { constraints: '>0' } } } },
    { git: { url: 'https://g.io/r', refSelection: { semver: { constraints: '^1.0.0' } } } },
    // A tag in the URL of a selection: vendir appends the chosen tag, and its pull fails.
    { image: { url: 'r.io/x:v1', tagSelection: { semver: {} } } },
  ])('tracks %j by the rule but does not poll it: its fetch fails as written', (fetch) => {
    expect(sourceTracked(fetch)).toBe(true);
    expect(polledSourceOf(fetch)).toBeUndefined();
  });

  it('pins a selection without it: the image to <tag>@<digest> (the lock keeps the tag), git to the commit', () => {
    const sel = { semver: { constraints: '>=1.0.0' } };
    expect(pinnedFetchOf({ imgpkgBundle: { image: 'r.io/x', tagSelection: sel } }, `1.2.0@${D1}`)).toEqual({
      imgpkgBundle: { image: `r.io/x:1.2.0@${D1}` },
    });
    expect(pinnedFetchOf({ image: { url: 'r.io/x', tagSelection: sel, subPath: 'p' } }, `1.2.0@${D1}`)).toEqual({
      image: { url: `r.io/x:1.2.0@${D1}`, subPath: 'p' },
    });
    const pinned = pinnedFetchOf({ git: { url: 'https://g.io/r', refSelection: sel } }, 'c'.repeat(40));
    expect(pinned).toEqual({ git: { url: 'https://g.io/r', ref: 'c'.repeat(40) } });
    // Pinned as the fetch cache and the quiet rule read it.
    expect(sourcePinned(pinned)).toBe(true);
    expect(sourcePinned(pinnedFetchOf({ image: { url: 'r.io/x', tagSelection: sel } }, `1.2.0@${D1}`))).toBe(true);
  });

  it('keys two selections on one repository as two records', () => {
    const of = (constraints: string) =>
      polledSourceOf({ imgpkgBundle: { image: 'r.io/x', tagSelection: { semver: { constraints } } } });
    const a = of('>=1.0.0');
    const b = of('<2.0.0');
    expect(a && b && sourcePollKey(a)).not.toBe(a && b && sourcePollKey(b));
    expect(sourcePollKey(of('>=1.0.0') as PolledSource)).toBe(sourcePollKey(a as PolledSource));
    const pre = polledSourceOf({
      imgpkgBundle: { image: 'r.io/x', tagSelection: { semver: { constraints: '>=1.0.0', prereleases: {} } } },
    });
    expect(sourcePollKey(pre as PolledSource)).not.toBe(sourcePollKey(a as PolledSource));
  });

  it('pins a tag to the digest and a branch to the commit', () => {
    expect(pinnedFetchOf({ imgpkgBundle: { image: IMAGE } }, D1)).toEqual({
      imgpkgBundle: { image: `registry.example/repo:latest@${D1}` },
    });
    expect(pinnedFetchOf({ git: { url: 'https://g.io/r', ref: 'main' } }, 'c'.repeat(40))).toEqual({
      git: { url: 'https://g.io/r', ref: 'c'.repeat(40) },
    });
  });

  it('pins http to the resolved sha256 (then sourcePinned) and a chart to the resolved version', () => {
    const http = pinnedFetchOf({ http: { url: 'https://h.io/r.tgz' }, path: 'p' }, 'e'.repeat(64));
    expect(http).toEqual({ http: { url: 'https://h.io/r.tgz', sha256: 'e'.repeat(64) }, path: 'p' });
    expect(sourcePinned(http)).toBe(true);
    const chart = { helmChart: { name: 'c', repository: { url: 'https://charts.io' } } };
    const pinned = pinnedFetchOf(chart, `1.2.3@sha256:${'f'.repeat(64)}`);
    expect(pinned).toEqual({ helmChart: { name: 'c', version: '1.2.3', repository: { url: 'https://charts.io' } } });
    // A chart is never pinned by its spec alone: only the fetch cache, given the resolution, pins it.
    expect(sourcePinned(pinned)).toBe(false);
  });

  it('keys a record by the source, not the cluster', () => {
    const a: PolledSource = { kind: 'imgpkgBundle', url: IMAGE, ref: 'latest' };
    expect(sourcePollKey(a)).toMatch(/^cache\/source-poll\/sha256\/[0-9a-f]{64}\.json$/);
    expect(sourcePollKey({ ...a })).toBe(sourcePollKey(a));
    expect(sourcePollKey({ ...a, url: 'registry.example/repo:v2', ref: 'v2' })).not.toBe(sourcePollKey(a));
    // A chart's latest and a given version of it are two sources.
    const chart: PolledSource = { kind: 'helmChart', url: 'https://charts.io', ref: 'c' };
    expect(sourcePollKey({ ...chart, version: '1.0.0' })).not.toBe(sourcePollKey(chart));
  });
});

describe('trackSource: a repository run', () => {
  it('the first run resolves and writes the record; the others of the period reuse it; a stale one is polled once', async () => {
    const f = fleet(['c1', 'c2', 'c3']);
    const refs = ['c1', 'c2', 'c3'].map((c) => f.repo(c, 'repo'));
    const tracked = [];
    for (const ref of refs) tracked.push(await trackSource(f.pkgrOf(ref.clusterId, 'repo'), ref, f.deps));
    expect(f.state.resolutions).toBe(1);
    expect(tracked.map((t) => t?.fetch)).toEqual(
      refs.map(() => ({ imgpkgBundle: { image: `registry.example/repo:latest@${D1}` } })),
    );
    expect(await f.record()).toEqual({
      v: 1,
      source: { kind: 'imgpkgBundle', url: IMAGE, ref: 'latest' },
      resolved: D1,
      polledAt: '2025-01-01T00:00:00.000Z',
      changedAt: '2025-01-01T00:00:00.000Z',
      members: refs.map((r) => ({ cluster: r.clusterId, namespace: 'ns', name: 'repo', uid: r.uid })),
    });

    // A period later the tag moved: the next run polls (once) and fetches the new digest.
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    const later = await trackSource(f.pkgrOf('c2', 'repo'), refs[1] as ObjectRef, f.deps);
    const again = await trackSource(f.pkgrOf('c3', 'repo'), refs[2] as ObjectRef, f.deps);
    expect([later?.resolved, again?.resolved, f.state.resolutions]).toEqual([D2, D2, 2]);
    expect(await f.record()).toMatchObject({ resolved: D2, changedAt: '2025-01-01T00:01:00.000Z' });
  });

  it("a tick that reaches the record a little sooner than the last one's claim still polls: a move waits one period, not two", async () => {
    const f = fleet(['c1']);
    const ref = f.repo('c1', 'repo');
    // The first claim landed 1.5 s after its tick.
    f.state.now = T0 + 1500;
    await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps);
    expect(f.state.resolutions).toBe(1);
    // The next tick, one period on, reaches the record 0.2 s after it: still polled.
    f.state.now = T0 + PERIOD + 200;
    f.state.digest = D2;
    expect((await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps))?.resolved).toBe(D2);
    expect(f.state.resolutions).toBe(2);
    // Within the period less its slack, the record is fresh: no request.
    f.state.now = T0 + PERIOD + 200 + PERIOD - pollFreshSlackMs(PERIOD) - 1;
    await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps);
    expect(f.state.resolutions).toBe(2);
  });

  it('a record polled "in the future" is not fresh: the next run polls it again', async () => {
    const f = fleet(['c1']);
    const ref = f.repo('c1', 'repo');
    await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps);
    expect(f.state.resolutions).toBe(1);
    // A run of another cluster dates the record in 2100 to pin the source for ever.
    await f.store.put(f.key, JSON.stringify({ ...(await f.record()), polledAt: '2100-01-01T00:00:00.000Z' }));
    f.state.digest = D2;
    expect((await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps))?.resolved).toBe(D2);
    expect(f.state.resolutions).toBe(2);
    // Another poller's clock a little ahead (within the slack) is still a fresh record.
    await f.store.put(
      f.key,
      JSON.stringify({
        ...(await f.record()),
        polledAt: new Date(f.state.now + pollFreshSlackMs(PERIOD)).toISOString(),
      }),
    );
    await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps);
    expect(f.state.resolutions).toBe(2);
  });

  it("one cluster's repositories on a source join its record up to MAX_MEMBERS_PER_CLUSTER; other clusters still join", async () => {
    const f = fleet(['hostile', 'c2']);
    const many = Array.from({ length: MAX_MEMBERS_PER_CLUSTER + 5 }, (_, i) => f.repo('hostile', `r${i}`));
    const tracked = [];
    for (const ref of many) tracked.push(await trackSource(f.pkgrOf('hostile', ref.name), ref, f.deps));
    // Past the bound a repository still fetches the fleet's digest, without joining.
    expect(tracked.every((t) => t?.resolved === D1)).toBe(true);
    const other = f.repo('c2', 'repo');
    expect((await trackSource(f.pkgrOf('c2', 'repo'), other, f.deps))?.resolved).toBe(D1);
    const members = (await f.record()).members;
    expect(members.filter((m) => m.cluster === 'hostile')).toHaveLength(MAX_MEMBERS_PER_CLUSTER);
    expect(members.filter((m) => m.cluster === 'c2').map((m) => m.name)).toEqual(['repo']);
  });

  it('a failed resolution falls back to the fetch by tag and writes nothing', async () => {
    const f = fleet(['c1']);
    const ref = f.repo('c1', 'repo');
    f.deps.resolveSource = async () => Promise.reject(new Error('HEAD manifest repo:latest answered 503'));
    expect(await trackSource(f.pkgrOf('c1', 'repo'), ref, f.deps)).toBeUndefined();
    expect(await f.store.list('cache/source-poll/')).toEqual([]);
  });
});

describe('pollSources: the timer', () => {
  it("a source whose registry holds its request does not hold the other sources' poll", async () => {
    const f = fleet(['c1']);
    const slow = f.repo('c1', 'slow', 'slow.example/repo:latest');
    const fast = f.repo('c1', 'fast');
    await f.deployAll([slow, fast]);
    f.state.now = T0 + PERIOD;
    // Each registry answers only once the other's request has been sent: polled one after the
    // other, the first source's request is held for ever and the poll never ends.
    let started = 0;
    let release: () => void = () => undefined;
    const both = new Promise<void>((r) => {
      release = r;
    });
    f.deps.resolveSource = async (source) => {
      if (++started === 2) release();
      await both;
      return source.url.startsWith('slow.') ? D1 : D2;
    };
    expect(await pollSources(f.deps)).toMatchObject({ sources: 2, polled: 2, changed: 1, failed: 0 });
  });

  it('starts where opts.start says in the record list, so sources after slow ones come early in some polls', async () => {
    const f = fleet(['c1']);
    const names = ['r0', 'r1', 'r2', 'r3'];
    const refs = names.map((n) => f.repo('c1', n, `${n}.example/repo:latest`));
    await f.deployAll(refs);
    f.state.now = T0 + PERIOD;
    const order = async (start: number) => {
      const seen: string[] = [];
      f.deps.resolveSource = async (source) => {
        seen.push(source.url.split('.')[0] as string);
        return D1;
      };
      f.state.now += PERIOD;
      // one source at a time would show the order exactly; with 8 workers the starts are in order
      await pollSources(f.deps, { start });
      return seen;
    };
    const keyOrder = await order(0);
    expect([...keyOrder].sort()).toEqual(names);
    // Half-way in: the second half of the key order first, then the first half.
    expect(await order(0.5)).toEqual([...keyOrder.slice(2), ...keyOrder.slice(0, 2)]);
    expect(await order(0.99)).toEqual([...keyOrder.slice(3), ...keyOrder.slice(0, 3)]);
  });

  it('one resolution per period per source however many pollers; a new digest pokes the leader only', async () => {
    const f = fleet(['c1', 'c2']);
    const a = f.repo('c1', 'repo');
    const b = f.repo('c2', 'repo');
    await f.deployAll([a, b], a);
    expect(f.state.resolutions).toBe(1);
    // Within the period: nothing to resolve, nobody behind.
    expect(await pollSources(f.deps)).toEqual({
      sources: 1,
      polled: 0,
      changed: 0,
      poked: 0,
      failed: 0,
      memberFailures: 0,
      paused: 0,
    });

    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    // Three pollers at once (three runtimes sharing the store): one request.
    const summaries = await Promise.all([0, 1, 2].map(() => pollSources(f.deps, { leaderStart: 0 })));
    expect(f.state.resolutions).toBe(2);
    expect(summaries.map((s) => s.polled).reduce((x, y) => x + y)).toBe(1);
    expect(summaries.map((s) => s.changed).reduce((x, y) => x + y)).toBe(1);
    // Nobody has deployed D2: only the leader (first member) is reconciled, by each poller that ran after the change.
    expect(new Set(f.poked())).toEqual(new Set(['c1/repo:ref-changed']));
  });

  it('the leader, having fetched the new digest, reconciles the members behind; then the poll has nobody to poke', async () => {
    const f = fleet(['c1', 'c2', 'c3']);
    const refs = ['c1', 'c2', 'c3'].map((c) => f.repo(c, 'repo'));
    await f.deployAll(refs);
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    await pollSources(f.deps, { leaderStart: 0 });
    expect(f.poked()).toEqual(['c1/repo:ref-changed']);
    f.state.emitted.length = 0;

    const leader = await trackSource(f.pkgrOf('c1', 'repo'), refs[0] as ObjectRef, f.deps);
    expect(leader?.resolved).toBe(D2);
    await memberDeployed(leader!, refs[0] as ObjectRef, true, f.deps);
    expect(f.poked()).toEqual(['c2/repo:ref-changed', 'c3/repo:ref-changed']);
    expect(f.state.emitted[0]).toMatchObject({ data: { uid: 'uid-c2-repo', generation: 1, resourceVersion: '7' } });

    f.state.emitted.length = 0;
    await f.deployAll(refs.slice(1));
    expect(f.state.emitted).toEqual([]);
    expect((await f.record()).members.map((m) => m.at)).toEqual([D2, D2, D2]);
    expect(await pollSources(f.deps)).toMatchObject({ polled: 0, poked: 0 });
  });

  it('pokes members behind once per period, only in clusters it serves; gone or re-pointed members leave the record', async () => {
    const f = fleet(['c1', 'c2', 'c3']);
    const refs = ['c1', 'c2', 'c3'].map((c) => f.repo(c, 'repo'));
    await f.deployAll(refs);
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    // The leader (c1) deployed D2 in an earlier run; c2 and c3 are behind.
    const t = await trackSource(f.pkgrOf('c1', 'repo'), refs[0] as ObjectRef, { ...f.deps, emit: undefined });
    await memberDeployed(t!, refs[0] as ObjectRef, false, f.deps);
    // c3 now names another tag; c2 is not served by this runtime.
    f.repo('c3', 'repo', 'registry.example/repo:v9');
    const served = { ...f.deps, clusters: { ...f.deps.clusters, clusterIds: () => ['c1', 'c3'] } } as DispatchDeps;
    const pokedAt = new Map<string, number>();
    expect(await pollSources(served, { pokedAt })).toMatchObject({ poked: 0 });
    expect((await f.record()).members.map((m) => m.cluster)).toEqual(['c1', 'c2']);

    expect(await pollSources(f.deps, { pokedAt })).toMatchObject({ poked: 1 });
    expect(await pollSources(f.deps, { pokedAt })).toMatchObject({ poked: 0 });
    f.state.now += PERIOD;
    expect(await pollSources(f.deps, { pokedAt })).toMatchObject({ poked: 1 });
    expect(f.poked()).toEqual(['c2/repo:ref-changed', 'c2/repo:ref-changed']);
  });

  it('a registry that loads clusters at run time (Lambda) is asked to load each member cluster first', async () => {
    const f = fleet(['c1', 'c2']);
    const refs = ['c1', 'c2'].map((c) => f.repo(c, 'repo'));
    await f.deployAll(refs);
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    const t = await trackSource(f.pkgrOf('c1', 'repo'), refs[0] as ObjectRef, { ...f.deps, emit: undefined });
    await memberDeployed(t!, refs[0] as ObjectRef, false, f.deps);
    // A fresh container: nothing loaded until prepare(); c2 loads, an unknown cluster would throw.
    const loaded = new Set<string>();
    const prepared: string[] = [];
    const lazy = {
      ...f.deps,
      clusters: {
        ...f.deps.clusters,
        clusterIds: () => [...loaded],
        prepare: async (id: string) => {
          prepared.push(id);
          if (id !== 'c2') throw new Error(`unknown cluster ${id}`);
          loaded.add(id);
        },
      },
    } as DispatchDeps;
    expect(await pollSources(lazy, { pokedAt: new Map() })).toMatchObject({ poked: 1 });
    expect(prepared).toEqual(['c2']);
    expect(f.poked()).toEqual(['c2/repo:ref-changed']);
  });

  it('a repository being deleted leaves the record', async () => {
    const f = fleet(['c1', 'c2']);
    const a = f.repo('c1', 'repo');
    const b = f.repo('c2', 'repo');
    for (const ref of [a, b]) await trackSource(f.pkgrOf(ref.clusterId, 'repo'), ref, f.deps);
    await leaveSource({ imgpkgBundle: { image: IMAGE } }, a, f.deps);
    expect((await f.record()).members.map((m) => m.cluster)).toEqual(['c2']);
  });

  it('a record every member left is no longer resolved: deleted sources cost the fleet poll nothing', async () => {
    // A tenant that creates and deletes objects on ever new tags (or on a server that answers
    // once, then holds every request to the deadline) must not leave sources the fleet's poll
    // resolves every period for ever, ahead of everyone else's.
    const f = fleet(['c1']);
    const a = f.repo('c1', 'repo');
    await trackSource(f.pkgrOf('c1', 'repo'), a, f.deps);
    await leaveSource({ imgpkgBundle: { image: IMAGE } }, a, f.deps);
    expect((await f.record()).members).toEqual([]);
    const before = f.state.resolutions;
    f.state.now = T0 + PERIOD;
    expect(await pollSources(f.deps)).toMatchObject({ polled: 0, poked: 0, failed: 0 });
    expect(f.state.resolutions).toBe(before);
    // A member joining again resolves the source itself (the record is stale).
    f.state.digest = D2;
    expect((await trackSource(f.pkgrOf('c1', 'repo'), a, f.deps))?.resolved).toBe(D2);
  });
});

describe('pollSources: each member on its own (a hung, refused or paused member holds no other)', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  /**
   * A fleet whose cluster `a-hang` never answers a read, `b-refused` refuses connections and
   * whose `c-paused/ns/m3` is paused; `z` holds 20 repositories. All on one tag, deployed at D1,
   * and by id the three hostile members come first.
   */
  async function hostile() {
    const f = fleet(['a-hang', 'b-refused', 'c-paused', 'z']);
    const refs = [f.repo('a-hang', 'm1'), f.repo('b-refused', 'm2'), f.repo('c-paused', 'm3')];
    for (let i = 0; i < 20; i++) refs.push(f.repo('z', `r${String(i).padStart(2, '0')}`));
    await f.deployAll(refs);
    const paused = f.clusters.get('c-paused')?.get('PackageRepository', 'ns', 'm3') as { spec: { paused?: boolean } };
    paused.spec.paused = true;
    const state = { refusing: true, reads: [] as string[], onHang: (): void => undefined };
    const view = f.deps.clusters.deployView.bind(f.deps.clusters);
    f.deps.clusters.deployView = ((id: string) => {
      const c = view(id);
      return new Proxy(c, {
        get: (t, prop) =>
          prop !== 'getObject'
            ? Reflect.get(t, prop, t)
            : async (ref: { name: string }) => {
                state.reads.push(`${id}/${ref.name}`);
                if (id === 'a-hang') {
                  state.onHang();
                  return await new Promise(() => undefined);
                }
                if (id === 'b-refused' && state.refusing) throw new Error('connect ECONNREFUSED 10.0.0.9:443');
                return await c.getObject(ref as never);
              },
      });
    }) as typeof f.deps.clusters.deployView;
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    return { f, state };
  }

  /** Runs `poll` under fake timers, advancing one member deadline: its summary, or `undefined` if it did not end. */
  async function withinOneMemberDeadline<T>(poll: () => Promise<T>): Promise<T | undefined> {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    let out: T | undefined;
    void poll().then((r) => {
      out = r;
    });
    await vi.advanceTimersByTimeAsync(MEMBER_DEADLINE_MS);
    await vi.advanceTimersByTimeAsync(0);
    vi.useRealTimers();
    return out;
  }

  /** The record moved to D2 longer than the leader's grace ago, polled now: every member behind is poked. */
  async function leaderHadItsGrace(f: ReturnType<typeof fleet>) {
    f.state.now = T0 + LEADER_GRACE_MS + 2 * PERIOD;
    await updateSourcePoll(f.store, f.key, (cur) =>
      cur
        ? { ...cur, resolved: D2, changedAt: new Date(T0).toISOString(), polledAt: new Date(f.state.now).toISOString() }
        : undefined,
    );
  }

  it('a fan-out sends each of the 20 healthy members its event within one member deadline; the others are counted and retried alone', async () => {
    const { f, state } = await hostile();
    await leaderHadItsGrace(f);
    const pokedAt = new Map<string, number>();
    const summary = await withinOneMemberDeadline(() => pollSources(f.deps, { pokedAt }));
    expect(summary).toMatchObject({ polled: 0, poked: 20, memberFailures: 2, paused: 1, failed: 0 });
    expect(f.poked()).toEqual(Array.from({ length: 20 }, (_, i) => `z/r${String(i).padStart(2, '0')}:ref-changed`));
    // Only the poked are marked: the refused member, answering now, is poked by the next check alone.
    state.refusing = false;
    f.state.emitted.length = 0;
    const again = await withinOneMemberDeadline(() => pollSources(f.deps, { pokedAt, resolve: false }));
    expect(again).toMatchObject({ poked: 1, memberFailures: 1, paused: 1 });
    expect(f.poked()).toEqual(['b-refused/m2:ref-changed']);
  });

  it('the leader is the first member that reads, is still on the source and is not paused', async () => {
    const { f } = await hostile();
    const summary = await withinOneMemberDeadline(() => pollSources(f.deps, { leaderStart: 0 }));
    expect(summary).toMatchObject({ changed: 1, poked: 1, memberFailures: 2, paused: 1 });
    expect(f.poked()).toEqual(['z/r00:ref-changed']);
  });

  it('a member cut by the function deadline is counted; no source starts after it', async () => {
    const { f, state } = await hostile();
    await leaderHadItsGrace(f);
    // The function deadline comes while the hung member is read: the poll ends (no timer
    // advanced), every member either poked or counted, none left waiting.
    const deadline = new AbortController();
    state.onHang = () => deadline.abort();
    const summary = await pollSources({ ...f.deps, deadline: deadline.signal });
    expect(summary.memberFailures).toBeGreaterThanOrEqual(2);
    expect(summary.poked + summary.memberFailures + summary.paused).toBe(23);
    expect(await pollSources({ ...f.deps, deadline: deadline.signal })).toMatchObject({ sources: 0, poked: 0 });
  });

  it('the leader of each move starts elsewhere in the members (a hostile member is not first every time)', async () => {
    const f = fleet(['c1']);
    const refs = Array.from({ length: 10 }, (_, i) => f.repo('c1', `r${i}`));
    await f.deployAll(refs);
    const leaders = new Set<string>();
    for (let move = 2; move <= 6; move++) {
      f.state.now += PERIOD;
      f.state.digest = `sha256:${String(move).repeat(64)}`;
      f.state.emitted.length = 0;
      expect(await pollSources(f.deps)).toMatchObject({ changed: 1, poked: 1 });
      // The same leader for every poll of one move.
      f.state.now += PERIOD;
      await pollSources(f.deps);
      expect(new Set(f.poked()).size).toBe(1);
      leaders.add(f.poked()[0] as string);
    }
    expect(leaders.size).toBeGreaterThan(1);
  });
});

describe('pollSources with resolve: false (record checks of runtimes serving part of a fleet)', () => {
  /** `f.deps` as a runtime that serves only `ids` sees them. */
  const servingOnly = (f: ReturnType<typeof fleet>, ids: string[]) =>
    ({ ...f.deps, clusters: { ...f.deps.clusters, clusterIds: () => ids } }) as DispatchDeps;

  it("reaches every runtime's repositories within a check of the move and of the leader's deploy, with no registry request", async () => {
    const f = fleet(['c1', 'c2', 'c3']);
    const refs = ['c1', 'c2', 'c3'].map((c) => f.repo(c, 'repo'));
    await f.deployAll(refs);
    const resolutions = f.state.resolutions;
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    // The runtime of c3 polls first and sees the move; the leader (c1, the first member) is not
    // its own, so it pokes nobody.
    const third = servingOnly(f, ['c3']);
    expect(await pollSources(third, { leaderStart: 0, pokedAt: new Map() })).toMatchObject({
      polled: 1,
      changed: 1,
      poked: 0,
    });
    expect(f.state.resolutions).toBe(resolutions + 1);
    // The leader's runtime learns it from its next check, not its next poll.
    const first = servingOnly(f, ['c1']);
    const firstPokes = new Map<string, number>();
    expect(await pollSources(first, { leaderStart: 0, pokedAt: firstPokes, resolve: false })).toMatchObject({
      polled: 0,
      poked: 1,
    });
    expect(f.poked()).toEqual(['c1/repo:ref-changed']);
    // The others are not poked before the leader deployed (one fetch and index for the fleet).
    const rest = servingOnly(f, ['c2', 'c3']);
    const restPokes = new Map<string, number>();
    expect(await pollSources(rest, { leaderStart: 0, pokedAt: restPokes, resolve: false })).toMatchObject({ poked: 0 });
    // The leader deploys D2 and pokes the members its runtime serves: none.
    const leader = await trackSource(f.pkgrOf('c1', 'repo'), refs[0] as ObjectRef, first);
    await memberDeployed(leader!, refs[0] as ObjectRef, true, first);
    expect(f.poked()).toEqual(['c1/repo:ref-changed']);
    // The other runtime's next check pokes both of its members, once.
    f.state.emitted.length = 0;
    expect(await pollSources(rest, { leaderStart: 0, pokedAt: restPokes, resolve: false })).toMatchObject({ poked: 2 });
    expect(f.poked()).toEqual(['c2/repo:ref-changed', 'c3/repo:ref-changed']);
    expect(await pollSources(rest, { leaderStart: 0, pokedAt: restPokes, resolve: false })).toMatchObject({ poked: 0 });
    // The next move: once the leader stored the new index (before its deploy), the others' check
    // pokes them, and the leader's deploy pokes nobody again.
    f.state.emitted.length = 0;
    f.state.now += PERIOD;
    const d3 = `sha256:${'3'.repeat(64)}`;
    f.state.digest = d3;
    expect(await pollSources(first, { leaderStart: 0, pokedAt: firstPokes })).toMatchObject({ changed: 1, poked: 1 });
    const next = await trackSource(f.pkgrOf('c1', 'repo'), refs[0] as ObjectRef, first);
    expect(await pollSources(rest, { leaderStart: 0, pokedAt: restPokes, resolve: false })).toMatchObject({ poked: 0 });
    expect(await memberIndexed(next!, refs[0] as ObjectRef, first)).toBe(0);
    expect((await f.record()).indexed).toBe(d3);
    expect(await pollSources(rest, { leaderStart: 0, pokedAt: restPokes, resolve: false })).toMatchObject({ poked: 2 });
    await memberDeployed(next!, refs[0] as ObjectRef, false, first);
    expect(f.poked()).toEqual(['c1/repo:ref-changed', 'c2/repo:ref-changed', 'c3/repo:ref-changed']);
    // Checks never resolved the source, however stale the record got.
    f.state.now += 5 * PERIOD;
    f.state.digest = `sha256:${'4'.repeat(64)}`;
    expect(await pollSources(rest, { leaderStart: 0, pokedAt: restPokes, resolve: false })).toMatchObject({
      polled: 0,
      changed: 0,
    });
    expect(f.state.resolutions).toBe(resolutions + 2);
    expect((await f.record()).resolved).toBe(d3);
  });
});

describe('startSourcePoller: the embedded timers', () => {
  /** A timer port whose intervals fire by hand: `fire(ms)` runs the callback of period `ms`. */
  const manualTimers = () => {
    const timers: { fn: () => void; ms: number; canceled: boolean }[] = [];
    const setTimer = (fn: () => void, ms: number) => {
      const t = { fn, ms, canceled: false };
      timers.push(t);
      return { cancel: () => (t.canceled = true) };
    };
    const fire = (ms: number) => {
      for (const t of timers) if (t.ms === ms && !t.canceled) t.fn();
    };
    return { timers, setTimer, fire };
  };

  it('polls once per period and checks the records in between (no resolution); a poll due during a check runs after it', async () => {
    const f = fleet(['c1', 'c2']);
    const refs = ['c1', 'c2'].map((c) => f.repo(c, 'repo'));
    await f.deployAll(refs);
    const resolutions = f.state.resolutions;
    f.deps.config = { ...f.deps.config, sourceCheckPeriodMs: 1000 };
    const t = manualTimers();
    const poller = startSourcePoller(f.deps, t.setTimer);
    expect(t.timers.map((x) => x.ms).sort()).toEqual([1000, PERIOD]);
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    // A check, held in its listing of the records, while the poll comes: the poll runs after it,
    // not dropped; the check itself resolved nothing.
    let release: () => void = () => undefined;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const list = f.store.list.bind(f.store);
    let lists = 0;
    f.store.list = async (...args: Parameters<typeof list>) => {
      if (++lists === 1) await gate;
      return await list(...args);
    };
    t.fire(1000);
    t.fire(PERIOD);
    await vi.waitFor(() => expect(lists).toBe(1));
    expect(f.state.resolutions).toBe(resolutions);
    release();
    await vi.waitFor(() => expect(f.state.resolutions).toBe(resolutions + 1));
    await vi.waitFor(() => expect(f.poked()).toEqual(['c1/repo:ref-changed']));
    // The leader deployed D2 (its runtime poked the rest: none here, emit dropped); a check pokes c2.
    const leader = await trackSource(f.pkgrOf('c1', 'repo'), refs[0] as ObjectRef, { ...f.deps, emit: undefined });
    await memberDeployed(leader!, refs[0] as ObjectRef, false, f.deps);
    t.fire(1000);
    await vi.waitFor(() => expect(f.poked()).toEqual(['c1/repo:ref-changed', 'c2/repo:ref-changed']));
    await poller.stop();
    expect(t.timers.every((x) => x.canceled)).toBe(true);
    expect(f.state.resolutions).toBe(resolutions + 1);
  });

  it.each([0, PERIOD, 2 * PERIOD])('has no check timer with sourceCheckPeriodMs %i', async (checkMs) => {
    const f = fleet(['c1']);
    f.deps.config = { ...f.deps.config, sourceCheckPeriodMs: checkMs };
    const t = manualTimers();
    await startSourcePoller(f.deps, t.setTimer).stop();
    expect(t.timers.map((x) => x.ms)).toEqual([PERIOD]);
  });
});

describe('a member whose record update fails is never left out', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a join that throws fails the run; the retried run joins, and the member is poked when the tag moves', async () => {
    const f = fleet(['c1', 'c2']);
    const a = f.repo('c1', 'repo');
    const b = f.repo('c2', 'repo');
    await f.deployAll([a]);
    f.store.throwing = 1;
    await expect(trackSource(f.pkgrOf('c2', 'repo'), b, f.deps)).rejects.toBeInstanceOf(StoreError);
    expect((await f.record()).members.map((m) => m.cluster)).toEqual(['c1']);
    // The run is retried (the queue's backoff, SQS redelivery) and joins.
    await f.deployAll([b]);
    expect((await f.record()).members.map((m) => [m.cluster, m.at])).toEqual([
      ['c1', D1],
      ['c2', D1],
    ]);
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    await pollSources(f.deps);
    const leader = await trackSource(f.pkgrOf('c1', 'repo'), a, f.deps);
    await memberDeployed(leader!, a, true, f.deps);
    expect(f.poked()).toEqual(['c1/repo:ref-changed', 'c2/repo:ref-changed']);
  });

  it('a record that keeps losing its compare-and-swap fails the run instead of fetching by tag unjoined', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout'] });
    const f = fleet(['c1', 'c2']);
    const a = f.repo('c1', 'repo');
    const b = f.repo('c2', 'repo');
    await f.deployAll([a]);
    // The record is due: the run must claim it first, and every claim loses.
    f.state.now = T0 + PERIOD;
    f.store.conflicting = Number.POSITIVE_INFINITY;
    const run = trackSource(f.pkgrOf('c2', 'repo'), b, f.deps);
    const settled = run.then(
      () => 'resolved',
      (e: Error) => e.message,
    );
    await vi.runAllTimersAsync();
    expect(await settled).toMatch(/conflicting writes in a row$/);
    expect(f.state.resolutions).toBe(1);
    f.store.conflicting = 0;
    expect((await trackSource(f.pkgrOf('c2', 'repo'), b, f.deps))?.resolved).toBe(D1);
    expect((await f.record()).members.map((m) => m.cluster)).toEqual(['c1', 'c2']);
  });

  it('a deploy joins the member again when the record lost it', async () => {
    const f = fleet(['c1', 'c2']);
    const a = f.repo('c1', 'repo');
    const b = f.repo('c2', 'repo');
    await f.deployAll([a]);
    const tracked = await trackSource(f.pkgrOf('c2', 'repo'), b, f.deps);
    // The record was replaced without c2 between its join and its deploy.
    const rec = await f.record();
    await f.store.put(f.key, JSON.stringify({ ...rec, members: rec.members.filter((m) => m.cluster !== 'c2') }));
    await memberDeployed(tracked!, b, false, f.deps);
    expect((await f.record()).members).toEqual([
      { cluster: 'c1', namespace: 'ns', name: 'repo', uid: 'uid-c1-repo', at: D1 },
      { cluster: 'c2', namespace: 'ns', name: 'repo', uid: 'uid-c2-repo', at: D1 },
    ]);
  });
});

describe('Apps on a polled source (trackAppSources)', () => {
  const GIT = { url: 'https://g.io/r', ref: 'main' };
  const [C1, C2] = ['c'.repeat(40), 'd'.repeat(40)];
  const gitKey = sourcePollKey({ kind: 'git', ...GIT });
  /** Creates the App `ns/name` in `cluster` fetching `git` and an inline entry; returns its ref and parsed App. */
  const appIn = (f: ReturnType<typeof fleet>, cluster: string, name: string, git: object = GIT) => {
    const raw = {
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name, namespace: 'ns', uid: `uid-${cluster}-${name}`, generation: 1, resourceVersion: '9' },
      spec: {
        fetch: [{ git, path: 'src' }, { inline: { paths: { 'a.yml': 'a: 1' } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      },
      // Reconciled: a run of it is a resync or a poke (a new generation resolves now, below).
      status: { observedGeneration: 1, conditions: [{ type: 'ReconcileSucceeded', status: 'True' }] },
    };
    f.clusters.get(cluster)?.put(raw as never);
    const parsed = parseApp(raw);
    if (!parsed.success) throw new Error('bad App');
    const ref: ObjectRef = {
      clusterId: cluster,
      kind: 'App',
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      namespace: 'ns',
      name,
      uid: raw.metadata.uid,
      generation: 1,
      resourceVersion: '9',
    };
    return { ref, app: parsed.data };
  };
  const gitRecord = async (f: ReturnType<typeof fleet>) => (await readSourcePoll(f.store, gitKey)) as SourcePollRecord;

  it('Apps of two clusters join as App members at what they fetch, pinned to one resolution', async () => {
    const f = fleet(['c1', 'c2']);
    f.state.digest = C1;
    const runs = [];
    for (const c of ['c1', 'c2']) {
      const { ref, app } = appIn(f, c, 'app');
      runs.push(await trackAppSources(app, ref, f.deps));
    }
    expect(f.state.resolutions).toBe(1);
    for (const r of runs) {
      expect(r.fetch).toEqual([{ git: { ...GIT, ref: C1 }, path: 'src' }, { inline: { paths: { 'a.yml': 'a: 1' } } }]);
      expect(r.tracked.map((t) => t.resolved)).toEqual([C1]);
    }
    expect((await gitRecord(f)).members).toEqual([
      { kind: 'App', cluster: 'c1', namespace: 'ns', name: 'app', uid: 'uid-c1-app', at: C1 },
      { kind: 'App', cluster: 'c2', namespace: 'ns', name: 'app', uid: 'uid-c2-app', at: C1 },
    ]);
  });

  it('a move pokes every App behind at once (no leader), as an App, with the cause naming the source', async () => {
    const f = fleet(['c1', 'c2']);
    f.state.digest = C1;
    const apps = ['c1', 'c2'].map((c) => appIn(f, c, 'app'));
    for (const { ref, app } of apps) await trackAppSources(app, ref, f.deps);
    f.state.now = T0 + PERIOD;
    f.state.digest = C2;
    const pokedAt = new Map<string, number>();
    expect(await pollSources(f.deps, { pokedAt })).toMatchObject({ polled: 1, changed: 1, poked: 2 });
    expect(f.poked()).toEqual(['c1/app:ref-changed', 'c2/app:ref-changed']);
    for (const e of f.state.emitted) {
      expect(e.data).toMatchObject({ kind: 'App', apiVersion: 'kappctrl.k14s.io/v1alpha1', uid: expect.any(String) });
      expect((e.data as { cause?: string }).cause).toBe(`source moved: git ${GIT.url} ${GIT.ref}@${C2}`);
    }
    // Both fetch the new commit: nobody is behind any more.
    for (const { ref, app } of apps) await trackAppSources(app, ref, f.deps);
    f.state.now += PERIOD;
    expect(await pollSources(f.deps, { pokedAt })).toMatchObject({ poked: 0 });
    expect(f.state.resolutions).toBe(3);
  });

  it('a repository is poked again within the period when the source moves again (per value, unlike an App)', async () => {
    const f = fleet(['c1']);
    const a = f.repo('c1', 'a');
    await f.deployAll([a], a);
    const pokedAt = new Map<string, number>();
    for (const [i, d] of [D2, `sha256:${'3'.repeat(64)}`].entries()) {
      f.state.digest = d;
      f.state.now = T0 + PERIOD + 1000 * i;
      await pollSources(f.deps, { pokedAt, resolve: i === 0 });
      if (i === 1)
        await readSourcePoll(f.store, f.key).then((r) => f.store.put(f.key, JSON.stringify({ ...r, resolved: d })));
      if (i === 1) await pollSources(f.deps, { pokedAt, resolve: false });
    }
    expect(f.poked()).toEqual(['c1/a:ref-changed', 'c1/a:ref-changed']);
  });

  it('a source whose value moves at every resolution pokes each App at most once per period (a tenant forcing resolutions buys no pokes)', async () => {
    const f = fleet(['c1', 'c2']);
    f.state.digest = C1;
    const [victim, attacker] = [appIn(f, 'c1', 'victim'), appIn(f, 'c2', 'attacker')];
    for (const { ref, app } of [victim, attacker]) await trackAppSources(app, ref, f.deps);
    const pokedAt = new Map<string, number>();
    const bumped = {
      ...attacker.app,
      metadata: { ...attacker.app.metadata, generation: 2 },
      status: { observedGeneration: 2, conditions: [{ type: 'Reconciling', status: 'True' }] },
    } as typeof attacker.app;
    // The attacker's new generations each force a resolution, each to a new value; the record
    // checks between them see the victim behind every time.
    for (const [i, d] of [C2, 'e'.repeat(40), 'f'.repeat(40)].entries()) {
      f.state.digest = d;
      f.state.now = T0 + 1000 * (i + 1);
      await trackAppSources(bumped, attacker.ref, f.deps);
      await pollSources(f.deps, { pokedAt, resolve: false });
    }
    expect(f.poked().filter((p) => p.startsWith('c1/victim'))).toEqual(['c1/victim:ref-changed']);
    // A period later the victim, still behind, is poked again.
    f.state.now = T0 + 3000 + PERIOD;
    await pollSources(f.deps, { pokedAt, resolve: false });
    expect(f.poked().filter((p) => p.startsWith('c1/victim'))).toHaveLength(2);
  });

  it('an App re-pointed to another branch leaves the record when poked; a deleted App leaves at once', async () => {
    const f = fleet(['c1', 'c2']);
    f.state.digest = C1;
    const a = appIn(f, 'c1', 'app');
    const b = appIn(f, 'c2', 'app');
    for (const { ref, app } of [a, b]) await trackAppSources(app, ref, f.deps);
    await leaveSource(b.app.spec.fetch ?? [], b.ref, f.deps);
    expect((await gitRecord(f)).members.map((m) => m.cluster)).toEqual(['c1']);
    appIn(f, 'c1', 'app', { ...GIT, ref: 'develop' });
    f.state.now = T0 + PERIOD;
    f.state.digest = C2;
    expect(await pollSources(f.deps)).toMatchObject({ poked: 0 });
    expect((await gitRecord(f)).members).toEqual([]);
  });

  it('a spec not reconciled yet resolves now despite a fresh record; a failed resolution fetches by ref', async () => {
    const f = fleet(['c1']);
    f.state.digest = C1;
    const { ref, app } = appIn(f, 'c1', 'app');
    await trackAppSources(app, ref, f.deps);
    // As the new generation's run left it before its fetch: `Reconciling` written with the
    // generation observed (upstream's setReconciling), so observedGeneration alone cannot tell.
    const changed = {
      ...app,
      metadata: { ...app.metadata, generation: 2 },
      status: { observedGeneration: 2, conditions: [{ type: 'Reconciling', status: 'True' }] },
    } as typeof app;
    f.state.digest = C2;
    expect((await trackAppSources(changed, ref, f.deps)).tracked.map((t) => t.resolved)).toEqual([C2]);
    expect(f.state.resolutions).toBe(2);
    // The source unreachable: the new generation fetches by ref (and fails as upstream's would).
    f.deps.resolveSource = async () => {
      throw new Error('connection refused');
    };
    const down = await trackAppSources(changed, ref, f.deps);
    expect(down).toEqual({ fetch: app.spec.fetch, tracked: [] });
  });

  it('a source the poll cannot resolve: members poked once with the failure as cause, their runs resolve for themselves; a good resolution clears it', async () => {
    const f = fleet(['c1', 'c2']);
    f.state.digest = C1;
    const apps = ['c1', 'c2'].map((c) => appIn(f, c, 'app'));
    for (const { ref, app } of apps) await trackAppSources(app, ref, f.deps);
    let down = true;
    f.deps.resolveSource = async () => {
      f.state.resolutions += 1;
      if (down) throw new Error('connection refused');
      return f.state.digest;
    };
    f.state.now = T0 + PERIOD;
    const pokedAt = new Map<string, number>();
    expect(await pollSources(f.deps, { pokedAt })).toMatchObject({ polled: 0, failed: 1, poked: 2 });
    expect(f.poked()).toEqual(['c1/app:ref-changed', 'c2/app:ref-changed']);
    for (const e of f.state.emitted)
      expect((e.data as { cause?: string }).cause).toBe(`source poll failed: git ${GIT.url} ${GIT.ref}`);
    const rec = await gitRecord(f);
    expect(rec).toMatchObject({ resolved: C1, failingSince: new Date(T0 + PERIOD).toISOString() });
    // A record check of another runtime in the same period pokes nobody again here.
    expect(await pollSources(f.deps, { pokedAt, resolve: false })).toMatchObject({ poked: 0 });
    // The poked App's run does not reuse the record (it is fresh, but failing): it resolves
    // itself, fails, and fetches by ref, so its status says what is wrong.
    const before = f.state.resolutions;
    const [a] = apps;
    expect(await trackAppSources(a!.app, a!.ref, f.deps)).toEqual({ fetch: a!.app.spec.fetch, tracked: [] });
    expect(f.state.resolutions).toBe(before + 1);
    // The next period's poll fails again: the same failure, nobody poked twice.
    f.state.now += PERIOD;
    f.state.emitted.length = 0;
    expect(await pollSources(f.deps, {})).toMatchObject({ failed: 1, poked: 0 });
    expect((await gitRecord(f)).failingSince).toBe(rec.failingSince);
    // The source is back at the same commit: the mark is cleared, runs reuse the record again.
    down = false;
    f.state.now += PERIOD;
    expect(await pollSources(f.deps, {})).toMatchObject({ polled: 1, failed: 0 });
    expect((await gitRecord(f)).failingSince).toBeUndefined();
    const after = f.state.resolutions;
    expect((await trackAppSources(a!.app, a!.ref, f.deps)).tracked.map((t) => t.resolved)).toEqual([C1]);
    expect(f.state.resolutions).toBe(after);
  });

  it('an App and a repository of one name in one cluster are two members, each poked as its kind', async () => {
    const f = fleet(['c1']);
    const repo = f.repo('c1', 'x');
    await trackSource(f.pkgrOf('c1', 'x'), repo, f.deps);
    // An old record's member has no kind: a repository. An App on the bundle joins beside it.
    const { ref, app } = appIn(f, 'c1', 'x');
    const bundleApp = { ...app, spec: { ...app.spec, fetch: [{ imgpkgBundle: { image: IMAGE } }] } };
    f.clusters
      .get('c1')
      ?.put({ ...(f.clusters.get('c1')?.get('App', 'ns', 'x') as object), spec: bundleApp.spec } as never);
    await trackAppSources(bundleApp, ref, f.deps);
    expect((await f.record()).members.map((m) => `${m.kind ?? '-'}:${m.name}:${m.at ?? '-'}`)).toEqual([
      `App:x:${D1}`,
      '-:x:-',
    ]);
    f.state.now = T0 + PERIOD;
    f.state.digest = D2;
    await pollSources(f.deps);
    // The repository is the leader (alone behind); the App is poked at once beside it.
    expect(f.state.emitted.map((e) => (e.data as { kind: string }).kind).sort()).toEqual(['App', 'PackageRepository']);
  });
});
