/**
 * The vendir configuration kapp-controller builds for an App's `spec.fetch[]`, the Secret and
 * ConfigMap documents sent alongside it, the `vendir sync` command line, and the template root.
 *
 * Mirrors kapp-controller `pkg/fetch/vendir.go` (`AddDir`, `ConfigBytes`, `Run`,
 * `ExtractImageRegistry`), `pkg/app/app_fetch.go` (`fetch`, the single-fetch `/0` rule) and
 * `pkg/config/config.go` (`ShouldSkipTLSForAuthority`). Pure: Secrets and ConfigMaps come in
 * through {@link RefObjects}; nothing here touches the network or the file system.
 *
 * @module
 */
import { posix } from 'node:path';
import { stringify } from 'yaml';
import type { LocalRef, VersionSelection } from '../api/common.js';
import { DEFAULT_GIT_DEPTH } from '../api/defaults.js';
import type {
  AppFetch,
  AppFetchGit,
  AppFetchHelmChart,
  AppFetchHTTP,
  AppFetchImage,
  AppFetchImgpkgBundle,
  AppFetchInline,
} from '../api/fetch.js';
import {
  type ConfigMapLike,
  configMapNotFoundMessage,
  type RefObjects,
  type SecretLike,
  secretNotFoundMessage,
} from '../api/refs.js';
import {
  gitRefError,
  gitUrlError,
  helmChartNameError,
  helmChartVersionError,
  helmRepositoryUrlError,
  quoteValue,
} from '../argv-values.js';
import { KappControllerError } from '../reconcile/result.js';
import { GIT_SAFETY_ENV } from './git-env.js';

/** vendir's `apiVersion` for `Config`. */
export const VENDIR_API_VERSION = 'vendir.k14s.io/v1alpha1';

/** Upstream: `Expected at least one fetch option` (`pkg/app/app_fetch.go`). */
export const NO_FETCH_MESSAGE = 'Expected at least one fetch option';

/** Upstream: `Unsupported way to fetch templates` (`pkg/fetch/vendir.go` `AddDir`). */
export const UNSUPPORTED_FETCH_MESSAGE = 'Unsupported way to fetch templates';

/**
 * Prefix upstream gives a failed `vendir sync` run (`AttachErrorf("Fetching resources: %s")`); the
 * runner appends the process error (`exit status 1` becomes
 * `Error (see .status.usefulErrorMessage for details)`).
 */
export const FETCH_RUN_ERROR_PREFIX = 'Fetching resources: ';

/** Which source an `AppFetch` entry uses, in upstream's precedence order. */
export type FetchSourceKind = 'inline' | 'image' | 'http' | 'git' | 'helmChart' | 'imgpkgBundle';

/** vendir `DirectoryContentsLocalRef`. */
export interface VendirLocalRef {
  /** Secret name. */
  name: string;
}

/** vendir `DirectoryContentsInlineSourceRef`. */
export interface VendirInlineSourceRef {
  /** Object name. */
  name: string;
  /** Directory the keys are written into. */
  directoryPath?: string;
}

/** vendir `DirectoryContents` as kapp-controller fills it (one source, `path: .`). */
export interface VendirContents {
  /** Always `.`: each fetch entry owns its whole directory. */
  path: '.';
  /** The fetch entry's `subPath` (image, http, git only). */
  newRootPath?: string;
  /** Inline files. */
  inline?: {
    paths?: Record<string, string>;
    pathsFrom?: Array<{ secretRef?: VendirInlineSourceRef; configMapRef?: VendirInlineSourceRef }>;
  };
  /** OCI image. */
  image?: {
    url?: string;
    tagSelection?: VersionSelection;
    secretRef?: VendirLocalRef;
    dangerousSkipTLSVerify?: true;
  };
  /** HTTP download. */
  http?: { url?: string; sha256?: string; secretRef?: VendirLocalRef };
  /**
   * A local directory vendir copies: what an `http` source becomes once the fetch stage has
   * downloaded and safely unpacked it itself (see {@link VendirConfigOptions.preparedHttp}).
   */
  directory?: { path: string };
  /** Git repository. */
  git?: {
    url?: string;
    ref?: string;
    refSelection?: VersionSelection;
    secretRef?: VendirLocalRef;
    lfsSkipSmudge?: true;
    dangerousSkipTLSVerify?: true;
    forceHTTPBasicAuth?: true;
    depth?: number;
  };
  /** Helm chart. */
  helmChart?: {
    name?: string;
    version?: string;
    repository?: { url?: string; secretRef?: VendirLocalRef };
  };
  /** imgpkg bundle. */
  imgpkgBundle?: {
    image?: string;
    tagSelection?: VersionSelection;
    secretRef?: VendirLocalRef;
    dangerousSkipTLSVerify?: true;
  };
}

/** vendir `Directory`: one per fetch entry. */
export interface VendirDirectory {
  /** `<index>` or the entry's `path`. */
  path: string;
  /** Exactly one contents entry. */
  contents: [VendirContents];
}

/** vendir `Config`. */
export interface VendirConfig {
  /** {@link VENDIR_API_VERSION}. */
  apiVersion: typeof VENDIR_API_VERSION;
  /** `Config`. */
  kind: 'Config';
  /** One per fetch entry, in `spec.fetch` order. */
  directories: VendirDirectory[];
}

/** Options for {@link buildVendirConfig}. */
export interface VendirConfigOptions {
  /**
   * The controller configuration's `dangerousSkipTLSVerify`: comma-separated hosts or
   * `host:port`s. Applies to `image`, `imgpkgBundle` and `git` sources only, as upstream.
   */
  dangerousSkipTLSVerify?: string;
  /**
   * `spec.fetch` index → absolute directory already holding that `http` entry's content
   * (downloaded and unpacked by the fetch stage with its own safe extractor). Such an entry
   * becomes a vendir `directory` source with the same `newRootPath`, so vendir never unpacks
   * an archive (vendir v0.44 writes `../` entries outside its directory). Entries not listed
   * keep their `http` source.
   */
  preparedHttp?: ReadonlyMap<number, string>;
}

/**
 * Returns the source an entry uses, checking in upstream's `switch` order
 * (inline, image, http, git, helmChart, imgpkgBundle), or `undefined` if none is set.
 *
 * @param entry - one `spec.fetch[]` entry
 */
export function fetchSourceKind(entry: AppFetch): FetchSourceKind | undefined {
  if (entry.inline) return 'inline';
  if (entry.image) return 'image';
  if (entry.http) return 'http';
  if (entry.git) return 'git';
  if (entry.helmChart) return 'helmChart';
  if (entry.imgpkgBundle) return 'imgpkgBundle';
  return undefined;
}

/**
 * The directory a fetch entry is synced into, relative to the fetch working directory:
 * `spec.fetch[i].path` if non-empty, otherwise `"<i>"`.
 *
 * @param entry - the fetch entry
 * @param index - its index in `spec.fetch`
 */
export function fetchDirectoryName(entry: AppFetch, index: number): string {
  return entry.path ? entry.path : String(index);
}

/**
 * Where templating runs, relative to the fetch working directory: `"0"` when there is exactly one
 * fetch entry without a `path` (upstream's backwards-compatible layout), otherwise `"."`.
 *
 * @param fetch - `spec.fetch`
 */
export function templateRootOf(fetch: readonly AppFetch[]): string {
  return fetch.length === 1 && !fetch[0]?.path ? '0' : '.';
}

/**
 * The registry part of an image reference, as upstream's `ExtractImageRegistry`: the text before
 * the first `/` if it contains `.` or `:`, otherwise `index.docker.io` (so `localhost/x` maps to
 * Docker Hub, as upstream).
 *
 * @param ref - image reference, e.g. `registry.local:5000/app@sha256:...`
 */
export function extractImageRegistry(ref: string): string {
  const slash = ref.indexOf('/');
  if (slash >= 0) {
    const first = ref.slice(0, slash);
    if (first.includes('.') || first.includes(':')) return first;
  }
  return 'index.docker.io';
}

/**
 * The authority (`host[:port]`) of a URL with a scheme (`https://user@host:8443/x` gives
 * `host:8443`), as Go's `url.Parse(u).Host`. scp-style git URLs (`git@host:org/repo`) and
 * scheme-less strings have none: `''`.
 *
 * @param url - a git URL
 */
export function extractUrlAuthority(url: string): string {
  const m = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/([^/?#]*)/.exec(url);
  if (!m) return '';
  const authority = m[1] ?? '';
  const at = authority.lastIndexOf('@');
  return at >= 0 ? authority.slice(at + 1) : authority;
}

/**
 * Go's `net.SplitHostPort` host part, or `undefined` where Go returns an error (no port, too many
 * colons, bad brackets).
 */
function splitHost(authority: string): string | undefined {
  if (authority.startsWith('[')) {
    const end = authority.indexOf(']');
    if (end < 0) return undefined;
    if (authority[end + 1] !== ':') return undefined;
    if (authority.indexOf(':', end + 2) >= 0) return undefined;
    return authority.slice(1, end);
  }
  const colon = authority.lastIndexOf(':');
  if (colon < 0) return undefined;
  const host = authority.slice(0, colon);
  if (host.includes(':')) return undefined;
  return host;
}

/**
 * Whether TLS verification is skipped for `candidate` (`host` or `host:port`) under the controller
 * configuration's comma-separated `dangerousSkipTLSVerify` list. An entry without a port matches
 * every port of that host; an entry with a port matches only that exact `host:port`.
 *
 * Mirrors `pkg/config/config.go` `ShouldSkipTLSForAuthority`.
 *
 * @param allowList - `dangerousSkipTLSVerify` (may be empty or undefined)
 * @param candidate - authority to check
 */
export function shouldSkipTLSForAuthority(allowList: string | undefined, candidate: string): boolean {
  if (!allowList) return false;
  const host = splitHost(candidate) ?? candidate;
  for (const raw of allowList.split(',')) {
    const authority = raw.trim();
    if (authority === host || authority === candidate) return true;
  }
  return false;
}

function localRef(ref: LocalRef | undefined): VendirLocalRef | undefined {
  return ref ? { name: ref.name ?? '' } : undefined;
}

function versionSelection(sel: VersionSelection | undefined): VersionSelection | undefined {
  if (!sel) return undefined;
  const out: VersionSelection = {};
  if (sel.semver) {
    out.semver = {};
    if (sel.semver.constraints) out.semver.constraints = sel.semver.constraints;
    if (sel.semver.prereleases) {
      out.semver.prereleases = {};
      if (sel.semver.prereleases.identifiers?.length) {
        out.semver.prereleases.identifiers = [...sel.semver.prereleases.identifiers];
      }
    }
  }
  return out;
}

/** Drops `undefined`, `''` and `false` values (Go `omitempty`). */
function compact<T extends object>(obj: T): T {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (v === undefined || v === '' || v === false) continue;
    out[k] = v;
  }
  return out as T;
}

function inlineContents(inline: AppFetchInline): VendirContents {
  const pathsFrom = (inline.pathsFrom ?? []).map((src) =>
    compact({
      secretRef: src.secretRef
        ? compact({ name: src.secretRef.name ?? '', directoryPath: src.secretRef.directoryPath })
        : undefined,
      configMapRef: src.configMapRef
        ? compact({ name: src.configMapRef.name ?? '', directoryPath: src.configMapRef.directoryPath })
        : undefined,
    }),
  );
  const body: VendirContents['inline'] = {};
  if (inline.paths && Object.keys(inline.paths).length > 0) body.paths = { ...inline.paths };
  if (pathsFrom.length > 0) body.pathsFrom = pathsFrom;
  return { path: '.', inline: body };
}

function imageContents(image: AppFetchImage, skip: string | undefined): VendirContents {
  return compact({
    path: '.' as const,
    newRootPath: image.subPath,
    image: compact({
      url: image.url,
      tagSelection: versionSelection(image.tagSelection),
      secretRef: localRef(image.secretRef),
      dangerousSkipTLSVerify: shouldSkipTLSForAuthority(skip, extractImageRegistry(image.url ?? '')) || undefined,
    }) as VendirContents['image'],
  });
}

function imgpkgBundleContents(bundle: AppFetchImgpkgBundle, skip: string | undefined): VendirContents {
  return {
    path: '.',
    imgpkgBundle: compact({
      image: bundle.image,
      tagSelection: versionSelection(bundle.tagSelection),
      secretRef: localRef(bundle.secretRef),
      dangerousSkipTLSVerify: shouldSkipTLSForAuthority(skip, extractImageRegistry(bundle.image ?? '')) || undefined,
    }) as VendirContents['imgpkgBundle'],
  };
}

function httpContents(http: AppFetchHTTP, prepared: string | undefined): VendirContents {
  if (prepared !== undefined) {
    return compact({ path: '.' as const, directory: { path: prepared }, newRootPath: http.subPath });
  }
  return compact({
    path: '.' as const,
    http: compact({ url: http.url, sha256: http.sha256, secretRef: localRef(http.secretRef) }),
    newRootPath: http.subPath,
  });
}

function gitContents(git: AppFetchGit, skip: string | undefined): VendirContents {
  // depth: unset -> 1; 0 -> full history, which vendir expresses by omitting the field.
  const depth = git.depth ?? DEFAULT_GIT_DEPTH;
  return compact({
    path: '.' as const,
    newRootPath: git.subPath,
    git: compact({
      url: git.url,
      ref: git.ref,
      refSelection: versionSelection(git.refSelection),
      secretRef: localRef(git.secretRef),
      lfsSkipSmudge: git.lfsSkipSmudge || undefined,
      dangerousSkipTLSVerify: shouldSkipTLSForAuthority(skip, extractUrlAuthority(git.url ?? '')) || undefined,
      forceHTTPBasicAuth: git.forceHTTPBasicAuth || undefined,
      depth: depth === 0 ? undefined : depth,
    }) as VendirContents['git'],
  });
}

function helmChartContents(chart: AppFetchHelmChart): VendirContents {
  return {
    path: '.',
    helmChart: compact({
      name: chart.name,
      version: chart.version,
      repository: chart.repository
        ? compact({ url: chart.repository.url, secretRef: localRef(chart.repository.secretRef) })
        : undefined,
    }),
  };
}

/**
 * Rejects fetch directory names that would make vendir write outside its working directory
 * (absolute paths, `..` escapes). Upstream passes them to vendir unchecked; vendir itself only
 * refuses `/`, `.`, `..` and `''`.
 */
function checkFetchPath(path: string, index: number): void {
  const normalised = posix.normalize(path);
  if (posix.isAbsolute(path) || normalised === '..' || normalised.startsWith('../')) {
    throw new KappControllerError(`Fetching (${index}): Invalid path: ${path}`);
  }
}

/**
 * Refuses fetch values that vendir passes to `git` or `helm` as separate arguments and that could
 * be read as an option there (see `argv-values.ts` for each rule): `git.url` (`git remote add
 * origin <url>`), `git.ref` (`git fetch origin <ref minus "origin/">`, `git checkout <ref>`),
 * `helmChart.name` (`helm fetch <name>`), `helmChart.version` (`--version <v>`) and
 * `helmChart.repository.url` (`helm repo add vendir-unused <url>`, `helm registry login <host>`).
 * Upstream passes them unchecked. image and imgpkgBundle references and http URLs reach vendir's
 * in-process libraries, never an argv, so they are not checked here. Empty values are left to
 * vendir's own errors.
 */
function checkArgvValues(entry: AppFetch, index: number): void {
  const fail = (field: string, value: string, what: string, reason: string): never => {
    throw new KappControllerError(
      `Fetching (${index}): ${field} ${quoteValue(value)} is not a valid ${what}: ${reason}`,
    );
  };
  const check = (
    field: string,
    value: string | undefined,
    what: string,
    rule: (v: string) => string | undefined,
  ): void => {
    if (!value) return;
    const reason = rule(value);
    if (reason !== undefined) fail(field, value, what, reason);
  };
  const kind = fetchSourceKind(entry);
  if (kind === 'git' && entry.git) {
    check('git.url', entry.git.url, 'git URL', gitUrlError);
    check('git.ref', entry.git.ref, 'git ref', gitRefError);
  }
  if (kind === 'helmChart' && entry.helmChart) {
    check('helmChart.name', entry.helmChart.name, 'chart name', helmChartNameError);
    check('helmChart.version', entry.helmChart.version, 'chart version', helmChartVersionError);
    check('helmChart.repository.url', entry.helmChart.repository?.url, 'repository URL', helmRepositoryUrlError);
  }
}

/**
 * Builds the vendir `Config` for `spec.fetch`: one directory per entry
 * (`{path: <i> | entry.path, contents: [{path: ".", <source>, newRootPath?: subPath}]}`).
 *
 * Field mapping (upstream `vendir.go`): `image.subPath`, `http.subPath` and `git.subPath` become
 * `newRootPath`; `git.depth` unset becomes 1 and `0` (full history) is omitted;
 * `dangerousSkipTLSVerify` is set for image, imgpkgBundle (registry of the reference) and git
 * (authority of the URL) sources matching `options.dangerousSkipTLSVerify`. Empty values are
 * omitted, as Go's `omitempty`.
 *
 * @param fetch - `spec.fetch`
 * @param options - controller configuration
 * @returns the vendir config object
 * @throws {KappControllerError} `Expected at least one fetch option` when `fetch` is empty;
 *   `Fetching (<i>): Unsupported way to fetch templates` for an entry without a source;
 *   `Fetching (<i>): Invalid path: <path>` for a `path` that is absolute or climbs out with `..`
 *   (a check upstream lacks); `Fetching (<i>): <field> "<value>" is not a valid <what>: <reason>`
 *   for a git URL or ref, or a helm chart name, version or repository URL, that a tool could
 *   read as an option (checks upstream lacks, see `checkArgvValues`).
 */
export function buildVendirConfig(fetch: readonly AppFetch[], options: VendirConfigOptions = {}): VendirConfig {
  if (fetch.length === 0) throw new KappControllerError(NO_FETCH_MESSAGE);
  const skip = options.dangerousSkipTLSVerify;
  const directories = fetch.map((entry, i): VendirDirectory => {
    const path = fetchDirectoryName(entry, i);
    let contents: VendirContents;
    switch (fetchSourceKind(entry)) {
      case 'inline':
        contents = inlineContents(entry.inline!);
        break;
      case 'image':
        contents = imageContents(entry.image!, skip);
        break;
      case 'http':
        contents = httpContents(entry.http!, options.preparedHttp?.get(i));
        break;
      case 'git':
        contents = gitContents(entry.git!, skip);
        break;
      case 'helmChart':
        contents = helmChartContents(entry.helmChart!);
        break;
      case 'imgpkgBundle':
        contents = imgpkgBundleContents(entry.imgpkgBundle!, skip);
        break;
      default:
        throw new KappControllerError(`Fetching (${i}): ${UNSUPPORTED_FETCH_MESSAGE}`);
    }
    checkFetchPath(path, i);
    checkArgvValues(entry, i);
    return { path, contents: [contents] };
  });
  return { apiVersion: VENDIR_API_VERSION, kind: 'Config', directories };
}

/** A Secret or ConfigMap reference that vendir needs alongside its config. */
export interface VendirResourceRef {
  /** Object kind. */
  kind: 'Secret' | 'ConfigMap';
  /** Object name, in the App's namespace. */
  name: string;
}

/**
 * The Secrets and ConfigMaps a vendir config refers to, in upstream's order (directory order;
 * inside an inline source, `pathsFrom` order), without duplicates.
 *
 * @param config - a config from {@link buildVendirConfig}
 */
export function vendirResourceRefs(config: VendirConfig): VendirResourceRef[] {
  const refs: VendirResourceRef[] = [];
  const seen = new Set<string>();
  const add = (kind: VendirResourceRef['kind'], name: string): void => {
    const key = `${kind}/${name}`;
    if (seen.has(key)) return;
    seen.add(key);
    refs.push({ kind, name });
  };
  for (const dir of config.directories) {
    for (const c of dir.contents) {
      if (c.inline) {
        for (const src of c.inline.pathsFrom ?? []) {
          if (src.secretRef) add('Secret', src.secretRef.name);
          else if (src.configMapRef) add('ConfigMap', src.configMapRef.name);
        }
      } else if (c.image?.secretRef) add('Secret', c.image.secretRef.name);
      else if (c.http?.secretRef) add('Secret', c.http.secretRef.name);
      else if (c.git?.secretRef) add('Secret', c.git.secretRef.name);
      else if (c.helmChart?.repository?.secretRef) add('Secret', c.helmChart.repository.secretRef.name);
      else if (c.imgpkgBundle?.secretRef) add('Secret', c.imgpkgBundle.secretRef.name);
    }
  }
  return refs;
}

/** Serialises like upstream's `sigs.k8s.io/yaml` (keys sorted, no line folding). */
function toYaml(value: unknown): string {
  return stringify(value, { sortMapEntries: true, lineWidth: 0 });
}

/** Decoded values in the API server's wire form (base64), as vendir reads them; none: omitted. */
function base64Values(values: Readonly<Record<string, Buffer>> | undefined): Record<string, string> | undefined {
  if (!values || Object.keys(values).length === 0) return undefined;
  return Object.fromEntries(Object.entries(values).map(([k, v]) => [k, v.toString('base64')]));
}

/**
 * The document vendir receives for a Secret: `apiVersion`, `kind`, `metadata.{name,namespace}`,
 * `type` and `data` only. Upstream sends the whole object (managedFields, annotations such as
 * `kubectl.kubernetes.io/last-applied-configuration`, ...); vendir reads only name, type and data,
 * so the rest is dropped rather than handed to a tool process.
 */
function secretDocument(secret: SecretLike, name: string, namespace: string | undefined): string {
  return toYaml(
    compact({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: compact({ name, namespace: secret.metadata?.namespace ?? namespace }),
      type: secret.type,
      data: base64Values(secret.data),
    }),
  );
}

/** As {@link secretDocument}, for a ConfigMap (`data`, `binaryData`). */
function configMapDocument(cm: ConfigMapLike, name: string, namespace: string | undefined): string {
  return toYaml(
    compact({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: compact({ name, namespace: cm.metadata?.namespace ?? namespace }),
      data: cm.data && Object.keys(cm.data).length > 0 ? { ...cm.data } : undefined,
      binaryData: base64Values(cm.binaryData),
    }),
  );
}

/** The `vendir sync` invocation. */
export interface VendirSyncCommand {
  /** Binary name. */
  bin: 'vendir';
  /** Exactly upstream's: `sync -f - --lock-file /dev/null`. */
  args: string[];
  /**
   * {@link VENDIR_GODEBUG} and `GIT_SAFETY_ENV` (`./git-env.ts`: the git vendir runs follows no
   * redirect). No `VENDIR_CACHE_DIR`: see {@link vendirSyncCommand}.
   */
  env: Record<string, string>;
}

/**
 * `GODEBUG` for vendir: Go's tar and zip readers then refuse entry names that are absolute or
 * climb out with `..` (`archive/tar: insecure file path`). Not set upstream. It guards the
 * archives vendir still unpacks itself: OCI layers of `image` and `imgpkgBundle` sources
 * (imgpkg v0.46.1 `DirImage` joins layer entry names onto its directory unchecked, so a layer
 * entry `../../x` is written outside) and charts read by the helm it runs. (http archives
 * never reach vendir: the fetch stage unpacks them itself.)
 */
export const VENDIR_GODEBUG = 'tarinsecurepath=0,zipinsecurepath=0';

/**
 * The `vendir sync` command upstream runs (`pkg/fetch/vendir.go` `Run`): config on stdin, lock file
 * discarded, cwd = the fetch working directory; plus {@link VENDIR_GODEBUG} and `GIT_SAFETY_ENV`
 * (vendir hands its environment to the `git` it runs, which then follows no redirect).
 *
 * Deviation: upstream also sets `VENDIR_CACHE_DIR` to a directory per object
 * (`<cacheRoot>/apps/<app uid>`) that outlives the run. Here vendir gets none, so it caches
 * nothing (vendir v0.44 reads no other cache location: without the variable it uses its
 * `NoCache`), and no run reads what an earlier run left (docs/decisions.md D1). That cache is unsafe to
 * keep: vendir keys an image or bundle entry by its digest alone, so a later run for
 * `<any registry>/x@<same digest>` is served from it without contacting that registry, and a
 * git entry is a `git bundle` a later `git fetch` starts from. What it saved is small: vendir
 * caches only entries of at most 1 MiB (`VENDIR_MAX_CACHE_SIZE`); a pinned fetch (commit,
 * digest, sha256) whose artifact is stored does not run vendir at all (`./pinned.ts`); and an
 * empty cache per run would cost more than none (vendir then writes a `git bundle` of every
 * git source: 785 ms without a cache, 944 ms with an empty one, 594 ms with a warm one, for a
 * 43-file repository over local HTTP).
 */
export function vendirSyncCommand(): VendirSyncCommand {
  return {
    bin: 'vendir',
    args: ['sync', '-f', '-', '--lock-file', '/dev/null'],
    env: { GODEBUG: VENDIR_GODEBUG, ...GIT_SAFETY_ENV },
  };
}

/** Input for {@link planVendirSync}. */
export interface VendirPlanInput {
  /** `spec.fetch`. */
  fetch: readonly AppFetch[];
  /** App namespace (where referenced Secrets and ConfigMaps live). */
  namespace: string;
  /** Referenced Secrets and ConfigMaps (see {@link vendirResourceRefs}). */
  refs: RefObjects;
  /** Controller configuration's `dangerousSkipTLSVerify`. */
  dangerousSkipTLSVerify?: string;
  /** See {@link VendirConfigOptions.preparedHttp}. */
  preparedHttp?: ReadonlyMap<number, string>;
}

/** Everything the fetch function needs to run vendir for an App. */
export interface VendirPlan {
  /** The vendir config. */
  config: VendirConfig;
  /** `config` as YAML. */
  configYaml: string;
  /** Referenced Secret and ConfigMap documents (YAML), in upstream order, deduplicated. */
  extraDocuments: string[];
  /**
   * vendir's stdin: `extraDocuments` then `configYaml`, joined with `---\n`, exactly as upstream's
   * `ConfigBytes`. Contains Secret data: never log or store it.
   */
  stdin: string;
  /** The command to run with `stdin`, cwd = the fetch working directory. */
  command: VendirSyncCommand;
  /** Template root relative to the fetch working directory (`"0"` or `"."`). */
  templateRoot: string;
}

/**
 * Plans the fetch stage of an App: vendir config, the documents sent with it, the command and the
 * template root. Mirrors `pkg/app/app_fetch.go` `fetch` up to (not including) running vendir.
 *
 * @param input - see {@link VendirPlanInput}
 * @returns the plan
 * @throws {KappControllerError} the config errors of {@link buildVendirConfig}; and
 *   `Fetching: secrets "<name>" not found` / `Fetching: configmaps "<name>" not found` when a
 *   referenced object is missing (upstream's `Fetching: %v` around the API error)
 */
export function planVendirSync(input: VendirPlanInput): VendirPlan {
  const config = buildVendirConfig(input.fetch, {
    dangerousSkipTLSVerify: input.dangerousSkipTLSVerify,
    preparedHttp: input.preparedHttp,
  });
  const extraDocuments = vendirResourceRefs(config).map((ref) => {
    if (ref.kind === 'Secret') {
      const secret = input.refs.secret(ref.name);
      if (!secret) throw new KappControllerError(`Fetching: ${secretNotFoundMessage(ref.name)}`);
      return secretDocument(secret, ref.name, input.namespace);
    }
    const cm = input.refs.configMap(ref.name);
    if (!cm) throw new KappControllerError(`Fetching: ${configMapNotFoundMessage(ref.name)}`);
    return configMapDocument(cm, ref.name, input.namespace);
  });
  const configYaml = toYaml(config);
  return {
    config,
    configYaml,
    extraDocuments,
    stdin: [...extraDocuments, configYaml].join('---\n'),
    command: vendirSyncCommand(),
    templateRoot: templateRootOf(input.fetch),
  };
}

/**
 * Whether a failed fetch may be retried with refreshed Secrets: upstream retries up to 3 more
 * times, 2s apart, when the App has an `image` or `imgpkgBundle` fetch and the regenerated config
 * bytes differ (a placeholder Secret was filled); `fetchWithVendir` (`./run.ts`)
 * does. Mirrors `App.HasImageOrImgpkgBundle`.
 *
 * @param fetch - `spec.fetch`
 */
export function hasImageOrImgpkgBundle(fetch: readonly AppFetch[]): boolean {
  return fetch.some((f) => f.image !== undefined || f.imgpkgBundle !== undefined);
}
