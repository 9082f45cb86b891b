/**
 * The stage function behind its dispatcher (`KAPP_LAMBDA_DISPATCHED=true`, docs/decisions.md
 * D15): the configuration refuses the root key's variable; the composition root builds no record
 * proof, sender check, fair share nor early delete, narrows the registry to the cluster of the
 * first accepted batch, seals with the batch's keys and signs every AWS client (S3, SQS, Secrets
 * Manager, the registry's) with the batch's credentials; the handler runs a batch with `poll` set
 * as the stage's source poll in the batch's cluster, refuses a raw SQS or bare poll event
 * (logged), and returns the records the deadline held back as `requeue` instead of sending
 * them. The stage and the AWS services are fakes at their ports.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { objectRefOf, parseEvent, SOURCE_POLL_EVENT_TYPE } from '../../events/schema.js';
import { ConfigError, parseLambdaEnv } from '../../functions/lib/entry/config.js';
import type { DispatchedBatch } from '../../functions/lib/entry/dispatch.js';
import { CollectingRequeuer, dispatchedHandler, RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import { type EntryDeps, makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { createLambdaDeps, lazyAwsClients, tenantClusterRegistry } from '../../functions/lib/entry/lambda.js';
import { createSecretsManagerClient } from '../../functions/lib/entry/secrets-client.js';
import { makeStageHandler } from '../../functions/lib/entry/stage-handler.js';
import type { ClusterRegistry, FetchView } from '../../functions/lib/kube/port.js';
import { UnknownClusterError } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { clusterTemplateRecord } from './support/cluster-records.js';
import { batchOf, DISPATCHED_ENV } from './support/dispatched-batch.js';

const env = DISPATCHED_ENV;

/** App `name` of cluster `clusterId`: message id `<name><n>`. */
const rec = (clusterId: string, name: string, n = 1) => clusterTemplateRecord(clusterId, name, n);

afterEach(() => {
  vi.useRealTimers();
});

describe('KAPP_LAMBDA_DISPATCHED', () => {
  it('sets the dispatched mode; unset or false leaves the queue mode', () => {
    expect(parseLambdaEnv('template', env).dispatched).toBe(true);
    expect(parseLambdaEnv('template', { ...env, KAPP_LAMBDA_DISPATCHED: 'false' }).dispatched).toBeUndefined();
    expect(parseLambdaEnv('template', { ...env, KAPP_LAMBDA_DISPATCHED: '' }).dispatched).toBeUndefined();
    expect(() => parseLambdaEnv('template', { ...env, KAPP_LAMBDA_DISPATCHED: 'yes' })).toThrow(
      'KAPP_LAMBDA_DISPATCHED',
    );
  });

  it("refuses at start to be told where the root key is (or the key): the run gets only its cluster's keys", () => {
    for (const name of ['KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET', 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY']) {
      const bad = () => parseLambdaEnv('template', { ...env, [name]: 'arn:aws:secretsmanager:eu-west-1:1:secret:k' });
      expect(bad).toThrow(ConfigError);
      expect(bad).toThrow(`${name}: must be unset with KAPP_LAMBDA_DISPATCHED=true (the dispatcher derives the keys)`);
      // Not a problem of the queue mode (the entry reads the secret there).
      expect(() =>
        parseLambdaEnv('template', { ...env, KAPP_LAMBDA_DISPATCHED: undefined, [name]: 'x' }),
      ).not.toThrow();
    }
  });
});

describe('createLambdaDeps in the dispatched mode', () => {
  /** A registry whose fetch view is the tagged string `fetch:<id>`. */
  const tagged = (prepared: string[] = []): ClusterRegistry => ({
    clusterIds: () => ['alpha', 'beta'],
    client: () => ({}) as never,
    fetchView: (id) => `fetch:${id}` as unknown as FetchView,
    deployView: () => ({}) as never,
    watchView: () => ({}) as never,
    prepare: async (id) => void prepared.push(id),
  });

  it('builds no proof, sender check, share nor early delete, and its requeuer is the collecting one', async () => {
    const root = await mkdtemp(join(tmpdir(), 'kapp-lambda-dispatched-'));
    try {
      const { KAPP_LAMBDA_KUBECONFIG: _, ...rest } = env;
      // Settings a queue-mode function would act on: the dispatcher does these now.
      const config = parseLambdaEnv('template', {
        ...rest,
        KAPP_LAMBDA_CLUSTER_REGISTRY: pathToFileURL(root).href,
        KAPP_LAMBDA_SENDER_CHECK: 'registry',
        KAPP_LAMBDA_CLUSTER_SHARE: '4',
      });
      const holder = new RunCredentialHolder();
      const requeued = new CollectingRequeuer();
      const deps = createLambdaDeps(config, lazyAwsClients(config, holder.credentials), {
        log: memoryLogger(),
        keyring: holder.keyring,
        requeuer: requeued,
        tenant: holder,
      });
      expect(deps.prover).toBeUndefined();
      expect(deps.checkSender).toBeUndefined();
      expect(deps.shares).toBeUndefined();
      expect(deps.deleter).toBeUndefined();
      expect(deps.requeuer).toBe(requeued);
      expect(deps.pipeline.keyring).toBe(holder.keyring);
      // The same configuration in the queue mode has them all.
      const queued = createLambdaDeps({ ...config, dispatched: undefined }, lazyAwsClients(config), {
        log: memoryLogger(),
      });
      expect([queued.prover, queued.checkSender, queued.shares, queued.deleter].every(Boolean)).toBe(true);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  it('refuses to build without the holder (it would serve every cluster)', () => {
    const config = parseLambdaEnv('template', env);
    expect(() => createLambdaDeps(config, lazyAwsClients(config), { log: memoryLogger(), clusters: tagged() })).toThrow(
      'the dispatched mode needs the run credential holder',
    );
  });

  it("serves only the first batch's cluster: none before it, UnknownClusterError for any other id after it", async () => {
    const holder = new RunCredentialHolder();
    const prepared: string[] = [];
    const config = parseLambdaEnv('template', env);
    const deps = createLambdaDeps(config, lazyAwsClients(config, holder.credentials), {
      log: memoryLogger(),
      clusters: tagged(prepared),
      tenant: holder,
      keyring: holder.keyring,
    });
    const clusters = deps.pipeline.clusters;
    expect(clusters.clusterIds()).toEqual([]);
    expect(() => clusters.fetchView('alpha')).toThrow(UnknownClusterError);
    holder.accept(await batchOf('alpha', 'a1', [rec('alpha', 'x')]));
    expect(clusters.clusterIds()).toEqual(['alpha']);
    expect(clusters.fetchView('alpha')).toBe('fetch:alpha');
    expect(() => clusters.fetchView('beta')).toThrow(UnknownClusterError);
    await deps.prepare?.('beta');
    await deps.prepare?.('alpha');
    expect(prepared).toEqual(['alpha']);
    // The one registry function as a cell's, with the id read late.
    expect(() => tenantClusterRegistry(tagged(), { clusterId: undefined }).fetchView('alpha')).toThrow(
      UnknownClusterError,
    );
  });

  it("reads a denied key its session may read as absent (S3's answer for a missing key it may not list), only once a batch named the cluster", async () => {
    const holder = new RunCredentialHolder();
    const config = parseLambdaEnv('template', env);
    const denied = Object.assign(new Error('Access Denied'), {
      name: 'AccessDenied',
      $metadata: { httpStatusCode: 403 },
    });
    const s3 = {
      async send() {
        throw denied;
      },
    };
    const deps = createLambdaDeps(
      config,
      { ...lazyAwsClients(config, holder.credentials), s3 },
      { log: memoryLogger(), clusters: tagged(), tenant: holder, keyring: holder.keyring },
    );
    const blob = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
    // Before a batch there is no session whose grants say what a denial means.
    await expect(deps.pipeline.store.head(blob)).rejects.toThrow(`failed to head object "${blob}"`);
    const batch = await batchOf('alpha', 'a1', [rec('alpha', 'x')]);
    holder.accept(batch);
    expect(await deps.pipeline.store.head(blob)).toBeUndefined();
    expect(await deps.pipeline.store.get(blob)).toBeUndefined();
    // A key outside the session's grants (another cluster's sealed keys, the dispatcher's shares) stays an error.
    for (const key of [`private/${'f'.repeat(32)}/x`, 'state/shares/template/alpha.json']) {
      await expect(deps.pipeline.store.head(key)).rejects.toThrow(`failed to head object "${key}"`);
    }
  });

  it("signs S3, SQS and Secrets Manager with each batch's credentials, never the SDK's default chain", async () => {
    const holder = new RunCredentialHolder();
    const config = parseLambdaEnv('template', env);
    const clients = lazyAwsClients(config, holder.credentials);
    expect(clients.credentials).toBe(holder.credentials);
    const secrets = createSecretsManagerClient(config, holder.credentials);
    try {
      await expect(secrets.config.credentials()).rejects.toThrow('no run credentials');
      holder.accept(await batchOf('alpha', 'a1', [rec('alpha', 'x')]));
      expect((await secrets.config.credentials()).accessKeyId).toBe('AKIA-a1');
      holder.accept(await batchOf('alpha', 'a2', [rec('alpha', 'x')]));
      expect((await secrets.config.credentials()).sessionToken).toBe('token-a2');
    } finally {
      secrets.destroy();
    }
  });
});

describe('dispatchedHandler', () => {
  /** A handler over a stage that runs `inner`; `seen` lists the record ids each call was given. */
  function setup(inner: (ids: string[]) => Promise<{ batchItemFailures: { itemIdentifier: string }[] }>) {
    const holder = new RunCredentialHolder();
    const requeued = new CollectingRequeuer();
    const log = memoryLogger();
    const seen: string[][] = [];
    const handler = dispatchedHandler(
      async (event) => {
        const ids = 'Records' in event ? event.Records.map((r) => r.messageId) : [];
        seen.push(ids);
        return await inner(ids);
      },
      holder,
      { requeued, log },
    );
    return { handler, holder, requeued, log, seen };
  }

  it('refuses a raw SQS event and a bare source poll event before reading them, and logs why', async () => {
    const { handler, holder, log, seen } = setup(async () => ({ batchItemFailures: [] }));
    await expect(handler({ Records: [rec('alpha', 'x')] })).rejects.toThrow(
      "refused a raw SQS event: a dispatched function runs only its dispatcher's batches",
    );
    await expect(handler({ type: SOURCE_POLL_EVENT_TYPE })).rejects.toThrow(
      "refused a source poll event: a dispatched function runs only its dispatcher's batches (the schedule must target the dispatcher)",
    );
    expect(seen).toEqual([]);
    expect(holder.clusterId).toBeUndefined();
    expect(log.records.map((r) => [r.level, r.obj.outcome, r.msg?.split(':')[0]])).toEqual([
      ['error', 'refused', 'refused a raw SQS event'],
      ['error', 'refused', 'refused a source poll event'],
    ]);
  });

  it("runs a poll batch as the stage handler's source poll, in the batch's cluster, with no records", async () => {
    const { handler, holder, seen } = setup(async () => ({ batchItemFailures: [] }));
    const polls: unknown[] = [];
    const pollHandler = dispatchedHandler(async (event) => {
      polls.push(event);
      return { batchItemFailures: [] };
    }, holder);
    expect(await pollHandler({ ...(await batchOf('alpha', 'a1', [])), poll: true })).toEqual({ batchItemFailures: [] });
    expect(polls).toEqual([{ type: SOURCE_POLL_EVENT_TYPE }]);
    expect(holder.clusterId).toBe('alpha');
    // A poll carries no records, `poll` is `true` or absent, and another cluster's poll is refused.
    await expect(handler({ ...(await batchOf('alpha', 'a1', [rec('alpha', 'x')])), poll: true })).rejects.toThrow(
      'refused a dispatched batch: a source poll carries no records',
    );
    await expect(
      handler({ ...(await batchOf('alpha', 'a1', [])), poll: 'yes' } as unknown as DispatchedBatch),
    ).rejects.toThrow('refused a dispatched batch: `poll` is neither true nor absent');
    await expect(pollHandler({ ...(await batchOf('beta', 'b1', [])), poll: true })).rejects.toThrow(
      'this environment serves alpha',
    );
    expect(seen).toEqual([]);
    expect(polls).toHaveLength(1);
  });

  it("over the index-repo stage handler: the poll runs with the registry narrowed to the batch's cluster", async () => {
    const holder = new RunCredentialHolder();
    const config = parseLambdaEnv('index-repo', {
      ...env,
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: 'https://sqs.eu-west-1.amazonaws.com/1/i.fifo',
      KAPP_LAMBDA_QUEUE_URL_INSTALL: 'https://sqs.eu-west-1.amazonaws.com/1/n.fifo',
      KAPP_LAMBDA_TOOL_VERSIONS: '{"vendir":"0.44.0"}',
    });
    const served: string[][] = [];
    const handler = dispatchedHandler(
      makeStageHandler(
        'index-repo',
        () =>
          createLambdaDeps(config, lazyAwsClients(config, holder.credentials), {
            log: memoryLogger(),
            clusters: {
              clusterIds: () => ['alpha', 'beta'],
              client: () => ({}) as never,
              fetchView: () => ({}) as never,
              deployView: () => ({}) as never,
              watchView: () => ({}) as never,
            },
            tenant: holder,
            keyring: holder.keyring,
            requeuer: new CollectingRequeuer(),
          }),
        async () => ({
          dispatch: async () => undefined,
          pollSources: async (deps) => {
            served.push(deps.clusters.clusterIds());
            await expect(deps.keyring?.keysFor('alpha')).rejects.toThrow('no sealing keys for cluster alpha');
            return { sources: 0, polled: 0, changed: 0, poked: 0, failed: 0, memberFailures: 0, paused: 0 };
          },
        }),
      ),
      holder,
    );
    expect(await handler({ ...(await batchOf('beta', 'b1', [])), poll: true })).toEqual({ batchItemFailures: [] });
    expect(served).toEqual([['beta']]);
  });

  it("logs a batch of another cluster than the environment's first as refused", async () => {
    const { handler, log, seen } = setup(async () => ({ batchItemFailures: [] }));
    await handler(await batchOf('alpha', 'a1', [rec('alpha', 'x')]));
    await expect(handler(await batchOf('beta', 'b1', [rec('beta', 'y')]))).rejects.toThrow(
      'refused a dispatched batch: it is for cluster beta, this environment serves alpha',
    );
    expect(seen).toEqual([['x1']]);
    expect(log.records.at(-1)?.msg).toBe(
      'refused a dispatched batch: it is for cluster beta, this environment serves alpha',
    );
  });

  it('returns the requeued ids in order as `requeue`, never one also failed nor one of an earlier invocation', async () => {
    const { handler, requeued } = setup(async (ids) => {
      await requeued.requeue(ids.map((messageId) => ({ messageId, body: '', messageGroupId: 'g', postponements: 1 })));
      return { batchItemFailures: [{ itemIdentifier: 'b1' }] };
    });
    // Left by an invocation that threw before its answer.
    await requeued.requeue([{ messageId: 'stale', body: '', messageGroupId: 'g', postponements: 1 }]);
    expect(
      await handler(await batchOf('alpha', 'a1', [rec('alpha', 'c'), rec('alpha', 'b'), rec('alpha', 'a')])),
    ).toEqual({ batchItemFailures: [{ itemIdentifier: 'b1' }], requeue: ['c1', 'a1'] });
    // Nothing requeued: no field.
    const quiet = setup(async () => ({ batchItemFailures: [] }));
    expect(await quiet.handler(await batchOf('alpha', 'a1', [rec('alpha', 'x')]))).toEqual({ batchItemFailures: [] });
  });

  it('over the stage handler: records the deadline held back come back as `requeue`, not sent and not failed', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const holder = new RunCredentialHolder();
    const requeued = new CollectingRequeuer();
    const ran: string[] = [];
    const deps: EntryDeps = {
      pipeline: {} as DispatchDeps,
      sender: new MemoryEventSender(),
      log: memoryLogger(),
      requeuer: requeued,
      dispatch: async (event) => {
        const { name } = objectRefOf(event);
        ran.push(name);
        // The first record takes more than half of the invocation's 10 minutes: nothing after it starts.
        if (name === 'a') vi.setSystemTime(Date.now() + 5 * 60_000 + 1);
        return undefined;
      },
    };
    const handler = dispatchedHandler(
      makeSqsHandler('template', () => deps),
      holder,
      { requeued },
    );
    const records = [rec('alpha', 'a'), rec('alpha', 'b'), rec('alpha', 'c')];
    expect(records.every((r) => parseEvent(r.body).ok)).toBe(true);
    expect(await handler(await batchOf('alpha', 'a1', records), { getRemainingTimeInMillis: () => 600_000 })).toEqual({
      batchItemFailures: [],
      requeue: ['b1', 'c1'],
    });
    expect(ran).toEqual(['a']);
  });
});
