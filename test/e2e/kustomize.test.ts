/**
 * e2e: the kustomize template step (issue 12 item 4; kapp-controller answers `Unsupported way to
 * template`), through the whole flow (forwarder → fetch → template → deploy with the real vendir,
 * kustomize, ytt and kapp), with the status asserted:
 *
 * - an inline-fetched overlay over a base (`namePrefix`, `commonLabels`) deploys its objects;
 * - kustomize followed by a ytt overlay, which reads kustomize's stream;
 * - a broken kustomization fails with `Templating dir: ...` and kustomize's stderr;
 * - a remote base is refused before kustomize starts (no tool runs).
 *
 * The kustomizations are built here, at run time.
 */
import { describe, expect, it } from 'vitest';
import {
  APP_FINALIZER,
  type AppObject,
  apply,
  appManifest,
  type E2ERuntime,
  expectFailed,
  expectSucceeded,
  getObject,
  RFC3339,
  SEE_USEFUL,
  suffix,
  useE2ERuntime,
} from './support.js';

const id = suffix();
const NS = `e2e-kustomize-${id}`;
const N = {
  overlay: `kz-overlay-${id}`,
  ytt: `kz-ytt-${id}`,
  broken: `kz-broken-${id}`,
  remote: `kz-remote-${id}`,
};

const rt = useE2ERuntime([NS]);

interface ConfigMap {
  metadata: { name: string; labels?: Record<string, string> };
  data?: Record<string, string>;
}

/** kustomize's notice for `commonLabels`, on stderr (kept in `status.template.stderr`). */
const COMMON_LABELS_NOTICE =
  "# Warning: 'commonLabels' is deprecated. Please use 'labels' instead. Run 'kustomize edit fix' to update your Kustomization automatically.\n";

/** A base with two ConfigMaps and an overlay at the root that prefixes and labels them. */
function overlayTree(prefix: string): Record<string, string> {
  const cm = (name: string, data: string) =>
    `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${name}\ndata:\n  ${data}\n`;
  return {
    'kustomization.yaml': `resources:\n- base\nnamePrefix: ${prefix}-\ncommonLabels:\n  env: ${prefix}\n`,
    'base/kustomization.yaml': 'resources:\n- settings.yaml\n- greeting.yaml\n',
    'base/settings.yaml': cm('settings', 'color: blue'),
    'base/greeting.yaml': cm('greeting', 'text: hello'),
  };
}

function kustomizeApp(name: string, paths: Record<string, string>, template: unknown[] = [{ kustomize: {} }]) {
  return appManifest(NS, name, { fetch: [{ inline: { paths } }], template, deploy: [{ kapp: {} }] });
}

/** Tool runs recorded for an App's template stage records (`tools.runs`); there must be one. */
function templateToolRuns(r: E2ERuntime, name: string): number {
  const runs = r.stageRuns(NS, name).filter((x) => x.stage === 'template');
  expect(runs.length).toBeGreaterThan(0);
  return runs.reduce((n, x) => n + ((x.tools as { runs?: number } | undefined)?.runs ?? 0), 0);
}

const YTT_OVERLAY = [
  '#@ load("@ytt:overlay", "overlay")',
  '#@overlay/match by=overlay.subset({"kind": "ConfigMap"}), expects="1+"',
  '---',
  'data:',
  '  #@overlay/match missing_ok=True',
  '  touched: by-ytt',
  '',
].join('\n');

const REMOTE = 'https://github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v1.0.6';

describe.concurrent('kustomize template step', () => {
  it('an overlay over a base (namePrefix, commonLabels): ReconcileSucceeded and the objects in the cluster', async () => {
    await apply(kustomizeApp(N.overlay, overlayTree('dev')));
    const app = await rt.waitReconciled(NS, N.overlay, 170_000);
    await expectSucceeded(app);
    expect(app.status?.template).toEqual({
      exitCode: 0,
      stderr: COMMON_LABELS_NOTICE,
      updatedAt: expect.stringMatching(RFC3339),
    });
    const settings = await getObject<ConfigMap>('configmap', NS, 'dev-settings');
    const greeting = await getObject<ConfigMap>('configmap', NS, 'dev-greeting');
    expect(settings?.data).toEqual({ color: 'blue' });
    expect(greeting?.data).toEqual({ text: 'hello' });
    expect(settings?.metadata.labels?.env).toBe('dev');
    expect(greeting?.metadata.labels?.env).toBe('dev');
    expect(await getObject('configmap', NS, 'settings')).toBeUndefined();
  });

  it('kustomize followed by a ytt overlay: ytt reads the kustomize stream', async () => {
    await apply(
      kustomizeApp(N.ytt, overlayTree('stage'), [
        { kustomize: {} },
        { ytt: { inline: { paths: { 'overlay.yml': YTT_OVERLAY } } } },
      ]),
    );
    const app = await rt.waitReconciled(NS, N.ytt, 170_000);
    await expectSucceeded(app);
    const settings = await getObject<ConfigMap>('configmap', NS, 'stage-settings');
    expect(settings?.data).toEqual({ color: 'blue', touched: 'by-ytt' });
    expect(settings?.metadata.labels?.env).toBe('stage');
    expect((await getObject<ConfigMap>('configmap', NS, 'stage-greeting'))?.data).toEqual({
      text: 'hello',
      touched: 'by-ytt',
    });
  });

  it("a broken kustomization: ReconcileFailed, Templating dir, kustomize's error in usefulErrorMessage", async () => {
    await apply(kustomizeApp(N.broken, { 'kustomization.yaml': 'resources:\n- gone.yaml\n' }));
    const app: AppObject = await rt.waitReconciled(NS, N.broken, 170_000);
    const message = `Templating dir: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toMatch(
      /^Error: accumulating resources: accumulation err='accumulating resources from 'gone\.yaml': evalsymlink failure on '\/\S+\/gone\.yaml' : lstat \/\S+\/gone\.yaml: no such file or directory': must build at directory: not a valid directory: /,
    );
    expect(s.template).toEqual({
      exitCode: 1,
      error: message,
      stderr: s.usefulErrorMessage,
      updatedAt: expect.stringMatching(RFC3339),
    });
    expect(s.fetch?.exitCode).toBe(0);
    expect(s.deploy).toBeUndefined();
    expect(app.metadata.finalizers ?? []).not.toContain(APP_FINALIZER);
  });

  it('a remote base: refused before kustomize starts, with the reason in status', async () => {
    await apply(kustomizeApp(N.remote, { 'kustomization.yaml': `resources:\n- ${REMOTE}\n` }));
    const app = await rt.waitReconciled(NS, N.remote, 170_000);
    const message =
      `Templating dir: kustomization.yaml: resources[0] ${JSON.stringify(REMOTE)} is a remote resource: ` +
      'the kustomize step builds only the fetched files (fetch remote sources with spec.fetch)';
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.template).toEqual({ exitCode: -1, error: message, updatedAt: expect.stringMatching(RFC3339) });
    expect(templateToolRuns(rt, N.remote)).toBe(0);
  });
});
