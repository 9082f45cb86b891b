/**
 * makeSqsHandler refuses a record whose FIFO message group is not its event's object's ordering
 * key (s19: SQS lets the sender choose MessageGroupId, and the sender check reads only the body),
 * and takes every record the fleet's own senders produce. Stage runner, sender check and logger
 * are faked at their ports.
 */
import { describe, expect, it } from 'vitest';
import {
  deleteEvent,
  deployEvent,
  type KappEvent,
  type ObjectRef,
  objectEvent,
  repoIndexedEvent,
  templateEvent,
} from '../../events/schema.js';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { type EntryDeps, makeSqsHandler, type SqsRecord } from '../../functions/lib/entry/handler.js';
import { senderCheckOf } from '../../functions/lib/entry/lambda.js';
import { messageGroupRefusal } from '../../functions/lib/entry/sender.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryEventSender, sendMessageInput } from '../../functions/lib/transport/index.js';

const ref = (kind: ObjectRef['kind'], name: string, clusterId = 'prod-eu-1'): ObjectRef => ({
  clusterId,
  kind,
  apiVersion: kind === 'App' ? 'kappctrl.k14s.io/v1alpha1' : 'packaging.carvel.dev/v1alpha1',
  namespace: 'default',
  name,
  uid: `uid-${name.slice(0, 40)}`,
  generation: 3,
  resourceVersion: '48213',
});
const time = '2025-01-02T03:04:05.000Z';
const run = { generation: 3, runId: 'r-1', startedAt: time };
const FETCH_KEY = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
const MANIFEST_KEY = `artifacts/template/sha256/${'b'.repeat(64)}.yaml`;
const EDGE_FORWARDER = 'AROAEDGEFORWARDER0001';
const PROD_FORWARDER = 'AROAPRODFORWARDER0001';
/** A fleet function's role id. */
const roleOf = (stage: PipelineStage) => `AROA${stage.toUpperCase().replace('-', '')}FUNCTION`;
const fleet = {
  forwarderOf: async (id: string) => ({ roleId: id === 'edge-1' ? EDGE_FORWARDER : PROD_FORWARDER }),
};

function setup(stage: Parameters<typeof makeSqsHandler>[0], withSenderCheck: boolean) {
  const log = memoryLogger();
  const seen: KappEvent[] = [];
  const checkSender = withSenderCheck
    ? senderCheckOf(
        { stage, senderCheck: { functionSenders: PIPELINE_STAGES.map((s) => ({ stage: s, roleId: roleOf(s) })) } },
        fleet,
      )
    : undefined;
  const deps: EntryDeps = {
    pipeline: { marker: 'pipeline-deps' } as unknown as DispatchDeps,
    sender: new MemoryEventSender(),
    log,
    dispatch: async (event) => {
      seen.push(event);
      return undefined;
    },
    ...(checkSender ? { checkSender } : {}),
  };
  return { handler: makeSqsHandler(stage, () => deps), log, seen };
}

/** `event` as its queue delivers it, with the attributes the fleet's SQS sender gives it. */
function delivered(messageId: string, event: KappEvent, senderRole: string, group?: string | null): SqsRecord {
  const input = sendMessageInput('https://sqs.example/q.fifo', event);
  return {
    messageId,
    body: input.MessageBody ?? '',
    attributes: {
      ...(group === null ? {} : { MessageGroupId: group ?? input.MessageGroupId }),
      ApproximateReceiveCount: '1',
      SenderId: `${senderRole}:s`,
    },
  };
}

describe('message group check', () => {
  it("refuses another cluster's forwarder's event queued in the victim's message group", async () => {
    const { handler, seen, log } = setup('fetch', true);
    const own = objectEvent(ref('App', 'anything', 'edge-1'), 'modified', { time });
    const res = await handler({ Records: [delivered('squat', own, EDGE_FORWARDER, 'prod-eu-1/App/default/web')] });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(seen).toEqual([]);
    const refused = log.records.filter((x) => x.obj.outcome === 'refused');
    expect(refused).toHaveLength(1);
    expect(refused[0]?.obj).toMatchObject({
      messageGroupId: 'prod-eu-1/App/default/web',
      subject: 'edge-1/App/default/anything',
      reason: expect.stringContaining("is not the event's object's (edge-1/App/default/anything)"),
    });
  });

  it('refuses a squatting record even without the sender check', async () => {
    const { handler, seen, log } = setup('fetch', false);
    const ev = objectEvent(ref('App', 'a'), 'modified', { time });
    await handler({ Records: [delivered('m', ev, PROD_FORWARDER, 'prod-eu-1/App/default/b')] });
    expect(seen).toEqual([]);
    expect(log.records.filter((x) => x.obj.outcome === 'refused')).toHaveLength(1);
  });

  it('a record without MessageGroupId is refused only when the sender check is on', async () => {
    const ev = objectEvent(ref('App', 'a'), 'modified', { time });
    const on = setup('fetch', true);
    await on.handler({ Records: [delivered('m', ev, PROD_FORWARDER, null)] });
    expect(on.seen).toEqual([]);
    expect(on.log.records.find((x) => x.obj.outcome === 'refused')?.obj.reason).toBe(
      'the message has no MessageGroupId',
    );
    const off = setup('fetch', false);
    await off.handler({ Records: [delivered('m', ev, PROD_FORWARDER, null)] });
    expect(off.seen.map((e) => e.id)).toEqual([ev.id]);
  });

  const app = ref('App', 'web');
  const repo = ref('PackageRepository', 'repo');
  /** What the fleet sends, each from its sender: a forwarder, or the function that sends it. */
  const legit: [string, Parameters<typeof makeSqsHandler>[0], KappEvent, string][] = [
    ['App object event', 'fetch', objectEvent(app, 'modified', { time }), PROD_FORWARDER],
    [
      'PackageInstall object event',
      'install',
      objectEvent(ref('PackageInstall', 'inst'), 'added', { time }),
      PROD_FORWARDER,
    ],
    ['PackageRepository object event', 'index-repo', objectEvent(repo, 'modified', { time }), PROD_FORWARDER],
    [
      'template hand-off',
      'template',
      templateEvent({ object: app, run, artifacts: { fetchKey: FETCH_KEY } }, { time }),
      roleOf('fetch'),
    ],
    [
      'deploy hand-off',
      'deploy',
      deployEvent({ object: app, run, artifacts: { fetchKey: FETCH_KEY, manifestKey: MANIFEST_KEY } }, { time }),
      roleOf('template'),
    ],
    ['delete hand-off', 'deploy', deleteEvent({ object: app, run }, { time }), roleOf('fetch')],
    [
      'repo.indexed fan-out',
      'install',
      repoIndexedEvent({ object: repo, run, artifacts: {}, changes: [] }, { time }),
      roleOf('index-repo'),
    ],
    [
      'long-named object (hashed key)',
      'fetch',
      objectEvent(ref('App', 'x'.repeat(253)), 'modified', { time }),
      PROD_FORWARDER,
    ],
  ];
  it.each(legit)('takes a %s sent by the fleet', async (_name, stage, event, sender) => {
    const { handler, seen, log } = setup(stage, true);
    await handler({ Records: [delivered('m', event, sender)] });
    expect(log.records.filter((x) => x.obj.outcome === 'refused')).toEqual([]);
    expect(seen.map((e) => e.id)).toEqual([event.id]);
  });

  it('a group check outside the handler: equal, different, absent', () => {
    expect(messageGroupRefusal('c/App/n/a', 'c/App/n/a', true)).toBeUndefined();
    expect(messageGroupRefusal('c/App/n/a', 'c/App/n/b', false)).toMatch(/message group c\/App\/n\/b/);
    expect(messageGroupRefusal('c/App/n/a', undefined, false)).toBeUndefined();
  });
});
