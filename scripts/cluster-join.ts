/**
 * `npm run cluster -- join <kubeconfig-context> --id <cluster-id> --fleet <outputs.json> …`:
 * everything a cluster needs to join a fleet, from the operator's machine, in one command.
 *
 * Cluster side (kubectl with argv arrays, `--context <context>`, server-side apply): the release
 * (`release/kapp-lambda-<version>.yml`: CRDs, namespaces, forwarder, RBAC), the RBAC of the
 * functions' identities ({@link rbacManifests}, with the token identities for `--auth token`)
 * and the forwarder's fleet ConfigMap (`kapp-lambda/kapp-lambda-forwarder-fleet`: the cluster
 * id, the region and the three entry queue URLs, which the release leaves out), preceded by the
 * Secret of the cluster's new event key (`kapp-lambda/kapp-lambda-forwarder-event-key`).
 * Fleet side: the registry document (`<prefix>clusters/<id>.json`, endpoint and CA read from
 * the context, and the same event key: the key of the SQS deduplication ids of the cluster's
 * events, `dedupId` of `functions/lib/transport/sqs.ts`). Cloud side: the cluster's own forwarder role, created with the AWS SDK (IAM
 * CreateRole with the EKS Pod Identity trust of that one cluster's forwarder ServiceAccount, and
 * AttachRolePolicy of the stack's `ForwarderPolicyArn`), its unique id recorded in the document;
 * the EKS access entries and the Pod Identity association are printed as exact `aws` commands.
 *
 * Why a role per cluster made here and not in the stack: the functions take an event naming a
 * cluster only from the role the cluster's document names (`functions/lib/entry/sender.ts`), so
 * each cluster needs its own role; created by the stack (context `forwarders`, the old way) each
 * join was a stack change and two outputs (CloudFormation allows 200). Made here, a join is a
 * data change: the registry document and an IAM role; the template stays the same for any
 * number of clusters. The role's permissions are the stack's one managed policy.
 *
 * `--print-only` calls no AWS API: it prints the IAM commands too; the document is written when
 * `--forwarder-role-id` names the role made from them (else join says to re-run with it).
 * `--auth token` clusters (not EKS, so no Pod Identity) get no role created: their trust (IRSA
 * of the cluster's OIDC provider, another account) is the operator's; join prints the commands
 * with a trust placeholder and needs `--forwarder-role-id` (or `--no-sender-check`) to register.
 *
 * The packaging global namespace (`kapp-controller-packaging-global`, which the release creates)
 * is checked before the release is applied and recorded after: join refuses a namespace that
 * exists already and is not the one the cluster's document records ({@link globalNamespaceRefusal};
 * `kubectl apply` would adopt it silently, with its creator's RoleBindings inside), unless
 * `--adopt-global-namespace`; the uid it has after the apply goes into the document
 * (`packagingGlobalNamespaceUid`), and the install function trusts the namespace's Packages only
 * while the live namespace has that uid (`functions/lib/packaging/global-trust.ts`).
 *
 * IAM is reached with the SDK's default credentials; `KAPP_LAMBDA_IAM_ENDPOINT` points it at
 * another endpoint (tests: moto's server), as `KAPP_LAMBDA_S3_ENDPOINT` does for the registry.
 *
 * @module
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import {
  AttachRolePolicyCommand,
  CreateRoleCommand,
  DeleteRoleCommand,
  DetachRolePolicyCommand,
  EntityAlreadyExistsException,
  GetRoleCommand,
  IAMClient,
  ListAttachedRolePoliciesCommand,
  NoSuchEntityException,
  UpdateAssumeRolePolicyCommand,
} from '@aws-sdk/client-iam';
import { KubeConfig } from '@kubernetes/client-node';
import { stringify } from 'yaml';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../functions/lib/api/constants.js';
import { PIPELINE_STAGES, type PipelineStage } from '../functions/lib/api/functions.js';
import {
  CLUSTER_ID_PATTERN,
  type ClusterDoc,
  clusterDocKey,
  EVENT_KEY_BYTES,
  IAM_ROLE_ID_PATTERN,
  isEventKey,
} from '../functions/lib/kube/cluster-doc.js';
import type { ObjectStore } from '../functions/lib/store/port.js';
import { FORWARDER_SERVICE_ACCOUNT, podIdentityTrust } from '../infra/aws/stages.js';
import { EXIT, exitCodesHelp, isUsageError, usageFailure } from './cli.js';
import {
  type AddInput,
  clusterDocOf,
  clusterNamingForwarder,
  identitySteps,
  putCluster,
  rbacManifests,
  recordedClusterDoc,
  registryStore,
} from './cluster-registry.js';
import {
  FORWARDER_DEPLOYMENT,
  FORWARDER_EVENT_KEY_SECRET,
  FORWARDER_FLEET_CONFIGMAP,
  packageVersion,
  RELEASE_DIR,
  RELEASE_NAMESPACE,
  releaseFileName,
} from './release.js';

/** The entry queues a forwarder sends to, by the stack's output suffix. */
const ENTRY_QUEUES = { fetch: 'Fetch', install: 'Install', 'index-repo': 'IndexRepo' } as const;

/**
 * What `join` needs of the fleet: the stack's fleet-wide outputs. `functionRoles` may be empty
 * (the access entries then name placeholders).
 */
export interface FleetOutputs {
  /** The fleet's region (output `Region`): the forwarder's `AWS_REGION`. */
  region: string;
  /** Output `QueueUrl<Stage>` of the three entry queues. */
  queueUrls: Record<keyof typeof ENTRY_QUEUES, string>;
  /** Output `ForwarderPolicyArn` (`arn:<partition>:iam::<account>:policy/…`). */
  forwarderPolicyArn: string;
  /** Output `FunctionRoleArn<Stage>`, per function. */
  functionRoles: Partial<Record<PipelineStage, string>>;
}

/** `index-repo` → `IndexRepo`, as the stack names its outputs. */
const pascal = (s: string) => s.replace(/(^|-)([a-z])/g, (_, __, c: string) => c.toUpperCase());

/**
 * The stack's outputs as {@link FleetOutputs}, from any of the forms the tools print: `cdk deploy
 * --outputs-file` (`{"<stack>": {"<key>": "<value>"}}`, the only stack), a flat `{"<key>": "<value>"}`,
 * or `aws cloudformation describe-stacks --query Stacks[0].Outputs` (`[{OutputKey, OutputValue}]`).
 *
 * @throws Error naming the missing outputs (a stack before `ForwarderPolicyArn`, or `isolation: cell`).
 */
export function parseFleetOutputs(text: string): FleetOutputs {
  const raw = JSON.parse(text) as unknown;
  let flat: Record<string, unknown>;
  if (Array.isArray(raw)) {
    flat = Object.fromEntries(
      (raw as { OutputKey?: string; OutputValue?: string }[]).map((o) => [o.OutputKey, o.OutputValue]),
    );
  } else if (raw && typeof raw === 'object') {
    const values = Object.values(raw);
    flat =
      values.length === 1 && values[0] && typeof values[0] === 'object'
        ? (values[0] as Record<string, unknown>)
        : (raw as Record<string, unknown>);
  } else throw new Error('the fleet outputs are not a JSON object or array');
  const str = (k: string) => (typeof flat[k] === 'string' && flat[k] !== '' ? (flat[k] as string) : undefined);
  const needed = ['Region', 'ForwarderPolicyArn', ...Object.values(ENTRY_QUEUES).map((q) => `QueueUrl${q}`)];
  const missing = needed.filter((k) => !str(k));
  if (missing.length > 0) {
    throw new Error(
      `the fleet outputs lack ${missing.join(', ')} (a stack deployed before cluster join, or isolation: cell, whose clusters join through context forwarders)`,
    );
  }
  const functionRoles: Partial<Record<PipelineStage, string>> = {};
  for (const s of PIPELINE_STAGES) {
    const arn = str(`FunctionRoleArn${pascal(s)}`);
    if (arn) functionRoles[s] = arn;
  }
  return {
    region: str('Region') as string,
    queueUrls: Object.fromEntries(
      Object.entries(ENTRY_QUEUES).map(([s, q]) => [s, str(`QueueUrl${q}`) as string]),
    ) as FleetOutputs['queueUrls'],
    forwarderPolicyArn: str('ForwarderPolicyArn') as string,
    functionRoles,
  };
}

/** The partition and account of an IAM ARN (`arn:<partition>:iam::<account>:…`). */
export function arnAccount(arn: string): { partition: string; account: string } {
  const m = /^arn:(aws[a-z-]*):iam::(\d{12}):/.exec(arn);
  if (!m) throw new Error(`${arn} is not an IAM ARN of an account`);
  return { partition: m[1] as string, account: m[2] as string };
}

/** Path of the roles `join` creates: `remove --delete-role` deletes only roles under it. */
export const FORWARDER_ROLE_PATH = '/kapp-lambda/';

/**
 * The name of cluster `id`'s forwarder role: `kapp-lambda-forwarder-<id>`, or for ids that
 * would pass IAM's 64 characters, the id's first 33 characters, `_` and 8 hex of its SHA-256.
 * The `_` (allowed in IAM names, never in a cluster id, a DNS label) keeps a hashed name from
 * being the plain name of another, shorter id: one id per name both ways.
 */
export function forwarderRoleName(id: string): string {
  const name = `kapp-lambda-forwarder-${id}`;
  if (name.length <= 64) return name;
  return `kapp-lambda-forwarder-${id.slice(0, 33)}_${createHash('sha256').update(id).digest('hex').slice(0, 8)}`;
}

/** The tag naming the cluster id a forwarder role was made for; `join --replace` reuses only a role tagged with its id. */
export const FORWARDER_ROLE_CLUSTER_TAG = 'kapp-lambda.carvel.dev/cluster';

/** `arn:<partition>:eks:<region>:<account>:cluster/<name>`: the `eks-cluster-arn` session tag. */
export function eksClusterArn(partition: string, region: string, account: string, name: string): string {
  return `arn:${partition}:eks:${region}:${account}:cluster/${name}`;
}

/**
 * The trust policy of a forwarder role on EKS, as the stack's `podIdentityForwarder` makes it:
 * one statement of {@link podIdentityTrust} (Pod Identity of this account, for the forwarder's
 * ServiceAccount in that one cluster only), so an association of another cluster or
 * ServiceAccount with the role gets no credentials.
 */
export function forwarderTrustPolicy(account: string, clusterArn: string): Record<string, unknown> {
  const trust = podIdentityTrust(account, clusterArn);
  return {
    Version: '2012-10-17',
    Statement: [
      {
        Effect: 'Allow',
        Principal: { Service: trust.service },
        Action: [...trust.actions],
        Condition: trust.conditions,
      },
    ],
  };
}

/** The IAM client of `join` and `remove --delete-role` (`KAPP_LAMBDA_IAM_ENDPOINT`: another endpoint). */
export function iamClient(env: NodeJS.ProcessEnv = process.env): IAMClient {
  const endpoint = env.KAPP_LAMBDA_IAM_ENDPOINT;
  return new IAMClient({ region: env.AWS_REGION ?? 'us-east-1', ...(endpoint ? { endpoint } : {}) });
}

/**
 * Creates cluster `id`'s forwarder role ({@link forwarderRoleName}, under {@link FORWARDER_ROLE_PATH})
 * with `trust`, tagged {@link FORWARDER_ROLE_CLUSTER_TAG} = `id`, and attaches the fleet's
 * forwarder policy. With `reuse` (`join --replace`) a role of that name join made before for
 * this same id (path and tag) is kept (its trust set again).
 *
 * @returns the role's unique id (`AROA…`), what the document names
 * @throws the SDK's error (e.g. `EntityAlreadyExistsException` for a role already there); Error
 *   when the role to reuse is not under the path or not tagged with `id`
 */
export async function createForwarderRole(
  iam: IAMClient,
  id: string,
  trust: Record<string, unknown>,
  policyArn: string,
  reuse = false,
): Promise<{ roleId: string; arn: string }> {
  const RoleName = forwarderRoleName(id);
  let role: { RoleId?: string; Arn?: string; Path?: string; Tags?: { Key?: string; Value?: string }[] } | undefined;
  try {
    role = (
      await iam.send(
        new CreateRoleCommand({
          RoleName,
          Path: FORWARDER_ROLE_PATH,
          AssumeRolePolicyDocument: JSON.stringify(trust),
          Description: `kapp-lambda forwarder of cluster ${id}: sends its object events to the entry queues`,
          Tags: [{ Key: FORWARDER_ROLE_CLUSTER_TAG, Value: id }],
        }),
      )
    ).Role;
  } catch (err) {
    if (!(reuse && err instanceof EntityAlreadyExistsException)) throw err;
    // `join --replace` of a cluster that joined before: its role stays (same id, same document),
    // its trust is set again (the cluster name may have changed). Only a role tagged with this
    // very id: retrusting another cluster's role would hand its credentials to this one.
    role = (await iam.send(new GetRoleCommand({ RoleName }))).Role;
    if (role?.Path !== FORWARDER_ROLE_PATH) throw new Error(`role ${RoleName} exists and was not made by join`);
    const tagged = role.Tags?.find((t) => t.Key === FORWARDER_ROLE_CLUSTER_TAG)?.Value;
    if (tagged !== id) {
      throw new Error(
        `role ${RoleName} was made for cluster ${tagged ?? '(untagged)'}, not ${id}: left in place (tag it ${FORWARDER_ROLE_CLUSTER_TAG}=${id} to reuse it)`,
      );
    }
    await iam.send(new UpdateAssumeRolePolicyCommand({ RoleName, PolicyDocument: JSON.stringify(trust) }));
  }
  await iam.send(new AttachRolePolicyCommand({ RoleName, PolicyArn: policyArn }));
  if (!role?.RoleId || !role.Arn) throw new Error(`IAM CreateRole ${RoleName} answered no role id`);
  return { roleId: role.RoleId, arn: role.Arn };
}

/**
 * Deletes the forwarder role `join` created for cluster `id` (its policies detached first), only
 * when its unique id is `roleId` (the one the document names) and it is under
 * {@link FORWARDER_ROLE_PATH}: a role of that name made otherwise is left alone.
 *
 * @returns false when there is no such role
 * @throws Error when the role there is another one
 */
export async function deleteForwarderRole(iam: IAMClient, id: string, roleId: string): Promise<boolean> {
  const RoleName = forwarderRoleName(id);
  let role: { RoleId?: string; Path?: string } | undefined;
  try {
    role = (await iam.send(new GetRoleCommand({ RoleName }))).Role;
  } catch (err) {
    if (err instanceof NoSuchEntityException) return false;
    throw err;
  }
  if (role?.RoleId !== roleId || role.Path !== FORWARDER_ROLE_PATH) {
    throw new Error(
      `role ${RoleName} (${role?.RoleId}) is not the forwarder role ${roleId} join created for ${id}: left in place`,
    );
  }
  const attached = await iam.send(new ListAttachedRolePoliciesCommand({ RoleName }));
  for (const p of attached.AttachedPolicies ?? []) {
    await iam.send(new DetachRolePolicyCommand({ RoleName, PolicyArn: p.PolicyArn }));
  }
  await iam.send(new DeleteRoleCommand({ RoleName }));
  return true;
}

/** The API server a kubeconfig context points at (what the registry document records). */
export interface ContextCluster {
  endpoint: string;
  /** PEM bundle of its CA. */
  caPem: string;
  tlsServerName?: string;
}

/**
 * The endpoint and CA of `context` in a kubeconfig (`kubeconfig` a path; default `$KUBECONFIG`
 * or `~/.kube/config`, as kubectl).
 *
 * @throws Error when the context is unknown or its cluster has no CA (the functions verify TLS;
 *   `insecure-skip-tls-verify` clusters cannot be registered)
 */
export async function contextCluster(context: string, kubeconfig?: string): Promise<ContextCluster> {
  const kc = new KubeConfig();
  if (kubeconfig) kc.loadFromFile(kubeconfig);
  else kc.loadFromDefault();
  const ctx = kc.getContextObject(context);
  if (!ctx) throw new Error(`no context ${JSON.stringify(context)} in the kubeconfig`);
  const cluster = kc.getCluster(ctx.cluster);
  if (!cluster) throw new Error(`context ${context}: no cluster ${JSON.stringify(ctx.cluster)} in the kubeconfig`);
  const caPem = cluster.caData
    ? Buffer.from(cluster.caData, 'base64').toString('utf8')
    : cluster.caFile
      ? await readFile(cluster.caFile, 'utf8')
      : undefined;
  if (!caPem) throw new Error(`context ${context}: its cluster names no CA (certificate-authority-data or -file)`);
  return {
    endpoint: cluster.server,
    caPem,
    ...(cluster.tlsServerName ? { tlsServerName: cluster.tlsServerName } : {}),
  };
}

/** The forwarder's fleet ConfigMap of cluster `id` (the settings the release leaves out). */
export function fleetConfigMap(id: string, fleet: FleetOutputs): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: FORWARDER_FLEET_CONFIGMAP, namespace: RELEASE_NAMESPACE },
    data: {
      FORWARDER_CLUSTER_ID: id,
      AWS_REGION: fleet.region,
      KAPP_LAMBDA_QUEUE_URL_FETCH: fleet.queueUrls.fetch,
      KAPP_LAMBDA_QUEUE_URL_INSTALL: fleet.queueUrls.install,
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: fleet.queueUrls['index-repo'],
    },
  };
}

/**
 * The Secret of cluster `id`'s forwarder holding its event key ({@link FORWARDER_EVENT_KEY_SECRET}:
 * `FORWARDER_EVENT_KEY`, the registry document's `eventKey`). Applied through kubectl's stdin,
 * never its argv, and never printed.
 */
export function eventKeySecret(eventKey: string): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: FORWARDER_EVENT_KEY_SECRET, namespace: RELEASE_NAMESPACE },
    type: 'Opaque',
    stringData: { FORWARDER_EVENT_KEY: eventKey },
  };
}

/** A new cluster event key: base64 of {@link EVENT_KEY_BYTES} random bytes. */
export function newEventKey(): string {
  return randomBytes(EVENT_KEY_BYTES).toString('base64');
}

/** Options of {@link writeJoinDocument}. */
export interface WriteDocumentOptions {
  /** Overwrite a document already there. Default false. */
  replace?: boolean;
  /**
   * Refuse a forwarder role id another cluster's document names (a role the operator gave;
   * a role join just created is new, so the scan of every document is skipped). Default true.
   */
  checkForwarder?: boolean;
}

/** {@link writeJoinDocument} refused: `code` is the exit code (1 registered, 2 a role another cluster names). */
export class JoinRefusedError extends Error {
  constructor(
    message: string,
    readonly code: number,
  ) {
    super(message);
  }
}

/**
 * The registry half of `join` (and what the 1,000-cluster infra test calls): validates the
 * document and writes it, refusing an id already registered unless `replace`.
 *
 * @returns the document's key
 * @throws JoinRefusedError as above; InvalidClusterDocumentError for a bad field
 */
export async function writeJoinDocument(
  store: ObjectStore,
  input: AddInput,
  options: WriteDocumentOptions = {},
): Promise<{ key: string; doc: ClusterDoc }> {
  const doc = clusterDocOf(input);
  if (!options.replace && (await store.head(clusterDocKey(input.id)))) {
    throw new JoinRefusedError(`${JSON.stringify(input.id)} is already registered; add --replace to overwrite it`, 1);
  }
  if (input.forwarderRoleId && options.checkForwarder !== false) {
    const other = await clusterNamingForwarder(store, input.forwarderRoleId, input.id);
    if (other !== undefined) {
      throw new JoinRefusedError(
        `--forwarder-role-id ${input.forwarderRoleId} is already the forwarder of cluster ${JSON.stringify(other)}: each cluster needs its own forwarder role`,
        2,
      );
    }
  }
  return { key: await putCluster(store, doc), doc };
}

/** One step of a join, in order: what it does, and where. */
export interface JoinStep {
  /**
   * `release`, `rbac`, `fleet-config`: kubectl apply against the context; `create-role`: IAM
   * through the SDK; `document`: the registry; `print`: a command for the operator (on stdout).
   */
  readonly action: 'release' | 'rbac' | 'fleet-config' | 'create-role' | 'document' | 'print';
  /** One line saying what (for `print`, the command itself). */
  readonly text: string;
}

/** The settled choices of a join ({@link joinPlan}'s input). */
export interface JoinSettings {
  id: string;
  context: string;
  auth: AddInput['auth'];
  fleet: FleetOutputs;
  /** A role the operator made (none: join creates one, for eks auth without print-only). */
  forwarderRoleId?: string;
  printOnly: boolean;
  noSenderCheck: boolean;
}

/** A command line as the operator pastes it: each argument single-quoted when it needs to be. */
function shellLine(argv: readonly string[]): string {
  return argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replaceAll("'", `'\\''`)}'`)).join(' ');
}

/** The trust placeholder printed for a token cluster's forwarder role. */
const TRUST_PLACEHOLDER = 'file://forwarder-trust.json';

/**
 * The steps of a join, in order (pure: `join` performs them, the unit tests read them): the
 * cluster-side applies, the forwarder role (created, or its commands printed), the registry
 * document (when a role id is known or `--no-sender-check`), and the EKS commands printed.
 */
export function joinPlan(s: JoinSettings): JoinStep[] {
  const steps: JoinStep[] = [
    { action: 'release', text: `apply the release to context ${s.context}` },
    {
      action: 'rbac',
      text: `apply the functions' RBAC${s.auth.kind === 'token' ? ' and their token identities' : ''}`,
    },
    {
      action: 'fleet-config',
      text: `apply Secret ${RELEASE_NAMESPACE}/${FORWARDER_EVENT_KEY_SECRET} (the cluster's event key: a new one unless the document has one) and ConfigMap ${RELEASE_NAMESPACE}/${FORWARDER_FLEET_CONFIGMAP} (FORWARDER_CLUSTER_ID=${s.id})`,
    },
  ];
  const { partition, account } = arnAccount(s.fleet.forwarderPolicyArn);
  const roleName = forwarderRoleName(s.id);
  const createRole = !s.forwarderRoleId && !s.noSenderCheck;
  if (createRole && s.auth.kind === 'eks' && !s.printOnly) {
    steps.push({ action: 'create-role', text: `create role ${roleName}, attach ${s.fleet.forwarderPolicyArn}` });
  } else if (createRole) {
    const trust =
      s.auth.kind === 'eks'
        ? JSON.stringify(
            forwarderTrustPolicy(account, eksClusterArn(partition, s.auth.region, account, s.auth.clusterName)),
          )
        : TRUST_PLACEHOLDER;
    steps.push(
      ...(s.auth.kind === 'token'
        ? [
            {
              action: 'print' as const,
              text: `# forwarder-trust.json: who may assume the role, that one cluster's ${FORWARDER_SERVICE_ACCOUNT.namespace}/${FORWARDER_SERVICE_ACCOUNT.name} only (e.g. IRSA of its OIDC provider)`,
            },
          ]
        : []),
      {
        action: 'print',
        text: shellLine([
          'aws',
          'iam',
          'create-role',
          '--role-name',
          roleName,
          '--path',
          FORWARDER_ROLE_PATH,
          '--assume-role-policy-document',
          trust,
          '--tags',
          `Key=${FORWARDER_ROLE_CLUSTER_TAG},Value=${s.id}`,
        ]),
      },
      {
        action: 'print',
        text: shellLine([
          'aws',
          'iam',
          'attach-role-policy',
          '--role-name',
          roleName,
          '--policy-arn',
          s.fleet.forwarderPolicyArn,
        ]),
      },
      {
        action: 'print',
        text: `# then register the cluster: npm run cluster -- join ${shellLine([s.context])} --id ${s.id} … --replace --forwarder-role-id $(aws iam get-role --role-name ${roleName} --query Role.RoleId --output text)`,
      },
    );
  }
  if (!createRole || (s.auth.kind === 'eks' && !s.printOnly)) {
    steps.push({ action: 'document', text: `write ${clusterDocKey(s.id)}` });
  }
  if (s.auth.kind === 'eks') {
    const roleArn = `arn:${partition}:iam::${account}:role${FORWARDER_ROLE_PATH}${roleName}`;
    steps.push({
      action: 'print',
      text: shellLine([
        'aws',
        'eks',
        'create-pod-identity-association',
        '--region',
        s.auth.region,
        '--cluster-name',
        s.auth.clusterName,
        '--namespace',
        FORWARDER_SERVICE_ACCOUNT.namespace,
        '--service-account',
        FORWARDER_SERVICE_ACCOUNT.name,
        '--role-arn',
        s.forwarderRoleId ? '<the forwarder role ARN>' : roleArn,
      ]),
    });
  }
  return steps;
}

/**
 * Runs kubectl with argv (no shell) and `input` on stdin.
 *
 * @returns its stdout
 * @throws Error with its stderr on a non-zero exit
 */
function runKubectl(kubectl: string, args: string[], input: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(kubectl, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.on('error', reject);
    child.on('close', (code) =>
      code === 0 ? resolve(stdout) : reject(new Error(`kubectl ${args.join(' ')} exited ${code}: ${stderr.trim()}`)),
    );
    child.stdin.end(input);
  });
}

/** The flag that adopts a packaging global namespace that existed before the join. */
export const ADOPT_GLOBAL_NAMESPACE_FLAG = '--adopt-global-namespace';

/**
 * Whether join may apply the release onto the packaging global namespace as it is: the refusal
 * to print, or `undefined` to go on. `kubectl apply` silently adopts a namespace that exists, with
 * whatever RoleBindings a tenant who created it put inside, and a label proves nothing (anyone
 * who creates the namespace sets it), so the only namespace join accepts is one that does not
 * exist yet (the release creates it) or the one the cluster's document already records (a
 * `--replace` of a cluster joined with this check); any other needs
 * {@link ADOPT_GLOBAL_NAMESPACE_FLAG}, the admin's word that it is the cluster's own.
 *
 * @param existingUid - the namespace's uid before the release is applied; `undefined`: absent
 * @param recordedUid - the uid the cluster's registry document records (`--replace`); `undefined`: none
 */
export function globalNamespaceRefusal(
  existingUid: string | undefined,
  recordedUid: string | undefined,
  adopt: boolean,
): string | undefined {
  if (existingUid === undefined || adopt) return undefined;
  if (recordedUid !== undefined && recordedUid.toLowerCase() === existingUid.toLowerCase()) return undefined;
  const ns = DEFAULT_PACKAGING_GLOBAL_NAMESPACE;
  return `namespace ${ns} exists already (uid ${existingUid}) and is not the one ${recordedUid === undefined ? 'the release created for this cluster' : `this cluster's document records (uid ${recordedUid})`}: whoever created it may write the Packages every PackageInstall of the cluster can select. Check who did and who may write it (kubectl get rolebindings,roles -n ${ns}; kubectl get namespace ${ns} -o yaml), then re-run with ${ADOPT_GLOBAL_NAMESPACE_FLAG} to record it as the cluster's own, or delete it so that the release creates it`;
}

const USAGE = `usage:
  npm run cluster -- join <kubeconfig-context> --id <cluster-id> --fleet <outputs.json> [--replace]
      --auth eks --eks-cluster-name <name> (region: the fleet's)
    | --auth token [--secret-prefix <prefix>] (--forwarder-role-id <AROA…> | --no-sender-check)
    [--forwarder-role-id <AROA…>] (a role you made: join creates none)
    [--print-only] (call no AWS API: print the IAM commands; the document is written with --forwarder-role-id)
    [--release <file>] (default release/kapp-lambda-<version>.yml) [--kubeconfig <file>] [--kubectl <path>]
    [${ADOPT_GLOBAL_NAMESPACE_FLAG}] (record a ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE} that existed before the
      release, after checking it is the cluster's own; without it join refuses such a namespace)
    --registry s3://<bucket>/<prefix> | file:///<dir> (default $KAPP_LAMBDA_CLUSTER_REGISTRY)
  --fleet: the stack's outputs as cdk deploy --outputs-file writes them, or as
    aws cloudformation describe-stacks --query Stacks[0].Outputs prints them
  IAM: the SDK's default credentials; KAPP_LAMBDA_IAM_ENDPOINT for another endpoint
${exitCodesHelp('an id already registered without --replace, a global namespace that existed before (without --adopt-global-namespace), kubectl or IAM failing, the registry unreachable')}`;

/** The join command line's options (strict). */
function parseJoinArgs(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      id: { type: 'string' },
      fleet: { type: 'string' },
      registry: { type: 'string' },
      auth: { type: 'string' },
      'eks-cluster-name': { type: 'string' },
      'secret-prefix': { type: 'string' },
      'forwarder-role-id': { type: 'string' },
      'no-sender-check': { type: 'boolean' },
      'print-only': { type: 'boolean' },
      release: { type: 'string' },
      kubeconfig: { type: 'string' },
      kubectl: { type: 'string' },
      replace: { type: 'boolean' },
      'adopt-global-namespace': { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

/** The parsed options of the join command line. */
type JoinValues = ReturnType<typeof parseJoinArgs>['values'];

/**
 * The join's settings from its command line, or the usage problem.
 *
 * @param readFleet - reads and parses `--fleet` (tests pass outputs)
 */
export async function joinSettings(
  argv: string[],
  readFleet: (file: string) => Promise<FleetOutputs>,
): Promise<{ settings: JoinSettings; values: JoinValues } | { problem: string } | { help: true }> {
  const { values: v, positionals } = parseJoinArgs(argv);
  if (v.help) return { help: true };
  const [command, context, ...extra] = positionals;
  if (command !== 'join') return { problem: 'not a join command line' };
  if (!context) return { problem: 'join needs the kubeconfig context of the cluster' };
  if (extra.length > 0) return { problem: `unexpected argument ${JSON.stringify(extra[0])}` };
  if (!v.id || !CLUSTER_ID_PATTERN.test(v.id)) return { problem: '--id expects the cluster id (a DNS-1123 label)' };
  if (!v.fleet) return { problem: "join needs --fleet <file> (the stack's outputs)" };
  const roleId = v['forwarder-role-id'];
  if (roleId !== undefined && !IAM_ROLE_ID_PATTERN.test(roleId)) {
    return { problem: '--forwarder-role-id expects an IAM role id (AROA…, aws iam get-role --query Role.RoleId)' };
  }
  if (roleId !== undefined && v['no-sender-check']) {
    return { problem: '--forwarder-role-id and --no-sender-check exclude each other' };
  }
  const fleet = await readFleet(v.fleet);
  let auth: AddInput['auth'];
  if (v.auth === 'eks') {
    if (!v['eks-cluster-name']) return { problem: '--auth eks needs --eks-cluster-name' };
    auth = { kind: 'eks', clusterName: v['eks-cluster-name'], region: fleet.region };
  } else if (v.auth === 'token') {
    auth = { kind: 'token', ...(v['secret-prefix'] ? { secretPrefix: v['secret-prefix'] } : {}) };
  } else return { problem: '--auth must be eks or token' };
  return {
    values: v,
    settings: {
      id: v.id,
      context,
      auth,
      fleet,
      ...(roleId ? { forwarderRoleId: roleId } : {}),
      printOnly: Boolean(v['print-only']),
      noSenderCheck: Boolean(v['no-sender-check']),
    },
  };
}

/**
 * Runs `npm run cluster -- join …` ({@link USAGE}): performs the plan's steps in order, printing
 * the `print` ones on stdout and what it did on stderr.
 *
 * @returns the exit code: 0 joined (or printed), 1 an id already registered without `--replace`
 *   or a packaging global namespace that existed before and is not recorded (without
 *   `--adopt-global-namespace`), 2 a usage error or a `--forwarder-role-id` another cluster names (both checked before
 *   anything changes)
 * @throws Error when kubectl, IAM or the registry fails (exit 1 through `runIfEntry`)
 */
export async function joinMain(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const err = (t: string) => process.stderr.write(t);
  const usage = (problem: string): number => usageFailure('cluster join', USAGE, problem, err);
  let parsed: Awaited<ReturnType<typeof joinSettings>>;
  try {
    parsed = await joinSettings(argv, async (file) => parseFleetOutputs(await readFile(file, 'utf8')));
  } catch (e) {
    if (!isUsageError(e)) throw e;
    return usage(e.message);
  }
  if ('help' in parsed) {
    process.stdout.write(USAGE);
    return EXIT.ok;
  }
  if ('problem' in parsed) return usage(parsed.problem);
  const { settings: s, values: v } = parsed;
  const location = v.registry ?? env.KAPP_LAMBDA_CLUSTER_REGISTRY;
  if (!location) return usage('--registry (or KAPP_LAMBDA_CLUSTER_REGISTRY) is required');
  const store = registryStore(location, env);
  // Refused before anything changes: a typo in an id must not repoint another cluster.
  if (!v.replace && (await store.head(clusterDocKey(s.id)))) {
    err(`cluster: ${JSON.stringify(s.id)} is already registered; add --replace to overwrite it\n`);
    return EXIT.failure;
  }
  const other = s.forwarderRoleId ? await clusterNamingForwarder(store, s.forwarderRoleId, s.id) : undefined;
  if (other !== undefined) {
    err(
      `cluster: --forwarder-role-id ${s.forwarderRoleId} is already the forwarder of cluster ${JSON.stringify(other)}: each cluster needs its own forwarder role\n`,
    );
    return EXIT.usage;
  }
  const target = await contextCluster(s.context, v.kubeconfig);
  const kubectl = v.kubectl ?? env.KUBECTL ?? 'kubectl';
  const kubeArgs = [...(v.kubeconfig ? ['--kubeconfig', v.kubeconfig] : []), '--context', s.context];
  // The packaging global namespace's uid now (empty: absent), read before and after the release.
  const globalUidNow = async () =>
    (
      await runKubectl(
        kubectl,
        [
          ...kubeArgs,
          'get',
          'namespace',
          DEFAULT_PACKAGING_GLOBAL_NAMESPACE,
          '--ignore-not-found',
          '-o',
          'jsonpath={.metadata.uid}',
        ],
        '',
      )
    ).trim() || undefined;
  const existingGlobalUid = await globalUidNow();
  // What a re-join replaces: its global namespace uid is checked, its event key kept.
  const recorded = v.replace ? await recordedClusterDoc(store, s.id) : undefined;
  const refusal = globalNamespaceRefusal(
    existingGlobalUid,
    recorded?.packagingGlobalNamespaceUid,
    Boolean(v['adopt-global-namespace']),
  );
  if (refusal) {
    err(`cluster: ${refusal}\n`);
    return EXIT.failure;
  }
  let globalUid: string | undefined;
  const apply = (docs: string) =>
    runKubectl(
      kubectl,
      [...kubeArgs, 'apply', '--server-side', '--force-conflicts', '--field-manager', 'kapp-lambda-join', '-f', '-'],
      docs,
    );
  const release = v.release ?? path.join(RELEASE_DIR, releaseFileName(await packageVersion()));
  let roleId = s.forwarderRoleId;
  // The cluster's event key: into the forwarder's Secret (before the fleet ConfigMap, which
  // starts the forwarder) and the registry document. The functions take an object's events only
  // in the message group its key gives (`messageGroupId`), so a running forwarder must hold the
  // document's key: a join keeps the document's key, else the Secret's, else makes one, and
  // restarts a forwarder that holds another.
  // The key the cluster's forwarder Secret holds now (a join that failed after writing it, or a
  // cluster removed and joined again, left one), and whether a forwarder runs already.
  const kubeRead = async (args: string[]) =>
    (
      await runKubectl(kubectl, [...kubeArgs, '-n', RELEASE_NAMESPACE, 'get', ...args, '--ignore-not-found'], '')
    ).trim();
  const [secretData, deployed] = await Promise.all([
    kubeRead(['secret', FORWARDER_EVENT_KEY_SECRET, '-o', 'jsonpath={.data.FORWARDER_EVENT_KEY}']),
    kubeRead([`deployment/${FORWARDER_DEPLOYMENT}`, '-o', 'name']),
  ]);
  const secretKey = secretData ? Buffer.from(secretData, 'base64').toString('utf8') : undefined;
  const eventKey = recorded?.eventKey ?? (secretKey && isEventKey(secretKey) ? secretKey : newEventKey());
  // A running forwarder read its key when it started: one that holds another (or none) is
  // restarted once the document names the new key (before that, its keyed events would be refused).
  const restartForwarder = deployed !== '' && secretKey !== eventKey;
  for (const step of joinPlan(s)) {
    if (step.action === 'print') {
      process.stdout.write(`${step.text}\n`);
      continue;
    }
    err(`${step.text}\n`);
    if (step.action === 'release') {
      await apply(await readFile(release, 'utf8'));
      globalUid = await globalUidNow();
      if (existingGlobalUid !== undefined && globalUid !== existingGlobalUid) {
        throw new Error(
          `namespace ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE} was replaced while join applied the release (uid ${existingGlobalUid}, now ${globalUid ?? 'none'}): run join again`,
        );
      }
      if (globalUid === undefined) {
        err(
          `the release created no namespace ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE}: no uid recorded, its Packages will be trusted unchecked\n`,
        );
      }
    } else if (step.action === 'rbac') {
      const manifests = await rbacManifests({ tokenIdentities: s.auth.kind === 'token' });
      await apply(manifests.map((m) => stringify(m)).join('---\n'));
    } else if (step.action === 'fleet-config') {
      await apply([eventKeySecret(eventKey), fleetConfigMap(s.id, s.fleet)].map((m) => stringify(m)).join('---\n'));
    } else if (step.action === 'create-role' && s.auth.kind === 'eks') {
      const { partition, account } = arnAccount(s.fleet.forwarderPolicyArn);
      const trust = forwarderTrustPolicy(account, eksClusterArn(partition, s.auth.region, account, s.auth.clusterName));
      const role = await createForwarderRole(
        iamClient(env),
        s.id,
        trust,
        s.fleet.forwarderPolicyArn,
        Boolean(v.replace),
      );
      roleId = role.roleId;
      err(`created ${role.arn} (${role.roleId})\n`);
    } else if (step.action === 'document') {
      let written: Awaited<ReturnType<typeof writeJoinDocument>>;
      try {
        written = await writeJoinDocument(
          store,
          {
            id: s.id,
            ...target,
            auth: s.auth,
            ...(roleId ? { forwarderRoleId: roleId } : {}),
            eventKey,
            ...(globalUid ? { packagingGlobalNamespaceUid: globalUid } : {}),
          },
          // A given role was checked above; a role join just created is new (no document names it),
          // one it reused carries this id's tag (createForwarderRole refuses any other).
          { replace: Boolean(v.replace), checkForwarder: false },
        );
      } catch (e) {
        if (!(e instanceof JoinRefusedError)) throw e;
        err(`cluster: ${e.message}\n`);
        return e.code;
      }
      err(`wrote ${written.key}\n`);
      if (restartForwarder) {
        err(`restart deployment ${RELEASE_NAMESPACE}/${FORWARDER_DEPLOYMENT} (it reads the new event key on start)\n`);
        await runKubectl(
          kubectl,
          [...kubeArgs, '-n', RELEASE_NAMESPACE, 'rollout', 'restart', `deployment/${FORWARDER_DEPLOYMENT}`],
          '',
        );
      }
      process.stdout.write(identitySteps(written.doc, s.fleet.functionRoles, RELEASE_NAMESPACE));
    }
  }
  return EXIT.ok;
}
