import { isIP } from 'node:net';
import { type MetricsServer, parseListenAddress, startMetricsServer } from '../functions/embedded/metrics-server.js';
import { buildFleetView, FleetViewSource } from '../functions/lib/fleet/view.js';
import { errorText } from '../functions/lib/log.js';
import type { ObjectStore } from '../functions/lib/store/port.js';
import { readOnlyStore } from '../functions/lib/store/read-only.js';
import { errorHint } from './cli.js';
import { storeDirMissing } from './receipts.js';

/** Where `fleet serve` listens without `--listen`: loopback, beside `npm start`'s 8080. */
export const DEFAULT_FLEET_SERVE_ADDRESS = '127.0.0.1:8090';

/** Whether `host` (of a `--listen` address) reaches this machine only: `localhost`, 127.0.0.0/8, `::1`. */
export function isLoopbackHost(host: string): boolean {
  if (host === 'localhost' || host === '::1') return true;
  return isIP(host) === 4 && host.startsWith('127.');
}

/** A store that cannot be served (exit 1): the message says which and why. */
export class FleetServeError extends Error {
  override readonly name = 'FleetServeError';
}

/** An error with its cause, one line: `<name>: <message> (<cause name>: <cause message>)`. */
function withCause(err: unknown): string {
  const cause = err instanceof Error ? err.cause : undefined;
  return (cause === undefined ? errorText(err) : `${errorText(err)} (${errorText(cause)})`) + errorHint(err);
}

/**
 * Checks that the store at `location` can be read before serving it: a local directory must
 * exist (a missing one would show an empty fleet, not an error), and one view must build (a bucket
 * that does not exist, refused access or no credentials fail here, not on every poll).
 *
 * @throws FleetServeError naming the location and the cause.
 */
export async function checkFleetStore(location: string, store: ObjectStore): Promise<void> {
  if (await storeDirMissing(location)) throw new FleetServeError(`--store ${location}: no such directory`);
  try {
    await buildFleetView(store);
  } catch (err) {
    throw new FleetServeError(`cannot read the store ${location}: ${withCause(err)}`);
  }
}

/** What {@link serveFleet} needs besides the store. */
export interface FleetServeOptions {
  /** The store's location (`s3://…` or `file:///…`), for messages. */
  location: string;
  /** `host:port` (port 0: any free port). */
  listen: string;
  /** Progress and the URL (one line). */
  out: (text: string) => void;
  /** Warnings and the store's errors while serving (once per run of failures). */
  err: (text: string) => void;
}

/**
 * Serves the fleet page of `store` (read-only) until the returned server is closed: checks the
 * store ({@link checkFleetStore}), listens, and prints `fleet page of <location>: open
 * http://<host>:<port>/`. Views are built one at a time and reused for a second
 * (`FleetViewSource`). A store that fails while served answers
 * the page's poll with 503 and prints its error once, then `the store reads again` when it does.
 *
 * @throws FleetServeError when the store cannot be read; Error when the address cannot be listened on.
 */
export async function serveFleet(store: ObjectStore, opts: FleetServeOptions): Promise<MetricsServer> {
  const { host } = parseListenAddress(opts.listen);
  const ro = readOnlyStore(store);
  await checkFleetStore(opts.location, ro);
  // One build at a time (FleetViewSource): requests during a build share its outcome, so the
  // outcomes arrive in order and a failure that started before the store came back cannot be
  // printed after `reads again`.
  const views = new FleetViewSource(ro);
  let failing = false;
  const server = await startMetricsServer(undefined, opts.listen, {
    fleet: async () => {
      try {
        const view = await views.view();
        if (failing) opts.err(`fleet: the store ${opts.location} reads again\n`);
        failing = false;
        return view;
      } catch (err) {
        if (!failing) opts.err(`fleet: cannot read the store ${opts.location}: ${withCause(err)}\n`);
        failing = true;
        throw err;
      }
    },
  });
  if (!isLoopbackHost(host)) {
    opts.err(
      `fleet: warning: listening on ${opts.listen}, not loopback: the page has no authentication, and whoever reaches it sees every cluster, PackageInstall, version and rollout of the fleet\n`,
    );
  }
  const shown = server.address.family === 'IPv6' ? `[${server.address.address}]` : server.address.address;
  opts.out(`fleet page of ${opts.location}: open http://${shown}:${server.address.port}/ (Ctrl-C stops)\n`);
  return server;
}
