/**
 * `npm start`'s command line: it takes no arguments (the embedded runtime is configured by
 * environment variables, `docs/configuration.md`) but `-h`/`--help` and
 * `--controller-config-namespace` (read by `./start-settings.ts`). Apart from
 * `./start.ts`, which starts the runtime when imported, so tests can run it.
 *
 * @module
 */

import { parseArgs } from 'node:util';
import { EXIT, exitCodesHelp, isUsageError, usageFailure } from './cli.js';
import { readStartSettings } from './start-settings.js';

/** `npm start --help`. */
export const START_USAGE = `usage: npm start [-- -h|--help] [-- --controller-config-namespace <ns>]
  --controller-config-namespace <ns>  where each cluster's kapp-controller-config is read
                                      (env KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE; default kapp-lambda;
                                      kapp-controller users name kapp-controller)
  Runs the forwarder and the functions in this process against the current kubeconfig context
  ($KUBECONFIG, else ~/.kube/config), in a Pod the cluster it runs in (KUBERNETES_SERVICE_HOST
  set, the ServiceAccount's files in KAPP_LAMBDA_SERVICEACCOUNT_DIR, default
  /var/run/secrets/kubernetes.io/serviceaccount), or a local control plane it starts when there
  is none.
  Configured by environment variables (docs/configuration.md), among them:
    KAPP_LAMBDA_CONTEXTS=a,b          contexts to serve (default: the current one)
    KAPP_LAMBDA_NAMESPACES=a,b        namespaces to serve (default: all)
    KAPP_LAMBDA_CONCURRENCY=4         stage runs at once
    KAPP_LAMBDA_STORE=<dir>           object store directory (default ~/.cache/kapp-lambda/store)
    KAPP_LAMBDA_LEASE_NAMESPACE=<ns>  namespace of the leader-election Lease (default kapp-lambda)
    KAPP_LAMBDA_LEADER_ELECTION=off   act without a Lease (only when nothing else serves the cluster)
    KAPP_LAMBDA_METRICS_ADDRESS=<host:port>|off  GET /metrics and the fleet page (/, /api/fleet) (default 127.0.0.1:8080)
    KAPP_LAMBDA_URL_POLICY=enforce, KAPP_LAMBDA_URL_ALLOW=…  the cloud mode's URL policy
    KAPP_LAMBDA_MAX_INLINE_BYTES=<n>  cap on an App's inline fetch content (default 64 MiB)
    KAPP_LAMBDA_FETCH_STALL_SECONDS=60, KAPP_LAMBDA_FETCH_STALL_MIN_BYTES=4096  cut a fetch
                                      connection that brings fewer bytes in a window
  Runs until Ctrl-C (exit 130) or SIGTERM (exit 143); an invalid KAPP_LAMBDA_URL_POLICY,
  KAPP_LAMBDA_URL_ALLOW, KAPP_LAMBDA_MAX_INLINE_BYTES or KAPP_LAMBDA_FETCH_STALL_* exits 2,
  as a usage error.
${exitCodesHelp('the local control plane could not start')}`;

/**
 * Reads `npm start`'s arguments.
 *
 * @param env - the environment, for the settings' variables (`KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE`)
 * @returns the exit code to stop with (`--help`: the usage on stdout, 0; anything else, or a
 *   setting `readStartSettings` refuses: a usage error on stderr, 2), or `undefined` to start
 *   the runtime.
 */
export function startCommandLine(
  argv: string[],
  io: { out: (t: string) => void; err: (t: string) => void },
  env: Readonly<Record<string, string | undefined>> = {},
) {
  try {
    const { values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      options: { help: { type: 'boolean', short: 'h' }, 'controller-config-namespace': { type: 'string' } },
    });
    if (values.help) {
      io.out(START_USAGE);
      return EXIT.ok;
    }
    if (positionals.length > 0) {
      return usageFailure('start', START_USAGE, `unexpected argument ${JSON.stringify(positionals[0])}`, io.err);
    }
  } catch (err) {
    if (!isUsageError(err)) throw err;
    return usageFailure('start', START_USAGE, err.message, io.err);
  }
  try {
    readStartSettings(argv, env);
  } catch (err) {
    return usageFailure('start', START_USAGE, (err as Error).message, io.err);
  }
  return undefined;
}
