/**
 * The fleet's cluster registry: document validation, the EKS token (checked against an
 * independent SigV4 computation and against the AWS SDK's own presigner), token caching, the secret-store token source, the
 * store-backed registry's loading and TTL, and the `cluster` command. Fakes only at the ports:
 * fixed credentials and clock for the signer, MemoryStore, a temp directory secret store.
 */
import { createHash, createHmac } from 'node:crypto';
import { mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Sha256 } from '@smithy/core/checksum';
import { HttpRequest } from '@smithy/core/transport';
import { SignatureV4 } from '@smithy/signature-v4';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import {
  DirSecretStore,
  EKS_TOKEN_PREFIX,
  EksTokenSource,
  jwtExpiry,
  presignGetCallerIdentity,
  SecretTokenSource,
} from '../../functions/lib/kube/bearer.js';
import {
  type ClusterDoc,
  clusterDocKey,
  InvalidClusterDocumentError,
  parseClusterDoc,
  parseRegistryLocation,
} from '../../functions/lib/kube/cluster-doc.js';
import { StoreClusterRegistry } from '../../functions/lib/kube/fleet-registry.js';
import { UnknownClusterError } from '../../functions/lib/kube/port.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  clusterDocOf,
  endpointReachWarning,
  listClusters,
  main,
  putCluster,
  rbacManifests,
  recordedClusterDoc,
  retargetPolicyNamespace,
} from '../../scripts/cluster-registry.js';
import { captured } from './support/captured.js';

// A self-signed certificate (only its shape matters here).
const CA_PEM = `-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUQm9ndXNDZXJ0aWZpY2F0ZUZvclRlc3RzMAoGCCqGSM49BAMCMA8xDTALBgNVBAMMBHRl
c3QwHhcNMjYwMTAxMDAwMDAwWhcNMjcwMTAxMDAwMDAwWjAPMQ0wCwYDVQQDDAR0ZXN0MFkwEwYHKoZIzj0CAQYI
-----END CERTIFICATE-----
`;
const CA_DATA = Buffer.from(CA_PEM).toString('base64');

function eksDoc(id = 'prod-eu-1'): ClusterDoc {
  return {
    apiVersion: 'kapp-lambda/v1',
    kind: 'Cluster',
    id,
    endpoint: 'https://abc.gr7.eu-west-1.eks.amazonaws.com',
    caData: CA_DATA,
    auth: { kind: 'eks', clusterName: 'prod-eu-1', region: 'eu-west-1' },
  };
}

function tokenDoc(id: string, secrets: Record<string, string>): ClusterDoc {
  return { ...eksDoc(id), endpoint: 'https://127.0.0.1:6443', auth: { kind: 'token', secrets } };
}

function problemsOf(doc: unknown, key = clusterDocKey('prod-eu-1')): string[] {
  try {
    parseClusterDoc(key, typeof doc === 'string' ? doc : JSON.stringify(doc));
  } catch (e) {
    expect(e).toBeInstanceOf(InvalidClusterDocumentError);
    expect((e as Error).message).not.toContain(CA_DATA.slice(0, 20));
    return [...(e as InvalidClusterDocumentError).problems];
  }
  throw new Error('expected the document to be refused');
}

describe('cluster documents', () => {
  it('accepts an eks and a token document', () => {
    expect(parseClusterDoc(clusterDocKey('prod-eu-1'), JSON.stringify(eksDoc()))).toEqual(eksDoc());
    const t = tokenDoc('edge-7', {
      fetch: 'kapp-lambda/edge-7/fetch',
      deploy: 'arn:aws:secretsmanager:eu-west-1:1:secret:x',
    });
    expect(parseClusterDoc('clusters/edge-7.json', JSON.stringify(t))).toEqual(t);
    const withForwarder = { ...eksDoc(), forwarder: { roleId: 'AROAEXAMPLEID1234567' } };
    expect(parseClusterDoc(clusterDocKey('prod-eu-1'), JSON.stringify(withForwarder))).toEqual(withForwarder);
    const withGlobal = { ...eksDoc(), packagingGlobalNamespaceUid: '3f0c2a4e-1b2c-4d5e-8f90-0123456789ab' };
    expect(parseClusterDoc(clusterDocKey('prod-eu-1'), JSON.stringify(withGlobal))).toEqual(withGlobal);
  });

  it.each([
    [
      'an http endpoint',
      { endpoint: 'http://abc.example' },
      'endpoint: expected an https:// URL without path, query or credentials',
    ],
    [
      'an endpoint with a path',
      { endpoint: 'https://abc.example/api' },
      'endpoint: expected an https:// URL without path, query or credentials',
    ],
    [
      'an endpoint with credentials',
      { endpoint: 'https://u:p@abc.example' },
      'endpoint: expected an https:// URL without path, query or credentials',
    ],
    [
      'a CA that is not PEM',
      { caData: Buffer.from('hello').toString('base64') },
      'caData: expected base64 of a PEM certificate bundle',
    ],
    ['an unknown field', { token: 'x' }, '(document): Unrecognized key: "token"'],
    ['another version', { apiVersion: 'kapp-lambda/v2' }, 'apiVersion: Invalid input: expected "kapp-lambda/v1"'],
    ['a bad region', { auth: { kind: 'eks', clusterName: 'a', region: 'EU' } }, 'auth.region: expected an AWS region'],
    [
      'an unknown auth kind',
      { auth: { kind: 'password' } },
      "auth.kind: Invalid discriminator value. Expected 'eks' | 'token'",
    ],
    [
      'a secret name with ..',
      { auth: { kind: 'token', secrets: { fetch: 'a/../b' } } },
      'auth.secrets.fetch: expected no empty, "." or ".." segment',
    ],
    [
      "an IAM user's id as the forwarder",
      { forwarder: { roleId: 'AIDAEXAMPLEID1234567' } },
      'forwarder.roleId: expected an IAM role id (AROA…)',
    ],
    [
      'a global namespace uid that is not a uid',
      { packagingGlobalNamespaceUid: 'kapp-controller-packaging-global' },
      'packagingGlobalNamespaceUid: expected a Kubernetes uid (a UUID)',
    ],
    [
      'a secret for a stage that does not exist',
      { auth: { kind: 'token', secrets: { forwarder: 'x' } } },
      'auth.secrets: Unrecognized key: "forwarder"',
    ],
  ])('refuses %s', (_what, patch, problem) => {
    const got = problemsOf({ ...eksDoc(), ...patch });
    expect(got.some((p) => p.startsWith(problem))).toBe(true);
  });

  it('refuses a document whose id is not its key, and one that is not JSON', () => {
    expect(problemsOf(eksDoc('other'))).toEqual(['id: does not match the key']);
    expect(problemsOf('{')).toEqual(['not valid JSON']);
  });

  it('parses registry locations', () => {
    expect(parseRegistryLocation('s3://fleet/kapp-lambda')).toEqual({
      kind: 's3',
      bucket: 'fleet',
      prefix: 'kapp-lambda/',
    });
    expect(parseRegistryLocation('s3://fleet')).toEqual({ kind: 's3', bucket: 'fleet', prefix: '' });
    expect(parseRegistryLocation('file:///srv/reg')).toEqual({ kind: 'dir', root: '/srv/reg' });
    for (const bad of ['fleet/x', 'https://fleet/x', 's3://Fleet/x', 's3://fleet/x?y=1', 'file://host/x']) {
      expect(() => parseRegistryLocation(bad)).toThrow('expected s3://bucket/prefix or file:///absolute/dir');
    }
  });
});

const CREDS = {
  accessKeyId: 'AKIDEXAMPLE',
  secretAccessKey: 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY',
  sessionToken: 'SESSION/TOKEN+1',
};
const T0 = new Date('2026-12-01T10:00:00.000Z');

/** SigV4 of a presigned GET with the given signed headers, computed here from the spec (not the SDK). */
function expectedSignature(url: URL, headers: Record<string, string>): string {
  const params = [...url.searchParams.entries()].filter(([k]) => k !== 'X-Amz-Signature');
  const enc = (s: string) =>
    encodeURIComponent(s).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  const query = params
    .map(([k, v]) => [enc(k), enc(v)])
    .sort(([a = ''], [b = '']) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`)
    .join('&');
  const names = Object.keys(headers).sort();
  const canonical = [
    'GET',
    '/',
    query,
    ...names.map((n) => `${n}:${headers[n]}`),
    '',
    names.join(';'),
    createHash('sha256').update('').digest('hex'),
  ].join('\n');
  const date = url.searchParams.get('X-Amz-Date') ?? '';
  const scope = `${date.slice(0, 8)}/eu-west-1/sts/aws4_request`;
  const toSign = ['AWS4-HMAC-SHA256', date, scope, createHash('sha256').update(canonical).digest('hex')].join('\n');
  let key: Buffer = createHmac('sha256', `AWS4${CREDS.secretAccessKey}`).update(date.slice(0, 8)).digest();
  for (const part of ['eu-west-1', 'sts', 'aws4_request']) key = createHmac('sha256', key).update(part).digest();
  return createHmac('sha256', key).update(toSign).digest('hex');
}

describe('EKS tokens', () => {
  it('is a presigned STS GetCallerIdentity URL signed with x-k8s-aws-id, as aws-iam-authenticator makes it', async () => {
    const source = new EksTokenSource({
      clusterName: 'prod-eu-1',
      region: 'eu-west-1',
      credentials: CREDS,
      now: () => T0,
    });
    const { token, expiresAt } = await source.token();
    expect(token.startsWith(EKS_TOKEN_PREFIX)).toBe(true);
    const encoded = token.slice(EKS_TOKEN_PREFIX.length);
    expect(encoded).toMatch(/^[A-Za-z0-9_-]+$/); // base64url, no padding
    const url = new URL(Buffer.from(encoded, 'base64url').toString('utf8'));
    expect(url.origin).toBe('https://sts.eu-west-1.amazonaws.com');
    expect(url.pathname).toBe('/');
    const q = Object.fromEntries(url.searchParams.entries());
    expect(q).toMatchObject({
      Action: 'GetCallerIdentity',
      Version: '2011-06-15',
      'X-Amz-Algorithm': 'AWS4-HMAC-SHA256',
      'X-Amz-Credential': 'AKIDEXAMPLE/20261201/eu-west-1/sts/aws4_request',
      'X-Amz-Date': '20261201T100000Z',
      'X-Amz-Expires': '60',
      'X-Amz-SignedHeaders': 'host;x-k8s-aws-id',
      'X-Amz-Security-Token': CREDS.sessionToken,
    });
    expect(q['X-Amz-Signature']).toBe(
      expectedSignature(url, { host: 'sts.eu-west-1.amazonaws.com', 'x-k8s-aws-id': 'prod-eu-1' }),
    );
    expect(expiresAt).toEqual(new Date(T0.getTime() + 15 * 60_000));
  });

  it.each([
    ['with a session token', CREDS],
    ['without a session token', { accessKeyId: 'AKIDEXAMPLE', secretAccessKey: CREDS.secretAccessKey }],
  ])('presigns exactly as the AWS SDK signer did (%s)', async (_, credentials) => {
    const hostname = 'sts.eu-west-1.amazonaws.com';
    const signer = new SignatureV4({ credentials, region: 'eu-west-1', service: 'sts', sha256: Sha256 });
    const request = new HttpRequest({
      method: 'GET',
      protocol: 'https:',
      hostname,
      path: '/',
      query: { Action: 'GetCallerIdentity', Version: '2011-06-15' },
      headers: { host: hostname, 'x-k8s-aws-id': 'prod  eu-1 ' },
    });
    const signed = await signer.presign(request, { expiresIn: 60, signingDate: new Date(T0.getTime() + 456) });
    expect(
      presignGetCallerIdentity(credentials, 'eu-west-1', hostname, 'prod  eu-1 ', new Date(T0.getTime() + 456), 60),
    ).toEqual(Object.entries(signed.query ?? {}));
  });

  it('takes the credentials from a provider and refuses an identity without a key pair', async () => {
    const fromProvider = new EksTokenSource({
      clusterName: 'c',
      region: 'eu-west-1',
      credentials: async () => CREDS,
      now: () => T0,
    });
    const direct = new EksTokenSource({ clusterName: 'c', region: 'eu-west-1', credentials: CREDS, now: () => T0 });
    expect((await fromProvider.token()).token).toBe((await direct.token()).token);
    const broken = new EksTokenSource({
      clusterName: 'c',
      region: 'eu-west-1',
      credentials: { accessKeyId: 'AKIDEXAMPLE' } as typeof CREDS,
      now: () => T0,
    });
    await expect(broken.token()).rejects.toThrow('the credentials have no access key id or secret access key');
  });

  it('is cached until shortly before its 15-minute expiry', async () => {
    let now = T0;
    const source = new EksTokenSource({ clusterName: 'c', region: 'eu-west-1', credentials: CREDS, now: () => now });
    const first = await source.token();
    now = new Date(T0.getTime() + 13 * 60_000);
    expect(await source.token()).toBe(first);
    // A caller needing ten more minutes (a tool's kubeconfig) gets a new one.
    const fresh = await source.token(10 * 60_000);
    expect(fresh.token).not.toBe(first.token);
    now = new Date(T0.getTime() + 13 * 60_000 + 14 * 60_000 + 1);
    expect((await source.token()).token).not.toBe(fresh.token);
  });
});

describe('tokens from a secret store', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'cluster-registry-unit-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads a token by name, keeps it for the TTL, and reads it again after', async () => {
    await writeFile(path.join(dir, 'fetch'), 'token-one\n');
    let now = T0;
    const source = new SecretTokenSource({
      store: new DirSecretStore(dir),
      name: 'fetch',
      ttlMs: 60_000,
      now: () => now,
    });
    expect((await source.token()).token).toBe('token-one');
    await writeFile(path.join(dir, 'fetch'), 'token-two');
    expect((await source.token()).token).toBe('token-one');
    now = new Date(T0.getTime() + 60_000);
    expect((await source.token()).token).toBe('token-two');
  });

  it('reads a JWT again when its exp is nearer than the validity asked for', async () => {
    const jwt = (exp: number) => `h.${Buffer.from(JSON.stringify({ exp: exp / 1000 })).toString('base64url')}.s`;
    await writeFile(path.join(dir, 'jwt'), jwt(T0.getTime() + 120_000));
    const source = new SecretTokenSource({
      store: new DirSecretStore(dir),
      name: 'jwt',
      ttlMs: 3_600_000,
      now: () => T0,
    });
    expect((await source.token()).expiresAt).toEqual(new Date(T0.getTime() + 120_000));
    await writeFile(path.join(dir, 'jwt'), jwt(T0.getTime() + 600_000));
    expect(jwtExpiry((await source.token(60_000)).token)).toEqual(new Date(T0.getTime() + 120_000));
    expect(jwtExpiry((await source.token(300_000)).token)).toEqual(new Date(T0.getTime() + 600_000));
  });

  it('refuses names that leave the directory and never quotes a value', async () => {
    await writeFile(path.join(tmpdir(), 'cluster-registry-outside'), 'secret-value');
    await symlink(path.join(tmpdir(), 'cluster-registry-outside'), path.join(dir, 'link')).catch(() => {});
    const store = new DirSecretStore(dir);
    await expect(store.read('../cluster-registry-outside')).rejects.toThrow(
      'reading secret ../cluster-registry-outside: outside the secret directory',
    );
    await expect(store.read('link')).rejects.toThrow('reading secret link: outside the secret directory');
    await writeFile(path.join(dir, 'empty'), '\n');
    await expect(store.read('empty')).rejects.toThrow('reading secret empty: empty');
    await rm(path.join(tmpdir(), 'cluster-registry-outside'));
  });
});

describe('StoreClusterRegistry', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'cluster-registry-unit-'));
    await writeFile(path.join(dir, 'fetch-token'), 'fetch-secret-token');
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  function setup(stage: 'fetch' | 'deploy' = 'fetch') {
    const store = new MemoryStore();
    let now = T0;
    const registry = new StoreClusterRegistry({
      store,
      stage,
      secrets: new DirSecretStore(dir),
      credentials: async () => CREDS,
      ttlMs: 60_000,
      now: () => now,
    });
    return { store, registry, advance: (ms: number) => (now = new Date(now.getTime() + ms)) };
  }

  it('knows a cluster only once its document is there and it was prepared', async () => {
    const { store, registry } = setup();
    await expect(registry.prepare('edge-1')).rejects.toBeInstanceOf(UnknownClusterError);
    await expect(registry.prepare('../x')).rejects.toBeInstanceOf(UnknownClusterError);
    await putCluster(store, tokenDoc('edge-1', { fetch: 'fetch-token' }));
    expect(() => registry.fetchView('edge-1')).toThrow(UnknownClusterError);
    await registry.prepare('edge-1');
    expect(registry.clusterIds()).toEqual(['edge-1']);
    expect(Object.keys(registry.fetchView('edge-1')).sort()).toEqual([
      'getConfigMap',
      'getNamespace',
      'getObject',
      'getSecret',
      'updateStatus',
    ]);
    expect(registry.deployView('edge-1').apiServer()).toEqual({ server: 'https://127.0.0.1:6443', caData: CA_DATA });
    const kubeconfig = parse(registry.runtimeKubeconfig('edge-1')) as {
      users: { user: { token: string } }[];
      clusters: { cluster: { server: string } }[];
    };
    expect(kubeconfig.users[0]?.user.token).toBe('fetch-secret-token');
    expect(kubeconfig.clusters[0]?.cluster.server).toBe('https://127.0.0.1:6443');
  });

  it("names a cluster's forwarder role from its document, without asking for a token, and reads it again after the TTL", async () => {
    const { store, registry, advance } = setup();
    // Not registered: no forwarder at all.
    expect(await registry.forwarderOf('edge-9')).toBeUndefined();
    expect(await registry.forwarderOf('../x')).toBeUndefined();
    // No token for the fetch stage in the secret store: the forwarder lookup does not need one.
    await putCluster(store, tokenDoc('edge-9', { fetch: 'no-such-token' }));
    // Registered, its document naming no forwarder role: told apart from not registered.
    expect(await registry.forwarderOf('edge-9')).toEqual({});
    await putCluster(store, {
      ...tokenDoc('edge-9', { fetch: 'no-such-token' }),
      forwarder: { roleId: 'AROAEXAMPLEID1234567' },
    });
    expect(await registry.forwarderOf('edge-9')).toEqual({});
    advance(60_000);
    expect(await registry.forwarderOf('edge-9')).toEqual({ roleId: 'AROAEXAMPLEID1234567' });
    await store.delete(clusterDocKey('edge-9'));
    advance(60_000);
    expect(await registry.forwarderOf('edge-9')).toBeUndefined();
  });

  it("names a prepared cluster's recorded global namespace uid from its document, none for an older document", async () => {
    const { store, registry } = setup();
    const uid = '3f0c2a4e-1b2c-4d5e-8f90-0123456789ab';
    await putCluster(store, { ...tokenDoc('edge-1', { fetch: 'fetch-token' }), packagingGlobalNamespaceUid: uid });
    await putCluster(store, tokenDoc('edge-2', { fetch: 'fetch-token' }));
    await registry.prepare('edge-1');
    await registry.prepare('edge-2');
    expect(registry.packagingGlobalNamespaceUid('edge-1')).toBe(uid);
    expect(registry.packagingGlobalNamespaceUid('edge-2')).toBeUndefined();
  });

  it('reads the document again after the TTL: a removed cluster becomes unknown, a changed one is rebuilt', async () => {
    const { store, registry, advance } = setup();
    await putCluster(store, tokenDoc('edge-2', { fetch: 'fetch-token' }));
    await registry.prepare('edge-2');
    const view = registry.fetchView('edge-2');
    await putCluster(store, { ...tokenDoc('edge-2', { fetch: 'fetch-token' }), endpoint: 'https://10.0.0.1:6443' });
    await registry.prepare('edge-2');
    expect(registry.fetchView('edge-2')).toBe(view);
    advance(60_000);
    await registry.prepare('edge-2');
    expect(registry.fetchView('edge-2')).not.toBe(view);
    expect(registry.deployView('edge-2').apiServer().server).toBe('https://10.0.0.1:6443');
    await store.delete(clusterDocKey('edge-2'));
    advance(60_000);
    await expect(registry.prepare('edge-2')).rejects.toBeInstanceOf(UnknownClusterError);
    expect(() => registry.fetchView('edge-2')).toThrow(UnknownClusterError);
  });

  it('fails a cluster whose document is invalid or gives this stage no identity', async () => {
    const { store, registry } = setup('deploy');
    await store.put(clusterDocKey('edge-3'), JSON.stringify({ ...tokenDoc('edge-3', {}), extra: true }));
    await expect(registry.prepare('edge-3')).rejects.toThrow(
      'invalid cluster document clusters/edge-3.json: (document): Unrecognized key: "extra"',
    );
    await putCluster(store, tokenDoc('edge-4', { fetch: 'fetch-token' }));
    await expect(registry.prepare('edge-4')).rejects.toThrow('cluster edge-4 has no token for the deploy function');
  });

  it('gives an eks cluster the function role as a token of that cluster', async () => {
    const { store, registry } = setup();
    await putCluster(store, eksDoc());
    await registry.prepare('prod-eu-1');
    const token = (parse(registry.runtimeKubeconfig('prod-eu-1')) as { users: { user: { token: string } }[] }).users[0]
      ?.user.token;
    expect(token?.startsWith(EKS_TOKEN_PREFIX)).toBe(true);
    const url = new URL(Buffer.from(token?.slice(EKS_TOKEN_PREFIX.length) ?? '', 'base64url').toString());
    expect(url.searchParams.get('X-Amz-SignedHeaders')).toBe('host;x-k8s-aws-id');
  });
});

describe('npm run cluster', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'cluster-registry-cli-'));
    await writeFile(path.join(dir, 'ca.pem'), CA_PEM);
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('names each stage a secret under the prefix for token auth', () => {
    const doc = clusterDocOf({ id: 'edge-9', endpoint: 'https://10.0.0.9', caPem: CA_PEM, auth: { kind: 'token' } });
    expect(doc.auth).toEqual({
      kind: 'token',
      secrets: {
        fetch: 'kapp-lambda/edge-9/fetch',
        template: 'kapp-lambda/edge-9/template',
        deploy: 'kapp-lambda/edge-9/deploy',
        'index-repo': 'kapp-lambda/edge-9/index-repo',
        install: 'kapp-lambda/edge-9/install',
      },
    });
  });

  it('renders the RBAC of every function, with the identity namespace substituted', async () => {
    const all = await rbacManifests({ tokenIdentities: true, identityNamespace: 'ids' });
    const roles = all.filter((m) => m.kind === 'ClusterRole').map((m) => (m.metadata as { name: string }).name);
    const stages = [
      'kapp-lambda:fetch',
      'kapp-lambda:template',
      'kapp-lambda:deploy',
      'kapp-lambda:index-repo',
      'kapp-lambda:install',
    ];
    expect(roles).toEqual([...stages, 'kapp-lambda:pkgr']);
    type Subject = { kind: string; namespace?: string; name: string };
    const subjects = all.flatMap((m) => (m.subjects as Subject[]) ?? []);
    // The functions' ServiceAccounts in the identity namespace; kapp's for PackageRepositories
    // in the runtime (controller-config) one, where index-repo asks for its token.
    for (const s of subjects.filter((s) => s.kind === 'ServiceAccount')) {
      expect([s.name, s.namespace]).toEqual([s.name, s.name === 'kapp-lambda-pkgr' ? 'kapp-lambda' : 'ids']);
    }
    const clusterSubjects = all.filter((m) => m.kind === 'ClusterRoleBinding').flatMap((m) => m.subjects as Subject[]);
    expect(clusterSubjects.filter((s) => s.kind === 'Group').map((s) => s.name)).toEqual(stages);
    expect(all.filter((m) => m.kind === 'ServiceAccount')).toHaveLength(6);
    expect(all.filter((m) => m.kind === 'Namespace').map((m) => (m.metadata as { name: string }).name)).toEqual([
      'kapp-lambda',
      'ids',
    ]);
    // No function may list or watch Secrets, and only deploy may request tokens.
    for (const role of all.filter((m) => m.kind === 'ClusterRole')) {
      for (const rule of role.rules as { resources: string[]; verbs: string[] }[]) {
        if (rule.resources.includes('secrets'))
          expect(rule.verbs.filter((v) => v === 'list' || v === 'watch')).toEqual([]);
        if (rule.resources.includes('serviceaccounts/token'))
          expect((role.metadata as { name: string }).name).toBe('kapp-lambda:deploy');
        expect(rule.verbs).not.toContain('*');
      }
    }
  });

  it('grants install and index-repo get on kapp-controller-config only, in the controller-config namespace', async () => {
    const ns = (m: Record<string, unknown>) => (m.metadata as { namespace?: string }).namespace;
    const pick = (all: Record<string, unknown>[]) =>
      all.filter((m) => (m.metadata as { name: string }).name === 'kapp-lambda:controller-config-reader');
    const dflt = pick(await rbacManifests({ identityNamespace: 'ids' }));
    expect(dflt.map((m) => [m.kind, ns(m)])).toEqual([
      ['Role', 'kapp-lambda'],
      ['RoleBinding', 'kapp-lambda'],
    ]);
    const all = await rbacManifests({ identityNamespace: 'ids', controllerConfigNamespace: 'carvel' });
    expect(all).toContainEqual(expect.objectContaining({ kind: 'Namespace', metadata: { name: 'carvel' } }));
    const [role, binding] = pick(all);
    expect(ns(role!)).toBe('carvel');
    expect(role!.rules).toEqual([
      {
        apiGroups: [''],
        resources: ['secrets', 'configmaps'],
        resourceNames: ['kapp-controller-config'],
        verbs: ['get'],
      },
    ]);
    expect(ns(binding!)).toBe('carvel');
    expect(binding!.subjects).toEqual([
      { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'kapp-lambda:install' },
      { kind: 'ServiceAccount', namespace: 'ids', name: 'kapp-lambda-install' },
      { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'kapp-lambda:index-repo' },
      { kind: 'ServiceAccount', namespace: 'ids', name: 'kapp-lambda-index-repo' },
    ]);
  });

  it("gives a PackageRepository's kapp its own identity: packages and ConfigMaps only; index-repo writes neither and may mint only its token", async () => {
    const all = await rbacManifests({ identityNamespace: 'ids', controllerConfigNamespace: 'carvel' });
    const named = (kind: string, name: string) =>
      all.find((m) => m.kind === kind && (m.metadata as { name: string }).name === name) as
        | { metadata: { namespace?: string }; rules?: unknown[]; subjects?: unknown[]; roleRef?: unknown }
        | undefined;
    expect(named('ServiceAccount', 'kapp-lambda-pkgr')).toMatchObject({
      metadata: { namespace: 'carvel' },
      automountServiceAccountToken: false,
    });
    expect(named('ClusterRole', 'kapp-lambda:pkgr')?.rules).toEqual([
      {
        apiGroups: ['data.packaging.carvel.dev'],
        resources: ['packages', 'packagemetadatas'],
        verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'],
      },
      { apiGroups: [''], resources: ['configmaps'], verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'] },
    ]);
    expect(named('ClusterRoleBinding', 'kapp-lambda:pkgr')?.subjects).toEqual([
      { kind: 'ServiceAccount', namespace: 'carvel', name: 'kapp-lambda-pkgr' },
    ]);
    const token = named('Role', 'kapp-lambda:pkgr-token');
    expect(token?.metadata.namespace).toBe('carvel');
    expect(token?.rules).toEqual([
      { apiGroups: [''], resources: ['serviceaccounts'], resourceNames: ['kapp-lambda-pkgr'], verbs: ['get'] },
      { apiGroups: [''], resources: ['serviceaccounts/token'], resourceNames: ['kapp-lambda-pkgr'], verbs: ['create'] },
    ]);
    expect(named('RoleBinding', 'kapp-lambda:pkgr-token')).toMatchObject({
      metadata: { namespace: 'carvel' },
      subjects: [
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'kapp-lambda:index-repo' },
        { kind: 'ServiceAccount', namespace: 'ids', name: 'kapp-lambda-index-repo' },
      ],
    });
    // index-repo itself: no Package or PackageMetadata rule, ConfigMaps read only, Secrets get/create.
    const indexRepo = named('ClusterRole', 'kapp-lambda:index-repo')?.rules as {
      apiGroups: string[];
      resources: string[];
      verbs: string[];
    }[];
    expect(indexRepo.filter((r) => r.apiGroups.includes('data.packaging.carvel.dev'))).toEqual([]);
    expect(indexRepo.find((r) => r.resources.includes('configmaps'))?.verbs).toEqual(['get', 'list']);
    expect(indexRepo.find((r) => r.resources.includes('secrets'))?.verbs).toEqual(['get', 'create']);
    expect(indexRepo.flatMap((r) => r.resources)).not.toContain('namespaces');
  });

  it("bounds kapp-lambda-pkgr's writes by an admission policy matching that ServiceAccount of the controller-config namespace only", async () => {
    type Policy = Record<string, unknown> & {
      spec: { failurePolicy: string; matchConditions: { name: string; expression: string }[] };
    };
    for (const [options, ns] of [
      [{}, 'kapp-lambda'],
      [{ controllerConfigNamespace: 'carvel' }, 'carvel'],
    ] as const) {
      const all = await rbacManifests({ identityNamespace: 'ids', ...options });
      const policies = all.filter((m) => m.kind === 'ValidatingAdmissionPolicy') as Policy[];
      expect(policies.map((p) => (p.metadata as { name: string }).name)).toEqual(['kapp-lambda-pkgr']);
      expect(policies[0]?.spec.failurePolicy).toBe('Fail');
      expect(policies[0]?.spec.matchConditions).toEqual([
        {
          name: 'kapp-lambda-pkgr',
          expression: `request.userInfo.username == 'system:serviceaccount:${ns}:kapp-lambda-pkgr'`,
        },
      ]);
      expect(all.filter((m) => m.kind === 'ValidatingAdmissionPolicyBinding').map((m) => m.spec)).toEqual([
        { policyName: 'kapp-lambda-pkgr', validationActions: ['Deny'] },
      ]);
      // A policy naming no ServiceAccount of the namespace it is moved from is an error, not a no-op.
      expect(() => retargetPolicyNamespace(policies[0] as Policy, 'elsewhere', 'x')).toThrow(
        'ValidatingAdmissionPolicy kapp-lambda-pkgr: no matchCondition names a ServiceAccount of elsewhere',
      );
    }
  });

  /** `add prod-eu-1` in `registry` with the suite's endpoint and CA file, then `extra`. */
  const addArgv = (registry: string, ...extra: string[]) => [
    'add',
    'prod-eu-1',
    '--registry',
    registry,
    '--endpoint',
    'https://abc.example',
    '--ca-file',
    path.join(dir, 'ca.pem'),
    ...extra,
  ];

  it('adds, lists and removes a cluster in a directory registry', async () => {
    const registry = `file://${dir}/registry`;
    const out: string[] = [];
    const write = process.stdout.write.bind(process.stdout);
    const errWrite = process.stderr.write.bind(process.stderr);
    const err: string[] = [];
    process.stdout.write = ((s: string) => out.push(s) > 0) as typeof process.stdout.write;
    process.stderr.write = ((s: string) => err.push(s) > 0) as typeof process.stderr.write;
    try {
      const argv = addArgv(registry);
      expect(
        await main([
          ...argv,
          '--auth',
          'eks',
          '--eks-cluster-name',
          'prod',
          '--region',
          'eu-west-1',
          '--function-role',
          'deploy=arn:aws:iam::123456789012:role/kl-deploy',
          '--forwarder-role-id',
          'AROAEXAMPLEID1234567',
        ]),
      ).toBe(0);
      // A forwarder identity that is not a role id (an IAM user's AIDA…, static keys) is refused.
      expect(await main([...argv, '--auth', 'token', '--replace', '--forwarder-role-id', 'AIDAEXAMPLEID1234567'])).toBe(
        2,
      );
      expect(await main(['list', '--registry', registry])).toBe(0);
      expect(await main([...argv, '--auth', 'magic'])).toBe(2);
      // An id already registered is replaced only when asked; an unknown id is not "removed".
      const again = [...argv, '--auth', 'eks', '--eks-cluster-name', 'other', '--region', 'eu-west-1'];
      expect(await main([...again, '--forwarder-role-id', 'AROAEXAMPLEID1234567'])).toBe(1);
      expect(await main(['remove', 'nope', '--registry', registry])).toBe(1);
    } finally {
      process.stdout.write = write;
      process.stderr.write = errWrite;
    }
    const text = out.join('');
    expect(text).toContain('name: kapp-lambda:fetch');
    expect(text).toContain('prod-eu-1\thttps://abc.example\teks prod eu-west-1\tforwarder AROAEXAMPLEID1234567\n');
    expect(err.join('')).toContain(
      'aws eks create-access-entry --region eu-west-1 --cluster-name prod --type STANDARD --principal-arn arn:aws:iam::123456789012:role/kl-deploy --kubernetes-groups kapp-lambda:deploy',
    );
    expect(err.join('')).toContain('cluster: --auth must be eks or token');
    expect(err.join('')).toContain('cluster: "prod-eu-1" is already registered; add --replace to overwrite it');
    expect(err.join('')).toContain('cluster: no cluster "nope" in the registry (see list)');
    const { LocalDirStore } = await import('../../functions/lib/store/local.js');
    const store = new LocalDirStore(path.join(dir, 'registry'));
    expect(await listClusters(store)).toEqual([
      'prod-eu-1\thttps://abc.example\teks prod eu-west-1\tforwarder AROAEXAMPLEID1234567',
    ]);
    expect(err.join('')).toContain('cluster: --forwarder-role-id expects an IAM role id');
    process.stderr.write = ((s: string) => err.push(s) > 0) as typeof process.stderr.write;
    try {
      expect(await main(['remove', 'prod-eu-1', '--registry', registry])).toBe(0);
    } finally {
      process.stderr.write = errWrite;
    }
    expect(err.at(-1)).toBe('removed clusters/prod-eu-1.json (the RBAC in the cluster is left as it is)\n');
    expect(await listClusters(store)).toEqual([]);
  });

  it("add --replace keeps the document's event key (its forwarder holds it); add makes none and says what that leaves open", async () => {
    const registry = `file://${dir}/registry-event-key`;
    const argv = (...extra: string[]) =>
      addArgv(registry, '--auth', 'token', '--forwarder-role-id', 'AROAEXAMPLEID1234567', ...extra);
    const { LocalDirStore } = await import('../../functions/lib/store/local.js');
    const store = new LocalDirStore(path.join(dir, 'registry-event-key'));
    const key = Buffer.alloc(32, 9).toString('base64');
    const added = await captured(() => main(argv()));
    expect(added.code).toBe(0);
    expect((await recordedClusterDoc(store, 'prod-eu-1'))?.eventKey).toBeUndefined();
    expect(added.err).toContain(
      "# No event key (join makes one): the SQS message groups and deduplication ids of prod-eu-1's events are unkeyed",
    );
    // As join records it, then a replacement by add.
    await putCluster(store, { ...((await recordedClusterDoc(store, 'prod-eu-1')) as ClusterDoc), eventKey: key });
    const replaced = await captured(() => main(argv('--replace', '--secret-prefix', 'other/')));
    expect(replaced.code).toBe(0);
    const doc = await recordedClusterDoc(store, 'prod-eu-1');
    expect({ eventKey: doc?.eventKey, auth: doc?.auth.kind === 'token' && doc.auth.secrets.fetch }).toEqual({
      eventKey: key,
      auth: 'other/fetch',
    });
    expect(replaced.err).toContain("# kept the document's event key");
    expect(replaced.err + replaced.out).not.toContain(key);
  });

  it("refuses a forwarder role id another cluster's document already names, except when replacing that cluster", async () => {
    const registry = `file://${dir}/registry-forwarders`;
    const err: string[] = [];
    const write = process.stdout.write.bind(process.stdout);
    const errWrite = process.stderr.write.bind(process.stderr);
    process.stdout.write = (() => true) as typeof process.stdout.write;
    process.stderr.write = ((s: string) => err.push(s) > 0) as typeof process.stderr.write;
    const add = (id: string, roleId: string, ...more: string[]) =>
      main([
        'add',
        id,
        '--registry',
        registry,
        '--endpoint',
        `https://${id}.example`,
        '--ca-file',
        path.join(dir, 'ca.pem'),
        '--auth',
        'token',
        '--forwarder-role-id',
        roleId,
        ...more,
      ]);
    const { LocalDirStore } = await import('../../functions/lib/store/local.js');
    const store = new LocalDirStore(path.join(dir, 'registry-forwarders'));
    try {
      expect(await add('cl-a', 'AROAFORWARDERA000001')).toBe(0);
      // B with A's role id (a copy-paste mistake): refused, naming A, nothing written.
      expect(await add('cl-b', 'AROAFORWARDERA000001')).toBe(2);
      expect(err.join('')).toContain(
        'cluster: --forwarder-role-id AROAFORWARDERA000001 is already the forwarder of cluster "cl-a"',
      );
      expect(await add('cl-b', 'AROAFORWARDERA000001', '--replace')).toBe(2);
      expect(await add('cl-b', 'AROAFORWARDERB000001')).toBe(0);
      // Replacing A itself keeps its own role id; B cannot take A's role even by replacing B.
      expect(await add('cl-a', 'AROAFORWARDERA000001', '--replace')).toBe(0);
      expect(await add('cl-b', 'AROAFORWARDERA000001', '--replace')).toBe(2);
      expect(await listClusters(store)).toEqual([
        'cl-a\thttps://cl-a.example\ttoken\tforwarder AROAFORWARDERA000001',
        'cl-b\thttps://cl-b.example\ttoken\tforwarder AROAFORWARDERB000001',
      ]);
    } finally {
      process.stdout.write = write;
      process.stderr.write = errWrite;
    }
  });

  it('refuses to add a cluster without its forwarder role id unless --no-sender-check says the functions do not check', async () => {
    const registry = `file://${dir}/registry-senders`;
    const err: string[] = [];
    const write = process.stdout.write.bind(process.stdout);
    const errWrite = process.stderr.write.bind(process.stderr);
    process.stdout.write = (() => true) as typeof process.stdout.write;
    process.stderr.write = ((s: string) => err.push(s) > 0) as typeof process.stderr.write;
    const argv = [
      'add',
      'edge-9',
      '--registry',
      registry,
      '--endpoint',
      'https://10.0.0.9',
      '--ca-file',
      path.join(dir, 'ca.pem'),
      '--auth',
      'token',
    ];
    const { LocalDirStore } = await import('../../functions/lib/store/local.js');
    const store = new LocalDirStore(path.join(dir, 'registry-senders'));
    try {
      // Neither: a usage error, nothing written (a checking fleet would refuse all its events).
      expect(await main(argv)).toBe(2);
      expect(err.join('')).toContain(
        "cluster: add needs --forwarder-role-id <AROA…> (the stack's ForwarderRoleId<Id> output): the functions take events naming edge-9 only from that role",
      );
      expect(await main([...argv, '--no-sender-check', '--forwarder-role-id', 'AROAEXAMPLEID1234567'])).toBe(2);
      expect(err.join('')).toContain('cluster: --forwarder-role-id and --no-sender-check exclude each other');
      expect(await listClusters(store)).toEqual([]);
      // Said on purpose: registered without a forwarder, and told what a checking fleet then does.
      expect(await main([...argv, '--no-sender-check'])).toBe(0);
      expect(await listClusters(store)).toEqual(['edge-9\thttps://10.0.0.9\ttoken\tforwarder none']);
      expect(err.join('')).toContain(
        '# --no-sender-check: no forwarder role named. Functions that check senders (KAPP_LAMBDA_SENDER_CHECK=registry, every CDK deployment) refuse every event naming edge-9',
      );
    } finally {
      process.stdout.write = write;
      process.stderr.write = errWrite;
    }
  });
});

describe('endpointReachWarning (add)', () => {
  const resolveTo = (addresses: string[]) => async () => addresses;
  it('warns for a private, loopback or unresolvable API server, naming the VPC context; not for a public one', async () => {
    expect(await endpointReachWarning('https://10.20.0.5:6443')).toMatch(
      /^# warning: .*10\.20\.0\.5.*private.*vpcId and subnetIds.*urlAllow/,
    );
    expect(await endpointReachWarning('https://127.0.0.1:6443')).toMatch(/^# warning: /);
    expect(await endpointReachWarning('https://abc.eks.example', resolveTo(['192.168.4.4']))).toMatch(
      /abc\.eks\.example resolves to 192\.168\.4\.4/,
    );
    const nx = async () => {
      throw Object.assign(new Error('nx'), { code: 'ENOTFOUND' });
    };
    expect(await endpointReachWarning('https://internal.corp', nx)).toMatch(/does not resolve \(ENOTFOUND\)/);
    expect(await endpointReachWarning('https://abc.eks.example', resolveTo(['52.16.0.9']))).toBeUndefined();
  });
});
