/**
 * e2e: failures surface with kapp-controller's status text (reference §3.4, §3.5): the stage
 * prefix, `Error (see .status.usefulErrorMessage for details)` for a tool that exited 1, the
 * tool's stderr in `usefulErrorMessage`, `Reconcile failed: <message>`, and
 * `consecutiveReconcileFailures` growing as the failure backoff retries (2 s, 4 s, ...).
 * Each case has its own namespace; the cases run concurrently on one runtime.
 */
import { describe, expect, it } from 'vitest';
import { freePort } from '../harness/servers.js';
import {
  APP_FINALIZER,
  type AppObject,
  apply,
  appManifest,
  expectFailed,
  getObject,
  inlineConfigMapApp,
  RFC3339,
  SEE_USEFUL,
  suffix,
  useE2ERuntime,
  yttConfigMap,
} from './support.js';

const id = suffix();
const NS = {
  ytt: `e2e-fail-ytt-${id}`,
  secret: `e2e-fail-secret-${id}`,
  git: `e2e-fail-git-${id}`,
  raw: `e2e-fail-raw-${id}`,
  path: `e2e-fail-path-${id}`,
  big: `e2e-fail-big-${id}`,
  leak: `e2e-fail-leak-${id}`,
  kapp: `e2e-fail-kapp-${id}`,
};

const rt = useE2ERuntime(Object.values(NS));

/** App `name` in `ns`: fetches `fetch`, templates with `template` (default plain ytt), deploys with kapp. */
const appOf = (ns: string, name: string, fetch: object[], template: object[] = [{ ytt: {} }]) =>
  appManifest(ns, name, { fetch, template, deploy: [{ kapp: {} }] });

/** One inline fetch of `paths`. */
const inline = (paths: Record<string, string>) => [{ inline: { paths } }];

/** Waits for a failed reconcile of the current generation that has been retried at least once. */
async function waitFailedTwice(ns: string, name: string): Promise<AppObject> {
  return await rt.waitForApp(
    ns,
    name,
    (a) =>
      a.status?.observedGeneration === a.metadata.generation &&
      (a.status?.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false) &&
      (a.status?.consecutiveReconcileFailures ?? 0) >= 2,
    'ReconcileFailed with consecutiveReconcileFailures >= 2',
  );
}

describe.concurrent('failures with kapp-controller status text', () => {
  it('a failing ytt template: Templating dir, ytt stderr in usefulErrorMessage, template exit 1', async () => {
    const ns = NS.ytt;
    const name = `ytt-${id}`;
    await apply(appOf(ns, name, inline({ 'config.yml': yttConfigMap('never', { foo: '#@ data.values.nothere' }) })));
    const app = await waitFailedTwice(ns, name);
    const message = `Templating dir: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toMatch(/^ytt: Error: /);
    expect(s.usefulErrorMessage).toContain('nothere');
    // template stderr is kept verbatim, final newline included (upstream app_reconcile_test.go)
    expect(s.usefulErrorMessage?.endsWith('\n')).toBe(true);
    expect(s.template).toEqual({
      exitCode: 1,
      error: message,
      stderr: s.usefulErrorMessage,
      updatedAt: expect.stringMatching(RFC3339),
    });
    expect(s.fetch?.exitCode).toBe(0);
    // never deployed: no deploy status, no finalizer (upstream adds it only in deploy)
    expect(s.deploy).toBeUndefined();
    expect(app.metadata.finalizers ?? []).not.toContain(APP_FINALIZER);
    expect(await getObject('configmap', ns, 'never')).toBeUndefined();
  });

  it('a ytt fail() with a 5 MiB message: ReconcileFailed with the tail of the message, status within 1 MiB', async () => {
    // Upstream bounds each field to 1 MiB, so template.stderr + usefulErrorMessage (2 MiB and
    // more) exceed what the API server stores and the App stays Reconciling. Here the whole
    // status has one 1 MiB budget and keeps the tail behind `[output truncated]`.
    const ns = NS.big;
    const name = `big-${id}`;
    await apply(
      appOf(ns, name, inline({ 'config.yml': '#@ fail("BEGIN-OF-FAIL " + "x" * 5242880 + " END-OF-FAIL")\n' })),
    );
    const app = await waitFailedTwice(ns, name);
    const message = `Templating dir: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(Buffer.byteLength(JSON.stringify(s))).toBeLessThanOrEqual(1024 * 1024);
    for (const text of [s.usefulErrorMessage, s.template?.stderr]) {
      expect(text?.startsWith('[output truncated]\n')).toBe(true);
      expect(text).toContain('x END-OF-FAIL');
      expect(text).not.toContain('- fail: BEGIN-OF-FAIL');
    }
    expect(s.template?.exitCode).toBe(1);
    expect(s.template?.error).toBe(message);
    expect(s.deploy).toBeUndefined();
  });

  it('a ytt fail() quoting a data value from a valuesFrom Secret: the value never appears in status', async () => {
    // redactSecrets alone recognizes only credential shapes (`password: x`); here the value is
    // printed bare, so only masking the Secret's own values keeps it out of status.
    const ns = NS.leak;
    const name = `leak-${id}`;
    const value = `Zq8-tenant-db-pw-${id}`;
    await apply(
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'db', namespace: ns },
        stringData: { 'values.yml': `db:\n  pw: ${value}\n` },
      },
      appOf(
        ns,
        name,
        inline({
          'values.yml': '#@data/values-schema\n---\ndb:\n  pw: ""\n',
          'config.yml': '#@ load("@ytt:data", "data")\n#@ fail("cannot connect with " + data.values.db.pw)\n',
        }),
        [{ ytt: { valuesFrom: [{ secretRef: { name: 'db' } }] } }],
      ),
    );
    const app = await waitFailedTwice(ns, name);
    expectFailed(app, `Templating dir: ${SEE_USEFUL}`);
    const s = app.status!;
    // The failure is still explained: ytt's message with the value masked.
    expect(s.usefulErrorMessage).toMatch(/^ytt: Error: /);
    expect(s.usefulErrorMessage).toContain('cannot connect with ***');
    const all = JSON.stringify(app);
    expect(all).not.toContain(value);
    expect(all).not.toContain(Buffer.from(value).toString('base64').replace(/=+$/, ''));
  });

  it('a missing Secret in inline.pathsFrom: Fetching: secrets "<name>" not found', async () => {
    const ns = NS.secret;
    const name = `secret-${id}`;
    await apply(appOf(ns, name, [{ inline: { pathsFrom: [{ secretRef: { name: 'no-such-secret' } }] } }]));
    const app = await waitFailedTwice(ns, name);
    const message = 'Fetching: secrets "no-such-secret" not found';
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.fetch).toEqual({
      exitCode: -1,
      error: message,
      startedAt: expect.stringMatching(RFC3339),
      updatedAt: expect.stringMatching(RFC3339),
    });
    expect(s.template).toBeUndefined();
    expect(s.deploy).toBeUndefined();
  });

  it('an unreachable git URL: Fetching resources, vendir stderr in usefulErrorMessage', async () => {
    const ns = NS.git;
    const name = `git-${id}`;
    const port = await freePort(); // closed: nothing listens there
    const url = `http://127.0.0.1:${port}/nothing-here`;
    await apply(appOf(ns, name, [{ git: { url, ref: 'origin/main' } }]));
    const app = await waitFailedTwice(ns, name);
    const message = `Fetching resources: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toMatch(/^vendir: Error: /);
    expect(s.usefulErrorMessage).toContain(`127.0.0.1:${port}`);
    expect(s.fetch?.exitCode).toBe(1);
    expect(s.fetch?.error).toBe(message);
    expect(s.fetch?.stderr).toBe(s.usefulErrorMessage);
    // fetch stderr is kept verbatim, final newline included (upstream stores vendir's as is)
    expect(s.usefulErrorMessage?.endsWith('\n')).toBe(true);
    expect(s.template).toBeUndefined();
  });

  it('a failing kapp deploy: Deploying, kapp stderr in usefulErrorMessage as status.deploy shows it (trimmed)', async () => {
    // upstream's updateLastDeploy hands setReconcileCompleted the WithFriendlyYAMLStrings result:
    // usefulErrorMessage is kapp's stderr trimmed, no whitespace before a newline, as in
    // status.deploy.stderr (reference §2.1.5's example ends without a newline)
    const ns = NS.kapp;
    const name = `kapp-${id}`;
    const missing = `does-not-exist-${id}`;
    const config = `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: configmap\n  namespace: ${missing}\ndata:\n  key: value`;
    await apply(appOf(ns, name, inline({ 'config.yml': config })));
    const app = await waitFailedTwice(ns, name);
    const message = `Deploying: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toMatch(/^kapp: Error: /);
    expect(s.usefulErrorMessage).toContain(missing);
    expect(s.usefulErrorMessage).toBe(s.usefulErrorMessage?.trim());
    expect(s.usefulErrorMessage).not.toMatch(/\s\n/);
    expect(s.deploy?.exitCode).toBe(1);
    expect(s.deploy?.finished).toBe(true);
    expect(s.deploy?.error).toBe(message);
    expect(s.deploy?.stderr).toBe(s.usefulErrorMessage);
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
  });

  it('a forbidden kapp rawOption: the allow-list error, after the finalizer was added', async () => {
    const ns = NS.raw;
    const name = `raw-${id}`;
    const manifest = inlineConfigMapApp(ns, name, 'never deployed') as { spec: Record<string, unknown> };
    manifest.spec.deploy = [{ kapp: { rawOptions: ['--wait-timeout=2m', '--kubeconfig=/x'] } }];
    await apply(manifest);
    const app = await waitFailedTwice(ns, name);
    const message = "Unexpected flag '--kubeconfig' specified (either forbidden or unknown)";
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.fetch?.exitCode).toBe(0);
    expect(s.template?.exitCode).toBe(0);
    expect(s.deploy).toEqual({
      exitCode: -1,
      finished: true,
      error: message,
      startedAt: expect.stringMatching(RFC3339),
      updatedAt: expect.stringMatching(RFC3339),
    });
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
    expect(await getObject('configmap', ns, `${name}-config`)).toBeUndefined();
    expect(await getObject('configmap', ns, `${name}.app`)).toBeUndefined();
  });

  it('a ytt path escaping the fetch directory: Checking path: Invalid path', async () => {
    const ns = NS.path;
    const name = `path-${id}`;
    const manifest = inlineConfigMapApp(ns, name, 'never rendered') as { spec: Record<string, unknown> };
    manifest.spec.template = [{ ytt: { paths: ['../..'] } }];
    await apply(manifest);
    const app = await waitFailedTwice(ns, name);
    const message = 'Checking path: Invalid path: ../..';
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.template).toEqual({ exitCode: -1, error: message, updatedAt: expect.stringMatching(RFC3339) });
    expect(s.deploy).toBeUndefined();
  });
});
