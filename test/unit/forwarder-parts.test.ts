import { readFileSync } from 'node:fs';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { backoffDelay, RESYNC_RETRY_DOUBLINGS, resyncRetryDelay } from '../../events/forwarder/backoff.js';
import { systemClock } from '../../events/forwarder/clock.js';
import { forwarderOptions, parseForwarderEnv, parseForwarderProgramEnv } from '../../events/forwarder/config.js';
import { DueHeap, type HeapItem } from '../../events/forwarder/due-heap.js';
import {
  appKind,
  appRefs,
  NO_REFS,
  packageInstallKind,
  packageRepositoryKind,
  packageRepositoryRefs,
  watchedKinds,
} from '../../events/forwarder/kinds.js';
import { leaseNameFor } from '../../events/forwarder/leadership.js';
import { silentLogger } from '../../events/forwarder/log.js';
import { mergeEvents, Outbox, toCloudEvent } from '../../events/forwarder/outbox.js';
import { lastWriteTime } from '../../events/forwarder/ref-index.js';
import { transportToStages } from '../../events/forwarder/transport.js';
import type { ObjectEvent, ObjectEventData } from '../../events/schema.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../functions/lib/pipeline/attempts.js';
import { MemoryEventSender } from '../../functions/lib/transport/memory.js';
import type { EventSender } from '../../functions/lib/transport/port.js';
import { STAGE_SIZING, VISIBILITY_MARGIN_SECONDS } from '../../infra/aws/stages.js';

function obj(spec: unknown, extra: Partial<KubeObject['metadata']> = {}): KubeObject {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name: 'a', namespace: 'ns', uid: 'u', resourceVersion: '1', generation: 1, ...extra },
    spec,
  };
}

describe('backoffDelay', () => {
  it.each([
    [0, 0, 500],
    [1, 0, 1000],
    [5, 0, 16_000],
    [6, 0, 30_000],
    [500, 0, 30_000],
    [0, 0.999, 250],
    [3, 0.5, 3000],
    [-2, 0, 500],
  ])('attempt %d with random %d → %d ms', (attempt, r, want) => {
    expect(backoffDelay(attempt, () => r)).toBe(want);
  });

  it('honours options', () => {
    expect(backoffDelay(2, () => 0.5, { initialMs: 100, factor: 3, maxMs: 10_000, jitter: 0 })).toBe(900);
    expect(backoffDelay(2, () => 1, { initialMs: 100, factor: 3, jitter: 1 })).toBe(0);
  });
});

describe('resyncRetryDelay', () => {
  it('doubles from resyncRetryMs up to 16 times it', () => {
    expect([0, 1, 2, 3, 4, 5, 40].map((n) => resyncRetryDelay(n, 300_000))).toEqual([
      300_000, 600_000, 1_200_000, 2_400_000, 4_800_000, 4_800_000, 4_800_000,
    ]);
  });

  it('reaches, at the default resyncRetryMs, the longest span SQS keeps redelivering a stage message', () => {
    const { resyncRetryMs } = parseForwarderEnv({ FORWARDER_CLUSTER_ID: 'c1' });
    const spanMs = Math.max(
      ...Object.values(STAGE_SIZING).map(
        (s) => (s.timeoutSeconds + VISIBILITY_MARGIN_SECONDS) * DEFAULT_MAX_ATTEMPTS * 1000,
      ),
    );
    expect(resyncRetryDelay(RESYNC_RETRY_DOUBLINGS, resyncRetryMs)).toBeGreaterThanOrEqual(spanMs);
  });
});

describe('DueHeap', () => {
  interface Item extends HeapItem {
    id: number;
  }
  const item = (id: number): Item => ({ id, due: Number.POSITIVE_INFINITY, heapIndex: -1 });

  it('pops in due order and supports moving and deleting items in place', () => {
    const heap = new DueHeap<Item>();
    const items = Array.from({ length: 200 }, (_, i) => item(i));
    // Deterministic shuffle of due times.
    for (const it of items) heap.set(it, ((it.id * 7919) % 1000) + 1000);
    expect(heap.size).toBe(200);
    for (const it of items.filter((x) => x.id % 3 === 0)) heap.set(it, 5000 - it.id); // move later
    for (const it of items.filter((x) => x.id % 5 === 1)) heap.set(it, it.id); // move earlier
    for (const it of items.filter((x) => x.id % 11 === 2)) heap.delete(it);
    heap.delete(items[2]!); // already deleted: no-op
    const expected = items
      .filter((x) => x.heapIndex >= 0)
      .map((x) => [x.due, x.id] as const)
      .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const popped: number[] = [];
    for (let x = heap.popDue(Number.MAX_SAFE_INTEGER); x; x = heap.popDue(Number.MAX_SAFE_INTEGER)) popped.push(x.due);
    expect(popped).toEqual(expected.map((e) => e[0]));
    expect(heap.size).toBe(0);
    expect(items.every((x) => x.heapIndex === -1)).toBe(true);
  });

  it('popDue returns only items due at now', () => {
    const heap = new DueHeap<Item>();
    const a = item(1);
    const b = item(2);
    heap.set(a, 10);
    heap.set(b, 20);
    expect(heap.popDue(9)).toBeUndefined();
    expect(heap.popDue(15)).toBe(a);
    expect(heap.popDue(15)).toBeUndefined();
    expect(heap.peek()).toBe(b);
  });
});

describe('watched kinds', () => {
  it('appRefs: tracked Secret and ConfigMap locations, sorted, deduplicated, without empty names', () => {
    const refs = appRefs(
      obj({
        fetch: [
          { inline: { pathsFrom: [{ secretRef: { name: 's-inline' } }, { configMapRef: { name: 'cm-inline' } }] } },
          { image: { url: 'x', secretRef: { name: 's-image' } } },
          { imgpkgBundle: { image: 'x', secretRef: { name: 's-bundle' } } },
          { http: { url: 'x', secretRef: { name: 's-http' } } },
          { git: { url: 'x', secretRef: { name: 's-git' } } },
          { helmChart: { name: 'c', repository: { url: 'x', secretRef: { name: 's-helm' } } } },
          { git: { url: 'x', secretRef: {} } },
        ],
        template: [
          {
            ytt: {
              inline: { pathsFrom: [{ secretRef: { name: 's-ytt-inline' } }] },
              valuesFrom: [{ secretRef: { name: 's-image' } }, { configMapRef: { name: 'cm-ytt' } }],
            },
          },
          { helmTemplate: { valuesFrom: [{ secretRef: { name: 's-helm-values' } }] } },
          { cue: { valuesFrom: [{ configMapRef: { name: 'cm-cue' } }] } },
          { sops: { pgp: { privateKeysSecretRef: { name: 'not-tracked' } } } },
        ],
        cluster: { kubeconfigSecretRef: { name: 'not-tracked-either' } },
      }),
    );
    expect(refs).toEqual({
      secrets: ['s-bundle', 's-git', 's-helm', 's-helm-values', 's-http', 's-image', 's-inline', 's-ytt-inline'],
      configMaps: ['cm-cue', 'cm-inline', 'cm-ytt'],
    });
  });

  it('appRefs: none while deleting, none for an unreadable spec', () => {
    const spec = { fetch: [{ git: { url: 'x', secretRef: { name: 's' } } }] };
    expect(appRefs(obj(spec))).toEqual({ secrets: ['s'], configMaps: [] });
    expect(appRefs(obj(spec, { deletionTimestamp: '2025-01-01T00:00:00Z' }))).toBe(NO_REFS);
    expect(appRefs(obj({ fetch: 7 }))).toBe(NO_REFS);
    expect(appRefs(obj(undefined))).toBe(NO_REFS);
  });

  it('packageRepositoryRefs: fetch secretRefs, else the placeholder of an image or bundle fetch', () => {
    expect(packageRepositoryRefs(obj({ fetch: { imgpkgBundle: { image: 'x', secretRef: { name: 'reg' } } } }))).toEqual(
      { secrets: ['reg'], configMaps: [] },
    );
    expect(packageRepositoryRefs(obj({ fetch: { inline: { pathsFrom: [{ secretRef: { name: 'no' } }] } } }))).toBe(
      NO_REFS,
    );
    // upstream tracks the in-memory App's refs, with the placeholder `<name>-fetch-0` set
    const name = obj({}).metadata.name;
    for (const fetch of [{ imgpkgBundle: { image: 'x' } }, { image: { url: 'x' } }]) {
      expect(packageRepositoryRefs(obj({ fetch }))).toEqual({ secrets: [`${name}-fetch-0`], configMaps: [] });
    }
    expect(packageRepositoryRefs(obj({ fetch: { git: { url: 'x' } } }))).toBe(NO_REFS);
    expect(packageRepositoryRefs(obj({ fetch: { imgpkgBundle: 'odd' } }))).toEqual({
      secrets: [`${name}-fetch-0`],
      configMaps: [],
    });
  });

  it('due times: App and PackageRepository from status, PackageInstall only when unhandled', () => {
    const now = Date.parse('2025-01-01T00:10:00Z');
    const status = (gen: number) => ({
      observedGeneration: gen,
      conditions: [{ type: 'ReconcileFailed', status: 'True' }],
      consecutiveReconcileFailures: 4,
      fetch: { exitCode: 1, updatedAt: '2025-01-01T00:09:50Z' },
    });
    const a = { ...obj({}), status: status(1) };
    expect(appKind().dueAt(a, now)).toBe(Date.parse('2025-01-01T00:10:06Z'));
    expect(appKind().dueAt({ ...obj({ paused: true }), status: status(1) }, now)).toBeNull();
    expect(appKind().dueAt({ ...obj({}), status: status(0) }, now)).toBe(now);
    expect(appKind().handledAt(a)).toBe(Date.parse('2025-01-01T00:09:50Z'));
    expect(packageRepositoryKind().dueAt(a, now)).toBe(Date.parse('2025-01-01T00:10:06Z'));
    expect(packageInstallKind().dueAt({ ...obj({}), status: { observedGeneration: 1 } }, now)).toBeNull();
    expect(packageInstallKind().dueAt({ ...obj({}), status: { observedGeneration: 0 } }, now)).toBe(now);
    expect(packageInstallKind().dueAt(obj({}), now)).toBe(now);
  });

  it('App due times follow a sync-period source read at each computation (the cluster config changed)', () => {
    const now = Date.parse('2025-01-01T00:10:00Z');
    const ok = {
      ...obj({}),
      status: {
        observedGeneration: 1,
        conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
        fetch: { exitCode: 0, updatedAt: '2025-01-01T00:09:50Z' },
      },
    };
    let config: { appDefaultSyncPeriodMs?: number } | undefined;
    const kind = appKind(() => config);
    const dflt = kind.dueAt(ok, now);
    expect(dflt).toBe(appKind().dueAt(ok, now));
    config = { appDefaultSyncPeriodMs: 3_600_000 };
    const hour = kind.dueAt(ok, now);
    expect(hour).toBe(appKind(config).dueAt(ok, now));
    expect(hour!).toBeGreaterThan(dflt! + 3_000_000);
    config = undefined;
    expect(kind.dueAt(ok, now)).toBe(dflt);
  });

  it('watchedKinds builds the table from names and rejects unknown ones', () => {
    expect(
      watchedKinds(['App', 'PackageInstall', 'PackageRepository', 'App']).map((k) => [
        k.resource.apiVersion,
        k.resource.kind,
        k.group,
        k.version,
        k.plural,
        k.tracksSecrets,
        k.tracksConfigMaps,
      ]),
    ).toEqual([
      ['kappctrl.k14s.io/v1alpha1', 'App', 'kappctrl.k14s.io', 'v1alpha1', 'apps', true, true],
      [
        'packaging.carvel.dev/v1alpha1',
        'PackageInstall',
        'packaging.carvel.dev',
        'v1alpha1',
        'packageinstalls',
        false,
        false,
      ],
      [
        'packaging.carvel.dev/v1alpha1',
        'PackageRepository',
        'packaging.carvel.dev',
        'v1alpha1',
        'packagerepositories',
        true,
        false,
      ],
    ]);
    expect(() => watchedKinds(['Package'])).toThrow(new TypeError('unknown watched kind "Package"'));
  });
});

describe('lastWriteTime', () => {
  it('is the latest of creationTimestamp and managedFields times', () => {
    const o = obj(undefined, {
      creationTimestamp: '2025-01-01T00:00:00Z',
      managedFields: [{ time: '2025-01-01T00:05:00Z' }, { time: 'garbage' }, { time: '2025-01-01T00:03:00Z' }, null],
    });
    expect(lastWriteTime(o)).toBe(Date.parse('2025-01-01T00:05:00Z'));
    expect(lastWriteTime(obj(undefined))).toBeNaN();
  });
});

describe('RBAC (infra/forwarder/rbac.yml)', () => {
  const docs = parseAllDocuments(readFileSync(new URL('../../infra/forwarder/rbac.yml', import.meta.url), 'utf8')).map(
    (d) => d.toJS() as { kind: string; rules?: unknown },
  );

  it('grants exactly get/list/watch on the watched kinds, Secrets, ConfigMaps and Namespaces, and list/watch of deployed kinds', () => {
    expect(docs.map((d) => d.kind)).toEqual([
      'ServiceAccount',
      'ClusterRole',
      'ClusterRoleBinding',
      'Role',
      'RoleBinding',
    ]);
    expect(docs[1]!.rules).toEqual([
      { apiGroups: ['kappctrl.k14s.io'], resources: ['apps'], verbs: ['get', 'list', 'watch'] },
      {
        apiGroups: ['packaging.carvel.dev'],
        resources: ['packageinstalls', 'packagerepositories'],
        verbs: ['get', 'list', 'watch'],
      },
      { apiGroups: [''], resources: ['secrets', 'configmaps', 'serviceaccounts'], verbs: ['get', 'list', 'watch'] },
      { apiGroups: [''], resources: ['namespaces'], verbs: ['get', 'list', 'watch'] },
      { apiGroups: ['*'], resources: ['*'], verbs: ['list', 'watch'] },
    ]);
  });

  it('grants writes only on Leases, only in its own namespace (leader election)', () => {
    const role = docs[3] as unknown as { metadata: { namespace: string }; rules: unknown };
    expect(role.metadata.namespace).toBe('kapp-lambda');
    expect(role.rules).toEqual([
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['get', 'create', 'update'] },
    ]);
    const binding = docs[4] as unknown as { metadata: { namespace: string }; subjects: unknown; roleRef: unknown };
    expect(binding.metadata.namespace).toBe('kapp-lambda');
    expect(binding.subjects).toEqual([
      { kind: 'ServiceAccount', name: 'kapp-lambda-forwarder', namespace: 'kapp-lambda' },
    ]);
    expect(binding.roleRef).toEqual({
      apiGroup: 'rbac.authorization.k8s.io',
      kind: 'Role',
      name: 'kapp-lambda-forwarder-leader-election',
    });
  });

  it('covers every kind of the table', () => {
    const rules = docs[1]!.rules as Array<{ apiGroups: string[]; resources: string[] }>;
    for (const k of watchedKinds(['App', 'PackageInstall', 'PackageRepository'])) {
      expect(rules.some((r) => r.apiGroups.includes(k.group) && r.resources.includes(k.plural))).toBe(true);
    }
  });
});

describe('Outbox', () => {
  const data = (name: string, reason: ObjectEventData['reason'], rv: string, uid = `u-${name}`): ObjectEventData => ({
    clusterId: 'c1',
    kind: 'App',
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    namespace: 'ns',
    name,
    uid,
    generation: Number(rv),
    resourceVersion: rv,
    reason,
  });

  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it.each([
    ['resync', 'modified', 'modified'],
    ['modified', 'resync', 'modified'],
    ['ref-changed', 'resync', 'ref-changed'],
    ['modified', 'ref-changed', 'ref-changed'],
    ['added', 'modified', 'added'],
    ['added', 'deleted', 'deleted'],
    ['deleted', 'added', 'deleted'],
  ] as const)('mergeEvents(%s, %s) keeps %s and the newer reference', (a, b, want) => {
    expect(mergeEvents(data('x', a, '1'), data('x', b, '2'))).toEqual(data('x', want, '2'));
  });

  it('keeps objects with another uid apart, and batches by batchSize', async () => {
    const sent: ObjectEvent[][] = [];
    const box = new Outbox({
      transport: {
        send: async (e) => {
          sent.push(e as ObjectEvent[]);
        },
      },
      build: (d, now) => ({ data: d, time: new Date(now).toISOString() }) as unknown as ObjectEvent,
      clock: systemClock,
      random: () => 0,
      windowMs: 100,
      batchSize: 2,
      logger: silentLogger,
    });
    box.enqueue(data('a', 'deleted', '1', 'old'));
    box.enqueue(data('b', 'modified', '2'));
    box.enqueue(data('c', 'modified', '3'));
    await vi.advanceTimersByTimeAsync(99);
    expect(sent).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(sent.map((b) => b.map((e) => `${e.data.reason} ${e.data.name} ${e.data.uid}`))).toEqual([
      ['deleted a old', 'modified b u-b'],
      ['modified c u-c'],
    ]);
    expect(sent[0]![0]!.time).toBe('1970-01-01T00:00:00.100Z');
    await box.idle();
  });

  it('sends an added at once, after everything queued before it, and later events of its object after a window', async () => {
    const sent: ObjectEvent[][] = [];
    const box = new Outbox({
      transport: {
        send: async (e) => {
          sent.push(e as ObjectEvent[]);
        },
      },
      build: (d, now) => ({ data: d, time: new Date(now).toISOString() }) as unknown as ObjectEvent,
      clock: systemClock,
      random: () => 0,
      windowMs: 100,
      batchSize: 10,
      logger: silentLogger,
    });
    const names = () => sent.map((b) => b.map((e) => `${e.data.reason} ${e.data.name} ${e.data.uid}`));
    box.enqueue(data('a', 'deleted', '1', 'old'));
    box.enqueue(data('a', 'added', '2', 'new'));
    box.enqueue(data('z', 'modified', '3'));
    await vi.advanceTimersByTimeAsync(0);
    expect(names()).toEqual([['deleted a old', 'added a new']]);
    box.enqueue(data('a', 'modified', '4', 'new'));
    await vi.advanceTimersByTimeAsync(99);
    expect(names()).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(names()[1]).toEqual(['modified z u-z', 'modified a new']);
    await box.idle();
  });
});

describe('parseForwarderEnv', () => {
  it('fills defaults', () => {
    expect(parseForwarderEnv({ FORWARDER_CLUSTER_ID: 'prod-eu-1', OTHER: 'ignored' })).toEqual({
      clusterId: 'prod-eu-1',
      kinds: ['App'],
      namespaces: [],
      timer: {},
      controllerConfigNamespace: 'kapp-lambda',
      coalesceWindowMs: 200,
      stallTimeoutMs: 90_000,
      watchTimeoutSeconds: 300,
      pageSize: 100,
      refPageSize: 100,
      batchSize: 100,
      resyncRetryMs: 300_000,
    });
  });

  it('reads every variable', () => {
    const s = parseForwarderEnv({
      FORWARDER_CLUSTER_ID: 'c1',
      FORWARDER_KINDS: 'App, PackageRepository,App',
      FORWARDER_NAMESPACES: 'team-a,team-b',
      FORWARDER_COALESCE_WINDOW_MS: '50',
      FORWARDER_STALL_TIMEOUT_SECONDS: '120',
      FORWARDER_WATCH_TIMEOUT_SECONDS: '600',
      FORWARDER_PAGE_SIZE: '250',
      FORWARDER_REF_PAGE_SIZE: '20',
      FORWARDER_BATCH_SIZE: '10',
      FORWARDER_RESYNC_RETRY_SECONDS: '60',
      FORWARDER_APP_DEFAULT_SYNC_PERIOD: '5m',
      FORWARDER_APP_MINIMUM_SYNC_PERIOD: '1m',
      FORWARDER_CONTROLLER_CONFIG_NAMESPACE: 'platform',
    });
    expect(s).toEqual({
      clusterId: 'c1',
      kinds: ['App', 'PackageRepository'],
      namespaces: ['team-a', 'team-b'],
      timer: { appDefaultSyncPeriodMs: 300_000, appMinimumSyncPeriodMs: 60_000 },
      controllerConfigNamespace: 'platform',
      coalesceWindowMs: 50,
      stallTimeoutMs: 120_000,
      watchTimeoutSeconds: 600,
      pageSize: 250,
      refPageSize: 20,
      batchSize: 10,
      resyncRetryMs: 60_000,
    });
    const o = forwarderOptions(s);
    expect(o.kinds!.map((k) => k.resource.kind)).toEqual(['App', 'PackageRepository']);
    // The App timer uses the configured default sync period.
    const app = {
      ...obj({}),
      status: { observedGeneration: 1, fetch: { exitCode: 0, updatedAt: '2025-01-01T00:00:00Z' } },
    };
    const due = o.kinds![0]!.dueAt(app, 0)!;
    expect(due).toBeGreaterThanOrEqual(Date.parse('2025-01-01T00:05:00Z'));
    expect(due).toBeLessThan(Date.parse('2025-01-01T00:05:05Z'));
  });

  it('names every bad variable', () => {
    expect(() =>
      parseForwarderEnv({ FORWARDER_KINDS: 'App,Package', FORWARDER_PAGE_SIZE: '0', FORWARDER_NAMESPACES: 'Bad_NS' }),
    ).toThrow(
      new Error(
        'invalid forwarder settings: FORWARDER_CLUSTER_ID: required; FORWARDER_KINDS: Invalid option: expected one of "App"|"PackageInstall"|"PackageRepository"; FORWARDER_NAMESPACES: expected DNS-1123 labels; FORWARDER_PAGE_SIZE: expected an integer in [1, 5000], received "0"',
      ),
    );
    expect(() => parseForwarderEnv({ FORWARDER_CLUSTER_ID: 'c', FORWARDER_APP_DEFAULT_SYNC_PERIOD: '1d' })).toThrow(
      /^invalid forwarder settings: Unmarshaling appDefaultSyncPeriod as duration: /,
    );
  });
});

describe('parseForwarderProgramEnv', () => {
  const FETCH = 'https://sqs.eu-west-1.amazonaws.com/111122223333/kapp-lambda-fetch.fifo';

  it('fills defaults: in-cluster, port 8080, the Lease of the watch scope, the queue of each watched kind', () => {
    const s = parseForwarderProgramEnv({
      FORWARDER_CLUSTER_ID: 'prod-eu-1',
      AWS_REGION: 'eu-west-1',
      KAPP_LAMBDA_QUEUE_URL_FETCH: FETCH,
      KAPP_LAMBDA_QUEUE_URL_DEPLOY: 'https://sqs.example/ignored.fifo', // not a queue the forwarder sends to
    });
    expect(s).toEqual({
      forwarder: parseForwarderEnv({ FORWARDER_CLUSTER_ID: 'prod-eu-1' }),
      region: 'eu-west-1',
      queueUrls: { fetch: FETCH },
      lease: { namespace: 'kapp-lambda', name: 'kapp-lambda-forwarder' },
      http: { host: '0.0.0.0', port: 8080 },
      reconcileMetricsMaxObjects: 50_000,
      shutdownTimeoutMs: 10_000,
      logLevel: 'info',
    });
  });

  it('reads every variable; the Lease name follows the namespaces as in the embedded runtime', () => {
    const s = parseForwarderProgramEnv({
      FORWARDER_CLUSTER_ID: 'c1',
      FORWARDER_KINDS: 'App,PackageInstall,PackageRepository',
      FORWARDER_NAMESPACES: 'team-b,team-a',
      AWS_REGION: 'us-east-1',
      KAPP_LAMBDA_SQS_ENDPOINT: 'http://127.0.0.1:4566',
      KAPP_LAMBDA_QUEUE_URL_FETCH: FETCH,
      KAPP_LAMBDA_QUEUE_URL_INSTALL: 'http://127.0.0.1:4566/1/install.fifo',
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: 'http://127.0.0.1:4566/1/index-repo.fifo',
      FORWARDER_LEASE_NAMESPACE: 'ops',
      FORWARDER_HTTP_HOST: '127.0.0.1',
      FORWARDER_HTTP_PORT: '0',
      FORWARDER_RECONCILE_METRICS_MAX_OBJECTS: '0',
      FORWARDER_SHUTDOWN_TIMEOUT_SECONDS: '3',
      FORWARDER_LOG_LEVEL: 'debug',
      KUBECONFIG: '/home/me/.kube/config',
    });
    expect(s.queueUrls).toEqual({
      fetch: FETCH,
      install: 'http://127.0.0.1:4566/1/install.fifo',
      'index-repo': 'http://127.0.0.1:4566/1/index-repo.fifo',
    });
    expect(s.lease).toEqual({ namespace: 'ops', name: leaseNameFor(['team-a', 'team-b']) });
    expect(s).toMatchObject({
      sqsEndpoint: 'http://127.0.0.1:4566',
      http: { host: '127.0.0.1', port: 0 },
      reconcileMetricsMaxObjects: 0,
      shutdownTimeoutMs: 3000,
      logLevel: 'debug',
      kubeconfig: '/home/me/.kube/config',
    });
    expect(parseForwarderProgramEnv({ ...BASE, FORWARDER_LEASE_NAME: 'mine' }).lease.name).toBe('mine');
  });

  const BASE = { FORWARDER_CLUSTER_ID: 'c1', AWS_REGION: 'eu-west-1', KAPP_LAMBDA_QUEUE_URL_FETCH: FETCH };

  it("names every bad variable, the forwarder's included, without echoing URLs", () => {
    expect(() =>
      parseForwarderProgramEnv({
        FORWARDER_KINDS: 'App,PackageInstall',
        KAPP_LAMBDA_QUEUE_URL_FETCH: 'sqs.example/secret-path',
        FORWARDER_HTTP_PORT: '70000',
        KUBECONFIG: '/a:/b',
      }),
    ).toThrow(
      new Error(
        'invalid forwarder settings: FORWARDER_CLUSTER_ID: required; AWS_REGION: required; FORWARDER_HTTP_PORT: expected an integer in [0, 65535], received "70000"; KUBECONFIG: expected one path (no list)',
      ),
    );
    expect(() =>
      parseForwarderProgramEnv({ ...BASE, FORWARDER_KINDS: 'App,PackageInstall', KAPP_LAMBDA_QUEUE_URL_FETCH: 'x/y' }),
    ).toThrow(
      new Error(
        'invalid forwarder settings: KAPP_LAMBDA_QUEUE_URL_FETCH: expected an http:// or https:// URL; KAPP_LAMBDA_QUEUE_URL_INSTALL: required (PackageInstall events go to it)',
      ),
    );
  });
});

describe('transportToStages', () => {
  const ev = (kind: 'App' | 'PackageInstall' | 'PackageRepository', name: string): ObjectEvent =>
    toCloudEvent(
      {
        clusterId: 'c1',
        kind,
        apiVersion: kind === 'App' ? 'kappctrl.k14s.io/v1alpha1' : 'packaging.carvel.dev/v1alpha1',
        namespace: 'ns',
        name,
        uid: `u-${name}`,
        generation: 1,
        resourceVersion: '7',
        reason: 'added',
      },
      0,
    );

  it('sends App events to fetch, PackageInstall events to install and PackageRepository events to index-repo, in order', async () => {
    const sender = new MemoryEventSender();
    const unrouted: string[] = [];
    const t = transportToStages(sender, { onUnrouted: (e) => unrouted.push(e.subject) });
    await t.send([ev('App', 'a'), ev('PackageInstall', 'p'), ev('PackageRepository', 'r'), ev('App', 'b')]);
    expect(sender.sent.map((s) => [s.stage, (s.event as ObjectEvent).subject])).toEqual([
      ['fetch', 'c1/App/ns/a'],
      ['install', 'c1/PackageInstall/ns/p'],
      ['index-repo', 'c1/PackageRepository/ns/r'],
      ['fetch', 'c1/App/ns/b'],
    ]);
    expect(unrouted).toEqual([]);
  });

  it('rejects the batch when the sender rejects', async () => {
    const sender = new MemoryEventSender((_, e) =>
      (e as ObjectEvent).data.name === 'b' ? new Error('down') : undefined,
    );
    await expect(transportToStages(sender).send([ev('App', 'a'), ev('App', 'b')])).rejects.toThrow('down');
    expect(sender.sent).toHaveLength(1);
  });

  it('hands each run of consecutive events for one queue to sendMany, in order', async () => {
    const calls: string[] = [];
    const sender: EventSender = {
      async send(stage, e) {
        calls.push(`send ${stage} ${(e as ObjectEvent).data.name}`);
      },
      async sendMany(stage, events) {
        calls.push(`sendMany ${stage} ${events.map((e) => (e as ObjectEvent).data.name).join(',')}`);
      },
    };
    await transportToStages(sender).send([
      ev('App', 'a'),
      ev('App', 'b'),
      ev('App', 'c'),
      ev('PackageInstall', 'p'),
      ev('App', 'd'),
      ev('App', 'e'),
    ]);
    expect(calls).toEqual(['sendMany fetch a,b,c', 'send install p', 'sendMany fetch d,e']);
  });
});
