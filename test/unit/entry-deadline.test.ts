/**
 * The function deadline (review R6): a Lambda context with little time left cancels the running
 * tool a margin before the limit; the stage records the cut in status and the record is done;
 * records not started by then go back to the queue. Faked at the ports: the shared fake
 * cluster, a fake runner whose ytt runs until its signal aborts, a memory store and sender.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { objectEvent, serializeEvent, templateEvent } from '../../events/schema.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import type { StageStatusSummary } from '../../functions/lib/api/status.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { CommandDeadlineError, DeadlineError, withDeadline } from '../../functions/lib/exec/deadline.js';
import { FakeCommandRunner, type ScriptedResult } from '../../functions/lib/exec/fake.js';
import { CommandCanceledError, type RunRequest } from '../../functions/lib/exec/runner.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  appObject,
  appWorld,
  finalFailed,
  NOW,
  putFetchArtifact,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('entry-deadline-');
const FETCH_PART: StageStatusSummary = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };
const CUT =
  'Templating dir: Process was canceled: cut by the function deadline (1 s before the time limit of the invocation)';

/** A tool that runs until its signal aborts (10 s safety bound: a passing run never reaches it). */
function untilAborted(seen: AbortSignal[]) {
  return async (req: RunRequest): Promise<ScriptedResult> => {
    if (req.signal) seen.push(req.signal);
    const aborted = await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), 10_000);
      req.signal?.addEventListener('abort', () => {
        clearTimeout(t);
        resolve(true);
      });
    });
    return aborted ? { error: new CommandCanceledError(req.cmd, true, req.signal?.reason) } : { stdout: 'late' };
  };
}

describe('the function deadline of the SQS handler', () => {
  it('cuts the running tool a margin before the limit; the status says so; later records are not started', async () => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    const fetchKey = await putFetchArtifact(w.store, tempDir());
    const seen: AbortSignal[] = [];
    w.runner.on('ytt', untilAborted(seen));
    const sender = new MemoryEventSender();
    const handler = makeSqsHandler('template', () => ({
      pipeline: w.deps,
      sender,
      log: w.log,
      deadlineMarginMs: 1000,
    }));
    const time = { time: new Date(NOW) };
    const tmpl = templateEvent({ object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART }, time);
    const other = templateEvent(
      { object: { ...REF, name: 'other', uid: 'uid-o' }, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART },
      time,
    );
    const records = [tmpl, other].map((e, i) => ({ messageId: `m${i + 1}`, body: serializeEvent(e) }));

    // 3.1 s left: the deadline fires after 2.1 s, 1 s before the limit. (With 100 ms, a loaded
    // machine fired it before the first record's ytt had started: nothing running to cut.)
    const res = await handler({ Records: records }, { awsRequestId: 'r1', getRemainingTimeInMillis: () => 3100 });

    expect(seen).toHaveLength(1);
    expect(seen[0]?.aborted).toBe(true);
    expect(seen[0]?.reason).toBeInstanceOf(DeadlineError);
    expect(w.statuses()).toEqual([
      finalFailed(CUT, CUT, {
        fetch: FETCH_PART,
        template: { exitCode: -1, error: CUT, updatedAt: NOW },
      } as Partial<AppStatus>),
    ]);
    expect(res).toEqual({ batchItemFailures: [{ itemIdentifier: 'm2' }] });
    expect(sender.sent).toEqual([]);
    expect(w.tools()).toEqual(['ytt']);
    const outcomes = w.log.records
      .filter((r) => r.obj.outcome !== undefined)
      .map((r) => [r.obj.messageId, r.obj.outcome]);
    expect(outcomes).toEqual([
      ['m1', 'failed'],
      ['m1', 'done'],
      ['m2', 'deadline'],
    ]);
  });

  it('with time to spare nothing is cut and the next stage is queued', async () => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    w.runner.on('vendir', async (req) => {
      await writeFile(path.join(req.cwd ?? '', 'config.yml'), 'a: 1\n');
      expect(req.signal?.aborted).toBe(false);
      return { stdout: 'lock: vendir\n' };
    });
    const sender = new MemoryEventSender();
    const handler = makeSqsHandler('fetch', () => ({ pipeline: w.deps, sender, log: w.log }));
    const ev = objectEvent(REF, 'added', { time: new Date(NOW) });
    const res = await handler(
      { Records: [{ messageId: 'm1', body: serializeEvent(ev) }] },
      { getRemainingTimeInMillis: () => 15 * 60_000 },
    );
    expect(res).toEqual({ batchItemFailures: [] });
    expect(sender.sent.map((s) => s.event.type)).toEqual(['dev.kapp-lambda.stage.template.v1']);
  });
});

describe('the function deadline with no time left, or no time limit', () => {
  it.each([
    ['no time left: no record starts, every record goes back to the queue', 0, 1000, false],
    ['past the limit: the same', -5, 1000, false],
    ['no time left and a negative margin: the same', 0, -1000, false],
    ['a remaining time that is not a number is no deadline: every record runs uncut', Number.NaN, 1000, true],
  ])('%s', async (_name, remaining, margin, runs) => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    const fetchKey = await putFetchArtifact(w.store, tempDir());
    const aborted: boolean[] = [];
    w.runner.on('ytt', async (req) => {
      await new Promise((resolve) => setTimeout(resolve, 20));
      aborted.push(req.signal?.aborted ?? false);
      return { stdout: 'a: 1\n' };
    });
    const sender = new MemoryEventSender();
    const handler = makeSqsHandler('template', () => ({
      pipeline: w.deps,
      sender,
      log: w.log,
      deadlineMarginMs: margin,
    }));
    const ev = templateEvent(
      { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART },
      { time: new Date(NOW) },
    );
    const records = ['m1', 'm2'].map((messageId) => ({ messageId, body: serializeEvent(ev) }));
    const res = await handler({ Records: records }, { getRemainingTimeInMillis: () => remaining });
    const outcome = runs ? 'forwarded' : 'deadline';
    const recordLines = w.log.records.filter((r) => r.obj.outcome !== undefined && r.msg !== 'stage run');
    expect(recordLines.map((r) => r.obj.outcome)).toEqual([outcome, outcome]);
    expect(res).toEqual({ batchItemFailures: runs ? [] : [{ itemIdentifier: 'm1' }, { itemIdentifier: 'm2' }] });
    // ytt runs for the first record (the second reuses its rendered manifest), never cut.
    expect(aborted).toEqual(runs ? [false] : []);
    expect(w.statuses()).toEqual([]);
    expect(sender.sent.map((e) => e.event.type)).toEqual(runs ? Array(2).fill('dev.kapp-lambda.stage.deploy.v1') : []);
  });
});

describe('withDeadline', () => {
  const canceled = (req: RunRequest): ScriptedResult => ({
    error: new CommandCanceledError(req.cmd, false, req.signal?.reason),
  });

  it('a tool started after the deadline fails as cut by it, naming the margin', async () => {
    const deadline = new AbortController();
    deadline.abort(new DeadlineError(30_000));
    const runner = withDeadline(new FakeCommandRunner().on('kapp', canceled), deadline.signal);
    const run = await runner.run({ cmd: 'kapp', args: ['deploy'] });
    expect(run.error).toBeInstanceOf(CommandDeadlineError);
    expect(run.error?.message).toBe(
      'Already canceled: cut by the function deadline (30 s before the time limit of the invocation)',
    );
  });

  it("a tool canceled by the request's own signal (App canceled) stays a plain cancellation", async () => {
    const deadline = new AbortController();
    const own = new AbortController();
    own.abort(new Error('App canceled or deleted'));
    deadline.abort(new DeadlineError(30_000));
    const runner = withDeadline(new FakeCommandRunner().on('kapp', canceled), deadline.signal);
    const run = await runner.run({ cmd: 'kapp', args: ['deploy'], signal: own.signal });
    expect(run.error?.constructor).toBe(CommandCanceledError);
    expect(run.error?.message).toBe('Already canceled');
  });
});
