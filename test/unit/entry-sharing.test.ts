/**
 * The sharing domain of a stage function (`KAPP_LAMBDA_SHARING`, docs/decisions.md D17): the
 * setting (default `fleet`; `cluster` refused outside the dispatched mode) and the composition
 * root's store, which in `cluster` reaches the claims under `d/<holder's keyring tag>/` and the
 * shared artifacts unchanged. S3 is a fake at the SDK client's `send`.
 */
import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  parseDispatcherEnv,
  parseLambdaEnv,
  SHARING_NEEDS_DISPATCHED,
} from '../../functions/lib/entry/config.js';
import type { AssumeRoleInput } from '../../functions/lib/entry/dispatch-aws.js';
import { createDispatcherDeps } from '../../functions/lib/entry/dispatch-entry.js';
import { RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import { type AwsClients, createLambdaDeps, sharingStore } from '../../functions/lib/entry/lambda.js';
import type { ClusterRegistry } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { MemoryStore } from '../../functions/lib/store/index.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import { runSessionPolicy } from '../../infra/aws/run-policy.js';
import { batchOf, DISPATCH_KEYRING, DISPATCHED_ENV } from './support/dispatched-batch.js';

const env = DISPATCHED_ENV;
const keyring = DISPATCH_KEYRING;

/** A holder that accepted a batch of `clusterId`, with that cluster's keys unless `keys` is false. */
async function holderOf(clusterId: string, keys = true): Promise<RunCredentialHolder> {
  const holder = new RunCredentialHolder();
  holder.accept(await batchOf(clusterId, 'a', [], keys));
  return holder;
}

describe('KAPP_LAMBDA_SHARING', () => {
  it('is fleet unless set to cluster', () => {
    expect(parseLambdaEnv('template', env).sharing).toBeUndefined();
    expect(parseLambdaEnv('template', { ...env, KAPP_LAMBDA_SHARING: 'fleet' }).sharing).toBeUndefined();
    expect(parseLambdaEnv('template', { ...env, KAPP_LAMBDA_SHARING: '' }).sharing).toBeUndefined();
    expect(parseLambdaEnv('template', { ...env, KAPP_LAMBDA_SHARING: 'cluster' }).sharing).toBe('cluster');
    expect(() => parseLambdaEnv('template', { ...env, KAPP_LAMBDA_SHARING: 'group' })).toThrow('KAPP_LAMBDA_SHARING');
  });

  it('refuses cluster outside the dispatched mode, where no session fences the domain', () => {
    for (const dispatched of [undefined, 'false']) {
      const bad = () =>
        parseLambdaEnv('template', { ...env, KAPP_LAMBDA_DISPATCHED: dispatched, KAPP_LAMBDA_SHARING: 'cluster' });
      expect(bad).toThrow(ConfigError);
      expect(bad).toThrow(SHARING_NEEDS_DISPATCHED);
    }
  });
});

describe('sharingStore', () => {
  it("keeps claims under d/<the holder's keyring tag>/ and shared keys where they are", async () => {
    const raw = new MemoryStore();
    const holder = await holderOf('alpha');
    const tag = (await keyring.keysFor('alpha')).tag;
    const store = sharingStore({ stage: 'template', sharing: 'cluster', dispatched: true }, raw, holder);
    await store.put('cache/render/sha256/1.json', '{}');
    await store.put('artifacts/template/sha256/2.yaml', 'x');
    expect(await raw.list('')).toEqual(['artifacts/template/sha256/2.yaml', `d/${tag}/cache/render/sha256/1.json`]);
  });

  it('is the store itself in fleet sharing', () => {
    const raw = new MemoryStore();
    expect(sharingStore({ stage: 'template', dispatched: true }, raw, undefined)).toBe(raw);
    expect(sharingStore({ stage: 'template' }, raw, undefined)).toBe(raw);
  });

  it('refuses cluster sharing without the dispatched mode or the holder', () => {
    const raw = new MemoryStore();
    const holder = new RunCredentialHolder();
    expect(() => sharingStore({ stage: 'fetch', sharing: 'cluster' }, raw, holder)).toThrow(SHARING_NEEDS_DISPATCHED);
    expect(() => sharingStore({ stage: 'fetch', sharing: 'cluster', dispatched: true }, raw, undefined)).toThrow(
      ConfigError,
    );
  });

  it('rejects an operation on a claim while the holder has no keys, and serves shared keys', async () => {
    const raw = new MemoryStore();
    const none = new RunCredentialHolder();
    const store = sharingStore({ stage: 'fetch', sharing: 'cluster', dispatched: true }, raw, none);
    await expect(store.get('inflight/cache/fetch/sha256/1.json')).rejects.toThrow('no sharing domain');
    const keyless = sharingStore(
      { stage: 'install', sharing: 'cluster', dispatched: true },
      raw,
      await holderOf('b', false),
    );
    await expect(keyless.list('cache/source-poll/')).rejects.toThrow('no sharing domain');
    expect(await keyless.get('artifacts/fetch/sha256/1.tgz')).toBeUndefined();
  });
});

describe('createLambdaDeps with cluster sharing', () => {
  it('hands the pipeline a store whose claims reach S3 under d/<tag>/ and whose blobs do not', async () => {
    const keys: string[] = [];
    const clients: AwsClients = {
      s3: {
        send: async (command: { input: { Key?: string } }) => {
          keys.push(command.input.Key ?? '');
          const notFound = Object.assign(new Error('NoSuchKey'), {
            name: 'NoSuchKey',
            $metadata: { httpStatusCode: 404 },
          });
          throw notFound;
        },
      } as unknown as AwsClients['s3'],
      sqs: { send: async () => ({}) } as unknown as AwsClients['sqs'],
    };
    const config = parseLambdaEnv('template', { ...env, KAPP_LAMBDA_SHARING: 'cluster' });
    const holder = await holderOf('alpha');
    const tag = (await keyring.keysFor('alpha')).tag;
    const deps = createLambdaDeps(config, clients, {
      log: memoryLogger(),
      clusters: { clusterIds: () => ['alpha'] } as unknown as ClusterRegistry,
      sender: new MemoryEventSender(),
      tenant: holder,
      keyring: holder.keyring,
    });
    expect(await deps.pipeline.store.get('cache/render/sha256/1.json')).toBeUndefined();
    expect(await deps.pipeline.store.get('artifacts/index/sha256/2.json')).toBeUndefined();
    expect(await deps.pipeline.store.get('artifacts/template/sha256/3.yaml')).toBeUndefined();
    expect(keys).toEqual([
      `d/${tag}/cache/render/sha256/1.json`,
      `d/${tag}/artifacts/index/sha256/2.json`,
      'artifacts/template/sha256/3.yaml',
    ]);
  });
});

describe('the dispatcher in cluster sharing', () => {
  const DISPATCHER_ENV = {
    AWS_REGION: 'eu-west-1',
    KAPP_LAMBDA_BUCKET: 'fleet-artifacts',
    KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/registry/',
    KAPP_LAMBDA_DISPATCH_STAGE: 'template',
    KAPP_LAMBDA_RUN_ROLE_ARN: 'arn:aws:iam::123456789012:role/kapp/run-template',
    KAPP_LAMBDA_STAGE_FUNCTION: 'kapp-lambda-template',
    KAPP_LAMBDA_QUEUE_URL_TEMPLATE: 'https://sqs.eu-west-1.amazonaws.com/123456789012/template.fifo',
  };

  it('reads KAPP_LAMBDA_SHARING (fleet unless cluster)', () => {
    expect(parseDispatcherEnv(DISPATCHER_ENV).sharing).toBe('fleet');
    expect(parseDispatcherEnv({ ...DISPATCHER_ENV, KAPP_LAMBDA_SHARING: 'cluster' }).sharing).toBe('cluster');
    expect(() => parseDispatcherEnv({ ...DISPATCHER_ENV, KAPP_LAMBDA_SHARING: 'all' })).toThrow('KAPP_LAMBDA_SHARING');
  });

  it("assumes each run's session under the policy of its cluster's domain", async () => {
    for (const sharing of [undefined, 'cluster'] as const) {
      const assumed: AssumeRoleInput[] = [];
      const config = parseDispatcherEnv({ ...DISPATCHER_ENV, KAPP_LAMBDA_SHARING: sharing });
      const deps = createDispatcherDeps(config, { s3: {}, sqs: {} } as unknown as AwsClients, keyring, {
        log: memoryLogger(),
        sdk: {
          async assumeRole(input) {
            assumed.push(input);
            const Expiration = new Date(2_000_000_000_000);
            return { Credentials: { AccessKeyId: 'AKIA', SecretAccessKey: 's', SessionToken: 't', Expiration } };
          },
          invoke: async () => ({ StatusCode: 200 }),
        },
      });
      const { tag } = await keyring.keysFor('alpha');
      await deps.credentials.forRun('template', 'alpha', tag);
      const target = {
        partition: 'aws',
        region: 'eu-west-1',
        account: '123456789012',
        bucket: 'fleet-artifacts',
        registry: { bucket: 'fleet-registry', prefix: 'registry/' },
        ...(sharing ? { sharing } : {}),
      };
      expect(assumed.map((a) => a.Policy)).toEqual([
        JSON.stringify(runSessionPolicy('template', 'alpha', tag, target)),
      ]);
      expect(assumed[0]?.Policy?.includes(`fleet-artifacts/d/${tag}/*`)).toBe(sharing === 'cluster');
      expect(assumed[0]?.Policy?.includes('fleet-artifacts/cache/*')).toBe(sharing === undefined);
    }
  });
});
