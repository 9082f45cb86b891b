/**
 * makeSqsHandler: edge validation, routing, partial batch failures and FIFO group skipping,
 * with the stage runner, the sender and the logger faked at their ports.
 */
import { describe, expect, it } from 'vitest';
import {
  deleteEvent,
  deployEvent,
  EVENT_TYPES,
  type KappEvent,
  type ObjectRef,
  objectEvent,
  objectRefOf,
  orderingKey,
  repoIndexedEvent,
  SOURCE_POLL_EVENT_TYPE,
  serializeEvent,
  templateEvent,
} from '../../events/schema.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { senderCheckOf } from '../../functions/lib/entry/lambda.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';

const app = (name: string): ObjectRef => ({
  clusterId: 'prod-eu-1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'default',
  name,
  uid: `uid-${name}`,
  generation: 3,
  resourceVersion: '48213',
});
const time = '2025-01-02T03:04:05.000Z';
const run = { generation: 3, runId: 'r-1', startedAt: time };
const FETCH_KEY = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
const MANIFEST_KEY = `artifacts/template/sha256/${'b'.repeat(64)}.yaml`;

const objEv = (name: string) => objectEvent(app(name), 'modified', { time });
const tmplEv = (name: string) =>
  templateEvent({ object: app(name), run, artifacts: { fetchKey: FETCH_KEY } }, { time });
const depEv = (name: string) =>
  deployEvent({ object: app(name), run, artifacts: { fetchKey: FETCH_KEY, manifestKey: MANIFEST_KEY } }, { time });
const delEv = (name: string) => deleteEvent({ object: app(name), run }, { time });

const record = (messageId: string, body: string, group?: string): SqsRecord => ({
  messageId,
  body,
  attributes:
    group === undefined ? { ApproximateReceiveCount: '1' } : { MessageGroupId: group, ApproximateReceiveCount: '2' },
  eventSourceARN: 'arn:aws:sqs:eu-west-1:123456789012:kapp-lambda-fetch.fifo',
});
const rec = (messageId: string, event: KappEvent) =>
  record(messageId, serializeEvent(event), orderingKey(objectRefOf(event)));

type Dispatch = NonNullable<EntryDeps['dispatch']>;

function setup(dispatch: Dispatch, sender = new MemoryEventSender()) {
  const log = memoryLogger();
  const seen: { event: KappEvent; deps: DispatchDeps }[] = [];
  const pipeline = { marker: 'pipeline-deps' } as unknown as DispatchDeps;
  const deps: EntryDeps = {
    pipeline,
    sender,
    log,
    dispatch: async (event, d) => {
      seen.push({ event, deps: d });
      return dispatch(event, d);
    },
  };
  return { deps, log, sender, seen };
}

const lines = (log: ReturnType<typeof memoryLogger>) =>
  log.records.map((r) => ({ level: r.level, msg: r.msg, outcome: r.obj.outcome, messageId: r.obj.messageId }));

describe('makeSqsHandler', () => {
  it('runs the stage and queues the next event for the stage it targets', async () => {
    const next = tmplEv('a');
    const { deps, sender, seen, log } = setup(async () => next);
    const handler = makeSqsHandler('fetch', () => deps);
    const ev = objEv('a');
    expect(await handler({ Records: [rec('m1', ev)] }, { awsRequestId: 'req-1' })).toEqual({ batchItemFailures: [] });
    expect(seen.map((s) => s.event)).toEqual([ev]);
    expect(seen[0]?.deps).toMatchObject({ marker: 'pipeline-deps' });
    expect(sender.sent).toEqual([{ stage: 'template', event: next }]);
    expect(log.records).toEqual([
      {
        level: 'info',
        msg: 'event handled; next stage queued',
        obj: {
          awsRequestId: 'req-1',
          messageId: 'm1',
          subject: 'prod-eu-1/App/default/a',
          eventId: ev.id,
          stage: 'fetch',
          outcome: 'forwarded',
          type: 'dev.kapp-lambda.object.v1',
          next: 'dev.kapp-lambda.stage.template.v1',
          to: 'template',
          nextId: next.id,
        },
      },
    ]);
  });

  it('passes a logger bound to the record to the stage', async () => {
    const { deps, seen, log } = setup(async (_e, d) => {
      d.log.info({ step: 'inside' }, 'stage says hi');
      return undefined;
    });
    await makeSqsHandler('fetch', () => deps)({ Records: [rec('m1', objEv('a'))] });
    expect(seen).toHaveLength(1);
    expect(log.records[0]).toEqual({
      level: 'info',
      msg: 'stage says hi',
      obj: { messageId: 'm1', subject: 'prod-eu-1/App/default/a', eventId: objEv('a').id, step: 'inside' },
    });
    expect(log.records[1]?.msg).toBe('event handled');
    expect(log.records[1]?.obj.outcome).toBe('done');
  });

  it('routes the delete hand-off to the deploy queue', async () => {
    const del = delEv('a');
    const { deps, sender } = setup(async () => del);
    await makeSqsHandler('fetch', () => deps)({ Records: [rec('m1', objEv('a'))] });
    expect(sender.sent).toEqual([{ stage: 'deploy', event: del }]);
  });

  it('drops an invalid event with the path of the bad field, without running or retrying it', async () => {
    const { deps, seen, log } = setup(async () => undefined);
    const bad = JSON.parse(serializeEvent(objEv('a')));
    bad.data.generation = '3';
    const res = await makeSqsHandler(
      'fetch',
      () => deps,
    )({
      Records: [record('m1', JSON.stringify(bad), 'g'), record('m2', '{not json', 'g'), record('m3', '', 'g')],
    });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([]);
    expect(log.records).toEqual([
      {
        level: 'warn',
        msg: 'invalid event; dropped',
        obj: {
          messageId: 'm1',
          stage: 'fetch',
          outcome: 'invalid',
          error: 'data.generation: expected number, received string',
        },
      },
      {
        level: 'warn',
        msg: 'invalid event; dropped',
        obj: { messageId: 'm2', stage: 'fetch', outcome: 'invalid', error: '(root): not valid JSON' },
      },
      {
        level: 'warn',
        msg: 'invalid event; dropped',
        obj: { messageId: 'm3', stage: 'fetch', outcome: 'invalid', error: '(root): not valid JSON' },
      },
    ]);
  });

  it('drops an event that targets another function', async () => {
    const { deps, seen, log } = setup(async () => undefined);
    const res = await makeSqsHandler(
      'template',
      () => deps,
    )({ Records: [rec('m1', depEv('a')), rec('m2', delEv('b'))] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([]);
    expect(log.records.map((r) => r.obj)).toEqual([
      {
        messageId: 'm1',
        stage: 'template',
        outcome: 'misrouted',
        type: 'dev.kapp-lambda.stage.deploy.v1',
        subject: 'prod-eu-1/App/default/a',
        target: 'deploy',
      },
      {
        messageId: 'm2',
        stage: 'template',
        outcome: 'misrouted',
        type: EVENT_TYPES.delete,
        subject: 'prod-eu-1/App/default/b',
        target: 'deploy',
      },
    ]);
    expect(log.records.map((r) => r.msg)).toEqual([
      'event is for another function; dropped',
      'event is for another function; dropped',
    ]);
  });

  it('the index-repo function runs a PackageRepository object event and sends nothing on; the fetch function drops it', async () => {
    const repo = objectEvent(
      { ...app('r'), kind: 'PackageRepository', apiVersion: 'packaging.carvel.dev/v1alpha1' },
      'added',
      { time },
    );
    const r = setup(async () => undefined);
    expect(
      await makeSqsHandler('index-repo', () => r.deps)({ Records: [rec('m1', repo), rec('m2', objEv('a'))] }),
    ).toEqual({ batchItemFailures: [] });
    expect(r.seen.map((x) => x.event)).toEqual([repo]);
    expect(r.sender.sent).toEqual([]);
    expect(r.log.records.map((x) => [x.msg, x.obj.outcome, x.obj.stage, x.obj.subject, x.obj.target])).toEqual([
      ['event handled', 'done', 'index-repo', 'prod-eu-1/PackageRepository/default/r', undefined],
      ['event is for another function; dropped', 'misrouted', 'index-repo', 'prod-eu-1/App/default/a', 'fetch'],
    ]);

    const f = setup(async () => undefined);
    await makeSqsHandler('fetch', () => f.deps)({ Records: [rec('m3', repo)] });
    expect(f.seen).toEqual([]);
    expect(f.log.records[0]?.obj).toMatchObject({ outcome: 'misrouted', target: 'index-repo' });
  });

  it('a repo.indexed hand-off of index-repo goes to the install queue; the record succeeds', async () => {
    const ref = { ...app('r'), kind: 'PackageRepository' as const, apiVersion: 'packaging.carvel.dev/v1alpha1' };
    const indexed = repoIndexedEvent({ object: ref, run, artifacts: {}, changes: [] }, { time });
    const r = setup(async () => indexed);
    const res = await makeSqsHandler(
      'index-repo',
      () => r.deps,
    )({
      Records: [rec('m1', objectEvent(ref, 'modified', { time }))],
    });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(r.sender.sent.map((s) => [s.stage, s.event.type])).toEqual([['install', indexed.type]]);
    expect(r.log.records.map((x) => [x.msg, x.obj.outcome])).toEqual([
      ['event handled; next stage queued', 'forwarded'],
    ]);
  });

  it('the install function runs a PackageInstall object event and sends nothing on; the fetch function drops it', async () => {
    const pkgi = objectEvent(
      { ...app('p'), kind: 'PackageInstall', apiVersion: 'packaging.carvel.dev/v1alpha1' },
      'added',
      { time },
    );
    const i = setup(async () => undefined);
    expect(await makeSqsHandler('install', () => i.deps)({ Records: [rec('m1', pkgi)] })).toEqual({
      batchItemFailures: [],
    });
    expect(i.seen.map((x) => x.event)).toEqual([pkgi]);
    expect(i.sender.sent).toEqual([]);
    expect(i.log.records.map((x) => [x.msg, x.obj.outcome, x.obj.stage])).toEqual([
      ['event handled', 'done', 'install'],
    ]);

    const { deps, log } = setup(async () => undefined);
    expect(await makeSqsHandler('fetch', () => deps)({ Records: [rec('m2', pkgi)] })).toEqual({
      batchItemFailures: [],
    });
    expect(log.records[0]?.obj).toMatchObject({ outcome: 'misrouted', target: 'install' });
  });

  it('fails only the record whose stage throws, and says why', async () => {
    const { deps, sender, log } = setup(async (e) => {
      if (e.subject.endsWith('/b')) throw new Error('failed to read App', { cause: new Error('connect ECONNREFUSED') });
      return depEv(e.subject.split('/')[3] ?? '');
    });
    const res = await makeSqsHandler(
      'template',
      () => deps,
    )({
      Records: [rec('m1', tmplEv('a')), rec('m2', tmplEv('b')), rec('m3', tmplEv('c'))],
    });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm2' }] });
    expect(sender.sent.map((s) => s.event.subject)).toEqual(['prod-eu-1/App/default/a', 'prod-eu-1/App/default/c']);
    const failed = log.records.find((r) => r.obj.outcome === 'failed');
    expect(failed).toEqual({
      level: 'error',
      msg: 'event failed; will be retried',
      obj: {
        messageId: 'm2',
        subject: 'prod-eu-1/App/default/b',
        eventId: tmplEv('b').id,
        stage: 'template',
        outcome: 'failed',
        type: 'dev.kapp-lambda.stage.template.v1',
        error: 'Error: failed to read App',
        cause: 'Error: connect ECONNREFUSED',
        receiveCount: 2,
      },
    });
  });

  it('fails the record when the next event cannot be queued', async () => {
    const sender = new MemoryEventSender(() => new Error('queue down'));
    const { deps } = setup(async () => depEv('a'), sender);
    const res = await makeSqsHandler('template', () => deps)({ Records: [rec('m1', tmplEv('a'))] });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm1' }] });
  });

  it('after a failure, fails the later records of the same message group without running them; other groups go on', async () => {
    const { deps, seen, log } = setup(async (e) => {
      if (e.id === tmplEv('a').id) throw new Error('boom');
      return undefined;
    });
    const a2 = templateEvent(
      {
        object: { ...app('a'), generation: 4 },
        run: { ...run, generation: 4, runId: 'r-2' },
        artifacts: { fetchKey: FETCH_KEY },
      },
      { time },
    );
    const res = await makeSqsHandler(
      'template',
      () => deps,
    )({
      Records: [
        rec('m1', tmplEv('a')),
        rec('m2', tmplEv('b')),
        rec('m3', a2),
        record('m4', '{}', 'prod-eu-1/App/default/a'),
      ],
    });
    expect(res).toEqual({
      batchItemFailures: [{ itemIdentifier: 'm1' }, { itemIdentifier: 'm3' }, { itemIdentifier: 'm4' }],
    });
    expect(seen.map((s) => s.event.id)).toEqual([tmplEv('a').id, tmplEv('b').id]);
    // One record at a time (the default concurrency): group by group, each in batch order.
    expect(lines(log)).toEqual([
      { level: 'error', msg: 'event failed; will be retried', outcome: 'failed', messageId: 'm1' },
      {
        level: 'warn',
        msg: 'earlier event of this object failed; retried after it',
        outcome: 'skipped',
        messageId: 'm3',
      },
      {
        level: 'warn',
        msg: 'earlier event of this object failed; retried after it',
        outcome: 'skipped',
        messageId: 'm4',
      },
      { level: 'info', msg: 'event handled', outcome: 'done', messageId: 'm2' },
    ]);
  });

  it('on a standard queue (no group) a failure fails only itself', async () => {
    const { deps } = setup(async (e) => {
      if (e.subject.endsWith('/a')) throw new Error('boom');
      return undefined;
    });
    const res = await makeSqsHandler(
      'template',
      () => deps,
    )({
      Records: [record('m1', serializeEvent(tmplEv('a'))), record('m2', serializeEvent(tmplEv('a')))],
    });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm1' }, { itemIdentifier: 'm2' }] });
  });

  it('builds its deps once, and again after a failed build', async () => {
    let calls = 0;
    const { deps } = setup(async () => undefined);
    const handler = makeSqsHandler('fetch', () => {
      calls++;
      if (calls === 1) throw new Error('loading kubeconfig /var/task/kubeconfig.yaml');
      return deps;
    });
    const err = await handler({ Records: [rec('m1', objEv('a'))] }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe('failed to initialize the fetch function');
    expect(((err as Error).cause as Error).message).toBe('loading kubeconfig /var/task/kubeconfig.yaml');
    expect(await handler({ Records: [rec('m1', objEv('a'))] })).toEqual({ batchItemFailures: [] });
    expect(await handler({ Records: [] })).toEqual({ batchItemFailures: [] });
    expect(calls).toBe(2);
  });
});

describe('the source poll event', () => {
  it('the index-repo function runs one poll of the store and dispatches nothing; another function drops it', async () => {
    const store = new MemoryStore();
    const listed: string[] = [];
    const list = store.list.bind(store);
    store.list = async (prefix, opts) => {
      listed.push(prefix);
      return await list(prefix, opts);
    };
    const { deps, seen, log } = setup(async () => undefined);
    deps.pipeline = { store, config: {}, now: () => new Date(time), log } as unknown as DispatchDeps;
    const poll = { type: SOURCE_POLL_EVENT_TYPE } as const;
    expect(await makeSqsHandler('index-repo', () => deps)(poll)).toEqual({ batchItemFailures: [] });
    expect(listed).toEqual(['cache/source-poll/sha256/']);
    expect(log.records.find((r) => r.msg === 'source poll')?.obj).toMatchObject({ sources: 0, polled: 0, poked: 0 });
    expect(await makeSqsHandler('install', () => deps)(poll)).toEqual({ batchItemFailures: [] });
    expect(listed).toHaveLength(1);
    expect(seen).toEqual([]);
  });
});

describe('the sender check', () => {
  const FETCH_ROLE = 'AROAFETCHFUNCTION0001';
  const PROD_FORWARDER = 'AROAPRODFORWARDER0001';
  const EDGE_FORWARDER = 'AROAEDGEFORWARDER0001';
  const forwarders: Record<string, string> = { 'prod-eu-1': PROD_FORWARDER, 'edge-1': EDGE_FORWARDER };
  /** `unwatched` is registered without a forwarder role id; any other id is not registered. */
  const forwarderOf = async (id: string) =>
    id === 'unwatched' ? {} : forwarders[id] === undefined ? undefined : { roleId: forwarders[id] };
  const fleet = { forwarderOf };
  const from = (messageId: string, event: KappEvent, senderId?: string): SqsRecord => {
    const r = rec(messageId, event);
    return { ...r, attributes: { ...r.attributes, ...(senderId === undefined ? {} : { SenderId: senderId }) } };
  };

  const DROPPED = 'event from a sender that may not send it (its cluster or its kind); dropped';
  const fetchSends = [{ stage: 'fetch', roleId: FETCH_ROLE }] as const;

  it("takes an event naming a cluster from that cluster's forwarder or a fleet function, and drops every other sender's", async () => {
    const { deps, seen, log } = setup(async () => undefined);
    const checkSender = senderCheckOf({ stage: 'fetch', senderCheck: { functionSenders: [...fetchSends] } }, fleet);
    const res = await makeSqsHandler('fetch', () => ({ ...deps, ...(checkSender ? { checkSender } : {}) }))({
      Records: [
        from('own', objEv('a'), `${PROD_FORWARDER}:eks-prod-eu-1-forwarder-abc`),
        from('fn', objEv('b'), `${FETCH_ROLE}:awslambda_123`),
        from('other', objEv('c'), `${EDGE_FORWARDER}:eks-edge-1-forwarder-xyz`),
        from('none', objEv('d')),
      ],
    });
    // A refused record is not retried: redelivery would not change its sender.
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen.map((s) => s.event.subject)).toEqual(['prod-eu-1/App/default/a', 'prod-eu-1/App/default/b']);
    const refused = log.records.filter((r) => r.obj.outcome === 'refused');
    expect(refused.map((r) => r.obj.clusterId)).toEqual(['prod-eu-1', 'prod-eu-1']);
    expect(refused.map((r) => [r.obj.messageId, r.obj.reason, r.msg])).toEqual([
      ['other', `sender ${EDGE_FORWARDER} is not the forwarder of cluster prod-eu-1`, DROPPED],
      ['none', 'the message has no SenderId', DROPPED],
    ]);
  });

  it('takes from each function only the events it sends, and from a forwarder only object events', async () => {
    const TEMPLATE_ROLE = 'AROATEMPLATEFUNCTION1';
    const DEPLOY_ROLE = 'AROADEPLOYFUNCTION001';
    const { deps, seen, log } = setup(async () => undefined);
    const checkSender = senderCheckOf(
      {
        stage: 'deploy',
        senderCheck: {
          functionSenders: [
            ...fetchSends,
            { stage: 'template', roleId: TEMPLATE_ROLE },
            { stage: 'deploy', roleId: DEPLOY_ROLE },
          ],
        },
      },
      fleet,
    );
    const inspect = (name: string, afterFailure: 'fetch' | 'template') =>
      deployEvent({ object: app(name), run, artifacts: {}, afterFailure }, { time });
    const continued = (name: string) =>
      deployEvent(
        {
          object: app(name),
          run,
          artifacts: { fetchKey: FETCH_KEY, manifestKey: MANIFEST_KEY },
          continuation: { count: 1, deployStartedAt: time },
        },
        { time },
      );
    const res = await makeSqsHandler('deploy', () => ({ ...deps, ...(checkSender ? { checkSender } : {}) }))({
      Records: [
        from('template-deploy', depEv('a'), `${TEMPLATE_ROLE}:s`),
        from('template-inspect', inspect('b', 'template'), `${TEMPLATE_ROLE}:s`),
        from('fetch-inspect', inspect('c', 'fetch'), `${FETCH_ROLE}:s`),
        from('fetch-delete', delEv('d'), `${FETCH_ROLE}:s`),
        from('deploy-continuation', continued('e'), `${DEPLOY_ROLE}:s`),
        // Forged: a manifest to apply from fetch (tenants' sources run there), and the like.
        from('fetch-deploy', depEv('f'), `${FETCH_ROLE}:s`),
        from('fetch-inspect-template', inspect('g', 'template'), `${FETCH_ROLE}:s`),
        from('template-delete', delEv('h'), `${TEMPLATE_ROLE}:s`),
        from('template-continuation', continued('i'), `${TEMPLATE_ROLE}:s`),
        // Its own role: any event of its queue (a postponed copy of a deploy hand-off).
        from('deploy-deploy', depEv('j'), `${DEPLOY_ROLE}:s`),
        from('forwarder-deploy', depEv('k'), `${PROD_FORWARDER}:eks-prod-eu-1-forwarder-abc`),
      ],
    });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen.map((s) => objectRefOf(s.event).name)).toEqual(['a', 'b', 'c', 'd', 'e', 'j']);
    const refused = log.records.filter((r) => r.obj.outcome === 'refused');
    const deploy = 'dev.kapp-lambda.stage.deploy.v1';
    expect(refused.map((r) => [r.obj.messageId, r.obj.reason, r.msg])).toEqual([
      [
        'fetch-deploy',
        `sender ${FETCH_ROLE} is the role of the fetch function, which never sends ${deploy} (deploy)`,
        DROPPED,
      ],
      [
        'fetch-inspect-template',
        `sender ${FETCH_ROLE} is the role of the fetch function, which never sends ${deploy} (inspect after template failure)`,
        DROPPED,
      ],
      [
        'template-delete',
        `sender ${TEMPLATE_ROLE} is the role of the template function, which never sends dev.kapp-lambda.stage.delete.v1 (delete)`,
        DROPPED,
      ],
      [
        'template-continuation',
        `sender ${TEMPLATE_ROLE} is the role of the template function, which never sends ${deploy} (deploy continuation)`,
        DROPPED,
      ],
      [
        'forwarder-deploy',
        `sender ${PROD_FORWARDER} is the forwarder of cluster prod-eu-1, which never sends ${deploy} (deploy)`,
        DROPPED,
      ],
    ]);
    expect(refused.map((r) => r.obj.type)).toEqual([deploy, deploy, 'dev.kapp-lambda.stage.delete.v1', deploy, deploy]);
  });

  it('drops an event naming an unregistered cluster, or a registered one without a forwarder role id, saying which; fails (retries) when the registry cannot be read', async () => {
    const { deps, seen, log } = setup(async () => undefined);
    const ghost = objectEvent({ ...app('x'), clusterId: 'ghost' }, 'modified', { time });
    const unwatched = objectEvent({ ...app('y'), clusterId: 'unwatched' }, 'modified', { time });
    let broken = false;
    const registry = {
      forwarderOf: async (id: string) => {
        if (broken) throw new Error('registry unreadable');
        return forwarderOf(id);
      },
    };
    const checkSender = senderCheckOf({ stage: 'fetch', senderCheck: { functionSenders: [] } }, registry);
    const handler = makeSqsHandler('fetch', () => ({ ...deps, ...(checkSender ? { checkSender } : {}) }));
    const body = (id: string, e: KappEvent, s: string): SqsRecord => ({
      ...record(id, serializeEvent(e)),
      attributes: { MessageGroupId: orderingKey(objectRefOf(e)), SenderId: s },
    });
    expect(await handler({ Records: [body('g', ghost, `${PROD_FORWARDER}:s`)] })).toEqual({ batchItemFailures: [] });
    expect(log.records.at(-1)?.obj).toMatchObject({
      outcome: 'refused',
      clusterId: 'ghost',
      reason: 'cluster ghost is not registered',
    });
    // Its events are lost until the document names the role: the line says so, and how.
    expect(await handler({ Records: [body('u', unwatched, `${PROD_FORWARDER}:s`)] })).toEqual({
      batchItemFailures: [],
    });
    expect(log.records.at(-1)).toMatchObject({
      level: 'warn',
      msg: DROPPED,
      obj: {
        outcome: 'refused',
        clusterId: 'unwatched',
        senderId: `${PROD_FORWARDER}:s`,
        reason:
          'the registry entry of cluster unwatched has no forwarder role id, so no forwarder may send for it (npm run cluster -- add unwatched --replace … --forwarder-role-id <ForwarderRoleId>)',
      },
    });
    broken = true;
    expect(await handler({ Records: [body('p', objEv('p'), `${PROD_FORWARDER}:s`)] })).toEqual({
      batchItemFailures: [{ itemIdentifier: 'p' }],
    });
    expect(log.records.at(-1)?.obj).toMatchObject({ outcome: 'failed', error: 'Error: registry unreadable' });
    expect(seen).toEqual([]);
  });

  it("in a cell, drops an event naming another cluster even from that cluster's forwarder or a fleet function, and takes its own cluster's", async () => {
    const { deps, seen, log } = setup(async () => undefined);
    const asked: string[] = [];
    const registry = {
      forwarderOf: async (id: string) => {
        asked.push(id);
        return forwarderOf(id);
      },
    };
    const checkSender = senderCheckOf(
      { stage: 'fetch', senderCheck: { functionSenders: [...fetchSends], cell: 'prod-eu-1' } },
      registry,
    );
    const edge = (name: string) => objectEvent({ ...app(name), clusterId: 'edge-1' }, 'modified', { time });
    const res = await makeSqsHandler('fetch', () => ({ ...deps, ...(checkSender ? { checkSender } : {}) }))({
      Records: [
        from('own', objEv('a'), `${PROD_FORWARDER}:eks-prod-eu-1-forwarder-abc`),
        from('fn', objEv('b'), `${FETCH_ROLE}:awslambda_123`),
        from('edge-forwarder', edge('c'), `${EDGE_FORWARDER}:eks-edge-1-forwarder-xyz`),
        from('edge-fn', edge('d'), `${FETCH_ROLE}:awslambda_456`),
      ],
    });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen.map((s) => s.event.subject)).toEqual(['prod-eu-1/App/default/a', 'prod-eu-1/App/default/b']);
    const refused = log.records.filter((r) => r.obj.outcome === 'refused');
    expect(refused.map((r) => [r.obj.messageId, r.obj.clusterId, r.obj.reason])).toEqual([
      ['edge-forwarder', 'edge-1', 'this function is the cell of cluster prod-eu-1 and serves no other cluster'],
      ['edge-fn', 'edge-1', 'this function is the cell of cluster prod-eu-1 and serves no other cluster'],
    ]);
    // The other cluster's document is never read (the cell's role may not read it).
    expect(asked).toEqual(['prod-eu-1']);
  });

  it('is off unless configured, and refuses to run configured without the fleet registry', () => {
    expect(senderCheckOf({ stage: 'fetch' }, fleet)).toBeUndefined();
    expect(() => senderCheckOf({ stage: 'fetch', senderCheck: { functionSenders: [] } }, undefined)).toThrow(
      'KAPP_LAMBDA_SENDER_CHECK: registry needs the fleet cluster registry',
    );
  });
});
