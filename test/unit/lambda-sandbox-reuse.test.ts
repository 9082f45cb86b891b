/**
 * On Lambda every tool shares the function's uid (issue 7), so what keeps two Apps' tools apart
 * is how many records one execution environment runs at once and that it leaves no run's files
 * to the next: the Runtime API loop takes one invocation at a time (`runtime-api.ts`), the
 * handler runs at most `recordConcurrency` records of a batch at once (1: one after another, as
 * here; the deployed functions' bounds are pinned by the infra test, and docs/security.md says
 * what overlapping records can reach), every run removes its directories, and a cold start
 * removes what a process ended mid-run left (`removeLeftoverScratch`).
 */
import { mkdir, readdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { type ObjectRef, objectEvent, objectRefOf, orderingKey, serializeEvent } from '../../events/schema.js';
import { type EntryDeps, makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { makeRunDirs } from '../../functions/lib/exec/sandbox.js';
import { makeScratch, removeLeftoverScratch, SCRATCH_PREFIXES } from '../../functions/lib/exec/scratch.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps, PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('sandbox-reuse-');

const app = (name: string, namespace: string): ObjectRef => ({
  clusterId: 'prod-eu-1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace,
  name,
  uid: `uid-${namespace}-${name}`,
  generation: 1,
  resourceVersion: '1',
});

describe('one Lambda execution environment, one record at a time', () => {
  it("with a record concurrency of 1 (the handler's default), runs a batch's records one after another, never two Apps' stages at once", async () => {
    let inFlight = 0;
    let most = 0;
    const order: string[] = [];
    const deps: EntryDeps = {
      pipeline: {} as DispatchDeps,
      sender: new MemoryEventSender(),
      log: memoryLogger(),
      dispatch: async (event) => {
        inFlight += 1;
        most = Math.max(most, inFlight);
        order.push(`start ${event.subject}`);
        await sleep(20);
        order.push(`end ${event.subject}`);
        inFlight -= 1;
        return undefined;
      },
    };
    const handler = makeSqsHandler('fetch', () => deps);
    const refs = [app('a', 'team-1'), app('b', 'team-2'), app('c', 'team-3')];
    const Records = refs.map((ref, i) => {
      const ev = objectEvent(ref, 'modified', { time: '2025-01-02T03:04:05.000Z' });
      return {
        messageId: `m${i}`,
        body: serializeEvent(ev),
        attributes: { MessageGroupId: orderingKey(objectRefOf(ev)), ApproximateReceiveCount: '1' },
      };
    });
    expect(await handler({ Records })).toEqual({ batchItemFailures: [] });
    expect(most).toBe(1);
    expect(order).toEqual(
      refs.flatMap((r) => [
        `start prod-eu-1/App/${r.namespace}/${r.name}`,
        `end prod-eu-1/App/${r.namespace}/${r.name}`,
      ]),
    );
  });
});

describe('removeLeftoverScratch', () => {
  it('removes the scratch and run directories an earlier process left, nothing else', async () => {
    const root = tempDir();
    const deps = { config: { tmpRoot: root } } as PipelineDeps;
    const left = [
      ...(await Promise.all(SCRATCH_PREFIXES.map((p) => makeScratch(deps, p)))),
      (await makeRunDirs(root)).root,
    ].map((d) => path.basename(d));
    // What an interrupted run leaves: another App's fetched source inside its scratch.
    await writeFile(path.join(root, left[0] as string, 'values.yml'), 'password: x\n');
    const kept = ['fetch', 'fetch-too-long-name', 'deployments', 'run-x', 'other-abcdef', '.cache'];
    for (const k of kept) await mkdir(path.join(root, k));
    await writeFile(path.join(root, 'template-ABCDEF.txt'), 'not ours');
    const removed = await removeLeftoverScratch(root);
    expect(removed.sort()).toEqual([...left].sort());
    expect((await readdir(root)).sort()).toEqual([...kept, 'template-ABCDEF.txt'].sort());
  });

  it('a missing root removes nothing and does not throw', async () => {
    await expect(removeLeftoverScratch(path.join(tempDir(), 'absent'))).resolves.toEqual([]);
  });
});
