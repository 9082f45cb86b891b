/**
 * e2e: an upgrade reaches the fleet as events (issue 10 item 5). Two cluster ids, each served by
 * its own embedded runtime, share one object store (as a fleet shares one bucket); each holds a
 * PackageRepository on the same imgpkg bundle *by tag* in the local registry and a PackageInstall
 * with `constraints: ">=1.0.0"` (sync periods 10m: no timer fires during the test). A new bundle
 * with version 2.0.0 is pushed under the same tag; the first runtime's source poll (period 2 s
 * here) resolves the tag with one manifest `HEAD` for the fleet, its member (the first: the
 * leader) fetches and templates the new digest once, the other finds its index and runs kapp
 * only, and both PackageInstalls report 2.0.0 (`status.version`, `lastAttemptedVersion`). The
 * second runtime polls every 10 min: only its record checks between polls (store reads, every
 * 2 s by default) can tell it that the leader deployed the new digest, as a runtime of a fleet
 * learns what another runtime's poll and leader did.
 *
 * Tool runs are counted from the runtimes' command runners (wrapped): the repository's fetch is
 * the vendir run whose config names the bundle; its template pipeline the ytt and kbld runs in an
 * `index-repo-` scratch (the PackageInstalls' Apps run their own vendir, ytt and kapp besides).
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { pushBundle } from '../harness/fixtures.js';
import {
  type E2EFleet,
  fleetLog,
  fleetPackageInstall,
  inlineConfigMapPackageDoc,
  PKGR_STATUS_KEYS,
  sourceMoves,
  startFleet,
  waitRepo,
} from './packaging-support.js';
import { apply, type E2ERuntime, expectSucceededStatus, getObject, servers, suffix, waitFor } from './support.js';

const id = suffix();
const CLUSTERS = [
  { context: `upfleet-a-${id}`, ns: `e2e-upfleet-a-${id}`, name: `repo-${id}` },
  { context: `upfleet-b-${id}`, ns: `e2e-upfleet-b-${id}`, name: `mirror-${id}` },
] as const;
const REF_NAME = 'upfleet.e2e.carvel.dev';
const PKGI = 'packageinstalls.packaging.carvel.dev';
const POLL_PERIOD_MS = 2000;

/** A Package of `version`: an inline ytt ConfigMap named `upfleet`. */
function packageDoc(version: string): object {
  return inlineConfigMapPackageDoc(REF_NAME, version, 'upfleet');
}

/** The repository bundle's files for `versions`. */
function bundle(versions: string[]): Record<string, string> {
  const files: Record<string, string> = {
    [`packages/${REF_NAME}/metadata.yml`]: stringify({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'PackageMetadata',
      metadata: { name: REF_NAME },
      spec: { displayName: 'Upgrade fleet' },
    }),
  };
  for (const v of versions) files[`packages/${REF_NAME}/${v}.yml`] = stringify(packageDoc(v));
  return files;
}

interface PkgiObject {
  status?: { version?: string; lastAttemptedVersion?: string; conditions?: Array<{ type: string }> };
}

/** One recorded tool run: the tool and what tells a repository's run from an App's. */
interface Run {
  cmd: string;
  repoFetch: boolean;
  inRepoScratch: boolean;
}

let fleet: E2EFleet | undefined;
let runtimes: E2ERuntime[] = [];
const runs: Run[] = [];
let tagRef = '';

beforeAll(async () => {
  tagRef = (await pushBundle(servers().registry, `upfleet-${id}:latest`, bundle(['1.0.0']))).ref;
  fleet = await startFleet(CLUSTERS, {
    prefix: 'kapp-lambda-e2e-upfleet-',
    pollPeriodMs: POLL_PERIOD_MS,
    onToolRun: (req) => {
      const stdin = typeof req.stdin === 'string' ? req.stdin : '';
      const places = [req.cwd ?? '', ...(req.writable ?? []), ...req.args].join(' ');
      runs.push({
        cmd: req.cmd,
        repoFetch: req.cmd === 'vendir' && stdin.includes('imgpkgBundle'),
        inRepoScratch: places.includes(`${path.sep}index-repo-`),
      });
    },
  });
  runtimes = fleet.runtimes;
});

afterAll(async () => {
  await fleet?.dispose();
});

/** The repositories' tool runs since `from`: fetches of the bundle, and the template pipeline's ytt and kbld. */
function repoRuns(from: number): { fetch: number; ytt: number; kbld: number } {
  const since = runs.slice(from);
  return {
    fetch: since.filter((r) => r.repoFetch).length,
    ytt: since.filter((r) => r.cmd === 'ytt' && r.inRepoScratch).length,
    kbld: since.filter((r) => r.cmd === 'kbld').length,
  };
}

async function waitVersion(ns: string, name: string, version: string): Promise<PkgiObject> {
  let last: PkgiObject | undefined;
  return await waitFor(
    `PackageInstall ${ns}/${name} at ${version}`,
    async () => {
      last = await getObject<PkgiObject>(PKGI, ns, name);
      const ok = last?.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded');
      return ok && last?.status?.version === version ? last : undefined;
    },
    {
      timeoutMs: 150_000,
      intervalMs: 500,
      describe: () => `last: ${JSON.stringify(last ?? null)}\nlog: ${fleetLog(runtimes, /source|PackageRepository/)}`,
    },
  );
}

/** Log records of the source poll seeing the tag move, across both runtimes. */
const moves = () => sourceMoves(runtimes);

describe('PackageRepository by tag: an upgrade reaches the fleet as events', () => {
  it("a new bundle under the same tag: one fetch and one template for both clusters, both installs at 2.0.0 without a sync timer or the second runtime's poll", async () => {
    for (const [i, c] of CLUSTERS.entries()) {
      await apply(
        {
          apiVersion: 'packaging.carvel.dev/v1alpha1',
          kind: 'PackageRepository',
          metadata: { name: c.name, namespace: c.ns },
          spec: { syncPeriod: '10m', fetch: { imgpkgBundle: { image: tagRef } } },
        },
        fleetPackageInstall(c.ns, REF_NAME),
      );
      await waitRepo(runtimes[i]!, c.ns, c.name);
    }
    for (const c of CLUSTERS) await waitVersion(c.ns, 'app', '1.0.0');
    const before = runs.length;
    const movesBefore = moves().length;

    const v2 = await pushBundle(servers().registry, `upfleet-${id}:latest`, bundle(['1.0.0', '2.0.0']));
    for (const c of CLUSTERS) {
      const pkgi = await waitVersion(c.ns, 'app', '2.0.0');
      expect(pkgi.status).toMatchObject({ version: '2.0.0', lastAttemptedVersion: '2.0.0' });
    }

    // One fetch and one template pipeline (one ytt run and kbld) for the new digest, fleet-wide.
    expect(repoRuns(before)).toEqual({ fetch: 1, ytt: 1, kbld: 1 });
    // One poller saw the tag move (one resolution won the period).
    expect(moves().length - movesBefore).toBe(1);
    for (const [i, c] of CLUSTERS.entries()) {
      const repo = await waitRepo(runtimes[i]!, c.ns, c.name);
      const s = expectSucceededStatus(repo, PKGR_STATUS_KEYS);
      // Fetched (or found indexed) pinned to the digest the tag resolved to.
      expect(s.fetch?.stdout, c.context).toContain(v2.digest);
    }
    // Two repositories, two installs and an upgrade in sequence: about a minute on a quiet
    // machine, several while the integration files share two cores (the 180 s default was hit).
  }, 420_000);
});
