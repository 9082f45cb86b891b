/**
 * Shared fixtures of the stage-level unit tests: a temp directory per file and the
 * {@link DispatchDeps} a stage runs with, faked at the ports only (one kube view for fetch and
 * deploy, a memory store, a fake runner, a memory logger, a fixed clock).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import type { FakeCommandRunner } from '../../../functions/lib/exec/fake.js';
import { memoryLogger } from '../../../functions/lib/log.js';
import type { DispatchDeps, PipelineConfig } from '../../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../../functions/lib/store/memory.js';

/**
 * A temp directory for the test file, made before its tests and removed after them.
 *
 * @param prefix - name prefix under the OS temp directory
 * @returns the directory (valid once `beforeAll` has run)
 */
export function useTempDir(prefix: string): () => string {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), prefix));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  return () => dir;
}

/** What {@link stageDeps} takes besides the kube view. */
export interface StageDepsOptions {
  runner: FakeCommandRunner;
  /** Default a new {@link MemoryStore}. */
  store?: MemoryStore;
  /** Fixed clock. Default `2025-01-01T00:00:00Z`. */
  now?: string;
  /** Scratch root of the stages. */
  tmpRoot: string;
  /** Merged over `{ toolVersions: { vendir: '0.44.0' }, controllerVersion: 'v0.53.1' }`. */
  config?: Partial<PipelineConfig>;
  /** Other ports (keyring, download, ...). */
  extra?: Partial<DispatchDeps>;
}

/**
 * Stage deps over one fake kube view (serving as fetch and deploy view).
 *
 * @returns the deps, their memory logger and store
 */
export function stageDeps(kube: unknown, opts: StageDepsOptions) {
  const log = memoryLogger();
  const store = opts.store ?? new MemoryStore();
  const deps: DispatchDeps = {
    clusters: {
      fetchView: () => kube,
      deployView: () => kube,
      installView: () => kube,
    } as unknown as DispatchDeps['clusters'],
    store,
    runner: opts.runner,
    now: () => new Date(opts.now ?? '2025-01-01T00:00:00Z'),
    log,
    clusterInfo: async () => ({}),
    ...opts.extra,
    config: {
      tmpRoot: opts.tmpRoot,
      toolVersions: { vendir: '0.44.0' },
      controllerVersion: 'v0.53.1',
      ...opts.config,
    },
  };
  return { deps, log, store };
}
