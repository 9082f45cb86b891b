/**
 * e2e: a fleet rollout in waves (issue 28 items 1 and 2). Three cluster ids, each served by its
 * own embedded runtime on the shared control plane, share one object store; a RolloutPolicy
 * there puts each in a wave of its own (`a`, then `b`, then `c`, soak 3 s). Each holds an inline
 * PackageRepository (Package 1.0.0) and a PackageInstall (`>=1.0.0`, sync period 10m: no timer
 * fires during the test). The repositories are updated in place with 2.0.0: the first install
 * run to see it creates the rollout (wave a released), b and c stay at 1.0.0 with a `Held`
 * Rollout condition; each later wave is released only once the one before has been healthy for
 * the soak (the forwarder's due time, or the other runtimes' rollout checks), and its
 * PackageInstalls are poked at once. The rollout record's times show the order. Then 3.0.0,
 * paused with `npm run fleet -- rollout pause` as it starts: no wave follows the first's soak
 * until `resume`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { KappLambdaConditionType } from '../../functions/lib/api/constants.js';
import { listReceipts } from '../../functions/lib/receipt/receipt.js';
import { readRollout } from '../../functions/lib/rollout/state.js';
import { REAL_IO as FLEET_IO, main as fleetMain } from '../../scripts/fleet.js';
import {
  applyRolloutPolicy,
  type E2EFleet,
  fleetPackageInstall,
  inlineConfigMapPackageDoc,
  inlineRepositoryManifest,
  type PkgiObject,
  startFleet,
  waitFleetPackageInstall,
  waitRepo,
} from './packaging-support.js';
import { apply, type E2ERuntime, getObject, suffix, waitFor } from './support.js';

const id = suffix();
const CLUSTERS = ['a', 'b', 'c'].map((w) => ({ context: `rollout-${w}-${id}`, ns: `e2e-rollout-${w}-${id}` }));
/** A fourth cluster id, served from the start, whose PackageInstall appears only mid-rollout (the last test). */
const JOINER = { context: `rollout-d-${id}`, ns: `e2e-rollout-d-${id}` };
const REF_NAME = 'rollout.e2e.carvel.dev';
const PKGI = 'packageinstalls.packaging.carvel.dev';
const SOAK_MS = 3000;

/** A Package of `version`: an inline ytt ConfigMap named `rollout`. */
function packageDoc(version: string): object {
  return inlineConfigMapPackageDoc(REF_NAME, version, 'rollout');
}

/** 4.0.0 and 5.0.0 do not render (their config is not YAML): their App fails at template, wherever it goes. */
const BROKEN = '4.0.0';
const BROKEN_TOO = '5.0.0';

function repo(ns: string, versions: string[]): object {
  const doc = (v: string) => {
    const d = packageDoc(v) as { spec: { template: { spec: { fetch: { inline: { paths: object } }[] } } } };
    if (v === BROKEN || v === BROKEN_TOO) {
      (d.spec.template.spec.fetch[0] as { inline: { paths: object } }).inline.paths = { 'config.yml': 'a: [' };
    }
    return d;
  };
  return inlineRepositoryManifest(
    ns,
    'repo',
    Object.fromEntries(versions.map((v) => [`packages/${v}.yml`, stringify(doc(v))])),
  );
}

let fleet: E2EFleet | undefined;
let runtimes: E2ERuntime[] = [];

beforeAll(async () => {
  fleet = await startFleet([...CLUSTERS, JOINER], {
    prefix: 'kapp-lambda-e2e-rollout-',
    pollPeriodMs: 600_000,
    onToolRun: () => {},
  });
  runtimes = fleet.runtimes;
});

afterAll(async () => {
  await fleet?.dispose();
});

const reconciledAt = (p: PkgiObject | undefined, version: string) =>
  p?.status?.version === version && p.status.conditions?.[0]?.type === 'ReconcileSucceeded';

const waitPkgi = (ns: string, what: string, pred: (p: PkgiObject | undefined) => boolean) =>
  waitFleetPackageInstall(runtimes, ns, what, pred);

describe('fleet rollout in waves', () => {
  it('three cluster ids in three waves: each wave starts only after the one before was healthy for the soak', async () => {
    const store = runtimes[0]!.runtime.store;
    await applyRolloutPolicy(store, `e2e-${id}`, {
      packages: [REF_NAME],
      waves: CLUSTERS.map((c, i) => ({ name: `w${i}`, clusters: [c.context], soak: `${SOAK_MS / 1000}s` })),
    });
    for (const [i, c] of CLUSTERS.entries()) {
      await apply(repo(c.ns, ['1.0.0']), fleetPackageInstall(c.ns, REF_NAME));
      await waitRepo(runtimes[i]!, c.ns, 'repo');
    }
    for (const c of CLUSTERS) await waitPkgi(c.ns, 'at 1.0.0', (p) => reconciledAt(p, '1.0.0'));
    expect(await store.list('state/rollouts/')).toEqual([]);

    // The last wave's repository first: its install run creates the rollout, and is held.
    for (const c of [...CLUSTERS].reverse()) await apply(repo(c.ns, ['1.0.0', '2.0.0']));
    const [a, b, c] = CLUSTERS as [(typeof CLUSTERS)[0], (typeof CLUSTERS)[0], (typeof CLUSTERS)[0]];
    await waitPkgi(a.ns, 'at 2.0.0', (p) => reconciledAt(p, '2.0.0'));
    const held = await waitPkgi(c.ns, 'held', (p) =>
      Boolean(p?.status?.conditions?.some((x) => x.type === KappLambdaConditionType.Rollout && x.reason === 'Held')),
    );
    expect(held.status?.version).toBe('1.0.0');
    expect(held.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
    await waitPkgi(b.ns, 'at 2.0.0', (p) => reconciledAt(p, '2.0.0'));
    await waitPkgi(c.ns, 'at 2.0.0', (p) => reconciledAt(p, '2.0.0'));

    const record = await waitFor(
      'the rollout completed',
      async () => {
        const r = (await readRollout(store, `e2e-${id}`, REF_NAME))?.record;
        return r?.status === 'completed' ? r : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 250 },
    );
    expect(record).toMatchObject({ target: '2.0.0', from: '1.0.0' });
    const t = (s: string | undefined) => Date.parse(s ?? '');
    for (let i = 1; i < record.waves.length; i++) {
      const before = record.waves[i - 1]!;
      const wave = record.waves[i]!;
      // Released only after the wave before was healthy for the whole soak.
      expect(t(wave.releasedAt)).toBeGreaterThanOrEqual(t(before.healthyAt) + SOAK_MS);
      expect(t(wave.healthyAt)).toBeGreaterThanOrEqual(t(wave.releasedAt));
    }
    expect(record.history.filter((h) => h.what === 'released').map((h) => h.wave)).toEqual(['w0', 'w1', 'w2']);
  }, 420_000);

  it('paused (npm run fleet -- rollout pause): no wave is released after the soak; resumed: the next waves follow', async () => {
    const store = runtimes[0]!.runtime.store;
    const policy = `e2e-${id}`;
    // The command line on the fleet's store (its output kept out of the test's).
    const fleetCli = async (...argv: string[]) =>
      await fleetMain(argv, {}, { ...FLEET_IO, store: () => store, missingDir: undefined, out: () => {} });
    for (const c of [...CLUSTERS].reverse()) await apply(repo(c.ns, ['1.0.0', '2.0.0', '3.0.0']));
    await waitFor(
      'the rollout of 3.0.0',
      async () => ((await readRollout(store, policy, REF_NAME))?.record.target === '3.0.0' ? true : undefined),
      { timeoutMs: 60_000, intervalMs: 100 },
    );
    expect(await fleetCli('rollout', 'pause', policy, '--package', REF_NAME)).toBe(0);
    const [a, b, c] = CLUSTERS as [(typeof CLUSTERS)[0], (typeof CLUSTERS)[0], (typeof CLUSTERS)[0]];
    await waitPkgi(a.ns, 'at 3.0.0', (p) => reconciledAt(p, '3.0.0'));
    const soaking = await waitFor(
      'wave w0 healthy',
      async () => {
        const r = (await readRollout(store, policy, REF_NAME))?.record;
        return r?.waves[0]?.soakEndsAt ? r : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 250 },
    );
    // Well past the soak's end: still paused, w1 not released, b held at 2.0.0.
    await new Promise((r) => setTimeout(r, Date.parse(soaking.waves[0]?.soakEndsAt ?? '') + 2000 - Date.now()));
    const paused = (await readRollout(store, policy, REF_NAME))?.record;
    expect(paused?.status).toBe('paused');
    expect(paused?.waves[1]?.releasedAt).toBeUndefined();
    expect((await getObject<PkgiObject>(PKGI, b.ns, 'app'))?.status?.version).toBe('2.0.0');

    expect(await fleetCli('rollout', 'resume', policy, '--package', REF_NAME)).toBe(0);
    await waitPkgi(b.ns, 'at 3.0.0', (p) => reconciledAt(p, '3.0.0'));
    await waitPkgi(c.ns, 'at 3.0.0', (p) => reconciledAt(p, '3.0.0'));
    const done = (await readRollout(store, policy, REF_NAME))?.record;
    expect(done?.history.map((h) => h.what).filter((w) => /by the operator|released/.test(w))).toEqual([
      'released',
      'paused by the operator',
      'running by the operator',
      'released',
      'released',
    ]);
  }, 420_000);

  it("a version that fails in the first wave stops the rollout, saying why, and the later waves' Apps are not touched", async () => {
    const store = runtimes[0]!.runtime.store;
    const policy = `e2e-${id}`;
    const [a, b, c] = CLUSTERS as [(typeof CLUSTERS)[0], (typeof CLUSTERS)[0], (typeof CLUSTERS)[0]];
    const generation = async (ns: string) =>
      (await getObject<{ metadata: { generation: number } }>('apps.kappctrl.k14s.io', ns, 'app'))?.metadata.generation;
    const before = { b: await generation(b.ns), c: await generation(c.ns) };
    for (const cl of [...CLUSTERS].reverse()) await apply(repo(cl.ns, ['1.0.0', '2.0.0', '3.0.0', BROKEN]));
    const failed = await waitPkgi(a.ns, `${BROKEN} failed`, (p) =>
      Boolean(p?.status?.conditions?.[0]?.type === 'ReconcileFailed'),
    );
    expect(failed.status?.conditions?.[0]?.type).toBe('ReconcileFailed');
    const stopped = await waitFor(
      'the rollout stopped',
      async () => {
        const r = (await readRollout(store, policy, REF_NAME))?.record;
        return r?.target === BROKEN && r.status === 'stopped' ? r : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    expect(stopped.cause).toMatch(
      new RegExp(`^wave w0: 1 failed \\(maxUnavailable 0\\), first ${a.context} ${a.ns}/app: `),
    );
    expect(stopped.waves.slice(1).map((w) => w.releasedAt)).toEqual([undefined, undefined]);
    // The stop is on the held PackageInstalls too, and they keep 3.0.0 with their Apps as they were.
    const held = await waitPkgi(b.ns, 'told the rollout stopped', (p) =>
      Boolean(p?.status?.conditions?.some((x) => x.type === KappLambdaConditionType.Rollout && x.reason === 'Stopped')),
    );
    expect(held.status?.version).toBe('3.0.0');
    expect((await getObject<PkgiObject>(PKGI, c.ns, 'app'))?.status?.version).toBe('3.0.0');
    expect({ b: await generation(b.ns), c: await generation(c.ns) }).toEqual(before);
  }, 420_000);

  it('with onFailure rollback, the failed cluster goes back to its last good version: the receipt of it deployed, and its status says so', async () => {
    const store = runtimes[0]!.runtime.store;
    const policy = `e2e-${id}`;
    await applyRolloutPolicy(store, policy, {
      packages: [REF_NAME],
      onFailure: 'rollback',
      waves: CLUSTERS.map((cl, i) => ({ name: `w${i}`, clusters: [cl.context], soak: `${SOAK_MS / 1000}s` })),
    });
    // The policy is read again within 2 s (its cache).
    await new Promise((r) => setTimeout(r, 2500));
    const [a] = CLUSTERS as [(typeof CLUSTERS)[0]];
    for (const cl of [...CLUSTERS].reverse()) {
      await apply(repo(cl.ns, ['1.0.0', '2.0.0', '3.0.0', BROKEN, BROKEN_TOO]));
    }
    // 5.0.0 starts a rollout of its own (4.0.0's ended), fails in wave w0 and stops; a goes back.
    // (Its health event may already have rolled it back from 4.0.0 under the new policy: the end
    // state is the same, a at 3.0.0.)
    await waitFor(
      'the rollout of 5.0.0 stopped',
      async () => {
        const r = (await readRollout(store, policy, REF_NAME))?.record;
        return r?.target === BROKEN_TOO && r.status === 'stopped' ? r : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 250 },
    );
    const back = await waitPkgi(a.ns, 'rolled back to 3.0.0 after 5.0.0', (p) =>
      Boolean(
        p?.status?.version === '3.0.0' &&
          p.status.conditions?.some(
            (x) =>
              x.type === KappLambdaConditionType.Rollout &&
              x.reason === 'RolledBack' &&
              x.message?.includes(`rollout of ${BROKEN_TOO} stopped`),
          ),
      ),
    );
    const rolled = back.status?.conditions?.find((x) => x.type === KappLambdaConditionType.Rollout);
    expect(rolled?.message, JSON.stringify(back.status)).toMatch(
      /^rolled back to 3\.0\.0 \(receipt (\d{8}-\d{6}-\d{3}-[0-9a-f]{8}), its render deployed as it was\) after the rollout of 5\.0\.0 stopped: wave w0: 1 failed/,
    );
    const receiptId = /receipt (\S+),/.exec(rolled?.message ?? '')?.[1];
    // The App runs the receipt's render (the App pipeline's rollback), and reconciles.
    const app = await waitFor(
      'the App rolled back and reconciled',
      async () => {
        const o = await getObject<{
          metadata: { annotations?: Record<string, string>; generation: number };
          status?: { conditions?: { type: string }[]; observedGeneration?: number };
        }>('apps.kappctrl.k14s.io', a.ns, 'app');
        return o?.metadata.annotations?.['kapp-lambda.carvel.dev/rollback-to'] === receiptId &&
          o?.status?.observedGeneration === o?.metadata.generation &&
          o?.status?.conditions?.[0]?.type === 'ReconcileSucceeded'
          ? o
          : undefined;
      },
      { timeoutMs: 60_000, intervalMs: 250 },
    );
    expect(app.metadata.annotations?.['kapp-lambda.carvel.dev/rollback-generation']).toBe(
      String(app.metadata.generation),
    );
    const deployed = await getObject<{ data?: Record<string, string> }>('configmap', a.ns, 'rollout');
    expect(deployed?.data?.version, JSON.stringify(app.metadata)).toBe('3.0.0');
    // The reconcile of the rollback's generation deployed the receipt's render (a later resync of
    // the App may have written a newer receipt since: not the one asserted). Its receipt is kept
    // after the App's status is written (`closeStage`): waited for, not read at once.
    const owner = { clusterId: a.context, namespace: a.ns, name: 'app' };
    let receipts: Awaited<ReturnType<typeof listReceipts>> = [];
    const ofRollback = await waitFor(
      "the receipt of the rollback's reconcile",
      async () => {
        receipts = await listReceipts(store, owner);
        const mine = receipts.filter((r) => r.generation === app.metadata.generation);
        return mine.length > 0 ? mine : undefined;
      },
      {
        timeoutMs: 30_000,
        intervalMs: 250,
        describe: () => JSON.stringify(receipts.slice(-3).map((r) => [r.id, r.generation, r.outcome, r.rollbackOf])),
      },
    );
    expect(
      ofRollback.map((r) => r.rollbackOf),
      JSON.stringify(receipts.slice(-3).map((r) => [r.id, r.generation, r.outcome, r.rollbackOf])),
    ).toContain(receiptId);
  }, 420_000);

  it("a cluster that joins mid-rollout gets the version its wave has reached: the rollout's from while held, the target once released", async () => {
    const store = runtimes[0]!.runtime.store;
    const policy = `e2e-${id}`;
    const [a, b, c] = CLUSTERS as [(typeof CLUSTERS)[0], (typeof CLUSTERS)[0], (typeof CLUSTERS)[0]];
    // Waves w0 (a), w1 (b), and rest: every other cluster, the joiner included.
    await applyRolloutPolicy(store, policy, {
      packages: [REF_NAME],
      waves: [
        { name: 'w0', clusters: [a.context], soak: `${SOAK_MS / 1000}s` },
        { name: 'w1', clusters: [b.context], soak: `${SOAK_MS / 1000}s` },
        { name: 'rest' },
      ],
    });
    await new Promise((r) => setTimeout(r, 2500));
    const versions = ['1.0.0', '2.0.0', '3.0.0', BROKEN, BROKEN_TOO, '6.0.0'];
    for (const cl of [...CLUSTERS].reverse()) await apply(repo(cl.ns, versions));
    // Held after w1's release (the soak leaves 3 s): pause it there.
    const fleetCli = async (...argv: string[]) =>
      await fleetMain(argv, {}, { ...FLEET_IO, store: () => store, missingDir: undefined, out: () => {} });
    await waitFor(
      'wave w1 of 6.0.0 released',
      async () => {
        const r = (await readRollout(store, policy, REF_NAME))?.record;
        return r?.target === '6.0.0' && r.waves[1]?.releasedAt ? r : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 100 },
    );
    expect(await fleetCli('rollout', 'pause', policy, '--package', REF_NAME)).toBe(0);
    const from = (await readRollout(store, policy, REF_NAME))?.record.from;
    expect(from).toBe('3.0.0');
    // The joiner: its repository and PackageInstall appear now, in wave rest, not released.
    await apply(repo(JOINER.ns, versions), fleetPackageInstall(JOINER.ns, REF_NAME));
    const held = await waitPkgi(JOINER.ns, `at ${from}, held`, (p) =>
      Boolean(
        reconciledAt(p, from as string) &&
          p?.status?.conditions?.some((x) => x.type === KappLambdaConditionType.Rollout && x.reason === 'Held'),
      ),
    );
    expect(held.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
    expect(await fleetCli('rollout', 'resume', policy, '--package', REF_NAME)).toBe(0);
    await waitPkgi(JOINER.ns, 'at 6.0.0', (p) => reconciledAt(p, '6.0.0'));
    await waitPkgi(c.ns, 'at 6.0.0', (p) => reconciledAt(p, '6.0.0'));
  }, 420_000);
});
