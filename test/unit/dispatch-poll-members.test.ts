/**
 * The source poll's membership in `cluster` sharing (`KAPP_LAMBDA_SHARING=cluster`, docs/decisions.md
 * D15): a dispatched fetch or index-repo run answers `pollMember` (whether its store lists source
 * poll records after the run), the dispatcher writes or deletes `state/poll-members/<cluster id>`
 * for the cluster it invoked and no other, and the poll's clusters are those members, with no
 * source poll record read; in `fleet` sharing the answer changes nothing and the records are read
 * as before. The stage function, STS and Lambda are fakes at their ports; the store is a memory one.
 */
import { describe, expect, it } from 'vitest';
import { objectEvent, SOURCE_POLL_EVENT_TYPE } from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { parseDispatcherEnv } from '../../functions/lib/entry/config.js';
import {
  type DispatchedBatch,
  makeDispatcher,
  POLL_MEMBER_STAGES,
  POLL_MEMBERS_PREFIX,
  type RunCredentials,
  StorePollMembers,
  sourcePollClusters,
} from '../../functions/lib/entry/dispatch.js';
import { parseBatchResponse } from '../../functions/lib/entry/dispatch-aws.js';
import { createDispatcherDeps } from '../../functions/lib/entry/dispatch-entry.js';
import { dispatchedHandler, hasSourcePollRecords, RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import type { AwsClients } from '../../functions/lib/entry/lambda-base.js';
import type { SqsBatchResponse, SqsRecord } from '../../functions/lib/entry/stage-handler.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { SOURCE_POLL_PREFIX } from '../../functions/lib/pipeline/source-poll.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';
import { dispatcherObjects, runRoleObjects } from '../../infra/aws/stages.js';
import { REF } from './support/app-world.js';
import { clusterPackagingRecord, clusterTemplateRecord, recordOf } from './support/cluster-records.js';

const keyring = new DerivedKeyring(Buffer.alloc(32, 3));
const credentials: RunCredentials = {
  forRun: async (_stage, clusterId) => ({
    accessKeyId: `AKIA-${clusterId}`,
    secretAccessKey: 's',
    sessionToken: 't',
    expiration: new Date('2030-01-01T00:00:00Z'),
  }),
};

/** An object event of App `name` of cluster `clusterId` (a fetch record): message id `<clusterId>-<name>`. */
const appRecord = (clusterId: string, name: string): SqsRecord =>
  recordOf(
    objectEvent({ ...REF, clusterId, name, uid: `uid-${name}` }, 'modified', { time: '2025-01-02T03:04:05.000Z' }),
    `${clusterId}-${name}`,
  );
/** A record of `stage` (fetch: an App's; index-repo: a PackageRepository's) of cluster `clusterId`. */
const recordFor = (stage: PipelineStage, clusterId: string, name: string): SqsRecord =>
  stage === 'fetch'
    ? appRecord(clusterId, name)
    : clusterPackagingRecord('PackageRepository', clusterId, name, `${clusterId}-${name}`);
const member = (clusterId: string) => `${POLL_MEMBERS_PREFIX}${clusterId}`;

/** A dispatcher of `stage` whose stage function answers `pollMember: members.get(tenant)` (absent when unset). */
function setup(
  stage: PipelineStage,
  members: ReadonlyMap<string, boolean>,
  store = new MemoryStore(),
  registered?: (clusterId: string) => Promise<boolean>,
) {
  const invoked: string[] = [];
  const log = memoryLogger();
  const dispatch = makeDispatcher(stage, {
    credentials,
    keyring,
    log,
    invoker: {
      async invoke(_s, tenant) {
        invoked.push(tenant);
        const pollMember = members.get(tenant);
        return { batchItemFailures: [], ...(pollMember === undefined ? {} : { pollMember }) };
      },
    },
    pollMembers: new StorePollMembers(store),
    pollClusters: () => sourcePollClusters(store, 'cluster'),
    ...(registered ? { registered } : {}),
  });
  return { dispatch, store, invoked, log };
}

/** `store`, failing every operation on a key under `prefix`. */
function refusing(store: ObjectStore, prefix: string): ObjectStore {
  const guard =
    <A extends unknown[], R>(f: (key: string, ...rest: A) => Promise<R>) =>
    async (key: string, ...rest: A): Promise<R> => {
      if (key.startsWith(prefix)) throw new Error(`AccessDenied: ${key}`);
      return await f.call(store, key, ...rest);
    };
  return {
    get: guard(store.get),
    head: guard(store.head),
    putIfAbsent: guard(store.putIfAbsent),
    getVersioned: guard(store.getVersioned),
    putIfMatch: guard(store.putIfMatch),
    put: guard(store.put),
    list: guard(store.list),
    delete: guard(store.delete),
  };
}

describe('the dispatcher: poll membership in cluster sharing', () => {
  it.each(POLL_MEMBER_STAGES)(
    '%s: a run answering pollMember true writes its cluster as a member, false deletes it',
    async (stage) => {
      const t = setup(
        stage,
        new Map([
          ['alpha', true],
          ['beta', false],
        ]),
      );
      await t.store.put(member('beta'), '{}');
      const records = [recordFor(stage, 'alpha', 'a'), recordFor(stage, 'beta', 'b')];
      expect(await t.dispatch({ Records: records })).toEqual({ batchItemFailures: [] });
      expect(await t.store.get(member('alpha'))).toEqual(Buffer.from('{}'));
      expect(await t.store.head(member('beta'))).toBeUndefined();
      expect(await t.store.list(POLL_MEMBERS_PREFIX)).toEqual([member('alpha')]);
    },
  );

  it("sets only the invoked cluster's membership: a run cannot add or drop another cluster", async () => {
    // beta's run answers true and gamma's false: alpha (no answer) keeps its membership, and
    // nothing any run answers names a cluster, so only beta and gamma change.
    const t = setup(
      'fetch',
      new Map([
        ['beta', true],
        ['gamma', false],
      ]),
    );
    await t.store.put(member('alpha'), '{}');
    await t.store.put(member('gamma'), '{}');
    await t.dispatch({ Records: [appRecord('beta', 'b'), appRecord('gamma', 'g')] });
    expect((await t.store.list(POLL_MEMBERS_PREFIX)).sort()).toEqual([member('alpha'), member('beta')]);
    expect(t.invoked.sort()).toEqual(['beta', 'gamma']);
  });

  it('runs the poll for the recorded members, reading no source poll record', async () => {
    const store = new MemoryStore();
    await store.put(`${SOURCE_POLL_PREFIX}a.json`, JSON.stringify({ members: [{ cluster: 'delta' }] }));
    for (const id of ['beta', 'alpha']) await store.put(member(id), '{}');
    await store.put(`${POLL_MEMBERS_PREFIX}Not_An_Id`, '{}');
    const guarded = refusing(store, 'cache/');
    expect(await sourcePollClusters(guarded, 'cluster')).toEqual(['alpha', 'beta']);
    const t = setup(
      'index-repo',
      new Map([
        ['alpha', true],
        ['beta', false],
      ]),
      store,
    );
    await t.dispatch({ type: SOURCE_POLL_EVENT_TYPE });
    expect(t.invoked.sort()).toEqual(['alpha', 'beta']);
    // beta's poll found no records left in its domain: it is no longer polled.
    expect(await sourcePollClusters(guarded, 'cluster')).toEqual(['alpha']);
  });

  it('drops the membership of a cluster the registry no longer names, invoking nothing for it; keeps it when the registry cannot be read', async () => {
    const store = new MemoryStore();
    for (const id of ['alpha', 'gone', 'unsure']) await store.put(member(id), '{}');
    const t = setup('index-repo', new Map([['alpha', true]]), store, async (id) => {
      if (id === 'unsure') throw new Error('registry unreadable');
      return id !== 'gone';
    });
    await t.dispatch({ type: SOURCE_POLL_EVENT_TYPE });
    expect(t.invoked.sort()).toEqual(['alpha', 'unsure']);
    expect(await sourcePollClusters(store, 'cluster')).toEqual(['alpha', 'unsure']);
    expect(t.log.records.find((r) => r.obj.dropped !== undefined)?.obj).toMatchObject({ clusters: 3, dropped: 1 });
  });

  it("ignores pollMember from another stage's run, and logs a membership it could not write", async () => {
    const t = setup('template', new Map([['alpha', true]]));
    await t.dispatch({ Records: [clusterTemplateRecord('alpha', 'x', 1, 'alpha-x1')] });
    expect(await t.store.list(POLL_MEMBERS_PREFIX)).toEqual([]);
    const broken = setup(
      'fetch',
      new Map([['alpha', true]]),
      refusing(new MemoryStore(), POLL_MEMBERS_PREFIX) as MemoryStore,
    );
    expect(await broken.dispatch({ Records: [appRecord('alpha', 'a')] })).toEqual({ batchItemFailures: [] });
    expect(
      broken.log.records.some((r) => r.msg?.startsWith("could not record the cluster's source poll membership")),
    ).toBe(true);
  });

  it('keeps a boolean pollMember of the invoke answer only', () => {
    const json = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
    expect(parseBatchResponse(json({ batchItemFailures: [], pollMember: false }), new Set())).toEqual({
      batchItemFailures: [],
      pollMember: false,
    });
    expect(parseBatchResponse(json({ batchItemFailures: [], pollMember: 'yes' }), new Set())).toEqual({
      batchItemFailures: [],
    });
  });
});

describe('the dispatcher: fleet sharing unchanged', () => {
  const ENV = {
    AWS_REGION: 'eu-west-1',
    KAPP_LAMBDA_BUCKET: 'fleet-artifacts',
    KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/registry/',
    KAPP_LAMBDA_RUN_ROLE_ARN: 'arn:aws:iam::123456789012:role/kapp/run',
    KAPP_LAMBDA_STAGE_FUNCTION: 'kapp-lambda-stage',
    KAPP_LAMBDA_QUEUE_URL_FETCH: 'https://sqs.eu-west-1.amazonaws.com/123456789012/fetch.fifo',
    KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: 'https://sqs.eu-west-1.amazonaws.com/123456789012/index-repo.fifo',
    KAPP_LAMBDA_QUEUE_URL_TEMPLATE: 'https://sqs.eu-west-1.amazonaws.com/123456789012/template.fifo',
  };
  const deps = (stage: PipelineStage, sharing?: string) =>
    createDispatcherDeps(
      parseDispatcherEnv({ ...ENV, KAPP_LAMBDA_DISPATCH_STAGE: stage, KAPP_LAMBDA_SHARING: sharing }),
      { s3: {}, sqs: {} } as unknown as AwsClients,
      keyring,
      { log: memoryLogger() },
    );

  it('reads KAPP_LAMBDA_SHARING (fleet by default) and keeps poll members only in cluster sharing, for fetch and index-repo', () => {
    expect(parseDispatcherEnv({ ...ENV, KAPP_LAMBDA_DISPATCH_STAGE: 'fetch' }).sharing).toBe('fleet');
    expect(() =>
      parseDispatcherEnv({ ...ENV, KAPP_LAMBDA_DISPATCH_STAGE: 'fetch', KAPP_LAMBDA_SHARING: 'group' }),
    ).toThrow('KAPP_LAMBDA_SHARING');
    expect(deps('fetch').pollMembers).toBeUndefined();
    expect(deps('index-repo', 'fleet').pollMembers).toBeUndefined();
    expect(deps('fetch', 'cluster').pollMembers).toBeInstanceOf(StorePollMembers);
    expect(deps('index-repo', 'cluster').pollMembers).toBeInstanceOf(StorePollMembers);
    expect(deps('template', 'cluster').pollMembers).toBeUndefined();
  });

  it("in fleet sharing a run's pollMember writes nothing and the poll's clusters are the records' members", async () => {
    const store = new MemoryStore();
    await store.put(`${SOURCE_POLL_PREFIX}a.json`, JSON.stringify({ members: [{ cluster: 'beta' }] }));
    await store.put(member('alpha'), '{}');
    expect(await sourcePollClusters(store)).toEqual(['beta']);
    expect(await sourcePollClusters(store, 'fleet')).toEqual(['beta']);
    const invoked: string[] = [];
    const dispatch = makeDispatcher('fetch', {
      credentials,
      keyring,
      log: memoryLogger(),
      invoker: {
        async invoke(_s, tenant) {
          invoked.push(tenant);
          return { batchItemFailures: [], pollMember: true };
        },
      },
    });
    await dispatch({ Records: [appRecord('gamma', 'g')] });
    expect(invoked).toEqual(['gamma']);
    expect(await store.list(POLL_MEMBERS_PREFIX)).toEqual([member('alpha')]);
  });
});

describe('the stage side: pollMember', () => {
  const batch = (poll: boolean): DispatchedBatch => ({
    records: poll ? [] : [appRecord('alpha', 'a')],
    clusterId: 'alpha',
    credentials: { accessKeyId: 'A', secretAccessKey: 's', sessionToken: 't', expiration: '2030-01-01T00:00:00.000Z' },
    ...(poll ? { poll: true as const } : {}),
  });

  it('answers, after the records and after a poll, whether its store lists source poll records', async () => {
    const store = new MemoryStore();
    const handler = dispatchedHandler(
      async (event) => {
        // The run itself writes the cluster's first record (as trackAppSources would).
        if ('Records' in event) await store.put(`${SOURCE_POLL_PREFIX}a.json`, '{}');
        else await store.delete(`${SOURCE_POLL_PREFIX}a.json`);
        return { batchItemFailures: [] };
      },
      new RunCredentialHolder(),
      { pollMember: () => hasSourcePollRecords(store) },
    );
    expect(await handler(batch(false))).toEqual({ batchItemFailures: [], pollMember: true });
    // The poll dropped the last record.
    expect(await handler(batch(true))).toEqual({ batchItemFailures: [], pollMember: false });
    await store.put('cache/fetch/sha256/x.json', '{}');
    expect(await hasSourcePollRecords(store)).toBe(false);
  });

  it('leaves pollMember out when the records cannot be listed, and has none without the option', async () => {
    const log = memoryLogger();
    const failing = dispatchedHandler(
      async () => ({ batchItemFailures: [] }) as SqsBatchResponse,
      new RunCredentialHolder(),
      {
        log,
        pollMember: () => hasSourcePollRecords(refusing(new MemoryStore(), 'cache/')),
      },
    );
    expect(await failing(batch(false))).toEqual({ batchItemFailures: [] });
    expect(
      log.records.some((r) => r.level === 'warn' && r.msg?.startsWith('could not list the source poll records')),
    ).toBe(true);
    const plain = dispatchedHandler(async () => ({ batchItemFailures: [] }), new RunCredentialHolder());
    expect(await plain(batch(false))).toEqual({ batchItemFailures: [] });
  });
});

describe('the grants of the poll members', () => {
  it("are the fetch and index-repo dispatchers' (read, write, delete) and no run role's; fetch's run role has its source poll records", () => {
    const grant = { keys: 'state/poll-members/*', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] };
    for (const stage of ['fetch', 'index-repo'] as const) {
      expect(dispatcherObjects(stage)).toContainEqual(expect.objectContaining(grant));
    }
    for (const stage of ['template', 'deploy', 'install'] as const) {
      expect(dispatcherObjects(stage).map((g) => g.keys)).not.toContain(grant.keys);
    }
    for (const stage of ['fetch', 'template', 'deploy', 'index-repo', 'install'] as const) {
      expect(runRoleObjects(stage).some((g) => g.keys.startsWith('state/poll-members'))).toBe(false);
    }
    expect(runRoleObjects('fetch')).toContainEqual(
      expect.objectContaining({ keys: 'cache/source-poll/*', actions: ['s3:GetObject', 's3:PutObject'] }),
    );
  });
});
