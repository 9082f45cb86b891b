/**
 * The source poll's resolution of a `helmChart` fetch source: which chart version helm would
 * fetch now, and which bytes that version names.
 *
 * - **An HTTP chart repository** (`repository.url` `http(s)://`): one GET of `<url>/index.yaml`
 *   (the fetch stage's downloader, `./http-download.ts`: the URL policy on every hop and
 *   connection, bounded by {@link MAX_HELM_INDEX_BYTES}), parsed with `yaml` (the chart's section
 *   alone when the index is laid out as helm writes it, the whole only up to
 *   {@link MAX_HELM_INDEX_PARSE_BYTES}: the parse is synchronous), and the entry of
 *   the chart picked as helm v3's `IndexFile.Get` (`pkg/repo/index.go`) does: the given
 *   `version` exactly (helm matches the string first, then the version as a constraint: the
 *   poll follows only full versions, see `sourceTracked`, so the constraint is equality), else
 *   the latest stable version (helm's constraint `*`, which skips prereleases; entries whose
 *   version does not parse are skipped too).
 * - **An OCI registry** (`oci://`): one registry `HEAD` of `<repo>/<name>:<version>`
 *   (`./registry-digest.ts`), only when a version is given. Without one helm lists the
 *   repository's tags and picks the highest, a tag list the poll has no client for (and a
 *   listing per period per chart, not one `HEAD`): such a chart is not polled and keeps
 *   upstream's sync period.
 *
 * The resolved value is `<version>@sha256:<hex>`: the index entry's `digest` (the chart
 * archive's sha256) or the manifest digest. An index entry without a digest gives
 * `<version>@index:<sha256 of its urls and created>`, which changes when the chart is
 * republished under the same version. The pinned fetch asks helm for `<version>` exactly and the
 * fleet fetch cache keys it by the whole value (`./pinned.ts`), so Apps on one chart version
 * and digest share one fetch and a republished version is fetched anew. helm does not check
 * the digest itself: a chart republished between the poll and the fetch is stored under the
 * older value's key until the next poll resolves the new one (one period).
 *
 * @module
 */
import { parse as parseYaml } from 'yaml';
import { canonicalJson, sha256Hex } from '../artifact/keys.js';
import { createHttpDownloader, type HttpDownloader } from './http-download.js';
import { type ResolveImageOptions, resolveImageDigest } from './registry-digest.js';

/** Largest `index.yaml` read, bytes: 64 MiB (the largest public chart repositories' are tens of MB). */
export const MAX_HELM_INDEX_BYTES = 64 * 1024 * 1024;

/**
 * Largest YAML text parsed at once, bytes: 8 MiB. The `yaml` library parses synchronously (the
 * resolution's deadline cannot stop it) and holds some 50 bytes of nodes per byte of text: a
 * 64 MiB index took some 30 s of CPU and 3 GB, past the fetch function's memory, in the process
 * every tenant's poll shares. A larger index is read through its chart's section alone
 * ({@link chartSection}), as helm writes it; one written otherwise is refused (the App then
 * fetches its chart as written, as before the poll).
 */
export const MAX_HELM_INDEX_PARSE_BYTES = 8 * 1024 * 1024;

/**
 * `yaml`'s options for an index: no check of duplicate keys, which compares every key of a map
 * with every other (quadratic: an index of 20,000 one-line charts, 250 kB, took 3.5 s; 1 MB a
 * minute). A duplicate key keeps its last value.
 */
const INDEX_YAML_OPTIONS = { uniqueKeys: false } as const;

/** The index has no usable entry for the chart; `message` says which (no URLs with credentials in it). */
export class HelmIndexError extends Error {
  override readonly name = 'HelmIndexError';
}

/** The chart a `helmChart` entry names. */
export interface HelmChartRef {
  /** `repository.url`: `http(s)://…` or `oci://…`. */
  repository: string;
  /** `name`. */
  name: string;
  /** `version`; absent or empty: the latest stable. */
  version?: string;
}

/** Options of {@link resolveHelmChart}: the URL policy's guards and the deadline, as a registry resolution's. */
export interface ResolveHelmOptions
  extends Pick<ResolveImageOptions, 'checkUrl' | 'lookupFor' | 'signal' | 'fetchImpl'> {
  /** The download port of the index. Default {@link createHttpDownloader}. */
  downloader?: HttpDownloader;
}

/** One chart version of an index (the fields the resolution reads). */
interface IndexEntry {
  version: string;
  digest?: unknown;
  urls?: unknown;
  created?: unknown;
}

/** Masterminds semver's loose version (what helm parses index versions with). */
const LOOSE_VERSION =
  /^v?([0-9]+)(?:\.([0-9]+))?(?:\.([0-9]+))?(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$/;

interface Parsed {
  nums: [bigint, bigint, bigint];
  pre: string;
}

function parseLoose(v: string): Parsed | undefined {
  const m = LOOSE_VERSION.exec(v);
  if (!m) return undefined;
  return { nums: [BigInt(m[1] ?? 0), BigInt(m[2] ?? 0), BigInt(m[3] ?? 0)], pre: m[4] ?? '' };
}

function cmpNums(a: Parsed, b: Parsed): number {
  for (let i = 0; i < 3; i++) {
    const x = a.nums[i] as bigint;
    const y = b.nums[i] as bigint;
    if (x !== y) return x > y ? 1 : -1;
  }
  return 0;
}

/** `<repo>/index.yaml`, as helm joins it (path joined, query kept). */
export function helmIndexUrl(repository: string): string {
  const u = new URL(repository);
  u.pathname = `${u.pathname.replace(/\/+$/, '')}/index.yaml`;
  return u.href;
}

/**
 * The entry helm v3 would fetch for `name` (and `version`) from an `index.yaml` (see the module
 * comment for the rule).
 * @throws HelmIndexError when the index does not parse, has no such chart, or no version matches
 */
export function pickChartVersion(indexYaml: string, name: string, version?: string): IndexEntry {
  const list = chartList(indexYaml, name);
  const vs = (Array.isArray(list) ? list : []).filter(
    (e): e is IndexEntry => e !== null && typeof e === 'object' && typeof (e as IndexEntry).version === 'string',
  );
  if (vs.length === 0) throw new HelmIndexError(`index.yaml has no chart ${JSON.stringify(name)}`);
  if (version) {
    const exact = vs.find((e) => e.version === version);
    if (exact) return exact;
    // helm's constraint `=<version>`: same numbers and prerelease, build metadata ignored.
    const want = parseLoose(version);
    const eq = want
      ? vs.find((e) => {
          const p = parseLoose(e.version);
          return p !== undefined && cmpNums(p, want) === 0 && p.pre === want.pre;
        })
      : undefined;
    if (eq) return eq;
    throw new HelmIndexError(`no chart version found for ${name}-${version}`);
  }
  let best: { e: IndexEntry; p: Parsed } | undefined;
  for (const e of vs) {
    const p = parseLoose(e.version);
    if (p?.pre !== '') continue;
    if (!best || cmpNums(p, best.p) > 0) best = { e, p };
  }
  if (!best) throw new HelmIndexError(`no chart version found for ${name}-`);
  return best.e;
}

/** `entries[name]` of an index: of its chart's section when that parses to a list, else of the whole (bounded). */
function chartList(indexYaml: string, name: string): unknown {
  const section = chartSection(indexYaml, name);
  if (section !== undefined && section.length <= MAX_HELM_INDEX_PARSE_BYTES) {
    try {
      const list = entriesOf(parseYaml(section, INDEX_YAML_OPTIONS))?.[name];
      if (Array.isArray(list)) return list;
    } catch {
      // Not helm's layout after all (an alias to an anchor outside it): the whole index decides.
    }
  }
  if (Buffer.byteLength(indexYaml, 'utf8') > MAX_HELM_INDEX_PARSE_BYTES) {
    throw new HelmIndexError(
      `index.yaml is larger than ${MAX_HELM_INDEX_PARSE_BYTES} bytes and has no section for chart ${JSON.stringify(name)} in helm's layout`,
    );
  }
  let doc: unknown;
  try {
    doc = parseYaml(indexYaml, INDEX_YAML_OPTIONS);
  } catch (err) {
    throw new HelmIndexError(`index.yaml does not parse: ${(err as Error).message.split('\n')[0]}`);
  }
  return entriesOf(doc)?.[name];
}

function entriesOf(doc: unknown): Record<string, unknown> | undefined {
  const entries = (doc as { entries?: unknown } | null)?.entries;
  return entries !== null && typeof entries === 'object' ? (entries as Record<string, unknown>) : undefined;
}

/**
 * The section of chart `name` in an index laid out as helm writes it (`entries:` at the line's
 * start, each chart's key on its own line indented two spaces, plain or quoted, its versions
 * below it indented further or as `  - ` items), as a document of its own
 * (`entries:\n  <name>:\n  - …`), or `undefined` when the index is not so laid out. Found by
 * string search, not parsed: a 64 MiB index costs a scan, and the parse only the chart's part.
 */
export function chartSection(indexYaml: string, name: string): string | undefined {
  if (name === '' || /[\r\n"'\\]/.test(name)) return undefined;
  const entries = /^entries:[ \t]*\r?$/m.exec(indexYaml);
  if (!entries) return undefined;
  const bodyAt = entries.index + entries[0].length;
  // Where the top-level map's next key starts (a line at column 0 that is no comment).
  const after = /^[^\s#]/m.exec(indexYaml.slice(bodyAt));
  const entriesEnd = after ? bodyAt + after.index : indexYaml.length;
  let keyAt = -1;
  for (const q of ['', '"', "'"]) {
    for (let at = indexYaml.indexOf(`\n  ${q}${name}${q}:`, bodyAt); at >= 0 && at < entriesEnd; ) {
      const lineEnd = indexYaml.indexOf('\n', at + 1);
      const rest = indexYaml.slice(at + 4 + 2 * q.length + name.length, lineEnd < 0 ? undefined : lineEnd);
      if (/^[ \t\r]*$/.test(rest)) {
        keyAt = at + 1;
        break;
      }
      at = indexYaml.indexOf(`\n  ${q}${name}${q}:`, at + 1);
    }
    if (keyAt >= 0) break;
  }
  if (keyAt < 0 || keyAt >= entriesEnd) return undefined;
  const firstLine = indexYaml.indexOf('\n', keyAt);
  if (firstLine < 0) return undefined;
  // The section ends at the next line indented less than its items: another chart's key, or the end of `entries`.
  const next = /^(?: {0,2}[^\s#-]| {0,2}-[^ \t\r\n])/m.exec(indexYaml.slice(firstLine + 1, entriesEnd));
  const end = next ? firstLine + 1 + next.index : entriesEnd;
  return `entries:\n${indexYaml.slice(keyAt, end)}`;
}

/** `<version>@sha256:<digest>`, or `<version>@index:<hash of urls and created>` without a digest. */
export function chartEntryResolved(entry: IndexEntry): string {
  const digest = typeof entry.digest === 'string' ? entry.digest.replace(/^sha256:/, '').toLowerCase() : '';
  if (/^[0-9a-f]{64}$/.test(digest)) return `${entry.version}@sha256:${digest}`;
  return `${entry.version}@index:${sha256Hex(canonicalJson({ urls: entry.urls ?? null, created: entry.created ?? null }))}`;
}

/** The chart version of a resolved value (`<version>@…`): what the pinned fetch asks helm for. */
export function chartVersionOf(resolved: string): string {
  const at = resolved.lastIndexOf('@');
  return at < 0 ? resolved : resolved.slice(0, at);
}

/**
 * The image repository of an `oci://` chart repository, its host always the registry as helm
 * reads it: a host without `.` or `:` (`oci://registry/charts`) gets its default port, since an
 * image reference's first part names a registry only with one of them (or as `localhost`) and
 * would otherwise be a Docker Hub repository, a registry the App never named.
 */
export function ociRepositoryRef(repository: string): string {
  const path = repository.replace(/^oci:\/\//i, '').replace(/\/+$/, '');
  const slash = path.indexOf('/');
  const host = slash < 0 ? path : path.slice(0, slash);
  if (host.includes('.') || host.includes(':') || host === 'localhost') return path;
  return `${host}:443${slash < 0 ? '' : path.slice(slash)}`;
}

/**
 * What `chart` resolves to now (see the module comment).
 * @throws HelmIndexError; HttpDownloadError (index download); RegistryResolveError (OCI, or an
 *   OCI chart without a version); UrlPolicyError from the guards; the signal's error at the deadline
 */
export async function resolveHelmChart(chart: HelmChartRef, opts: ResolveHelmOptions = {}): Promise<string> {
  if (/^oci:\/\//i.test(chart.repository)) {
    if (!chart.version) throw new HelmIndexError('an OCI chart without a version is not resolved');
    // helm stores `+` of a version as `_` in the OCI tag.
    const ref = `${ociRepositoryRef(chart.repository)}/${chart.name}:${chart.version.replaceAll('+', '_')}`;
    return `${chart.version}@${await resolveImageDigest(ref, opts)}`;
  }
  const downloader = opts.downloader ?? createHttpDownloader(opts.fetchImpl);
  const got = await downloader.download({
    url: helmIndexUrl(chart.repository),
    maxBytes: MAX_HELM_INDEX_BYTES,
    ...(opts.signal ? { signal: opts.signal } : {}),
    ...(opts.checkUrl ? { checkUrl: opts.checkUrl } : {}),
    ...(opts.lookupFor ? { lookupFor: opts.lookupFor } : {}),
  });
  return chartEntryResolved(pickChartVersion(got.body.toString('utf8'), chart.name, chart.version));
}
