/**
 * Whether a rendered manifest may hold a Secret object, read the way kapp reads it: kapp
 * (`pkg/kapp/resources/yaml_doc.go`) cuts the file into documents at every line that starts with
 * `---` and decodes each with sigs.k8s.io/yaml (go-yaml v2, a YAML 1.1 reader), so any spelling
 * the YAML specs allow counts: flow style (`{kind: Secret}`), `kind : Secret`, a tag
 * (`!!str Secret`, `!!binary U2VjcmV0`), quoted or escaped keys and values (`"k\x69nd"`), an
 * alias (`kind: *s`), a value on the next line or in a block scalar, a `List` whose items hold a
 * Secret, JSON, a `%YAML` directive, tabs, byte-order marks, and the line breaks of YAML 1.1 that
 * YAML 1.2 reads as text (NEL, U+2028, U+2029, a bare CR). The regular expressions this replaced
 * missed most of these, so such renders were stored unsealed and shared by the fleet.
 *
 * Reading a few MB with the `yaml` library takes seconds, so each kapp document is first scanned
 * for a scalar that could resolve to `Secret` ({@link mayResolveToSecret}); only those documents
 * are parsed, and one that does not parse counts as holding a Secret. Every choice leans one way:
 * a manifest wrongly taken for secret is only sealed for its cluster (a cache shared less), never
 * the reverse.
 *
 * @module
 */
import { type Document, isAlias, isScalar, parseAllDocuments, parseDocument, visit } from 'yaml';

/** Characters that continue a plain scalar (or quoted text) on either side of `Secret`. */
const GLUED = /[A-Za-z0-9_./-]/;
const ALNUM = /[A-Za-z0-9]/;
/** What ends a word for go-yaml: a space, a tab or a line break (YAML 1.1's included). */
const LINE_OR_SPACE = /[ \t\n\r\u0085\u2028\u2029]/;
/** Line breaks of YAML 1.1 (go-yaml) that the `yaml` library (YAML 1.2) reads as text. */
const YAML11_BREAKS = /\r\n?|[\u0085\u2028\u2029]/g;
const HAS_YAML11_BREAK = /[\r\u0085\u2028\u2029]/;

/** A pattern for `text`, each character literal or as a YAML hex escape, joined by `sep`. */
function spelled(text: string, sep: string): RegExp {
  const chars = [...text].map((c) => {
    const hex = c
      .charCodeAt(0)
      .toString(16)
      .padStart(2, '0')
      .replace(/[a-f]/g, (h) => `[${h}${h.toUpperCase()}]`);
    return `(?:${c}|\\\\(?:x${hex}|u00${hex}|U000000${hex}))`;
  });
  return new RegExp(chars.join(`(?:${sep})*`), 'g');
}

/** `Secret` in a double-quoted scalar with escapes or escaped line breaks (`"\x53ecret"`, `"Sec\⏎ret"`). */
const ESCAPED_SECRET = spelled('Secret', '\\\\(?:\\r\\n|[\\r\\n\\u0085\\u2028\\u2029])[ \\t]*');

/**
 * The base64 of `Secret` (`U2VjcmV0`, the only encoding of those six bytes) as a `!!binary`
 * value may spell it: any whitespace (go-yaml folds lines, Go's decoder skips CR and LF) or
 * escape between the characters, each literal or escaped.
 */
const BINARY_SECRET = spelled(
  'U2VjcmV0',
  '\\s|\\u0085|\\\\(?:x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|\\r\\n|[^xuU])',
);

/**
 * Whether the literal `Secret` at `i` could be a whole scalar. It cannot when a character that
 * goes on a plain scalar or quoted text touches it (`SecretStore`, `v1/Secret`), when a word
 * follows on its line (`Secret containing`: a plain scalar runs over spaces, quoted text and
 * block lines too), when a word precedes it on its line that is not a tag, anchor or alias
 * (`a Secret`: two scalars are never side by side), or when it is a block sequence entry
 * (`  - Secret`: a sequence item is never a mapping's value).
 */
function literalCouldBeScalar(text: string, i: number): boolean {
  const end = i + 'Secret'.length;
  const before = text[i - 1] ?? '';
  if (GLUED.test(before) || GLUED.test(text[end] ?? '')) return false;
  if (before === "'" || before === '"') return quotedCouldBeScalar(text, i - 1, end);
  let j = end;
  while (text[j] === ' ' || text[j] === '\t') j++;
  if (j > end && ALNUM.test(text[j] ?? '')) return false;
  let k = i - 1;
  while (k >= 0 && (text[k] === ' ' || text[k] === '\t')) k--;
  if (k === i - 1 || k < 0) return true;
  const c = text[k]!;
  if (ALNUM.test(c)) {
    for (let w = k; w >= 0 && !LINE_OR_SPACE.test(text[w]!); w--) if ('!&*'.includes(text[w]!)) return true;
    return false;
  }
  if (c === '-') {
    let s = k - 1;
    while (s >= 0 && (text[s] === ' ' || text[s] === '\t')) s--;
    return !(s < 0 || text[s] === '\n');
  }
  return true;
}

/**
 * Whether the quote at `open` before a literal `Secret` (ending at `end`) could open a scalar that
 * is exactly `Secret`: the same quote closes it at once (or, double-quoted, an escape follows),
 * and the quote starts a token (after a space, a line break, a flow indicator, `:` or a
 * byte-order mark; after anything else it is text inside a plain scalar, as in `('Secret', …)`).
 */
function quotedCouldBeScalar(text: string, open: number, end: number): boolean {
  const q = text[open]!;
  const next = text[end];
  if (next !== q && !(q === '"' && next === '\\')) return false;
  return open === 0 || /[ \t\n\r\u0085\u2028\u2029[{,:?\uFEFF]/.test(text[open - 1]!);
}

/**
 * Whether some scalar of one kapp document could resolve to `Secret`: a literal `Secret` that
 * could be a whole scalar, `Secret` spelled with escapes, or its base64 under a tag. A document
 * with none holds no Secret whatever a YAML reader makes of it, so it need not be parsed: the
 * only ways YAML turns text into a string are folding (which puts a space or a line break
 * between lines), `''` in single quotes, escapes in double quotes and `!!binary`.
 */
function mayResolveToSecret(doc: string): boolean {
  for (let i = doc.indexOf('Secret'); i >= 0; i = doc.indexOf('Secret', i + 1)) {
    if (literalCouldBeScalar(doc, i)) return true;
  }
  if (doc.includes('\\')) {
    for (const m of doc.matchAll(ESCAPED_SECRET)) if (m[0].includes('\\')) return true;
  }
  if (doc.includes('!')) {
    BINARY_SECRET.lastIndex = 0;
    if (BINARY_SECRET.test(doc)) return true;
  }
  return false;
}

/** Nesting bound of the `?` re-reads below (go-yaml refuses `??`; this only bounds the work). */
const MAX_REREAD_DEPTH = 3;

/**
 * The strings a scalar (or an alias of one) may stand for: its text, its value, for a tagged one
 * its base64 decoding, and for a plain one that starts with `?` what follows (go-yaml reads `?`
 * as the key indicator in flow context even without a space: `{?kind: Secret}` has the key
 * `kind` where this parser reads `?kind`; an alias there counts as both `kind` and `Secret`).
 */
function scalarTexts(doc: Document, node: unknown, depth: number): string[] {
  const target = isAlias(node) ? node.resolve(doc) : node;
  if (!isScalar(target)) return [];
  const out: string[] = [];
  const source = typeof target.source === 'string' ? target.source : undefined;
  if (source !== undefined) out.push(source);
  const v = target.value;
  if (typeof v === 'string') out.push(v);
  else if (v instanceof Uint8Array) out.push(Buffer.from(v).toString('utf8'));
  // Any tag, not only `!!binary` as this parser spells it: go-yaml also reads
  // `!<tag:yaml.org,2002:%62inary>` (a %-escaped tag) as binary.
  if (target.tag && source !== undefined) out.push(Buffer.from(source, 'base64').toString('utf8'));
  const rest = questionRest(target.type, source);
  if (rest !== undefined && depth < MAX_REREAD_DEPTH) {
    if (rest.startsWith('*')) out.push('kind', 'Secret');
    else {
      const inner = parseDocument(rest, { uniqueKeys: false });
      out.push(...scalarTexts(inner, inner.contents, depth + 1));
    }
  }
  return out;
}

/** What follows the leading `?` of a plain scalar, or `undefined`. */
function questionRest(type: string | undefined, source: string | undefined): string | undefined {
  return type === 'PLAIN' && source?.startsWith('?') ? source.slice(1).trim() : undefined;
}

/**
 * Whether one kapp document, parsed as YAML (every document of it, every mapping at any depth,
 * duplicate keys included), has a `kind` key whose scalar is `Secret`; a document that does not
 * parse counts as one that has. A plain scalar `?…` is also read again as the flow mapping go-yaml
 * makes of it (`{?"kind":"Secret"}` is one scalar here, a Secret there).
 */
function documentHasSecret(text: string, depth = 0): boolean {
  // go-yaml skips a byte-order mark at the start of a line and keeps one elsewhere as text;
  // dropping them all can only join what go-yaml keeps apart (over-matching).
  const yaml = (HAS_YAML11_BREAK.test(text) ? text.replace(YAML11_BREAKS, '\n') : text).replace(/\uFEFF/g, '');
  let docs: Document[];
  try {
    docs = parseAllDocuments(yaml, { uniqueKeys: false }) as Document[];
  } catch {
    return true;
  }
  for (const doc of docs) {
    if (doc.errors.length > 0) return true;
    let found = false;
    visit(doc, {
      Pair(_, pair) {
        if (
          scalarTexts(doc, pair.key, depth).includes('kind') &&
          scalarTexts(doc, pair.value, depth).includes('Secret')
        ) {
          found = true;
          return visit.BREAK;
        }
        return undefined;
      },
      Scalar(_, node) {
        const rest = questionRest(node.type, node.source);
        if (rest?.includes(':') && depth < MAX_REREAD_DEPTH && documentHasSecret(`{${rest}}`, depth + 1)) {
          found = true;
          return visit.BREAK;
        }
        return undefined;
      },
    });
    if (found) return true;
  }
  return false;
}

/** The manifest cut as kapp cuts it: before every line that starts with `---` (kept with the next). */
function kappDocuments(manifest: string): string[] {
  const out: string[] = [];
  let start = 0;
  for (let i = manifest.indexOf('\n---'); i >= 0; i = manifest.indexOf('\n---', i + 1)) {
    out.push(manifest.slice(start, i + 1));
    start = i + 1;
  }
  out.push(manifest.slice(start));
  return out;
}

/**
 * True when a rendered manifest may contain a Secret object (its values must not be shared):
 * some kapp document of it has, at any depth, a `kind` key whose scalar resolves to `Secret`
 * (a Secret inside a `List`, and over-matching such as a `valuesFrom` entry of kind Secret,
 * included), or does not parse as YAML. A string value that merely mentions `kind: Secret` (a
 * ConfigMap's data) is not a key: kapp deploys it as text. Linear in the manifest's size; only
 * documents where `Secret` could be a scalar are parsed.
 */
export function manifestHasSecret(manifest: string): boolean {
  return kappDocuments(manifest).some((doc) => mayResolveToSecret(doc) && documentHasSecret(doc));
}
