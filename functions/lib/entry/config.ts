/**
 * Configuration of the Lambda functions, parsed once per process from an environment map by
 * the entry file (the only place that reads `process.env`) and passed on as a typed object.
 *
 * The variables, their defaults and what each does are {@link LAMBDA_ENV_DOCS} below, the one
 * source of the reference in `docs/configuration.md` (`npm run gen:config`); a variable read
 * here without a row there fails `test/unit/config-reference.test.ts`.
 *
 * Credentials are not configuration: the AWS SDK takes the function role's temporary
 * credentials from its default provider chain, and nothing here is secret, so the parsed
 * object may be logged.
 *
 * Not read here, but worth setting on Node 20 functions: `AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED=true`
 * (the SDK otherwise writes a multi-line Node 22 deprecation warning to stderr once per cold start).
 *
 * @module
 */
import { isAbsolute } from 'node:path';
import * as z from 'zod';
import {
  absPath,
  blankToUndefined,
  commaList,
  envProblem,
  httpUrl,
  intText,
  json,
  optional,
  required,
  type SettingDoc,
} from '../api/env.js';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../api/functions.js';
import { STAGE_TOOLS } from '../exec/runner.js';
import { MAX_INLINE_BYTES_CEILING } from '../fetch/inline-limit.js';
import { DEFAULT_FETCH_STALL_MIN_BYTES, DEFAULT_FETCH_STALL_SECONDS, type StallRule } from '../fetch/stall.js';
import { parseUrlPolicy, type UrlPolicy, UrlPolicyChecker } from '../fetch/url-policy.js';
import {
  CLUSTER_ID_PATTERN,
  IAM_ROLE_ID_PATTERN,
  parseRegistryLocation,
  type RegistryLocation,
} from '../kube/cluster-doc.js';
import { DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS, type KubeApiRate } from '../kube/rate-limit.js';
import { defaultNamespaceShare } from '../lease/shares.js';
import { DEFAULT_MAX_ATTEMPTS } from '../pipeline/attempts.js';
import { parseControllerSyncConfig, type TimerConfig } from '../reconcile/timer.js';

/**
 * Version reported as `kappControllerVersion` to the downward API (same as the embedded
 * runtime's): the upstream release kapp-lambda mirrors, equal to `COMPATIBLE_KAPP_CONTROLLER_VERSION`
 * (`../packaging/select.ts`, which Packages' `kappControllerVersionSelection` is checked
 * against), so a template that branches on the controller version sees the same release as
 * package selection does. Upstream reports its own build version; kapp-lambda's own (0.1.0)
 * would send such templates down their oldest branch.
 */
export const CONTROLLER_VERSION = '0.53.1';

/**
 * The functions a function hands events to: fetch → template (and deploy, for deletions),
 * template → deploy, index-repo → install (`repo.indexed`: the versions a repository gained
 * or lost) and index-repo → index-repo and → fetch (the fleet source poll's `ref-changed` to the
 * repositories and Apps of a moved tag or branch, `../pipeline/source-poll.ts`), install → install (the
 * `ref-changed` fan-out to each PackageInstall it may move). fetch, template and deploy also
 * send to fetch: the function that ends an App's run sends the run lease's follow-up
 * (`../lease/`, an object event); and deploy sends to deploy: its own continuation past the
 * function deadline (`../pipeline/app/deploy.ts`). The stack derives each function's queue URLs,
 * `sqs:SendMessage` grants and each queue's `KAPP_LAMBDA_FUNCTION_SENDERS` from this table: a
 * route missing here is refused in a deployed fleet (the follow-up lost, the lease left reserved
 * for it; the continuation never queued).
 */
export const NEXT_STAGES: Readonly<Partial<Record<PipelineStage, readonly PipelineStage[]>>> = {
  fetch: ['template', 'deploy', 'fetch'],
  template: ['deploy', 'fetch'],
  deploy: ['deploy', 'fetch'],
  'index-repo': ['install', 'index-repo', 'fetch'],
  install: ['install'],
};

/**
 * Default `KAPP_LAMBDA_RECORD_CONCURRENCY` per function: how many records of one SQS batch run
 * side by side in one invocation.
 *
 * - fetch, template, deploy, index-repo 1: their tools share the function's uid (Lambda cannot
 *   switch uids, issue 7), so a tool that code escaped into could read the run directories of
 *   records running beside it (other Apps' fetched and rendered files, some made from their
 *   Secrets). These functions also take one record per invocation (`STAGE_SIZING` of
 *   `infra/aws/stages.ts`): in series, a slow record would hold the rest of its batch.
 * - install 10: no tool, only API calls (resolve a version, write an App): a whole batch at
 *   once, so one slow record (a cluster whose API server is slow) holds no other cluster's.
 */
export const STAGE_RECORD_CONCURRENCY: Readonly<Record<PipelineStage, number>> = Object.freeze({
  fetch: 1,
  template: 1,
  deploy: 1,
  'index-repo': 1,
  install: 10,
});

/**
 * The environment variables of the Lambda functions: what {@link parseLambdaEnv} (and, at cold
 * start, `./main.ts` and `./artifact-key.ts`) read, with defaults and meanings. The Lambda table
 * of `docs/configuration.md` is generated from it (`npm run gen:config`); keep a row beside each
 * variable the schema below gains.
 */
export const LAMBDA_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'AWS_REGION',
    default: 'required',
    meaning: 'region of the S3 and SQS clients (Lambda sets it)',
    readBy: 'every function; the forwarder',
  },
  {
    name: 'KAPP_LAMBDA_BUCKET',
    default: 'required',
    meaning: 'S3 bucket of artifacts, render cache and receipts',
    readBy: 'every function; `npm run receipts` (default store)',
  },
  {
    name: 'KAPP_LAMBDA_BUCKET_PREFIX',
    default: "`''`",
    meaning: 'key prefix inside the bucket, e.g. `kapp-lambda/`',
    readBy: 'every function; `npm run receipts`',
  },
  {
    name: 'KAPP_LAMBDA_S3_ENDPOINT',
    default: 'AWS',
    meaning: 'S3-compatible endpoint (`http(s)://…`); path-style addressing',
    readBy: 'every function; `npm run cluster`',
  },
  {
    name: 'KAPP_LAMBDA_SQS_ENDPOINT',
    default: 'AWS',
    meaning: 'SQS-compatible endpoint (`http(s)://…`)',
    readBy: 'every function; the forwarder',
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_FETCH',
    default: 'optional',
    meaning:
      "FIFO queue of the fetch function (a function's own queue URL lets it delete the records it handled before the invocation returns)",
    readBy: "fetch, template, deploy (the run lease's follow-up); the forwarder",
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_TEMPLATE',
    default: 'required by fetch',
    meaning: 'FIFO queue of the template function',
    readBy: 'fetch',
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_DEPLOY',
    default: 'required by fetch, template, deploy',
    meaning: 'FIFO queue of the deploy function',
    readBy: 'fetch, template, deploy',
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_INDEX_REPO',
    default: 'optional',
    meaning: 'FIFO queue of the index-repo function',
    readBy: "index-repo (the source poll's `ref-changed`); the forwarder",
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_INSTALL',
    default: 'optional',
    meaning: 'FIFO queue of the install function',
    readBy: 'index-repo, install; the forwarder',
  },
  {
    name: 'KAPP_LAMBDA_CLUSTER_REGISTRY',
    default: 'this or the kubeconfig',
    meaning:
      "the fleet's cluster registry: `s3://<bucket>/<prefix>` (documents `clusters/<id>.json` under it) or `file:///<dir>`",
    readBy: 'every function; `npm run cluster` (default `--registry`)',
  },
  {
    name: 'KAPP_LAMBDA_CLUSTER_SECRETS',
    default: '`aws-secretsmanager`',
    meaning: "where `token` clusters' ServiceAccount tokens are: `aws-secretsmanager` or `file:///<dir>`",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_SENDER_CHECK',
    default: '`off`',
    meaning:
      "`registry`: take an event naming a cluster only from that cluster's forwarder (its registry document's `forwarder.roleId`; object events only) or a function of `KAPP_LAMBDA_FUNCTION_SENDERS`, and from a function only the events that function sends (`EMITS`, `sender.ts`); `off`: no check (local setups). `registry` needs the cluster registry and the function's own queue URL: a record's `SenderId` is trusted only once the record is proven a message of that queue (a visibility change by its receipt handle), so a direct `lambda:Invoke` cannot choose it",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_FUNCTION_SENDERS',
    default: 'none',
    meaning:
      "comma list of `<function>=<IAM role id>` entries, e.g. `fetch=AROA…,template=AROA…`: the functions that send to this function's queue and their roles' ids. A bare role id (the format before the check knew each role's function) is refused at start: it would take any event from that role",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_CELL_CLUSTER',
    default: 'none (every registered cluster)',
    meaning:
      "the one cluster id this function serves (a cell of the CDK stack's `isolation: cell`): the sender check refuses an event naming any other, whoever sent it, and no other cluster is loaded. Needs `KAPP_LAMBDA_SENDER_CHECK=registry`",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS',
    default: '`60`',
    meaning: 'how long a cluster document (and a token from the secret store) is used before it is read again',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_KUBECONFIG',
    default: 'this or the registry',
    meaning: 'kubeconfig file whose contexts are the clusters served (id = context name); the local and emulator setup',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_CLUSTERS',
    default: 'all contexts',
    meaning: 'comma list of contexts to serve (kubeconfig only)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_TMP_DIR',
    default: '`/tmp`',
    meaning: 'absolute scratch directory root',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_BIN_DIR',
    default: '`/opt/bin`',
    meaning: "absolute directory of the layer's tools",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_TOOL_VERSIONS',
    default: 'required, except by install (runs no tool: `{}`)',
    meaning: 'JSON object `{ "<bin>": "<version without v>" }` (render-cache key)',
    readBy: 'every function but install',
  },
  {
    name: 'KAPP_LAMBDA_TOOL_TIMEOUT_MS',
    default: 'runner default (15 min)',
    meaning: 'kill a tool after this long',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS',
    default: '3600',
    meaning:
      "the longest a deploy waits for its resources in all, over every invocation it continues in: an App's longer (or unlimited) `--wait-timeout` is cut there, with a status saying so (one App's endless wait must not hold the fleet's deploy slots)",
    readBy: 'deploy',
  },
  {
    name: 'KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS',
    default: '`[]`',
    meaning: 'JSON array, kapp-controller-config `kappDeployRawOptions`',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY',
    default: 'none',
    meaning: 'kapp-controller-config `dangerousSkipTLSVerify` (comma hosts)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD',
    default: '30s',
    meaning: 'kapp-controller-config `appDefaultSyncPeriod` (Go duration)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_APP_MINIMUM_SYNC_PERIOD',
    default: '30s',
    meaning: 'kapp-controller-config `appMinimumSyncPeriod` (Go duration)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_KUBE_API_QPS',
    default: '20',
    meaning:
      "client-side limit on each cluster's API requests per second, per function instance (`functions/lib/kube/rate-limit.ts`; 0: none); kapp-controller's client has 20 (controller-runtime's default)",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_KUBE_API_BURST',
    default: '30',
    meaning: "its burst (kapp-controller's: 30)",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE',
    default: '`kapp-lambda`',
    meaning:
      "namespace of each cluster's own `kapp-controller-config` Secret or ConfigMap, read from that cluster; its keys replace the four above for that cluster's runs, and its `caCerts` and proxy keys apply to its fetches only",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_CONTROLLER_CONFIG_TTL_SECONDS',
    default: '`10`',
    meaning: "how long a cluster's `kapp-controller-config` is used before an event reads it again (0: every event)",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_LOG_LEVEL',
    default: '`info`',
    meaning: '`debug`, `info`, `warn` or `error`',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_METRICS',
    default: '`cluster`',
    meaning:
      "reconcile metrics as CloudWatch EMF log lines: `cluster` (dimensions `clusterId`, `controller`), `object` (also per object: upstream's labels as dimensions, one custom metric per series and object) or `off`",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_HARDEN_ADDON',
    default: '`/opt/lib/kapp-lambda-harden.node`',
    meaning: 'absolute path of the hardening addon (`functions/lib/exec/harden.ts`)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_URL_POLICY',
    default: '`enforce`',
    meaning: '`enforce` or `off`: refuse fetches to loopback, link-local and private addresses',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_MAX_INLINE_BYTES',
    default: '`67108864` (64 MiB)',
    meaning:
      "cap on an App's or PackageRepository's inline fetch content (`paths` plus each `pathsFrom` Secret's and ConfigMap's data), bytes (1..1073741824): over it the fetch fails with a `Fetching` error naming the source; the objects are read one at a time and none after the one that passed it. The same size caps, apart, the Secrets and ConfigMaps a stage reads besides: the fetch's credentials Secrets (`Fetching: secret \"<name>\" brings the App's referenced Secrets and ConfigMaps to <n> bytes, over the limit of <max> bytes`) and the template's `valuesFrom` and sops key objects (`Templating: …`)",
    readBy: 'fetch, template, index-repo',
  },
  {
    name: 'KAPP_LAMBDA_FETCH_STALL_SECONDS',
    default: '`60`',
    meaning:
      "stall window of a fetch, seconds (1..900): a tool's connection through the egress proxy (vendir, git, helm, imgpkg, kbld) or an http source's download that brings fewer than `KAPP_LAMBDA_FETCH_STALL_MIN_BYTES` from the server in a window is cut, and the `Fetching` failure's `usefulErrorMessage` names the host and this rule",
    readBy: 'fetch, index-repo, template',
  },
  {
    name: 'KAPP_LAMBDA_FETCH_STALL_MIN_BYTES',
    default: '`4096`',
    meaning: 'byte floor of each stall window (1..1048576); see `KAPP_LAMBDA_FETCH_STALL_SECONDS`',
    readBy: 'fetch, index-repo, template',
  },
  {
    name: 'KAPP_LAMBDA_MAX_RECEIVE_COUNT',
    default: '`5`',
    meaning:
      "the function queue's redrive `maxReceiveCount`: the receive that ends a failing run with `ReconcileFailed`",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_RECORD_CONCURRENCY',
    default: "the function's `STAGE_RECORD_CONCURRENCY`: install 10, the others 1",
    meaning:
      'records of one SQS batch run at once, at most (1..10; records of one message group always one after another)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_CLUSTER_SHARE',
    default:
      'none (no shares: every record runs); the stack sets `max(1, floor(maxConcurrency × recordConcurrency / 2))`',
    meaning:
      "records of one cluster the function runs at once, fleet-wide (1..10000): a record over it is parked in the artifact bucket, acknowledged, and sent back to the function's queue when a record of its cluster ends (`functions/lib/lease/shares.ts`)",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_NAMESPACE_SHARE',
    default: '`max(1, ceil(cluster share / 2))`',
    meaning:
      'records of one namespace of a cluster the function runs at once, fleet-wide (1..10000; at most the cluster share); read only with `KAPP_LAMBDA_CLUSTER_SHARE`',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_URL_ALLOW',
    default: 'none',
    meaning: "comma list of exceptions: `host`, `host:port` or CIDR (a fleet's private registries)",
    readBy: 'every function; the stack sets it on fetch, index-repo, template, deploy',
  },
  {
    name: 'KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT',
    default: 'AWS',
    meaning: 'Secrets Manager-compatible endpoint (`http(s)://…`)',
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET',
    default: 'required, except by install (stores nothing)',
    meaning:
      'where the base64 root key (32+ bytes) sealing private artifacts is: a Secrets Manager secret ARN or name, or `file:///<path>`; read by `lambdaEntry` at cold start, not here. The key itself is never a variable (`KAPP_LAMBDA_ARTIFACT_ROOT_KEY` is refused)',
    readBy: 'every function but install (`entry/artifact-key.ts`, at cold start)',
  },
  {
    name: 'KAPP_LAMBDA_DISPATCHED',
    default: '`false`',
    meaning:
      "`true`: the function runs behind its stage's dispatcher (docs/decisions.md D15): it takes only the dispatcher's batches of one cluster (a raw SQS or bare poll event is refused; a batch with `poll` runs the source poll in its cluster), signs every AWS request with the run session's credentials the batch carries, opens only that cluster's sealed artifacts with the keys it carries, and leaves the record proof, sender check, fair shares and early delete to the dispatcher; `KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET` must then be unset",
    readBy: 'every function',
  },
  {
    name: 'KAPP_LAMBDA_SHARING',
    default: '`fleet`',
    meaning:
      "the sharing domain of the function's claims (cache records, in-flight markers, repository indexes; docs/decisions.md D17): `fleet` keeps them under `cache/`, `inflight/`, `artifacts/index/`, shared by every cluster; `cluster` keeps them under `d/<cluster tag>/…`, which only that cluster's run session may write (needs `KAPP_LAMBDA_DISPATCHED=true`: the tag is the run's keyring tag). Content-addressed artifacts are shared either way. A dispatcher in `cluster` sharing keeps the source poll's member clusters itself (`state/poll-members/<cluster id>`, from what each fetch or index-repo run answers) and reads no source poll record",
    readBy:
      'every function and the dispatchers (whose run sessions grant the domain); the stack sets `cluster` on both in `isolation: shared` unless context `sharing` is `fleet`',
  },
  {
    name: 'KAPP_LAMBDA_UNKEYED_GROUPS',
    default: '`refuse`',
    meaning:
      "`accept`, for the time an upgrade to keyed message groups takes (docs/upgrading.md): a record of a cluster that has an event key is also taken in its object's unkeyed group (`<cluster>/<Kind>/<ns>/<name>`, what forwarders and functions of earlier releases send), so no event waits while the forwarders are updated; any sender may name such a group, so set it back to `refuse` once every forwarder runs the new release",
    readBy:
      'the functions and dispatchers that check records (with `KAPP_LAMBDA_SENDER_CHECK=registry`); the stack sets it from context `unkeyedGroups`',
  },
  {
    name: 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY',
    default: 'unset',
    meaning:
      'the former format (the key itself in a variable): refused at start, naming `KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET`',
    readBy: 'every function (`entry/artifact-key.ts`, at cold start)',
  },
  {
    name: 'KAPP_LAMBDA_DISPATCH_STAGE',
    default: 'required by a dispatcher',
    meaning:
      "the stage a dispatcher function dispatches (`fetch`, `template`, `deploy`, `index-repo`, `install`): it consumes that stage's queue and runs each cluster's records in the stage function under that cluster's run session (the shared mode, docs/decisions.md D15)",
    readBy: 'the dispatchers (`functions/dispatch/index.ts`)',
  },
  {
    name: 'KAPP_LAMBDA_RUN_ROLE_ARN',
    default: 'required by a dispatcher',
    meaning:
      "the stage's run role (`arn:<partition>:iam::<account>:role/…`), assumed for each cluster with `RoleSessionName` = the cluster id (a one-character id followed by `.`, `runSessionName`) and the inline session policy of `infra/aws/run-policy.ts`; its partition and account name the session policy's resources",
    readBy: 'the dispatchers',
  },
  {
    name: 'KAPP_LAMBDA_STAGE_FUNCTION',
    default: 'required by a dispatcher',
    meaning: "the stage function's name or ARN, invoked synchronously with `TenantId` = the cluster id",
    readBy: 'the dispatchers',
  },
  {
    name: 'KAPP_LAMBDA_RECEIVER_ROLE_ID',
    default: 'required by a dispatcher with `KAPP_LAMBDA_SENDER_CHECK=registry`',
    meaning:
      "the dispatcher's own role id (`AROA…`): the sender of the copies it sends its queue (parked and postponed records), taken for any event of that queue",
    readBy: 'the dispatchers',
  },
  {
    name: 'KAPP_LAMBDA_STS_ENDPOINT',
    default: 'AWS',
    meaning: 'STS-compatible endpoint (`http(s)://…`)',
    readBy: 'the dispatchers',
  },
  {
    name: 'KAPP_LAMBDA_LAMBDA_ENDPOINT',
    default: 'AWS',
    meaning: "Lambda-compatible endpoint (`http(s)://…`) of the stage function's invoke",
    readBy: 'the dispatchers',
  },
  {
    name: 'AWS_LAMBDA_RUNTIME_API',
    default: 'set by Lambda',
    meaning:
      'the Runtime API address the function polls for invocations; unset: the module is not run as a Lambda bootstrap',
    readBy: 'every function (`functions/lib/entry/main.ts`)',
  },
  {
    name: 'AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED',
    default: 'unset',
    meaning:
      'not read by kapp-lambda; worth setting to `true` on Node 20 functions (the SDK otherwise writes a multi-line Node 22 deprecation warning to stderr once per cold start). `npm start`, `npm run demo` and the test setup set it',
    readBy: 'the AWS SDK',
  },
];

/** One `<function>=<role id>` entry of `KAPP_LAMBDA_FUNCTION_SENDERS`. */
export interface FunctionSender {
  /** The function that runs with the role. */
  readonly stage: PipelineStage;
  /** Its role's unique id (`AROA…`): the principal of the `SenderId` of what it sends. */
  readonly roleId: string;
}

/**
 * Parses one `KAPP_LAMBDA_FUNCTION_SENDERS` entry, `<function>=<role id>`.
 * @returns the entry, or `undefined` when it is not one (a bare role id included).
 */
export function parseFunctionSender(entry: string): FunctionSender | undefined {
  const eq = entry.indexOf('=');
  const stage = entry.slice(0, eq).trim();
  const roleId = entry.slice(eq + 1).trim();
  if (eq < 0 || !(PIPELINE_STAGES as readonly string[]).includes(stage) || !IAM_ROLE_ID_PATTERN.test(roleId)) {
    return undefined;
  }
  return { stage: stage as PipelineStage, roleId };
}

/** Log levels the functions accept. */
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;

/** Settings of one Lambda function (the variables: {@link LAMBDA_ENV_DOCS}). */
export interface LambdaConfig {
  /** The function these settings are for. */
  stage: PipelineStage;
  /** `AWS_REGION`. */
  region: string;
  /** `KAPP_LAMBDA_BUCKET`. */
  bucket: string;
  /** `KAPP_LAMBDA_BUCKET_PREFIX`; `''` for the bucket root. */
  bucketPrefix: string;
  /** `KAPP_LAMBDA_S3_ENDPOINT`; when set the client uses path-style addressing. */
  s3Endpoint?: string;
  /** `KAPP_LAMBDA_SQS_ENDPOINT`. */
  sqsEndpoint?: string;
  /** `KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT`. */
  secretsManagerEndpoint?: string;
  /** {@link queueUrlEnv}`(<stage>)`: every URL given (at least those of {@link NEXT_STAGES}). */
  queueUrls: Partial<Record<PipelineStage, string>>;
  /**
   * `KAPP_LAMBDA_CLUSTER_REGISTRY`, `KAPP_LAMBDA_CLUSTER_SECRETS` and
   * `KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS`: the fleet's cluster registry. Exactly one of this
   * and `kubeconfigPath` is set.
   */
  clusterRegistry?: ClusterRegistryConfig;
  /**
   * `KAPP_LAMBDA_SENDER_CHECK=registry` and `KAPP_LAMBDA_FUNCTION_SENDERS`: who may send events
   * naming a cluster (`./sender.ts`); unset: no check.
   */
  senderCheck?: {
    /** `KAPP_LAMBDA_FUNCTION_SENDERS`: each sending function's role id. */
    functionSenders: FunctionSender[];
    /** `KAPP_LAMBDA_CELL_CLUSTER`: the only cluster id an event may name; unset: any registered one. */
    cell?: string;
  };
  /** `KAPP_LAMBDA_KUBECONFIG`: path of the kubeconfig (never its contents); `''` when the registry is used. */
  kubeconfigPath: string;
  /** `KAPP_LAMBDA_CLUSTERS`; `undefined` serves every context. */
  clusterContexts?: string[];
  /** `KAPP_LAMBDA_TMP_DIR`, default `/tmp` (Lambda's only writable directory). */
  tmpDir: string;
  /** `KAPP_LAMBDA_BIN_DIR`, default `/opt/bin` (where Lambda mounts layer `bin/` directories). */
  binDir: string;
  /** `KAPP_LAMBDA_TOOL_VERSIONS`: versions without `v`, keyed by binary; `{}` for a function that runs no tool when unset. */
  toolVersions: Record<string, string>;
  /** `KAPP_LAMBDA_TOOL_TIMEOUT_MS`. */
  toolTimeoutMs?: number;
  /** `KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS`, ms. */
  maxDeployWaitMs?: number;
  /** `KAPP_LAMBDA_MAX_INLINE_BYTES`; unset: the fetch's `DEFAULT_MAX_INLINE_BYTES` (64 MiB). */
  maxInlineBytes?: number;
  /**
   * `KAPP_LAMBDA_FETCH_STALL_SECONDS` (ms) and `_MIN_BYTES`; a key unset takes the fetch's
   * default (`DEFAULT_STALL_RULE`, 4 KiB in 60 s); both unset: absent.
   */
  fetchStall?: StallRule;
  /** `KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS`. */
  kappDeployRawOptions: string[];
  /** `KAPP_LAMBDA_KUBE_API_QPS` / `_BURST` (a key unset: kapp-controller's 20 / 30). */
  kubeApi: KubeApiRate;
  /** `KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY`. */
  dangerousSkipTLSVerify?: string;
  /** `KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD` / `_MINIMUM_SYNC_PERIOD`, in ms. */
  timer: TimerConfig;
  /** `KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE`; unset: `DEFAULT_CONTROLLER_CONFIG_NAMESPACE`. */
  controllerConfigNamespace?: string;
  /** `KAPP_LAMBDA_CONTROLLER_CONFIG_TTL_SECONDS`, in ms; unset: the pipeline's default (10 s). */
  controllerConfigTtlMs?: number;
  /** `KAPP_LAMBDA_LOG_LEVEL`. */
  logLevel: (typeof LOG_LEVELS)[number];
  /** `KAPP_LAMBDA_METRICS`: how reconcile metrics are published (`../observe/metrics.ts`). */
  metrics: 'cluster' | 'object' | 'off';
  /** `KAPP_LAMBDA_HARDEN_ADDON`: loaded at init; the function does not start without it. */
  hardenAddon: string;
  /** `KAPP_LAMBDA_URL_POLICY` and `KAPP_LAMBDA_URL_ALLOW`; enforced unless set to `off`. */
  urlPolicy: UrlPolicy;
  /**
   * `KAPP_LAMBDA_MAX_RECEIVE_COUNT`, default 5: must equal the `maxReceiveCount` of the queue's
   * redrive policy (see `pipeline/retry-bound.ts`).
   */
  maxReceiveCount: number;
  /** `KAPP_LAMBDA_RECORD_CONCURRENCY`, default the stage's {@link STAGE_RECORD_CONCURRENCY}. */
  recordConcurrency: number;
  /**
   * `KAPP_LAMBDA_CLUSTER_SHARE` and `KAPP_LAMBDA_NAMESPACE_SHARE` (default
   * `defaultNamespaceShare` of the cluster share, never above it): the fair shares of the
   * function's slots (`../lease/shares.ts`). Unset: no shares.
   */
  shares?: { cluster: number; namespace: number };
  /**
   * `KAPP_LAMBDA_DISPATCHED=true`: the function runs behind its stage's dispatcher
   * (`./dispatched.ts`); its edge work (proof, sender check, shares, early delete) is the
   * dispatcher's, and `senderCheck` and `shares` are then not used. Unset: it consumes its queue.
   */
  dispatched?: true;
  /**
   * `KAPP_LAMBDA_SHARING=cluster` (only with `dispatched`): the store seen through the cluster's
   * sharing domain (`../store/domain.ts`). Unset: `fleet`, the claims shared fleet-wide.
   */
  sharing?: 'cluster';
  /**
   * `KAPP_LAMBDA_UNKEYED_GROUPS=accept`: a keyed cluster's record is also taken in its object's
   * unkeyed group (`EdgeChecks.acceptUnkeyed`, for an upgrade's time). Unset: refused.
   */
  acceptUnkeyedGroups?: true;
}

/**
 * The fair shares of `KAPP_LAMBDA_CLUSTER_SHARE` and `KAPP_LAMBDA_NAMESPACE_SHARE` (default
 * `defaultNamespaceShare` of the cluster share, never above it); none without a cluster share.
 */
function sharesOf(cluster: number | undefined, namespace: number | undefined): LambdaConfig['shares'] {
  if (cluster === undefined) return undefined;
  return { cluster, namespace: Math.min(cluster, namespace ?? defaultNamespaceShare(cluster)) };
}

/** Where a function finds its clusters at run time (`../kube/fleet-registry.ts`). */
export interface ClusterRegistryConfig {
  /** The registry's documents. */
  location: RegistryLocation;
  /** `token` clusters' tokens: Secrets Manager, or files under a directory. */
  secrets: { kind: 'aws-secretsmanager' } | { kind: 'dir'; root: string };
  /** Document (and token) cache lifetime, ms. */
  ttlMs: number;
}

/** The environment was not valid; `problems` lists `<VAR>: <problem>` for each bad variable. */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  constructor(
    stage: PipelineStage,
    /** One `<VAR>: <problem>` per bad variable. */
    readonly problems: readonly string[],
  ) {
    super(`invalid configuration of the ${stage} function: ${problems.join('; ')}`);
  }
}

/** One optional URL variable per function with a queue. */
const QUEUE_ENV_SCHEMA = Object.fromEntries(PIPELINE_STAGES.map((s) => [queueUrlEnv(s), optional(httpUrl)]));

function validLocation(v: string): boolean {
  try {
    parseRegistryLocation(v);
    return true;
  } catch {
    return false;
  }
}

const KUBECONFIG_PATH = z
  .string({ error: 'required (path of a kubeconfig file)' })
  .refine(isAbsolute, { error: 'expected an absolute path' });

/**
 * `KAPP_LAMBDA_MAX_INLINE_BYTES`: an integer of bytes, 1..`MAX_INLINE_BYTES_CEILING`, optional.
 * One rule for the Lambda functions and `npm start` (`scripts/start-settings.ts`).
 */
export const MAX_INLINE_BYTES_SETTING = optional(intText(1, MAX_INLINE_BYTES_CEILING, true));

/**
 * `KAPP_LAMBDA_FETCH_STALL_SECONDS`: the stall window of a fetch, seconds, 1..900 (a Lambda
 * function's longest run), optional. One rule for the Lambda functions and `npm start`.
 */
export const FETCH_STALL_SECONDS_SETTING = optional(intText(1, 900, true));

/** `KAPP_LAMBDA_FETCH_STALL_MIN_BYTES`: the byte floor of a stall window, 1..1 MiB, optional. */
export const FETCH_STALL_MIN_BYTES_SETTING = optional(intText(1, 1024 * 1024, true));

/**
 * The stall rule the two settings make (`../fetch/stall.ts`): a value unset takes its default;
 * both unset, `undefined` (the fetch's default applies).
 *
 * @param seconds - `KAPP_LAMBDA_FETCH_STALL_SECONDS`, parsed
 * @param minBytes - `KAPP_LAMBDA_FETCH_STALL_MIN_BYTES`, parsed
 */
export function fetchStallRule(seconds: number | undefined, minBytes: number | undefined): StallRule | undefined {
  if (seconds === undefined && minBytes === undefined) return undefined;
  return {
    windowMs: (seconds ?? DEFAULT_FETCH_STALL_SECONDS) * 1000,
    minBytes: minBytes ?? DEFAULT_FETCH_STALL_MIN_BYTES,
  };
}

const EnvSchema = z.object({
  AWS_REGION: required(z.string({ error: 'required' }).regex(/^[a-z0-9-]+$/, { error: 'expected a region name' })),
  KAPP_LAMBDA_BUCKET: required(
    z
      .string({ error: 'required' })
      .regex(/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/, { error: 'expected an S3 bucket name' }),
  ),
  KAPP_LAMBDA_BUCKET_PREFIX: z.preprocess(blankToUndefined, z.string().default('')),
  KAPP_LAMBDA_S3_ENDPOINT: optional(httpUrl),
  KAPP_LAMBDA_SQS_ENDPOINT: optional(httpUrl),
  KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: optional(httpUrl),
  ...QUEUE_ENV_SCHEMA,
  KAPP_LAMBDA_KUBECONFIG: required(KUBECONFIG_PATH),
  KAPP_LAMBDA_CLUSTER_REGISTRY: optional(
    z.string().refine(validLocation, { error: 'expected s3://bucket/prefix or file:///absolute/dir' }),
  ),
  KAPP_LAMBDA_CLUSTER_SECRETS: optional(
    z.string().refine((v) => v === 'aws-secretsmanager' || (validLocation(v) && v.startsWith('file:')), {
      error: 'expected aws-secretsmanager or file:///absolute/dir',
    }),
  ),
  KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS: optional(intText(1, 3600)),
  KAPP_LAMBDA_SENDER_CHECK: z.preprocess(blankToUndefined, z.enum(['registry', 'off']).default('off')),
  KAPP_LAMBDA_UNKEYED_GROUPS: z.preprocess(
    blankToUndefined,
    z.enum(['refuse', 'accept'], { error: 'expected refuse or accept' }).default('refuse'),
  ),
  KAPP_LAMBDA_FUNCTION_SENDERS: optional(
    z.string().transform((v, ctx) => {
      const entries = commaList(v);
      const parsed = entries.map(parseFunctionSender);
      if (parsed.every((p) => p !== undefined)) return parsed;
      // A bare id is the format before each role was bound to its function: taking it as before
      // would let that role send any event (docs/decisions.md D6), so the function refuses to start instead.
      const bare = entries.some((e) => IAM_ROLE_ID_PATTERN.test(e));
      ctx.addIssue({
        code: 'custom',
        message: `expected a comma list of <function>=<IAM role id> entries, e.g. fetch=AROA…,template=AROA… (function: ${PIPELINE_STAGES.join(', ')})${bare ? '; bare role ids are no longer accepted: name the function each role belongs to (the CDK app does)' : ''}`,
      });
      return z.NEVER;
    }),
  ),
  KAPP_LAMBDA_CELL_CLUSTER: optional(
    z.string().regex(CLUSTER_ID_PATTERN, { error: 'expected a cluster id (a DNS-1123 label)' }),
  ),
  KAPP_LAMBDA_CLUSTERS: optional(
    z
      .string()
      .transform(commaList)
      .pipe(z.array(z.string()).min(1, { error: 'expected a comma list of kubeconfig contexts' })),
  ),
  KAPP_LAMBDA_TMP_DIR: absPath('/tmp'),
  KAPP_LAMBDA_BIN_DIR: absPath('/opt/bin'),
  KAPP_LAMBDA_HARDEN_ADDON: absPath('/opt/lib/kapp-lambda-harden.node'),
  KAPP_LAMBDA_TOOL_VERSIONS: required(
    z
      .string({ error: 'required (JSON object of tool versions)' })
      .pipe(json(z.record(z.string().regex(/^[a-z0-9-]+$/), z.string().min(1)), 'an object of tool → version strings')),
  ),
  KAPP_LAMBDA_TOOL_TIMEOUT_MS: optional(intText(1000, 900_000)),
  KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS: optional(intText(1, 86_400)),
  KAPP_LAMBDA_MAX_INLINE_BYTES: MAX_INLINE_BYTES_SETTING,
  KAPP_LAMBDA_FETCH_STALL_SECONDS: FETCH_STALL_SECONDS_SETTING,
  KAPP_LAMBDA_FETCH_STALL_MIN_BYTES: FETCH_STALL_MIN_BYTES_SETTING,
  KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS: optional(z.string().pipe(json(z.array(z.string()), 'an array of strings'))),
  KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY: optional(z.string()),
  KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD: optional(z.string()),
  KAPP_LAMBDA_APP_MINIMUM_SYNC_PERIOD: optional(z.string()),
  KAPP_LAMBDA_MAX_RECEIVE_COUNT: optional(intText(1, 1000)),
  KAPP_LAMBDA_RECORD_CONCURRENCY: optional(intText(1, 10)),
  KAPP_LAMBDA_CLUSTER_SHARE: optional(intText(1, 10_000)),
  KAPP_LAMBDA_NAMESPACE_SHARE: optional(intText(1, 10_000)),
  KAPP_LAMBDA_KUBE_API_QPS: optional(intText(0, 100_000)),
  KAPP_LAMBDA_KUBE_API_BURST: optional(intText(1, 100_000)),
  KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: optional(
    z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, { error: 'expected a namespace name' }),
  ),
  KAPP_LAMBDA_CONTROLLER_CONFIG_TTL_SECONDS: optional(intText(0, 3600)),
  KAPP_LAMBDA_DISPATCHED: z.preprocess(blankToUndefined, z.enum(['true', 'false']).default('false')),
  KAPP_LAMBDA_SHARING: z.preprocess(blankToUndefined, z.enum(['fleet', 'cluster']).default('fleet')),
  KAPP_LAMBDA_LOG_LEVEL: z.preprocess(blankToUndefined, z.enum(LOG_LEVELS).default('info')),
  KAPP_LAMBDA_METRICS: z.preprocess(blankToUndefined, z.enum(['cluster', 'object', 'off']).default('cluster')),
  KAPP_LAMBDA_URL_POLICY: z.preprocess(blankToUndefined, z.enum(['enforce', 'off']).default('enforce')),
  KAPP_LAMBDA_URL_ALLOW: optional(
    z.string().refine(
      (v) => {
        try {
          new UrlPolicyChecker(parseUrlPolicy('enforce', v, 'enforce'));
          return true;
        } catch {
          return false;
        }
      },
      { error: 'expected a comma list of host, host:port or CIDR entries' },
    ),
  ),
});

/**
 * Why `KAPP_LAMBDA_SHARING=cluster` is refused without `KAPP_LAMBDA_DISPATCHED=true`: a domain is
 * fenced by the run's session policy and named by its keyring tag, and both exist only behind the
 * dispatcher (in the queue mode every cluster's runs hold one role, so a domain would fence nothing).
 */
export const SHARING_NEEDS_DISPATCHED =
  "KAPP_LAMBDA_SHARING: cluster needs KAPP_LAMBDA_DISPATCHED=true (only a run session fences a cluster's domain)";

/**
 * Parses and validates the function's environment (the variables: {@link LAMBDA_ENV_DOCS}).
 *
 * @param stage - the function being configured; decides which queue URLs are required.
 * @param env - the environment, e.g. `process.env` (only the variables above are read).
 * @returns the settings, defaults filled in.
 * @throws ConfigError `invalid configuration of the <stage> function: <VAR>: <problem>; …`
 *   naming every bad variable. Values are never echoed (a misplaced secret stays out of logs).
 */
export function parseLambdaEnv(stage: PipelineStage, env: Readonly<Record<string, string | undefined>>): LambdaConfig {
  // The kubeconfig is required unless the fleet's cluster registry is used.
  const hasRegistry = blankToUndefined(env.KAPP_LAMBDA_CLUSTER_REGISTRY) !== undefined;
  const schema = hasRegistry ? EnvSchema.extend({ KAPP_LAMBDA_KUBECONFIG: optional(KUBECONFIG_PATH) }) : EnvSchema;
  // Tool versions key tool outputs (render cache, pinned fetches): a function running no tool
  // (install) has none to key, and an unset value is `{}`.
  const noVersions = STAGE_TOOLS[stage].length === 0 && blankToUndefined(env.KAPP_LAMBDA_TOOL_VERSIONS) === undefined;
  const r = schema.safeParse(noVersions ? { ...env, KAPP_LAMBDA_TOOL_VERSIONS: '{}' } : env);
  const problems: string[] = [];
  if (!r.success) {
    for (const i of r.error.issues) {
      const line = envProblem(i);
      if (!problems.includes(line)) problems.push(line);
    }
  }
  if (!hasRegistry && blankToUndefined(env.KAPP_LAMBDA_SENDER_CHECK) === 'registry') {
    problems.push(
      'KAPP_LAMBDA_SENDER_CHECK: registry needs KAPP_LAMBDA_CLUSTER_REGISTRY (the forwarders are named there)',
    );
  }
  // The cell's check is part of the sender check: without it an event naming another cluster would run.
  if (
    blankToUndefined(env.KAPP_LAMBDA_CELL_CLUSTER) !== undefined &&
    blankToUndefined(env.KAPP_LAMBDA_SENDER_CHECK) !== 'registry'
  ) {
    problems.push(
      'KAPP_LAMBDA_CELL_CLUSTER: needs KAPP_LAMBDA_SENDER_CHECK=registry (the check that refuses other clusters)',
    );
  }
  // Behind the dispatcher the run gets its cluster's keys in each batch; the root key opens every
  // cluster's artifacts, so a dispatched function must not even be told where it is.
  if (blankToUndefined(env.KAPP_LAMBDA_DISPATCHED) === 'true') {
    for (const name of ['KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET', 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY']) {
      if (blankToUndefined(env[name]) !== undefined) {
        problems.push(`${name}: must be unset with KAPP_LAMBDA_DISPATCHED=true (the dispatcher derives the keys)`);
      }
    }
  }
  if (
    blankToUndefined(env.KAPP_LAMBDA_SHARING) === 'cluster' &&
    blankToUndefined(env.KAPP_LAMBDA_DISPATCHED) !== 'true'
  ) {
    problems.push(SHARING_NEEDS_DISPATCHED);
  }
  if (hasRegistry && blankToUndefined(env.KAPP_LAMBDA_KUBECONFIG) !== undefined) {
    problems.push('KAPP_LAMBDA_CLUSTER_REGISTRY: set either it or KAPP_LAMBDA_KUBECONFIG, not both');
  }
  // The sender check trusts a record's SenderId only once the record is proven a message of the
  // function's own queue (`EntryDeps.prover`), which needs that queue's URL.
  if (
    blankToUndefined(env.KAPP_LAMBDA_SENDER_CHECK) === 'registry' &&
    blankToUndefined(env[queueUrlEnv(stage)]) === undefined &&
    !(NEXT_STAGES[stage] ?? []).includes(stage)
  ) {
    problems.push(
      `${queueUrlEnv(stage)}: required with KAPP_LAMBDA_SENDER_CHECK=registry (each record is proven a message of the function's own queue before its SenderId is trusted)`,
    );
  }
  for (const next of NEXT_STAGES[stage] ?? []) {
    const name = queueUrlEnv(next);
    if (blankToUndefined(env[name]) === undefined)
      problems.push(`${name}: required (the ${stage} function sends to it)`);
  }
  let timer: TimerConfig = {};
  if (r.success) {
    try {
      timer = parseControllerSyncConfig({
        appDefaultSyncPeriod: r.data.KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD,
        appMinimumSyncPeriod: r.data.KAPP_LAMBDA_APP_MINIMUM_SYNC_PERIOD,
      });
    } catch (cause) {
      problems.push(`KAPP_LAMBDA_APP_*_SYNC_PERIOD: ${(cause as Error).message}`);
    }
  }
  if (!r.success || problems.length > 0) throw new ConfigError(stage, problems);
  const e = r.data;
  const queueUrls: Partial<Record<PipelineStage, string>> = {};
  for (const s of PIPELINE_STAGES) {
    const url = (e as Record<string, unknown>)[queueUrlEnv(s)];
    if (typeof url === 'string' && url) queueUrls[s] = url;
  }
  const config: LambdaConfig = {
    stage,
    region: e.AWS_REGION,
    bucket: e.KAPP_LAMBDA_BUCKET,
    bucketPrefix: e.KAPP_LAMBDA_BUCKET_PREFIX,
    queueUrls,
    kubeconfigPath: e.KAPP_LAMBDA_KUBECONFIG ?? '',
    tmpDir: e.KAPP_LAMBDA_TMP_DIR,
    binDir: e.KAPP_LAMBDA_BIN_DIR,
    hardenAddon: e.KAPP_LAMBDA_HARDEN_ADDON,
    toolVersions: e.KAPP_LAMBDA_TOOL_VERSIONS,
    kappDeployRawOptions: e.KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS ?? [],
    kubeApi: {
      qps: e.KAPP_LAMBDA_KUBE_API_QPS ?? DEFAULT_KUBE_API_QPS,
      burst: e.KAPP_LAMBDA_KUBE_API_BURST ?? DEFAULT_KUBE_API_BURST,
    },
    timer,
    logLevel: e.KAPP_LAMBDA_LOG_LEVEL,
    metrics: e.KAPP_LAMBDA_METRICS,
    urlPolicy: parseUrlPolicy(e.KAPP_LAMBDA_URL_POLICY, e.KAPP_LAMBDA_URL_ALLOW, 'enforce'),
    maxReceiveCount: e.KAPP_LAMBDA_MAX_RECEIVE_COUNT ?? DEFAULT_MAX_ATTEMPTS,
    recordConcurrency: e.KAPP_LAMBDA_RECORD_CONCURRENCY ?? STAGE_RECORD_CONCURRENCY[stage],
  };
  if (e.KAPP_LAMBDA_S3_ENDPOINT) config.s3Endpoint = e.KAPP_LAMBDA_S3_ENDPOINT;
  if (e.KAPP_LAMBDA_SQS_ENDPOINT) config.sqsEndpoint = e.KAPP_LAMBDA_SQS_ENDPOINT;
  if (e.KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT) config.secretsManagerEndpoint = e.KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT;
  if (e.KAPP_LAMBDA_CLUSTER_REGISTRY) {
    const secrets = e.KAPP_LAMBDA_CLUSTER_SECRETS;
    const dir = secrets?.startsWith('file:') ? parseRegistryLocation(secrets) : undefined;
    config.clusterRegistry = {
      location: parseRegistryLocation(e.KAPP_LAMBDA_CLUSTER_REGISTRY),
      secrets: dir?.kind === 'dir' ? { kind: 'dir', root: dir.root } : { kind: 'aws-secretsmanager' },
      ttlMs: (e.KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS ?? 60) * 1000,
    };
  }
  if (e.KAPP_LAMBDA_CLUSTERS) config.clusterContexts = e.KAPP_LAMBDA_CLUSTERS;
  if (e.KAPP_LAMBDA_SENDER_CHECK === 'registry') {
    config.senderCheck = {
      functionSenders: e.KAPP_LAMBDA_FUNCTION_SENDERS ?? [],
      ...(e.KAPP_LAMBDA_CELL_CLUSTER ? { cell: e.KAPP_LAMBDA_CELL_CLUSTER } : {}),
    };
  }
  const shares = sharesOf(e.KAPP_LAMBDA_CLUSTER_SHARE, e.KAPP_LAMBDA_NAMESPACE_SHARE);
  if (shares) config.shares = shares;
  if (e.KAPP_LAMBDA_TOOL_TIMEOUT_MS !== undefined) config.toolTimeoutMs = e.KAPP_LAMBDA_TOOL_TIMEOUT_MS;
  if (e.KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS !== undefined)
    config.maxDeployWaitMs = e.KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS * 1000;
  if (e.KAPP_LAMBDA_MAX_INLINE_BYTES !== undefined) config.maxInlineBytes = e.KAPP_LAMBDA_MAX_INLINE_BYTES;
  const stall = fetchStallRule(e.KAPP_LAMBDA_FETCH_STALL_SECONDS, e.KAPP_LAMBDA_FETCH_STALL_MIN_BYTES);
  if (stall) config.fetchStall = stall;
  if (e.KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE)
    config.controllerConfigNamespace = e.KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE;
  if (e.KAPP_LAMBDA_CONTROLLER_CONFIG_TTL_SECONDS !== undefined)
    config.controllerConfigTtlMs = e.KAPP_LAMBDA_CONTROLLER_CONFIG_TTL_SECONDS * 1000;
  if (e.KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY) config.dangerousSkipTLSVerify = e.KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY;
  if (e.KAPP_LAMBDA_DISPATCHED === 'true') config.dispatched = true;
  if (e.KAPP_LAMBDA_SHARING === 'cluster') config.sharing = 'cluster';
  if (e.KAPP_LAMBDA_UNKEYED_GROUPS === 'accept') config.acceptUnkeyedGroups = true;
  return config;
}

/**
 * Settings of a dispatcher function (the shared mode, docs/decisions.md D15; `functions/dispatch/index.ts`):
 * the subset of a stage function's {@link LambdaConfig} its edge work needs, and the run role,
 * the stage function and the endpoints of its STS and Lambda clients.
 */
export interface DispatcherConfig
  extends Pick<
    LambdaConfig,
    | 'stage'
    | 'region'
    | 'bucket'
    | 'bucketPrefix'
    | 's3Endpoint'
    | 'sqsEndpoint'
    | 'secretsManagerEndpoint'
    | 'logLevel'
    | 'maxReceiveCount'
    | 'shares'
    | 'acceptUnkeyedGroups'
  > {
  /** {@link queueUrlEnv}`(<stage>)`: the stage's queue, which the dispatcher consumes and sends copies to. */
  queueUrl: string;
  /** `KAPP_LAMBDA_CLUSTER_REGISTRY` (an `s3://` one: its bucket and prefix are in the run sessions' policy) and the rest. */
  clusterRegistry: ClusterRegistryConfig & { location: { kind: 's3' } };
  /** `KAPP_LAMBDA_SENDER_CHECK=registry`: the run roles' ids and the dispatcher's own; unset: no check. */
  senderCheck?: {
    /** `KAPP_LAMBDA_FUNCTION_SENDERS`: each stage's run role id. */
    functionSenders: FunctionSender[];
    /** `KAPP_LAMBDA_RECEIVER_ROLE_ID`. */
    receiverRoleId: string;
  };
  /** `KAPP_LAMBDA_RUN_ROLE_ARN`. */
  runRoleArn: string;
  /** The run role ARN's partition (`aws`, `aws-cn`, …) and 12-digit account. */
  partition: string;
  account: string;
  /** `KAPP_LAMBDA_STAGE_FUNCTION`. */
  stageFunction: string;
  /** `KAPP_LAMBDA_STS_ENDPOINT`. */
  stsEndpoint?: string;
  /** `KAPP_LAMBDA_LAMBDA_ENDPOINT`. */
  lambdaEndpoint?: string;
  /**
   * `KAPP_LAMBDA_SHARING` (default `fleet`): in `cluster` sharing the run sessions grant each
   * cluster its sharing domain's claims (`d/<tag>/…`) instead of the fleet's (`runSessionPolicy`'s
   * `target.sharing`), and the source poll's member clusters are the dispatchers' own records
   * (`StorePollMembers` of `./dispatch.ts`), not the fleet's source poll records.
   */
  sharing: 'fleet' | 'cluster';
}

/** An IAM role ARN: partition, account, path and name. */
const ROLE_ARN = /^arn:(aws(?:-[a-z]+)*):iam::(\d{12}):role\/[\w+=,.@/-]{1,512}$/;

/** The dispatcher's own variables (the others are {@link EnvSchema}'s). */
const DispatcherOwnSchema = z.object({
  KAPP_LAMBDA_DISPATCH_STAGE: required(
    z.enum(PIPELINE_STAGES, { error: `expected one of ${PIPELINE_STAGES.join(', ')}` }),
  ),
  KAPP_LAMBDA_RUN_ROLE_ARN: required(
    z.string({ error: 'required' }).regex(ROLE_ARN, { error: 'expected an IAM role ARN' }),
  ),
  KAPP_LAMBDA_STAGE_FUNCTION: required(
    z
      .string({ error: 'required' })
      .regex(/^[A-Za-z0-9_:.$-]{1,170}$/, { error: 'expected a Lambda function name or ARN' }),
  ),
  KAPP_LAMBDA_RECEIVER_ROLE_ID: optional(
    z.string().regex(IAM_ROLE_ID_PATTERN, { error: 'expected an IAM role id (AROA…)' }),
  ),
  KAPP_LAMBDA_STS_ENDPOINT: optional(httpUrl),
  KAPP_LAMBDA_LAMBDA_ENDPOINT: optional(httpUrl),
  KAPP_LAMBDA_SHARING: z.preprocess(
    blankToUndefined,
    z.enum(['fleet', 'cluster'], { error: 'expected fleet or cluster' }).default('fleet'),
  ),
});

/**
 * Parses and validates a dispatcher's environment (the variables: {@link LAMBDA_ENV_DOCS}, the
 * dispatchers' rows and the stage functions' rows it shares: region, bucket, endpoints, its
 * stage's queue URL, the cluster registry, the sender check, the shares, the receive count, the
 * log level). The root key's secret is read by `artifactKeyringFromEnv` at cold start, not here.
 *
 * @throws ConfigError naming every bad variable (as {@link parseLambdaEnv}; values never echoed),
 *   under the stage given, or `fetch` when the stage itself is bad.
 */
export function parseDispatcherEnv(env: Readonly<Record<string, string | undefined>>): DispatcherConfig {
  const schema = EnvSchema.pick({
    AWS_REGION: true,
    KAPP_LAMBDA_BUCKET: true,
    KAPP_LAMBDA_BUCKET_PREFIX: true,
    KAPP_LAMBDA_S3_ENDPOINT: true,
    KAPP_LAMBDA_SQS_ENDPOINT: true,
    KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: true,
    KAPP_LAMBDA_CLUSTER_SECRETS: true,
    KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS: true,
    KAPP_LAMBDA_SENDER_CHECK: true,
    KAPP_LAMBDA_FUNCTION_SENDERS: true,
    KAPP_LAMBDA_MAX_RECEIVE_COUNT: true,
    KAPP_LAMBDA_CLUSTER_SHARE: true,
    KAPP_LAMBDA_NAMESPACE_SHARE: true,
    KAPP_LAMBDA_LOG_LEVEL: true,
    KAPP_LAMBDA_SHARING: true,
    KAPP_LAMBDA_UNKEYED_GROUPS: true,
  })
    .extend(DispatcherOwnSchema.shape)
    .extend({
      KAPP_LAMBDA_CLUSTER_REGISTRY: required(
        z
          .string({ error: 'required (s3://bucket/prefix)' })
          .refine((v) => validLocation(v) && v.startsWith('s3:'), { error: 'expected s3://bucket/prefix' }),
      ),
    });
  const r = schema.safeParse(env);
  const stage = r.success
    ? r.data.KAPP_LAMBDA_DISPATCH_STAGE
    : (PIPELINE_STAGES as readonly string[]).includes(env.KAPP_LAMBDA_DISPATCH_STAGE ?? '')
      ? (env.KAPP_LAMBDA_DISPATCH_STAGE as PipelineStage)
      : 'fetch';
  const problems: string[] = [];
  if (!r.success) {
    for (const i of r.error.issues) {
      const line = envProblem(i);
      if (!problems.includes(line)) problems.push(line);
    }
  }
  const queueName = queueUrlEnv(stage);
  const queueUrl = blankToUndefined(env[queueName]);
  if (queueUrl === undefined || !httpUrl.safeParse(queueUrl).success) {
    problems.push(`${queueName}: required (the queue the dispatcher consumes), an http(s) URL`);
  }
  if (
    blankToUndefined(env.KAPP_LAMBDA_SENDER_CHECK) === 'registry' &&
    blankToUndefined(env.KAPP_LAMBDA_RECEIVER_ROLE_ID) === undefined
  ) {
    problems.push(
      "KAPP_LAMBDA_RECEIVER_ROLE_ID: required with KAPP_LAMBDA_SENDER_CHECK=registry (the sender of the dispatcher's own copies)",
    );
  }
  // The run sessions' policy (`runSessionPolicy`) names the artifact bucket's keys from its root.
  if (blankToUndefined(env.KAPP_LAMBDA_BUCKET_PREFIX) !== undefined) {
    problems.push(
      "KAPP_LAMBDA_BUCKET_PREFIX: not supported by a dispatcher (the run sessions' policy names the bucket's keys from its root)",
    );
  }
  if (!r.success || problems.length > 0) throw new ConfigError(stage, problems);
  const e = r.data;
  const location = parseRegistryLocation(e.KAPP_LAMBDA_CLUSTER_REGISTRY);
  const [, partition, account] = ROLE_ARN.exec(e.KAPP_LAMBDA_RUN_ROLE_ARN) as RegExpExecArray;
  const secrets = e.KAPP_LAMBDA_CLUSTER_SECRETS;
  const dir = secrets?.startsWith('file:') ? parseRegistryLocation(secrets) : undefined;
  const config: DispatcherConfig = {
    stage,
    region: e.AWS_REGION,
    bucket: e.KAPP_LAMBDA_BUCKET,
    bucketPrefix: e.KAPP_LAMBDA_BUCKET_PREFIX,
    queueUrl: queueUrl as string,
    clusterRegistry: {
      location: location as Extract<RegistryLocation, { kind: 's3' }>,
      secrets: dir?.kind === 'dir' ? { kind: 'dir', root: dir.root } : { kind: 'aws-secretsmanager' },
      ttlMs: (e.KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS ?? 60) * 1000,
    },
    runRoleArn: e.KAPP_LAMBDA_RUN_ROLE_ARN,
    partition: partition as string,
    account: account as string,
    stageFunction: e.KAPP_LAMBDA_STAGE_FUNCTION,
    logLevel: e.KAPP_LAMBDA_LOG_LEVEL,
    maxReceiveCount: e.KAPP_LAMBDA_MAX_RECEIVE_COUNT ?? DEFAULT_MAX_ATTEMPTS,
    sharing: e.KAPP_LAMBDA_SHARING,
  };
  if (e.KAPP_LAMBDA_S3_ENDPOINT) config.s3Endpoint = e.KAPP_LAMBDA_S3_ENDPOINT;
  if (e.KAPP_LAMBDA_SQS_ENDPOINT) config.sqsEndpoint = e.KAPP_LAMBDA_SQS_ENDPOINT;
  if (e.KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT) config.secretsManagerEndpoint = e.KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT;
  if (e.KAPP_LAMBDA_STS_ENDPOINT) config.stsEndpoint = e.KAPP_LAMBDA_STS_ENDPOINT;
  if (e.KAPP_LAMBDA_LAMBDA_ENDPOINT) config.lambdaEndpoint = e.KAPP_LAMBDA_LAMBDA_ENDPOINT;
  if (e.KAPP_LAMBDA_SENDER_CHECK === 'registry') {
    config.senderCheck = {
      functionSenders: e.KAPP_LAMBDA_FUNCTION_SENDERS ?? [],
      receiverRoleId: e.KAPP_LAMBDA_RECEIVER_ROLE_ID as string,
    };
  }
  const shares = sharesOf(e.KAPP_LAMBDA_CLUSTER_SHARE, e.KAPP_LAMBDA_NAMESPACE_SHARE);
  if (shares) config.shares = shares;
  if (e.KAPP_LAMBDA_UNKEYED_GROUPS === 'accept') config.acceptUnkeyedGroups = true;
  return config;
}
