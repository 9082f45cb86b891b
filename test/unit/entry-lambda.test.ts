/**
 * The Lambda composition root (per-stage cluster narrowing, deps wiring, SDK client options)
 * and the Runtime API loop with a fake API client at its port.
 */
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type KappEvent, type ObjectRef, objectEvent, objectRefOf } from '../../events/schema.js';
import { createAwsClients } from '../../functions/lib/entry/aws-clients.js';
import { CONTROLLER_VERSION, ConfigError, parseLambdaEnv } from '../../functions/lib/entry/config.js';
import {
  cellClusterRegistry,
  createLambdaDeps,
  kubeconfigClusterRegistry,
  lazySendClient,
  stageClusterRegistry,
} from '../../functions/lib/entry/lambda.js';
import {
  errorBody,
  type Invocation,
  type InvocationContext,
  isMainModule,
  type RuntimeApiClient,
  RuntimeApiClient as RuntimeApiClientClass,
  RuntimeApiError,
  runRuntimeLoop,
} from '../../functions/lib/entry/runtime-api.js';
import { createSecretsManagerClient } from '../../functions/lib/entry/secrets-client.js';
import type {
  ClusterRegistry,
  DeployView,
  FetchView,
  InstallView,
  KubeClient,
  WatchView,
} from '../../functions/lib/kube/port.js';
import { KubeApiError, UnknownClusterError } from '../../functions/lib/kube/port.js';
import { StageShares } from '../../functions/lib/lease/shares.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { COMPATIBLE_KAPP_CONTROLLER_VERSION } from '../../functions/lib/packaging/select.js';
import { toolEnv } from '../../functions/lib/pipeline/compose.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import {
  MemoryEventSender,
  SqsEventSender,
  SqsMessageDeleter,
  SqsMessageRequeuer,
} from '../../functions/lib/transport/index.js';

const env = {
  AWS_REGION: 'eu-west-1',
  KAPP_LAMBDA_BUCKET: 'kapp-lambda-artifacts',
  KAPP_LAMBDA_BUCKET_PREFIX: 'fleet/',
  KAPP_LAMBDA_QUEUE_URL_FETCH: 'https://sqs.eu-west-1.amazonaws.com/1/f.fifo',
  KAPP_LAMBDA_QUEUE_URL_TEMPLATE: 'https://sqs.eu-west-1.amazonaws.com/1/t.fifo',
  KAPP_LAMBDA_QUEUE_URL_DEPLOY: 'https://sqs.eu-west-1.amazonaws.com/1/d.fifo',
  KAPP_LAMBDA_QUEUE_URL_INSTALL: 'https://sqs.eu-west-1.amazonaws.com/1/i.fifo',
  KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: 'https://sqs.eu-west-1.amazonaws.com/1/r.fifo',
  KAPP_LAMBDA_KUBECONFIG: '/var/task/kubeconfig.yaml',
  KAPP_LAMBDA_TOOL_VERSIONS: '{"vendir":"0.44.0"}',
};

/** A registry whose views are tagged strings, so tests see which one was handed out. */
function taggedRegistry(): ClusterRegistry {
  const tag = <T>(s: string) => s as unknown as T;
  return {
    clusterIds: () => ['prod-eu-1'],
    client: (id) => tag<KubeClient>(`client:${id}`),
    fetchView: (id) => tag<FetchView>(`fetch:${id}`),
    deployView: (id) => tag<DeployView>(`deploy:${id}`),
    watchView: (id) => tag<WatchView>(`watch:${id}`),
    installView: (id) => tag<InstallView>(`install:${id}`),
  };
}

describe('CONTROLLER_VERSION', () => {
  it('is the release package selection checks against, so templates and Packages see one version', () => {
    expect(CONTROLLER_VERSION).toBe(COMPATIBLE_KAPP_CONTROLLER_VERSION);
  });
});

describe('stageClusterRegistry', () => {
  it.each(['fetch', 'template'] as const)('gives the %s function only the FetchView', (stage) => {
    const r = stageClusterRegistry(taggedRegistry(), stage);
    expect(r.clusterIds()).toEqual(['prod-eu-1']);
    expect(r.fetchView('prod-eu-1')).toBe('fetch:prod-eu-1');
    expect(() => r.deployView('prod-eu-1')).toThrow(`the ${stage} function may not use deploy credentials`);
    expect(() => r.client('prod-eu-1')).toThrow(`the ${stage} function may not use a full cluster client`);
    expect(() => r.watchView('prod-eu-1')).toThrow(`the ${stage} function may not use the watch view`);
    expect(() => r.installView?.('prod-eu-1')).toThrow(`the ${stage} function may not use the install view`);
  });

  it('gives the deploy function the DeployView and the FetchView, nothing more', () => {
    const r = stageClusterRegistry(taggedRegistry(), 'deploy');
    expect(r.deployView('prod-eu-1')).toBe('deploy:prod-eu-1');
    expect(r.fetchView('prod-eu-1')).toBe('fetch:prod-eu-1');
    expect(() => r.client('prod-eu-1')).toThrow('the deploy function may not use a full cluster client');
    expect(() => r.watchView('prod-eu-1')).toThrow('the deploy function may not use the watch view');
    expect(() => r.installView?.('prod-eu-1')).toThrow('the deploy function may not use the install view');
  });

  it('gives the index-repo function the DeployView, the FetchView and the InstallView (placeholder Secret)', () => {
    const r = stageClusterRegistry(taggedRegistry(), 'index-repo');
    expect(r.deployView('prod-eu-1')).toBe('deploy:prod-eu-1');
    expect(r.fetchView('prod-eu-1')).toBe('fetch:prod-eu-1');
    expect(r.installView?.('prod-eu-1')).toBe('install:prod-eu-1');
    expect(() => r.client('prod-eu-1')).toThrow('the index-repo function may not use a full cluster client');
    expect(() => r.watchView('prod-eu-1')).toThrow('the index-repo function may not use the watch view');
  });

  it('gives the install function the InstallView and the FetchView, no deploy credentials', () => {
    const r = stageClusterRegistry(taggedRegistry(), 'install');
    expect(r.installView?.('prod-eu-1')).toBe('install:prod-eu-1');
    expect(r.fetchView('prod-eu-1')).toBe('fetch:prod-eu-1');
    expect(() => r.deployView('prod-eu-1')).toThrow('the install function may not use deploy credentials');
    expect(() => r.client('prod-eu-1')).toThrow('the install function may not use a full cluster client');
    expect(() => r.watchView('prod-eu-1')).toThrow('the install function may not use the watch view');
  });

  it("hands every function the global namespace uid the cluster's document records (the install function's trust check)", () => {
    const r = stageClusterRegistry(
      { ...taggedRegistry(), packagingGlobalNamespaceUid: (id) => `uid:${id}` },
      'install',
    );
    expect(r.packagingGlobalNamespaceUid?.('prod-eu-1')).toBe('uid:prod-eu-1');
    const cell = cellClusterRegistry(
      { ...taggedRegistry(), packagingGlobalNamespaceUid: (id) => `uid:${id}` },
      'prod-eu-1',
    );
    expect(cell.packagingGlobalNamespaceUid?.('prod-eu-1')).toBe('uid:prod-eu-1');
    expect(() => cell.packagingGlobalNamespaceUid?.('edge-1')).toThrow(UnknownClusterError);
  });

  it('offers no install view when the registry has none', () => {
    const { installView: _, ...withoutInstall } = taggedRegistry();
    expect(stageClusterRegistry(withoutInstall, 'install').installView).toBeUndefined();
  });
});

describe('cellClusterRegistry', () => {
  it("serves its one cluster: another id's views throw UnknownClusterError, and preparing it loads nothing", async () => {
    const prepared: string[] = [];
    const base = {
      ...taggedRegistry(),
      clusterIds: () => ['edge-1', 'prod-eu-1'],
      prepare: async (id: string) => void prepared.push(id),
    };
    const r = cellClusterRegistry(base, 'prod-eu-1');
    expect(r.clusterIds()).toEqual(['prod-eu-1']);
    expect(r.fetchView('prod-eu-1')).toBe('fetch:prod-eu-1');
    for (const view of [r.fetchView, r.deployView, r.client, r.watchView, r.installView!]) {
      expect(() => view('edge-1')).toThrow(UnknownClusterError);
    }
    await r.prepare?.('edge-1');
    await r.prepare?.('prod-eu-1');
    expect(prepared).toEqual(['prod-eu-1']);
  });
});

describe('createLambdaDeps', () => {
  it('wires S3, SQS, the narrowed registry and the pipeline configuration', () => {
    const config = parseLambdaEnv('fetch', { ...env, KAPP_LAMBDA_TOOL_TIMEOUT_MS: '60000' });
    const clients = createAwsClients(config);
    const log = memoryLogger();
    const now = () => new Date('2025-01-02T03:04:05.000Z');
    const deps = createLambdaDeps(config, clients, { log, clusters: taggedRegistry(), now });
    expect(deps.log).toBe(log);
    expect(deps.sender).toBeInstanceOf(SqsEventSender);
    // Its own queue's URL given: handled records are deleted early; the stage's records at once.
    expect(deps.deleter).toBeInstanceOf(SqsMessageDeleter);
    // ...and what the function deadline holds back is sent back there.
    expect(deps.requeuer).toBeInstanceOf(SqsMessageRequeuer);
    expect(deps.recordConcurrency).toBe(1);
    const withoutOwnQueue = createLambdaDeps(
      parseLambdaEnv('template', {
        ...env,
        KAPP_LAMBDA_QUEUE_URL_TEMPLATE: undefined,
        KAPP_LAMBDA_RECORD_CONCURRENCY: '2',
      }),
      clients,
      { log, clusters: taggedRegistry() },
    );
    // Shares only with a requeuer to wake parked records by.
    expect(deps.shares).toBeUndefined();
    const requeuer = { requeue: async () => {} };
    const shared = createLambdaDeps(parseLambdaEnv('install', { ...env, KAPP_LAMBDA_CLUSTER_SHARE: '4' }), clients, {
      log,
      clusters: taggedRegistry(),
      requeuer,
    });
    expect(shared.shares).toBeInstanceOf(StageShares);
    expect(shared.shares?.limits).toEqual({ clusterShare: 4, namespaceShare: 2 });
    expect(withoutOwnQueue.deleter).toBeUndefined();
    expect(withoutOwnQueue.requeuer).toBeUndefined();
    expect(withoutOwnQueue.recordConcurrency).toBe(2);
    expect(deps.pipeline.store).toBeInstanceOf(S3Store);
    expect((deps.pipeline.store as S3Store).bucket).toBe('kapp-lambda-artifacts');
    expect((deps.pipeline.store as S3Store).prefix).toBe('fleet/');
    expect(deps.pipeline.now()).toEqual(new Date('2025-01-02T03:04:05.000Z'));
    expect(deps.pipeline.log).toBe(log);
    expect(deps.pipeline.clusters.fetchView('prod-eu-1')).toBe('fetch:prod-eu-1');
    expect(() => deps.pipeline.clusters.deployView('prod-eu-1')).toThrow(
      'the fetch function may not use deploy credentials',
    );
    expect(deps.pipeline.config).toEqual({
      tmpRoot: '/tmp',
      toolVersions: { vendir: '0.44.0' },
      controllerVersion: '0.53.1',
      kappDeployRawOptions: [],
      // kapp-controller's client-side limit (controller-runtime's default) unless configured
      kubeApi: { qps: 20, burst: 30 },
      timer: {},
      toolTimeoutMs: 60_000,
      urlPolicy: { mode: 'enforce', allow: [] },
    });
    clients.s3.destroy();
    clients.sqs.destroy();
  });

  it("in a cell, refuses events naming another cluster and never loads one (the fleet registry's views, the source poll's prepare)", async () => {
    const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = env;
    const root = await mkdtemp(join(tmpdir(), 'kapp-lambda-cell-'));
    const config = parseLambdaEnv('fetch', {
      ...noKube,
      KAPP_LAMBDA_CLUSTER_REGISTRY: pathToFileURL(root).href,
      KAPP_LAMBDA_SENDER_CHECK: 'registry',
      KAPP_LAMBDA_CELL_CLUSTER: 'prod-eu-1',
    });
    const clients = createAwsClients(config);
    const deps = createLambdaDeps(config, clients, { log: memoryLogger() });
    const appIn = (clusterId: string) =>
      objectEvent(
        {
          clusterId,
          kind: 'App',
          apiVersion: 'kappctrl.k14s.io/v1alpha1',
          namespace: 'ns',
          name: 'a',
          uid: 'u',
          generation: 1,
          resourceVersion: '1',
        },
        'modified',
        { time: new Date('2026-12-01T00:00:00Z') },
      );
    try {
      expect(await deps.checkSender?.(appIn('edge-1'), 'AROAEDGEFORWARDER0001:s')).toBe(
        'this function is the cell of cluster prod-eu-1 and serves no other cluster',
      );
      // Its own cluster is looked up in the (empty) registry: not registered.
      expect(await deps.checkSender?.(appIn('prod-eu-1'), 'AROAPRODFORWARDER0001:s')).toBe(
        'cluster prod-eu-1 is not registered',
      );
      await deps.pipeline.clusters.prepare?.('edge-1');
      expect(deps.pipeline.clusters.clusterIds()).toEqual([]);
      expect(() => deps.pipeline.clusters.fetchView('edge-1')).toThrow(UnknownClusterError);
      await expect(deps.pipeline.clusters.prepare?.('prod-eu-1')).rejects.toThrow(UnknownClusterError);
    } finally {
      clients.s3.destroy();
      clients.sqs.destroy();
      await rm(root, { recursive: true, force: true });
    }
  });

  it('only allows the stage tools, resolved in the bin dir', async () => {
    const config = parseLambdaEnv('deploy', { ...env, KAPP_LAMBDA_BIN_DIR: '/nonexistent/bin' });
    const clients = createAwsClients(config);
    const deps = createLambdaDeps(config, clients, { log: memoryLogger(), clusters: taggedRegistry() });
    await expect(deps.pipeline.runner.run({ cmd: 'ytt', args: ['version'] })).rejects.toThrow(/ytt/);
    const r = await deps.pipeline.runner.run({ cmd: 'kapp', args: ['version'] });
    expect(r.exitCode).toBe(-1);
    expect(r.error?.message).toContain('kapp');
    clients.s3.destroy();
    clients.sqs.destroy();
  });

  it('gives the index-repo function its tools and the deploy view, never its own identity for kapp', async () => {
    const config = parseLambdaEnv('index-repo', { ...env, KAPP_LAMBDA_BIN_DIR: '/nonexistent/bin' });
    const clients = createAwsClients(config);
    const deps = createLambdaDeps(config, clients, { log: memoryLogger(), clusters: taggedRegistry() });
    // kapp gets a token of kapp-lambda-pkgr (`packageRepositoryKubeconfig`), not this function's.
    expect(deps.pipeline).not.toHaveProperty('runtimeKubeconfig');
    expect(deps.pipeline.clusters.deployView('prod-eu-1')).toBe('deploy:prod-eu-1');
    for (const tool of ['vendir', 'imgpkg', 'ytt', 'kbld', 'kapp']) {
      // Allowed: it starts (and fails only because the bin dir does not exist).
      const r = await deps.pipeline.runner.run({ cmd: tool, args: ['version'] });
      expect(r.error?.message).toBe(`failed to start ${tool}: ENOENT`);
    }
    for (const tool of ['helm', 'sops', 'cue', 'kustomize']) {
      await expect(deps.pipeline.runner.run({ cmd: tool, args: ['version'] })).rejects.toThrow(tool);
    }
    clients.s3.destroy();
    clients.sqs.destroy();
  });

  it('serves the fleet registry as the function identity, loading the record cluster before the stage', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'entry-lambda-fleet-'));
    try {
      const pem = '-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIU\n-----END CERTIFICATE-----\n';
      await mkdir(join(dir, 'registry', 'clusters'), { recursive: true });
      await mkdir(join(dir, 'tokens'));
      await writeFile(join(dir, 'tokens', 'edge-1-index-repo'), 'the-index-repo-token');
      const doc = {
        apiVersion: 'kapp-lambda/v1',
        kind: 'Cluster',
        id: 'edge-1',
        endpoint: 'https://127.0.0.1:1',
        caData: Buffer.from(pem).toString('base64'),
        auth: { kind: 'token', secrets: { 'index-repo': 'edge-1-index-repo' } },
      };
      await writeFile(join(dir, 'registry', 'clusters', 'edge-1.json'), JSON.stringify(doc));
      const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = env;
      const config = parseLambdaEnv('index-repo', {
        ...noKube,
        KAPP_LAMBDA_CLUSTER_REGISTRY: pathToFileURL(join(dir, 'registry')).href,
        KAPP_LAMBDA_CLUSTER_SECRETS: pathToFileURL(join(dir, 'tokens')).href,
      });
      const clients = createAwsClients(config);
      const deps = createLambdaDeps(config, clients, { log: memoryLogger() });
      const ref = (clusterId: string): ObjectRef => ({
        clusterId,
        kind: 'PackageRepository',
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        namespace: 'ns',
        name: 'repo',
        uid: 'u',
        generation: 1,
        resourceVersion: '1',
      });
      const time = new Date('2026-12-01T00:00:00Z');
      // The handler loads the record's cluster (`prepare`) before the stage runs.
      const run = async (event: KappEvent) => {
        await deps.prepare?.(objectRefOf(event).clusterId);
        return await dispatchEvent(event, deps.pipeline);
      };
      await expect(run(objectEvent(ref('edge-2'), 'added', { time }))).rejects.toThrow(UnknownClusterError);
      // edge-1 is loaded: the stage runs and reaches the (closed) endpoint as the function identity.
      await expect(run(objectEvent(ref('edge-1'), 'added', { time }))).rejects.toThrow(KubeApiError);
      expect(() => deps.pipeline.clusters.client('edge-1')).toThrow(
        'the index-repo function may not use a full cluster client',
      );
      clients.s3.destroy();
      clients.sqs.destroy();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('gives the install function no tool and only its own queue to send to', async () => {
    const config = parseLambdaEnv('install', {
      ...env,
      KAPP_LAMBDA_QUEUE_URL_FETCH: undefined,
      KAPP_LAMBDA_QUEUE_URL_TEMPLATE: undefined,
      KAPP_LAMBDA_QUEUE_URL_DEPLOY: undefined,
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: undefined,
    });
    expect(config.queueUrls).toEqual({ install: env.KAPP_LAMBDA_QUEUE_URL_INSTALL });
    const clients = createAwsClients(config);
    const deps = createLambdaDeps(config, clients, { log: memoryLogger(), clusters: taggedRegistry() });
    expect(deps.pipeline.clusters.installView?.('prod-eu-1')).toBe('install:prod-eu-1');
    for (const tool of ['vendir', 'imgpkg', 'ytt', 'kbld', 'kapp', 'helm']) {
      await expect(deps.pipeline.runner.run({ cmd: tool, args: ['version'] })).rejects.toThrow(tool);
    }
    clients.s3.destroy();
    clients.sqs.destroy();
  });

  it('takes a given sender', () => {
    const config = parseLambdaEnv('template', env);
    const sender = new MemoryEventSender();
    const clients = createAwsClients(config);
    expect(createLambdaDeps(config, clients, { log: memoryLogger(), clusters: taggedRegistry(), sender }).sender).toBe(
      sender,
    );
    clients.s3.destroy();
    clients.sqs.destroy();
  });
});

describe('createAwsClients', () => {
  it('uses the region, and path-style addressing with a custom S3 endpoint', async () => {
    const c = createAwsClients(
      parseLambdaEnv('deploy', {
        ...env,
        KAPP_LAMBDA_S3_ENDPOINT: 'http://127.0.0.1:7070',
        KAPP_LAMBDA_SQS_ENDPOINT: 'http://127.0.0.1:9324',
      }),
    );
    expect(await c.s3.config.region()).toBe('eu-west-1');
    expect(await c.sqs.config.region()).toBe('eu-west-1');
    expect(c.s3.config.forcePathStyle).toBe(true);
    const s3e = await c.s3.config.endpoint?.();
    expect(`${s3e?.protocol}//${s3e?.hostname}:${s3e?.port}`).toBe('http://127.0.0.1:7070');
    const sqse = await c.sqs.config.endpoint?.();
    expect(`${sqse?.protocol}//${sqse?.hostname}:${sqse?.port}`).toBe('http://127.0.0.1:9324');
    c.s3.destroy();
    c.sqs.destroy();
  });

  it('points the Secrets Manager client at KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT when set, else AWS', async () => {
    const custom = createSecretsManagerClient(
      parseLambdaEnv('deploy', { ...env, KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: 'http://127.0.0.1:5000' }),
    );
    expect(await custom.config.region()).toBe('eu-west-1');
    const e = await custom.config.endpoint?.();
    expect(`${e?.protocol}//${e?.hostname}:${e?.port}`).toBe('http://127.0.0.1:5000');
    const aws = createSecretsManagerClient(parseLambdaEnv('deploy', env));
    expect(aws.config.endpoint).toBeUndefined();
    expect(() => parseLambdaEnv('deploy', { ...env, KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: 'not a url' })).toThrow(
      'KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT',
    );
    custom.destroy();
    aws.destroy();
  });

  it('makes a lazy client on its first send only, once for concurrent sends', async () => {
    let made = 0;
    const sent: unknown[] = [];
    const client = lazySendClient(async () => {
      made++;
      return { send: async (command: string, options?: unknown) => sent.push([command, options]) };
    });
    expect(made).toBe(0);
    await Promise.all([client.send('a'), client.send('b', { abortSignal: 'x' })]);
    expect(made).toBe(1);
    expect(sent).toEqual([
      ['a', undefined],
      ['b', { abortSignal: 'x' }],
    ]);
  });

  it('leaves AWS endpoints and virtual-hosted addressing alone by default', () => {
    const c = createAwsClients(parseLambdaEnv('deploy', env));
    expect(c.s3.config.forcePathStyle).toBe(false);
    c.s3.destroy();
    c.sqs.destroy();
  });
});

describe('kubeconfigClusterRegistry', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'entry-kc-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('serves every context of the file, or the listed ones', async () => {
    const path = join(dir, 'kubeconfig');
    const cluster = (name: string) => ({ name, cluster: { server: `https://${name}.example:6443` } });
    const kc = {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [cluster('a'), cluster('b')],
      users: [{ name: 'u', user: { token: 'redacted-token' } }],
      contexts: [
        { name: 'prod-eu-1', context: { cluster: 'a', user: 'u' } },
        { name: 'prod-us-1', context: { cluster: 'b', user: 'u' } },
      ],
      'current-context': 'prod-eu-1',
    };
    await writeFile(path, JSON.stringify(kc));
    expect(kubeconfigClusterRegistry({ stage: 'fetch', kubeconfigPath: path }).clusterIds()).toEqual([
      'prod-eu-1',
      'prod-us-1',
    ]);
    expect(
      kubeconfigClusterRegistry({ stage: 'fetch', kubeconfigPath: path, clusterContexts: ['prod-us-1'] }).clusterIds(),
    ).toEqual(['prod-us-1']);
    expect(() =>
      kubeconfigClusterRegistry({ stage: 'fetch', kubeconfigPath: path, clusterContexts: ['nope'] }),
    ).toThrow(`loading kubeconfig ${path}: no context "nope"`);
  });

  it('refuses at start, as a configuration error, a context the plain transports cannot serve', async () => {
    const path = join(dir, 'proxied');
    await writeFile(
      path,
      JSON.stringify({
        clusters: [
          { name: 'a', cluster: { server: 'https://a.example:6443', 'proxy-url': 'socks5://secret-proxy:1080' } },
        ],
        users: [{ name: 'u', user: { token: 'redacted-token' } }],
        contexts: [{ name: 'edge', context: { cluster: 'a', user: 'u' } }],
      }),
    );
    const refused = (() => {
      try {
        kubeconfigClusterRegistry({ stage: 'deploy', kubeconfigPath: path });
      } catch (e) {
        return e;
      }
    })();
    expect(refused).toBeInstanceOf(ConfigError);
    expect((refused as Error).message).toBe(
      'invalid configuration of the deploy function: KAPP_LAMBDA_KUBECONFIG: context "edge" uses cluster proxy-url other than an http:// proxy to an https server, which the functions do not support',
    );
  });

  it('names the path, never the contents, when the file is missing', () => {
    expect(() => kubeconfigClusterRegistry({ stage: 'fetch', kubeconfigPath: join(dir, 'missing') })).toThrow(
      `loading kubeconfig ${join(dir, 'missing')}`,
    );
  });
});

describe('Runtime API pieces', () => {
  it('isMainModule compares the real path of argv[1] with the module URL', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'entry-main-'));
    const file = join(dir, 'fetch.mjs');
    await writeFile(file, '');
    await symlink(file, join(dir, 'link.mjs'));
    const url = pathToFileURL(file).href;
    expect(isMainModule(url, file)).toBe(true);
    expect(isMainModule(url, join(dir, 'link.mjs'))).toBe(true);
    expect(isMainModule(url, '/var/runtime/index.mjs')).toBe(false);
    expect(isMainModule(url, undefined)).toBe(false);
    await rm(dir, { recursive: true, force: true });
  });

  it('errorBody gives type and message, nothing else', () => {
    const e = new RangeError('too big');
    expect(errorBody(e)).toEqual({ errorType: 'RangeError', errorMessage: 'too big' });
    expect(errorBody('plain')).toEqual({ errorType: 'Error', errorMessage: 'plain' });
    expect(errorBody({ token: 'x' })).toEqual({ errorType: 'Error', errorMessage: 'non-Error thrown' });
  });

  it.each(['127.0.0.1:9001', 'localhost:8080', '[::1]:9001'])('accepts endpoint %s', (ep) => {
    expect(() => new RuntimeApiClientClass(ep).close()).not.toThrow();
  });

  it.each(['', '127.0.0.1', 'http://127.0.0.1:9001', '127.0.0.1:9001/x'])('rejects endpoint %j', (ep) => {
    expect(() => new RuntimeApiClientClass(ep)).toThrow(
      new RuntimeApiError(`invalid Runtime API endpoint ${JSON.stringify(ep)}`),
    );
  });
});

describe('runRuntimeLoop', () => {
  /** A fake of the API client at its port: hands out invocations, records answers. */
  function fakeApi(invocations: Invocation[]) {
    const calls: string[] = [];
    const api = {
      async next(): Promise<Invocation> {
        const inv = invocations.shift();
        calls.push(inv ? `next ${inv.requestId}` : 'next (api gone)');
        if (!inv) throw new RuntimeApiError('failed to get the next invocation: status 500');
        return inv;
      },
      async respond(id: string, result: unknown) {
        calls.push(`respond ${id} ${JSON.stringify(result)}`);
      },
      async error(id: string, err: unknown) {
        calls.push(`error ${id} ${JSON.stringify(errorBody(err))}`);
      },
    };
    return { api: api as unknown as RuntimeApiClient, calls };
  }
  const inv = (requestId: string, event: unknown): Invocation => ({
    requestId,
    deadlineMs: 10_000,
    invokedFunctionArn: 'arn:aws:lambda:eu-west-1:1:function:fetch',
    traceId: '',
    event,
  });

  it('answers each invocation with the result or the error, in order, until the API fails', async () => {
    const { api, calls } = fakeApi([inv('r1', { n: 1 }), inv('r2', { n: 2 }), inv('r3', { n: 3 })]);
    const contexts: InvocationContext[] = [];
    const handler = async (event: { n: number }, ctx: InvocationContext) => {
      contexts.push(ctx);
      if (event.n === 2) throw new TypeError('bad n');
      if (event.n === 3) return { big: 'x'.repeat(6 * 1024 * 1024) };
      return { batchItemFailures: [] };
    };
    const err = await runRuntimeLoop(api, handler, { now: () => 4_000 }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(RuntimeApiError);
    expect(calls).toEqual([
      'next r1',
      'respond r1 {"batchItemFailures":[]}',
      'next r2',
      'error r2 {"errorType":"TypeError","errorMessage":"bad n"}',
      'next r3',
      `error r3 {"errorType":"RangeError","errorMessage":"response is ${6 * 1024 * 1024 + 10} bytes, over 6291456"}`,
      'next (api gone)',
    ]);
    expect(contexts.map((c) => [c.awsRequestId, c.invokedFunctionArn, c.getRemainingTimeInMillis()])).toEqual([
      ['r1', 'arn:aws:lambda:eu-west-1:1:function:fetch', 6000],
      ['r2', 'arn:aws:lambda:eu-west-1:1:function:fetch', 6000],
      ['r3', 'arn:aws:lambda:eu-west-1:1:function:fetch', 6000],
    ]);
  });

  it('stops after the current invocation when aborted', async () => {
    const { api, calls } = fakeApi([inv('r1', {}), inv('r2', {})]);
    const ac = new AbortController();
    await runRuntimeLoop(
      api,
      async () => {
        ac.abort();
        return null;
      },
      { signal: ac.signal },
    );
    expect(calls).toEqual(['next r1', 'respond r1 null']);
  });
});

describe('toolEnv', () => {
  const tools = (allow: readonly string[]) => ({ allow, resolveBin: (n: string) => `/opt/bin/${n}`, tmpDir: '/tmp' });
  it('points vendir at the layer helm for the fetch function', () => {
    expect(toolEnv('fetch', tools(['vendir', 'imgpkg', 'helm']))).toEqual({
      PATH: '/opt/bin:/usr/local/bin:/usr/bin:/bin',
      HOME: '/tmp',
      TMPDIR: '/tmp',
      GIT_CEILING_DIRECTORIES: '/tmp',
      VENDIR_HELM_BINARY: '/opt/bin/helm',
    });
  });
  it('is the minimal environment for the other functions', () => {
    expect(toolEnv('deploy', tools(['kapp']))).toEqual({
      PATH: '/opt/bin:/usr/local/bin:/usr/bin:/bin',
      HOME: '/tmp',
      TMPDIR: '/tmp',
      GIT_CEILING_DIRECTORIES: '/tmp',
    });
  });
});
