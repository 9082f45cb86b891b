/**
 * e2e: a runtime that loses its cluster's Lease while kapp deploys stops that kapp at once and
 * writes nothing more (`events/forwarder/leadership.ts`, `functions/embedded/leadership.ts`):
 * another holder takes the Lease over (written here with kubectl and kept renewed, as a second
 * runtime would), the runtime's next
 * renewal sees it, the deploy stage's term signal aborts, the runner kills kapp's process group,
 * and the App's status is left to the new leader (no `ReconcileFailed` from the ex-leader); the
 * stage is parked until this runtime leads again.
 * Before this, the kapp ran to its end beside the new leader's.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { leaseNameFor } from '../../events/forwarder/leadership.js';
import {
  apply,
  applyCrds,
  appManifest,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  getApp,
  getObject,
  k,
  PRODUCTION_LEASE,
  pendingDeployment,
  startRuntime,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-lease-loss-${id}`;
const NAME = `waits-${id}`;

let rt: E2ERuntime;

/** Pids of kapp processes deploying this test's App (its app name is `<App>-ctrl`). */
function kappPids(): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
    } catch {
      continue; // gone meanwhile
    }
    if (argv[0]?.endsWith('kapp') && argv.includes('deploy') && argv.some((a) => a.includes(`${NAME}-ctrl`))) {
      pids.push(Number(entry));
    }
  }
  return pids;
}

/** Writes the Lease as another runtime holding it now (renewed each call). */
async function otherHoldsLease(): Promise<void> {
  const renewTime = new Date().toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
  const spec = { holderIdentity: 'other-runtime', leaseDurationSeconds: 15, renewTime };
  await k([
    '-n',
    'kapp-lambda',
    'patch',
    'lease',
    leaseNameFor([NS]),
    '--type',
    'merge',
    '-p',
    JSON.stringify({ spec }),
  ]);
}

beforeAll(async () => {
  await applyCrds();
  await createTenant(NS);
  rt = await startRuntime([NS], PRODUCTION_LEASE);
});

afterAll(async () => {
  await rt?.dispose();
  await deleteNamespaces([NS]);
});

describe('losing the Lease while kapp deploys', () => {
  it('kills the running kapp and writes no status as the ex-leader', { timeout: 240_000 }, async () => {
    const [clusterId] = rt.runtime.registry.clusterIds();
    await waitFor('the runtime to lead', async () => (rt.runtime.leading().includes(clusterId!) ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 100,
    });
    // A Deployment that never becomes available (no node matches): kapp keeps waiting on it.
    const deployment = pendingDeployment(`${NAME}-stuck`, NAME, 'kapp-lambda.test/no-such-node');
    await apply(
      appManifest(NS, NAME, {
        fetch: [{ inline: { paths: { 'deployment.yml': deployment } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: { rawOptions: ['--wait-timeout=180s'] } }],
      }),
    );
    await waitFor('kapp to create the Deployment', async () =>
      (await getObject('deployment', NS, `${NAME}-stuck`)) ? true : undefined,
    );
    const running = await waitFor('the kapp process', async () => (kappPids().length > 0 ? kappPids() : undefined));
    expect(running.length).toBe(1);

    // Another runtime takes the Lease over and keeps it.
    await otherHoldsLease();
    const keep = setInterval(() => void otherHoldsLease().catch(() => undefined), 2000);
    try {
      await waitFor('the runtime to stop leading', async () => (rt.runtime.leading().length === 0 ? true : undefined), {
        timeoutMs: 20_000,
        intervalMs: 100,
      });
      await waitFor('kapp to be killed', async () => (kappPids().length === 0 ? true : undefined), {
        timeoutMs: 20_000,
        intervalMs: 200,
      });
      // Parked (not retried against the bound): it runs again when this runtime leads again.
      const crash = await waitFor('the deploy stage to end as not the leader', async () =>
        rt
          .logsFor(NS, NAME)
          .find((r) => r.msg?.startsWith('stage parked') && String(r.obj.error).startsWith('not the leader')),
      );
      expect(crash.obj.error).toBe(
        `not the leader of cluster ${JSON.stringify(clusterId)}: another runtime holds its lease`,
      );
      // No deploy outcome was written by the ex-leader: the status is still the running one.
      const after = await getApp(NS, NAME);
      expect(after?.status?.conditions?.map((c) => c.type)).toEqual(['Reconciling']);
      expect(rt.stageRuns(NS, NAME).filter((r) => r.stage === 'deploy')).toEqual([]);
      await new Promise((r) => setTimeout(r, 3000));
      expect((await getApp(NS, NAME))?.status).toEqual(after?.status);
      expect(kappPids()).toEqual([]);
    } finally {
      clearInterval(keep);
    }
  });
});
