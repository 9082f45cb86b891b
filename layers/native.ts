/**
 * Builds the runtime's one native piece, `layers/native/harden.c` (a Node-API addon that makes
 * the runtime process non-dumpable; see `functions/lib/exec/harden.ts`), with the machine's C
 * compiler against the running Node's headers. Node-API is ABI-stable, so one build serves
 * every Node version from 20 on, and it links only libc (`prctl`), so the Debian-built file
 * loads on Lambda's Amazon Linux 2023 as well. Cached by source hash and architecture.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { cacheRoot } from './gobuild.js';

const SOURCE = fileURLToPath(new URL('./native/harden.c', import.meta.url));
const LAUNCH_SOURCE = fileURLToPath(new URL('./native/launch.c', import.meta.url));

/** Name of the tool launcher (`layers/native/launch.c`) in a layer's `bin/`. */
export const LAUNCHER_NAME = 'kl-launch';

/**
 * Name of the egress connector (`layers/native/connect.c`): git's `GIT_PROXY_COMMAND` for
 * `git://` and, installed a second time as `ssh`, the wrapper that sends ssh through the egress
 * proxy (`functions/lib/fetch/egress-proxy.ts`).
 */
export const CONNECTOR_NAME = 'kl-connect';

/** File name of the addon inside a Lambda layer's `lib/` (mounted at `/opt/lib`). */
export const HARDEN_ADDON_NAME = 'kapp-lambda-harden.node';

/**
 * Where the addon for this source and architecture is cached.
 *
 * @param root - cache root (default `~/.cache/kapp-lambda`)
 */
export function hardenAddonPath(root = cacheRoot()): string {
  const hash = createHash('sha256').update(readFileSync(SOURCE)).update(process.arch).digest('hex').slice(0, 10);
  return path.join(root, 'native', `harden-${process.arch}-${hash}.node`);
}

/**
 * Compiles the addon unless it is cached.
 *
 * @param log - progress lines
 * @param root - cache root
 * @returns the addon's path
 * @throws Error naming what is missing when the C compiler or Node's headers are absent
 */
export function buildHardenAddon(log: (m: string) => void, root = cacheRoot()): string {
  const out = hardenAddonPath(root);
  if (existsSync(out)) return out;
  const include = path.resolve(path.dirname(process.execPath), '..', 'include', 'node');
  if (!existsSync(path.join(include, 'node_api.h'))) {
    throw new Error(`native addon: Node's headers are missing (${include}/node_api.h); install Node with its headers`);
  }
  mkdirSync(path.dirname(out), { recursive: true });
  const tmp = `${out}.${process.pid}.tmp`;
  log('harden addon: compiling layers/native/harden.c');
  try {
    execFileSync('gcc', ['-shared', '-fPIC', '-O2', '-Wall', '-Werror', '-I', include, '-o', tmp, SOURCE], {
      stdio: ['ignore', 'inherit', 'inherit'],
    });
  } catch (err) {
    throw new Error(`native addon: gcc failed (${(err as Error).message}); a C compiler (Debian gcc) is needed`);
  }
  renameSync(tmp, out);
  return out;
}

function sourceKey(...files: string[]): string {
  const hash = createHash('sha256');
  for (const file of files) hash.update(readFileSync(file));
  return hash.update(process.arch).digest('hex').slice(0, 10);
}

/** A static executable built from one C file of `layers/native/`. */
interface StaticProgram {
  /** The file name in a layer. */
  readonly name: string;
  /** Absolute path of its C source. */
  readonly source: string;
  /** Other sources built with it, part of its cache key. */
  readonly companions?: readonly string[];
}

/** The tool launcher (`launch.c`). */
const LAUNCHER: StaticProgram = { name: LAUNCHER_NAME, source: LAUNCH_SOURCE };

/** The git launcher (`git-launch.c`, see `./git.ts`). */
const GIT_LAUNCHER: StaticProgram = {
  name: 'kl-git',
  source: fileURLToPath(new URL('./native/git-launch.c', import.meta.url)),
};

/**
 * File name of the passwd shim (`layers/native/passwd.c`) the connector's `ssh` wrapper preloads
 * into ssh from its own directory: a passwd entry for a tool uid `/etc/passwd` does not list, and
 * the run's `HOME` as ssh's home.
 */
export const SSH_PASSWD_NAME = 'kl-passwd.so';

const PASSWD_SOURCE = fileURLToPath(new URL('./native/passwd.c', import.meta.url));

/** The egress connector (`connect.c`), built with the passwd shim it preloads into ssh. */
const CONNECTOR: StaticProgram = {
  name: CONNECTOR_NAME,
  source: fileURLToPath(new URL('./native/connect.c', import.meta.url)),
  companions: [PASSWD_SOURCE],
};

function staticPath(program: StaticProgram, root: string): string {
  return path.join(
    root,
    'native',
    `${program.name}-${process.arch}-${sourceKey(program.source, ...(program.companions ?? []))}`,
  );
}

/** Compiles a static program unless it is cached. @throws Error when the C compiler fails. */
function buildStatic(program: StaticProgram, log: (m: string) => void, root: string): string {
  const out = staticPath(program, root);
  if (existsSync(out)) return out;
  mkdirSync(path.dirname(out), { recursive: true });
  const tmp = `${out}.${process.pid}.tmp`;
  log(`${program.name}: compiling layers/native/${path.basename(program.source)}`);
  try {
    execFileSync('gcc', ['-static', '-O2', '-Wall', '-Werror', '-o', tmp, program.source], {
      stdio: ['ignore', 'inherit', 'inherit'],
    });
  } catch (err) {
    throw new Error(`${program.name}: gcc failed (${(err as Error).message}); a C compiler (Debian gcc) is needed`);
  }
  renameSync(tmp, out);
  return out;
}

/**
 * Where the tool launcher for this source and architecture is cached.
 *
 * @param root - cache root (default `~/.cache/kapp-lambda`)
 */
export function launcherPath(root = cacheRoot()): string {
  return staticPath(LAUNCHER, root);
}

/**
 * Compiles the tool launcher (`functions/lib/exec/runner.ts` `launcher`) unless it is cached:
 * a static executable, so the same file runs on Lambda.
 *
 * @param log - progress lines
 * @param root - cache root
 * @returns the launcher's path
 * @throws Error when the C compiler fails
 */
export function buildLauncher(log: (m: string) => void, root = cacheRoot()): string {
  return buildStatic(LAUNCHER, log, root);
}

/**
 * Compiles the git launcher (`layers/native/git-launch.c`: runs a layer's git with the layer's
 * own loader and libraries, from wherever the layer is) unless it is cached; static.
 *
 * @param log - progress lines
 * @param root - cache root
 * @returns the launcher's path
 * @throws Error when the C compiler fails
 */
export function buildGitLauncher(log: (m: string) => void, root = cacheRoot()): string {
  return buildStatic(GIT_LAUNCHER, log, root);
}

/**
 * Where the egress connector for this source and architecture is cached: `kl-connect` in a
 * directory of its own that also holds it as `ssh` (the runner puts that directory on the tools'
 * `PATH` ahead of the system's, so vendir's `GIT_SSH_COMMAND=ssh ...` starts the wrapper) and
 * the passwd shim {@link SSH_PASSWD_NAME} the wrapper preloads into ssh.
 *
 * @param root - cache root (default `~/.cache/kapp-lambda`)
 */
export function connectorPath(root = cacheRoot()): string {
  return path.join(`${staticPath(CONNECTOR, root)}.d`, CONNECTOR_NAME);
}

/**
 * Compiles the egress connector unless it is cached, and lays out {@link connectorPath}'s
 * directory (`kl-connect` and `ssh`, the same static file, static so it runs on Lambda too;
 * and {@link SSH_PASSWD_NAME}, a shared object linking only libc).
 *
 * @param log - progress lines
 * @param root - cache root
 * @returns the connector's path
 * @throws Error when the C compiler fails
 */
export function buildConnector(log: (m: string) => void, root = cacheRoot()): string {
  const out = connectorPath(root);
  const dir = path.dirname(out);
  if ([CONNECTOR_NAME, 'ssh', SSH_PASSWD_NAME].every((name) => existsSync(path.join(dir, name)))) return out;
  const built = buildStatic(CONNECTOR, log, root);
  mkdirSync(dir, { recursive: true });
  const shim = path.join(dir, SSH_PASSWD_NAME);
  const shimTmp = `${shim}.${process.pid}.tmp`;
  log(`${SSH_PASSWD_NAME}: compiling layers/native/passwd.c`);
  try {
    execFileSync('gcc', ['-shared', '-fPIC', '-O2', '-Wall', '-Werror', '-o', shimTmp, PASSWD_SOURCE], {
      stdio: ['ignore', 'inherit', 'inherit'],
    });
  } catch (err) {
    throw new Error(`${SSH_PASSWD_NAME}: gcc failed (${(err as Error).message}); a C compiler (Debian gcc) is needed`);
  }
  chmodSync(shimTmp, 0o755);
  renameSync(shimTmp, shim);
  for (const name of [CONNECTOR_NAME, 'ssh']) {
    const dest = path.join(path.dirname(out), name);
    const tmp = `${dest}.${process.pid}.tmp`;
    copyFileSync(built, tmp);
    chmodSync(tmp, 0o755);
    renameSync(tmp, dest);
  }
  return out;
}
