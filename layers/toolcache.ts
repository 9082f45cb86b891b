/**
 * The built tool cache shared through an OCI registry: a team builds the pinned Go components
 * once (`npm run setup -- --push-cache <registry/repo>`) and every laptop, CI runner and deploy
 * host pulls them (`--pull-cache <registry/repo>` or `KAPP_LAMBDA_TOOL_CACHE_REGISTRY`) instead
 * of compiling for an hour.
 *
 * One image per component, tagged with its cache key and the platform
 * (`<name>-<version>-<recipe hash>-<os>-<arch>`, {@link toolCacheTag}): a changed pin or build
 * recipe names a new tag, so a stale image is never pulled for it. The image holds the binaries
 * and {@link SUMS_FILE} (`sha256sum` format). The project's patched imgpkg (from the cache,
 * `layers/gobuild.ts` `patchImgpkgLayerPaths`) pushes and pulls, so any registry and any
 * credential imgpkg reads (`~/.docker/config.json`, `IMGPKG_REGISTRY_*`) work;
 * go-containerregistry checks each layer against the manifest's digest.
 *
 * Trust comes from the repository, not the registry: the sums file comes inside the same image,
 * so whoever can write the registry can forge both. A push records each tag's binaries' sha256
 * in the committed lock file ({@link DEFAULT_TOOL_CACHE_LOCK}, {@link ToolCacheLock}); a pull is
 * attempted only for a tag the lock lists, and a pulled binary is run (its version check) only
 * after the set of files is exactly the component's binaries and each one's sha256 is the one
 * the lock records. A pull that fails a check is removed and the component is built instead.
 * imgpkg writes into a private directory of the pull's own: what it does to a hostile layer
 * before those checks (a whiteout entry removes the output's parent) stays inside it.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import { createReadStream, existsSync } from 'node:fs';
import { copyFile, link, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { binDir, cacheRoot, componentKey, type Progress, run, verifyVersions } from './gobuild.js';
import type { GoComponent } from './manifest.js';

/** Name of the checksum file inside each pushed image: `<sha256 hex>  <binary>` lines. */
export const SUMS_FILE = '.kapp-lambda-sha256sums';

/** Go's name of the machine (`amd64`, `arm64`) for Node's `process.arch`. */
function goArch(arch: string): string {
  return arch === 'x64' ? 'amd64' : arch === 'ia32' ? '386' : arch;
}

/**
 * The registry tag of a component's image: its cache key (`componentKey`) and the platform the
 * binaries run on, e.g. `age-v1.2.1-7311fcb298-linux-amd64`. A valid OCI tag (at most 128 of
 * `[A-Za-z0-9_.-]`).
 */
export function toolCacheTag(c: GoComponent, platform = process.platform, arch = process.arch): string {
  return `${componentKey(c)}-${platform}-${goArch(arch)}`;
}

/** sha256 of a file, hex. */
async function sha256File(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(file)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** The sha256 (hex) of each binary of a component in a directory: binary name → digest. */
export async function binarySums(c: GoComponent, dir: string): Promise<Record<string, string>> {
  const sums: Record<string, string> = {};
  for (const b of c.binaries) sums[b.bin] = await sha256File(path.join(dir, b.bin));
  return sums;
}

/** The {@link SUMS_FILE} text of a component's {@link binarySums}. */
function sumsText(sums: Record<string, string>): string {
  return `${Object.entries(sums)
    .map(([bin, sum]) => `${sum}  ${bin}`)
    .join('\n')}\n`;
}

/** The {@link SUMS_FILE} text of a directory holding a component's binaries. */
export async function sumsOf(c: GoComponent, dir: string): Promise<string> {
  return sumsText(await binarySums(c, dir));
}

/**
 * Checks a pulled directory before anything in it is run: it holds exactly the component's
 * binaries and {@link SUMS_FILE}, and each binary's sha256 is the one the sums file records.
 * @throws Error naming the first file that is missing, unexpected or does not match.
 */
export async function verifyPulled(c: GoComponent, dir: string): Promise<void> {
  const sumsPath = path.join(dir, SUMS_FILE);
  if (!existsSync(sumsPath)) throw new Error(`${c.name}: pulled image has no ${SUMS_FILE}`);
  const recorded = new Map<string, string>();
  for (const line of (await readFile(sumsPath, 'utf8')).split('\n')) {
    const m = /^([0-9a-f]{64}) {2}(\S+)$/.exec(line);
    if (m?.[1] && m[2]) recorded.set(m[2], m[1]);
  }
  const expected = new Set(c.binaries.map((b) => b.bin));
  for (const f of await readdir(dir)) {
    if (f !== SUMS_FILE && !expected.has(f)) throw new Error(`${c.name}: pulled image holds unexpected ${f}`);
  }
  for (const bin of expected) {
    const want = recorded.get(bin);
    if (!want) throw new Error(`${c.name}: ${SUMS_FILE} records no digest for ${bin}`);
    if (!existsSync(path.join(dir, bin))) throw new Error(`${c.name}: pulled image has no ${bin}`);
    const got = await sha256File(path.join(dir, bin));
    if (got !== want) throw new Error(`${c.name}: ${bin} has sha256 ${got}, ${SUMS_FILE} records ${want}`);
  }
}

/**
 * The committed record of what a team pushed: for each image tag ({@link toolCacheTag}), the
 * sha256 (hex) of each of the component's binaries, as the pusher built them. Builds are not
 * reproducible bit for bit, so the lock holds the pusher's digests, not ones anybody could
 * recompute; a machine pulls only what it lists.
 */
export interface ToolCacheLock {
  /** Format version; 1. */
  version: 1;
  /** Tag → binary name → sha256 hex. */
  images: Record<string, Record<string, string>>;
}

/** The lock file in the checkout, `layers/toolcache.lock.json`; `KAPP_LAMBDA_TOOL_CACHE_LOCK` overrides it. */
export const DEFAULT_TOOL_CACHE_LOCK = fileURLToPath(new URL('./toolcache.lock.json', import.meta.url));

/**
 * Reads a lock file; a missing file is an empty lock (nothing is pulled).
 * @throws Error when the file is not a version 1 lock or a digest is not 64 lowercase hex digits
 */
export async function readToolCacheLock(file: string): Promise<ToolCacheLock> {
  if (!existsSync(file)) return { version: 1, images: {} };
  const parsed = JSON.parse(await readFile(file, 'utf8')) as Partial<ToolCacheLock>;
  if (parsed.version !== 1 || typeof parsed.images !== 'object' || parsed.images === null) {
    throw new Error(`${file}: not a version 1 tool cache lock`);
  }
  for (const [tag, sums] of Object.entries(parsed.images)) {
    for (const [bin, sum] of Object.entries(sums)) {
      if (!/^[0-9a-f]{64}$/.test(sum)) throw new Error(`${file}: ${tag} ${bin}: not a sha256: ${sum}`);
    }
  }
  return { version: 1, images: parsed.images };
}

/**
 * Writes a lock file with its tags and binaries sorted (a stable diff to commit), through a
 * temporary file renamed over it so an interrupted write leaves the old lock.
 */
export async function writeToolCacheLock(file: string, lock: ToolCacheLock): Promise<void> {
  const images: ToolCacheLock['images'] = {};
  for (const tag of Object.keys(lock.images).sort()) {
    const sums = lock.images[tag] ?? {};
    images[tag] = Object.fromEntries(
      Object.keys(sums)
        .sort()
        .map((b) => [b, sums[b] ?? '']),
    );
  }
  const tmp = `${file}.tmp-${process.pid}`;
  await writeFile(tmp, `${JSON.stringify({ version: 1, images }, null, 2)}\n`);
  await rename(tmp, file);
}

/**
 * Checks a pulled directory against the lock's entry for its tag: every binary of the component
 * has the sha256 the lock records. Run after {@link verifyPulled} (which refuses extra files) and
 * before anything in the directory runs.
 * @throws Error naming the first binary the lock does not record or whose sha256 differs
 */
export async function verifyLocked(c: GoComponent, dir: string, locked: Record<string, string>): Promise<void> {
  for (const b of c.binaries) {
    const want = locked[b.bin];
    if (!want) throw new Error(`${c.name}: the tool cache lock records no sha256 for ${b.bin}`);
    const got = await sha256File(path.join(dir, b.bin));
    if (got !== want) throw new Error(`${c.name}: ${b.bin} has sha256 ${got}, the tool cache lock records ${want}`);
  }
}

/** How a {@link ToolCache} reaches its registry. */
export interface ToolCacheOptions {
  /** `registry/repository` (no tag) holding one image per component. */
  repo: string;
  /** Path of the imgpkg binary that pushes and pulls. */
  imgpkg: string;
  /** Cache root the components go into; default `cacheRoot()`. */
  root?: string;
  /** Environment of imgpkg (its credentials); default `process.env`. */
  env?: NodeJS.ProcessEnv;
  /** The lock file pulls are checked against and pushes record into; default {@link DEFAULT_TOOL_CACHE_LOCK}. */
  lockFile?: string;
}

/** A registry repository of built components, with the tags it held when opened. */
export interface ToolCache {
  /** The tags the repository holds (read once, by {@link openToolCache}; pushes add theirs). */
  readonly tags: ReadonlySet<string>;
  /**
   * Pulls the component into the cache unless it is already complete there, the lock does not
   * list its tag or the repository has no image for it.
   * @returns `'pulled'`, `'local'` (already in the cache), `'unlocked'` (the lock does not list
   *   the tag: nothing is asked of the registry) or `'absent'` (no such tag)
   * @throws Error when the pull fails or the content does not verify against the lock (nothing
   *   is left in the cache, nothing pulled has run)
   */
  pull(c: GoComponent, progress: Progress): Promise<'pulled' | 'local' | 'unlocked' | 'absent'>;
  /**
   * Pushes the component's complete cache directory with its sums file and records its binaries'
   * sha256 in the lock file, unless the repository holds its tag and the lock lists it already.
   * A tag the repository holds but the lock does not is pushed over: what the lock records is
   * then what the tag holds.
   * @returns `'pushed'` or `'present'`
   * @throws Error when the component is not built, imgpkg fails or the lock cannot be written
   */
  push(c: GoComponent, progress: Progress): Promise<'pushed' | 'present'>;
}

/** Whether a component's cache directory is complete (the marker `buildComponent` writes, every binary). */
function isComplete(c: GoComponent, dir: string): boolean {
  return existsSync(path.join(dir, '.complete')) && c.binaries.every((b) => existsSync(path.join(dir, b.bin)));
}

/**
 * Lists the repository's tags (`imgpkg tag list`; a repository the registry does not know yet
 * has none) and returns the {@link ToolCache} over it.
 * @throws Error when imgpkg fails for another reason (unreachable registry, denied access)
 */
export async function openToolCache(opts: ToolCacheOptions): Promise<ToolCache> {
  const root = opts.root ?? cacheRoot();
  const env = opts.env ?? process.env;
  const lockFile = opts.lockFile ?? DEFAULT_TOOL_CACHE_LOCK;
  const lock = await readToolCacheLock(lockFile);
  const imgpkg = (args: string[]) => run([opts.imgpkg, ...args, '--tty=false'], { env });
  const tags = new Set<string>();
  try {
    // With --tty=false imgpkg prints one tag a line (--json would swallow the error text).
    const listed = await imgpkg(['tag', 'list', '-i', opts.repo]);
    for (const line of listed.stdout.split('\n')) if (line.trim()) tags.add(line.trim());
  } catch (e) {
    if (!/NAME_UNKNOWN/.test((e as Error).message)) {
      throw new Error(`list tool cache tags of ${opts.repo}`, { cause: e });
    }
  }
  return {
    tags,
    async pull(c, progress) {
      const out = binDir(c, root);
      if (isComplete(c, out)) return 'local';
      const tag = toolCacheTag(c);
      const locked = lock.images[tag];
      if (!locked) return 'unlocked';
      if (!tags.has(tag)) return 'absent';
      // Pulled into a fresh private directory of its own (`tmp/pull-<tag>-XXXXXX/out`), never
      // beside the cache's other components: imgpkg acts on a layer's entries before any check,
      // and a whiteout entry `.wh...` removes `<out>/..`, which is then this private parent, not
      // `bin/` with every component built so far. Only what the lock verified moves into place.
      const tmpRoot = path.join(root, 'tmp');
      await mkdir(tmpRoot, { recursive: true });
      const parent = await mkdtemp(path.join(tmpRoot, `pull-${tag}-`));
      const tmp = path.join(parent, 'out');
      try {
        progress(`${c.name} ${c.version}: pulling ${opts.repo}:${tag}`);
        await imgpkg(['pull', '-i', `${opts.repo}:${tag}`, '-o', tmp]);
        // The in-image sums only check the image's shape; the lock decides what may run.
        await verifyPulled(c, tmp);
        await verifyLocked(c, tmp, locked);
        await verifyVersions(c, tmp);
        await rm(path.join(tmp, SUMS_FILE));
        await rm(out, { recursive: true, force: true });
        await mkdir(path.dirname(out), { recursive: true });
        await rename(tmp, out);
        await writeFile(path.join(out, '.complete'), `${new Date().toISOString()} pulled ${opts.repo}:${tag}\n`);
      } catch (e) {
        throw new Error(`pull ${c.name} from ${opts.repo}:${tag}`, { cause: e });
      } finally {
        await rm(parent, { recursive: true, force: true });
      }
      return 'pulled';
    },
    async push(c, progress) {
      const tag = toolCacheTag(c);
      if (tags.has(tag) && lock.images[tag]) return 'present';
      const dir = binDir(c, root);
      if (!isComplete(c, dir)) throw new Error(`push ${c.name}: not built in ${dir}`);
      const stage = path.join(root, 'tmp', `push-${tag}-${process.pid}`);
      await rm(stage, { recursive: true, force: true });
      await mkdir(stage, { recursive: true });
      try {
        for (const b of c.binaries) {
          // A hard link costs nothing; another file system needs a copy.
          await link(path.join(dir, b.bin), path.join(stage, b.bin)).catch(() =>
            copyFile(path.join(dir, b.bin), path.join(stage, b.bin)),
          );
        }
        const sums = await binarySums(c, stage);
        await writeFile(path.join(stage, SUMS_FILE), sumsText(sums));
        progress(`${c.name} ${c.version}: pushing ${opts.repo}:${tag}`);
        await imgpkg(['push', '-i', `${opts.repo}:${tag}`, '-f', stage]);
        // Written after each push, so an interrupted setup keeps what it pushed.
        lock.images[tag] = sums;
        await writeToolCacheLock(lockFile, lock);
      } catch (e) {
        throw new Error(`push ${c.name} to ${opts.repo}:${tag}`, { cause: e });
      } finally {
        await rm(stage, { recursive: true, force: true });
      }
      tags.add(tag);
      return 'pushed';
    },
  };
}
