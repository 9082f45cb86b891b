/**
 * The install dispatcher as the fleet's rollout coordinator (`functions/lib/entry/dispatch.ts`,
 * `functions/lib/entry/dispatch-rollouts.ts`): what a batch carries to a run, what it takes back,
 * the schedule's check, and the stage side's view and report (`dispatched.ts`). The rollout's
 * course through real install runs is `install-rollout.test.ts` ("in the shared stack").
 */
import { describe, expect, it } from 'vitest';
import { ROLLOUT_CHECK_EVENT_TYPE } from '../../events/schema.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import type { DispatchedBatch, StageInvoker } from '../../functions/lib/entry/dispatch.js';
import { makeDispatcher } from '../../functions/lib/entry/dispatch.js';
import { narrowRolloutView, RolloutCoordinator } from '../../functions/lib/entry/dispatch-rollouts.js';
import { dispatchedHandler, RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import type { SqsBatchResponse } from '../../functions/lib/entry/stage-handler.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { RolloutReports } from '../../functions/lib/rollout/access.js';
import { commandRollout, newRollout } from '../../functions/lib/rollout/evaluate.js';
import { parseRolloutPolicy } from '../../functions/lib/rollout/policy.js';
import {
  casRollout,
  type FleetEntry,
  fleetKey,
  putPolicy,
  readRollout,
  rolloutKey,
} from '../../functions/lib/rollout/state.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { clusterInstallRecord } from './support/cluster-records.js';

const REF = 'pkg.test.carvel.dev';
const POLICY = parseRolloutPolicy(`
apiVersion: kapp-lambda/v1
kind: RolloutPolicy
metadata: { name: default }
spec:
  packages: [${REF}]
  waves:
    - { name: canary, clusters: [alpha, gamma], soak: 0s }
    - { name: rest }
`);
const T0 = new Date('2026-12-07T08:00:00.000Z');

/** A fleet entry of `clusterId`'s `ns/inst` at `version`, reconciled. */
function entry(clusterId: string, version: string): FleetEntry {
  return {
    clusterId,
    namespace: 'ns',
    name: 'inst',
    refName: REF,
    uid: `uid-${clusterId}`,
    version,
    reconcile: 'succeeded',
    at: T0.toISOString(),
  };
}

async function setup() {
  const store = new MemoryStore();
  await putPolicy(store, POLICY);
  const poked: string[][] = [];
  const log = memoryLogger();
  const coordinator = new RolloutCoordinator({
    store,
    log,
    now: () => T0,
    poke: async (events) => {
      poked.push(events.map((e) => `${e.subject} ${(e.data as { cause?: string }).cause}`));
    },
  });
  return { store, poked, log, coordinator };
}

describe('the view a run gets', () => {
  it('names no other cluster: its wave lists it alone, other listing waves none, failures and history its own', () => {
    const record = {
      ...newRollout(POLICY, REF, '2.0.0', '1.0.0', T0),
      status: 'stopped' as const,
      cause: 'wave canary: 1 failed (maxUnavailable 0), first gamma ns/secret-app: reconcile of 2.0.0 failed',
      failed: [{ cluster: 'gamma', namespace: 'ns', name: 'secret-app', at: T0.toISOString(), why: 'x' }],
    };
    const forAlpha = narrowRolloutView([POLICY], [record], 'alpha');
    expect(JSON.stringify(forAlpha)).not.toMatch(/gamma|secret-app/);
    expect(forAlpha.policies[0]?.spec.waves.map((w) => w.clusters)).toEqual([['alpha'], undefined]);
    expect(forAlpha.records[0]?.cause).toBe('wave canary: 1 failed (maxUnavailable 0)');
    const forBeta = narrowRolloutView([POLICY], [record], 'beta');
    expect(forBeta.policies[0]?.spec.waves.map((w) => w.clusters)).toEqual([[], undefined]);
    const forGamma = narrowRolloutView([POLICY], [record], 'gamma');
    expect(forGamma.records[0]?.failed).toHaveLength(1);
    expect(forGamma.records[0]?.cause).toContain('secret-app');
  });
});

describe('makeDispatcher (install) with the coordinator', () => {
  it('gives each cluster its view, takes back only the invoked cluster`s report, and evaluates once per batch', async () => {
    const { store, coordinator, poked } = await setup();
    await store.put(fleetKey('alpha', 'ns', 'inst'), JSON.stringify(entry('alpha', '1.0.0')));
    await store.put(fleetKey('beta', 'ns', 'inst'), JSON.stringify(entry('beta', '1.0.0')));
    const payloads: DispatchedBatch[] = [];
    const invoker: StageInvoker = {
      async invoke(_stage, _tenant, payload): Promise<SqsBatchResponse> {
        payloads.push(payload);
        // Each run asks to start 2.0.0; beta's ask is refused (not first wave), alpha's is taken.
        return {
          batchItemFailures: [],
          rollouts: { touched: [], start: [{ policy: 'default', refName: REF, version: '2.0.0', from: '1.0.0' }] },
        };
      },
    };
    const dispatch = makeDispatcher('install', {
      credentials: {
        forRun: async () => ({
          accessKeyId: 'a',
          secretAccessKey: 's',
          sessionToken: 't',
          expiration: new Date('2030-01-01'),
        }),
      },
      invoker,
      keyring: new DerivedKeyring(Buffer.alloc(32, 1)),
      log: memoryLogger(),
      rollouts: coordinator,
    });
    await dispatch({
      Records: [clusterInstallRecord('beta', 'inst', 'b1'), clusterInstallRecord('alpha', 'inst', 'a1')],
    });
    expect(payloads.map((p) => [p.clusterId, p.rollouts?.policies[0]?.spec.waves[0]?.clusters])).toEqual([
      ['beta', []],
      ['alpha', ['alpha']],
    ]);
    expect((await readRollout(store, 'default', REF))?.record).toMatchObject({ target: '2.0.0', status: 'running' });
    expect(poked).toEqual([[`alpha/PackageInstall/ns/inst rollout: default/${REF} wave canary released (2.0.0)`]]);
  });

  it('the schedule`s check releases a wave a run did not, and sends the end pokes of an aborted rollout once', async () => {
    const { store, coordinator, poked } = await setup();
    await store.put(fleetKey('alpha', 'ns', 'inst'), JSON.stringify(entry('alpha', '2.0.0')));
    await store.put(fleetKey('gamma', 'ns', 'inst'), JSON.stringify(entry('gamma', '2.0.0')));
    await store.put(fleetKey('beta', 'ns', 'inst'), JSON.stringify(entry('beta', '1.0.0')));
    await casRollout(store, 'default', REF, () => newRollout(POLICY, REF, '2.0.0', '1.0.0', T0));
    const dispatch = makeDispatcher('install', {
      credentials: { forRun: async () => Promise.reject(new Error('no invoke expected')) },
      invoker: { invoke: async () => Promise.reject(new Error('no invoke expected')) },
      keyring: new DerivedKeyring(Buffer.alloc(32, 1)),
      log: memoryLogger(),
      rollouts: coordinator,
    });
    await dispatch({ type: ROLLOUT_CHECK_EVENT_TYPE });
    expect((await readRollout(store, 'default', REF))?.record.waves[1]?.releasedAt).toBe(T0.toISOString());
    expect(poked.flat().filter((p) => p.includes('released'))).toEqual([
      `beta/PackageInstall/ns/inst rollout: default/${REF} wave rest released (2.0.0)`,
    ]);
    poked.length = 0;
    // The CLI aborts it: the next check pokes every member once, the one after none.
    await casRollout(store, 'default', REF, (r) => (r ? commandRollout(r, 'abort', T0) : undefined));
    await dispatch({ type: ROLLOUT_CHECK_EVENT_TYPE });
    expect(poked.flat().map((p) => p.split(' ')[0])).toEqual([
      'alpha/PackageInstall/ns/inst',
      'beta/PackageInstall/ns/inst',
      'gamma/PackageInstall/ns/inst',
    ]);
    await dispatch({ type: ROLLOUT_CHECK_EVENT_TYPE });
    expect(poked).toHaveLength(1);
    expect(await store.get(rolloutKey('default', REF))).toBeDefined();
  });
});

describe('the stage side', () => {
  const batch = (rollouts: unknown): DispatchedBatch =>
    ({
      records: [],
      clusterId: 'alpha',
      credentials: {
        accessKeyId: 'a',
        secretAccessKey: 's',
        sessionToken: 't',
        expiration: '2030-01-01T00:00:00.000Z',
      },
      rollouts,
    }) as DispatchedBatch;

  it('keeps the batch`s view for the run, answers what the run reported, and refuses a malformed view', async () => {
    const holder = new RunCredentialHolder();
    const reports = new RolloutReports();
    const handler = dispatchedHandler(
      async () => {
        expect(holder.rolloutView?.policies[0]?.metadata.name).toBe('default');
        reports.touch('default', REF);
        return { batchItemFailures: [] };
      },
      holder,
      { rolloutReports: reports },
    );
    const view = narrowRolloutView([POLICY], [], 'alpha');
    expect(await handler(batch(view))).toEqual({
      batchItemFailures: [],
      rollouts: { touched: [`default/${REF}`], start: [] },
    });
    await expect(handler(batch({ policies: [{ kind: 'nope' }], records: [] }))).rejects.toThrow(
      'refused a dispatched batch: malformed rollouts view',
    );
  });
});
