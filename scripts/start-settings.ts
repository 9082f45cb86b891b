/**
 * The command line and environment of `npm start` (`scripts/start.ts`) that need a rule of
 * their own, and its start banner, kept apart from the script so a unit test can read them
 * without starting a runtime.
 *
 * @module
 */
import path from 'node:path';
import { parseArgs } from 'node:util';
import { LEASE_ACQUIRED_MESSAGE } from '../events/forwarder/leader.js';
import { isDns1123Label } from '../functions/lib/api/names.js';
import {
  FETCH_STALL_MIN_BYTES_SETTING,
  FETCH_STALL_SECONDS_SETTING,
  fetchStallRule,
  MAX_INLINE_BYTES_SETTING,
} from '../functions/lib/entry/config.js';
import type { StallRule } from '../functions/lib/fetch/stall.js';
import { SERVICE_ACCOUNT_DIR } from '../functions/lib/kube/kubeconfig-auth.js';

/** Settings of `npm start` read from its flags and environment. */
export interface StartSettings {
  /**
   * Namespace of each cluster's `kapp-controller-config` (`--controller-config-namespace`, else
   * `KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE`, the Lambda functions' variable). Unset: the
   * runtime's default, `kapp-lambda`. kapp-controller reads its own pod's namespace, so a user
   * coming from it names `kapp-controller` here and keeps the object where it is.
   */
  controllerConfigNamespace?: string;
  /**
   * Cap on an App's inline fetch content, bytes (`KAPP_LAMBDA_MAX_INLINE_BYTES`, the Lambda
   * functions' variable). Unset: the fetch's default, 64 MiB (`functions/lib/fetch/inline-limit.ts`).
   */
  maxInlineBytes?: number;
  /**
   * The fetch's progress rule (`KAPP_LAMBDA_FETCH_STALL_SECONDS` and `_MIN_BYTES`, the Lambda
   * functions' variables). Unset: the fetch's default, 4 KiB in 60 s (`functions/lib/fetch/stall.ts`).
   */
  fetchStall?: StallRule;
}

/**
 * Reads the flags (`node:util` `parseArgs`, strict) and the environment; a flag wins over its
 * variable, a blank value counts as unset.
 *
 * @param argv - The arguments after the script (`process.argv.slice(2)`).
 * @param env - The environment (`process.env`).
 * @returns The settings, `help` when `--help`/`-h` was given.
 * @throws Error on an unknown option, a namespace that is not a DNS-1123 label or a
 *   `KAPP_LAMBDA_MAX_INLINE_BYTES` that is not an integer in [1, 1 GiB], a
 *   `KAPP_LAMBDA_FETCH_STALL_SECONDS` not in [1, 900] or a `KAPP_LAMBDA_FETCH_STALL_MIN_BYTES`
 *   not in [1, 1 MiB] (the message names the flag or variable).
 */
export function readStartSettings(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): StartSettings & { help?: boolean } {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      'controller-config-namespace': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) return { help: true };
  const flag = values['controller-config-namespace']?.trim();
  const variable = env.KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE?.trim();
  const namespace = flag || variable;
  if (namespace && !isDns1123Label(namespace)) {
    const source = flag ? '--controller-config-namespace' : 'KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE';
    throw new Error(`${source}: expected a namespace name (a DNS-1123 label), got ${JSON.stringify(namespace)}`);
  }
  /** The Lambda functions' rule for `name`; a value it refuses throws, naming the variable. */
  const read = (name: string, rule: typeof MAX_INLINE_BYTES_SETTING): number | undefined => {
    const parsed = rule.safeParse(env[name]);
    if (!parsed.success) throw new Error(`${name}: ${parsed.error.issues[0]?.message ?? 'invalid'}`);
    return parsed.data;
  };
  const maxInline = read('KAPP_LAMBDA_MAX_INLINE_BYTES', MAX_INLINE_BYTES_SETTING);
  const stall = fetchStallRule(
    read('KAPP_LAMBDA_FETCH_STALL_SECONDS', FETCH_STALL_SECONDS_SETTING),
    read('KAPP_LAMBDA_FETCH_STALL_MIN_BYTES', FETCH_STALL_MIN_BYTES_SETTING),
  );
  return {
    ...(namespace ? { controllerConfigNamespace: namespace } : {}),
    ...(maxInline !== undefined ? { maxInlineBytes: maxInline } : {}),
    ...(stall ? { fetchStall: stall } : {}),
  };
}

/**
 * The line `npm start` prints once the runtime is set up. With leader election it says what to
 * wait for without holding the log message itself ({@link LEASE_ACQUIRED_MESSAGE}): the banner
 * goes to the same stderr, so a grep for the message would otherwise match at once. `[l]ease`
 * is the usual trick: as a pattern it matches the message, as text it is not the message.
 *
 * @param leaderElection - Whether the runtime waits for a Lease (`KAPP_LAMBDA_LEADER_ELECTION`).
 * @returns One line, without the `[start]` prefix.
 */
export function startBanner(leaderElection: boolean): string {
  if (!leaderElection) return 'forwarder and functions running (no leader election); Ctrl-C to stop';
  const pattern = LEASE_ACQUIRED_MESSAGE.replace(/lease$/, '[l]ease');
  return `forwarder and functions run once this process holds the cluster lease (wait for: grep '${pattern}'); Ctrl-C to stop`;
}

/**
 * Which cluster `npm start` serves, and how it reaches it: a kubeconfig file, the cluster it runs
 * in (a Pod: no kubeconfig, the API server's address in `KUBERNETES_SERVICE_HOST`/`_PORT` and the
 * ServiceAccount's token, CA and namespace in `serviceAccountDir`), or a local control plane it
 * starts.
 */
export type KubeSource =
  | { kind: 'kubeconfig'; path: string }
  | { kind: 'in-cluster'; serviceAccountDir: string }
  | { kind: 'local' };

/**
 * Chooses {@link KubeSource} in controller-runtime's order (`config.GetConfig`, which
 * kapp-controller uses): `$KUBECONFIG` (its first file) when that file exists, else in-cluster when
 * `KUBERNETES_SERVICE_HOST` is set, else `~/.kube/config` when it exists, else a local control
 * plane. The ServiceAccount directory is `KAPP_LAMBDA_SERVICEACCOUNT_DIR`, else the mount every
 * Pod gets (`/var/run/secrets/kubernetes.io/serviceaccount`); tests point it at minted files.
 *
 * @param env - the environment (`process.env`).
 * @param home - the home directory (`os.homedir()`).
 * @param exists - whether a file exists (`fs.existsSync`).
 */
export function kubeSourceOf(
  env: Readonly<Record<string, string | undefined>>,
  home: string,
  exists: (file: string) => boolean,
): KubeSource {
  const explicit = env.KUBECONFIG?.split(':')[0];
  if (explicit && exists(explicit)) return { kind: 'kubeconfig', path: explicit };
  if (env.KUBERNETES_SERVICE_HOST?.trim()) {
    return { kind: 'in-cluster', serviceAccountDir: env.KAPP_LAMBDA_SERVICEACCOUNT_DIR?.trim() || SERVICE_ACCOUNT_DIR };
  }
  const fallback = path.join(home, '.kube', 'config');
  return exists(fallback) ? { kind: 'kubeconfig', path: fallback } : { kind: 'local' };
}

/**
 * The setting that lets `npm start` serve the cluster it runs in without a uid per tool run
 * ({@link inClusterToolIsolation}); only the value `allow` counts.
 */
export const SHARED_TOOL_UID_SETTING = 'KAPP_LAMBDA_SHARED_TOOL_UID';

/**
 * Whether `npm start` may serve the cluster it runs in given whether it can run tools under pool
 * uids (`canSwitchUid()`: it is root). Without that, every tool (helm, ytt, kapp, vendir … run on
 * tenants' inputs) shares the runtime's uid and reads its ServiceAccount token (a
 * cluster-admin equivalent), the artifact root key and other runs' files. That is a refusal, not a
 * warning: a warning in a Pod's log is read after the token has leaked, and the release's
 * Deployment runs as root with the capabilities the uid switch needs, so only a changed manifest
 * meets it. `KAPP_LAMBDA_SHARED_TOOL_UID=allow` starts anyway (one trusted tenant, or a runtime
 * sandboxed otherwise), with a warning. Outside a cluster (a kubeconfig, a local control plane)
 * nothing is checked: the developer's own credentials are at stake, as they were.
 *
 * @returns `undefined` to start; else the line to log and whether to exit (status 1)
 */
export function inClusterToolIsolation(
  source: KubeSource,
  canSwitchUid: boolean,
  env: Readonly<Record<string, string | undefined>>,
): { message: string; exit: boolean } | undefined {
  if (source.kind !== 'in-cluster' || canSwitchUid) return undefined;
  const shared =
    "runs every tool under this process's uid: the tools can read its ServiceAccount token, the artifact root key and other runs' files";
  if (env[SHARED_TOOL_UID_SETTING]?.trim() === 'allow') {
    return { message: `WARNING: not root, ${shared} (${SHARED_TOOL_UID_SETTING}=allow)`, exit: false };
  }
  return {
    message: `refusing to serve the cluster as a non-root user: it ${shared}. Run as root with the capabilities of the release's Deployment (the tools then get a uid each), or set ${SHARED_TOOL_UID_SETTING}=allow to accept that`,
    exit: true,
  };
}
