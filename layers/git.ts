/**
 * git for the Lambda layers of the functions that run vendir (fetch, index-repo): vendir execs
 * `git` from `PATH` for every `git` source, and the fleet source poll runs `git ls-remote`.
 *
 * Decision (docs/decisions.md D13): the machine's (Debian's) git, relocated into the layer with its
 * own loader and every library it links, started through a static launcher
 * (`layers/native/git-launch.c`, layout there). Not a container-image fetch function: the
 * other functions' zip + layer packaging, sizing and tests would fork in two, and an image
 * cold-starts slower. Not git built from source for Amazon Linux: there is no source or
 * toolchain for it here (git's HTTPS needs libcurl and a TLS stack built alike), and it would
 * be a second git beside the one the embedded runtime and the tests use. Not a git client in
 * the function feeding vendir a `directory` source: vendir's lock output (the commit, its tag
 * description and title in the App's status) and its ref, tag-selection, submodule, LFS and
 * auth handling would have to be rewritten. The relocated git is the same git the embedded
 * runtime runs, its loader and libraries never mix with Amazon Linux's (glibc 2.34 there, 2.36
 * here), and it runs from any directory, so a test can run it with `PATH` = the layer alone.
 *
 * Not carried: `ssh` (vendir's git sources with an SSH key run `ssh` through
 * `GIT_SSH_COMMAND`), git LFS. Those sources fail on Lambda with git's own error.
 *
 * @module
 */
import { execFileSync } from 'node:child_process';
import { chmod, copyFile, mkdir, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import type { Stage } from './manifest.js';
import { buildGitLauncher } from './native.js';
import { tool } from './tools.js';

/** The functions whose layer carries git (the ones that run vendir), from the tool table `./tools.ts`. */
export const GIT_LAYER_STAGES: readonly Stage[] = tool('git').stages;

/** The real executables taken from git's exec path. */
const GIT_EXECUTABLES = ['git', 'git-remote-http', 'git-sh-i18n--envsubst'] as const;

/**
 * git's shell helpers `git submodule update` needs (vendir runs it after every checkout; in
 * git 2.39 `git submodule` is still a script).
 */
const GIT_SCRIPTS = ['git-submodule', 'git-sh-setup', 'git-sh-i18n'] as const;

/**
 * The system commands those scripts run (from `/usr/bin`): carried too, so the layer needs
 * nothing of the Lambda OS but `/bin/sh`. git puts `GIT_EXEC_PATH` first on the scripts' `PATH`.
 */
const SCRIPT_COMMANDS = ['sed', 'basename', 'uname'] as const;

/** Names in `GIT_EXEC_PATH` that are the launcher: every real executable, and `git-remote-https`. */
const LAUNCHED_NAMES = [...GIT_EXECUTABLES, 'git-remote-https', ...SCRIPT_COMMANDS] as const;

/** What {@link addGitToLayer} put into a layer. */
export interface LayerGit {
  /** `git --version` of the git carried, e.g. `git version 2.39.5`. */
  version: string;
  /** Bytes added to the layer (executables, libraries, loader, launchers, scripts). */
  bytes: number;
  /** The libraries carried (file names in `git/lib/`), the loader as `ld.so`. */
  libraries: string[];
}

/**
 * The shared libraries and loader of an executable, from `ldd`: `[file name, path]` pairs, the
 * loader as `['ld.so', path]`.
 *
 * @throws Error naming a library `ldd` could not find.
 */
export function lddLibraries(lddOutput: string): [string, string][] {
  const out: [string, string][] = [];
  for (const line of lddOutput.split('\n')) {
    const t = line.trim();
    if (t === '' || t.startsWith('linux-vdso') || t.startsWith('linux-gate')) continue;
    const arrow = /^(\S+) => (\S+) \(0x[0-9a-f]+\)$/.exec(t);
    if (arrow?.[1] && arrow[2]) {
      out.push([arrow[1], arrow[2]]);
      continue;
    }
    if (/ => not found$/.test(t)) throw new Error(`git layer: ldd: ${t}`);
    const loader = /^(\/\S+) \(0x[0-9a-f]+\)$/.exec(t);
    if (loader?.[1]) out.push(['ld.so', loader[1]]);
  }
  return out;
}

async function copyExecutable(from: string, to: string): Promise<number> {
  await copyFile(from, to);
  await chmod(to, 0o755);
  return (await stat(to)).size;
}

/**
 * Adds git to a layer directory: `bin/git` (the launcher) and `git/` (layout in
 * `layers/native/git-launch.c`), from the machine's git (`git --exec-path`) and, for git's
 * submodule script, its `sed`, `basename` and `uname`.
 *
 * @param layerDir - the layer root (holds `bin/`).
 * @param log - progress lines.
 * @param root - cache root of the launcher build.
 * @returns what was added.
 * @throws Error when the machine has no git, `ldd` cannot resolve a library, or the launcher
 *   does not compile.
 */
export async function addGitToLayer(layerDir: string, log: (m: string) => void, root?: string): Promise<LayerGit> {
  const execPath = execFileSync('git', ['--exec-path'], { encoding: 'utf8' }).trim();
  const version = execFileSync('git', ['--version'], { encoding: 'utf8' }).trim();
  const launcher = buildGitLauncher(log, root);
  const gitDir = path.join(layerDir, 'git');
  const dirs = ['real', 'exec', 'lib', 'templates'].map((d) => path.join(gitDir, d));
  for (const d of [...dirs, path.join(layerDir, 'bin')]) await mkdir(d, { recursive: true });
  let bytes = 0;
  const libraries = new Map<string, string>();
  const sources = [
    ...GIT_EXECUTABLES.map((exe) => [exe, path.join(execPath, exe)] as const),
    ...SCRIPT_COMMANDS.map((cmd) => [cmd, path.join('/usr/bin', cmd)] as const),
  ];
  for (const [exe, from] of sources) {
    bytes += await copyExecutable(from, path.join(gitDir, 'real', exe));
    for (const [name, file] of lddLibraries(execFileSync('ldd', [from], { encoding: 'utf8' })))
      libraries.set(name, file);
  }
  for (const [name, file] of libraries) {
    bytes += await copyExecutable(await realpath(file), path.join(gitDir, 'lib', name));
  }
  for (const name of LAUNCHED_NAMES) bytes += await copyExecutable(launcher, path.join(gitDir, 'exec', name));
  for (const name of GIT_SCRIPTS)
    bytes += await copyExecutable(path.join(execPath, name), path.join(gitDir, 'exec', name));
  bytes += await copyExecutable(launcher, path.join(layerDir, 'bin', 'git'));
  log(`git layer: ${version}, ${libraries.size} libraries, ${(bytes / 1_048_576).toFixed(1)} MiB`);
  return { version, bytes, libraries: [...libraries.keys()].sort() };
}
