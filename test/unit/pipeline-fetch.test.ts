/**
 * The fetch stage over its outcomes (review R6): one row per outcome, each asserting the exact
 * status writes, the exact hand-off to the template stage (the next event's data) and the stage's
 * logged outcome. Called through `runFetch` with the App as the reconcile step read it. Faked at
 * the ports: the shared fake cluster, the fake runner (vendir), a memory store.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { AppStatus } from '../../functions/lib/api/index.js';
import type { StageOutput } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  type AppShape,
  type AppWorld,
  appObject,
  appWorld,
  changeApp,
  fetchAsRead,
  finalFailed,
  NOW,
  RECONCILING,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
  vendirWrites,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-fetch-');

/** The fetch part of a vendir run that printed `lock: vendir\n`. */
const FETCH_OK = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };
const VENDIR_FAILED = 'Fetching resources: Error (see .status.usefulErrorMessage for details)';
const INVALID_PATH = 'Fetching (0): Invalid path: ../up';
const INLINE = { fetch: [{ inline: { paths: { 'config.yml': 'a: 1\n' } } }] };

interface Row {
  app: AppShape;
  /** Scripts vendir (default: succeeds). */
  vendir?: (w: AppWorld) => Parameters<AppWorld['runner']['on']>[1];
  /** Runs the fetch once before the row (a warm cache, same store). */
  warm?: boolean;
  statuses: AppStatus[];
  /** Whether the template stage is handed the fetch (its data is then checked exactly). */
  next: boolean;
  outcome: string;
  tools: string[];
}

const rows: Record<string, Row> = {
  'succeeded, deferred (resync run): nothing written, the fetch part rides the event': {
    app: { status: SUCCEEDED_BEFORE },
    statuses: [],
    next: true,
    outcome: 'succeeded',
    tools: ['vendir'],
  },
  'succeeded, immediate (Reconciling): the fetch part is written now': {
    app: { status: RECONCILING },
    statuses: [{ ...RECONCILING, fetch: FETCH_OK }],
    next: true,
    outcome: 'succeeded',
    tools: ['vendir'],
  },
  'cached: a pinned fetch whose artifact exists runs no vendir and keeps its lock output': {
    app: { status: SUCCEEDED_BEFORE, spec: INLINE },
    warm: true,
    statuses: [],
    next: true,
    outcome: 'cached',
    tools: [],
  },
  'failed: vendir exits 1, the final status is written (even when deferred)': {
    app: { status: SUCCEEDED_BEFORE },
    vendir: () => ({ stdout: 'partial', stderr: 'fatal: repository not found', exitCode: 1 }),
    statuses: [
      finalFailed(VENDIR_FAILED, 'fatal: repository not found', {
        fetch: {
          exitCode: 1,
          stdout: 'partial',
          stderr: 'fatal: repository not found',
          error: VENDIR_FAILED,
          startedAt: NOW,
          updatedAt: NOW,
        },
      }),
    ],
    next: false,
    outcome: 'failed',
    tools: ['vendir'],
  },
  'invalid: a fetch the planner refuses fails before vendir runs': {
    app: { status: SUCCEEDED_BEFORE, spec: { fetch: [{ git: { url: 'https://git.example/r' }, path: '../up' }] } },
    statuses: [
      finalFailed(INVALID_PATH, INVALID_PATH, {
        fetch: { exitCode: -1, error: INVALID_PATH, startedAt: NOW, updatedAt: NOW },
      }),
    ],
    next: false,
    outcome: 'failed',
    tools: [],
  },
  'paused: an App held when read runs nothing and writes nothing': {
    app: { status: SUCCEEDED_BEFORE, spec: { paused: true } },
    statuses: [],
    next: false,
    outcome: 'paused',
    tools: [],
  },
  'stale, immediate: the spec changed while vendir ran, the write is dropped and nothing is handed on': {
    app: { status: RECONCILING },
    vendir: (w) => vendirWrites(undefined, () => changeApp(w, 'generation')),
    statuses: [],
    next: false,
    outcome: 'stale',
    tools: ['vendir'],
  },
  'stale, deferred: nothing is written, the hand-off goes on (the template stage stops it)': {
    app: { status: SUCCEEDED_BEFORE },
    vendir: (w) => vendirWrites(undefined, () => changeApp(w, 'generation')),
    statuses: [],
    next: true,
    outcome: 'succeeded',
    tools: ['vendir'],
  },
  'stale, failed: the final status of a run whose spec changed meanwhile is dropped': {
    app: { status: SUCCEEDED_BEFORE },
    vendir: (w) => async () => {
      changeApp(w, 'generation');
      return { stderr: 'boom', exitCode: 1 };
    },
    statuses: [],
    next: false,
    outcome: 'stale',
    tools: ['vendir'],
  },
  'gone: the App was recreated while vendir ran, nothing is written for the new one': {
    app: { status: RECONCILING },
    vendir: (w) => vendirWrites(undefined, () => changeApp(w, 'recreated')),
    statuses: [],
    next: false,
    outcome: 'gone',
    tools: ['vendir'],
  },
};

async function fetchOnce(row: Row, store: MemoryStore) {
  const w = appWorld({ app: appObject(row.app), store, tmpRoot: path.join(tempDir(), 'scratch') });
  w.runner.on('vendir', row.vendir ? row.vendir(w) : vendirWrites());
  return { w, out: await fetchAsRead(w) };
}

describe('fetch stage table', () => {
  it.each(Object.entries(rows))('%s', async (_name, row) => {
    const store = new MemoryStore();
    if (row.warm) await fetchOnce(row, store);
    const { w, out } = await fetchOnce(row, store);
    expect(w.statuses()).toEqual(row.statuses);
    const fetchKeys = await store.list('artifacts/fetch/');
    const want: StageOutput = row.next
      ? {
          template: {
            object: REF,
            run: RUN,
            artifacts: { fetchKey: fetchKeys[0] ?? 'none' },
            fetchStatus: { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW },
          },
        }
      : {};
    expect(out).toEqual(want);
    expect(w.outcomes()).toEqual([['fetch', row.outcome]]);
    expect(w.tools()).toEqual(row.tools);
  });
});
