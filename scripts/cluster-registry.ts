/**
 * `npm run cluster -- <command>`: the fleet's cluster registry (the documents the functions read
 * at run time, `functions/lib/kube/cluster-doc.ts`).
 *
 * ```
 * npm run cluster -- add <id> --endpoint https://… --ca-file ca.pem --auth eks \
 *     --eks-cluster-name NAME --region REGION [--function-role <stage>=<role arn> …] \
 *     --forwarder-role-id AROA…
 * npm run cluster -- add <id> --endpoint https://… --ca-file ca.pem --auth token \
 *     [--secret-prefix kapp-lambda/<id>/] [--identity-namespace kapp-lambda] \
 *     --forwarder-role-id AROA… | --no-sender-check
 * (both: [--controller-config-namespace kapp-lambda], where the functions read kapp-controller-config)
 * npm run cluster -- list [-o json|yaml]
 * npm run cluster -- remove <id> [--delete-role]
 * npm run cluster -- join <kubeconfig-context> --id <id> --fleet <outputs.json> … (./cluster-join.ts)
 * ```
 *
 * `add` refuses an id already registered unless `--replace`, and a `--forwarder-role-id` another
 * cluster's document already names (exit 2, naming it); `remove` of an unknown id exits 1.
 * Exit codes as every command line of the project (`./cli.ts`): 0 success, 1 failure, 2 usage
 * error; `--help` prints the usage on stdout. `list -o json|yaml` prints the documents without
 * their CA ({@link ClusterSummary}).
 * `--forwarder-role-id` is the unique id of the cluster's forwarder role (the stack's output
 * `ForwarderRoleId<Id>`): the functions accept events naming the cluster only from that role
 * (`functions/lib/entry/sender.ts`). `add` requires it: a fleet that checks senders (every CDK
 * deployment, `KAPP_LAMBDA_SENDER_CHECK=registry`) refuses every event of a cluster registered
 * without it. `--no-sender-check` registers one without it on purpose, for functions that run
 * without the check (local setups, `KAPP_LAMBDA_SENDER_CHECK` off).
 *
 * Every command takes `--registry s3://<bucket>/<prefix>` or `file:///<dir>`, default
 * `$KAPP_LAMBDA_CLUSTER_REGISTRY` (the functions' variable); S3 is reached as the functions do
 * (`AWS_REGION`, `KAPP_LAMBDA_S3_ENDPOINT`, the SDK's default credentials). `add` writes the
 * document, prints the RBAC manifests the cluster needs (`infra/rbac/`) on stdout, and the
 * steps that map each function's identity (EKS access entries, or the token copies) on stderr.
 *
 * @module
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { S3Client } from '@aws-sdk/client-s3';
import { parseAllDocuments, stringify } from 'yaml';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../functions/lib/api/constants.js';
import { PIPELINE_STAGES, type PipelineStage } from '../functions/lib/api/functions.js';
import { CLOUD_URL_POLICY, UrlPolicyChecker, UrlPolicyError } from '../functions/lib/fetch/url-policy.js';
import {
  CLUSTER_DOC_API_VERSION,
  CLUSTER_DOC_PREFIX,
  type ClusterDoc,
  clusterDocKey,
  IAM_ROLE_ID_PATTERN,
  InvalidClusterDocumentError,
  KUBE_UID_PATTERN,
  MAX_CLUSTER_DOC_BYTES,
  parseClusterDoc,
  parseRegistryLocation,
} from '../functions/lib/kube/cluster-doc.js';
import { DEFAULT_CONTROLLER_CONFIG_NAMESPACE } from '../functions/lib/reconcile/controller-config.js';
import { LocalDirStore } from '../functions/lib/store/local.js';
import type { ObjectStore } from '../functions/lib/store/port.js';
import { S3Store } from '../functions/lib/store/s3.js';
import {
  EXIT,
  exitCodesHelp,
  formatOutput,
  isUsageError,
  OUTPUT_OPTION,
  type OutputFormat,
  parseOutputFormat,
  runIfEntry,
  usageFailure,
} from './cli.js';

/** Directory of the RBAC manifests, one file per function plus `token-identities.yml`. */
export const RBAC_DIR = path.resolve(import.meta.dirname, '../infra/rbac');

/** The Kubernetes group a function's identity is mapped to: `kapp-lambda:<stage>`. */
export function stageGroup(stage: PipelineStage): string {
  return `kapp-lambda:${stage}`;
}

/** The ServiceAccount of a function's identity for `token` clusters: `kapp-lambda-<stage>`. */
export function stageServiceAccount(stage: PipelineStage): string {
  return `kapp-lambda-${stage}`;
}

/** Options of {@link rbacManifests}. */
export interface RbacOptions {
  /** Include the ServiceAccounts and token Secrets of `token` auth. Default false. */
  tokenIdentities?: boolean;
  /** Namespace of those ServiceAccounts (and the bindings' ServiceAccount subjects). Default `kapp-lambda`. */
  identityNamespace?: string;
  /**
   * Namespace of the cluster's `kapp-controller-config` (the functions'
   * `KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE`), where `controller-config.yml` grants install and
   * index-repo its read. Default `kapp-lambda`.
   */
  controllerConfigNamespace?: string;
}

/** The file whose objects live in the controller-config namespace, not the identity one. */
const CONTROLLER_CONFIG_RBAC = 'controller-config.yml';

/**
 * The identity of a PackageRepository's kapp (the ServiceAccount `kapp-lambda-pkgr` and its
 * RBAC): in the runtime's namespace, which is the controller-config one (the index-repo function
 * looks for the ServiceAccount there).
 */
const PKGR_KAPP_RBAC = 'package-repository-kapp.yml';

/** Files whose objects live in the controller-config (runtime) namespace. */
const RUNTIME_NAMESPACE_RBAC = [CONTROLLER_CONFIG_RBAC, PKGR_KAPP_RBAC];

/** The namespace the files of `infra/rbac/` declare (what {@link rbacManifests} substitutes). */
const FILES_NAMESPACE = 'kapp-lambda';

/**
 * Points a ValidatingAdmissionPolicy of `infra/rbac/` at the ServiceAccounts of namespace `to`
 * instead of `from`, in place. Its matchConditions name a ServiceAccount by username
 * (`'system:serviceaccount:<ns>:<name>'`, a CEL string), which carries the namespace where an
 * RBAC subject has a field of its own; a policy left on the old namespace would guard nobody.
 *
 * @throws Error when no matchCondition names a ServiceAccount of `from` (the file and this
 *   function disagree).
 */
export function retargetPolicyNamespace(policy: Record<string, unknown>, from: string, to: string): void {
  const conditions = (policy.spec as { matchConditions?: { expression: string }[] } | undefined)?.matchConditions;
  const old = `'system:serviceaccount:${from}:`;
  const named = (conditions ?? []).filter((c) => c.expression.includes(old));
  if (named.length === 0) {
    const name = (policy.metadata as { name?: string } | undefined)?.name;
    throw new Error(`ValidatingAdmissionPolicy ${name}: no matchCondition names a ServiceAccount of ${from}`);
  }
  for (const c of named) c.expression = c.expression.replaceAll(old, `'system:serviceaccount:${to}:`);
}

/**
 * The RBAC manifests of `infra/rbac/` as objects: per function a ClusterRole and a
 * ClusterRoleBinding to its group and ServiceAccount, the Role reading `kapp-controller-config`
 * (install, index-repo), the identity of a PackageRepository's kapp (`kapp-lambda-pkgr`, its
 * ClusterRole, the Role letting index-repo request its token, and the ValidatingAdmissionPolicy
 * bounding its writes to kapp's records), and for token auth the identities themselves. The
 * files are the source; only the identity and controller-config namespaces are substituted (a
 * ServiceAccount subject is in the namespace its ServiceAccount is declared in:
 * `kapp-lambda-pkgr` the controller-config one, the functions' the identity one; the policy's
 * username of `kapp-lambda-pkgr` too, {@link retargetPolicyNamespace}).
 *
 * @throws Error when a file cannot be read or parsed.
 */
export async function rbacManifests(options: RbacOptions = {}): Promise<Record<string, unknown>[]> {
  const ids = options.identityNamespace ?? 'kapp-lambda';
  const runtime = options.controllerConfigNamespace ?? DEFAULT_CONTROLLER_CONFIG_NAMESPACE;
  const files = [
    ...PIPELINE_STAGES.map((s) => `${s}.yml`),
    ...RUNTIME_NAMESPACE_RBAC,
    ...(options.tokenIdentities ? ['token-identities.yml'] : []),
  ];
  type Manifest = {
    kind: string;
    metadata: { name: string; namespace?: string };
    subjects?: { kind: string; name: string; namespace?: string }[];
  };
  const parsed: Array<{ file: string; o: Manifest }> = [];
  for (const file of files) {
    for (const doc of parseAllDocuments(await readFile(path.join(RBAC_DIR, file), 'utf8'))) {
      if (doc.errors.length > 0) throw new Error(`parsing ${file}: ${doc.errors[0]?.message}`);
      parsed.push({ file, o: doc.toJS() as Manifest });
    }
  }
  const runtimeAccounts = new Set(
    parsed
      .filter((p) => RUNTIME_NAMESPACE_RBAC.includes(p.file) && p.o.kind === 'ServiceAccount')
      .map((p) => p.o.metadata.name),
  );
  const namespaces = new Set<string>();
  const out: Record<string, unknown>[] = [];
  for (const { file, o } of parsed) {
    const ns = RUNTIME_NAMESPACE_RBAC.includes(file) ? runtime : ids;
    if (o.kind === 'Namespace') {
      // Each file declares the namespace it needs; it is listed once.
      if (namespaces.has(ns)) continue;
      namespaces.add(ns);
      o.metadata.name = ns;
    } else if (o.metadata.namespace) o.metadata.namespace = ns;
    if (o.kind === 'ValidatingAdmissionPolicy') retargetPolicyNamespace(o, FILES_NAMESPACE, ns);
    for (const s of o.subjects ?? []) {
      if (s.kind === 'ServiceAccount') s.namespace = runtimeAccounts.has(s.name) ? runtime : ids;
    }
    out.push(o);
  }
  return out;
}

/** The store behind a registry location (S3 as the functions reach it, or a directory). */
export function registryStore(location: string, env: NodeJS.ProcessEnv = process.env): ObjectStore {
  const loc = parseRegistryLocation(location);
  if (loc.kind === 'dir') return new LocalDirStore(loc.root);
  const endpoint = env.KAPP_LAMBDA_S3_ENDPOINT;
  const client = new S3Client({
    ...(env.AWS_REGION ? { region: env.AWS_REGION } : {}),
    ...(endpoint ? { endpoint, forcePathStyle: true } : {}),
  });
  return new S3Store({ client, bucket: loc.bucket, prefix: loc.prefix });
}

/** Input of {@link clusterDocOf}. */
export interface AddInput {
  id: string;
  endpoint: string;
  /** PEM bundle of the API server's CA. */
  caPem: string;
  tlsServerName?: string;
  auth:
    | { kind: 'eks'; clusterName: string; region: string }
    | { kind: 'token' /** Default `kapp-lambda/<id>/`. */; secretPrefix?: string };
  /** The forwarder role's unique id (`AROA…`); none: no forwarder may send for the cluster. */
  forwarderRoleId?: string;
  /** The cluster's event key (base64 of 32 random bytes, `eventKey`); none: unkeyed message groups and deduplication ids. */
  eventKey?: string;
  /**
   * The `metadata.uid` of the cluster's packaging global namespace, as the release created it
   * (`packagingGlobalNamespaceUid`); none: its Packages are trusted unchecked.
   */
  packagingGlobalNamespaceUid?: string;
}

/**
 * The validated document for a cluster.
 *
 * @throws InvalidClusterDocumentError naming the bad fields.
 */
export function clusterDocOf(input: AddInput): ClusterDoc {
  const auth =
    input.auth.kind === 'eks'
      ? input.auth
      : {
          kind: 'token' as const,
          secrets: Object.fromEntries(
            PIPELINE_STAGES.map((s) => [
              s,
              `${input.auth.kind === 'token' ? (input.auth.secretPrefix ?? `kapp-lambda/${input.id}/`) : ''}${s}`,
            ]),
          ),
        };
  const doc = {
    apiVersion: CLUSTER_DOC_API_VERSION,
    kind: 'Cluster',
    id: input.id,
    endpoint: input.endpoint,
    caData: Buffer.from(input.caPem, 'utf8').toString('base64'),
    ...(input.tlsServerName ? { tlsServerName: input.tlsServerName } : {}),
    auth,
    ...(input.forwarderRoleId ? { forwarder: { roleId: input.forwarderRoleId } } : {}),
    ...(input.eventKey ? { eventKey: input.eventKey } : {}),
    ...(input.packagingGlobalNamespaceUid ? { packagingGlobalNamespaceUid: input.packagingGlobalNamespaceUid } : {}),
  };
  return parseClusterDoc(clusterDocKey(input.id), JSON.stringify(doc));
}

/** Writes a cluster's document (replacing an older one). */
export async function putCluster(store: ObjectStore, doc: ClusterDoc): Promise<string> {
  const key = clusterDocKey(doc.id);
  await store.put(key, `${JSON.stringify(doc, null, 2)}\n`);
  return key;
}

/** Every registry document's key and body (pages of 1000 keys; documents that vanished skipped). */
async function* clusterDocBodies(store: ObjectStore): AsyncGenerator<{ key: string; body: string }> {
  let after: string | undefined;
  for (;;) {
    const keys = await store.list(CLUSTER_DOC_PREFIX, after ? { startAfter: after } : {});
    for (const key of keys) {
      if (!key.endsWith('.json')) continue;
      const body = await store.get(key, { maxBytes: MAX_CLUSTER_DOC_BYTES });
      if (body) yield { key, body: body.toString() };
    }
    if (keys.length < 1000) return;
    after = keys[keys.length - 1];
  }
}

/**
 * One registered cluster as `list -o json|yaml` prints it: the document without its CA (`caData`),
 * or, for a document that fails validation, its key and why.
 */
export type ClusterSummary =
  | {
      id: string;
      endpoint: string;
      tlsServerName?: string;
      auth: ClusterDoc['auth'];
      /** The forwarder role's unique id; `null` when the document names none (`--no-sender-check`). */
      forwarderRoleId: string | null;
    }
  | { key: string; invalid: string };

/** Every registry document as a {@link ClusterSummary}, in key order. Never the CA. */
export async function clusterSummaries(store: ObjectStore): Promise<ClusterSummary[]> {
  const out: ClusterSummary[] = [];
  for await (const { key, body } of clusterDocBodies(store)) {
    try {
      const doc = parseClusterDoc(key, body);
      out.push({
        id: doc.id,
        endpoint: doc.endpoint,
        ...(doc.tlsServerName ? { tlsServerName: doc.tlsServerName } : {}),
        auth: doc.auth,
        forwarderRoleId: doc.forwarder?.roleId ?? null,
      });
    } catch (err) {
      out.push({ key, invalid: (err as Error).message });
    }
  }
  return out;
}

/** One line of `list`: the id, endpoint and auth kind, or why the document is invalid. Never the CA. */
export async function listClusters(store: ObjectStore): Promise<string[]> {
  return (await clusterSummaries(store)).map((c) => {
    if ('invalid' in c) return `${c.key}\tINVALID\t${c.invalid}`;
    const how = c.auth.kind === 'eks' ? `eks ${c.auth.clusterName} ${c.auth.region}` : 'token';
    return `${c.id}\t${c.endpoint}\t${how}\tforwarder ${c.forwarderRoleId ?? 'none'}`;
  });
}

/**
 * The registered cluster, other than `exceptId`, whose document names `roleId` as its forwarder:
 * a forwarder speaks for the clusters that name it, so a role id copied from another cluster's
 * output would let that cluster's forwarder send this one's events. Invalid documents are
 * skipped (`list` reports them).
 *
 * @returns the other cluster's id, or `undefined` when none names the role
 */
export async function clusterNamingForwarder(
  store: ObjectStore,
  roleId: string,
  exceptId: string,
): Promise<string | undefined> {
  for await (const { key, body } of clusterDocBodies(store)) {
    let doc: ClusterDoc;
    try {
      doc = parseClusterDoc(key, body);
    } catch {
      continue;
    }
    if (doc.id !== exceptId && doc.forwarder?.roleId === roleId) return doc.id;
  }
  return undefined;
}

/** The steps that give each function its identity in the cluster (printed by `add`). */
export function identitySteps(
  doc: ClusterDoc,
  roles: Partial<Record<PipelineStage, string>>,
  identityNs: string,
): string {
  const lines: string[] = [];
  if (doc.auth.kind === 'eks') {
    lines.push(
      `# Map each stage's IAM role (the stack's FunctionRoleArn<Stage>: in isolation=shared its dispatcher's) to its group (the cluster's authentication mode must include API):`,
    );
    for (const s of PIPELINE_STAGES) {
      const arn = roles[s] ?? `<${s}-function-role-arn>`;
      lines.push(
        `aws eks create-access-entry --region ${doc.auth.region} --cluster-name ${doc.auth.clusterName} --type STANDARD --principal-arn ${arn} --kubernetes-groups ${stageGroup(s)}`,
      );
    }
  } else {
    lines.push(
      `# Store each function's ServiceAccount token where the document names it (after applying the manifests):`,
    );
    for (const s of PIPELINE_STAGES) {
      const name = doc.auth.secrets[s];
      lines.push(
        `kubectl -n ${identityNs} get secret ${stageServiceAccount(s)}-token -o 'jsonpath={.data.token}' | base64 -d | aws secretsmanager create-secret --name ${name} --secret-string file:///dev/stdin`,
      );
    }
  }
  return `${lines.join('\n')}\n`;
}

/**
 * Cluster `id`'s registry document as recorded; `undefined` when there is none or it does not
 * parse (a document `add --replace` and `join --replace` overwrite). What a replacement keeps
 * of it: the event key (the functions take an object's events only in the message group its key
 * gives, so a running forwarder must keep holding the document's key) and, for join, the checked
 * global namespace uid.
 */
export async function recordedClusterDoc(store: ObjectStore, id: string): Promise<ClusterDoc | undefined> {
  const key = clusterDocKey(id);
  const body = await store.get(key, { maxBytes: MAX_CLUSTER_DOC_BYTES });
  if (body === undefined) return undefined;
  try {
    return parseClusterDoc(key, body);
  } catch (e) {
    if (e instanceof InvalidClusterDocumentError) return undefined;
    throw e;
  }
}

const USAGE = `usage:
  npm run cluster -- add <id> --endpoint https://… --ca-file <pem> [--tls-server-name <name>] [--replace]
      --auth eks --eks-cluster-name <name> --region <region> [--function-role <stage>=<arn> …]
    | --auth token [--secret-prefix <prefix>] [--identity-namespace <ns>]
      --forwarder-role-id <AROA…> (the stack's ForwarderRoleId<Id>: the only sender of this cluster's events)
    | --no-sender-check (no forwarder role: only for functions without the sender check, local setups)
    [--controller-config-namespace <ns>] (where the functions read kapp-controller-config; default kapp-lambda)
    [--packaging-global-namespace-uid <uid>] (the uid of ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE} once the
      release created it: its Packages are trusted only while the namespace has it)
  npm run cluster -- list [-o json|yaml] (default: one tab-separated line per cluster)
  npm run cluster -- remove <id> [--delete-role] (also the forwarder role join created for it)
  npm run cluster -- join <kubeconfig-context> --id <id> --fleet <outputs.json> … (join --help)
  (all: --registry s3://<bucket>/<prefix> | file:///<dir>, default $KAPP_LAMBDA_CLUSTER_REGISTRY;
   -h, --help: this text)
${exitCodesHelp('an id already registered without --replace, an unknown id to remove, the registry unreachable')}`;

/** The command line's options (`node:util` `parseArgs`, strict: an unknown option throws). */
function parseClusterArgs(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      registry: { type: 'string' },
      endpoint: { type: 'string' },
      'ca-file': { type: 'string' },
      'tls-server-name': { type: 'string' },
      auth: { type: 'string' },
      'eks-cluster-name': { type: 'string' },
      region: { type: 'string' },
      'function-role': { type: 'string', multiple: true },
      'secret-prefix': { type: 'string' },
      'identity-namespace': { type: 'string' },
      'controller-config-namespace': { type: 'string' },
      'forwarder-role-id': { type: 'string' },
      'no-sender-check': { type: 'boolean' },
      'packaging-global-namespace-uid': { type: 'string' },
      replace: { type: 'boolean' },
      'delete-role': { type: 'boolean' },
      ...OUTPUT_OPTION,
      help: { type: 'boolean', short: 'h' },
    },
  });
}

/**
 * Runs the command line.
 *
 * @returns the exit code ({@link EXIT}): 0 (`--help` too, on stdout), 1 for an id already
 *   registered without `--replace` or an unknown id to remove, 2 for a usage error (an unknown
 *   option, a missing or invalid argument, a forwarder role another cluster names).
 */
export async function main(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  // join has options of its own (./cluster-join.ts), loaded only for it (the IAM client).
  if (argv[0] === 'join') return (await import('./cluster-join.js')).joinMain(argv, env);
  const err = (t: string) => process.stderr.write(t);
  const usage = (problem: string): number => usageFailure('cluster', USAGE, problem, err);
  let parsed: ReturnType<typeof parseClusterArgs>;
  let format: OutputFormat | undefined;
  try {
    parsed = parseClusterArgs(argv);
    format = parseOutputFormat(parsed.values.output);
  } catch (e) {
    if (!isUsageError(e)) throw e;
    return usage(e.message);
  }
  const { values: v, positionals } = parsed;
  if (v.help) {
    process.stdout.write(USAGE);
    return EXIT.ok;
  }
  const [command, id, ...extra] = positionals;
  if (!command) return usage('a command is required');
  if (v['delete-role'] && command !== 'remove') return usage(`--delete-role applies to remove, not ${command}`);
  if (!['add', 'list', 'remove'].includes(command)) return usage(`unknown command ${JSON.stringify(command)}`);
  if (format && command !== 'list') return usage(`-o applies to list, not ${command}`);
  const location = v.registry ?? env.KAPP_LAMBDA_CLUSTER_REGISTRY;
  if (!location) return usage('--registry (or KAPP_LAMBDA_CLUSTER_REGISTRY) is required');
  if (extra.length > 0) return usage(`unexpected argument ${JSON.stringify(extra[0])}`);
  const store = registryStore(location, env);
  if (command === 'list') {
    if (format) process.stdout.write(formatOutput(await clusterSummaries(store), format));
    else for (const line of await listClusters(store)) process.stdout.write(`${line}\n`);
    return EXIT.ok;
  }
  if (!id) return usage('a cluster id is required');
  if (command === 'remove') {
    if (!(await store.head(clusterDocKey(id)))) {
      process.stderr.write(`cluster: no cluster ${JSON.stringify(id)} in the registry (see list)\n`);
      return 1;
    }
    if (v['delete-role']) {
      const body = await store.get(clusterDocKey(id), { maxBytes: MAX_CLUSTER_DOC_BYTES });
      const roleId = body ? parseClusterDoc(clusterDocKey(id), body.toString()).forwarder?.roleId : undefined;
      if (roleId) {
        // The role goes first: when it cannot (another role of that name), the document stays.
        const { deleteForwarderRole, iamClient, forwarderRoleName } = await import('./cluster-join.js');
        const gone = await deleteForwarderRole(iamClient(env), id, roleId);
        process.stderr.write(`${gone ? 'deleted' : 'no'} forwarder role ${forwarderRoleName(id)} (${roleId})\n`);
      }
    }
    await store.delete(clusterDocKey(id));
    process.stderr.write(`removed ${clusterDocKey(id)} (the RBAC in the cluster is left as it is)\n`);
    return 0;
  }
  if (!v.endpoint || !v['ca-file']) return usage('add needs --endpoint and --ca-file');
  const forwarderRoleId = v['forwarder-role-id'];
  if (forwarderRoleId !== undefined && !IAM_ROLE_ID_PATTERN.test(forwarderRoleId)) {
    return usage('--forwarder-role-id expects an IAM role id (AROA…, aws iam get-role --query Role.RoleId)');
  }
  const globalUid = v['packaging-global-namespace-uid'];
  if (globalUid !== undefined && !KUBE_UID_PATTERN.test(globalUid)) {
    return usage(
      `--packaging-global-namespace-uid expects a uid (kubectl get namespace ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE} -o jsonpath='{.metadata.uid}')`,
    );
  }
  const roles: Partial<Record<PipelineStage, string>> = {};
  for (const pair of v['function-role'] ?? []) {
    const [stage, arn] = [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)];
    if (
      !(PIPELINE_STAGES as readonly string[]).includes(stage) ||
      !/^arn:aws[a-z-]*:iam::\d{12}:role\/\S+$/.test(arn)
    ) {
      return usage(`--function-role expects <stage>=<IAM role ARN>, stage one of ${PIPELINE_STAGES.join(', ')}`);
    }
    roles[stage as PipelineStage] = arn;
  }
  let auth: AddInput['auth'];
  if (v.auth === 'eks') {
    if (!v['eks-cluster-name'] || !v.region) return usage('--auth eks needs --eks-cluster-name and --region');
    auth = { kind: 'eks', clusterName: v['eks-cluster-name'], region: v.region };
  } else if (v.auth === 'token') {
    auth = { kind: 'token', ...(v['secret-prefix'] ? { secretPrefix: v['secret-prefix'] } : {}) };
  } else {
    return usage('--auth must be eks or token');
  }
  // Without the role id a checking fleet drops every event of the cluster: never by omission.
  if (forwarderRoleId !== undefined && v['no-sender-check']) {
    return usage('--forwarder-role-id and --no-sender-check exclude each other');
  }
  if (forwarderRoleId === undefined && !v['no-sender-check']) {
    return usage(
      `add needs --forwarder-role-id <AROA…> (the stack's ForwarderRoleId<Id> output): the functions take events naming ${id} only from that role, and a fleet that checks senders (every CDK deployment) would refuse all of them; --no-sender-check registers it without one, for functions that run without the check (local setups)`,
    );
  }
  // A typo in an id must not silently repoint another cluster's functions (the document decides
  // where their identities are sent): replacing one is explicit.
  if (!v.replace && (await store.head(clusterDocKey(id)))) {
    process.stderr.write(`cluster: ${JSON.stringify(id)} is already registered; add --replace to overwrite it\n`);
    return 1;
  }
  if (forwarderRoleId !== undefined) {
    const other = await clusterNamingForwarder(store, forwarderRoleId, id);
    if (other !== undefined) {
      process.stderr.write(
        `cluster: --forwarder-role-id ${forwarderRoleId} is already the forwarder of cluster ${JSON.stringify(other)}: each cluster needs its own forwarder role (the stack's ForwarderRoleId<Id> output of ${JSON.stringify(id)}), or that cluster's forwarder could send events for ${JSON.stringify(id)}\n`,
      );
      return 2;
    }
  }
  // A replacement keeps the event key join made (its forwarder holds it); add makes none, as it
  // writes nothing into the cluster (the key would have to be printed).
  const eventKey = v.replace ? (await recordedClusterDoc(store, id))?.eventKey : undefined;
  const doc = clusterDocOf({
    id,
    endpoint: v.endpoint,
    caPem: await readFile(v['ca-file'], 'utf8'),
    ...(v['tls-server-name'] ? { tlsServerName: v['tls-server-name'] } : {}),
    auth,
    ...(forwarderRoleId ? { forwarderRoleId } : {}),
    ...(globalUid ? { packagingGlobalNamespaceUid: globalUid } : {}),
    ...(eventKey ? { eventKey } : {}),
  });
  const key = await putCluster(store, doc);
  const reach = await endpointReachWarning(v.endpoint);
  if (reach) process.stderr.write(reach);
  const identityNamespace = v['identity-namespace'] ?? 'kapp-lambda';
  const manifests = await rbacManifests({
    tokenIdentities: auth.kind === 'token',
    identityNamespace,
    ...(v['controller-config-namespace'] ? { controllerConfigNamespace: v['controller-config-namespace'] } : {}),
  });
  process.stdout.write(manifests.map((m) => stringify(m)).join('---\n'));
  process.stderr.write(
    `wrote ${key}\n# Apply the manifests on stdout to the cluster (kubectl apply -f, or kapp deploy).\n`,
  );
  process.stderr.write(identitySteps(doc, roles, identityNamespace));
  if (!globalUid) {
    process.stderr.write(
      `# No --packaging-global-namespace-uid: the Packages of ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE} are trusted unchecked. Once the release created it: add --replace … --packaging-global-namespace-uid "$(kubectl get namespace ${DEFAULT_PACKAGING_GLOBAL_NAMESPACE} -o jsonpath='{.metadata.uid}')" (npm run cluster -- join does it, and refuses a namespace that existed before).\n`,
    );
  }
  if (!eventKey) {
    process.stderr.write(
      `# No event key (join makes one): the SQS message groups and deduplication ids of ${id}'s events are unkeyed, so another cluster's forwarder can name them and hold its objects' events back. npm run cluster -- join writes the key into the registry and the forwarder's Secret.\n`,
    );
  } else {
    process.stderr.write("# kept the document's event key (the forwarder's Secret holds it).\n");
  }
  if (!forwarderRoleId) {
    process.stderr.write(
      `# --no-sender-check: no forwarder role named. Functions that check senders (KAPP_LAMBDA_SENDER_CHECK=registry, every CDK deployment) refuse every event naming ${id} (logged as refused) until the document names one (add --replace … --forwarder-role-id).\n`,
    );
  }
  return 0;
}

/**
 * A warning for `add` when the cloud functions could not reach `endpoint` as deployed by
 * default: its host is (or resolves to) a loopback, private or link-local address, or does not
 * resolve here (a private DNS name). The functions reach such an API server only from a VPC that
 * routes to it (CDK context `vpcId`, `subnetIds`) and with the address in `urlAllow`; this
 * command cannot see the stack, so it names both. `undefined` for a public endpoint.
 *
 * @param resolve - host resolver (tests pass a fake; default the system's)
 */
export async function endpointReachWarning(
  endpoint: string,
  resolve?: ConstructorParameters<typeof UrlPolicyChecker>[1],
): Promise<string | undefined> {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    return undefined;
  }
  const host = url.hostname.replace(/^\[|\]$/g, '');
  try {
    await new UrlPolicyChecker(CLOUD_URL_POLICY, resolve).check({
      source: endpoint,
      scheme: 'https',
      host,
      ...(url.port ? { port: url.port } : {}),
    });
    return undefined;
  } catch (err) {
    if (!(err instanceof UrlPolicyError)) throw err;
    return `# warning: ${err.message}. The functions reach this API server only when the stack runs them in a VPC that routes to it (cdk context vpcId and subnetIds) and lists it in urlAllow (docs/aws.md, "Context"); a stack without a VPC cannot reach it.\n`;
  }
}

runIfEntry(import.meta.filename, 'cluster', (argv) => main(argv));
