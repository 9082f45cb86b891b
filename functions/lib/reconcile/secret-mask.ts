/**
 * Masking of the exact values of the Secrets a stage read for an App, in every text written
 * for that App (status, hand-off summaries, cache records, log lines).
 *
 * Why: {@link redactSecrets} only recognizes credentials by their shape (`password: …`, URL
 * userinfo, PEM keys). A Secret value a tool echoes in any other shape (a ytt `fail()` message
 * built from a data value that came from `valuesFrom.secretRef`, a git error quoting a token,
 * kapp printing a rendered Secret's field) would reach status, which every reader of the App
 * (`kubectl get app -o yaml`) sees, including those who may not read the Secret. This mask
 * knows the values themselves, so it catches them whatever surrounds them.
 *
 * Not upstream: kapp-controller copies tool output into status as is.
 *
 * What is masked, for each Secret data value (each key of each Secret read):
 * - the value as UTF-8 text (when it is valid UTF-8); when it is not, its lossy UTF-8 text
 *   (U+FFFD for each invalid sequence) and each valid run between invalid sequences;
 * - its standard base64 form (padded and unpadded; a tool printing the Secret object shows it
 *   so), and its JSON-escaped form when that differs (a value with quotes or newlines inside a
 *   JSON document);
 * - each line of a multi-line value, trimmed of surrounding blanks (a PEM key, an age key file
 *   or a kubeconfig printed line by line, or indented inside YAML);
 * - when the value is a YAML or JSON document (a ytt/helm/cue values file from
 *   `valuesFrom.secretRef`), each string or number leaf of it (with its base64 and
 *   JSON-escaped forms), and in `KEY=value`
 *   lines (an env file) each value: a ytt `fail()` that prints `data.values.password` shows the
 *   leaf, not the file.
 *
 * Short values: a value (or line, or leaf) shorter than {@link MIN_MASKED_CHARS} (4)
 * characters is not masked, nor are its base64 forms.
 * Masking `1`, `no` or `443` everywhere would make every status unreadable, and would not
 * protect the value anyway: replacing every `a` with `***` tells the reader that the value is
 * `a`. A 1-3 character value has too little entropy to be a credential; such Secrets still get
 * the shape-based {@link redactSecrets}. The same bound applies to each line of a multi-line
 * value.
 *
 * Replacement is longest needle first, so a value is masked whole before any of its lines.
 * Cost: one `split`/`join` per needle over the text (linear per needle); the number of needles
 * is bounded by {@link MAX_MASK_NEEDLES}.
 *
 * @module
 */
import { parseAllDocuments } from 'yaml';
import { scratchPathRewriter } from '../exec/scratch.js';
import { redactSecrets, TRUNCATION_PREFIX } from './redact.js';

/** What a masked value is replaced with (the same marker as {@link redactSecrets}). */
export const MASKED = '***';

/** Needles shorter than this many characters are not masked (see the module comment). */
export const MIN_MASKED_CHARS = 4;

/**
 * At most this many needles are kept per mask (a Secret with thousands of lines still yields a
 * bounded amount of work per text). Whole values and their base64 forms are added before lines,
 * so they are never the ones dropped.
 */
export const MAX_MASK_NEEDLES = 4096;

/** Lines of one value considered (beyond this, only the whole value and its base64 are masked). */
export const MAX_LINES_PER_VALUE = 1024;

/** Values larger than this are not parsed as YAML/JSON for their leaves (bytes). */
export const MAX_PARSED_VALUE_BYTES = 256 * 1024;

/** Leaves of one YAML/JSON value considered. */
export const MAX_LEAVES_PER_VALUE = 1024;

/** The string and number leaves of a YAML/JSON document, depth first, at most `max`. */
function leaves(value: unknown, out: string[], max: number, depth = 0): void {
  if (out.length >= max || depth > 64) return;
  if (typeof value === 'string') out.push(value);
  else if (typeof value === 'number' && Number.isFinite(value)) out.push(String(value));
  else if (Array.isArray(value)) for (const v of value) leaves(v, out, max, depth + 1);
  else if (value !== null && typeof value === 'object') {
    for (const v of Object.values(value)) leaves(v, out, max, depth + 1);
  }
}

/**
 * Values up to this size (UTF-16 code units) keep their leaves in {@link parsedLeaves}: 8 Ki, so
 * the memo holds at most a few MiB. A token or password is far below; a large kubeconfig or
 * values file is parsed each time, as before.
 */
const MEMO_VALUE_CHARS = 8 * 1024;
/** Most values whose leaves are kept: 256 (the oldest kept goes first). */
const MEMO_VALUES = 256;
/**
 * Leaves by value, for the values every run masks again: an App's ServiceAccount token is added
 * to each stage's mask on every no-op resync, and a JWT (its `-`) was parsed as YAML each time.
 * Holds secret values: memory only, never logged; the leaves are the same for the same text.
 */
const parsedLeaves = new Map<string, readonly string[]>();

/** Leaves of `text` read as YAML (JSON is YAML) documents; `[]` when it is not YAML. */
function structuredLeaves(text: string): readonly string[] {
  if (Buffer.byteLength(text) > MAX_PARSED_VALUE_BYTES || !/[:=[{-]/.test(text)) return [];
  if (text.length > MEMO_VALUE_CHARS) return parseLeaves(text);
  const kept = parsedLeaves.get(text);
  if (kept) return kept;
  const out = parseLeaves(text);
  parsedLeaves.set(text, out);
  while (parsedLeaves.size > MEMO_VALUES) parsedLeaves.delete(parsedLeaves.keys().next().value as string);
  return out;
}

function parseLeaves(text: string): string[] {
  const out: string[] = [];
  try {
    for (const doc of parseAllDocuments(text)) {
      if ('errors' in doc && doc.errors.length === 0)
        leaves(doc.toJS({ maxAliasCount: 16 }), out, MAX_LEAVES_PER_VALUE);
    }
  } catch {
    // Not YAML: lines and env pairs still apply.
  }
  return out;
}

function isValidUtf8(buf: Buffer): boolean {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(buf);
    return true;
  } catch {
    return false;
  }
}

/**
 * The set of Secret values of one App's stage run, and the function that masks them.
 * Instances are mutable (values are added as Secrets are read) and belong to one run of one
 * App; never share one between Apps.
 */
export class SecretMask {
  private readonly whole = new Set<string>();
  private readonly lines = new Set<string>();
  private sorted: string[] | undefined;
  private scratch: ((text: string) => string) | undefined;

  /** Number of distinct needles (texts that are masked). */
  get size(): number {
    return this.needles().length;
  }

  /**
   * Also shows the runtime's scratch and run directories under `tmpRoot` as their stable
   * stand-ins (`../exec/scratch.ts` `scratchPathRewriter`) in every text this mask passes: a
   * tool's error names the file it read (`open /tmp/kapp-lambda-Ab12Cd/template-Xy34Zw/…`), a
   * path that changes every run. Not a secret, but it leaves by the same doors (status, Events,
   * logs, cache records), so the mask that guards them rewrites it too.
   *
   * @param tmpRoot - `PipelineConfig.tmpRoot` (also the runner's `tmpDir`).
   */
  addScratchRoot(tmpRoot: string): void {
    this.scratch = scratchPathRewriter(tmpRoot);
  }

  /**
   * Adds one Secret data value (and its derived forms, see the module comment).
   *
   * @param value - The decoded value (a Buffer from the API client, or text).
   * @param opts - `structured: false` skips the YAML/JSON leaves and env pairs (for a value
   *   whose leaves are common words, e.g. a kubeconfig's `kind: Config`, which would otherwise
   *   turn every `ConfigMap` in kapp's output into `***Map`). Default true.
   */
  addValue(value: Buffer | string, opts: { structured?: boolean } = {}): void {
    const structured = opts.structured ?? true;
    const buf = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
    if (buf.length < MIN_MASKED_CHARS) return;
    const b64 = buf.toString('base64');
    this.addNeedle(this.whole, b64);
    this.addNeedle(this.whole, b64.replace(/=+$/, ''));
    if (!isValidUtf8(buf)) {
      this.addLossyForms(buf);
      return;
    }
    const text = buf.toString('utf8');
    this.addNeedle(this.whole, text);
    this.addNeedle(this.whole, JSON.stringify(text).slice(1, -1));
    // A leaf gets the forms of a value of its own (text, base64, JSON-escaped), not its leaves.
    if (structured) for (const leaf of structuredLeaves(text)) this.addValue(leaf.trim(), { structured: false });
    if (!/[\r\n]/.test(text)) return;
    this.addNeedle(this.whole, text.trim());
    let n = 0;
    for (const line of text.split(/\r?\n|\r/)) {
      if (n++ >= MAX_LINES_PER_VALUE) break;
      this.addNeedle(this.lines, line.trim());
      const env = structured ? /^(?:export\s+)?[A-Za-z_][A-Za-z0-9_.-]*=(.*)$/.exec(line.trim()) : null;
      if (env?.[1] !== undefined) this.addNeedle(this.lines, env[1].trim().replace(/^(["'])(.*)\1$/, '$2'));
    }
  }

  /**
   * A value that is not valid UTF-8, as a tool printing it shows it once decoded: the lossy
   * UTF-8 text (each invalid sequence as U+FFFD, as this runner decodes tool output), and each
   * run of valid text between invalid sequences (another decoder replaces or drops them
   * differently). Runs shorter than {@link MIN_MASKED_CHARS} are skipped by `addNeedle`.
   */
  private addLossyForms(buf: Buffer): void {
    const lossy = buf.toString('utf8');
    this.addNeedle(this.whole, lossy);
    let n = 0;
    for (const run of lossy.split('\uFFFD')) {
      if (n++ >= MAX_LINES_PER_VALUE) break;
      this.addNeedle(this.lines, run);
    }
  }

  /**
   * Adds every data value of a Secret.
   *
   * @param data - key → decoded value (the kube port's `SecretData.data`), or key → base64
   *   (`SecretLike.data`, with `base64: true`).
   * @param opts - `base64`: the values are base64-encoded (decoded before adding);
   *   `structured`: see {@link SecretMask.addValue}.
   */
  addSecretData(
    data: Readonly<Record<string, Buffer | string>>,
    opts: { base64?: boolean; structured?: boolean } = {},
  ): void {
    for (const v of Object.values(data)) {
      const value = typeof v === 'string' && opts.base64 ? Buffer.from(v, 'base64') : v;
      this.addValue(value, { structured: opts.structured ?? true });
    }
  }

  /**
   * Replaces every occurrence of a masked value in `text` with {@link MASKED}. When the text
   * starts with the truncation marker ({@link TRUNCATION_PREFIX}: its head was cut), a cut
   * value's tail at the start of what was kept is masked too. Scratch paths are rewritten first
   * ({@link SecretMask.addScratchRoot}).
   *
   * @param text - Any text.
   * @returns The masked text (the same string when nothing matched).
   */
  text(text: string): string {
    const needles = this.needles();
    if (text === '') return text;
    let out = this.scratch ? this.scratch(text) : text;
    if (needles.length === 0) return out;
    for (const n of needles) if (out.includes(n)) out = out.split(n).join(MASKED);
    if (out.startsWith(TRUNCATION_PREFIX))
      out = TRUNCATION_PREFIX + this.maskCutHead(out.slice(TRUNCATION_PREFIX.length));
    return out;
  }

  /**
   * {@link redactSecrets} (credential shapes) after {@link SecretMask.text} (exact values).
   *
   * @param text - Any text headed for status, an event, the object store or a log line.
   */
  redact(text: string): string {
    return redactSecrets(this.text(text));
  }

  /**
   * A stage result with its texts masked (`stdout`, `stderr`, `error`); mask a result as soon
   * as the tool returns, before anything cuts or copies its output.
   *
   * @param result - A `StageResult` (or any object with those fields).
   */
  result<R extends { stdout: string; stderr: string; error?: string }>(result: R): R {
    if (this.idle()) return result;
    const out = { ...result, stdout: this.text(result.stdout), stderr: this.text(result.stderr) };
    if (result.error !== undefined) out.error = this.text(result.error);
    return out;
  }

  /**
   * Masks every string in a JSON value (a status, a status part, a stage result), returning a
   * copy; other values are kept.
   *
   * @param value - Any JSON value.
   */
  deep<T>(value: T): T {
    if (this.idle()) return value;
    return this.walk(value) as T;
  }

  private walk(value: unknown): unknown {
    if (typeof value === 'string') return this.text(value);
    if (Array.isArray(value)) return value.map((v) => this.walk(v));
    if (value !== null && typeof value === 'object') {
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(value)) out[k] = this.walk(v);
      return out;
    }
    return value;
  }

  /**
   * A kept tail that begins inside a value: masks the longest proper suffix (at least
   * {@link MIN_MASKED_CHARS} long) of a value that the tail starts with. Linear in the needle
   * lengths: candidate suffixes are found by searching the needle for the tail's first characters.
   */
  private maskCutHead(tail: string): string {
    if (tail.length < MIN_MASKED_CHARS) return tail;
    const head = tail.slice(0, MIN_MASKED_CHARS);
    for (const n of this.needles()) {
      for (let i = n.indexOf(head, 1); i > 0 && n.length - i >= MIN_MASKED_CHARS; i = n.indexOf(head, i + 1)) {
        if (tail.startsWith(n.slice(i))) return MASKED + tail.slice(n.length - i);
      }
    }
    return tail;
  }

  /** True when no text can change (no needle, no scratch root). */
  private idle(): boolean {
    return this.needles().length === 0 && !this.scratch;
  }

  private addNeedle(set: Set<string>, needle: string): void {
    if (needle.length < MIN_MASKED_CHARS || needle === MASKED) return;
    if (this.whole.size + this.lines.size >= MAX_MASK_NEEDLES) return;
    set.add(needle);
    this.sorted = undefined;
  }

  private needles(): string[] {
    if (!this.sorted) {
      this.sorted = [...new Set([...this.whole, ...this.lines])].sort((a, b) => b.length - a.length);
    }
    return this.sorted;
  }
}
