/**
 * A deploy longer than one invocation (issue 11 item 6a): the function deadline stops kapp while
 * it waits, the stage writes the progress so far (still `Reconciling`) and the deploy function
 * queues its own continuation, which runs kapp again within what is left of kapp's wait budget
 * and ends the run; a canceled, deleted or changed App stops the continuation. Through the SQS
 * handler (the deadline comes from the Lambda context), faked at the ports: the shared fake
 * cluster, a fake kapp that waits until its signal aborts, a memory store and sender.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { type DeployStageData, type DeployStageEvent, deployEvent, serializeEvent } from '../../events/schema.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import type { StageStatusSummary } from '../../functions/lib/api/status.js';
import { sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import {
  KAPP_DEFAULT_WAIT_TIMEOUT_MS,
  type KappCommand,
  kappWaitTimeoutMs,
  MAX_CONTINUED_WAIT_MS,
  withKappWaitBudget,
} from '../../functions/lib/deploy/kapp.js';
import { KAPP_KILL_GRACE_MS } from '../../functions/lib/deploy/run.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import type { ScriptedResult } from '../../functions/lib/exec/fake.js';
import { CommandCanceledError, type RunRequest } from '../../functions/lib/exec/runner.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { type AppWorld, appObject, appWorld, changeApp, finalSucceeded, NOW, REF, RUN } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('deploy-continue-');
const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
const MANIFEST_KEY = templateArtifactKey(sha256Hex(MANIFEST));
const FETCH_PART: StageStatusSummary = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };
const TEMPLATE_PART: StageStatusSummary = { exitCode: 0, updatedAt: NOW };
const WAITING = '12:00:00AM: ---- waiting on 1 changes [0/1 done] ----\n';
/** A spec change announced the run: the status the template stage left. */
const RECONCILING = {
  observedGeneration: 1,
  conditions: [{ type: 'Reconciling', status: 'True' }],
  friendlyDescription: 'Reconciling',
} as AppStatus;

const DATA: DeployStageData = {
  object: REF,
  run: RUN,
  artifacts: { manifestKey: MANIFEST_KEY },
  fetchStatus: FETCH_PART,
  templateStatus: TEMPLATE_PART,
};

/** kapp printing {@link WAITING}, then waiting until its signal aborts (10 s bound: never reached by a passing run). */
function kappWaitsUntilAborted(kills: RunRequest[]) {
  return async (req: RunRequest): Promise<ScriptedResult> => {
    req.onOutput?.(WAITING, 'stdout');
    const aborted = await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), 10_000);
      req.signal?.addEventListener('abort', () => {
        clearTimeout(t);
        resolve(true);
      });
    });
    if (aborted) kills.push(req);
    return aborted
      ? { stdout: WAITING, error: new CommandCanceledError(req.cmd, true, req.signal?.reason) }
      : { stdout: 'late' };
  };
}

async function world(
  status: AppStatus = RECONCILING,
  opts: { rawOptions?: string[]; maxDeployWaitMs?: number } = {},
): Promise<AppWorld> {
  const w = appWorld({
    app: appObject({
      status,
      ...(opts.rawOptions ? { spec: { deploy: [{ kapp: { rawOptions: opts.rawOptions } }] } } : {}),
    }),
    tmpRoot: path.join(tempDir(), 'scratch'),
    ...(opts.maxDeployWaitMs ? { config: { maxDeployWaitMs: opts.maxDeployWaitMs } } : {}),
  });
  await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
  return w;
}

/** Time left that puts the handler's deadline 2 s away (its margin is 1 s). */
const DEADLINE_IN_2S = 3000;

function deployHandler(w: AppWorld, sender: MemoryEventSender) {
  return makeSqsHandler('deploy', () => ({ pipeline: w.deps, sender, log: w.log, deadlineMarginMs: 1000 }));
}

function record(event: DeployStageEvent) {
  return { Records: [{ messageId: 'm1', body: serializeEvent(event) }] };
}

describe('a deploy the function deadline stops', () => {
  it('writes the progress so far, still Reconciling, and queues its own continuation', async () => {
    const w = await world();
    const kills: RunRequest[] = [];
    w.runner.on('kapp', kappWaitsUntilAborted(kills));
    const sender = new MemoryEventSender();
    // 3 s left: the deadline fires after 2 s, 1 s before the limit (slack for kapp to have
    // started on a loaded machine: a deadline before it would stop no kapp).
    const res = await deployHandler(w, sender)(record(deployEvent(DATA, { time: NOW })), {
      getRemainingTimeInMillis: () => DEADLINE_IN_2S,
    });

    expect(res).toEqual({ batchItemFailures: [] });
    expect(kills).toHaveLength(1);
    // kapp gets SIGTERM first, SIGKILL only after the grace.
    expect(kills[0]?.killGraceMs).toBe(KAPP_KILL_GRACE_MS);
    expect(w.statuses().at(-1)).toEqual({
      ...RECONCILING,
      fetch: FETCH_PART,
      template: TEMPLATE_PART,
      deploy: { finished: false, exitCode: 0, stdout: WAITING.trimEnd(), startedAt: NOW, updatedAt: NOW },
    });
    expect(w.outcomes()).toEqual([['deploy', 'continued']]);
    expect(sender.sent).toHaveLength(1);
    const next = sender.sent[0];
    expect(next?.stage).toBe('deploy');
    expect(next?.event.type).toBe('dev.kapp-lambda.stage.deploy.v1');
    expect(next?.event.source).toBe('/kapp-lambda/functions/deploy');
    expect((next?.event as DeployStageEvent | undefined)?.data).toEqual({
      ...DATA,
      // the receipt's trail counts this invocation: the kapp run the deadline stopped
      receipt: {
        stages: [expect.objectContaining({ stage: 'deploy', tools: [expect.objectContaining({ tool: 'kapp' })] })],
      },
      continuation: { count: 1, deployStartedAt: NOW },
    });
  });

  it('a resync run (not announced) is marked Reconciling while it continues', async () => {
    const succeeded = {
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      friendlyDescription: 'Reconcile succeeded',
      consecutiveReconcileSuccesses: 3,
    } as AppStatus;
    const w = await world(succeeded);
    w.runner.on('kapp', kappWaitsUntilAborted([]));
    const sender = new MemoryEventSender();
    await deployHandler(w, sender)(record(deployEvent(DATA, { time: NOW })), {
      getRemainingTimeInMillis: () => DEADLINE_IN_2S,
    });
    const last = w.statuses().at(-1);
    expect(last?.conditions).toEqual([{ type: 'Reconciling', status: 'True' }]);
    expect(last?.friendlyDescription).toBe('Reconciling');
    expect(last?.consecutiveReconcileSuccesses).toBe(3);
    expect(sender.sent.map((s) => s.stage)).toEqual(['deploy']);
  });
});

describe('the continuation', () => {
  const tenMinutesIn = '2024-12-31T23:50:00Z';
  const continued = (count: number, deployStartedAt = tenMinutesIn) =>
    deployEvent({ ...DATA, continuation: { count, deployStartedAt } }, { time: NOW });

  it("runs kapp again with what is left of its wait budget and ends the run with the first kapp's start", async () => {
    const w = await world();
    w.runner.on('kapp', { stdout: 'Succeeded' });
    const sender = new MemoryEventSender();
    const res = await deployHandler(w, sender)(record(continued(1)), { getRemainingTimeInMillis: () => 900_000 });

    expect(res).toEqual({ batchItemFailures: [] });
    const args = w.runner.calls[0]?.args ?? [];
    // kapp's default 15 m, 10 m of it spent: the last --wait-timeout wins in kapp.
    expect(args.filter((a) => a.startsWith('--wait-timeout='))).toEqual(['--wait-timeout=5m0s']);
    expect(w.statuses()).toEqual([
      finalSucceeded({
        fetch: FETCH_PART,
        template: TEMPLATE_PART,
        deploy: { finished: true, exitCode: 0, stdout: 'Succeeded', startedAt: tenMinutesIn, updatedAt: NOW },
      } as Partial<AppStatus>),
    ]);
    expect(w.outcomes()).toEqual([['deploy', 'succeeded']]);
    expect(sender.sent).toEqual([]);
  });

  // kapp v0.64's own words when its wait runs out.
  const TIMED_OUT = 'kapp: Error: Timed out waiting after 1s for resources: [deployment/web (apps/v1) namespace: ns]\n';

  it("an App's unlimited wait is cut at the fleet's maximum, and the status says so", async () => {
    const w = await world(RECONCILING, { rawOptions: ['--wait-timeout=0s'], maxDeployWaitMs: 10 * 60_000 });
    w.runner.on('kapp', { stderr: TIMED_OUT, exitCode: 1 });
    await deployHandler(w, new MemoryEventSender())(record(continued(1)), { getRemainingTimeInMillis: () => 900_000 });
    const args = w.runner.calls[0]?.args ?? [];
    // ten minutes spent of the fleet's ten: kapp's last chance, 1 s
    expect(args.filter((a) => a.startsWith('--wait-timeout=')).at(-1)).toBe('--wait-timeout=1s');
    const last = w.statuses().at(-1);
    expect(last?.conditions?.[0]?.type).toBe('ReconcileFailed');
    expect(last?.usefulErrorMessage).toBe(
      `${TIMED_OUT}kapp-lambda: the deploy's wait was cut at the fleet's maximum of 10m0s in all (KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS); the App's --wait-timeout asks for longer`,
    );
  });

  it("a first kapp asking to wait longer than the fleet's maximum is cut there already, and the status says so", async () => {
    const w = await world(RECONCILING, { rawOptions: ['--wait-timeout=180s'], maxDeployWaitMs: 5000 });
    w.runner.on('kapp', { stderr: TIMED_OUT, exitCode: 1 });
    // 900 s left: without the cut the first kapp would wait its 180 s, then to the deadline
    await deployHandler(w, new MemoryEventSender())(record(deployEvent(DATA, { time: NOW })), {
      getRemainingTimeInMillis: () => 900_000,
    });
    const args = w.runner.calls[0]?.args ?? [];
    expect(args.filter((a) => a.startsWith('--wait-timeout=')).at(-1)).toBe('--wait-timeout=5s');
    expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(
      `${TIMED_OUT}kapp-lambda: the deploy's wait was cut at the fleet's maximum of 5s in all (KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS); the App's --wait-timeout asks for longer`,
    );
  });

  it("a first kapp within the fleet's maximum keeps the App's own wait", async () => {
    const w = await world(RECONCILING, { rawOptions: ['--wait-timeout=4s'], maxDeployWaitMs: 5000 });
    w.runner.on('kapp', { stdout: 'ok' });
    await deployHandler(w, new MemoryEventSender())(record(deployEvent(DATA, { time: NOW })), {
      getRemainingTimeInMillis: () => 900_000,
    });
    expect((w.runner.calls[0]?.args ?? []).filter((a) => a.startsWith('--wait-timeout='))).toEqual([
      '--wait-timeout=4s',
    ]);
  });

  it("a wait within the fleet's maximum times out with kapp's words alone", async () => {
    const w = await world(RECONCILING, { rawOptions: ['--wait-timeout=10m'], maxDeployWaitMs: 60 * 60_000 });
    w.runner.on('kapp', { stderr: TIMED_OUT, exitCode: 1 });
    await deployHandler(w, new MemoryEventSender())(record(continued(1)), { getRemainingTimeInMillis: () => 900_000 });
    expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(TIMED_OUT.trimEnd());
  });

  it('cut again: continues with the next count, keeping the first start', async () => {
    const w = await world();
    w.runner.on('kapp', kappWaitsUntilAborted([]));
    const sender = new MemoryEventSender();
    await deployHandler(w, sender)(record(continued(3)), { getRemainingTimeInMillis: () => DEADLINE_IN_2S });
    expect((sender.sent[0]?.event as DeployStageEvent | undefined)?.data.continuation).toEqual({
      count: 4,
      deployStartedAt: tenMinutesIn,
    });
    expect(w.statuses().at(-1)?.deploy?.startedAt).toBe(tenMinutesIn);
  });

  it("the App canceled meanwhile: ends without kapp as upstream's cancel of the waiting kapp does (ReconcileFailed, Process was canceled)", async () => {
    const progress = {
      finished: false,
      exitCode: 0,
      stdout: WAITING.trimEnd(),
      startedAt: tenMinutesIn,
      updatedAt: NOW,
    };
    const w = await world({
      ...RECONCILING,
      fetch: FETCH_PART,
      template: TEMPLATE_PART,
      deploy: progress,
    } as AppStatus);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    changeApp(w, 'canceled');
    const sender = new MemoryEventSender();
    const res = await deployHandler(w, sender)(record(continued(1)), { getRemainingTimeInMillis: () => 900_000 });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(w.tools()).toEqual([]);
    const message = 'Deploying: Process was canceled';
    expect(w.statuses()).toEqual([
      expect.objectContaining({
        observedGeneration: 1,
        conditions: [{ type: 'ReconcileFailed', status: 'True', message }],
        friendlyDescription: `Reconcile failed: ${message}`,
        fetch: FETCH_PART,
        template: TEMPLATE_PART,
        deploy: { ...progress, finished: true, exitCode: -1, error: message },
      }),
    ]);
    expect(w.outcomes()).toEqual([['deploy', 'failed']]);
    expect(sender.sent).toEqual([]);
  });

  it('the App paused meanwhile: kapp goes on (upstream: paused does not stop a running reconcile), the result is marked Canceled/paused', async () => {
    const w = await world();
    w.runner.on('kapp', { stdout: 'Succeeded' });
    changeApp(w, 'paused');
    const sender = new MemoryEventSender();
    const res = await deployHandler(w, sender)(record(continued(1)), { getRemainingTimeInMillis: () => 900_000 });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(w.tools()).toEqual(['kapp']);
    const last = w.statuses().at(-1);
    expect(last?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(last).toMatchObject({ observedGeneration: 2, friendlyDescription: 'Canceled/paused' });
    expect(sender.sent).toEqual([]);
  });

  it.each([
    ['generation', 'stale'],
    ['deleted', 'gone'],
  ] as const)('the App %s meanwhile: stops without kapp, nothing queued (%s)', async (change, outcome) => {
    const w = await world();
    w.runner.on('kapp', { stdout: 'Succeeded' });
    changeApp(w, change);
    const sender = new MemoryEventSender();
    const res = await deployHandler(w, sender)(record(continued(1)), { getRemainingTimeInMillis: () => 900_000 });
    expect(res).toEqual({ batchItemFailures: [] });
    expect(w.tools()).toEqual([]);
    expect(w.statuses()).toEqual([]);
    expect(w.outcomes()).toEqual([['deploy', outcome]]);
    expect(sender.sent).toEqual([]);
  });
});

describe("kapp's wait budget", () => {
  const cmd = (...raw: string[]): KappCommand => ({
    bin: 'kapp',
    args: ['deploy', '-f', '-', ...raw, '--app', 'a.app', '--yes'],
    env: {},
    sensitiveEnv: [],
  });

  it.each([
    ['kapp default', [], KAPP_DEFAULT_WAIT_TIMEOUT_MS],
    ['the last of several raw options', ['--wait-timeout=1h', '--wait-timeout=30m'], 30 * 60_000],
    ['0s: no limit', ['--wait-timeout=0s'], undefined],
    ['unparsable (kapp rejects it itself)', ['--wait-timeout=soon'], undefined],
  ])('%s', (_name, raw, ms) => {
    expect(kappWaitTimeoutMs(cmd(...raw))).toBe(ms);
  });

  it('appends what is left, at least 1 s, of at most MAX_CONTINUED_WAIT_MS in all', () => {
    const last = (b: ReturnType<typeof withKappWaitBudget>) => [b.cmd.args.at(-1), b.capped];
    expect(last(withKappWaitBudget(cmd('--wait-timeout=30m'), 20 * 60_000))).toEqual(['--wait-timeout=10m0s', false]);
    expect(last(withKappWaitBudget(cmd(), 14 * 60_000 + 500))).toEqual(['--wait-timeout=1m0s', false]);
    expect(last(withKappWaitBudget(cmd(), 60 * 60_000))).toEqual(['--wait-timeout=1s', false]);
    // A tenant's unlimited or very long wait would hold the fleet's shared deploy concurrency.
    expect(last(withKappWaitBudget(cmd('--wait-timeout=0s'), 15 * 60_000))).toEqual(['--wait-timeout=45m0s', true]);
    expect(last(withKappWaitBudget(cmd('--wait-timeout=240h'), MAX_CONTINUED_WAIT_MS))).toEqual([
      '--wait-timeout=1s',
      true,
    ]);
    // the fleet's own maximum
    expect(last(withKappWaitBudget(cmd('--wait-timeout=30m'), 5 * 60_000, 20 * 60_000))).toEqual([
      '--wait-timeout=15m0s',
      true,
    ]);
    expect(last(withKappWaitBudget(cmd('--wait-timeout=10m'), 5 * 60_000, 20 * 60_000))).toEqual([
      '--wait-timeout=5m0s',
      false,
    ]);
  });
});
