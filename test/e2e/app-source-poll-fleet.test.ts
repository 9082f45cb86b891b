/**
 * e2e: a moved git branch reaches the Apps of two cluster ids as events (issue 24 item 2). Two
 * cluster ids, each served by its own embedded runtime, share one object store (as a fleet shares
 * one bucket); each holds an App fetching the same branch of a repo on the local git smart-HTTP
 * server (`syncPeriod: 1h`: only the source poll can explain an update during the test). The
 * first runtime polls the fleet's sources every 2 s; the second every 10 min, so its App learns
 * of the move from its record checks (store reads every 2 s). A commit moves the branch; one
 * resolution sees it for the fleet (counted as the repository test counts them: the poll's
 * "source moved" log records), `ref-changed` reaches both Apps, and both deploy the new content,
 * fetched once for the fleet (the pinned fetch cache: one vendir run names the new commit).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRepo, publishFile } from '../harness/fixtures.js';
import { type E2EFleet, fleetLog, sourceMoves, startFleet } from './packaging-support.js';
import {
  apply,
  appManifest,
  configMapYaml,
  type E2ERuntime,
  getObject,
  servers,
  succeededAt,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
const CLUSTERS = [
  { context: `srcpoll-a-${id}`, ns: `e2e-srcpoll-a-${id}` },
  { context: `srcpoll-b-${id}`, ns: `e2e-srcpoll-b-${id}` },
] as const;
const REPO = `e2e-srcpoll-${id}/config`;
const POLL_PERIOD_MS = 2000;

let fleet: E2EFleet | undefined;
let runtimes: E2ERuntime[] = [];
/** The stdin of every vendir run, both runtimes. */
const vendirConfigs: string[] = [];

/** The repo's one file: a ConfigMap `greeting` with `data.greeting`. */
const tree = (greeting: string) => ({ 'cm.yml': configMapYaml('greeting', { greeting }) });

beforeAll(async () => {
  fleet = await startFleet(CLUSTERS, {
    prefix: 'kapp-lambda-e2e-srcpoll-',
    pollPeriodMs: POLL_PERIOD_MS,
    onToolRun: (req) => {
      if (req.cmd === 'vendir') vendirConfigs.push(typeof req.stdin === 'string' ? req.stdin : '');
    },
  });
  runtimes = fleet.runtimes;
});

afterAll(async () => {
  await fleet?.dispose();
});

/** Waits until the ConfigMap `name` the App deployed in `ns` says `greeting`. */
async function waitGreeting(ns: string, greeting: string, name = 'greeting'): Promise<void> {
  let last: unknown;
  await waitFor(
    `ConfigMap ${ns}/${name} at ${greeting}`,
    async () => {
      last = await getObject<{ data?: Record<string, string> }>('configmap', ns, name);
      return (last as { data?: Record<string, string> } | undefined)?.data?.greeting === greeting ? true : undefined;
    },
    {
      timeoutMs: 120_000,
      intervalMs: 500,
      describe: () => `last: ${JSON.stringify(last ?? null)}\nlog: ${fleetLog(runtimes, /source|stage run/)}`,
    },
  );
}

/** Log records of the source poll seeing the branch move, across both runtimes. */
const moves = () => sourceMoves(runtimes);

describe('App on a git branch: a move reaches the fleet as events', () => {
  it('a new commit on the branch: one resolution for both cluster ids, one fetch, both Apps deploy it without a sync timer', async () => {
    const first = await createRepo(servers().git, REPO, tree('one'));
    for (const c of CLUSTERS) {
      await apply(
        appManifest(c.ns, 'app', {
          syncPeriod: '1h',
          fetch: [{ git: { url: first.url, ref: 'origin/main' } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        }),
      );
    }
    for (const [i, c] of CLUSTERS.entries()) {
      await runtimes[i]!.waitForApp(c.ns, 'app', succeededAt(1));
      await waitGreeting(c.ns, 'one');
    }
    const movesBefore = moves().length;

    const second = await createRepo(servers().git, REPO, tree('two'));
    for (const c of CLUSTERS) await waitGreeting(c.ns, 'two');

    // One poller saw the branch move (one resolution won the period), for both cluster ids.
    expect(moves().length - movesBefore).toBe(1);
    // One fetch of the new commit for the fleet: the other App reused the pinned fetch.
    expect(vendirConfigs.filter((v) => v.includes(second.commitSha))).toHaveLength(1);
    for (const [i, c] of CLUSTERS.entries()) {
      // The ConfigMap is deployed before the run's status write lands: wait for the status of
      // the run that fetched the new commit, not the one before it.
      const app = await runtimes[i]!.waitForApp(
        c.ns,
        'app',
        (a) => succeededAt(1)(a) && (a.status?.fetch?.stdout?.includes(second.commitSha) ?? false),
        'the status of the run that fetched the new commit',
      );
      // vendir's lock config, as a fetch of the branch gives it: the commit, not the ref.
      expect(app.status?.fetch?.stdout, c.context).toContain(second.commitSha);
      expect(app.status?.fetch?.stdout).not.toContain('origin/main');
      // Reconciled by the poll's event: the App's own run says why.
      const causes = runtimes[i]!.records.filter(
        (r) => r.msg === 'reconciling for a moved source' && String(r.obj.cause).includes(second.commitSha),
      );
      expect(causes.length, c.context).toBeGreaterThan(0);
    }
  }, 300_000);
});

describe('App on an http file without sha256: a new file reaches the fleet as events', () => {
  it("a new file under the URL: one resolution (the body's sha256) for both cluster ids, both Apps deploy it", async () => {
    const file = `e2e-srcpoll-${id}/cm.yml`;
    const cm = (greeting: string) => configMapYaml('greeting-http', { greeting });
    const first = await publishFile(servers().http, file, cm('one'));
    for (const c of CLUSTERS) {
      await apply(
        appManifest(c.ns, 'app-http', {
          syncPeriod: '1h',
          fetch: [{ http: { url: first.url } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        }),
      );
    }
    for (const c of CLUSTERS) await waitGreeting(c.ns, 'one', 'greeting-http');
    const urlMoves = () => moves().filter((r) => r.obj.source === first.url).length;
    const movesBefore = urlMoves();

    const second = await publishFile(servers().http, file, cm('two'));
    for (const c of CLUSTERS) await waitGreeting(c.ns, 'two', 'greeting-http');
    // One poller saw the new body for the fleet; each App was reconciled by the poll's event.
    expect(urlMoves() - movesBefore).toBe(1);
    for (const [i, c] of CLUSTERS.entries()) {
      const causes = runtimes[i]!.records.filter(
        (r) => r.msg === 'reconciling for a moved source' && String(r.obj.cause).includes(second.sha256),
      );
      expect(causes.length, c.context).toBeGreaterThan(0);
    }
  }, 300_000);
});
