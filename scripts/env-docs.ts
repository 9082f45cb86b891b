/**
 * The environment variables of the scripts (`npm start`, the demo, `npm run receipts`,
 * `npm run cluster`), of the CDK app, of the build and its caches and of the test runner, and the ambient
 * variables kapp-lambda's own code reads from its surroundings. These programs read
 * `process.env` inline at their top level (importing them runs them), so their rows live here,
 * beside them, rather than in each file; `docs/configuration.md`'s tables are generated from
 * them (`npm run gen:config`) and `test/unit/config-reference.test.ts` fails when a variable read
 * in the code has no row.
 *
 * @module
 */
import type { SettingDoc } from '../functions/lib/api/env.js';

/** `npm start` (`./start.ts`): the embedded runtime's settings. */
export const START_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'KUBECONFIG',
    default: '`~/.kube/config`',
    meaning:
      'kubeconfig whose current context is served (first file of a list); none: in a Pod (`KUBERNETES_SERVICE_HOST` set) the cluster it runs in, else start a local control plane, apply the CRDs and print its kubeconfig path',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_SERVICEACCOUNT_DIR',
    default: '`/var/run/secrets/kubernetes.io/serviceaccount`',
    meaning:
      "in a cluster (no kubeconfig, `KUBERNETES_SERVICE_HOST` set): the directory holding the ServiceAccount's `token` (re-read every 60 s), `ca.crt` and `namespace`; the cluster is served as `in-cluster`",
    readBy: '`scripts/start-settings.ts` `kubeSourceOf`',
  },
  {
    name: 'KAPP_LAMBDA_SHARED_TOOL_UID',
    default: 'unset (refuse)',
    meaning:
      "in a cluster: `allow` starts as a non-root user, whose tools then run under its uid and can read its ServiceAccount token and the artifact root key (a warning is logged); unset, such a start exits 1. As root (the release's Deployment) each tool run gets a uid of its own",
    readBy: '`scripts/start-settings.ts` `inClusterToolIsolation`',
  },
  {
    name: 'KAPP_LAMBDA_CONTEXTS',
    default: 'the current context',
    meaning: 'comma list of contexts to serve (several clusters at once; a `cluster` label on the metrics)',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_NAMESPACES',
    default: 'all',
    meaning: 'comma list of namespaces to watch; also names the Lease (`kapp-lambda-forwarder-<hash>`)',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_CONCURRENCY',
    default: '4',
    meaning: 'objects reconciled at once',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_STORE',
    default: '`~/.cache/kapp-lambda/store`',
    meaning: 'local object store directory (artifacts, render cache, receipts)',
    readBy: '`scripts/start.ts`; `npm run receipts`',
  },
  {
    name: 'KAPP_LAMBDA_CACHE',
    default: '`$XDG_CACHE_HOME/kapp-lambda`, else `~/.cache/kapp-lambda`',
    meaning: "tool cache root (built tools, layers, bundles, the store's default)",
    readBy: '`layers/gobuild.ts` `cacheRoot`',
  },
  {
    name: 'KAPP_LAMBDA_LEASE_NAMESPACE',
    default: '`kapp-lambda`',
    meaning: 'namespace of the leader-election Lease (must exist)',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_LEADER_ELECTION',
    default: 'on',
    meaning: '`off`: act without a Lease (only when nothing else serves the cluster)',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_METRICS_ADDRESS',
    default: '`127.0.0.1:8080`',
    meaning: "where `GET /metrics` serves kapp-controller's reconcile series; `off`: no server",
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_URL_POLICY',
    default: '`off`',
    meaning: "`enforce`: the cloud mode's URL policy ([security.md](security.md))",
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_URL_ALLOW',
    default: 'none',
    meaning: 'comma list of exceptions to the policy: `host`, `host:port` or CIDR',
    readBy: '`scripts/start.ts`',
  },
  {
    name: 'KAPP_LAMBDA_MAX_INLINE_BYTES',
    default: '`67108864` (64 MiB)',
    meaning:
      "cap on an App's inline fetch content (`paths` plus each `pathsFrom` Secret's and ConfigMap's data) and, apart, on the Secrets and ConfigMaps its fetch and template read besides, bytes (1..1073741824), as the Lambda functions' variable; an invalid value exits 2",
    readBy: '`scripts/start-settings.ts`',
  },
  {
    name: 'KAPP_LAMBDA_FETCH_STALL_SECONDS',
    default: '`60`',
    meaning:
      "stall window of a fetch, seconds (1..900): a tool's connection through the egress proxy or an http source's download that brings fewer than `KAPP_LAMBDA_FETCH_STALL_MIN_BYTES` in a window is cut, and status names the host and the rule; as the Lambda functions' variable; an invalid value exits 2",
    readBy: '`scripts/start-settings.ts`',
  },
  {
    name: 'KAPP_LAMBDA_FETCH_STALL_MIN_BYTES',
    default: '`4096`',
    meaning:
      "byte floor of each stall window (1..1048576), as the Lambda functions' variable; an invalid value exits 2",
    readBy: '`scripts/start-settings.ts`',
  },
  {
    name: 'KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE',
    default: '`kapp-lambda`',
    meaning:
      "namespace of each cluster's `kapp-controller-config` Secret or ConfigMap (flag `--controller-config-namespace`, which wins); kapp-controller reads its own namespace, so a cluster it ran on keeps the object in `kapp-controller`: `npm start -- --controller-config-namespace kapp-controller`",
    readBy: '`scripts/start-settings.ts`',
  },
];

/** The demo, `npm run receipts` and `npm run cluster`. */
export const SCRIPTS_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'DEMO_TIMEOUT_SECONDS',
    default: '300',
    meaning: 'how long the demo waits for every App, the repository and the install',
    readBy: '`scripts/demo.ts`',
  },
  {
    name: ['KAPP_LAMBDA_BUCKET', 'KAPP_LAMBDA_BUCKET_PREFIX'],
    default: "unset, `''`",
    meaning:
      "`npm run receipts`' store when set: `s3://$KAPP_LAMBDA_BUCKET/$KAPP_LAMBDA_BUCKET_PREFIX` (`--store` overrides)",
    readBy: '`scripts/receipts.ts`',
  },
  {
    name: 'KAPP_LAMBDA_STORE',
    default: '`~/.cache/kapp-lambda/store`',
    meaning: "`npm run receipts`' store otherwise",
    readBy: '`scripts/receipts.ts`',
  },
  {
    name: 'KAPP_LAMBDA_CLUSTER_REGISTRY',
    default: 'none',
    meaning: "`npm run cluster`'s `--registry` when not given",
    readBy: '`scripts/cluster-registry.ts`',
  },
  {
    name: ['KAPP_LAMBDA_S3_ENDPOINT', 'AWS_REGION'],
    default: "AWS, the SDK's",
    meaning: 'S3-compatible endpoint and region of a registry in S3',
    readBy: '`scripts/cluster-registry.ts`',
  },
  {
    name: 'KAPP_LAMBDA_IAM_ENDPOINT',
    default: "AWS, the SDK's",
    meaning:
      "IAM endpoint of `npm run cluster -- join` (creates the cluster's forwarder role) and `remove --delete-role`, e.g. a test server",
    readBy: '`scripts/cluster-join.ts`',
  },
  {
    name: 'KUBECTL',
    default: '`kubectl` on `PATH`',
    meaning: 'the kubectl binary `npm run cluster -- join` applies with (`--kubectl` overrides)',
    readBy: '`scripts/cluster-join.ts`',
  },
];

/**
 * The CDK app (`infra/aws/app.ts`, which synthesizes at its top level). Its settings are context
 * keys, not variables (`docs/aws.md`); these are what the CDK CLI hands it.
 */
export const CDK_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: ['CDK_DEFAULT_ACCOUNT', 'CDK_DEFAULT_REGION'],
    default: 'set by the CDK CLI',
    meaning: "the stack's account and region",
    readBy: '`infra/aws/app.ts`',
  },
  {
    name: ['CDK_OUTDIR', 'CDK_CONTEXT_JSON'],
    default: 'set by the CDK CLI',
    meaning: 'where the assembly goes; the context as JSON (e.g. for a synth without the CLI)',
    readBy: "aws-cdk-lib's `App`",
  },
];

/** The tool cache every program shares (`layers/gobuild.ts` `cacheRoot`). */
export const BUILD_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'KAPP_LAMBDA_CACHE',
    default: '`$XDG_CACHE_HOME/kapp-lambda`, else `~/.cache/kapp-lambda`',
    meaning:
      'root of the built tools (`bin/`), wrapper modules (`gosrc/`), layers, bundles and the embedded store ([running.md](running.md#first-run-cost))',
    readBy: '`layers/gobuild.ts` `cacheRoot` (setup, build, start, demo, bench, tests)',
  },
  {
    name: 'KAPP_LAMBDA_TOOL_CACHE_REGISTRY',
    default: 'unset (build everything)',
    meaning:
      '`registry/repository` of a shared tool cache: `npm run setup` pulls each component it holds and the lock lists (tag `<name>-<version>-<recipe hash>-<os>-<arch>`) instead of building it; `--pull-cache`/`--push-cache` override it ([running.md](running.md#sharing-the-tool-cache-through-a-registry))',
    readBy: '`scripts/setup-plan.ts` `parseSetupArgs` (setup)',
  },
  {
    name: 'KAPP_LAMBDA_TOOL_CACHE_LOCK',
    default: '`layers/toolcache.lock.json` (committed)',
    meaning:
      'the tool cache lock: the sha256 of each pushed binary by tag; setup pulls only the tags it lists and runs a pulled binary only when its sha256 matches, `--push-cache` records what it pushes there ([running.md](running.md#sharing-the-tool-cache-through-a-registry))',
    readBy: '`scripts/setup-plan.ts` `parseSetupArgs` (setup)',
  },
  {
    name: 'XDG_CACHE_HOME',
    default: '`~/.cache`',
    meaning: 'parent of the default cache root',
    readBy: '`layers/gobuild.ts`',
  },
];

/** The test runner (`vitest.config.ts`) and its harness. */
export const TEST_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'KAPP_LAMBDA_TEST_WORKERS',
    default: '4',
    meaning: 'integration and e2e files run at once',
    readBy: '`vitest.config.ts`',
  },
  {
    name: ['AWS_LAMBDA_FUNCTION_TIMEOUT', 'AWS_LAMBDA_FUNCTION_MEMORY_SIZE'],
    default: '120, unset',
    meaning: 'the time limit and memory the Runtime Interface Emulator gives a function',
    readBy: '`test/harness/lambda.ts` (sets them for the emulator)',
  },
];

/**
 * Variables kapp-lambda's code reads but nobody sets for it: the process's surroundings (a Pod's,
 * a shell's), passed on or used as they are.
 */
export const AMBIENT_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: ['KUBERNETES_SERVICE_HOST', 'KUBERNETES_SERVICE_PORT'],
    default: 'set by Kubernetes in a Pod',
    meaning:
      "the in-cluster API server address (client-go's `InClusterConfig`), used with the ServiceAccount's token and CA when no kubeconfig is given",
    readBy:
      'the forwarder program and `npm start` in a Pod (`functions/lib/kube/kubeconfig-auth.ts` `inClusterConnection`)',
  },
  {
    name: 'PATH',
    default: "the shell's",
    meaning:
      'passed on to the cold-start children of the bench (the tools the functions run are found by absolute path, never on `PATH`)',
    readBy: '`bench/scenarios/bundles.ts`',
  },
  {
    name: 'NODE_PATH',
    default: 'set by the bench',
    meaning: 'where the cold-start child of `--sdk` resolves the AWS SDK from',
    readBy: '`bench/cold-start.mjs`',
  },
];
