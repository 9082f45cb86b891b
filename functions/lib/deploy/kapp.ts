/**
 * Exact `kapp` command lines for Apps (deploy, inspect, delete) and PackageRepositories (deploy,
 * delete), and the parse of kapp's `--app-metadata-file-output` into
 * `status.deploy.kapp.associatedResources`.
 *
 * Mirrors kapp-controller `pkg/deploy/kapp.go` (`Deploy`, `Delete`, `Inspect`, `addDeployArgs`,
 * `addGenericArgs`, `oldManagedName`, `trySaveAppMeta`), `pkg/deploy/factory.go` (the `.app` /
 * `.pkgr` suffixes, global raw options for Apps only), `pkg/config/config.go`
 * (`KappDeployRawOptions` defaults), `pkg/app/app_deploy.go` and
 * `pkg/pkgrepository/package_repo_app.go` (PackageRepository flags).
 *
 * @module
 */
import { parse } from 'yaml';
import type { AppDeployKapp } from '../api/deploy.js';
import { formatDuration, tryParseDuration } from '../api/duration.js';
import type { AssociatedResources } from '../api/status.js';
import { KappControllerError } from '../reconcile/result.js';
import {
  KAPP_ALLOWED_DELETE_FLAGS,
  KAPP_ALLOWED_DEPLOY_FLAGS,
  KAPP_ALLOWED_INSPECT_FLAGS,
  validateRawOptions,
} from './kapp-restrict.js';
import type { AppDeploySpec, ClusterAccess } from './kubeconfig.js';

/** kapp app name suffix for Apps (and the Apps of PackageInstalls): `<name>.app`. */
export const APP_SUFFIX = '.app';

/** kapp app name suffix for PackageRepositories: `<name>.pkgr`. */
export const PKGR_SUFFIX = '.pkgr';

/**
 * Built-in deploy flags every App gets before the controller configuration's
 * `kappDeployRawOptions` and the App's own `rawOptions` (later flags win in kapp).
 */
export const DEFAULT_KAPP_DEPLOY_RAW_OPTIONS: readonly string[] = Object.freeze([
  '--app-changes-max-to-keep=5',
  '--apply-timeout=5m',
]);

/** The inspect filter hiding PodMetrics (they churn constantly). */
export const INSPECT_FILTER = '{"not":{"resource":{"kinds":["PodMetrics"]}}}';

/** Environment variable carrying the restricted kubeconfig to kapp. */
export const KAPP_KUBECONFIG_ENV = 'KAPP_KUBECONFIG_YAML';

/** Upstream: `Expected exactly one deploy option`. */
export const NOT_ONE_DEPLOY_MESSAGE = 'Expected exactly one deploy option';

/** Upstream: `Unsupported way to deploy` (a deploy entry without `kapp`). */
export const UNSUPPORTED_DEPLOY_MESSAGE = 'Unsupported way to deploy';

/** Prefixes upstream gives kapp process failures (`AttachErrorf`). */
export const KAPP_ERROR_PREFIX = {
  deploy: 'Deploying: ',
  delete: 'Deleting: ',
  inspect: 'Inspecting: ',
} as const;

/** Prefix of a failure to add the finalizer before kapp runs (`app_deploy.go` `blockDeletion`). */
export const BLOCKING_FOR_DEPLOY_PREFIX = 'Blocking for deploy: ';

/** A kapp invocation. */
export interface KappCommand {
  /** Binary. */
  bin: 'kapp';
  /** Exact argv after the binary. */
  args: string[];
  /** Environment additions (`KAPP_KUBECONFIG_YAML` when a kubeconfig is used). */
  env: Record<string, string>;
  /** Names of `env` entries holding credentials: never log them. */
  sensitiveEnv: string[];
}

/** The legacy (pre-v0.39) kapp app name, passed as `--prev-app` so kapp renames old apps. */
export function legacyKappAppName(name: string): string {
  return `${name}-ctrl`;
}

/**
 * The single `kapp` deploy entry of an App.
 *
 * @param spec - the App's spec
 * @throws {KappControllerError} {@link NOT_ONE_DEPLOY_MESSAGE}; {@link UNSUPPORTED_DEPLOY_MESSAGE}
 */
export function appKappDeploy(spec: AppDeploySpec): AppDeployKapp {
  const deploy = spec.deploy ?? [];
  if (deploy.length !== 1) throw new KappControllerError(NOT_ONE_DEPLOY_MESSAGE);
  const kapp = deploy[0]!.kapp;
  if (!kapp) throw new KappControllerError(UNSUPPORTED_DEPLOY_MESSAGE);
  return kapp;
}

/**
 * `--app <name><suffix> [--namespace=<ns>] [--app-namespace=<ns>] [--kubeconfig=/dev/null] --yes` + env.
 * The namespaces come from the App's spec (or its kubeconfig Secret), so they are attached with
 * `=` (upstream: `--namespace <ns>`): a value can never be read as a flag of its own.
 */
function genericArgs(access: ClusterAccess, suffix: string): { args: string[]; env: Record<string, string> } {
  const args = ['--app', `${access.name}${suffix}`];
  const env: Record<string, string> = {};
  if (access.namespace) args.push(`--namespace=${access.namespace}`);
  if (access.deployNamespace) args.push(`--app-namespace=${access.deployNamespace}`);
  if (access.kubeconfigYaml !== undefined) {
    env[KAPP_KUBECONFIG_ENV] = access.kubeconfigYaml;
    args.push('--kubeconfig=/dev/null'); // kapp reads the kubeconfig from the env var above
  } else if (!access.dangerousUsePodServiceAccount) {
    throw new Error('Internal inconsistency: Unknown kapp service account configuration');
  }
  args.push('--yes');
  return { args, env };
}

function command(args: string[], generic: { args: string[]; env: Record<string, string> }): KappCommand {
  return {
    bin: 'kapp',
    args: [...args, ...generic.args],
    env: generic.env,
    sensitiveEnv: Object.keys(generic.env),
  };
}

/** Input for {@link kappDeployCommand}. */
export interface KappDeployInput {
  /** The App's `deploy[0].kapp`. */
  kapp: AppDeployKapp;
  /** From `appClusterAccess` (or the PackageRepository's own access). */
  access: ClusterAccess;
  /** Absolute path kapp writes its app metadata to (`<tmp>/app-metadata.yml` upstream). */
  metadataFile: string;
  /**
   * Controller-wide raw options placed before the App's own. For Apps: omit to get
   * {@link DEFAULT_KAPP_DEPLOY_RAW_OPTIONS} followed by `controllerRawOptions`. `null`: none at
   * all (PackageRepositories: their factory has no kapp configuration).
   */
  globalRawOptions?: readonly string[] | null;
  /** The controller configuration's `kappDeployRawOptions` (used when `globalRawOptions` is omitted). */
  controllerRawOptions?: readonly string[];
  /** `.app` (default) or `.pkgr`. */
  suffix?: string;
}

/**
 * `kapp deploy --app-metadata-file-output <f> --prev-app <N>-ctrl -f - [--into-ns=<ns>] [--map-ns=<m>]...
 * <global raw options> <rawOptions> --app <N>.app [--namespace=<ns>] [--app-namespace=<ns>]
 * [--kubeconfig=/dev/null] --yes`, stdin = the template output.
 *
 * `intoNs`, `mapNs` and the namespaces are attached with `=` (upstream passes them as separate
 * arguments), so no user value can be read as a flag; raw options are one `--name=value`
 * argument each (see `validateRawOptions`).
 *
 * Global options are validated first, then the App's, each against the deploy allow-list.
 *
 * @param input - see {@link KappDeployInput}
 * @throws {KappControllerError} raw option errors (bare upstream texts, see `validateRawOptions`)
 */
export function kappDeployCommand(input: KappDeployInput): KappCommand {
  const args = [
    'deploy',
    '--app-metadata-file-output',
    input.metadataFile,
    '--prev-app',
    legacyKappAppName(input.access.name),
    '-f',
    '-',
  ];
  if (input.kapp.intoNs) args.push(`--into-ns=${input.kapp.intoNs}`);
  for (const m of input.kapp.mapNs ?? []) args.push(`--map-ns=${m}`);
  const global =
    input.globalRawOptions === undefined
      ? [...DEFAULT_KAPP_DEPLOY_RAW_OPTIONS, ...(input.controllerRawOptions ?? [])]
      : (input.globalRawOptions ?? []);
  args.push(...validateRawOptions(global, KAPP_ALLOWED_DEPLOY_FLAGS));
  args.push(...validateRawOptions(input.kapp.rawOptions, KAPP_ALLOWED_DEPLOY_FLAGS));
  return command(args, genericArgs(input.access, input.suffix ?? APP_SUFFIX));
}

/**
 * `kapp inspect --filter {"not":{"resource":{"kinds":["PodMetrics"]}}} --tty <inspect.rawOptions>
 * --app <N>.app [--namespace=<ns>] [--app-namespace=<ns>] [--kubeconfig=/dev/null] --yes`.
 *
 * Run only when `kapp.inspect` is set (unset means no inspect) and a deploy was attempted before
 * (`status.deploy` present).
 *
 * @param input - the App's kapp entry and cluster access
 * @throws {KappControllerError} raw option errors against the inspect allow-list
 */
export function kappInspectCommand(input: {
  kapp: AppDeployKapp;
  access: ClusterAccess;
  suffix?: string;
}): KappCommand {
  const args = ['inspect', '--filter', INSPECT_FILTER, '--tty'];
  if (input.kapp.inspect) args.push(...validateRawOptions(input.kapp.inspect.rawOptions, KAPP_ALLOWED_INSPECT_FLAGS));
  return command(args, genericArgs(input.access, input.suffix ?? APP_SUFFIX));
}

/**
 * `kapp delete --prev-app <N>-ctrl <delete.rawOptions> --app <N>.app [--namespace=<ns>]
 * [--app-namespace=<ns>] [--kubeconfig=/dev/null] --yes`. No global or deploy raw options.
 *
 * @param input - the App's kapp entry and cluster access
 * @throws {KappControllerError} raw option errors against the delete allow-list
 */
export function kappDeleteCommand(input: { kapp: AppDeployKapp; access: ClusterAccess; suffix?: string }): KappCommand {
  const args = ['delete', '--prev-app', legacyKappAppName(input.access.name)];
  if (input.kapp.delete) args.push(...validateRawOptions(input.kapp.delete.rawOptions, KAPP_ALLOWED_DELETE_FLAGS));
  return command(args, genericArgs(input.access, input.suffix ?? APP_SUFFIX));
}

/** Whether an App's kapp entry asks for inspect (`inspect` set, even `{}`). */
export function wantsInspect(kapp: AppDeployKapp): boolean {
  return kapp.inspect !== undefined && kapp.inspect !== null;
}

/**
 * Whether a run of `app` that failed at fetch or template still has `inspect()` to do, as
 * upstream's `reconcileDeploy` runs it whenever `status.deploy` exists (an earlier deploy
 * attempt, reference §3.2): then the deploy function ends the run (`DeployStageData`
 * `afterFailure`). Nothing to do when no deploy was attempted, or when the one kapp entry does
 * not ask for inspect (upstream's inspect then returns nothing and the status keeps its
 * `inspect`); an invalid deploy list fails inspect too (`Expected exactly one deploy option`).
 */
export function inspectsAfterFailure(app: { spec: AppDeploySpec; status?: { deploy?: unknown } }): boolean {
  if (!app.status?.deploy) return false;
  const entries = app.spec.deploy ?? [];
  const kapp = entries.length === 1 ? entries[0]?.kapp : undefined;
  return !kapp || wantsInspect(kapp);
}

/**
 * kapp's client rate limit for PackageRepository deploy and delete: `--kube-api-qps=30
 * --kube-api-burst=40`, upstream's (`pkg/pkgrepository/package_repo_app.go`), so both kapps run
 * at the same rate (issue 24, "honest figures": the repositories ratio had mostly measured ours
 * at 50/100 against upstream's 30/40). App deploys pass no rate flag, as upstream: kapp's own
 * default (`--kube-api-qps` 1000, `--kube-api-burst` 1000, `pkg/kapp/cmd/core/kube_api_flags.go`).
 *
 * What a higher limit would gain, kept from when this was 50/100: upstream's Packages and
 * PackageMetadatas live behind its aggregated API server, whose SubjectAccessReviews were slow
 * on GKE (issues #377, #381), which is why it keeps kapp slow; here they are CRDs served by the
 * kube-apiserver itself, and at 30 QPS kapp's ~600 requests for a 500-Package repository take
 * ~20 s of waiting on its own limiter. 50/100 is kubectl's default QPS (50) and the limit
 * kapp-controller's PR #1410 proposed for every App deploy. Measured here
 * (kapp v0.64.2, 600 objects on a local kube-apiserver, 2 shared cores): deploy 20.4 s at 30/40,
 * 11.6 s at 50/100, and no faster at 50/300, 100/200 or 1000/1000, or with
 * `--apply-concurrency=10`: beyond 50 QPS the API server's own time is the bound, so a higher
 * limit would only take more of a customer's API server for nothing. The total number of
 * requests is unchanged; a 100-object repository stays within the burst.
 *
 * Other flags evaluated and not passed (kapp v0.64.2, 150 objects, a loaded 2-core host):
 * `--apply-concurrency=10` or `=20` (default 5) changed neither deploy nor delete beyond the
 * noise (deploy 4.8–10.6 s, delete 6.0–8.4 s across runs of each): the creates wait on the API
 * server's CPU, not on kapp's concurrency. `--wait-concurrency` does nothing with `--wait=false`,
 * `--diff-changes` is already off by default, and `kapp delete` lists every resource type of the
 * cluster for the app's label whatever its flags (`IdentifiedResources.List` without refs), so
 * no flag trims its fixed cost. `--app-changes-max-to-keep=5` and
 * `--existing-non-labeled-resources-check=false` are upstream's and kept.
 */
export const PKGR_KAPP_RATE_LIMIT: readonly string[] = Object.freeze(['--kube-api-qps=30', '--kube-api-burst=40']);

/** Flags shared by PackageRepository deploy and delete. */
function pkgrKappRawOptions(debug: boolean): string[] {
  const opts = [
    ...PKGR_KAPP_RATE_LIMIT,
    // The repository's kapp identity (kapp-lambda-pkgr) may list few resource types: scope kapp's
    // lists to the namespace (a refused list is skipped) instead of spinning on forbidden lists.
    '--dangerous-scope-to-fallback-allowed-namespaces=true',
    '--wait=false',
  ];
  if (debug) opts.push('--debug=true');
  return opts;
}

/**
 * The kapp entry kapp-controller generates for a PackageRepository (`package_repo_app.go`):
 * deploy `--logs=false --app-changes-max-to-keep=5 --dangerous-override-ownership-of-existing-resources=true
 * --existing-non-labeled-resources-check=false` + shared flags; delete: the shared flags
 * ({@link PKGR_KAPP_RATE_LIMIT} `--dangerous-scope-to-fallback-allowed-namespaces=true
 * --wait=false [--debug=true]`). The rate limit is kapp-lambda's, not upstream's 30/40 (see
 * {@link PKGR_KAPP_RATE_LIMIT}).
 *
 * @param debug - upstream's `KAPPCTRL_PKGR_KAPP_DEBUG=true` (adds `--debug=true`)
 */
export function packageRepositoryKapp(debug = false): AppDeployKapp {
  return {
    rawOptions: [
      '--logs=false',
      '--app-changes-max-to-keep=5',
      '--dangerous-override-ownership-of-existing-resources=true',
      '--existing-non-labeled-resources-check=false',
      ...pkgrKappRawOptions(debug),
    ],
    delete: { rawOptions: pkgrKappRawOptions(debug) },
  };
}

/** Input for the PackageRepository commands. */
export interface PackageRepositoryKappInput {
  /** PackageRepository name (kapp app `<name>.pkgr`). */
  name: string;
  /** PackageRepository namespace (`--namespace`; no `--app-namespace`). */
  namespace: string;
  /** Add `--debug=true`. */
  debug?: boolean;
  /**
   * Kubeconfig for the identity the repository is deployed with. Omitted: the runtime's own
   * identity (upstream: the controller pod's ServiceAccount, no `--kubeconfig`).
   */
  kubeconfigYaml?: string;
}

function pkgrAccess(input: PackageRepositoryKappInput): ClusterAccess {
  return input.kubeconfigYaml === undefined
    ? { name: input.name, namespace: input.namespace, deployNamespace: '', dangerousUsePodServiceAccount: true }
    : { name: input.name, namespace: input.namespace, deployNamespace: '', kubeconfigYaml: input.kubeconfigYaml };
}

/**
 * `kapp deploy --app-metadata-file-output <f> --prev-app <N>-ctrl -f - <pkgr deploy flags> --app <N>.pkgr
 * --namespace=<ns> --yes`. No global `kappDeployRawOptions` (upstream's PackageRepository factory
 * has no kapp configuration).
 *
 * @param input - name, namespace, metadata file, debug, optional kubeconfig
 */
export function packageRepositoryDeployCommand(
  input: PackageRepositoryKappInput & { metadataFile: string },
): KappCommand {
  return kappDeployCommand({
    kapp: packageRepositoryKapp(input.debug),
    access: pkgrAccess(input),
    metadataFile: input.metadataFile,
    globalRawOptions: null,
    suffix: PKGR_SUFFIX,
  });
}

/**
 * `kapp delete --prev-app <N>-ctrl <pkgr delete flags> --app <N>.pkgr --namespace=<ns> --yes`.
 *
 * @param input - name, namespace, debug, optional kubeconfig
 */
export function packageRepositoryDeleteCommand(input: PackageRepositoryKappInput): KappCommand {
  return kappDeleteCommand({
    kapp: packageRepositoryKapp(input.debug),
    access: pkgrAccess(input),
    suffix: PKGR_SUFFIX,
  });
}

/** kapp's app metadata (`--app-metadata-file-output`), the fields kapp-controller reads. */
export interface KappAppMeta {
  /** Label key kapp puts on the app's resources (`kapp.k14s.io/app`). */
  labelKey: string;
  /** Its value. */
  labelValue: string;
  /** Namespaces touched by the last change (`(cluster)` for cluster-scoped resources). */
  lastChangeNamespaces: string[];
  /** Group/kinds the app uses. */
  usedGKs: Array<{ group: string; kind: string }>;
}

/** Case-insensitive field lookup, as Go's `encoding/json` (which `sigs.k8s.io/yaml` uses) matches. */
function field(o: unknown, name: string): unknown {
  if (typeof o !== 'object' || o === null || Array.isArray(o)) return undefined;
  const rec = o as Record<string, unknown>;
  if (Object.hasOwn(rec, name)) return rec[name];
  const lower = name.toLowerCase();
  const key = Object.keys(rec).find((k) => k.toLowerCase() === lower);
  return key === undefined ? undefined : rec[key];
}

function asString(v: unknown): string | undefined {
  return v === undefined || v === null ? '' : typeof v === 'string' ? v : undefined;
}

/**
 * Parses kapp's app metadata file. Like upstream's `trySaveAppMeta`, any problem (unreadable YAML,
 * wrong types) yields `undefined` and the deploy result is unaffected.
 *
 * @param text - contents of the `--app-metadata-file-output` file
 */
export function parseKappAppMeta(text: string): KappAppMeta | undefined {
  let doc: unknown;
  try {
    doc = parse(text);
  } catch {
    return undefined;
  }
  if (doc === null || doc === undefined) doc = {};
  if (typeof doc !== 'object' || Array.isArray(doc)) return undefined;
  const labelKey = asString(field(doc, 'labelKey'));
  const labelValue = asString(field(doc, 'labelValue'));
  if (labelKey === undefined || labelValue === undefined) return undefined;
  const nsRaw = field(field(doc, 'lastChange'), 'namespaces');
  const gksRaw = field(doc, 'usedGKs');
  if (nsRaw !== undefined && nsRaw !== null && !Array.isArray(nsRaw)) return undefined;
  if (gksRaw !== undefined && gksRaw !== null && !Array.isArray(gksRaw)) return undefined;
  const namespaces: string[] = [];
  for (const n of (nsRaw as unknown[] | null | undefined) ?? []) {
    if (typeof n !== 'string') return undefined;
    namespaces.push(n);
  }
  const usedGKs: KappAppMeta['usedGKs'] = [];
  for (const gk of (gksRaw as unknown[] | null | undefined) ?? []) {
    const group = asString(field(gk, 'Group'));
    const kind = asString(field(gk, 'Kind'));
    if (group === undefined || kind === undefined) return undefined;
    usedGKs.push({ group, kind });
  }
  return { labelKey, labelValue, lastChangeNamespaces: namespaces, usedGKs };
}

/**
 * `status.deploy.kapp.associatedResources` from kapp's app metadata, or `undefined` (keep what the
 * status had) when there is no metadata or `lastChange.namespaces` is empty. Every field is set:
 * `label` is `<labelKey>=<labelValue>`, `namespaces` those of the last change, `groupKinds` the
 * used group/kinds.
 *
 * @param meta - from {@link parseKappAppMeta}
 */
export function associatedResources(meta: KappAppMeta | undefined): Required<AssociatedResources> | undefined {
  if (!meta || meta.lastChangeNamespaces.length === 0) return undefined;
  return {
    label: `${meta.labelKey}=${meta.labelValue}`,
    namespaces: [...meta.lastChangeNamespaces],
    groupKinds: meta.usedGKs.map((gk) => ({ group: gk.group, kind: gk.kind })),
  };
}

/** kapp's default `--wait-timeout` (kapp v0.64: `15m0s`), ms. */
export const KAPP_DEFAULT_WAIT_TIMEOUT_MS = 15 * 60_000;

/**
 * The `--wait-timeout` a kapp deploy command runs with, ms: its last `--wait-timeout=<duration>`
 * argument (kapp keeps the last value of a repeated flag), else {@link KAPP_DEFAULT_WAIT_TIMEOUT_MS}.
 * `0s` (no wait limit in kapp) and an unparsable value (kapp itself rejects it) are `undefined`.
 */
export function kappWaitTimeoutMs(cmd: Pick<KappCommand, 'args'>): number | undefined {
  const last = cmd.args.filter((a) => a.startsWith('--wait-timeout=')).at(-1);
  if (last === undefined) return KAPP_DEFAULT_WAIT_TIMEOUT_MS;
  const ms = tryParseDuration(last.slice('--wait-timeout='.length));
  return ms === undefined || ms <= 0 ? undefined : ms;
}

/**
 * Shortest wait a continued deploy gets, ms (1 s): a deploy whose wait budget is spent still
 * runs kapp once, which applies nothing new and fails with kapp's own `Timed out waiting` error.
 */
export const MIN_CONTINUED_WAIT_MS = 1000;

/**
 * Default of the longest wait a deploy continued over several invocations gets in all, ms (1 h;
 * the fleet sets its own with `KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS`). A deviation from upstream,
 * whose one kapp process may wait without limit (`--wait-timeout=0s`) or for any duration an App
 * asks: on Lambda one deploy function serves the whole fleet with a bounded concurrency, so a few
 * Apps waiting forever on a resource that never becomes ready would hold every tenant's deploys.
 * The embedded runtime never continues a deploy, so it keeps upstream's.
 */
export const MAX_CONTINUED_WAIT_MS = 60 * 60_000;

/** A continued kapp deploy command and whether the fleet's maximum, not the App, set its wait. */
export interface BudgetedKappCommand {
  readonly cmd: KappCommand;
  /**
   * True when the App asked for a longer wait than the fleet's maximum (or none, `0s`): a
   * timeout of this kapp is then the fleet's cut, which the status must say.
   */
  readonly capped: boolean;
}

/**
 * A kapp deploy that continues one the function deadline stopped (`../pipeline/app/deploy.ts`):
 * kapp's wait restarts with every process, so the continuation gets what is left of the run's
 * wait budget, `--wait-timeout=<kapp's timeout - elapsed>` (at least {@link MIN_CONTINUED_WAIT_MS}),
 * appended so that it wins over every earlier value. Upstream's one kapp process waits at most
 * its `--wait-timeout`; a deploy split over invocations waits about as long in total, but never
 * longer than the fleet's maximum (also for `--wait-timeout=0s`, no limit in kapp).
 *
 * @param elapsedMs - time since the run's first kapp started.
 * @param maxWaitMs - the fleet's maximum wait in all, ms; default {@link MAX_CONTINUED_WAIT_MS}.
 * @returns a copy of `cmd` with the remaining wait as its last `--wait-timeout`.
 */
export function withKappWaitBudget(
  cmd: KappCommand,
  elapsedMs: number,
  maxWaitMs: number = MAX_CONTINUED_WAIT_MS,
): BudgetedKappCommand {
  const asked = kappWaitTimeoutMs(cmd);
  const capped = asked === undefined || asked > maxWaitMs;
  const timeout = capped ? maxWaitMs : asked;
  const left = Math.max(MIN_CONTINUED_WAIT_MS, Math.ceil((timeout - elapsedMs) / 1000) * 1000);
  return { cmd: { ...cmd, args: [...cmd.args, `--wait-timeout=${formatDuration(left)}`] }, capped };
}

/** kapp's failure when its wait runs out (kapp v0.64: `Timed out waiting after <d> for resources: …`). */
const KAPP_WAIT_TIMED_OUT = /\bTimed out waiting after\b/;

/**
 * The line added to a capped continuation's stderr (so to `usefulErrorMessage`) when kapp's wait
 * ran out: kapp's own message names only the last process's few seconds, not that the fleet cut
 * a longer wait the App asked for.
 * @returns the line, or `undefined` when kapp did not time out waiting.
 */
export function fleetWaitCutNote(stderr: string, maxWaitMs: number): string | undefined {
  if (!KAPP_WAIT_TIMED_OUT.test(stderr)) return undefined;
  return `kapp-lambda: the deploy's wait was cut at the fleet's maximum of ${formatDuration(maxWaitMs)} in all (KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS); the App's --wait-timeout asks for longer`;
}
