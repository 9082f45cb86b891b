/**
 * `npm start`'s command line: it takes no arguments (the embedded runtime is configured by
 * environment variables, `docs/configuration.md`), only `-h`/`--help`. Apart from
 * `./start.ts`, which starts the runtime when imported, so tests can run it.
 *
 * @module
 */

import { parseArgs } from 'node:util';
import { EXIT, exitCodesHelp, isUsageError, usageFailure } from './cli.js';

/** `npm start --help`. */
export const START_USAGE = `usage: npm start [-- -h|--help]
  Runs the forwarder and the functions in this process against the current kubeconfig context
  ($KUBECONFIG, else ~/.kube/config), or a local control plane it starts when there is none.
  Configured by environment variables (docs/configuration.md), among them:
    KAPP_LAMBDA_CONTEXTS=a,b          contexts to serve (default: the current one)
    KAPP_LAMBDA_NAMESPACES=a,b        namespaces to serve (default: all)
    KAPP_LAMBDA_CONCURRENCY=4         stage runs at once
    KAPP_LAMBDA_STORE=<dir>           object store directory (default ~/.cache/kapp-lambda/store)
    KAPP_LAMBDA_LEASE_NAMESPACE=<ns>  namespace of the leader-election Lease (default kapp-lambda)
    KAPP_LAMBDA_LEADER_ELECTION=off   act without a Lease (only when nothing else serves the cluster)
    KAPP_LAMBDA_METRICS_ADDRESS=<host:port>|off  GET /metrics (default 127.0.0.1:8080)
    KAPP_LAMBDA_URL_POLICY=enforce, KAPP_LAMBDA_URL_ALLOW=…  the cloud mode's URL policy
  Runs until Ctrl-C (exit 130) or SIGTERM (exit 143); an invalid KAPP_LAMBDA_URL_POLICY or
  KAPP_LAMBDA_URL_ALLOW exits 2, as a usage error.
${exitCodesHelp('the local control plane could not start')}`;

/**
 * Reads `npm start`'s arguments.
 *
 * @returns the exit code to stop with (`--help`: the usage on stdout, 0; anything else: a usage
 *   error on stderr, 2), or `undefined` to start the runtime (no arguments).
 */
export function startCommandLine(argv: string[], io: { out: (t: string) => void; err: (t: string) => void }) {
  try {
    const { values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      options: { help: { type: 'boolean', short: 'h' } },
    });
    if (values.help) {
      io.out(START_USAGE);
      return EXIT.ok;
    }
    if (positionals.length > 0) {
      return usageFailure('start', START_USAGE, `unexpected argument ${JSON.stringify(positionals[0])}`, io.err);
    }
    return undefined;
  } catch (err) {
    if (!isUsageError(err)) throw err;
    return usageFailure('start', START_USAGE, err.message, io.err);
  }
}
