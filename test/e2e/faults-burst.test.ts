/**
 * e2e fault (issue 7, item 9): the forwarder SIGKILLed during a burst of 200 App creations.
 * In the embedded default the forwarder and the pipeline are one process (`scripts/start.ts`),
 * so the whole runtime is killed, mid-burst, and a new one started: every App must reach a
 * terminal condition (here ReconcileSucceeded, the Apps are valid), and no App may ever have
 * two kapp runs at once (sampled from /proc during the whole test). The restarted forwarder
 * knows nothing of the first one's queue: it relists, and sends `added` for objects without a
 * status or still `Reconciling`.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ChildRuntime, childLog, kappSampler, killGroup, startChildRuntime } from './faults-support.js';
import {
  type AppObject,
  apply,
  applyCrds,
  createTenant,
  deleteNamespaces,
  inlineConfigMapApp,
  k,
  succeededAt,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-flt-burst-${id}`;
/** The burst size the issue names. */
const APPS = 200;
/** Succeeded Apps before the kill: mid-burst, most Apps still queued or running. */
const KILL_AFTER = 40;

const timings: Record<string, unknown> = {};
const children: ChildRuntime[] = [];
let root: string | undefined;

beforeAll(async () => {
  await applyCrds();
  await createTenant(NS);
});

afterAll(async () => {
  for (const c of children) await killGroup(c);
  if (root) await rm(root, { recursive: true, force: true });
  await deleteNamespaces([NS]);
  process.stderr.write(`[faults-burst] timings ${JSON.stringify(timings, null, 1)}\n`);
});

/** Every App of the namespace, one kubectl list. */
async function listApps(): Promise<AppObject[]> {
  const r = await k(['get', 'apps', '-n', NS, '-o', 'json']);
  return (JSON.parse(r.stdout) as { items: AppObject[] }).items;
}

const succeeded = succeededAt(1);
const terminal = (a: AppObject) =>
  a.status?.observedGeneration === a.metadata.generation &&
  (a.status?.conditions ?? []).some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed');

describe('faults: the forwarder during a burst', () => {
  it(`SIGKILLed during a burst of ${APPS} App creations: every App reaches a terminal condition, never two kapps for one App`, async () => {
    root = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-burst-'));
    const storeDir = path.join(root, 'store');
    const first = startChildRuntime(NS, storeDir, path.join(root, 'runtime-1.log'));
    children.push(first);
    await waitFor(
      'the child runtime to take the lease',
      async () => (/leader election: acquired lease/.test(childLog(first.logFile)) ? true : undefined),
      { timeoutMs: 90_000, describe: () => childLog(first.logFile).slice(-3000) },
    );
    const sampler = kappSampler();
    try {
      const t0 = Date.now();
      const names = Array.from({ length: APPS }, (_, i) => `burst-${id}-${i}`);
      // One burst: every App created at once (one List), as a team applying a directory would.
      await apply(...names.map((n) => inlineConfigMapApp(NS, n, n)));
      const before = await waitFor(
        `${KILL_AFTER} Apps to succeed before the kill`,
        async () => {
          const done = (await listApps()).filter(succeeded).length;
          return done >= KILL_AFTER ? done : undefined;
        },
        { timeoutMs: 300_000, intervalMs: 250, describe: () => childLog(first.logFile).slice(-3000) },
      );
      await killGroup(first);
      const killedAt = Date.now();
      const afterKill = await listApps();
      const unfinished = afterKill.filter((a) => !terminal(a)).length;
      // The kill really was mid-burst: work was left for the restarted runtime.
      expect(unfinished).toBeGreaterThan(0);

      const second = startChildRuntime(NS, storeDir, path.join(root, 'runtime-2.log'));
      children.push(second);
      let last: AppObject[] = [];
      await waitFor(
        `all ${APPS} Apps to reach a terminal condition after the restart`,
        async () => {
          last = await listApps();
          return last.length === APPS && last.every(terminal) ? true : undefined;
        },
        {
          timeoutMs: 480_000,
          intervalMs: 1000,
          describe: () =>
            `not terminal: ${last
              .filter((a) => !terminal(a))
              .map((a) => a.metadata.name)
              .slice(0, 20)
              .join(', ')}\nlog: ${childLog(second.logFile).slice(-3000)}`,
        },
      );
      timings.burst = {
        apps: APPS,
        succeededBeforeKill: before,
        unfinishedAtKill: unfinished,
        restartToAllTerminalMs: Date.now() - killedAt,
        totalMs: Date.now() - t0,
        appsWithKapp: sampler.max.size,
        samples: sampler.samples,
      };
      // Valid Apps: terminal means succeeded, each for its one generation.
      expect(last.filter((a) => !succeeded(a)).map((a) => a.metadata.name)).toEqual([]);
      // Never two kapp runs for one App at once, across the kill and the restart.
      const doubled = [...sampler.max].filter(([app, n]) => app.startsWith(`burst-${id}-`) && n > 1);
      expect(doubled).toEqual([]);
      // The sampler did see the kapp runs it judges.
      expect([...sampler.max.keys()].filter((app) => app.startsWith(`burst-${id}-`)).length).toBeGreaterThan(0);
      await killGroup(second);
    } finally {
      sampler.stop();
    }
  }, 900_000);
});
