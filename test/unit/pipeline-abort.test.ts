/**
 * Deleting an App kills its running fetch and templating tools, as it kills kapp during a
 * deploy: the stage ends at once without writing a status (the delete owns the App now).
 * Canceling does not: upstream cannot cancel vendir or the templaters (reference §3.10). Faked at the ports: a kube port whose App is deleted while the tool runs, a runner
 * whose tool runs until its signal aborts (or a safety bound, which fails the test).
 */

import { mkdtemp, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { App } from '../../functions/lib/api/index.js';
import { fetchArtifactKey } from '../../functions/lib/artifact/keys.js';
import { packDir } from '../../functions/lib/artifact/tarball.js';
import { FakeCommandRunner, type ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { CommandCanceledError } from '../../functions/lib/exec/runner.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import { runFetch } from '../../functions/lib/pipeline/fetch.js';
import { runTemplate } from '../../functions/lib/pipeline/template.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { REF } from './support/app-world.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const RUN = { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' };

const APP = {
  apiVersion: REF.apiVersion,
  kind: 'App',
  metadata: { name: 'app', namespace: 'ns', uid: 'uid-1', generation: 1, resourceVersion: '1', finalizers: ['x'] },
  spec: {
    fetch: [{ git: { url: 'https://git.example/big-repo', ref: 'origin/main' } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  },
} as unknown as App;

type Change = 'delete' | 'cancel' | 'recreate' | 'none';

function fakeKube() {
  let current = structuredClone(APP) as unknown as KubeObject & { spec: Record<string, unknown> };
  const statuses: unknown[] = [];
  return {
    statuses,
    change(what: Change) {
      const meta = { ...current.metadata, generation: 2 };
      if (what === 'delete') current = { ...current, metadata: { ...meta, deletionTimestamp: '2025-01-01T00:00:01Z' } };
      if (what === 'cancel') current = { ...current, metadata: meta, spec: { ...current.spec, canceled: true } };
      if (what === 'recreate') current = { ...current, metadata: { ...current.metadata, uid: 'uid-2' } };
    },
    async getObject() {
      return structuredClone(current) as never;
    },
    async updateStatus(_r: unknown, _p: unknown, status: unknown) {
      statuses.push(status);
      return { resourceVersion: '9' };
    },
    async getSecret() {
      return undefined;
    },
    async getConfigMap() {
      return undefined;
    },
    async getNamespace() {
      return undefined;
    },
  };
}

/** A tool that runs until aborted; after 10 s (never in a passing run) it "succeeds". */
function longTool(onStart: () => void, done: ScriptedResult) {
  return async (req: RunRequest): Promise<ScriptedResult> => {
    onStart();
    const aborted = await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), 10_000);
      req.signal?.addEventListener('abort', () => {
        clearTimeout(t);
        resolve(true);
      });
    });
    return aborted ? { error: new CommandCanceledError(req.cmd, true, req.signal?.reason), exitCode: -1 } : done;
  };
}

const tempDir = useTempDir('pipeline-abort-');

function depsWith(kube: ReturnType<typeof fakeKube>, runner: FakeCommandRunner, store = new MemoryStore()) {
  const { deps, log } = stageDeps(kube, {
    runner,
    store,
    tmpRoot: path.join(tempDir(), 'scratch'),
    config: { toolVersions: { vendir: '0.44.0', ytt: '0.55.3' }, abortPollIntervalMs: 1 },
  });
  return { deps, log };
}

describe('fetch: vendir is killed when the App goes away', () => {
  it.each<Change>(['delete', 'recreate'])('%s during vendir: killed, no status written', async (what) => {
    const kube = fakeKube();
    let signal: AbortSignal | undefined;
    const runner = new FakeCommandRunner().on('vendir', (req) =>
      longTool(
        () => {
          signal = req.signal;
          kube.change(what);
        },
        { stdout: 'lock' },
      )(req),
    );
    const { deps, log } = depsWith(kube, runner);
    const out = await runFetch({ clusterId: 'c1', ref: REF, run: RUN }, { raw: APP as never, app: APP }, deps);
    expect(signal?.aborted).toBe(true);
    expect((signal?.reason as Error | undefined)?.message).toBe('App canceled or deleted');
    expect(out).toEqual({});
    expect(kube.statuses).toEqual([]);
    expect(log.records.find((r) => r.msg === 'stage run')?.obj).toMatchObject({ stage: 'fetch', outcome: 'stale' });
  });

  it.each<[string, Change]>([
    ['cancel during vendir: not killed (only kapp is cancellable upstream, reference §3.10)', 'cancel'],
    ['an App that stays: vendir is not killed', 'none'],
  ])('%s; the fetch hands on', async (_title, what) => {
    const kube = fakeKube();
    let signal: AbortSignal | undefined;
    const runner = new FakeCommandRunner().on('vendir', async (req) => {
      signal = req.signal;
      kube.change(what);
      // Let several polls happen while vendir runs.
      await new Promise((r) => setTimeout(r, 30));
      await writeFile(path.join(req.cwd ?? '', 'a.yml'), 'a: 1\n');
      return { stdout: 'lock' };
    });
    const { deps } = depsWith(kube, runner);
    const out = await runFetch({ clusterId: 'c1', ref: REF, run: RUN }, { raw: APP as never, app: APP }, deps);
    expect(signal?.aborted).toBe(false);
    expect(out.template?.artifacts.fetchKey).toMatch(/^artifacts\/fetch\/sha256\//);
  });
});

describe('template: ytt is killed when the App is deleted', () => {
  it('delete during ytt: killed, no status, nothing handed to deploy', async () => {
    const dir = await mkdtemp(path.join(tempDir(), 'src-'));
    await writeFile(path.join(dir, 'a.yml'), 'a: 1\n');
    const packed = await packDir(dir);
    const fetchKey = fetchArtifactKey(packed.sha256);
    const store = new MemoryStore();
    await store.put(fetchKey, packed.tgz);
    const kube = fakeKube();
    let signal: AbortSignal | undefined;
    const runner = new FakeCommandRunner().on('ytt', (req) =>
      longTool(
        () => {
          signal = req.signal;
          kube.change('delete');
        },
        { stdout: 'kind: ConfigMap\n' },
      )(req),
    );
    const { deps } = depsWith(kube, runner, store);
    const out = await runTemplate({ object: REF, run: RUN, artifacts: { fetchKey } }, deps, async () => ({}));
    expect(signal?.aborted).toBe(true);
    expect(out).toEqual({});
    expect(kube.statuses).toEqual([]);
    expect(await store.list('artifacts/template/')).toEqual([]);
  });
});
