import { describe, expect, it } from 'vitest';
import {
  apiMessage,
  collectionPath,
  errorFromResponse,
  extractGroupVersions,
  KubeApiClient,
  objectPath,
  parseServerVersion,
  ServiceAccountTokens,
  TOKEN_CACHE_ENTRIES,
} from '../../functions/lib/kube/client.js';
import { ConflictError, GoneError, KubeApiError, resourceFor, WatchGoneError } from '../../functions/lib/kube/port.js';
import {
  METADATA_ONLY_ACCEPT,
  type RestRequest,
  type RestResponse,
  type RestTransport,
  WatchHttpError,
  type WatchTransport,
} from '../../functions/lib/kube/transport.js';

const APP = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: 'ns1', name: 'a1' };
const APP_PATH = '/apis/kappctrl.k14s.io/v1alpha1/namespaces/ns1/apps/a1';

/** Answers queued responses in order and records every request. */
class FakeRest implements RestTransport {
  readonly requests: RestRequest[] = [];
  constructor(private readonly answers: Array<RestResponse | Error>) {}
  async send(request: RestRequest): Promise<RestResponse> {
    this.requests.push(structuredClone(request));
    const answer = this.answers.shift();
    if (!answer) throw new Error(`unexpected request ${request.method} ${request.path}`);
    if (answer instanceof Error) throw answer;
    return structuredClone(answer);
  }
}

/** Replays scripted watch lines, then resolves or fails. */
class FakeWatch implements WatchTransport {
  readonly calls: Array<{ path: string; query: Record<string, unknown> }> = [];
  constructor(
    private readonly lines: Array<[string, unknown]>,
    private readonly end?: Error,
  ) {}
  async stream(
    path: string,
    query: Record<string, string | number | boolean | undefined>,
    onLine: (type: string, object: unknown) => void,
  ): Promise<void> {
    this.calls.push({ path, query });
    for (const [type, object] of this.lines) onLine(type, structuredClone(object));
    if (this.end) throw this.end;
  }
}

const notFound = (message: string): RestResponse => ({
  statusCode: 404,
  body: { kind: 'Status', status: 'Failure', message, reason: 'NotFound', code: 404 },
});
const conflict: RestResponse = {
  statusCode: 409,
  body: {
    kind: 'Status',
    message:
      'Operation cannot be fulfilled on apps.kappctrl.k14s.io "a1": the object has been modified; please apply your changes to the latest version and try again',
    reason: 'Conflict',
    code: 409,
  },
};

function app(resourceVersion: string, finalizers?: string[], uid = 'u1') {
  return {
    statusCode: 200,
    body: {
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'a1', namespace: 'ns1', uid, resourceVersion, generation: 1, finalizers },
    },
  };
}

function client(rest: RestTransport, watch: WatchTransport = new FakeWatch([])) {
  return new KubeApiClient({ rest, watch, apiServer: { server: 'https://127.0.0.1:6443' } });
}

describe('paths', () => {
  it.each([
    [{ ...APP }, undefined, APP_PATH],
    [{ ...APP }, 'status', `${APP_PATH}/status`],
    [
      { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageInstall', namespace: 'n', name: 'p' },
      undefined,
      '/apis/packaging.carvel.dev/v1alpha1/namespaces/n/packageinstalls/p',
    ],
    [
      { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageRepository', namespace: 'n', name: 'r' },
      undefined,
      '/apis/packaging.carvel.dev/v1alpha1/namespaces/n/packagerepositories/r',
    ],
    [
      { apiVersion: 'data.packaging.carvel.dev/v1alpha1', kind: 'PackageMetadata', namespace: 'n', name: 'm' },
      undefined,
      '/apis/data.packaging.carvel.dev/v1alpha1/namespaces/n/packagemetadatas/m',
    ],
    [
      { apiVersion: 'data.packaging.carvel.dev/v1alpha1', kind: 'Package', namespace: 'n', name: 'p.1.0.0' },
      undefined,
      '/apis/data.packaging.carvel.dev/v1alpha1/namespaces/n/packages/p.1.0.0',
    ],
    [
      { apiVersion: 'v1', kind: 'ServiceAccount', namespace: 'n', name: 'sa' },
      'token',
      '/api/v1/namespaces/n/serviceaccounts/sa/token',
    ],
    [{ apiVersion: 'v1', kind: 'Namespace', name: 'n' }, undefined, '/api/v1/namespaces/n'],
  ])('objectPath(%o, %s) = %s', (ref, sub, expected) => {
    expect(objectPath(ref, sub)).toBe(expected);
  });

  it('collectionPath across namespaces and in one', () => {
    const type = resourceFor({ apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' });
    expect(collectionPath(type)).toBe('/apis/kappctrl.k14s.io/v1alpha1/apps');
    expect(collectionPath(type, 'x')).toBe('/apis/kappctrl.k14s.io/v1alpha1/namespaces/x/apps');
  });

  it('rejects unknown kinds and namespaced refs without namespace', () => {
    expect(() => objectPath({ apiVersion: 'v1', kind: 'Pod', namespace: 'n', name: 'p' })).toThrow(
      new TypeError('unknown resource kind v1/Pod'),
    );
    expect(() => objectPath({ ...APP, namespace: undefined })).toThrow(new TypeError('App a1 needs a namespace'));
  });
});

describe('pure helpers', () => {
  it.each([
    ['v1.34.4', '1.34.4'],
    ['v1.34.4+k3s1', '1.34.4'],
    ['v1.35.0-rc.1', '1.35.0'],
    ['1.30.12-eks-abc+build', '1.30.12'],
  ])('parseServerVersion(%s) = %s', (input, expected) => {
    expect(parseServerVersion(input)).toBe(expected);
  });

  it('parseServerVersion rejects garbage', () => {
    expect(() => parseServerVersion('v1.34')).toThrow('parsing kubernetes version "v1.34"');
  });

  it('extractGroupVersions: core first, then every version of every group, deduplicated', () => {
    expect(
      extractGroupVersions(
        { kind: 'APIVersions', versions: ['v1'] },
        {
          kind: 'APIGroupList',
          groups: [
            { name: 'apps', versions: [{ groupVersion: 'apps/v1', version: 'v1' }] },
            {
              name: 'kappctrl.k14s.io',
              versions: [{ groupVersion: 'kappctrl.k14s.io/v1alpha1', version: 'v1alpha1' }],
            },
            {
              name: 'autoscaling',
              versions: [
                { groupVersion: 'autoscaling/v2', version: 'v2' },
                { groupVersion: 'autoscaling/v1', version: 'v1' },
                { groupVersion: 'autoscaling/v2', version: 'v2' },
              ],
            },
          ],
        },
      ),
    ).toEqual(['v1', 'apps/v1', 'kappctrl.k14s.io/v1alpha1', 'autoscaling/v2', 'autoscaling/v1']);
  });

  it('errorFromResponse maps codes to classes with short messages and a cause', () => {
    const e409 = errorFromResponse('updating status of App ns1/a1', conflict);
    expect(e409).toBeInstanceOf(ConflictError);
    expect(e409.message).toBe(
      'updating status of App ns1/a1: 409 Operation cannot be fulfilled on apps.kappctrl.k14s.io "a1": the object has been modified; please apply your changes to the latest version and try again',
    );
    expect(e409.statusCode).toBe(409);
    expect(e409.reason).toBe('Conflict');
    expect((e409.cause as Error).name).toBe('ApiResponseError');

    const e410 = errorFromResponse('watching apps.kappctrl.k14s.io', {
      statusCode: 410,
      body: { kind: 'Status', message: 'too old resource version: 1 (42)', reason: 'Expired', code: 410 },
    });
    expect(e410).toBeInstanceOf(WatchGoneError);
    expect(e410.message).toBe('watching apps.kappctrl.k14s.io: 410 too old resource version: 1 (42)');

    const e403 = errorFromResponse('getting Secret ns1/s', {
      statusCode: 403,
      body: { kind: 'Status', message: 'secrets "s" is forbidden', reason: 'Forbidden', code: 403 },
    });
    expect(e403.constructor).toBe(KubeApiError);
    expect(e403.message).toBe('getting Secret ns1/s: 403 secrets "s" is forbidden');
  });

  it('apiMessage falls back to a bounded text body, then to the code', () => {
    expect(apiMessage({ statusCode: 502, body: 'bad gateway' })).toBe('bad gateway');
    expect(apiMessage({ statusCode: 502, body: 'x'.repeat(300) })).toBe(`${'x'.repeat(200)}…`);
    expect(apiMessage({ statusCode: 503, body: undefined })).toBe('HTTP 503');
  });
});

describe('KubeApiClient reads', () => {
  it('getObject returns the object, and undefined on 404', async () => {
    const rest = new FakeRest([app('7'), notFound('apps.kappctrl.k14s.io "a1" not found')]);
    const c = client(rest);
    expect((await c.getObject(APP))?.metadata.resourceVersion).toBe('7');
    expect(await c.getObject(APP)).toBeUndefined();
    expect(rest.requests).toEqual([
      { method: 'GET', path: APP_PATH },
      { method: 'GET', path: APP_PATH },
    ]);
  });

  it('getObject wraps other failures with the action', async () => {
    const rest = new FakeRest([
      {
        statusCode: 403,
        body: { kind: 'Status', message: 'apps.kappctrl.k14s.io "a1" is forbidden', reason: 'Forbidden', code: 403 },
      },
      Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), { code: 'ECONNREFUSED' }),
    ]);
    const c = client(rest);
    await expect(c.getObject(APP)).rejects.toThrow('getting App ns1/a1: 403 apps.kappctrl.k14s.io "a1" is forbidden');
    const err = await c.getObject(APP).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KubeApiError);
    expect((err as KubeApiError).message).toBe('getting App ns1/a1: connect ECONNREFUSED 127.0.0.1:6443');
    expect((err as KubeApiError).statusCode).toBeUndefined();
    expect((err as KubeApiError).cause).toBeInstanceOf(Error);
  });

  it('a name the API server reads as another path (".", "..", with "/" or "%") is no object: absent, no request', async () => {
    // What a real API server answers: `secrets/.` is the namespace's Secret list, `..` the namespace.
    const list = { statusCode: 200, body: { kind: 'SecretList', metadata: {}, items: [{ data: { k: 'dg==' } }] } };
    const namespace = { statusCode: 200, body: { kind: 'Namespace', metadata: { name: 'n' } } };
    const rest = new FakeRest(Array.from({ length: 12 }, (_, i) => (i % 2 ? namespace : list)));
    const c = client(rest);
    for (const name of ['.', '..', 's1/', '%2e']) {
      expect(await c.getSecret('n', name)).toBeUndefined();
      expect(await c.getConfigMap('n', name)).toBeUndefined();
      expect(await c.getObject({ apiVersion: 'v1', kind: 'ServiceAccount', namespace: 'n', name })).toBeUndefined();
    }
    expect(rest.requests).toEqual([]);
  });

  it('getSecret decodes data; getConfigMap keeps data and decodes binaryData; getNamespace gives phase', async () => {
    const rest = new FakeRest([
      {
        statusCode: 200,
        body: {
          kind: 'Secret',
          metadata: { name: 's', namespace: 'n', uid: 'u', resourceVersion: '1' },
          type: 'kubernetes.io/basic-auth',
          data: { username: Buffer.from('me').toString('base64'), password: Buffer.from('pw').toString('base64') },
        },
      },
      {
        statusCode: 200,
        body: {
          kind: 'ConfigMap',
          metadata: { name: 'c', namespace: 'n', uid: 'u', resourceVersion: '2' },
          data: { 'values.yml': 'a: 1\n' },
          binaryData: { bin: Buffer.from([0, 1, 2]).toString('base64') },
        },
      },
      {
        statusCode: 200,
        body: {
          kind: 'Namespace',
          metadata: { name: 'n', uid: 'u', resourceVersion: '3', deletionTimestamp: '2025-01-01T00:00:00Z' },
          status: { phase: 'Terminating' },
        },
      },
      notFound('secrets "nope" not found'),
    ]);
    const c = client(rest);
    const secret = await c.getSecret('n', 's');
    expect(secret?.type).toBe('kubernetes.io/basic-auth');
    expect(secret?.data.username?.toString('utf8')).toBe('me');
    expect(secret?.data.password?.toString('utf8')).toBe('pw');
    const cm = await c.getConfigMap('n', 'c');
    expect(cm?.data).toEqual({ 'values.yml': 'a: 1\n' });
    expect([...(cm?.binaryData.bin ?? [])]).toEqual([0, 1, 2]);
    expect((await c.getNamespace('n'))?.phase).toBe('Terminating');
    expect(await c.getSecret('n', 'nope')).toBeUndefined();
    expect(rest.requests.map((r) => r.path)).toEqual([
      '/api/v1/namespaces/n/secrets/s',
      '/api/v1/namespaces/n/configmaps/c',
      '/api/v1/namespaces/n',
      '/api/v1/namespaces/n/secrets/nope',
    ]);
  });

  it('listConfigMaps lists every namespace by label selector, page after page, and throws a refused list', async () => {
    const cm = (ns: string, name: string) => ({
      metadata: { name, namespace: ns, uid: `u-${name}`, resourceVersion: '1' },
      data: { spec: name },
    });
    const rest = new FakeRest([
      { statusCode: 200, body: { items: [cm('a', 'x.app'), cm('b', 'y.pkgr')], metadata: { continue: 'next-page' } } },
      { statusCode: 200, body: { items: [cm('c', 'z.app')], metadata: { continue: '' } } },
      {
        statusCode: 403,
        body: { kind: 'Status', message: 'configmaps is forbidden', reason: 'Forbidden', code: 403 },
      },
    ]);
    const c = client(rest);
    const listed = await c.listConfigMaps('kapp.k14s.io/is-app');
    expect(listed.map((m) => [m.metadata.namespace, m.metadata.name, m.data.spec])).toEqual([
      ['a', 'x.app', 'x.app'],
      ['b', 'y.pkgr', 'y.pkgr'],
      ['c', 'z.app', 'z.app'],
    ]);
    expect(rest.requests.map((r) => [r.method, r.path, r.query])).toEqual([
      ['GET', '/api/v1/configmaps', { labelSelector: 'kapp.k14s.io/is-app', limit: 50, continue: undefined }],
      ['GET', '/api/v1/configmaps', { labelSelector: 'kapp.k14s.io/is-app', limit: 50, continue: 'next-page' }],
    ]);
    await expect(c.listConfigMaps('kapp.k14s.io/is-app')).rejects.toMatchObject({ statusCode: 403 });
  });

  it('listConfigMaps holds only what `keep` returns of each ConfigMap, page after page', async () => {
    const cm = (name: string) => ({ metadata: { name, namespace: 'a' }, data: { spec: name } });
    const rest = new FakeRest([
      { statusCode: 200, body: { items: [cm('x'), cm('big')], metadata: { continue: 'next' } } },
      { statusCode: 200, body: { items: [cm('y')] } },
    ]);
    const seen: string[] = [];
    const kept = await client(rest).listConfigMaps('kapp.k14s.io/is-app', (m) => {
      seen.push(m.metadata.name ?? '');
      return m.metadata.name === 'big' ? undefined : { ...m, data: {} };
    });
    expect(seen).toEqual(['x', 'big', 'y']);
    expect(kept.map((m) => [m.metadata.name, m.data])).toEqual([
      ['x', {}],
      ['y', {}],
    ]);
  });

  it('a data key named __proto__ is kept as data (an own key), not made the prototype', async () => {
    const meta = { name: 's', namespace: 'n', uid: 'u', resourceVersion: '1' };
    const b64 = Buffer.from('S3cr3t!').toString('base64');
    // JSON.parse, as the transport's answer is read, makes `__proto__` an own key.
    const answer = (kind: string, field: string) => ({
      statusCode: 200,
      body: JSON.parse(`{"kind":"${kind}","metadata":${JSON.stringify(meta)},"${field}":{"__proto__":"${b64}"}}`),
    });
    const c = client(new FakeRest([answer('Secret', 'data'), answer('ConfigMap', 'binaryData')]));
    for (const decoded of [(await c.getSecret('n', 's'))?.data, (await c.getConfigMap('n', 's'))?.binaryData]) {
      expect(Object.getPrototypeOf(decoded)).toBe(Object.prototype);
      expect(Object.keys(decoded ?? {})).toEqual(['__proto__']);
      expect(Object.values(decoded ?? {}).map((v) => v.toString('utf8'))).toEqual(['S3cr3t!']);
    }
  });
});

describe('KubeApiClient.updateStatus', () => {
  it('PUTs the status subresource with resourceVersion and uid preconditions, reading back metadata only', async () => {
    const rest = new FakeRest([app('8')]);
    const out = await client(rest).updateStatus(
      APP,
      { resourceVersion: '7', uid: 'u1' },
      { friendlyDescription: 'ok' },
    );
    // The answer is PartialObjectMetadata, not the object: no `object`, so writeStatus plans the
    // stage's next write on its own copy (the status it wrote, this resourceVersion).
    expect(out).toEqual({ resourceVersion: '8' });
    expect(rest.requests).toEqual([
      {
        method: 'PUT',
        path: `${APP_PATH}/status`,
        accept: METADATA_ONLY_ACCEPT,
        body: {
          apiVersion: 'kappctrl.k14s.io/v1alpha1',
          kind: 'App',
          metadata: { name: 'a1', namespace: 'ns1', resourceVersion: '7', uid: 'u1' },
          status: { friendlyDescription: 'ok' },
        },
      },
    ]);
  });

  it('409 → ConflictError, 404 → GoneError, 409 on UID precondition → GoneError', async () => {
    const uidConflict: RestResponse = {
      statusCode: 409,
      body: {
        kind: 'Status',
        message:
          'Operation cannot be fulfilled on apps.kappctrl.k14s.io "a1": Precondition failed: UID in precondition: u1, UID in object meta: u2',
        reason: 'Conflict',
        code: 409,
      },
    };
    const rest = new FakeRest([conflict, notFound('apps.kappctrl.k14s.io "a1" not found'), uidConflict]);
    const c = client(rest);
    const pre = { resourceVersion: '7', uid: 'u1' };
    const e1 = await c.updateStatus(APP, pre, {}).catch((e: unknown) => e);
    expect(e1).toBeInstanceOf(ConflictError);
    const e2 = await c.updateStatus(APP, pre, {}).catch((e: unknown) => e);
    expect(e2).toBeInstanceOf(GoneError);
    expect((e2 as Error).message).toBe('updating status of App ns1/a1: 404 apps.kappctrl.k14s.io "a1" not found');
    const e3 = await c.updateStatus(APP, pre, {}).catch((e: unknown) => e);
    expect(e3).toBeInstanceOf(GoneError);
  });
});

describe('KubeApiClient finalizers', () => {
  const F = 'finalizers.kapp-ctrl.k14s.io/delete';

  it('adds with a merge patch carrying the read resourceVersion, reading and writing metadata only', async () => {
    const rest = new FakeRest([app('5', ['other']), app('6', ['other', F])]);
    expect(await client(rest).addFinalizer(APP, F)).toEqual({ changed: true, resourceVersion: '6' });
    expect(rest.requests[0]).toEqual({ method: 'GET', path: APP_PATH, accept: METADATA_ONLY_ACCEPT });
    expect(rest.requests[1]).toEqual({
      method: 'PATCH',
      path: APP_PATH,
      contentType: 'application/merge-patch+json',
      accept: METADATA_ONLY_ACCEPT,
      body: { metadata: { resourceVersion: '5', finalizers: ['other', F] } },
    });
  });

  it('is idempotent: present on add, absent on remove → no write', async () => {
    const rest = new FakeRest([app('5', [F]), app('5', [])]);
    const c = client(rest);
    expect(await c.addFinalizer(APP, F)).toEqual({ changed: false, resourceVersion: '5' });
    expect(await c.removeFinalizer(APP, F)).toEqual({ changed: false, resourceVersion: '5' });
    expect(rest.requests.map((r) => r.method)).toEqual(['GET', 'GET']);
  });

  it('retries on 409 with a fresh read', async () => {
    const rest = new FakeRest([app('5', [F, 'x']), conflict, app('6', [F]), app('7', [])]);
    expect(await client(rest).removeFinalizer(APP, F)).toEqual({ changed: true, resourceVersion: '7' });
    expect(rest.requests.map((r) => [r.method, (r.body as { metadata?: unknown })?.metadata])).toEqual([
      ['GET', undefined],
      ['PATCH', { resourceVersion: '5', finalizers: ['x'] }],
      ['GET', undefined],
      ['PATCH', { resourceVersion: '6', finalizers: [] }],
    ]);
  });

  it('gives up after 5 conflicts with the last ConflictError', async () => {
    const answers: RestResponse[] = [];
    for (let i = 0; i < 5; i++) answers.push(app(String(i), []), conflict);
    const rest = new FakeRest(answers);
    const err = await client(rest)
      .addFinalizer(APP, F)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConflictError);
    expect(rest.requests).toHaveLength(10);
  });

  it('remove on a missing object or another uid is a no-op; add throws GoneError', async () => {
    const rest = new FakeRest([
      notFound('apps.kappctrl.k14s.io "a1" not found'),
      app('5', [F], 'u2'),
      notFound('apps.kappctrl.k14s.io "a1" not found'),
      app('5', [], 'u2'),
    ]);
    const c = client(rest);
    expect(await c.removeFinalizer(APP, F)).toEqual({ changed: false, resourceVersion: undefined });
    expect(await c.removeFinalizer(APP, F, { uid: 'u1' })).toEqual({ changed: false, resourceVersion: undefined });
    const gone = (await c.addFinalizer(APP, F).catch((e: unknown) => e)) as GoneError;
    expect([gone.constructor, gone.message, gone.statusCode]).toEqual([
      GoneError,
      'adding finalizer to App ns1/a1: object not found',
      404,
    ]);
    await expect(c.addFinalizer(APP, F, { uid: 'u1' })).rejects.toThrow(
      'adding finalizer to App ns1/a1: object not found (uid changed)',
    );
  });

  it("plans on the caller's copy: no request when the finalizer is on it, else the PATCH alone", async () => {
    const copy = (rv: string, finalizers: string[], uid = 'u1') => app(rv, finalizers, uid).body;
    const present = new FakeRest([]);
    expect(await client(present).addFinalizer(APP, F, { uid: 'u1', object: copy('5', [F]) })).toEqual({
      changed: false,
      resourceVersion: '5',
    });
    expect(present.requests).toEqual([]);

    const absent = new FakeRest([app('6', ['other', F])]);
    expect(await client(absent).addFinalizer(APP, F, { uid: 'u1', object: copy('5', ['other']) })).toEqual({
      changed: true,
      resourceVersion: '6',
    });
    expect(absent.requests.map((r) => [r.method, (r.body as { metadata?: unknown })?.metadata])).toEqual([
      ['PATCH', { resourceVersion: '5', finalizers: ['other', F] }],
    ]);
  });

  it('a copy that moved costs a 409 and a fresh read; a copy of a deleted object ends gone', async () => {
    const moved = new FakeRest([conflict, app('7', ['x']), app('8', ['x', F])]);
    const copy = app('5', []).body;
    expect(await client(moved).addFinalizer(APP, F, { uid: 'u1', object: copy })).toEqual({
      changed: true,
      resourceVersion: '8',
    });
    expect(moved.requests.map((r) => [r.method, (r.body as { metadata?: unknown })?.metadata])).toEqual([
      ['PATCH', { resourceVersion: '5', finalizers: [F] }],
      ['GET', undefined],
      ['PATCH', { resourceVersion: '7', finalizers: ['x', F] }],
    ]);
    const deleted = new FakeRest([notFound('apps.kappctrl.k14s.io "a1" not found')]);
    await expect(client(deleted).addFinalizer(APP, F, { uid: 'u1', object: copy })).rejects.toBeInstanceOf(GoneError);
  });

  it('surfaces a 422 (no new finalizers while deleting) as KubeApiError', async () => {
    const rest = new FakeRest([
      app('5', []),
      {
        statusCode: 422,
        body: {
          kind: 'Status',
          message:
            'App.kappctrl.k14s.io "a1" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted',
          reason: 'Invalid',
          code: 422,
        },
      },
    ]);
    const err = (await client(rest)
      .addFinalizer(APP, F)
      .catch((e: unknown) => e)) as KubeApiError;
    expect(err.constructor).toBe(KubeApiError);
    expect(err.statusCode).toBe(422);
  });
});

describe('KubeApiClient deploy credentials', () => {
  it('serviceAccountToken GETs the SA then creates a TokenRequest (default 7200s)', async () => {
    const rest = new FakeRest([
      { statusCode: 200, body: { kind: 'ServiceAccount', metadata: { name: 'sa', namespace: 'n' } } },
      {
        statusCode: 201,
        body: {
          kind: 'TokenRequest',
          status: { token: 'secret-token', expirationTimestamp: '2030-01-01T02:00:00Z' },
        },
      },
    ]);
    const token = await client(rest).serviceAccountToken('n', 'sa');
    expect(token).toEqual({ token: 'secret-token', expiresAt: new Date('2030-01-01T02:00:00Z') });
    expect(rest.requests).toEqual([
      { method: 'GET', path: '/api/v1/namespaces/n/serviceaccounts/sa' },
      {
        method: 'POST',
        path: '/api/v1/namespaces/n/serviceaccounts/sa/token',
        body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 7200 } },
      },
    ]);
  });

  describe('token cache (upstream pkg/satoken/token_manager.go)', () => {
    const sa = (uid: string): RestResponse => ({
      statusCode: 200,
      body: { kind: 'ServiceAccount', metadata: { name: 'sa', namespace: 'n', uid } },
    });
    const minted = (token: string, expires: string): RestResponse => ({
      statusCode: 201,
      body: { kind: 'TokenRequest', status: { token, expirationTimestamp: expires } },
    });
    const at = (clock: { now: Date }, rest: RestTransport) =>
      new KubeApiClient({
        rest,
        watch: new FakeWatch([]),
        apiServer: { server: 'https://127.0.0.1:6443' },
        now: () => clock.now,
      });

    it('reuses a token until half its lifetime has passed (less the margin); the SA is read every time', async () => {
      const clock = { now: new Date('2030-01-01T00:00:00Z') };
      const rest = new FakeRest([
        sa('s1'),
        minted('t1', '2030-01-01T02:00:00Z'),
        sa('s1'),
        sa('s1'),
        minted('t2', '2030-01-01T03:00:00Z'),
      ]);
      const c = at(clock, rest);
      expect((await c.serviceAccountToken('n', 'sa')).token).toBe('t1');
      clock.now = new Date('2030-01-01T00:59:49Z'); // 10 s + 1 s before the 1 h refresh point
      expect(await c.serviceAccountToken('n', 'sa')).toEqual({
        token: 't1',
        expiresAt: new Date('2030-01-01T02:00:00Z'),
      });
      clock.now = new Date('2030-01-01T00:59:51Z');
      expect((await c.serviceAccountToken('n', 'sa')).token).toBe('t2');
      expect(rest.requests.map((r) => r.method)).toEqual(['GET', 'POST', 'GET', 'GET', 'POST']);
    });

    it('a recreated ServiceAccount (new uid), another one or another lifetime gets its own token', async () => {
      const clock = { now: new Date('2030-01-01T00:00:00Z') };
      const later = '2030-01-01T02:00:00Z';
      const rest = new FakeRest([
        sa('s1'),
        minted('t1', later),
        sa('s2'),
        minted('t2', later),
        sa('s2'),
        minted('t3', '2030-01-01T00:10:00Z'),
      ]);
      const c = at(clock, rest);
      expect((await c.serviceAccountToken('n', 'sa')).token).toBe('t1');
      expect((await c.serviceAccountToken('n', 'sa')).token).toBe('t2');
      expect((await c.serviceAccountToken('n', 'sa', 600)).token).toBe('t3');
    });

    it('concurrent deploys of one ServiceAccount share one TokenRequest; a failed one is not kept', async () => {
      const clock = { now: new Date('2030-01-01T00:00:00Z') };
      const forbidden: RestResponse = { statusCode: 403, body: { kind: 'Status', message: 'forbidden', code: 403 } };
      const rest = new FakeRest([
        sa('s1'),
        forbidden,
        sa('s1'),
        minted('t1', '2030-01-01T02:00:00Z'),
        sa('s1'),
        sa('s1'),
      ]);
      const c = at(clock, rest);
      await expect(c.serviceAccountToken('n', 'sa')).rejects.toThrow('Getting service account token: forbidden');
      expect((await c.serviceAccountToken('n', 'sa')).token).toBe('t1');
      const both = await Promise.all([c.serviceAccountToken('n', 'sa'), c.serviceAccountToken('n', 'sa')]);
      expect(both.map((t) => t.token)).toEqual(['t1', 't1']);
      expect(rest.requests.map((r) => r.method)).toEqual(['GET', 'POST', 'GET', 'POST', 'GET', 'GET']);
    });

    it('cachedServiceAccountToken: the last token minted for the SA while fresh, without any request', async () => {
      const clock = { now: new Date('2030-01-01T00:00:00Z') };
      const rest = new FakeRest([
        sa('s1'),
        minted('t1', '2030-01-01T02:00:00Z'),
        sa('s2'),
        minted('t2', '2030-01-01T02:00:00Z'),
      ]);
      const c = at(clock, rest);
      expect(c.cachedServiceAccountToken('n', 'sa')).toBeUndefined();
      await c.serviceAccountToken('n', 'sa');
      expect(c.cachedServiceAccountToken('n', 'sa')?.token).toBe('t1');
      expect(c.cachedServiceAccountToken('n', 'other')).toBeUndefined();
      expect(c.cachedServiceAccountToken('n', 'sa', 600)).toBeUndefined();
      // a recreated SA's token replaces the old one
      await c.serviceAccountToken('n', 'sa');
      expect(c.cachedServiceAccountToken('n', 'sa')?.token).toBe('t2');
      expect(rest.requests.map((r) => r.method)).toEqual(['GET', 'POST', 'GET', 'POST']);
      // past the refresh point it is not served
      clock.now = new Date('2030-01-01T00:59:51Z');
      expect(c.cachedServiceAccountToken('n', 'sa')).toBeUndefined();
    });

    it('holds at most TOKEN_CACHE_ENTRIES tokens, dropping the oldest', async () => {
      const clock = { now: new Date('2030-01-01T00:00:00Z') };
      const tokens = new ServiceAccountTokens(() => clock.now);
      let requests = 0;
      const request = async () => {
        requests++;
        return { token: `t${requests}`, expiresAt: new Date('2030-01-01T02:00:00Z') };
      };
      for (let i = 0; i <= TOKEN_CACHE_ENTRIES; i++) await tokens.get(`k${i}`, request);
      expect(requests).toBe(TOKEN_CACHE_ENTRIES + 1);
      await tokens.get(`k${TOKEN_CACHE_ENTRIES}`, request);
      expect(requests).toBe(TOKEN_CACHE_ENTRIES + 1);
      await tokens.get('k0', request);
      expect(requests).toBe(TOKEN_CACHE_ENTRIES + 2);
    });
  });

  it('a missing SA gives the upstream error text', async () => {
    const rest = new FakeRest([notFound('serviceaccounts "nope" not found')]);
    const err = (await client(rest)
      .serviceAccountToken('n', 'nope', 600)
      .catch((e: unknown) => e)) as KubeApiError;
    expect(err).toBeInstanceOf(KubeApiError);
    expect(err.message).toBe('Getting service account: serviceaccounts "nope" not found');
    expect(err.statusCode).toBe(404);
  });

  it('a failed TokenRequest says so without any token', async () => {
    const rest = new FakeRest([
      { statusCode: 200, body: { kind: 'ServiceAccount' } },
      {
        statusCode: 403,
        body: { kind: 'Status', message: 'serviceaccounts "sa" is forbidden', code: 403 },
      },
    ]);
    await expect(client(rest).serviceAccountToken('n', 'sa')).rejects.toThrow(
      'Getting service account token: serviceaccounts "sa" is forbidden',
    );
  });

  it('serverVersion, apiGroupVersions, apiServer', async () => {
    const rest = new FakeRest([
      { statusCode: 200, body: { major: '1', minor: '34', gitVersion: 'v1.34.4' } },
      { statusCode: 200, body: { versions: ['v1'] } },
      { statusCode: 200, body: { groups: [{ versions: [{ groupVersion: 'apps/v1' }] }] } },
    ]);
    const c = client(rest);
    expect(await c.serverVersion()).toBe('1.34.4');
    expect(await c.apiGroupVersions()).toEqual(['v1', 'apps/v1']);
    expect(c.apiServer()).toEqual({ server: 'https://127.0.0.1:6443' });
    expect(rest.requests.map((r) => r.path)).toEqual(['/version', '/api', '/apis']);
  });
});

describe('KubeApiClient list and watch', () => {
  const APPS = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' };

  it('list pages, fills apiVersion/kind, and maps 410 to WatchGoneError', async () => {
    const rest = new FakeRest([
      {
        statusCode: 200,
        body: {
          kind: 'AppList',
          metadata: { resourceVersion: '100', continue: 'tok' },
          items: [{ metadata: { name: 'a', namespace: 'n', uid: 'u', resourceVersion: '9' } }],
        },
      },
      { statusCode: 200, body: { kind: 'AppList', metadata: { resourceVersion: '100', continue: '' }, items: [] } },
      {
        statusCode: 410,
        body: { kind: 'Status', message: 'The provided continue parameter is too old', reason: 'Expired', code: 410 },
      },
    ]);
    const c = client(rest);
    const page = await c.list(APPS, { limit: 1 });
    expect(page).toEqual({
      items: [
        {
          apiVersion: APPS.apiVersion,
          kind: 'App',
          metadata: { name: 'a', namespace: 'n', uid: 'u', resourceVersion: '9' },
        },
      ],
      resourceVersion: '100',
      continue: 'tok',
    });
    expect(await c.list(APPS, { namespace: 'n', limit: 1, continue: 'tok' })).toEqual({
      items: [],
      resourceVersion: '100',
      continue: undefined,
    });
    await expect(c.list(APPS, { continue: 'old' })).rejects.toBeInstanceOf(WatchGoneError);
    expect(rest.requests).toEqual([
      { method: 'GET', path: '/apis/kappctrl.k14s.io/v1alpha1/apps', query: { limit: 1, continue: undefined } },
      {
        method: 'GET',
        path: '/apis/kappctrl.k14s.io/v1alpha1/namespaces/n/apps',
        query: { limit: 1, continue: 'tok' },
      },
      { method: 'GET', path: '/apis/kappctrl.k14s.io/v1alpha1/apps', query: { limit: undefined, continue: 'old' } },
    ]);
  });

  it('watch delivers events in order (bookmarks included) with the right query', async () => {
    const watch = new FakeWatch([
      ['ADDED', { metadata: { name: 'a', resourceVersion: '11' } }],
      ['BOOKMARK', { kind: 'App', apiVersion: APPS.apiVersion, metadata: { resourceVersion: '12' } }],
      ['MODIFIED', { metadata: { name: 'a', resourceVersion: '13' } }],
      ['DELETED', { metadata: { name: 'a', resourceVersion: '14' } }],
    ]);
    const seen: string[] = [];
    await client(new FakeRest([]), watch).watch(
      APPS,
      { resourceVersion: '10', allowWatchBookmarks: true, timeoutSeconds: 5, namespace: 'n' },
      (e) => seen.push(`${e.type}:${e.object.kind}:${e.object.metadata.resourceVersion}`),
    );
    expect(seen).toEqual(['ADDED:App:11', 'BOOKMARK:App:12', 'MODIFIED:App:13', 'DELETED:App:14']);
    expect(watch.calls).toEqual([
      {
        path: '/apis/kappctrl.k14s.io/v1alpha1/namespaces/n/apps',
        query: { resourceVersion: '10', allowWatchBookmarks: true, timeoutSeconds: 5 },
      },
    ]);
  });

  it('an in-band 410 ERROR event becomes WatchGoneError', async () => {
    const watch = new FakeWatch([
      [
        'ERROR',
        {
          kind: 'Status',
          status: 'Failure',
          message: 'too old resource version: 1 (500)',
          reason: 'Expired',
          code: 410,
        },
      ],
    ]);
    const err = (await client(new FakeRest([]), watch)
      .watch(APPS, { resourceVersion: '1', allowWatchBookmarks: true }, () => {})
      .catch((e: unknown) => e)) as WatchGoneError;
    expect(err).toBeInstanceOf(WatchGoneError);
    expect(err.message).toBe('watching apps.kappctrl.k14s.io: 410 too old resource version: 1 (500)');
  });

  it('an HTTP 410 on the watch request becomes WatchGoneError; other codes KubeApiError', async () => {
    const gone = client(new FakeRest([]), new FakeWatch([], new WatchHttpError(410, 'Gone')));
    await expect(gone.watch(APPS, { resourceVersion: '1', allowWatchBookmarks: true }, () => {})).rejects.toThrow(
      new WatchGoneError('watching apps.kappctrl.k14s.io: 410 Gone'),
    );
    const forbidden = client(new FakeRest([]), new FakeWatch([], new WatchHttpError(403, 'Forbidden')));
    const err = (await forbidden
      .watch(APPS, { resourceVersion: '1', allowWatchBookmarks: true }, () => {})
      .catch((e: unknown) => e)) as KubeApiError;
    expect(err.constructor).toBe(KubeApiError);
    expect(err.message).toBe('watching apps.kappctrl.k14s.io: 403 Forbidden');
  });

  it('an exception in onEvent is rethrown as is; transport errors are wrapped', async () => {
    const boom = new Error('handler broke');
    const c = client(new FakeRest([]), new FakeWatch([['ADDED', { metadata: {} }]]));
    await expect(
      c.watch(APPS, { resourceVersion: '1', allowWatchBookmarks: true }, () => {
        throw boom;
      }),
    ).rejects.toBe(boom);
    const reset = Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });
    const c2 = client(new FakeRest([]), new FakeWatch([], reset));
    const err = (await c2
      .watch(APPS, { resourceVersion: '1', allowWatchBookmarks: true }, () => {})
      .catch((e: unknown) => e)) as KubeApiError;
    expect(err).toBeInstanceOf(KubeApiError);
    expect(err.message).toBe('watching apps.kappctrl.k14s.io: socket hang up');
    expect(err.cause).toBe(reset);
  });
});

describe('KubeApiClient leases', () => {
  const PATH = '/apis/coordination.k8s.io/v1/namespaces/kapp-lambda/leases';
  const spec = { holderIdentity: 'h_1', leaseDurationSeconds: 15, renewTime: '2025-03-01T10:00:00.000000Z' };
  const lease = (rv: string) => ({
    metadata: { name: 'l', namespace: 'kapp-lambda', uid: 'u', resourceVersion: rv },
    spec,
  });

  it('gets (undefined on 404), creates with POST and updates with a resourceVersion PUT', async () => {
    const rest = new FakeRest([
      { statusCode: 404, body: { kind: 'Status', reason: 'NotFound', message: 'leases "l" not found' } },
      { statusCode: 201, body: lease('5') },
      { statusCode: 200, body: lease('6') },
      { statusCode: 200, body: lease('6') },
    ]);
    const c = client(rest);
    expect(await c.getLease('kapp-lambda', 'l')).toBeUndefined();
    expect(await c.createLease('kapp-lambda', 'l', spec)).toEqual(lease('5'));
    expect(await c.updateLease('kapp-lambda', 'l', '5', spec)).toEqual(lease('6'));
    expect(await c.getLease('kapp-lambda', 'l')).toEqual(lease('6'));
    expect(rest.requests).toEqual([
      { method: 'GET', path: `${PATH}/l` },
      {
        method: 'POST',
        path: PATH,
        body: {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: { name: 'l', namespace: 'kapp-lambda' },
          spec,
        },
      },
      {
        method: 'PUT',
        path: `${PATH}/l`,
        body: {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: { name: 'l', namespace: 'kapp-lambda', resourceVersion: '5' },
          spec,
        },
      },
      { method: 'GET', path: `${PATH}/l` },
    ]);
  });

  it('maps 409 to ConflictError and a missing namespace to KubeApiError with the server message', async () => {
    const rest = new FakeRest([
      { statusCode: 409, body: { reason: 'AlreadyExists', message: 'leases.coordination.k8s.io "l" already exists' } },
      { statusCode: 409, body: { reason: 'Conflict', message: 'the object has been modified' } },
      { statusCode: 404, body: { reason: 'NotFound', message: 'namespaces "kapp-lambda" not found' } },
    ]);
    const c = client(rest);
    await expect(c.createLease('kapp-lambda', 'l', spec)).rejects.toBeInstanceOf(ConflictError);
    const err = await c.updateLease('kapp-lambda', 'l', '5', spec).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConflictError);
    expect((err as Error).message).toBe('updating Lease kapp-lambda/l: 409 the object has been modified');
    const missing = await c.createLease('kapp-lambda', 'l', spec).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(KubeApiError);
    expect(missing).not.toBeInstanceOf(ConflictError);
    expect((missing as Error).message).toBe('creating Lease kapp-lambda/l: 404 namespaces "kapp-lambda" not found');
  });
});

describe('KubeApiClient App and Secret writes (install view)', () => {
  const APPS = '/apis/kappctrl.k14s.io/v1alpha1/namespaces/ns1/apps';
  const alreadyExists: RestResponse = {
    statusCode: 409,
    body: { kind: 'Status', reason: 'AlreadyExists', message: 'secrets "s" already exists', code: 409 },
  };

  it('creates with POST, updates with PUT, deletes with a uid precondition (false on 404 and on another uid)', async () => {
    const rest = new FakeRest([
      { statusCode: 201, body: app('1').body },
      { statusCode: 200, body: app('2').body },
      conflict,
      { statusCode: 404, body: notFound('apps "a1" not found').body },
      { statusCode: 200, body: {} },
      { statusCode: 404, body: notFound('apps "a1" not found').body },
      {
        statusCode: 409,
        body: {
          kind: 'Status',
          reason: 'Conflict',
          message: 'Precondition failed: UID in precondition: u2, UID in object meta: u1',
        },
      },
    ]);
    const c = client(rest);
    const body = app('1').body;
    expect(await c.createApp(body)).toEqual(body);
    expect(await c.updateApp(body)).toEqual(app('2').body);
    await expect(c.updateApp(body)).rejects.toBeInstanceOf(ConflictError);
    await expect(c.updateApp(body)).rejects.toBeInstanceOf(GoneError);
    expect(await c.deleteApp('ns1', 'a1', { uid: 'u1' })).toBe(true);
    expect(await c.deleteApp('ns1', 'a1')).toBe(false);
    expect(await c.deleteApp('ns1', 'a1', { uid: 'u2' })).toBe(false);
    expect(rest.requests.map((r) => [r.method, r.path])).toEqual([
      ['POST', APPS],
      ['PUT', APP_PATH],
      ['PUT', APP_PATH],
      ['PUT', APP_PATH],
      ['DELETE', APP_PATH],
      ['DELETE', APP_PATH],
      ['DELETE', APP_PATH],
    ]);
    expect(rest.requests[4]!.body).toEqual({
      apiVersion: 'v1',
      kind: 'DeleteOptions',
      propagationPolicy: 'Background',
      preconditions: { uid: 'u1' },
    });
  });

  it('creates a Secret with base64 data; AlreadyExists is false, other errors throw', async () => {
    const rest = new FakeRest([
      { statusCode: 201, body: {} },
      alreadyExists,
      { statusCode: 403, body: { kind: 'Status', reason: 'Forbidden', message: 'forbidden' } },
    ]);
    const c = client(rest);
    const secret = {
      metadata: { name: 's', namespace: 'ns1', annotations: { a: '' } },
      type: 'kubernetes.io/dockerconfigjson',
      data: { '.dockerconfigjson': Buffer.from('{"auths":{}}') },
    };
    expect(await c.createSecret(secret)).toBe(true);
    expect(await c.createSecret(secret)).toBe(false);
    await expect(c.createSecret(secret)).rejects.toBeInstanceOf(KubeApiError);
    expect(rest.requests[0]).toEqual({
      method: 'POST',
      path: '/api/v1/namespaces/ns1/secrets',
      body: {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: secret.metadata,
        type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': Buffer.from('{"auths":{}}').toString('base64') },
      },
    });
  });
});
