/**
 * The cluster registry's document: one JSON object per cluster at `clusters/<id>.json` in the
 * registry's object store, saying where the cluster's API server is (endpoint, CA bundle) and
 * how each stage function authenticates to it. Written by `npm run cluster -- add`, read by the
 * functions at run time (`fleet-registry.ts`). Holds no credential to a cluster or to the cloud:
 * an `eks` cluster is reached with the function's own IAM role (dispatched: a token its
 * dispatcher's role signed), a `token` cluster with a
 * ServiceAccount token the function reads from a secret store by the name given here. Its one
 * secret is `eventKey` ({@link EVENT_KEY_BYTES} random bytes, base64), the key of the cluster's
 * SQS deduplication ids (`dedupId` of `../transport/sqs.ts`), which `npm run cluster -- join`
 * writes here and into the forwarder's Secret: it grants nothing but spoiling the deduplication
 * of that cluster's events, which the functions' sender check and idempotence absorb.
 *
 * ```json
 * { "apiVersion": "kapp-lambda/v1", "kind": "Cluster", "id": "prod-eu-1",
 *   "endpoint": "https://ABC.gr7.eu-west-1.eks.amazonaws.com", "caData": "<base64 of PEM>",
 *   "auth": { "kind": "eks", "clusterName": "prod-eu-1", "region": "eu-west-1" },
 *   "forwarder": { "roleId": "AROAEXAMPLEID1234567" }, "eventKey": "<base64 of 32 random bytes>",
 *   "packagingGlobalNamespaceUid": "3f0c…" }
 * ```
 *
 * `packagingGlobalNamespaceUid` is the one record of who owns the cluster's packaging global
 * namespace: the `metadata.uid` join saw after applying the release, which created the namespace
 * (`../packaging/global-trust.ts` trusts that namespace's Packages only while its uid is this one).
 *
 * @module
 */
import * as z from 'zod';
import { PIPELINE_STAGES, type PipelineStage } from '../api/functions.js';
import { lazily } from '../api/lazy.js';

/** `apiVersion` of a cluster document. */
export const CLUSTER_DOC_API_VERSION = 'kapp-lambda/v1';

/** Key prefix of the cluster documents in the registry store. */
export const CLUSTER_DOC_PREFIX = 'clusters/';

/** Largest cluster document read, bytes (a CA bundle of a few certificates fits many times). */
export const MAX_CLUSTER_DOC_BYTES = 256 * 1024;

/** Length of a cluster's `eventKey`, bytes: 32 (HMAC-SHA256's block of security). */
export const EVENT_KEY_BYTES = 32;

/** Whether `s` is base64 of {@link EVENT_KEY_BYTES} bytes (a cluster's event key). */
export function isEventKey(s: string): boolean {
  return /^[A-Za-z0-9+/]+={0,2}$/.test(s) && Buffer.from(s, 'base64').length === EVENT_KEY_BYTES;
}

/** A Kubernetes object uid as the API server assigns it (a UUID; any case, as kubectl prints it). */
export const KUBE_UID_PATTERN = /^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$/;

/** A cluster id: a DNS-1123 label (as the events' `clusterId`). */
export const CLUSTER_ID_PATTERN = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** `clusters/<id>.json`. @throws TypeError for an id that is not a DNS-1123 label. */
export function clusterDocKey(clusterId: string): string {
  if (!CLUSTER_ID_PATTERN.test(clusterId)) throw new TypeError('cluster id must be a DNS-1123 label');
  return `${CLUSTER_DOC_PREFIX}${clusterId}.json`;
}

/**
 * An IAM role's unique id (`RoleId`, `AROA` + 12 or more upper-case letters and digits): what SQS
 * reports as the `SenderId` of a message sent with the role's credentials (`<role id>:<session>`).
 */
export const IAM_ROLE_ID_PATTERN = /^AROA[A-Z0-9]{12,124}$/;

/**
 * Builds the schema of a cluster document (strict: unknown fields are refused). Built on the
 * first document parsed ({@link clusterDocSchema}), not at import: a function serving the
 * clusters of a kubeconfig never reads one.
 */
function buildClusterDocSchema() {
  /**
   * A secret's name in the secret store: a Secrets Manager name or ARN, or a relative path in a
   * directory store. No `.`/`..` segment, no leading `/`.
   */
  const secretName = z
    .string()
    .regex(/^[A-Za-z0-9_+=.@:-][A-Za-z0-9/_+=.@:-]{0,2047}$/, { error: 'expected a secret name or ARN' })
    .refine((s) => !s.split('/').some((seg) => seg === '' || seg === '.' || seg === '..'), {
      error: 'expected no empty, "." or ".." segment',
    });

  /** Base64 of a PEM bundle of one or more certificates. */
  const caData = z
    .string()
    .regex(/^[A-Za-z0-9+/]+={0,2}$/, { error: 'expected base64' })
    .refine(
      (s) => {
        const pem = Buffer.from(s, 'base64').toString('utf8');
        return /^\s*(-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----\s*)+$/.test(pem);
      },
      { error: 'expected base64 of a PEM certificate bundle' },
    );

  const endpoint = z.string().refine(
    (s) => {
      try {
        const u = new URL(s);
        return (
          u.protocol === 'https:' && !u.username && !u.password && !u.search && !u.hash && /^\/?$/.test(u.pathname)
        );
      } catch {
        return false;
      }
    },
    { error: 'expected an https:// URL without path, query or credentials' },
  );

  /**
   * `eks`: the function's own IAM role (in the dispatched mode its dispatcher's, which signs each
   * run's token), mapped by an EKS access entry to its stage's group.
   */
  const EksAuth = z.strictObject({
    kind: z.literal('eks'),
    /** The EKS cluster name: signed into the token (`x-k8s-aws-id`). */
    clusterName: z.string().regex(/^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$/, { error: 'expected an EKS cluster name' }),
    /** Region of the STS endpoint the token is presigned for (the cluster's region). */
    region: z.string().regex(/^[a-z]{2}(-[a-z]+)+-\d$/, { error: 'expected an AWS region' }),
  });

  /** `token`: per stage, the name of a secret holding that stage's ServiceAccount token. */
  const TokenAuth = z.strictObject({
    kind: z.literal('token'),
    secrets: z.strictObject(Object.fromEntries(PIPELINE_STAGES.map((s) => [s, secretName.optional()]))),
  });

  /**
   * `forwarder`: the identity the cluster's forwarder sends its events with. The functions take an
   * event naming this cluster from a forwarder only when SQS says this role sent it
   * (`../entry/sender.ts`); without it, no forwarder may speak for the cluster.
   */
  const Forwarder = z.strictObject({
    /** The forwarder role's unique id (`aws iam get-role --query Role.RoleId`, the stack's `ForwarderRoleId<Id>`). */
    roleId: z.string().regex(IAM_ROLE_ID_PATTERN, { error: 'expected an IAM role id (AROA…)' }),
  });

  return z.strictObject({
    apiVersion: z.literal(CLUSTER_DOC_API_VERSION),
    kind: z.literal('Cluster'),
    id: z.string().regex(CLUSTER_ID_PATTERN, { error: 'expected a DNS-1123 label' }),
    endpoint,
    caData,
    /** `tls-server-name`: the name the API server's certificate is checked against, when not the endpoint's host. */
    tlsServerName: z
      .string()
      .regex(/^[A-Za-z0-9.-]{1,253}$/)
      .optional(),
    auth: z.discriminatedUnion('kind', [EksAuth, TokenAuth]),
    forwarder: Forwarder.optional(),
    /**
     * `eventKey`: base64 of {@link EVENT_KEY_BYTES} random bytes, the key of the SQS deduplication
     * ids of every event naming this cluster (`dedupId`, `../transport/sqs.ts`), known to the
     * functions (here) and to the cluster's forwarder (its Secret, written by join) only, so no
     * other cluster's forwarder can predict one and spend it first. Absent (a document from
     * before it, or `cluster add`): the event id is the deduplication id, as before.
     */
    eventKey: z
      .string()
      .refine(isEventKey, { error: `expected base64 of ${EVENT_KEY_BYTES} bytes` })
      .optional(),
    /**
     * `packagingGlobalNamespaceUid`: the `metadata.uid` of the packaging global namespace
     * (`kapp-controller-packaging-global`) that `npm run cluster -- join` saw after the release
     * created it (or, with `--adopt-global-namespace`, adopted it). The install function trusts
     * that namespace's Packages only while the live namespace has this uid: a namespace a tenant
     * created before the install, or deleted and created again since, has another. Absent (a
     * document from before it, or `cluster add` without `--packaging-global-namespace-uid`): the
     * global Packages are trusted unchecked, with a warning logged once per cluster and process.
     */
    packagingGlobalNamespaceUid: z
      .string()
      .regex(KUBE_UID_PATTERN, { error: 'expected a Kubernetes uid (a UUID)' })
      .optional(),
  });
}

/** The schema of a cluster document, built on first use (see {@link buildClusterDocSchema}). */
export const clusterDocSchema = lazily(buildClusterDocSchema);

/** How a stage authenticates to an EKS cluster. */
export interface EksClusterAuth {
  kind: 'eks';
  /** The EKS cluster name: signed into the token (`x-k8s-aws-id`). */
  clusterName: string;
  /** Region of the STS endpoint the token is presigned for (the cluster's region). */
  region: string;
}
/** How a stage authenticates with a ServiceAccount token; `secrets[stage]` names its secret. */
export interface TokenClusterAuth {
  kind: 'token';
  secrets: Partial<Record<PipelineStage, string>>;
}
/** A validated cluster document. */
export type ClusterDoc = Omit<z.infer<ReturnType<typeof buildClusterDocSchema>>, 'auth'> & {
  auth: EksClusterAuth | TokenClusterAuth;
};

/** A cluster document failed validation; `problems` are `<field path>: <problem>` (never values). */
export class InvalidClusterDocumentError extends Error {
  override readonly name = 'InvalidClusterDocumentError';
  constructor(
    /** The document's key. */
    readonly key: string,
    /** One `<path>: <problem>` per issue. */
    readonly problems: readonly string[],
  ) {
    super(`invalid cluster document ${key}: ${problems.join('; ')}`);
  }
}

/**
 * Parses and validates a cluster document.
 *
 * @param key - the document's key, `clusters/<id>.json`: its id must equal the document's `id`.
 * @param body - the document bytes (JSON).
 * @returns the document.
 * @throws InvalidClusterDocumentError naming each bad field (values are never quoted: a CA or a
 *   misplaced token stays out of logs).
 */
export function parseClusterDoc(key: string, body: Buffer | string): ClusterDoc {
  let raw: unknown;
  try {
    raw = JSON.parse(typeof body === 'string' ? body : body.toString('utf8'));
  } catch {
    throw new InvalidClusterDocumentError(key, ['not valid JSON']);
  }
  const r = clusterDocSchema().safeParse(raw);
  if (!r.success) {
    throw new InvalidClusterDocumentError(
      key,
      r.error.issues.map((i) => `${i.path.length ? i.path.join('.') : '(document)'}: ${i.message}`),
    );
  }
  if (key !== clusterDocKey(r.data.id)) throw new InvalidClusterDocumentError(key, ['id: does not match the key']);
  return r.data as ClusterDoc;
}

/** Where the registry's documents are: an S3 bucket and prefix, or a local directory. */
export type RegistryLocation = { kind: 's3'; bucket: string; prefix: string } | { kind: 'dir'; root: string };

/**
 * Parses `s3://<bucket>[/<prefix>]` or `file:///<absolute dir>` (the value of
 * `KAPP_LAMBDA_CLUSTER_REGISTRY` and of the `cluster` command's `--registry`).
 *
 * @throws TypeError `expected s3://bucket/prefix or file:///absolute/dir` otherwise.
 */
export function parseRegistryLocation(text: string): RegistryLocation {
  const bad = new TypeError('expected s3://bucket/prefix or file:///absolute/dir');
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw bad;
  }
  if (url.search || url.hash || url.username || url.password) throw bad;
  if (url.protocol === 's3:' && /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(url.hostname)) {
    const prefix = decodeURIComponent(url.pathname.replace(/^\/+/, ''));
    if (prefix !== '' && !/^[A-Za-z0-9._/-]+$/.test(prefix)) throw bad;
    return { kind: 's3', bucket: url.hostname, prefix: prefix === '' || prefix.endsWith('/') ? prefix : `${prefix}/` };
  }
  if (url.protocol === 'file:' && url.hostname === '' && url.pathname.startsWith('/')) {
    return { kind: 'dir', root: decodeURIComponent(url.pathname) };
  }
  throw bad;
}
