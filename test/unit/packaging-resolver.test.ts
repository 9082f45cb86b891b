/**
 * The package resolver (functions/lib/packaging/resolver.ts) over a fake Kubernetes port: the
 * global-namespace rules of upstream's aggregated API (reference §3.13; upstream tests
 * `package_test.go`, `packagemetadata_test.go`, `Test_PackageReposWithOverlappingPackages_localAndGlobalNS`).
 */
import { describe, expect, it } from 'vitest';
import { Annotation, DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../../functions/lib/api/constants.js';
import { packageObjectName } from '../../functions/lib/api/datapackaging.js';
import { PackageMetadataResource, PackageResource } from '../../functions/lib/api/resources.js';
import {
  KubeApiError,
  type KubeNamespace,
  type KubeObject,
  type ListOptions,
  type ListResult,
  type ResourceKind,
  type ResourceRef,
} from '../../functions/lib/kube/port.js';
import { type GlobalTrust, globalTrustOf } from '../../functions/lib/packaging/global-trust.js';
import {
  getPackage,
  getPackageMetadata,
  listPackageMetadatas,
  listPackages,
  type PackagingReader,
  versionsOf,
  visibleGlobalNamespace,
} from '../../functions/lib/packaging/resolver.js';

const GLOBAL = DEFAULT_PACKAGING_GLOBAL_NAMESPACE;

function pkg(namespace: string, refName: string, version: string, note = namespace): KubeObject {
  return {
    apiVersion: PackageResource.apiVersion,
    kind: PackageResource.kind,
    metadata: {
      name: packageObjectName(refName, version),
      namespace,
      uid: `${namespace}-${version}`,
      resourceVersion: '1',
    },
    spec: { refName, version, releaseNotes: note },
  };
}

function pkgm(namespace: string, name: string, note = namespace): KubeObject {
  return {
    apiVersion: PackageMetadataResource.apiVersion,
    kind: PackageMetadataResource.kind,
    metadata: { name, namespace, uid: `${namespace}-${name}`, resourceVersion: '1' },
    spec: { displayName: note },
  };
}

/** A fake cluster: namespaces (with annotations) and objects; lists page 2 items at a time. */
class FakeKube implements PackagingReader {
  readonly lists: string[] = [];
  constructor(
    readonly namespaces: Record<string, Record<string, string>>,
    readonly objects: KubeObject[],
    readonly namespaceError?: Error,
  ) {}
  async getNamespace(name: string): Promise<KubeNamespace | undefined> {
    if (this.namespaceError) throw this.namespaceError;
    const annotations = this.namespaces[name];
    if (!annotations) return undefined;
    return { metadata: { name, uid: name, resourceVersion: '1', annotations }, phase: 'Active' };
  }
  async getObject<T extends KubeObject = KubeObject>(ref: ResourceRef): Promise<T | undefined> {
    const found = this.objects.find(
      (o) => o.kind === ref.kind && o.metadata.namespace === ref.namespace && o.metadata.name === ref.name,
    );
    return found ? (structuredClone(found) as T) : undefined;
  }
  async list<T extends KubeObject = KubeObject>(kind: ResourceKind, options: ListOptions): Promise<ListResult<T>> {
    this.lists.push(`${kind.kind} ${options.namespace}`);
    const all = this.objects.filter((o) => o.kind === kind.kind && o.metadata.namespace === options.namespace);
    const start = Number(options.continue ?? '0');
    const end = start + 2;
    return {
      items: structuredClone(all.slice(start, end)) as T[],
      resourceVersion: '9',
      continue: end < all.length ? String(end) : undefined,
    };
  }
}

const namespaces = { ns: {}, excluded: { [Annotation.ExcludeGlobalPackages]: '' }, [GLOBAL]: {}, other: {} };

/** [namespace, releaseNotes] of each listed Package, keyed by its identity. */
const seen = (
  pkgs: Array<{
    metadata: { namespace?: string };
    spec: { refName?: string; version?: string; releaseNotes?: string };
  }>,
) => pkgs.map((p) => `${p.spec.refName}.${p.spec.version} in ${p.metadata.namespace} from ${p.spec.releaseNotes}`);

describe('listPackages: which Packages namespace N sees', () => {
  const objects = [
    pkg(GLOBAL, 'a.test.carvel.dev', '1.0.0'),
    pkg(GLOBAL, 'a.test.carvel.dev', '2.0.0+build.1'),
    pkg(GLOBAL, 'b.test.carvel.dev', '1.0.0'),
    pkg('ns', 'a.test.carvel.dev', '2.0.0+build.1'),
    pkg('ns', 'c.test.carvel.dev', '1.0.0'),
    pkg('excluded', 'c.test.carvel.dev', '1.0.0'),
  ];

  it.each<[string, string, string[]]>([
    [
      'local overrides global with the same refName.version, in place; global ones are presented in N',
      'ns',
      [
        'a.test.carvel.dev.1.0.0 in ns from kapp-controller-packaging-global',
        'a.test.carvel.dev.2.0.0+build.1 in ns from ns',
        'b.test.carvel.dev.1.0.0 in ns from kapp-controller-packaging-global',
        'c.test.carvel.dev.1.0.0 in ns from ns',
      ],
    ],
    [
      'global only: a namespace without packages sees the global ones',
      'other',
      [
        'a.test.carvel.dev.1.0.0 in other from kapp-controller-packaging-global',
        'a.test.carvel.dev.2.0.0+build.1 in other from kapp-controller-packaging-global',
        'b.test.carvel.dev.1.0.0 in other from kapp-controller-packaging-global',
      ],
    ],
    ['excluded namespace: local only', 'excluded', ['c.test.carvel.dev.1.0.0 in excluded from excluded']],
    [
      'the global namespace itself: its own packages, once',
      GLOBAL,
      [
        'a.test.carvel.dev.1.0.0 in kapp-controller-packaging-global from kapp-controller-packaging-global',
        'a.test.carvel.dev.2.0.0+build.1 in kapp-controller-packaging-global from kapp-controller-packaging-global',
        'b.test.carvel.dev.1.0.0 in kapp-controller-packaging-global from kapp-controller-packaging-global',
      ],
    ],
    ['a namespace that does not exist: no global packages', 'missing', []],
  ])('%s', async (_case, namespace, expected) => {
    expect(seen(await listPackages(new FakeKube(namespaces, objects), namespace))).toEqual(expected);
  });

  it('local only: with nothing global, the local packages', async () => {
    const kube = new FakeKube(namespaces, [pkg('ns', 'c.test.carvel.dev', '1.0.0')]);
    expect(seen(await listPackages(kube, 'ns'))).toEqual(['c.test.carvel.dev.1.0.0 in ns from ns']);
  });

  it('refName filters after the merge', async () => {
    const kube = new FakeKube(namespaces, objects);
    expect(seen(await listPackages(kube, 'ns', { refName: 'a.test.carvel.dev' }))).toEqual([
      'a.test.carvel.dev.1.0.0 in ns from kapp-controller-packaging-global',
      'a.test.carvel.dev.2.0.0+build.1 in ns from ns',
    ]);
    expect(kube.lists).toEqual([`Package ${GLOBAL}`, `Package ${GLOBAL}`, 'Package ns']);
  });

  it('the global namespace is configurable', async () => {
    const kube = new FakeKube(namespaces, objects);
    expect(seen(await listPackages(kube, 'other', { globalNamespace: 'excluded' }))).toEqual([
      'c.test.carvel.dev.1.0.0 in other from excluded',
    ]);
  });

  it('does not change the objects it read', async () => {
    const kube = new FakeKube(namespaces, objects);
    await listPackages(kube, 'other');
    expect(kube.objects[0]?.metadata.namespace).toBe(GLOBAL);
  });

  it('a failing namespace read is thrown, not taken as "no global packages"', async () => {
    const error = new KubeApiError('getting Namespace ns: 500 boom', { statusCode: 500 });
    await expect(listPackages(new FakeKube(namespaces, objects, error), 'ns')).rejects.toBe(error);
  });

  it('versionsOf: the exact versions of one refName, + kept', async () => {
    expect(await versionsOf(new FakeKube(namespaces, objects), 'ns', 'a.test.carvel.dev')).toEqual([
      '1.0.0',
      '2.0.0+build.1',
    ]);
    expect(await versionsOf(new FakeKube(namespaces, objects), 'excluded', 'a.test.carvel.dev')).toEqual([]);
  });
});

describe('getPackage', () => {
  const objects = [
    pkg(GLOBAL, 'a.test.carvel.dev', '1.0.0'),
    pkg(GLOBAL, 'a.test.carvel.dev', '2.0.0+build.1'),
    pkg('ns', 'a.test.carvel.dev', '2.0.0+build.1'),
    pkg('excluded', 'c.test.carvel.dev', '1.0.0'),
  ];
  const get = (namespace: string, refName: string, version: string) =>
    getPackage(new FakeKube(namespaces, objects), namespace, refName, version).then((p) => (p ? seen([p]) : []));

  it.each<[string, string, string, string, string[]]>([
    ['local', 'ns', 'a.test.carvel.dev', '2.0.0+build.1', ['a.test.carvel.dev.2.0.0+build.1 in ns from ns']],
    [
      'global, presented in N',
      'ns',
      'a.test.carvel.dev',
      '1.0.0',
      ['a.test.carvel.dev.1.0.0 in ns from kapp-controller-packaging-global'],
    ],
    ['excluded namespace: not the global one', 'excluded', 'a.test.carvel.dev', '1.0.0', []],
    [
      'excluded namespace: its own',
      'excluded',
      'c.test.carvel.dev',
      '1.0.0',
      ['c.test.carvel.dev.1.0.0 in excluded from excluded'],
    ],
    ['missing everywhere', 'ns', 'a.test.carvel.dev', '3.0.0', []],
    ['a version no name can hold', 'ns', 'a.test.carvel.dev', '1.0.0-RC1', []],
  ])('%s', async (_case, namespace, refName, version, expected) => {
    expect(await get(namespace, refName, version)).toEqual(expected);
  });
});

describe('PackageMetadata: identity is metadata.name', () => {
  const objects = [
    pkgm(GLOBAL, 'a.test.carvel.dev'),
    pkgm(GLOBAL, 'b.test.carvel.dev'),
    pkgm('ns', 'b.test.carvel.dev'),
    pkgm('ns', 'c.test.carvel.dev'),
  ];
  const names = (items: Array<{ metadata: { name?: string; namespace?: string }; spec: { displayName?: string } }>) =>
    items.map((m) => `${m.metadata.name} in ${m.metadata.namespace} from ${m.spec.displayName}`);

  it.each<[string, string[]]>([
    [
      'ns',
      [
        'a.test.carvel.dev in ns from kapp-controller-packaging-global',
        'b.test.carvel.dev in ns from ns',
        'c.test.carvel.dev in ns from ns',
      ],
    ],
    ['excluded', []],
    [GLOBAL, [`a.test.carvel.dev in ${GLOBAL} from ${GLOBAL}`, `b.test.carvel.dev in ${GLOBAL} from ${GLOBAL}`]],
  ])('listPackageMetadatas in %s', async (namespace, expected) => {
    expect(names(await listPackageMetadatas(new FakeKube(namespaces, objects), namespace))).toEqual(expected);
  });

  it('getPackageMetadata: local, else global in N', async () => {
    const kube = new FakeKube(namespaces, objects);
    expect(names([(await getPackageMetadata(kube, 'ns', 'b.test.carvel.dev'))!])).toEqual([
      'b.test.carvel.dev in ns from ns',
    ]);
    expect(names([(await getPackageMetadata(kube, 'other', 'a.test.carvel.dev'))!])).toEqual([
      `a.test.carvel.dev in other from ${GLOBAL}`,
    ]);
    expect(await getPackageMetadata(kube, 'excluded', 'a.test.carvel.dev')).toBeUndefined();
  });
});

describe('visibleGlobalNamespace', () => {
  it.each<[string, string | undefined]>([
    ['ns', GLOBAL],
    ['excluded', undefined],
    [GLOBAL, undefined],
    ['', undefined],
    ['missing', undefined],
  ])('%j → %j', async (namespace, expected) => {
    expect(await visibleGlobalNamespace(new FakeKube(namespaces, []), namespace)).toBe(expected);
  });
});

describe('the global namespace is trusted by its recorded uid, not its name (global-trust.ts)', () => {
  // The fake's namespaces have their name as uid.
  const objects = [pkg(GLOBAL, 'a.test.carvel.dev', '1.0.0'), pkg('ns', 'c.test.carvel.dev', '1.0.0')];

  it.each<[string, string | undefined, GlobalTrust]>([
    ['recorded and equal', 'uid-1', { trusted: true, recorded: true }],
    ['recorded in another case', 'UID-1', { trusted: true, recorded: true }],
    ['nothing recorded: trusted unchecked', undefined, { trusted: true, recorded: false }],
    [
      'recorded and different',
      'uid-0',
      {
        trusted: false,
        reason: `namespace ${GLOBAL} has uid uid-1, not the uid uid-0 recorded when kapp-lambda was installed (created by someone else, or deleted and created again)`,
      },
    ],
  ])('globalTrustOf: %s', (_case, recorded, expected) => {
    expect(globalTrustOf(GLOBAL, recorded, 'uid-1')).toEqual(expected);
  });

  it('globalTrustOf: a namespace that does not exist has nothing to trust', () => {
    expect(globalTrustOf(GLOBAL, 'uid-0', undefined)).toEqual({ trusted: true, recorded: true, absent: true });
  });

  it.each<[string, string | undefined, string[]]>([
    [
      'recorded uid equal: global and local',
      GLOBAL,
      [`a.test.carvel.dev.1.0.0 in ns from ${GLOBAL}`, 'c.test.carvel.dev.1.0.0 in ns from ns'],
    ],
    ['recorded uid different: local only', 'another-uid', ['c.test.carvel.dev.1.0.0 in ns from ns']],
    [
      'nothing recorded: global and local',
      undefined,
      [`a.test.carvel.dev.1.0.0 in ns from ${GLOBAL}`, 'c.test.carvel.dev.1.0.0 in ns from ns'],
    ],
  ])('listPackages: %s', async (_case, uid, expected) => {
    const options = uid === undefined ? {} : { globalNamespaceUid: uid };
    expect(seen(await listPackages(new FakeKube(namespaces, objects), 'ns', options))).toEqual(expected);
  });

  it('a recorded global namespace found absent is not listed: one a tenant creates between the check and the list provides nothing', async () => {
    // The check reads no global namespace; the list (moments later) finds a tenant's Packages in
    // one of that name, created meanwhile with a new uid.
    const { [GLOBAL]: _, ...withoutGlobal } = namespaces;
    const kube = new FakeKube(withoutGlobal, objects);
    expect(seen(await listPackages(kube, 'ns', { globalNamespaceUid: GLOBAL }))).toEqual([
      'c.test.carvel.dev.1.0.0 in ns from ns',
    ]);
    expect(await getPackage(kube, 'ns', 'a.test.carvel.dev', '1.0.0', { globalNamespaceUid: GLOBAL })).toBeUndefined();
    expect(kube.lists.filter((l) => l.endsWith(` ${GLOBAL}`))).toEqual([]);
  });

  it('getPackage and visibleGlobalNamespace: an untrusted global namespace provides nothing', async () => {
    const kube = new FakeKube(namespaces, objects);
    const untrusted = { globalNamespaceUid: 'another-uid' };
    expect(await getPackage(kube, 'ns', 'a.test.carvel.dev', '1.0.0', untrusted)).toBeUndefined();
    expect(await visibleGlobalNamespace(kube, 'ns', untrusted)).toBeUndefined();
    expect(await visibleGlobalNamespace(kube, 'ns', { globalNamespaceUid: GLOBAL })).toBe(GLOBAL);
  });
});
