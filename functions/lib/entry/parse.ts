/**
 * Validation of a queue message body at the edge: any stage event, including the delete
 * hand-off (`dev.kapp-lambda.stage.delete.v1`, which `parseEvent` of `events/schema.ts`
 * does not know).
 *
 * @module
 */
import { formatPath, MAX_EVENT_BYTES, parseEvent } from '../../../events/schema.js';
import { DELETE_EVENT_TYPE, DeleteStageEventSchema } from '../pipeline/delete-event.js';
import type { StageEvent } from '../pipeline/runtime.js';

/** Result of {@link parseStageEvent}. */
export type ParseStageEventResult = { ok: true; event: StageEvent } | { ok: false; error: string };

/** How many problems of a delete hand-off are listed (as `parseEvent` does). */
const MAX_REPORTED_ISSUES = 5;

/**
 * Validates a serialized stage event. Never throws.
 *
 * @param body - the message body (UTF-8 JSON, at most {@link MAX_EVENT_BYTES}).
 * @returns `{ ok: true, event }`, or `{ ok: false, error }` naming each bad field by its path
 *   from the event root (`data.generation: expected number, received string`), in the format
 *   of `parseEvent`; values are not echoed, so `error` is safe to log.
 */
export function parseStageEvent(body: string): ParseStageEventResult {
  if (!body.includes(DELETE_EVENT_TYPE)) return parseEvent(body);
  // Only a body that mentions the delete type can be one; anything else keeps parseEvent's errors.
  if (Buffer.byteLength(body) > MAX_EVENT_BYTES) {
    return { ok: false, error: `(root): event exceeds ${MAX_EVENT_BYTES} bytes` };
  }
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return { ok: false, error: '(root): not valid JSON' };
  }
  if (typeof value !== 'object' || value === null || (value as { type?: unknown }).type !== DELETE_EVENT_TYPE) {
    return parseEvent(value);
  }
  const r = DeleteStageEventSchema.safeParse(value);
  if (r.success) return { ok: true, event: r.data };
  const lines: string[] = [];
  for (const iss of r.error.issues) {
    const line = `${formatPath(iss.path)}: ${iss.message}`;
    if (!lines.includes(line)) lines.push(line);
  }
  const shown = lines.slice(0, MAX_REPORTED_ISSUES).join('; ');
  return {
    ok: false,
    error: lines.length > MAX_REPORTED_ISSUES ? `${shown}; (+${lines.length - MAX_REPORTED_ISSUES} more)` : shown,
  };
}
