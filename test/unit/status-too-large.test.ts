import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TemplateStageData } from '../../events/schema.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { packDir } from '../../functions/lib/artifact/tarball.js';
import { KAPP_OUTPUT_BYTES } from '../../functions/lib/deploy/run.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { KubeApiClient } from '../../functions/lib/kube/client.js';
import { KubeApiError, type KubeObject, type ResourceRef } from '../../functions/lib/kube/port.js';
import { MapClusterRegistry } from '../../functions/lib/kube/registry.js';
import { isStatusTooLargeError, writeStatus } from '../../functions/lib/kube/status-write.js';
import type { RestRequest, RestResponse, RestTransport, WatchTransport } from '../../functions/lib/kube/transport.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { runDeploy } from '../../functions/lib/pipeline/app/deploy.js';
import { runTemplate } from '../../functions/lib/pipeline/app/template.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { writeAppStatus } from '../../functions/lib/pipeline/report.js';
import { TRUNCATION_PREFIX } from '../../functions/lib/reconcile/redact.js';
import { summarizeStatus, templatePart } from '../../functions/lib/reconcile/status.js';
import {
  APISERVER_MAX_REQUEST_BODY_BYTES,
  ETCD_CLIENT_MAX_SEND_BYTES,
  ETCD_MAX_REQUEST_BYTES,
  STATUS_BUDGET_BYTES,
} from '../../functions/lib/reconcile/status-budget.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';

const MiB = 1024 * 1024;
const REF: ResourceRef = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: 'n', name: 'a' };
const APP_PATH = '/apis/kappctrl.k14s.io/v1alpha1/namespaces/n/apps/a';
const FENCE = { uid: 'u1', generation: 1 };

interface Limits {
  /** kube-apiserver request body bound (413 above). */
  body: number;
  /** The apiserver's etcd client send bound (500 ResourceExhausted above). */
  client: number;
  /** etcd --max-request-bytes (500 `etcdserver: request is too large` above). */
  etcd: number;
}

const REAL: Limits = {
  body: APISERVER_MAX_REQUEST_BODY_BYTES,
  client: ETCD_CLIENT_MAX_SEND_BYTES,
  etcd: ETCD_MAX_REQUEST_BYTES,
};

const failure = (code: number, message: string, reason = '') => ({
  statusCode: code,
  body: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code },
});

/**
 * The API server at the transport port: one App, GET and PUT /status with the real server's
 * answers for oversized writes (the shapes kube-apiserver v1.34 sends: 413 from the body limit,
 * 500 from etcd or from its gRPC client). Real {@link KubeApiClient} on top maps them.
 */
class FakeApiServer implements RestTransport {
  readonly puts: number[] = [];
  constructor(
    public object: KubeObject,
    private readonly limits: Limits = REAL,
  ) {}

  /** Every status stored, in order. */
  readonly statuses: AppStatus[] = [];

  async send(req: RestRequest): Promise<RestResponse> {
    if (req.method === 'GET' && req.path === APP_PATH) return { statusCode: 200, body: structuredClone(this.object) };
    if (req.method === 'PATCH' && req.path === APP_PATH) {
      // Finalizers (merge patch with the resourceVersion precondition).
      const patch = req.body as { metadata: { finalizers: string[] } };
      const rv = String(Number(this.object.metadata.resourceVersion) + 1);
      this.object = {
        ...this.object,
        metadata: { ...this.object.metadata, finalizers: patch.metadata.finalizers, resourceVersion: rv },
      };
      return { statusCode: 200, body: structuredClone(this.object) };
    }
    if (req.method === 'GET' && req.path === '/api/v1/namespaces/n/serviceaccounts/sa') {
      return { statusCode: 200, body: { metadata: { name: 'sa', namespace: 'n' } } };
    }
    if (req.method === 'POST' && req.path === '/api/v1/namespaces/n/serviceaccounts/sa/token') {
      return { statusCode: 201, body: { status: { token: 'tok', expirationTimestamp: '2099-01-01T00:00:00Z' } } };
    }
    if (req.method !== 'PUT' || req.path !== `${APP_PATH}/status`) return failure(404, 'not found', 'NotFound');
    const bodyBytes = Buffer.byteLength(JSON.stringify(req.body));
    this.puts.push(bodyBytes);
    if (bodyBytes > this.limits.body) {
      return failure(413, `Request entity too large: limit is ${this.limits.body}`, 'RequestEntityTooLarge');
    }
    const sent = req.body as { metadata: { resourceVersion: string }; status: unknown };
    if (sent.metadata.resourceVersion !== this.object.metadata.resourceVersion) {
      return failure(409, 'the object has been modified', 'Conflict');
    }
    const next = {
      ...this.object,
      metadata: { ...this.object.metadata, resourceVersion: String(Number(this.object.metadata.resourceVersion) + 1) },
      status: sent.status,
    };
    const stored = Buffer.byteLength(JSON.stringify(next));
    if (stored > this.limits.client) {
      return failure(
        500,
        `rpc error: code = ResourceExhausted desc = trying to send message larger than max (${stored} vs. ${this.limits.client})`,
      );
    }
    if (stored > this.limits.etcd) return failure(500, 'etcdserver: request is too large');
    this.object = next;
    this.statuses.push(next.status as AppStatus);
    return { statusCode: 200, body: structuredClone(next) };
  }
}

const noWatch: WatchTransport = {
  stream: async () => {
    throw new Error('not used');
  },
};

const clientOf = (server: FakeApiServer) =>
  new KubeApiClient({ rest: server, watch: noWatch, apiServer: { server: 'https://127.0.0.1:6443' } });

function appObject(spec: Record<string, unknown> = {}, status?: AppStatus): KubeObject {
  return {
    apiVersion: REF.apiVersion,
    kind: 'App',
    metadata: { name: 'a', namespace: 'n', uid: 'u1', resourceVersion: '1', generation: 1 },
    spec: {
      fetch: [{ inline: { paths: { 'config.yml': 'a: 1\n' } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
      ...spec,
    },
    ...(status ? { status } : {}),
  } as KubeObject;
}

/** The status of a ytt `fail()` with a ~5 MiB message: template.stderr and usefulErrorMessage carry it. */
function yttFailure(current: AppStatus | undefined): AppStatus {
  const stderr = `ytt: Error: \n- fail: ${'x'.repeat(5 * MiB)}\n    in <toplevel>\n      config.yml:3 | END-OF-MESSAGE\n`;
  const result = {
    stdout: '',
    stderr,
    exitCode: 1,
    error: 'Templating dir: Error (see .status.usefulErrorMessage for details)',
    finished: true,
  };
  const part = templatePart(result, new Date('2024-01-02T03:04:05Z'));
  return summarizeStatus(current, 1, { template: part }, result);
}

describe('isStatusTooLargeError (real client error mapping)', () => {
  it.each([
    ['413 from the request body bound', { body: 1000, client: 2 * MiB, etcd: MiB }, true],
    ['500 ResourceExhausted from the etcd client', { body: 3 * MiB, client: 1000, etcd: MiB }, true],
    ['500 etcdserver: request is too large', { body: 3 * MiB, client: 2 * MiB, etcd: 1000 }, true],
  ])('%s', async (_name, limits, want) => {
    const server = new FakeApiServer(appObject(), limits);
    const error = await clientOf(server)
      .updateStatus(REF, { resourceVersion: '1', uid: 'u1' }, { usefulErrorMessage: 'x'.repeat(2000) })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(KubeApiError);
    expect(isStatusTooLargeError(error)).toBe(want);
  });

  it.each([
    ['a conflict', failure(409, 'the object has been modified', 'Conflict')],
    ['another 500', failure(500, 'Internal error occurred: etcd leader changed')],
    ['a 422 validation error', failure(422, 'status.conditions: Invalid value', 'Invalid')],
  ])('is false for %s', async (_name, answer) => {
    const rest: RestTransport = {
      send: async (req) => (req.method === 'GET' ? { statusCode: 200, body: {} } : answer),
    };
    const client = new KubeApiClient({ rest, watch: noWatch, apiServer: { server: 'https://x' } });
    const error = await client.updateStatus(REF, { resourceVersion: '1', uid: 'u1' }, {}).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(KubeApiError);
    expect(isStatusTooLargeError(error)).toBe(false);
  });
});

describe('App status writes under the API server size limits', () => {
  it('without the budget, the 5 MiB ytt fail() status is rejected on every attempt (the old crash loop)', async () => {
    const server = new FakeApiServer(appObject());
    const error = await writeStatus<AppStatus>(clientOf(server), REF, FENCE, yttFailure).catch((e: unknown) => e);
    expect(isStatusTooLargeError(error)).toBe(true);
    expect((error as Error).message).toMatch(/trying to send message larger than max \(\d+ vs\. 2097152\)/);
  });

  it('writeAppStatus fits it into the budget: one write, ReconcileFailed, the tail of the message kept', async () => {
    const server = new FakeApiServer(appObject());
    const w = await writeAppStatus(clientOf(server), REF, FENCE, yttFailure);
    expect(w).toMatchObject({ outcome: 'written', resourceVersion: '2', attempts: 1 });
    expect(w.tooLarge).toBeUndefined();
    expect(server.puts).toHaveLength(1);
    const status = server.object.status as AppStatus;
    expect(Buffer.byteLength(JSON.stringify(status))).toBeLessThanOrEqual(STATUS_BUDGET_BYTES);
    expect(status.conditions).toEqual([
      {
        type: 'ReconcileFailed',
        status: 'True',
        message: 'Templating dir: Error (see .status.usefulErrorMessage for details)',
      },
    ]);
    expect(status.usefulErrorMessage?.startsWith(TRUNCATION_PREFIX)).toBe(true);
    expect(status.usefulErrorMessage?.endsWith('config.yml:3 | END-OF-MESSAGE\n')).toBe(true);
    expect(status.template?.stderr?.startsWith(TRUNCATION_PREFIX)).toBe(true);
    expect(status.consecutiveReconcileFailures).toBe(1);
    // The stored (fitted) status passes the budget unchanged: re-fitting does not cause writes.
    const again = await writeAppStatus(clientOf(server), REF, FENCE, (cur) => summarizeStatus(cur, 1, {}));
    expect(again.outcome).toBe('unchanged');
    expect(server.puts).toHaveLength(1);
  });

  it('a large spec shrinks the budget so the whole object stays under etcd 1.5 MiB', async () => {
    const spec = { fetch: [{ inline: { paths: { 'config.yml': 'y'.repeat(1.1 * MiB) } } }] };
    const server = new FakeApiServer(appObject(spec));
    const w = await writeAppStatus(clientOf(server), REF, FENCE, yttFailure);
    expect(w.outcome).toBe('written');
    expect(w.tooLarge).toBeUndefined();
    expect(Buffer.byteLength(JSON.stringify(server.object))).toBeLessThanOrEqual(ETCD_MAX_REQUEST_BYTES);
    expect((server.object.status as AppStatus).usefulErrorMessage?.endsWith('END-OF-MESSAGE\n')).toBe(true);
  });

  it.each([
    [
      '413 Request entity too large',
      { body: 100_000, client: 2 * MiB, etcd: 1.5 * MiB },
      'Status too large to store (updating status of App n/a: 413 Request entity too large: limit is 100000)',
    ],
    [
      '500 trying to send message larger than max',
      { body: 3 * MiB, client: 100_000, etcd: 1.5 * MiB },
      'Status too large to store (updating status of App n/a: 500 rpc error: code = ResourceExhausted desc = trying to send message larger than max (',
    ],
    [
      '500 etcdserver: request is too large',
      { body: 3 * MiB, client: 2 * MiB, etcd: 100_000 },
      'Status too large to store (updating status of App n/a: 500 etcdserver: request is too large)',
    ],
  ])('a write rejected with %s falls back to a minimal ReconcileFailed, once', async (_name, limits, head) => {
    const server = new FakeApiServer(appObject({}, { consecutiveReconcileFailures: 2 }), limits);
    const w = await writeAppStatus(clientOf(server), REF, FENCE, yttFailure);
    expect(w).toMatchObject({ outcome: 'written', resourceVersion: '2', attempts: 2, tooLarge: true });
    expect(server.puts).toHaveLength(2);
    const status = server.object.status as AppStatus;
    const message = status.conditions?.[0]?.message ?? '';
    expect(status.conditions).toHaveLength(1);
    expect(status.conditions?.[0]?.type).toBe('ReconcileFailed');
    expect(message.startsWith(head)).toBe(true);
    expect(message).toContain(
      '; first part of the error: Templating dir: Error (see .status.usefulErrorMessage for details)',
    );
    expect(Buffer.byteLength(message)).toBeLessThanOrEqual(2048);
    expect(status.friendlyDescription).toBe(`Reconcile failed: ${message}`);
    expect(status.usefulErrorMessage).toBe(message);
    expect(status.observedGeneration).toBe(1);
    expect(status.consecutiveReconcileFailures).toBe(3);
    expect(status.template).toEqual({ exitCode: 1, updatedAt: '2024-01-02T03:04:05Z' });
  });

  it('does not loop when even the fallback is too large: two PUTs, then the error', async () => {
    const server = new FakeApiServer(appObject(), { body: 3 * MiB, client: 2 * MiB, etcd: 600 });
    const error = await writeAppStatus(clientOf(server), REF, FENCE, yttFailure).catch((e: unknown) => e);
    expect(isStatusTooLargeError(error)).toBe(true);
    expect(server.puts).toHaveLength(2);
  });
});

describe('template output cut by the runner bound', () => {
  let tmp: string;
  let fetchKey: string;
  let tgz: Buffer;

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), 'status-too-large-'));
    const dir = await mkdtemp(path.join(tmp, 'src-'));
    await writeFile(path.join(dir, 'config.yml'), 'a: 1\n');
    const packed = await packDir(dir);
    tgz = packed.tgz;
    fetchKey = fetchArtifactKey(packed.sha256);
  });
  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  async function run(manifestBytes: number) {
    const server = new FakeApiServer(appObject());
    const store = new MemoryStore();
    await store.put(fetchKey, tgz);
    const runner = new FakeCommandRunner().on('ytt', {
      stdout: `${'---\nkind: ConfigMap\n'.repeat(manifestBytes / 20)}`.slice(0, manifestBytes),
    });
    const deps: PipelineDeps = {
      clusters: new MapClusterRegistry({ c1: clientOf(server) }),
      store,
      runner,
      now: () => new Date('2024-01-02T03:04:05Z'),
      log: memoryLogger(),
      config: {
        tmpRoot: path.join(tmp, 'scratch'),
        toolVersions: { ytt: 'v0.55.3' },
        controllerVersion: 'v0.53.1',
        maxTemplateOutputBytes: 1000,
      },
    };
    const data: TemplateStageData = {
      object: {
        clusterId: 'c1',
        kind: 'App',
        apiVersion: REF.apiVersion,
        namespace: 'n',
        name: 'a',
        uid: 'u1',
        generation: 1,
        resourceVersion: '1',
      },
      run: { generation: 1, runId: 'r1', startedAt: '2024-01-02T03:04:05Z' },
      artifacts: { fetchKey },
    };
    const out = await runTemplate(data, deps, async () => ({}));
    return { out, server, store };
  }

  it('fails the stage with a clear error instead of handing the tail to deploy', async () => {
    const { out, server, store } = await run(5000);
    expect(out.deploy).toBeUndefined();
    expect(await store.list('artifacts/template/')).toEqual([]);
    const status = server.object.status as AppStatus;
    const error =
      'Templating dir: ytt output exceeded 1000 bytes (the limit of a rendered manifest); nothing was deployed';
    expect(status.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message: error }]);
    expect(status.usefulErrorMessage).toBe(error);
    expect(status.template).toEqual({ exitCode: -1, error, updatedAt: '2024-01-02T03:04:05Z' });
  });

  it('hands an output within the bound to deploy', async () => {
    const { out, store } = await run(1000);
    expect(out.deploy?.artifacts.manifestKey).toMatch(/^artifacts\/template\/sha256\/[0-9a-f]{64}\.yaml$/);
    expect((await store.get(out.deploy?.artifacts.manifestKey ?? ''))?.length).toBe(1000);
  });
});

describe('kapp output while and after deploying', () => {
  it('8 MiB of kapp progress: every status written stays within the budget, the tail and marker kept', {
    timeout: 120_000,
  }, async () => {
    const server = new FakeApiServer(appObject({ serviceAccountName: 'sa' }));
    const store = new MemoryStore();
    const manifestKey = templateArtifactKey(sha256Hex('kind: ConfigMap\n'));
    await store.put(manifestKey, 'kind: ConfigMap\n');
    const line = 'Wait to: 0 reconcile, 0 delete, 1 noop  |  ongoing: waiting on configmap/x (v1) namespace: n\n';
    let total = 0;
    const runner = new FakeCommandRunner().on('kapp', async (req) => {
      req.onOutput?.('Changes\n\n ---- applying 1 changes [0/1 done] ----\n', 'stdout');
      // 8 MiB in 16 chunks, pausing so the 1 ms progress timer fires in between.
      const chunk = line.repeat(Math.ceil((512 * 1024) / line.length));
      for (let i = 0; i < 16; i++) {
        req.onOutput?.(chunk, 'stdout');
        req.onOutput?.(`stderr warning ${i}\n`.repeat(2000), 'stderr');
        total += chunk.length;
        await new Promise((r) => setTimeout(r, 3));
      }
      // kapp keeps running until a progress write has shown the cut output (bounded wait).
      const cutShown = () =>
        server.statuses.some((st) => st.deploy?.finished === false && st.deploy.stdout?.startsWith(TRUNCATION_PREFIX));
      for (let i = 0; i < 2000 && !cutShown(); i++) await new Promise((r) => setTimeout(r, 5));
      return { stdout: `${chunk.repeat(16)}Succeeded\n`, stderr: 'last warning\n' };
    });
    const deps: PipelineDeps = {
      clusters: new MapClusterRegistry({ c1: clientOf(server) }),
      store,
      runner,
      now: () => new Date('2024-01-02T03:04:05Z'),
      log: memoryLogger(),
      config: {
        tmpRoot: path.join(tmpdir(), 'status-too-large-deploy'),
        toolVersions: {},
        controllerVersion: 'v0.53.1',
        deployProgressIntervalMs: 1,
      },
    };
    await runDeploy(
      {
        object: {
          clusterId: 'c1',
          kind: 'App',
          apiVersion: REF.apiVersion,
          namespace: 'n',
          name: 'a',
          uid: 'u1',
          generation: 1,
          resourceVersion: '1',
        },
        run: { generation: 1, runId: 'r1', startedAt: '2024-01-02T03:04:05Z' },
        artifacts: { manifestKey },
      },
      deps,
    );
    expect(total).toBeGreaterThan(8 * MiB - 1);
    const progress = server.statuses.filter((st) => st.deploy?.finished === false);
    expect(progress.length).toBeGreaterThan(0);
    for (const st of server.statuses) {
      expect(Buffer.byteLength(JSON.stringify(st))).toBeLessThanOrEqual(STATUS_BUDGET_BYTES);
    }
    for (const st of progress) {
      expect(st.deploy?.stdout?.endsWith('waiting on configmap/x (v1) namespace: n')).toBe(true);
    }
    // Once more than the budget has streamed, progress shows the tail behind the marker.
    expect(progress.some((st) => st.deploy?.stdout?.startsWith(TRUNCATION_PREFIX))).toBe(true);
    const final = server.object.status as AppStatus;
    expect(final.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(final.deploy?.finished).toBe(true);
    expect(final.deploy?.stdout?.startsWith(TRUNCATION_PREFIX)).toBe(true);
    expect(final.deploy?.stdout?.endsWith('namespace: n\nSucceeded')).toBe(true);
    // The runner kept at most its bound; the status at most its share of the budget.
    expect(Buffer.byteLength(final.deploy?.stdout ?? '')).toBeLessThan(KAPP_OUTPUT_BYTES);
    expect(final.deploy?.stderr).toBe('last warning');
  });
});
