/**
 * The pure parts of the benchmark's rollout scenario (`bench/scenarios/rollout.ts`): the
 * per-wave figures from a rollout record and the members' times, the rows' verdicts, the
 * targets computed from a result, and the repository bundle whose broken version fails only
 * where a PackageInstall's values ask for it.
 */
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { computeTargets } from '../../bench/lib/targets.js';
import { type RolloutResult, rolloutRows, waveFigures } from '../../bench/scenarios/rollout.js';
import { UPGRADE_REF_NAME, upgradeBundle } from '../../bench/scenarios/upgrade.js';
import type { RolloutRecord } from '../../functions/lib/rollout/state.js';

const T0 = Date.parse('2026-12-07T08:00:00.000Z');
const iso = (ms: number) => new Date(T0 + ms).toISOString();

function record(waves: RolloutRecord['waves']): RolloutRecord {
  return {
    policy: 'bench-rollout',
    refName: UPGRADE_REF_NAME,
    target: '2.0.0',
    from: '1.0.0',
    status: 'completed',
    createdAt: iso(0),
    waves,
    failed: [],
    history: [],
  };
}

describe('bench rollout: wave figures', () => {
  const rec = record([
    { name: 'w1', releasedAt: iso(0), healthyAt: iso(2000), soakEndsAt: iso(32_000) },
    { name: 'w2', releasedAt: iso(32_400), healthyAt: iso(35_000), soakEndsAt: iso(65_000) },
    { name: 'w3' },
  ]);
  const waves = [['real-a', 'real-b'], ['sim-01', 'sim-02'], ['sim-03']];

  it('takes soaked → released from the record and released → first/last member from the times seen', () => {
    const seen = new Map([
      ['real-a', T0 + 1500],
      ['real-b', T0 + 1900],
      ['sim-01', T0 + 33_000],
      ['sim-02', T0 + 34_600],
    ]);
    const [w1, w2, w3] = waveFigures(rec, waves, seen);
    expect(w1).toMatchObject({
      name: 'w1',
      members: 2,
      afterSoakMs: null,
      releaseToFirstMs: 1500,
      releaseToLastMs: 1900,
    });
    expect(w2).toMatchObject({ afterSoakMs: 400, releaseToFirstMs: 600, releaseToLastMs: 2200 });
    expect(w2?.soakEndsAt).toBe(iso(65_000));
    // never released: nothing to measure from
    expect(w3).toMatchObject({ releasedAt: null, afterSoakMs: null, releaseToFirstMs: null, releaseToLastMs: null });
  });

  it('leaves the last member unknown while one member was not seen', () => {
    const [w1] = waveFigures(rec, waves, new Map([['real-a', T0 + 1500]]));
    expect(w1).toMatchObject({ releaseToFirstMs: 1500, releaseToLastMs: null });
  });
});

describe('bench rollout: rows and targets', () => {
  const result: RolloutResult = {
    clusterIds: 3,
    waveSizes: [1, 1, 1],
    soakS: 30,
    pollPeriodMs: 60_000,
    startsAt: 'push',
    kappController: 'none',
    clean: {
      pushToLastMs: 90_000,
      pollToLastMs: 70_000,
      pollWaitMs: 20_000,
      status: 'completed',
      perIdMs: {},
      record: record([]),
      waves: [
        {
          name: 'w1',
          members: 1,
          releasedAt: null,
          healthyAt: null,
          soakEndsAt: null,
          afterSoakMs: null,
          releaseToFirstMs: 1000,
          releaseToLastMs: 1000,
        },
        {
          name: 'w2',
          members: 1,
          releasedAt: null,
          healthyAt: null,
          soakEndsAt: null,
          afterSoakMs: 6000,
          releaseToFirstMs: 900,
          releaseToLastMs: 900,
        },
        {
          name: 'w3',
          members: 1,
          releasedAt: null,
          healthyAt: null,
          soakEndsAt: null,
          afterSoakMs: 300,
          releaseToFirstMs: 800,
          releaseToLastMs: 800,
        },
      ],
    },
    failing: {
      failing: { clusterId: 'sim-01', wave: 'w2' },
      failureToStoppedMs: 200,
      storeFailureToStoppedMs: 5,
      pushToFailureMs: 30_000,
      cause: 'x',
      checkedAfterMs: 35_000,
      laterMembers: 1,
      touched: [{ clusterId: 'sim-02', why: 'attempted 3.0.0' }],
      laterWavesReleased: 0,
      wave2AtTarget: 0,
      record: record([]),
    },
  };

  it('misses a boundary over 5 s and a later wave touched; meets the rest', () => {
    const rows = rolloutRows(result);
    const verdict = (part: string) => rows.find((r) => r.figure.includes(part))?.verdict;
    expect(verdict('w2: previous wave soaked')).toBe('missed');
    expect(verdict('w3: previous wave soaked')).toBe('met');
    expect(verdict('ReconcileFailed → rollout stopped')).toBe('met');
    expect(verdict('later waves')).toBe('missed');
    expect(rows.at(-1)).toMatchObject({ figure: 'kapp-controller', value: 'no rollouts: no side-by-side figure' });
  });

  it('puts the worst boundary, the stop and the touched count in the targets', () => {
    const t = computeTargets({ rollout: JSON.parse(JSON.stringify(result)) });
    expect(t['rollout.afterSoakMs']).toMatchObject({ value: 6000, met: false });
    expect(t['rollout.releaseToLastMs']).toMatchObject({ value: 1000, met: true });
    expect(t['rollout.failureToStoppedMs']).toMatchObject({ value: 200, met: true });
    expect(t['rollout.laterWavesTouched']).toMatchObject({ value: 1, met: false });
  });
});

describe('bench rollout: the broken version', () => {
  it('declares the fail switch in every version and asserts on it only in the broken ones', () => {
    const files = upgradeBundle(['1.0.0', '3.0.0'], ['3.0.0']);
    const paths = (v: string) =>
      parse(files[`packages/${UPGRADE_REF_NAME}/${v}.yml`]!).spec.template.spec.fetch[0].inline.paths as Record<
        string,
        string
      >;
    expect(paths('1.0.0')['values.yml']).toContain('fail: false');
    expect(paths('1.0.0')['config.yml']).not.toContain('assert.fail');
    expect(paths('3.0.0')['values.yml']).toContain('fail: false');
    expect(paths('3.0.0')['config.yml']).toContain('#@ if data.values.fail:');
    expect(paths('3.0.0')['config.yml']).toContain('version: "3.0.0"');
  });

  it('leaves the upgrade scenario’s Packages as they were without broken versions', () => {
    const files = upgradeBundle(['1.0.0']);
    const paths = parse(files[`packages/${UPGRADE_REF_NAME}/1.0.0.yml`]!).spec.template.spec.fetch[0].inline.paths;
    expect(Object.keys(paths)).toEqual(['config.yml']);
  });
});
