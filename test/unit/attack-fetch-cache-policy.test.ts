/**
 * The fleet's fetch cache against the URL policy (issue 7 §4): an App of one cluster pins a
 * source another cluster's policy refuses (here a git repository on loopback, standing for an
 * internal host only the first cluster's allow-list admits). The record of the pinned fetch is in
 * the shared store, but the second cluster must not be served the artifact: its fetch fails with
 * the policy's message and no tool runs (`fetchPassesUrlPolicy` in `functions/lib/fetch/run.ts`).
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { PipelineConfig } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { appObject, appWorld, fetchAsRead, SUCCEEDED_BEFORE, vendirWrites } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('attack-fetch-cache-policy-');

const COMMIT = 'a'.repeat(40);
const PINNED = { fetch: [{ git: { url: 'https://127.0.0.1/repo', ref: COMMIT } }] };

async function fetchIn(store: MemoryStore, config: Partial<PipelineConfig>) {
  const w = appWorld({
    app: appObject({ status: SUCCEEDED_BEFORE, spec: PINNED }),
    store,
    tmpRoot: path.join(tempDir(), 'scratch'),
    config,
  });
  w.runner.on('vendir', vendirWrites());
  return { w, out: await fetchAsRead(w) };
}

describe('attack: a pinned fetch record is served only where the URL policy admits its source', () => {
  it('a cluster whose policy refuses the source gets the policy error, not the cached artifact', async () => {
    const store = new MemoryStore();
    const first = await fetchIn(store, { urlPolicy: { mode: 'enforce', allow: ['127.0.0.0/8'] } });
    expect(first.w.tools()).toEqual(['vendir']);
    expect(await store.list('cache/')).not.toEqual([]);

    const refused = await fetchIn(store, { urlPolicy: { mode: 'enforce', allow: [] } });
    expect(refused.w.tools()).toEqual([]);
    expect(refused.out).toEqual({});
    expect(refused.w.outcomes()).toEqual([['fetch', 'failed']]);
    const status = refused.w.statuses().at(-1);
    expect(status?.conditions?.[0]?.type).toBe('ReconcileFailed');
    expect(status?.fetch?.error).toMatch(/^Fetching resources: .*127\.0\.0\.1/);

    // The same record is served where the policy admits the source (the cache itself works).
    const admitted = await fetchIn(store, { urlPolicy: { mode: 'enforce', allow: ['127.0.0.0/8'] } });
    expect(admitted.w.tools()).toEqual([]);
    expect(admitted.w.outcomes()).toEqual([['fetch', 'cached']]);
  });
});
