/**
 * A program that runs one command with the host's tool directories hidden, so a Lambda
 * function under the Runtime Interface Emulator finds only what its own layer carries (as in a
 * Lambda sandbox, whose image has no git, kubectl or Carvel tools). Run inside a private mount
 * namespace (`unshare --mount --propagation private`, root); mounts made here vanish with it.
 *
 * Usage: `node lambda-sandbox.mjs [--bind <src> <dst>]... [--hide <dir>]... [--keep <file>]... -- <cmd> [args...]`
 *
 * - `--bind`: bind-mounts the file or directory `src` onto `dst` (which must exist), before any
 *   hiding, e.g. the host's node binary to `<root>/var/lang/bin/node`, where Lambda's Node
 *   runtime keeps it;
 * - `--hide`: mounts an empty tmpfs over `dir` (e.g. `/usr/bin`, `/usr/local/bin`);
 * - `--keep`: a file of a hidden directory that stays (a copy of its content, read before the
 *   hiding), e.g. `/usr/bin/sh`: Lambda's image has `/bin/sh` (git's submodule script needs it),
 *   and on this machine `/bin` is `/usr/bin`;
 * - then starts `cmd` with this process's stdio and environment, passes SIGTERM and SIGINT on,
 *   and exits with its code (128 + signal number when a signal ended it).
 *
 * Exits 2 on a usage error and 126 when a mount fails (the mount tool's output on stderr).
 *
 * @module
 */
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { constants } from 'node:os';
import path from 'node:path';

/** The parsed arguments. */
interface SandboxArgs {
  binds: [string, string][];
  hide: string[];
  keep: string[];
  argv: string[];
}

function parse(args: readonly string[]): SandboxArgs {
  const out: SandboxArgs = { binds: [], hide: [], keep: [], argv: [] };
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '--') {
      out.argv = args.slice(i + 1);
      break;
    }
    if (a === '--bind' && args[i + 2] !== undefined) {
      out.binds.push([args[i + 1] as string, args[i + 2] as string]);
      i += 2;
    } else if (a === '--hide' && args[i + 1] !== undefined) {
      out.hide.push(args[i + 1] as string);
      i += 1;
    } else if (a === '--keep' && args[i + 1] !== undefined) {
      out.keep.push(args[i + 1] as string);
      i += 1;
    } else {
      throw new Error(`unexpected argument ${a}`);
    }
  }
  if (out.argv.length === 0) throw new Error('no command after --');
  return out;
}

let parsed: SandboxArgs;
try {
  parsed = parse(process.argv.slice(2));
} catch (err) {
  process.stderr.write(`lambda-sandbox: ${(err as Error).message}\n`);
  process.exit(2);
}
// Resolved before anything is hidden: `mount` lives in /usr/bin.
const MOUNT = '/usr/bin/mount';
try {
  // Read before anything is hidden (`readFileSync` follows `sh` → `dash`).
  const kept = parsed.keep.map((file) => ({ file, content: readFileSync(file) }));
  for (const [src, dst] of parsed.binds) execFileSync(MOUNT, ['--bind', src, dst], { stdio: 'inherit' });
  // The directory of `mount` itself last: once it is hidden, no mount can follow.
  const hide = [...parsed.hide].sort((a, b) => Number(MOUNT.startsWith(`${a}/`)) - Number(MOUNT.startsWith(`${b}/`)));
  for (const dir of hide) {
    const keep = kept.filter(({ file }) => path.dirname(file) === dir);
    // Writable only when a kept file goes in: `mount` may be hidden by now, so no remount.
    const mode = keep.length > 0 ? 'rw,size=4m' : 'ro,size=4k';
    execFileSync(MOUNT, ['-t', 'tmpfs', '-o', `${mode},mode=0755`, 'lambda-sandbox-hidden', dir], {
      stdio: 'inherit',
    });
    for (const { file, content } of keep) writeFileSync(file, content, { mode: 0o755 });
  }
} catch (err) {
  process.stderr.write(`lambda-sandbox: mount failed: ${(err as Error).message}\n`);
  process.exit(126);
}
const [cmd, ...rest] = parsed.argv;
const child = spawn(cmd as string, rest, { stdio: 'inherit' });
for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => child.kill(sig));
child.on('error', (err) => {
  process.stderr.write(`lambda-sandbox: ${cmd}: ${err.message}\n`);
  process.exit(127);
});
child.on('exit', (code, signal) => {
  process.exit(code ?? 128 + (signal ? constants.signals[signal] : 0));
});
