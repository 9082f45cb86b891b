/**
 * Fleet rollouts (`functions/lib/rollout/`): the policy file and wave membership, the store
 * layout with its compare-and-swap, the pure state machine, the Rollout condition round trip,
 * and `npm run fleet -- rollout …` (`scripts/fleet.ts`) over a memory store.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { KappLambdaConditionType } from '../../functions/lib/api/constants.js';
import type { PackageInstall } from '../../functions/lib/api/packaging.js';
import { StoreRollouts } from '../../functions/lib/rollout/access.js';
import { soakingUntil } from '../../functions/lib/rollout/condition.js';
import {
  capFor,
  commandRollout,
  evaluateRollout,
  memberFailure,
  memberHealthy,
  newRollout,
  RolloutCommandError,
  rolloutCondition,
  startsRollout,
} from '../../functions/lib/rollout/evaluate.js';
import { rolloutGate } from '../../functions/lib/rollout/gate.js';
import { parseRolloutPolicy, policyCovers, RolloutPolicyError, waveOf } from '../../functions/lib/rollout/policy.js';
import {
  casRollout,
  type FleetEntry,
  fleetKey,
  listFleetEntries,
  policyFor,
  putPolicy,
  type RolloutRecord,
  readFleetEntry,
  readRollout,
  rolloutKey,
  writeFleetEntry,
} from '../../functions/lib/rollout/state.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { EXIT } from '../../scripts/cli.js';
import { type FleetIo, main } from '../../scripts/fleet.js';

const REF = 'hello.examples.kapp-lambda.dev';
const POLICY_YAML = `
apiVersion: kapp-lambda/v1
kind: RolloutPolicy
metadata: { name: default }
spec:
  packages: [${REF}]
  waves:
    - { name: canary, clusters: [a], soak: 30s }
    - { name: early, clusters: [b, c], soak: 1m, maxUnavailable: 1 }
    - { name: rest }
`;
const POLICY = parseRolloutPolicy(POLICY_YAML);
const T0 = new Date('2026-12-07T08:00:00.000Z');
const at = (s: number) => new Date(T0.getTime() + s * 1000);

function member(clusterId: string, over: Partial<FleetEntry> = {}): FleetEntry {
  return {
    clusterId,
    namespace: 'default',
    name: 'hello',
    refName: REF,
    version: '1.0.0',
    lastAttemptedVersion: '1.0.0',
    reconcile: 'succeeded',
    at: T0.toISOString(),
    ...over,
  };
}
const upgraded = (clusterId: string, healthySince: number, over: Partial<FleetEntry> = {}) =>
  member(clusterId, {
    version: '2.0.0',
    lastAttemptedVersion: '2.0.0',
    healthySince: at(healthySince).toISOString(),
    ...over,
  });

describe('rollout policy', () => {
  it("parses the README's example policy (examples/rollout-policy.yml): three waves, the last the catch-all", () => {
    const p = parseRolloutPolicy(readFileSync(new URL('../../examples/rollout-policy.yml', import.meta.url), 'utf8'));
    expect(p.spec.waves.map((w) => [w.name, w.clusters ?? '*', w.soak, w.maxUnavailable])).toEqual([
      ['canary', ['canary-1'], '30s', 0],
      ['early', ['prod-eu-1', 'prod-us-1'], '5m', 1],
      ['rest', '*', '0s', 0],
    ]);
    expect(waveOf(p, 'prod-us-1')).toBe(1);
    expect(waveOf(p, 'anyone-else')).toBe(2);
  });

  it('parses the file with defaults and finds each cluster its wave', () => {
    expect(POLICY.spec.onFailure).toBe('stop');
    expect(POLICY.spec.waves.map((w) => [w.name, w.soak, w.maxUnavailable])).toEqual([
      ['canary', '30s', 0],
      ['early', '1m', 1],
      ['rest', '0s', 0],
    ]);
    expect(['a', 'b', 'c', 'zz'].map((id) => waveOf(POLICY, id))).toEqual([0, 1, 1, 2]);
    expect(policyCovers(POLICY, REF)).toBe(true);
    expect(policyCovers(POLICY, 'other.dev')).toBe(false);
  });

  it('without a catch-all wave an unlisted cluster is not gated', () => {
    const p = parseRolloutPolicy(POLICY_YAML.replace('    - { name: rest }\n', ''));
    expect(waveOf(p, 'a')).toBe(0);
    expect(waveOf(p, 'b')).toBe(1);
    expect(waveOf(p, 'zz')).toBeUndefined();
  });

  it.each([
    ['a bad soak', POLICY_YAML.replace('soak: 30s', 'soak: 30x'), 'spec.waves.0.soak: time: invalid duration "30x"'],
    ['an unknown field', POLICY_YAML.replace('soak: 30s', 'selector: {}'), 'spec.waves.0'],
    ['two catch-all waves', `${POLICY_YAML}    - { name: more }\n`, 'at most one wave without clusters'],
    ['a duplicate wave name', POLICY_YAML.replace('name: early', 'name: canary'), 'spec.waves.1.name: duplicate'],
    ['an unknown onFailure', POLICY_YAML.replace('  waves:', '  onFailure: ignore\n  waves:'), 'spec.onFailure'],
    ['no waves', POLICY_YAML.replace(/ {2}waves:[\s\S]*/, '  waves: []\n'), 'spec.waves'],
    ['not YAML', 'a: [', 'invalid rollout policy'],
    [
      'a cluster in two waves',
      POLICY_YAML.replace('clusters: [b, c]', 'clusters: [b, a]'),
      'spec.waves.1.clusters.1: cluster a is already in wave canary',
    ],
    ['an empty cluster list', POLICY_YAML.replace('clusters: [a]', 'clusters: []'), 'spec.waves.0.clusters: empty'],
  ])('refuses %s', (_what, text, message) => {
    expect(() => parseRolloutPolicy(text)).toThrow(RolloutPolicyError);
    expect(() => parseRolloutPolicy(text)).toThrow(message);
  });

  it('accepts onFailure: rollback', () => {
    const p = parseRolloutPolicy(POLICY_YAML.replace('  waves:', '  onFailure: rollback\n  waves:'));
    expect(p.spec.onFailure).toBe('rollback');
  });
});

describe('rollout state in the store', () => {
  it('keeps the layout of the plan', () => {
    expect(rolloutKey('default', REF)).toBe(`state/rollouts/default/${REF}.json`);
    expect(fleetKey('a', 'default', 'hello')).toBe('state/fleet/a/default/hello.json');
  });

  it('policyFor finds the policy listing the refName, else a "*" one, and caches for 2 s', async () => {
    const store = new MemoryStore();
    await putPolicy(store, POLICY);
    const star = parseRolloutPolicy(POLICY_YAML.replace('name: default', 'name: all').replace(`[${REF}]`, '["*"]'));
    await putPolicy(store, star);
    expect((await policyFor(store, REF, 0))?.metadata.name).toBe('default');
    expect((await policyFor(store, 'other.dev', 0))?.metadata.name).toBe('all');
    await store.delete('state/rollout-policies/all.json');
    expect((await policyFor(store, 'other.dev', 1999))?.metadata.name).toBe('all');
    expect(await policyFor(store, 'other.dev', 2000)).toBeUndefined();
  });

  it('casRollout creates once, and a writer holding an old version reads again', async () => {
    const store = new MemoryStore();
    const created = await casRollout(store, 'default', REF, (r) => r ?? newRollout(POLICY, REF, '2.0.0', '1.0.0', T0));
    expect(created.written).toBe(true);
    const again = await casRollout(store, 'default', REF, (r) =>
      r ? undefined : newRollout(POLICY, REF, '3.0.0', '1.0.0', T0),
    );
    expect(again).toMatchObject({ written: false, record: { target: '2.0.0' } });
    // A change computed from a stale read loses the race once, then applies to the fresh record.
    let calls = 0;
    const stale = (await readRollout(store, 'default', REF))?.etag;
    const moved = await casRollout(store, 'default', REF, (r) => {
      calls++;
      if (calls === 1) void store.put(rolloutKey('default', REF), JSON.stringify({ ...r, cause: 'moved' }));
      return r && { ...r, status: 'paused' };
    });
    expect(calls).toBe(2);
    expect(moved.record).toMatchObject({ status: 'paused', cause: 'moved' });
    expect((await readRollout(store, 'default', REF))?.etag).not.toBe(stale);
  });

  it('writes a fleet entry only when it changed (besides its time) and lists them by refName', async () => {
    const store = new MemoryStore();
    const e = member('a');
    expect(await writeFleetEntry(store, e, undefined)).toBe(true);
    const read = await readFleetEntry(store, 'a', 'default', 'hello');
    expect(read).toEqual(e);
    expect(await writeFleetEntry(store, { ...e, at: at(5).toISOString() }, read)).toBe(false);
    expect(await writeFleetEntry(store, { ...e, version: '2.0.0' }, read)).toBe(true);
    await writeFleetEntry(store, { ...member('b'), refName: 'other.dev' }, undefined);
    expect((await listFleetEntries(store, REF)).map((x) => x.clusterId)).toEqual(['a']);
    expect(await listFleetEntries(store)).toHaveLength(2);
  });
});

describe('rollout state machine', () => {
  const fresh = () => newRollout(POLICY, REF, '2.0.0', '1.0.0', T0);

  it('a new rollout has its first wave released; a newer version waits while it moves', () => {
    const r = fresh();
    expect(r.waves.map((w) => w.releasedAt !== undefined)).toEqual([true, false, false]);
    expect(startsRollout(undefined, '2.0.0')).toBe(true);
    expect(startsRollout(r, '3.0.0')).toBe(false);
    expect(startsRollout({ ...r, status: 'completed' }, '3.0.0')).toBe(true);
    expect(startsRollout({ ...r, status: 'aborted' }, '2.0.0')).toBe(false);
  });

  it('caps a held cluster at its version (or from), a released one at the target, none when completed', () => {
    const r = fresh();
    expect(capFor(r, 0, '1.0.0')).toBe('2.0.0');
    expect(capFor(r, 1, '1.0.0')).toBe('1.0.0');
    expect(capFor(r, 1, undefined)).toBe('1.0.0');
    expect(capFor(r, 0, '2.1.0')).toBe('2.1.0');
    expect(capFor(r, undefined, '1.0.0')).toBeUndefined();
    expect(capFor({ ...r, status: 'completed' }, 1, '1.0.0')).toBeUndefined();
    expect(capFor({ ...r, status: 'stopped' }, 1, '1.0.0')).toBe('1.0.0');
  });

  it('a cluster the policy puts in a wave its rollout does not know (the waves changed since) is held, not ungated', async () => {
    // The rollout of 2.0.0 stopped under canary/early/rest; the policy is then applied with the
    // catch-all renamed. A cluster of the new wave must not take the version the rollout stopped
    // on (its run selects with no cap at all otherwise), nor any other, until a rollout knows its wave.
    const store = new MemoryStore();
    const renamed = parseRolloutPolicy(POLICY_YAML.replace('{ name: rest }', '{ name: others }'));
    await putPolicy(store, renamed);
    const stopped: RolloutRecord = { ...fresh(), status: 'stopped' };
    await casRollout(store, 'default', REF, () => stopped);
    const pkgi = (version: string | undefined) =>
      ({
        metadata: { namespace: 'default', name: 'hello' },
        spec: { packageRef: { refName: REF } },
        ...(version ? { status: { version } } : {}),
      }) as PackageInstall;
    const gateOf = (clusterId: string, version: string | undefined) =>
      rolloutGate(new StoreRollouts(store, {}), at(5), clusterId, pkgi(version), () => '2.0.0');
    expect((await gateOf('d', '1.0.0'))?.cap).toBe('1.0.0');
    expect((await gateOf('d', undefined))?.cap).toBe('1.0.0');
    // Its wave unknown, it is no member of the record's waves: no wave, so no Rollout condition.
    expect((await gateOf('d', '1.0.0'))?.wave).toBeUndefined();
    // Moving, too: held until the rollout completes; once completed, not capped.
    await casRollout(store, 'default', REF, () => ({ ...stopped, status: 'running' }));
    expect((await gateOf('d', '1.0.0'))?.cap).toBe('1.0.0');
    await casRollout(store, 'default', REF, () => ({ ...stopped, status: 'completed' }));
    expect((await gateOf('d', '1.0.0'))?.cap).toBeUndefined();
    // A cluster in no wave of the policy (no catch-all) stays ungated.
    await putPolicy(store, parseRolloutPolicy(POLICY_YAML.replace('    - { name: rest }\n', '')));
    await casRollout(store, 'default', REF, () => stopped);
    expect((await gateOf('d', '1.0.0'))?.cap).toBeUndefined();
  });

  it('health and failure of a member', () => {
    expect(memberHealthy(upgraded('a', 1), '2.0.0')).toBe(true);
    expect(memberHealthy(upgraded('a', 1, { health: 'True' }), '2.0.0')).toBe(true);
    expect(memberHealthy(upgraded('a', 1, { health: 'Unknown' }), '2.0.0')).toBe(false);
    expect(memberHealthy(upgraded('a', 1, { reconcile: 'reconciling' }), '2.0.0')).toBe(false);
    expect(memberHealthy(member('a'), '2.0.0')).toBe(false);
    expect(memberFailure(member('a', { lastAttemptedVersion: '2.0.0', reconcile: 'failed' }), '2.0.0')).toBe(
      'reconcile of 2.0.0 failed',
    );
    expect(memberFailure(upgraded('a', 1, { health: 'False' }), '2.0.0')).toBe('2.0.0 unhealthy');
    expect(memberFailure(member('a', { reconcile: 'failed' }), '2.0.0')).toBeUndefined();
  });

  it('waits for the wave, soaks, then releases the next wave; the last completes the rollout', () => {
    let r = fresh();
    const members = [member('a'), member('b'), member('c'), member('d')];
    // a not at the target yet: nothing moves.
    expect(evaluateRollout(r, POLICY, members, at(1))).toMatchObject({ changed: false, released: [] });
    members[0] = upgraded('a', 5);
    let e = evaluateRollout(r, POLICY, members, at(6));
    expect(e).toMatchObject({ changed: true, released: [] });
    r = e.record;
    expect(r.waves[0]).toMatchObject({ healthyAt: at(5).toISOString(), soakEndsAt: at(35).toISOString() });
    expect(rolloutCondition(r, 0, at(6))).toMatchObject({ reason: 'Soaking', status: 'True' });
    expect(rolloutCondition(r, 1, at(6))).toMatchObject({
      reason: 'Held',
      status: 'False',
      message: '2.0.0 held: wave early not started (rollout at wave canary)',
    });
    expect(evaluateRollout(r, POLICY, members, at(34))).toMatchObject({ changed: false });
    e = evaluateRollout(r, POLICY, members, at(35));
    expect(e.released).toEqual([1]);
    r = e.record;
    expect(r.waves[0]?.completedAt).toBe(at(35).toISOString());
    expect(rolloutCondition(r, 1, at(36))).toMatchObject({ reason: 'Upgrading' });
    // maxUnavailable 1 in early: b alone healthy is enough.
    members[1] = upgraded('b', 40);
    r = evaluateRollout(r, POLICY, members, at(41)).record;
    expect(r.waves[1]?.soakEndsAt).toBe(at(100).toISOString());
    e = evaluateRollout(r, POLICY, members, at(100));
    expect(e.released).toEqual([2]);
    members[3] = upgraded('d', 101);
    e = evaluateRollout(e.record, POLICY, members, at(102));
    expect(e.record.status).toBe('completed');
    expect(e.record.history.map((h) => [h.what.split(/[,:]/)[0], h.wave])).toEqual([
      ['rollout of 2.0.0 created (from 1.0.0)', undefined],
      ['released', 'canary'],
      ['healthy', 'canary'],
      ['released', 'early'],
      ['healthy', 'early'],
      ['released', 'rest'],
      ['healthy', 'rest'],
      ['completed', undefined],
    ]);
    expect(capFor(e.record, 2, '1.0.0')).toBeUndefined();
    expect(rolloutCondition(e.record, 2, at(102)).reason).toBe('Completed');
  });

  it('a catch-all wave without members is passed at once; a listed cluster that never reported holds its wave', () => {
    const e = evaluateRollout(fresh(), POLICY, [upgraded('a', 1), member('d')], at(31));
    expect(e.released).toEqual([1]);
    expect(e.record.waves[1]?.healthyAt).toBeUndefined();
    const two = parseRolloutPolicy(
      POLICY_YAML.replace('    - { name: early, clusters: [b, c], soak: 1m, maxUnavailable: 1 }\n', ''),
    );
    const done = evaluateRollout(newRollout(two, REF, '2.0.0', '1.0.0', T0), two, [upgraded('a', 1)], at(31));
    expect(done.released).toEqual([1]);
    expect(done.record.waves[1]).toMatchObject({ soakEndsAt: at(31).toISOString(), completedAt: at(31).toISOString() });
    expect(done.record.status).toBe('completed');
  });

  it('a member that stops being healthy ends the soak', () => {
    let r = evaluateRollout(fresh(), POLICY, [upgraded('a', 1)], at(2)).record;
    r = evaluateRollout(r, POLICY, [upgraded('a', 1, { reconcile: 'reconciling' })], at(10)).record;
    expect(r.waves[0]?.healthyAt).toBeUndefined();
    expect(r.history.at(-1)).toMatchObject({ what: 'no longer healthy', wave: 'canary' });
  });

  it('stops when more than maxUnavailable members of a released wave failed, and names the cause', () => {
    const failing = member('a', { lastAttemptedVersion: '2.0.0', reconcile: 'failed' });
    const e = evaluateRollout(fresh(), POLICY, [failing, member('b')], at(3));
    expect(e.record.status).toBe('stopped');
    expect(e.record.cause).toBe(
      'wave canary: 1 failed (maxUnavailable 0), first a default/hello: reconcile of 2.0.0 failed',
    );
    expect(e.record.failed).toEqual([
      { cluster: 'a', namespace: 'default', name: 'hello', at: at(3).toISOString(), why: 'reconcile of 2.0.0 failed' },
    ]);
    expect(rolloutCondition(e.record, 1, at(3))).toMatchObject({ reason: 'Stopped', status: 'False' });
    expect(capFor(e.record, 1, '1.0.0')).toBe('1.0.0');
    expect(evaluateRollout(e.record, POLICY, [upgraded('a', 4)], at(99)).changed).toBe(false);
  });

  it('one failed member of early is within its maxUnavailable 1', () => {
    const r: RolloutRecord = {
      ...fresh(),
      waves: fresh().waves.map((w, i) => (i < 2 ? { ...w, releasedAt: T0.toISOString() } : w)),
    };
    const members = [upgraded('a', 0), upgraded('b', 1, { health: 'False' }), upgraded('c', 2)];
    const e = evaluateRollout(r, POLICY, members, at(3));
    expect(e.record.status).toBe('running');
    expect(e.record.waves[1]?.healthyAt).toBe(at(2).toISOString());
  });

  it('paused: keeps soaking, releases nothing; resume releases; abort freezes', () => {
    let r = commandRollout(fresh(), 'pause', at(1)) as RolloutRecord;
    expect(commandRollout(r, 'pause', at(1))).toBeUndefined();
    const members = [upgraded('a', 2), member('b')];
    r = evaluateRollout(r, POLICY, members, at(40)).record;
    expect(r.waves[1]?.releasedAt).toBeUndefined();
    expect(r.waves[0]?.soakEndsAt).toBe(at(32).toISOString());
    expect(rolloutCondition(r, 1, at(40)).message).toContain('(rollout paused)');
    r = commandRollout(r, 'resume', at(41)) as RolloutRecord;
    expect(evaluateRollout(r, POLICY, members, at(41)).released).toEqual([1]);
    const aborted = commandRollout(r, 'abort', at(42)) as RolloutRecord;
    expect(aborted).toMatchObject({ status: 'aborted', cause: 'aborted by the operator' });
    expect(() => commandRollout(aborted, 'resume', at(43))).toThrow(RolloutCommandError);
    expect(evaluateRollout(aborted, POLICY, [upgraded('a', 2)], at(99)).changed).toBe(false);
  });

  it('the Soaking condition carries its end, which soakingUntil reads back', () => {
    const r = evaluateRollout(fresh(), POLICY, [upgraded('a', 2)], at(3)).record;
    const c = rolloutCondition(r, 0, at(3));
    expect(c.message).toBe(`2.0.0: wave canary healthy, soaking until ${at(32).toISOString()}`);
    expect(soakingUntil([{ type: 'ReconcileSucceeded', status: 'True' }, c])).toBe(at(32).getTime());
    expect(soakingUntil([{ ...c, reason: 'Upgrading' }])).toBeUndefined();
    expect(
      soakingUntil([{ type: KappLambdaConditionType.Rollout, reason: 'Soaking', message: 'until x' }]),
    ).toBeUndefined();
    expect(soakingUntil(undefined)).toBeUndefined();
  });
});

describe('npm run fleet -- rollout', () => {
  function io(files: Record<string, string> = {}) {
    const store = new MemoryStore();
    const out: string[] = [];
    const err: string[] = [];
    const fio: FleetIo = {
      store: () => store,
      readFile: async (f) => {
        const t = files[f];
        if (t === undefined) throw new Error('ENOENT');
        return t;
      },
      out: (t) => out.push(t),
      err: (t) => err.push(t),
      now: () => T0,
    };
    return { store, out, err, fio };
  }

  it('apply stores the policy; list shows it and its rollouts (table and -o yaml)', async () => {
    const t = io({ 'p.yml': POLICY_YAML });
    expect(await main(['rollout', 'apply', '-f', 'p.yml'], {}, t.fio)).toBe(EXIT.ok);
    expect(t.out.join('')).toMatch(
      new RegExp(
        `^rollout policy default applied: ${REF.replaceAll('.', '\\.')} in 3 waves \\(canary → early → rest\\), in file:///`,
      ),
    );
    expect((await policyFor(t.store, REF, 0))?.spec.waves).toHaveLength(3);
    await casRollout(t.store, 'default', REF, () => newRollout(POLICY, REF, '2.0.0', '1.0.0', T0));
    t.out.length = 0;
    expect(await main(['rollout', 'list'], {}, t.fio)).toBe(EXIT.ok);
    expect(t.out.join('').split('\n')[1]).toMatch(
      /^default\s+hello\.examples\.kapp-lambda\.dev\s+1\.0\.0\s+2\.0\.0\s+running\s+canary \(1\/3\)$/,
    );
    t.out.length = 0;
    expect(await main(['rollout', 'list', '-o', 'yaml'], {}, t.fio)).toBe(EXIT.ok);
    expect(parseYaml(t.out.join(''))).toMatchObject({
      policies: [{ metadata: { name: 'default' } }],
      rollouts: [{ target: '2.0.0' }],
    });
  });

  it('pause, resume and abort change the record; an unknown policy or rollout, or a final one, fails', async () => {
    const t = io();
    expect(await main(['rollout', 'pause', 'default', '--package', REF], {}, t.fio)).toBe(EXIT.failure);
    expect(t.err.at(-1)).toBe('fleet: no rollout policy default (see rollout list)\n');
    await putPolicy(t.store, POLICY);
    expect(await main(['rollout', 'pause', 'default', '--package', REF], {}, t.fio)).toBe(EXIT.failure);
    expect(t.err.join('')).toContain('no rollout of');
    await casRollout(t.store, 'default', REF, () => newRollout(POLICY, REF, '2.0.0', '1.0.0', T0));
    expect(await main(['rollout', 'pause', 'default', '--package', REF], {}, t.fio)).toBe(EXIT.ok);
    expect((await readRollout(t.store, 'default', REF))?.record.status).toBe('paused');
    expect(await main(['rollout', 'resume', 'default', '--package', REF], {}, t.fio)).toBe(EXIT.ok);
    expect((await readRollout(t.store, 'default', REF))?.record.status).toBe('running');
    expect(await main(['rollout', 'abort', 'default', '--package', REF], {}, t.fio)).toBe(EXIT.ok);
    expect(t.out.at(-1)).toBe(`rollout default/${REF} (2.0.0): aborted\n`);
    expect(await main(['rollout', 'resume', 'default', '--package', REF], {}, t.fio)).toBe(EXIT.failure);
    expect(t.err.at(-1)).toBe('fleet: rollout of 2.0.0 is aborted: cannot resume\n');
  });

  it('delete aborts the policy`s moving rollouts, then removes it: no longer gated; an unknown policy fails', async () => {
    const t = io({ 'p.yml': POLICY_YAML });
    expect(await main(['rollout', 'delete', 'default'], {}, t.fio)).toBe(EXIT.failure);
    expect(t.err.at(-1)).toBe('fleet: no rollout policy default (see rollout list)\n');
    expect(await main(['rollout', 'apply', '-f', 'p.yml'], {}, t.fio)).toBe(EXIT.ok);
    await casRollout(t.store, 'default', REF, () => newRollout(POLICY, REF, '2.0.0', '1.0.0', T0));
    expect(await main(['rollout', 'delete', 'default'], {}, t.fio)).toBe(EXIT.ok);
    expect(t.out.at(-1)).toBe(
      `rollout policy default deleted; aborted: ${REF} (2.0.0): its packages are no longer gated\n`,
    );
    expect((await readRollout(t.store, 'default', REF))?.record.status).toBe('aborted');
    expect(await policyFor(t.store, REF, 10_000)).toBeUndefined();
  });

  it('a file:/// store no runtime has written stops every command but apply, saying so', async () => {
    const t = io({ 'p.yml': POLICY_YAML });
    t.fio.missingDir = async () => true;
    for (const argv of [['status'], ['rollout', 'list'], ['rollout', 'delete', 'default']]) {
      expect(await main([...argv, '--store', 'file:///nowhere'], {}, t.fio)).toBe(EXIT.failure);
      expect(t.err.at(-1)).toMatch(/^fleet: --store file:\/\/\/nowhere: no such directory \(no runtime has written it/);
    }
    expect(await main(['rollout', 'apply', '-f', 'p.yml', '--store', 'file:///nowhere'], {}, t.fio)).toBe(EXIT.ok);
  });

  it.each([
    [['rollout', 'delete'], 'delete takes <policy> and nothing else'],
    [[], 'a command is required'],
    [['rollout'], 'a rollout command is required'],
    [['rollout', 'pause', 'default'], 'pause takes <policy> --package <refName>'],
    [['rollout', 'apply'], 'apply takes -f'],
    [['rollout', 'pause', 'default', '--package', REF, '-o', 'json'], '-o applies to list'],
    [['rollout', 'list', '--bogus'], 'Unknown option'],
  ])('usage error for %j', async (argv, message) => {
    const t = io();
    expect(await main(argv, {}, t.fio)).toBe(EXIT.usage);
    expect(t.err.join('')).toContain(message);
  });

  it('an invalid policy file fails with its issues and stores nothing', async () => {
    const t = io({ 'bad.yml': POLICY_YAML.replace('soak: 30s', 'soak: soon') });
    expect(await main(['rollout', 'apply', '-f', 'bad.yml'], {}, t.fio)).toBe(EXIT.failure);
    expect(t.err.join('')).toContain('bad.yml: invalid rollout policy: spec.waves.0.soak');
    expect(await t.store.list('state/')).toEqual([]);
  });
});
