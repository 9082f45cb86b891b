/**
 * The stage frame's write policy for a long fetch output, and the error classifier. Faked at the
 * ports: a fake cluster that keeps the App's status, a fake vendir, a memory store.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { App, AppStatus } from '../../functions/lib/api/index.js';
import { ArtifactError } from '../../functions/lib/artifact/tarball.js';
import { FakeCommandRunner, type ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';
import { KubeApiError } from '../../functions/lib/kube/port.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { APP_KIND } from '../../functions/lib/pipeline/app/kind.js';
import type { RunCopy } from '../../functions/lib/pipeline/deps.js';
import { openStage } from '../../functions/lib/pipeline/stage.js';
import type { LoadedApp } from '../../functions/lib/pipeline/stage-inputs.js';
import { KappControllerError, MissingArtifactError, outcomeOf } from '../../functions/lib/reconcile/result.js';
import { fromEventPart, PART_BOUNDS, summarizeStatus } from '../../functions/lib/reconcile/status.js';
import { REF } from './support/app-world.js';
import { FakeCluster } from './support/fake-cluster.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const RUN = { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' };

/** An App whose last run succeeded for this generation: a resync run, so its writes are deferred. */
function resyncedApp(conditionType: 'ReconcileSucceeded' | 'Reconciling'): App {
  return {
    apiVersion: REF.apiVersion,
    kind: 'App',
    metadata: { name: 'app', namespace: 'ns', uid: 'uid-1', generation: 1, resourceVersion: '1' },
    spec: { fetch: [{ git: { url: 'https://git.example/repo', ref: 'origin/main' } }], template: [{ ytt: {} }] },
    status: { observedGeneration: 1, conditions: [{ type: conditionType, status: 'True' }] },
  } as unknown as App;
}

const tempDir = useTempDir('stage-frame-');

/** vendir printing `stdout` and leaving one file in the fetch directory. */
function vendir(stdout: string) {
  return new FakeCommandRunner().on('vendir', async (req: RunRequest): Promise<ScriptedResult> => {
    await writeFile(path.join(req.cwd ?? '', 'config.yml'), 'a: 1\n');
    return { stdout, exitCode: 0 };
  });
}

async function fetchOnce(app: App, stdout: string) {
  const kube = new FakeCluster().put(app as never);
  const { deps } = stageDeps(kube, { runner: vendir(stdout), tmpRoot: path.join(tempDir(), 'scratch') });
  const loaded = { raw: structuredClone(app), app } as unknown as LoadedApp;
  const out = await runFetch({ clusterId: REF.clusterId, ref: REF, run: RUN }, loaded, deps);
  return { kube, out };
}

/** The run's final write, as the deploy stage makes it from the event's copy of the fetch part. */
function finalStatus(kube: FakeCluster, carried: Parameters<typeof fromEventPart>[0]): AppStatus {
  return summarizeStatus(
    kube.get('App', REF.namespace, REF.name)?.status as AppStatus | undefined,
    RUN.generation,
    { fetch: fromEventPart(carried) },
    {
      stdout: '',
      stderr: '',
      exitCode: 0,
      finished: true,
    },
  );
}

describe('closeStage: a long fetch output survives a deferred write at the stored bound', () => {
  // 100 KiB of vendir output: within the 1 MiB status bound, beyond what an event carries.
  const long = `${'lock: x\n'.repeat(100 * 128)}`;

  it.each([
    ['deferred (resync)', 'ReconcileSucceeded'],
    ['immediate (Reconciling)', 'Reconciling'],
  ] as const)('%s: the final status keeps all of status.fetch.stdout', async (_name, condition) => {
    const { kube, out } = await fetchOnce(resyncedApp(condition), long);
    const carried = out.template?.fetchStatus;
    expect(carried?.stdout?.length).toBeLessThanOrEqual(PART_BOUNDS.event.output);
    expect(finalStatus(kube, carried).fetch?.stdout).toBe(long);
  });

  it('a deferred fetch whose output fits an event writes nothing before the run ends', async () => {
    const { kube, out } = await fetchOnce(resyncedApp('ReconcileSucceeded'), 'lock: short\n');
    expect(kube.calls.filter(([op]) => op === 'update')).toHaveLength(0);
    expect(finalStatus(kube, out.template?.fetchStatus).fetch?.stdout).toBe('lock: short\n');
  });
});

describe('outcomeOf: what happens next after an error', () => {
  it.each([
    ['a user-facing planning error', new KappControllerError('Expected non-empty URL'), 'user'],
    ['a URL refused by the fetch policy', new UrlPolicyError('http://10.0.0.1/x', 'private address'), 'user'],
    ['a refused fetch directory', new ArtifactError('unsafe-path', 'symlink escapes the directory'), 'user'],
    ['an object-store I/O failure while packing', new ArtifactError('io', 'EIO'), 'retry'],
    ['a missing artifact of an earlier stage', new MissingArtifactError('manifest', 'artifacts/x'), 'restart'],
    ['an API server failure', new KubeApiError('unavailable', { statusCode: 503 }), 'retry'],
    ['anything else', new Error('boom'), 'retry'],
  ])('%s -> %s', (_name, err, want) => {
    expect(outcomeOf(err)).toBe(want);
  });
});

describe('RunCopy: a later stage of an in-process run opens on the previous stage copy', () => {
  const open = (deps: ReturnType<typeof stageDeps>['deps'], generation = 1) =>
    openStage(deps, {
      stage: 'template',
      object: REF,
      generation,
      view: (id) => deps.clusters.fetchView(id),
      kind: APP_KIND,
    });
  const counted = (app: App) => {
    const view = new FakeCluster().put(app as never);
    return { view, reads: () => view.calls.filter(([op]) => op === 'get').length };
  };

  it('no read while the copy is the run object and nothing waits; a read when an event waits or the copy is not it', async () => {
    const app = resyncedApp('ReconcileSucceeded');
    const { view, reads } = counted(app);
    let waiting = false;
    const runCopy: RunCopy = { superseded: () => waiting };
    const { deps } = stageDeps(view, { runner: new FakeCommandRunner(), tmpRoot: '/nonexistent', extra: { runCopy } });

    const first = await open(deps);
    expect(reads()).toBe(1); // nothing handed on yet
    expect(first.stop).toBeUndefined();
    expect(runCopy.frame).toBe(first.stop ? undefined : first.frame);

    const second = await open(deps);
    expect(reads()).toBe(1);
    expect(second.stop ? undefined : second.frame.loaded.app.metadata.resourceVersion).toBe('1');

    waiting = true;
    await open(deps);
    expect(reads()).toBe(2);
    waiting = false;

    // a copy of another generation is not the run's: read (and stop as stale)
    expect((await open(deps, 2)).stop).toBe('stale');
    expect(reads()).toBe(3);
  });
});
