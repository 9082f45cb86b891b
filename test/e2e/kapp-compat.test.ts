/**
 * e2e: the tools kapp-controller users drive it with. kapp's built-in wait rules for
 * `kappctrl.k14s.io/v1alpha1` App and `packaging.carvel.dev/v1alpha1` PackageInstall
 * (`pkg/kapp/resourcesmisc/kappctrl_k14s_io_v1alpha1_app.go`,
 * `packaging_carvel_dev_v1alpha1_packageinstall.go`: wait for `observedGeneration`, then
 * `Reconciling` is in progress, `ReconcileFailed` / `DeleteFailed` fail with `usefulErrorMessage`
 * (else the condition's message), anything else succeeds)
 * finish on the status the runtime writes: the real kapp deploys Apps and PackageInstalls the way
 * kapp-controller's own e2e suite does (`kapp deploy -a <name> -f - --wait-timeout 3m`), waits for
 * `ReconcileSucceeded` and fails with kapp's message on `ReconcileFailed`. `kubectl get` shows
 * upstream's columns for apps, pkgi, pkgr, pkg and pkgm, read from the real API server's Table API
 * (`config/config/crds.yml`; for Package and PackageMetadata the aggregated API's `ConvertToTable`).
 */
import { type RequestOptions, request } from 'node:https';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { toolBin } from '../harness/fixtures.js';
import { type KubectlResult, kubectl, loadKubeConfig } from '../harness/kube.js';
import {
  expectRepoSucceeded,
  inlineRepositoryManifest,
  packageDoc,
  packageMetadataDoc,
  waitRepo,
} from './packaging-support.js';
import {
  type AppObject,
  appManifest,
  expectSucceeded,
  getApp,
  inlineConfigMapApp,
  k,
  kubeconfigPath,
  SA,
  SEE_USEFUL,
  suffix,
  useE2ERuntime,
} from './support.js';

const id = suffix();
const NS = `e2e-kapp-compat-${id}`;
const REF_NAME = 'hello.compat.carvel.dev';

const rt = useE2ERuntime([NS]);

/**
 * Runs the real kapp (`kapp --kubeconfig <admin> <args>`) with `input` on stdin, as a user
 * would from a shell; never throws on a non-zero exit.
 */
async function kapp(args: string[], input?: string): Promise<KubectlResult> {
  return await kubectl(kubeconfigPath, args, { kubectl: toolBin('kapp'), input, check: false, timeoutMs: 240_000 });
}

/** `kapp deploy -a <name> -n <NS> -f - --wait-timeout 3m --yes` of `docs` (upstream e2e's form). */
async function kappDeploy(name: string, ...docs: object[]): Promise<KubectlResult> {
  return await kapp(
    ['deploy', '-a', name, '-n', NS, '-f', '-', '--wait-timeout', '3m', '--yes'],
    docs.map((d) => stringify(d)).join('---\n'),
  );
}

/** A Package of {@link REF_NAME} whose App renders `config.yml` (inline ytt). */
function inlinePackageDoc(version: string, config: string): object {
  const template = {
    fetch: [{ inline: { paths: { 'config.yml': config } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  };
  return packageDoc(REF_NAME, version, { spec: { template: { spec: template } } });
}

/** A PackageInstall of {@link REF_NAME} `version`, deploying with {@link SA}. */
function packageInstall(name: string, version: string): object {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name, namespace: NS },
    spec: { serviceAccountName: SA, packageRef: { refName: REF_NAME, versionSelection: { constraints: version } } },
  };
}

/** One `metav1.Table` as the API server answers `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`. */
interface Table {
  kind: string;
  columnDefinitions: { name: string; type: string; format?: string }[];
  rows: { cells: unknown[] }[];
}

/** GETs `apiPath` from the shared control plane as a Table (admin credentials, in process). */
async function getTable(apiPath: string): Promise<Table> {
  const kc = loadKubeConfig(kubeconfigPath);
  const server = new URL(kc.getCurrentCluster()?.server ?? '');
  const opts: RequestOptions = {
    hostname: server.hostname,
    port: server.port,
    path: apiPath,
    method: 'GET',
    headers: { Accept: 'application/json;as=Table;v=v1;g=meta.k8s.io' },
  };
  await kc.applyToHTTPSOptions(opts);
  const body = await new Promise<string>((resolve, reject) => {
    const req = request(opts, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        data += c;
      });
      res.on('end', () =>
        res.statusCode === 200 ? resolve(data) : reject(new Error(`GET ${apiPath}: ${res.statusCode} ${data}`)),
      );
    });
    req.on('error', reject);
    req.end();
  });
  return JSON.parse(body) as Table;
}

describe.concurrent('kapp and kubectl on the runtime', () => {
  it('kapp deploy of an App waits until ReconcileSucceeded', async () => {
    const name = `ok-${id}`;
    const r = await kappDeploy(`${name}-kapp`, inlineConfigMapApp(NS, name, 'hello from kapp'));
    expect(r.code, r.stderr).toBe(0);
    // kapp waited on the App with its built-in rule and saw it succeed
    expect(r.stdout).toMatch(
      new RegExp(`ongoing: reconcile app/${name} \\(kappctrl\\.k14s\\.io/v1alpha1\\) namespace: ${NS}`),
    );
    expect(r.stdout).toMatch(
      new RegExp(`ok: reconcile app/${name} \\(kappctrl\\.k14s\\.io/v1alpha1\\) namespace: ${NS}`),
    );
    expect(r.stdout).toContain('Succeeded');
    // when kapp returns, the App has already succeeded: no polling needed
    const app = (await getApp(NS, name)) as AppObject;
    await expectSucceeded(app);
    const cm = await k(['get', 'configmap', `${name}-config`, '-n', NS, '-o', 'jsonpath={.data.greeting}']);
    expect(cm.stdout).toBe('hello from kapp');
  });

  it("kapp deploy of a failing App exits non-zero with kapp's Reconcile failed message", async () => {
    const name = `fail-${id}`;
    const r = await kappDeploy(
      `${name}-kapp`,
      appManifest(NS, name, {
        fetch: [{ inline: { paths: { 'config.yml': '#@ load("@ytt:data", "data")\nfoo: #@ data.values.nothere\n' } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    expect(r.code).not.toBe(0);
    // kapp's rule (v0.64): `Reconcile failed: message: <usefulErrorMessage, else the condition's>`,
    // wrapped and indented by kapp
    expect(r.stderr).toContain(`waiting on reconcile app/${name} (kappctrl.k14s.io/v1alpha1) namespace: ${NS}`);
    expect(r.stderr).toMatch(/Finished waiting unsuccessfully:\s+Reconcile failed: message: ytt:\s+Error:/);
    expect(r.stderr).toContain('data.values.nothere');
    const app = await getApp(NS, name);
    expect(app?.status?.conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: `Templating dir: ${SEE_USEFUL}` },
    ]);
  });

  it('kapp deploy of PackageInstalls waits for success and fails with their usefulErrorMessage', async () => {
    const repo = `repo-${id}`;
    await rt.cluster.apply(
      inlineRepositoryManifest(NS, repo, {
        'packages/metadata.yml': stringify(packageMetadataDoc(REF_NAME, { categories: ['demo', 'compat'] })),
        'packages/1.0.0.yml': stringify(
          inlinePackageDoc(
            '1.0.0',
            ['apiVersion: v1', 'kind: ConfigMap', 'metadata:', '  name: hello', 'data:', '  version: "1.0.0"'].join(
              '\n',
            ),
          ),
        ),
        'packages/2.0.0.yml': stringify(
          inlinePackageDoc('2.0.0', '#@ load("@ytt:data", "data")\nfoo: #@ data.values.nothere\n'),
        ),
      }),
    );
    expectRepoSucceeded(await waitRepo(rt, NS, repo));

    const ok = `pkgi-ok-${id}`;
    const r = await kappDeploy(`${ok}-kapp`, packageInstall(ok, '1.0.0'));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`ok: reconcile packageinstall/${ok} \\(packaging\\.carvel\\.dev/v1alpha1\\)`));
    const pkgi = await rt.cluster.getObject<{ status?: Record<string, unknown> }>('packageinstall', NS, ok);
    expect(pkgi?.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(pkgi?.status?.version).toBe('1.0.0');
    const cm = await k(['get', 'configmap', 'hello', '-n', NS, '-o', 'jsonpath={.data.version}']);
    expect(cm.stdout).toBe('1.0.0');

    const bad = `pkgi-bad-${id}`;
    const f = await kappDeploy(`${bad}-kapp`, packageInstall(bad, '2.0.0'));
    expect(f.code).not.toBe(0);
    // kapp's PackageInstall rule quotes usefulErrorMessage (the App's: ytt's stderr)
    expect(f.stderr).toContain(`waiting on reconcile packageinstall/${bad} (packaging.carvel.dev/v1alpha1)`);
    expect(f.stderr).toMatch(/Finished waiting unsuccessfully:\s+Reconcile failed: message: ytt:\s+Error:/);
    expect(f.stderr).toContain('data.values.nothere');

    // kubectl get apps,pkgi,pkgr,pkg,pkgm: one table per kind with upstream's columns
    const all = await k(['get', 'apps,pkgi,pkgr,pkg,pkgm', '-n', NS]);
    const headers = all.stdout
      .split('\n')
      .filter((l) => l.startsWith('NAME '))
      .map((l) => l.trim().split(/\s{2,}/));
    expect(headers).toEqual([
      ['NAME', 'DESCRIPTION', 'SINCE-DEPLOY', 'AGE'],
      ['NAME', 'PACKAGE NAME', 'PACKAGE VERSION', 'DESCRIPTION', 'AGE'],
      ['NAME', 'AGE', 'DESCRIPTION'],
      ['NAME', 'PACKAGEMETADATA NAME', 'VERSION', 'AGE'],
      ['NAME', 'DISPLAY NAME', 'CATEGORIES', 'SHORT DESCRIPTION', 'AGE'],
    ]);
    expect(all.stdout).toMatch(
      new RegExp(`packageinstall\\.packaging\\.carvel\\.dev/${ok}\\s+${REF_NAME}\\s+1\\.0\\.0\\s+Reconcile succeeded`),
    );

    // the Table API (what kubectl, k9s and dashboards read), column by column
    const cols = async (p: string) => (await getTable(p)).columnDefinitions.map((c) => [c.name, c.type]);
    expect(await cols(`/apis/kappctrl.k14s.io/v1alpha1/namespaces/${NS}/apps`)).toEqual([
      ['Name', 'string'],
      ['Description', 'string'],
      ['Since-Deploy', 'date'],
      ['Age', 'date'],
    ]);
    expect(await cols(`/apis/packaging.carvel.dev/v1alpha1/namespaces/${NS}/packageinstalls`)).toEqual([
      ['Name', 'string'],
      ['Package name', 'string'],
      ['Package version', 'string'],
      ['Description', 'string'],
      ['Age', 'date'],
    ]);
    expect(await cols(`/apis/packaging.carvel.dev/v1alpha1/namespaces/${NS}/packagerepositories`)).toEqual([
      ['Name', 'string'],
      ['Age', 'date'],
      ['Description', 'string'],
    ]);
    // upstream's aggregated API also has `Included Software`, which no CRD column can join
    expect(await cols(`/apis/data.packaging.carvel.dev/v1alpha1/namespaces/${NS}/packages`)).toEqual([
      ['Name', 'string'],
      ['PackageMetadata Name', 'string'],
      ['Version', 'string'],
      ['Age', 'date'],
    ]);
    expect(await cols(`/apis/data.packaging.carvel.dev/v1alpha1/namespaces/${NS}/packagemetadatas`)).toEqual([
      ['Name', 'string'],
      ['Display Name', 'string'],
      ['Categories', 'string'],
      ['Short Description', 'string'],
      ['Age', 'date'],
    ]);
    const pkgiRows = (await getTable(`/apis/packaging.carvel.dev/v1alpha1/namespaces/${NS}/packageinstalls`)).rows;
    expect(pkgiRows.map((row) => row.cells.slice(0, 4))).toContainEqual([ok, REF_NAME, '1.0.0', 'Reconcile succeeded']);
    const appRows = (await getTable(`/apis/kappctrl.k14s.io/v1alpha1/namespaces/${NS}/apps`)).rows;
    expect(appRows.map((row) => row.cells.slice(0, 2))).toContainEqual([ok, 'Reconcile succeeded']);
  });
});
