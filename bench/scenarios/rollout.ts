/**
 * Scenario 13, a fleet rollout in waves (issue 28, "Measured"): a new package version reaches a
 * fleet wave by wave, each wave released once the one before has been healthy for its soak, and a
 * failing cluster stops the rollout.
 *
 * **kapp-lambda**: the fleet of the upgrade scenario ({@link startUpgradeFleet}: 20 cluster ids,
 * one embedded runtime each, one shared object store; PackageRepository on
 * `<registry>/rollout-fleet:latest` through the counting proxy, PackageInstall `>=1.0.0`, both
 * `syncPeriod: 10m0s`), and a RolloutPolicy in the store naming the ids by wave (2, 6, 12:
 * `real-a` and `real-b` first, then the simulated ids in order), soak 30 s, `maxUnavailable: 0`,
 * `onFailure: stop`. One member of wave 2 (its last) has a values Secret (`fail: true`) that
 * only version 3.0.0 refuses to render. Two rollouts on the same fleet:
 *
 * 1. **clean**: 1.0.0 installed everywhere, then a bundle with 2.0.0 pushed under the same tag.
 *    Measured: push → the last PackageInstall at 2.0.0 (`ReconcileSucceeded`), and poll (the
 *    first runtime's "source moved to a new digest") → the same; per wave, its release
 *    (`releasedAt` of the rollout record) → its first and last member seen at 2.0.0; per wave
 *    boundary, the wave's `soakEndsAt` → the next wave's `releasedAt`.
 * 2. **failing**: 3.0.0 pushed. Measured: the failing member's PackageInstall first seen
 *    `ReconcileFailed` → the rollout record first seen `stopped` (both polled every 100 ms); then,
 *    a soak and 5 s after the stop, every PackageInstall of the waves after wave 2 still at 2.0.0
 *    (never attempted 3.0.0) and its App's `metadata.generation` as before the push.
 *
 * Member times are when the bench's poll (every 250 ms, two cluster-wide lists) first saw them;
 * wave times are the rollout record's (written by the runtimes, same clock). kapp-controller has
 * no rollouts (every PackageInstall takes a new version on its own sync): no side-by-side figure.
 *
 * Settings: `BENCH_ROLLOUT_WAVES` (wave sizes, default `2,6,12`; the fleet is their sum, at
 * least 2 and 3 waves), `BENCH_ROLLOUT_SOAK_S` (default 30), `BENCH_ROLLOUT_POLL_MS` (source
 * poll period, default 60000).
 *
 * @module
 */
import type { RestTransport } from '../../functions/lib/kube/transport.js';
import { validateRolloutPolicy } from '../../functions/lib/rollout/policy.js';
import { putPolicy, type RolloutRecord, readFleetEntry, readRollout } from '../../functions/lib/rollout/state.js';
import { pushBundle } from '../../test/harness/fixtures.js';
import type { RegistryServer } from '../../test/harness/servers/registry.js';
import type { BenchContext } from '../lib/context.js';
import { collectionPath, createAll } from '../lib/kube.js';
import type { Ours } from '../lib/ours.js';
import type { RegistryProxy } from '../lib/registry-proxy.js';
import type { Row } from '../lib/stats.js';
import type { StepRunner } from './repositories.js';
import {
  FAIL_VALUES,
  installedVersions,
  isoOf,
  startRegistryAndProxy,
  startUpgradeFleet,
  UPGRADE_REF_NAME,
  type UpgradeFleet,
  upgradeBundle,
  upgradeManifests,
  waitVersions,
} from './upgrade.js';

/** Wave sizes unless `BENCH_ROLLOUT_WAVES` says otherwise. */
export const DEFAULT_ROLLOUT_WAVES: readonly number[] = [2, 6, 12];
/** Soak of every wave unless `BENCH_ROLLOUT_SOAK_S` says otherwise, seconds. */
export const DEFAULT_ROLLOUT_SOAK_S = 30;
/** Target of the issue: a wave soaked → the next released, and a failure → the rollout stopped, ms. */
export const ROLLOUT_TARGET_MS = 5_000;

const SCENARIO = '13 rollout';
const NS = 'bench-rollout';
const REPO = 'rollout-fleet';
const POLICY = 'bench-rollout';
const VALUES_SECRET = 'rollout-values';
/** The version that fails to render for the member with {@link FAIL_VALUES}. */
const BROKEN = '3.0.0';

/** Per wave of one rollout: the record's times and its members as seen. */
export interface WaveFigures {
  name: string;
  members: number;
  /** The record's `releasedAt`, `healthyAt`, `soakEndsAt` (ISO; null when not reached). */
  releasedAt: string | null;
  healthyAt: string | null;
  soakEndsAt: string | null;
  /** The previous wave's `soakEndsAt` → this wave's `releasedAt`, ms (null: first wave, or not reached). */
  afterSoakMs: number | null;
  /** `releasedAt` → its first / last member seen at the target, ms (null: not all seen). */
  releaseToFirstMs: number | null;
  releaseToLastMs: number | null;
}

/**
 * The per-wave figures of a rollout from its record and when each member was first seen at the
 * target (epoch ms by cluster id). Pure.
 *
 * @param waves - member cluster ids per wave, in the record's wave order
 */
export function waveFigures(
  record: RolloutRecord,
  waves: readonly (readonly string[])[],
  seenAt: ReadonlyMap<string, number>,
): WaveFigures[] {
  const t = (iso: string | undefined) => (iso === undefined ? undefined : Date.parse(iso));
  return record.waves.map((w, i) => {
    const released = t(w.releasedAt);
    const prevSoak = i > 0 ? t(record.waves[i - 1]?.soakEndsAt) : undefined;
    const seen = (waves[i] ?? []).map((id) => seenAt.get(id));
    const all = seen.every((s) => s !== undefined) && seen.length > 0;
    const times = seen.filter((s): s is number => s !== undefined);
    return {
      name: w.name,
      members: waves[i]?.length ?? 0,
      releasedAt: w.releasedAt ?? null,
      healthyAt: w.healthyAt ?? null,
      soakEndsAt: w.soakEndsAt ?? null,
      afterSoakMs: released !== undefined && prevSoak !== undefined ? released - prevSoak : null,
      releaseToFirstMs: released !== undefined && times.length ? Math.round(Math.min(...times) - released) : null,
      releaseToLastMs: released !== undefined && all ? Math.round(Math.max(...times) - released) : null,
    };
  });
}

/** The clean rollout (1.0.0 → 2.0.0). */
export interface CleanRollout {
  /** Push returned → the last PackageInstall at 2.0.0, ms. */
  pushToLastMs: number;
  /** The first "source moved to a new digest" → the last PackageInstall at 2.0.0 (null: not seen), ms. */
  pollToLastMs: number | null;
  /** Push returned → that first "source moved" (the poll wait), ms. */
  pollWaitMs: number | null;
  /** Rollout record status when the last member was seen (`completed` expected). */
  status: string;
  waves: WaveFigures[];
  /** Per cluster id: push returned → its PackageInstall at 2.0.0, ms. */
  perIdMs: Record<string, number>;
  record: RolloutRecord;
}

/** The failing rollout (2.0.0 → 3.0.0, one wave-2 member failing). */
export interface FailingRollout {
  /** The failing member's cluster id and wave. */
  failing: { clusterId: string; wave: string };
  /** Its PackageInstall first seen `ReconcileFailed` → the record first seen `stopped` (polled every 100 ms), ms. */
  failureToStoppedMs: number;
  /**
   * The same in the store's times: its fleet index entry as the failing run wrote it (`at`, first
   * seen failed) → the record's `stopped` history line, ms (null: that entry not seen before a
   * retry rewrote it).
   */
  storeFailureToStoppedMs: number | null;
  /** Push returned → its PackageInstall first seen `ReconcileFailed`, ms. */
  pushToFailureMs: number;
  /** The record's `cause`. */
  cause: string;
  /** How long after the stop the later waves were checked, ms. */
  checkedAfterMs: number;
  /** Members of the waves after wave 2 checked, and those touched (not at 2.0.0, 3.0.0 attempted, or App generation changed). */
  laterMembers: number;
  touched: { clusterId: string; why: string }[];
  /** Whether the record still had no later wave released at the check. */
  laterWavesReleased: number;
  /** Wave-2 members other than the failing one at 3.0.0 at the check. */
  wave2AtTarget: number;
  record: RolloutRecord;
}

/** Result of the scenario, as written to the results file. */
export interface RolloutResult {
  clusterIds: number;
  waveSizes: number[];
  soakS: number;
  pollPeriodMs: number;
  /** Where the clean rollout's clock starts (`pushToLastMs` includes the poll's wait). */
  startsAt: string;
  clean?: CleanRollout;
  failing?: FailingRollout;
  /** kapp-controller has no rollouts: no side-by-side figure. */
  kappController: string;
}

interface PkgiObject {
  status?: {
    version?: string;
    lastAttemptedVersion?: string;
    conditions?: { type: string; status?: string; message?: string }[];
  };
}

async function getJson<T>(rest: RestTransport, p: string): Promise<T | undefined> {
  const r = await rest.send({ method: 'GET', path: p });
  if (r.statusCode === 404) return undefined;
  if (r.statusCode !== 200) throw new Error(`GET ${p}: ${r.statusCode}`);
  return r.body as T;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const epochOf = (at: number) => performance.timeOrigin + at;

/** The first "source moved to a new digest" logged after `marks` (per runtime), as `performance.now()`. */
function firstMove(runtimes: readonly Ours[], marks: readonly number[]): number | undefined {
  const moved = runtimes.flatMap((r, j) =>
    r.logs.slice(marks[j]).filter((l) => l.msg === 'source moved to a new digest'),
  );
  return moved.length ? Math.min(...moved.map((l) => l.at)) : undefined;
}

/** Polls the rollout record until `pred` holds; `undefined` when `timeoutMs` ran out. */
async function waitRecord(
  fleet: UpgradeFleet,
  pred: (r: RolloutRecord) => boolean,
  timeoutMs: number,
  intervalMs = 250,
): Promise<RolloutRecord | undefined> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const r = (await readRollout(fleet.store, POLICY, UPGRADE_REF_NAME))?.record;
    if (r && pred(r)) return r;
    if (performance.now() >= deadline) return undefined;
    await sleep(intervalMs);
  }
}

/**
 * Runs both rollouts on one fleet (see the module comment). Starts and stops a second control
 * plane and one runtime per cluster id.
 *
 * @throws Error when setup fails, a rollout does not reach its end in time, or the failure is
 *   not seen
 */
export async function rolloutOurs(
  ctx: BenchContext,
  registry: RegistryServer,
  proxy: RegistryProxy,
  opts: { waveSizes: readonly number[]; soakS: number; pollMs: number },
): Promise<RolloutResult> {
  const total = opts.waveSizes.reduce((a, n) => a + n, 0);
  if (opts.waveSizes.length < 3 || opts.waveSizes.some((n) => !(Number.isInteger(n) && n > 0)) || total < 2) {
    throw new Error(`rollout: wave sizes ${opts.waveSizes.join(',')}: want 3 or more positive sizes summing to ≥ 2`);
  }
  const fleet = await startUpgradeFleet(ctx, 'rollout', NS, opts.pollMs, total - 2);
  const result: RolloutResult = {
    clusterIds: total,
    waveSizes: [...opts.waveSizes],
    soakS: opts.soakS,
    pollPeriodMs: opts.pollMs,
    startsAt: 'push (imgpkg push returned); pollToLastMs from the first "source moved"',
    kappController:
      'kapp-controller has no rollouts (each PackageInstall takes a new version on its own sync): no side-by-side figure',
  };
  try {
    const { ids, rests, targets, runtimes } = fleet;
    const waves: string[][] = [];
    let next = 0;
    for (const n of opts.waveSizes) {
      waves.push(ids.slice(next, next + n).map((i) => i.id));
      next += n;
    }
    const failingId = waves[1]!.at(-1)!;
    const failing = ids.find((i) => i.id === failingId)!;
    await putPolicy(
      fleet.store,
      validateRolloutPolicy({
        apiVersion: 'kapp-lambda/v1',
        kind: 'RolloutPolicy',
        metadata: { name: POLICY },
        spec: {
          packages: [UPGRADE_REF_NAME],
          onFailure: 'stop',
          waves: waves.map((clusters, i) => ({
            name: `w${i + 1}`,
            clusters,
            soak: `${opts.soakS}s`,
            maxUnavailable: 0,
          })),
        },
      }),
    );
    const image = `${proxy.host}/${REPO}:latest`;
    const breaks = [BROKEN];
    await pushBundle(registry, `${REPO}:latest`, upgradeBundle(['1.0.0'], breaks));
    await createAll(rests[failing.cluster], [
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: VALUES_SECRET, namespace: failing.ns },
        stringData: { 'values.yml': FAIL_VALUES },
      },
    ]);
    const s0 = performance.now();
    await Promise.all(
      ids.map((i) =>
        createAll(
          rests[i.cluster],
          upgradeManifests(i.ns, image, '10m0s', i.id === failingId ? VALUES_SECRET : undefined),
        ),
      ),
    );
    const at1 = await waitVersions(targets, '1.0.0', 300_000);
    if (at1.size < ids.length)
      throw new Error(`rollout: ${ids.length - at1.size} PackageInstall(s) not at 1.0.0 after 300 s`);
    await Promise.all(runtimes.map((r) => r.runtime.pipeline.idle()));
    ctx.say(`rollout: 1.0.0 on ${ids.length} cluster ids in ${((Math.max(...at1.values()) - s0) / 1000).toFixed(1)} s`);

    // 1. clean: 1.0.0 → 2.0.0
    const budget = 2 * opts.pollMs + waves.length * opts.soakS * 1000 + 180_000;
    let marks = runtimes.map((r) => r.logs.length);
    await pushBundle(registry, `${REPO}:latest`, upgradeBundle(['1.0.0', '2.0.0'], breaks));
    let pushed = performance.now();
    ctx.say(`rollout: 2.0.0 pushed; waves ${opts.waveSizes.join('/')}, soak ${opts.soakS} s`);
    const at2 = await waitVersions(targets, '2.0.0', budget);
    if (at2.size < ids.length) {
      const missing = ids.filter((i) => !at2.has(i.id)).map((i) => i.id);
      const r = (await readRollout(fleet.store, POLICY, UPGRADE_REF_NAME))?.record;
      throw new Error(`rollout: ${missing.join(', ')} not at 2.0.0 in time; record ${JSON.stringify(r)}`);
    }
    const last = Math.max(...at2.values());
    const move = firstMove(runtimes, marks);
    // The last wave's soak ends the rollout: the next version starts a rollout of its own only then.
    const done = await waitRecord(
      fleet,
      (r) => r.target === '2.0.0' && r.status === 'completed',
      opts.soakS * 1000 + 30_000,
    );
    const record1 = done ?? (await readRollout(fleet.store, POLICY, UPGRADE_REF_NAME))?.record;
    if (!record1) throw new Error('rollout: no rollout record for 2.0.0');
    result.clean = {
      pushToLastMs: Math.round(last - pushed),
      pollToLastMs: move === undefined ? null : Math.round(last - move),
      pollWaitMs: move === undefined ? null : Math.round(move - pushed),
      status: record1.status,
      waves: waveFigures(record1, waves, new Map([...at2].map(([k, t]) => [k, epochOf(t)]))),
      perIdMs: Object.fromEntries([...at2].map(([k, t]) => [k, Math.round(t - pushed)])),
      record: record1,
    };
    ctx.say(`rollout: clean ${JSON.stringify({ ...result.clean, perIdMs: undefined, record: undefined })}`);
    await Promise.all(runtimes.map((r) => r.runtime.pipeline.idle()));

    // 2. failing: 2.0.0 → 3.0.0, the last member of wave 2 fails to render it
    const later = waves.slice(2).flat();
    const byId = new Map(ids.map((i) => [i.id, i]));
    const appPath = (id: string) => `${collectionPath('App', byId.get(id)!.ns)}/app`;
    const pkgiPath = (id: string) => `${collectionPath('PackageInstall', byId.get(id)!.ns)}/app`;
    const restOf = (id: string) => rests[byId.get(id)!.cluster];
    const generations = new Map<string, number | undefined>();
    for (const id of later) {
      const app = await getJson<{ metadata: { generation?: number } }>(restOf(id), appPath(id));
      generations.set(id, app?.metadata.generation);
    }
    marks = runtimes.map((r) => r.logs.length);
    await pushBundle(registry, `${REPO}:latest`, upgradeBundle(['1.0.0', '2.0.0', BROKEN], breaks));
    pushed = performance.now();
    ctx.say(`rollout: ${BROKEN} pushed; ${failingId} (wave w2) fails to render it`);
    let failedSeen: number | undefined;
    let stoppedSeen: number | undefined;
    let stopped: RolloutRecord | undefined;
    let failedEntryAt: string | undefined;
    const deadline = pushed + budget;
    while ((failedSeen === undefined || stoppedSeen === undefined) && performance.now() < deadline) {
      const [p, r, e] = await Promise.all([
        getJson<PkgiObject>(restOf(failingId), pkgiPath(failingId)),
        readRollout(fleet.store, POLICY, UPGRADE_REF_NAME),
        failedEntryAt === undefined ? readFleetEntry(fleet.store, failingId, failing.ns, 'app') : undefined,
      ]);
      // the failing run's own entry (a retry rewrites it later)
      if (e?.reconcile === 'failed' && e.lastAttemptedVersion === BROKEN) failedEntryAt = e.at;
      const now = performance.now();
      if (
        failedSeen === undefined &&
        p?.status?.lastAttemptedVersion === BROKEN &&
        p.status.conditions?.[0]?.type === 'ReconcileFailed'
      ) {
        failedSeen = now;
      }
      if (stoppedSeen === undefined && r?.record.target === BROKEN && r.record.status === 'stopped') {
        stoppedSeen = now;
        stopped = r.record;
      }
      await sleep(100);
    }
    if (failedSeen === undefined || stoppedSeen === undefined || !stopped) {
      throw new Error(
        `rollout: ${failedSeen === undefined ? `${failingId} not seen ReconcileFailed` : 'rollout not seen stopped'} within ${budget / 1000} s`,
      );
    }
    // A soak and 5 s more: had the stop not held, the next wave would have been released by now.
    const checkAfter = opts.soakS * 1000 + 5000;
    await sleep(Math.max(0, stoppedSeen + checkAfter - performance.now()));
    const touched: { clusterId: string; why: string }[] = [];
    for (const id of later) {
      const p = await getJson<PkgiObject>(restOf(id), pkgiPath(id));
      const app = await getJson<{ metadata: { generation?: number } }>(restOf(id), appPath(id));
      const whys = [
        p?.status?.version !== '2.0.0' ? `status.version ${p?.status?.version}` : '',
        p?.status?.lastAttemptedVersion === BROKEN ? `attempted ${BROKEN}` : '',
        app?.metadata.generation !== generations.get(id)
          ? `App generation ${generations.get(id)} → ${app?.metadata.generation}`
          : '',
      ].filter(Boolean);
      if (whys.length) touched.push({ clusterId: id, why: whys.join('; ') });
    }
    const wave2 = new Set(waves[1]!.filter((id) => id !== failingId));
    const versionsNow = new Map<string, string>();
    for (const rest of new Set(Object.values(rests))) {
      for (const [ns, v] of await installedVersions(rest)) versionsNow.set(ns, v);
    }
    const atCheck = (await readRollout(fleet.store, POLICY, UPGRADE_REF_NAME))?.record ?? stopped;
    const stopLine = stopped.history.find((h) => h.what.startsWith('stopped'));
    result.failing = {
      failing: { clusterId: failingId, wave: 'w2' },
      failureToStoppedMs: Math.round(stoppedSeen - failedSeen),
      storeFailureToStoppedMs: failedEntryAt && stopLine ? Date.parse(stopLine.at) - Date.parse(failedEntryAt) : null,
      pushToFailureMs: Math.round(failedSeen - pushed),
      cause: stopped.cause ?? '',
      checkedAfterMs: Math.round(performance.now() - stoppedSeen),
      laterMembers: later.length,
      touched,
      laterWavesReleased: atCheck.waves.slice(2).filter((w) => w.releasedAt !== undefined).length,
      wave2AtTarget: [...wave2].filter((id) => versionsNow.get(byId.get(id)!.ns) === BROKEN).length,
      record: atCheck,
    };
    ctx.say(
      `rollout: failing ${JSON.stringify({ ...result.failing, record: undefined })} (stop seen at ${isoOf(stoppedSeen)})`,
    );
    return result;
  } finally {
    await fleet.stop();
  }
}

const secs = (ms: number | null) => (ms === null ? '?' : `${(ms / 1000).toFixed(1)} s`);
/** Table rows of the scenario's results. */
export function rolloutRows(r: RolloutResult): Row[] {
  const rows: Row[] = [];
  const c = r.clean;
  const met = (ms: number | null) => (ms !== null && ms < ROLLOUT_TARGET_MS ? 'met' : 'missed');
  if (c) {
    rows.push({
      scenario: SCENARIO,
      figure: `push → last of ${r.clusterIds} PackageInstalls at the new version (waves ${r.waveSizes.join('/')}, soak ${r.soakS} s, poll ${secs(r.pollPeriodMs)})`,
      value: `${secs(c.pushToLastMs)} (poll wait ${secs(c.pollWaitMs)} + from the poll ${secs(c.pollToLastMs)}); rollout ${c.status}`,
    });
    for (const [i, w] of c.waves.entries()) {
      if (i > 0) {
        rows.push({
          scenario: SCENARIO,
          figure: `  ${w.name}: previous wave soaked (soakEndsAt) → released`,
          value: secs(w.afterSoakMs),
          target: '< 5 s',
          verdict: met(w.afterSoakMs),
        });
      }
      rows.push({
        scenario: SCENARIO,
        figure: `  ${w.name} (${w.members}): released → first / last member at the new version`,
        value: `${secs(w.releaseToFirstMs)} / ${secs(w.releaseToLastMs)}`,
        target: '< 5 s',
        verdict: met(w.releaseToLastMs),
      });
    }
  }
  const f = r.failing;
  if (f) {
    rows.push(
      {
        scenario: SCENARIO,
        figure: `failing: ${f.failing.clusterId} (${f.failing.wave}) ReconcileFailed → rollout stopped`,
        value: `${secs(f.failureToStoppedMs)} seen (store times ${secs(f.storeFailureToStoppedMs)})`,
        target: '< 5 s',
        verdict: met(f.failureToStoppedMs),
      },
      {
        scenario: SCENARIO,
        figure: `  later waves' PackageInstalls touched, ${secs(f.checkedAfterMs)} after the stop`,
        value: `${f.touched.length} of ${f.laterMembers}${f.touched.length ? ` (${f.touched.map((t) => `${t.clusterId}: ${t.why}`).join(', ')})` : ''}; later waves released ${f.laterWavesReleased}`,
        target: '0',
        verdict: f.touched.length === 0 && f.laterWavesReleased === 0 ? 'met' : 'missed',
      },
    );
  }
  rows.push({ scenario: SCENARIO, figure: 'kapp-controller', value: 'no rollouts: no side-by-side figure' });
  return rows;
}

/**
 * Runs the scenario: starts the registry and its counting proxy, then the fleet's two rollouts
 * (one step), and adds the table rows.
 */
export async function rolloutScenario(
  ctx: BenchContext,
  step: StepRunner,
  opts: { waveSizes: readonly number[]; soakS: number; pollMs: number },
): Promise<RolloutResult | undefined> {
  const servers = await step(SCENARIO, 'registry and proxy', startRegistryAndProxy);
  if (!servers) return undefined;
  const { registry, proxy } = servers;
  try {
    const r = await step(SCENARIO, `kapp-lambda, ${opts.waveSizes.join('/')} cluster ids`, () =>
      rolloutOurs(ctx, registry, proxy, opts),
    );
    if (r) ctx.rows.push(...rolloutRows(r));
    return r;
  } finally {
    await proxy.stop();
    await registry.stop();
  }
}
