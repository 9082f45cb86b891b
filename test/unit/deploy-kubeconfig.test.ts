import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import type { SecretLike } from '../../functions/lib/api/index.js';
import {
  type AppDeploySpec,
  appClusterAccess,
  credentialSource,
  kubeconfigFromSecret,
  restrictKubeconfig,
  serviceAccountKubeconfig,
  UPSTREAM_SA_SERVER,
} from '../../functions/lib/deploy/index.js';
import { KappControllerError } from '../../functions/lib/reconcile/result.js';

const TOKEN = 'eyJhbGciOiJSUzI1NiJ9.super-secret-token';
const CA_B64 = Buffer.from('-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n').toString('base64');
const b64 = (s: string) => Buffer.from(s).toString('base64');
const bytes = (s: string) => Buffer.from(s);

const FULL = `apiVersion: v1
kind: Config
preferences: {colors: true}
current-context: ctx-b
clusters:
- name: c1
  cluster:
    server: https://1.2.3.4:6443
    tls-server-name: api.local
    insecure-skip-tls-verify: true
    certificate-authority: /etc/ca.crt
    certificate-authority-data: ${CA_B64}
    proxy-url: http://proxy:3128
    disable-compression: true
    extensions: [{name: e, extension: {}}]
users:
- name: u1
  user:
    client-certificate: /home/u/cert.pem
    client-certificate-data: ${b64('CERT')}
    client-key: /home/u/key.pem
    client-key-data: ${b64('KEY')}
    token: ${TOKEN}
    tokenFile: /var/run/token
    as: admin
    as-uid: "1"
    as-groups: [g1, g2]
    as-user-extra: {scopes: [a, b]}
    username: user
    password: pw
    auth-provider: {name: oidc, config: {idp-issuer-url: https://idp}}
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/steal-credentials
- name: u2
  user:
    exec: {command: aws}
contexts:
- name: ctx-a
  context: {cluster: c1, user: u1}
- name: ctx-b
  context: {cluster: c1, user: u2, namespace: team-b}
extensions: [{name: x}]
`;

describe('restrictKubeconfig (kubeconfig_restricted.go)', () => {
  it('keeps only the allowed fields: no exec plugins, no file paths', () => {
    const r = restrictKubeconfig(FULL);
    expect(parse(r.yaml)).toEqual({
      apiVersion: 'v1',
      kind: 'Config',
      preferences: {},
      'current-context': 'ctx-b',
      clusters: [
        {
          name: 'c1',
          cluster: {
            server: 'https://1.2.3.4:6443',
            'tls-server-name': 'api.local',
            'insecure-skip-tls-verify': true,
            'certificate-authority-data': CA_B64,
            'proxy-url': 'http://proxy:3128',
          },
        },
      ],
      users: [
        {
          name: 'u1',
          user: {
            'client-certificate-data': b64('CERT'),
            'client-key-data': b64('KEY'),
            token: TOKEN,
            as: 'admin',
            'as-groups': ['g1', 'g2'],
            'as-user-extra': { scopes: ['a', 'b'] },
            username: 'user',
            password: 'pw',
            'auth-provider': { name: 'oidc', config: { 'idp-issuer-url': 'https://idp' } },
          },
        },
        { name: 'u2', user: {} },
      ],
      contexts: [
        { name: 'ctx-a', context: { cluster: 'c1', user: 'u1' } },
        { name: 'ctx-b', context: { cluster: 'c1', user: 'u2', namespace: 'team-b' } },
      ],
    });
    for (const banned of [
      'exec',
      'steal-credentials',
      'tokenFile',
      '/etc/ca.crt',
      '/home/u',
      'as-uid',
      'extensions',
      'colors',
    ]) {
      expect(r.yaml).not.toContain(banned);
    }
    expect(r.defaultNamespace).toBe('team-b');
  });

  it('defaults the namespace to "default" and renders empty lists as null, as Go', () => {
    const r = restrictKubeconfig('clusters: [{name: c, cluster: {}}]\ncurrent-context: missing\n');
    expect(r.defaultNamespace).toBe('default');
    expect(parse(r.yaml)).toEqual({
      clusters: [{ name: 'c', cluster: { server: '' } }],
      contexts: null,
      'current-context': 'missing',
      preferences: {},
      users: null,
    });
    expect(r.yaml.split('\n')[0]).toBe('clusters:');
  });

  it.each([
    ['users: []\n', 'Expected to find at least one cluster in kubeconfig'],
    ['', 'Expected to find at least one cluster in kubeconfig'],
    [
      `clusters: [{name: c, cluster: {server: x}}]\nusers: [{name: u, user: {token: [${TOKEN}]}}]\n`,
      'Parsing kubeconfig: expected a string at users[0].user.token',
    ],
    [
      `clusters: [{name: c, cluster: {certificate-authority-data: "not base64 ${TOKEN}"}}]\n`,
      'Parsing kubeconfig: illegal base64 data at clusters[0].cluster.certificate-authority-data',
    ],
    ['- a\n', 'Parsing kubeconfig: expected a mapping at the top level'],
  ])('fails %#: %s', (input, message) => {
    expect(() => restrictKubeconfig(input)).toThrowError(new KappControllerError(message));
  });

  it('never puts kubeconfig content into errors', () => {
    let message = '';
    try {
      restrictKubeconfig(`users:\n- name: u\n  user:\n    token: "${TOKEN}\n  bad: [`);
    } catch (err) {
      message = (err as Error).message;
      expect((err as Error).cause).toBeUndefined();
    }
    expect(message).toMatch(/^Parsing kubeconfig: invalid YAML/);
    expect(message).not.toContain('super-secret');
  });
});

describe('ServiceAccount kubeconfig (service_accounts.go)', () => {
  it('builds dst-cluster/dst-user/dst-ctx with the App namespace', () => {
    const r = serviceAccountKubeconfig({
      token: TOKEN,
      caCert: 'CA-PEM',
      namespace: 'apps',
      server: UPSTREAM_SA_SERVER,
    });
    expect(r.defaultNamespace).toBe('apps');
    expect(parse(r.yaml)).toEqual({
      apiVersion: 'v1',
      kind: 'Config',
      preferences: {},
      clusters: [
        {
          name: 'dst-cluster',
          cluster: {
            'certificate-authority-data': b64('CA-PEM'),
            // biome-ignore lint/suspicious/noTemplateCurlyInString: the literal kapp expands
            server: 'https://${KAPP_KUBERNETES_SERVICE_HOST_PORT}',
          },
        },
      ],
      users: [{ name: 'dst-user', user: { token: TOKEN } }],
      contexts: [{ name: 'dst-ctx', context: { cluster: 'dst-cluster', namespace: 'apps', user: 'dst-user' } }],
      'current-context': 'dst-ctx',
    });
  });

  it('quotes awkward tokens safely', () => {
    const r = serviceAccountKubeconfig({
      token: 'a"b: c\n#d',
      caCert: new Uint8Array([1, 2]),
      namespace: 'n',
      server: 'https://s',
    });
    expect(parse(r.yaml).users[0].user.token).toBe('a"b: c\n#d');
  });

  it('gives each input its own kubeconfig when asked again (a rotated token, another namespace)', () => {
    const input = { token: 't1', caCert: 'CA-PEM', namespace: 'n1', server: 'https://s' };
    const first = serviceAccountKubeconfig(input);
    expect(serviceAccountKubeconfig({ ...input })).toEqual(first);
    const rotated = serviceAccountKubeconfig({ ...input, token: 't2' });
    expect(parse(rotated.yaml).users[0].user.token).toBe('t2');
    const other = serviceAccountKubeconfig({ ...input, namespace: 'n2', caCert: new TextEncoder().encode('CA-PEM') });
    expect(other.defaultNamespace).toBe('n2');
    expect(parse(other.yaml).contexts[0].context.namespace).toBe('n2');
    // a caller changing its copy does not change what the next caller gets
    first.defaultNamespace = 'changed';
    expect(serviceAccountKubeconfig(input).defaultNamespace).toBe('n1');
  });
});

describe('credentials and namespaces (kubeconfig.go ClusterAccess)', () => {
  const kubeconfig = (ns?: string) =>
    `clusters: [{name: c, cluster: {server: https://remote}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u${ns ? `, namespace: ${ns}` : ''}}}]\ncurrent-context: x\n`;
  const secret = (ns?: string, key = 'value'): SecretLike => ({
    metadata: { name: 'kc' },
    data: { [key]: bytes(kubeconfig(ns)) },
  });
  const sa = { kind: 'serviceAccount' as const, token: TOKEN, caCert: 'CA', server: 'https://api' };

  it('prefers the ServiceAccount over the cluster', () => {
    expect(
      credentialSource({ serviceAccountName: 'sa', cluster: { kubeconfigSecretRef: { name: 'kc' } } }, 'ns'),
    ).toEqual({
      kind: 'serviceAccount',
      serviceAccountName: 'sa',
      namespace: 'ns',
    });
    expect(credentialSource({ cluster: { kubeconfigSecretRef: { name: 'kc' } } }, 'ns')).toEqual({
      kind: 'kubeconfigSecret',
      secretName: 'kc',
      key: 'value',
      namespace: 'ns',
    });
  });

  it.each([
    [{}, 'Preparing kapp: Expected service account or cluster specified'],
    [{ cluster: { namespace: 'x' } }, 'Preparing kapp: Expected kubeconfig secret reference to be specified'],
  ] as Array<[AppDeploySpec, string]>)('fails %#: %s', (spec, message) => {
    expect(() => credentialSource(spec, 'ns')).toThrowError(new KappControllerError(message));
  });

  it.each([
    // [spec, material, --namespace, --app-namespace]  (default_namespace_test.go matrix)
    [{ serviceAccountName: 'sa' }, sa, '', 'app-ns'],
    [{ serviceAccountName: 'sa', defaultNamespace: 'X' }, sa, 'X', 'app-ns'],
    [
      { cluster: { namespace: 'C', kubeconfigSecretRef: { name: 'kc' } } },
      { kind: 'kubeconfigSecret', secret: secret() },
      'C',
      'C',
    ],
    [
      { defaultNamespace: 'X', cluster: { namespace: 'C', kubeconfigSecretRef: { name: 'kc' } } },
      { kind: 'kubeconfigSecret', secret: secret() },
      'X',
      'C',
    ],
    [
      { defaultNamespace: 'X', cluster: { kubeconfigSecretRef: { name: 'kc' } } },
      { kind: 'kubeconfigSecret', secret: secret() },
      'X',
      'default',
    ],
    [
      { defaultNamespace: 'X', cluster: { kubeconfigSecretRef: { name: 'kc' } } },
      { kind: 'kubeconfigSecret', secret: secret('kc-ns') },
      'X',
      'kc-ns',
    ],
    [
      { cluster: { kubeconfigSecretRef: { name: 'kc' } } },
      { kind: 'kubeconfigSecret', secret: secret('kc-ns') },
      '',
      '',
    ],
  ] as const)('matrix %#', (spec, material, namespace, deployNamespace) => {
    const access = appClusterAccess({ name: 'app', namespace: 'app-ns', spec }, material);
    expect({ namespace: access.namespace, deployNamespace: access.deployNamespace }).toEqual({
      namespace,
      deployNamespace,
    });
    expect(access.name).toBe('app');
    expect(access.kubeconfigYaml).toContain('current-context');
  });

  it('reads the kubeconfig from the given key and reports missing keys sorted', () => {
    expect(kubeconfigFromSecret(secret(undefined, 'config'), 'config')).toContain('https://remote');
    const s: SecretLike = { data: { zeta: bytes(''), alpha: bytes('') } };
    expect(() => kubeconfigFromSecret(s)).toThrow("Expected to find key 'value' in secret (keys: alpha, zeta)");
    expect(() =>
      appClusterAccess(
        { name: 'a', namespace: 'n', spec: { cluster: { kubeconfigSecretRef: { name: 'kc', key: 'cfg' } } } },
        { kind: 'kubeconfigSecret', secret: secret() },
      ),
    ).toThrowError(new KappControllerError("Preparing kapp: Expected to find key 'cfg' in secret (keys: value)"));
  });

  it('prefixes kubeconfig parse errors with "Preparing kapp: "', () => {
    const bad: SecretLike = { data: { value: bytes('users: []') } };
    expect(() =>
      appClusterAccess(
        { name: 'a', namespace: 'n', spec: { cluster: { kubeconfigSecretRef: { name: 'kc' } } } },
        { kind: 'kubeconfigSecret', secret: bad },
      ),
    ).toThrowError(new KappControllerError('Preparing kapp: Expected to find at least one cluster in kubeconfig'));
  });
});
