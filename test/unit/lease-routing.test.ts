/**
 * The run lease's follow-up and the deploy continuation as the CDK stack wires the functions:
 * a function has a queue URL and `sqs:SendMessage` only for `NEXT_STAGES[stage]`, and a queue
 * takes events naming any cluster only from the roles of `functionSenders(stage)` (`NEXT_STAGES`
 * inverted, `infra/aws/stack.ts`); everything else must be the cluster's forwarder. The deploy
 * function ends App runs (follow-up → fetch) and continues its own deploys (→ deploy), template
 * and fetch end runs too (→ fetch): each of those routes must be in `NEXT_STAGES`.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  deployEvent,
  type KappEvent,
  objectEvent,
  objectRefOf,
  orderingKey,
  serializeEvent,
} from '../../events/schema.js';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { NEXT_STAGES } from '../../functions/lib/entry/config.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { senderRefusal } from '../../functions/lib/entry/sender.js';
import { leaseKey, parseLease, RunLeases } from '../../functions/lib/lease/index.js';
import { appObject, appWorld, changeApp, NOW, REF, RUN, SUCCEEDED_BEFORE } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('lease-routing-');
const MANIFEST_BODY = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
// A shared manifest's key is its bytes' digest (deploy refuses one that is not).
const MANIFEST_KEY = templateArtifactKey(sha256Hex(MANIFEST_BODY));
const roleOf = (s: PipelineStage) => `AROA${s.toUpperCase().replace('-', '')}`;
const FORWARDER = 'AROAFORWARDER';
/** `functionSenders` of infra/aws/stack.ts. */
const functionSenders = (stage: PipelineStage) => PIPELINE_STAGES.filter((s) => NEXT_STAGES[s]?.includes(stage));
const checkSenderOf = (stage: PipelineStage) => {
  const policy = {
    functionSenders: new Map(functionSenders(stage).map((s) => [roleOf(s), [s]])),
    forwarderOf: async () => ({ roleId: FORWARDER }),
  };
  return (event: KappEvent, senderId: string | undefined) => senderRefusal(policy, event, senderId);
};
interface Sent {
  from: PipelineStage;
  to: PipelineStage;
  event: KappEvent;
}
/** A function's sender as the stack configures it: queue URLs (and the grant) of NEXT_STAGES only. */
const senderOf = (from: PipelineStage, sent: Sent[]) => ({
  async send(to: PipelineStage, event: KappEvent) {
    if (!NEXT_STAGES[from]?.includes(to)) throw new Error(`no queue configured for the ${to} function`);
    sent.push({ from, to, event });
  },
});
const rec = (event: KappEvent, messageId: string, senderId: string) => ({
  Records: [
    {
      messageId,
      body: serializeEvent(event),
      attributes: { MessageGroupId: orderingKey(objectRefOf(event)), SenderId: `${senderId}:session` },
    },
  ],
});

describe('run lease routes as deployed (NEXT_STAGES, sender check)', () => {
  it('the deploy that ends a run delivers its follow-up to fetch, which takes it', async () => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST_BODY));
    const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
    const sent: Sent[] = [];
    const fn = (stage: PipelineStage) =>
      makeSqsHandler(stage, () => ({
        pipeline: w.deps,
        sender: senderOf(stage, sent),
        log: w.log,
        leases,
        checkSender: checkSenderOf(stage),
      }));
    const deployFn = fn('deploy');
    const fetchFn = fn('fetch');
    let started!: () => void;
    const kappStarted = new Promise<void>((r) => {
      started = r;
    });
    let finish!: () => void;
    const kappMayFinish = new Promise<void>((r) => {
      finish = r;
    });
    w.runner.on('kapp', async () => {
      started();
      await kappMayFinish;
      return { stdout: 'Succeeded' };
    });
    const deploy = deployEvent({ object: REF, run: RUN, artifacts: { manifestKey: MANIFEST_KEY } }, { time: NOW });
    const deploying = deployFn(rec(deploy, 'm1', roleOf('template')));
    await kappStarted;
    changeApp(w, 'generation');
    const changed = objectEvent({ ...REF, generation: 2, resourceVersion: '2' }, 'modified', { time: NOW });
    expect(await fetchFn(rec(changed, 'm2', FORWARDER))).toEqual({ batchItemFailures: [] });
    finish();
    // Before the fix: the deploy function has no fetch queue, the record fails, and the lease
    // stays reserved for a follow-up that was never sent; the retry is then coalesced away.
    expect(await deploying).toEqual({ batchItemFailures: [] });
    expect(sent.map((s) => [s.from, s.to])).toEqual([['deploy', 'fetch']]);
    const followUp = sent[0]!.event;
    expect(parseLease(await w.store.get(leaseKey(REF))).holder).toBe(`event:${followUp.id}`);
    // The fetch queue takes it from the deploy function's role (not refused as a non-forwarder).
    w.runner.on('vendir', async () => ({ stdout: '' }));
    await fetchFn(rec(followUp, 'm3', roleOf('deploy')));
    expect(w.log.records.find((r) => r.obj.messageId === 'm3' && r.obj.outcome)?.obj.outcome).not.toBe('refused');
  });

  it('every function that can end or continue a run may send to (and is taken by) the queue it needs', async () => {
    // end of a run (lease follow-up, an object event → fetch): fetch, template, deploy;
    // the deploy continuation (→ deploy): deploy.
    const routes: [PipelineStage, PipelineStage][] = [
      ['fetch', 'fetch'],
      ['template', 'fetch'],
      ['deploy', 'fetch'],
      ['deploy', 'deploy'],
    ];
    const followUp = objectEvent(REF, 'modified', { time: NOW });
    const continuation = deployEvent(
      {
        object: REF,
        run: RUN,
        artifacts: { manifestKey: MANIFEST_KEY },
        continuation: { count: 1, deployStartedAt: NOW },
      },
      { time: NOW },
    );
    for (const [from, to] of routes) {
      expect(NEXT_STAGES[from] ?? [], `${from} → ${to}: queue URL and SendMessage grant`).toContain(to);
      const event = to === 'fetch' ? followUp : continuation;
      expect(await checkSenderOf(to)(event, `${roleOf(from)}:s`), `${from} → ${to}: sender check`).toBe(undefined);
    }
  });
});
