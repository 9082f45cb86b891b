/**
 * e2e: the identity a PackageRepository's kapp runs as (issue 7), on the shared control plane
 * with the real tools. This file's runtime has its own runtime namespace (its
 * `controllerConfigNamespace`), where `infra/rbac/package-repository-kapp.yml` is applied with
 * this file's names, so the ServiceAccount `kapp-lambda-pkgr` there is the only identity its
 * repositories' kapp has: a repository reconciles, a version taken out is pruned and deleting it
 * removes its Packages; what that identity may do is asked of the API server (a
 * SubjectAccessReview per verb, `kubectl auth can-i --as`), and its admission policy is in force
 * before any repository (a ConfigMap that is no kapp record refused); a record planted to copy the
 * repository's kapp label value is refused; without the ServiceAccount a repository fails with
 * its name and kapp never runs.
 */
import { readFile } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { retargetPolicyNamespace } from '../../scripts/cluster-registry.js';
import { PKGR_KAPP_RBAC_FILE, REPO_ROOT } from '../../scripts/local-env.js';
import {
  expectRepoSucceeded,
  inlineRepositoryManifest,
  PKG,
  PKGR,
  packageDoc,
  packageMetadataDoc,
  packagesPaths,
  waitRepo,
  waitRepoGone,
} from './packaging-support.js';
import { apply, getObject, k, suffix, useE2ERuntime } from './support.js';

const id = suffix();
const RUNTIME_NS = `e2e-pkgr-rt-${id}`;
const NS = { tenant: `e2e-pkgr-id-${id}`, other: `e2e-pkgr-other-${id}` };
const SA_NAME = 'kapp-lambda-pkgr';
const ROLE = `kapp-lambda:pkgr-${id}`;
const REF_NAME = 'ident.corp.com';

/** Its admission policy and binding, named apart from the shared one (for kapp-lambda's). */
const POLICY = `kapp-lambda-pkgr-${id}`;

/**
 * `package-repository-kapp.yml` in {@link RUNTIME_NS}: its ClusterRole and binding named
 * {@link ROLE}, its admission policy and binding {@link POLICY}, matching the ServiceAccount of
 * {@link RUNTIME_NS}.
 */
async function pkgrKappRbac(): Promise<object[]> {
  const text = await readFile(`${REPO_ROOT}/${PKGR_KAPP_RBAC_FILE}`, 'utf8');
  return parseAllDocuments(text)
    .map((d) => d.toJS() as Record<string, Record<string, unknown> & { name: string; namespace?: string }>)
    .filter((o) => String(o.kind) !== 'Namespace')
    .map((o) => {
      if (o.metadata?.namespace) o.metadata.namespace = RUNTIME_NS;
      if (String(o.kind).startsWith('Cluster')) o.metadata!.name = ROLE;
      if (String(o.kind) === 'ClusterRoleBinding') o.roleRef!.name = ROLE;
      for (const s of (o.subjects ?? []) as unknown as { kind: string; namespace?: string }[]) {
        if (s.kind === 'ServiceAccount') s.namespace = RUNTIME_NS;
      }
      if (String(o.kind).startsWith('ValidatingAdmissionPolicy')) o.metadata!.name = POLICY;
      if (String(o.kind) === 'ValidatingAdmissionPolicy') retargetPolicyNamespace(o, 'kapp-lambda', RUNTIME_NS);
      if (String(o.kind) === 'ValidatingAdmissionPolicyBinding') o.spec!.policyName = POLICY;
      return o;
    });
}

/** An inline repository of {@link REF_NAME} with the given versions. */
function repository(ns: string, name: string, versions: string[]): object {
  const docs = [packageMetadataDoc(REF_NAME), ...versions.map((v) => packageDoc(REF_NAME, v))];
  return inlineRepositoryManifest(ns, name, packagesPaths(docs));
}

/** The Package object names of `ns`. */
async function packages(ns: string): Promise<string[]> {
  const out = (await k(['get', PKG, '-n', ns, '-o', 'name'])).stdout.trim();
  return out === '' ? [] : out.split('\n').sort();
}

/** `kubectl auth can-i <verb> <resource> -n <ns> --as` the runtime's kapp identity: `yes` or `no`. */
async function kappCan(verb: string, resource: string, ns: string, extra: string[] = []): Promise<string> {
  const r = await k(
    ['auth', 'can-i', verb, resource, '-n', ns, `--as=system:serviceaccount:${RUNTIME_NS}:${SA_NAME}`, ...extra],
    undefined,
    false,
  );
  return r.stdout.trim();
}

const rt = useE2ERuntime(Object.values(NS), {
  tenants: [RUNTIME_NS],
  overrides: { config: { controllerConfigNamespace: RUNTIME_NS } },
});

beforeAll(async () => {
  await apply(...(await pkgrKappRbac()));
  // The admission policy binds this runtime's kapp identity once the API server's informer has
  // it: wait (at most 30 s) until a ConfigMap that is no kapp record is refused to it
  // (impersonated, a server-side dry run), so every repository below meets it.
  for (const deadline = Date.now() + 30_000; ; ) {
    const probe = await k(
      [
        'create',
        'configmap',
        'probe',
        '-n',
        NS.tenant,
        '--dry-run=server',
        `--as=system:serviceaccount:${RUNTIME_NS}:${SA_NAME}`,
      ],
      undefined,
      false,
    );
    if (probe.code !== 0 && probe.stderr.includes("kapp-lambda-pkgr may only write kapp's records")) break;
    if (Date.now() > deadline) throw new Error(`admission policy ${POLICY} not enforced after 30 s: ${probe.stderr}`);
    await new Promise((done) => setTimeout(done, 250));
  }
});

afterAll(async () => {
  await k(['delete', 'clusterrolebinding,clusterrole', ROLE, '--ignore-not-found'], undefined, false);
  await k(
    ['delete', 'validatingadmissionpolicybinding,validatingadmissionpolicy', POLICY, '--ignore-not-found'],
    undefined,
    false,
  );
});

describe("PackageRepository: kapp as the runtime namespace's kapp-lambda-pkgr", () => {
  const name = `ident-${id}`;

  it('reconciles a repository (its Packages appear), then prunes a version taken out', async () => {
    await apply(repository(NS.tenant, name, ['1.0.0', '2.0.0']));
    expectRepoSucceeded(await waitRepo(rt, NS.tenant, name));
    expect(await packages(NS.tenant)).toEqual([
      `package.data.packaging.carvel.dev/${REF_NAME}.1.0.0`,
      `package.data.packaging.carvel.dev/${REF_NAME}.2.0.0`,
    ]);
    await apply(repository(NS.tenant, name, ['2.0.0']));
    const pruned = await waitRepo(rt, NS.tenant, name);
    expectRepoSucceeded(pruned);
    expect(pruned.metadata.generation).toBe(2);
    expect(await packages(NS.tenant)).toEqual([`package.data.packaging.carvel.dev/${REF_NAME}.2.0.0`]);
  });

  it('that identity may write Packages, PackageMetadatas and ConfigMaps, and nothing else the API server is asked about', async () => {
    for (const [verb, resource] of [
      ['create', 'packages.data.packaging.carvel.dev'],
      ['delete', 'packagemetadatas.data.packaging.carvel.dev'],
      ['update', 'configmaps'],
    ] as const) {
      expect(await kappCan(verb, resource, NS.tenant), `${verb} ${resource}`).toBe('yes');
    }
    for (const [verb, resource, extra] of [
      ['get', 'secrets', []],
      ['create', 'secrets', []],
      ['create', 'serviceaccounts', ['--subresource=token']],
      ['create', 'deployments.apps', []],
      ['create', 'clusterrolebindings.rbac.authorization.k8s.io', []],
      ['update', 'packagerepositories.packaging.carvel.dev', ['--subresource=status']],
      ['watch', 'packages.data.packaging.carvel.dev', []],
    ] as const) {
      expect(await kappCan(verb, resource, NS.tenant, [...extra]), `${verb} ${resource} ${extra.join(' ')}`).toBe('no');
    }
  });

  it("a repository whose planted record copies this repository's kapp label value is refused; the Packages stay", async () => {
    const record = await getObject<{ data: { spec: string } }>('configmap', NS.tenant, `${name}.pkgr`);
    const { labelKey, labelValue } = JSON.parse(record?.data.spec ?? '{}') as { labelKey: string; labelValue: string };
    expect(labelKey).toBe('kapp.k14s.io/app');
    const evil = `evil-${id}`;
    // Planted before the repository exists, labelled as kapp labels its records: the selector
    // copied, nothing else (a copied lastChange.namespaces naming the victim's namespace is
    // refused on its own).
    await apply({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: `${evil}.pkgr`, namespace: NS.other, labels: { 'kapp.k14s.io/is-app': '' } },
      data: { spec: JSON.stringify({ labelKey, labelValue }) },
    });
    try {
      await apply(repository(NS.other, evil, []));
      const refused = await waitRepo(rt, NS.other, evil);
      expect(refused.status?.usefulErrorMessage).toBe(
        `Deploying: kapp app record ConfigMap ${NS.other}/${evil}.pkgr shares its label kapp.k14s.io/app=${labelValue} with the kapp app record ConfigMap ${NS.tenant}/${name}.pkgr: kapp would act on that app's resources too; delete the ConfigMap that was copied`,
      );
      expect(refused.status?.deploy?.stdout ?? '').toBe('');
      expect(await packages(NS.tenant)).toEqual([`package.data.packaging.carvel.dev/${REF_NAME}.2.0.0`]);
    } finally {
      await k(['delete', 'configmap', `${evil}.pkgr`, '-n', NS.other]);
    }
  });

  it('deleting the repository removes its Packages, PackageMetadata and kapp record', async () => {
    await k(['delete', PKGR, name, '-n', NS.tenant, '--wait=false']);
    await waitRepoGone(NS.tenant, name);
    expect(
      (
        await k(['get', `${PKG},packagemetadatas.data.packaging.carvel.dev`, '-n', NS.tenant, '-o', 'name'])
      ).stdout.trim(),
    ).toBe('');
    expect(await getObject('configmap', NS.tenant, `${name}.pkgr`)).toBeUndefined();
  });

  it('without the ServiceAccount a repository fails naming it, and kapp never runs', async () => {
    await k(['delete', 'serviceaccount', SA_NAME, '-n', RUNTIME_NS]);
    const orphan = `orphan-${id}`;
    await apply(repository(NS.tenant, orphan, ['1.0.0']));
    const failed = await waitRepo(rt, NS.tenant, orphan);
    expect(failed.status?.usefulErrorMessage).toBe(
      `Deploying: Preparing kapp: Getting service account: serviceaccounts "${SA_NAME}" not found`,
    );
    expect(await packages(NS.tenant)).toEqual([]);
    expect(await getObject('configmap', NS.tenant, `${orphan}.pkgr`)).toBeUndefined();
    // With the ServiceAccount back, its deletion runs kapp delete and completes.
    await apply(...(await pkgrKappRbac()));
    await k(['delete', PKGR, orphan, '-n', NS.tenant, '--wait=false']);
    await waitRepoGone(NS.tenant, orphan);
  });
});
