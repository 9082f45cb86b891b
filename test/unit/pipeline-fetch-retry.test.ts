/**
 * The fetch retry of reference §3.6 step 4 (upstream `pkg/app/app_fetch.go` and
 * `pkg/pkgrepository/app_fetch.go` `fetch`): after a failed vendir run of a fetch with an
 * `image` or `imgpkgBundle` source, up to 3 more checks 2 s apart, vendir running again only
 * when the config it would be given changed (a placeholder Secret filled by
 * secretgen-controller). Through `runFetch` (Apps, hence PackageInstall Apps) and
 * `dispatchEvent` (PackageRepositories), faked at the ports: the fake cluster's Secrets, the
 * fake runner's vendir (it fails unless its stdin carries the credentials), an injected sleep
 * that records its waits instead of waiting.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { objectEvent } from '../../events/schema.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import type { ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { FETCH_RETRIES, FETCH_RETRY_INTERVAL_MS } from '../../functions/lib/fetch/run.js';
import type { KubeSecret } from '../../functions/lib/kube/port.js';
import type { RepoTemplateOutput } from '../../functions/lib/packaging/repo-template.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import {
  type AppShape,
  appObject,
  appWorld,
  finalFailed,
  NOW,
  PKGR_REF,
  RECONCILING,
  REF,
  RUN,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-fetch-retry-');

const DOCKERCONFIG = '.dockerconfigjson';
const EMPTY_AUTHS = '{"auths":{}}';
const FILLED_AUTHS = '{"auths":{"registry.example":{"username":"u","password":"retry-secret-pw"}}}';
const VENDIR_FAILED = 'Fetching resources: Error (see .status.usefulErrorMessage for details)';
const UNAUTHORIZED = 'vendir: Error: Syncing directory 0: UNAUTHORIZED: authentication required';

/** A placeholder Secret (`<name>-fetch-0` as upstream writes it) holding `auths`. */
function placeholder(name: string, auths: string, resourceVersion = '1'): KubeSecret {
  return {
    metadata: {
      name,
      namespace: REF.namespace,
      uid: `uid-${name}`,
      resourceVersion,
      annotations: { 'secretgen.carvel.dev/image-pull-secret': '' },
    },
    type: 'kubernetes.io/dockerconfigjson',
    data: { [DOCKERCONFIG]: Buffer.from(auths) },
  };
}

/** Whether vendir's stdin carries the Secret holding {@link FILLED_AUTHS}. */
function hasCredentials(req: RunRequest): boolean {
  return String(req.stdin ?? '').includes(Buffer.from(FILLED_AUTHS).toString('base64'));
}

/** A vendir that fetches only when its stdin carries {@link FILLED_AUTHS}, else fails as a registry 401 does. */
async function vendirNeedsCredentials(req: RunRequest): Promise<ScriptedResult> {
  if (!hasCredentials(req)) return { stderr: UNAUTHORIZED, exitCode: 1 };
  await writeFile(path.join(req.cwd ?? '', 'config.yml'), 'a: 1\n');
  return { stdout: 'lock: vendir\n', exitCode: 0 };
}

const BUNDLE = (secret?: string) => ({
  imgpkgBundle: { image: 'registry.example/bundle:v1', ...(secret ? { secretRef: { name: secret } } : {}) },
});

interface Setup {
  spec: AppShape['spec'];
  /** Secrets in the cluster before the run. */
  secrets?: KubeSecret[];
  /** Runs at each wait (1-based): changes the cluster meanwhile. */
  onSleep?: (n: number, w: ReturnType<typeof appWorld>) => void;
  vendir?: (req: RunRequest) => Promise<ScriptedResult>;
  /** `deps.deadline`. */
  deadline?: AbortSignal;
}

/**
 * A world with a keyring (a fetch with a Secret is sealed) whose sleep records each wait and
 * calls `onSleep` (1-based) instead of waiting.
 */
function retryWorld(
  onSleep: ((n: number, w: ReturnType<typeof appWorld>) => void) | undefined,
  opts: { app?: ReturnType<typeof appObject>; extra: Partial<DispatchDeps> },
) {
  const sleeps: number[] = [];
  const w = appWorld({
    ...(opts.app ? { app: opts.app } : {}),
    tmpRoot: path.join(tempDir(), 'scratch'),
    extra: {
      keyring: new DerivedKeyring(Buffer.alloc(32, 7)),
      sleep: async (ms: number) => {
        sleeps.push(ms);
        onSleep?.(sleeps.length, w);
      },
      ...opts.extra,
    },
  });
  return { sleeps, w };
}

/** Runs the fetch stage of a `Reconciling` App once; returns the world, the hand-off and the waits. */
async function fetchWith(s: Setup) {
  const { sleeps, w } = retryWorld(s.onSleep, {
    app: appObject({ status: RECONCILING, spec: s.spec }),
    extra: s.deadline ? { deadline: s.deadline } : {},
  });
  for (const secret of s.secrets ?? []) w.cluster.secrets.set(`${REF.namespace}/${secret.metadata.name}`, secret);
  w.runner.on('vendir', s.vendir ?? vendirNeedsCredentials);
  const app = structuredClone(w.app()!);
  const out = await runFetch(
    { clusterId: REF.clusterId, ref: REF, run: RUN },
    { raw: structuredClone(app) as never, app },
    w.deps,
  );
  return { w, out, sleeps };
}

/** Fills the placeholder `name` (a new resourceVersion, as the API server's). */
function fill(w: ReturnType<typeof appWorld>, name: string, auths = FILLED_AUTHS, resourceVersion = '2'): void {
  w.cluster.secrets.set(`${REF.namespace}/${name}`, placeholder(name, auths, resourceVersion));
}

const PH = 'app-fetch-0';

describe('fetch retry (§3.6 step 4): Apps', () => {
  it('the placeholder filled during the first wait: vendir runs again with it and the same run succeeds', async () => {
    const { w, out, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (n, world) => n === 1 && fill(world, PH),
    });
    expect(sleeps).toEqual([FETCH_RETRY_INTERVAL_MS]);
    expect(w.tools()).toEqual(['vendir', 'vendir']);
    // the second run was given the filled Secret, the first the empty one
    expect(String(w.runner.calls[0]?.stdin)).toContain(Buffer.from(EMPTY_AUTHS).toString('base64'));
    expect(w.runner.calls.map(hasCredentials)).toEqual([false, true]);
    expect(out.template?.artifacts.fetchKey).toBeDefined();
    expect(w.statuses()).toEqual([
      { ...RECONCILING, fetch: { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW } },
    ]);
    expect(w.outcomes()).toEqual([['fetch', 'succeeded']]);
    // one retry check that found a change, and the password never in a log line
    const checks = w.log.records.filter((r) => r.msg === 'fetch retry check');
    expect(checks.map((r) => [r.obj.retry, r.obj.changed])).toEqual([[1, true]]);
    expect(JSON.stringify(w.log.records)).not.toContain('retry-secret-pw');
  });

  it('filled only before the third check: vendir runs twice, after three waits', async () => {
    const { w, out, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (n, world) => n === 3 && fill(world, PH),
    });
    expect(sleeps).toEqual([2000, 2000, 2000]);
    expect(w.tools()).toEqual(['vendir', 'vendir']);
    expect(out.template).toBeDefined();
  });

  it('unchanged Secrets: three waits, no second vendir run, the first failure is the result', async () => {
    const { w, out, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
    });
    expect(sleeps).toEqual(Array(FETCH_RETRIES).fill(FETCH_RETRY_INTERVAL_MS));
    expect(w.tools()).toEqual(['vendir']);
    expect(out).toEqual({});
    expect(w.statuses()).toEqual([
      finalFailed(VENDIR_FAILED, UNAUTHORIZED, {
        fetch: { exitCode: 1, stderr: UNAUTHORIZED, error: VENDIR_FAILED, startedAt: NOW, updatedAt: NOW },
      }),
    ]);
  });

  it('a change vendir is not given (an annotation, a new resourceVersion) is no reason to run it again', async () => {
    const { w, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (n, world) => fill(world, PH, EMPTY_AUTHS, String(n + 1)),
    });
    expect(sleeps).toHaveLength(3);
    expect(w.tools()).toEqual(['vendir']);
  });

  it('at most 3 retries: a Secret that changes before every check but never works runs vendir 4 times', async () => {
    const { w, out, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (n, world) => fill(world, PH, `{"auths":{"wrong-${n}":{}}}`, String(n + 1)),
    });
    expect(sleeps).toHaveLength(FETCH_RETRIES);
    expect(w.tools()).toEqual(['vendir', 'vendir', 'vendir', 'vendir']);
    expect(out).toEqual({});
    expect(w.statuses().at(-1)?.conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: VENDIR_FAILED },
    ]);
  });

  it('an image source is retried as a bundle is', async () => {
    const { w, out } = await fetchWith({
      spec: { fetch: [{ image: { url: 'registry.example/img:v1', secretRef: { name: PH } } }] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (_n, world) => fill(world, PH),
    });
    expect(w.tools()).toEqual(['vendir', 'vendir']);
    expect(out.template).toBeDefined();
  });

  it('no retry for a fetch without image or imgpkgBundle (git, helmChart, http), even when its Secret changes', async () => {
    for (const fetch of [
      { git: { url: 'https://git.example/r', ref: 'origin/main', secretRef: { name: PH } } },
      { helmChart: { name: 'c', repository: { url: 'https://charts.example', secretRef: { name: PH } } } },
    ]) {
      const { w, sleeps } = await fetchWith({
        spec: { fetch: [fetch] },
        secrets: [placeholder(PH, EMPTY_AUTHS)],
        onSleep: (_n, world) => fill(world, PH),
      });
      expect(sleeps).toEqual([]);
      expect(w.tools()).toEqual(['vendir']);
      expect(w.outcomes()).toEqual([['fetch', 'failed']]);
    }
  });

  it('an image source next to a git source with the Secret: retried (any image or bundle entry counts)', async () => {
    const { w, out } = await fetchWith({
      spec: {
        fetch: [
          { git: { url: 'https://git.example/r', ref: 'origin/main', secretRef: { name: PH } }, path: 'g' },
          { image: { url: 'registry.example/img:v1' }, path: 'i' },
        ],
      },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (_n, world) => fill(world, PH),
    });
    expect(w.tools()).toEqual(['vendir', 'vendir']);
    expect(out.template).toBeDefined();
  });

  it('a bundle that refers to no Secret or ConfigMap fails at once: its config cannot change, no wait', async () => {
    const { w, sleeps } = await fetchWith({ spec: { fetch: [BUNDLE()] } });
    expect(sleeps).toEqual([]);
    expect(w.tools()).toEqual(['vendir']);
    expect(w.outcomes()).toEqual([['fetch', 'failed']]);
  });

  it('a success, or a failure before vendir (missing Secret), is not retried', async () => {
    const ok = await fetchWith({ spec: { fetch: [BUNDLE(PH)] }, secrets: [placeholder(PH, FILLED_AUTHS)] });
    expect([ok.sleeps, ok.w.tools()]).toEqual([[], ['vendir']]);
    const missing = await fetchWith({ spec: { fetch: [BUNDLE(PH)] } });
    expect([missing.sleeps, missing.w.tools()]).toEqual([[], []]);
    expect(missing.w.statuses().at(-1)?.usefulErrorMessage).toBe(`Fetching: secrets "${PH}" not found`);
  });

  it('the Secret deleted before a check: that planning error ends the fetch, over vendir last output', async () => {
    const { w, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (_n, world) => world.cluster.secrets.delete(`${REF.namespace}/${PH}`),
    });
    expect(sleeps).toEqual([2000]);
    expect(w.tools()).toEqual(['vendir']);
    const message = `Fetching: secrets "${PH}" not found`;
    expect(w.statuses()).toEqual([
      finalFailed(message, UNAUTHORIZED, {
        fetch: { exitCode: 1, stderr: UNAUTHORIZED, error: message, startedAt: NOW, updatedAt: NOW },
      }),
    ]);
  });

  it('the function deadline during a wait: no more checks, the first failure is the result', async () => {
    const deadline = new AbortController();
    const { w, sleeps } = await fetchWith({
      spec: { fetch: [BUNDLE(PH)] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      deadline: deadline.signal,
      onSleep: (_n, world) => {
        fill(world, PH);
        deadline.abort();
      },
    });
    expect(sleeps).toEqual([2000]);
    expect(w.tools()).toEqual(['vendir']);
    expect(w.outcomes()).toEqual([['fetch', 'failed']]);
  });

  it('a pinned bundle fetched by a retry leaves no fetch-cache record under the first read Secrets', async () => {
    const pinned = { imgpkgBundle: { image: `registry.example/b@sha256:${'c'.repeat(64)}`, secretRef: { name: PH } } };
    const records = async (w: ReturnType<typeof appWorld>) =>
      (await w.store.list('')).filter((k) => k.includes('/cache/fetch/'));
    const retried = await fetchWith({
      spec: { fetch: [pinned] },
      secrets: [placeholder(PH, EMPTY_AUTHS)],
      onSleep: (_n, world) => fill(world, PH),
    });
    expect(retried.out.template).toBeDefined();
    expect(await records(retried.w)).toEqual([]);
    // the control: the same fetch without a retry leaves its record
    const direct = await fetchWith({ spec: { fetch: [pinned] }, secrets: [placeholder(PH, FILLED_AUTHS)] });
    expect(direct.out.template).toBeDefined();
    expect(await records(direct.w)).toHaveLength(1);
  });
});

// ------------------------------------------------------------------- PackageRepositories

const TEMPLATED: RepoTemplateOutput = {
  result: { stdout: '', stderr: '', exitCode: 0, finished: true },
  manifest: 'apiVersion: data.packaging.carvel.dev/v1alpha1\nkind: Package\n',
  versions: { 'a.example.com': ['1.0.0'] },
};

/** vendir leaving `0/packages/a.yml`, when its stdin carries {@link FILLED_AUTHS}. */
async function repoVendirNeedsCredentials(req: RunRequest): Promise<ScriptedResult> {
  if (!hasCredentials(req)) return { stderr: UNAUTHORIZED, exitCode: 1 };
  await mkdir(path.join(req.cwd ?? '', '0', 'packages'), { recursive: true });
  await writeFile(path.join(req.cwd ?? '', '0', 'packages', 'a.yml'), 'kind: Package\n');
  return { stdout: 'lock: vendir\n' };
}

/** Reconciles a new PackageRepository fetching a bundle by tag without secretRef. */
async function indexWith(onSleep?: (n: number, w: ReturnType<typeof appWorld>) => void) {
  const { sleeps, w } = retryWorld(onSleep, { extra: { templateRepository: async () => TEMPLATED } });
  w.cluster.put({
    apiVersion: PKGR_REF.apiVersion,
    kind: 'PackageRepository',
    metadata: { name: 'repo', namespace: 'ns', uid: 'uid-r', generation: 1, resourceVersion: '1' },
    spec: { fetch: BUNDLE() },
  } as never);
  w.runner.on('vendir', repoVendirNeedsCredentials);
  w.runner.on('kapp', { stdout: 'Succeeded' });
  await dispatchEvent(objectEvent(PKGR_REF, 'added', { time: new Date(NOW) }), w.deps);
  return { w, sleeps };
}

describe('fetch retry (§3.6 step 4): PackageRepositories, as upstream pkg/pkgrepository/app_fetch.go', () => {
  it('its placeholder filled during a wait: the fetch names it, vendir runs again with it, the run deploys', async () => {
    const { w, sleeps } = await indexWith((n, world) => {
      if (n === 1) world.cluster.secrets.set('ns/repo-fetch-0', { ...placeholder('repo-fetch-0', FILLED_AUTHS, '2') });
    });
    expect(sleeps).toEqual([2000]);
    expect(w.tools()).toEqual(['vendir', 'vendir', 'kapp']);
    // anonymous first (the placeholder created unfilled is not named), then with the placeholder
    expect(w.runner.calls[0]?.stdin).not.toContain('repo-fetch-0');
    expect(w.runner.calls[1]?.stdin).toContain('name: repo-fetch-0');
    expect(w.outcomes()).toContainEqual(['index-repo', 'succeeded']);
    // fetched with credentials: sealed for this cluster, never in the fleet-wide cache or index
    expect(await w.store.list('artifacts/fetch/')).toEqual([]);
  });

  it('its placeholder left unfilled: three waits, vendir once, ReconcileFailed', async () => {
    const { w, sleeps } = await indexWith();
    expect(sleeps).toEqual([2000, 2000, 2000]);
    expect(w.tools()).toEqual(['vendir']);
    expect(w.outcomes()).toContainEqual(['index-repo', 'failed']);
  });
});
