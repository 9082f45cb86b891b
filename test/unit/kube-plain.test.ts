/**
 * The forwarder's plain transports (`functions/lib/kube/plain.ts`, `kubeconfig-auth.ts`):
 * kubeconfig contexts read without client-node (certificates, tokens, token files, exec plugins;
 * what it refuses), and the REST and watch transports against a local HTTP server standing in
 * for the API server.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { forwarderKube } from '../../events/forwarder/kube.js';
import { WatchHttpError } from '../../functions/lib/kube/http.js';
import {
  inClusterConnection,
  type PlainConnection,
  plainConnectionOf,
} from '../../functions/lib/kube/kubeconfig-auth.js';
import { restTransportForKubeconfig } from '../../functions/lib/kube/kubeconfig-plain.js';
import {
  APP_SERVER_MAX_BODY_BYTES,
  PlainRestTransport,
  PlainWatchTransport,
  RestBodyTooLargeError,
} from '../../functions/lib/kube/plain.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'kube-plain-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const b64 = (s: string) => Buffer.from(s).toString('base64');

async function kubeconfig(name: string, user: Record<string, unknown>, cluster: Record<string, unknown> = {}) {
  const file = path.join(dir, name);
  await writeFile(
    file,
    [
      'apiVersion: v1',
      'kind: Config',
      'current-context: one',
      'clusters:',
      `- name: c1\n  cluster: ${JSON.stringify({ server: 'https://one.example:6443', ...cluster })}`,
      'users:',
      `- name: u1\n  user: ${JSON.stringify(user)}`,
      'contexts:',
      '- name: one\n  context: {cluster: c1, user: u1}',
      '- name: two\n  context: {cluster: missing, user: u1}',
    ].join('\n'),
  );
  return file;
}

describe('plainConnectionOf', () => {
  it('reads inline certificate data, the CA and the TLS options of the current context', async () => {
    const file = await kubeconfig(
      'certs.yaml',
      { 'client-certificate-data': b64('CERT'), 'client-key-data': b64('KEY') },
      { 'certificate-authority-data': b64('CA'), 'tls-server-name': 'api', 'insecure-skip-tls-verify': true },
    );
    expect(await plainConnectionOf(file)).toEqual({
      connection: {
        server: 'https://one.example:6443',
        ca: 'CA',
        cert: 'CERT',
        key: 'KEY',
        tlsServerName: 'api',
        insecureSkipTlsVerify: true,
      },
    });
  });

  it('reads certificate files relative to the kubeconfig and keeps a token file as a path', async () => {
    await writeFile(path.join(dir, 'ca.crt'), 'CAFILE');
    const file = await kubeconfig('files.yaml', { tokenFile: 'token' }, { 'certificate-authority': 'ca.crt' });
    expect(await plainConnectionOf(file)).toEqual({
      connection: { server: 'https://one.example:6443', ca: 'CAFILE', tokenFile: path.join(dir, 'token') },
    });
  });

  it('takes an exec plugin with its arguments and environment', async () => {
    const file = await kubeconfig('exec.yaml', {
      exec: {
        apiVersion: 'client.authentication.k8s.io/v1',
        command: 'aws',
        args: ['eks', 'get-token'],
        env: [{ name: 'A', value: 'b' }],
      },
    });
    expect(await plainConnectionOf(file)).toEqual({
      connection: {
        server: 'https://one.example:6443',
        exec: {
          command: 'aws',
          args: ['eks', 'get-token'],
          env: { A: 'b' },
          apiVersion: 'client.authentication.k8s.io/v1',
        },
      },
    });
  });

  it('takes basic auth, impersonation and an auth-provider stored token; names a missing token field only', async () => {
    const conn = async (name: string, user: Record<string, unknown>) =>
      ((await plainConnectionOf(await kubeconfig(name, user))) as { connection: PlainConnection }).connection;
    expect(await conn('basic.yaml', { username: 'u', password: 'p' })).toMatchObject({
      basic: { username: 'u', password: 'p' },
    });
    expect(
      await conn('as.yaml', { token: 't', as: 'jane', 'as-groups': ['g1', 'g2'], 'as-user-extra': { scopes: ['s'] } }),
    ).toMatchObject({ token: 't', impersonate: { user: 'jane', groups: ['g1', 'g2'], extra: { scopes: ['s'] } } });
    expect(
      await conn('oidc.yaml', {
        'auth-provider': { name: 'oidc', config: { 'id-token': 'idt', 'access-token': 'x' } },
      }),
    ).toMatchObject({ token: 'idt' });
    expect(
      await conn('gcp.yaml', { 'auth-provider': { name: 'gcp', config: { 'access-token': 'at' } } }),
    ).toMatchObject({ token: 'at' });
    expect(
      await plainConnectionOf(
        await kubeconfig('ap.yaml', { 'auth-provider': { name: 'oidc', config: { 'refresh-token': 'secret-rt' } } }),
      ),
    ).toEqual({ unsupported: 'user auth-provider without config id-token' });
  });

  it('names what it does not speak instead of connecting without it', async () => {
    expect(
      await plainConnectionOf(await kubeconfig('proxy.yaml', { token: 't' }, { 'proxy-url': 'socks5://p' })),
    ).toEqual({
      unsupported: 'cluster proxy-url other than an http:// proxy to an https server',
    });
    await expect(forwarderKube({ kubeconfig: path.join(dir, 'proxy.yaml') })).rejects.toThrow(
      /does not support cluster proxy-url/,
    );
  });

  it('fails on a missing context or cluster, naming the context and never the contents', async () => {
    const file = await kubeconfig('ctx.yaml', { token: 'secret-token' });
    await expect(plainConnectionOf(file, 'nope')).rejects.toThrow('no context "nope"');
    await expect(plainConnectionOf(file, 'two')).rejects.toThrow('context "two" has no cluster');
    await writeFile(path.join(dir, 'bad.yaml'), 'secret-token: [');
    await expect(plainConnectionOf(path.join(dir, 'bad.yaml'))).rejects.toThrow(/not a valid kubeconfig$/);
  });
});

describe('inClusterConnection', () => {
  it('uses the service host and port, the mounted CA and the token file', async () => {
    const sa = path.join(dir, 'sa');
    await import('node:fs/promises').then((fs) => fs.mkdir(sa, { recursive: true }));
    await writeFile(path.join(sa, 'token'), 'tok');
    await writeFile(path.join(sa, 'ca.crt'), 'CA');
    expect(inClusterConnection({ KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443' }, sa)).toEqual({
      server: 'https://[fd00::1]:443',
      ca: 'CA',
      tokenFile: path.join(sa, 'token'),
    });
    expect(() => inClusterConnection({}, sa)).toThrow(/not in a cluster/);
  });
});

describe('PlainRestTransport and PlainWatchTransport', () => {
  let server: http.Server;
  let base: string;
  const seen: {
    method?: string;
    url?: string;
    auth?: string;
    accept?: string;
    body: string;
    headers?: http.IncomingHttpHeaders;
  }[] = [];
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c) => {
        body += c;
      });
      req.on('end', () => {
        seen.push({
          method: req.method,
          url: req.url,
          auth: req.headers.authorization,
          accept: req.headers.accept,
          body,
          headers: req.headers,
        });
        const url = new URL(req.url ?? '/', 'http://x');
        if (url.pathname.endsWith('/forbidden')) {
          res.writeHead(403, { 'Content-Type': 'application/json' });
          res.end(JSON.stringify({ kind: 'Status', message: 'no watching here' }));
          return;
        }
        if (url.pathname.endsWith('/flood')) {
          // A hostile server: an answer far longer than anything an API server sends.
          res.writeHead(200, { 'Content-Type': 'application/json' });
          const chunk = Buffer.alloc(1 << 20, 'a');
          let left = 64;
          const pump = (): void => {
            while (left-- > 0 && !res.destroyed) if (!res.write(chunk)) return void res.once('drain', pump);
            res.end();
          };
          pump();
          return;
        }
        if (url.searchParams.get('watch') === 'true') {
          res.writeHead(200, { 'Content-Type': 'application/json' });
          // one event split across writes, then two in one write
          res.write('{"type":"ADDED","object":{"metadata":{"na');
          res.write('me":"a"}}}\n{"type":"MODIFIED","object":{"metadata":{"name":"a"}}}\n{"type":"BOOKMARK",');
          res.end('"object":{"metadata":{"resourceVersion":"9"}}}\n');
          return;
        }
        res.writeHead(url.pathname.endsWith('/missing') ? 404 : 200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ path: url.pathname, query: url.search }));
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/prefix`;
  });
  afterAll(async () => {
    await new Promise((r) => server.close(r));
  });

  it('sends JSON with the token under the server path prefix and resolves every status', async () => {
    const rest = new PlainRestTransport({ server: base, token: 't0k' });
    const ok = await rest.send({
      method: 'PUT',
      path: '/api/v1/namespaces/n/configmaps/c',
      query: { dryRun: 'All', skip: undefined },
      body: { data: { a: 'é' } },
      accept: 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json',
    });
    expect(ok).toEqual({
      statusCode: 200,
      body: { path: '/prefix/api/v1/namespaces/n/configmaps/c', query: '?dryRun=All' },
    });
    expect(seen.at(-1)).toMatchObject({
      method: 'PUT',
      auth: 'Bearer t0k',
      accept: 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json',
      body: '{"data":{"a":"é"}}',
    });
    expect((await rest.send({ method: 'GET', path: '/missing' })).statusCode).toBe(404);
    rest.close();
  });

  it('re-reads a token file after its refresh period only, and asks an exec plugin once per token life', async () => {
    const tokenFile = path.join(dir, 'rotating');
    await writeFile(tokenFile, 'first\n');
    const rest = new PlainRestTransport({ server: base, tokenFile });
    await rest.send({ method: 'GET', path: '/x' });
    await writeFile(tokenFile, 'second\n');
    await rest.send({ method: 'GET', path: '/x' });
    expect(seen.slice(-2).map((s) => s.auth)).toEqual(['Bearer first', 'Bearer first']);
    rest.close();

    const plugin = path.join(dir, 'plugin.mjs');
    const counter = path.join(dir, 'plugin-runs');
    await writeFile(
      plugin,
      `#!/usr/bin/env node\nimport { appendFileSync } from 'node:fs';\nappendFileSync(${JSON.stringify(counter)}, 'x');\nconst info = JSON.parse(process.env.KUBERNETES_EXEC_INFO);\nprocess.stdout.write(JSON.stringify({ apiVersion: info.apiVersion, kind: 'ExecCredential', status: { token: 'exec-' + process.env.EXTRA, expirationTimestamp: new Date(Date.now() + 3600e3).toISOString() } }));\n`,
    );
    await chmod(plugin, 0o755);
    const execRest = new PlainRestTransport({
      server: base,
      exec: {
        command: process.execPath,
        args: [plugin],
        env: { EXTRA: 'ok' },
        apiVersion: 'client.authentication.k8s.io/v1',
      },
    });
    await execRest.send({ method: 'GET', path: '/x' });
    await execRest.send({ method: 'GET', path: '/x' });
    expect(seen.slice(-2).map((s) => s.auth)).toEqual(['Bearer exec-ok', 'Bearer exec-ok']);
    expect((await import('node:fs/promises').then((fs) => fs.readFile(counter, 'utf8'))).length).toBe(1);
    execRest.close();
  });

  it('asks a bearer source per request and per watch, ahead of a static token', async () => {
    const tokens = ['b1', 'b2', 'b3'];
    const conn = { server: base, token: 'static', bearer: async () => tokens.shift() ?? 'none' };
    const rest = new PlainRestTransport(conn);
    await rest.send({ method: 'GET', path: '/a' });
    expect(seen.at(-1)?.auth).toBe('Bearer b1');
    await rest.send({ method: 'GET', path: '/b' });
    expect(seen.at(-1)?.auth).toBe('Bearer b2');
    rest.close();
    await new PlainWatchTransport(conn).stream('/api/v1/secrets', {}, () => {});
    expect(seen.at(-1)?.auth).toBe('Bearer b3');
  });

  it('bounds the body of an answer: an App-named server cannot fill the memory of the function serving every tenant', async () => {
    const bounded = new PlainRestTransport({ server: base }, undefined, 4096);
    await expect(bounded.send({ method: 'GET', path: '/flood' })).rejects.toThrow(
      new RestBodyTooLargeError({ method: 'GET', path: '/flood' }, 4096),
    );
    expect((await bounded.send({ method: 'GET', path: '/small' })).statusCode).toBe(200);
    bounded.close();
    const app = restTransportForKubeconfig(
      JSON.stringify({
        clusters: [{ name: 'c', cluster: { server: base } }],
        users: [{ name: 'u', user: { token: 'flood' } }],
        contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'x',
      }),
    );
    await expect(app.send({ method: 'GET', path: '/flood' })).rejects.toThrow(
      `longer than ${APP_SERVER_MAX_BODY_BYTES} bytes (GET /flood)`,
    );
  });

  it('closes its connection to a proxy-url that never answers CONNECT once the request bound passes', async () => {
    const proxied: net.Socket[] = [];
    let onClose: () => void = () => {};
    const closed = new Promise<void>((resolve) => {
      onClose = resolve;
    });
    // A proxy that accepts, reads the CONNECT and never answers.
    const proxy = net.createServer((socket) => {
      proxied.push(socket);
      socket.resume();
      socket.on('close', () => onClose());
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    const port = (proxy.address() as AddressInfo).port;
    const rest = new PlainRestTransport(
      { server: 'https://api.example.test:6443', token: 't', proxyUrl: `http://127.0.0.1:${port}` },
      200,
    );
    // The request's own bound or the tunnel's, whichever passes first: both are 200 ms.
    await expect(rest.send({ method: 'GET', path: '/version' })).rejects.toThrow(/within 200 ms/);
    await closed;
    expect(proxied).toHaveLength(1);
    rest.close();
    await new Promise((r) => proxy.close(r));
  });

  it('reads as an App kubeconfig: basic auth, impersonation, a stored auth-provider token', async () => {
    const appKubeconfig = (user: Record<string, unknown>) =>
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: { server: base } }],
        users: [{ name: 'u', user }],
        contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'x',
      });
    await restTransportForKubeconfig(
      appKubeconfig({ username: 'app', password: 'pw', as: 'jane', 'as-groups': ['g1', 'g2'] }),
    ).send({
      method: 'GET',
      path: '/basic',
    });
    expect(seen.at(-1)?.auth).toBe(`Basic ${Buffer.from('app:pw').toString('base64')}`);
    expect(seen.at(-1)?.headers?.['impersonate-user']).toBe('jane');
    expect(seen.at(-1)?.headers?.['impersonate-group']).toBe('g1, g2');
    await restTransportForKubeconfig(
      appKubeconfig({ 'auth-provider': { name: 'azure', config: { 'access-token': 'az' } } }),
    ).send({ method: 'GET', path: '/provider' });
    expect(seen.at(-1)?.auth).toBe('Bearer az');
    // A restricted kubeconfig never names a file or a program; one that did is refused by field name.
    expect(() => restTransportForKubeconfig(appKubeconfig({ tokenFile: '/var/secret-token' }))).toThrow(
      /^the App kubeconfig: context "x" uses user tokenFile, which is not supported$/,
    );
    expect(() =>
      restTransportForKubeconfig(
        appKubeconfig({ 'auth-provider': { name: 'oidc', config: { 'refresh-token': 'rt-secret' } } }),
      ),
    ).toThrow(
      /^the App kubeconfig: context "x" uses user auth-provider without config id-token, which is not supported$/,
    );
  });

  it('streams watch events split across chunks, in order, and reports a refused watch with its status', async () => {
    const watch = new PlainWatchTransport({ server: base, token: 'w' });
    const lines: [string, unknown][] = [];
    await watch.stream('/api/v1/secrets', { resourceVersion: '5', allowWatchBookmarks: true }, (t, o) =>
      lines.push([t, o]),
    );
    expect(lines).toEqual([
      ['ADDED', { metadata: { name: 'a' } }],
      ['MODIFIED', { metadata: { name: 'a' } }],
      ['BOOKMARK', { metadata: { resourceVersion: '9' } }],
    ]);
    expect(seen.at(-1)?.url).toBe('/prefix/api/v1/secrets?resourceVersion=5&allowWatchBookmarks=true&watch=true');
    const refused = watch.stream('/forbidden', {}, () => {});
    await expect(refused).rejects.toBeInstanceOf(WatchHttpError);
    await expect(refused).rejects.toMatchObject({ statusCode: 403, message: 'no watching here' });
  });

  it('rejects with the handler error and resolves when aborted', async () => {
    const watch = new PlainWatchTransport({ server: base });
    await expect(
      watch.stream('/api/v1/secrets', {}, () => {
        throw new Error('handler broke');
      }),
    ).rejects.toThrow('handler broke');
    const ac = new AbortController();
    ac.abort();
    await expect(watch.stream('/api/v1/secrets', {}, () => {}, ac.signal)).resolves.toBeUndefined();
  });
});
