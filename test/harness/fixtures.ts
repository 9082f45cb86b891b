/**
 * Builders that turn the shared fixtures (`../shared/fixtures/`, see its SOURCES.md) into
 * what the test servers serve: git repos, helm chart repos, zip/tgz archives and imgpkg
 * bundles. The demo uses the same builders on the project's own `examples/sources/`
 * (`scripts/demo-examples.ts`). Everything is built at run time from the fixture files, with fixed dates and
 * modes, so the same input gives the same git commit ids and archive bytes.
 *
 * Tools come from the pinned cache (`binPath(component(...))`, built by `npm run setup`);
 * `git` is Debian's.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { type ZipOptions, type Zippable, zipSync } from 'fflate';
import * as tar from 'tar';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { binDir, binPath, run } from '../../layers/gobuild.js';
import { COMPONENTS } from '../../layers/manifest.js';
import { type GitServerInfo, isolatedGitEnv, repoDir } from './servers/git.js';
import type { HttpServerInfo } from './servers/http.js';
import { makeTempDir, removeTempDir } from './servers/process.js';
import type { RegistryInfo } from './servers/registry.js';

/** Root of the kapp-lambda checkout (two levels above this file). */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/**
 * The shared, read-only fixtures dir: `shared/fixtures/` beside the checkout (as laid out for
 * developers and CI).
 */
export const FIXTURES_DIR = path.resolve(REPO_ROOT, '..', 'shared', 'fixtures');

/**
 * Checks that {@link FIXTURES_DIR} is there before anything starts: a checkout without the
 * project's `shared/` folder beside it otherwise failed ~20 s later, after the control plane
 * had started, with a bare `ENOENT scandir`.
 * @throws Error naming the expected path and what it holds.
 */
export function requireFixtures(): void {
  if (existsSync(FIXTURES_DIR)) return;
  throw new Error(
    `the shared fixtures are missing: expected ${FIXTURES_DIR} (the project's shared/ folder beside this checkout, ../shared, holds the third-party charts, git repositories and bundles the tests serve on 127.0.0.1; npm run demo needs none of it); clone or link it there`,
  );
}

/**
 * Absolute path inside {@link FIXTURES_DIR}.
 * @throws Error when a part contains `..` (paths stay inside the fixtures).
 */
export function fixturePath(...parts: string[]): string {
  if (parts.some((p) => p.split(/[\\/]/).includes('..'))) throw new Error(`fixture path leaves fixtures: ${parts}`);
  return path.join(FIXTURES_DIR, ...parts);
}

/** Files given inline: relative POSIX path → content (UTF-8 string or bytes). */
export type FileTree = Readonly<Record<string, string | Uint8Array>>;

/** Content for a repo, archive or bundle: a directory path, or inline files. */
export type FixtureSource = string | FileTree;

/** Fixed timestamp for everything built here: 2021-01-29T00:00:00Z (k8s-simple-app-example's commit day). */
export const FIXTURE_EPOCH_SECONDS = 1611878400;

/**
 * Absolute path of a pinned Go-built tool (`ytt`, `kbld`, `kapp`, `vendir`, `imgpkg`, `helm`,
 * `sops`, `age`, `cue`, `kustomize`, `versitygw`, ...).
 * @throws Error when no component in the manifest ships that binary.
 */
export function toolBin(bin: string): string {
  const c = COMPONENTS.find((x) => x.binaries.some((b) => b.bin === bin));
  if (!c) throw new Error(`no pinned component ships ${bin}`);
  return binPath(c, bin);
}

/**
 * Environment for running the pinned tools as children: PATH has the cache dirs of every
 * layer tool (vendir, imgpkg, helm, ytt, kbld, kapp, sops, age, cue, kustomize) first, then the
 * current PATH (Debian's `git`), so vendir finds `git` and `helm` (`VENDIR_HELM_BINARY` is the
 * pinned helm too). vendir's `imgpkgBundle`/`image` sources link imgpkg as a library and run
 * no `imgpkg` binary. (imgpkg's IaaS keychains
 * are off unless `--activate-keychain` is given.) With `home`, helm's config, cache and data dirs
 * and docker's config dir live under it instead of the user's home.
 */
export function toolEnv(opts: { home?: string; extra?: NodeJS.ProcessEnv } = {}): NodeJS.ProcessEnv {
  const dirs = COMPONENTS.filter((c) => c.layers.length > 0).map((c) => binDir(c));
  const env: NodeJS.ProcessEnv = {
    PATH: [...dirs, process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin'].join(path.delimiter),
    HOME: opts.home ?? process.env.HOME,
    LANG: 'C',
    TMPDIR: process.env.TMPDIR,
    SOPS_DISABLE_VERSION_CHECK: '1',
    // vendir runs `helm3` instead of `helm` for `helmVersion: "3"` unless this is set
    VENDIR_HELM_BINARY: toolBin('helm'),
    GIT_CONFIG_NOSYSTEM: '1',
    GIT_TERMINAL_PROMPT: '0',
  };
  if (opts.home) {
    Object.assign(env, {
      HELM_CACHE_HOME: path.join(opts.home, '.cache', 'helm'),
      HELM_CONFIG_HOME: path.join(opts.home, '.config', 'helm'),
      HELM_DATA_HOME: path.join(opts.home, '.local', 'share', 'helm'),
      DOCKER_CONFIG: path.join(opts.home, '.docker'),
    });
  }
  return { ...env, ...opts.extra };
}

/** One entry of a walked tree. */
interface TreeEntry {
  /** Relative POSIX path, no leading `./`. */
  readonly rel: string;
  readonly dir: boolean;
  /** Absolute path of the source file (dir sources) or the inline content. */
  readonly from: string | Uint8Array;
}

/** Walks a source into entries sorted by path (dirs before their content); skips `.git`. */
async function walk(source: FixtureSource): Promise<TreeEntry[]> {
  const out: TreeEntry[] = [];
  if (typeof source !== 'string') {
    const dirs = new Set<string>();
    for (const [rel, content] of Object.entries(source)) {
      assertRelative(rel);
      const parts = rel.split('/');
      for (let i = 1; i < parts.length; i++) dirs.add(parts.slice(0, i).join('/'));
      out.push({ rel, dir: false, from: typeof content === 'string' ? Buffer.from(content) : content });
    }
    for (const d of dirs) out.push({ rel: d, dir: true, from: '' });
  } else {
    const visit = async (abs: string, rel: string) => {
      for (const e of await readdir(abs, { withFileTypes: true })) {
        if (e.name === '.git') continue;
        const r = rel ? `${rel}/${e.name}` : e.name;
        const a = path.join(abs, e.name);
        if (e.isDirectory()) {
          out.push({ rel: r, dir: true, from: a });
          await visit(a, r);
        } else if (e.isFile()) out.push({ rel: r, dir: false, from: a });
      }
    };
    await visit(source, '');
  }
  return out.sort((a, b) => (a.rel < b.rel ? -1 : a.rel > b.rel ? 1 : 0));
}

function assertRelative(rel: string): void {
  if (!rel || rel.startsWith('/') || rel.split('/').some((p) => p === '..' || p === '')) {
    throw new Error(`bad relative path in file tree: ${JSON.stringify(rel)}`);
  }
}

async function contentOf(e: TreeEntry): Promise<Uint8Array> {
  return typeof e.from === 'string' ? await readFile(e.from) : e.from;
}

/**
 * Writes a source into `dest` (created when missing) with normalized modes: dirs 0755,
 * files 0644 (0755 when the source file is executable). Fixture dirs are read-only, so tests
 * that modify content copy it first with this.
 * @returns `dest`.
 */
export async function materialize(source: FixtureSource, dest: string): Promise<string> {
  await mkdir(dest, { recursive: true });
  for (const e of await walk(source)) {
    const target = path.join(dest, ...e.rel.split('/'));
    if (e.dir) {
      await mkdir(target, { recursive: true, mode: 0o755 });
      continue;
    }
    const exec = typeof e.from === 'string' && ((await stat(e.from)).mode & 0o111) !== 0;
    if (typeof e.from === 'string') await copyFile(e.from, target);
    else await writeFile(target, e.from);
    await chmod(target, exec ? 0o755 : 0o644);
  }
  return dest;
}

/**
 * Reads every file under `dir` (skipping `.git`) as UTF-8 text.
 * @returns relative POSIX path → content, keys sorted; for exact comparisons in tests.
 */
export async function readTree(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const e of await walk(dir)) if (!e.dir) out[e.rel] = (await contentOf(e)).toString();
  return out;
}

// ---------------------------------------------------------------------------------- git

/** Options of {@link createRepo}. */
export interface CreateRepoOptions {
  /** Branch the commit goes on; also the repo's HEAD. Default `main`. */
  readonly branch?: string;
  /** Commit message. Default `fixture: <name>`. */
  readonly message?: string;
  /**
   * Author and committer time in Unix seconds. Default {@link FIXTURE_EPOCH_SECONDS} plus
   * 60 s per commit already on the branch, so a repo built the same way has the same ids.
   */
  readonly date?: number;
  /** Lightweight tags to point at the new commit (e.g. `v1.0.0`); moved if they exist. */
  readonly tags?: readonly string[];
}

/** A repo served by the git server. */
export interface GitRepo {
  /** Clone URL, `<baseUrl>/<name>` (no `.git` suffix, as GitHub URLs in the examples). */
  readonly url: string;
  /** Full hex id of the commit just made. */
  readonly commitSha: string;
  readonly branch: string;
  /** Absolute path of the bare repo. */
  readonly gitDir: string;
}

/**
 * Creates (or adds a commit to) a bare repo `<name>.git` under the git server's root whose
 * tree is exactly `source`. The commit has a fixed author (`kapp-lambda fixtures
 * <fixtures@kapp-lambda.invalid>`) and date, so its id depends only on the content, the
 * options and the commits before it. A second call with the same name adds a commit on top of
 * `branch` (a new branch starts from nothing), which lets tests move a ref.
 * @param name repo name, may contain `/` (e.g. `k14s/k8s-simple-app-example`), no `..`.
 * @throws Error when a git command fails.
 */
export async function createRepo(
  git: GitServerInfo,
  name: string,
  source: FixtureSource,
  opts: CreateRepoOptions = {},
): Promise<GitRepo> {
  assertRelative(name);
  const branch = opts.branch ?? 'main';
  const gitDir = repoDir(git, name);
  const env = isolatedGitEnv();
  const g = (args: string[], extra: NodeJS.ProcessEnv = {}) =>
    run(['git', '--git-dir', gitDir, ...args], { env: { ...env, ...extra } }).then((r) => r.stdout.trim());
  if (!existsSync(gitDir)) {
    await mkdir(path.dirname(gitDir), { recursive: true });
    await run(['git', 'init', '--quiet', '--bare', `--initial-branch=${branch}`, gitDir], { env });
  }
  const parent = await g(['rev-parse', '--verify', '--quiet', `refs/heads/${branch}^{commit}`]).catch(() => '');
  const count = parent ? Number(await g(['rev-list', '--count', parent])) : 0;
  const date = `${opts.date ?? FIXTURE_EPOCH_SECONDS + 60 * count} +0000`;
  const tmp = await makeTempDir('gitsrc');
  try {
    const workTree = typeof source === 'string' ? source : await materialize(source, path.join(tmp, 'tree'));
    const index = { GIT_INDEX_FILE: path.join(tmp, 'index') };
    await g(['--work-tree', workTree, 'add', '--all', '--force', '.'], index);
    const tree = await g(['write-tree'], index);
    const commitSha = await g(
      ['commit-tree', tree, ...(parent ? ['-p', parent] : []), '-m', opts.message ?? `fixture: ${name}`],
      {
        GIT_AUTHOR_NAME: 'kapp-lambda fixtures',
        GIT_AUTHOR_EMAIL: 'fixtures@kapp-lambda.invalid',
        GIT_AUTHOR_DATE: date,
        GIT_COMMITTER_NAME: 'kapp-lambda fixtures',
        GIT_COMMITTER_EMAIL: 'fixtures@kapp-lambda.invalid',
        GIT_COMMITTER_DATE: date,
      },
    );
    await g(['update-ref', `refs/heads/${branch}`, commitSha]);
    await g(['symbolic-ref', 'HEAD', `refs/heads/${branch}`]);
    for (const t of opts.tags ?? []) await g(['update-ref', `refs/tags/${t}`, commitSha]);
    return { url: `${git.baseUrl}/${name}`, commitSha, branch, gitDir };
  } finally {
    await removeTempDir(tmp);
  }
}

// ------------------------------------------------------------------------------ archives

/** Archive options. */
export interface ArchiveOptions {
  /** Folder every entry goes under, without slashes, e.g. `k8s-simple-app-example-master`. */
  readonly prefix?: string;
}

/**
 * Builds a zip of a source in memory: entries sorted, dirs included (as GitHub's archive
 * zips have them), Unix modes 0755/0644, every time 2021-01-29 00:00 (DOS time, local).
 */
export async function zipTree(source: FixtureSource, opts: ArchiveOptions = {}): Promise<Uint8Array> {
  const mtime = new Date(FIXTURE_EPOCH_SECONDS * 1000 + new Date().getTimezoneOffset() * 60_000);
  const dirOpts: ZipOptions = { mtime, os: 3, attrs: ((0o40755 << 16) | 0x10) >>> 0 };
  const fileOpts: ZipOptions = { mtime, os: 3, attrs: (0o100644 << 16) >>> 0 };
  const root: Zippable = {};
  const dirs = new Map<string, Zippable>([['', root]]);
  const ensureDir = (rel: string): Zippable => {
    const have = dirs.get(rel);
    if (have) return have;
    const cut = rel.lastIndexOf('/');
    const parent = ensureDir(cut < 0 ? '' : rel.slice(0, cut));
    const own: Zippable = {};
    parent[rel.slice(cut + 1)] = [own, dirOpts];
    dirs.set(rel, own);
    return own;
  };
  const base = opts.prefix ? `${opts.prefix}/` : '';
  if (opts.prefix) ensureDir(opts.prefix);
  for (const e of await walk(source)) {
    const rel = `${base}${e.rel}`;
    if (e.dir) ensureDir(rel);
    else {
      const cut = rel.lastIndexOf('/');
      ensureDir(cut < 0 ? '' : rel.slice(0, cut))[rel.slice(cut + 1)] = [await contentOf(e), fileOpts];
    }
  }
  return zipSync(root, { level: 6 });
}

/**
 * Builds a gzipped tar of a source in memory: entries sorted, dirs included, modes
 * 0755/0644, no owners, every mtime 2021-01-29T00:00:00Z.
 */
export async function tgzTree(source: FixtureSource, opts: ArchiveOptions = {}): Promise<Buffer> {
  const tmp = await makeTempDir('tgz');
  try {
    const dir = await materialize(source, path.join(tmp, 'tree'));
    const entries = (await walk(dir)).map((e) => e.rel);
    const chunks: Buffer[] = [];
    const stream = tar.create(
      {
        cwd: dir,
        gzip: { level: 6 },
        portable: true,
        noDirRecurse: true,
        mtime: new Date(FIXTURE_EPOCH_SECONDS * 1000),
        prefix: opts.prefix,
      },
      entries,
    );
    for await (const c of stream) chunks.push(Buffer.from(c as Buffer));
    return Buffer.concat(chunks);
  } finally {
    await removeTempDir(tmp);
  }
}

/**
 * A gzipped tar of `entries` (name → text), each name written as is: the hostile archive
 * (`../x` stays `../x`), which {@link tgzTree} cannot make since tar sanitizes the names it packs.
 * Regular files only, mode 0644, mtime 0.
 */
export function rawTgz(entries: Record<string, string>): Buffer {
  const blocks: Buffer[] = [];
  for (const [name, text] of Object.entries(entries)) {
    const body = Buffer.from(text);
    const block = Buffer.alloc(512);
    new tar.Header({ path: name, type: 'File', size: body.length, mode: 0o644, mtime: new Date(0) }).encode(block, 0);
    blocks.push(block, body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return gzipSync(Buffer.concat(blocks));
}

/** A file published on the static HTTP server. */
export interface PublishedFile {
  /** `<baseUrl>/<fileName>`. */
  readonly url: string;
  /** Lowercase hex sha256 of the file (what an `http` fetch's `sha256` field takes). */
  readonly sha256: string;
  /** Size in bytes. */
  readonly size: number;
}

/**
 * Writes a zip (`.zip`) or gzipped tar (`.tgz`, `.tar.gz`) of a source to `<root>/<fileName>`
 * on the static HTTP server.
 * @param fileName relative POSIX path under the server root, e.g. `k8s-simple-app-example-master.zip`.
 * @throws Error for other extensions.
 */
export async function publishArchive(
  http: HttpServerInfo,
  fileName: string,
  source: FixtureSource,
  opts: ArchiveOptions = {},
): Promise<PublishedFile> {
  let bytes: Uint8Array;
  if (fileName.endsWith('.zip')) bytes = await zipTree(source, opts);
  else if (fileName.endsWith('.tgz') || fileName.endsWith('.tar.gz')) bytes = await tgzTree(source, opts);
  else throw new Error(`publish archive ${fileName}: name must end in .zip, .tgz or .tar.gz`);
  return await publishFile(http, fileName, bytes);
}

/** Writes bytes to `<root>/<fileName>` on the static HTTP server. */
export async function publishFile(
  http: HttpServerInfo,
  fileName: string,
  bytes: Uint8Array | string,
): Promise<PublishedFile> {
  assertRelative(fileName);
  const target = path.join(http.root, ...fileName.split('/'));
  await mkdir(path.dirname(target), { recursive: true });
  await writeFile(target, bytes);
  const buf = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
  return {
    url: `${http.baseUrl}/${fileName}`,
    sha256: createHash('sha256').update(buf).digest('hex'),
    size: buf.byteLength,
  };
}

// ---------------------------------------------------------------------------------- helm

/** One chart version in a helm repo built by {@link buildHelmRepo}. */
export interface HelmChartEntry {
  readonly name: string;
  readonly version: string;
  /** URL of the packaged `.tgz`. */
  readonly url: string;
  /** sha256 of the `.tgz` as written in index.yaml. */
  readonly digest: string;
}

/** A helm chart repository on the static HTTP server. */
export interface HelmRepo {
  /** Repository URL (what `helm repo add` and vendir's `helmChart.repository.url` take), no trailing slash. */
  readonly url: string;
  /** Every chart version in its index.yaml. */
  readonly charts: readonly HelmChartEntry[];
}

/**
 * Packages chart dirs with the real `helm package` into `<root>/<repoPath>/` on the static
 * HTTP server and (re)writes its index with `helm repo index --url`.
 * @param chartDirs chart source dirs, e.g. `fixturePath('podinfo/charts/podinfo')`.
 * @param opts.repoPath folder of the repo under the server root; default `charts`.
 * @throws Error when helm fails (e.g. an invalid chart).
 */
export async function buildHelmRepo(
  http: HttpServerInfo,
  chartDirs: readonly string[],
  opts: { repoPath?: string } = {},
): Promise<HelmRepo> {
  const repoPath = opts.repoPath ?? 'charts';
  assertRelative(repoPath);
  const outDir = path.join(http.root, ...repoPath.split('/'));
  const url = `${http.baseUrl}/${repoPath}`;
  await mkdir(outDir, { recursive: true });
  const home = await makeTempDir('helm');
  try {
    const env = toolEnv({ home });
    const helm = toolBin('helm');
    for (const dir of chartDirs) await run([helm, 'package', dir, '--destination', outDir], { env });
    await run([helm, 'repo', 'index', outDir, '--url', url], { env });
  } finally {
    await removeTempDir(home);
  }
  const index = parseYaml(await readFile(path.join(outDir, 'index.yaml'), 'utf8')) as {
    entries?: Record<string, { name: string; version: string; urls: string[]; digest: string }[]>;
  };
  const charts = Object.values(index.entries ?? {})
    .flat()
    .map((e) => ({ name: e.name, version: e.version, url: e.urls[0] ?? '', digest: e.digest }));
  return { url, charts };
}

// -------------------------------------------------------------------------------- imgpkg

/** A bundle pushed by {@link pushBundle}. */
export interface PushedBundle {
  /** The tag ref pushed, `<host>/<repo>:<tag>`. */
  readonly ref: string;
  /** Digest ref, `<host>/<repo>@sha256:<hex>`. */
  readonly digestRef: string;
  /** `sha256:<hex>` of the bundle image manifest. */
  readonly digest: string;
}

/**
 * Empty ImagesLock, for bundles that reference no images, byte for byte as imgpkg itself
 * writes one (`imgpkg pull` rewrites `.imgpkg/images.yml` into this form when every image of
 * the lock, here none, is found in the bundle's repository).
 */
export const EMPTY_IMAGES_LOCK = '---\napiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n';

/**
 * An `ImagesLock` (`.imgpkg/images.yml`) mapping each original ref (its `kbld.carvel.dev/id`) to
 * where the image now is, as `imgpkg copy` writes one for a relocated bundle: kbld rewrites the
 * original to the location without asking any registry.
 */
export function imagesLock(entries: readonly { id: string; image: string }[]): string {
  return stringifyYaml({
    apiVersion: 'imgpkg.carvel.dev/v1alpha1',
    kind: 'ImagesLock',
    images: entries.map((e) => ({ image: e.image, annotations: { 'kbld.carvel.dev/id': e.id } })),
  });
}

/** imgpkg's credentials for `registry` (`IMGPKG_REGISTRY_*`) when it has an account, else none. */
function registryAuthEnv(registry: RegistryInfo): NodeJS.ProcessEnv {
  const { auth } = registry;
  return auth
    ? {
        IMGPKG_REGISTRY_HOSTNAME: registry.host,
        IMGPKG_REGISTRY_USERNAME: auth.username,
        IMGPKG_REGISTRY_PASSWORD: auth.password,
      }
    : {};
}

/**
 * Pushes a source as an imgpkg bundle with the real `imgpkg push -b` to the registry (plain
 * HTTP, which imgpkg uses for 127.0.0.1 without flags). When the source has no
 * `.imgpkg/images.yml`, `imagesLock` (default {@link EMPTY_IMAGES_LOCK}) is added; when it has
 * no `.imgpkg/bundle.yml`, none is added (imgpkg does not require it).
 * @param repoTag `<repo>:<tag>` inside the registry, e.g. `simple-app-bundle:v1.0.0`.
 * @throws Error when imgpkg fails.
 */
export async function pushBundle(
  registry: RegistryInfo,
  repoTag: string,
  source: FixtureSource,
  opts: { imagesLock?: string } = {},
): Promise<PushedBundle> {
  assertRepoTag(repoTag);
  const tmp = await makeTempDir('bundle');
  try {
    const dir = await materialize(source, path.join(tmp, 'bundle'));
    const lock = path.join(dir, '.imgpkg', 'images.yml');
    if (!existsSync(lock)) {
      await mkdir(path.dirname(lock), { recursive: true });
      await writeFile(lock, opts.imagesLock ?? EMPTY_IMAGES_LOCK);
    }
    const ref = `${registry.host}/${repoTag}`;
    const lockOut = path.join(tmp, 'bundle-lock.yml');
    await run([toolBin('imgpkg'), 'push', '--tty=false', '-b', ref, '-f', dir, '--lock-output', lockOut], {
      env: toolEnv({ home: tmp, extra: registryAuthEnv(registry) }),
    });
    const bundleLock = parseYaml(await readFile(lockOut, 'utf8')) as { bundle?: { image?: string } };
    const digestRef = bundleLock.bundle?.image ?? '';
    const digest = digestRef.slice(digestRef.indexOf('@') + 1);
    if (!digest.startsWith('sha256:')) throw new Error(`imgpkg push ${ref}: no digest in lock output`);
    return { ref, digestRef, digest };
  } finally {
    await removeTempDir(tmp);
  }
}

/** @throws Error unless `repoTag` is `<repo>:<tag>` in the registry's lower-case syntax. */
function assertRepoTag(repoTag: string): void {
  if (!/^[a-z0-9][a-z0-9._/-]*:[\w][\w.-]{0,127}$/.test(repoTag)) throw new Error(`bad repo:tag ${repoTag}`);
}

/**
 * Pushes `source` as a plain image (`imgpkg push -i`, one layer holding the files; not a
 * bundle: no `.imgpkg/`), what an App's `fetch[].image` pulls.
 * @param repoTag - `<repo>:<tag>` under the registry, e.g. `e2e/plain:v1`
 * @returns the tag and digest references
 * @throws Error when imgpkg fails
 */
export async function pushImage(registry: RegistryInfo, repoTag: string, source: FixtureSource): Promise<PushedBundle> {
  assertRepoTag(repoTag);
  const tmp = await makeTempDir('image');
  try {
    const dir = await materialize(source, path.join(tmp, 'image'));
    const ref = `${registry.host}/${repoTag}`;
    // imgpkg writes no lock file for a plain image; its output names the pushed digest
    // (`Pushed '<repo>@sha256:<hex>'`), printed only with `--tty=true`.
    const res = await run([toolBin('imgpkg'), 'push', '--tty=true', '-i', ref, '-f', dir], {
      env: toolEnv({ home: tmp, extra: registryAuthEnv(registry) }),
    });
    const digest = /@(sha256:[0-9a-f]{64})/.exec(res.stdout)?.[1] ?? '';
    const digestRef = `${ref.slice(0, ref.lastIndexOf(':'))}@${digest}`;
    if (!digest) throw new Error(`imgpkg push ${ref}: no digest in its output`);
    return { ref, digestRef, digest };
  } finally {
    await removeTempDir(tmp);
  }
}

/**
 * Packages a chart dir with the real `helm package` and pushes it to the registry as an OCI
 * artifact (`helm push <tgz> oci://<host>/<repoPath> --plain-http`): the chart is then
 * `oci://<host>/<repoPath>/<chart name>`, what `helmChart.repository.url: oci://<host>/<repoPath>`
 * fetches.
 * @returns the repository URL (`oci://<host>/<repoPath>`)
 * @throws Error when helm fails
 */
export async function pushHelmChartOci(registry: RegistryInfo, chartDir: string, repoPath: string): Promise<string> {
  assertRelative(repoPath);
  const home = await makeTempDir('helm-oci');
  try {
    const env = toolEnv({ home });
    const helm = toolBin('helm');
    const out = path.join(home, 'out');
    await mkdir(out);
    await run([helm, 'package', chartDir, '--destination', out], { env });
    const [tgz] = await readdir(out);
    if (!tgz) throw new Error(`helm package ${chartDir}: no chart written`);
    const url = `oci://${registry.host}/${repoPath}`;
    await run([helm, 'push', path.join(out, tgz), url, '--plain-http'], { env });
    return url;
  } finally {
    await removeTempDir(home);
  }
}

/**
 * A self-signed certificate (RSA 2048, valid one day) for the DNS name `name`, made with openssl
 * (argv only) as `tls.key` and `tls.crt` in `dir`: for test TLS servers that clients reach by
 * that name (and trust through `caCerts`, or skip verifying).
 * @returns the PEM key and certificate
 * @throws the openssl error
 */
export async function selfSignedCert(dir: string, name: string): Promise<{ key: string; cert: string }> {
  const key = path.join(dir, 'tls.key');
  const cert = path.join(dir, 'tls.crt');
  await promisify(execFile)('openssl', [
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '1',
    '-subj',
    `/CN=${name}`,
    '-addext',
    `subjectAltName=DNS:${name}`,
    '-keyout',
    key,
    '-out',
    cert,
  ]);
  return { key: await readFile(key, 'utf8'), cert: await readFile(cert, 'utf8') };
}
