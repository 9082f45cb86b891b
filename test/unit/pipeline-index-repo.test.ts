/**
 * The index-repo function over its outcomes (§2.2, §3.12): one row per outcome, each asserting
 * the exact status writes, the tools run, the finalizer and the logged outcomes. Called through
 * `dispatchEvent` with a PackageRepository object event. Faked at the ports: the shared fake
 * cluster, the fake runner (vendir, kapp) and an injected repository template pipeline.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { objectEvent, type Reason } from '../../events/schema.js';
import { type AppStatus, Finalizer } from '../../functions/lib/api/index.js';
import { exitWith, type ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import type { RepoTemplateInput, RepoTemplateOutput } from '../../functions/lib/packaging/repo-template.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { appWorld, finalFailed, finalSucceeded, NOW, PKGR_REF } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-index-repo-');

const INLINE_FETCH = { inline: { paths: { 'packages/a.yml': 'kind: Package\n' } } };
const MANIFEST = 'apiVersion: data.packaging.carvel.dev/v1alpha1\nkind: Package\n';
const VENDIR_STDERR =
  "vendir: Error: Syncing directory '0':\n  Syncing directory '.' with inline contents:\n    boom\n";
const FETCH_FAILED = 'Fetching resources: Error (see .status.usefulErrorMessage for details)';
const KAPP_FAILED = 'Deploying: Error (see .status.usefulErrorMessage for details)';
const NO_PACKAGES = "Invalid package repository content: must contain 'packages/' directory but did not";
const RECONCILING = {
  observedGeneration: 1,
  conditions: [{ type: 'Reconciling', status: 'True' }],
  friendlyDescription: 'Reconciling',
};
const FETCHED = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };
/** A status of a success one minute before {@link NOW}: not due for 10m. */
const SUCCEEDED_A_MINUTE_AGO = {
  observedGeneration: 1,
  conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
  friendlyDescription: 'Reconcile succeeded',
  consecutiveReconcileSuccesses: 1,
  fetch: { ...FETCHED, startedAt: '2024-12-31T23:59:00Z', updatedAt: '2024-12-31T23:59:00Z' },
};
const DEPLOY_ARGV = [
  'deploy',
  '--app-metadata-file-output',
  '<work>/app-metadata.yml',
  '--prev-app',
  'repo-ctrl',
  '-f',
  '-',
  '--logs=false',
  '--app-changes-max-to-keep=5',
  '--dangerous-override-ownership-of-existing-resources=true',
  '--existing-non-labeled-resources-check=false',
  '--kube-api-qps=30',
  '--kube-api-burst=40',
  '--dangerous-scope-to-fallback-allowed-namespaces=true',
  '--wait=false',
  '--app',
  'repo.pkgr',
  '--namespace=ns',
];
const DELETE_ARGV = [
  'delete',
  '--prev-app',
  'repo-ctrl',
  '--kube-api-qps=30',
  '--kube-api-burst=40',
  '--dangerous-scope-to-fallback-allowed-namespaces=true',
  '--wait=false',
  '--app',
  'repo.pkgr',
  '--namespace=ns',
];

interface RepoShape {
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
}

function repoObject(shape: RepoShape = {}) {
  return {
    apiVersion: PKGR_REF.apiVersion,
    kind: 'PackageRepository',
    metadata: { name: 'repo', namespace: 'ns', uid: 'uid-r', generation: 1, resourceVersion: '1', ...shape.metadata },
    spec: { fetch: INLINE_FETCH, ...shape.spec },
    ...(shape.status ? { status: shape.status } : {}),
  };
}

/** vendir leaving `0/packages/a.yml` in its directory. */
async function vendirFetches(req: RunRequest): Promise<ScriptedResult> {
  await mkdir(path.join(req.cwd ?? '', '0', 'packages'), { recursive: true });
  await writeFile(path.join(req.cwd ?? '', '0', 'packages', 'a.yml'), 'kind: Package\n');
  return { stdout: 'lock: vendir\n' };
}

interface Row {
  repo: RepoShape;
  reason?: Reason;
  vendir?: (req: RunRequest) => Promise<ScriptedResult> | ScriptedResult;
  template?: RepoTemplateOutput;
  kapp?: ScriptedResult;
  statuses: unknown[];
  tools: string[];
  /** `[stage, outcome]` of each stage-run log line. */
  outcomes: Array<[string, string]>;
  /** The finalizers left on the object. */
  finalizers: string[];
}

const TEMPLATED: RepoTemplateOutput = {
  result: { stdout: '', stderr: '', exitCode: 0, finished: true },
  manifest: MANIFEST,
  versions: { 'a.example.com': ['1.0.0'] },
};

const rows: Record<string, Row> = {
  'paused: Paused and observedGeneration only, even while being deleted (paused wins)': {
    repo: {
      spec: { paused: true },
      metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] },
    },
    statuses: [{ observedGeneration: 1, friendlyDescription: 'Paused' }],
    tools: [],
    outcomes: [['reconcile', 'paused']],
    finalizers: [Finalizer.PackageRepository],
  },
  'deleting: Deleting, kapp delete <name>.pkgr, both finalizers removed': {
    repo: {
      metadata: {
        deletionTimestamp: NOW,
        finalizers: [Finalizer.PackageRepository, Finalizer.PackageRepositoryLegacy, 'other'],
      },
    },
    kapp: { stdout: 'Succeeded' },
    statuses: [
      { observedGeneration: 1, conditions: [{ type: 'Deleting', status: 'True' }], friendlyDescription: 'Deleting' },
    ],
    tools: ['kapp'],
    outcomes: [
      ['reconcile', 'deleted'],
      ['delete', 'deleted'],
    ],
    finalizers: ['other'],
  },
  'deleting fails: DeleteFailed, the finalizer stays': {
    repo: { metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] } },
    kapp: exitWith(1, 'kapp: Error: forbidden'),
    statuses: [
      { observedGeneration: 1, conditions: [{ type: 'Deleting', status: 'True' }], friendlyDescription: 'Deleting' },
      {
        observedGeneration: 1,
        conditions: [
          {
            type: 'DeleteFailed',
            status: 'True',
            message: 'Deleting: Error (see .status.usefulErrorMessage for details)',
          },
        ],
        friendlyDescription: 'Delete failed: Deleting: Error (see .status.usefulErrorMessage for details)',
        consecutiveReconcileFailures: 1,
        usefulErrorMessage: 'kapp: Error: forbidden',
        deploy: {
          finished: true,
          exitCode: 1,
          stderr: 'kapp: Error: forbidden',
          error: 'Deleting: Error (see .status.usefulErrorMessage for details)',
          startedAt: NOW,
          updatedAt: NOW,
        },
      },
    ],
    tools: ['kapp'],
    outcomes: [
      ['reconcile', 'deleted'],
      ['delete', 'failed'],
    ],
    finalizers: [Finalizer.PackageRepository],
  },
  'not due: a resync a minute after a success is a no-op (10m default)': {
    repo: { status: SUCCEEDED_A_MINUTE_AGO },
    reason: 'resync',
    statuses: [],
    tools: [],
    outcomes: [['reconcile', 'noop']],
    finalizers: [],
  },
  "fetch fails: vendir's stderr is the usefulErrorMessage, nothing templated or deployed": {
    repo: {},
    vendir: () => exitWith(1, VENDIR_STDERR),
    statuses: [
      RECONCILING,
      finalFailed(FETCH_FAILED, VENDIR_STDERR, {
        fetch: { exitCode: 1, stderr: VENDIR_STDERR, error: FETCH_FAILED, startedAt: NOW, updatedAt: NOW },
      }),
    ],
    tools: ['vendir'],
    outcomes: [
      ['reconcile', 'succeeded'],
      ['index-repo', 'failed'],
    ],
    finalizers: [],
  },
  'template fails: the template part carries the error, kapp does not run': {
    repo: {},
    template: { result: { stdout: '', stderr: '', exitCode: -1, error: NO_PACKAGES, finished: true } },
    statuses: [
      RECONCILING,
      finalFailed(NO_PACKAGES, NO_PACKAGES, {
        fetch: FETCHED,
        template: { exitCode: -1, error: NO_PACKAGES, updatedAt: NOW },
      }),
    ],
    tools: ['vendir'],
    outcomes: [
      ['reconcile', 'succeeded'],
      ['index-repo', 'failed'],
    ],
    finalizers: [],
  },
  'deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect': {
    repo: {},
    kapp: { stdout: 'Succeeded' },
    statuses: [
      RECONCILING,
      finalSucceeded({
        fetch: FETCHED,
        template: { exitCode: 0, updatedAt: NOW },
        deploy: { finished: true, exitCode: 0, stdout: 'Succeeded', startedAt: NOW, updatedAt: NOW },
      }),
    ],
    tools: ['vendir', 'kapp'],
    outcomes: [
      ['reconcile', 'succeeded'],
      ['index-repo', 'succeeded'],
    ],
    finalizers: [Finalizer.PackageRepository],
  },
  'deploy fails: ReconcileFailed with kapp stderr, the finalizer stays added': {
    repo: {},
    kapp: exitWith(1, 'kapp: Error: Conflicting resources'),
    statuses: [
      RECONCILING,
      finalFailed(KAPP_FAILED, 'kapp: Error: Conflicting resources', {
        fetch: FETCHED,
        template: { exitCode: 0, updatedAt: NOW },
        deploy: {
          finished: true,
          exitCode: 1,
          stderr: 'kapp: Error: Conflicting resources',
          error: KAPP_FAILED,
          startedAt: NOW,
          updatedAt: NOW,
        },
      }),
    ],
    tools: ['vendir', 'kapp'],
    outcomes: [
      ['reconcile', 'succeeded'],
      ['index-repo', 'failed'],
    ],
    finalizers: [Finalizer.PackageRepository],
  },
};

async function indexOnce(row: Row, runtimeKubeconfig?: string) {
  const templateCalls: RepoTemplateInput[] = [];
  const w = appWorld({
    tmpRoot: path.join(tempDir(), 'scratch'),
    extra: {
      templateRepository: async (input) => {
        templateCalls.push(input);
        return row.template ?? TEMPLATED;
      },
      ...(runtimeKubeconfig ? { runtimeKubeconfig: () => runtimeKubeconfig } : {}),
    },
  });
  w.cluster.put(repoObject(row.repo) as never);
  w.runner.on('vendir', row.vendir ?? vendirFetches);
  w.runner.on('kapp', row.kapp ?? { stdout: 'Succeeded' });
  const next = await dispatchEvent(objectEvent(PKGR_REF, row.reason ?? 'modified', { time: new Date(NOW) }), w.deps);
  const stored = w.cluster.get('PackageRepository', 'ns', 'repo');
  return { w, next, templateCalls, finalizers: stored?.metadata.finalizers ?? [] };
}

describe('index-repo (PackageRepository reconcile)', () => {
  it.each(Object.entries(rows))('%s', async (_name, row) => {
    const { w, next, finalizers } = await indexOnce(row);
    expect(w.statuses()).toEqual(row.statuses as AppStatus[]);
    expect(w.tools()).toEqual(row.tools);
    expect(w.outcomes()).toEqual(row.outcomes);
    expect(finalizers).toEqual(row.finalizers);
    expect(next).toBeUndefined();
  });

  it('runs kapp deploy <name>.pkgr with the exact argv, the manifest on stdin, the runtime identity', async () => {
    const { w, templateCalls } = await indexOnce(
      rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
    );
    const kapp = w.runner.calls.find((c) => c.cmd === 'kapp')!;
    const work = path.dirname(kapp.args[2]!);
    expect(kapp.args.map((a) => a.replace(work, '<work>'))).toEqual([...DEPLOY_ARGV, '--yes']);
    expect(kapp.stdin).toBe(MANIFEST);
    expect(kapp.env).toEqual({});
    // The fetched tree is unpacked as vendir's directory `0`; a non-bundle fetch runs no kbld.
    expect(templateCalls).toHaveLength(1);
    expect(templateCalls[0]).toMatchObject({ name: 'repo', namespace: 'ns', bundle: false });
    expect(path.basename(templateCalls[0]!.root)).toBe('0');
    // The finalizer was added before kapp ran.
    const order = w.cluster.calls.map((c) => c[0]).filter((c) => c === 'addFinalizer');
    expect(order).toEqual(['addFinalizer']);
  });

  it('gives kapp the runtime kubeconfig through KAPP_KUBECONFIG_YAML when the runtime has one', async () => {
    const row = rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!;
    const { w } = await indexOnce(row, 'apiVersion: v1\nkind: Config\n');
    const kapp = w.runner.calls.find((c) => c.cmd === 'kapp')!;
    const work = path.dirname(kapp.args[2]!);
    expect(kapp.args.map((a) => a.replace(work, '<work>'))).toEqual([
      ...DEPLOY_ARGV,
      '--kubeconfig=/dev/null',
      '--yes',
    ]);
    expect(kapp.env).toEqual({ KAPP_KUBECONFIG_YAML: 'apiVersion: v1\nkind: Config\n' });
  });

  it('runs kapp delete <name>.pkgr with the exact argv', async () => {
    const { w } = await indexOnce(rows['deleting: Deleting, kapp delete <name>.pkgr, both finalizers removed']!);
    expect(w.runner.argv()).toEqual([['kapp', ...DELETE_ARGV, '--yes']]);
  });

  it('the fetched root the template pipeline reads lies inside the scratch handed to its tools', async () => {
    // With uid isolation a tool reaches only its `writable` directories: the scratch must be a
    // stage scratch (its parent traversable), not a directory inside the 0700 one (ytt's lstat of
    // packages/ was `permission denied` on the real runner), and the fetched root inside it.
    const { w, templateCalls } = await indexOnce(
      rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
    );
    expect(templateCalls).toHaveLength(1);
    const { root, scratch } = templateCalls[0]!;
    expect(path.dirname(scratch)).toBe(w.deps.config.tmpRoot);
    expect(path.relative(scratch, root)).toBe(path.join('fetched', '0'));
  });

  it('an imgpkgBundle fetch tells the template pipeline it is a bundle', async () => {
    const { templateCalls } = await indexOnce({
      ...rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
      repo: { spec: { fetch: { imgpkgBundle: { image: `registry.example/repo@sha256:${'a'.repeat(64)}` } } } },
    });
    expect(templateCalls.map((c) => c.bundle)).toEqual([true]);
  });
});
