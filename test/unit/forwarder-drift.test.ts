import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { KAPP_WRITE_HOLD_MS, KAPP_WRITE_SKEW_MS, writtenSince } from '../../events/forwarder/drift.js';
import { Forwarder, type ForwarderOptions } from '../../events/forwarder/forwarder.js';
import { watchedKinds } from '../../events/forwarder/kinds.js';
import {
  appDeployed,
  appInputsFixed,
  appQuietUntil,
  DEFAULT_SAFETY_SYNC_PERIOD_MS,
  MAX_DEPLOYED_GROUP_KINDS,
  packageRepositoryQuietUntil,
  repositoryInputsFixed,
  SAFETY_SYNC_PERIOD_ANNOTATION,
  SYNC_MODE_ANNOTATION,
} from '../../events/forwarder/quiet.js';
import { FakeObjectWatcher } from '../../events/forwarder/testing.js';
import type { Transport } from '../../events/forwarder/transport.js';
import {
  EVENT_TYPES,
  type HealthEvent,
  healthMessage,
  type KappEvent,
  type ObjectEvent,
  parseEvent,
  targetFunction,
} from '../../events/schema.js';
import { type KubeObject, WatchGoneError } from '../../functions/lib/kube/port.js';
import { parseControllerConfigData } from '../../functions/lib/reconcile/controller-config.js';

const APP = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' };
const DEPLOYMENT = { apiVersion: 'apps/v1', kind: 'Deployment' };
const PKGR = { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageRepository' };
const PACKAGE = { apiVersion: 'data.packaging.carvel.dev/v1alpha1', kind: 'Package' };
const T0 = Date.parse('2025-01-01T00:00:00Z');
const LABEL = 'kapp.k14s.io/app';

function iso(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** Status of an App that deployed Deployments into `default` under label value 42 at `at`. */
function deployedStatus(at: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    observedGeneration: 1,
    conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
    fetch: { exitCode: 0, updatedAt: iso(at - 1000) },
    template: { exitCode: 0, updatedAt: iso(at - 1000) },
    deploy: {
      exitCode: 0,
      finished: true,
      updatedAt: iso(at),
      kapp: {
        associatedResources: {
          label: `${LABEL}=42`,
          namespaces: ['default'],
          groupKinds: [{ group: 'apps', kind: 'Deployment' }],
        },
      },
    },
    ...extra,
  };
}

function app(
  o: { status?: Record<string, unknown>; spec?: Record<string, unknown>; annotations?: Record<string, string> } = {},
): KubeObject {
  return {
    ...APP,
    metadata: {
      name: 'a',
      namespace: 'default',
      uid: 'uid-a',
      resourceVersion: '',
      generation: 1,
      ...(o.annotations ? { annotations: o.annotations } : {}),
    },
    spec: o.spec ?? {
      fetch: [{ inline: { paths: { 'a.yml': 'x' } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    },
    ...(o.status ? { status: o.status } : {}),
  };
}

/**
 * A PackageRepository (sync period 1m) that succeeded at `at`; `packages`: its status names the
 * Packages kapp deployed (label value 43), which a repository's status does not today.
 */
function repo(
  at: number,
  o: { fetch?: unknown; spec?: Record<string, unknown>; annotations?: Record<string, string>; packages?: boolean } = {},
): KubeObject {
  const status = deployedStatus(at) as { deploy: Record<string, unknown> };
  if (o.packages)
    status.deploy.kapp = {
      associatedResources: {
        label: `${LABEL}=43`,
        namespaces: ['default'],
        groupKinds: [{ group: 'data.packaging.carvel.dev', kind: 'Package' }],
      },
    };
  else delete status.deploy.kapp;
  return {
    ...PKGR,
    metadata: {
      name: 'r',
      namespace: 'default',
      uid: 'uid-r',
      resourceVersion: '',
      generation: 1,
      ...(o.annotations ? { annotations: o.annotations } : {}),
    },
    spec: { syncPeriod: '1m', fetch: o.fetch ?? { imgpkgBundle: { image: 'r.io/repo:1.0' } }, ...o.spec },
    status,
  };
}

/** A Deployment of the App, last written by `manager` at `at` (`status`: the status subresource). */
function deployment(name: string, manager: string, at: number, subresource?: string): KubeObject {
  return {
    ...DEPLOYMENT,
    metadata: {
      name,
      namespace: 'default',
      uid: `uid-${name}`,
      resourceVersion: '',
      generation: 1,
      labels: { [LABEL]: '42' },
      managedFields: [
        { manager: 'kapp', operation: 'Update', time: iso(T0 - 60_000) },
        ...(manager === 'kapp' && !subresource
          ? []
          : [{ manager, operation: 'Update', time: iso(at), ...(subresource ? { subresource } : {}) }]),
      ],
    },
    spec: { replicas: 1 },
  };
}

/** A Deployment of the App whose only write is kapp's, at `at`. */
function byKapp(name: string, at: number): KubeObject {
  const d = deployment(name, 'kapp', at);
  (d.metadata.managedFields as Array<{ time: string }>)[0]!.time = iso(at);
  return d;
}

/** Records object events; health events (`forwarder-health.test.ts`) are kept apart. */
class Recorder implements Transport {
  readonly events: ObjectEvent[] = [];
  readonly health: KappEvent[] = [];
  async send(events: KappEvent[]): Promise<void> {
    for (const e of events) {
      if (e.type === 'dev.kapp-lambda.object.v1') this.events.push(e);
      else this.health.push(e);
    }
  }
  take(): string[] {
    const out = this.events.map((e) => `${e.data.reason}${e.data.cause ? ` ${e.data.cause}` : ''}`);
    this.events.length = 0;
    return out;
  }
}

let watcher: FakeObjectWatcher;
let transport: Recorder;
let fwd: Forwarder | undefined;

function start(extra: Partial<ForwarderOptions> = {}): Forwarder {
  fwd = new Forwarder({
    clusterId: 'c1',
    watcher,
    transport,
    kinds: watchedKinds(['App']),
    random: () => 0,
    coalesceWindowMs: 200,
    resyncRetryMs: 300_000,
    ...extra,
  });
  fwd.start();
  return fwd;
}

async function settle(ms = 250): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

beforeEach(() => {
  vi.useFakeTimers({ now: T0 });
  watcher = new FakeObjectWatcher();
  // As kube-apiserver does: without them every quiet watch would look stalled after 90 s.
  watcher.bookmarkEvery(60_000);
  watcher.serve(DEPLOYMENT, 'deployments');
  transport = new Recorder();
});

afterEach(async () => {
  await fwd?.stop();
  fwd = undefined;
  vi.useRealTimers();
});

describe('writtenSince', () => {
  const now = T0 + 60_000;
  it('any entry of another manager outside status at or after the last reconcile; kapp and status writes are not', () => {
    expect(writtenSince(deployment('d', 'kapp', T0), T0, now)).toBe(false);
    expect(writtenSince(deployment('d', 'kube-controller-manager', T0, 'status'), T0, now)).toBe(false);
    expect(writtenSince(deployment('d', 'kubectl-edit', T0), T0, now)).toBe(true);
    expect(writtenSince(deployment('d', 'kubectl-edit', T0 - 1000), T0, now)).toBe(false);
    expect(writtenSince(deployment('d', 'kubectl-edit', T0 - 1000), Number.NaN, now)).toBe(true);
  });

  it("a write under kapp's name after the reconcile ended is not kapp-controller's", () => {
    const byKapp = (at: number) => {
      const d = deployment('d', 'kapp', T0);
      (d.metadata.managedFields as Array<{ time: string }>)[0]!.time = iso(at);
      return d;
    };
    expect(writtenSince(byKapp(T0 + KAPP_WRITE_SKEW_MS), T0, now)).toBe(false);
    expect(writtenSince(byKapp(T0 + KAPP_WRITE_SKEW_MS + 1000), T0, now)).toBe(true);
  });

  it('a forged newest entry hides nothing, an entry far in the future is not believed, no managedFields is drift', () => {
    const forged = deployment('d', 'kubectl-edit', T0 + 10_000);
    (forged.metadata.managedFields as unknown[]).push({
      manager: 'kapp',
      operation: 'Apply',
      time: iso(T0 + 3_600_000),
    });
    expect(writtenSince(forged, T0, now)).toBe(true);
    const future = deployment('d', 'kapp', T0);
    (future.metadata.managedFields as unknown[]).push({ manager: 'x', operation: 'Update', time: iso(T0 + 3_600_000) });
    expect(writtenSince(future, T0, now)).toBe(false);
    const cleared = deployment('d', 'kapp', T0);
    delete cleared.metadata.managedFields;
    expect(writtenSince(cleared, T0, now)).toBe(true);
  });
});

describe('appQuietUntil: who may stay quiet at its sync period', () => {
  const done = app({ status: deployedStatus(T0) });
  it('an inline App that succeeded: quiet until its last reconcile plus the safety period', () => {
    expect(appQuietUntil(done, undefined, () => 0)).toBe(T0 + DEFAULT_SAFETY_SYNC_PERIOD_MS);
    expect(appQuietUntil(done, { safetySyncPeriodMs: 1_200_000 }, () => 0)).toBe(T0 + 1_200_000);
    const annotated = app({ status: deployedStatus(T0), annotations: { [SAFETY_SYNC_PERIOD_ANNOTATION]: '1h' } });
    expect(appQuietUntil(annotated, { safetySyncPeriodMs: 1_200_000 }, () => 0)).toBe(T0 + 3_600_000);
  });

  it('periodic as upstream when asked, failing, unreconciled, deploying elsewhere, or the safety period is not longer', () => {
    const periodic = app({ status: deployedStatus(T0), annotations: { [SYNC_MODE_ANNOTATION]: 'periodic' } });
    expect(appQuietUntil(periodic, undefined, () => 0)).toBeUndefined();
    expect(appQuietUntil(done, { syncMode: 'periodic' }, () => 0)).toBeUndefined();
    const optIn = app({ status: deployedStatus(T0), annotations: { [SYNC_MODE_ANNOTATION]: 'exception' } });
    expect(appQuietUntil(optIn, { syncMode: 'periodic' }, () => 0)).toBe(T0 + DEFAULT_SAFETY_SYNC_PERIOD_MS);
    const failed = app({
      status: deployedStatus(T0, { conditions: [{ type: 'ReconcileFailed', status: 'True' }] }),
    });
    expect(appQuietUntil(failed, undefined, () => 0)).toBeUndefined();
    expect(
      appQuietUntil(app({ status: deployedStatus(T0, { observedGeneration: 0 }) }), undefined, () => 0),
    ).toBeUndefined();
    // A run that died mid-way (a function timeout) leaves Reconciling with the previous deploy.
    const stuck = app({ status: deployedStatus(T0, { conditions: [{ type: 'Reconciling', status: 'True' }] }) });
    expect(appQuietUntil(stuck, undefined, () => 0)).toBeUndefined();
    expect(appQuietUntil(app({ status: deployedStatus(T0, { conditions: [] }) }), undefined, () => 0)).toBeUndefined();
    const remote = app({
      status: deployedStatus(T0),
      spec: { ...(done.spec as object), cluster: { kubeconfigSecretRef: { name: 'k' } } },
    });
    expect(appQuietUntil(remote, undefined, () => 0)).toBeUndefined();
    const long = app({ status: deployedStatus(T0), spec: { ...(done.spec as object), syncPeriod: '1h' } });
    expect(appQuietUntil(long, undefined, () => 0)).toBeUndefined();
  });

  it('only sources that cannot move behind the spec or that the fleet polls: commit ids, sha256, digests, inline, public tags, branches and selections; kbld only over a bundle', () => {
    const sha = 'a'.repeat(40);
    const digest = `@sha256:${'b'.repeat(64)}`;
    const fixed = (fetch: unknown[], template: unknown[] = [{ ytt: {} }]) => appInputsFixed({ fetch, template });
    expect(fixed([{ git: { url: 'https://g', ref: sha } }])).toBe(true);
    // A public branch or tag is polled for the fleet (a move sends ref-changed); with a Secret it is not.
    expect(fixed([{ git: { url: 'https://g', ref: 'origin/main' } }])).toBe(true);
    expect(fixed([{ git: { url: 'https://g', ref: 'origin/main', secretRef: { name: 's' } } }])).toBe(false);
    expect(fixed([{ git: { url: 'https://tok@g', ref: 'origin/main' } }])).toBe(false);
    // A tag selection is polled too (issue 24); with a Secret, or beside a ref (vendir lets the ref win), it is not.
    expect(fixed([{ git: { url: 'https://g', refSelection: { semver: {} } } }])).toBe(true);
    expect(fixed([{ git: { url: 'https://g', refSelection: { semver: {} }, secretRef: { name: 's' } } }])).toBe(false);
    expect(fixed([{ git: { url: 'https://g', ref: 'main', refSelection: { semver: {} } } }])).toBe(false);
    expect(fixed([{ http: { url: 'https://h/a.tgz', sha256: 'c'.repeat(64) } }])).toBe(true);
    // http without sha256 is polled (the body's sha256); not with a Secret or a query (a signed URL's token).
    expect(fixed([{ http: { url: 'https://h/a.tgz' } }])).toBe(true);
    expect(fixed([{ http: { url: 'https://h/a.tgz', secretRef: { name: 's' } } }])).toBe(false);
    expect(fixed([{ http: { url: 'https://h/a.tgz?X-Amz-Signature=x' } }])).toBe(false);
    expect(fixed([{ image: { url: `r/i${digest}` } }])).toBe(true);
    expect(fixed([{ image: { url: 'r/i:1.0' } }])).toBe(true);
    expect(fixed([{ image: { url: 'r/i:1.0', secretRef: { name: 's' } } }])).toBe(false);
    expect(fixed([{ image: { url: 'r/i', tagSelection: { semver: {} } } }])).toBe(true);
    expect(fixed([{ image: { url: 'r/i', tagSelection: { semver: {} }, secretRef: { name: 's' } } }])).toBe(false);
    expect(fixed([{ imgpkgBundle: { image: 'r/b:1.0' } }], [{ ytt: {} }, { kbld: {} }])).toBe(true);
    expect(fixed([{ helmChart: { name: 'c', version: '1.0.0' } }])).toBe(false);
    // A chart from a public repository is polled (index.yaml), at no or a full version; a constraint is not.
    expect(fixed([{ helmChart: { name: 'c', repository: { url: 'https://charts.io' } } }])).toBe(true);
    expect(fixed([{ helmChart: { name: 'c', version: '^1.0', repository: { url: 'https://charts.io' } } }])).toBe(
      false,
    );
    expect(fixed([{ helmChart: { name: 'c', version: '1.0.0', repository: { url: 'oci://r.io/charts' } } }])).toBe(
      true,
    );
    expect(fixed([{ helmChart: { name: 'c', repository: { url: 'oci://r.io/charts' } } }])).toBe(false);
    expect(fixed([{ imgpkgBundle: { image: `r/b${digest}` } }], [{ ytt: {} }, { kbld: {} }])).toBe(true);
    expect(fixed([{ image: { url: `r/i${digest}` } }], [{ kbld: {} }])).toBe(false);
    expect(fixed([])).toBe(false);
    expect(fixed([{ inline: { paths: { 'a.yml': 'x' } } }], [{ sops: { age: {} } }, { ytt: {} }])).toBe(false);
  });

  it('reads the label, kinds and namespaces kapp recorded', () => {
    expect(appDeployed(done)).toEqual({
      label: '42',
      groupKinds: [{ group: 'apps', kind: 'Deployment' }],
      namespaces: ['default'],
    });
    expect(
      appDeployed(app({ status: { deploy: { kapp: { associatedResources: { label: 'other=1' } } } } })),
    ).toBeUndefined();
  });

  it('a status naming more kinds than any App deploys is not believed: no watch starts, the App keeps its timer', () => {
    // The status is writable by whoever may patch apps/status: each kind it names is a discovery
    // (two requests) and, when served, a list+watch of the cluster's API server by the forwarder.
    const kinds = (n: number) => Array.from({ length: n }, (_, i) => ({ group: `g${i}.example`, kind: 'K' }));
    const deployed = (n: number) =>
      appDeployed(
        app({
          status: {
            deploy: { kapp: { associatedResources: { label: 'kapp.k14s.io/app=1', groupKinds: kinds(n) } } },
          },
        }),
      );
    expect(deployed(MAX_DEPLOYED_GROUP_KINDS)?.groupKinds).toHaveLength(MAX_DEPLOYED_GROUP_KINDS);
    expect(deployed(MAX_DEPLOYED_GROUP_KINDS + 1)).toBeUndefined();
    expect(deployed(10_000)).toBeUndefined();
  });

  it('kapp-controller-config keys: kappLambdaSyncMode and kappLambdaSafetySyncPeriod', () => {
    expect(
      parseControllerConfigData({ kappLambdaSyncMode: 'periodic', kappLambdaSafetySyncPeriod: '30m' }).timer,
    ).toEqual({
      syncMode: 'periodic',
      safetySyncPeriodMs: 1_800_000,
    });
    expect(() => parseControllerConfigData({ kappLambdaSyncMode: 'sometimes' })).toThrow(/kappLambdaSyncMode/);
  });
});

describe('packageRepositoryQuietUntil: a repository at its sync period', () => {
  it('succeeded, shorter sync period than the safety period, a source that cannot move unseen: quiet until the safety period', () => {
    expect(packageRepositoryQuietUntil(repo(T0), undefined, () => 0)).toBe(T0 + DEFAULT_SAFETY_SYNC_PERIOD_MS);
    const annotated = repo(T0, { annotations: { [SAFETY_SYNC_PERIOD_ANNOTATION]: '1h' } });
    expect(packageRepositoryQuietUntil(annotated, { safetySyncPeriodMs: 1_200_000 }, () => 0)).toBe(T0 + 3_600_000);
    expect(packageRepositoryQuietUntil(repo(T0), { safetySyncPeriodMs: 1_200_000 }, () => 0)).toBe(T0 + 1_200_000);
  });

  it('periodic as upstream when asked, at its default 10m, paused, failing, or running', () => {
    const periodic = repo(T0, { annotations: { [SYNC_MODE_ANNOTATION]: 'periodic' } });
    expect(packageRepositoryQuietUntil(periodic, undefined, () => 0)).toBeUndefined();
    expect(packageRepositoryQuietUntil(repo(T0), { syncMode: 'periodic' }, () => 0)).toBeUndefined();
    const optIn = repo(T0, { annotations: { [SYNC_MODE_ANNOTATION]: 'exception' } });
    expect(packageRepositoryQuietUntil(optIn, { syncMode: 'periodic' }, () => 0)).toBe(
      T0 + DEFAULT_SAFETY_SYNC_PERIOD_MS,
    );
    // its default sync period (10m) is the default safety period: nothing to save
    const byDefault = repo(T0);
    delete (byDefault.spec as Record<string, unknown>).syncPeriod;
    expect(packageRepositoryQuietUntil(byDefault, undefined, () => 0)).toBeUndefined();
    expect(packageRepositoryQuietUntil(repo(T0, { spec: { paused: true } }), undefined, () => 0)).toBeUndefined();
    const failed = repo(T0);
    (failed.status as Record<string, unknown>).conditions = [{ type: 'ReconcileFailed', status: 'True' }];
    expect(packageRepositoryQuietUntil(failed, undefined, () => 0)).toBeUndefined();
    const running = repo(T0);
    (running.status as Record<string, unknown>).conditions = [
      { type: 'ReconcileSucceeded', status: 'True' },
      { type: 'Reconciling', status: 'True' },
    ];
    expect(packageRepositoryQuietUntil(running, undefined, () => 0)).toBeUndefined();
    const newer = repo(T0);
    newer.metadata.generation = 2;
    expect(packageRepositoryQuietUntil(newer, undefined, () => 0)).toBeUndefined();
  });

  it('sources: pinned, inline without pathsFrom, or tracked by the fleet source poll', () => {
    const digest = `@sha256:${'b'.repeat(64)}`;
    expect(repositoryInputsFixed({ imgpkgBundle: { image: `r.io/repo${digest}` } })).toBe(true);
    expect(repositoryInputsFixed({ imgpkgBundle: { image: 'r.io/repo:1.0' } })).toBe(true);
    expect(repositoryInputsFixed({ git: { url: 'https://g.io/r', ref: 'origin/main' } })).toBe(true);
    expect(repositoryInputsFixed({ inline: { paths: { 'p.yml': 'x' } } })).toBe(true);
    expect(repositoryInputsFixed({ imgpkgBundle: { image: 'r.io/repo', tagSelection: { semver: {} } } })).toBe(true);
    // not polled: a Secret, http without sha256 (no fallback in a repository's fetch), inline from
    // Secrets the forwarder does not watch
    expect(repositoryInputsFixed({ http: { url: 'https://h.io/r.tgz' } })).toBe(false);
    expect(repositoryInputsFixed({ imgpkgBundle: { image: 'r.io/repo:1.0', secretRef: { name: 's' } } })).toBe(false);
    expect(
      repositoryInputsFixed({
        imgpkgBundle: { image: 'r.io/repo', tagSelection: { semver: {} }, secretRef: { name: 's' } },
      }),
    ).toBe(false);
    expect(repositoryInputsFixed({ http: { url: 'https://h.io/r.tgz', secretRef: { name: 's' } } })).toBe(false);
    expect(repositoryInputsFixed({ inline: { pathsFrom: [{ secretRef: { name: 's' } }] } })).toBe(false);
    const secretFetch = { imgpkgBundle: { image: 'r.io/repo:1.0', secretRef: { name: 's' } } };
    expect(packageRepositoryQuietUntil(repo(T0, { fetch: secretFetch }), undefined, () => 0)).toBeUndefined();
  });
});

describe('forwarder: a PackageRepository at its sync period', () => {
  const startRepos = () => start({ kinds: watchedKinds(['PackageRepository']) });
  /** Events over `n` sync periods (1m + jitter), each resync answered by a reconcile. */
  const syncPeriods = async (n: number, packages: boolean) => {
    const out: string[] = [];
    for (let i = 0; i < n; i++) {
      await settle(66_000);
      const events = transport.take();
      if (events.length > 0) watcher.apply(repo(Date.now(), { packages }));
      out.push(...events);
    }
    return out;
  };

  it('stays periodic while its status does not name the Packages it deployed (no drift watch covers them)', async () => {
    watcher.apply(repo(T0 - 70_000));
    startRepos();
    await settle();
    expect(transport.take()).toEqual(['resync']);
    vi.setSystemTime(T0 + 1_000);
    watcher.apply(repo(T0 + 1_000));
    expect(await syncPeriods(3, false)).toEqual(['resync', 'resync', 'resync']);
  });

  it('is quiet once drift watches cover the Packages its status names', async () => {
    watcher.serve(PACKAGE, 'packages');
    watcher.apply(repo(T0 - 70_000, { packages: true }));
    startRepos();
    await settle();
    expect(transport.take()).toEqual(['resync']);
    vi.setSystemTime(T0 + 1_000);
    watcher.apply(repo(T0 + 1_000, { packages: true }));
    expect(await syncPeriods(3, true)).toEqual([]);
    expect(fwd!.stats().quiet).toBeGreaterThan(0);
  });
});

describe('forwarder: reconcile by exception', () => {
  it('after a start every App reconciles once at its sync period; then its sync periods send nothing until the safety period', async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0));
    start();
    await settle();
    expect(transport.take()).toEqual([]);
    // Due at T0 + 20-25 s (30 s + jitter after its last reconcile): the watches started after it, so it runs.
    await settle(25_000);
    expect(transport.take()).toEqual(['resync']);
    // The reconcile ends (a new status); from now on its watches cover it.
    const reconciled = T0 + 26_000;
    vi.setSystemTime(reconciled);
    watcher.apply(app({ status: deployedStatus(reconciled) }));
    await settle(5 * 60_000);
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().quiet).toBeGreaterThan(0);
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(reconciled + DEFAULT_SAFETY_SYNC_PERIOD_MS);
    await vi.advanceTimersByTimeAsync(reconciled + DEFAULT_SAFETY_SYNC_PERIOD_MS - Date.now() + 250);
    expect(transport.take()).toEqual(['resync']);
  });

  it('a safety-period reconcile that wrote no status (nothing changed) leaves the App quiet for another safety period', async () => {
    const reconciled = T0 - 10_000;
    watcher.apply(app({ status: deployedStatus(reconciled) }));
    watcher.apply(deployment('web', 'kapp', T0 - 20_000));
    start();
    await settle(25_000); // its first sync period after the start: the watches started after its reconcile
    expect(transport.take()).toEqual(['resync']);
    // That run changed nothing: no status write. The watches cover the App from the ask on.
    await settle(5 * 60_000);
    expect(transport.take()).toEqual([]);
    const safety = fwd!.dueAt(APP, 'default', 'a')!;
    expect(safety).toBeGreaterThan(T0 + DEFAULT_SAFETY_SYNC_PERIOD_MS);
    await vi.advanceTimersByTimeAsync(safety - Date.now() + 250);
    const [again, ...more] = transport.take();
    expect(more).toEqual([]);
    expect(again).toMatch(/^resync resync-at-\d+$/); // same status asked again: an id of its own
    // The safety run wrote no status either: quiet again until one more safety period from its ask.
    const asked = Date.now();
    await settle(5 * 60_000);
    expect(transport.take()).toEqual([]);
    expect(fwd!.dueAt(APP, 'default', 'a')).toBeGreaterThan(asked + DEFAULT_SAFETY_SYNC_PERIOD_MS - 2000);
  });

  it('a hand edit or deletion of a deployed object is one ref-changed naming it; kapp and status writes are not drift', async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0));
    start();
    await settle();
    expect(fwd!.stats().driftKinds).toBe(1);
    watcher.apply(deployment('web', 'kube-controller-manager', T0 + 200, 'status'));
    watcher.apply(deployment('web', 'kapp', T0 + 200));
    await settle();
    expect(transport.take()).toEqual([]);
    watcher.apply(deployment('web', 'kubectl-edit', Date.now()));
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified']);
    watcher.remove(DEPLOYMENT, 'default', 'web');
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web deleted']);
    expect(fwd!.stats().drift).toBe(2);
    const [list] = watcher.listCalls(DEPLOYMENT);
    // A Deployment's health is judged (`health.ts`): its watch reads whole objects; without health, metadata only.
    expect(list).toMatchObject({ labelSelector: LABEL });
    expect(list?.metadataOnly).toBeFalsy();
  });

  it("a hand edit under kapp's field manager name, or behind a forged managedFields entry, is drift", async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0 - 20_000));
    start();
    await settle();
    transport.take();
    await settle(30_000);
    transport.take();
    // kubectl edit --field-manager=kapp, long after the last reconcile: held for a status that
    // would explain it, then reported.
    watcher.apply(byKapp('web', Date.now()));
    await settle();
    expect(transport.take()).toEqual([]);
    await settle(KAPP_WRITE_HOLD_MS);
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified']);
    // An update that sets managedFields itself: a kapp entry dated next year, its own edit older.
    const forged = deployment('web', 'kubectl-edit', Date.now());
    (forged.metadata.managedFields as unknown[]).push({ manager: 'kapp', operation: 'Apply', time: iso(T0 + 3.15e10) });
    watcher.apply(forged);
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified']);
    // managedFields cleared with [{}] by the edit itself.
    const cleared = deployment('db', 'kapp', T0);
    delete cleared.metadata.managedFields;
    watcher.apply(cleared);
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/db created']);
  });

  it("kapp's writes that reach the forwarder before their run's status are not drift; under kapp's name with no status in time, they are", async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0 - 20_000));
    start();
    await settle(30_000);
    await settle(KAPP_WRITE_HOLD_MS + 60_000);
    transport.take();
    watcher.apply(deployment('web', 'kubectl-edit', Date.now()));
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified']);
    // The reconcile it asked for (a resync writes no Reconciling status): kapp reverts the edit,
    // and the watch sees kapp's write before the status the reconcile then writes.
    await settle(2000);
    watcher.apply(byKapp('web', Date.now()));
    await settle(3000);
    watcher.apply(app({ status: deployedStatus(Date.now() - 2000) }));
    await settle(KAPP_WRITE_HOLD_MS);
    expect(transport.take()).toEqual([]);
    // A moved source's run (poked by the fleet source poll, not through the forwarder): the same.
    watcher.apply(byKapp('web', Date.now()));
    await settle(1000);
    watcher.apply(app({ status: deployedStatus(Date.now()) }));
    await settle(KAPP_WRITE_HOLD_MS);
    expect(transport.take()).toEqual([]);
    // An edit under kapp's name that no status explains: reported once the hold ends, even right
    // after an event the tenant caused (a touch that changed nothing, so no status follows).
    watcher.apply(deployment('web', 'kubectl-label', Date.now()));
    watcher.apply(deployment('web', 'kapp', T0 - 20_000));
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified']);
    await settle(5000);
    watcher.apply(byKapp('web', Date.now()));
    await settle(KAPP_WRITE_HOLD_MS - 1000);
    expect(transport.take()).toEqual([]);
    await settle(1500);
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified']);
  });

  it('an App whose template reads its own metadata (valuesFrom downwardAPI) keeps its sync period, as upstream', async () => {
    const spec = {
      fetch: [{ inline: { paths: { 'a.yml': 'x' } } }],
      template: [
        {
          ytt: {
            valuesFrom: [{ downwardAPI: { items: [{ name: 'env', fieldPath: "metadata.annotations['env']" }] } }],
          },
        },
      ],
      deploy: [{ kapp: {} }],
    };
    watcher.apply(app({ spec, annotations: { env: 'staging' }, status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0 - 20_000));
    start();
    await settle(30_000);
    expect(transport.take()).toEqual(['resync']);
    // `kubectl annotate app a env=prod --overwrite`: no new generation; the render input moved.
    watcher.apply(app({ spec, annotations: { env: 'prod' }, status: deployedStatus(T0 - 10_000) }));
    await settle(40_000); // upstream: at its next sync, 30 s + jitter
    expect(transport.take().length).toBeGreaterThan(0);
  });

  it("objects labelled with an App's label in a namespace it did not deploy into are not its drift", async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0));
    start();
    await settle();
    transport.take();
    // Another tenant copies the label onto its own objects, writes and deletes them.
    const forged = { ...deployment('web', 'kubectl', Date.now()) };
    forged.metadata = { ...forged.metadata, namespace: 'tenant-b', uid: 'uid-b' };
    watcher.apply(forged);
    await settle();
    watcher.apply(structuredClone(forged));
    watcher.remove(DEPLOYMENT, 'tenant-b', 'web');
    await settle();
    expect(transport.take()).toEqual([]);
    // Nor after 410 Gone: its deletion while the watch was away is not the App's.
    watcher.apply(structuredClone(forged));
    await settle();
    watcher.stallWatches(DEPLOYMENT);
    watcher.remove(DEPLOYMENT, 'tenant-b', 'web');
    watcher.compact(DEPLOYMENT);
    watcher.failWatches(new WatchGoneError('gone'), DEPLOYMENT);
    await settle(1000);
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().drift).toBe(0);
  });

  it("an App whose status names another App's label gets none of its drift, and the real owner keeps its timer", async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0));
    start();
    await settle();
    transport.take();
    // A tenant allowed to patch apps/status in its namespace names App a's label and namespace.
    const thief = app({ status: deployedStatus(T0 - 10_000) });
    thief.metadata = { ...thief.metadata, namespace: 'tenant-b', uid: 'uid-b' };
    watcher.apply(thief);
    await settle();
    transport.take();
    watcher.apply(deployment('web', 'kubectl-edit', Date.now()));
    await settle();
    const sent = transport.events.map((e) => `${e.data.namespace}/${e.data.name} ${e.data.cause ?? ''}`);
    expect(sent.filter((e) => e.startsWith('tenant-b/'))).toEqual([]);
    // The label is claimed twice: a is not covered by the drift watches, so it is not quiet.
    expect(fwd!.dueAt(APP, 'default', 'a')).toBeLessThan(Date.now() + DEFAULT_SAFETY_SYNC_PERIOD_MS / 2);
  });

  it('changes while the App reconciles are its own deploy; writes before its last reconcile are not drift', async () => {
    watcher.apply(
      app({ status: deployedStatus(T0 - 10_000, { conditions: [{ type: 'Reconciling', status: 'True' }] }) }),
    );
    watcher.apply(deployment('web', 'kapp', T0));
    start();
    await settle();
    transport.take();
    watcher.remove(DEPLOYMENT, 'default', 'web');
    watcher.apply(deployment('other', 'kube-controller-manager', Date.now()));
    await settle();
    expect(transport.take()).toEqual([]);
    watcher.apply(app({ status: deployedStatus(T0 + 5_000) }));
    watcher.apply(deployment('other', 'kubectl', T0 - 60_000));
    await settle();
    expect(transport.take()).toEqual([]);
  });

  it('a hand edit during a reconcile is reported when the reconcile ends (kapp may have applied before it)', async () => {
    const running = { conditions: [{ type: 'Reconciling', status: 'True' }] };
    watcher.apply(app({ status: deployedStatus(T0 - 10_000, running) }));
    watcher.apply(deployment('web', 'kapp', T0));
    start();
    await settle();
    transport.take();
    watcher.apply(deployment('web', 'kubectl-edit', Date.now()));
    watcher.apply(deployment('web', 'kube-controller-manager', Date.now()));
    await settle();
    expect(transport.take()).toEqual([]);
    watcher.apply(app({ status: deployedStatus(T0 + 5_000) }));
    await settle();
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment default/web modified during a reconcile']);
    // Once only; a reconcile with only the controller's writes reports nothing.
    watcher.apply(app({ status: deployedStatus(T0 + 5_000, running) }));
    watcher.apply(deployment('web', 'kube-controller-manager', Date.now() + 1000));
    watcher.apply(app({ status: deployedStatus(T0 + 9_000) }));
    await settle();
    expect(transport.take()).toEqual([]);
  });

  it('after 410 Gone a relist tells objects deleted or edited while away, and nothing for the unchanged', async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0));
    watcher.apply(deployment('db', 'kapp', T0));
    start();
    await settle();
    transport.take();
    watcher.stallWatches(DEPLOYMENT);
    watcher.remove(DEPLOYMENT, 'default', 'db');
    watcher.compact(DEPLOYMENT);
    watcher.failWatches(new WatchGoneError('gone'), DEPLOYMENT);
    await settle(1000);
    expect(transport.take()).toEqual(['ref-changed drift: apps/v1 Deployment deleted while the watch was away']);
    watcher.compact(DEPLOYMENT);
    watcher.failWatches(new WatchGoneError('gone'), DEPLOYMENT);
    await settle(1000);
    expect(transport.take()).toEqual([]);
  });

  /** Starts a forwarder, lets App `a` run its first reconcile, and checks it is quiet after it. */
  async function quietApp(extra: Partial<ForwarderOptions> = {}): Promise<void> {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    watcher.apply(deployment('web', 'kapp', T0));
    start(extra);
    await settle(25_000);
    expect(transport.take()).toEqual(['resync']);
    vi.setSystemTime(T0 + 26_000);
    watcher.apply(app({ status: deployedStatus(T0 + 26_000) }));
    await settle(40_000);
    expect(transport.take()).toEqual([]);
  }

  /** The App's reconcile ends now (a new status with the current time). */
  function reconciledNow(): void {
    watcher.apply(app({ status: deployedStatus(Math.floor(Date.now() / 1000) * 1000) }));
  }

  it('while its drift watch fails, a quiet App keeps its sync period; the watch back, it is quiet again with no burst', async () => {
    await quietApp();
    watcher.failWatches(new Error('forbidden'), DEPLOYMENT);
    // Asked at once (the spread of the shortest sync period is 0 here), not at its safety period.
    await settle(1000);
    expect(transport.take()).toEqual(['resync']);
    reconciledNow();
    // The watch is open again but has delivered nothing yet (the next bookmark is at T0 + 120 s):
    // its next sync period runs too.
    await settle(36_000);
    expect(transport.take()).toEqual(['resync']);
    reconciledNow();
    // It delivers (a bookmark): covered as before; nothing is sent for the unchanged App and its
    // sync periods are quiet again.
    await settle(5 * 60_000);
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().watchErrors).toBe(1);
  });

  it('a stalled drift watch (open, silent) is restarted and its quiet App asked; back, the App is quiet again', async () => {
    await quietApp();
    watcher.stallWatches(DEPLOYMENT);
    await settle(95_000);
    expect(transport.take()).toEqual(['resync']);
    expect(fwd!.stats().stalls).toBe(1);
    reconciledNow();
    await settle(5 * 60_000);
    expect(transport.take()).toEqual([]);
  });

  it('a kapp-controller-config change makes a quiet App reconcile once at its sync period', async () => {
    let changes = 0;
    await quietApp({ controllerConfig: { namespace: 'kapp-lambda', onChange: () => changes++ } });
    const before = changes;
    watcher.apply({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'kapp-controller-config', namespace: 'kapp-lambda', uid: 'cc', resourceVersion: '' },
      data: { caCerts: 'x' },
    } as KubeObject);
    await settle(40_000);
    expect(changes).toBeGreaterThan(before);
    expect(transport.take()).toEqual(['resync']);
  });

  it('a change or deletion of its ServiceAccount asks the App at once (upstream: at its next sync)', async () => {
    const withSa = { ...(app().spec as object), serviceAccountName: 'deployer' };
    watcher.apply(app({ status: deployedStatus(T0 - 10_000), spec: withSa }));
    const sa = (rv: string) =>
      ({
        apiVersion: 'v1',
        kind: 'ServiceAccount',
        metadata: { name: 'deployer', namespace: 'default', uid: 'sa', resourceVersion: rv },
      }) as KubeObject;
    watcher.apply(sa(''));
    start();
    await settle();
    transport.take();
    const changed = watcher.apply({ ...sa(''), metadata: { ...sa('').metadata, labels: { x: '1' } } });
    await settle();
    expect(transport.take()).toEqual([`ref-changed ServiceAccount/deployer@${changed.metadata.resourceVersion}`]);
    const gone = watcher.remove({ apiVersion: 'v1', kind: 'ServiceAccount' }, 'default', 'deployer')!;
    await settle();
    expect(transport.take()).toEqual([`ref-changed ServiceAccount/deployer@gone-${gone.metadata.resourceVersion}`]);
  });

  it('a kind no App deploys any more stops being watched; deployed again, it is watched again', async () => {
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    start();
    await settle();
    expect(watcher.openWatches(DEPLOYMENT)).toBe(1);
    const noKinds = deployedStatus(T0 - 10_000);
    (
      noKinds.deploy as { kapp: { associatedResources: { groupKinds: unknown[] } } }
    ).kapp.associatedResources.groupKinds = [];
    watcher.apply(app({ status: noKinds }));
    await settle();
    expect(watcher.openWatches(DEPLOYMENT)).toBe(0);
    expect(fwd!.stats().driftKinds).toBe(0);
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    await settle();
    expect(watcher.openWatches(DEPLOYMENT)).toBe(1);
    watcher.remove(APP, 'default', 'a');
    await settle();
    expect(watcher.openWatches(DEPLOYMENT)).toBe(0);
  });

  it('an App whose deployed kind is not served keeps its sync period', async () => {
    watcher.served.clear();
    watcher.apply(app({ status: deployedStatus(T0 - 10_000) }));
    start();
    await settle(25_000);
    expect(transport.take()).toEqual(['resync']);
    vi.setSystemTime(T0 + 26_000);
    watcher.apply(app({ status: deployedStatus(T0 + 26_000) }));
    await settle(36_000);
    expect(transport.take()).toEqual(['resync']);
    expect(fwd!.stats().quiet).toBe(0);
  });
});

describe('forwarder: health after deploy (health.ts)', () => {
  const HEALTHY = 'kapp-lambda.carvel.dev/Healthy';
  const UNAVAILABLE = 'Available=False (MinimumReplicasUnavailable)';
  const healthEvents = () => transport.health.filter((e): e is HealthEvent => e.type === EVENT_TYPES.health);
  /** The App of `deployedStatus`, reconciled 10 s ago; `conditions` after kapp-controller's. */
  const reconciled = (extra: object[] = [], first = 'ReconcileSucceeded') =>
    app({ status: deployedStatus(T0 - 10_000, { conditions: [{ type: first, status: 'True' }, ...extra] }) });
  /** Deployment `web` of the App, written by kapp only, with an inline env value in its pod template. */
  const web = (available: boolean): KubeObject => ({
    ...byKapp('web', T0 - 20_000),
    spec: { replicas: 1, template: { spec: { containers: [{ name: 'c', env: [{ name: 'T', value: 'secret' }] }] } } },
    status: {
      observedGeneration: 1,
      replicas: 1,
      updatedReplicas: 1,
      conditions: [
        {
          type: 'Available',
          status: available ? 'True' : 'False',
          reason: available ? 'MinimumReplicasAvailable' : 'MinimumReplicasUnavailable',
        },
      ],
    },
  });

  it('sends the health of a reconciled App to fetch, and again only when it changes', async () => {
    watcher.apply(reconciled());
    watcher.apply(web(true));
    start();
    await settle(1500);
    const [first, ...more] = healthEvents();
    expect(more).toEqual([]);
    expect(first?.data).toMatchObject({ status: 'True', reason: 'Healthy', unhealthy: [] });
    expect(first?.data.object).toMatchObject({ kind: 'App', namespace: 'default', name: 'a', uid: 'uid-a' });
    expect(targetFunction(first!)).toBe('fetch');
    expect(parseEvent(JSON.stringify(first)).ok).toBe(true);
    expect(JSON.stringify(first)).not.toContain('secret');

    // The fetch function wrote it: nothing more to send.
    transport.health.length = 0;
    watcher.apply(
      reconciled([{ type: HEALTHY, status: 'True', reason: 'Healthy', message: healthMessage({ unhealthy: [] }) }]),
    );
    await settle(1500);
    expect(healthEvents()).toEqual([]);

    // Its Deployment loses its pods: False after the debounce, the resource named; no drift (a status write).
    watcher.apply(web(false));
    await settle(1500);
    expect(healthEvents().map((e) => e.data)).toEqual([
      expect.objectContaining({
        status: 'False',
        reason: 'Unhealthy',
        unhealthy: [{ kind: 'Deployment', namespace: 'default', name: 'web', why: UNAVAILABLE }],
      }),
    ]);
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().health).toBe(2);
  });

  it('waits for a reconcile to end, and judges an App that deployed no workload healthy', async () => {
    const configMapOnly = (first: string) => {
      const status = deployedStatus(T0 - 10_000, { conditions: [{ type: first, status: 'True' }] });
      const deploy = status.deploy as { kapp: { associatedResources: { groupKinds: object[] } } };
      deploy.kapp.associatedResources.groupKinds = [{ group: '', kind: 'ConfigMap' }];
      return app({ status });
    };
    watcher.serve({ apiVersion: 'v1', kind: 'ConfigMap' }, 'configmaps');
    watcher.apply(configMapOnly('Reconciling'));
    start();
    await settle(1500);
    expect(healthEvents()).toEqual([]);
    watcher.apply(configMapOnly('ReconcileSucceeded'));
    await settle(1500);
    expect(healthEvents().map((e) => e.data.status)).toEqual(['True']);
  });

  it('after a restart sends nothing for an App whose condition already says its health', async () => {
    const message = healthMessage({
      unhealthy: [{ kind: 'Deployment', namespace: 'default', name: 'web', why: UNAVAILABLE }],
    });
    watcher.apply(reconciled([{ type: HEALTHY, status: 'False', reason: 'Unhealthy', message }]));
    watcher.apply(web(false));
    start();
    await settle(1500);
    expect(healthEvents()).toEqual([]);
  });

  it('with health off, drift watches stay metadata only and no health is sent', async () => {
    watcher.apply(reconciled());
    watcher.apply(web(true));
    start({ health: false });
    await settle(1500);
    expect(healthEvents()).toEqual([]);
    expect(watcher.listCalls(DEPLOYMENT)[0]).toMatchObject({ metadataOnly: true });
  });
});
