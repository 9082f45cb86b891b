/**
 * The dispatcher of the shared mode (docs/decisions.md D15, `functions/lib/entry/dispatch.ts`):
 * a batch is split by cluster into one invoke each (records of a message group together and in
 * order), the stage's answers map back to the original records, a failed invoke fails only its
 * own records; the STS adapter assumes the run role under exactly `runSessionPolicy` of the
 * record's cluster and caches the session per (stage, cluster) until it nears its expiry; the
 * stage side refuses a second cluster in one environment and its SDK clients sign with each
 * invocation's credentials. STS, Lambda and the stage are fakes at their ports.
 */
import { describe, expect, it } from 'vitest';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { createAwsClients } from '../../functions/lib/entry/aws-clients.js';
import {
  type DispatchedBatch,
  makeDispatcher,
  type RunCredentials,
  type StageInvoker,
} from '../../functions/lib/entry/dispatch.js';
import {
  type AssumeRoleInput,
  type InvokeInput,
  type InvokeOutput,
  LambdaStageInvoker,
  RUN_SESSION_REFRESH_MS,
  StsRunCredentials,
} from '../../functions/lib/entry/dispatch-aws.js';
import { dispatchedHandler, RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import type { SqsBatchResponse, SqsEvent, SqsRecord } from '../../functions/lib/entry/stage-handler.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { type RunPolicyTarget, runSessionPolicy } from '../../infra/aws/run-policy.js';
import { clusterInstallRecord, clusterTemplateRecord } from './support/cluster-records.js';

const keyring = new DerivedKeyring(Buffer.alloc(32, 7));
const TARGET: RunPolicyTarget = {
  partition: 'aws',
  region: 'eu-west-1',
  account: '123456789012',
  bucket: 'fleet-artifacts',
  registry: { bucket: 'fleet-registry', prefix: 'registry/' },
};

/** The record of App `name` of cluster `clusterId`, generation `n`: message id `<clusterId>-<name><n>`. */
const rec = (clusterId: string, name: string, n = 1): SqsRecord =>
  clusterTemplateRecord(clusterId, name, n, `${clusterId}-${name}${n}`);
const ids = (rs: readonly SqsRecord[]) => rs.map((r) => r.messageId);
const failures = (...names: string[]): SqsBatchResponse => ({
  batchItemFailures: names.map((itemIdentifier) => ({ itemIdentifier })),
});
const creds = (id: string, expiration = new Date('2030-01-01T00:00:00Z')) => ({
  accessKeyId: `AKIA-${id}`,
  secretAccessKey: `secret-${id}`,
  sessionToken: `token-${id}`,
  expiration,
});

/** A dispatcher over fake credentials and a fake stage answering with `answer(tenant, payload)`. */
function setup(
  answer: (tenant: string, payload: DispatchedBatch) => Promise<SqsBatchResponse> = async () => failures(),
  stage: PipelineStage = 'template',
) {
  const invokes: { stage: PipelineStage; tenant: string; payload: DispatchedBatch }[] = [];
  const asked: [PipelineStage, string, string][] = [];
  const credentials: RunCredentials = {
    async forRun(s, clusterId, tag) {
      asked.push([s, clusterId, tag]);
      if (clusterId === 'nokeys') throw new Error('sts down');
      return creds(clusterId);
    },
  };
  const invoker: StageInvoker = {
    async invoke(s, tenant, payload) {
      invokes.push({ stage: s, tenant, payload });
      return await answer(tenant, payload);
    },
  };
  const log = memoryLogger();
  return { dispatch: makeDispatcher(stage, { credentials, invoker, keyring, log }), invokes, asked, log };
}

describe('makeDispatcher', () => {
  it('splits a batch by cluster, one invoke per cluster with its tenant, credentials and sealing keys', async () => {
    const { dispatch, invokes, asked } = setup();
    const event: SqsEvent = { Records: [rec('alpha', 'x'), rec('beta', 'y'), rec('alpha', 'z')] };
    expect(await dispatch(event)).toEqual(failures());
    expect(invokes.map((i) => [i.stage, i.tenant, i.payload.clusterId, ids(i.payload.records)])).toEqual([
      ['template', 'alpha', 'alpha', ['alpha-x1', 'alpha-z1']],
      ['template', 'beta', 'beta', ['beta-y1']],
    ]);
    const [a, b] = [await keyring.keysFor('alpha'), await keyring.keysFor('beta')];
    expect(asked).toEqual([
      ['template', 'alpha', a.tag],
      ['template', 'beta', b.tag],
    ]);
    expect(invokes[0]?.payload.credentials).toEqual({ ...creds('alpha'), expiration: '2030-01-01T00:00:00.000Z' });
    expect(invokes[0]?.payload.sealingKeys).toEqual({
      tag: a.tag,
      encKey: a.encKey.toString('base64'),
      macKey: a.macKey.toString('base64'),
    });
    expect(invokes[1]?.payload.sealingKeys?.tag).toBe(b.tag);
    expect(invokes[0]?.payload.records[0]).toBe(event.Records[0]);
  });

  it('keeps the records of one message group in one invoke, in batch order', async () => {
    const { dispatch, invokes } = setup();
    await dispatch({
      Records: [
        rec('alpha', 'x', 1),
        rec('alpha', 'y', 1),
        rec('beta', 'x', 1),
        rec('alpha', 'x', 2),
        rec('alpha', 'x', 3),
      ],
    });
    const alpha = invokes.find((i) => i.tenant === 'alpha');
    expect(ids(alpha?.payload.records ?? [])).toEqual(['alpha-x1', 'alpha-y1', 'alpha-x2', 'alpha-x3']);
    expect(invokes).toHaveLength(2);
  });

  it("maps each stage's answer back to the original records, and ignores one naming records it was not given", async () => {
    const { dispatch, log } = setup(async (tenant) =>
      tenant === 'alpha' ? failures('alpha-z1', 'beta-y1') : failures('beta-y2'),
    );
    const answer = await dispatch({
      Records: [rec('alpha', 'x'), rec('beta', 'y'), rec('alpha', 'z'), rec('beta', 'y', 2)],
    });
    expect(answer).toEqual(failures('alpha-z1', 'beta-y2'));
    expect(log.records.filter((r) => r.obj.first === 'beta-y1').map((r) => r.obj.clusterId)).toEqual(['alpha']);
  });

  it('logs made-up ids in an answer once, counted, however many there are', async () => {
    const many = Array.from({ length: 5000 }, (_, i) => `made-up-${i}`);
    const { dispatch, log } = setup(async () => ({
      batchItemFailures: many.map((itemIdentifier) => ({ itemIdentifier })),
      requeue: many,
    }));
    expect(await dispatch({ Records: [rec('alpha', 'x')] })).toEqual(failures());
    const lines = log.records.filter((r) => /not given/.test(r.msg ?? ''));
    expect(lines.map((r) => r.obj.unknown)).toEqual([{ batchItemFailures: 5000, requeue: 5000 }]);
  });

  it('fails exactly the records of a failed invoke, or of a cluster whose credentials could not be had', async () => {
    const { dispatch, invokes } = setup(async (tenant) => {
      if (tenant === 'beta') throw new Error('TooManyRequestsException');
      return failures();
    });
    const answer = await dispatch({
      Records: [rec('alpha', 'x'), rec('beta', 'y'), rec('nokeys', 'n'), rec('beta', 'w'), rec('alpha', 'z')],
    });
    expect(answer).toEqual(failures('beta-y1', 'nokeys-n1', 'beta-w1'));
    expect(invokes.map((i) => i.tenant)).toEqual(['alpha', 'beta']);
  });

  it('drops a record with no valid event (no cluster to run it for) and sends no sealing keys to install', async () => {
    const { dispatch, invokes } = setup(undefined, 'install');
    const answer = await dispatch({
      Records: [{ messageId: 'junk', body: '{}' }, clusterInstallRecord('alpha', 'x', 'alpha-x1')],
    });
    expect(answer).toEqual(failures());
    expect(invokes.map((i) => [i.tenant, ids(i.payload.records), 'sealingKeys' in i.payload])).toEqual([
      ['alpha', ['alpha-x1'], false],
    ]);
  });
});

describe('StsRunCredentials', () => {
  const TAG_A = 'a'.repeat(32);
  const TAG_B = 'b'.repeat(32);
  function sts(fail = false) {
    const calls: AssumeRoleInput[] = [];
    let clock = Date.parse('2030-01-01T00:00:00Z');
    const run = new StsRunCredentials({
      assumeRole: async (input) => {
        calls.push(input);
        if (fail) throw new Error('AccessDenied');
        const n = calls.length;
        return {
          Credentials: {
            AccessKeyId: `AKIA${n}`,
            SecretAccessKey: `s${n}`,
            SessionToken: `t${n}`,
            Expiration: new Date(clock + input.DurationSeconds * 1000),
          },
        };
      },
      roleArn: (stage) => `arn:aws:iam::123456789012:role/run-${stage}`,
      target: TARGET,
      now: () => clock,
    });
    return { run, calls, tick: (ms: number) => (clock += ms) };
  }

  it("assumes the stage's run role as the cluster with exactly runSessionPolicy of that cluster", async () => {
    const { run, calls } = sts();
    await run.forRun('fetch', 'alpha', TAG_A);
    await run.forRun('fetch', 'beta', TAG_B);
    expect(calls).toEqual([
      {
        RoleArn: 'arn:aws:iam::123456789012:role/run-fetch',
        RoleSessionName: 'alpha',
        Policy: JSON.stringify(runSessionPolicy('fetch', 'alpha', TAG_A, TARGET)),
        DurationSeconds: 3600,
      },
      {
        RoleArn: 'arn:aws:iam::123456789012:role/run-fetch',
        RoleSessionName: 'beta',
        Policy: JSON.stringify(runSessionPolicy('fetch', 'beta', TAG_B, TARGET)),
        DurationSeconds: 3600,
      },
    ]);
    // Cluster alpha's session names nothing of beta's: not its id, not its tag.
    expect(calls[0]?.Policy).not.toMatch(/beta|b{32}/);
    expect(calls[1]?.Policy).not.toMatch(/alpha|a{32}/);
    // a one-character id: STS refuses a session name under 2 characters
    await run.forRun('fetch', 'z', TAG_A);
    expect(calls[2]?.RoleSessionName).toBe('z.');
  });

  it('keeps a session per (stage, cluster) and replaces it before it expires', async () => {
    const { run, calls, tick } = sts();
    const [first, again] = await Promise.all([
      run.forRun('deploy', 'alpha', TAG_A),
      run.forRun('deploy', 'alpha', TAG_A),
    ]);
    expect(again).toBe(first);
    expect(calls).toHaveLength(1);
    await run.forRun('template', 'alpha', TAG_A);
    await run.forRun('deploy', 'beta', TAG_B);
    expect(calls.map((c) => [c.RoleArn.slice(-8), c.RoleSessionName])).toEqual([
      ['n-deploy', 'alpha'],
      ['template', 'alpha'],
      ['n-deploy', 'beta'],
    ]);
    tick(3_600_000 - RUN_SESSION_REFRESH_MS - 1);
    expect((await run.forRun('deploy', 'alpha', TAG_A)).accessKeyId).toBe('AKIA1');
    tick(2);
    const renewed = await run.forRun('deploy', 'alpha', TAG_A);
    expect(renewed.accessKeyId).toBe('AKIA4');
    expect(renewed.expiration.getTime() - Date.parse('2030-01-01T00:00:00Z')).toBe(
      2 * 3_600_000 - RUN_SESSION_REFRESH_MS + 1,
    );
    expect(calls).toHaveLength(4);
  });

  it('does not keep a failed AssumeRole, and wraps its error', async () => {
    const { run, calls } = sts(true);
    await expect(run.forRun('fetch', 'alpha', TAG_A)).rejects.toThrow('assume the run role of fetch for cluster alpha');
    await expect(run.forRun('fetch', 'alpha', TAG_A)).rejects.toThrow();
    expect(calls).toHaveLength(2);
  });
});

describe('LambdaStageInvoker', () => {
  const batch: DispatchedBatch = {
    records: [rec('alpha', 'x')],
    clusterId: 'alpha',
    credentials: { ...creds('alpha'), expiration: '2030-01-01T00:00:00.000Z' },
  };
  const invoker = (out: InvokeOutput | Error, seen: InvokeInput[] = []) =>
    new LambdaStageInvoker({
      invoke: async (input) => {
        seen.push(input);
        if (out instanceof Error) throw out;
        return out;
      },
      functionName: (stage) => `fleet-${stage}`,
    });
  const json = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));

  it('invokes the stage synchronously as the tenant, with the batch as its payload, and reads its answer', async () => {
    const seen: InvokeInput[] = [];
    const answer = await invoker({ StatusCode: 200, Payload: json(failures('alpha-x1')) }, seen).invoke(
      'template',
      'alpha',
      batch,
    );
    expect(answer).toEqual(failures('alpha-x1'));
    expect(seen.map((s) => ({ ...s, Payload: JSON.parse(new TextDecoder().decode(s.Payload)) }))).toEqual([
      { FunctionName: 'fleet-template', InvocationType: 'RequestResponse', TenantId: 'alpha', Payload: batch },
    ]);
  });

  it("throws on the invoke's error, the function's error and an answer that is no batch response", async () => {
    await expect(invoker(new Error('throttled')).invoke('template', 'alpha', batch)).rejects.toThrow(
      'invoke the template function for cluster alpha',
    );
    await expect(
      invoker({ StatusCode: 200, FunctionError: 'Unhandled', Payload: json({ errorMessage: 'x' }) }).invoke(
        'template',
        'alpha',
        batch,
      ),
    ).rejects.toThrow('the function failed (Unhandled)');
    for (const bad of [{}, { batchItemFailures: [{ itemIdentifier: 1 }] }, 'null']) {
      await expect(invoker({ StatusCode: 200, Payload: json(bad) }).invoke('template', 'alpha', batch)).rejects.toThrow(
        'not a batch response',
      );
    }
  });
});

describe('the stage side: RunCredentialHolder and dispatchedHandler', () => {
  const batchOf = (clusterId: string, key: string, records = [rec(clusterId, 'x')]): DispatchedBatch => ({
    records,
    clusterId,
    credentials: { ...creds(key), expiration: '2030-01-01T00:00:00.000Z' },
  });

  it("runs the batch's records as the queue's event, and refuses a second cluster in one environment", async () => {
    const holder = new RunCredentialHolder();
    const seen: string[][] = [];
    const handler = dispatchedHandler(async (event) => {
      seen.push('Records' in event ? ids(event.Records) : []);
      return failures('alpha-x1');
    }, holder);
    expect(await handler(batchOf('alpha', 'a1'))).toEqual(failures('alpha-x1'));
    await expect(handler(batchOf('beta', 'b1'))).rejects.toThrow(
      'refused a dispatched batch: it is for cluster beta, this environment serves alpha',
    );
    await expect(handler(batchOf('alpha', 'a2', [rec('beta', 'y')]))).rejects.toThrow('a record is of another cluster');
    expect(seen).toEqual([['alpha-x1']]);
    expect((await holder.credentials()).accessKeyId).toBe('AKIA-a1');
    expect(holder.clusterId).toBe('alpha');
  });

  it("serves only its cluster's sealing keys, and no credentials before a batch", async () => {
    const holder = new RunCredentialHolder();
    await expect(holder.credentials()).rejects.toThrow('no run credentials');
    const a = await keyring.keysFor('alpha');
    holder.accept({
      ...batchOf('alpha', 'a1'),
      sealingKeys: { tag: a.tag, encKey: a.encKey.toString('base64'), macKey: a.macKey.toString('base64') },
    });
    expect(await holder.keyring.keysFor('alpha')).toEqual(a);
    await expect(holder.keyring.keysFor('beta')).rejects.toThrow('no sealing keys for cluster beta');
  });

  it("gives the stage's SDK clients each invocation's credentials (not the SDK's cached first ones)", async () => {
    const holder = new RunCredentialHolder();
    const { s3, sqs } = createAwsClients({ region: 'eu-west-1' }, holder.credentials);
    holder.accept(batchOf('alpha', 'a1'));
    expect((await s3.config.credentials()).accessKeyId).toBe('AKIA-a1');
    holder.accept(batchOf('alpha', 'a2'));
    expect((await s3.config.credentials()).accessKeyId).toBe('AKIA-a2');
    expect((await sqs.config.credentials()).sessionToken).toBe('token-a2');
  });
});
