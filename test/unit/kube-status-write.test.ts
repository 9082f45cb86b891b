import { describe, expect, it } from 'vitest';
import {
  ConflictError,
  GoneError,
  KubeApiError,
  type KubeObject,
  type ResourceRef,
} from '../../functions/lib/kube/port.js';
import {
  normalizeStatus,
  planStatusWrite,
  STATUS_WRITE_ATTEMPTS,
  writeStatus,
} from '../../functions/lib/kube/status-write.js';
import { FakeCluster } from './support/fake-cluster.js';

const REF: ResourceRef = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: 'n', name: 'a' };
const RUN = { uid: 'u1', generation: 3 };

interface Status {
  friendlyDescription?: string;
  observedGeneration?: number;
  conditions?: Array<{ type: string; status: string }>;
}

function object(rv: string, status: Status | undefined, generation = 3, uid = 'u1'): KubeObject {
  return {
    apiVersion: REF.apiVersion,
    kind: 'App',
    metadata: { name: 'a', namespace: 'n', uid, resourceVersion: rv, generation },
    status,
  };
}

const succeeded = (s: Status | undefined): Status => ({
  ...s,
  observedGeneration: 3,
  friendlyDescription: 'Reconcile succeeded',
  conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
});

describe('planStatusWrite', () => {
  it.each([
    ['missing object', undefined, { action: 'gone' }],
    ['recreated object (other uid)', object('5', {}, 3, 'u2'), { action: 'gone' }],
    ['newer generation', object('5', {}, 4), { action: 'stale', resourceVersion: '5' }],
    ['older generation (never overwrite)', object('5', {}, 2), { action: 'stale', resourceVersion: '5' }],
    ['equal status', object('5', succeeded(undefined)), { action: 'unchanged', resourceVersion: '5' }],
    [
      'changed status',
      object('5', { friendlyDescription: 'Reconciling' }),
      { action: 'write', resourceVersion: '5', status: succeeded(undefined) },
    ],
  ])('%s', (_name, obj, expected) => {
    expect(planStatusWrite<Status>(obj, RUN, succeeded)).toEqual(expected);
  });

  it('compares JSON-normalized (undefined members do not count as a change)', () => {
    const stored = object('5', { friendlyDescription: 'x' });
    const plan = planStatusWrite<Status>(stored, RUN, (s) => ({ ...s, observedGeneration: undefined }));
    expect(plan).toEqual({ action: 'unchanged', resourceVersion: '5' });
  });

  it('hands mutate a copy, so it cannot change the comparison base', () => {
    const plan = planStatusWrite<Status>(object('5', { friendlyDescription: 'x' }), RUN, (s) => {
      if (s) s.friendlyDescription = 'y';
      return s ?? {};
    });
    expect(plan).toEqual({ action: 'write', resourceVersion: '5', status: { friendlyDescription: 'y' } });
  });

  it('normalizeStatus drops undefined and stringifies dates', () => {
    expect(normalizeStatus({ a: undefined, b: new Date('2025-01-02T03:04:05Z') })).toEqual({
      b: '2025-01-02T03:04:05.000Z',
    });
    expect(normalizeStatus(undefined)).toBeUndefined();
  });
});

describe('writeStatus', () => {
  it('writes with the read resourceVersion and uid as preconditions', async () => {
    const fake = new FakeCluster([object('5', {})], ['6']);
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded)).toEqual({
      outcome: 'written',
      resourceVersion: '6',
      attempts: 1,
      object: object('6', succeeded({})),
    });
    expect(fake.calls).toEqual([
      ['get', 'a'],
      ['update', 'a', { resourceVersion: '5', uid: 'u1' }, succeeded({})],
    ]);
  });

  it('unchanged → no write', async () => {
    const fake = new FakeCluster([object('5', succeeded(undefined))]);
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded)).toEqual({
      outcome: 'unchanged',
      resourceVersion: '5',
      attempts: 1,
      object: object('5', succeeded(undefined)),
    });
    expect(fake.calls).toEqual([['get', 'a']]);
  });

  it('stale and gone → no write', async () => {
    const fake = new FakeCluster([object('5', {}, 4), undefined, object('5', {}, 3, 'other')]);
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded)).toEqual({
      outcome: 'stale',
      resourceVersion: '5',
      attempts: 1,
      object: object('5', {}, 4),
    });
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded)).toEqual({
      outcome: 'gone',
      resourceVersion: undefined,
      attempts: 1,
    });
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded)).toEqual({
      outcome: 'gone',
      resourceVersion: undefined,
      attempts: 1,
    });
    expect(fake.calls.filter((c) => c[0] === 'update')).toEqual([]);
  });

  it('on 409 re-reads and re-plans against the fresh status', async () => {
    const fake = new FakeCluster(
      [object('5', { friendlyDescription: 'Reconciling' }), object('7', { friendlyDescription: 'other' })],
      [new ConflictError('updating status of App n/a: 409 conflict'), '8'],
    );
    const result = await writeStatus<Status>(fake, REF, RUN, succeeded);
    expect(result).toEqual({
      outcome: 'written',
      resourceVersion: '8',
      attempts: 2,
      object: object('8', succeeded({})),
    });
    expect(fake.calls.filter((c) => c[0] === 'update').map((c) => c[2])).toEqual([
      { resourceVersion: '5', uid: 'u1' },
      { resourceVersion: '7', uid: 'u1' },
    ]);
  });

  it('plans its first attempt on the object the caller just read, without a GET', async () => {
    const fake = new FakeCluster([], ['6']);
    const read = { object: object('5', {}) };
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded, undefined, read)).toEqual({
      outcome: 'written',
      resourceVersion: '6',
      attempts: 1,
      object: object('6', succeeded({})),
    });
    expect(fake.calls).toEqual([['update', 'a', { resourceVersion: '5', uid: 'u1' }, succeeded({})]]);
    // Read as not found: gone, as a GET answering 404 would be.
    expect((await writeStatus<Status>(fake, REF, RUN, succeeded, undefined, { object: undefined })).outcome).toBe(
      'gone',
    );
  });

  it('a copy older than the stored object costs a 409 and a re-read', async () => {
    const fake = new FakeCluster([object('7', { friendlyDescription: 'other' })], [new ConflictError('c'), '8']);
    const result = await writeStatus<Status>(fake, REF, RUN, succeeded, undefined, { object: object('5', {}) });
    expect(result).toEqual({
      outcome: 'written',
      resourceVersion: '8',
      attempts: 2,
      object: object('8', succeeded({})),
    });
    expect(fake.calls.map((c) => c.slice(0, 3))).toEqual([
      ['update', 'a', { resourceVersion: '5', uid: 'u1' }],
      ['get', 'a'],
      ['update', 'a', { resourceVersion: '7', uid: 'u1' }],
    ]);
  });

  it('a conflict followed by a spec change ends stale (never overwrites a newer run)', async () => {
    const fake = new FakeCluster([object('5', {}), object('9', {}, 4)], [new ConflictError('c')]);
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded)).toEqual({
      outcome: 'stale',
      resourceVersion: '9',
      attempts: 2,
      object: object('9', {}, 4),
    });
  });

  it('keeps the object as the write answered it, when the writer answers with it', async () => {
    const answered = { ...object('6', succeeded({})), metadata: { ...object('6', {}).metadata, managedFields: [] } };
    const fake = new FakeCluster([object('5', {})], ['6']);
    const writer = {
      getObject: fake.getObject.bind(fake),
      getSecret: fake.getSecret.bind(fake),
      getConfigMap: fake.getConfigMap.bind(fake),
      getNamespace: fake.getNamespace.bind(fake),
      updateStatus: async (...args: Parameters<FakeCluster['updateStatus']>) => ({
        ...(await fake.updateStatus(...args)),
        object: answered,
      }),
    };
    expect((await writeStatus<Status>(writer, REF, RUN, succeeded)).object).toBe(answered);
  });

  it('a kept copy that finds the status unchanged is checked against the stored object first', async () => {
    // The stored status moved on since the copy was kept: the write still lands on it.
    const moved = object('7', { friendlyDescription: 'edited' });
    const fake = new FakeCluster([moved], ['8']);
    const kept = { object: object('5', succeeded(undefined)), kept: true };
    expect(await writeStatus<Status>(fake, REF, RUN, succeeded, undefined, kept)).toMatchObject({
      outcome: 'written',
      resourceVersion: '8',
    });
    expect(fake.calls.map((c) => c.slice(0, 3))).toEqual([
      ['get', 'a'],
      ['update', 'a', { resourceVersion: '7', uid: 'u1' }],
    ]);
    // Confirmed unchanged: nothing written.
    const same = new FakeCluster([object('9', succeeded(undefined))]);
    const still = { object: object('9', succeeded(undefined)), kept: true };
    expect((await writeStatus<Status>(same, REF, RUN, succeeded, undefined, still)).outcome).toBe('unchanged');
    expect(same.calls).toEqual([['get', 'a']]);
    // A fresh copy (not kept) is trusted as a GET would be: no read at all.
    const fresh = new FakeCluster([]);
    const read = { object: object('9', succeeded(undefined)) };
    expect((await writeStatus<Status>(fresh, REF, RUN, succeeded, undefined, read)).outcome).toBe('unchanged');
    expect(fresh.calls).toEqual([]);
  });

  it('GoneError from the write → gone', async () => {
    const fake = new FakeCluster([object('5', {})], [new GoneError('g', { statusCode: 404 })]);
    expect((await writeStatus<Status>(fake, REF, RUN, succeeded)).outcome).toBe('gone');
  });

  it(`throws the last ConflictError after ${STATUS_WRITE_ATTEMPTS} attempts`, async () => {
    const reads = Array.from({ length: 5 }, (_, i) => object(String(i), {}));
    const conflicts = Array.from({ length: 5 }, (_, i) => new ConflictError(`c${i}`));
    const fake = new FakeCluster(reads, conflicts);
    await expect(writeStatus<Status>(fake, REF, RUN, succeeded)).rejects.toBe(conflicts[4]);
    expect(fake.calls).toHaveLength(10);
  });

  it('other API errors propagate unchanged', async () => {
    const denied = new KubeApiError('updating status of App n/a: 403 forbidden', { statusCode: 403 });
    const fake = new FakeCluster([object('5', {})], [denied]);
    await expect(writeStatus<Status>(fake, REF, RUN, succeeded)).rejects.toBe(denied);
  });
});
