import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import {
  ApiValidationError,
  type App,
  AppClusterKubeconfigSecretRefSchema,
  AppFetchGitSchema,
  AppResource,
  AppSpecSchema,
  AppTemplateHelmTemplateSchema,
  ConditionType,
  DEFAULT_APP_SYNC_PERIOD,
  DEFAULT_GIT_DEPTH,
  DEFAULT_KUBECONFIG_SECRET_KEY,
  DEFAULT_PACKAGE_INSTALL_SYNC_PERIOD,
  DEFAULT_PACKAGE_REPOSITORY_SYNC_PERIOD,
  formatPath,
  MINIMUM_SYNC_PERIOD,
  type ParseResult,
  parseApp,
  parsePackage,
  parsePackageInstall,
  parsePackageMetadata,
  parsePackageRepository,
  pruneNulls,
} from '../../functions/lib/api/index.js';
import { fetchDirectoryName } from '../../functions/lib/fetch/vendir.js';
import { fixturePath } from '../harness/fixtures.js';

const FIXTURES = fixturePath('kapp-controller');

const PARSERS: Record<string, (input: unknown) => ParseResult<unknown>> = {
  App: parseApp,
  PackageInstall: parsePackageInstall,
  PackageRepository: parsePackageRepository,
  Package: parsePackage,
  PackageMetadata: parsePackageMetadata,
};

interface FixtureDoc {
  readonly file: string;
  readonly object: { kind: string; metadata?: { name?: string } } & Record<string, unknown>;
}

/** Every document of a Carvel kind in the YAML files under `dir` (recursively). */
function carvelDocs(dir: string): FixtureDoc[] {
  const files = (readdirSync(join(FIXTURES, dir), { recursive: true }) as string[])
    .filter((f) => /\.ya?ml$/.test(f))
    .sort();
  const out: FixtureDoc[] = [];
  for (const file of files) {
    for (const doc of parseAllDocuments(readFileSync(join(FIXTURES, dir, file), 'utf8'))) {
      const object = doc.toJS() as FixtureDoc['object'] | null;
      if (object && typeof object.kind === 'string' && object.kind in PARSERS) {
        out.push({ file: join(dir, file), object });
      }
    }
  }
  return out;
}

function countKinds(docs: readonly FixtureDoc[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const { object } of docs) counts[object.kind] = (counts[object.kind] ?? 0) + 1;
  return counts;
}

function mustParseApp(input: unknown): App {
  const result = parseApp(input);
  if (!result.success) throw result.error;
  return result.data;
}

function appWith(spec: unknown, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name: 'bad', namespace: 'default' },
    spec,
    ...extra,
  };
}

describe('fixture objects parse', () => {
  const examples = carvelDocs('examples');
  const e2eAssets = carvelDocs('test/e2e/assets');
  const cliExamples = carvelDocs('cli/examples');

  it('finds the expected number of objects per kind', () => {
    expect(countKinds(examples)).toEqual({
      App: 11,
      Package: 3,
      PackageInstall: 5,
      PackageMetadata: 2,
      PackageRepository: 4,
    });
    expect(countKinds(e2eAssets)).toEqual({ Package: 4, PackageMetadata: 1 });
    expect(countKinds(cliExamples)).toEqual({ Package: 6, PackageMetadata: 6, PackageInstall: 3 });
  });

  it.each(
    [...examples, ...e2eAssets, ...cliExamples].map((d) => [
      `${d.file} ${d.object.kind}/${d.object.metadata?.name}`,
      d,
    ]),
  )('%s', (_name, { object }) => {
    const result = PARSERS[object.kind]!(object);
    expect(result.success ? 'ok' : result.error.message).toBe('ok');
  });

  it('parses the Packages inlined in the inline PackageRepository example', () => {
    const repo = examples.find((d) => d.file === 'examples/packaging-with-repo/inline-repo.yml');
    const parsed = parsePackageRepository(repo?.object);
    if (!parsed.success) throw parsed.error;
    const paths = parsed.data.spec.fetch.inline?.paths ?? {};
    const packages = Object.entries(paths)
      .filter(([path]) => path.startsWith('packages/'))
      .flatMap(([, content]) => parseAllDocuments(content).map((d) => d.toJS()));
    expect(packages.map((p) => p.kind)).toContain('Package');
    for (const pkg of packages) {
      const result = PARSERS[pkg.kind]!(pkg);
      expect(result.success ? 'ok' : result.error.message).toBe('ok');
    }
  });

  it('keeps the typed content of an App', () => {
    const doc = examples.find((d) => d.file === 'examples/simple-app-downward-api/app.yml');
    const app = mustParseApp(doc?.object);
    expect(app.metadata).toEqual({ name: 'simple-app', namespace: 'default' });
    expect(app.spec.serviceAccountName).toBe('default-ns-sa');
    expect(app.spec.fetch).toEqual([
      {
        git: {
          url: 'https://github.com/k14s/k8s-simple-app-example',
          ref: 'origin/develop',
          subPath: 'config-step-2-template',
        },
      },
    ]);
    expect(app.spec.template?.[0]?.ytt?.valuesFrom).toEqual([
      {
        downwardAPI: {
          items: [
            { name: 'ns', fieldPath: 'metadata.namespace' },
            { name: 'k8sV', kubernetesVersion: {} },
            { name: 'kcV', kappControllerVersion: {} },
            { name: 'k8sApis', kubernetesAPIs: {} },
          ],
        },
      },
    ]);
    expect(app.spec.deploy).toEqual([{ kapp: {} }]);
  });

  it('keeps a Package template spec and its free-form values schema', () => {
    const doc = examples.find((d) => d.file === 'examples/cert-manager-tce-pkg/pkg.yml');
    const result = parsePackage(doc?.object);
    if (!result.success) throw result.error;
    const pkg = result.data;
    expect(pkg.spec.refName).toBe('cert-manager.community.tanzu.vmware.com');
    expect(pkg.spec.version).toBe('1.8.0');
    expect(pkg.spec.releasedAt).toBe('2021-10-29T12:00:00Z');
    expect(pkg.spec.template?.spec.deploy).toEqual([{ kapp: { rawOptions: ['--diff-changes=true'] } }]);
    expect(pkg.spec.valuesSchema?.openAPIv3).toEqual({
      title: 'cert-manager.community.tanzu.vmware.com.1.8.0 values schema',
      examples: [{ namespace: 'cert-manager' }],
      properties: {
        namespace: {
          type: 'string',
          description: 'The namespace in which to deploy cert-manager.',
          default: 'cert-manager',
        },
      },
    });
  });
});

describe('invalid objects: error paths relative to the whole object', () => {
  it.each([
    [
      'wrong type deep in fetch',
      appWith({ fetch: [{ git: { url: 5 } }] }),
      [
        {
          path: 'spec.fetch[0].git.url',
          code: 'invalid_type',
          message: 'Invalid input: expected string, received number',
        },
      ],
    ],
    [
      'non-integer int64',
      appWith({ fetch: [{}, { git: { depth: 1.5 } }] }),
      [
        {
          path: 'spec.fetch[1].git.depth',
          code: 'invalid_type',
          message: 'Invalid input: expected int, received number',
        },
      ],
    ],
    [
      'map key that is not an identifier',
      appWith({ fetch: [{ inline: { paths: { 'config.yml': 3 } } }] }),
      [
        {
          path: 'spec.fetch[0].inline.paths["config.yml"]',
          code: 'invalid_type',
          message: 'Invalid input: expected string, received number',
        },
      ],
    ],
    [
      'Go duration',
      appWith({ syncPeriod: '1d' }),
      [{ path: 'spec.syncPeriod', code: 'custom', message: 'time: invalid duration "1d"' }],
    ],
    [
      'template step',
      appWith({ template: [{ ytt: { paths: 'config/' } }] }),
      [
        {
          path: 'spec.template[0].ytt.paths',
          code: 'invalid_type',
          message: 'Invalid input: expected array, received string',
        },
      ],
    ],
    [
      'status condition without type',
      appWith({}, { status: { conditions: [{ status: 'True' }] } }),
      [
        {
          path: 'status.conditions[0].type',
          code: 'invalid_type',
          message: 'Invalid input: expected string, received undefined',
        },
      ],
    ],
    [
      'status time',
      appWith({}, { status: { deploy: { startedAt: 'yesterday' } } }),
      [{ path: 'status.deploy.startedAt', code: 'invalid_format', message: 'Invalid ISO datetime' }],
    ],
    [
      'wrong kind and missing spec',
      { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'PackageInstall', metadata: { name: 'x' } },
      [
        { path: 'kind', code: 'invalid_value', message: 'Invalid input: expected "App"' },
        { path: 'spec', code: 'invalid_type', message: 'Invalid input: expected object, received undefined' },
      ],
    ],
    [
      'not an object',
      'nope',
      [{ path: '', code: 'invalid_type', message: 'Invalid input: expected object, received string' }],
    ],
  ])('%s', (_name, input, issues) => {
    const result = parseApp(input);
    expect(result.success).toBe(false);
    if (result.success) return;
    expect(result.error).toBeInstanceOf(ApiValidationError);
    expect(result.error.kind).toBe('App');
    expect(result.error.issues).toEqual(issues);
  });

  it('names the object and every issue in the error message', () => {
    const result = parseApp(appWith({ fetch: [{ git: { url: 5 } }], paused: 'yes' }));
    expect(result.success).toBe(false);
    if (result.success) return;
    expect(result.error.message).toBe(
      'invalid App default/bad: spec.fetch[0].git.url: Invalid input: expected string, received number; ' +
        'spec.paused: Invalid input: expected boolean, received string',
    );
    const bare = parseApp(null);
    expect(bare.success ? '' : bare.error.message).toBe(
      'invalid App: (root): Invalid input: expected object, received null',
    );
  });

  it('requires spec.fetch on a PackageRepository', () => {
    const result = parsePackageRepository({
      apiVersion: 'packaging.carvel.dev/v1alpha1',
      kind: 'PackageRepository',
      metadata: { name: 'repo', namespace: 'ns' },
      spec: { syncPeriod: '5m' },
    });
    expect(result.success ? 'ok' : result.error.message).toBe(
      'invalid PackageRepository ns/repo: spec.fetch: Invalid input: expected object, received undefined',
    );
  });

  it('checks PackageInstall status and Package template shapes', () => {
    const pkgi = parsePackageInstall({
      apiVersion: 'packaging.carvel.dev/v1alpha1',
      kind: 'PackageInstall',
      metadata: { name: 'i' },
      spec: { packageRef: { refName: 'a.b.c', versionSelection: { constraints: '>=1.0.0' } } },
      status: { version: 1, lastAttemptedVersion: '1.0.0' },
    });
    expect(pkgi.success ? [] : pkgi.error.issues.map((i) => i.path)).toEqual(['status.version']);
    const pkg = parsePackage({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'Package',
      metadata: { name: 'a.b.c.1.0.0' },
      spec: { refName: 'a.b.c', version: '1.0.0', template: { spec: { deploy: [{ kapp: { rawOptions: '--x' } }] } } },
    });
    expect(pkg.success ? [] : pkg.error.issues.map((i) => i.path)).toEqual([
      'spec.template.spec.deploy[0].kapp.rawOptions',
    ]);
    const noSpec = parsePackage({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'Package',
      metadata: { name: 'a.b.c.1.0.0' },
      spec: { template: {} },
    });
    expect(noSpec.success ? [] : noSpec.error.issues.map((i) => i.path)).toEqual(['spec.template.spec']);
  });
});

describe('what parsing keeps, drops and normalises', () => {
  it('drops unknown fields like the API server, but keeps unknown metadata', () => {
    const app = mustParseApp(
      appWith(
        { fetch: [{ git: { url: 'u', bogus: true } }], bogus: 1 },
        { extra: 1, metadata: { name: 'a', managedFields: [{ manager: 'kubectl' }] } },
      ),
    );
    expect(app).toEqual({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'a', managedFields: [{ manager: 'kubectl' }] },
      spec: { fetch: [{ git: { url: 'u' } }] },
    });
  });

  it('drops null object fields (the API server prunes them) but keeps array elements', () => {
    expect(pruneNulls({ a: null, b: [null, { c: null, d: 1 }], e: { f: null } })).toEqual({
      b: [null, { d: 1 }],
      e: {},
    });
    const app = mustParseApp(
      appWith(
        { fetch: [{ git: { url: 'u', ref: null } }], template: [{ ytt: null }, { kbld: {} }], cluster: null },
        {
          metadata: { name: 'a', creationTimestamp: null },
        },
      ),
    );
    expect(app.metadata).toEqual({ name: 'a' });
    expect(app.spec).toEqual({ fetch: [{ git: { url: 'u' } }], template: [{}, { kbld: {} }] });
  });

  it('keeps null where upstream declares the field nullable (Package releasedAt, values schema)', () => {
    const result = parsePackage({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'Package',
      metadata: { name: 'a.b.c.1.0.0' },
      spec: {
        refName: 'a.b.c',
        version: '1.0.0',
        releasedAt: null,
        valuesSchema: { openAPIv3: { properties: { x: { default: null } } } },
      },
    });
    if (!result.success) throw result.error;
    expect(result.data.spec).toEqual({
      refName: 'a.b.c',
      version: '1.0.0',
      releasedAt: null,
      valuesSchema: { openAPIv3: { properties: { x: { default: null } } } },
    });
    const nullSchema = parsePackage({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'Package',
      metadata: { name: 'a.b.c.1.0.0' },
      spec: { valuesSchema: { openAPIv3: null } },
    });
    expect(nullSchema.success && nullSchema.data.spec.valuesSchema).toEqual({ openAPIv3: null });
  });

  it('normalises Date timestamps in metadata (typed client models) to RFC 3339 seconds', () => {
    const app = mustParseApp(
      appWith({}, { metadata: { name: 'a', creationTimestamp: new Date(Date.UTC(2024, 0, 2, 3, 4, 5, 678)) } }),
    );
    expect(app.metadata.creationTimestamp).toBe('2024-01-02T03:04:05Z');
  });

  it('keeps a full status', () => {
    const status = {
      conditions: [
        {
          type: 'ReconcileFailed',
          status: 'True',
          message: 'Deploying: Error (see .status.usefulErrorMessage for details)',
        },
      ],
      observedGeneration: 1,
      friendlyDescription: 'Reconcile failed: Deploying: Error (see .status.usefulErrorMessage for details)',
      usefulErrorMessage: 'kapp: Error: ...',
      fetch: {
        exitCode: 0,
        stdout: 'kind: LockConfig',
        startedAt: '2024-01-01T00:00:00Z',
        updatedAt: '2024-01-01T00:00:01Z',
      },
      template: { exitCode: 0, stderr: '', updatedAt: '2024-01-01T00:00:02Z' },
      deploy: {
        exitCode: 1,
        finished: true,
        error: 'Deploying: Error (see .status.usefulErrorMessage for details)',
        kapp: {
          associatedResources: {
            label: 'kapp.k14s.io/app=1',
            namespaces: ['default'],
            groupKinds: [{ group: 'apps', kind: 'Deployment' }],
          },
        },
      },
      inspect: { exitCode: 0, stdout: 'Resources in app' },
      consecutiveReconcileSuccesses: 0,
      consecutiveReconcileFailures: 1,
    };
    expect(mustParseApp(appWith({}, { status })).status).toEqual(status);
    expect(ConditionType.ReconcileFailed).toBe(status.conditions[0]?.type);
  });
});

describe('defaults', () => {
  it('are not injected by parsing: the object keeps what was written', () => {
    const app = mustParseApp(
      appWith({ fetch: [{ git: { url: 'u' } }], cluster: { kubeconfigSecretRef: { name: 's' } } }),
    );
    expect(app.spec.fetch?.[0]?.git).toEqual({ url: 'u' });
    expect(app.spec.cluster?.kubeconfigSecretRef).toEqual({ name: 's' });
    expect(app.spec.syncPeriod).toBeUndefined();
  });

  it('git depth defaults to 1; 0 means full history', () => {
    expect(DEFAULT_GIT_DEPTH).toBe(1);
  });

  it('kubeconfig secret key defaults to "value"', () => {
    expect(DEFAULT_KUBECONFIG_SECRET_KEY).toBe('value');
  });

  it('fetch directory defaults to the entry index', () => {
    expect(fetchDirectoryName({ git: { url: 'u' } }, 0)).toBe('0');
    expect(fetchDirectoryName({ git: { url: 'u' } }, 3)).toBe('3');
    expect(fetchDirectoryName({ git: { url: 'u' }, path: 'vendor/x' }, 3)).toBe('vendor/x');
  });

  it('sync periods', () => {
    expect([
      DEFAULT_APP_SYNC_PERIOD,
      DEFAULT_PACKAGE_INSTALL_SYNC_PERIOD,
      DEFAULT_PACKAGE_REPOSITORY_SYNC_PERIOD,
      MINIMUM_SYNC_PERIOD,
    ]).toEqual(['30s', '10m', '10m', '30s']);
  });

  it('are documented in the schema descriptions (and so in the CRDs)', () => {
    expect(AppFetchGitSchema.shape.depth.unwrap().description).toBe(
      'depth of commits to fetch; 1 (default) means only latest commit, 0 means everything (optional)',
    );
    expect(AppClusterKubeconfigSecretRefSchema.shape.key.unwrap().description).toBe(
      'Specifies key that contains kubeconfig (optional; default "value")',
    );
    expect(AppTemplateHelmTemplateSchema.shape.name.unwrap().description).toBe(
      "Set name explicitly, default is App CR's name (optional; v0.13.0+)",
    );
    expect(AppSpecSchema.shape.syncPeriod.unwrap().description).toContain('default=30s');
  });
});

describe('formatPath', () => {
  it.each([
    [[], ''],
    [['spec', 'fetch', 0, 'git', 'url'], 'spec.fetch[0].git.url'],
    [['spec', 'fetch', 0, 'inline', 'paths', '.imgpkg/images.yml'], 'spec.fetch[0].inline.paths[".imgpkg/images.yml"]'],
    [[0, 'a'], '[0].a'],
    // the event contract's (`events/schema.ts`), which prints the empty path as `(root)`
    [['data', 'generation'], 'data.generation'],
    [['data', 'items', 2, 'name'], 'data.items[2].name'],
    [['a-b', 'c'], '["a-b"].c'],
  ] as const)('%j -> %s', (path, text) => {
    expect(formatPath(path)).toBe(text);
  });
});

describe('resource identities', () => {
  it('App', () => {
    expect(AppResource).toEqual({
      group: 'kappctrl.k14s.io',
      version: 'v1alpha1',
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      listKind: 'AppList',
      plural: 'apps',
      singular: 'app',
      shortNames: [],
      categories: ['carvel'],
    });
  });
});
