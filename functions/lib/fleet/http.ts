/**
 * The fleet page's two routes as one transport-free function (issue 28 item 5), shared by every
 * server of the page so they answer alike: `npm start`'s HTTP server
 * (`functions/embedded/metrics-server.ts`), `npm run fleet -- serve` (`scripts/fleet-serve.ts`,
 * over any store, the cloud fleet's bucket included) and the page's Lambda function behind a
 * Function URL (`functions/fleet-page/index.ts`).
 *
 * - `GET /`: the page ({@link FLEET_PAGE_HTML}) under its CSP ({@link fleetPageCsp}: its own
 *   inline style and script by hash, requests to its own origin only), `nosniff`, `no-store`.
 * - `GET /api/fleet`: the {@link FleetView} as JSON, `no-store`. A view that cannot be built (the
 *   store unreachable, access refused) answers 503 with {@link FLEET_UNAVAILABLE} as plain text:
 *   the page shows it and polls again; the error itself goes to the caller's `onError`, never to
 *   the client (a store's error names buckets, keys and endpoints).
 * - Any other method on those paths: 405 with `Allow: GET`; any other path: `undefined` (the
 *   caller's: 404, or its own routes such as `/metrics`).
 *
 * @module
 */
import { FLEET_PAGE_HTML, fleetPageCsp } from './page.js';
import type { FleetView } from './view.js';

/** The body of the 503 {@link fleetResponse} answers when the view cannot be built. */
export const FLEET_UNAVAILABLE = "cannot read the fleet's store (the server's log says why)\n";

/** The paths {@link fleetResponse} answers. */
export const FLEET_PATHS: readonly string[] = Object.freeze(['/', '/api/fleet']);

/** One answer of {@link fleetResponse}: status, headers (lower-case names) and a UTF-8 body. */
export interface FleetResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** The CSP, computed once (it hashes the page). */
let csp: string | undefined;

/**
 * The answer to `method path` (path without the query), or `undefined` when `path` is none of
 * {@link FLEET_PATHS}.
 *
 * @param view - builds the fleet view (`buildFleetView`); called for `GET /api/fleet` only.
 * @param onError - told why a view could not be built (the 503); default: nothing.
 */
export async function fleetResponse(
  method: string,
  path: string,
  view: () => Promise<FleetView>,
  onError: (err: unknown) => void = () => {},
): Promise<FleetResponse | undefined> {
  if (!FLEET_PATHS.includes(path)) return undefined;
  if (method !== 'GET') return { status: 405, headers: { allow: 'GET' }, body: '' };
  if (path === '/') {
    csp ??= fleetPageCsp();
    return {
      status: 200,
      headers: {
        'content-type': 'text/html; charset=utf-8',
        'content-security-policy': csp,
        'x-content-type-options': 'nosniff',
        'cache-control': 'no-store',
      },
      body: FLEET_PAGE_HTML,
    };
  }
  let built: FleetView;
  try {
    built = await view();
  } catch (err) {
    onError(err);
    return {
      status: 503,
      headers: { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' },
      body: FLEET_UNAVAILABLE,
    };
  }
  return {
    status: 200,
    headers: { 'content-type': 'application/json', 'cache-control': 'no-store' },
    body: JSON.stringify(built),
  };
}
