/**
 * Deleting an App kills its running fetch and templating tools, as it kills kapp during a
 * deploy: the stage ends at once without writing a status (the delete owns the App now).
 * Canceling does not: upstream cannot cancel vendir or the templaters (reference §3.10). Faked at the ports: a fake cluster whose App is deleted while the tool runs, a runner
 * whose tool runs until its signal aborts (or a safety bound, which fails the test).
 */

import { mkdtemp, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { fetchArtifactKey } from '../../functions/lib/artifact/keys.js';
import { packDir } from '../../functions/lib/artifact/tarball.js';
import type { ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { CommandCanceledError } from '../../functions/lib/exec/runner.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { runTemplate } from '../../functions/lib/pipeline/app/template.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { type AppWorld, appObject, appWorld, REF } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const RUN = { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' };

const APP = appObject({
  metadata: { finalizers: ['x'] },
  spec: { fetch: [{ git: { url: 'https://git.example/big-repo', ref: 'origin/main' } }] },
});

type Change = 'delete' | 'cancel' | 'recreate' | 'none';

/** Changes the stored App while a tool runs (its resourceVersion kept, as the stage's copy). */
function change(world: AppWorld, what: Change) {
  const obj = world.cluster.get('App', REF.namespace, REF.name);
  if (!obj) throw new Error('no App to change');
  if (what === 'delete' || what === 'cancel') obj.metadata.generation = 2;
  if (what === 'delete') obj.metadata.deletionTimestamp = '2025-01-01T00:00:01Z';
  if (what === 'cancel') obj.spec = { ...(obj.spec as object), canceled: true };
  if (what === 'recreate') obj.metadata.uid = 'uid-2';
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

/** The App in the table world, polled for an abort every 1 ms. */
const worldOf = (store?: MemoryStore) =>
  appWorld({ app: APP, store, tmpRoot: path.join(tempDir(), 'scratch'), config: { abortPollIntervalMs: 1 } });

describe('fetch: vendir is killed when the App goes away', () => {
  it.each<Change>(['delete', 'recreate'])('%s during vendir: killed, no status written', async (what) => {
    const w = worldOf();
    let signal: AbortSignal | undefined;
    w.runner.on('vendir', (req) =>
      longTool(
        () => {
          signal = req.signal;
          change(w, what);
        },
        { stdout: 'lock' },
      )(req),
    );
    const { deps, log } = w;
    const out = await runFetch({ clusterId: 'c1', ref: REF, run: RUN }, { raw: APP as never, app: APP }, deps);
    expect(signal?.aborted).toBe(true);
    expect((signal?.reason as Error | undefined)?.message).toBe('App canceled or deleted');
    expect(out).toEqual({});
    expect(w.statuses()).toEqual([]);
    expect(log.records.find((r) => r.msg === 'stage run')?.obj).toMatchObject({ stage: 'fetch', outcome: 'stale' });
  });

  it.each<[string, Change]>([
    ['cancel during vendir: not killed (only kapp is cancellable upstream, reference §3.10)', 'cancel'],
    ['an App that stays: vendir is not killed', 'none'],
  ])('%s; the fetch hands on', async (_title, what) => {
    const w = worldOf();
    let signal: AbortSignal | undefined;
    w.runner.on('vendir', async (req) => {
      signal = req.signal;
      change(w, what);
      // Several polls read the changed App while vendir runs (counted, not slept for: a loaded
      // machine could let a fixed sleep pass before any poll, and the test would prove nothing).
      const reads = () => w.cluster.calls.filter((c) => c[0] === 'get' && c[1] === REF.name).length;
      const before = reads();
      while (reads() < before + 3) await new Promise((r) => setTimeout(r, 1));
      await writeFile(path.join(req.cwd ?? '', 'a.yml'), 'a: 1\n');
      return { stdout: 'lock' };
    });
    const { deps } = w;
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
    const w = worldOf(store);
    let signal: AbortSignal | undefined;
    w.runner.on('ytt', (req) =>
      longTool(
        () => {
          signal = req.signal;
          change(w, 'delete');
        },
        { stdout: 'kind: ConfigMap\n' },
      )(req),
    );
    const { deps } = w;
    const out = await runTemplate({ object: REF, run: RUN, artifacts: { fetchKey } }, deps, async () => ({}));
    expect(signal?.aborted).toBe(true);
    expect(out).toEqual({});
    expect(w.statuses()).toEqual([]);
    expect(await store.list('artifacts/template/')).toEqual([]);
  });
});
