/**
 * e2e: the fetch retry of reference §3.6 step 4 through the whole flow (forwarder → fetch →
 * template → deploy with the real vendir, imgpkg, ytt and kapp) against a real registry that
 * requires credentials (distribution's htpasswd basic auth, `../harness/servers/registry.ts`).
 *
 * The App's `imgpkgBundle.secretRef` names a placeholder Secret as a PackageInstall gets one
 * (`kubernetes.io/dockerconfigjson` `{"auths":{}}`, annotated
 * `secretgen.carvel.dev/image-pull-secret: ""`); the test plays secretgen-controller and fills it
 * with the registry's credentials once the fetch's first vendir run has failed (401). Upstream,
 * and now kapp-lambda, re-read the Secret within the same fetch (3 checks, 2 s apart) and run
 * vendir again once its config changed, so that reconcile succeeds: no `ReconcileFailed` is ever
 * written, the fetch stage never ends failed, and the one fetch ran vendir twice. Without the
 * retry the first run ends `ReconcileFailed` (the filled Secret's `ref-changed` then brings a
 * second, successful run), which each of those assertions refuses.
 *
 * The same for a PackageRepository fetching a bundle without `secretRef` (upstream
 * `pkg/pkgrepository/app_fetch.go` retries alike): its own placeholder `<name>-fetch-0`, created
 * unfilled by the index-repo function, is filled after the first vendir run failed; the retry
 * re-reads it, the fetch names it, and that reconcile deploys the repository's Packages.
 *
 * vendir's runs are observed at the runner port (`wrapDeps`: each run's bundle, exit code and
 * stderr, for when to fill the Secret and how often vendir ran); nothing is faked.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunRequest, RunResult } from '../../functions/lib/exec/runner.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { pushBundle } from '../harness/fixtures.js';
import { type RegistryServer, startRegistry } from '../harness/servers/registry.js';
import {
  expectRepoSucceeded,
  getRepo,
  packageDoc,
  packageMetadataDoc,
  packagesByRefName,
  packagesPaths,
  repositoryManifest,
  waitRepo,
} from './packaging-support.js';
import {
  type AppObject,
  apply,
  appManifest,
  configMapYaml,
  expectSucceeded,
  getObject,
  k,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-fetch-retry-${id}`;
const APP = `retry-${id}`;
const PLACEHOLDER = `${APP}-fetch-0`;
const REPO = `retry-repo-${id}`;
const REFNAME = `retried.${id}.example.com`;

/** Each vendir run of this file's runtime, as it ended, with the bundle it was given. */
const vendirRuns: { bundle: string | undefined; exitCode: number; stderr: string }[] = [];
/** The bundle refs pushed (App, repository). */
const bundles = { app: '', repo: '' };

/** vendir's runs for one bundle. */
function runsOf(bundle: string) {
  return vendirRuns.filter((r) => r.bundle === bundle);
}

/**
 * Per bundle, what secretgen-controller does once that bundle's first vendir run failed. Run
 * before the fetch sees the failure, so the Secret is filled before the retry's first check
 * (2 s later) however slow the machine is: the test plays secretgen-controller at its fastest.
 */
const onFirstFailure = new Map<string, () => Promise<void>>();

/** Records every vendir run at the runner port (the run itself is the real one). */
function observingVendir(deps: DispatchDeps): DispatchDeps {
  const { runner } = deps;
  return {
    ...deps,
    runner: {
      run: async (req: RunRequest): Promise<RunResult> => {
        const res = await runner.run(req);
        if (req.cmd === 'vendir') {
          const bundle = Object.values(bundles).find((b) => b && String(req.stdin ?? '').includes(b));
          vendirRuns.push({ bundle, exitCode: res.exitCode, stderr: res.stderr });
          const fill = bundle === undefined || res.exitCode === 0 ? undefined : onFirstFailure.get(bundle);
          if (bundle !== undefined && fill) {
            onFirstFailure.delete(bundle);
            await fill();
          }
        }
        return res;
      },
    },
  };
}

let registry: RegistryServer;

beforeAll(async () => {
  registry = await startRegistry({ auth: true });
  const app = await pushBundle(registry, `e2e/retry-${id}:v1`, {
    'config/cm.yml': configMapYaml(`${APP}-config`, { fetched: 'with credentials' }),
  });
  const repo = await pushBundle(
    registry,
    `e2e/retry-repo-${id}:v1`,
    // An inline package: no image ref for the repository's kbld step to resolve.
    packagesPaths([
      packageMetadataDoc(REFNAME),
      packageDoc(REFNAME, '1.0.0', {
        spec: {
          template: {
            spec: {
              fetch: [{ inline: { paths: { 'cm.yml': configMapYaml(`${REPO}-pkg`, { from: 'package' }) } } }],
              template: [{ ytt: {} }],
              deploy: [{ kapp: {} }],
            },
          },
        },
      }),
    ]),
  );
  bundles.app = app.ref;
  bundles.repo = repo.ref;
}, 120_000);

afterAll(async () => {
  await registry?.stop();
});

const rt = useE2ERuntime([NS], { overrides: { wrapDeps: observingVendir } });

/** The registry's credentials as secretgen-controller writes them into a placeholder (`auths`). */
function filledAuths(): Record<string, unknown> {
  const { auth } = registry;
  if (!auth) throw new Error('the registry was started without auth');
  return { [registry.host]: { username: auth.username, password: auth.password } };
}

/** Every status `read` gives while `body` runs, read every 100 ms. */
async function watchingStatus<S>(read: () => Promise<S | undefined>, body: () => Promise<void>): Promise<S[]> {
  const seen: S[] = [];
  let watching = true;
  const watcher = (async () => {
    while (watching) {
      const status = await read().catch(() => undefined);
      if (status) seen.push(status);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  try {
    await body();
  } finally {
    watching = false;
    await watcher;
  }
  return seen;
}

/** Waits for the first vendir run for `bundle` and checks the registry refused it (no credentials). */
async function firstRunRefused(bundle: string): Promise<void> {
  await waitFor('the first vendir run to fail', async () => (runsOf(bundle).length > 0 ? true : undefined), {
    timeoutMs: 120_000,
  });
  expect(runsOf(bundle)[0]?.exitCode).not.toBe(0);
  expect(runsOf(bundle)[0]?.stderr).toMatch(/UNAUTHORIZED|401/);
}

/** The condition types and failure counts of `statuses`: no ReconcileFailed, no failure counted. */
function expectNeverFailed(statuses: (AppObject['status'] | undefined)[]): void {
  expect(statuses.length).toBeGreaterThan(0);
  expect(statuses.flatMap((s) => (s?.conditions ?? []).map((c) => c.type))).not.toContain('ReconcileFailed');
  expect(statuses.every((s) => (s?.consecutiveReconcileFailures ?? 0) === 0)).toBe(true);
}

/** The placeholder Secret holding `auths` (what upstream creates, then secretgen-controller fills). */
function placeholder(auths: Record<string, unknown>): object {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name: PLACEHOLDER,
      namespace: NS,
      annotations: { 'secretgen.carvel.dev/image-pull-secret': '' },
    },
    type: 'kubernetes.io/dockerconfigjson',
    data: { '.dockerconfigjson': Buffer.from(JSON.stringify({ auths })).toString('base64') },
  };
}

describe('fetch retry (reference §3.6 step 4)', () => {
  it('a placeholder Secret filled after the first vendir run failed: the same reconcile succeeds', async () => {
    await apply(placeholder({}));
    // secretgen-controller's part: the registry's credentials into the placeholder.
    onFirstFailure.set(bundles.app, () => apply(placeholder(filledAuths())));
    await apply(
      appManifest(NS, APP, {
        fetch: [{ imgpkgBundle: { image: bundles.app, secretRef: { name: PLACEHOLDER } } }],
        template: [{ ytt: { paths: ['config'] } }],
        deploy: [{ kapp: {} }],
      }),
    );
    // Every status the App shows meanwhile: a ReconcileFailed would stay for seconds (the
    // ref-changed run's fetch and template come after it).
    const seen = await watchingStatus(
      async () => (await rt.cluster.getApp(NS, APP))?.status,
      async () => {
        await firstRunRefused(bundles.app);
        const app = await rt.waitForApp(NS, APP, succeededAt(1), 'generation 1 succeeded', 120_000);
        await expectSucceeded(app);
        expect(app.status?.usefulErrorMessage ?? '').toBe('');
      },
    );
    const cm = await getObject<{ data?: Record<string, string> }>('configmap', NS, `${APP}-config`);
    expect(cm?.data).toEqual({ fetched: 'with credentials' });

    // No failure was ever written or logged: the first fetch stage itself succeeded, with vendir
    // run twice (the 401, then the run given the filled Secret).
    expectNeverFailed(seen);
    const fetchRuns = rt.stageRuns(NS, APP).filter((r) => r.stage === 'fetch');
    expect(fetchRuns[0]?.outcome, JSON.stringify(fetchRuns)).toBe('succeeded');
    expect(fetchRuns.map((r) => r.outcome)).not.toContain('failed');
    expect(
      runsOf(bundles.app)
        .slice(0, 2)
        .map((r) => r.exitCode),
    ).toEqual([1, 0]);
    const checks = rt.records.filter((r) => r.msg === 'fetch retry check' && r.obj.name === APP);
    expect(checks.some((r) => r.obj.changed === true)).toBe(true);
    expect(JSON.stringify(rt.records)).not.toContain(registry.auth?.password);
  });

  it('a PackageRepository: its own placeholder filled after the first vendir run failed, the same reconcile deploys', async () => {
    // the index-repo function creates the placeholder unfilled before that run
    const data = Buffer.from(JSON.stringify({ auths: filledAuths() })).toString('base64');
    onFirstFailure.set(bundles.repo, async () => {
      await k([
        'patch',
        'secret',
        `${REPO}-fetch-0`,
        '-n',
        NS,
        '--type=merge',
        '-p',
        JSON.stringify({ data: { '.dockerconfigjson': data } }),
      ]);
    });
    await apply(repositoryManifest(NS, REPO, { imgpkgBundle: { image: bundles.repo } }));
    const seen = await watchingStatus(
      async () => (await getRepo(NS, REPO))?.status,
      async () => {
        await firstRunRefused(bundles.repo);
        expectRepoSucceeded(await waitRepo(rt, NS, REPO));
      },
    );
    expect((await packagesByRefName(NS, REFNAME)).map((p) => p.spec.version)).toEqual(['1.0.0']);
    expectNeverFailed(seen);
    const outcomes = rt.records
      .filter((r) => r.msg === 'stage run' && String(r.obj.object ?? '').endsWith(`/${NS}/${REPO}`))
      .map((r) => r.obj.outcome);
    expect(outcomes, JSON.stringify(outcomes)).not.toContain('failed');
    // the first run anonymous (the unfilled placeholder is not named), the second with it
    expect(
      runsOf(bundles.repo)
        .slice(0, 2)
        .map((r) => r.exitCode),
    ).toEqual([1, 0]);
  });
});
