/**
 * SQS-compatible queue service for tests: moto's server (Python `moto[server]`, pinned in
 * {@link MOTO_VERSION}; installed by `npm run setup`, `scripts/python.ts`, into the project's
 * virtual environment {@link pythonVenv}) on 127.0.0.1.
 *
 * Why moto rather than ElasticMQ: it is on PyPI (no JVM), starts in about a second, and
 * implements what the cloud mode relies on: FIFO queues with `MessageGroupId` ordering,
 * explicit (`MessageDeduplicationId`) and content-based deduplication within the 5-minute
 * window, visibility timeouts, and redrive to a dead-letter queue after `maxReceiveCount`.
 *
 * moto 5.2.1 deduplicates a FIFO message only against messages still in the queue; Amazon SQS
 * drops a copy for 5 minutes after the first was sent, whether or not it was consumed. The
 * server runs through `moto_sqs.py`, which adds that history, so a copy sent after the original
 * was received and deleted is dropped as on AWS. It also sets a message's `SenderId` as SQS does
 * for a role session moto's STS issued (`<role id>:<session name>`); other senders keep moto's
 * constant one.
 *
 * moto accepts any credentials; clients sign with the fixed throw-away pair of
 * {@link SqsInfo} (no AWS account is ever reached: the endpoint is the loopback server).
 * Queue URLs are `<endpoint>/123456789012/<name>` (moto's default account).
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  CreateQueueCommand,
  type CreateQueueCommandInput,
  GetQueueAttributesCommand,
  SQSClient,
} from '@aws-sdk/client-sqs';
import { cacheRoot } from '../../../layers/gobuild.js';
import { httpAnswers, LOOPBACK, startProcess, withFreePort } from './process.js';

/** The moto release the harness runs (`pip install 'moto[server]==<this>'`). */
export const MOTO_VERSION = '5.2.1';

/**
 * The project's Python virtual environment, `<cache>/venv` (`python3 -m venv`, made by
 * `scripts/python.ts`): moto lives there rather than in the user's site, which Debian 12's
 * Python refuses to `pip install --user` into (PEP 668, externally managed).
 * @param root - cache root (default {@link cacheRoot})
 */
export function pythonVenv(root = cacheRoot()): { dir: string; python: string; pip: string } {
  const dir = path.join(root, 'venv');
  return { dir, python: path.join(dir, 'bin', 'python'), pip: path.join(dir, 'bin', 'pip') };
}

/** JSON-serializable description of a running SQS server. */
export interface SqsInfo {
  /** `http://127.0.0.1:<port>`: the SDK's `endpoint`. */
  readonly endpoint: string;
  /** Signing region, `us-east-1`. */
  readonly region: string;
  /** Throw-away credentials moto accepts (not secrets: moto checks nothing). */
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
}

/** A running SQS server: {@link SqsInfo} plus `stop()`. */
export interface SqsServer extends SqsInfo {
  /** Kills moto. Idempotent. */
  stop(): Promise<void>;
}

/** Options of {@link createFifoQueue}. */
export interface FifoQueueOptions {
  /** `ContentBasedDeduplication` (default false: senders give `MessageDeduplicationId`). */
  readonly contentBased?: boolean;
  /** `VisibilityTimeout`, seconds (default 30, SQS's). */
  readonly visibilityTimeoutSeconds?: number;
  /** Dead-letter queue ARN and `maxReceiveCount`, as a `RedrivePolicy`. */
  readonly deadLetter?: { readonly arn: string; readonly maxReceiveCount: number };
}

/** The wrapper that runs moto's server with AWS's deduplication interval (see the module comment). */
const MOTO_SQS_PY = fileURLToPath(new URL('./moto_sqs.py', import.meta.url));

/**
 * argv of moto's server (through `moto_sqs.py`, run by the venv's python, {@link pythonVenv})
 * on `127.0.0.1:<port>`. Pure; exported for tests.
 */
export function motoArgv(port: number, root = cacheRoot()): string[] {
  return [pythonVenv(root).python, MOTO_SQS_PY, '--host', LOOPBACK, '--port', String(port)];
}

/** An SQS client for a test server (static throw-away credentials, path-style queue URLs). */
export function sqsClient(sqs: SqsInfo): SQSClient {
  return new SQSClient({
    endpoint: sqs.endpoint,
    region: sqs.region,
    credentials: { accessKeyId: sqs.accessKeyId, secretAccessKey: sqs.secretAccessKey },
  });
}

/**
 * Creates a FIFO queue (`<name>.fifo`; `name` without the suffix) and returns its URL and ARN.
 * @throws the SDK error when the name is invalid or exists with other attributes.
 */
export async function createFifoQueue(
  sqs: SqsInfo,
  name: string,
  opts: FifoQueueOptions = {},
): Promise<{ url: string; arn: string }> {
  const client = sqsClient(sqs);
  try {
    const attributes: NonNullable<CreateQueueCommandInput['Attributes']> = {
      FifoQueue: 'true',
      ContentBasedDeduplication: String(opts.contentBased ?? false),
      VisibilityTimeout: String(opts.visibilityTimeoutSeconds ?? 30),
    };
    if (opts.deadLetter) {
      attributes.RedrivePolicy = JSON.stringify({
        deadLetterTargetArn: opts.deadLetter.arn,
        maxReceiveCount: opts.deadLetter.maxReceiveCount,
      });
    }
    const created = await client.send(new CreateQueueCommand({ QueueName: `${name}.fifo`, Attributes: attributes }));
    const url = created.QueueUrl;
    if (!url) throw new Error(`create queue ${name}.fifo: no QueueUrl in the answer`);
    const attrs = await client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['QueueArn'] }));
    const arn = attrs.Attributes?.QueueArn;
    if (!arn) throw new Error(`create queue ${name}.fifo: no QueueArn in the answer`);
    return { url, arn };
  } finally {
    client.destroy();
  }
}

/**
 * Starts moto's server on a free 127.0.0.1 port and waits until it answers (`/moto-api/`). Its
 * state is in memory: nothing on disk to clean up.
 * @throws Error with moto's output when it does not start (e.g. not installed: `npm run setup`).
 */
export async function startSqsServer(): Promise<SqsServer> {
  // HOME: moto (botocore) reads its config from the user's home; moto itself is in the venv.
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME, PYTHONUNBUFFERED: '1' };
  return await withFreePort(async (port) => {
    const proc = await startProcess('moto', motoArgv(port), {
      env,
      ready: () => httpAnswers(`http://${LOOPBACK}:${port}/moto-api/`, (s) => s === 200),
    });
    return {
      endpoint: `http://${LOOPBACK}:${port}`,
      region: 'us-east-1',
      accessKeyId: 'moto-test',
      secretAccessKey: 'moto-test',
      stop: () => proc.stop(),
    };
  });
}
