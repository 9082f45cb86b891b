/**
 * What the tests of a stage function behind its dispatcher share: a dispatched stage's
 * environment and the batches a dispatcher would send it (credentials, the cluster's sealing keys).
 */
import { DerivedKeyring } from '../../../functions/lib/artifact/keyring.js';
import type { DispatchedBatch } from '../../../functions/lib/entry/dispatch.js';
import type { SqsRecord } from '../../../functions/lib/entry/handler.js';

/** A template stage function's environment behind its dispatcher (a kubeconfig for its clusters). */
export const DISPATCHED_ENV = {
  AWS_REGION: 'eu-west-1',
  KAPP_LAMBDA_BUCKET: 'kapp-lambda-artifacts',
  KAPP_LAMBDA_QUEUE_URL_FETCH: 'https://sqs.eu-west-1.amazonaws.com/1/f.fifo',
  KAPP_LAMBDA_QUEUE_URL_TEMPLATE: 'https://sqs.eu-west-1.amazonaws.com/1/t.fifo',
  KAPP_LAMBDA_QUEUE_URL_DEPLOY: 'https://sqs.eu-west-1.amazonaws.com/1/d.fifo',
  KAPP_LAMBDA_TOOL_VERSIONS: '{"ytt":"0.52.0"}',
  KAPP_LAMBDA_KUBECONFIG: '/var/task/kubeconfig.yaml',
  KAPP_LAMBDA_DISPATCHED: 'true',
};

/** The dispatcher's keyring of these tests (a fixed root key). */
export const DISPATCH_KEYRING = new DerivedKeyring(Buffer.alloc(32, 7));

/**
 * A batch of cluster `clusterId` with credentials `AKIA-<key>` and, unless `keys` is false, that
 * cluster's sealing keys from {@link DISPATCH_KEYRING}.
 */
export async function batchOf(
  clusterId: string,
  key: string,
  records: SqsRecord[],
  keys = true,
): Promise<DispatchedBatch> {
  const k = await DISPATCH_KEYRING.keysFor(clusterId);
  return {
    records,
    clusterId,
    credentials: {
      accessKeyId: `AKIA-${key}`,
      secretAccessKey: `secret-${key}`,
      sessionToken: `token-${key}`,
      expiration: '2030-01-01T00:00:00.000Z',
    },
    ...(keys
      ? { sealingKeys: { tag: k.tag, encKey: k.encKey.toString('base64'), macKey: k.macKey.toString('base64') } }
      : {}),
  };
}
