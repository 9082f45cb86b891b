/**
 * The real command runner against real processes (coreutils and dash): output, stdin, exit codes,
 * timeouts and cancellation that kill the whole process group, output bounds, the minimal
 * environment, streaming and metrics.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import {
  chmod,
  link,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  realpath,
  rm,
  stat,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { KAPP_ERROR_PREFIX } from '../../functions/lib/deploy/kapp.js';
import { createToolMetrics } from '../../functions/lib/exec/metrics.js';
import {
  CommandCanceledError,
  CommandExitError,
  type CommandRunner,
  CommandStartError,
  CommandTimeoutError,
  createCommandRunner,
  DEFAULT_SYSTEM_PATH,
  type OutputStream,
} from '../../functions/lib/exec/runner.js';
import { canSwitchUid, ensureTraversable } from '../../functions/lib/exec/sandbox.js';
import { attachError } from '../../functions/lib/reconcile/result.js';
import { TEMPLATING_DIR_ERROR_PREFIX } from '../../functions/lib/template/step.js';
import { hardenAddonPath, launcherPath } from '../../layers/native.js';

const BINS: Record<string, string> = {
  echo: '/bin/echo',
  cat: '/bin/cat',
  sleep: '/bin/sleep',
  sh: '/bin/sh',
  env: '/usr/bin/env',
  pwd: '/bin/pwd',
  missing: '/nonexistent/dir/missing-tool',
};

let scratch: string;
let runner: CommandRunner;
const metrics = createToolMetrics();

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'exec-test-')));
  runner = createCommandRunner({
    allow: Object.keys(BINS),
    resolveBin: (name) => {
      const p = BINS[name];
      if (p === undefined) throw new Error(`unknown tool ${name}`);
      return p;
    },
    home: scratch,
    tmpDir: scratch,
    metrics,
  });
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

/** Whether a pid is gone (or a zombie waiting to be reaped, which runs nothing). */
function isDead(pid: number): boolean {
  const stat = `/proc/${pid}/stat`;
  if (!existsSync(stat)) return true;
  try {
    const text = readFileSync(stat, 'utf8');
    return text.slice(text.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return true;
  }
}

describe('real command runner', () => {
  it('captures stdout of /bin/echo with exit code 0 and a duration', async () => {
    const r = await runner.run({ cmd: 'echo', args: ['hello', 'world'] });
    expect(r.stdout).toBe('hello world\n');
    expect(r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
    expect(r.error).toBeUndefined();
    expect(r.truncated).toEqual({ stdout: false, stderr: false });
    expect(r.durationMs).toBeGreaterThan(0);
  });

  it('passes argv without a shell', async () => {
    const r = await runner.run({ cmd: 'echo', args: ['$HOME', '`id`', 'a;b', '*'] });
    expect(r.stdout).toBe('$HOME `id` a;b *\n');
  });

  it('feeds stdin to /bin/cat, as text and as bytes', async () => {
    expect((await runner.run({ cmd: 'cat', args: [], stdin: 'kind: ConfigMap\n' })).stdout).toBe('kind: ConfigMap\n');
    const bytes = new TextEncoder().encode('é€\n');
    expect((await runner.run({ cmd: 'cat', args: ['-'], stdin: bytes })).stdout).toBe('é€\n');
  });

  it('gives /dev/null as stdin when none is passed', async () => {
    const r = await runner.run({ cmd: 'cat', args: [] });
    expect(r).toMatchObject({ stdout: '', exitCode: 0 });
  });

  it('tolerates a tool that exits without reading a large stdin', async () => {
    const r = await runner.run({ cmd: 'echo', args: ['done'], stdin: 'x'.repeat(8 * 1024 * 1024) });
    expect(r).toMatchObject({ stdout: 'done\n', exitCode: 0 });
  });

  it('reports a non-zero exit as a result with Go error text', async () => {
    const r = await runner.run({ cmd: 'sh', args: ['-c', 'echo out; echo err >&2; exit 3'] });
    expect(r).toMatchObject({ stdout: 'out\n', stderr: 'err\n', exitCode: 3 });
    expect(r.error).toBeInstanceOf(CommandExitError);
    expect(r.error?.message).toBe('exit status 3');

    const one = await runner.run({ cmd: 'sh', args: ['-c', 'echo "ytt: Error: boom" >&2; exit 1'] });
    expect(attachError(TEMPLATING_DIR_ERROR_PREFIX, one)).toEqual({
      stdout: '',
      stderr: 'ytt: Error: boom\n',
      exitCode: 1,
      error: 'Templating dir: Error (see .status.usefulErrorMessage for details)',
      finished: true,
    });
  });

  it('reports death by signal as signal: killed with exit code -1', async () => {
    const r = await runner.run({ cmd: 'sh', args: ['-c', 'kill -9 $$'] });
    expect(r.exitCode).toBe(-1);
    expect(r.error).toBeInstanceOf(CommandExitError);
    expect(r.error?.message).toBe('signal: killed');
  });

  it('kills /bin/sleep on timeout: exit code -1', async () => {
    const r = await runner.run({ cmd: 'sleep', args: ['30'], timeoutMs: 200 });
    expect(r.exitCode).toBe(-1);
    expect(r.error).toBeInstanceOf(CommandTimeoutError);
    expect(r.error?.message).toBe('Process timed out after 200ms');
    expect(r.durationMs).toBeGreaterThanOrEqual(150);
    expect(r.durationMs).toBeLessThan(10_000);
  });

  it('kills /bin/sleep on abort: Process was canceled, exit code -1, reason as cause', async () => {
    const ac = new AbortController();
    const reason = new Error('spec.canceled');
    setTimeout(() => ac.abort(reason), 200);
    const r = await runner.run({ cmd: 'sleep', args: ['30'], signal: ac.signal });
    expect(r.exitCode).toBe(-1);
    expect(r.error).toBeInstanceOf(CommandCanceledError);
    expect(r.error?.message).toBe('Process was canceled');
    expect(r.error?.cause).toBe(reason);
    expect(r.durationMs).toBeLessThan(10_000);
    expect(attachError(KAPP_ERROR_PREFIX.deploy, r).error).toBe('Deploying: Process was canceled');
  });

  it('runs nothing when the signal is already aborted', async () => {
    const ac = new AbortController();
    ac.abort();
    const r = await runner.run({ cmd: 'echo', args: ['never'], signal: ac.signal });
    expect(r).toMatchObject({ stdout: '', exitCode: -1, durationMs: 0 });
    expect(r.error?.message).toBe('Already canceled');
  });

  it('kills the whole process group on timeout, grandchildren included', async () => {
    const r = await runner.run({ cmd: 'sh', args: ['-c', 'sleep 30 & echo $!; wait'], timeoutMs: 300 });
    expect(r.error).toBeInstanceOf(CommandTimeoutError);
    const grandchild = Number.parseInt(r.stdout.trim(), 10);
    expect(grandchild).toBeGreaterThan(1);
    await vi.waitFor(() => expect(isDead(grandchild)).toBe(true), { timeout: 5_000, interval: 20 });
  });

  it('kills the whole process group on abort', async () => {
    const ac = new AbortController();
    let pid = 0;
    const r = await runner.run({
      cmd: 'sh',
      args: ['-c', 'sleep 30 & echo $!; wait'],
      signal: ac.signal,
      onOutput: (chunk) => {
        pid = Number.parseInt(chunk.trim(), 10);
        ac.abort();
      },
    });
    expect(r.error?.message).toBe('Process was canceled');
    expect(pid).toBeGreaterThan(1);
    await vi.waitFor(() => expect(isDead(pid)).toBe(true), { timeout: 5_000, interval: 20 });
  });

  it('with a kill grace, an abort sends SIGTERM first: a tool that handles it stops on its own', async () => {
    const ac = new AbortController();
    const r = await runner.run({
      cmd: 'sh',
      args: ['-c', "trap 'echo stopping; exit 3' TERM; echo ready; sleep 30 & wait"],
      signal: ac.signal,
      killGraceMs: 20_000,
      onOutput: (chunk) => {
        if (chunk.includes('ready')) ac.abort();
      },
    });
    expect(r.error?.message).toBe('Process was canceled');
    // The trap ran: SIGTERM came, not SIGKILL (the grace is far longer than the test waits).
    expect(r.stdout).toBe('ready\nstopping\n');
  });

  it('with a kill grace, a tool that ignores SIGTERM is killed when the grace ends', async () => {
    const ac = new AbortController();
    let pid = 0;
    const r = await runner.run({
      cmd: 'sh',
      args: ['-c', "trap '' TERM; sleep 30 & echo $!; wait"],
      signal: ac.signal,
      killGraceMs: 300,
      onOutput: (chunk) => {
        pid = Number.parseInt(chunk.trim(), 10);
        ac.abort();
      },
    });
    expect(r.error?.message).toBe('Process was canceled');
    expect(pid).toBeGreaterThan(1);
    await vi.waitFor(() => expect(isDead(pid)).toBe(true), { timeout: 5_000, interval: 20 });
  });

  it('does not hang on a background process left behind, and reaps it', async () => {
    const started = performance.now();
    const r = await runner.run({ cmd: 'sh', args: ['-c', 'sleep 30 & echo $!'] });
    expect(r.exitCode).toBe(0);
    expect(performance.now() - started).toBeLessThan(10_000);
    const pid = Number.parseInt(r.stdout.trim(), 10);
    await vi.waitFor(() => expect(isDead(pid)).toBe(true), { timeout: 5_000, interval: 20 });
  });

  it('ends a moment after the tool even when a process outside its group holds the output pipe', async () => {
    const r = await runner.run({
      cmd: 'sh',
      args: ['-c', `/usr/bin/setsid -f /bin/sh -c 'echo $$; exec /bin/sleep 30'; /bin/sleep 0.3; echo done`],
    });
    const pid = Number.parseInt(r.stdout, 10);
    try {
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toContain('done\n');
      // Without the close grace the run would wait for the 30 s sleep.
      expect(r.durationMs).toBeLessThan(20_000);
    } finally {
      if (pid > 1) process.kill(pid, 'SIGKILL');
    }
  }, 40_000);

  it('bounds output per stream, keeping the tail', async () => {
    const script = 'i=0; while [ $i -lt 5000 ]; do echo "line $i"; i=$((i+1)); done; echo END; echo e1 >&2';
    const r = await runner.run({ cmd: 'sh', args: ['-c', script], maxOutputBytes: 1000 });
    expect(r.exitCode).toBe(0);
    expect(Buffer.byteLength(r.stdout)).toBeLessThanOrEqual(1000);
    expect(Buffer.byteLength(r.stdout)).toBeGreaterThan(900);
    expect(r.stdout.endsWith('line 4999\nEND\n')).toBe(true);
    expect(r.truncated).toEqual({ stdout: true, stderr: false });
    expect(r.stderr).toBe('e1\n');
  });

  it('never splits a UTF-8 character at the bound', async () => {
    const r = await runner.run({ cmd: 'cat', args: [], stdin: 'é'.repeat(1000), maxOutputBytes: 101 });
    expect(r.stdout).toBe('é'.repeat(50));
    expect(r.truncated.stdout).toBe(true);
  });

  it('starts from a minimal environment plus explicit variables, never the parent one', async () => {
    const saved = { KUBECONFIG: process.env.KUBECONFIG, AWS_SECRET_ACCESS_KEY: process.env.AWS_SECRET_ACCESS_KEY };
    process.env.KUBECONFIG = '/parent/kubeconfig';
    process.env.AWS_SECRET_ACCESS_KEY = 'parent-secret';
    try {
      const r = await runner.run({ cmd: 'env', args: [], env: { FOO: 'bar' } });
      const vars = r.stdout.trim().split('\n').sort();
      const run = /^HOME=(.*)\/home$/m.exec(r.stdout)?.[1] ?? '';
      expect(path.dirname(run)).toBe(scratch);
      expect(path.basename(run)).toMatch(/^run-/);
      expect(vars).toEqual([
        'FOO=bar',
        `GIT_CEILING_DIRECTORIES=${scratch}`,
        `HOME=${run}/home`,
        `PATH=/bin:/usr/bin:/nonexistent/dir:${DEFAULT_SYSTEM_PATH}`,
        `TMPDIR=${run}/tmp`,
        `XDG_CACHE_HOME=${run}/cache`,
        `XDG_CONFIG_HOME=${run}/config`,
        `XDG_DATA_HOME=${run}/data`,
      ]);
      const kube = await runner.run({ cmd: 'env', args: [], env: { KUBECONFIG: '/run/kapp/kubeconfig' } });
      expect(kube.stdout).toContain('KUBECONFIG=/run/kapp/kubeconfig\n');
      expect(kube.stdout).not.toContain('AWS_');
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it('git run from a run directory never finds a repository planted in the temp root', async () => {
    const root = await realpath(await mkdtemp(path.join(tmpdir(), 'ceiling-')));
    try {
      // What an escaped tool could leave in Lambda's /tmp for a later invocation's git.
      execFileSync('git', ['init', '-q', root]);
      const opts = { allow: ['git'], resolveBin: () => '/usr/bin/git', tmpDir: root };
      const look = { cmd: 'git', args: ['rev-parse', '--absolute-git-dir'] };
      const planted = await createCommandRunner({
        ...opts,
        // The environment without the ceiling: the threat.
        baseEnv: { PATH: DEFAULT_SYSTEM_PATH, HOME: root, TMPDIR: root },
      }).run(look);
      expect(planted.stdout.trim()).toBe(path.join(root, '.git'));
      const r = await createCommandRunner(opts).run(look);
      expect(r.exitCode).toBe(128);
      expect(r.stderr).toContain('not a git repository');
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  it("runs in the given cwd, defaulting to the run's own HOME", async () => {
    expect((await runner.run({ cmd: 'pwd', args: [], cwd: '/' })).stdout).toBe('/\n');
    const r = await runner.run({ cmd: 'sh', args: ['-c', 'pwd; echo "$HOME"'] });
    const [cwd, home] = r.stdout.trim().split('\n');
    expect(cwd).toBe(home);
    expect(cwd?.startsWith(`${scratch}/run-`)).toBe(true);
  });

  it('gives every run its own HOME, temp and cache directories and removes them afterwards', async () => {
    const plant = await runner.run({
      cmd: 'sh',
      args: [
        '-c',
        'mkdir -p "$HOME/.docker" "$XDG_DATA_HOME/helm/plugins/evil" && echo planted > "$HOME/.gitconfig" && echo {} > "$HOME/.docker/config.json" && echo x > "$TMPDIR/t" && echo "$HOME"',
      ],
    });
    expect(plant.error).toBeUndefined();
    const plantedHome = plant.stdout.trim();
    expect(existsSync(plantedHome)).toBe(false);
    const look = await runner.run({
      cmd: 'sh',
      args: ['-c', 'ls -A "$HOME" "$TMPDIR" "$XDG_DATA_HOME" "$XDG_CACHE_HOME" "$XDG_CONFIG_HOME"; echo "$HOME"'],
    });
    expect(look.stdout).not.toContain('.gitconfig');
    expect(look.stdout).not.toContain('.docker');
    expect(look.stdout).not.toContain('helm');
    expect(look.stdout.trim().split('\n').at(-1)).not.toBe(plantedHome);
    expect((await readdir(scratch)).filter((n) => n.startsWith('run-'))).toEqual([]);
  });

  it('streams decoded output chunks as they arrive', async () => {
    const chunks: [string, OutputStream][] = [];
    const r = await runner.run({
      cmd: 'sh',
      args: ['-c', 'echo first; echo warn >&2; cat'],
      stdin: `${'é'.repeat(40_000)}\n`,
      onOutput: (c, s) => chunks.push([c, s]),
    });
    const joined = (stream: OutputStream) =>
      chunks
        .filter(([, s]) => s === stream)
        .map(([c]) => c)
        .join('');
    expect(joined('stdout')).toBe(r.stdout);
    expect(joined('stderr')).toBe('warn\n');
    expect(r.stdout).toBe(`first\n${'é'.repeat(40_000)}\n`);
    expect(chunks.every(([c]) => !c.includes('\uFFFD'))).toBe(true);
  });

  it('reports a binary that does not exist as a start failure', async () => {
    const r = await runner.run({ cmd: 'missing', args: ['x'] });
    expect(r.exitCode).toBe(-1);
    expect(r.error).toBeInstanceOf(CommandStartError);
    expect(r.error?.message).toBe('failed to start missing: ENOENT');
    expect((r.error?.cause as NodeJS.ErrnoException | undefined)?.code).toBe('ENOENT');
  });

  it('counts runs and time per tool', () => {
    const snap = metrics.snapshot();
    expect(snap.sleep).toMatchObject({ count: 2, failures: 2 });
    expect(snap.sleep?.totalMs).toBeGreaterThanOrEqual(300);
    expect(snap.missing).toEqual({ count: 1, failures: 1, totalMs: 0, maxMs: 0 });
    expect(snap.echo?.count).toBe(4);
    expect(snap.echo?.failures).toBe(1);
  });
});

describe('tool runs under their own uid (the runtime is root)', () => {
  let root: string;
  let work: string;
  let sandboxed: CommandRunner;

  beforeAll(async () => {
    expect(canSwitchUid()).toBe(true); // this suite runs as root, as CI does
    root = await realpath(await mkdtemp(path.join(tmpdir(), 'exec-uid-')));
    work = path.join(root, 'work');
    ensureTraversable(work);
    sandboxed = createCommandRunner({
      allow: ['sh', 'sleep'],
      resolveBin: (name) => (name === 'sh' ? '/bin/sh' : '/bin/sleep'),
      tmpDir: work,
      uidPool: { first: 910_100, size: 2 },
    });
  });

  afterAll(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('cannot read the runtime environment, its files or another run, and writes only where allowed', async () => {
    const secret = path.join(root, 'kubeconfig');
    await writeFile(secret, 'admin-token', { mode: 0o600 });
    const scratchDir = await mkdtemp(path.join(work, 'fetch-'));
    const other = await mkdtemp(path.join(work, 'template-'));
    const r = await sandboxed.run({
      cmd: 'sh',
      args: [
        '-c',
        [
          'id -u',
          `cat ${secret} || echo no-secret`,
          `cat /proc/${process.pid}/environ || echo no-environ`,
          `echo out > ${scratchDir}/ok && echo wrote-scratch`,
          `echo out > ${other}/bad || echo no-other`,
        ].join('; '),
      ],
      writable: [scratchDir],
    });
    const lines = r.stdout.trim().split('\n');
    expect(Number(lines[0])).toBeGreaterThanOrEqual(910_100);
    expect(Number(lines[0])).toBeLessThan(910_102);
    expect(lines.slice(1)).toEqual(['no-secret', 'no-environ', 'wrote-scratch', 'no-other']);
    expect(r.stderr).toContain('Permission denied');
    expect(existsSync(path.join(other, 'bad'))).toBe(false);
  });

  it('gives runs in flight different uids, so one cannot read the other', async () => {
    // a has written its file and runs until b has ended (waited for, not slept for: on a loaded
    // machine a fixed sleep could let b look before a wrote, or after a ended and gave its uid back).
    let aOut = '';
    let wrote = () => {};
    const aWrote = new Promise<void>((r) => {
      wrote = r;
    });
    const a = sandboxed.run({
      cmd: 'sh',
      args: [
        '-c',
        'echo secret-a > "$HOME/a"; id -u; echo "$HOME"; i=0; while [ ! -e "$HOME/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done',
      ],
      onOutput: (chunk, stream) => {
        if (stream !== 'stdout') return;
        aOut += chunk;
        if (aOut.split('\n').length > 2) wrote();
      },
    });
    await Promise.race([aWrote, a]); // a run that failed to start fails the assertions below, not the bound
    const b = await sandboxed.run({
      cmd: 'sh',
      args: ['-c', 'id -u; for f in $(dirname "$HOME")/../run-*/home/a; do cat "$f" || true; done'],
    });
    await writeFile(path.join(aOut.split('\n')[1] ?? '', 'go'), '');
    const ra = await a;
    const [uidA] = ra.stdout.trim().split('\n');
    const [uidB, ...rest] = b.stdout.trim().split('\n');
    expect(uidA).not.toBe(uidB);
    expect(rest.join('\n')).not.toContain('secret-a');
  });

  it('hands a directory over without following symlinks or hard links to files outside', async () => {
    const outside = path.join(root, 'outside.txt');
    await writeFile(outside, 'root only', { mode: 0o600 });
    const dir = await mkdtemp(path.join(work, 'src-'));
    await mkdir(path.join(dir, 'sub'));
    await symlink(outside, path.join(dir, 'sub', 'link'));
    await link(outside, path.join(dir, 'hard'));
    const r = await sandboxed.run({
      cmd: 'sh',
      args: [
        '-c',
        `cat ${dir}/sub/link || echo no-link; cat ${dir}/hard || echo no-hard; touch ${dir}/sub/new && echo ok`,
      ],
      writable: [dir],
    });
    expect(r.stdout.trim().split('\n')).toEqual(['no-link', 'no-hard', 'ok']);
    expect((await stat(outside)).uid).toBe(0);
    expect((await stat(path.join(dir, 'sub'))).uid).toBeGreaterThanOrEqual(910_100);
  });
});

describe('the runtime process is not dumpable (hardening addon)', () => {
  /**
   * Runs a Node process as an unprivileged uid (as the functions run on Lambda) that starts a
   * tool under its own uid; the tool tries to read the runtime's environment.
   */
  async function readOwnEnviron(harden: boolean): Promise<string> {
    const dir = await realpath(await mkdtemp(path.join(tmpdir(), 'harden-')));
    const addon = path.join(dir, 'harden.node');
    await writeFile(addon, await readFile(hardenAddonPath()), { mode: 0o755 });
    const script = path.join(dir, 'runtime.cjs');
    await writeFile(
      script,
      [
        "const { spawnSync } = require('node:child_process');",
        `if (${harden}) { const m = { exports: {} }; process.dlopen(m, ${JSON.stringify(addon)}); if (m.exports.setNotDumpable() !== 0) process.exit(3); }`,
        // The child script's own template literal: its ${process.pid} is the child's pid.
        // biome-ignore lint/suspicious/noTemplateCurlyInString: code of the script written out
        "const r = spawnSync('/bin/sh', ['-c', `tr '\\\\0' '\\\\n' < /proc/${process.pid}/environ || echo denied`], { encoding: 'utf8' });",
        'process.stdout.write(r.stdout);',
      ].join('\n'),
      { mode: 0o644 },
    );
    await chmod(dir, 0o755);
    try {
      const out = execFileSync(process.execPath, [script], {
        uid: 910_250,
        gid: 910_250,
        env: { PATH: DEFAULT_SYSTEM_PATH, AWS_SECRET_ACCESS_KEY: 'role-secret' },
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'ignore'],
      });
      return out;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  it('a tool under the same uid reads the environment of an unhardened runtime (the threat)', async () => {
    expect(await readOwnEnviron(false)).toContain('AWS_SECRET_ACCESS_KEY=role-secret');
  });

  it('but not the environment of a hardened one', async () => {
    const out = await readOwnEnviron(true);
    expect(out).not.toContain('role-secret');
    expect(out.trim()).toBe('denied');
  });
});

describe('tools die with the runtime (launcher)', () => {
  /** Whether a process with this pid still runs (and is not a zombie). */
  const alive = (pid: number) => !isDead(pid);

  /**
   * Starts a stand-in runtime (`sh`) that starts `sleep 60` (through the launcher or not),
   * SIGKILLs the stand-in and reports whether the sleep survived.
   */
  async function sleepSurvivesRuntimeKill(viaLauncher: boolean): Promise<boolean> {
    const start = viaLauncher ? `${launcherPath()} $$ /bin/sleep 60` : '/bin/sleep 60';
    const runtime = spawn('/bin/sh', ['-c', `${start} & echo $!; wait`], { stdio: ['ignore', 'pipe', 'ignore'] });
    const pid = await new Promise<number>((resolve) =>
      runtime.stdout.once('data', (d) => resolve(Number(String(d).trim()))),
    );
    await new Promise((r) => setTimeout(r, 200));
    expect(alive(pid)).toBe(true);
    runtime.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 500));
    const survived = alive(pid);
    if (survived) process.kill(pid, 'SIGKILL');
    return survived;
  }

  it('a tool started directly outlives a SIGKILLed runtime (the threat)', async () => {
    expect(await sleepSurvivesRuntimeKill(false)).toBe(true);
  });

  it('a tool started through the launcher is killed with it', async () => {
    expect(await sleepSurvivesRuntimeKill(true)).toBe(false);
  });

  it('the runner with a launcher runs tools as before and reports a missing binary as a start failure', async () => {
    const launched = createCommandRunner({
      allow: Object.keys(BINS),
      resolveBin: (name) => BINS[name] ?? '/nope',
      tmpDir: scratch,
      launcher: launcherPath(),
    });
    const r = await launched.run({ cmd: 'sh', args: ['-c', 'echo "$0 $1"; exit 3', 'x'] });
    expect(r.stdout).toBe('x \n');
    expect(r.error?.message).toBe('exit status 3');
    const missing = await launched.run({ cmd: 'missing', args: [] });
    expect(missing.error).toBeInstanceOf(CommandStartError);
    expect(missing.error?.message).toBe('failed to start missing: ENOENT');
  });
});

describe('what a tool leaves outside its process group (Lambda: subreaper and orphan sweeper; root: the uid pool)', () => {
  /**
   * Runs `test/harness/orphan-runtime.ts` (a stand-in runtime process) and returns its report;
   * the process the tool left behind is killed afterwards whatever the outcome.
   */
  async function leaveBehind(
    mode: 'sweep' | 'none' | 'pool',
    hold: 'hold' | 'quiet',
  ): Promise<{
    pid: number;
    alive: boolean;
    exitCode: number;
    ms: number;
    uid?: number;
    underUid?: number[];
    next?: { uid: number; seen: string };
  }> {
    const dir = await realpath(await mkdtemp(path.join(tmpdir(), 'orphans-')));
    const script = path.resolve('test/harness/orphan-runtime.ts');
    try {
      const out = execFileSync(
        process.execPath,
        ['--import', 'tsx', script, mode, launcherPath(), hardenAddonPath(), dir, hold],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 50_000 },
      );
      return JSON.parse(out.trim().split('\n').at(-1) ?? '{}');
    } finally {
      const pidFile = path.join(dir, ...(mode === 'pool' ? ['work', 'out'] : []), 'left-behind.pid');
      const pid = existsSync(pidFile) ? Number.parseInt(readFileSync(pidFile, 'utf8'), 10) : 0;
      if (pid > 1) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // Gone already.
        }
      }
      await rm(dir, { recursive: true, force: true });
    }
  }

  it('without the sweeper, a process that called setsid outlives the run (the threat)', async () => {
    const r = await leaveBehind('none', 'quiet');
    expect(r.exitCode).toBe(0);
    expect(r.pid).toBeGreaterThan(1);
    expect(r.alive).toBe(true);
  }, 60_000);

  it('with it, that process is killed before the run resolves', async () => {
    const r = await leaveBehind('sweep', 'quiet');
    expect(r.exitCode).toBe(0);
    expect(r.pid).toBeGreaterThan(1);
    expect(r.alive).toBe(false);
  }, 60_000);

  it('and a left-behind process holding the output pipe cannot keep the run open', async () => {
    const r = await leaveBehind('sweep', 'hold');
    expect(r.exitCode).toBe(0);
    expect(r.alive).toBe(false);
    // Without the sweep the run would wait for the pipe: the 60 s sleep (the call's timeout is 50 s).
    expect(r.ms).toBeLessThan(30_000);
  }, 60_000);

  it('as root, a run ends only once nothing runs under its uid: the next run under it finds nothing left', async () => {
    // The embedded runtime's case: no sweeper, a pool of one uid, a tool that leaves
    // `setsid sleep 600` behind.
    const r = await leaveBehind('pool', 'quiet');
    expect(r.exitCode).toBe(0);
    expect(r.uid).toBe(910_300);
    expect(r.alive).toBe(false);
    expect(r.underUid).toEqual([]);
    expect(r.next).toEqual({ uid: 910_300, seen: 'unseen' });
  }, 60_000);
});
