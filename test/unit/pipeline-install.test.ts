/**
 * The install function over its outcomes (§2.3, §3.9, §3.11): one row per outcome, each asserting
 * the PackageInstall status written, the App left in the cluster, the cluster writes made and the
 * logged outcome. Called through `dispatchEvent` with a PackageInstall object event. Faked at the
 * port only: the shared fake cluster (as install view: list, App and Secret writes).
 */
import { describe, expect, it } from 'vitest';
import {
  EVENT_TYPES,
  type KappEvent,
  type ObjectRef,
  objectEvent,
  repoIndexedEvent,
  serializeEvent,
} from '../../events/schema.js';
import { Finalizer } from '../../functions/lib/api/index.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { stageClusterRegistry } from '../../functions/lib/entry/lambda.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { ConflictError, KubeApiError, type KubeObject } from '../../functions/lib/kube/port.js';
import { injectValues, secretNamesFromAnnotation } from '../../functions/lib/packaging/install-values.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { friendlyErrMsg } from '../../functions/lib/pipeline/install/install.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { FakeCluster } from './support/fake-cluster.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-install-');
const NOW = '2025-01-01T00:00:00Z';
const GLOBAL = 'kapp-controller-packaging-global';
const GENERIC = 'Error (see .status.usefulErrorMessage for details)';
const PKGI_API = 'packaging.carvel.dev/v1alpha1';
const REF: ObjectRef = {
  clusterId: 'c1',
  kind: 'PackageInstall',
  apiVersion: PKGI_API,
  namespace: 'ns',
  name: 'inst',
  uid: 'uid-pkgi',
  generation: 1,
  resourceVersion: '1',
};
const OWNER = { apiVersion: PKGI_API, kind: 'PackageInstall', name: 'inst', uid: 'uid-pkgi' };
const CONTROLLER = { ...OWNER, controller: true, blockOwnerDeletion: true };

interface PkgShape {
  version: string;
  namespace?: string;
  k8s?: string;
  kc?: string;
  spec?: Record<string, unknown>;
}

/** A Package `pkg.test.carvel.dev` of `version` with an image fetch, two ytt steps and kapp. */
function pkg(p: PkgShape): KubeObject {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: {
      name: `pkg.test.carvel.dev.${p.version}`,
      namespace: p.namespace ?? 'ns',
      uid: `uid-${p.version}`,
      resourceVersion: '1',
    },
    spec: {
      refName: 'pkg.test.carvel.dev',
      version: p.version,
      ...(p.k8s ? { kubernetesVersionSelection: { constraints: p.k8s } } : {}),
      ...(p.kc ? { kappControllerVersionSelection: { constraints: p.kc } } : {}),
      template: {
        spec: {
          fetch: [{ image: { url: `registry.example/pkg:${p.version}` } }, { git: { url: 'https://git.example/r' } }],
          template: [{ ytt: { paths: ['0'] } }, { kbld: {} }, { ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
      ...p.spec,
    },
  };
}

interface PkgiShape {
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
  annotations?: Record<string, string>;
  metadata?: Record<string, unknown>;
}

function pkgi(s: PkgiShape = {}): KubeObject {
  return {
    apiVersion: PKGI_API,
    kind: 'PackageInstall',
    metadata: {
      name: 'inst',
      namespace: 'ns',
      uid: 'uid-pkgi',
      generation: 1,
      resourceVersion: '1',
      ...(s.annotations ? { annotations: s.annotations } : {}),
      ...s.metadata,
    },
    spec: {
      serviceAccountName: 'sa',
      packageRef: { refName: 'pkg.test.carvel.dev', versionSelection: { constraints: '>=1.0.0' } },
      values: [{ secretRef: { name: 'vals' } }],
      ...s.spec,
    },
    ...(s.status ? { status: s.status } : {}),
  };
}

/** The App generated for {@link pkgi} from {@link pkg} `version` (§3.11.3), as created. */
function generatedApp(version: string, extra: { annotations?: Record<string, string> } = {}) {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: {
      name: 'inst',
      namespace: 'ns',
      annotations: {
        ...extra.annotations,
        'packaging.carvel.dev/package-ref-name': 'pkg.test.carvel.dev',
        'packaging.carvel.dev/package-version': version,
      },
      ownerReferences: [CONTROLLER],
    },
    spec: {
      fetch: [
        { image: { url: `registry.example/pkg:${version}`, secretRef: { name: 'inst-fetch-0' } } },
        { git: { url: 'https://git.example/r' } },
      ],
      template: [{ ytt: { paths: ['0'], valuesFrom: [{ secretRef: { name: 'vals' } }] } }, { kbld: {} }, { ytt: {} }],
      deploy: [{ kapp: {} }],
      serviceAccountName: 'sa',
      syncPeriod: '10m0s',
    },
  };
}

/** An App that exists for the PackageInstall with `status`. */
function existingApp(version: string, status: Record<string, unknown>, generation = 1): KubeObject {
  const app = generatedApp(version) as unknown as KubeObject;
  app.metadata = { ...app.metadata, uid: 'uid-app', resourceVersion: '5', generation };
  return { ...app, status };
}

const RECONCILING = {
  observedGeneration: 1,
  conditions: [{ type: 'Reconciling', status: 'True' }],
  friendlyDescription: 'Reconciling',
};
const SUCCEEDED = {
  observedGeneration: 1,
  conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
  friendlyDescription: 'Reconcile succeeded',
};

function failed(message: string, extra: Record<string, unknown> = {}) {
  return {
    observedGeneration: 1,
    conditions: [{ type: 'ReconcileFailed', status: 'True', message }],
    friendlyDescription: friendlyErrMsg(`Reconcile failed: ${message}`),
    ...extra,
  };
}

const FINALIZER_ADDED: [string, ...unknown[]] = ['addFinalizer', 'inst', Finalizer.PackageInstall];
const PLACEHOLDER_CREATED: [string, ...unknown[]] = ['createSecret', 'inst-fetch-0'];
/** The writes of a reconcile that creates the App. */
const CREATED: Row['writes'] = [FINALIZER_ADDED, PLACEHOLDER_CREATED, ['createApp', 'inst']];
/** The writes of a reconcile that updates the App. */
const UPDATED: Row['writes'] = [FINALIZER_ADDED, PLACEHOLDER_CREATED, ['updateApp', 'inst']];

/** `[Reconciling]` with `version` selected and attempted. */
function reconcilingAt(version: string) {
  return { ...RECONCILING, version, lastAttemptedVersion: version };
}

interface Row {
  pkgi: KubeObject;
  packages?: KubeObject[];
  app?: KubeObject;
  /** Namespaces other than `ns` and the global one (both exist). */
  nsAnnotations?: Record<string, string>;
  status: unknown;
  /** The App afterwards (`undefined`: none); only compared where given. */
  appAfter?: unknown;
  /** Cluster writes besides status writes and reads, in order. */
  writes: Array<[string, ...unknown[]]>;
  /** Default `succeeded`. */
  outcome?: string;
  /** Default the PackageInstall finalizer. */
  finalizers?: string[];
  /** The recorded uid of the global namespace (its live uid is `uid-g`), and where it is recorded. */
  recorded?: { uid: string; in: 'registry document' | 'kapp-controller-config' };
}

/** The note a PackageInstall gets when the global namespace's live uid `uid-g` is not `recorded`. */
const untrusted = (recorded: string) =>
  `; the Packages of the global namespace were not trusted: namespace ${GLOBAL} has uid uid-g, not the uid ${recorded} recorded when kapp-lambda was installed (created by someone else, or deleted and created again); if the namespace is the cluster's own, record its uid again (npm run cluster -- join --replace --adopt-global-namespace, or kapp-controller-config key kappLambdaPackagingGlobalNamespaceUID)`;

const V1_V2 = [pkg({ version: '1.0.0' }), pkg({ version: '2.0.0' })];

const rows: Record<string, Row> = {
  'first reconcile: finalizer, placeholder Secret, App created; stays Reconciling with version and lastAttemptedVersion':
    {
      pkgi: pkgi(),
      packages: V1_V2,
      status: reconcilingAt('2.0.0'),
      appAfter: generatedApp('2.0.0'),
      writes: CREATED,
    },
  'App succeeded: the PackageInstall mirrors ReconcileSucceeded (upstream packageinstall_test.go shape)': {
    pkgi: pkgi({ status: reconcilingAt('2.0.0') }),
    packages: V1_V2,
    app: existingApp('2.0.0', SUCCEEDED),
    status: { ...SUCCEEDED, version: '2.0.0', lastAttemptedVersion: '2.0.0' },
    writes: [FINALIZER_ADDED, PLACEHOLDER_CREATED],
  },
  'App failed: ReconcileFailed with the generic message and the App usefulErrorMessage': {
    pkgi: pkgi(),
    packages: V1_V2,
    app: existingApp('2.0.0', {
      ...failed('Deploying: Error (see .status.usefulErrorMessage for details)'),
      usefulErrorMessage: 'kapp: Error: boom',
    }),
    status: failed(GENERIC, {
      version: '2.0.0',
      lastAttemptedVersion: '2.0.0',
      usefulErrorMessage: 'kapp: Error: boom',
    }),
    writes: [FINALIZER_ADDED, PLACEHOLDER_CREATED],
    outcome: 'failed',
  },
  'new version: the App is updated and the PackageInstall shows Reconciling until the App observes it': {
    pkgi: pkgi({ status: { ...SUCCEEDED, version: '1.0.0', lastAttemptedVersion: '1.0.0' } }),
    packages: V1_V2,
    app: existingApp('1.0.0', SUCCEEDED),
    status: reconcilingAt('2.0.0'),
    writes: UPDATED,
  },
  'downgrade guard: version is set, lastAttemptedVersion kept, the exact message, App untouched': {
    pkgi: pkgi({
      spec: { packageRef: { refName: 'pkg.test.carvel.dev', versionSelection: { constraints: '1.0.0' } } },
      status: { ...SUCCEEDED, version: '2.0.0', lastAttemptedVersion: '2.0.0' },
    }),
    packages: V1_V2,
    app: existingApp('2.0.0', SUCCEEDED),
    status: failed(GENERIC, {
      version: '1.0.0',
      lastAttemptedVersion: '2.0.0',
      usefulErrorMessage:
        "Stopped installing matched version '1.0.0' since last attempted version '2.0.0' is higher.\n" +
        'hint: Add annotation packaging.carvel.dev/downgradable: "" to PackageInstall to proceed with downgrade',
    }),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'downgradable annotation: the lower version is installed': {
    pkgi: pkgi({
      annotations: { 'packaging.carvel.dev/downgradable': '' },
      spec: { packageRef: { refName: 'pkg.test.carvel.dev', versionSelection: { constraints: '1.0.0' } } },
      status: { ...SUCCEEDED, version: '2.0.0', lastAttemptedVersion: '2.0.0' },
    }),
    packages: V1_V2,
    app: existingApp('2.0.0', SUCCEEDED),
    status: reconcilingAt('1.0.0'),
    writes: UPDATED,
  },
  'no version matches: the selection message, friendly first 80 characters': {
    pkgi: pkgi({
      spec: { packageRef: { refName: 'pkg.test.carvel.dev', versionSelection: { constraints: '>=3.0.0' } } },
    }),
    packages: V1_V2,
    status: failed(
      'Expected to find at least one version, but did not (details: all=2 -> after-prereleases-filter=2 -> after-kapp-controller-version-check=2 -> after-constraints-filter=0)',
    ),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'no Package at all: Package <refName> not found': {
    pkgi: pkgi(),
    packages: [],
    status: failed('Package pkg.test.carvel.dev not found'),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'no versionSelection: Expected non-empty version selection': {
    pkgi: pkgi({ spec: { packageRef: { refName: 'pkg.test.carvel.dev' } } }),
    packages: V1_V2,
    status: failed('Expected non-empty version selection'),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'values without secretRef: Invalid fields': {
    pkgi: pkgi({ spec: { values: [{ secretRef: { name: 'a' } }, {}] } }),
    packages: V1_V2,
    status: failed('Invalid fields: spec.values[1].secretRef: Required value'),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'global Package, local override wins; Kubernetes 1.34.4 excludes 2.0.0': {
    pkgi: pkgi(),
    packages: [
      pkg({ version: '1.0.0', namespace: GLOBAL }),
      pkg({ version: '2.0.0', namespace: GLOBAL }),
      pkg({ version: '2.0.0', k8s: '<1.30.0' }),
    ],
    status: reconcilingAt('1.0.0'),
    writes: CREATED,
  },
  'ignore-kubernetes-version-selection: the constraint is skipped': {
    pkgi: pkgi({ annotations: { 'packaging.carvel.dev/ignore-kubernetes-version-selection': '' } }),
    packages: [pkg({ version: '1.0.0' }), pkg({ version: '2.0.0', k8s: '<1.30.0' })],
    status: reconcilingAt('2.0.0'),
    writes: CREATED,
  },
  'kapp-controller version check: 0.53.1 is too old for 2.0.0; the annotation skips it': {
    pkgi: pkgi(),
    packages: [pkg({ version: '1.0.0', kc: '>=0.50.0' }), pkg({ version: '2.0.0', kc: '>=0.60.0' })],
    status: reconcilingAt('1.0.0'),
    writes: CREATED,
  },
  'global namespace with the uid its registry document records: its Packages are trusted': {
    pkgi: pkgi(),
    packages: [pkg({ version: '1.0.0', namespace: GLOBAL })],
    recorded: { uid: 'uid-g', in: 'registry document' },
    status: reconcilingAt('1.0.0'),
    writes: CREATED,
  },
  'global namespace with another uid than recorded (a tenant created it first): its Packages are absent, the status says why':
    {
      pkgi: pkgi(),
      packages: [pkg({ version: '1.0.0', namespace: GLOBAL }), pkg({ version: '9.0.0', namespace: GLOBAL })],
      recorded: { uid: 'uid-admin', in: 'registry document' },
      status: failed(`Package pkg.test.carvel.dev not found${untrusted('uid-admin')}`),
      writes: [FINALIZER_ADDED],
      outcome: 'failed',
    },
  'global namespace with another uid than kapp-controller-config records: a local Package is still installed': {
    pkgi: pkgi(),
    packages: [pkg({ version: '1.0.0' }), pkg({ version: '9.0.0', namespace: GLOBAL })],
    recorded: { uid: 'uid-admin', in: 'kapp-controller-config' },
    status: reconcilingAt('1.0.0'),
    writes: CREATED,
  },
  'global namespace with another uid than kapp-controller-config records, no local version matches: the note too': {
    pkgi: pkgi(),
    packages: [pkg({ version: '0.1.0' }), pkg({ version: '9.0.0', namespace: GLOBAL })],
    recorded: { uid: 'uid-admin', in: 'kapp-controller-config' },
    status: failed(
      `Expected to find at least one version, but did not (details: all=1 -> after-prereleases-filter=1 -> after-kapp-controller-version-check=1 -> after-constraints-filter=0)${untrusted('uid-admin')}`,
    ),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'exclude-global-packages on the namespace: global Packages are not seen': {
    pkgi: pkgi(),
    packages: [pkg({ version: '1.0.0', namespace: GLOBAL })],
    nsAnnotations: { 'kapp-controller.carvel.dev/exclude-global-packages': '' },
    status: failed('Package pkg.test.carvel.dev not found'),
    writes: [FINALIZER_ADDED],
    outcome: 'failed',
  },
  'manually-controlled App: left as it is, its status still mirrored': {
    pkgi: pkgi(),
    packages: V1_V2,
    app: (() => {
      const a = existingApp('1.0.0', SUCCEEDED);
      a.metadata.annotations = { 'ext.packaging.carvel.dev/manually-controlled': '' };
      a.metadata.ownerReferences = [];
      return a;
    })(),
    status: { ...SUCCEEDED, version: '2.0.0', lastAttemptedVersion: '2.0.0' },
    writes: [FINALIZER_ADDED, PLACEHOLDER_CREATED],
  },
  'an App controlled by another object: the controller-runtime message': {
    pkgi: pkgi(),
    packages: V1_V2,
    app: (() => {
      const a = existingApp('2.0.0', SUCCEEDED);
      a.metadata.ownerReferences = [{ ...CONTROLLER, name: 'other', uid: 'uid-other' }];
      return a;
    })(),
    status: failed('Object ns/inst is already owned by another PackageInstall controller other', {
      version: '2.0.0',
      lastAttemptedVersion: '2.0.0',
    }),
    writes: [FINALIZER_ADDED, PLACEHOLDER_CREATED],
    outcome: 'failed',
  },
  'takeover: an App of the same name without a controller gets the ownerReference and the Package spec': {
    pkgi: pkgi(),
    packages: V1_V2,
    app: {
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: {
        name: 'inst',
        namespace: 'ns',
        uid: 'uid-app',
        resourceVersion: '5',
        generation: 3,
        annotations: { mine: 'x' },
      },
      spec: { fetch: [{ inline: {} }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] },
      status: SUCCEEDED,
    },
    status: reconcilingAt('2.0.0'),
    appAfter: { ...generatedApp('2.0.0', { annotations: { mine: 'x' } }), status: SUCCEEDED },
    writes: UPDATED,
  },
  'deleting, App present: propagated fields updated, the App deleted, Deleting, finalizer kept': {
    pkgi: pkgi({
      metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageInstall] },
      spec: { serviceAccountName: 'fixed-sa', noopDelete: true },
      status: { ...SUCCEEDED, version: '2.0.0', lastAttemptedVersion: '2.0.0' },
    }),
    app: (() => {
      const a = existingApp('2.0.0', SUCCEEDED);
      a.metadata.finalizers = [Finalizer.App];
      return a;
    })(),
    status: {
      observedGeneration: 1,
      conditions: [{ type: 'Deleting', status: 'True' }],
      friendlyDescription: 'Deleting',
      version: '2.0.0',
      lastAttemptedVersion: '2.0.0',
    },
    writes: [
      ['updateApp', 'inst'],
      ['deleteApp', 'inst'],
    ],
    outcome: 'deleted',
  },
  'deleting, App DeleteFailed: Delete failed: Error (see .status.usefulErrorMessage for details)': {
    pkgi: pkgi({ metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageInstall] } }),
    app: (() => {
      const a = existingApp('2.0.0', {
        observedGeneration: 1,
        conditions: [{ type: 'DeleteFailed', status: 'True', message: 'Deleting: boom' }],
        usefulErrorMessage: 'Getting service account: serviceaccounts "sa" not found',
      });
      a.metadata.finalizers = [Finalizer.App];
      a.metadata.deletionTimestamp = NOW;
      return a;
    })(),
    status: {
      observedGeneration: 1,
      conditions: [{ type: 'DeleteFailed', status: 'True', message: GENERIC }],
      friendlyDescription: `Delete failed: ${GENERIC}`,
      usefulErrorMessage: 'Getting service account: serviceaccounts "sa" not found',
    },
    writes: [],
    outcome: 'deleted',
  },
  'deleting, App gone: the finalizer is removed': {
    pkgi: pkgi({ metadata: { deletionTimestamp: NOW, finalizers: [Finalizer.PackageInstall, 'other'] } }),
    status: undefined,
    writes: [['removeFinalizer', 'inst', Finalizer.PackageInstall]],
    outcome: 'deleted',
    finalizers: ['other'],
  },
};

function world(row: Row) {
  const cluster = new FakeCluster();
  cluster.put(row.pkgi);
  for (const p of row.packages ?? []) cluster.put(p);
  if (row.app) cluster.put(row.app);
  cluster.namespaces.set('ns', {
    metadata: { name: 'ns', uid: 'uid-ns', resourceVersion: '1', annotations: row.nsAnnotations },
    phase: 'Active',
  });
  cluster.namespaces.set(GLOBAL, { metadata: { name: GLOBAL, uid: 'uid-g', resourceVersion: '1' }, phase: 'Active' });
  const { deps, log } = stageDeps(cluster, { runner: new FakeCommandRunner(), now: NOW, tmpRoot: tempDir() });
  if (row.recorded?.in === 'registry document') {
    const uid = row.recorded.uid;
    deps.clusters = { ...deps.clusters, packagingGlobalNamespaceUid: () => uid };
  } else if (row.recorded) deps.clusterConfig = { timer: {}, packagingGlobalNamespaceUid: row.recorded.uid };
  return { cluster, deps, log };
}

describe('install: the PackageInstall reconcile, one row per outcome', () => {
  it.each(Object.entries(rows))('%s', async (_name, row) => {
    const { cluster, deps, log } = world(row);
    const next = await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), deps);
    expect(next).toBeUndefined();
    const statuses = cluster.statuses;
    expect(statuses).toEqual(row.status === undefined ? [] : [row.status]);
    const writes = cluster.calls.filter((c) => c[0] !== 'get' && c[0] !== 'update');
    expect(writes).toEqual(row.writes);
    const stored = cluster.get('PackageInstall', 'ns', 'inst');
    expect(stored?.metadata.finalizers ?? []).toEqual(row.finalizers ?? [Finalizer.PackageInstall]);
    const outcomes = log.records.filter((r) => r.msg === 'stage run').map((r) => r.obj.outcome);
    expect(outcomes).toEqual([row.outcome ?? 'succeeded']);
    if (row.appAfter) {
      const app = cluster.get('App', 'ns', 'inst');
      const { uid: _u, resourceVersion: _r, generation: _g, ...meta } = app?.metadata ?? {};
      expect({ ...app, metadata: meta }).toEqual(row.appAfter);
    }
  });

  it('no recorded uid (a cluster joined before the record): global Packages trusted, one warning per cluster', async () => {
    const row: Row = {
      pkgi: pkgi(),
      packages: [pkg({ version: '1.0.0', namespace: GLOBAL })],
      status: reconcilingAt('1.0.0'),
      writes: CREATED,
    };
    const { cluster, deps, log } = world(row);
    const ref = { ...REF, clusterId: 'c-unrecorded' };
    await dispatchEvent(objectEvent(ref, 'modified', { time: new Date(NOW) }), deps);
    await dispatchEvent(objectEvent({ ...ref, resourceVersion: '2' }, 'modified', { time: new Date(NOW) }), deps);
    expect(cluster.statuses[0]).toEqual(row.status);
    expect(log.records.filter((r) => r.level === 'warn' && /global namespace/.test(r.msg ?? ''))).toEqual([
      expect.objectContaining({
        obj: { clusterId: 'c-unrecorded' },
        msg: "the packaging global namespace's uid is not recorded: its Packages are trusted unchecked (record it: on the embedded runtime, kapp-controller-config key kappLambdaPackagingGlobalNamespaceUID; in a cloud fleet, npm run cluster -- join --replace)",
      }),
    ]);
  });

  it('on Lambda: the install function, narrowed to its access, creates the App from one SQS record and sends nothing on', async () => {
    const row = rows[Object.keys(rows)[0] as string] as Row;
    const { cluster, deps, log } = world(row);
    const sender = new MemoryEventSender();
    const handler = makeSqsHandler('install', () => ({
      pipeline: { ...deps, clusters: stageClusterRegistry(deps.clusters, 'install') },
      sender,
      log,
    }));
    const body = serializeEvent(objectEvent(REF, 'added', { time: new Date(NOW) }));
    const record = { messageId: 'm1', body, attributes: { MessageGroupId: 'c1/PackageInstall/ns/inst' } };
    expect(await handler({ Records: [record] })).toEqual({ batchItemFailures: [] });
    const app = cluster.get('App', 'ns', 'inst');
    const { uid: _u, resourceVersion: _r, generation: _g, ...meta } = app?.metadata ?? {};
    expect({ ...app, metadata: meta }).toEqual(row.appAfter);
    expect(cluster.statuses).toEqual([row.status]);
    expect(sender.sent).toEqual([]);
    expect(log.records.filter((r) => r.obj.outcome === 'done').map((r) => r.obj.stage)).toEqual(['install']);
  });

  it('on Lambda: an infrastructure error recorded in status ends the record (the forwarder requeues it); one whose status write fails too is retried by SQS', async () => {
    // Two retry drivers (SQS redelivery holding the FIFO group for the visibility timeout, and
    // the forwarder's rate-limited requeues piling up behind it) flooded the object's queue.
    const row = rows[Object.keys(rows)[0] as string] as Row;
    const { cluster, deps, log } = world(row);
    const refused = new KubeApiError('listing Packages: 503 Service Unavailable', { statusCode: 503 });
    cluster.list = async () => {
      throw refused;
    };
    const handler = makeSqsHandler('install', () => ({
      pipeline: { ...deps, clusters: stageClusterRegistry(deps.clusters, 'install') },
      sender: new MemoryEventSender(),
      log,
      maxAttempts: 5,
    }));
    const body = serializeEvent(objectEvent(REF, 'added', { time: new Date(NOW) }));
    const record = (n: number) => ({
      messageId: `m${n}`,
      body,
      attributes: { MessageGroupId: 'c1/PackageInstall/ns/inst', ApproximateReceiveCount: '1' },
    });
    expect(await handler({ Records: [record(1)] })).toEqual({ batchItemFailures: [] });
    expect(cluster.statuses).toEqual([failed('listing Packages: 503 Service Unavailable')]);
    expect(log.records.filter((r) => r.obj.outcome === 'done').map((r) => r.obj.stage)).toEqual(['install']);

    // The same failure again leaves the status as it is: nothing to write, the record is done.
    expect(await handler({ Records: [record(2)] })).toEqual({ batchItemFailures: [] });
    cluster.list = async () => {
      throw new KubeApiError('listing Packages: 500 Internal Server Error', { statusCode: 500 });
    };
    cluster.onWrite = () => {
      throw refused;
    };
    expect(await handler({ Records: [record(3)] })).toEqual({ batchItemFailures: [{ itemIdentifier: 'm3' }] });
    expect(cluster.statuses).toEqual([failed('listing Packages: 503 Service Unavailable')]);
  });

  it('the placeholder Secret is a dockerconfigjson with no registries, annotated and owned by the PackageInstall', async () => {
    const { cluster, deps } = world(rows[Object.keys(rows)[0]!]!);
    await dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), deps);
    const secret = cluster.secrets.get('ns/inst-fetch-0')!;
    expect(secret.type).toBe('kubernetes.io/dockerconfigjson');
    expect(secret.data['.dockerconfigjson']?.toString()).toBe('{"auths":{}}');
    expect(secret.metadata.annotations).toEqual({ 'secretgen.carvel.dev/image-pull-secret': '' });
    expect(secret.metadata.ownerReferences).toEqual([OWNER]);
  });

  it('syncPeriod: the PackageInstall value as Go formats it, else packageInstallDefaultSyncPeriod', async () => {
    const row = rows[Object.keys(rows)[0]!]!;
    const own = world({ ...row, pkgi: pkgi({ spec: { syncPeriod: '90s', paused: true, defaultNamespace: 'dst' } }) });
    await dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), own.deps);
    expect(own.cluster.get('App', 'ns', 'inst')?.spec).toMatchObject({
      syncPeriod: '1m30s',
      paused: true,
      defaultNamespace: 'dst',
    });
    const configured = world(row);
    configured.deps.config.timer = { packageInstallDefaultSyncPeriodMs: 20 * 60_000 };
    await dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), configured.deps);
    expect(configured.cluster.get('App', 'ns', 'inst')?.spec).toMatchObject({ syncPeriod: '20m0s' });
  });

  it('an App write that conflicts (the App pipeline wrote meanwhile) is computed again from a fresh read', async () => {
    const row =
      rows['new version: the App is updated and the PackageInstall shows Reconciling until the App observes it']!;
    const w = world(row);
    const update = w.cluster.updateApp.bind(w.cluster);
    let conflicts = 0;
    w.cluster.updateApp = async (app) => {
      if (conflicts++ === 0) throw new ConflictError('updating App ns/inst: 409 the object has been modified');
      return await update(app);
    };
    await dispatchEvent(objectEvent(REF, 'modified', { time: new Date(NOW) }), w.deps);
    expect(conflicts).toBe(2);
    expect(w.cluster.statuses).toEqual([row.status]);
    expect(w.cluster.get('App', 'ns', 'inst')?.metadata.annotations).toMatchObject({
      'packaging.carvel.dev/package-version': '2.0.0',
    });
  });

  it('fetch-<i>-secret-name overrides the secretRef of that fetch step (and wins over the placeholder)', async () => {
    const row = rows[Object.keys(rows)[0]!]!;
    const w = world({
      ...row,
      pkgi: pkgi({
        annotations: {
          'ext.packaging.carvel.dev/fetch-0-secret-name': 'reg-creds',
          'ext.packaging.carvel.dev/fetch-1-secret-name': 'git-creds',
        },
      }),
    });
    await dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), w.deps);
    const spec = w.cluster.get('App', 'ns', 'inst')?.spec as { fetch: unknown[] };
    expect(spec.fetch).toEqual([
      { image: { url: 'registry.example/pkg:2.0.0', secretRef: { name: 'reg-creds' } } },
      { git: { url: 'https://git.example/r', secretRef: { name: 'git-creds' } } },
    ]);
  });
});

describe('install values (§3.11.4): only the first ytt or helmTemplate step', () => {
  const ann = {
    'ext.packaging.carvel.dev/ytt-paths-from-secret-name.b': 'paths-b',
    'ext.packaging.carvel.dev/ytt-paths-from-secret-name': 'paths',
    'ext.packaging.carvel.dev/ytt-paths-from-secret-name.a': 'paths-a',
    'ext.packaging.carvel.dev/helm-template-values-from-secret-name.z': 'helm-z',
    'ext.packaging.carvel.dev/helm-template-values-from-secret-name': 'helm',
    'ext.packaging.carvel.dev/helm-template-name': 'rel',
    'ext.packaging.carvel.dev/helm-template-namespace': 'relns',
  };

  it('suffixes sort lexically after the bare key', () => {
    expect(secretNamesFromAnnotation(ann, 'ext.packaging.carvel.dev/ytt-paths-from-secret-name')).toEqual([
      'paths',
      'paths-a',
      'paths-b',
    ]);
  });

  it('helm first: the helm step gets names, annotation values then the values; ytt gets only its paths', () => {
    const spec = {
      template: [{ helmTemplate: { valuesFrom: [{ path: 'v.yml' }] } }, { ytt: {} }, { helmTemplate: {} }, { ytt: {} }],
    };
    injectValues(spec, [{ secretRef: { name: 'v1' } }, { secretRef: { name: 'v2', key: 'ignored' } }], ann);
    expect(spec.template).toEqual([
      {
        helmTemplate: {
          name: 'rel',
          namespace: 'relns',
          valuesFrom: [
            { path: 'v.yml' },
            { secretRef: { name: 'helm' } },
            { secretRef: { name: 'helm-z' } },
            { secretRef: { name: 'v1' } },
            { secretRef: { name: 'v2' } },
          ],
        },
      },
      {
        ytt: {
          inline: {
            pathsFrom: [
              { secretRef: { name: 'paths' } },
              { secretRef: { name: 'paths-a' } },
              { secretRef: { name: 'paths-b' } },
            ],
          },
        },
      },
      { helmTemplate: {} },
      { ytt: {} },
    ]);
  });

  it('ytt-data-values-overlays: the values go to inline.pathsFrom of the first ytt step', () => {
    const spec = { template: [{ ytt: { inline: { paths: { 'a.yml': 'x' } } } }, { ytt: {} }] };
    injectValues(spec, [{ secretRef: { name: 'v1' } }], { 'ext.packaging.carvel.dev/ytt-data-values-overlays': '' });
    expect(spec.template).toEqual([
      { ytt: { inline: { paths: { 'a.yml': 'x' }, pathsFrom: [{ secretRef: { name: 'v1' } }] } } },
      { ytt: {} },
    ]);
  });

  it('friendly text: first line, 80 characters then ...', () => {
    expect(friendlyErrMsg('a'.repeat(81))).toBe(`${'a'.repeat(80)}...`);
    expect(friendlyErrMsg('a'.repeat(80))).toBe('a'.repeat(80));
    expect(friendlyErrMsg('short\nmore')).toBe('short...');
  });
});

/** A PackageInstall `namespace/name` of `refName` with `constraints` (or none: no version selection). */
function pkgiIn(namespace: string, name: string, refName: string, selection?: Record<string, unknown>): KubeObject {
  return pkgi({
    metadata: { name, namespace, uid: `uid-${namespace}-${name}` },
    spec: { packageRef: { refName, ...(selection ? { versionSelection: selection } : {}) } },
  });
}

const REPO_REF: ObjectRef = { ...REF, kind: 'PackageRepository', name: 'repo', uid: 'uid-repo' };

interface FanOutRow {
  /** Namespace of the repository. */
  repoNamespace: string;
  changes?: Array<{ refName: string; versions: string[] }>;
  /** Namespaces and their annotations (besides the global one). */
  namespaces?: Record<string, Record<string, string> | undefined>;
  installs: KubeObject[];
  /** `namespace/name` of each PackageInstall sent a `ref-changed` event, in order. */
  sent: string[];
}

const A = 'a.test.carvel.dev';
const B = 'b.test.carvel.dev';
const EXCLUDE = { 'kapp-controller.carvel.dev/exclude-global-packages': '' };

const fanOutRows: Record<string, FanOutRow> = {
  'same namespace: only PackageInstalls of a changed refName': {
    repoNamespace: 'ns',
    changes: [{ refName: A, versions: ['2.0.0'] }],
    installs: [pkgiIn('ns', 'a', A, { constraints: '>=1.0.0' }), pkgiIn('ns', 'b', B, { constraints: '>=1.0.0' })],
    sent: ['ns/a'],
  },
  'another namespace does not see a local repository': {
    repoNamespace: 'ns',
    changes: [{ refName: A, versions: ['2.0.0'] }],
    namespaces: { other: undefined },
    installs: [pkgiIn('other', 'a', A, { constraints: '>=1.0.0' })],
    sent: [],
  },
  'upstream version filter: a change no selection accepts reconciles nothing': {
    repoNamespace: 'ns',
    changes: [{ refName: A, versions: ['0.9.0', '2.0.0-rc.1'] }],
    installs: [
      pkgiIn('ns', 'ge1', A, { constraints: '>=1.0.0' }),
      pkgiIn('ns', 'pre', A, { constraints: '>=1.0.0', prereleases: {} }),
      pkgiIn('ns', 'exact-pre', A, { constraints: '2.0.0-rc.1' }),
      pkgiIn('ns', 'bad-range', A, { constraints: '^1.0.0' }),
      pkgiIn('ns', 'no-selection', A),
    ],
    sent: ['ns/exact-pre', 'ns/no-selection', 'ns/pre'],
  },
  'a removed version its selection accepts: reconciled (it may now fail or move down)': {
    repoNamespace: 'ns',
    changes: [{ refName: A, versions: ['1.5.0'] }],
    installs: [pkgiIn('ns', 'a', A, { constraints: '>=1.0.0 <2.0.0' })],
    sent: ['ns/a'],
  },
  'global repository: every namespace, except those excluding global packages': {
    repoNamespace: GLOBAL,
    changes: [{ refName: A, versions: ['2.0.0'] }],
    namespaces: { ns2: undefined, excluded: EXCLUDE },
    installs: [
      pkgiIn('ns', 'a', A, { constraints: '>=1.0.0' }),
      pkgiIn('ns2', 'a', A, { constraints: '>=1.0.0' }),
      pkgiIn('excluded', 'a', A, { constraints: '>=1.0.0' }),
      pkgiIn(GLOBAL, 'a', A, { constraints: '>=1.0.0' }),
    ],
    sent: [`${GLOBAL}/a`, 'ns/a', 'ns2/a'],
  },
  'no changes listed (too many for one event): every PackageInstall in scope': {
    repoNamespace: 'ns',
    installs: [pkgiIn('ns', 'a', A, { constraints: '>=1.0.0' }), pkgiIn('ns', 'b', B, { constraints: '>=9.0.0' })],
    sent: ['ns/a', 'ns/b'],
  },
  'a PackageInstall being deleted is left to its own delete': {
    repoNamespace: 'ns',
    changes: [{ refName: A, versions: ['2.0.0'] }],
    installs: [
      pkgi({
        metadata: { name: 'gone', deletionTimestamp: NOW, finalizers: [Finalizer.PackageInstall] },
        spec: { packageRef: { refName: A, versionSelection: { constraints: '>=1.0.0' } } },
      }),
    ],
    sent: [],
  },
};

function fanOutWorld(row: Pick<FanOutRow, 'namespaces' | 'installs'>) {
  const cluster = new FakeCluster();
  for (const i of row.installs) cluster.put(i);
  for (const [name, annotations] of Object.entries({ ns: undefined, ...row.namespaces })) {
    cluster.namespaces.set(name, {
      metadata: { name, uid: `uid-${name}`, resourceVersion: '1', annotations },
      phase: 'Active',
    });
  }
  cluster.namespaces.set(GLOBAL, { metadata: { name: GLOBAL, uid: 'uid-g', resourceVersion: '1' }, phase: 'Active' });
  const emitted: KappEvent[] = [];
  const { deps, log } = stageDeps(cluster, {
    runner: new FakeCommandRunner(),
    now: NOW,
    tmpRoot: tempDir(),
    extra: { emit: async (events) => void emitted.push(...events) },
  });
  return { cluster, deps, log, emitted };
}

function indexed(namespace: string, changes?: Array<{ refName: string; versions: string[] }>) {
  return repoIndexedEvent(
    {
      object: { ...REPO_REF, namespace },
      run: { generation: 1, runId: 'r1', startedAt: NOW },
      artifacts: {},
      ...(changes ? { changes } : {}),
    },
    { time: NOW },
  );
}

describe('install: a repository whose versions changed reconciles its PackageInstalls at once (repo.indexed)', () => {
  it.each(Object.entries(fanOutRows))('%s', async (_name, row) => {
    const { deps, emitted, cluster } = fanOutWorld(row);
    expect(await dispatchEvent(indexed(row.repoNamespace, row.changes), deps)).toBeUndefined();
    const sent = emitted.map((e) => (e.type === EVENT_TYPES.object ? `${e.data.namespace}/${e.data.name}` : e.type));
    expect(sent.sort()).toEqual(row.sent);
    for (const e of emitted) {
      expect(e.type === EVENT_TYPES.object && [e.data.kind, e.data.reason, e.data.clusterId]).toEqual([
        'PackageInstall',
        'ref-changed',
        'c1',
      ]);
    }
    // The fan-out only reads: the PackageInstalls reconcile in their own runs.
    expect(cluster.statuses).toEqual([]);
  });

  it('a PackageInstall that failed with "Package not found" succeeds once a repository provides it, without a timer', async () => {
    const inst = pkgi({
      spec: { packageRef: { refName: 'pkg.test.carvel.dev', versionSelection: { constraints: '>=1.0.0' } } },
    });
    const { cluster, deps, emitted } = fanOutWorld({ installs: [inst] });
    await dispatchEvent(objectEvent(REF, 'added', { time: new Date(NOW) }), deps);
    expect((cluster.statuses.at(-1) as { conditions?: unknown } | undefined)?.conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: 'Package pkg.test.carvel.dev not found' },
    ]);
    // The repository deploys its Packages, then hands on what changed.
    cluster.put(pkg({ version: '1.0.0' }));
    await dispatchEvent(indexed('ns', [{ refName: 'pkg.test.carvel.dev', versions: ['1.0.0'] }]), deps);
    expect(emitted).toHaveLength(1);
    expect(await dispatchEvent(emitted[0]!, deps)).toBeUndefined();
    expect(cluster.statuses.at(-1)).toEqual(reconcilingAt('1.0.0'));
    expect(cluster.get('App', 'ns', 'inst')?.metadata.annotations?.['packaging.carvel.dev/package-version']).toBe(
      '1.0.0',
    );
  });

  it('without a transport for fan-out events: logged and dropped, never thrown', async () => {
    const { deps, log } = fanOutWorld({ installs: [pkgiIn('ns', 'a', A, { constraints: '>=1.0.0' })] });
    const { emit: _none, ...without } = deps;
    await dispatchEvent(indexed('ns', [{ refName: A, versions: ['2.0.0'] }]), without);
    expect(log.records.some((r) => r.msg === 'no transport for fan-out events; dropped')).toBe(true);
  });
});
