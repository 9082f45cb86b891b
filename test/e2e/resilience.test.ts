/**
 * e2e: the pipeline survives what a serverless deployment sees: a function crashing mid-run
 * (retried from the crashed stage, not from fetch), the forwarder and functions restarting
 * while the App changes (no change lost), and two quick updates (the newest generation wins,
 * a stale run never overwrites its status).
 */
import { afterAll, describe, expect, it } from 'vitest';
import type { EmbeddedOptions } from '../../functions/embedded/runtime.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import {
  apply,
  appManifest,
  expectSucceeded,
  getApp,
  getObject,
  inlineConfigMapApp,
  pendingDeployment,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = {
  crash: `e2e-res-crash-${id}`,
  restart: `e2e-res-restart-${id}`,
  quick: `e2e-res-quick-${id}`,
  cancel: `e2e-res-cancel-${id}`,
};

/** The tools the template function may run (`layers/tools.ts`). */
const TEMPLATE_TOOLS = new Set(STAGE_TOOLS.template);

/** One-shot crash of the next template-stage tool run, armed by a test. */
const crash = { armed: false, thrown: 0, tool: '' };

/** Wraps the command runner so that, when armed, the next template tool run throws once. */
function crashingDeps(deps: DispatchDeps): DispatchDeps {
  return {
    ...deps,
    runner: {
      async run(req) {
        if (crash.armed && TEMPLATE_TOOLS.has(req.cmd)) {
          crash.armed = false;
          crash.thrown++;
          crash.tool = req.cmd;
          throw new Error('injected crash in the template stage');
        }
        return await deps.runner.run(req);
      },
    },
  };
}

const runtimeOptions: Partial<EmbeddedOptions> = { wrapDeps: crashingDeps };

const rt = useE2ERuntime(Object.values(NS), { overrides: runtimeOptions });

afterAll(() => {
  crash.armed = false;
});

const greetingOf = async (ns: string, name: string) =>
  (await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`))?.data?.greeting;

describe('resilience', () => {
  it('a function crashing in the template stage is retried from that stage to success', async () => {
    const ns = NS.crash;
    const name = `crash-${id}`;
    crash.armed = true;
    await apply(inlineConfigMapApp(ns, name, `survived a crash ${id}`));
    const app = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded after the crash');
    await expectSucceeded(app);
    expect(crash).toEqual({ armed: false, thrown: 1, tool: 'ytt' });
    expect(await greetingOf(ns, name)).toBe(`survived a crash ${id}`);

    // the crash was logged with the object and retried ...
    const crashes = rt.logsFor(ns, name).filter((r) => r.msg === 'stage crashed; retrying');
    expect(crashes).toHaveLength(1);
    expect(crashes[0]!.level).toBe('error');
    expect(crashes[0]!.obj).toMatchObject({ attempt: 0, error: 'injected crash in the template stage' });
    // ... from the template stage: fetch ran once, template finished once, deploy once
    const runs = rt.stageRuns(ns, name).map((r) => `${r.stage}:${r.outcome}`);
    expect(runs.filter((r) => r.startsWith('fetch:'))).toEqual(['fetch:succeeded']);
    expect(runs.filter((r) => r.startsWith('template:'))).toEqual(['template:succeeded']);
    expect(runs.filter((r) => r.startsWith('deploy:'))).toEqual(['deploy:succeeded']);
    expect(app.status?.consecutiveReconcileSuccesses).toBe(1);
  });

  it('a forwarder restart loses no change: a spec updated while nothing runs is reconciled after start', async () => {
    const ns = NS.restart;
    const name = `restart-${id}`;
    await apply(inlineConfigMapApp(ns, name, 'before restart'));
    await expectSucceeded(await rt.waitForApp(ns, name, succeededAt(1), 'generation 1 reconciled'));

    await rt.stop();
    await apply(inlineConfigMapApp(ns, name, 'changed while stopped'));
    const stopped = await getApp(ns, name);
    expect(stopped?.metadata.generation).toBe(2);
    expect(stopped?.status?.observedGeneration).toBe(1);
    expect(await greetingOf(ns, name)).toBe('before restart');

    const before = rt.stageRuns(ns, name).length;
    rt.restart();
    const app = await rt.waitForApp(ns, name, succeededAt(2), 'generation 2 reconciled by the new runtime');
    await expectSucceeded(app);
    expect(await greetingOf(ns, name)).toBe('changed while stopped');
    const after = rt.stageRuns(ns, name).slice(before);
    expect(after.filter((r) => r.stage === 'deploy').map((r) => [r.generation, r.outcome])).toEqual([[2, 'succeeded']]);
  });

  it('canceling an App while kapp waits kills kapp and ends in ReconcileFailed (kapp-controller cancel_test.go)', async () => {
    const ns = NS.cancel;
    const name = `cancel-${id}`;
    // A Deployment that can never become available (no node matches), so kapp keeps waiting.
    const deployment = pendingDeployment(`${name}-stuck`, name, 'kapp-lambda.test/no-such-node');
    const spec = {
      fetch: [{ inline: { paths: { 'deployment.yml': deployment } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: { rawOptions: ['--wait-timeout=120s'] } }],
    };
    await apply({ ...appManifest(ns, name, spec) });
    await waitFor('kapp to create the Deployment', async () =>
      (await getObject('deployment', ns, `${name}-stuck`)) ? true : undefined,
    );
    await apply({ ...appManifest(ns, name, { ...spec, canceled: true }) });
    const app = await rt.waitForApp(
      ns,
      name,
      (a) =>
        a.status?.observedGeneration === 2 &&
        (a.status?.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false) &&
        a.status?.friendlyDescription === 'Canceled/paused',
      'ReconcileFailed after the cancel',
    );
    expect(app.status?.conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: 'Deploying: Process was canceled' },
    ]);
    expect(app.status?.deploy).toMatchObject({
      exitCode: -1,
      finished: true,
      error: 'Deploying: Process was canceled',
    });
    expect(app.status?.usefulErrorMessage).toBeDefined();
  });

  it('two quick updates end with the status and resources of the newest generation', async () => {
    const ns = NS.quick;
    const name = `quick-${id}`;
    await apply(inlineConfigMapApp(ns, name, 'v1'));
    await rt.waitForApp(ns, name, succeededAt(1), 'generation 1 reconciled');

    await apply(inlineConfigMapApp(ns, name, 'v2'));
    await apply(inlineConfigMapApp(ns, name, 'v3'));
    const app = await rt.waitForApp(ns, name, succeededAt(3), 'generation 3 reconciled');
    await expectSucceeded(app);
    expect(await greetingOf(ns, name)).toBe('v3');

    // nothing left to run: the final status still belongs to generation 3 (no stale overwrite)
    await rt.runtime.pipeline.idle();
    const settled = await getApp(ns, name);
    expect(settled?.metadata.generation).toBe(3);
    await expectSucceeded(settled!);
    expect(await greetingOf(ns, name)).toBe('v3');
    // no deploy for an older generation finished after generation 3's
    const deploys = rt.stageRuns(ns, name).filter((r) => r.stage === 'deploy' && r.outcome === 'succeeded');
    expect(deploys.at(-1)?.generation).toBe(3);
  });
});
