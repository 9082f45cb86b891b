/**
 * The embedded runtime's `GET /metrics`: kapp-controller's reconcile series
 * (`../lib/observe/metrics.ts`) in the Prometheus text format, as upstream serves them on
 * `-metrics-bind-address` (`:8080`). Loopback by default: the series name every App.
 *
 * @module
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';

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
 * Serves `registry` on `GET /metrics` at `address` (default {@link DEFAULT_METRICS_ADDRESS});
 * any other path answers 404.
 *
 * @throws Error when the address is malformed or cannot be listened on (e.g. the port is taken).
 */
export async function startMetricsServer(
  registry: Registry,
  address = DEFAULT_METRICS_ADDRESS,
): Promise<MetricsServer> {
  const { host, port } = parseListenAddress(address);
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404).end();
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
