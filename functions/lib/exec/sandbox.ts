/**
 * Per-run isolation of tool processes (docs/decisions.md D1: tenants are hostile, so no run
 * sees what another run left or holds).
 *
 * - Every run gets its own directory (`<tmp>/run-XXXXXX/{home,tmp,cache,config,data}`) that is
 *   its `HOME`, `TMPDIR` and XDG directories, removed when the run ends: a `.gitconfig`,
 *   `.docker/config.json` or helm plugin planted by one App's run is never seen by another.
 * - When the runtime is root (the embedded default in a container, the test machine), each
 *   concurrent run also gets its own unprivileged uid from a pool, so a tool cannot read the
 *   runtime's memory or `/proc/<pid>/environ` (mode 0400, owned by root), the kubeconfig or the
 *   object store (0600/0700, owned by root), nor the files of another run in flight. kapp-controller
 *   gets part of this from its credential-less sidecar; a uid per run is stricter (runs of
 *   different Apps cannot see each other either). A uid goes back to the pool only once no
 *   process runs under it (`./uid-leases.ts`).
 * - Handing a directory to a run changes owners with `lchown` and never follows a symlink or
 *   touches a file with more than one link, so fetched content cannot make the runtime give a
 *   run ownership of a file outside its directory.
 *
 * On AWS Lambda the function is not root and cannot change uid: the run directory still
 * isolates runs, and docs/security.md ("Known gaps") says what a tool run can reach there.
 *
 * @module
 */
import { chmodSync, copyFileSync, constants as fsc, linkSync, mkdirSync, rmSync, statSync } from 'node:fs';
import { lchown, lstat, mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

/** A pool of uids tool runs are spread over (one per run in flight). */
export interface UidPool {
  /** First uid (and gid) of the pool. */
  first: number;
  /** How many runs may hold a uid at once; a run beyond that waits for one. */
  size: number;
}

/**
 * Default pool: 64 uids from 910000, far above the ranges distributions hand out (system users
 * below 1000, regular users below 60000, subuid ranges usually from 100000 in blocks of 65536 per
 * user, so 910000 only collides on hosts with more than 12 delegated users).
 */
export const DEFAULT_UID_POOL: UidPool = Object.freeze({ first: 910_000, size: 64 });

/** Whether this process can run tools under other uids (it is root). */
export function canSwitchUid(): boolean {
  return typeof process.getuid === 'function' && process.getuid() === 0;
}

/** The name prefix of a run's directory under the runner's temp directory (`run-XXXXXX`). */
export const RUN_DIR_PREFIX = 'run-';

/** The private directories of one run. */
export interface RunDirs {
  /** The run's root, removed by {@link removeRunDirs}. */
  root: string;
  /** `HOME`, the default working directory, `TMPDIR` and the XDG directories. */
  env: Record<'HOME' | 'TMPDIR' | 'XDG_CACHE_HOME' | 'XDG_CONFIG_HOME' | 'XDG_DATA_HOME', string>;
}

/**
 * Creates a run's private directories under `parent` (mode 0700, owned by `uid` when given).
 *
 * @param parent - where run directories live (the runner's temp directory)
 * @param uid - the run's uid when runs are switched to one
 */
export async function makeRunDirs(parent: string, uid?: number): Promise<RunDirs> {
  await mkdir(parent, { recursive: true });
  const root = await mkdtemp(path.join(parent, RUN_DIR_PREFIX));
  const env = {
    HOME: path.join(root, 'home'),
    TMPDIR: path.join(root, 'tmp'),
    XDG_CACHE_HOME: path.join(root, 'cache'),
    XDG_CONFIG_HOME: path.join(root, 'config'),
    XDG_DATA_HOME: path.join(root, 'data'),
  };
  for (const dir of Object.values(env)) await mkdir(dir, { mode: 0o700 });
  if (uid !== undefined) await handOver(root, uid);
  return { root, env };
}

/** Removes a run's directories; never throws (a leftover must not fail the run). */
export async function removeRunDirs(dirs: RunDirs): Promise<void> {
  await rm(dirs.root, { recursive: true, force: true }).catch(() => undefined);
}

/**
 * Gives `uid` (and the same gid) ownership of `dir` and everything below it, so a run under
 * that uid may read and write there. Symlinks are re-owned themselves (`lchown`), never
 * followed; regular files with more than one hard link are left alone (a hard link to a file
 * outside would otherwise hand that file over).
 *
 * @param dir - a directory the runtime created for the run (scratch or cache)
 * @param uid - the run's uid
 * @throws the file system error when `dir` itself cannot be re-owned
 */
export async function handOver(dir: string, uid: number): Promise<void> {
  const top = await lstat(dir);
  if (!top.isDirectory()) throw new Error(`handOver: ${dir} is not a directory`);
  await lchown(dir, uid, uid);
  // Entries of a directory are handed over in parallel (the file system calls queue on libuv's
  // thread pool): sequentially, a 1,000-file tree cost ~130 ms per tool run.
  const walk = async (d: string): Promise<void> => {
    const entries = await readdir(d, { withFileTypes: true });
    await Promise.all(
      entries.map(async (entry) => {
        const p = path.join(d, entry.name);
        if (entry.isDirectory()) {
          await lchown(p, uid, uid);
          await walk(p);
        } else if (entry.isSymbolicLink()) {
          await lchown(p, uid, uid);
        } else {
          const s = await lstat(p);
          if (s.isFile() && s.nlink > 1) return;
          if (s.uid === uid) return;
          await lchown(p, uid, uid);
        }
      }),
    );
  };
  await walk(dir);
}

/** The sticky bit (`S_ISVTX`, which `fs.constants` does not name): only an entry's owner may rename or remove it. */
const STICKY = 0o1000;

/**
 * Makes `dir` and its ancestors traversable (`o+x`, never `o+r`) so runs under other uids can
 * reach their directories inside it, changing only directories inside the OS temp directory
 * that lack the bit (the runtime's own `mkdtemp` roots). Those directories, the OS temp directory
 * included, also lose group and other write unless they are sticky (`/tmp`): a Pod's emptyDir
 * is 0777 without the sticky bit, where a run could rename the staged tools' directory away and
 * put its own binaries in its place for the next run of another App.
 *
 * @param dir - the runner's temp directory
 * @throws Error naming the first ancestor that cannot be traversed and may not be changed here
 */
export function ensureTraversable(dir: string): void {
  mkdirSync(dir, { recursive: true });
  const osTmp = path.resolve(tmpdir());
  let cur = path.resolve(dir);
  for (;;) {
    let mode = statSync(cur).mode & 0o7777;
    const inTmp = cur === osTmp || cur.startsWith(`${osTmp}/`);
    if (inTmp && (mode & 0o022) !== 0 && (mode & STICKY) === 0) {
      mode &= ~0o022;
      chmodSync(cur, mode);
    }
    if ((mode & fsc.S_IXOTH) === 0) {
      if (!inTmp || cur === osTmp) {
        throw new Error(
          `tool sandbox: ${cur} is not traversable by other users; use a temp root under ${osTmp} or run without uid isolation`,
        );
      }
      chmodSync(cur, mode | fsc.S_IXOTH);
    }
    const parent = path.dirname(cur);
    if (parent === cur) return;
    cur = parent;
  }
}

/**
 * Places the runtime's tool binaries where a run under another uid can execute them (the Go
 * build cache sits in root's 0700 home): hard links (a copy across file systems) in `dir`,
 * mode 0755.
 *
 * @param names - the allowed tool names
 * @param resolveBin - where each binary is now
 * @param dir - the directory to stage into (created; must be traversable)
 * @returns a resolver to the staged binaries; names that did not resolve stay unresolvable
 */
export function stageBinaries(
  names: readonly string[],
  resolveBin: (name: string) => string,
  dir: string,
): (name: string) => string {
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  chmodSync(dir, 0o755);
  const staged = new Map<string, string>();
  for (const name of names) {
    let src: string;
    try {
      src = resolveBin(name);
    } catch {
      continue;
    }
    const dest = path.join(dir, name);
    rmSync(dest, { force: true });
    try {
      linkSync(src, dest);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') continue;
      copyFileSync(src, dest);
    }
    chmodSync(dest, 0o755);
    staged.set(name, dest);
  }
  return (name) => {
    const p = staged.get(name);
    if (p === undefined) throw new Error(`unknown tool ${name}`);
    return p;
  };
}
