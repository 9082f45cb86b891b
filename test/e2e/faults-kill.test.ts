/**
 * e2e fault (issue 7, item 9): the runtime (a separate `scripts/start.ts` process) SIGKILLed
 * while kapp runs: kapp dies with it (PR_SET_PDEATHSIG), the restarted runtime finishes the
 * App, never two kapps at once. The runtime processes serve only this file's namespace, so
 * they hold their own Lease (another namespace scope) and run alongside the other files.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type ChildRuntime,
  childLog,
  kappProcesses,
  kappSampler,
  killGroup,
  slowApp,
  startChildRuntime,
} from './faults-support.js';
import {
  type AppObject,
  apply,
  applyCrds,
  createTenant,
  deleteNamespaces,
  expectSucceeded,
  getApp,
  getObject,
  reconciled,
  succeededAt,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
/** Served only by the child-process runtimes (their own Lease: another namespace scope). */
const CHILD_NS = `e2e-flt-kill-${id}`;

/** Timings, printed at the end (for the report). */
const timings: Record<string, unknown> = {};
const since = (t0: number) => Date.now() - t0;

const children: ChildRuntime[] = [];
let childRoot: string | undefined;

beforeAll(async () => {
  await applyCrds();
  await createTenant(CHILD_NS);
});

afterAll(async () => {
  for (const c of children) await killGroup(c);
  if (childRoot) await rm(childRoot, { recursive: true, force: true });
  await deleteNamespaces([CHILD_NS]);
  process.stderr.write(`[faults-kill] timings ${JSON.stringify(timings, null, 1)}\n`);
});

describe('faults: the runtime process', () => {
  it('the runtime process SIGKILLed while kapp runs: kapp dies with it, the restart converges, one kapp at a time', async () => {
    const ns = CHILD_NS;
    const name = `kill-${id}`;
    childRoot = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-faults-'));
    const storeDir = path.join(childRoot, 'store');
    const first = startChildRuntime(CHILD_NS, storeDir, path.join(childRoot, 'runtime-1.log'));
    children.push(first);
    const t0 = Date.now();
    await waitFor(
      'the child runtime to take the lease',
      async () => (/leader election: acquired lease/.test(childLog(first.logFile)) ? true : undefined),
      { timeoutMs: 90_000, describe: () => childLog(first.logFile).slice(-3000) },
    );
    const leaseMs = since(t0);

    await apply(slowApp(ns, name, 25));
    const kappPid = await waitFor(
      'kapp to run for the App',
      async () => {
        const pids = kappProcesses().get(name);
        return pids && pids.length > 0 && (await getObject('deployment', ns, `${name}-slow`)) ? pids : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 100, describe: () => childLog(first.logFile).slice(-3000) },
    );
    expect(kappPid).toHaveLength(1);
    const killedAt = Date.now();
    await killGroup(first);
    // PR_SET_PDEATHSIG: kapp is killed with its parent.
    await waitFor('kapp to die with the runtime', async () => (kappProcesses().get(name) ? undefined : true), {
      timeoutMs: 5000,
      intervalMs: 50,
    });
    const kappGoneMs = since(killedAt);
    const interrupted = await getApp(ns, name);
    expect(reconciled(interrupted)).toBe(false);

    const sampler = kappSampler();
    try {
      const second = startChildRuntime(CHILD_NS, storeDir, path.join(childRoot, 'runtime-2.log'));
      children.push(second);
      const restartedAt = Date.now();
      let last: AppObject | undefined;
      const converged = succeededAt(1);
      const app = await waitFor(
        `App ${ns}/${name}: ReconcileSucceeded after the restart`,
        async () => {
          last = await getApp(ns, name);
          return last && converged(last) ? last : undefined;
        },
        {
          timeoutMs: 240_000,
          describe: () =>
            `last status: ${JSON.stringify(last?.status ?? null)}\nlog: ${childLog(second.logFile).slice(-3000)}`,
        },
      );
      timings['runtime-sigkill'] = {
        leaseFirstMs: leaseMs,
        kappGoneAfterKillMs: kappGoneMs,
        convergedAfterRestartMs: since(restartedAt),
        kappRunsAfterRestart: sampler.seen.get(name)?.size ?? 0,
        samples: sampler.samples,
      };
      await expectSucceeded(app);
      expect(sampler.max.get(name) ?? 0).toBeLessThanOrEqual(1);
      await killGroup(second);
    } finally {
      sampler.stop();
    }
  }, 500_000);
});
