/**
 * What every stage handler gets: ports (Kubernetes, object storage, command runner, clock,
 * logger) and the typed runtime configuration. Both composition roots build one
 * {@link PipelineDeps} per process with `createPipelineDeps` (`./compose.ts`); handlers never
 * read the environment.
 */

import type { DeployStageData, KappEvent, ObjectRef, StageRun, TemplateStageData } from '../../../events/schema.js';
import type { ClusterKeyring } from '../artifact/keyring.js';
import type { PinOptions } from '../deploy/pin-server.js';
import type { PkgrAdmissionCache } from '../deploy/pkgr-admission.js';
import type { CommandRunner } from '../exec/runner.js';
import type { HttpDownloader } from '../fetch/http-download.js';
import type { PolledSource } from '../fetch/source-resolve.js';
import type { StallRule } from '../fetch/stall.js';
import type { UrlPolicy } from '../fetch/url-policy.js';
import type { ClusterRegistry, KubeObject } from '../kube/port.js';
import type { KubeApiRate } from '../kube/rate-limit.js';
import type { RestTransport } from '../kube/transport.js';
import type { Logger } from '../log.js';
import type { ReconcileEventRecorder } from '../observe/events.js';
import type { ReconcileMetrics } from '../observe/metrics.js';
import type { templateRepository as defaultTemplateRepository } from '../packaging/repo-template.js';
import type { StageMeter } from '../receipt/meter.js';
import type { ClusterControllerConfig } from '../reconcile/controller-config.js';
import { type SecretMask, SecretMask as SecretMaskImpl } from '../reconcile/secret-mask.js';
import type { ControllerSyncConfig } from '../reconcile/timer.js';
import type { RolloutAccess } from '../rollout/access.js';
import type { ObjectStore } from '../store/port.js';
import type { ClusterInfo } from '../template/downward-api.js';
import type { requiredClusterInfo } from '../template/plan.js';

/** Runtime configuration of the pipeline (kapp-controller's flags and `kapp-controller-config`). */
export interface PipelineConfig {
  /**
   * Directory for per-run scratch directories (fetch output, template inputs, kapp files).
   * Upstream uses the memory-backed `KAPPCTRL_MEM_TMP_DIR`; on Lambda this is `/tmp`.
   */
  tmpRoot: string;
  /**
   * `kappDeployRawOptions` of `kapp-controller-config` (allow-listed like per-App options).
   * Default `[]`. The runtime-wide value; a cluster's own `kapp-controller-config` replaces it
   * for that cluster's runs (`./cluster-config.ts`).
   */
  kappDeployRawOptions?: string[];
  /** `dangerousSkipTLSVerify` of `kapp-controller-config`: comma-separated hosts (per cluster as above). */
  dangerousSkipTLSVerify?: string;
  /**
   * The client-side limit on each cluster's API requests (`../kube/rate-limit.ts`). Default
   * kapp-controller's, 20 QPS / burst 30; per key, a cluster's own `kapp-controller-config`
   * (`kappLambdaKubeAPIQPS`, `kappLambdaKubeAPIBurst`) replaces it for that cluster.
   */
  kubeApi?: KubeApiRate;
  /**
   * Sync period defaults (`appDefaultSyncPeriod`, `appMinimumSyncPeriod`, and
   * `packageInstallDefaultSyncPeriod` for the Apps PackageInstalls generate: 10m when unset);
   * per key, a cluster's own `kapp-controller-config` replaces them for its runs.
   */
  timer?: ControllerSyncConfig;
  /**
   * Namespace of each cluster's `kapp-controller-config` Secret or ConfigMap. Default
   * `DEFAULT_CONTROLLER_CONFIG_NAMESPACE` (`kapp-lambda`, the forwarder's).
   */
  controllerConfigNamespace?: string;
  /**
   * The packaging global namespace whose Packages every namespace sees (upstream
   * `-packaging-global-namespace`). Default `kapp-controller-packaging-global`.
   */
  packagingGlobalNamespace?: string;
  /**
   * The kapp-controller version Packages' `kappControllerVersionSelection` is checked against.
   * Default `COMPATIBLE_KAPP_CONTROLLER_VERSION` (`../packaging/select.ts`, 0.53.1: the upstream
   * release kapp-lambda mirrors).
   */
  kappControllerCompatibleVersion?: string;
  /**
   * Versions of the tools, keyed by binary (`ytt`, `vendir`, `kapp`, ...: the tool table
   * `layers/tools.ts`); the template tools' are part of the render-cache key (`renderToolVersions`),
   * so a tool upgrade re-renders.
   */
  toolVersions: Readonly<Record<string, string>>;
  /** Reported to the downward API as `kappControllerVersion`. */
  controllerVersion: string;
  /** How often kapp's progress is copied into `status.deploy` while it runs, ms. Upstream: 2000. */
  deployProgressIntervalMs?: number;
  /**
   * How often a running fetch or template re-reads its App to stop when the App is deleted,
   * recreated or canceled (as kapp is stopped during a deploy), ms. Default 2000.
   */
  abortPollIntervalMs?: number;
  /**
   * The transport runs one event of an object at a time and every stage of a run before the
   * object's next event (the embedded runtime's queue, which sets this). Then an App whose status
   * still shows `Reconciling` for its generation when an object event starts has lost its run (a
   * hand-off dropped, a crash not retried): the reconcile step runs it again at once, as a
   * restarted forwarder does (`added` for an object in flight), instead of waiting for the sync
   * period. Default false: on Lambda a run's template and deploy events travel on other queues,
   * so the run may still be in flight.
   */
  oneRunPerObject?: boolean;
  /** Kill a tool after this long, ms. Default: the runner's default. */
  toolTimeoutMs?: number;
  /**
   * The longest wait a deploy continued over invocations gets in all, ms (Lambda only: the
   * embedded runtime never continues a deploy). Default `MAX_CONTINUED_WAIT_MS` (1 h).
   */
  maxDeployWaitMs?: number;
  /**
   * The URL policy every fetch obeys (`../fetch/url-policy.ts`). Default: off, as
   * kapp-controller; the Lambda functions default to enforcing it.
   */
  urlPolicy?: UrlPolicy;
  /**
   * Cap on an App's (or PackageRepository's) inline fetch content, bytes: `paths` plus the data of
   * each `pathsFrom` Secret and ConfigMap, read one at a time. Over it the fetch fails
   * (`Fetching (<i>): inline pathsFrom secret "<name>" brings the App's inline content to <n>
   * bytes, over the limit of <max> bytes`) before vendir runs. The same size caps, apart, the
   * Secrets and ConfigMaps a stage reads besides (`referencedLimit`: the fetch's credentials, the
   * template's `valuesFrom` and sops keys). Not in kapp-controller. Default
   * `DEFAULT_MAX_INLINE_BYTES` (64 MiB) of `../fetch/inline-limit.ts`.
   */
  maxInlineBytes?: number;
  /**
   * The fetch's progress rule (`../fetch/stall.ts`): a tool's connection through the egress
   * proxy, or an http download, that brings fewer than `minBytes` in a window of `windowMs` is
   * cut, and the fetch's `usefulErrorMessage` names the host and the rule. Not in
   * kapp-controller. Default `DEFAULT_STALL_RULE` (4 KiB in 60 s).
   */
  fetchStall?: StallRule;
  /**
   * Bound of each templating tool's output (the manifest stream), bytes. Output above it fails
   * the template stage (`Templating dir: ytt output exceeded <N> bytes ...`) rather than
   * deploying a cut manifest. Default: `DEFAULT_MAX_OUTPUT_BYTES` of the runner (64 MiB).
   */
  maxTemplateOutputBytes?: number;
  /**
   * How often the fleet resolves each polled PackageRepository source (a tag or branch) again,
   * ms: one registry `HEAD` or `git ls-remote` per source per period, whatever the fleet size
   * (`./source-poll.ts`). Default `DEFAULT_SOURCE_POLL_PERIOD_MS` (60 000).
   */
  sourcePollPeriodMs?: number;
  /**
   * How often an embedded runtime reads the fleet's source poll records between its polls, ms:
   * object-store reads only, no registry request (`pollSources` with `resolve: false`). A runtime
   * serving only some clusters of a fleet learns this way, within one check, that another
   * runtime's poll saw a tag move or that the new digest's index was built, instead of at its own
   * next poll. Default `DEFAULT_SOURCE_CHECK_PERIOD_MS` (2 000); 0 turns the checks off. Unused on
   * Lambda, where one poll serves every cluster.
   */
  sourceCheckPeriodMs?: number;
  /**
   * Life of a private artifact (content made from Secrets) after each write, ms. Default
   * `DEFAULT_PRIVATE_TTL_MS` (7 days); see `../artifact/sealed.ts`.
   */
  privateArtifactTtlMs?: number;
}

/** Ports and configuration of the stage handlers. */
export interface PipelineDeps {
  /** Cluster id → narrowed Kubernetes clients. */
  clusters: ClusterRegistry;
  /** Artifacts, render cache and receipts. */
  store: ObjectStore;
  /**
   * Per-cluster keys sealing private artifacts (content made from Secrets). Without one, a
   * run that would store secret material fails instead (it is never stored in the clear).
   */
  keyring?: ClusterKeyring;
  /** The one command runner (allow-listed tools). */
  runner: CommandRunner;
  /**
   * Starts (once) and returns the address of the process's egress proxy
   * (`../fetch/egress-proxy.ts`), set by `createPipelineDeps` while the URL policy is enforced:
   * the deploy stage makes it every cluster's `proxy-url` in a kubeconfig Secret kapp gets, so
   * each connection kapp makes (redirects and DNS answers included) is checked when it is made.
   * Absent: the kubeconfig's URLs are checked once, before kapp starts.
   */
  egressProxyUrl?: () => Promise<string>;
  /**
   * Downloads `http` fetch sources (the fetch stage unpacks them itself, safely, instead of
   * vendir). Default: `createHttpDownloader()` (Node's `fetch`).
   */
  download?: HttpDownloader;
  /**
   * Resolves a polled PackageRepository source (a tag or branch) to its digest or commit now.
   * Default: `resolveSource` of `../fetch/source-resolve.ts` (one registry `HEAD`, or `git ls-remote`
   * through `runner`, under the URL policy); unit tests inject a fake.
   * @throws when the source cannot be resolved (the run then fetches by tag)
   */
  resolveSource?: (source: PolledSource) => Promise<string>;
  /**
   * The function deadline of this invocation (Lambda: fires `DEFAULT_DEADLINE_MARGIN_MS` before
   * the time limit, `../entry/handler.ts`); the runner's tools get it through `withDeadline`. A
   * stage waiting for another runner's artifact (`../artifact/single-flight.ts`) stops waiting
   * when it fires. Absent: no deadline (the embedded runtime).
   */
  deadline?: AbortSignal;
  /**
   * When {@link deadline} fires, ms since the epoch (set with it). A stage waiting for another
   * runner's artifact waits at most half the time left before it (`../artifact/single-flight.ts`).
   */
  deadlineAt?: number;
  /**
   * Opens a connection acting as an App's own identity, from the restricted kubeconfig kapp
   * gets (its ServiceAccount token or kubeconfig Secret): the deploy stage lists the App's
   * resources with it to record a deploy and to check a resync for drift without kapp
   * (`../deploy/live-record.ts`). Default (`createPipelineDeps`): `restTransportForKubeconfig`.
   * Absent: every resync runs kapp.
   * @throws Error when the kubeconfig cannot be loaded
   */
  appReader?: (kubeconfigYaml: string) => RestTransport;
  /**
   * A cluster's own `kapp-controller-config` (`../reconcile/controller-config.ts`), cached per
   * cluster and re-read when it changes; `createPipelineDeps` sets it. Read once per event by
   * `withClusterConfig` (`./cluster-config.ts`), which overlays it on {@link PipelineDeps.config}
   * and sets {@link PipelineDeps.clusterConfig}. Absent: only the runtime-wide settings apply.
   * @throws the API errors of the read (the event is retried)
   */
  controllerConfig?: (clusterId: string) => Promise<ClusterControllerConfig>;
  /**
   * The `kapp-controller-config` of the cluster of this event (set per event by
   * `withClusterConfig`): its `caCerts`, proxy and skipped hosts reach this run's fetches only.
   */
  clusterConfig?: ClusterControllerConfig;
  /**
   * The embedded driver's copy of the object of this run, handed from stage to stage in process
   * ({@link RunCopy}): a stage opens on it instead of reading the object again. Absent (Lambda,
   * where each stage is its own invocation): every stage after the first reads the object.
   */
  runCopy?: RunCopy;
  /** Wall clock. */
  now: () => Date;
  /**
   * Waits `ms` milliseconds, or less when `signal` fires (it resolves then, never rejects): the
   * pause between fetch retries (`../fetch/run.ts`). Default: a timer; unit tests inject one
   * that does not wait.
   */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** Uniform [0,1) source for jitter; defaults to `Math.random`. */
  random?: () => number;
  log: Logger;
  config: PipelineConfig;
  /**
   * The values of the Secrets read for the App of this run, masked in everything written for
   * it (`../reconcile/secret-mask.ts`). Per run, never per process: the runtimes set a fresh
   * one for each event (`dispatchWithRetryBound`); a stage called without one makes its own.
   */
  secretMask?: SecretMask;
  /**
   * Sends events about other objects through the runtime's transport, each to its own function
   * and ordering key (not the run's next stage, which a stage returns): the `ref-changed` events
   * a `repo.indexed` event fans out to PackageInstalls. Embedded: the in-process queue
   * (`EmbeddedPipeline.send`); Lambda: the function's queue of each event. Resolves once every
   * event is accepted. Absent: such events are dropped with a warning.
   * @throws TransportError when an event was not accepted (the stage is retried)
   */
  emit?: (events: readonly KappEvent[]) => Promise<void>;
  /**
   * How the install stage reaches the fleet's rollouts (`../rollout/access.ts`): the dispatched
   * install run's view and reports (`ReportingRollouts`). Absent: the run reads and writes the
   * rollout records in {@link store} itself (`StoreRollouts`), as the embedded runtime does.
   */
  rollouts?: RolloutAccess;
  /**
   * kapp-controller's reconcile counters and times (`../observe/metrics.ts`): the embedded
   * runtime's Prometheus registry, the Lambda functions' CloudWatch EMF lines. Absent: none.
   */
  metrics?: ReconcileMetrics;
  /**
   * The process's reconcile Event recorder (`../observe/events.ts`), writing through the
   * cluster's `clusters.eventWriter`. Absent: no Events.
   */
  events?: ReconcileEventRecorder;
  /**
   * The meter of this event's stage (`../receipt/meter.ts`): `store` and `runner` are its
   * counting wrappers. Set per event by `dispatchWithRetryBound`; absent: no receipts.
   */
  meter?: StageMeter;
}

/**
 * One run's object as its last stage knew it, kept by a driver that runs a run's stages back to
 * back in one process (`functions/embedded/pipeline.ts`). `openStage` sets {@link frame} and a
 * later stage of the same run opens on its `latest` copy (the object as that stage last read or
 * wrote it, with the status it wrote) instead of a GET, unless {@link superseded}: an event about
 * the object arrived since the run started (the forwarder saw it change), then it reads again. A
 * change the forwarder has not reported yet is the same race as one right after a GET: the run's
 * status writes plan on the copy's resourceVersion, so a moved object costs a 409 and a re-read
 * there, and its fence stops a run whose spec changed.
 */
export interface RunCopy {
  /** The frame of the run's last opened stage (its `latest` is kept current by its status writes). */
  frame?: { latest?: KubeObject };
  /** True when an event about the object waits behind this run. */
  superseded: () => boolean;
  /**
   * The artifacts the run stored so far, by key (`./run-artifacts.ts` `carryingArtifacts`, which
   * the driver puts in front of the run's store): a later stage reads them without a request.
   */
  artifacts?: Map<string, Buffer>;
}

/**
 * The run's {@link SecretMask}: `deps.secretMask`, or a fresh one when the caller gave none
 * (which still shows the scratch directories under `config.tmpRoot` by their stand-ins).
 */
export function secretMaskOf(deps: PipelineDeps): SecretMask {
  if (deps.secretMask) return deps.secretMask;
  const mask = new SecretMaskImpl();
  mask.addScratchRoot(deps.config.tmpRoot);
  return mask;
}

/** The object and run a stage works for (everything a hand-off event carries). */
export interface RunContext {
  clusterId: string;
  ref: ObjectRef;
  run: StageRun;
}

/** What a stage hands on: at most one of the next stage's inputs. */
export interface StageOutput {
  template?: TemplateStageData;
  deploy?: DeployStageData;
  delete?: RunContext;
}

/**
 * Live cluster values the template stage may need (helm `--kube-version`, downward API), of
 * the App's destination cluster: `clusterId`'s own when `destination` is `undefined`, else the
 * cluster of `destination`, the restricted (and policed) kubeconfig of the App's kubeconfig
 * Secret, or the `Error` that says why it could not be had (each needed value is then that
 * error, with the lookup's prefix).
 */
export type ClusterInfoSource = (
  clusterId: string,
  needs: ReturnType<typeof requiredClusterInfo>,
  destination?: string | Error,
) => Promise<ClusterInfo>;

/** Dependencies of the index-repo stage (`./repo/index-repo.ts` `runIndexRepo`): the pipeline's ports plus one of its own. */
export interface IndexRepoDeps extends PipelineDeps {
  /** How kapp's API server address is pinned (`packageRepositoryKubeconfig`); default the system resolver. */
  pinServer?: PinOptions;
  /** The repository template pipeline. Default `templateRepository` of `../packaging/repo-template.ts` (tests inject a fake). */
  templateRepository?: typeof defaultTemplateRepository;
  /**
   * Whether the admission policy bounding `kapp-lambda-pkgr` is installed on the cluster, kept
   * per cluster for a while (`PkgrAdmissionCache` of `../deploy/pkgr-admission.ts`;
   * `createPipelineDeps` sets one). Absent: read before every repository kapp run.
   */
  pkgrAdmission?: Pick<PkgrAdmissionCache, 'check'>;
}

/** Dependencies of a function's stage (the index-repo ports are optional). */
export interface DispatchDeps extends IndexRepoDeps {
  /** Live cluster values for templates that need them. */
  clusterInfo: ClusterInfoSource;
}
