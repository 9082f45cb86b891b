import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import {
  type AppTemplate,
  type ConfigMapLike,
  refObjectsFrom,
  type SecretLike,
} from '../../functions/lib/api/index.js';
import {
  CUE_MODULE_FETCH_MESSAGE,
  dearmorPrivateKeyBlock,
  planTemplate,
  type RunStep,
  requiredClusterInfo,
  type SopsStep,
  sopsDecryptCommand,
  sopsDecryptedPath,
  sopsDecryptFailureMessage,
  type TemplatePlanInput,
} from '../../functions/lib/template/index.js';
import { DEAD_PROXY_ENV } from '../../functions/lib/template/step.js';
import { fixturePath } from '../harness/fixtures.js';

const ROOT = '/w/fetch/0';
const SCRATCH = '/w/scratch';
const bytes = (s: string) => Buffer.from(s, 'utf8');
const text = (c: string | Uint8Array) => (typeof c === 'string' ? c : Buffer.from(c).toString('utf8'));

function secret(name: string, data: Record<string, string>): SecretLike {
  return { metadata: { name }, data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, bytes(v)])) };
}
function configMap(name: string, data: Record<string, string>, binaryData?: Record<string, Buffer>): ConfigMapLike {
  return { metadata: { name }, data, binaryData };
}

function plan(template: AppTemplate[], extra: Partial<TemplatePlanInput> = {}) {
  return planTemplate({
    app: { metadata: { name: 'app', namespace: 'ns', uid: 'uid-1' }, spec: { template } },
    templateRoot: ROOT,
    scratchRoot: SCRATCH,
    refs: refObjectsFrom({}),
    ...extra,
  });
}

function run(step: unknown): RunStep {
  expect((step as RunStep).kind).toBe('run');
  return step as RunStep;
}

describe('pipeline (app_template.go)', () => {
  it('fails with no template', () => {
    expect(plan([]).steps).toEqual([{ kind: 'fail', index: 0, message: 'Expected at least one template option' }]);
  });

  it.each([
    [[{ jsonnet: {} }], 0],
    [[{ ytt: {} }, { jsonnet: {} }], 1],
    [[{ ytt: {} }, {}], 1],
  ] as Array<[AppTemplate[], number]>)('stops at an unsupported templater %#', (template, index) => {
    const steps = plan(template).steps;
    expect(steps).toHaveLength(index + 1);
    expect(steps[index]).toEqual({ kind: 'fail', index, message: 'Unsupported way to template' });
  });

  it('feeds the stream to later steps: ytt on the dir, then kbld on stdin', () => {
    const steps = plan([{ ytt: {} }, { kbld: {} }]).steps.map(run);
    expect(steps.map((s) => [s.bin, s.args, s.stdin])).toEqual([
      ['ytt', ['-f', ROOT], 'none'],
      ['kbld', ['-f', '-', '--build=false'], 'previous'],
    ]);
    expect(steps.map((s) => s.errorPrefix)).toEqual(['Templating dir: ', 'Templating dir: ']);
  });

  it('sops keeps working on the directory; the step after it reads the directory', () => {
    const refs = refObjectsFrom({ secrets: [secret('keys', { k: 'AGE-SECRET-KEY-1X' })] });
    const steps = plan([{ sops: { age: { privateKeysSecretRef: { name: 'keys' } } } }, { ytt: {} }], { refs }).steps;
    expect(steps[0]!.kind).toBe('sops');
    expect(run(steps[1]).args).toEqual(['-f', ROOT]);
    expect(run(steps[1]).stdin).toBe('none');
  });

  it.each([
    [[{ ytt: {} }, { sops: { age: {} } }], 'Templating data is not supported'],
    [[{ helmTemplate: {} }, { cue: {} }], 'Templating stream is not supported'],
    [[{ ytt: {} }, { kustomize: {} }], 'Templating stream is not supported'],
  ] as Array<[AppTemplate[], string]>)('cannot run sops, cue or kustomize on a stream: %s', (template, message) => {
    expect(plan(template).steps[1]).toEqual({ kind: 'fail', index: 1, message });
  });

  it('reports a step planning error only at that step, after the earlier steps', () => {
    const steps = plan([{ ytt: {} }, { kbld: { paths: ['../x'] } }, { kbld: {} }]).steps;
    expect(steps.map((s) => s.kind)).toEqual(['run', 'fail']);
    expect(steps[1]).toEqual({ kind: 'fail', index: 1, message: 'Checking path: Invalid path: ../x' });
  });

  it('rejects caller mistakes', () => {
    expect(() =>
      planTemplate({ app: {}, templateRoot: 'rel', scratchRoot: SCRATCH, refs: refObjectsFrom({}) }),
    ).toThrow(TypeError);
    expect(() =>
      planTemplate({ app: {}, templateRoot: ROOT, scratchRoot: `${ROOT}/s`, refs: refObjectsFrom({}) }),
    ).toThrow('scratchRoot must not be inside templateRoot');
    expect(() => planTemplate({ app: {}, templateRoot: ROOT, scratchRoot: ROOT, refs: refObjectsFrom({}) })).toThrow(
      TypeError,
    );
  });
});

describe('ytt (pkg/template/ytt.go)', () => {
  const refs = refObjectsFrom({
    secrets: [secret('vals', { 'b.yml': 'b: 2', 'a.yml': 'a: 1' }), secret('inl', { 'z.yml': 'z' })],
    configMaps: [configMap('cmvals', { 'c.yml': 'c: 3' }, { 'bin.yml': bytes('bin') })],
  });

  it('builds the full argv in upstream order', () => {
    const result = plan(
      [
        {
          ytt: {
            ignoreUnknownComments: true,
            strict: true,
            paths: ['config', 'values.yml'],
            inline: {
              paths: { 'b.yml': 'b', 'a.yml': 'a' },
              pathsFrom: [{ secretRef: { name: 'inl', directoryPath: 'sub' } }],
            },
            fileMarks: ['a.yml:type=data', 'b:exclude=true'],
            valuesFrom: [
              { secretRef: { name: 'vals' } },
              { configMapRef: { name: 'cmvals' } },
              { path: 'vals.yml' },
              { path: '../outside.yml' },
              {
                downwardAPI: {
                  items: [
                    { name: 'name', fieldPath: 'metadata.name' },
                    { name: 'ns', fieldPath: '{.metadata.namespace}' },
                  ],
                },
              },
            ],
          },
        },
      ],
      { refs },
    );
    const step = run(result.steps[0]);
    expect(step.bin).toBe('ytt');
    expect(step.args).toEqual([
      '--ignore-unknown-comments',
      '-f',
      '/w/fetch/0/config',
      '-f',
      '/w/fetch/0/values.yml',
      '-f',
      '/w/scratch/0/inline',
      '--file-mark=a.yml:type=data',
      '--file-mark=b:exclude=true',
      '--data-values-file',
      '/w/scratch/0/values/0/a.yml',
      '--data-values-file',
      '/w/scratch/0/values/0/b.yml',
      '--data-values-file',
      '/w/scratch/0/values/1/c.yml',
      '--data-values-file',
      '/w/fetch/0/vals.yml',
      '--data-values-file',
      '/w/scratch/0/values/4/downwardapi_0.yaml',
      '--data-values-file',
      '/w/scratch/0/values/4/downwardapi_1.yaml',
    ]);
    expect(step.args).not.toContain('--strict');
    expect(step.files.map((f) => [f.path, text(f.content), f.sensitive])).toEqual([
      ['/w/scratch/0/inline/a.yml', 'a', false],
      ['/w/scratch/0/inline/b.yml', 'b', false],
      ['/w/scratch/0/inline/sub/z.yml', 'z', true],
      ['/w/scratch/0/values/0/a.yml', 'a: 1', true],
      ['/w/scratch/0/values/0/b.yml', 'b: 2', true],
      ['/w/scratch/0/values/1/c.yml', 'c: 3', false],
      ['/w/scratch/0/values/4/downwardapi_0.yaml', 'name: app\n', false],
      ['/w/scratch/0/values/4/downwardapi_1.yaml', 'ns: ns\n', false],
    ]);
    expect(result.warnings).toEqual([
      "valuesFrom[3].path '../outside.yml' is outside the template root and was ignored",
    ]);
  });

  it('asks for the inline directory to exist even when it gets no files', () => {
    const step = run(plan([{ ytt: { inline: {} } }]).steps[0]);
    expect(step.args).toEqual(['-f', ROOT, '-f', '/w/scratch/0/inline']);
    expect(step.files).toEqual([]);
    expect(step.dirs).toEqual(['/w/scratch/0/inline']);
    expect(run(plan([{ ytt: {} }]).steps[0]).dirs).toEqual([]);
  });

  it('passes -f - for a "-" path when a stream exists', () => {
    const steps = plan([{ helmTemplate: {} }, { ytt: { paths: ['-', 'overlays'] } }]).steps;
    expect(run(steps[1]).args).toEqual(['-f', '-', '-f', '/w/fetch/0/overlays']);
  });

  it.each([
    [{ paths: ['-'] }, 'Expected stdin to be available when using it as path, but was not'],
    [{ paths: ['ok', '../../etc'] }, 'Checking path: Invalid path: ../../etc'],
    [{ inline: { paths: { '../x.yml': 'x' } } }, 'Invalid path: ../x.yml'],
    [{ inline: { pathsFrom: [{ secretRef: { name: 'nope' } }] } }, 'secrets "nope" not found'],
    [{ inline: { pathsFrom: [{ configMapRef: { name: 'nope' } }] } }, 'configmaps "nope" not found'],
    [{ inline: { pathsFrom: [{}] } }, 'Expected either secretRef or configMapRef as a source'],
    [{ valuesFrom: [{ secretRef: { name: 'nope' } }] }, 'Preparing template values: secrets "nope" not found'],
    [{ valuesFrom: [{}] }, 'Preparing template values: Expected either secretRef, configMapRef or path as a source'],
  ])('fails %#: %s', (ytt, message) => {
    expect(plan([{ ytt }], { refs }).steps).toEqual([{ kind: 'fail', index: 0, message }]);
  });

  it('passes a "-" values path through as --data-values-file -', () => {
    const steps = plan([{ ytt: {} }, { ytt: { valuesFrom: [{ path: '-' }] } }]).steps;
    expect(run(steps[1]).args).toEqual(['-f', '-', '--data-values-file', '-']);
  });
});

describe('kbld (pkg/template/kbld.go)', () => {
  it('never builds and resolves paths', () => {
    expect(run(plan([{ kbld: {} }]).steps[0]).args).toEqual(['-f', ROOT, '--build=false']);
    const steps = plan([{ ytt: {} }, { kbld: { paths: ['-', '.imgpkg/images.yml'] } }]).steps;
    expect(run(steps[1]).args).toEqual(['-f', '-', '-f', '/w/fetch/0/.imgpkg/images.yml', '--build=false']);
  });
});

describe('helmTemplate (pkg/template/helm_template.go)', () => {
  const refs = refObjectsFrom({ secrets: [secret('hv', { 'data.yml': 'password: x' })] });

  it('defaults name and namespace to the App, chart path to the root, and disarms the cluster env', () => {
    const step = run(plan([{ helmTemplate: {} }]).steps[0]);
    expect(step.bin).toBe('helm');
    // `=` forms and `--` before the positionals (upstream: `template app <root> --namespace ns ...`),
    // so no user value can be read as a helm flag.
    expect(step.args).toEqual(['template', '--namespace=ns', '--include-crds', '--', 'app', ROOT]);
    expect(step.env).toEqual({ KUBERNETES_SERVICE_HOST: 'not-real', KUBERNETES_SERVICE_PORT: 'not-real' });
    expect(step.errorPrefix).toBe('Templating helm chart: ');
  });

  it('builds the full argv', () => {
    const step = run(
      plan(
        [
          {
            helmTemplate: {
              name: 'rel',
              namespace: 'target',
              path: 'charts/podinfo',
              kubernetesVersion: {},
              kubernetesAPIs: {},
              valuesFrom: [{ secretRef: { name: 'hv' } }, { path: 'charts/podinfo/values-prod.yaml' }],
            },
          },
        ],
        { refs, cluster: { kubernetesVersion: '1.34.1', kubernetesAPIs: ['v1', 'apps/v1'] } },
      ).steps[0],
    );
    expect(step.args).toEqual([
      'template',
      '--namespace=target',
      '--include-crds',
      '--kube-version=1.34.1',
      '--api-versions=v1,apps/v1',
      '--values=/w/scratch/0/values/0/data.yml',
      '--values=/w/fetch/0/charts/podinfo/values-prod.yaml',
      '--',
      'rel',
      '/w/fetch/0/charts/podinfo',
    ]);
  });

  it('honours explicit kubernetesVersion / groupVersions (upstream ignores them here)', () => {
    const step = run(
      plan([
        { helmTemplate: { kubernetesVersion: { version: '1.20.0' }, kubernetesAPIs: { groupVersions: ['x/v1'] } } },
      ]).steps[0],
    );
    expect(step.args.slice(-5, -3)).toEqual(['--kube-version=1.20.0', '--api-versions=x/v1']);
  });

  it('reports a failed live lookup as the step error', () => {
    const steps = plan([{ helmTemplate: { kubernetesVersion: {} } }], {
      cluster: { kubernetesVersion: new Error('boom') },
    }).steps;
    expect(steps).toEqual([{ kind: 'fail', index: 0, message: 'boom' }]);
  });

  it('throws a TypeError when a needed live value was not provided (caller bug)', () => {
    expect(() => plan([{ helmTemplate: { kubernetesAPIs: {} } }])).toThrow(TypeError);
  });

  it('reads values from stdin only on a stream', () => {
    expect(plan([{ helmTemplate: { valuesFrom: [{ path: '-' }] } }]).steps).toEqual([
      { kind: 'fail', index: 0, message: 'Expected stdin to be available when using it as path, but was not' },
    ]);
    const steps = plan([{ ytt: {} }, { helmTemplate: { valuesFrom: [{ path: '-' }] } }]).steps;
    expect(run(steps[1]).args.slice(-4, -3)).toEqual(['--values=-']);
    expect(run(steps[1]).stdin).toBe('previous');
  });

  it('fails a chart path outside the root with the bare upstream text', () => {
    expect(plan([{ helmTemplate: { path: '../chart' } }]).steps).toEqual([
      { kind: 'fail', index: 0, message: 'Invalid path: ../chart' },
    ]);
  });

  it('plans the nginx-helm-git example: helm, ytt overlay on the stream, kbld', () => {
    const docs = parseAllDocuments(
      readFileSync(fixturePath('kapp-controller', 'examples', 'nginx-helm-git.yml'), 'utf8'),
    ).map((d) => d.toJS());
    const app = docs.find((d) => d.kind === 'App');
    const valuesSecret = docs.find((d) => d.kind === 'Secret');
    const r = planTemplate({
      app,
      templateRoot: ROOT,
      scratchRoot: SCRATCH,
      refs: refObjectsFrom({ secrets: [secret('nginx-values', valuesSecret.stringData)] }),
    });
    const steps = r.steps.map(run);
    expect(steps.map((s) => [s.bin, ...s.args])).toEqual([
      [
        'helm',
        'template',
        '--namespace=default',
        '--include-crds',
        '--values=/w/scratch/0/values/0/data.yml',
        '--',
        'nginx',
        ROOT,
      ],
      ['ytt', '--ignore-unknown-comments', '-f', '-', '-f', '/w/scratch/1/inline'],
      ['kbld', '-f', '-', '--build=false'],
    ]);
    expect(steps[1]!.files.map((f) => f.path)).toEqual(['/w/scratch/1/inline/remove-lb.yml']);
  });
});

describe('cue (pkg/template/cue.go)', () => {
  it('plans the cue example with cwd = template root', () => {
    const docs = parseAllDocuments(readFileSync(fixturePath('kapp-controller', 'examples', 'cue.yml'), 'utf8')).map(
      (d) => d.toJS(),
    );
    const app = docs.find((d) => d.kind === 'App');
    const values = readFileSync(fixturePath('kapp-controller-cue-app', 'values.yml'), 'utf8');
    const step = run(
      planTemplate({
        app,
        templateRoot: ROOT,
        scratchRoot: SCRATCH,
        refs: refObjectsFrom({ configMaps: [configMap('cue-values', { 'values.yml': values })] }),
      }).steps[0],
    );
    expect(step.bin).toBe('cue');
    expect(step.args).toEqual([
      'export',
      '--out',
      'yaml',
      // `=` forms and `--` before the positionals (upstream: `. --path config: <values> --expression
      // output`), so no user value can be read as a cue flag.
      '--path=config:',
      '--expression=output',
      '--',
      '.',
      '/w/scratch/0/values/0/values.yml',
    ]);
    expect(step.cwd).toBe(ROOT);
    expect(step.stdin).toBe('none');
    expect(step.files).toEqual([{ path: '/w/scratch/0/values/0/values.yml', content: values, sensitive: false }]);
    // No module registry: a cue.mod/module.cue's deps are not downloaded (upstream's cue would).
    expect(step.env).toEqual({ CUE_REGISTRY: 'none' });
    expect(step.failureHint).toEqual({ stderrIncludes: 'cannot fetch ', message: CUE_MODULE_FETCH_MESSAGE });
  });

  it('passes paths as written after checking their scope', () => {
    expect(run(plan([{ cue: { paths: ['app.cue', 'lib/x.cue'] } }]).steps[0]).args).toEqual([
      'export',
      '--out',
      'yaml',
      '--',
      'app.cue',
      'lib/x.cue',
    ]);
    expect(plan([{ cue: { paths: ['../x.cue'] } }]).steps).toEqual([
      { kind: 'fail', index: 0, message: 'Checking path: Invalid path: ../x.cue' },
    ]);
  });

  it('wraps values errors in "Writing values: "', () => {
    expect(plan([{ cue: { valuesFrom: [{ configMapRef: { name: 'nope' } }] } }]).steps).toEqual([
      { kind: 'fail', index: 0, message: 'Writing values: Preparing template values: configmaps "nope" not found' },
    ]);
  });
});

const ARMORED = `-----BEGIN PGP PRIVATE KEY BLOCK-----

lFgEawzu4BYJKwYBBAHaRw8BAQdA6DoyckbvH5T61uoCZcjmV0ftP5Hy7u7UZLNE
d1twAQwAAP9LAq6zyvaSmDuWEB9gYFVdGw9jEyi5+aI2LarD7+6xQQ/EtCdrYXBw
LWxhbWJkYSB0ZXN0IDx0ZXN0QGV4YW1wbGUuaW52YWxpZD6IkAQTFggAOBYhBOY+
JYrn9kWVuB9Yj1O6Bn9HkEEhBQJrDO7gAhsjBQsJCAcCBhUKCQgLAgQWAgMBAh4B
AheAAAoJEFO6Bn9HkEEhjq8A/AmWhNGl8Q3+3eiUl6EkvNV23/O+zdIzlXE/al6+
qg2PAQCbY+xalGaXQc0bKFn5/ZrZUBuoCykKTXkvHeAcLRGiCA==
=JNve
-----END PGP PRIVATE KEY BLOCK-----
`;
// sha256 of `gpg --dearmor` of ARMORED (a throwaway test key without passphrase).
const DEARMORED_SHA256 = 'ccd181cd4cc05afdec4c3ddd8f6d788fd366769ff3d2e69097f77708c1016409';

describe('sops (pkg/template/sops.go)', () => {
  it('plans age: empty config, key file, env, default target = root', () => {
    const refs = refObjectsFrom({ secrets: [secret('keys', { b: 'AGE-SECRET-KEY-B', a: 'AGE-SECRET-KEY-A' })] });
    const step = plan([{ sops: { age: { privateKeysSecretRef: { name: 'keys' } } } }], { refs }).steps[0] as SopsStep;
    expect(step).toMatchObject({
      kind: 'sops',
      bin: 'sops',
      targets: [ROOT],
      explicitPaths: false,
      args: ['--config=/w/scratch/0/sops/.sops.yml'],
      env: { SOPS_AGE_KEY_FILE: '/w/scratch/0/sops/key.txt' },
      errorPrefix: 'Decrypting dir: ',
    });
    expect(step.files.map((f) => [f.path, text(f.content), f.sensitive])).toEqual([
      ['/w/scratch/0/sops/.sops.yml', '{}', false],
      ['/w/scratch/0/sops/key.txt', 'AGE-SECRET-KEY-A\nAGE-SECRET-KEY-B\n', true],
    ]);
    expect(sopsDecryptCommand(step, '/w/fetch/0/s.sops.yml')).toEqual({
      bin: 'sops',
      args: ['--config=/w/scratch/0/sops/.sops.yml', '--decrypt', '/w/fetch/0/s.sops.yml'],
      // No network for sops (pgp and age only): its proxy refuses everything, loopback included.
      env: {
        SOPS_AGE_KEY_FILE: '/w/scratch/0/sops/key.txt',
        HTTP_PROXY: 'http://127.0.0.1:9',
        HTTPS_PROXY: 'http://127.0.0.1:9',
        http_proxy: 'http://127.0.0.1:9',
        https_proxy: 'http://127.0.0.1:9',
        NO_PROXY: '',
        no_proxy: '',
        KL_PROXY_LOOPBACK: '1',
      },
    });
    expect(sopsDecryptCommand(step, '/w/fetch/0/s.sops.yml').args.some((a) => a.startsWith('--keyservice'))).toBe(
      false,
    );
  });

  it('plans pgp: secring.gpg is the dearmored key block, GNUPGHOME is its dir', () => {
    const refs = refObjectsFrom({ secrets: [secret('pgp', { 'key.asc': ARMORED })] });
    const step = plan(
      [{ sops: { pgp: { privateKeysSecretRef: { name: 'pgp' } }, paths: ['secrets', 'x.sops.yaml'] } }],
      { refs },
    ).steps[0] as SopsStep;
    expect(step.env).toEqual({ GNUPGHOME: '/w/scratch/0/sops', ...DEAD_PROXY_ENV });
    expect(step.targets).toEqual(['/w/fetch/0/secrets', '/w/fetch/0/x.sops.yaml']);
    expect(step.explicitPaths).toBe(true);
    const ring = step.files.find((f) => f.path === '/w/scratch/0/sops/secring.gpg')!;
    expect(ring.sensitive).toBe(true);
    expect(
      createHash('sha256')
        .update(ring.content as Uint8Array)
        .digest('hex'),
    ).toBe(DEARMORED_SHA256);
  });

  it.each([
    [{}, 'Unsupported SOPS strategy'],
    [{ age: {} }, 'Building config: Getting private keys secret: Expected privateKeysSecretRef to be specified'],
    [
      { age: { privateKeysSecretRef: { name: 'nope' } } },
      'Building config: Getting private keys secret: secrets "nope" not found',
    ],
    [
      { age: { privateKeysSecretRef: { name: 'keys' } }, paths: ['../x'] },
      'Decrypting dir: Checking path: Invalid path: ../x',
    ],
    [
      { pgp: { privateKeysSecretRef: { name: 'keys' } } },
      'Building config: Generating secring.gpg: Reading private keys: openpgp: invalid argument: no armored data found',
    ],
  ])('fails %#: %s', (sops, message) => {
    const refs = refObjectsFrom({ secrets: [secret('keys', { k: 'AGE-SECRET-KEY-1' })] });
    expect(plan([{ sops }], { refs }).steps).toEqual([{ kind: 'fail', index: 0, message }]);
  });

  it('dearmors strictly', () => {
    expect(() => dearmorPrivateKeyBlock(ARMORED.replace('=JNve', '=AAAA'))).toThrow(
      'openpgp: invalid data: armor invalid',
    );
    expect(() => dearmorPrivateKeyBlock(ARMORED.replaceAll('PRIVATE', 'PUBLIC'))).toThrow(
      'Expected to find private key within entity',
    );
    expect(() => dearmorPrivateKeyBlock(ARMORED.replaceAll('PGP PRIVATE KEY BLOCK', 'PGP MESSAGE'))).toThrow(
      'openpgp: invalid argument: expected public or private key block, got: PGP MESSAGE',
    );
    expect(() => dearmorPrivateKeyBlock(ARMORED.replace('-----END PGP PRIVATE KEY BLOCK-----', ''))).toThrow(
      'armor invalid',
    );
    const withHeader = ARMORED.replace('BLOCK-----\n\n', 'BLOCK-----\nVersion: x\n\n');
    expect(createHash('sha256').update(dearmorPrivateKeyBlock(withHeader)).digest('hex')).toBe(DEARMORED_SHA256);
  });

  it('maps sops file names and formats per-file failures', () => {
    expect(sopsDecryptedPath('/a/secret.sops.yml')).toBe('/a/secret.yml');
    expect(sopsDecryptedPath('/a/secret.sops.yaml')).toBe('/a/secret.yaml');
    expect(sopsDecryptedPath('/a/secret.yml')).toBeUndefined();
    expect(sopsDecryptFailureMessage('/a/s.sops.yml', 'no key', 'exit status 128')).toBe(
      "Decrypting dir: Decrypting file '/a/s.sops.yml': Running sops: no key, exit status 128",
    );
  });
});

describe('requiredClusterInfo', () => {
  it('asks only for live values that will be read', () => {
    expect(requiredClusterInfo([{ ytt: {} }, { helmTemplate: { kubernetesVersion: { version: '1.2.3' } } }])).toEqual({
      kubernetesVersion: false,
      kubernetesAPIs: false,
      kappControllerVersion: false,
    });
    expect(
      requiredClusterInfo([
        { helmTemplate: { kubernetesAPIs: {} } },
        {
          ytt: {
            valuesFrom: [
              {
                downwardAPI: {
                  items: [
                    { name: 'a', fieldPath: 'metadata.name', kubernetesVersion: {} },
                    { name: 'b', kappControllerVersion: {} },
                  ],
                },
              },
            ],
          },
        },
      ]),
    ).toEqual({ kubernetesVersion: false, kubernetesAPIs: true, kappControllerVersion: true });
    expect(
      requiredClusterInfo([
        { cue: { valuesFrom: [{ downwardAPI: { items: [{ name: 'v', kubernetesVersion: {} }] } }] } },
      ]),
    ).toEqual({
      kubernetesVersion: true,
      kubernetesAPIs: false,
      kappControllerVersion: false,
    });
  });
});
