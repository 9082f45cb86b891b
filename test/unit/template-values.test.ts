import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { type AppTemplateValuesDownwardAPIItem, refObjectsFrom } from '../../functions/lib/api/index.js';
import { KappControllerError } from '../../functions/lib/reconcile/result.js';
import {
  type ClusterInfo,
  downwardAPIValuesYaml,
  evaluateFieldPath,
  planValues,
  relaxedJSONPathExpression,
  splitWithEscaping,
  type ValuesContext,
} from '../../functions/lib/template/index.js';

const meta = {
  name: 'simple-app',
  namespace: 'kappctrl-test',
  uid: '0b6c1c2a-uid',
  labels: { expectedLabel: 'expectedLabelValue' },
  annotations: {
    expectedAnnotation: 'expectedAnnotationValue',
    anotherExpectedAnnotation: 'another',
    'kapp.k14s.io/x': 'dotted',
  },
};
const bytes = (s: string) => Buffer.from(s);
const text = (c: string | Uint8Array) => (typeof c === 'string' ? c : Buffer.from(c).toString('utf8'));

function ctx(cluster: ClusterInfo = {}): ValuesContext {
  return {
    templateRoot: '/t',
    metadata: meta,
    cluster,
    refs: refObjectsFrom({
      secrets: [
        { metadata: { name: 's' }, data: { 'z.yml': bytes('z: 1'), 'a.yml': bytes('a: 1'), 'm.yml': bytes('m: 1') } },
      ],
      configMaps: [
        { metadata: { name: 'c' }, data: { 'v.yml': 'from_cm: true' }, binaryData: { 'b.yml': bytes('x') } },
      ],
    }),
  };
}

describe('planValues (pkg/template/values.go AsPaths)', () => {
  it('orders sources as given and Secret/ConfigMap keys by name, one directory per source', () => {
    const p = planValues(
      [{ configMapRef: { name: 'c' } }, { secretRef: { name: 's' } }, { path: 'vals.yml' }, { path: '-' }],
      '/v',
      ctx(),
    );
    expect(p.paths).toEqual(['/v/0/v.yml', '/v/1/a.yml', '/v/1/m.yml', '/v/1/z.yml', '/t/vals.yml', '-']);
    expect(p.files.map((f) => [f.path, text(f.content), f.sensitive])).toEqual([
      ['/v/0/v.yml', 'from_cm: true', false],
      ['/v/1/a.yml', 'a: 1', true],
      ['/v/1/m.yml', 'm: 1', true],
      ['/v/1/z.yml', 'z: 1', true],
    ]);
    expect(p.warnings).toEqual([]);
  });

  it('silently drops a path outside the template root (upstream quirk), with a warning', () => {
    const p = planValues([{ path: '../../etc/passwd' }, { path: 'ok.yml' }], '/v', ctx());
    expect(p.paths).toEqual(['/t/ok.yml']);
    expect(p.warnings).toHaveLength(1);
  });

  it.each([
    [{ secretRef: { name: 'nope' } }, 'Preparing template values: secrets "nope" not found'],
    [{ configMapRef: { name: 'nope' } }, 'Preparing template values: configmaps "nope" not found'],
    [{ path: '' }, 'Preparing template values: Expected either secretRef, configMapRef or path as a source'],
    [
      { downwardAPI: { items: [{ name: 'x', fieldPath: 'metadata.generation' }] } },
      'Preparing template values: generation is not found',
    ],
  ])('fails %#: %s', (source, message) => {
    expect(() => planValues([source], '/v', ctx())).toThrowError(new KappControllerError(message));
  });

  it('rejects a Secret key that would escape the values directory', () => {
    const c = ctx();
    c.refs = refObjectsFrom({ secrets: [{ metadata: { name: 's' }, data: { '..': bytes('x') } }] });
    expect(() => planValues([{ secretRef: { name: 's' } }], '/v', c)).toThrow(
      'Preparing template values: Invalid path: ..',
    );
  });

  it('writes downward API items as downwardapi_<idx>.yaml', () => {
    const p = planValues(
      [
        {
          downwardAPI: {
            items: [
              { name: 'a', fieldPath: 'metadata.name' },
              { name: 'b', fieldPath: 'metadata.uid' },
            ],
          },
        },
      ],
      '/v',
      ctx(),
    );
    expect(p.paths).toEqual(['/v/0/downwardapi_0.yaml', '/v/0/downwardapi_1.yaml']);
    expect(p.files.map((f) => text(f.content))).toEqual(['a: simple-app\n', 'b: 0b6c1c2a-uid\n']);
  });
});

describe('downward API (pkg/template/downward_api_values.go)', () => {
  it.each(['metadata.name', '.metadata.name', '{metadata.name}', '{.metadata.name}'])(
    'accepts the spelling %s',
    (fieldPath) => {
      expect(relaxedJSONPathExpression(fieldPath)).toBe('{.metadata.name}');
      expect(downwardAPIValuesYaml([{ name: 'name', fieldPath }], meta, {})).toEqual(['name: simple-app\n']);
    },
  );

  it.each(['{a}{b}', '{metadata.name', '{}'])('rejects the malformed path %s', (fieldPath) => {
    expect(() => relaxedJSONPathExpression(fieldPath)).toThrow(
      "unexpected path string, expected a 'name1.name2' or '.name1.name2' or '{name1.name2}' or '{.name1.name2}'",
    );
  });

  it('renders the values of upstream e2e Test_YttTemplate_ValuesFrom', () => {
    const items: AppTemplateValuesDownwardAPIItem[] = [
      { name: 'name', fieldPath: 'metadata.name' },
      { name: 'namespace', fieldPath: 'metadata.namespace' },
      { name: 'uid', fieldPath: 'metadata.uid' },
      { name: 'annotation', fieldPath: "metadata.annotations['expectedAnnotation']" },
      { name: 'label', fieldPath: "metadata.labels['expectedLabel']" },
      { name: 'allAnnotations', fieldPath: 'metadata.annotations' },
      { name: 'kubernetesVersion', kubernetesVersion: { version: '1.0.0' } },
      { name: 'kcVersion', kappControllerVersion: { version: '2.0.0' } },
      { name: 'k8sAPIs', kubernetesAPIs: { groupVersions: ['test/test', 'test2/test2'] } },
    ];
    const merged = Object.assign({}, ...downwardAPIValuesYaml(items, meta, {}).map((d) => parse(d)));
    expect(merged).toEqual({
      name: 'simple-app',
      namespace: 'kappctrl-test',
      uid: '0b6c1c2a-uid',
      annotation: 'expectedAnnotationValue',
      label: 'expectedLabelValue',
      allAnnotations: meta.annotations,
      kubernetesVersion: '1.0.0',
      kcVersion: '2.0.0',
      k8sAPIs: ['test/test', 'test2/test2'],
    });
  });

  it('nests fieldPath values under dotted names, with \\. as a literal dot', () => {
    expect(
      downwardAPIValuesYaml([{ name: 'app.meta.name', fieldPath: 'metadata.name' }], meta, {}).map((d) => parse(d)),
    ).toEqual([{ app: { meta: { name: 'simple-app' } } }]);
    expect(
      downwardAPIValuesYaml([{ name: 'a\\.b', fieldPath: 'metadata.name' }], meta, {}).map((d) => parse(d)),
    ).toEqual([{ 'a.b': 'simple-app' }]);
  });

  it('keys version items by the literal name (no nesting), as upstream', () => {
    expect(
      downwardAPIValuesYaml([{ name: 'k8s.version', kubernetesVersion: { version: '1.2.3' } }], meta, {}).map((d) =>
        parse(d),
      ),
    ).toEqual([{ 'k8s.version': '1.2.3' }]);
  });

  it('uses live values when no explicit value is given, and their failure text', () => {
    const cluster: ClusterInfo = {
      kubernetesVersion: '1.34.1',
      kubernetesAPIs: ['v1', 'apps/v1'],
      kappControllerVersion: '0.53.1',
    };
    expect(
      downwardAPIValuesYaml(
        [
          { name: 'v', kubernetesVersion: {} },
          { name: 'kc', kappControllerVersion: { version: '' } },
          { name: 'apis', kubernetesAPIs: {} },
          { name: 'none', kubernetesAPIs: { groupVersions: [] } },
        ],
        meta,
        cluster,
      ).map((d) => parse(d)),
    ).toEqual([{ v: '1.34.1' }, { kc: '0.53.1' }, { apis: ['v1', 'apps/v1'] }, { none: [] }]);
    expect(() =>
      downwardAPIValuesYaml([{ name: 'v', kubernetesVersion: {} }], meta, {
        kubernetesVersion: new Error('Unable to get server version'),
      }),
    ).toThrow('Unable to get server version');
    expect(() => downwardAPIValuesYaml([{ name: 'v', kubernetesVersion: {} }], meta, {})).toThrow(TypeError);
  });

  it.each([
    [
      { name: '.a', fieldPath: 'metadata.name' },
      "Invalid name was provided '.a' (hint: separate paths should only use a single '.' character)",
    ],
    [
      { name: 'a.', fieldPath: 'metadata.name' },
      "Invalid name was provided 'a.' (hint: separate paths should only use a single '.' character)",
    ],
    [
      { name: 'a..b', kubernetesVersion: {} },
      "Invalid name was provided 'a..b' (hint: separate paths should only use a single '.' character)",
    ],
    [{ name: 'a' }, 'Invalid downward API item given'],
    [{ name: 'a', fieldPath: "metadata.labels['missing']" }, 'missing is not found'],
    [{ name: 'a', fieldPath: 'spec.fetch' }, 'spec is not found'],
    [{ name: 'a', fieldPath: 'metadata.name.x' }, 'x is not found'],
  ] as Array<[AppTemplateValuesDownwardAPIItem, string]>)('fails %#: %s', (item, message) => {
    expect(() => downwardAPIValuesYaml([item], meta, {})).toThrow(message);
  });

  it('evaluates like client-go jsonpath over PartialObjectMetadata', () => {
    expect(evaluateFieldPath("{.metadata.annotations['kapp.k14s.io/x']}", meta)).toBe('dotted');
    expect(evaluateFieldPath('{.metadata.annotations.kapp\\.k14s\\.io/x}', meta)).toBe('dotted');
    expect(evaluateFieldPath('{.metadata.labels}', meta)).toEqual({ expectedLabel: 'expectedLabelValue' });
    expect(evaluateFieldPath('{.metadata.labels}', { name: 'x' })).toEqual({});
    expect(evaluateFieldPath('{.kind}', meta)).toBe('');
    expect(evaluateFieldPath('{.metadata.Name}', meta)).toBe('simple-app');
    expect(evaluateFieldPath('{.metadata}', meta)).toEqual({
      name: 'simple-app',
      namespace: 'kappctrl-test',
      uid: '0b6c1c2a-uid',
      labels: meta.labels,
      annotations: meta.annotations,
    });
    expect(() => evaluateFieldPath('{.metadata.labels[*]}', meta)).toThrow('unsupported JSONPath expression');
    expect(() => evaluateFieldPath('{..name}', meta)).toThrow('unsupported JSONPath expression');
  });

  it('splits names like Go splitWithEscaping', () => {
    expect(splitWithEscaping('a.b\\.c.d')).toEqual(['a', 'b.c', 'd']);
    expect(splitWithEscaping('a\\')).toEqual(['a\\']);
    expect(splitWithEscaping('')).toEqual(['']);
  });
});
