/**
 * The record check before a PackageRepository's kapp run (`functions/lib/deploy/kapp-record.ts`):
 * a planted record with a selector of its own, and the copy of another kapp app's value, with
 * the hostile shapes an attacker would try; the controls show kapp's own records pass.
 */
import { describe, expect, it } from 'vitest';
import { KAPP_IS_APP_LABEL_KEY, plantedKappRecord } from '../../functions/lib/deploy/kapp-record.js';
import { KubeApiError } from '../../functions/lib/kube/port.js';
import { FakeCluster } from './support/fake-cluster.js';

const OURS = '1700000000000000001';
const VICTIM = '1600000000000000002';
const APPS = ['repo.pkgr', 'repo-ctrl'];

/** A kapp app record ConfigMap (`kapp.k14s.io/is-app` label unless `labelled` is false). */
function record(c: FakeCluster, ns: string, name: string, spec: string, labelled = true) {
  c.configMaps.set(`${ns}/${name}`, {
    metadata: {
      name,
      namespace: ns,
      uid: `uid-${ns}-${name}`,
      resourceVersion: '1',
      ...(labelled ? { labels: { [KAPP_IS_APP_LABEL_KEY]: '' } } : {}),
    },
    data: { spec },
    binaryData: {},
  });
}

const spec = (value: string) => JSON.stringify({ labelKey: 'kapp.k14s.io/app', labelValue: value, usedGKs: [] });

/** A cluster with the victim app's own record (`team-b/web.app.apps.k14s.io`). */
function withVictim(): FakeCluster {
  const c = new FakeCluster();
  record(c, 'team-b', 'web.app.apps.k14s.io', spec(VICTIM));
  return c;
}

const copied = (ours: string, theirs: string, value = VICTIM) =>
  `kapp app record ConfigMap ns/${ours} shares its label kapp.k14s.io/app=${value} with the kapp app record ConfigMap ${theirs}: kapp would act on that app's resources too; delete the ConfigMap that was copied`;

describe('plantedKappRecord: a record copying another kapp app', () => {
  it.each([
    ['the --app record (migrated name)', 'repo.pkgr.apps.k14s.io'],
    ['the --app record (old name)', 'repo.pkgr'],
    ['the --prev-app record (kapp would rename it to the --app one)', 'repo-ctrl'],
  ])('refuses %s holding another app record value, naming both', async (_what, name) => {
    const c = withVictim();
    record(c, 'ns', name, spec(VICTIM));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(copied(name, 'team-b/web.app.apps.k14s.io'));
  });

  it('refuses the copy whatever the other record is named or wherever it is (same namespace, any name)', async () => {
    const c = new FakeCluster();
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(VICTIM));
    record(c, 'ns', 'kapp-controller-legacy', spec(VICTIM));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(copied('repo.pkgr.apps.k14s.io', 'ns/kapp-controller-legacy'));
  });

  it("the repository's own record names are its own only in its namespace: the same name elsewhere is another app", async () => {
    const c = new FakeCluster();
    record(c, 'other', 'repo.pkgr.apps.k14s.io', spec(VICTIM));
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(VICTIM));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(
      copied('repo.pkgr.apps.k14s.io', 'other/repo.pkgr.apps.k14s.io'),
    );
  });

  it.each([
    ['a case-folded key Go reads as labelValue', { labelKey: 'kapp.k14s.io/app', LABELVALUE: VICTIM }],
    [
      'a duplicate folded key after the exact one',
      { labelKey: 'kapp.k14s.io/app', labelValue: '5', LabelValue: VICTIM },
    ],
    ['another labelKey (the value is still the one kapp selects on)', { labelKey: 'app', labelValue: VICTIM }],
  ])('finds the value in the other record under %s', async (_what, other) => {
    const c = new FakeCluster();
    record(c, 'team-b', 'web.app', JSON.stringify(other));
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(VICTIM));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(copied('repo.pkgr.apps.k14s.io', 'team-b/web.app'));
  });

  it('checks every present record: a legit --app record does not hide a copying --prev-app record', async () => {
    const c = withVictim();
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(OURS));
    record(c, 'ns', 'repo-ctrl', spec(VICTIM));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(copied('repo-ctrl', 'team-b/web.app.apps.k14s.io'));
  });

  it('lists the records cluster-wide by kapp label, once, and only when the repository has a record', async () => {
    const none = withVictim();
    expect(await plantedKappRecord(none, 'ns', APPS)).toBeUndefined();
    expect(none.calls.filter((call) => call[0] === 'listConfigMaps')).toEqual([]);
    const one = withVictim();
    record(one, 'ns', 'repo.pkgr.apps.k14s.io', spec(OURS));
    expect(await plantedKappRecord(one, 'ns', APPS)).toBeUndefined();
    expect(one.calls.filter((call) => call[0] === 'listConfigMaps')).toEqual([
      ['listConfigMaps', KAPP_IS_APP_LABEL_KEY],
    ]);
  });

  it('holds none of the listed records that hold no value of its own (any tenant may label 1 MiB ConfigMaps as records)', async () => {
    const c = withVictim();
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(OURS));
    for (let i = 0; i < 20; i++) {
      const big = JSON.stringify({ labelKey: 'kapp.k14s.io/app', labelValue: `${i}`, pad: 'x'.repeat(1024 * 1024) });
      record(c, 'team-c', `filler-${i}.apps.k14s.io`, big);
    }
    const list = c.listConfigMaps.bind(c);
    let held = 0;
    c.listConfigMaps = async (selector, keep) => {
      const kept = await list(selector, keep);
      held += kept.reduce((n, cm) => n + (cm.data.spec?.length ?? 0), 0);
      return kept;
    };
    expect(await plantedKappRecord(c, 'ns', APPS)).toBeUndefined();
    expect(held).toBeLessThan(1024);
    // The copy is still found.
    record(c, 'team-c', 'copy.apps.k14s.io', JSON.stringify({ labelValue: OURS, pad: 'x'.repeat(1024 * 1024) }));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(
      copied('repo.pkgr.apps.k14s.io', 'team-c/copy.apps.k14s.io', OURS),
    );
  });

  it('a selector of its own is refused before any list (the existing check)', async () => {
    const c = withVictim();
    record(c, 'ns', 'repo.pkgr', '{"labelKey":"app","labelValue":"nginx"}');
    expect(await plantedKappRecord(c, 'ns', APPS)).toContain('was not written by kapp');
    expect(c.calls.filter((call) => call[0] === 'listConfigMaps')).toEqual([]);
  });

  it('a list the API server refuses fails the check (an infrastructure error, never a pass)', async () => {
    const c = withVictim();
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(OURS));
    c.listConfigMaps = async () => {
      throw new KubeApiError('listing configmaps: forbidden', { statusCode: 403 });
    };
    await expect(plantedKappRecord(c, 'ns', APPS)).rejects.toThrow('listing configmaps: forbidden');
  });
});

describe('plantedKappRecord: a record sending kapp to other namespaces (lastChange.namespaces)', () => {
  it.each([
    ['another namespace', { namespaces: ['ns', 'team-b'] }, '"team-b"'],
    ['cluster scope', { namespaces: ['(cluster)'] }, '"(cluster)"'],
    ['a key Go folds onto it', { NameSpaces: ['team-b'] }, '"team-b"'],
    ['a value that is not a list', { namespaces: 'team-b' }, '"team-b"'],
  ])('refuses one naming %s', async (_what, lastChange, named) => {
    const c = new FakeCluster();
    record(c, 'ns', 'repo.pkgr', JSON.stringify({ labelKey: 'kapp.k14s.io/app', labelValue: OURS, lastChange }));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBe(
      `kapp app record ConfigMap ns/repo.pkgr was not written by kapp (its lastChange.namespaces names ${named}): kapp would act on its selector with the controller's identity; delete the ConfigMap`,
    );
  });

  it('refuses it under a folded lastChange key too', async () => {
    const c = new FakeCluster();
    const spec = { labelKey: 'kapp.k14s.io/app', labelValue: OURS, LASTCHANGE: { namespaces: ['x'] } };
    record(c, 'ns', 'repo-ctrl', JSON.stringify(spec));
    expect(await plantedKappRecord(c, 'ns', APPS)).toContain('its lastChange.namespaces names "x"');
  });

  it("passes kapp's own record of a repository (its namespace only)", async () => {
    const c = new FakeCluster();
    const spec = {
      labelKey: 'kapp.k14s.io/app',
      labelValue: OURS,
      lastChange: { successful: true, namespaces: ['ns'] },
      usedGKs: [],
    };
    record(c, 'ns', 'repo.pkgr', JSON.stringify(spec));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBeUndefined();
  });
});

describe('plantedKappRecord: records kapp writes pass (controls)', () => {
  it("the --app and --prev-app records may share a value (kapp's rename of the legacy record)", async () => {
    const c = withVictim();
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(OURS));
    record(c, 'ns', 'repo-ctrl', spec(OURS));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBeUndefined();
  });

  it.each([
    ['a value that only starts with ours', 'team-b', 'x.app', spec(`${VICTIM}0`)],
    [
      'the value as a JSON number (Go cannot read it into the string field)',
      'team-b',
      'x.app',
      `{"labelValue":${VICTIM}}`,
    ],
    ['a spec that is not JSON', 'team-b', 'x.app', `labelValue: "${VICTIM}"`],
    ['a change record (not an app record)', 'team-b', 'web.app-change-1', spec(VICTIM)],
  ])('ignores %s', async (_what, ns, name, other) => {
    const c = new FakeCluster();
    record(c, ns, name, other, !name.includes('change'));
    record(c, 'ns', 'repo.pkgr.apps.k14s.io', spec(VICTIM));
    expect(await plantedKappRecord(c, 'ns', APPS)).toBeUndefined();
  });
});
