/**
 * One size budget for a whole App (or PackageRepository) status, so that a status write always
 * fits the API server's storage limit, and the minimal failed status written when the API
 * server still rejects one as too large.
 *
 * Why: the App object is one etcd value. etcd refuses a value above `--max-request-bytes`
 * (default 1.5 MiB: `etcdserver: request is too large`), the API server's etcd client refuses
 * to send more than 2 MiB (`rpc error: code = ResourceExhausted desc = trying to send message
 * larger than max (2098865 vs. 2097152)`), and the API server refuses a request body above
 * 3 MiB (HTTP 413 `Request entity too large: limit is 3145728`). Upstream's PR #1840 bounds
 * each output field to 1 MiB, which still lets fetch + template + deploy + inspect + the
 * usefulErrorMessage copy add up to several MiB; a 5 MiB ytt `fail()` message (stored in
 * `template.stderr` and again in `usefulErrorMessage`) then makes every write fail and the App
 * stays `Reconciling`. Here the sum of all text fields is bounded by one budget, below the etcd
 * limit minus the rest of the object.
 *
 * Cuts keep the tail with upstream's `[output truncated]\n` marker ({@link TRUNCATION_PREFIX}),
 * like PR #1840. Sizes are counted as the API server's JSON encoder writes them (Go's
 * `encoding/json`: `<`, `>`, `&`, U+2028/9 and control characters take 6 bytes), so an
 * escape-heavy text cannot slip past the budget.
 *
 * @module
 */
import { codePointCost, cutTail, encodedTextBytes, redactSecrets, TRUNCATION_PREFIX } from './redact.js';
import { friendlyDeleteFailed, friendlyReconcileFailed } from './status.js';
import type { AppStatusLike, Condition } from './types.js';

/** etcd's default `--max-request-bytes`: 1.5 MiB. The whole object (metadata, spec, status) is one value. */
export const ETCD_MAX_REQUEST_BYTES = 1_572_864;

/** The API server's etcd client refuses to send more than this (gRPC `MaxCallSendMsgSize`, 2 MiB). */
export const ETCD_CLIENT_MAX_SEND_BYTES = 2 * 1024 * 1024;

/** The API server's request body bound (`MaxRequestBodyBytes`, 3 MiB): above it, HTTP 413. */
export const APISERVER_MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024;

/** The budget of a whole status, encoded: 1 MiB (when the rest of the object leaves room). */
export const STATUS_BUDGET_BYTES = 1024 * 1024;

/**
 * Room kept between object and etcd limit for what the API server adds on write (new
 * resourceVersion, the status manager's managedFields entry) and etcd's request framing.
 */
export const OBJECT_HEADROOM_BYTES = 64 * 1024;

/** The smallest budget given, even when the spec leaves less room (the write may then fall back). */
export const MIN_STATUS_BUDGET_BYTES = 16 * 1024;

/** Bound of each short text (condition message, friendlyDescription, a stage's `error`): 16 KiB. */
export const SHORT_TEXT_BYTES = 16 * 1024;

/** At most this many conditions are kept (upstream always writes exactly one). */
export const MAX_CONDITIONS = 8;

/** Bound of the message of the minimal status written when a status was too large. */
export const TOO_LARGE_MESSAGE_BYTES = 2048;

// ---------------------------------------------------------------------------------------------
// Encoded sizes

/** A deep copy of a JSON value that shares the (immutable) strings instead of copying megabytes. */
function copyJson<T>(value: T): T {
  if (Array.isArray(value)) return value.map(copyJson) as T;
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = copyJson(v);
    return out as T;
  }
  return value;
}

/**
 * Bytes of `value` serialized as JSON by the API server (an upper bound: strings as
 * {@link encodedTextBytes} plus quotes, no whitespace). `undefined` members are skipped, as
 * `JSON.stringify` does.
 *
 * @param value - Any JSON value.
 * @returns Encoded bytes.
 */
export function encodedSize(value: unknown): number {
  if (value === null || value === undefined) return 4;
  if (typeof value === 'string') return encodedTextBytes(value) + 2;
  if (typeof value === 'number' || typeof value === 'boolean') return String(value).length;
  if (Array.isArray(value)) {
    let n = 2 + Math.max(0, value.length - 1);
    for (const v of value) n += encodedSize(v);
    return n;
  }
  if (typeof value === 'object') {
    let n = 2;
    let members = 0;
    for (const [k, v] of Object.entries(value)) {
      if (v === undefined) continue;
      n += encodedTextBytes(k) + 3 + encodedSize(v);
      members++;
    }
    return n + Math.max(0, members - 1);
  }
  return 0;
}

/** The first `maxBytes` (encoded) of `text`, for short one-line excerpts. */
function headEncoded(text: string, maxBytes: number): string {
  let used = 0;
  let end = 0;
  while (end < text.length) {
    const cp = text.codePointAt(end) ?? 0;
    const cost = codePointCost(cp);
    if (used + cost > maxBytes) return `${text.slice(0, end)}…`;
    used += cost;
    end += cp > 0xffff ? 2 : 1;
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// The budget

/**
 * The status budget of one object: {@link STATUS_BUDGET_BYTES}, or less when the rest of the
 * object (metadata with managedFields, spec: an inline App can carry a large spec) leaves less
 * room under {@link ETCD_MAX_REQUEST_BYTES} minus {@link OBJECT_HEADROOM_BYTES}; never below
 * {@link MIN_STATUS_BUDGET_BYTES}.
 *
 * @param object - The object as read (its `status` is ignored); `undefined` gives the full budget.
 * @returns Encoded bytes the status may take.
 */
export function statusBudgetFor(object: Record<string, unknown> | undefined): number {
  if (!object) return STATUS_BUDGET_BYTES;
  const { status: _status, ...rest } = object;
  const room = ETCD_MAX_REQUEST_BYTES - OBJECT_HEADROOM_BYTES - encodedSize(rest);
  return Math.max(MIN_STATUS_BUDGET_BYTES, Math.min(STATUS_BUDGET_BYTES, room));
}

/** How a text field competes for the budget. */
type FieldClass = 'short' | 'useful' | 'stderr' | 'stdout';

/**
 * Shares of the long texts when they compete: usefulErrorMessage (what `kubectl describe`
 * users read first) before stderr, stderr before stdout.
 */
const WEIGHTS: Record<Exclude<FieldClass, 'short'>, number> = { useful: 8, stderr: 2, stdout: 1 };

interface TextField {
  holder: Record<string, unknown>;
  key: string;
  cls: FieldClass;
  bytes: number;
}

const STAGE_PARTS = ['fetch', 'template', 'deploy', 'inspect'] as const;
const STAGE_TEXT: Record<string, FieldClass> = { error: 'short', stderr: 'stderr', stdout: 'stdout' };

/** The longest string anywhere in a JSON value, in UTF-16 code units. */
function longestString(value: unknown): number {
  if (typeof value === 'string') return value.length;
  if (value === null || typeof value !== 'object') return 0;
  let n = 0;
  for (const v of Array.isArray(value) ? value : Object.values(value)) n = Math.max(n, longestString(v));
  return n;
}

/**
 * The last `maxUnits` code units of `text` (never starting inside a surrogate pair). Every code
 * unit encodes to at least one byte, so no cut to `maxUnits` bytes or fewer needs more.
 */
function lastUnits(text: string, maxUnits: number): string {
  if (text.length <= maxUnits) return text;
  let start = text.length - maxUnits;
  const unit = text.charCodeAt(start);
  if (unit >= 0xdc00 && unit <= 0xdfff) start++;
  return text.slice(start);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/**
 * Collects the bounded text fields of `status` (a private deep copy), each first cut to its last
 * `maxUnits` code units (cheap, and never less than any share it can get) so that a 5 MiB text
 * is measured only once at budget size.
 */
function textFields(status: Record<string, unknown>, maxUnits: number): TextField[] {
  const out: TextField[] = [];
  const add = (holder: Record<string, unknown>, key: string, cls: FieldClass) => {
    const v = holder[key];
    if (typeof v !== 'string' || v === '') return;
    const text = lastUnits(v, maxUnits);
    holder[key] = text;
    // A pre-cut text always counts as too big for its share (so it gets the marker).
    out.push({
      holder,
      key,
      cls,
      bytes: text === v ? encodedTextBytes(text) : Math.max(encodedTextBytes(text), maxUnits + 1),
    });
  };
  add(status, 'friendlyDescription', 'short');
  add(status, 'usefulErrorMessage', 'useful');
  if (Array.isArray(status.conditions)) {
    for (const c of status.conditions) {
      if (!isRecord(c)) continue;
      add(c, 'message', 'short');
      add(c, 'reason', 'short');
    }
  }
  for (const part of STAGE_PARTS) {
    const p = status[part];
    if (!isRecord(p)) continue;
    for (const [key, cls] of Object.entries(STAGE_TEXT)) add(p, key, cls);
  }
  return out;
}

/**
 * Max-min fair shares: each index gets at most `caps[i]`, the total at most `total`, and what a
 * small field does not need goes to the others in proportion to `weights`.
 */
function waterFill(caps: readonly number[], weights: readonly number[], total: number): number[] {
  const alloc = caps.map(() => 0);
  let active = caps.map((_, i) => i).filter((i) => (caps[i] ?? 0) > 0);
  let remaining = Math.max(0, total);
  while (active.length > 0 && remaining > 0) {
    const wsum = active.reduce((s, i) => s + (weights[i] ?? 1), 0);
    const fits = active.filter((i) => (caps[i] ?? 0) <= (remaining * (weights[i] ?? 1)) / wsum);
    if (fits.length === 0) {
      for (const i of active) alloc[i] = Math.floor((remaining * (weights[i] ?? 1)) / wsum);
      break;
    }
    for (const i of fits) {
      alloc[i] = caps[i] ?? 0;
      remaining -= alloc[i] ?? 0;
    }
    active = active.filter((i) => !fits.includes(i));
  }
  return alloc;
}

/**
 * Makes a status fit `budgetBytes` (encoded JSON), as every status write does before it is sent:
 * - at most {@link MAX_CONDITIONS} conditions;
 * - short texts (condition messages and reasons, friendlyDescription, each stage's `error`)
 *   first, each at most {@link SHORT_TEXT_BYTES} and together at most a quarter of the room;
 * - the rest of the room shared by usefulErrorMessage, the stages' stderr and stdout with
 *   weights 8 : 2 : 1 (a field that needs less than its share gives the rest to the others);
 * - every cut keeps the tail behind `[output truncated]\n`.
 *
 * When the fields that are not text (timestamps, `deploy.kapp.associatedResources`, ...) alone
 * exceed the budget, the result is {@link tooLargeStatus}. The input is not modified.
 *
 * @param status - The status about to be written.
 * @param budgetBytes - Defaults to {@link STATUS_BUDGET_BYTES}; see {@link statusBudgetFor}.
 * @param generation - `observedGeneration` for the fallback; defaults to the status's own.
 * @returns A status whose {@link encodedSize} is at most `budgetBytes`.
 */
export function fitStatus<S extends AppStatusLike>(
  status: S,
  budgetBytes: number = STATUS_BUDGET_BYTES,
  generation?: number,
): S {
  // A string longer than the budget cannot fit (each code unit encodes to 1+ bytes).
  if (longestString(status) <= budgetBytes && encodedSize(status) <= budgetBytes) return status;
  const out = copyJson(status) as S & Record<string, unknown>;
  if (Array.isArray(out.conditions) && out.conditions.length > MAX_CONDITIONS) {
    out.conditions = out.conditions.slice(0, MAX_CONDITIONS);
  }
  const fields = textFields(out, budgetBytes);
  const texts = fields.map((f) => f.holder[f.key] as string);
  for (const f of fields) f.holder[f.key] = '';
  const room = budgetBytes - encodedSize(out);
  const short = fields.map((f, i) => ({ f, i })).filter(({ f }) => f.cls === 'short');
  const long = fields.map((f, i) => ({ f, i })).filter(({ f }) => f.cls !== 'short');
  const shortAlloc = waterFill(
    short.map(({ f }) => Math.min(f.bytes, SHORT_TEXT_BYTES)),
    short.map(() => 1),
    Math.floor(room / 4),
  );
  const shortUsed = shortAlloc.reduce((s, n) => s + n, 0);
  const longAlloc = waterFill(
    long.map(({ f }) => f.bytes),
    long.map(({ f }) => WEIGHTS[f.cls as Exclude<FieldClass, 'short'>]),
    room - shortUsed,
  );
  const apply = (list: typeof short, alloc: number[]) =>
    list.forEach(({ f, i }, k) => {
      const text = texts[i] ?? '';
      f.holder[f.key] = (alloc[k] ?? 0) >= f.bytes ? text : cutTail(text, alloc[k] ?? 0);
    });
  apply(short, shortAlloc);
  apply(long, longAlloc);
  if (room < 0 || encodedSize(out) > budgetBytes) {
    return tooLargeStatus(status, status, generation ?? status.observedGeneration ?? 0, 'its fields exceed the budget');
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The fallback

/**
 * The minimal failed status written when a status could not be stored because of its size (the
 * API server answered 413, or etcd refused the request): one condition, `ReconcileFailed` (or
 * `DeleteFailed` when the rejected status was a delete's) whose message says the status was too
 * large, why, and the first part of the rejected status's error; friendlyDescription and
 * usefulErrorMessage from that message; failures + 1, successes 0; of the stage parts only exit
 * codes, `finished` and times; `deploy.kapp` kept when small (the delete path reads it). The
 * message is redacted and at most {@link TOO_LARGE_MESSAGE_BYTES} plus a short prefix.
 *
 * Beyond upstream (kapp-controller retries the write and keeps the old status).
 *
 * @param current - The stored status (counters come from it).
 * @param attempted - The status that was rejected.
 * @param generation - `observedGeneration` of the run.
 * @param reason - Why (e.g. the API server's message); its first 512 bytes are kept.
 */
export function tooLargeStatus<S extends AppStatusLike>(
  current: S | undefined,
  attempted: S | undefined,
  generation: number,
  reason: string,
): S {
  const first = attempted?.conditions?.[0];
  const deleting = first?.type === 'Deleting' || first?.type === 'DeleteFailed';
  const err = first?.message || attempted?.usefulErrorMessage || '';
  let message = `Status too large to store (${headEncoded(redactSecrets(reason.replace(/\s+/g, ' ')), 512)})`;
  if (err !== '') {
    const room = TOO_LARGE_MESSAGE_BYTES - encodedTextBytes(message) - 40;
    message += `; first part of the error: ${headEncoded(redactSecrets(err), Math.max(0, room))}`;
  }
  const condition: Condition = { type: deleting ? 'DeleteFailed' : 'ReconcileFailed', status: 'True', message };
  const out: Record<string, unknown> = {
    observedGeneration: generation,
    conditions: [condition],
    friendlyDescription: deleting ? friendlyDeleteFailed(message) : friendlyReconcileFailed(message),
    usefulErrorMessage: message,
    consecutiveReconcileFailures: (current?.consecutiveReconcileFailures ?? 0) + 1,
    consecutiveReconcileSuccesses: 0,
  };
  const src = (attempted ?? {}) as Record<string, unknown>;
  for (const part of STAGE_PARTS) {
    const p = src[part];
    if (!isRecord(p)) continue;
    const small: Record<string, unknown> = {};
    for (const key of ['exitCode', 'finished', 'startedAt', 'updatedAt']) {
      const v = p[key];
      if (typeof v === 'number' || typeof v === 'boolean' || (typeof v === 'string' && v.length <= 64)) small[key] = v;
    }
    if (part === 'deploy' && isRecord(p.kapp) && encodedSize(p.kapp) <= 64 * 1024) small.kapp = p.kapp;
    out[part] = small;
  }
  return out as S;
}

/**
 * Puts {@link TRUNCATION_PREFIX} in front of a text whose head a bounded reader dropped (the
 * command runner's `truncated`, `exec/tail.ts` `TextTail`), so the status shows that
 * output is missing even when the kept tail fits its field. A text that already starts with the
 * marker is returned as is.
 *
 * @param text - The kept tail.
 * @param truncated - Whether its head was dropped.
 */
export function markTruncated(text: string, truncated: boolean): string {
  return truncated && !text.startsWith(TRUNCATION_PREFIX) ? TRUNCATION_PREFIX + text : text;
}
