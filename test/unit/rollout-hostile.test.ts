/**
 * The cloud-rollout coordinator (`functions/lib/entry/dispatch-rollouts.ts`) and the fleet page
 * against a taken-over cluster (issue 28 attacker pass, findings H1–H4, M1, M2 in part, M3, L2).
 * In the shared stack a cluster's run writes its own fleet entries (`state/fleet/<id>/…`, any key
 * its session may PUT) and answers its dispatcher's batch (`touched`, `start`): neither may stop
 * the coordination of other clusters' rollouts, start a rollout it may not, nor grow the work or
 * the records every reader loads. Cluster `zeta` is the attacker throughout.
 */
import { describe, expect, it } from 'vitest';
import { RE_POKE_WINDOW_MS } from '../../functions/lib/entry/dispatch-rollouts.js';
import { buildFleetView } from '../../functions/lib/fleet/view.js';
import { commandRollout, FAILURES_KEPT, keptFailures, newRollout } from '../../functions/lib/rollout/evaluate.js';
import { parseRolloutPolicy } from '../../functions/lib/rollout/policy.js';
import {
  casRollout,
  type FleetEntry,
  fleetKey,
  policyKey,
  putPolicy,
  readRollout,
  rolloutKey,
} from '../../functions/lib/rollout/state.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { GetOptions, ObjectStore } from '../../functions/lib/store/port.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import {
  coordinatorOver,
  entry,
  fakeBucket,
  putEntry,
  REF,
  restReleased,
  storeWith,
  T0,
  twoWavePolicy,
} from './support/rollout-hostile.js';

const POLICY = twoWavePolicy();
const AT = T0.toISOString();
const OTHER = 'other.test.carvel.dev';
/** A second policy, of another package only beta (canary) and gamma (rest) run. */
const OTHER_POLICY = twoWavePolicy(OTHER, 'zz-other', 'beta');
/** The poke gamma is owed once OTHER's wave rest is released. */
const GAMMA_RELEASED = `gamma/PackageInstall/ns/inst rollout: zz-other/${OTHER} wave rest released (3.0.0)`;

/** POLICY with wave rest released (`restReleased`), alpha at the target: the re-poke and M3 cases start here. */
async function restReleasedStore(): Promise<MemoryStore> {
  const store = new MemoryStore();
  await putPolicy(store, POLICY);
  await casRollout(store, 'default', REF, () => restReleased(POLICY));
  await putEntry(store, entry('alpha', '2.0.0'));
  return store;
}

/**
 * REF (policy `default`): canary done, rest released, `zeta` (as `zetaEntry` says) a member of
 * rest. OTHER (policy `zz-other`, evaluated after `default`): beta healthy at the target in wave
 * canary, gamma waits for rest.
 */
async function twoRollouts(zetaEntry: FleetEntry) {
  const base = new MemoryStore();
  await putPolicy(base, POLICY);
  await putPolicy(base, OTHER_POLICY);
  await casRollout(base, 'default', REF, () => restReleased(POLICY));
  await putEntry(base, entry('alpha', '2.0.0'));
  await putEntry(base, zetaEntry);
  await casRollout(base, 'zz-other', OTHER, () => newRollout(OTHER_POLICY, OTHER, '3.0.0', '2.0.0', T0));
  await putEntry(base, { ...entry('beta', '3.0.0'), refName: OTHER });
  await putEntry(base, { ...entry('gamma', '2.0.0'), refName: OTHER });
  return base;
}

describe('H1: keys S3 takes but S3Store never writes, planted under zeta`s own fleet prefix', () => {
  it('leave the schedule`s check and the fleet page working (S3Store.list leaves them out)', async () => {
    const objects = new Map<string, string>([
      [policyKey('default'), JSON.stringify(POLICY)],
      [rolloutKey('default', REF), JSON.stringify(newRollout(POLICY, REF, '2.0.0', '1.0.0', T0))],
      [fleetKey('alpha', 'ns', 'inst'), JSON.stringify(entry('alpha', '2.0.0'))],
      [fleetKey('beta', 'ns', 'inst'), JSON.stringify(entry('beta', '1.0.0'))],
    ]);
    // 1,000 keys: one of them ends a listing page (the next page's startAfter); `~` sorts last.
    for (let i = 0; i < 1000; i++) objects.set(`state/fleet/zeta/x+${String(i).padStart(4, '0')}.json`, '{}');
    objects.set('state/fleet/zeta/ns/x~.json', '{}');
    const store = new S3Store({ client: fakeBucket(objects), bucket: 'bkt' });
    const { coordinator, poked } = coordinatorOver(store);
    await coordinator.check();
    expect(poked.flat()).toEqual([`beta/PackageInstall/ns/inst rollout: default/${REF} wave rest released (2.0.0)`]);
    const view = await buildFleetView(store);
    expect(view.installs.map((i) => i.clusterId).sort()).toEqual(['alpha', 'beta']);
    expect(view.rollouts).toHaveLength(1);
  });
});

describe('H2: zeta`s entries no poke can be made of do not lose other clusters` pokes', () => {
  it('an uppercase namespace: the check still releases gamma`s wave and sends an aborted rollout`s end pokes', async () => {
    const store = await twoRollouts(entry('zeta', '1.0.0', 'inst', { namespace: 'NS' }));
    await casRollout(store, 'default', REF, (r) => (r ? commandRollout(r, 'abort', T0) : undefined));
    const { coordinator, poked } = coordinatorOver(store);
    await coordinator.check();
    const subjects = poked.flat().map((p) => p.split(' ')[0]);
    expect(poked.flat()).toContain(GAMMA_RELEASED);
    expect(subjects).toContain('alpha/PackageInstall/ns/inst'); // REF's end poke
    expect(subjects.filter((s) => s?.startsWith('zeta/'))).toEqual([]);
  });

  it('a uid no event takes: a co-batched cluster`s released wave is still poked', async () => {
    const store = await twoRollouts(entry('zeta', '2.0.0', 'inst', { uid: 'not a uid', reconcile: 'failed' }));
    const { coordinator, poked } = coordinatorOver(store);
    await coordinator.afterBatch(
      new Map([
        ['beta', { touched: [`zz-other/${OTHER}`], start: [] }],
        ['zeta', { touched: [`default/${REF}`], start: [] }],
      ]),
    );
    expect(poked.flat()).toContain(GAMMA_RELEASED);
  });

  it('a send that fails leaves the end pokes and a released wave`s pokes to the next check', async () => {
    const store = await twoRollouts(entry('zeta', '1.0.0'));
    await casRollout(store, 'default', REF, (r) => (r ? commandRollout(r, 'abort', T0) : undefined));
    const { coordinator, poked } = coordinatorOver(store, 1);
    await coordinator.check();
    expect(poked).toEqual([]);
    expect((await readRollout(store, 'zz-other', OTHER))?.record.waves[1]?.releasedAt).toBe(AT);
    expect((await readRollout(store, 'default', REF))?.record.endPokedAt).toBeUndefined();
    await coordinator.check();
    expect(poked.flat()).toContain(GAMMA_RELEASED);
    expect(poked.flat().map((p) => p.split(' ')[0])).toEqual(
      expect.arrayContaining(['alpha/PackageInstall/ns/inst', 'zeta/PackageInstall/ns/inst']),
    );
    expect((await readRollout(store, 'default', REF))?.record.endPokedAt).toBe(AT);
  });
});

describe('H3: a rollout whose evaluation fails ends that rollout`s part only', () => {
  for (const since of ['garbage', '2026-13-45T99:00:00Z']) {
    it(`zeta healthy since ${since}: the entry is refused, OTHER released and gamma poked`, async () => {
      const store = await twoRollouts(entry('zeta', '2.0.0', 'inst', { health: 'True', healthySince: since }));
      const { coordinator, poked, log } = coordinatorOver(store);
      await coordinator.check();
      expect(poked.flat()).toContain(GAMMA_RELEASED);
      expect(JSON.stringify(log.records)).not.toMatch(/Invalid time value/);
    });
  }

  it('a store that fails the write of one rollout: the next is still evaluated and poked', async () => {
    const base = await twoRollouts(entry('zeta', '2.0.0'));
    const store = storeWith(base, {
      putIfMatch: async (key, body, etag) => {
        if (key === rolloutKey('default', REF)) throw new Error('store did not answer');
        return await base.putIfMatch(key, body, etag);
      },
    });
    const { coordinator, poked } = coordinatorOver(store);
    await coordinator.check();
    expect(poked.flat()).toContain(GAMMA_RELEASED);
  });
});

describe('H4: a touched name that is no `<policy>/<refName>`', () => {
  it('is ignored: a co-batched cluster`s released wave is still poked', async () => {
    const store = await twoRollouts(entry('zeta', '1.0.0'));
    const { coordinator, poked } = coordinatorOver(store);
    await coordinator.afterBatch(
      new Map([
        ['beta', { touched: [`zz-other/${OTHER}`], start: [] }],
        ['zeta', { touched: ['default/no such key'], start: [] }],
      ]),
    );
    expect(poked.flat()).toContain(GAMMA_RELEASED);
  });
});

/** `base` with its fleet entry reads kept (key, options). */
function fleetReads(base: ObjectStore) {
  const reads: { key: string; opts: GetOptions | undefined }[] = [];
  const store = storeWith(base, {
    get: async (key, opts) => {
      if (key.startsWith('state/fleet/')) reads.push({ key, opts });
      return await base.get(key, opts);
    },
  });
  return { store, reads };
}

describe('M1: the coordinator`s work per batch is bounded by the fleet, not by what a run answers', () => {
  it('two moving rollouts and 100 made-up touched names: each fleet entry read once', async () => {
    const base = new MemoryStore();
    const star = twoWavePolicy('*');
    await putPolicy(base, star);
    await casRollout(base, 'default', REF, () => newRollout(star, REF, '2.0.0', '1.0.0', T0));
    await casRollout(base, 'default', OTHER, () => newRollout(star, OTHER, '3.0.0', '2.0.0', T0));
    await putEntry(base, entry('alpha', '2.0.0'));
    await putEntry(base, { ...entry('alpha', '3.0.0', 'other'), refName: OTHER });
    for (let i = 0; i < 48; i++) await putEntry(base, entry(`c${i}`, '1.0.0'));
    const { store, reads } = fleetReads(base);
    const { coordinator, poked } = coordinatorOver(store);
    const touched = [`default/${REF}`, `default/${OTHER}`, ...Array.from({ length: 100 }, (_, i) => `default/x${i}`)];
    await coordinator.afterBatch(new Map([['zeta', { touched, start: [] }]]));
    expect(poked.flat().filter((p) => p.endsWith(`default/${REF} wave rest released (2.0.0)`))).toHaveLength(48);
    expect(reads).toHaveLength(50);
  });

  it('a fleet entry is read at most 1 MiB, however large zeta makes it', async () => {
    const base = new MemoryStore();
    await putPolicy(base, POLICY);
    await casRollout(base, 'default', REF, () => newRollout(POLICY, REF, '2.0.0', '1.0.0', T0));
    const pad = 'x'.repeat(8 * 1024 * 1024);
    await base.put(fleetKey('zeta', 'ns', 'inst'), JSON.stringify({ ...entry('zeta', '1.0.0'), pad }));
    const { store, reads } = fleetReads(base);
    await coordinatorOver(store).coordinator.afterBatch(
      new Map([['zeta', { touched: [`default/${REF}`], start: [] }]]),
    );
    expect(reads.map((r) => r.opts?.maxBytes)).toEqual([1024 * 1024]);
  });
});

/** A `*` policy, one wave of every cluster: it does not gate REF (`default` lists it). */
const WIDE = parseRolloutPolicy(`
apiVersion: kapp-lambda/v1
kind: RolloutPolicy
metadata: { name: wide }
spec:
  packages: ["*"]
  waves:
    - { name: all }
`);

/** What `clusterId` asked to start (alpha, canary of `default`, runs REF at 1.0.0); the records then. */
async function asked(
  clusterId: string,
  ask: { policy: string; version: string; from?: string },
  planted: FleetEntry[] = [],
) {
  const store = new MemoryStore();
  await putPolicy(store, POLICY);
  await putPolicy(store, WIDE);
  await putEntry(store, entry('alpha', '1.0.0'));
  await putEntry(store, entry('zeta', '1.0.0'));
  for (const e of planted) await putEntry(store, e);
  await coordinatorOver(store).coordinator.afterBatch(
    new Map([[clusterId, { touched: [], start: [{ ...ask, refName: REF }] }]]),
  );
  return {
    default: (await readRollout(store, 'default', REF))?.record,
    wide: (await readRollout(store, 'wide', REF))?.record,
  };
}
describe('M2 (in part): a start ask', () => {
  it('under a policy that does not gate the refName creates nothing (no phantom rollout)', async () => {
    expect(await asked('zeta', { policy: 'wide', version: '9.9.9', from: '1.0.0' })).toEqual({
      default: undefined,
      wide: undefined,
    });
  });

  it('from a version the asker`s entries do not run, or of no semver version, creates nothing', async () => {
    expect((await asked('alpha', { policy: 'default', version: '2.0.0', from: '0.0.1' })).default).toBeUndefined();
    expect((await asked('alpha', { policy: 'default', version: '2.0.0' })).default).toBeUndefined();
    expect((await asked('alpha', { policy: 'default', version: 'latest', from: '1.0.0' })).default).toBeUndefined();
    // As the gating policy's first wave asks it, it starts.
    expect((await asked('alpha', { policy: 'default', version: '2.0.0', from: '1.0.0' })).default).toMatchObject({
      target: '2.0.0',
      from: '1.0.0',
    });
  });
});

describe('M2: the version a rollout starts from', () => {
  it('is one another cluster runs: alpha`s own planted entry at 0.0.1 does not make it the from', async () => {
    const planted = [entry('alpha', '0.0.1', 'planted')];
    expect(
      (await asked('alpha', { policy: 'default', version: '2.0.0', from: '0.0.1' }, planted)).default,
    ).toBeUndefined();
    expect(
      (await asked('alpha', { policy: 'default', version: '2.0.0', from: '1.0.0' }, planted)).default,
    ).toMatchObject({
      from: '1.0.0',
    });
  });
});

describe('the check`s re-pokes of a released wave', () => {
  it('reach members that have not run since the release, within RE_POKE_WINDOW_MS of it only', async () => {
    const store = await restReleasedStore();
    // beta has not run since the release (its entry is from T0); gamma ran after it, still at 1.0.0.
    await putEntry(store, entry('beta', '1.0.0'));
    await putEntry(store, entry('gamma', '1.0.0', 'inst', { at: new Date(T0.getTime() + 1000).toISOString() }));
    const soon = coordinatorOver(store, 0, () => new Date(T0.getTime() + 60_000));
    await soon.coordinator.check();
    expect(soon.poked.flat().map((p) => p.split(' ')[0])).toEqual(['beta/PackageInstall/ns/inst']);
    const late = coordinatorOver(store, 0, () => new Date(T0.getTime() + RE_POKE_WINDOW_MS + 1000));
    await late.coordinator.check();
    expect(late.poked).toEqual([]);
  });
});

describe('M3: a cluster id with a slash', () => {
  it('alpha`s entry naming cluster `alpha/x` (key state/fleet/alpha/x/…) is no member of wave rest', async () => {
    const store = await restReleasedStore();
    await putEntry(store, entry('beta', '2.0.0'));
    await putEntry(store, entry('alpha/x', '2.0.0', 'inst', { reconcile: 'failed', lastAttemptedVersion: '2.0.0' }));
    await coordinatorOver(store).coordinator.check();
    expect((await readRollout(store, 'default', REF))?.record.status).not.toBe('stopped');
  });
});

describe('L2: the failures a stopped record keeps', () => {
  it('4,000 failing entries of zeta: the record keeps 10, and the page still shows the stop', async () => {
    const store = new MemoryStore();
    await putPolicy(store, POLICY);
    const r = newRollout(POLICY, REF, '2.0.0', '1.0.0', T0);
    r.waves[1] = { name: 'rest', releasedAt: AT };
    await casRollout(store, 'default', REF, () => r);
    // Names of 253 characters: 4,000 failures would be some 1.4 MB of record.
    const long = Array.from({ length: 3 }, () => 'n'.repeat(63)).join('.');
    for (let i = 0; i < 4000; i++) {
      const name = `${long}.${String(i).padStart(4, '0')}${'n'.repeat(57)}`;
      await putEntry(
        store,
        entry('zeta', '2.0.0', name, { uid: `u${i}`, reconcile: 'failed', lastAttemptedVersion: '2.0.0' }),
      );
    }
    await coordinatorOver(store).coordinator.afterBatch(
      new Map([['zeta', { touched: [`default/${REF}`], start: [] }]]),
    );
    expect((await readRollout(store, 'default', REF))?.record.failed).toHaveLength(FAILURES_KEPT.perCluster);
    expect((await buildFleetView(store)).rollouts).toMatchObject([{ refName: REF, status: 'stopped' }]);
  });

  it('keeps at most 200 in all, in order', () => {
    const failed = Array.from({ length: 300 }, (_, i) => ({ cluster: `c${Math.floor(i / 10)}`, i }));
    expect(keptFailures(failed)).toEqual(failed.slice(0, FAILURES_KEPT.total));
  });
});
