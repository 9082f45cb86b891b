/**
 * The embedded runtime's HTTP server: `GET /metrics`, kapp-controller's reconcile series
 * (`../lib/observe/metrics.ts`) in the Prometheus text format, as upstream serves them on
 * `-metrics-bind-address` (`:8080`), and the fleet page (`GET /`, `GET /api/fleet`). Loopback by
 * default: the series and the page name every App and cluster.
 *
 * @module
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { FLEET_PATHS, fleetResponse } from '../lib/fleet/http.js';
import type { FleetView } from '../lib/fleet/view.js';

/** Default address of {@link startMetricsServer}: loopback, upstream's port. */
export const DEFAULT_METRICS_ADDRESS = '127.0.0.1:8080';

/** A listening metrics server. */
export interface MetricsServer {
  /** Where it listens (the port chosen, when 0 was asked for). */
  readonly address: AddressInfo;
  /** Stops listening and closes open connections. */
  close(): Promise<void>;
}

/**
 * Parses `host:port` (`[v6]:port` for IPv6; port 0: any free port).
 *
 * @throws Error `metrics address <value>: expected host:port` when it is not one.
 */
export function parseListenAddress(value: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(value.trim());
  const port = m ? Number(m[3]) : Number.NaN;
  if (!m || port > 65_535) throw new Error(`metrics address ${value}: expected host:port`);
  return { host: (m[1] ?? m[2]) as string, port };
}

/**
 * Serves `registry` on `GET /metrics` at `address` (default {@link DEFAULT_METRICS_ADDRESS}) and,
 * with `opts.fleet`, the fleet page on `GET /` and its data on `GET /api/fleet`
 * (`fleetResponse`, `../lib/fleet/http.ts`: a view that cannot be built answers 503); any other
 * path answers 404, any other method 405. Without a registry (`npm run fleet -- serve`, which has
 * no runtime to measure) `/metrics` is a 404 too.
 *
 * @param opts.fleet - builds the fleet view (`buildFleetView`).
 * @param opts.onFleetError - told why a view could not be built; default: nothing.
 * @throws Error when the address is malformed or cannot be listened on (e.g. the port is taken).
 */
export async function startMetricsServer(
  registry: Registry | undefined,
  address = DEFAULT_METRICS_ADDRESS,
  opts: { fleet?: () => Promise<FleetView>; onFleetError?: (err: unknown) => void } = {},
): Promise<MetricsServer> {
  const { host, port } = parseListenAddress(address);
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0] as string;
    const method = req.method ?? 'GET';
    const fleet = opts.fleet;
    if (fleet && FLEET_PATHS.includes(path)) {
      void fleetResponse(method, path, fleet, opts.onFleetError).then((r) => {
        if (r) res.writeHead(r.status, r.headers).end(r.body);
      });
      return;
    }
    if (path !== '/metrics' || !registry) {
      res.writeHead(404).end();
      return;
    }
    if (method !== 'GET') {
      res.writeHead(405, { allow: 'GET' }).end();
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
      () => res.writeHead(500).end(),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  return {
    address: server.address() as AddressInfo,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
