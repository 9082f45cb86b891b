/**
 * Writing one core/v1 Event (`EventWriter.writeEvent`), kept apart from the client so that the
 * client only delegates to it: POST; when an Event of that name exists (409 AlreadyExists),
 * GET it and PATCH `count` + 1 and `lastTimestamp` (client-go's `EventCorrelator` aggregation,
 * done on the server's copy so that several processes add to one Event); when it expired
 * between the two (404), POST again once.
 *
 * @module
 */

import type { RestRequest, RestResponse } from './http.js';
import type { NewEvent } from './port.js';

/** Sends a request (the client's send, which maps a missing answer to `KubeApiError`). */
export type EventSend = (action: string, request: RestRequest) => Promise<RestResponse>;

/** Maps a refused answer to the port's error (the client's `errorFromResponse`). */
export type EventFail = (action: string, response: RestResponse) => Error;

/** `metav1.Time`: RFC 3339, whole seconds. */
function time(t: Date): string {
  return `${t.toISOString().slice(0, 19)}Z`;
}

/** The Event as POSTed. */
export function eventBody(event: NewEvent): Record<string, unknown> {
  const at = time(event.at);
  return {
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { name: event.name, namespace: event.involvedObject.namespace },
    involvedObject: event.involvedObject,
    type: event.type,
    reason: event.reason,
    message: event.message,
    source: { component: event.component },
    firstTimestamp: at,
    lastTimestamp: at,
    count: 1,
  };
}

/**
 * Creates the Event or adds to its count (see the module comment).
 *
 * @returns `created` or `updated`.
 * @throws what `fail` returns for a refused request; what `send` throws when no answer came.
 */
export async function writeCoreEvent(
  send: EventSend,
  fail: EventFail,
  event: NewEvent,
): Promise<'created' | 'updated'> {
  const namespace = event.involvedObject.namespace;
  const collection = `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`;
  const path = `${collection}/${encodeURIComponent(event.name)}`;
  const action = `writing Event ${namespace}/${event.name}`;
  for (let attempt = 0; attempt < 2; attempt++) {
    const created = await send(action, { method: 'POST', path: collection, body: eventBody(event) });
    if (created.statusCode === 201 || created.statusCode === 200) return 'created';
    if (created.statusCode !== 409) throw fail(action, created);
    const current = await send(action, { method: 'GET', path });
    if (current.statusCode === 404) continue;
    if (current.statusCode !== 200) throw fail(action, current);
    const body = current.body as { count?: number; metadata?: { resourceVersion?: string } };
    const patched = await send(action, {
      method: 'PATCH',
      path,
      contentType: 'application/merge-patch+json',
      body: {
        // The resourceVersion makes a concurrent bump a 409 instead of a lost count.
        metadata: { resourceVersion: body.metadata?.resourceVersion },
        count: (body.count ?? 1) + 1,
        lastTimestamp: time(event.at),
        message: event.message,
      },
    });
    if (patched.statusCode === 200) return 'updated';
    if (patched.statusCode !== 404) throw fail(action, patched);
  }
  throw fail(action, { statusCode: 404, body: { message: 'the Event expired while it was written' } });
}
