/**
 * Bounding and redaction of every text that leaves a stage for status, logs or events:
 * upstream's 1 MiB tail truncation (PR #1840, `[output truncated]\n` prefix) and, beyond
 * upstream, the credential shapes {@link redactSecrets} replaces with `***`.
 *
 * @module
 */

/** Bound of each status text field: 1 MiB (upstream PR #1840). */
export const MAX_STATUS_TEXT_BYTES = 1024 * 1024;

/** Prefix of a field cut by {@link truncateTail} (upstream PR #1840). */
export const TRUNCATION_PREFIX = '[output truncated]\n';

/**
 * Keeps the last bytes of `text` so that the result, including {@link TRUNCATION_PREFIX}, is at
 * most `maxBytes` UTF-8 bytes (upstream PR #1840 keeps the tail because kapp's summary and errors
 * come last). The cut never splits a character.
 *
 * @param text - Any text.
 * @param maxBytes - Bound in bytes; defaults to {@link MAX_STATUS_TEXT_BYTES}.
 * @returns `text` when it fits, else `[output truncated]\n<tail>`.
 */
export function truncateTail(text: string, maxBytes: number = MAX_STATUS_TEXT_BYTES): string {
  // Every UTF-16 unit is at most 3 UTF-8 bytes: skip the encode for short strings.
  if (text.length * 3 <= maxBytes) return text;
  const buf = Buffer.from(text, 'utf8');
  if (buf.length <= maxBytes) return text;
  const keep = Math.max(0, maxBytes - Buffer.byteLength(TRUNCATION_PREFIX));
  let start = buf.length - keep;
  while (start < buf.length && ((buf[start] ?? 0) & 0xc0) === 0x80) start++;
  return TRUNCATION_PREFIX + buf.subarray(start).toString('utf8');
}

// ---------------------------------------------------------------------------------------------
// Encoded sizes (JSON)

/**
 * Bytes of one code point inside a JSON string as the API server encodes it: an upper bound of
 * both Go's `encoding/json` (HTML-escaping) and `JSON.stringify`.
 */
export function codePointCost(cp: number): number {
  if (cp === 0x22 || cp === 0x5c || cp === 0x0a || cp === 0x0d || cp === 0x09) return 2;
  if (cp < 0x20 || cp === 0x3c || cp === 0x3e || cp === 0x26) return 6;
  if (cp < 0x80) return 1;
  if (cp < 0x800) return 2;
  if (cp === 0x2028 || cp === 0x2029) return 6;
  // Lone surrogates: JSON.stringify writes `\udXXX`.
  if (cp >= 0xd800 && cp <= 0xdfff) return 6;
  if (cp < 0x10000) return 3;
  return 4;
}

/**
 * Bytes of `text` inside a JSON string as the API server encodes it (without the quotes): an
 * upper bound of both Go's `encoding/json` (HTML-escaping) and `JSON.stringify`.
 *
 * @param text - Any text.
 * @returns Encoded bytes.
 */
export function encodedTextBytes(text: string): number {
  // UTF-8 length natively, plus what escaping adds: 1 byte for `"`, `\`, `\n`, `\r`, `\t`;
  // 5 for the other controls and `<`, `>`, `&` (`\u00XX`); 3 for U+2028/9 and lone surrogates
  // (UTF-8 counts 3, the escape is 6).
  return (
    Buffer.byteLength(text, 'utf8') +
    count(text, TWO_BYTE_ESCAPES) +
    5 * count(text, SIX_BYTE_ESCAPES) +
    3 * count(text, WIDE_ESCAPES)
  );
}

const TWO_BYTE_ESCAPES = /["\\\n\r\t]/g;
// biome-ignore lint/suspicious/noControlCharactersInRegex: counting the control characters JSON escapes
const SIX_BYTE_ESCAPES = /[\u0000-\u0008\u000b\u000c\u000e-\u001f<>&]/g;
const WIDE_ESCAPES = /[\u2028\u2029]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

function count(text: string, re: RegExp): number {
  re.lastIndex = 0;
  let n = 0;
  while (re.exec(text) !== null) n++;
  return n;
}

/**
 * Keeps the tail of `text` so that, encoded ({@link encodedTextBytes}), the result including
 * {@link TRUNCATION_PREFIX} is at most `maxBytes` (upstream PR #1840 keeps the tail: kapp's
 * summary and a tool's error come last). Never splits a character. A text that already carries
 * the marker keeps exactly one.
 *
 * @param text - Any text.
 * @param maxBytes - Encoded bound in bytes.
 * @returns `text` when it fits, `[output truncated]\n<tail>` otherwise, `''` when not even the
 *   marker fits.
 */
export function truncateTailEncoded(text: string, maxBytes: number): string {
  if (text.length <= maxBytes / 6 || encodedTextBytes(text) <= maxBytes) return text;
  return cutTail(text, maxBytes);
}

/** {@link truncateTailEncoded} for a text known not to fit. */
export function cutTail(text: string, maxBytes: number): string {
  const keep = maxBytes - encodedTextBytes(TRUNCATION_PREFIX);
  if (keep < 0) return '';
  let used = 0;
  let start = text.length;
  while (start > 0) {
    let i = start - 1;
    const unit = text.charCodeAt(i);
    if (unit >= 0xdc00 && unit <= 0xdfff && i > 0) {
      const hi = text.charCodeAt(i - 1);
      if (hi >= 0xd800 && hi <= 0xdbff) i--;
    }
    const cost = codePointCost(text.codePointAt(i) ?? 0);
    if (used + cost > keep) break;
    used += cost;
    start = i;
  }
  return TRUNCATION_PREFIX + text.slice(start);
}

// ---------------------------------------------------------------------------------------------

const REDACTED = '***';

/** A private key block, complete or cut off at the end of the text. */
const PEM_PRIVATE_KEY = /-----BEGIN ([A-Z0-9 ]{0,40}PRIVATE KEY)-----(?:[\s\S]*?-----END \1-----|[\s\S]*$)/g;
/** age identities. */
const AGE_SECRET_KEY = /AGE-SECRET-KEY-1[0-9A-Z]+/g;
/** `scheme://userinfo@`: everything up to the last `@` of the authority. */
const URL_USERINFO = /(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{0,31}:\/\/)[^\s/?#@]*(?:@[^\s/?#@]*)*@/g;
/** `Authorization: <scheme> <credentials>` in headers, JSON or YAML. */
const AUTHORIZATION =
  /\b((?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?)(?:(bearer|basic|token|digest|negotiate|aws4-hmac-sha256)[ \t]+)?[^\s"',;]+/gi;
/** A bare bearer token (8+ token characters, so prose like "Bearer token" is left alone). */
const BEARER = /\b(Bearer[ \t]+)[A-Za-z0-9\-._~+/]{8,}=*/g;
/** Docker config `"auth": "<base64 user:pass>"`. */
const DOCKER_AUTH = /("auth"[ \t]*:[ \t]*)"[^"\n]*"/g;
/** Secret-named keys: `token: x`, `password=x`, `"apiKey": "x"`, `accessToken=x`, `client_secret: x`. */
const SECRET_KEY_VALUE =
  /(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]{0,64}?(?:token|password|passwd|secret[_-]?key|api[_-]?key|access[_-]?key|private[_-]?key|client[_-]?secret)["']?[ \t]*[:=][ \t]*)("[^"\n]*"|'[^'\n]*'|[^\s"',;&]+)/gi;
/**
 * Whether a secret-named key matched at `offset` is the last element of a file path in Go's
 * `*PathError` shape, `<op> <path>: <error>` (helm's `open …/etc/passwd: no such file or
 * directory`, a projected `…/serviceaccount/token: permission denied`): the key follows `/` or
 * a backslash and its separator is `:`, so what follows is the error's prose, not a value. `token=x`
 * after a slash (a URL path) is still an assignment.
 */
function isPathErrorPrefix(text: string, offset: number, head: string): boolean {
  const before = text[offset - 1];
  return (before === '/' || before === '\\') && !head.includes('=');
}

/** Secret-named CLI flags with a separate value: `--password x`, `--token x`. */
const SECRET_FLAG = /(?<![A-Za-z0-9_-])(--?[A-Za-z0-9-]{0,64}?(?:token|password|passwd)[ \t]+)(?!-)(\S+)/gi;

/**
 * Replaces credentials in free text with `***`: URL userinfo (`https://user:pass@host` →
 * `https://***@host`), `Authorization` headers (scheme kept), bearer tokens, docker config
 * `auth`, secret-named keys (`token: …`, `password=…`, `"apiKey": "…"`, `client_secret=…`),
 * secret-named CLI flags, PEM private keys and age secret keys.
 *
 * Every pattern is bounded so that megabytes of tool output are scanned in linear time.
 *
 * @param text - Any text headed for status, logs or events.
 * @returns The text with secrets replaced.
 */
export function redactSecrets(text: string): string {
  if (text === '') return text;
  return text
    .replace(PEM_PRIVATE_KEY, (_m, label: string) => `-----BEGIN ${label}-----\n${REDACTED}\n-----END ${label}-----`)
    .replace(AGE_SECRET_KEY, `AGE-SECRET-KEY-${REDACTED}`)
    .replace(URL_USERINFO, `$1${REDACTED}@`)
    .replace(AUTHORIZATION, (_m, head: string, scheme: string | undefined) =>
      scheme ? `${head}${scheme} ${REDACTED}` : `${head}${REDACTED}`,
    )
    .replace(BEARER, `$1${REDACTED}`)
    .replace(DOCKER_AUTH, `$1"${REDACTED}"`)
    .replace(SECRET_KEY_VALUE, (match: string, head: string, value: string, offset: number, whole: string) => {
      const q = value[0];
      if (q === '"' || q === "'") return `${head}${q}${REDACTED}${q}`;
      return isPathErrorPrefix(whole, offset, head) ? match : `${head}${REDACTED}`;
    })
    .replace(SECRET_FLAG, `$1${REDACTED}`);
}

/**
 * Prepares text for a bounded status field: {@link redactSecrets}, then {@link truncateTail}
 * (redaction first, so a cut never leaves half a secret unrecognized).
 *
 * @param text - Any text.
 * @param maxBytes - Bound in bytes; defaults to {@link MAX_STATUS_TEXT_BYTES}.
 */
export function boundedStatusText(text: string, maxBytes: number = MAX_STATUS_TEXT_BYTES): string {
  return truncateTail(redactSecrets(text), maxBytes);
}
