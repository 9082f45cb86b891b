/**
 * The embedded default: forwarder and functions in one process (`npm start`, `npm run demo`,
 * the e2e tests). The composition root: builds the ports (kubeconfig cluster registry, local
 * directory object store, command runner over the cached tools, pino logger) and wires one
 * forwarder per cluster into the in-process {@link EmbeddedPipeline}. The same stage
 * handlers run unchanged on Lambda, where each entry file builds its own ports.
 */
import path from 'node:path';
import { Forwarder } from '../../events/forwarder/forwarder.js';
import { watchedKinds } from '../../events/forwarder/kinds.js';
import { COMPONENTS } from '../../layers/manifest.js';
import { hardenAddonPath, LAUNCHER_NAME, launcherPath } from '../../layers/native.js';
import { type ClusterKeyring, fileKeyring } from '../lib/artifact/keyring.js';
import { CONTROLLER_VERSION } from '../lib/entry/config.js';
import { cacheBinResolver } from '../lib/exec/bins.js';
import { hardenProcess } from '../lib/exec/harden.js';
import { createToolMetrics, type ToolMetrics } from '../lib/exec/metrics.js';
import { createCommandRunner, minimalEnv, TOOL_NAMES } from '../lib/exec/runner.js';
import { canSwitchUid, DEFAULT_UID_POOL, ensureTraversable, stageBinaries } from '../lib/exec/sandbox.js';
import { KubeConfigClusterRegistry } from '../lib/kube/registry.js';
import type { Logger } from '../lib/log.js';
import type { PipelineConfig } from '../lib/pipeline/deps.js';
import { type DispatchDeps, EmbeddedPipeline } from '../lib/pipeline/runtime.js';
import type { ClusterInfoSource } from '../lib/pipeline/template.js';
import { LocalDirStore } from '../lib/store/local.js';
import type { ObjectStore } from '../lib/store/port.js';

export { CONTROLLER_VERSION };

/** Pinned tool versions (without `v`), keyed by binary, from `layers/manifest.ts`. */
export function pinnedToolVersions(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const c of COMPONENTS) for (const b of c.binaries) out[b.bin] = c.version.replace(/^v/, '');
  return out;
}

/** Options of {@link startEmbedded}. */
export interface EmbeddedOptions {
  /** Kubeconfig whose contexts are the clusters served (cluster id = context name). */
  kubeconfigPath: string;
  /** Serve only these contexts; default all. */
  contexts?: readonly string[];
  /** Namespaces to watch; default all. */
  namespaces?: readonly string[];
  /** Object store; default a {@link LocalDirStore} at `storeDir`. */
  store?: ObjectStore;
  /** Local object store root when `store` is not given. */
  storeDir?: string;
  /** Tool cache root (`~/.cache/kapp-lambda`). */
  cacheRoot: string;
  /**
   * Keys sealing private artifacts (content made from Secrets), per cluster. Default: keys
   * derived from the root key file `<cacheRoot>/keys/artifact-root.key`, created 0600 on first
   * use (outside the store directory, so no object key can name it).
   */
  keyring?: ClusterKeyring;
  /** Scratch directory root. */
  tmpRoot: string;
  log: Logger;
  /** Objects reconciled at once. Default 4. */
  concurrency?: number;
  /** Forwarder tuning (coalescing window, watchdog), ms. */
  forwarder?: { coalesceWindowMs?: number; stallTimeoutMs?: number; watchTimeoutSeconds?: number };
  /** Overrides of the pipeline configuration. */
  config?: Partial<PipelineConfig>;
  /** Crash retry backoff, ms. */
  retry?: { baseRetryMs?: number; maxRetryMs?: number };
  /**
   * Run each tool under its own unprivileged uid (see `functions/lib/exec/sandbox.ts`).
   * Default: on when this process is root, the only case where it is possible.
   */
  isolateTools?: boolean;
  /** The hardening addon (`functions/lib/exec/harden.ts`); default the one `npm run setup` builds. */
  hardenAddon?: string;
  /** Wraps the dispatch deps (tests inject crashes here). */
  wrapDeps?: (deps: DispatchDeps) => DispatchDeps;
}

/** A running embedded runtime. */
export interface EmbeddedRuntime {
  pipeline: EmbeddedPipeline;
  forwarders: Forwarder[];
  registry: KubeConfigClusterRegistry;
  store: ObjectStore;
  /** Tool runs and time per tool since start. */
  toolMetrics: ToolMetrics;
  /** Stops the forwarders (draining what they hold) and the pipeline after running stages end. */
  stop(): Promise<void>;
}

/**
 * Starts forwarders and the in-process pipeline.
 * @throws Error when the kubeconfig cannot be loaded.
 */
export function startEmbedded(opts: EmbeddedOptions): EmbeddedRuntime {
  const registry = KubeConfigClusterRegistry.fromFile(opts.kubeconfigPath, { contexts: opts.contexts });
  const store = opts.store ?? new LocalDirStore(opts.storeDir ?? `${opts.cacheRoot}/store`);
  const toolMetrics = createToolMetrics();
  // A tool must not read this process's environment or memory, even under the same uid.
  hardenProcess(opts.hardenAddon ?? hardenAddonPath(opts.cacheRoot));
  const isolate = opts.isolateTools ?? canSwitchUid();
  const cached = cacheBinResolver(opts.cacheRoot);
  const launcherFile = launcherPath(opts.cacheRoot);
  // The launcher is resolved like a tool so that it is staged with them (not on the allow-list).
  let resolveBin = (name: string) => (name === LAUNCHER_NAME ? launcherFile : cached(name));
  if (isolate) {
    // Runs under other uids must reach their scratch directories and execute the tools,
    // which sit in root's private home: stage them beside the scratch root.
    ensureTraversable(opts.tmpRoot);
    resolveBin = stageBinaries([...TOOL_NAMES, LAUNCHER_NAME], resolveBin, path.join(opts.tmpRoot, 'bin'));
  }
  const runner = createCommandRunner({
    allow: TOOL_NAMES,
    resolveBin,
    tmpDir: opts.tmpRoot,
    metrics: toolMetrics,
    ...(isolate ? { uidPool: DEFAULT_UID_POOL } : {}),
    launcher: resolveBin(LAUNCHER_NAME),
    // vendir runs `helm3` for Helm 3 charts unless told which binary is helm 3.
    baseEnv: {
      ...minimalEnv({ allow: TOOL_NAMES, resolveBin, tmpDir: opts.tmpRoot }),
      VENDIR_HELM_BINARY: resolveBin('helm'),
    },
  });
  const clusterInfo: ClusterInfoSource = async (clusterId, needs) => {
    const client = registry.client(clusterId);
    return {
      kubernetesVersion: needs.kubernetesVersion ? await client.serverVersion().catch((e: Error) => e) : undefined,
      kubernetesAPIs: needs.kubernetesAPIs ? await client.apiGroupVersions().catch((e: Error) => e) : undefined,
      kappControllerVersion: CONTROLLER_VERSION,
    };
  };
  const base: DispatchDeps = {
    clusters: registry,
    store,
    keyring: opts.keyring ?? fileKeyring(path.join(opts.cacheRoot, 'keys', 'artifact-root.key')),
    runner,
    now: () => new Date(),
    log: opts.log,
    clusterInfo,
    config: {
      tmpRoot: opts.tmpRoot,
      toolVersions: pinnedToolVersions(),
      controllerVersion: CONTROLLER_VERSION,
      ...opts.config,
    },
  };
  const deps = opts.wrapDeps ? opts.wrapDeps(base) : base;
  const pipeline = new EmbeddedPipeline(deps, { concurrency: opts.concurrency, ...opts.retry });
  const forwarders = registry.clusterIds().map(
    (clusterId) =>
      new Forwarder({
        clusterId,
        watcher: registry.watchView(clusterId),
        transport: pipeline,
        kinds: watchedKinds(['App'], deps.config.timer),
        namespaces: opts.namespaces,
        logger: opts.log,
        ...opts.forwarder,
      }),
  );
  for (const f of forwarders) f.start();
  return {
    pipeline,
    forwarders,
    registry,
    store,
    toolMetrics,
    async stop() {
      await Promise.all(forwarders.map((f) => f.stop({ drain: false, timeoutMs: 5000 })));
      pipeline.close();
      await pipeline.idle();
    },
  };
}
