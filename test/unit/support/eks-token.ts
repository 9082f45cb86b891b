/**
 * Reading an EKS bearer token in tests: its presigned STS URL, and whether it was signed for a
 * given cluster name (the `x-k8s-aws-id` header is signed, not sent in the URL, so the signature
 * is computed again for the name and compared).
 */
import type { AwsCredentialIdentity } from '@smithy/types';
import { EKS_TOKEN_PREFIX, presignGetCallerIdentity } from '../../../functions/lib/kube/bearer.js';

/** The presigned URL of an EKS token (`k8s-aws-v1.` + base64url). @throws Error for another token. */
export function decodeEksToken(token: string): URL {
  if (!token.startsWith(EKS_TOKEN_PREFIX)) throw new Error('not an EKS token');
  return new URL(Buffer.from(token.slice(EKS_TOKEN_PREFIX.length), 'base64url').toString('utf8'));
}

/** Whether the token's URL carries the signature of `credentials` for cluster `clusterName`. */
export function signedFor(url: URL, clusterName: string, credentials: AwsCredentialIdentity): boolean {
  const q = url.searchParams;
  const [, , region] = (q.get('X-Amz-Credential') ?? '').split('/');
  const d = q.get('X-Amz-Date') ?? '';
  const date = new Date(`${d.slice(0, 4)}-${d.slice(4, 6)}-${d.slice(6, 11)}:${d.slice(11, 13)}:${d.slice(13, 15)}Z`);
  const again = presignGetCallerIdentity(
    credentials,
    region ?? '',
    url.hostname,
    clusterName,
    date,
    Number(q.get('X-Amz-Expires')),
  );
  return again.find(([k]) => k === 'X-Amz-Signature')?.[1] === q.get('X-Amz-Signature');
}
