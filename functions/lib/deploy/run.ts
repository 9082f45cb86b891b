/**
 * Running kapp (upstream `pkg/deploy/kapp.go` `Deploy`/`Inspect`/`Delete` and `pkg/kubeconfig`):
 * the cluster access kapp gets (a TokenRequest token for the App's ServiceAccount, or its
 * kubeconfig Secret) and a kapp run with cancellation and progress streaming. The command lines
 * are planned in `./kapp.ts` and `./kubeconfig.ts`; the deploy stage and the delete path
 * (`../pipeline/app/deploy.ts`, `../pipeline/app/delete.ts`) decide when kapp runs and what its result
 * means for the App.
 *
 * @module
 */

import type { App } from '../api/index.js';
import type { CommandRunner, RunResult } from '../exec/runner.js';
import { TextTail } from '../exec/tail.js';
import type { DeployView, KubeObject, KubeReader, KubeSecret, ResourceRef } from '../kube/port.js';
import { type AbortWatchDeps, watchForAbort } from '../reconcile/abort-watch.js';
import { KappControllerError } from '../reconcile/result.js';
import type { SecretMask } from '../reconcile/secret-mask.js';
import { KAPP_APPLYING_MARKER } from '../reconcile/status.js';
import { markTruncated } from '../reconcile/status-budget.js';
import type { KappCommand } from './kapp.js';
import {
  appClusterAccess,
  type ClusterAccess,
  type CredentialMaterial,
  credentialSource,
  kubeconfigFromSecret,
  NO_CREDENTIALS_MESSAGE,
  serviceAccountKubeconfig,
} from './kubeconfig.js';
import { restrictKubeconfig } from './kubeconfig-restrict.js';
import { type PinOptions, pinServer } from './pin-server.js';

/** What a kapp run uses of the stage's dependencies (a `PipelineDeps` fits). */
export interface KappRunDeps extends AbortWatchDeps {
  /** The one command runner (allow-listed tools). */
  runner: CommandRunner;
  config: AbortWatchDeps['config'] & {
    /** How often kapp's progress is handed to `onProgress`, ms. Default 2000 (upstream). */
    deployProgressIntervalMs?: number;
    /** Kill kapp after this long, ms. Default: the runner's default. */
    toolTimeoutMs?: number;
  };
}

/**
 * Gathers credentials and builds kapp's cluster access (`pkg/kubeconfig`). On the ServiceAccount
 * path the API server's host is resolved once and kapp gets that address with
 * `tls-server-name` set to the host (`./pin-server.ts`), so a DNS answer that changes later
 * cannot move kapp's connections elsewhere (upstream's kapp uses the in-cluster service address).
 * @param mask - when given, the minted token and every value of the kubeconfig Secret are
 *   added to it, so kapp's output can never show them in status.
 * @param pin - the resolver and probe of the pinning (tests); default the system's
 * @throws KappControllerError `Preparing kapp: …` for user-fixable problems (missing SA or Secret);
 *   Error when the API server's host does not resolve (infrastructure: the event is retried)
 */
export async function clusterAccessFor(
  app: App,
  kube: DeployView,
  mask?: SecretMask,
  pin?: PinOptions,
): Promise<ClusterAccess> {
  const ns = app.metadata.namespace ?? '';
  const source = credentialSource(app.spec, ns);
  let material: CredentialMaterial;
  if (source.kind === 'serviceAccount') {
    const token = await mintToken(kube, ns, source.serviceAccountName, mask);
    material = serviceAccountMaterial(kube, token, await pinnedApiServer(kube, pin));
  } else {
    let secret: KubeSecret;
    try {
      secret = await readKubeconfigSecret(kube, ns, source.secretName, mask);
    } catch (err) {
      if (!(err instanceof KappControllerError)) throw err;
      throw new KappControllerError(`Preparing kapp: ${err.message}`, { cause: err });
    }
    material = { kind: 'kubeconfigSecret', secret };
  }
  return appClusterAccess({ name: app.metadata.name ?? '', namespace: ns, spec: app.spec }, material);
}

/**
 * A TokenRequest token for the ServiceAccount `namespace/name` (default lifetime, kept by the
 * client's token cache while fresh), added to `mask`.
 *
 * @throws KappControllerError `Preparing kapp: <API message>` (e.g. `Preparing kapp: Getting
 *   service account: serviceaccounts "x" not found`), as upstream words every credential error
 */
async function mintToken(
  kube: DeployView,
  namespace: string,
  name: string,
  mask?: SecretMask,
  expirationSeconds?: number,
): Promise<string> {
  try {
    const { token } = await kube.serviceAccountToken(namespace, name, expirationSeconds);
    mask?.addValue(token);
    return token;
  } catch (err) {
    throw new KappControllerError(`Preparing kapp: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * The ServiceAccount a PackageRepository's kapp runs as, in the runtime's namespace (the
 * namespace of `kapp-controller-config`, `PipelineConfig.controllerConfigNamespace`, default
 * `kapp-lambda`): `kapp-lambda-pkgr`, bound by `infra/rbac/package-repository-kapp.yml` to
 * Packages, PackageMetadatas and ConfigMaps only, its ConfigMap writes bounded to kapp's records
 * outside the kube-* namespaces by that file's ValidatingAdmissionPolicy. Upstream runs that kapp
 * as the controller's own ServiceAccount (`NewKappPrivilegedForPackageRepository`); the
 * index-repo function's identity may only request this one token (a Role with `resourceNames`),
 * and no longer writes Packages or ConfigMaps itself.
 */
export const PKGR_KAPP_SERVICE_ACCOUNT = 'kapp-lambda-pkgr';

/**
 * Lifetime asked for {@link PKGR_KAPP_SERVICE_ACCOUNT}'s token, seconds: 600, the API server's
 * minimum, not upstream's 7200 (the App path keeps that). This identity acts in every namespace,
 * so a token that leaks (a kapp run's files, its memory) is worth as little as possible; the cache
 * hands it out until half its life less 10 s has passed, so kapp, which runs a repository with
 * `--wait=false`, gets at least about 5 minutes of it.
 */
export const PKGR_TOKEN_EXPIRATION_SECONDS = 600;

/**
 * The restricted kubeconfig of a PackageRepository's kapp run: a TokenRequest token of
 * {@link PKGR_KAPP_SERVICE_ACCOUNT} in `runtimeNamespace`, on this cluster's API server, with the
 * repository's namespace as the context namespace (built as an App's ServiceAccount
 * kubeconfig, `serviceAccountKubeconfig`). The token is added to `mask`.
 *
 * @param repositoryNamespace - the PackageRepository's namespace
 * @param pin - as {@link clusterAccessFor}'s: the API server's address is pinned the same way
 * @returns the kubeconfig YAML (sensitive: only for `KAPP_KUBECONFIG_YAML`)
 * @throws KappControllerError `Preparing kapp: Getting service account: serviceaccounts
 *   "kapp-lambda-pkgr" not found` when the RBAC of `infra/rbac/package-repository-kapp.yml` is
 *   missing (or another API message of the GET or TokenRequest)
 */
export async function packageRepositoryKubeconfig(
  kube: DeployView,
  runtimeNamespace: string,
  repositoryNamespace: string,
  mask?: SecretMask,
  pin?: PinOptions,
): Promise<string> {
  const token = await mintToken(kube, runtimeNamespace, PKGR_KAPP_SERVICE_ACCOUNT, mask, PKGR_TOKEN_EXPIRATION_SECONDS);
  const material = serviceAccountMaterial(kube, token, await pinnedApiServer(kube, pin));
  return serviceAccountKubeconfig({ ...material, namespace: repositoryNamespace }).yaml;
}

/**
 * Reads an App's kubeconfig Secret (`pkg/kubeconfig/kubeconfig_secrets.go`
 * `fetchKubeconfigYAML`); every value is added to `mask`.
 *
 * @throws KappControllerError `Getting kubeconfig secret: secrets "<name>" not found`
 *   (client-go's NotFound text); KubeApiError for any other failed read (infrastructure)
 */
async function readKubeconfigSecret(
  kube: Pick<KubeReader, 'getSecret'>,
  namespace: string,
  name: string,
  mask?: SecretMask,
): Promise<KubeSecret> {
  const secret = await kube.getSecret(namespace, name);
  if (!secret) throw new KappControllerError(`Getting kubeconfig secret: secrets "${name}" not found`);
  mask?.addSecretData(secret.data, { structured: false });
  return secret;
}

/**
 * The restricted kubeconfig of the cluster an App deploys to, for reading that cluster's
 * version and API groups (helm `--kube-version`/`--api-versions`, downward API), as upstream's
 * `ComponentInfo.KubernetesVersion` picks it (`pkg/componentinfo/component_info.go`):
 * `serviceAccountName` set → `undefined`, the App's own cluster; otherwise `cluster` →
 * its kubeconfig Secret, restricted as kapp gets it (`pkg/kubeconfig/kubeconfig_secrets.go`).
 * The texts are upstream's `ClusterAccess` errors, without the deploy's `Preparing kapp: `.
 *
 * @param mask - when given, every value of the kubeconfig Secret is added to it
 * @returns the restricted kubeconfig YAML (sensitive), or `undefined` for the App's own cluster
 * @throws KappControllerError `Expected service account or cluster specified`, `Expected
 *   kubeconfig secret reference to be specified`, `Getting kubeconfig secret: secrets "<n>" not
 *   found`, `Expected to find key '<k>' in secret (keys: …)` or a kubeconfig parse error;
 *   KubeApiError when the Secret cannot be read (infrastructure)
 */
export async function destinationKubeconfig(
  app: App,
  kube: Pick<KubeReader, 'getSecret'>,
  mask?: SecretMask,
): Promise<string | undefined> {
  const { spec } = app;
  if (spec.serviceAccountName) return undefined;
  if (!spec.cluster) throw new KappControllerError(NO_CREDENTIALS_MESSAGE);
  const ref = spec.cluster.kubeconfigSecretRef;
  if (!ref) throw new KappControllerError('Expected kubeconfig secret reference to be specified');
  const secret = await readKubeconfigSecret(kube, app.metadata.namespace ?? '', ref.name ?? '', mask);
  return restrictKubeconfig(kubeconfigFromSecret(secret, ref.key)).yaml;
}

/**
 * kapp's cluster access from the ServiceAccount token {@link clusterAccessFor} last minted for
 * the App, while it is fresh, with no request (`DeployCredentials.cachedServiceAccountToken`):
 * for the no-op resync's list of the App's resources only, which the API server refuses when
 * the ServiceAccount is gone or recreated (its token dies with it); anything else takes
 * {@link clusterAccessFor}. `undefined` for a kubeconfig Secret or without such a token. Its
 * server is not pinned: only the runtime's own reads use it (Node's TLS verifies the host as
 * kapp's would), never kapp.
 */
export function cachedClusterAccess(app: App, kube: DeployView, mask?: SecretMask): ClusterAccess | undefined {
  const ns = app.metadata.namespace ?? '';
  const source = credentialSource(app.spec, ns);
  if (source.kind !== 'serviceAccount') return undefined;
  const token = kube.cachedServiceAccountToken?.(ns, source.serviceAccountName)?.token;
  if (!token) return undefined;
  mask?.addValue(token);
  return appClusterAccess(
    { name: app.metadata.name ?? '', namespace: ns, spec: app.spec },
    serviceAccountMaterial(kube, token),
  );
}

/** This cluster's API server at the address its host resolves to now (`./pin-server.ts`). */
async function pinnedApiServer(
  kube: DeployView,
  pin?: PinOptions,
): Promise<{ server: string; tlsServerName?: string }> {
  const api = kube.apiServer();
  return await pinServer(api.server, api.tlsServerName, pin);
}

/**
 * The credential material of a ServiceAccount token on this cluster's API server, at `at`
 * (a pinned address) or its configured server.
 */
function serviceAccountMaterial(
  kube: DeployView,
  token: string,
  at?: { server: string; tlsServerName?: string },
): Extract<CredentialMaterial, { kind: 'serviceAccount' }> {
  const api = kube.apiServer();
  const server = at ?? { server: api.server, ...(api.tlsServerName ? { tlsServerName: api.tlsServerName } : {}) };
  return {
    kind: 'serviceAccount',
    token,
    caCert: api.caData ? Buffer.from(api.caData, 'base64') : '',
    ...server,
  };
}

/**
 * Bound of kapp's output kept in memory, per stream: 2 MiB for the runner's result, 1 Mi code
 * units for the progress copy. Both are above what status keeps (the status budget cuts
 * further, with the `[output truncated]` marker), so the most useful tail always survives.
 */
export const KAPP_OUTPUT_BYTES = 2 * 1024 * 1024;
/** See {@link KAPP_OUTPUT_BYTES}. */
export const KAPP_PROGRESS_CHARS = 1024 * 1024;

/**
 * How long a canceled kapp (App canceled or deleted, function deadline) gets between SIGTERM and
 * SIGKILL, ms: 5 s, well inside the deadline's margin left for the status write.
 */
export const KAPP_KILL_GRACE_MS = 5000;

/** kapp's output so far, as handed to a progress callback. */
export interface KappProgress {
  /** The kept tail of stdout, behind `[output truncated]\n` when its head was dropped. */
  stdout: string;
  /** The kept tail of stderr, likewise. */
  stderr: string;
  /** Whether kapp's stdout ever contained {@link KAPP_APPLYING_MARKER}. */
  applying: boolean;
  /**
   * The watched object as the poll before this call read it (`undefined`: not found), for a
   * status write to plan on instead of reading it again.
   */
  live?: KubeObject | undefined;
}

/**
 * Runs a kapp command with cancellation (App canceled or deleted) and progress streaming.
 * `onProgress` is called at most every `intervalMs` with kapp's output so far. What is kept of
 * kapp's output is bounded ({@link KAPP_OUTPUT_BYTES}, {@link KAPP_PROGRESS_CHARS}); a result
 * whose head was dropped carries the truncation marker.
 *
 * @param stdin - the manifest for `kapp deploy`; `undefined` for inspect and delete.
 * @param watch - the App watched for cancellation; `cancelOnDelete: false` for `kapp delete`
 *   (the App is being deleted while it runs), so only `spec.canceled` kills it then.
 *   `canceled`: the App was already canceled when the stage read it, so kapp never starts and
 *   the result is `Already canceled` (upstream's cancel channel is closed by the App watch's
 *   first event before kapp runs, `pkg/app/app_deploy.go` `newCancelCh`).
 * @param writable - directories kapp may write (the deploy's `--app-metadata-file-output`).
 * @returns the runner's result; resolves for every process outcome.
 */
export async function runKapp(
  cmd: KappCommand,
  stdin: string | undefined,
  deps: KappRunDeps,
  watch: { kube: DeployView; ref: ResourceRef; uid: string; cancelOnDelete: boolean; canceled?: boolean },
  onProgress: (progress: KappProgress) => Promise<void>,
  writable: readonly string[] = [],
): Promise<RunResult> {
  const stdout = new TextTail(KAPP_PROGRESS_CHARS, KAPP_APPLYING_MARKER);
  const stderr = new TextTail(KAPP_PROGRESS_CHARS);
  const watcher = watchForAbort(watch.kube, watch.ref, watch.uid, deps, {
    intervalMs: deps.config.deployProgressIntervalMs ?? 2000,
    abortOnDelete: watch.cancelOnDelete,
    failureMessage: 'deploy progress update failed',
    onTick: (live) =>
      onProgress({
        stdout: markTruncated(stdout.text(), stdout.truncated),
        stderr: markTruncated(stderr.text(), stderr.truncated),
        applying: stdout.seen,
        live,
      }),
  });
  try {
    const run = await deps.runner.run({
      cmd: cmd.bin,
      args: cmd.args,
      env: cmd.env,
      stdin,
      writable,
      signal: watch.canceled ? AbortSignal.abort(new Error('App canceled')) : watcher.signal,
      killGraceMs: KAPP_KILL_GRACE_MS,
      timeoutMs: deps.config.toolTimeoutMs,
      maxOutputBytes: KAPP_OUTPUT_BYTES,
      onOutput: (chunk, stream) => {
        if (stream === 'stdout') stdout.push(chunk);
        else stderr.push(chunk);
      },
    });
    return {
      ...run,
      stdout: markTruncated(run.stdout, run.truncated.stdout),
      stderr: markTruncated(run.stderr, run.truncated.stderr),
    };
  } finally {
    // A progress write still in flight must land before the caller writes the final status,
    // or it would overwrite it with `finished: false`.
    await watcher.stop();
  }
}
