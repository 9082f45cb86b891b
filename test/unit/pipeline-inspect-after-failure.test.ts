/**
 * Inspect after a failed fetch or template (reference §3.2: upstream's `reconcileDeploy` runs
 * `inspect()` whenever `status.deploy` exists, whatever stage failed, and writes the failure and
 * `status.inspect` in one final status). The failing stage hands the failure to the deploy
 * function (`afterFailure`), which runs `kapp inspect` only and writes that status. Faked at the
 * ports: the shared fake cluster, the fake runner (vendir, ytt, kapp), a memory store.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { deployEvent, type KappEvent, templateEvent } from '../../events/schema.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { failRunAfterRetries } from '../../functions/lib/pipeline/retry-bound.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  type AppShape,
  type AppWorld,
  appObject,
  appWorld,
  FETCH_PART,
  finalFailed,
  NOW,
  putFetchArtifact,
  RECONCILING,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-inspect-after-');

const VENDIR_FAILED = 'Fetching resources: Error (see .status.usefulErrorMessage for details)';
const YTT_FAILED = 'Templating dir: Error (see .status.usefulErrorMessage for details)';
/** `status.deploy` of an earlier run: it is what makes upstream inspect after any later failure. */
const EARLIER_DEPLOY = { finished: true, exitCode: 0, stdout: 'Succeeded', startedAt: NOW, updatedAt: NOW };
const EARLIER_INSPECT = { exitCode: 0, stdout: 'old inspect', updatedAt: '2024-12-31T00:00:00Z' };
const DEPLOYED_BEFORE = { ...SUCCEEDED_BEFORE, deploy: EARLIER_DEPLOY, inspect: EARLIER_INSPECT } as AppStatus;
const INSPECT_SPEC = { deploy: [{ kapp: { inspect: {} } }] };
const FETCH_FAILED_PART = {
  exitCode: 1,
  stdout: 'partial',
  stderr: 'fatal: repository not found',
  error: VENDIR_FAILED,
  startedAt: NOW,
  updatedAt: NOW,
};
/** The deploy event a fetch that failed after an earlier deploy hands on. */
const AFTER_FETCH = {
  object: REF,
  run: RUN,
  artifacts: {},
  fetchStatus: FETCH_FAILED_PART,
  afterFailure: 'fetch' as const,
};
const NEW_INSPECT = { exitCode: 0, stdout: "Resources in app 'simple-app-ctrl'", updatedAt: NOW };

/** The final status of a run of generation 1 that failed after an earlier success. */
const failedAfter = (before: AppStatus, message: string, useful: string, parts: Partial<AppStatus>) =>
  finalFailed(message, useful, parts, before);

/** The fetch stage of the world's App, as the reconcile step read it (a copy). */
function fetchAsRead(w: AppWorld) {
  const app = structuredClone(w.app()!);
  return runFetch(
    { clusterId: REF.clusterId, ref: REF, run: RUN },
    { raw: structuredClone(app) as never, app },
    w.deps,
  );
}

/** Runs the fetch stage (vendir fails) and then whatever it hands on, as the functions would. */
async function failFetch(shape: AppShape) {
  const w = appWorld({ app: appObject(shape), tmpRoot: path.join(tempDir(), 'scratch') });
  w.runner.on('vendir', { stdout: 'partial', stderr: 'fatal: repository not found', exitCode: 1 });
  w.runner.on('kapp', { stdout: "Resources in app 'simple-app-ctrl'" });
  const out = await fetchAsRead(w);
  const next = out.deploy ? await dispatchEvent(deployEvent(out.deploy, { time: new Date(NOW) }), w.deps) : undefined;
  return { w, out, next };
}

describe('inspect after a failed fetch', () => {
  it('deployed before, inspect asked: the deploy function inspects and writes the one final status', async () => {
    const { w, out, next } = await failFetch({ status: DEPLOYED_BEFORE, spec: INSPECT_SPEC });
    expect(out).toEqual({
      deploy: { object: REF, run: RUN, artifacts: {}, fetchStatus: FETCH_FAILED_PART, afterFailure: 'fetch' },
    });
    expect(next).toBeUndefined();
    // kapp inspect only: no deploy, no finalizer
    expect(w.runner.calls.map((c) => [c.cmd, c.args[0]])).toEqual([
      ['vendir', 'sync'],
      ['kapp', 'inspect'],
    ]);
    expect(w.app()?.metadata.finalizers ?? []).toEqual([]);
    expect(w.statuses()).toEqual([
      failedAfter(DEPLOYED_BEFORE, VENDIR_FAILED, 'fatal: repository not found', {
        fetch: FETCH_FAILED_PART,
        inspect: NEW_INSPECT,
      }),
    ]);
    expect(w.outcomes()).toEqual([
      ['fetch', 'failed'],
      ['deploy', 'failed'],
    ]);
  });

  it('the final status is the one the fetch stage writes itself, plus the new inspect', async () => {
    const handed = await failFetch({ status: DEPLOYED_BEFORE, spec: INSPECT_SPEC });
    // without an earlier deploy the fetch stage ends the run itself, as before
    const own = await failFetch({ status: { ...DEPLOYED_BEFORE, deploy: undefined }, spec: INSPECT_SPEC });
    expect(own.out).toEqual({});
    expect(own.w.tools()).toEqual(['vendir']);
    const [viaDeploy] = handed.w.statuses();
    const [viaFetch] = own.w.statuses();
    expect({ ...viaDeploy, deploy: undefined, inspect: undefined }).toEqual({ ...viaFetch, inspect: undefined });
  });

  it('Reconciling (spec changed): the fetch part is written at once, the final status by the deploy function', async () => {
    const before = { ...RECONCILING, deploy: EARLIER_DEPLOY } as AppStatus;
    const { w } = await failFetch({ status: before, spec: INSPECT_SPEC });
    expect(w.statuses()).toEqual([
      { ...before, fetch: FETCH_FAILED_PART },
      failedAfter(before, VENDIR_FAILED, 'fatal: repository not found', {
        fetch: FETCH_FAILED_PART,
        inspect: NEW_INSPECT,
      }),
    ]);
  });

  it('deployed before, inspect not asked: the fetch stage ends the run (status.inspect kept, no kapp)', async () => {
    const { w, out } = await failFetch({ status: DEPLOYED_BEFORE });
    expect(out).toEqual({});
    expect(w.tools()).toEqual(['vendir']);
    expect(w.statuses()).toEqual([
      failedAfter(DEPLOYED_BEFORE, VENDIR_FAILED, 'fatal: repository not found', { fetch: FETCH_FAILED_PART }),
    ]);
  });

  it('two deploy entries: inspect fails with the entry error, no kapp (upstream checks the entry first)', async () => {
    const spec = { deploy: [{ kapp: {} }, { kapp: {} }] };
    const { w, out } = await failFetch({ status: DEPLOYED_BEFORE, spec });
    expect(out.deploy?.afterFailure).toBe('fetch');
    expect(w.tools()).toEqual(['vendir']);
    expect(w.statuses().at(-1)?.inspect).toEqual({
      exitCode: -1,
      error: 'Expected exactly one deploy option',
      updatedAt: NOW,
    });
    expect(w.statuses().at(-1)?.conditions?.[0]?.message).toBe(VENDIR_FAILED);
  });

  it('kapp inspect fails: status.inspect says so, the run still fails with the fetch error', async () => {
    const w = appWorld({ app: appObject({ status: DEPLOYED_BEFORE, spec: INSPECT_SPEC }), tmpRoot: tempDir() });
    w.runner.on('kapp', { stderr: 'kapp: Error: app not found', exitCode: 1 });
    const data = AFTER_FETCH;
    await dispatchEvent(deployEvent(data, { time: new Date(NOW) }), w.deps);
    const last = w.statuses().at(-1);
    expect(last?.inspect).toMatchObject({ exitCode: 1, stderr: 'kapp: Error: app not found' });
    expect(last?.inspect?.error).toMatch(/^Inspecting: /);
    expect(last?.conditions?.[0]?.message).toBe(VENDIR_FAILED);
    expect(last?.usefulErrorMessage).toBe('fatal: repository not found');
  });

  it('the App changed meanwhile: the inspect stage stops (stale), nothing runs or is written', async () => {
    const w = appWorld({
      app: appObject({ generation: 2, status: DEPLOYED_BEFORE, spec: INSPECT_SPEC }),
      tmpRoot: tempDir(),
    });
    const data = AFTER_FETCH;
    await dispatchEvent(deployEvent(data, { time: new Date(NOW) }), w.deps);
    expect(w.tools()).toEqual([]);
    expect(w.statuses()).toEqual([]);
  });

  it('a stored part longer than an event carries is the failure the final status reports', async () => {
    const long = `${'x'.repeat(40 * 1024)}\nfatal: the end`;
    const w = appWorld({
      app: appObject({ status: { ...DEPLOYED_BEFORE, conditions: RECONCILING.conditions }, spec: INSPECT_SPEC }),
      tmpRoot: path.join(tempDir(), 'scratch'),
    });
    w.runner.on('vendir', { stderr: long, exitCode: 1 });
    w.runner.on('kapp', { stdout: 'ok' });
    const out = await fetchAsRead(w);
    expect(out.deploy?.fetchStatus?.stderr?.length).toBeLessThan(long.length);
    await dispatchEvent(deployEvent(out.deploy!, { time: new Date(NOW) }), w.deps);
    const last = w.statuses().at(-1);
    expect(last?.usefulErrorMessage).toBe(long);
    expect(last?.fetch?.stderr).toBe(long);
  });

  it('the inspect stage keeps failing on infrastructure: the fetch failure is the status, inspect names the cause', async () => {
    const w = appWorld({ app: appObject({ status: DEPLOYED_BEFORE, spec: INSPECT_SPEC }), tmpRoot: tempDir() });
    const data = AFTER_FETCH;
    const outcome = await failRunAfterRetries(
      deployEvent(data, { time: new Date(NOW) }) as KappEvent,
      new Error('token request failed'),
      w.deps,
    );
    expect(outcome).toBe('written');
    expect(w.statuses()).toEqual([
      failedAfter(DEPLOYED_BEFORE, VENDIR_FAILED, 'fatal: repository not found', {
        fetch: FETCH_FAILED_PART,
        inspect: { exitCode: -1, error: expect.stringMatching(/^Inspecting: /), updatedAt: NOW },
      }),
    ]);
  });
});

describe('inspect after a failed template', () => {
  it('ytt fails after an earlier deploy: the deploy function inspects; fetch and template parts as the run left them', async () => {
    const store = new MemoryStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const w = appWorld({
      app: appObject({ status: DEPLOYED_BEFORE, spec: INSPECT_SPEC }),
      store,
      tmpRoot: path.join(tempDir(), 'scratch'),
    });
    w.runner.on('ytt', { stderr: 'ytt: Error: boom', exitCode: 1 });
    w.runner.on('kapp', { stdout: "Resources in app 'simple-app-ctrl'" });
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART };
    const next = await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
    expect(next?.type).toBe('dev.kapp-lambda.stage.deploy.v1');
    const templatePart = { exitCode: 1, stderr: 'ytt: Error: boom', error: YTT_FAILED, updatedAt: NOW };
    expect(next?.data).toEqual({ ...data, templateStatus: templatePart, afterFailure: 'template' });
    expect(w.statuses()).toEqual([]);
    await dispatchEvent(next!, w.deps);
    expect(w.tools()).toEqual(['ytt', 'kapp']);
    expect(w.statuses()).toEqual([
      failedAfter(DEPLOYED_BEFORE, YTT_FAILED, 'ytt: Error: boom', {
        fetch: FETCH_PART,
        template: templatePart,
        inspect: NEW_INSPECT,
      }),
    ]);
  });
});
