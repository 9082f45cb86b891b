/**
 * Issue 27's done-when for item 2: an invocation for cluster A is refused when it reaches for
 * cluster B's credentials or artifacts (docs/decisions.md D15). The real path: the dispatcher's
 * `StsRunCredentials` assumes the fetch stage's run role through the real STS client, the stage's
 * `RunCredentialHolder` takes the session from a dispatched batch, and the dispatched composition
 * (`createLambdaDeps` with `KAPP_LAMBDA_DISPATCHED=true`) reads and writes with it: its S3 store,
 * its fleet registry (documents in S3, tokens in Secrets Manager), all signed with the session.
 * Cluster A's sealed artifact, registry document, token, lease and receipt are reachable; cluster
 * B's (`private/<tagB>/…`, `clusters/b.json`, `kapp-lambda/b/fetch-??????`, `state/leases/b/…`,
 * `receipts/b/…`) are AccessDenied, and so is A's token of another stage; a batch of B handed to
 * the environment that served A is refused before anything of it is used. In cluster sharing
 * (docs/decisions.md D17) A's claims are under `d/<tagA>/…`, reachable; B's domain and the
 * fleet's claims (`cache/…`, `inflight/…`) are AccessDenied. An install run's session of A (issue
 * 28) reaches A's fleet index entries (`state/fleet/a/…`: read, write, delete) and receipts (read);
 * B's, and the fleet's rollout records and policies (the install dispatcher's), are AccessDenied.
 *
 * What the emulator can and cannot show (moto 5.2.1, a server of this file's own with IAM
 * enforced after the setup, `../harness/servers/moto-iam.ts`):
 * - moto evaluates only an assumed role's own policies, never the session policy `AssumeRole`
 *   carries. So, as D15 says, the run role here is an emulator-only stand-in whose own policy IS
 *   `runSessionPolicy('fetch', 'a', tagA, target)`: what is shown is that this document, the one
 *   the dispatcher sends, fences B off; not that AWS intersects it with the run role's.
 * - moto's resource matcher reads IAM's `?` as a regex quantifier (`-??????` does not compile)
 *   and checks Secrets Manager against `*` instead of the secret's ARN; the server's wrapper
 *   (`moto_iam.py`) matches as IAM does and passes the secret's ARN, the production policy is
 *   unchanged. The `??????` suffix is thereby evaluated: A's token (whose ARN ends in 6 random
 *   characters) is read, B's is refused.
 * - `s3:ListBucket`'s `s3:prefix` condition cannot be shown: moto checks a condition only against
 *   values it is handed, and it hands none for a caller's own policies, so the statement refuses
 *   every listing, A's prefixes included. Listings are not asserted here.
 */
import { randomBytes } from 'node:crypto';
import {
  CreateAccessKeyCommand,
  CreateRoleCommand,
  CreateUserCommand,
  IAMClient,
  PutRolePolicyCommand,
  PutUserPolicyCommand,
} from '@aws-sdk/client-iam';
import {
  CreateBucketCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  PutObjectCommand,
  S3Client,
} from '@aws-sdk/client-s3';
import { CreateSecretCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { AssumeRoleCommand, STSClient } from '@aws-sdk/client-sts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { openArtifact, sealArtifact } from '../../functions/lib/artifact/sealed.js';
import { parseLambdaEnv } from '../../functions/lib/entry/config.js';
import type { DispatchedBatch } from '../../functions/lib/entry/dispatch.js';
import { StsRunCredentials } from '../../functions/lib/entry/dispatch-aws.js';
import { UNSEALED_TAG } from '../../functions/lib/entry/dispatch-entry.js';
import { CollectingRequeuer, dispatchedHandler, RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import type { EntryDeps } from '../../functions/lib/entry/handler.js';
import { createLambdaDeps, fleetClusterRegistry, lazyAwsClients } from '../../functions/lib/entry/lambda.js';
import { createSecretsManagerClient } from '../../functions/lib/entry/secrets-client.js';
import { SecretsManagerSecretStore } from '../../functions/lib/kube/bearer.js';
import { UnknownClusterError } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { type RunPolicyTarget, runSessionPolicy } from '../../infra/aws/run-policy.js';
import { type IamMotoServer, startIamMotoServer } from '../harness/servers/moto-iam.js';
import { clusterTemplateRecord } from '../unit/support/cluster-records.js';

const ACCOUNT = '123456789012';
const suffix = randomBytes(3).toString('hex');
const ARTIFACTS = `confine-artifacts-${suffix}`;
const REGISTRY = `confine-registry-${suffix}`;
const target: RunPolicyTarget = {
  partition: 'aws',
  region: 'us-east-1',
  account: ACCOUNT,
  bucket: ARTIFACTS,
  registry: { bucket: REGISTRY, prefix: 'registry/' },
};
/** {@link target} with each cluster's claims in its sharing domain (D17). */
const CLUSTER_SHARING: RunPolicyTarget = { ...target, sharing: 'cluster' };
/** A pinned-fetch record: a claim (`cache/fetch/…`, or `d/<tag>/cache/fetch/…` in a sharing domain). */
const CLAIM = `cache/fetch/sha256/${'f'.repeat(64)}.json`;
const keyring = new DerivedKeyring(randomBytes(32));
const PEM = '-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIU\n-----END CERTIFICATE-----\n';

/** A sealed fetch artifact's key of a cluster (`private/<cluster tag>/<namespace tag>/fetch/<mac>.tgz`). */
const privateKey = (tag: string) => `private/${tag}/${'0'.repeat(32)}/fetch/${'e'.repeat(64)}.tgz`;

/** The SDK error names along `err`'s cause chain (the store and the secret store wrap them). */
function names(err: unknown): string[] {
  const out: string[] = [];
  for (let c = err; c instanceof Error; c = (c as { cause?: unknown }).cause) out.push(c.name);
  return out;
}

/** Resolves to the cause chain's names when `work` is refused by IAM; rejects when it is not refused. */
async function denied(work: Promise<unknown>): Promise<string[]> {
  try {
    await work;
  } catch (err) {
    if (names(err).some((n) => /^AccessDenied/.test(n))) return names(err);
    throw err;
  }
  throw new Error('expected AccessDenied, but the request was allowed');
}

let moto: IamMotoServer;
let tagA: string;
let tagB: string;
let holder: RunCredentialHolder;
let deps: EntryDeps;
let config: ReturnType<typeof parseLambdaEnv>;
let sessionKeyId: string;
/** Cluster A's run in cluster sharing (D17): its configuration, holder and composition. */
let clusterConfig: ReturnType<typeof parseLambdaEnv>;
let clusterRun: { holder: RunCredentialHolder; deps: EntryDeps };
/** An install run's session of cluster A (issue 28: its fleet index entries and receipts), as an S3 client. */
let installS3: S3Client;

beforeAll(async () => {
  moto = await startIamMotoServer();
  const admin = {
    endpoint: moto.endpoint,
    region: moto.region,
    credentials: { accessKeyId: moto.accessKeyId, secretAccessKey: moto.secretAccessKey },
  };
  [tagA, tagB] = [(await keyring.keysFor('a')).tag, (await keyring.keysFor('b')).tag];
  // The fleet as the stack would leave it: both clusters' sealed artifacts, documents, tokens,
  // leases and receipts (IAM not yet enforced: moto takes the throw-away pair).
  const s3 = new S3Client({ ...admin, forcePathStyle: true });
  const sm = new SecretsManagerClient(admin);
  const iam = new IAMClient(admin);
  try {
    for (const Bucket of [ARTIFACTS, REGISTRY]) await s3.send(new CreateBucketCommand({ Bucket }));
    const expires = new Date(Date.now() + 86_400_000);
    for (const [id, tag] of [
      ['a', tagA],
      ['b', tagB],
    ] as const) {
      const keys = await keyring.keysFor(id);
      const key = privateKey(tag);
      const put = (Bucket: string, Key: string, Body: string | Buffer) =>
        s3.send(new PutObjectCommand({ Bucket, Key, Body }));
      await put(ARTIFACTS, key, sealArtifact(keys.encKey, key, Buffer.from(`sealed of ${id}`), expires));
      await put(ARTIFACTS, `state/leases/${id}/ns/app.json`, '{}');
      await put(ARTIFACTS, `receipts/${id}/ns/app/1.json`, '{}');
      await put(ARTIFACTS, `state/fleet/${id}/ns/pkgi.json`, `{"of":"${id}"}`);
      const doc = {
        apiVersion: 'kapp-lambda/v1',
        kind: 'Cluster',
        id,
        endpoint: 'https://127.0.0.1:1',
        caData: Buffer.from(PEM).toString('base64'),
        auth: { kind: 'token', secrets: { fetch: `kapp-lambda/${id}/fetch`, deploy: `kapp-lambda/${id}/deploy` } },
      };
      await put(REGISTRY, `registry/clusters/${id}.json`, JSON.stringify(doc));
      for (const stage of ['fetch', 'deploy']) {
        await sm.send(
          new CreateSecretCommand({ Name: `kapp-lambda/${id}/${stage}`, SecretString: `token-${id}-${stage}` }),
        );
      }
    }
    // The claims of D17: the fleet's (`cache/…`) and each cluster's sharing domain's (`d/<tag>/…`).
    for (const k of [CLAIM, `d/${tagA}/${CLAIM}`, `d/${tagB}/${CLAIM}`]) {
      await s3.send(new PutObjectCommand({ Bucket: ARTIFACTS, Key: k, Body: '{"fetchKey":"x"}' }));
    }
    // The fleet's rollouts, which only the install dispatcher holds (issue 28).
    await s3.send(new PutObjectCommand({ Bucket: ARTIFACTS, Key: 'state/rollouts/default/hello.json', Body: '{}' }));
    await s3.send(new PutObjectCommand({ Bucket: ARTIFACTS, Key: 'state/rollout-policies/default.json', Body: '{}' }));
    // D15's emulator stand-in: the run role's own policy is the session document of cluster A,
    // in fleet sharing and (a second role) in cluster sharing; a third, install's.
    const dispatcherArn = `arn:aws:iam::${ACCOUNT}:user/dispatcher-fetch`;
    const runRole = async (
      RoleName: string,
      t: RunPolicyTarget,
      stage: 'fetch' | 'install' = 'fetch',
      tag = tagA,
    ): Promise<string> => {
      const role = await iam.send(
        new CreateRoleCommand({
          RoleName,
          MaxSessionDuration: 3600,
          AssumeRolePolicyDocument: JSON.stringify({
            Version: '2012-10-17',
            Statement: [{ Effect: 'Allow', Principal: { AWS: dispatcherArn }, Action: 'sts:AssumeRole' }],
          }),
        }),
      );
      await iam.send(
        new PutRolePolicyCommand({
          RoleName,
          PolicyName: 'run-session-a',
          PolicyDocument: JSON.stringify(runSessionPolicy(stage, 'a', tag, t)),
        }),
      );
      return role.Role?.Arn as string;
    };
    const roleArn = await runRole('run-fetch', target);
    const clusterRoleArn = await runRole('run-fetch-cluster', CLUSTER_SHARING);
    // The install dispatcher derives no sealing keys: its runs' tag is UNSEALED_TAG.
    const installRoleArn = await runRole('run-install', CLUSTER_SHARING, 'install', UNSEALED_TAG);
    await iam.send(new CreateUserCommand({ UserName: 'dispatcher-fetch' }));
    await iam.send(
      new PutUserPolicyCommand({
        UserName: 'dispatcher-fetch',
        PolicyName: 'assume-run',
        PolicyDocument: JSON.stringify({
          Version: '2012-10-17',
          Statement: [
            { Effect: 'Allow', Action: 'sts:AssumeRole', Resource: [roleArn, clusterRoleArn, installRoleArn] },
          ],
        }),
      }),
    );
    const key = (await iam.send(new CreateAccessKeyCommand({ UserName: 'dispatcher-fetch' }))).AccessKey;
    await moto.enforceIam();

    // The dispatcher's side: the run session of cluster A, through the real STS client.
    const sts = new STSClient({
      endpoint: moto.endpoint,
      region: moto.region,
      credentials: { accessKeyId: key?.AccessKeyId as string, secretAccessKey: key?.SecretAccessKey as string },
    });
    const a = await keyring.keysFor('a');
    /** A dispatched batch of cluster A carrying a session of `arn` under `t`'s policy. */
    const batchOf = async (arn: string, t: RunPolicyTarget): Promise<DispatchedBatch> => {
      const session = await new StsRunCredentials({
        assumeRole: (input) => sts.send(new AssumeRoleCommand(input)),
        roleArn: () => arn,
        target: t,
      }).forRun('fetch', 'a', tagA);
      return {
        records: [clusterTemplateRecord('a', 'app')],
        clusterId: 'a',
        credentials: {
          accessKeyId: session.accessKeyId,
          secretAccessKey: session.secretAccessKey,
          sessionToken: session.sessionToken,
          expiration: session.expiration.toISOString(),
        },
        sealingKeys: { tag: a.tag, encKey: a.encKey.toString('base64'), macKey: a.macKey.toString('base64') },
      };
    };
    const batch = await batchOf(roleArn, target);
    const clusterBatch = await batchOf(clusterRoleArn, CLUSTER_SHARING);
    const install = await new StsRunCredentials({
      assumeRole: (input) => sts.send(new AssumeRoleCommand(input)),
      roleArn: () => installRoleArn,
      target: CLUSTER_SHARING,
    }).forRun('install', 'a', UNSEALED_TAG);
    installS3 = new S3Client({
      endpoint: moto.endpoint,
      region: moto.region,
      forcePathStyle: true,
      credentials: {
        accessKeyId: install.accessKeyId,
        secretAccessKey: install.secretAccessKey,
        sessionToken: install.sessionToken,
      },
    });
    sts.destroy();
    sessionKeyId = batch.credentials.accessKeyId;
    // The stage's side: the dispatched composition, as `lambdaEntry` builds it.
    const env = {
      AWS_REGION: moto.region,
      KAPP_LAMBDA_BUCKET: ARTIFACTS,
      KAPP_LAMBDA_S3_ENDPOINT: moto.endpoint,
      KAPP_LAMBDA_SQS_ENDPOINT: moto.endpoint,
      KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: moto.endpoint,
      KAPP_LAMBDA_QUEUE_URL_FETCH: `${moto.endpoint}/${ACCOUNT}/fetch.fifo`,
      KAPP_LAMBDA_QUEUE_URL_TEMPLATE: `${moto.endpoint}/${ACCOUNT}/template.fifo`,
      KAPP_LAMBDA_QUEUE_URL_DEPLOY: `${moto.endpoint}/${ACCOUNT}/deploy.fifo`,
      KAPP_LAMBDA_CLUSTER_REGISTRY: `s3://${REGISTRY}/registry/`,
      KAPP_LAMBDA_TOOL_VERSIONS: '{"vendir":"0.44.0"}',
      KAPP_LAMBDA_DISPATCHED: 'true',
    };
    config = parseLambdaEnv('fetch', env);
    /** The dispatched composition under `c`, its holder having accepted `b`. */
    const compose = (c: typeof config, b: DispatchedBatch) => {
      const h = new RunCredentialHolder();
      h.accept(b);
      const d = createLambdaDeps(c, lazyAwsClients(c, h.credentials), {
        log: memoryLogger(),
        keyring: h.keyring,
        requeuer: new CollectingRequeuer(),
        tenant: h,
      });
      return { holder: h, deps: d };
    };
    ({ holder, deps } = compose(config, batch));
    clusterConfig = parseLambdaEnv('fetch', { ...env, KAPP_LAMBDA_SHARING: 'cluster' });
    clusterRun = compose(clusterConfig, clusterBatch);
  } finally {
    s3.destroy();
    sm.destroy();
    iam.destroy();
  }
}, 120_000);

afterAll(async () => {
  installS3?.destroy();
  await moto?.stop();
});

describe("a run of cluster A holds A's keys and nothing of B's", () => {
  it("opens A's sealed artifact with the batch's keys; B's is AccessDenied", async () => {
    const body = await deps.pipeline.store.get(privateKey(tagA));
    const keys = await holder.keyring.keysFor('a');
    expect(openArtifact(keys.encKey, privateKey(tagA), body as Buffer).plaintext.toString()).toBe('sealed of a');
    expect(await denied(deps.pipeline.store.get(privateKey(tagB)))).toContain('AccessDenied');
    await expect(holder.keyring.keysFor('b')).rejects.toThrow('no sealing keys for cluster b');
  });

  it("loads A from the registry (document and fetch token); B's document and tokens are AccessDenied", async () => {
    // The composition's own registry: A's document from S3, A's fetch token from Secrets Manager.
    await deps.prepare?.('a');
    expect(deps.pipeline.clusters.clusterIds()).toEqual(['a']);
    // B is unknown to it before any request (the narrowing) ...
    expect(() => deps.pipeline.clusters.fetchView('b')).toThrow(UnknownClusterError);
    // ... and the session itself cannot read B, whatever code asks: the un-narrowed fleet
    // registry over the same clients, and the secret store over the same credentials.
    const clients = lazyAwsClients(config, holder.credentials);
    const fleet = fleetClusterRegistry({ ...config, clusterRegistry: config.clusterRegistry! }, clients);
    expect(await denied(fleet.prepare('b'))).toContain('AccessDenied');
    await fleet.prepare('a');
    const secrets = new SecretsManagerSecretStore(createSecretsManagerClient(config, holder.credentials));
    expect(await secrets.read('kapp-lambda/a/fetch')).toBe('token-a-fetch');
    expect(await denied(secrets.read('kapp-lambda/b/fetch'))).toContain('AccessDeniedException');
    // A's token of another stage is not this run's either.
    expect(await denied(secrets.read('kapp-lambda/a/deploy'))).toContain('AccessDeniedException');
    const raw = clients.s3;
    expect(
      await denied(raw.send(new GetObjectCommand({ Bucket: REGISTRY, Key: 'registry/clusters/b.json' }))),
    ).toContain('AccessDenied');
  });

  it("reads and writes A's leases and receipts; B's are AccessDenied", async () => {
    const store = deps.pipeline.store;
    expect((await store.get('state/leases/a/ns/app.json'))?.toString()).toBe('{}');
    await store.put('state/leases/a/ns/app.json', Buffer.from('{"a":1}'));
    await store.put('receipts/a/ns/app/2.json', Buffer.from('{}'));
    for (const key of ['state/leases/b/ns/app.json', 'receipts/b/ns/app/1.json']) {
      expect(await denied(store.get(key))).toContain('AccessDenied');
      expect(await denied(store.put(key, Buffer.from('{"taken":true}')))).toContain('AccessDenied');
    }
  });

  it("install: reads, writes and deletes A's fleet index entries and reads A's receipts; B's, and the fleet's rollout records and policies, are AccessDenied", async () => {
    const get = (Key: string) => installS3.send(new GetObjectCommand({ Bucket: ARTIFACTS, Key }));
    const put = (Key: string) => installS3.send(new PutObjectCommand({ Bucket: ARTIFACTS, Key, Body: '{}' }));
    const del = (Key: string) => installS3.send(new DeleteObjectCommand({ Bucket: ARTIFACTS, Key }));
    expect(await (await get('state/fleet/a/ns/pkgi.json')).Body?.transformToString()).toBe('{"of":"a"}');
    await put('state/fleet/a/ns/other.json');
    await del('state/fleet/a/ns/other.json');
    expect(await (await get('receipts/a/ns/app/1.json')).Body?.transformToString()).toBe('{}');
    for (const key of ['state/fleet/b/ns/pkgi.json', 'state/rollouts/default/hello.json']) {
      expect(await denied(get(key)), key).toContain('AccessDenied');
      expect(await denied(put(key)), key).toContain('AccessDenied');
      expect(await denied(del(key)), key).toContain('AccessDenied');
    }
    for (const key of ['receipts/b/ns/app/1.json', 'state/rollout-policies/default.json', privateKey(tagA)]) {
      expect(await denied(get(key)), key).toContain('AccessDenied');
    }
  });

  it("in cluster sharing, reads and writes A's domain (d/<tagA>/) only: B's domain and the fleet's claims are AccessDenied", async () => {
    const store = clusterRun.deps.pipeline.store;
    // Through the stage's store a claim's key reaches A's domain.
    expect((await store.get(CLAIM))?.toString()).toBe('{"fetchKey":"x"}');
    await store.put(CLAIM, Buffer.from('{"fetchKey":"a"}'));
    expect((await store.get(`d/${tagA}/${CLAIM}`))?.toString()).toBe('{"fetchKey":"a"}');
    await store.put(`inflight/${CLAIM}`, Buffer.from('{}'));
    await store.delete(`inflight/${CLAIM}`);
    // B's domain, by its own key, whatever code asks.
    for (const key of [`d/${tagB}/${CLAIM}`, `d/${tagB}/inflight/${CLAIM}`]) {
      expect(await denied(store.get(key))).toContain('AccessDenied');
      expect(await denied(store.put(key, Buffer.from('{"fetchKey":"planted"}')))).toContain('AccessDenied');
    }
    // The fleet's claims, straight through the session's S3 client (the store maps them away).
    const raw = lazyAwsClients(clusterConfig, clusterRun.holder.credentials).s3;
    expect(await denied(raw.send(new GetObjectCommand({ Bucket: ARTIFACTS, Key: CLAIM })))).toContain('AccessDenied');
    for (const Key of [CLAIM, `inflight/${CLAIM}`]) {
      expect(await denied(raw.send(new PutObjectCommand({ Bucket: ARTIFACTS, Key, Body: '{}' })))).toContain(
        'AccessDenied',
      );
    }
    // The shared artifacts stay shared, the sealed keys sealed.
    await store.put(`artifacts/fetch/sha256/${'1'.repeat(64)}.tgz`, Buffer.from('tarball'));
    expect(await denied(store.get(privateKey(tagB)))).toContain('AccessDenied');
  });

  it('refuses a batch of cluster B in the environment that served A, keeping A’s session', async () => {
    const handler = dispatchedHandler(async () => ({ batchItemFailures: [] }), holder);
    const b = await keyring.keysFor('b');
    const batchB: DispatchedBatch = {
      records: [clusterTemplateRecord('b', 'app')],
      clusterId: 'b',
      credentials: {
        accessKeyId: 'AKIAB',
        secretAccessKey: 'b',
        sessionToken: 'b',
        expiration: new Date(Date.now() + 3_600_000).toISOString(),
      },
      sealingKeys: { tag: b.tag, encKey: b.encKey.toString('base64'), macKey: b.macKey.toString('base64') },
    };
    await expect(handler(batchB)).rejects.toThrow(
      'refused a dispatched batch: it is for cluster b, this environment serves a',
    );
    expect((await holder.credentials()).accessKeyId).toBe(sessionKeyId);
    await expect(holder.keyring.keysFor('b')).rejects.toThrow('no sealing keys for cluster b');
  });
});
