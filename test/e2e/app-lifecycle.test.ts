/**
 * e2e: App lifecycle rows of reference §3.8.4, §3.9 and §3.10 that the other e2e files do not
 * run, through the whole flow with the real kapp and the status kapp-controller writes asserted:
 *
 * - `inspect: {}`: `status.inspect` after a successful deploy (`kapp inspect` output with
 *   `Resources in app '<N>.app'`), and after the next deploy failed (upstream's inspect runs
 *   after every deploy attempt: a fresh inspect of what is still deployed), and after later
 *   fetch and template failures (it runs whenever `status.deploy` exists);
 * - progress in `status.deploy` while kapp waits (`Reconciling`, unfinished, kapp's output so
 *   far), then deleting the App while kapp still waits: the deploy is canceled, `kapp delete`
 *   runs, the resources and the App go away (upstream `delete_test.go`);
 * - `--prev-app <N>-ctrl`: a kapp app of that name deployed beforehand with the real kapp is
 *   taken over by the App (kapp renames its record to `<N>.app`), its objects kept, not recreated.
 */
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { toolBin } from '../harness/fixtures.js';
import { type KubectlResult, kubectl } from '../harness/kube.js';
import {
  APP_FINALIZER,
  apply,
  appManifest,
  expectFailed,
  expectSucceeded,
  failedAt,
  getApp,
  getObject,
  kubeconfigPath,
  pendingDeployment,
  RFC3339,
  SEE_USEFUL,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-life-${id}`;

const rt = useE2ERuntime([NS]);

/** The real kapp as a user runs it (`kapp --kubeconfig <admin> <args>`); never throws on exit. */
async function kapp(args: string[], input?: string): Promise<KubectlResult> {
  return await kubectl(kubeconfigPath, args, { kubectl: toolBin('kapp'), input, check: false, timeoutMs: 240_000 });
}

/** A ConfigMap document (YAML) with `data`, optionally in `namespace`. */
function configMapYaml(name: string, data: Record<string, string>, namespace?: string): string {
  return stringify({
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name, ...(namespace ? { namespace } : {}) },
    data,
  });
}

/** An inline-fetch + ytt App deploying `files` with `kapp` options. */
function inlineApp(name: string, files: Record<string, string>, kapp: Record<string, unknown> = {}): object {
  return appManifest(NS, name, {
    fetch: [{ inline: { paths: files } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp }],
  });
}

interface Meta {
  metadata: { uid: string; resourceVersion: string };
}

describe.concurrent('App lifecycle with the real kapp', () => {
  it('inspect: status.inspect after a successful deploy, refreshed after a failed deploy, fetch and template', async () => {
    const name = `inspect-${id}`;
    const ok = { 'cm.yml': configMapYaml(`${name}-config`, { v: 'one' }) };
    await apply(inlineApp(name, ok, { inspect: {} }));
    const first = await rt.waitForApp(NS, name, succeededAt(1), 'generation 1 succeeded');
    // expectSucceeded expects no inspect: check the rest of the shape by hand
    const s1 = first.status ?? {};
    expect(s1.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(s1.deploy?.exitCode).toBe(0);
    expect(Object.keys(s1.inspect ?? {}).sort()).toEqual(['exitCode', 'stdout', 'updatedAt']);
    expect(s1.inspect?.exitCode).toBe(0);
    expect(s1.inspect?.updatedAt).toMatch(RFC3339);
    expect(s1.inspect?.stdout).toContain(`Resources in app '${name}.app'`);
    expect(s1.inspect?.stdout).toContain(`${name}-config`);
    expect((s1.inspect?.updatedAt ?? '') >= (s1.deploy?.updatedAt ?? '~')).toBe(true);
    // WithFriendlyYAMLStrings: trimmed, no whitespace before a newline
    expect(s1.inspect?.stdout).toBe(s1.inspect?.stdout?.trim());
    expect(s1.inspect?.stdout).not.toMatch(/[ \t]+\n/);

    // The next deploy fails in kapp (a resource in a namespace that does not exist).
    const missing = `e2e-life-missing-${id}`;
    await apply(
      inlineApp(name, { ...ok, 'bad.yml': configMapYaml(`${name}-bad`, { v: 'x' }, missing) }, { inspect: {} }),
    );
    const failed = await rt.waitForApp(NS, name, failedAt(2), 'generation 2 failed');
    expectFailed(failed, `Deploying: ${SEE_USEFUL}`);
    const s2 = failed.status ?? {};
    expect(s2.deploy).toMatchObject({ exitCode: 1, finished: true, error: `Deploying: ${SEE_USEFUL}` });
    expect(s2.usefulErrorMessage).toContain(missing);
    // inspect ran after the failed attempt: what the app still holds, listed afresh
    expect(Object.keys(s2.inspect ?? {}).sort()).toEqual(['exitCode', 'stdout', 'updatedAt']);
    expect(s2.inspect?.exitCode).toBe(0);
    expect(s2.inspect?.stdout).toContain(`Resources in app '${name}.app'`);
    expect(s2.inspect?.stdout).toContain(`${name}-config`);
    expect(s2.inspect?.stdout).not.toContain(`${name}-bad`);
    expect((s2.inspect?.updatedAt ?? '') >= (s2.deploy?.updatedAt ?? '~')).toBe(true);
    expect((s2.inspect?.updatedAt ?? '') >= (s1.inspect?.updatedAt ?? '~')).toBe(true);

    // A later fetch failure (upstream inspects whenever status.deploy exists, reference §3.2):
    // status.inspect is listed afresh, status.deploy stays the last attempt's.
    const missingSecret = `no-such-secret-${id}`;
    await apply(
      appManifest(NS, name, {
        fetch: [{ inline: { paths: ok, pathsFrom: [{ secretRef: { name: missingSecret } }] } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: { inspect: {} } }],
      }),
    );
    const fetchFailed = await rt.waitForApp(NS, name, failedAt(3), 'generation 3 failed at fetch');
    const fetchMessage = `Fetching: secrets "${missingSecret}" not found`;
    expectFailed(fetchFailed, fetchMessage);
    const s3 = fetchFailed.status ?? {};
    expect(s3.usefulErrorMessage).toBe(fetchMessage);
    // The last deploy attempt's part, kept: a retry of generation 2's failed deploy may land
    // between the read above and the apply (a loaded machine: seen once), so only its times may move.
    expect(s3.deploy).toEqual({ ...s2.deploy, startedAt: s3.deploy?.startedAt, updatedAt: s3.deploy?.updatedAt });
    expect((s3.deploy?.updatedAt ?? '') >= (s2.deploy?.updatedAt ?? '~')).toBe(true);
    expect(Object.keys(s3.inspect ?? {}).sort()).toEqual(['exitCode', 'stdout', 'updatedAt']);
    expect(s3.inspect?.stdout).toContain(`Resources in app '${name}.app'`);
    expect(s3.inspect?.stdout).toContain(`${name}-config`);
    expect((s3.inspect?.updatedAt ?? '') >= (s3.fetch?.updatedAt ?? '~')).toBe(true);

    // A later template failure: the same.
    await apply(inlineApp(name, { ...ok, 'bad.yml': '#@ fail("e2e template failure")\n' }, { inspect: {} }));
    const templateFailed = await rt.waitForApp(NS, name, failedAt(4), 'generation 4 failed at template');
    expectFailed(templateFailed, `Templating dir: ${SEE_USEFUL}`);
    const s4 = templateFailed.status ?? {};
    expect(s4.usefulErrorMessage).toContain('e2e template failure');
    expect(s4.deploy).toEqual(s2.deploy);
    expect(s4.inspect?.exitCode).toBe(0);
    expect(s4.inspect?.stdout).toContain(`${name}-config`);
    expect((s4.inspect?.updatedAt ?? '') >= (s4.template?.updatedAt ?? '~')).toBe(true);
  });

  it('progress in status.deploy while kapp waits; deleting the App then cancels the deploy, runs kapp delete and removes everything', async () => {
    const name = `waits-${id}`;
    const deployment = pendingDeployment(`${name}-stuck`, name, 'kapp-lambda.test/no-such-node');
    await apply(
      inlineApp(
        name,
        { 'deployment.yml': deployment, 'cm.yml': configMapYaml(`${name}-config`, { v: 'one' }) },
        { rawOptions: ['--wait-timeout=300s'] },
      ),
    );
    // Mid-deploy: kapp applied and is waiting on the Deployment; its output so far is in status.
    // kapp applies the ConfigMap first and waits on it too, so a progress write can show a wait
    // before the Deployment's create line: wait for both.
    const mid = await rt.waitForApp(
      NS,
      name,
      (a) =>
        (a.status?.deploy?.finished === false &&
          a.status.deploy.stdout?.includes('---- waiting on ') &&
          a.status.deploy.stdout.includes(`create deployment/${name}-stuck`)) ??
        false,
      'kapp output in status.deploy while it waits',
    );
    const s = mid.status ?? {};
    expect(s.conditions).toEqual([{ type: 'Reconciling', status: 'True' }]);
    expect(s.friendlyDescription).toBe('Reconciling');
    expect(s.observedGeneration).toBe(1);
    expect(Object.keys(s.deploy ?? {}).sort()).toEqual(['exitCode', 'finished', 'startedAt', 'stdout', 'updatedAt']);
    expect(s.deploy?.exitCode).toBe(0);
    expect(s.deploy?.startedAt).toMatch(RFC3339);
    expect(s.deploy?.stdout).toContain('---- applying ');
    expect(s.deploy?.stdout).toContain(`deployment/${name}-stuck`);
    expect(s.fetch?.exitCode).toBe(0);
    expect(s.template?.exitCode).toBe(0);
    expect(mid.metadata.finalizers).toContain(APP_FINALIZER);
    expect(await getObject('deployment', NS, `${name}-stuck`)).toBeDefined();

    // Delete while kapp still waits (its --wait-timeout is minutes away).
    await kubectl(kubeconfigPath, ['delete', 'apps.kappctrl.k14s.io', name, '-n', NS, '--wait=false']);
    await waitFor(`App ${NS}/${name} gone`, async () => ((await getApp(NS, name)) ? undefined : true), {
      timeoutMs: 180_000,
      describe: async () => JSON.stringify((await getApp(NS, name))?.status ?? null),
    });
    for (const [kind, obj] of [
      ['deployment', `${name}-stuck`],
      ['configmap', `${name}-config`],
      ['configmap', `${name}.app`],
    ] as const) {
      expect(await getObject(kind, NS, obj), `${kind} ${obj}`).toBeUndefined();
    }
    const runs = rt.stageRuns(NS, name);
    // the deploy ended without waiting out its timeout (kapp was killed), then kapp delete ran
    const deploys = runs.filter((r) => r.stage === 'deploy');
    expect(deploys.length, JSON.stringify(runs)).toBe(1);
    expect(deploys[0]?.outcome).not.toBe('succeeded');
    const deletes = runs.filter((r) => r.stage === 'delete');
    expect(deletes.at(-1)?.outcome).toBe('deleted');
    expect((deletes.at(-1)?.tools as { runs?: number } | undefined)?.runs).toBe(1);
  });

  it('--prev-app <N>-ctrl: a kapp app deployed beforehand under that name is taken over, its objects kept', async () => {
    const name = `prev-${id}`;
    const cm = configMapYaml(`${name}-config`, { v: 'one' });
    const r = await kapp(['deploy', '-a', `${name}-ctrl`, '-n', NS, '-f', '-', '--yes'], cm);
    expect(r.code, r.stderr).toBe(0);
    const before = await getObject<Meta>('configmap', NS, `${name}-config`);
    const oldRecord = await getObject<{ data?: { spec?: string } }>('configmap', NS, `${name}-ctrl`);
    expect(before).toBeDefined();
    expect(oldRecord).toBeDefined();
    const oldSpec = JSON.parse(oldRecord?.data?.spec ?? '{}') as { labelKey?: string; labelValue?: string };

    await apply(inlineApp(name, { 'cm.yml': cm }));
    const app = await rt.waitForApp(NS, name, succeededAt(1), 'generation 1 succeeded');
    const label = await expectSucceeded(app);
    // kapp renamed the old app: same label, record now `<N>.app`, the old record gone
    expect(label).toBe(`${oldSpec.labelKey}=${oldSpec.labelValue}`);
    expect(await getObject('configmap', NS, `${name}-ctrl`)).toBeUndefined();
    // the ConfigMap was kept (same object), not deleted and created again
    const after = await getObject<Meta>('configmap', NS, `${name}-config`);
    expect(after?.metadata.uid).toBe(before?.metadata.uid);
    // kapp's summary: nothing created or deleted (the old app's objects were already its own)
    expect(app.status?.deploy?.stdout).toMatch(/Op:\s+0 create, 0 delete, 0 update/);
  });
});
