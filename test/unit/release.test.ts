/**
 * The release manifest (`scripts/release.ts`, `release/kapp-lambda-<version>.yml`): the committed
 * file is what the sources give now, and it holds every object a cluster needs, with no
 * placeholder left to edit.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../../functions/lib/api/constants.js';
import { SERVICE_ACCOUNT_DIR } from '../../functions/lib/kube/kubeconfig-auth.js';
import { rbacManifests } from '../../scripts/cluster-registry.js';
import {
  DEFAULT_FORWARDER_IMAGE_REPOSITORY,
  FORWARDER_FLEET_CONFIGMAP,
  forwarderDocuments,
  KAPP_DELETE_STRATEGY,
  KEEP_ON_UNINSTALL_LABEL,
  KIND_ORDER,
  METRICS_SCRAPER_LABEL,
  PACKAGE_REF_NAME,
  packageDocument,
  packageFiles,
  packageVersion,
  RELEASE_DIR,
  type ReleaseDocument,
  RUNTIME_CACHE_DIR,
  RUNTIME_CAPABILITIES,
  RUNTIME_NAME,
  main as release,
  releaseDocuments,
  releaseFileName,
  releaseFiles,
  releaseHeader,
  renderManifest,
  runtimeBindings,
  runtimeReleaseDocuments,
  runtimeReleaseFileName,
  staleRelease,
} from '../../scripts/release.js';

const version = await packageVersion();
const committed = await readFile(path.join(RELEASE_DIR, releaseFileName(version)), 'utf8');
const docs = parseAllDocuments(committed).map((d) => d.toJS() as ReleaseDocument);
const rank = (kind: string) => KIND_ORDER.indexOf(kind);
const id = (d: ReleaseDocument) => `${d.kind}/${d.metadata.namespace ?? ''}/${d.metadata.name}`;

describe('release manifest', () => {
  it('the committed file is what npm run release generates now (regenerate: npm run release)', async () => {
    expect(committed).toBe(renderManifest(version, 'release', await releaseDocuments({ version })));
    expect(await staleRelease()).toBeUndefined();
  });

  it('opens with its version and how to apply it', () => {
    expect(committed.startsWith(releaseHeader(version))).toBe(true);
    expect(committed).toContain(`kubectl apply -f kapp-lambda-${version}.yml`);
  });

  it("the README's Install section names every object but the CRDs (those by kind), and each object's kind", async () => {
    const readme = await readFile(path.join(RELEASE_DIR, '..', 'README.md'), 'utf8');
    const install = readme.slice(
      readme.indexOf('\n## Install\n'),
      readme.indexOf('Another image repository or an IRSA role'),
    );
    // Markdown wraps lines: compare with every run of white space as one space.
    const text = install.replace(/\s+/g, ' ');
    const missing = docs
      .filter((d) => d.kind !== 'CustomResourceDefinition')
      .filter((d) => !text.includes(`\`${d.metadata.name}\``) || !text.toLowerCase().includes(d.kind.toLowerCase()))
      .map(id);
    expect(missing).toEqual([]);
  });

  it('holds every kind, the two namespaces and the five CRDs, namespaces and CRDs first', () => {
    const kinds = [...new Set(docs.map((d) => d.kind))];
    expect([...kinds].sort()).toEqual([
      'ClusterRole',
      'ClusterRoleBinding',
      'ConfigMap',
      'CustomResourceDefinition',
      'Deployment',
      'Namespace',
      'NetworkPolicy',
      'Role',
      'RoleBinding',
      'Service',
      'ServiceAccount',
      'ValidatingAdmissionPolicy',
      'ValidatingAdmissionPolicyBinding',
    ]);
    // In creation order, one run per kind, every kind ranked.
    expect(kinds).toEqual(KIND_ORDER.filter((k) => kinds.includes(k)));
    expect(docs.map((d) => d.kind)).toEqual(docs.map((d) => d.kind).sort((a, b) => rank(a) - rank(b)));
    // What an object lives in or refers to is created before it.
    const before: Array<[string, string]> = [
      ['Namespace', 'ServiceAccount'],
      ['CustomResourceDefinition', 'ClusterRole'],
      ['ServiceAccount', 'ClusterRoleBinding'],
      ['ConfigMap', 'Deployment'],
      ['ClusterRole', 'ClusterRoleBinding'],
      ['Role', 'RoleBinding'],
      ['ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding'],
      ['ServiceAccount', 'Deployment'],
    ];
    for (const [first, then] of before) expect(rank(first), `${first} before ${then}`).toBeLessThan(rank(then));
    expect(docs.slice(0, 7).map((d) => `${d.kind}/${d.metadata.name}`)).toEqual([
      `Namespace/${DEFAULT_PACKAGING_GLOBAL_NAMESPACE}`,
      'Namespace/kapp-lambda',
      'CustomResourceDefinition/apps.kappctrl.k14s.io',
      'CustomResourceDefinition/packageinstalls.packaging.carvel.dev',
      'CustomResourceDefinition/packagemetadatas.data.packaging.carvel.dev',
      'CustomResourceDefinition/packagerepositories.packaging.carvel.dev',
      'CustomResourceDefinition/packages.data.packaging.carvel.dev',
    ]);
    // Baseline: the in-cluster runtime runs as root so that its tools get uids of their own.
    expect(docs.find((d) => d.kind === 'Namespace' && d.metadata.name === 'kapp-lambda')?.metadata.labels).toEqual({
      'pod-security.kubernetes.io/enforce': 'baseline',
      'pod-security.kubernetes.io/audit': 'restricted',
    });
    expect(new Set(docs.map(id)).size).toBe(docs.length);
  });

  it("serves the forwarder's /metrics through a Service on the Deployment's http port", () => {
    const svc = docs.find((d) => id(d) === 'Service/kapp-lambda/kapp-lambda-forwarder-metrics') as ReleaseDocument & {
      spec: { selector: Record<string, string>; ports: Array<{ name: string; port: number; targetPort: string }> };
    };
    const dep = docs.find((d) => d.kind === 'Deployment') as ReleaseDocument & {
      spec: {
        template: {
          metadata: { labels: Record<string, string> };
          spec: { containers: Array<{ ports: Array<{ name: string; containerPort: number }> }> };
        };
      };
    };
    expect(svc.spec.ports).toEqual([{ name: 'http-metrics', port: 8080, targetPort: 'http', protocol: 'TCP' }]);
    expect(dep.spec.template.metadata.labels).toMatchObject(svc.spec.selector);
    const http = dep.spec.template.spec.containers[0]!.ports.find((p) => p.name === 'http');
    expect(http?.containerPort).toBe(8080);
    const config = docs.find((d) => d.kind === 'ConfigMap' && d.metadata.name === 'kapp-lambda-forwarder') as
      | (ReleaseDocument & { data: Record<string, string> })
      | undefined;
    expect(config?.data.FORWARDER_HTTP_PORT).toBe('8080');
    // Scraped only from namespaces labelled for it: any Pod could otherwise read every App's
    // series or hold the forwarder's few scrape slots.
    const policy = docs.find((d) => d.kind === 'NetworkPolicy');
    expect(policy?.spec).toEqual({
      podSelector: { matchLabels: svc.spec.selector },
      policyTypes: ['Ingress'],
      ingress: [
        {
          from: [{ namespaceSelector: { matchLabels: { [METRICS_SCRAPER_LABEL]: 'true' } } }],
          ports: [{ protocol: 'TCP', port: 8080 }],
        },
      ],
    });
    expect(committed).toContain(`labelled ${METRICS_SCRAPER_LABEL}=true`);
  });

  it('holds every object npm run cluster -- add prints (default namespaces, no token identities)', async () => {
    const rbac = (await rbacManifests()) as ReleaseDocument[];
    const byId = new Map(docs.map((d) => [id(d), d]));
    for (const o of rbac) {
      if (o.kind === 'Namespace') expect(byId.has(id(o))).toBe(true);
      else expect(byId.get(id(o))).toEqual(o);
    }
    expect(docs.map(id)).toContain('ValidatingAdmissionPolicyBinding//kapp-lambda-pkgr');
    expect(docs.filter((d) => d.kind === 'Secret')).toEqual([]);
  });

  it('pins the forwarder image by the version and leaves no placeholder', () => {
    const dep = docs.find((d) => d.kind === 'Deployment') as ReleaseDocument & {
      spec: { template: { spec: { containers: Array<{ image: string; envFrom: unknown[] }> } } };
    };
    const [container] = dep.spec.template.spec.containers;
    expect(container!.image).toBe(`${DEFAULT_FORWARDER_IMAGE_REPOSITORY}:${version}`);
    expect(container!.envFrom).toEqual([
      { configMapRef: { name: 'kapp-lambda-forwarder' } },
      { configMapRef: { name: FORWARDER_FLEET_CONFIGMAP } },
      // The cluster's event key, written by join; optional: without it the forwarder still starts.
      { secretRef: { name: 'kapp-lambda-forwarder-event-key', optional: true } },
    ]);
    const config = docs.find((d) => d.kind === 'ConfigMap') as ReleaseDocument & { data: Record<string, string> };
    expect(Object.keys(config.data).sort()).toEqual([
      'FORWARDER_HTTP_PORT',
      'FORWARDER_KINDS',
      'FORWARDER_LEASE_NAMESPACE',
      'FORWARDER_LOG_LEVEL',
      'FORWARDER_SHUTDOWN_TIMEOUT_SECONDS',
    ]);
    const account = docs.find((d) => id(d) === 'ServiceAccount/kapp-lambda/kapp-lambda-forwarder');
    expect(account?.metadata.annotations).toBeUndefined();
    expect(committed).not.toMatch(/111122223333|registry\.example\.com|my-cluster|eu-west-1/);
  });

  it('takes the image repository and an IRSA role as inputs', async () => {
    const arn = 'arn:aws:iam::123456789012:role/fwd';
    const out = await forwarderDocuments({ version: '9.9.9', imageRepository: 'r.test/fwd', forwarderRoleArn: arn });
    const dep = out.find((d) => d.kind === 'Deployment') as unknown as {
      spec: { template: { spec: { containers: Array<{ image: string }> } } };
    };
    expect(dep.spec.template.spec.containers[0]!.image).toBe('r.test/fwd:9.9.9');
    expect(out.find((d) => d.kind === 'ServiceAccount')?.metadata.annotations).toEqual({
      'eks.amazonaws.com/role-arn': arn,
    });
    expect((await releaseDocuments({ version: '9.9.9' })).length).toBe(docs.length);
  });

  it('marks the CRDs and the global packaging namespace, and nothing else, to stay on uninstall', () => {
    const kept = docs.filter(
      (d) =>
        d.metadata.labels?.[KEEP_ON_UNINSTALL_LABEL] === 'keep' &&
        d.metadata.annotations?.[KAPP_DELETE_STRATEGY] === 'orphan',
    );
    expect(kept.map(id)).toEqual([
      `Namespace//${DEFAULT_PACKAGING_GLOBAL_NAMESPACE}`,
      'CustomResourceDefinition//apps.kappctrl.k14s.io',
      'CustomResourceDefinition//packageinstalls.packaging.carvel.dev',
      'CustomResourceDefinition//packagemetadatas.data.packaging.carvel.dev',
      'CustomResourceDefinition//packagerepositories.packaging.carvel.dev',
      'CustomResourceDefinition//packages.data.packaging.carvel.dev',
    ]);
    const marked = docs.filter(
      (d) => d.metadata.labels?.[KEEP_ON_UNINSTALL_LABEL] ?? d.metadata.annotations?.[KAPP_DELETE_STRATEGY],
    );
    expect(marked).toEqual(kept);
    expect(committed).toContain(`kubectl delete -f kapp-lambda-${version}.yml -l '${KEEP_ON_UNINSTALL_LABEL}!=keep'`);
  });
});

describe('the Carvel package of kapp-lambda', () => {
  const read = (name: string) => readFile(path.join(RELEASE_DIR, name), 'utf8');

  it('the committed package is what npm run release generates now', async () => {
    const files = await releaseFiles(version);
    expect([...files.keys()]).toEqual([
      releaseFileName(version),
      runtimeReleaseFileName(version),
      'package/bundle/.imgpkg/images.yml',
      'package/bundle/config/kapp-lambda.yml',
      'package/bundle/config/values-schema.yml',
      'package/bundle/config/values.yml',
      'package/repository/.imgpkg/images.yml',
      `package/repository/packages/${PACKAGE_REF_NAME}/metadata.yml`,
      `package/repository/packages/${PACKAGE_REF_NAME}/${version}.yml`,
    ]);
    for (const [name, text] of files) expect(await read(name), name).toBe(text);
  });

  it('bundle/ and repository/ are both imgpkg bundles: each holds .imgpkg/images.yml, an ImagesLock', async () => {
    // imgpkg push -b refuses a directory without it ("This directory is not a bundle. It is
    // missing .imgpkg/images.yml"); the PackageRepository fetches repository/ as an imgpkgBundle.
    for (const dir of ['bundle', 'repository']) {
      const lock = parse(await read(`package/${dir}/.imgpkg/images.yml`));
      expect(lock, dir).toEqual({ apiVersion: 'imgpkg.carvel.dev/v1alpha1', kind: 'ImagesLock' });
    }
  });

  it("config holds the release's documents but its CRDs and namespaces", async () => {
    const config = parseAllDocuments(await read('package/bundle/config/kapp-lambda.yml')).map(
      (d) => d.toJS() as ReleaseDocument,
    );
    expect(config).toEqual(docs.filter((d) => d.kind !== 'CustomResourceDefinition' && d.kind !== 'Namespace'));
    expect(config.map(id)).toContain('Deployment/kapp-lambda/kapp-lambda-forwarder');
  });

  it('the Package fetches the bundle, templates its config with ytt and deploys with kapp; values as the schema says', async () => {
    const pkg = parse(await read(`package/repository/packages/${PACKAGE_REF_NAME}/${version}.yml`)) as ReleaseDocument;
    expect(pkg).toEqual(packageDocument(version, `ghcr.io/kapp-lambda/package:${version}`));
    expect(pkg.metadata.name).toBe(`kapp-lambda.carvel.dev.${version}`);
    expect(pkg.spec).toMatchObject({
      refName: 'kapp-lambda.carvel.dev',
      version,
      template: {
        spec: {
          fetch: [{ imgpkgBundle: { image: `ghcr.io/kapp-lambda/package:${version}` } }],
          template: [{ ytt: { paths: ['config/'] } }],
          deploy: [{ kapp: {} }],
        },
      },
    });
    const schema = (pkg.spec as { valuesSchema: { openAPIv3: { properties: Record<string, { properties: object }> } } })
      .valuesSchema.openAPIv3;
    expect(Object.keys(schema.properties.forwarder!.properties)).toEqual(['image', 'replicas', 'roleArn']);
    expect(Object.keys(schema.properties.fleet!.properties)).toEqual(['clusterId', 'queueUrls', 'region']);
    expect(schema.properties.forwarder!.properties).toMatchObject({
      image: { type: 'string', default: `${DEFAULT_FORWARDER_IMAGE_REPOSITORY}:${version}` },
      replicas: { type: 'integer', default: 2 },
    });
    const ytt = await read('package/bundle/config/values-schema.yml');
    expect(ytt).toContain(`  image: "${DEFAULT_FORWARDER_IMAGE_REPOSITORY}:${version}"\n`);
    expect(ytt).toContain('    indexRepo: ""\n');
  });

  it('names another bundle when told', async () => {
    const files = await packageFiles(version, '127.0.0.1:5000/pkg@sha256:abc');
    expect(files.get(`package/repository/packages/${PACKAGE_REF_NAME}/${version}.yml`)).toContain(
      'image: 127.0.0.1:5000/pkg@sha256:abc',
    );
  });

  it("the repository's ImagesLock lists a bundle given by digest, as kbld --imgpkg-lock-output does; a tag leaves it empty", async () => {
    const digest = `127.0.0.1:5000/pkg@sha256:${'0123456789abcdef'.repeat(4)}`;
    const lockOf = async (bundle: string) =>
      parse((await packageFiles(version, bundle)).get('package/repository/.imgpkg/images.yml')!);
    expect(await lockOf(digest)).toEqual({
      apiVersion: 'imgpkg.carvel.dev/v1alpha1',
      kind: 'ImagesLock',
      images: [{ image: digest, annotations: { 'kbld.carvel.dev/id': digest } }],
    });
    // imgpkg's ImagesLock holds digests only; a tag's digest is known once the bundle is pushed.
    for (const tag of ['127.0.0.1:5000/pkg:1.0.0', '127.0.0.1:5000/pkg@sha256:abc']) {
      expect(await lockOf(tag), tag).toEqual({ apiVersion: 'imgpkg.carvel.dev/v1alpha1', kind: 'ImagesLock' });
    }
  });
});

const runtimeText = await readFile(path.join(RELEASE_DIR, runtimeReleaseFileName(version)), 'utf8');
const runtimeDocs = parseAllDocuments(runtimeText).map((d) => d.toJS() as ReleaseDocument);

describe('in-cluster runtime release', () => {
  it('the committed file is what npm run release generates now, and says to apply it after the main one', async () => {
    const main = await releaseDocuments({ version });
    expect(runtimeText).toBe(renderManifest(version, 'runtime', runtimeReleaseDocuments({ version }, main)));
    expect(runtimeText.startsWith(releaseHeader(version, 'runtime'))).toBe(true);
    expect(runtimeText).toContain(
      `kubectl apply -f kapp-lambda-${version}.yml && kubectl apply -f kapp-lambda-runtime-${version}.yml`,
    );
    expect(runtimeDocs.map(id)).toEqual([
      `ServiceAccount/kapp-lambda/${RUNTIME_NAME}`,
      `ClusterRoleBinding//${RUNTIME_NAME}:deploy`,
      `ClusterRoleBinding//${RUNTIME_NAME}:fetch`,
      `ClusterRoleBinding//${RUNTIME_NAME}:forwarder`,
      `ClusterRoleBinding//${RUNTIME_NAME}:index-repo`,
      `ClusterRoleBinding//${RUNTIME_NAME}:install`,
      `ClusterRoleBinding//${RUNTIME_NAME}:template`,
      `RoleBinding/kapp-lambda/${RUNTIME_NAME}:controller-config-reader`,
      `RoleBinding/kapp-lambda/${RUNTIME_NAME}:forwarder-leader-election`,
      `RoleBinding/kapp-lambda/${RUNTIME_NAME}:pkgr-token`,
      `Service/kapp-lambda/${RUNTIME_NAME}-metrics`,
      `NetworkPolicy/kapp-lambda/${RUNTIME_NAME}-metrics`,
      `Deployment/kapp-lambda/${RUNTIME_NAME}`,
      `PodDisruptionBudget/kapp-lambda/${RUNTIME_NAME}`,
    ]);
  });

  it('binds the runtime to the roles of the forwarder and of every function, not to the PackageRepository kapp’s', () => {
    const roles = new Set(
      docs
        .filter((d) => d.kind.endsWith('Role'))
        .map((d) => `${d.kind}/${d.metadata.namespace ?? ''}/${d.metadata.name}`),
    );
    const bindings = runtimeDocs.filter((d) => d.kind.endsWith('Binding'));
    const byId = (a: ReleaseDocument, b: ReleaseDocument) => id(a).localeCompare(id(b));
    expect([...bindings].sort(byId)).toEqual(runtimeBindings(docs).sort(byId));
    for (const b of bindings) {
      const ref = b.roleRef as { kind: string; name: string };
      expect(roles.has(`${ref.kind}/${ref.kind === 'Role' ? b.metadata.namespace : ''}/${ref.name}`)).toBe(true);
      expect(b.subjects).toEqual([{ kind: 'ServiceAccount', name: RUNTIME_NAME, namespace: 'kapp-lambda' }]);
    }
    expect(bindings.map((b) => (b.roleRef as { name: string }).name)).not.toContain('kapp-lambda:pkgr');
  });

  it('runs two replicas as root with a few capabilities (tools get uids of their own), the token root-only, scratch on emptyDirs, metrics Service and PodDisruptionBudget', () => {
    type Container = {
      image: string;
      env: Array<{ name: string; value: string }>;
      securityContext: Record<string, unknown>;
      volumeMounts: Array<{ name: string; mountPath: string }>;
      resources: { requests: Record<string, string>; limits: Record<string, string> };
    };
    const dep = runtimeDocs.find((d) => d.kind === 'Deployment') as ReleaseDocument & {
      spec: {
        replicas: number;
        template: {
          metadata: { labels: Record<string, string> };
          spec: {
            serviceAccountName: string;
            automountServiceAccountToken: boolean;
            securityContext: Record<string, unknown>;
            containers: Container[];
            volumes: Array<{ name: string; emptyDir?: object; projected?: { defaultMode: number; sources: object[] } }>;
          };
        };
      };
    };
    const pod = dep.spec.template.spec;
    const [c] = pod.containers;
    expect(dep.spec.replicas).toBe(2);
    expect(pod.serviceAccountName).toBe(RUNTIME_NAME);
    expect(c!.image).toBe(`ghcr.io/kapp-lambda/runtime:${version}`);
    // Root, or every tool run shares the runtime's uid and reads its token (canSwitchUid()).
    expect(pod.securityContext).toEqual({
      runAsNonRoot: false,
      runAsUser: 0,
      runAsGroup: 0,
      seccompProfile: { type: 'RuntimeDefault' },
    });
    expect(c!.securityContext).toEqual({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      runAsNonRoot: false,
      capabilities: { drop: ['ALL'], add: ['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'KILL', 'SETGID', 'SETUID'] },
      seccompProfile: { type: 'RuntimeDefault' },
    });
    // Every capability added is one baseline Pod Security admits.
    const baseline = ['AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD'];
    baseline.push('NET_BIND_SERVICE', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT');
    expect(RUNTIME_CAPABILITIES.filter((cap) => !baseline.includes(cap))).toEqual([]);
    // The token: not automounted (0644), projected root-only (0400) where in-cluster config reads it.
    expect(pod.automountServiceAccountToken).toBe(false);
    const token = pod.volumes.find((v) => v.name === 'service-account');
    expect(token?.projected?.defaultMode).toBe(0o400);
    expect(token?.projected?.sources).toContainEqual({
      serviceAccountToken: { path: 'token', expirationSeconds: 3607 },
    });
    expect(Object.keys(c!.resources.requests).sort()).toEqual(['cpu', 'ephemeral-storage', 'memory']);
    expect(c!.resources.limits.memory).toBe('2Gi');
    expect(c!.volumeMounts).toEqual([
      { name: 'scratch', mountPath: '/scratch' },
      { name: 'keys', mountPath: `${RUNTIME_CACHE_DIR}/keys` },
      { name: 'service-account', mountPath: SERVICE_ACCOUNT_DIR, readOnly: true },
    ]);
    expect(pod.volumes.filter((v) => v.emptyDir === undefined).map((v) => v.name)).toEqual(['service-account']);
    expect(Object.fromEntries(c!.env.map((e) => [e.name, e.value]))).toEqual({
      KAPP_LAMBDA_METRICS_ADDRESS: '0.0.0.0:8080',
      KAPP_LAMBDA_CACHE: RUNTIME_CACHE_DIR,
      KAPP_LAMBDA_STORE: '/scratch/store',
      TMPDIR: '/scratch',
      HOME: '/scratch',
    });
    const labels = dep.spec.template.metadata.labels;
    const service = runtimeDocs.find((d) => d.kind === 'Service') as ReleaseDocument & {
      spec: Record<string, unknown>;
    };
    expect(service.spec).toEqual({
      selector: labels,
      ports: [{ name: 'metrics', port: 8080, targetPort: 'metrics', protocol: 'TCP' }],
    });
    const pdb = runtimeDocs.find((d) => d.kind === 'PodDisruptionBudget') as ReleaseDocument & {
      spec: Record<string, unknown>;
    };
    expect(pdb.spec).toEqual({ minAvailable: 1, selector: { matchLabels: labels } });
    const policy = runtimeDocs.find((d) => d.kind === 'NetworkPolicy') as ReleaseDocument & {
      spec: { podSelector: unknown; ingress: Array<{ from: unknown; ports: unknown }> };
    };
    expect(policy.spec.podSelector).toEqual({ matchLabels: labels });
    expect(policy.spec.ingress).toEqual([
      {
        from: [{ namespaceSelector: { matchLabels: { [METRICS_SCRAPER_LABEL]: 'true' } } }],
        ports: [{ protocol: 'TCP', port: 8080 }],
      },
    ]);
  });
});

describe('--package-bundle', () => {
  it('writes the package with its Package naming the bundle given, and needs --out-dir', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'release-package-'));
    const write = process.stdout.write;
    const errWrite = process.stderr.write;
    process.stdout.write = (() => true) as never;
    process.stderr.write = (() => true) as never;
    try {
      expect(await release(['--package-bundle', 'registry.corp/kl/package:9', '--out-dir', dir])).toBe(0);
      expect(await release(['--package-bundle', 'registry.corp/kl/package:9'])).toBe(2);
    } finally {
      process.stdout.write = write;
      process.stderr.write = errWrite;
    }
    const pkg = parse(
      await readFile(path.join(dir, 'package/repository/packages', PACKAGE_REF_NAME, `${version}.yml`), 'utf8'),
    );
    expect(pkg.spec.template.spec.fetch).toEqual([{ imgpkgBundle: { image: 'registry.corp/kl/package:9' } }]);
    for (const bundle of ['bundle', 'repository']) {
      expect(parse(await readFile(path.join(dir, 'package', bundle, '.imgpkg/images.yml'), 'utf8')), bundle).toEqual({
        apiVersion: 'imgpkg.carvel.dev/v1alpha1',
        kind: 'ImagesLock',
      });
    }
    await rm(dir, { recursive: true, force: true });
  });
});
