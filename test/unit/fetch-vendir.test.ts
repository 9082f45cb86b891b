import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { type AppFetch, refObjectsFrom } from '../../functions/lib/api/index.js';
import {
  buildVendirConfig,
  extractImageRegistry,
  extractUrlAuthority,
  fetchDirectoryName,
  hasImageOrImgpkgBundle,
  planVendirSync,
  shouldSkipTLSForAuthority,
  templateRootOf,
  vendirResourceRefs,
  vendirSyncCommand,
} from '../../functions/lib/fetch/index.js';
import { KappControllerError } from '../../functions/lib/reconcile/result.js';
import { fixturePath } from '../harness/fixtures.js';

const EXAMPLES = fixturePath('kapp-controller', 'examples');

function exampleApp(file: string): { metadata: { name: string; namespace: string }; spec: { fetch: AppFetch[] } } {
  const docs = parseAllDocuments(readFileSync(`${EXAMPLES}/${file}`, 'utf8')).map((d) => d.toJS());
  return docs.find((d) => d?.kind === 'App');
}

describe('buildVendirConfig (pkg/fetch/vendir.go AddDir)', () => {
  it('maps the http example with subPath to newRootPath in directory "0"', () => {
    const app = exampleApp('simple-app-http.yml');
    expect(buildVendirConfig(app.spec.fetch)).toEqual({
      apiVersion: 'vendir.k14s.io/v1alpha1',
      kind: 'Config',
      directories: [
        {
          path: '0',
          contents: [
            {
              path: '.',
              http: { url: 'https://dk-shared-assets.s3.amazonaws.com/k8s-simple-app-example-master.zip' },
              newRootPath: 'k8s-simple-app-example-master/config-step-2-template',
            },
          ],
        },
      ],
    });
  });

  it('maps the git example: ref, subPath, default depth 1', () => {
    const app = exampleApp('nginx-helm-git.yml');
    expect(buildVendirConfig(app.spec.fetch).directories).toEqual([
      {
        path: '0',
        contents: [
          {
            path: '.',
            newRootPath: 'bitnami/nginx',
            git: {
              url: 'https://github.com/bitnami/charts',
              ref: 'b3619f0a83392ac5e10e298f1f4df980683d8328',
              depth: 1,
            },
          },
        ],
      },
    ]);
  });

  it('maps the helmChart and image examples', () => {
    expect(buildVendirConfig(exampleApp('redis-helm.yml').spec.fetch).directories[0]!.contents[0]).toEqual({
      path: '.',
      helmChart: { name: 'redis', version: '17.3.17', repository: { url: 'https://charts.bitnami.com/bitnami' } },
    });
    expect(buildVendirConfig(exampleApp('consul-image-helm.yml').spec.fetch).directories[0]!.contents[0]).toEqual({
      path: '.',
      image: { url: 'dkalinin/consul-helm' },
    });
  });

  it('maps every field of every source', () => {
    const sel = { semver: { constraints: '>=1.0.0', prereleases: { identifiers: ['rc'] } } };
    const fetch: AppFetch[] = [
      {
        inline: {
          paths: { 'a.yml': 'a: 1' },
          pathsFrom: [{ secretRef: { name: 's1', directoryPath: 'sub' } }, { configMapRef: { name: 'c1' } }],
        },
      },
      { image: { url: 'reg.io/img', tagSelection: sel, secretRef: { name: 's2' }, subPath: 'cfg' } },
      { http: { url: 'https://h/x.tgz', sha256: 'ab', secretRef: { name: 's3' }, subPath: 'd' } },
      {
        git: {
          url: 'ssh://git@host/r.git',
          ref: 'origin/main',
          refSelection: sel,
          secretRef: { name: 's4' },
          subPath: 'p',
          lfsSkipSmudge: true,
          forceHTTPBasicAuth: true,
          depth: 5,
        },
        path: 'git-dest',
      },
      {
        helmChart: {
          name: 'c',
          version: '1.2.3',
          repository: { url: 'oci://reg.io/charts', secretRef: { name: 's5' } },
        },
      },
      { imgpkgBundle: { image: 'reg.io/b@sha256:abc', tagSelection: sel, secretRef: { name: 's6' } } },
    ];
    expect(buildVendirConfig(fetch).directories).toEqual([
      {
        path: '0',
        contents: [
          {
            path: '.',
            inline: {
              paths: { 'a.yml': 'a: 1' },
              pathsFrom: [{ secretRef: { name: 's1', directoryPath: 'sub' } }, { configMapRef: { name: 'c1' } }],
            },
          },
        ],
      },
      {
        path: '1',
        contents: [
          { path: '.', newRootPath: 'cfg', image: { url: 'reg.io/img', tagSelection: sel, secretRef: { name: 's2' } } },
        ],
      },
      {
        path: '2',
        contents: [
          { path: '.', http: { url: 'https://h/x.tgz', sha256: 'ab', secretRef: { name: 's3' } }, newRootPath: 'd' },
        ],
      },
      {
        path: 'git-dest',
        contents: [
          {
            path: '.',
            newRootPath: 'p',
            git: {
              url: 'ssh://git@host/r.git',
              ref: 'origin/main',
              refSelection: sel,
              secretRef: { name: 's4' },
              lfsSkipSmudge: true,
              forceHTTPBasicAuth: true,
              depth: 5,
            },
          },
        ],
      },
      {
        path: '4',
        contents: [
          {
            path: '.',
            helmChart: {
              name: 'c',
              version: '1.2.3',
              repository: { url: 'oci://reg.io/charts', secretRef: { name: 's5' } },
            },
          },
        ],
      },
      {
        path: '5',
        contents: [
          { path: '.', imgpkgBundle: { image: 'reg.io/b@sha256:abc', tagSelection: sel, secretRef: { name: 's6' } } },
        ],
      },
    ]);
  });

  it.each([
    [undefined, 1],
    [1, 1],
    [10, 10],
    [0, undefined],
  ])('git depth %j -> vendir depth %j (0 = full history, omitted)', (depth, expected) => {
    const c = buildVendirConfig([{ git: { url: 'https://g/r', ref: 'main', depth } }]).directories[0]!.contents[0];
    expect(c.git?.depth).toBe(expected);
    expect(Object.hasOwn(c.git!, 'depth')).toBe(expected !== undefined);
  });

  it('uses upstream switch precedence when an entry sets two sources', () => {
    const c = buildVendirConfig([{ git: { url: 'g' }, image: { url: 'i' } }]).directories[0]!.contents[0];
    expect(c.image).toEqual({ url: 'i' });
    expect(c.git).toBeUndefined();
  });

  it('turns a prepared http entry into a directory source with the same newRootPath, without its secret', () => {
    const fetch: AppFetch[] = [
      { http: { url: 'https://h/a.zip', sha256: 'abc', secretRef: { name: 's' }, subPath: 'a/b' } },
      { path: 'other', http: { url: 'https://h/b.tgz' } },
    ];
    const config = buildVendirConfig(fetch, { preparedHttp: new Map([[0, '/scratch/fetch-http-1/0']]) });
    expect(config.directories).toEqual([
      { path: '0', contents: [{ path: '.', directory: { path: '/scratch/fetch-http-1/0' }, newRootPath: 'a/b' }] },
      { path: 'other', contents: [{ path: '.', http: { url: 'https://h/b.tgz' } }] },
    ]);
    expect(vendirResourceRefs(config)).toEqual([]);
  });

  it.each([
    [[], 'Expected at least one fetch option'],
    [[{}], 'Fetching (0): Unsupported way to fetch templates'],
    [[{ image: { url: 'x' } }, { path: 'p' }], 'Fetching (1): Unsupported way to fetch templates'],
    [[{ inline: {}, path: '../escape' }], 'Fetching (0): Invalid path: ../escape'],
    [[{ inline: {}, path: '/abs' }], 'Fetching (0): Invalid path: /abs'],
  ] as Array<[AppFetch[], string]>)('fails %#: %s', (fetch, message) => {
    expect(() => buildVendirConfig(fetch)).toThrowError(new KappControllerError(message));
  });
});

describe('dangerousSkipTLSVerify (config.ShouldSkipTLSForAuthority)', () => {
  const list =
    'always.trustworthy.com, selectively.trusted.net:123456, [1fff:0:a88:85a3::ac1f]:8001, 1aaa:0:a88:85a3::ac1f';
  it.each([
    ['some.random.org', false],
    ['always.trustworthy.com', true],
    ['always.trustworthy.com:12345', true],
    ['selectively.trusted.net', false],
    ['selectively.trusted.net:8888', false],
    ['selectively.trusted.net:123456', true],
    ['[1fff:0:a88:85a3::ac1f]:8001', true],
    ['[1fff:0:a88:85a3::ac1f]:8002', false],
    ['[1aaa:0:a88:85a3::ac1f]:8001', true],
    ['1aaa:0:a88:85a3::ac1f', true],
  ])('%s -> %s (upstream config_test cases)', (candidate, expected) => {
    expect(shouldSkipTLSForAuthority(list, candidate)).toBe(expected);
  });

  it('is false with no allow-list', () => {
    expect(shouldSkipTLSForAuthority('', 'a')).toBe(false);
    expect(shouldSkipTLSForAuthority(undefined, 'a')).toBe(false);
  });

  it.each([
    ['registry.local:5000/app', 'registry.local:5000'],
    ['my.reg/app@sha256:abc', 'my.reg'],
    ['dkalinin/consul-helm', 'index.docker.io'],
    ['nginx', 'index.docker.io'],
    ['localhost/app', 'index.docker.io'],
  ])('extractImageRegistry(%s) = %s', (ref, registry) => {
    expect(extractImageRegistry(ref)).toBe(registry);
  });

  it.each([
    ['https://0.0.0.0/bitnami/charts/', '0.0.0.0'],
    ['https://user:pw@git.local:8443/r.git', 'git.local:8443'],
    ['ssh://git@host/r.git', 'host'],
    ['git@github.com:org/repo.git', ''],
  ])('extractUrlAuthority(%s) = %j', (url, authority) => {
    expect(extractUrlAuthority(url)).toBe(authority);
  });

  it('sets the flag for image, imgpkgBundle and git, never for http or helmChart', () => {
    const cfg = buildVendirConfig(
      [
        { image: { url: 'reg.local:5000/a' } },
        { imgpkgBundle: { image: 'reg.local/b' } },
        { git: { url: 'https://0.0.0.0/bitnami/charts/' } },
        { git: { url: 'https://bitbucket.org/bitnami/charts/' } },
        { http: { url: 'https://reg.local/x' } },
        { helmChart: { name: 'x', repository: { url: 'https://reg.local' } } },
        { image: { url: 'other.io/a' } },
      ],
      { dangerousSkipTLSVerify: 'reg.local, 0.0.0.0' },
    );
    const flags = cfg.directories.map((d) => {
      const c = d.contents[0];
      return c.image?.dangerousSkipTLSVerify ?? c.imgpkgBundle?.dangerousSkipTLSVerify ?? c.git?.dangerousSkipTLSVerify;
    });
    expect(flags).toEqual([true, true, true, undefined, undefined, undefined, undefined]);
    expect(JSON.stringify(cfg.directories[4])).not.toContain('dangerous');
  });
});

describe('layout (app_fetch.go)', () => {
  it.each([
    [[{ inline: {} }], '0'],
    [[{ inline: {}, path: 'foo' }], '.'],
    [[{ inline: {} }, { inline: {} }], '.'],
  ] as Array<[AppFetch[], string]>)('templateRootOf %# = %s', (fetch, root) => {
    expect(templateRootOf(fetch)).toBe(root);
  });

  it('names directories by index unless path is set', () => {
    expect(fetchDirectoryName({ git: {}, path: 'git-dest' }, 0)).toBe('git-dest');
    expect(fetchDirectoryName({ http: {} }, 1)).toBe('1');
  });

  it('knows when upstream retries (image or imgpkgBundle present)', () => {
    expect(hasImageOrImgpkgBundle([{ git: {} }, { image: {} }])).toBe(true);
    expect(hasImageOrImgpkgBundle([{ git: {} }, { http: {} }])).toBe(false);
  });
});

describe('planVendirSync (ConfigBytes + Run)', () => {
  const secret = (name: string, extra: Record<string, unknown> = {}) => ({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name,
      namespace: 'ns',
      annotations: { 'kubectl.kubernetes.io/last-applied-configuration': '{"stringData":{"password":"leak"}}' },
      managedFields: [{ manager: 'kubectl' }],
    },
    type: 'Opaque',
    data: { username: Buffer.from('user'), password: Buffer.from('pw') },
    ...extra,
  });

  it('runs exactly `vendir sync -f - --lock-file /dev/null` with no VENDIR_CACHE_DIR, a GODEBUG refusing unsafe tar/zip names and a git that follows no redirect', () => {
    expect(vendirSyncCommand()).toEqual({
      bin: 'vendir',
      args: ['sync', '-f', '-', '--lock-file', '/dev/null'],
      env: {
        GODEBUG: 'tarinsecurepath=0,zipinsecurepath=0',
        GIT_CONFIG_COUNT: '1',
        GIT_CONFIG_KEY_0: 'http.followRedirects',
        GIT_CONFIG_VALUE_0: 'false',
      },
    });
  });

  it('sends only referenced objects, trimmed, before the config, joined with ---', () => {
    const refs = refObjectsFrom({
      secrets: [secret('git-creds'), secret('unrelated'), secret('inline-s')],
      configMaps: [
        {
          metadata: { name: 'inline-cm', namespace: 'ns' },
          data: { 'f.yml': 'x: 1' },
        },
      ],
    });
    const plan = planVendirSync({
      fetch: [
        { git: { url: 'https://g/r', ref: 'main', secretRef: { name: 'git-creds' } } },
        { inline: { pathsFrom: [{ secretRef: { name: 'inline-s' } }, { configMapRef: { name: 'inline-cm' } }] } },
        { git: { url: 'https://g/r2', secretRef: { name: 'git-creds' } } },
      ],
      namespace: 'ns',
      refs,
    });
    expect(vendirResourceRefs(plan.config)).toEqual([
      { kind: 'Secret', name: 'git-creds' },
      { kind: 'Secret', name: 'inline-s' },
      { kind: 'ConfigMap', name: 'inline-cm' },
    ]);
    expect(plan.extraDocuments.map((d) => parse(d))).toEqual([
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'git-creds', namespace: 'ns' },
        type: 'Opaque',
        data: { username: 'dXNlcg==', password: 'cHc=' },
      },
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'inline-s', namespace: 'ns' },
        type: 'Opaque',
        data: { username: 'dXNlcg==', password: 'cHc=' },
      },
      {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'inline-cm', namespace: 'ns' },
        data: { 'f.yml': 'x: 1' },
      },
    ]);
    expect(plan.stdin).toBe([...plan.extraDocuments, plan.configYaml].join('---\n'));
    expect(plan.stdin).not.toContain('unrelated');
    expect(plan.stdin).not.toContain('leak');
    expect(plan.stdin).not.toContain('managedFields');
    const docs = parseAllDocuments(plan.stdin).map((d) => d.toJS());
    expect(docs).toHaveLength(4);
    expect(docs[3]).toEqual(plan.config);
    expect(plan.configYaml.startsWith('apiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n')).toBe(true);
    expect(plan.templateRoot).toBe('.');
    expect(plan.command.args).toEqual(['sync', '-f', '-', '--lock-file', '/dev/null']);
  });

  it('has only the config on stdin when nothing is referenced', () => {
    const plan = planVendirSync({
      fetch: [{ inline: { paths: { 'a.yml': 'a' } } }],
      namespace: 'ns',
      refs: refObjectsFrom({}),
    });
    expect(plan.extraDocuments).toEqual([]);
    expect(plan.stdin).toBe(plan.configYaml);
    expect(plan.templateRoot).toBe('0');
  });

  it.each([
    [[{ image: { url: 'i', secretRef: { name: 'missing' } } }], 'Fetching: secrets "missing" not found'],
    [
      [{ helmChart: { name: 'c', repository: { url: 'u', secretRef: { name: 'hs' } } } }],
      'Fetching: secrets "hs" not found',
    ],
    [[{ inline: { pathsFrom: [{ configMapRef: { name: 'cm' } }] } }], 'Fetching: configmaps "cm" not found'],
  ] as Array<[AppFetch[], string]>)('fails for a missing object: %s', (fetch, message) => {
    expect(() => planVendirSync({ fetch, namespace: 'ns', refs: refObjectsFrom({}) })).toThrowError(
      new KappControllerError(message),
    );
  });
});
