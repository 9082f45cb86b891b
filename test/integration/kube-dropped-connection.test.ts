/**
 * A dropped connection to the API server (issue 25 item 7: a fresh clone's suite, loaded by
 * other work, once failed an App with `Premature close` while adding its finalizer): the real
 * {@link KubeApiClient} over each real transport (client-node's, the plain one) against a real
 * loopback HTTP server that closes the socket before or in the middle of chosen answers. A
 * replay-safe request (a GET; a PATCH or PUT carrying its resourceVersion) is sent again and
 * succeeds; a create (POST) is not repeated; a connection that keeps dropping fails after
 * {@link DROPPED_CONNECTION_ATTEMPTS} attempts, naming them.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { KubeApiClient } from '../../functions/lib/kube/client.js';
import { DROPPED_CONNECTION_ATTEMPTS } from '../../functions/lib/kube/http.js';
import { plainClient } from '../../functions/lib/kube/plain.js';
import { APP_API_VERSION, KubeApiError, type KubeObject } from '../../functions/lib/kube/port.js';
import { clientForKubeConfig } from '../../functions/lib/kube/registry.js';

/**
 * What the server does with one request: answer it; close the socket before answering
 * (`hang-up`: the client sees `socket hang up`); or start a chunked answer and close the socket
 * halfway, without applying a write (`cut`) or after applying it (`apply-then-cut`: the answer
 * of a write that happened is lost).
 */
type Fate = 'answer' | 'hang-up' | 'cut' | 'apply-then-cut';

const APP_PATH = '/apis/kappctrl.k14s.io/v1alpha1/namespaces/ns/apps/a';
const APP_REF = { apiVersion: APP_API_VERSION, kind: 'App', namespace: 'ns', name: 'a' };
const FINALIZER = 'finalizers.kapp-ctrl.k14s.io/delete';

let server: http.Server;
let base: string;
/** Fates of the next requests, in order; `answer` once empty. */
let fates: Fate[] = [];
/** Every request received, as `METHOD path`. */
let seen: string[] = [];
/** The one App the server holds. */
let app: KubeObject;

function conflict(res: http.ServerResponse): void {
  res.writeHead(409, { 'Content-Type': 'application/json' });
  res.end(
    JSON.stringify({
      kind: 'Status',
      status: 'Failure',
      reason: 'Conflict',
      code: 409,
      message: 'Operation cannot be fulfilled on apps.kappctrl.k14s.io "a": the object has been modified',
    }),
  );
}

/** Applies a write with its resourceVersion precondition, as the API server does; `undefined` when it conflicts. */
function apply(method: string, path: string, body: string): { status: number; body: unknown } | undefined {
  if (method === 'GET' && path === APP_PATH) return { status: 200, body: app };
  if (method === 'POST') return { status: 201, body: JSON.parse(body) };
  const patch = JSON.parse(body) as KubeObject & { status?: unknown };
  if (patch.metadata.resourceVersion !== app.metadata.resourceVersion) return undefined;
  const resourceVersion = String(Number(app.metadata.resourceVersion) + 1);
  if (method === 'PATCH' && path === APP_PATH) {
    app = { ...app, metadata: { ...app.metadata, finalizers: patch.metadata.finalizers, resourceVersion } };
  } else if (method === 'PUT' && path === `${APP_PATH}/status`) {
    app = { ...app, metadata: { ...app.metadata, resourceVersion }, status: patch.status } as KubeObject;
  } else {
    return { status: 404, body: { kind: 'Status', code: 404, message: 'not found' } };
  }
  return { status: 200, body: app };
}

beforeAll(async () => {
  server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (chunk) => {
      body += chunk;
    });
    req.on('end', () => {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      seen.push(`${req.method} ${path}`);
      const fate = fates.shift() ?? 'answer';
      if (fate === 'hang-up') {
        req.socket.destroy();
        return;
      }
      const answer = fate === 'cut' ? { status: 200, body: app } : apply(req.method ?? '', path, body);
      if (!answer) {
        conflict(res);
        return;
      }
      const text = JSON.stringify(answer.body);
      res.writeHead(answer.status, { 'Content-Type': 'application/json' });
      if (fate === 'answer') {
        res.end(text);
        return;
      }
      // Half the answer in one chunk, then the socket closes under it.
      res.write(text.slice(0, text.length >> 1), () => res.socket?.destroy());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

beforeEach(() => {
  fates = [];
  seen = [];
  app = {
    apiVersion: APP_API_VERSION,
    kind: 'App',
    metadata: { name: 'a', namespace: 'ns', uid: 'u-1', resourceVersion: '1' },
  } as KubeObject;
});

/** The client-node transports, as the runtime's kubeconfig registry builds them. */
function clientNode(): KubeApiClient {
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromOptions({
    clusters: [{ name: 'c', server: base, skipTLSVerify: true }],
    users: [{ name: 'u', token: 't0k' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
  });
  return clientForKubeConfig(kubeConfig);
}

/** The plain transports, as the forwarder and the fleet registry build them. */
function plain(): KubeApiClient {
  return plainClient({ server: base, token: 't0k' });
}

describe.each([
  // node-fetch reads a chunked answer cut off as `Premature close`; node:http as `aborted`.
  {
    transport: 'client-node',
    client: clientNode,
    hangUpReason: (path: string) => `request to ${base}${path} failed, reason: socket hang up`,
    cutReason: (path: string) => `Invalid response body while trying to fetch ${base}${path}: Premature close`,
  },
  { transport: 'plain', client: plain, hangUpReason: () => 'socket hang up', cutReason: () => 'aborted' },
])('a dropped connection over the $transport transport', ({ client, hangUpReason, cutReason }) => {
  it('a GET dropped before its answer, then in the middle of it, is sent again and succeeds', async () => {
    fates = ['hang-up', 'cut'];
    const got = await client().getObject(APP_REF);
    expect(got?.metadata).toEqual({ name: 'a', namespace: 'ns', uid: 'u-1', resourceVersion: '1' });
    expect(seen).toEqual([`GET ${APP_PATH}`, `GET ${APP_PATH}`, `GET ${APP_PATH}`]);
  });

  it('a finalizer PATCH whose answer is cut off before it was applied is sent again and applied once', async () => {
    fates = ['answer', 'cut'];
    const added = await client().addFinalizer(APP_REF, FINALIZER, { uid: 'u-1' });
    expect(added).toEqual({ changed: true, resourceVersion: '2' });
    expect(app.metadata.finalizers).toEqual([FINALIZER]);
    expect(seen).toEqual([`GET ${APP_PATH}`, `PATCH ${APP_PATH}`, `PATCH ${APP_PATH}`]);
  });

  it('a finalizer PATCH applied but whose answer was lost: the replay is refused (409), a re-read finds it in place', async () => {
    fates = ['answer', 'apply-then-cut'];
    const added = await client().addFinalizer(APP_REF, FINALIZER, { uid: 'u-1' });
    // Not `changed`: from the client's side someone put it there; it is there, once.
    expect(added).toEqual({ changed: false, resourceVersion: '2' });
    expect(app.metadata.finalizers).toEqual([FINALIZER]);
    expect(seen).toEqual([`GET ${APP_PATH}`, `PATCH ${APP_PATH}`, `PATCH ${APP_PATH}`, `GET ${APP_PATH}`]);
  });

  it('a status PUT with its resourceVersion dropped before its answer is sent again', async () => {
    fates = ['hang-up'];
    const written = await client().updateStatus(
      APP_REF,
      { resourceVersion: '1', uid: 'u-1' },
      { friendlyDescription: 'Reconcile succeeded' },
    );
    expect(written).toEqual({ resourceVersion: '2' });
    expect(seen).toEqual([`PUT ${APP_PATH}/status`, `PUT ${APP_PATH}/status`]);
  });

  it('a create (POST) is not repeated: its drop rejects, the server saw it once', async () => {
    fates = ['hang-up'];
    const creating = client().createSecret({
      metadata: { name: 's', namespace: 'ns' },
      type: 'Opaque',
      data: { k: Buffer.from('v') },
    });
    await expect(creating).rejects.toThrow(
      new KubeApiError(`creating Secret ns/s: ${hangUpReason('/api/v1/namespaces/ns/secrets')}`),
    );
    expect(seen).toEqual(['POST /api/v1/namespaces/ns/secrets']);
  });

  it('a GET whose connection keeps dropping fails after the bound, naming the attempts and the last drop', async () => {
    fates = Array.from({ length: DROPPED_CONNECTION_ATTEMPTS + 1 }, () => 'cut' as const);
    await expect(client().getObject(APP_REF)).rejects.toThrow(
      new KubeApiError(
        `getting App ns/a: the API server dropped the connection 3 times (GET ${APP_PATH}): ${cutReason(APP_PATH)}`,
      ),
    );
    expect(seen).toEqual([`GET ${APP_PATH}`, `GET ${APP_PATH}`, `GET ${APP_PATH}`]);
  });
});
