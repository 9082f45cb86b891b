/**
 * The check that the admission policy bounding `kapp-lambda-pkgr` is installed and enforced
 * (`functions/lib/deploy/pkgr-admission.ts`), over the fake cluster: every way the policy or its
 * binding can be missing or not enforcing, and the per-cluster cache of the answer.
 */
import { describe, expect, it } from 'vitest';
import { PkgrAdmissionCache, pkgrAdmissionProblem } from '../../functions/lib/deploy/pkgr-admission.js';
import { KubeApiError, type KubeObject } from '../../functions/lib/kube/port.js';
import { FakeCluster, PKGR_ADMISSION_OBJECTS } from './support/fake-cluster.js';

const [POLICY, BINDING] = PKGR_ADMISSION_OBJECTS;

/** A fake cluster whose policy and binding carry `policy` / `binding` as their spec. */
function clusterWith(spec: { policy?: object | null; binding?: object | null }): FakeCluster {
  const c = new FakeCluster();
  for (const [base, s] of [
    [POLICY, spec.policy],
    [BINDING, spec.binding],
  ] as const) {
    if (s === null) c.admission.delete(base.kind);
    else if (s !== undefined)
      c.admission.set(base.kind, { ...structuredClone(base), spec: s } as unknown as KubeObject);
  }
  return c;
}

/** What the check says is wrong, without the fixed text around it. */
async function problemOf(c: FakeCluster): Promise<string | undefined> {
  const p = await pkgrAdmissionProblem(c);
  return p
    ?.replace(/^kapp-lambda-pkgr, the identity a PackageRepository's kapp runs as, is not bounded: /, '')
    .split('; kapp does not run for PackageRepositories until')[0];
}

describe('pkgrAdmissionProblem', () => {
  it('none when the policy fails closed and its binding denies (the release; matchResources {} selects all)', async () => {
    expect(await problemOf(clusterWith({}))).toBeUndefined();
    expect(await problemOf(clusterWith({ policy: {} }))).toBeUndefined(); // failurePolicy defaults to Fail
    const all = { namespaceSelector: {}, objectSelector: {}, matchPolicy: 'Equivalent' };
    expect(
      await problemOf(
        clusterWith({
          binding: { policyName: 'kapp-lambda-pkgr', validationActions: ['Audit', 'Deny'], matchResources: all },
        }),
      ),
    ).toBeUndefined();
  });

  it.each<[string, { policy?: object | null; binding?: object | null }, string]>([
    ['policy missing', { policy: null }, 'ValidatingAdmissionPolicy kapp-lambda-pkgr not found'],
    ['binding missing', { binding: null }, 'ValidatingAdmissionPolicyBinding kapp-lambda-pkgr not found'],
    [
      'both missing (a cluster older than 1.30 answers 404 too)',
      { policy: null, binding: null },
      'ValidatingAdmissionPolicy kapp-lambda-pkgr not found; ValidatingAdmissionPolicyBinding kapp-lambda-pkgr not found',
    ],
    [
      'binding Warn only',
      { binding: { policyName: 'kapp-lambda-pkgr', validationActions: ['Warn'] } },
      'ValidatingAdmissionPolicyBinding kapp-lambda-pkgr does not deny (validationActions ["Warn"])',
    ],
    [
      'binding without validationActions',
      { binding: { policyName: 'kapp-lambda-pkgr' } },
      'ValidatingAdmissionPolicyBinding kapp-lambda-pkgr does not deny (validationActions [])',
    ],
    [
      'binding naming another policy (ours unbound)',
      { binding: { policyName: 'something-else', validationActions: ['Deny'] } },
      "ValidatingAdmissionPolicyBinding kapp-lambda-pkgr binds policy 'something-else'",
    ],
    [
      'binding narrowed to some namespaces',
      {
        binding: {
          policyName: 'kapp-lambda-pkgr',
          validationActions: ['Deny'],
          matchResources: { namespaceSelector: { matchLabels: { nothing: 'here' } } },
        },
      },
      'ValidatingAdmissionPolicyBinding kapp-lambda-pkgr narrows what it validates (spec.matchResources)',
    ],
    [
      'binding excluding ConfigMaps',
      {
        binding: {
          policyName: 'kapp-lambda-pkgr',
          validationActions: ['Deny'],
          matchResources: { excludeResourceRules: [{ apiGroups: [''], resources: ['configmaps'] }] },
        },
      },
      'ValidatingAdmissionPolicyBinding kapp-lambda-pkgr narrows what it validates (spec.matchResources)',
    ],
    [
      'policy failing open',
      { policy: { failurePolicy: 'Ignore' } },
      'ValidatingAdmissionPolicy kapp-lambda-pkgr does not fail closed (failurePolicy Ignore)',
    ],
  ])('%s: refused, saying what', async (_name, spec, what) => {
    expect(await problemOf(clusterWith(spec))).toBe(what);
  });

  it('says how to install both', async () => {
    expect(await pkgrAdmissionProblem(clusterWith({ policy: null }))).toMatch(
      /until the ValidatingAdmissionPolicy kapp-lambda-pkgr \(failurePolicy Fail\) and its ValidatingAdmissionPolicyBinding kapp-lambda-pkgr \(validationActions \[Deny\]\) are installed: apply the kapp-lambda release manifest \(release\/kapp-lambda-<version>\.yml/,
    );
  });

  it('a role that may not read them (403) refuses, naming the missing grant; other errors are thrown', async () => {
    const c = new FakeCluster();
    const get = c.getObject.bind(c);
    c.getObject = async (ref) => {
      if (ref.kind === 'ValidatingAdmissionPolicyBinding') throw new KubeApiError('forbidden', { statusCode: 403 });
      return await get(ref);
    };
    expect(await problemOf(c)).toBe(
      'ValidatingAdmissionPolicyBinding kapp-lambda-pkgr cannot be read by this runtime (403: its role lacks get on validatingadmissionpolicybindings)',
    );
    c.getObject = async () => {
      throw new KubeApiError('etcd timeout', { statusCode: 500 });
    };
    await expect(pkgrAdmissionProblem(c)).rejects.toThrow('etcd timeout');
  });
});

describe('PkgrAdmissionCache', () => {
  it('keeps each cluster answer for its TTL (either way), then reads again; a failed read is not kept', async () => {
    let now = 0;
    const cache = new PkgrAdmissionCache({ ttlMs: 10_000, now: () => now });
    const a = new FakeCluster();
    const b = clusterWith({ policy: null });
    const reads = (c: FakeCluster) => c.calls.filter((x) => x[0] === 'get').length;
    expect(await cache.check('a', a)).toBeUndefined();
    expect(await cache.check('b', b)).toMatch(/not found/);
    a.admission.delete('ValidatingAdmissionPolicy');
    now = 9_999;
    expect(await cache.check('a', a)).toBeUndefined();
    expect(await cache.check('b', b)).toMatch(/not found/);
    expect([reads(a), reads(b)]).toEqual([2, 2]);
    now = 10_000;
    expect(await cache.check('a', a)).toMatch(/ValidatingAdmissionPolicy kapp-lambda-pkgr not found/);
    expect(reads(a)).toBe(4);
    // Concurrent checks share a read; a read that throws is tried again next time.
    now = 20_000;
    const get = a.getObject.bind(a);
    let fail = true;
    a.getObject = async (ref) => {
      if (fail) throw new KubeApiError('unavailable', { statusCode: 503 });
      return await get(ref);
    };
    await expect(Promise.all([cache.check('a', a), cache.check('a', a)])).rejects.toThrow('unavailable');
    fail = false;
    expect(await cache.check('a', a)).toMatch(/not found/);
  });
});
