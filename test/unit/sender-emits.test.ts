/**
 * Which sender may send which event (`EMITS`, `functions/lib/entry/sender.ts`, issue 7): the
 * whole table, event shape by sender; real App runs through the fetch, template and deploy
 * functions (faked at the ports) with the sender check on, every event each function sends
 * delivered to its target with that function's role as `SenderId` and taken there; forged
 * events refused; and a function that would send outside its row failing the send instead.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  deleteEvent,
  deployEvent,
  healthEvent,
  type KappEvent,
  type ObjectRef,
  objectEvent,
  objectRefOf,
  orderingKey,
  repoIndexedEvent,
  serializeEvent,
  targetFunction,
  templateEvent,
} from '../../events/schema.js';
import { Finalizer } from '../../functions/lib/api/constants.js';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { senderCheckOf } from '../../functions/lib/entry/lambda.js';
import {
  EMITS,
  type EventSenderName,
  emitRefusal,
  emittedShape,
  mayEmit,
  sendingAs,
} from '../../functions/lib/entry/sender.js';
import { RunLeases } from '../../functions/lib/lease/index.js';
import { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION } from '../../functions/lib/pipeline/app/receipts.js';
import { buildReceipt, receiptKey } from '../../functions/lib/receipt/receipt.js';
import { type EventSender, MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  appObject,
  appWorld,
  FETCH_PART,
  MANIFEST,
  MANIFEST_KEY,
  NOW,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
  vendirWrites,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('sender-emits-');
const time = NOW;
const FETCH_KEY = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
const FORWARDER = 'AROACLUSTERFORWARDER1';
const roleOf = (s: PipelineStage) => `AROA${s.toUpperCase().replace('-', '')}FUNCTION`;
const ref = (kind: ObjectRef['kind']): ObjectRef => ({
  ...REF,
  kind,
  apiVersion: kind === 'App' ? REF.apiVersion : 'packaging.carvel.dev/v1alpha1',
});

/** One event of every shape, named as the table names it. */
const SHAPES: Record<string, KappEvent> = {
  'object App': objectEvent(ref('App'), 'modified', { time }),
  'object App ref-changed': objectEvent(ref('App'), 'ref-changed', { time }),
  'object PackageInstall': objectEvent(ref('PackageInstall'), 'added', { time }),
  'object PackageInstall ref-changed': objectEvent(ref('PackageInstall'), 'ref-changed', { time }),
  'object PackageRepository': objectEvent(ref('PackageRepository'), 'deleted', { time }),
  'object PackageRepository ref-changed': objectEvent(ref('PackageRepository'), 'ref-changed', { time }),
  template: templateEvent({ object: REF, run: RUN, artifacts: { fetchKey: FETCH_KEY } }, { time }),
  deploy: deployEvent(
    { object: REF, run: RUN, artifacts: { fetchKey: FETCH_KEY, manifestKey: MANIFEST_KEY } },
    { time },
  ),
  'deploy continuation': deployEvent(
    {
      object: REF,
      run: RUN,
      artifacts: { manifestKey: MANIFEST_KEY },
      continuation: { count: 2, deployStartedAt: time },
    },
    { time },
  ),
  rollback: deployEvent(
    { object: REF, run: RUN, artifacts: { manifestKey: MANIFEST_KEY }, rollbackOf: '20250102-030405-000-0a1b2c3d' },
    { time },
  ),
  'inspect after fetch failure': deployEvent(
    { object: REF, run: RUN, artifacts: {}, fetchStatus: FETCH_PART, afterFailure: 'fetch' },
    { time },
  ),
  'inspect after template failure': deployEvent(
    { object: REF, run: RUN, artifacts: { fetchKey: FETCH_KEY }, afterFailure: 'template' },
    { time },
  ),
  delete: deleteEvent({ object: REF, run: RUN }, { time }),
  'repo.indexed': repoIndexedEvent(
    {
      object: ref('PackageRepository'),
      run: RUN,
      artifacts: {},
      changes: [{ refName: 'p.example.com', versions: ['1.0.0'] }],
    },
    { time },
  ),
  health: healthEvent({ object: REF, status: 'True', reason: 'Healthy', unhealthy: [] }, { time }),
};

/** The table, written out (not read from `EMITS`): what each sender's row takes. */
const TAKES: Record<EventSenderName, string[]> = {
  forwarder: [
    'object App',
    'object App ref-changed',
    'object PackageInstall',
    'object PackageInstall ref-changed',
    'object PackageRepository',
    'object PackageRepository ref-changed',
    'health',
  ],
  fetch: ['object App', 'object App ref-changed', 'template', 'rollback', 'inspect after fetch failure', 'delete'],
  template: ['object App', 'object App ref-changed', 'deploy', 'inspect after template failure'],
  deploy: ['object App', 'object App ref-changed', 'deploy continuation'],
  'index-repo': ['object App ref-changed', 'object PackageRepository ref-changed', 'repo.indexed'],
  install: ['object PackageInstall ref-changed'],
};
const SENDERS: EventSenderName[] = ['forwarder', ...PIPELINE_STAGES];

describe('the table of who sends what', () => {
  it.each(SENDERS)('%s: takes exactly its row', (sender) => {
    const taken = Object.entries(SHAPES)
      .filter(([, event]) => mayEmit(sender, event))
      .map(([name]) => name);
    expect(taken).toEqual(TAKES[sender]);
  });

  it('names each event by its shape, and every shape of the table is one of an event', () => {
    for (const [name, event] of Object.entries(SHAPES)) expect(emittedShape(event), name).toBe(name);
    for (const row of Object.values(EMITS)) for (const shape of row) expect(Object.keys(SHAPES)).toContain(shape);
  });

  it('refuses with the sender and the event type named', () => {
    expect(emitRefusal('fetch', SHAPES.deploy!)).toBe(
      'the fetch function never sends dev.kapp-lambda.stage.deploy.v1 (deploy)',
    );
    expect(emitRefusal('forwarder', SHAPES.template!)).toBe(
      'a forwarder never sends dev.kapp-lambda.stage.template.v1 (template)',
    );
    expect(emitRefusal('template', SHAPES.deploy!)).toBeUndefined();
  });
});

describe('the sender check over the table', () => {
  const policy = (
    stage: PipelineStage,
    functionSenders = PIPELINE_STAGES.map((s) => ({ stage: s, roleId: roleOf(s) })),
  ) =>
    senderCheckOf(
      { stage, senderCheck: { functionSenders } },
      { forwarderOf: async (id) => (id === REF.clusterId ? { roleId: FORWARDER } : undefined) },
    )!;

  it('refuses what each role never sends, whatever the queue', async () => {
    // fetch runs tenants' sources: a manifest to apply from it is the forgery issue 7 is about.
    expect(await policy('deploy')(SHAPES.deploy!, `${roleOf('fetch')}:awslambda_1`)).toBe(
      `sender ${roleOf('fetch')} is the role of the fetch function, which never sends dev.kapp-lambda.stage.deploy.v1 (deploy)`,
    );
    expect(await policy('deploy')(SHAPES.deploy!, `${roleOf('template')}:awslambda_1`)).toBeUndefined();
    // template sends deploy hand-offs, not template hand-offs or deletes; deploy sends no template hand-off.
    expect(await policy('template')(SHAPES.template!, `${roleOf('deploy')}:s`)).toMatch(/never sends .*\(template\)$/);
    expect(await policy('deploy')(SHAPES.delete!, `${roleOf('template')}:s`)).toMatch(/never sends .*\(delete\)$/);
    // The forwarder: object events only (here: a fetch hand-off, a repo.indexed).
    expect(await policy('template')(SHAPES.template!, `${FORWARDER}:pod`)).toBe(
      `sender ${FORWARDER} is the forwarder of cluster ${REF.clusterId}, which never sends dev.kapp-lambda.stage.template.v1 (template)`,
    );
    expect(await policy('install')(SHAPES['repo.indexed']!, `${FORWARDER}:pod`)).toMatch(
      /forwarder .*\(repo\.indexed\)$/,
    );
    expect(await policy('install')(SHAPES['object PackageInstall']!, `${FORWARDER}:pod`)).toBeUndefined();
    // install's fan-out is ref-changed only; index-repo sends PackageInstalls nothing but repo.indexed.
    expect(
      await policy('install')(SHAPES['object PackageInstall ref-changed']!, `${roleOf('install')}:s`),
    ).toBeUndefined();
    expect(await policy('install')(SHAPES['object PackageInstall']!, `${roleOf('index-repo')}:s`)).toMatch(
      /never sends/,
    );
    expect(await policy('install')(SHAPES['object PackageInstall ref-changed']!, `${roleOf('index-repo')}:s`)).toMatch(
      /index-repo function, which never sends/,
    );
  });

  it("takes from a function's own role any event of its own queue (its postponed copies), and nothing more", async () => {
    for (const stage of PIPELINE_STAGES) {
      for (const [shape, event] of Object.entries(SHAPES)) {
        const refusal = await policy(stage)(event, `${roleOf(stage)}:s`);
        if (targetFunction(event) === stage) expect(refusal, `${stage} ← ${shape}`).toBeUndefined();
        else if (!TAKES[stage].includes(shape)) expect(refusal, `${stage} ← ${shape}`).toMatch(/never sends/);
      }
    }
    // Template's own copy of a template hand-off, install's of a repo.indexed: taken.
    expect(await policy('template')(SHAPES.template!, `${roleOf('template')}:s`)).toBeUndefined();
    expect(await policy('install')(SHAPES['repo.indexed']!, `${roleOf('install')}:s`)).toBeUndefined();
    // Only its own queue: template's role still may not send the deploy queue a continuation.
    expect(await policy('deploy')(SHAPES['deploy continuation']!, `${roleOf('template')}:s`)).toMatch(
      /template function, which never sends .*\(deploy continuation\)$/,
    );
    // Its own role not named among the queue's senders: nothing from it.
    expect(
      await policy('template', [{ stage: 'fetch', roleId: roleOf('fetch') }])(
        SHAPES.template!,
        `${roleOf('template')}:s`,
      ),
    ).toMatch(/not registered|not the forwarder/);
  });

  it('takes from a role named for two functions what either sends', async () => {
    const shared = 'AROASHAREDFUNCTIONS1';
    const check = policy('deploy', [
      { stage: 'fetch', roleId: shared },
      { stage: 'template', roleId: shared },
    ]);
    expect(await check(SHAPES.deploy!, `${shared}:s`)).toBeUndefined();
    expect(await check(SHAPES.delete!, `${shared}:s`)).toBeUndefined();
    expect(await check(SHAPES['deploy continuation']!, `${shared}:s`)).toBe(
      `sender ${shared} is the role of the fetch and template function, which never sends dev.kapp-lambda.stage.deploy.v1 (deploy continuation)`,
    );
  });
});

interface Sent {
  from: PipelineStage;
  to: PipelineStage;
  event: KappEvent;
}

/**
 * The App functions as deployed: each with the sender check (every function's role named, the
 * cluster's forwarder), the run leases, and a sender recording what it sends; `deliver` runs a
 * record through its target function with the sender's role as `SenderId`, and then everything
 * sent meanwhile, the same way, until nothing is left.
 */
function appFleet(w: ReturnType<typeof appWorld>) {
  const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
  const sent: Sent[] = [];
  const functionSenders = PIPELINE_STAGES.map((s) => ({ stage: s, roleId: roleOf(s) }));
  const fn = (stage: PipelineStage) => {
    const checkSender = senderCheckOf(
      { stage, senderCheck: { functionSenders } },
      { forwarderOf: async () => ({ roleId: FORWARDER }) },
    );
    return makeSqsHandler(stage, () => ({
      pipeline: w.deps,
      sender: { send: async (to: PipelineStage, event: KappEvent) => void sent.push({ from: stage, to, event }) },
      log: w.log,
      leases,
      ...(checkSender ? { checkSender } : {}),
    }));
  };
  const handlers = { fetch: fn('fetch'), template: fn('template'), deploy: fn('deploy') } as Partial<
    Record<PipelineStage, ReturnType<typeof fn>>
  >;
  const deliver = async (to: PipelineStage, event: KappEvent, senderRole: string) => {
    const handler = handlers[to];
    if (!handler) throw new Error(`no ${to} function here`);
    const res = await handler({
      Records: [
        {
          messageId: `m-${event.id}`,
          body: serializeEvent(event),
          attributes: { MessageGroupId: orderingKey(objectRefOf(event)), SenderId: `${senderRole}:s` },
        },
      ],
    });
    expect(res).toEqual({ batchItemFailures: [] });
  };
  return {
    sent,
    /** Delivers the forwarder's `event` and runs the chain it starts. */
    async run(event: KappEvent): Promise<[PipelineStage, PipelineStage, string][]> {
      await deliver('fetch', event, FORWARDER);
      for (let i = 0; i < sent.length; i++) {
        const s = sent[i]!;
        await deliver(s.to, s.event, roleOf(s.from));
      }
      expect(w.log.records.filter((r) => r.obj.outcome === 'refused').map((r) => r.obj.reason)).toEqual([]);
      return sent.map((s) => [s.from, s.to, emittedShape(s.event)]);
    },
  };
}

describe("the App functions' real events, each from its sender's role", () => {
  const world = (app = appObject()) => appWorld({ app, tmpRoot: path.join(tempDir(), 'scratch') });

  it('a run: fetch → template → deploy, every hand-off taken', async () => {
    const w = world();
    w.runner.on('vendir', vendirWrites());
    w.runner.on('ytt', async () => ({ stdout: 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n' }));
    w.runner.on('kapp', async () => ({ stdout: 'Succeeded' }));
    const route = await appFleet(w).run(objectEvent(REF, 'added', { time }));
    expect(route).toEqual([
      ['fetch', 'template', 'template'],
      ['template', 'deploy', 'deploy'],
    ]);
    expect(w.app()?.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
  });

  it('a failed fetch, and a failed template: the inspect after each failure taken from its stage', async () => {
    // Deployed before, kapp inspect asked for: upstream inspects after any failure then
    // (`inspectsAfterFailure`).
    const deployed = {
      ...SUCCEEDED_BEFORE,
      deploy: { exitCode: 0, finished: true, startedAt: NOW, updatedAt: NOW },
    } as typeof SUCCEEDED_BEFORE;
    const shape = { status: deployed, generation: 2, spec: { deploy: [{ kapp: { inspect: {} } }] } };
    const fetchFails = world(appObject(shape));
    fetchFails.runner.on('vendir', async () => ({ stderr: 'no such ref', exitCode: 1 }));
    fetchFails.runner.on('kapp', async () => ({ stdout: 'Succeeded' }));
    expect(await appFleet(fetchFails).run(objectEvent({ ...REF, generation: 2 }, 'modified', { time }))).toEqual([
      ['fetch', 'deploy', 'inspect after fetch failure'],
    ]);
    const templateFails = world(appObject(shape));
    templateFails.runner.on('vendir', vendirWrites());
    templateFails.runner.on('ytt', async () => ({ stderr: 'ytt: Error: bad', exitCode: 1 }));
    templateFails.runner.on('kapp', async () => ({ stdout: 'Succeeded' }));
    expect(await appFleet(templateFails).run(objectEvent({ ...REF, generation: 2 }, 'modified', { time }))).toEqual([
      ['fetch', 'template', 'template'],
      ['template', 'deploy', 'inspect after template failure'],
    ]);
  });

  it('a rollback: fetch hands the receipt render to deploy, taken and applied', async () => {
    const id = '20250101-000000-000-0123abcd';
    const w = world(
      appObject({
        status: SUCCEEDED_BEFORE,
        metadata: { annotations: { [ROLLBACK_TO_ANNOTATION]: id, [ROLLBACK_GENERATION_ANNOTATION]: '1' } },
      }),
    );
    const receipt = buildReceipt({
      owner: REF,
      uid: REF.uid,
      generation: 1,
      runId: 'earlier',
      startedAt: new Date(NOW),
      endedAt: new Date(NOW),
      trail: { stages: [] },
      render: { key: MANIFEST_KEY, digest: MANIFEST_KEY.slice(-69, -5), private: false },
    });
    await w.store.put(receiptKey(REF, id), JSON.stringify({ ...receipt, id }));
    await w.store.put(MANIFEST_KEY, MANIFEST);
    w.runner.on('kapp', async () => ({ stdout: 'Succeeded' }));
    expect(await appFleet(w).run(objectEvent(REF, 'modified', { time }))).toEqual([['fetch', 'deploy', 'rollback']]);
    expect(w.tools()).toEqual(['kapp']);
    expect(w.app()?.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
  });

  it('a deletion: fetch → deploy (delete) taken', async () => {
    const w = world(
      appObject({ status: SUCCEEDED_BEFORE, metadata: { finalizers: [Finalizer.App], deletionTimestamp: NOW } }),
    );
    w.runner.on('kapp', async () => ({ stdout: 'Succeeded' }));
    expect(await appFleet(w).run(objectEvent(REF, 'deleted', { time }))).toEqual([['fetch', 'deploy', 'delete']]);
  });
});

describe('a function that would send outside its row', () => {
  it('fails the send (the record is retried) and sends nothing', async () => {
    const inner = new MemoryEventSender();
    const sender = sendingAs('fetch', inner);
    await expect(sender.send('deploy', SHAPES.deploy!)).rejects.toThrow(
      'the fetch function never sends dev.kapp-lambda.stage.deploy.v1 (deploy)',
    );
    await sender.send('template', SHAPES.template!);
    expect(inner.sent.map((s) => s.event.id)).toEqual([SHAPES.template!.id]);

    // Through the handler: a fetch stage returning a manifest to deploy fails its record.
    const w = appWorld({ app: appObject(), tmpRoot: path.join(tempDir(), 'scratch') });
    const into = new MemoryEventSender();
    const handler = makeSqsHandler('fetch', () => ({
      pipeline: w.deps,
      sender: into,
      log: w.log,
      dispatch: async () => SHAPES.deploy!,
    }));
    const event = SHAPES['object App']!;
    const res = await handler({
      Records: [{ messageId: 'm', body: serializeEvent(event), attributes: { MessageGroupId: orderingKey(REF) } }],
    });
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm' }] });
    expect(into.sent).toEqual([]);
  });

  it('checks every event of a sendMany before sending any, and passes an allowed list through whole', async () => {
    const lists: string[][] = [];
    const inner: EventSender = {
      async send() {
        throw new Error('sendMany expected');
      },
      async sendMany(_stage, events) {
        lists.push(events.map((e) => e.id));
      },
    };
    const sender = sendingAs('fetch', inner);
    await expect(sender.sendMany?.('template', [SHAPES.template!, SHAPES.deploy!])).rejects.toThrow(
      'the fetch function never sends dev.kapp-lambda.stage.deploy.v1 (deploy)',
    );
    expect(lists).toEqual([]);
    await sender.sendMany?.('template', [SHAPES.template!, SHAPES.template!]);
    expect(lists).toEqual([[SHAPES.template!.id, SHAPES.template!.id]]);
    // A sender without sendMany stays without one (sendAll then sends one by one).
    expect(sendingAs('fetch', new MemoryEventSender()).sendMany).toBeUndefined();
  });
});
