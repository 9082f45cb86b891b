import { describe, expect, it } from 'vitest';
import {
  appHealth,
  HealthIndex,
  isHealthKind,
  MAX_UNHEALTHY_NAMED,
  resourceHealth,
  type UnhealthyResource,
} from '../../events/forwarder/health.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';

const DEPLOYMENT = { group: 'apps', kind: 'Deployment' };
const STATEFUL_SET = { group: 'apps', kind: 'StatefulSet' };
const DAEMON_SET = { group: 'apps', kind: 'DaemonSet' };
const JOB = { group: 'batch', kind: 'Job' };

function obj(o: { spec?: unknown; status?: unknown; generation?: number; name?: string; ns?: string }): KubeObject {
  return {
    apiVersion: 'x/v1',
    kind: 'X',
    metadata: {
      name: o.name ?? 'w',
      namespace: o.ns ?? 'default',
      uid: 'u',
      resourceVersion: '1',
      generation: o.generation ?? 2,
    },
    ...(o.spec === undefined ? {} : { spec: o.spec }),
    ...(o.status === undefined ? {} : { status: o.status }),
  };
}

function deployment(status: Record<string, unknown>, replicas = 2): KubeObject {
  return obj({
    spec: { replicas },
    status: {
      observedGeneration: 2,
      replicas: 2,
      updatedReplicas: 2,
      conditions: [
        { type: 'Available', status: 'True', reason: 'MinimumReplicasAvailable' },
        { type: 'Progressing', status: 'True', reason: 'NewReplicaSetAvailable' },
      ],
      ...status,
    },
  });
}

describe('resourceHealth: Deployment', () => {
  it('is ok when observed, Available=True and every replica updated', () => {
    expect(resourceHealth(DEPLOYMENT, deployment({}))).toEqual({ health: 'ok' });
  });

  it('is progressing while the controller has not observed the latest generation', () => {
    expect(resourceHealth(DEPLOYMENT, deployment({ observedGeneration: 1 }))).toEqual({
      health: 'progressing',
      why: 'waiting for generation 2 to be observed',
    });
  });

  it('fails when Available is not True, naming the reason', () => {
    const d = deployment({
      conditions: [{ type: 'Available', status: 'False', reason: 'MinimumReplicasUnavailable' }],
    });
    expect(resourceHealth(DEPLOYMENT, d)).toEqual({
      health: 'failed',
      why: 'Available=False (MinimumReplicasUnavailable)',
    });
    expect(resourceHealth(DEPLOYMENT, deployment({ conditions: [] }))?.health).toBe('failed');
  });

  it('fails on ProgressDeadlineExceeded even while Available=True', () => {
    const d = deployment({
      conditions: [
        { type: 'Available', status: 'True' },
        { type: 'Progressing', status: 'False', reason: 'ProgressDeadlineExceeded' },
      ],
    });
    expect(resourceHealth(DEPLOYMENT, d)).toEqual({ health: 'failed', why: 'ProgressDeadlineExceeded' });
  });

  it('is progressing while replicas are being updated or old ones remain', () => {
    expect(resourceHealth(DEPLOYMENT, deployment({ updatedReplicas: 1 }))?.health).toBe('progressing');
    expect(resourceHealth(DEPLOYMENT, deployment({ replicas: 3 }))?.health).toBe('progressing');
  });

  it('takes spec.replicas default 1 as desired', () => {
    const d = obj({
      spec: {},
      status: {
        observedGeneration: 2,
        replicas: 1,
        updatedReplicas: 1,
        conditions: [{ type: 'Available', status: 'True' }],
      },
    });
    expect(resourceHealth(DEPLOYMENT, d)).toEqual({ health: 'ok' });
  });

  it('reads a missing or malformed status as not yet observed, never throwing', () => {
    expect(resourceHealth(DEPLOYMENT, obj({}))?.health).toBe('progressing');
    expect(resourceHealth(DEPLOYMENT, obj({ status: 'x' }))?.health).toBe('progressing');
    expect(resourceHealth(DEPLOYMENT, obj({ status: { observedGeneration: 5, conditions: 'x' } }))?.health).toBe(
      'failed',
    );
  });
});

describe('resourceHealth: StatefulSet, DaemonSet, Job', () => {
  const sts = (status: Record<string, unknown>) =>
    obj({
      spec: { replicas: 3 },
      status: { observedGeneration: 2, readyReplicas: 3, currentRevision: 'r1', updateRevision: 'r1', ...status },
    });

  it('StatefulSet: ok when every replica is ready and the revisions match', () => {
    expect(resourceHealth(STATEFUL_SET, sts({}))).toEqual({ health: 'ok' });
  });

  it('StatefulSet: progressing during a revision change, failed when replicas are not ready after it', () => {
    expect(resourceHealth(STATEFUL_SET, sts({ updateRevision: 'r2', readyReplicas: 1 }))?.health).toBe('progressing');
    expect(resourceHealth(STATEFUL_SET, sts({ readyReplicas: 2 }))).toEqual({
      health: 'failed',
      why: '2/3 replicas ready',
    });
  });

  const ds = (status: Record<string, unknown>) =>
    obj({
      status: {
        observedGeneration: 2,
        desiredNumberScheduled: 4,
        updatedNumberScheduled: 4,
        numberUnavailable: 0,
        ...status,
      },
    });

  it('DaemonSet: ok when none unavailable and all updated', () => {
    expect(resourceHealth(DAEMON_SET, ds({}))).toEqual({ health: 'ok' });
    expect(resourceHealth(DAEMON_SET, ds({ numberUnavailable: undefined }))).toEqual({ health: 'ok' });
  });

  it('DaemonSet: failed with unavailable pods, progressing while not all updated', () => {
    expect(resourceHealth(DAEMON_SET, ds({ numberUnavailable: 1 }))).toEqual({
      health: 'failed',
      why: '1/4 pods unavailable',
    });
    expect(resourceHealth(DAEMON_SET, ds({ updatedNumberScheduled: 3 }))?.health).toBe('progressing');
  });

  it('Job: Complete is ok, Failed is failed, anything else progressing', () => {
    expect(resourceHealth(JOB, obj({ status: { conditions: [{ type: 'Complete', status: 'True' }] } }))).toEqual({
      health: 'ok',
    });
    expect(
      resourceHealth(
        JOB,
        obj({ status: { conditions: [{ type: 'Failed', status: 'True', reason: 'BackoffLimitExceeded' }] } }),
      ),
    ).toEqual({ health: 'failed', why: 'Failed (BackoffLimitExceeded)' });
    expect(resourceHealth(JOB, obj({ status: { active: 1 } }))?.health).toBe('progressing');
  });

  it('judges only the four kinds', () => {
    expect(resourceHealth({ group: '', kind: 'ConfigMap' }, obj({}))).toBeUndefined();
    expect(resourceHealth({ group: 'extensions', kind: 'Deployment' }, obj({}))).toBeUndefined();
    expect(isHealthKind(DEPLOYMENT)).toBe(true);
    expect(isHealthKind(JOB)).toBe(true);
    expect(isHealthKind({ group: '', kind: 'Service' })).toBe(false);
  });
});

describe('appHealth', () => {
  const r = (name: string, health: 'failed' | 'progressing', kind = 'Deployment'): UnhealthyResource => ({
    kind,
    namespace: 'default',
    name,
    health,
    why: health,
  });

  it('is True (Healthy) with nothing unhealthy: an App that deployed no judged kind too', () => {
    expect(appHealth([])).toEqual({ status: 'True', reason: 'Healthy', unhealthy: [] });
  });

  it('is False when one failed, failed ones named first', () => {
    const h = appHealth([r('b', 'progressing'), r('c', 'failed'), r('a', 'progressing')]);
    expect(h.status).toBe('False');
    expect(h.reason).toBe('Unhealthy');
    expect(h.unhealthy.map((u) => u.name)).toEqual(['c', 'a', 'b']);
  });

  it('is Unknown (Progressing) when some progress and none failed', () => {
    expect(appHealth([r('a', 'progressing', 'Job')])).toMatchObject({ status: 'Unknown', reason: 'Progressing' });
  });

  it(`names at most ${MAX_UNHEALTHY_NAMED}`, () => {
    const many = Array.from({ length: 9 }, (_, i) => r(`d${i}`, 'failed'));
    expect(appHealth(many).unhealthy).toHaveLength(MAX_UNHEALTHY_NAMED);
  });
});

describe('HealthIndex', () => {
  const bad = { health: 'failed', why: 'Available=False' } as const;

  it('keeps only workloads that are not ok, per label, and says which labels changed', () => {
    const ix = new HealthIndex();
    expect(ix.set('42', DEPLOYMENT, obj({ name: 'a' }), { health: 'ok' })).toEqual([]);
    expect(ix.size).toBe(0);
    expect(ix.set('42', DEPLOYMENT, obj({ name: 'a' }), bad)).toEqual(['42']);
    expect(ix.set('42', DEPLOYMENT, obj({ name: 'a' }), bad)).toEqual([]); // unchanged
    expect(ix.notOk('42')).toEqual([
      { kind: 'Deployment', namespace: 'default', name: 'a', health: 'failed', why: 'Available=False' },
    ]);
    expect(ix.set('42', DEPLOYMENT, obj({ name: 'a' }), { health: 'ok' })).toEqual(['42']);
    expect(ix.size).toBe(0);
  });

  it('moves a relabelled object and forgets a deleted one', () => {
    const ix = new HealthIndex();
    ix.set('42', DEPLOYMENT, obj({ name: 'a' }), bad);
    expect(ix.set('43', DEPLOYMENT, obj({ name: 'a' }), bad).sort()).toEqual(['42', '43']);
    expect(ix.notOk('42')).toEqual([]);
    expect(ix.delete(DEPLOYMENT, 'default', 'a')).toEqual(['43']);
    expect(ix.delete(DEPLOYMENT, 'default', 'a')).toEqual([]);
  });

  it('filters by the App deploy namespaces', () => {
    const ix = new HealthIndex();
    ix.set('42', DEPLOYMENT, obj({ name: 'a', ns: 'mine' }), bad);
    ix.set('42', DEPLOYMENT, obj({ name: 'b', ns: 'theirs' }), bad);
    expect(ix.notOk('42', ['mine']).map((u) => u.name)).toEqual(['a']);
    expect(ix.notOk('42').length).toBe(2);
  });

  it('sweeps what a relist of one kind and scope did not return', () => {
    const ix = new HealthIndex();
    ix.set('42', DEPLOYMENT, obj({ name: 'a', ns: 'n1' }), bad);
    ix.set('42', DEPLOYMENT, obj({ name: 'b', ns: 'n2' }), bad);
    ix.set('42', JOB, obj({ name: 'j', ns: 'n1' }), { health: 'progressing', why: 'x' });
    const seen = new Set([HealthIndex.keyOf(DEPLOYMENT, obj({ name: 'a', ns: 'n1' }))]);
    expect(ix.sweep(DEPLOYMENT, 'n2', seen)).toEqual(['42']);
    expect(
      ix
        .notOk('42')
        .map((u) => u.name)
        .sort(),
    ).toEqual(['a', 'j']);
    expect(ix.sweep(DEPLOYMENT, undefined, new Set())).toEqual(['42']);
    expect(ix.notOk('42').map((u) => u.name)).toEqual(['j']);
  });
});
