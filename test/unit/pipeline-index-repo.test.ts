/**
 * The index-repo function over its outcomes (§2.2, §3.12): one row per outcome, each asserting
 * the exact status writes, the tools run, the finalizer and the logged outcomes. Called through
 * `dispatchEvent` with a PackageRepository object event. Faked at the ports: the shared fake
 * cluster, the fake runner (vendir, kapp) and an injected repository template pipeline.
 */
import { mkdir, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it, vi } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { EVENT_TYPES, type KappEvent, objectEvent, type Reason } from '../../events/schema.js';
import { type AppStatus, Finalizer, parsePackageRepository } from '../../functions/lib/api/index.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { serviceAccountKubeconfig } from '../../functions/lib/deploy/kubeconfig.js';
import { packageRepositoryKubeconfig } from '../../functions/lib/deploy/run.js';
import { exitWith, type ScriptedResult } from '../../functions/lib/exec/fake.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { KubeApiError } from '../../functions/lib/kube/port.js';
import { readRepositoryVersions, repoPointerKey } from '../../functions/lib/packaging/repo-index.js';
import type { RepoTemplateInput, RepoTemplateOutput } from '../../functions/lib/packaging/repo-template.js';
import type { DispatchDeps, PipelineConfig } from '../../functions/lib/pipeline/deps.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { planRepoIndex } from '../../functions/lib/pipeline/repo/index-repo-cache.js';
import {
  readSourcePoll,
  SOURCE_POLL_PREFIX,
  sourcePollKey,
  updateSourcePoll,
} from '../../functions/lib/pipeline/source-poll.js';
import { KAPP_APPLYING_MARKER } from '../../functions/lib/reconcile/status.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { type ObjectBody, StoreError } from '../../functions/lib/store/port.js';
import { appWorld, finalFailed, finalSucceeded, NOW, PKGR_REF } from './support/app-world.js';
import { FAKE_API_SERVER, FAKE_SA_TOKEN, FakeCluster } from './support/fake-cluster.js';
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
// kapp's rate limit is upstream's 30/40 (PKGR_KAPP_RATE_LIMIT in functions/lib/deploy/kapp.ts).
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

/**
 * The kubeconfig kapp gets: the fake cluster's token of kapp-lambda-pkgr on its API server,
 * the repository's namespace as the context's (an App ServiceAccount kubeconfig's shape).
 */
const PKGR_KUBECONFIG = serviceAccountKubeconfig({
  token: FAKE_SA_TOKEN,
  caCert: '',
  namespace: 'ns',
  server: FAKE_API_SERVER.server,
}).yaml;

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
  /** The `changes` of the `repo.indexed` event handed on (none: no event). */
  announces?: Array<{ refName: string; versions: string[] }>;
  /** ConfigMaps in `ns` (`data.spec` by name): a kapp app record planted before the run. */
  records?: Record<string, string>;
  /** Other kapp app records of the cluster (`data.spec` by `<namespace>/<name>`, labelled `kapp.k14s.io/is-app`). */
  otherRecords?: Record<string, string>;
  /** The runtime namespace's `kapp-lambda-pkgr` ServiceAccount is missing (its RBAC not applied). */
  noPkgrServiceAccount?: boolean;
  /** Changes the admission policy bounding `kapp-lambda-pkgr` or its binding (both installed by default). */
  admission?: (cluster: FakeCluster) => void;
}

/** The error of a run whose kapp identity is missing (`packageRepositoryKubeconfig`). */
const NO_PKGR_SA = 'Preparing kapp: Getting service account: serviceaccounts "kapp-lambda-pkgr" not found';

/** The error of a run whose kapp identity is not bounded by its admission policy (`pkgrAdmissionProblem`). */
const UNBOUNDED = (what: string) =>
  `kapp-lambda-pkgr, the identity a PackageRepository's kapp runs as, is not bounded: ${what}; kapp does not run for PackageRepositories until the ValidatingAdmissionPolicy kapp-lambda-pkgr (failurePolicy Fail) and its ValidatingAdmissionPolicyBinding kapp-lambda-pkgr (validationActions [Deny]) are installed: apply the kapp-lambda release manifest (release/kapp-lambda-<version>.yml, or what \`npm run cluster -- add\` prints), which holds both; ValidatingAdmissionPolicy needs Kubernetes 1.30 or later`;
const ADMISSION = 'admissionregistration.k8s.io/v1';
/** Removes the policy (`ValidatingAdmissionPolicy`) or its binding from the fake cluster. */
const without = (kind: 'ValidatingAdmissionPolicy' | 'ValidatingAdmissionPolicyBinding') => (c: FakeCluster) =>
  c.admission.delete(kind);

/** The deploy error of a planted kapp record (`plantedKappRecord`). */
const PLANTED = (cm: string, why: string) =>
  `Deploying: kapp app record ConfigMap ns/${cm} was not written by kapp (${why}): kapp would act on its selector with the controller's identity; delete the ConfigMap`;
const SELECTOR_PLANTED = PLANTED('repo.pkgr.apps.k14s.io', 'its label selector is not kapp.k14s.io/app=<number>');
/** The deploy error of a record copying another kapp app's value. */
const COPIED =
  "Deploying: kapp app record ConfigMap ns/repo.pkgr.apps.k14s.io shares its label kapp.k14s.io/app=1600000000000000002 with the kapp app record ConfigMap team-b/web.app.apps.k14s.io: kapp would act on that app's resources too; delete the ConfigMap that was copied";

const TEMPLATED: RepoTemplateOutput = {
  result: { stdout: '', stderr: '', exitCode: 0, finished: true },
  manifest: MANIFEST,
  versions: { 'a.example.com': ['1.0.0'] },
};

/** The stage-run outcomes of a run that fails in index-repo. */
const RUN_FAILED: Array<[string, string]> = [
  ['reconcile', 'succeeded'],
  ['index-repo', 'failed'],
];
/** The stage-run outcomes of a delete that fails. */
const DELETE_FAILED: Array<[string, string]> = [
  ['reconcile', 'deleted'],
  ['delete', 'failed'],
];
/** The status a delete writes first. */
const DELETING_STATUS = {
  observedGeneration: 1,
  conditions: [{ type: 'Deleting', status: 'True' }],
  friendlyDescription: 'Deleting',
};

/** A run refused after templating and before kapp: its deploy part fails with `message`, the finalizer stays added. */
function refusedBeforeKapp(message: string): Pick<Row, 'statuses' | 'tools' | 'outcomes' | 'finalizers'> {
  return {
    statuses: [
      RECONCILING,
      finalFailed(message, message, {
        fetch: FETCHED,
        template: { exitCode: 0, updatedAt: NOW },
        deploy: { finished: true, exitCode: -1, error: message, startedAt: NOW, updatedAt: NOW },
      }),
    ],
    tools: ['vendir'],
    outcomes: RUN_FAILED,
    finalizers: [Finalizer.PackageRepository],
  };
}

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
    statuses: [DELETING_STATUS],
    tools: ['kapp'],
    outcomes: [
      ['reconcile', 'deleted'],
      ['delete', 'deleted'],
    ],
    finalizers: ['other'],
  },
  'deleting fails: DeleteFailed, the finalizer stays': {
    repo: { metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] } },
    kapp: exitWith(1, 'kapp: Error: forbidden: \n  deleting \n'),
    statuses: [
      DELETING_STATUS,
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
        // raw (upstream's reconcileDelete reads delete()'s own result); status.deploy friendly
        usefulErrorMessage: 'kapp: Error: forbidden: \n  deleting \n',
        deploy: {
          finished: true,
          exitCode: 1,
          stderr: 'kapp: Error: forbidden:\n  deleting',
          error: 'Deleting: Error (see .status.usefulErrorMessage for details)',
          startedAt: NOW,
          updatedAt: NOW,
        },
      },
    ],
    tools: ['kapp'],
    outcomes: DELETE_FAILED,
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
    outcomes: RUN_FAILED,
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
    outcomes: RUN_FAILED,
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
    // First deploy of this repository: every version it holds is new.
    announces: [{ refName: 'a.example.com', versions: ['1.0.0'] }],
  },
  'a planted kapp record (any selector): kapp never runs, ReconcileFailed names the ConfigMap (attack)': {
    repo: {},
    records: { 'repo.pkgr.apps.k14s.io': '{"labelKey":"app","labelValue":"nginx"}' },
    ...refusedBeforeKapp(SELECTOR_PLANTED),
  },
  'deleting next to a planted legacy record (a Go case-folded key): DeleteFailed, kapp never runs (attack)': {
    repo: { metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] } },
    records: { 'repo-ctrl': '{"labelKey":"kapp.k14s.io/app","labelValue":"1","LABELKEY":"app"}' },
    statuses: [
      DELETING_STATUS,
      expect.objectContaining({
        conditions: [expect.objectContaining({ type: 'DeleteFailed' })],
        usefulErrorMessage: `Deleting: ${PLANTED('repo-ctrl', "its data.spec has key 'LABELKEY'").slice('Deploying: '.length)}`,
      }),
    ],
    tools: [],
    outcomes: DELETE_FAILED,
    finalizers: [Finalizer.PackageRepository],
  },
  'a record copying another kapp app record value: kapp never runs, ReconcileFailed names both ConfigMaps (attack)': {
    repo: {},
    records: { 'repo.pkgr.apps.k14s.io': '{"labelKey":"kapp.k14s.io/app","labelValue":"1600000000000000002"}' },
    otherRecords: {
      'team-b/web.app.apps.k14s.io': '{"labelKey":"kapp.k14s.io/app","labelValue":"1600000000000000002"}',
    },
    ...refusedBeforeKapp(COPIED),
  },
  "kapp's ServiceAccount missing (RBAC not applied): ReconcileFailed names it, kapp never runs": {
    repo: {},
    noPkgrServiceAccount: true,
    ...refusedBeforeKapp(`Deploying: ${NO_PKGR_SA}`),
  },
  "deleting without kapp's ServiceAccount: DeleteFailed names it, the finalizer stays, kapp never runs": {
    repo: { metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] } },
    noPkgrServiceAccount: true,
    statuses: [
      DELETING_STATUS,
      expect.objectContaining({
        conditions: [expect.objectContaining({ type: 'DeleteFailed' })],
        usefulErrorMessage: `Deleting: ${NO_PKGR_SA}`,
      }),
    ],
    tools: [],
    outcomes: DELETE_FAILED,
    finalizers: [Finalizer.PackageRepository],
  },
  'the admission policy bounding kapp-lambda-pkgr missing: ReconcileFailed says so and how to install it, no token, kapp never runs (attack)':
    {
      repo: {},
      admission: without('ValidatingAdmissionPolicy'),
      ...refusedBeforeKapp(`Deploying: ${UNBOUNDED('ValidatingAdmissionPolicy kapp-lambda-pkgr not found')}`),
    },
  'its binding missing: ReconcileFailed, kapp never runs (attack)': {
    repo: {},
    admission: without('ValidatingAdmissionPolicyBinding'),
    ...refusedBeforeKapp(`Deploying: ${UNBOUNDED('ValidatingAdmissionPolicyBinding kapp-lambda-pkgr not found')}`),
  },
  'its binding only warns (validationActions [Warn]): ReconcileFailed, kapp never runs (attack)': {
    repo: {},
    admission: (c) =>
      c.admission.set('ValidatingAdmissionPolicyBinding', {
        apiVersion: ADMISSION,
        kind: 'ValidatingAdmissionPolicyBinding',
        metadata: { name: 'kapp-lambda-pkgr' },
        spec: { policyName: 'kapp-lambda-pkgr', validationActions: ['Warn', 'Audit'] },
      } as never),
    ...refusedBeforeKapp(
      `Deploying: ${UNBOUNDED('ValidatingAdmissionPolicyBinding kapp-lambda-pkgr does not deny (validationActions ["Warn","Audit"])')}`,
    ),
  },
  'deleting without the admission policy: DeleteFailed says so, the finalizer stays, kapp never runs (attack)': {
    repo: { metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] } },
    admission: (c) => {
      without('ValidatingAdmissionPolicy')(c);
      without('ValidatingAdmissionPolicyBinding')(c);
    },
    statuses: [
      DELETING_STATUS,
      expect.objectContaining({
        conditions: [expect.objectContaining({ type: 'DeleteFailed' })],
        usefulErrorMessage: `Deleting: ${UNBOUNDED('ValidatingAdmissionPolicy kapp-lambda-pkgr not found; ValidatingAdmissionPolicyBinding kapp-lambda-pkgr not found')}`,
      }),
    ],
    tools: [],
    outcomes: DELETE_FAILED,
    finalizers: [Finalizer.PackageRepository],
  },
  'deploy fails: ReconcileFailed with the friendly kapp stderr, the finalizer stays added': {
    repo: {},
    kapp: exitWith(1, '  kapp: Error: create package/x: \n    Evaluating: \n- fail: Conflicting resources\n'),
    statuses: [
      RECONCILING,
      // usefulErrorMessage as status.deploy.stderr: upstream's updateLastDeploy returns the
      // friendly result (trimmed, `\s+\n` → `\n`) that setReconcileCompleted then reads
      finalFailed(KAPP_FAILED, 'kapp: Error: create package/x:\n    Evaluating:\n- fail: Conflicting resources', {
        fetch: FETCHED,
        template: { exitCode: 0, updatedAt: NOW },
        deploy: {
          finished: true,
          exitCode: 1,
          stderr: 'kapp: Error: create package/x:\n    Evaluating:\n- fail: Conflicting resources',
          error: KAPP_FAILED,
          startedAt: NOW,
          updatedAt: NOW,
        },
      }),
    ],
    tools: ['vendir', 'kapp'],
    outcomes: RUN_FAILED,
    finalizers: [Finalizer.PackageRepository],
  },
};

// A record as kapp writes it (also the legacy `<N>-ctrl` one) does not stop kapp (attack control).
rows['a kapp record as kapp writes it: kapp runs (attack control)'] = {
  ...rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
  records: {
    'repo.pkgr.apps.k14s.io': '{"labelKey":"kapp.k14s.io/app","labelValue":"1700000000000000000","usedGVs":[]}',
    'repo-ctrl': '{"labelKey":"kapp.k14s.io/app","labelValue":"1600000000000000000"}',
  },
};

async function indexOnce(
  row: Row,
  config: { controllerConfigNamespace?: string } = {},
  extra: Partial<DispatchDeps> = {},
  /** Called while the repository is templated (after the fetch), with the world. */
  duringTemplate?: (world: ReturnType<typeof appWorld>) => void,
) {
  const templateCalls: RepoTemplateInput[] = [];
  const w: ReturnType<typeof appWorld> = appWorld({
    tmpRoot: path.join(tempDir(), 'scratch'),
    config,
    extra: {
      templateRepository: async (input) => {
        templateCalls.push(input);
        duringTemplate?.(w);
        return row.template ?? TEMPLATED;
      },
      ...extra,
    },
  });
  w.cluster.put(repoObject(row.repo) as never);
  for (const [name, spec] of Object.entries(row.records ?? {})) {
    w.cluster.configMaps.set(`ns/${name}`, {
      metadata: { name, namespace: 'ns', uid: `uid-${name}`, resourceVersion: '1' },
      data: { spec },
      binaryData: {},
    });
  }
  for (const [key, spec] of Object.entries(row.otherRecords ?? {})) {
    const [namespace, name] = key.split('/') as [string, string];
    w.cluster.configMaps.set(key, {
      metadata: { name, namespace, uid: `uid-${name}`, resourceVersion: '1', labels: { 'kapp.k14s.io/is-app': '' } },
      data: { spec },
      binaryData: {},
    });
  }
  row.admission?.(w.cluster);
  if (row.noPkgrServiceAccount) {
    w.cluster.serviceAccountToken = async (_ns, name) => {
      throw new KubeApiError(`Getting service account: serviceaccounts "${name}" not found`, { statusCode: 404 });
    };
  }
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
    expect(next && next.type === EVENT_TYPES.repoIndexed ? next.data.changes : next).toEqual(row.announces);
  });

  it('an unbounded kapp identity gets no token: the admission policy is read before the TokenRequest', async () => {
    const { w } = await indexOnce(
      rows[
        'the admission policy bounding kapp-lambda-pkgr missing: ReconcileFailed says so and how to install it, no token, kapp never runs (attack)'
      ]!,
    );
    expect(w.cluster.calls.filter((c) => c[0] === 'serviceAccountToken')).toEqual([]);
    expect(w.cluster.calls.filter((c) => c[0] === 'get' && c[1] === 'kapp-lambda-pkgr')).toHaveLength(2);
  });

  it('runs kapp deploy <name>.pkgr with the exact argv, the manifest on stdin, as kapp-lambda-pkgr', async () => {
    const { w, templateCalls } = await indexOnce(
      rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
    );
    const kapp = w.runner.calls.find((c) => c.cmd === 'kapp')!;
    const work = path.dirname(kapp.args[2]!);
    expect(kapp.args.map((a) => a.replace(work, '<work>'))).toEqual([
      ...DEPLOY_ARGV,
      '--kubeconfig=/dev/null',
      '--yes',
    ]);
    expect(kapp.stdin).toBe(MANIFEST);
    expect(kapp.env).toEqual({ KAPP_KUBECONFIG_YAML: PKGR_KUBECONFIG });
    // A 600 s token of kapp-lambda-pkgr in the runtime's namespace (default kapp-lambda), nothing else.
    expect(w.cluster.calls.filter((c) => c[0] === 'serviceAccountToken')).toEqual([
      ['serviceAccountToken', 'kapp-lambda/kapp-lambda-pkgr', 600],
    ]);
    // The fetched tree is unpacked as vendir's directory `0`; a non-bundle fetch runs no kbld.
    expect(templateCalls).toHaveLength(1);
    expect(templateCalls[0]).toMatchObject({ name: 'repo', namespace: 'ns', bundle: false });
    expect(path.basename(templateCalls[0]!.root)).toBe('0');
    // The finalizer was added before kapp ran.
    const order = w.cluster.calls.map((c) => c[0]).filter((c) => c === 'addFinalizer');
    expect(order).toEqual(['addFinalizer']);
  });

  it('checks the kapp records right before kapp: a record swapped while the run templates is refused (attack)', async () => {
    const row =
      rows['a planted kapp record (any selector): kapp never runs, ReconcileFailed names the ConfigMap (attack)']!;
    // The record reads as kapp writes it when the run starts; the tenant swaps it during the template.
    const { w } = await indexOnce(
      { ...row, records: { 'repo.pkgr.apps.k14s.io': '{"labelKey":"kapp.k14s.io/app","labelValue":"17"}' } },
      {},
      {},
      (world) => {
        const cm = world.cluster.configMaps.get('ns/repo.pkgr.apps.k14s.io')!;
        world.cluster.configMaps.set('ns/repo.pkgr.apps.k14s.io', {
          ...cm,
          data: { spec: '{"labelKey":"app","labelValue":"nginx"}' },
        });
      },
    );
    expect(w.tools()).toEqual(['vendir']);
    expect(w.statuses()).toEqual(row.statuses as AppStatus[]);
  });

  it("takes kapp-lambda-pkgr from the runtime's namespace (kapp-controller-config's), for deploy and delete", async () => {
    const deployed = await indexOnce(
      rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
      { controllerConfigNamespace: 'carvel' },
    );
    const deleted = await indexOnce(rows['deleting: Deleting, kapp delete <name>.pkgr, both finalizers removed']!, {
      controllerConfigNamespace: 'carvel',
    });
    for (const { w } of [deployed, deleted]) {
      expect(w.cluster.calls.filter((c) => c[0] === 'serviceAccountToken')).toEqual([
        ['serviceAccountToken', 'carvel/kapp-lambda-pkgr', 600],
      ]);
      expect(w.runner.calls.find((c) => c.cmd === 'kapp')?.env).toEqual({ KAPP_KUBECONFIG_YAML: PKGR_KUBECONFIG });
    }
  });

  it("pins the API server of kapp-lambda-pkgr's kubeconfig: the address resolved once, TLS verifying the name", async () => {
    const cluster = new FakeCluster();
    cluster.apiServer = () => ({ ...FAKE_API_SERVER, server: 'https://api.fleet.corp:6443' });
    const resolved: string[] = [];
    const yaml = await packageRepositoryKubeconfig(cluster as never, 'kapp-lambda', 'ns', undefined, {
      resolve: async (host) => {
        resolved.push(host);
        return ['10.9.8.7'];
      },
    });
    expect(resolved).toEqual(['api.fleet.corp']);
    expect(yaml).toContain('server: https://10.9.8.7:6443');
    expect(yaml).toContain('tls-server-name: api.fleet.corp');
  });

  it('kapp delete does not wait for the Deleting status write; Deleting is still the first status', async () => {
    const row = rows['deleting: Deleting, kapp delete <name>.pkgr, both finalizers removed']!;
    const w = appWorld({ tmpRoot: path.join(tempDir(), 'scratch') });
    w.cluster.put(repoObject(row.repo) as never);
    let kappStarted!: () => void;
    const started = new Promise<void>((resolve) => {
      kappStarted = resolve;
    });
    const events: string[] = [];
    const update = w.cluster.updateStatus.bind(w.cluster);
    w.cluster.updateStatus = async (ref, pre, status) => {
      // The Deleting write is held until kapp has started (or 2 s, so a regression fails, not hangs).
      await Promise.race([started, new Promise((r) => setTimeout(r, 2000))]);
      events.push('status written');
      return await update(ref, pre, status);
    };
    w.runner.on('kapp', () => {
      events.push('kapp started');
      kappStarted();
      return { stdout: 'Succeeded' };
    });
    await dispatchEvent(objectEvent(PKGR_REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(events).toEqual(['kapp started', 'status written']);
    expect(w.statuses()).toEqual(row.statuses as AppStatus[]);
    expect(w.cluster.get('PackageRepository', 'ns', 'repo')?.metadata.finalizers).toEqual(row.finalizers);
  });

  // A forced run of an unchanged spec writes no `Reconciling` at its start; once kapp changes the
  // cluster its progress says `Reconciling` (upstream's every sync does by then), and a delete's
  // progress keeps `Deleting`.
  it.each<[string, string, object, string]>([
    ['a forced run of the same generation', 'Reconciling', { status: SUCCEEDED_A_MINUTE_AGO }, 'added'],
    [
      'a delete',
      'Deleting',
      {
        status: SUCCEEDED_A_MINUTE_AGO,
        metadata: { finalizers: [Finalizer.PackageRepository], deletionTimestamp: NOW },
      },
      'modified',
    ],
  ])('kapp progress of %s is written as %s', async (_name, condition, repo, reason) => {
    const w = appWorld({
      tmpRoot: path.join(tempDir(), 'scratch'),
      config: { deployProgressIntervalMs: 5 },
      extra: { templateRepository: async () => TEMPLATED },
    });
    w.cluster.put(repoObject(repo as never) as never);
    w.runner.on('vendir', vendirFetches);
    w.runner.on('kapp', async (req) => {
      const before = w.statuses().length;
      req.onOutput?.(`Changes\n${KAPP_APPLYING_MARKER}1 changes [0/1 done] ----\n`, 'stdout');
      await vi.waitFor(() =>
        expect(w.statuses().some((st, i) => i >= before && st.deploy?.finished === false)).toBe(true),
      );
      return { stdout: 'Succeeded' };
    });
    await dispatchEvent(objectEvent(PKGR_REF, reason as Reason, { time: new Date(NOW) }), w.deps);
    const progress = w.statuses().filter((st) => st.deploy?.finished === false);
    expect(progress.length).toBeGreaterThan(0);
    for (const st of progress) expect(st.conditions?.map((c) => c.type)).toEqual([condition]);
  });

  it('runs kapp delete <name>.pkgr with the exact argv', async () => {
    const { w } = await indexOnce(rows['deleting: Deleting, kapp delete <name>.pkgr, both finalizers removed']!);
    expect(w.runner.argv()).toEqual([['kapp', ...DELETE_ARGV, '--kubeconfig=/dev/null', '--yes']]);
    expect(w.runner.calls[0]?.env).toEqual({ KAPP_KUBECONFIG_YAML: PKGR_KUBECONFIG });
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

  it("templates vendir's own files, not an unpacked copy of the artifact it just stored", async () => {
    const written: number[] = [];
    const read: number[] = [];
    const row = rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!;
    const w = appWorld({
      tmpRoot: path.join(tempDir(), 'scratch'),
      extra: {
        templateRepository: async (input) => {
          read.push((await stat(path.join(input.root, 'packages', 'a.yml'))).ino);
          return TEMPLATED;
        },
      },
    });
    w.cluster.put(repoObject(row.repo) as never);
    w.runner.on('vendir', async (req) => {
      const out = await vendirFetches(req);
      written.push((await stat(path.join(req.cwd ?? '', '0', 'packages', 'a.yml'))).ino);
      return out;
    });
    w.runner.on('kapp', { stdout: 'Succeeded' });
    await dispatchEvent(objectEvent(PKGR_REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(written).toHaveLength(1);
    expect(read).toEqual(written);
    expect(w.statuses().at(-1)?.friendlyDescription).toBe('Reconcile succeeded');
  });

  it('an imgpkgBundle fetch tells the template pipeline it is a bundle', async () => {
    const { templateCalls } = await indexOnce({
      ...rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!,
      repo: { spec: { fetch: { imgpkgBundle: { image: `registry.example/repo@sha256:${'a'.repeat(64)}` } } } },
    });
    expect(templateCalls.map((c) => c.bundle)).toEqual([true]);
  });
});

// ------------------------------------------------------------------- the placeholder Secret (§3.12 step 2)

const BUNDLE_BY_TAG = { imgpkgBundle: { image: 'registry.example/repo:v1' } };
const BUNDLE_BY_DIGEST = { imgpkgBundle: { image: `registry.example/repo@sha256:${'b'.repeat(64)}` } };
const DOCKERCONFIG = '.dockerconfigjson';
/** `ns/repo-fetch-0` as secretgen-controller leaves it once it filled it. */
const FILLED = {
  metadata: { name: 'repo-fetch-0', namespace: 'ns', uid: 'uid-p', resourceVersion: '2' },
  type: 'kubernetes.io/dockerconfigjson',
  data: { [DOCKERCONFIG]: Buffer.from('{"auths":{"registry.example":{"username":"u","password":"p"}}}') },
};

/** A world whose fetch may read Secrets (a keyring seals what it stores). */
function filledWorld() {
  return appWorld({
    tmpRoot: path.join(tempDir(), 'scratch'),
    extra: { templateRepository: async () => TEMPLATED, keyring: new DerivedKeyring(Buffer.alloc(32, 7)) },
  });
}

describe('index-repo: deleting a repository whose kapp app holds what kapp-lambda-pkgr may not delete (its legacy <name>-ctrl)', () => {
  const DELETING = { metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] } };
  const RECORD = (value: string) => `{"labelKey":"kapp.k14s.io/app","labelValue":"${value}"}`;
  /** A ConfigMap in the fake cluster (`data.spec` only when given). */
  const put = (w: ReturnType<typeof appWorld>, key: string, labels: Record<string, string>, spec?: string) => {
    const [namespace, name] = key.split('/') as [string, string];
    w.cluster.configMaps.set(key, {
      metadata: { name, namespace, uid: `uid-${name}`, resourceVersion: '1', labels },
      data: spec === undefined ? {} : { spec },
      binaryData: {},
    });
  };
  /** One delete attempt: the last status, whether kapp ran, the finalizers left. */
  const attempt = async (w: ReturnType<typeof appWorld>) => {
    const before = w.runner.calls.length;
    await dispatchEvent(objectEvent(PKGR_REF, 'modified', { time: new Date(NOW) }), w.deps);
    return {
      status: w.statuses().at(-1) as AppStatus & { usefulErrorMessage?: string },
      kapp: w.runner.calls.slice(before).map((c) => c.cmd),
      finalizers: w.cluster.get('PackageRepository', 'ns', 'repo')?.metadata.finalizers,
    };
  };
  const world = () => {
    const w = appWorld({ tmpRoot: path.join(tempDir(), 'scratch') });
    w.cluster.put(repoObject(DELETING) as never);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    return w;
  };

  it('the legacy record never renamed: DeleteFailed names it and what an admin runs, kapp never runs; once it is gone the repository is deleted', async () => {
    const w = world();
    put(w, 'ns/repo-ctrl', { 'kapp.k14s.io/is-app': '' }, RECORD('1500000000000000000'));
    const first = await attempt(w);
    expect(first.kapp).toEqual([]);
    expect(first.finalizers).toEqual([Finalizer.PackageRepository]);
    // A refusal before kapp: the condition and usefulErrorMessage carry it whole.
    expect(first.status.conditions).toEqual([
      { type: 'DeleteFailed', status: 'True', message: first.status.usefulErrorMessage },
    ]);
    expect(first.status.usefulErrorMessage).toBe(
      "Deleting: the kapp app record ConfigMap ns/repo-ctrl is the legacy app repo-ctrl (kapp-controller's name for this repository's app before v0.39), never renamed to repo.pkgr: kapp would delete it as repo-ctrl, recording changes kapp-lambda-pkgr may not write. An admin must delete that app, with `kapp delete -a repo-ctrl -n ns` as an identity that may (its objects and its record), or the ConfigMap ns/repo-ctrl alone (its objects then stay); the PackageRepository is deleted at the next retry",
    );
    // The admin deletes the legacy app; the retry (failure backoff) runs kapp, which finds no app.
    w.cluster.configMaps.delete('ns/repo-ctrl');
    const second = await attempt(w);
    expect(second.kapp).toEqual(['kapp']);
    expect(second.finalizers).toEqual([]); // the repository goes
  });

  it("ConfigMaps labelled with the app's value (a legacy App's objects taken over): DeleteFailed names them, kapp never runs; once deleted, kapp runs and the repository goes", async () => {
    const w = world();
    put(w, 'ns/repo.pkgr', { 'kapp.k14s.io/is-app': '' }, RECORD('1500000000000000000'));
    for (const name of ['web-config', 'web-env']) put(w, `ns/${name}`, { 'kapp.k14s.io/app': '1500000000000000000' });
    // Not kapp's to delete: another namespace (kapp lists the repository's only), another value.
    put(w, 'other/web-config', { 'kapp.k14s.io/app': '1500000000000000000' });
    put(w, 'ns/unrelated', { 'kapp.k14s.io/app': '1700000000000000000' });
    const first = await attempt(w);
    expect(first.kapp).toEqual([]);
    expect(first.finalizers).toEqual([Finalizer.PackageRepository]);
    expect(first.status.usefulErrorMessage).toBe(
      "Deleting: kapp would delete ConfigMap ns/web-config, ns/web-env, labelled kapp.k14s.io/app=1500000000000000000 as the app repo.pkgr's objects (a legacy app's, taken over from repo-ctrl), which kapp-lambda-pkgr may not delete (only kapp's records): an admin must delete them, or the app record ConfigMap ns/repo.pkgr (kapp then deletes nothing: the app's Packages stay); the PackageRepository is deleted at the next retry",
    );
    w.cluster.configMaps.delete('ns/web-config');
    w.cluster.configMaps.delete('ns/web-env');
    const second = await attempt(w);
    expect(second.kapp).toEqual(['kapp']);
    expect(second.finalizers).toEqual([]);
  });

  it('names at most ten; a kapp record carrying the label does not block (the policy lets kapp delete it) (attack control)', async () => {
    const w = world();
    put(w, 'ns/repo.pkgr', { 'kapp.k14s.io/is-app': '' }, RECORD('1500000000000000000'));
    put(w, 'ns/repo.pkgr-change-abc12', {
      'kapp.k14s.io/app': '1500000000000000000',
      'kapp.k14s.io/is-app-change': '',
      'kapp.k14s.io/app-change-app': 'repo.pkgr',
    });
    // Spelled like a record but not labelled as one: the policy refuses it, so it blocks.
    for (let i = 0; i < 12; i++)
      put(w, `ns/cm-${String(i).padStart(2, '0')}`, { 'kapp.k14s.io/app': '1500000000000000000' });
    const { status } = await attempt(w);
    expect(status.usefulErrorMessage).toMatch(
      /^Deleting: kapp would delete ConfigMap ns\/cm-00, .*, ns\/cm-09 and 2 more, labelled/,
    );
    expect(status.usefulErrorMessage).not.toContain('repo.pkgr-change-abc12');
  });

  it('a renamed record next to a leftover legacy one, nothing labelled but Packages: kapp runs (control)', async () => {
    const w = world();
    put(w, 'ns/repo.pkgr', { 'kapp.k14s.io/is-app': '' }, RECORD('1500000000000000000'));
    put(w, 'ns/repo-ctrl', { 'kapp.k14s.io/is-app': '' }, RECORD('1500000000000000000'));
    const { kapp, finalizers } = await attempt(w);
    expect(kapp).toEqual(['kapp']);
    expect(finalizers).toEqual([]);
  });
});

describe('index-repo: the placeholder Secret <name>-fetch-0 (§3.12 step 2)', () => {
  const deploys = rows['deploy succeeds: ReconcileSucceeded with fetch, template and deploy parts, no inspect']!;

  it('is created as upstream for a bundle without secretRef; unfilled, the fetch stays anonymous', async () => {
    const { w } = await indexOnce({ ...deploys, repo: { spec: { fetch: BUNDLE_BY_TAG } } });
    const secret = w.cluster.secrets.get('ns/repo-fetch-0')!;
    expect(secret.metadata).toEqual({
      name: 'repo-fetch-0',
      namespace: 'ns',
      uid: 'uid-repo-fetch-0',
      resourceVersion: '1',
      annotations: { 'secretgen.carvel.dev/image-pull-secret': '' },
      ownerReferences: [
        { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageRepository', name: 'repo', uid: 'uid-r' },
      ],
    });
    expect(secret.type).toBe('kubernetes.io/dockerconfigjson');
    expect(Buffer.from(secret.data[DOCKERCONFIG]!).toString()).toBe('{"auths":{}}');
    const vendir = w.runner.calls.find((c) => c.cmd === 'vendir')!;
    expect(vendir.stdin).not.toContain('secretRef');
    expect(w.tools()).toEqual(['vendir', 'kapp']);
  });

  it('once secretgen-controller filled it, the fetch authenticates with it', async () => {
    const w = filledWorld();
    w.cluster.put(repoObject({ spec: { fetch: BUNDLE_BY_TAG } }) as never);
    w.cluster.secrets.set('ns/repo-fetch-0', FILLED as never);
    w.runner.on('vendir', vendirFetches);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    await dispatchEvent(objectEvent(PKGR_REF, 'added', { time: new Date(NOW) }), w.deps);
    const vendir = w.runner.calls.find((c) => c.cmd === 'vendir')!;
    expect(vendir.stdin).toContain('name: repo-fetch-0');
    expect(vendir.stdin).toContain('kind: Secret');
    // created once, never overwritten: secretgen-controller's content stays
    expect(Buffer.from(w.cluster.secrets.get('ns/repo-fetch-0')!.data[DOCKERCONFIG]!).toString()).toContain('"u"');
    expect(w.outcomes()).toContainEqual(['index-repo', 'succeeded']);
  });

  it('no placeholder for a fetch with secretRef or another source', async () => {
    for (const fetch of [
      { imgpkgBundle: { image: 'registry.example/r:v1', secretRef: { name: 'reg' } } },
      INLINE_FETCH,
    ]) {
      const { w } = await indexOnce({ ...deploys, repo: { spec: { fetch } } });
      expect(w.cluster.calls.filter((c) => c[0] === 'createSecret')).toEqual([]);
    }
  });

  it('ref-changed: its own unfilled placeholder forces nothing; filled, it forces a reconcile', async () => {
    // A source by digest: a tag is polled for the fleet, and its ref-changed (the poll's poke for a
    // new digest) always runs (next test).
    const notDue = { spec: { fetch: BUNDLE_BY_DIGEST }, status: SUCCEEDED_A_MINUTE_AGO };
    const first = await indexOnce({ ...deploys, repo: { spec: { fetch: BUNDLE_BY_DIGEST } } });
    const unfilled = filledWorld();
    unfilled.cluster.put(repoObject(notDue) as never);
    unfilled.cluster.secrets.set('ns/repo-fetch-0', first.w.cluster.secrets.get('ns/repo-fetch-0')!);
    await dispatchEvent(objectEvent(PKGR_REF, 'ref-changed', { time: new Date(NOW) }), unfilled.deps);
    expect(unfilled.outcomes()).toEqual([['reconcile', 'noop']]);
    // deleted: the forced run creates it again (upstream recreates it on every reconcile)
    const deleted = await indexOnce({ ...deploys, repo: notDue, reason: 'ref-changed' });
    expect(deleted.w.cluster.calls.filter((c) => c[0] === 'createSecret')).toEqual([['createSecret', 'repo-fetch-0']]);

    const w = filledWorld();
    w.cluster.put(repoObject(notDue) as never);
    w.cluster.secrets.set('ns/repo-fetch-0', FILLED as never);
    w.runner.on('vendir', vendirFetches);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    await dispatchEvent(objectEvent(PKGR_REF, 'ref-changed', { time: new Date(NOW) }), w.deps);
    expect(w.outcomes()).toEqual([
      ['reconcile', 'succeeded'],
      ['index-repo', 'succeeded'],
    ]);
  });

  it('ref-changed on a source by tag (polled for the fleet) runs even with its placeholder unfilled', async () => {
    const notDue = { spec: { fetch: BUNDLE_BY_TAG }, status: SUCCEEDED_A_MINUTE_AGO };
    const first = await indexOnce({ ...deploys, repo: { spec: { fetch: BUNDLE_BY_TAG } } });
    const w = filledWorld();
    w.cluster.put(repoObject(notDue) as never);
    w.cluster.secrets.set('ns/repo-fetch-0', first.w.cluster.secrets.get('ns/repo-fetch-0')!);
    w.runner.on('vendir', vendirFetches);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    await dispatchEvent(objectEvent(PKGR_REF, 'ref-changed', { time: new Date(NOW) }), w.deps);
    expect(w.outcomes()).toEqual([
      ['reconcile', 'succeeded'],
      ['index-repo', 'succeeded'],
    ]);
  });
});

// ------------------------------------------------------------------------------ the fleet index

const COMMIT = 'c'.repeat(40);
const DIGEST = `sha256:${'d'.repeat(64)}`;
/** A rendered index as `templateRepository` returns it: annotated for `ns/repo`. */
const indexManifest = (ref: string) =>
  [
    'apiVersion: data.packaging.carvel.dev/v1alpha1',
    'kind: Package',
    'metadata:',
    '  name: a.example.com.1.0.0',
    '  annotations:',
    `    packaging.carvel.dev/package-repository-ref: ${ref}`,
    '    kapp.k14s.io/create-strategy: fallback-on-update-or-noop',
    'spec:',
    '  refName: a.example.com',
    '  version: 1.0.0',
    '---',
    'apiVersion: kapp.k14s.io/v1alpha1',
    'kind: Config',
    'rebaseRules: []',
    '',
  ].join('\n');
const KBLD_STDERR = 'resolve | final: registry.example/a:1 -> registry.example/a@sha256:1\n';
const INDEXED: RepoTemplateOutput = {
  result: { stdout: '', stderr: KBLD_STDERR, exitCode: 0, finished: true },
  manifest: indexManifest('ns/repo'),
  versions: { 'a.example.com': ['1.0.0', '1.1.0+kadras.2'] },
};

/** One cluster of the fleet: its PackageRepository (`ns2/repo2` unless the first) and runtime. */
interface FleetCluster {
  clusterId: string;
  namespace: string;
  name: string;
  fetch: Record<string, unknown>;
  config?: Partial<PipelineConfig>;
  template?: RepoTemplateOutput;
  /** The repository's metadata over the default (uid, deletionTimestamp, finalizers). */
  metadata?: Record<string, unknown>;
  kapp?: ScriptedResult;
  /** Default {@link vendirFetches}. */
  vendir?: (req: RunRequest) => Promise<ScriptedResult>;
  /** The source resolver (default: unreachable, so a tag or branch is fetched as is). */
  resolve?: () => Promise<string>;
}

async function reconcileIn(store: MemoryStore, c: FleetCluster) {
  const templateCalls: RepoTemplateInput[] = [];
  const w = appWorld({
    tmpRoot: path.join(tempDir(), 'scratch'),
    store,
    config: c.config,
    extra: {
      templateRepository: async (input) => {
        templateCalls.push(input);
        return c.template ?? INDEXED;
      },
      // A tag or branch is polled for the fleet when it resolves; these rows' registry and git
      // server cannot be reached unless the row says otherwise.
      resolveSource: c.resolve ?? (async () => Promise.reject(new Error('unreachable'))),
    },
  });
  const metadata: Record<string, unknown> = { name: c.name, namespace: c.namespace, ...c.metadata };
  w.cluster.put(repoObject({ metadata, spec: { fetch: c.fetch } }) as never);
  w.runner.on('vendir', c.vendir ?? vendirFetches);
  w.runner.on('kapp', c.kapp ?? { stdout: 'Succeeded' });
  const ref = { ...PKGR_REF, clusterId: c.clusterId, namespace: c.namespace, name: c.name };
  const next = await dispatchEvent(
    objectEvent({ ...ref, uid: String(metadata.uid ?? ref.uid) }, 'added', { time: new Date(NOW) }),
    w.deps,
  );
  const kapp = w.runner.calls.find((call) => call.cmd === 'kapp');
  return { w, templateCalls, stdin: kapp?.stdin, next };
}

interface FleetRow {
  fetch: Record<string, unknown>;
  /** The source resolver of both clusters (default: unreachable). */
  resolve?: () => Promise<string>;
  /** The second cluster's pipeline config (tool versions, URL policy). */
  config?: Partial<PipelineConfig>;
  /** The first cluster's template result (default {@link INDEXED}). */
  firstTemplate?: RepoTemplateOutput;
  /** Tools run and template pipelines run in the second cluster. */
  tools: string[];
  templates: number;
  /** The second cluster's final status. */
  status: AppStatus;
}

/**
 * The second cluster's final status, whether its parts came from the index or from its own tools:
 * a hit reports the recorded vendir lock config and kbld stderr, as the App pipeline's caches do.
 */
const SUCCEEDED = finalSucceeded({
  fetch: FETCHED,
  template: { exitCode: 0, stderr: KBLD_STDERR, updatedAt: NOW },
  deploy: { finished: true, exitCode: 0, stdout: 'Succeeded', startedAt: NOW, updatedAt: NOW },
});

const fleetRows: Record<string, FleetRow> = {
  'git pinned to a commit: kapp only, fetch and template parts from the index': {
    fetch: { git: { url: 'https://git.example/repo', ref: COMMIT } },
    tools: ['kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'imgpkgBundle by digest: kapp only': {
    fetch: { imgpkgBundle: { image: `registry.example/repo@${DIGEST}` } },
    tools: ['kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'inline (pinned by its content): kapp only': {
    fetch: INLINE_FETCH,
    tools: ['kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'imgpkgBundle by tag, polled: the second cluster finds the fresh poll record, kapp only': {
    fetch: { imgpkgBundle: { image: 'registry.example/repo:v1' } },
    resolve: async () => DIGEST,
    tools: ['kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'git branch, polled: the second cluster finds the fresh poll record, kapp only': {
    fetch: { git: { url: 'https://git.example/repo', ref: 'origin/main' } },
    resolve: async () => COMMIT,
    tools: ['kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'imgpkgBundle by tag that cannot be resolved: fetched, then the template is skipped by the tree digest': {
    fetch: { imgpkgBundle: { image: 'registry.example/repo:v1' } },
    tools: ['vendir', 'kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'git branch that cannot be resolved: fetched, then the template is skipped by the tree digest': {
    fetch: { git: { url: 'https://git.example/repo', ref: 'origin/main' } },
    tools: ['vendir', 'kapp'],
    templates: 0,
    status: SUCCEEDED,
  },
  'another ytt version: not the same index, templated again': {
    fetch: { git: { url: 'https://git.example/repo', ref: COMMIT } },
    config: { toolVersions: { vendir: '0.44.0', ytt: '0.99.0', kapp: '0.64.2' } },
    tools: ['vendir', 'kapp'],
    templates: 1,
    status: SUCCEEDED,
  },
  'the first template failed: nothing was indexed, fetched and templated again': {
    fetch: { git: { url: 'https://git.example/repo', ref: COMMIT } },
    firstTemplate: { result: { stdout: '', stderr: '', exitCode: -1, error: NO_PACKAGES, finished: true } },
    tools: ['vendir', 'kapp'],
    templates: 1,
    status: SUCCEEDED,
  },
  "a source this cluster's URL policy refuses: the index is not used, the fetch fails": {
    fetch: { git: { url: 'https://127.0.0.1/repo', ref: COMMIT } },
    config: { urlPolicy: { mode: 'enforce', allow: [] } },
    tools: [],
    templates: 0,
    status: expect.objectContaining({
      conditions: [expect.objectContaining({ type: 'ReconcileFailed' })],
      fetch: expect.objectContaining({ error: expect.stringContaining('Fetching resources: ') }),
    }) as AppStatus,
  },
};

describe('index-repo: the package set is indexed once for the fleet', () => {
  it.each(Object.entries(fleetRows))('%s', async (_name, row) => {
    const store = new MemoryStore();
    const first = await reconcileIn(store, {
      clusterId: 'c1',
      namespace: 'ns',
      name: 'repo',
      fetch: row.fetch,
      template: row.firstTemplate,
      resolve: row.resolve,
    });
    expect(first.w.tools()[0]).toBe('vendir');
    expect(first.templateCalls).toHaveLength(1);

    const second = await reconcileIn(store, {
      clusterId: 'c2',
      namespace: 'ns2',
      name: 'repo2',
      fetch: row.fetch,
      config: row.config,
      resolve: row.resolve,
    });
    expect(second.w.tools()).toEqual(row.tools);
    expect(second.templateCalls).toHaveLength(row.templates);
    expect(second.w.statuses().at(-1)).toEqual(row.status);
  });

  it("the second cluster's kapp gets the index with its own package-repository-ref, all else as rendered", async () => {
    const store = new MemoryStore();
    const fetch = { git: { url: 'https://git.example/repo', ref: COMMIT } };
    const first = await reconcileIn(store, { clusterId: 'c1', namespace: 'ns', name: 'repo', fetch });
    expect(first.stdin).toBe(indexManifest('ns/repo'));
    const second = await reconcileIn(store, { clusterId: 'c2', namespace: 'ns2', name: 'repo2', fetch });
    expect(parseAllDocuments(second.stdin ?? '').map((d) => d.toJS())).toEqual(
      parseAllDocuments(indexManifest('ns2/repo2')).map((d) => d.toJS()),
    );
    // The same name and namespace in another cluster: the stored bytes as they are.
    const third = await reconcileIn(store, { clusterId: 'c3', namespace: 'ns', name: 'repo', fetch });
    expect(third.stdin).toBe(indexManifest('ns/repo'));
    expect(third.w.tools()).toEqual(['kapp']);
  });

  it('a pinned source whose content a branch indexed: fetched once, then found without a fetch', async () => {
    const store = new MemoryStore();
    const branch = { git: { url: 'https://git.example/repo', ref: 'origin/main' } };
    const pinned = { git: { url: 'https://git.example/repo', ref: COMMIT } };
    const first = await reconcileIn(store, { clusterId: 'c1', namespace: 'ns', name: 'repo', fetch: branch });
    expect(first.templateCalls).toHaveLength(1);
    const second = await reconcileIn(store, { clusterId: 'c2', namespace: 'ns', name: 'repo', fetch: pinned });
    expect([second.w.tools(), second.templateCalls.length]).toEqual([['vendir', 'kapp'], 0]);
    const third = await reconcileIn(store, { clusterId: 'c3', namespace: 'ns', name: 'repo', fetch: pinned });
    expect([third.w.tools(), third.templateCalls.length]).toEqual([['kapp'], 0]);
    expect(third.w.statuses().at(-1)).toEqual(SUCCEEDED);
  });

  it('stores the versions per refName beside the index, read back by the typed reader', async () => {
    const store = new MemoryStore();
    await reconcileIn(store, {
      clusterId: 'c1',
      namespace: 'ns',
      name: 'repo',
      fetch: { git: { url: 'https://git.example/repo', ref: COMMIT } },
    });
    const indexes = await store.list('artifacts/index/');
    expect(indexes.map((k) => k.replace(/[0-9a-f]{64}/, '<d>'))).toEqual([
      'artifacts/index/sha256/<d>.json',
      'artifacts/index/sha256/<d>.yaml',
    ]);
    const digest = /([0-9a-f]{64})/.exec(indexes[0]!)![1]!;
    expect(await readRepositoryVersions(store, digest)).toEqual(INDEXED.versions);
    expect(await readRepositoryVersions(store, 'e'.repeat(64))).toBeUndefined();
    // One record for the fetched tree, one for the pinned source.
    expect(await store.list('cache/index/')).toHaveLength(2);
  });

  it("a deploy its source's poll record cannot take fails the run; the retried run records it", async () => {
    /** Its compare-and-swap writes that record a member's deployed digest (`at`) throw once. */
    class RecordFailing extends MemoryStore {
      failures = 1;
      override async putIfMatch(key: string, body: ObjectBody, ifMatch: string | undefined) {
        if (this.failures > 0 && String(body).includes('"at":')) {
          this.failures -= 1;
          throw new StoreError(`failed to put object "${key}" conditionally`, 'putIfMatch', key);
        }
        return await super.putIfMatch(key, body, ifMatch);
      }
    }
    const store = new RecordFailing();
    const c1 = {
      clusterId: 'c1',
      namespace: 'ns',
      name: 'repo',
      fetch: { imgpkgBundle: { image: 'registry.example/repo:v1' } },
      resolve: async () => DIGEST,
    };
    await expect(reconcileIn(store, c1)).rejects.toThrow('recording the deployed source digest failed');
    const [key] = await store.list(SOURCE_POLL_PREFIX);
    const members = async () => (await readSourcePoll(store, key!))?.members;
    expect(await members()).toEqual([{ cluster: 'c1', namespace: 'ns', name: 'repo', uid: PKGR_REF.uid }]);
    // The retry: the index is there (kapp only), and the deployed digest is recorded.
    const retried = await reconcileIn(store, c1);
    expect(retried.w.tools()).toEqual(['kapp']);
    expect(await members()).toEqual([{ cluster: 'c1', namespace: 'ns', name: 'repo', uid: PKGR_REF.uid, at: DIGEST }]);
  });

  it('a fetch that uses a Secret is never indexed', async () => {
    const w = appWorld({ tmpRoot: path.join(tempDir(), 'scratch') });
    const pkgr = parsePackageRepository(
      repoObject({ spec: { fetch: { git: { url: 'https://git.example/r', ref: COMMIT, secretRef: { name: 's' } } } } }),
    );
    if (!pkgr.success) throw pkgr.error;
    expect(await planRepoIndex(pkgr.data, { namespace: 'ns', name: 'repo' }, w.deps)).toBeUndefined();
  });
});

/** One reconcile of `c1` `ns/repo` in a row of {@link announceRows}. */
interface AnnounceStep {
  /** Versions the template renders (default {@link INDEXED}'s). */
  versions?: Record<string, string[]>;
  fetch?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
  kapp?: ScriptedResult;
  /** The `changes` of the `repo.indexed` event handed on; `null`: no event. */
  announces: Array<{ refName: string; versions: string[] }> | null;
}

const GIT = { git: { url: 'https://git.example/repo', ref: 'origin/main' } };
const V1 = { 'a.example.com': ['1.0.0'], 'b.example.com': ['0.1.0'] };
const V2 = { 'a.example.com': ['1.0.0', '2.0.0'], 'b.example.com': ['0.1.0'] };
const DELETING = { deletionTimestamp: NOW, finalizers: [Finalizer.PackageRepository] };
/** What a first deploy of {@link V1} (or its removal) announces: every refName with all its versions. */
const ALL_OF_V1 = [
  { refName: 'a.example.com', versions: ['1.0.0'] },
  { refName: 'b.example.com', versions: ['0.1.0'] },
];
/** The first reconcile of most rows: {@link V1} deployed, all of it announced. */
const FIRST_V1: AnnounceStep = { versions: V1, announces: ALL_OF_V1 };

/** Successive reconciles of one repository sharing one store: what each hands on to the PackageInstalls. */
const announceRows: Record<string, AnnounceStep[]> = {
  'the first deploy announces every version; the same versions again announce nothing': [
    FIRST_V1,
    { versions: V1, announces: null },
  ],
  'a version added: only its refName, only the new version': [
    FIRST_V1,
    { versions: V2, announces: [{ refName: 'a.example.com', versions: ['2.0.0'] }] },
  ],
  'a version and a refName removed: the removed ones': [
    {
      versions: V2,
      announces: [
        { refName: 'a.example.com', versions: ['1.0.0', '2.0.0'] },
        { refName: 'b.example.com', versions: ['0.1.0'] },
      ],
    },
    { versions: { 'a.example.com': ['2.0.0'] }, announces: ALL_OF_V1 },
  ],
  'a failed deploy announces nothing and keeps the pointer: the next success announces the change': [
    FIRST_V1,
    { versions: V2, kapp: exitWith(1, 'kapp: Error: boom'), announces: null },
    { versions: V2, announces: [{ refName: 'a.example.com', versions: ['2.0.0'] }] },
  ],
  'a deleted repository announces the removal of all it deployed; recreated, it announces all again': [
    FIRST_V1,
    { metadata: DELETING, announces: ALL_OF_V1 },
    {
      versions: { 'a.example.com': ['1.0.0'] },
      metadata: { uid: 'uid-new' },
      announces: [{ refName: 'a.example.com', versions: ['1.0.0'] }],
    },
  ],
  'a repository recreated under the same name (new uid) starts afresh': [
    FIRST_V1,
    { versions: V1, metadata: { uid: 'uid-new' }, announces: ALL_OF_V1 },
  ],
  'a pinned source already indexed (no fetch, no template) is compared by the stored versions document': [
    {
      versions: V1,
      fetch: { git: { url: 'https://git.example/repo', ref: COMMIT } },
      announces: ALL_OF_V1,
    },
    { versions: V2, fetch: { git: { url: 'https://git.example/repo', ref: COMMIT } }, announces: null },
  ],
};

describe('index-repo: a polled tag moved (the fleet leader)', () => {
  it('the run that templates the new digest reconciles the repositories behind on the source while its own kapp deploys, once', async () => {
    const store = new MemoryStore();
    const fetch = { imgpkgBundle: { image: 'registry.example/repo:v1' } };
    const emitted: KappEvent[] = [];
    let poked: () => void = () => undefined;
    const pokedOnce = new Promise<void>((r) => {
      poked = r;
    });
    const w = appWorld({
      tmpRoot: path.join(tempDir(), 'scratch'),
      store,
      extra: {
        templateRepository: async () => INDEXED,
        resolveSource: async () => DIGEST,
        emit: async (events) => {
          emitted.push(...events);
          poked();
        },
      },
    });
    w.deps.clusters = { ...w.deps.clusters, clusterIds: () => [PKGR_REF.clusterId] };
    w.cluster.put(repoObject({ spec: { fetch } }) as never);
    w.cluster.put(repoObject({ metadata: { name: 'other', uid: 'uid-o' }, spec: { fetch } }) as never);
    // The tag moved to DIGEST (a fresh poll record); the other repository deployed the old digest.
    const key = sourcePollKey({ kind: 'imgpkgBundle', url: fetch.imgpkgBundle.image, ref: 'v1' });
    const old = `sha256:${'0'.repeat(64)}`;
    await updateSourcePoll(store, key, () => ({
      v: 1,
      source: { kind: 'imgpkgBundle', url: fetch.imgpkgBundle.image, ref: 'v1' },
      resolved: DIGEST,
      polledAt: NOW,
      changedAt: NOW,
      members: [{ cluster: PKGR_REF.clusterId, namespace: 'ns', name: 'other', uid: 'uid-o', at: old }],
    }));
    w.runner.on('vendir', vendirFetches);
    let pokedDuringKapp = false;
    w.runner.on('kapp', async () => {
      pokedDuringKapp = await Promise.race([pokedOnce.then(() => true), sleep(2_000).then(() => false)]);
      return { stdout: 'Succeeded' };
    });
    await dispatchEvent(objectEvent(PKGR_REF, 'ref-changed', { time: new Date(NOW) }), w.deps);
    expect(w.tools()).toEqual(['vendir', 'kapp']);
    expect(pokedDuringKapp).toBe(true);
    // Poked once: the deploy that follows does not poke it again.
    expect(emitted.map((e) => (e.type === EVENT_TYPES.object ? `${e.data.name}:${e.data.reason}` : e.type))).toEqual([
      'other:ref-changed',
    ]);
    const rec = await readSourcePoll(store, key);
    expect(rec).toMatchObject({ resolved: DIGEST, indexed: DIGEST });
    expect(rec?.members.find((m) => m.name === 'repo')?.at).toBe(DIGEST);
  });
});

describe('index-repo: a change of versions is handed on to the PackageInstalls (repo.indexed)', () => {
  it.each(Object.entries(announceRows))('%s', async (_name, steps) => {
    const store = new MemoryStore();
    const seen: Array<unknown> = [];
    for (const step of steps) {
      const { next } = await reconcileIn(store, {
        clusterId: 'c1',
        namespace: 'ns',
        name: 'repo',
        fetch: step.fetch ?? GIT,
        template: { ...INDEXED, versions: step.versions ?? INDEXED.versions },
        ...(step.metadata ? { metadata: step.metadata } : {}),
        ...(step.kapp ? { kapp: step.kapp } : {}),
        vendir: vendirFetchesVersions(step.versions ?? INDEXED.versions ?? {}),
      });
      seen.push(announced(next));
    }
    expect(seen).toEqual(steps.map((s) => s.announces));
  });

  it('the event names the repository and the index deployed; the pointer names that index', async () => {
    const store = new MemoryStore();
    const { next } = await reconcileIn(store, { clusterId: 'c1', namespace: 'ns', name: 'repo', fetch: GIT });
    if (next?.type !== EVENT_TYPES.repoIndexed) throw new Error('expected a repo.indexed event');
    expect(next.subject).toBe('c1/PackageRepository/ns/repo');
    const indexKey = next.data.artifacts.indexKey ?? '';
    expect(indexKey).toMatch(/^artifacts\/index\/sha256\/[0-9a-f]{64}\.json$/);
    const pointer = JSON.parse((await store.get(repoPointerKey('c1', 'ns', 'repo')))?.toString() ?? '{}');
    expect(pointer).toEqual({ uid: 'uid-r', index: /([0-9a-f]{64})/.exec(indexKey)?.[1] });
  });
});

/** vendir leaving a tree that differs with `versions` (a new tree digest, as a real new version makes). */
function vendirFetchesVersions(versions: Record<string, string[]>) {
  return async (req: RunRequest): Promise<ScriptedResult> => {
    await mkdir(path.join(req.cwd ?? '', '0', 'packages'), { recursive: true });
    await writeFile(path.join(req.cwd ?? '', '0', 'packages', 'a.yml'), `# ${JSON.stringify(versions)}\n`);
    return { stdout: 'lock: vendir\n' };
  };
}

/** The `changes` of a `repo.indexed` event, `null` for no event. */
function announced(next: KappEvent | undefined) {
  if (!next) return null;
  return next.type === EVENT_TYPES.repoIndexed ? next.data.changes : next.type;
}
