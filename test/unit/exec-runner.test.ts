import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { KAPP_ERROR_PREFIX } from '../../functions/lib/deploy/kapp.js';
import { exitWith, FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { createToolMetrics, type ToolRunSample, teeToolMetrics } from '../../functions/lib/exec/metrics.js';
import {
  CommandCanceledError,
  CommandExitError,
  CommandNotAllowedError,
  CommandStartError,
  CommandTimeoutError,
  createCommandRunner,
  DEFAULT_SYSTEM_PATH,
  dirBinResolver,
  minimalEnv,
  type OutputStream,
  STAGE_TOOLS,
} from '../../functions/lib/exec/runner.js';
import { FETCH_RUN_ERROR_PREFIX } from '../../functions/lib/fetch/vendir.js';
import { attachError } from '../../functions/lib/reconcile/result.js';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';

describe('error texts (Go os/exec and pkg/exec/cmd_runner.go)', () => {
  it.each([
    [new CommandExitError('ytt', 1), 'exit status 1', 1],
    [new CommandExitError('ytt', 3), 'exit status 3', 3],
    [new CommandExitError('kapp', -1, 'SIGKILL'), 'signal: killed', -1],
    [new CommandExitError('kapp', 0, 'SIGTERM'), 'signal: terminated', -1],
    [new CommandExitError('kapp', -1, 'SIGUSR1'), 'signal: SIGUSR1', -1],
    [new CommandCanceledError('kapp', false, 'r'), 'Already canceled', -1],
    [new CommandCanceledError('kapp', true, 'r'), 'Process was canceled', -1],
    [new CommandTimeoutError('helm', 250), 'Process timed out after 250ms', -1],
    [new CommandStartError('cue', new Error('bad')), 'failed to start cue: bad', -1],
  ] as const)('%s', (error, message, exitCode) => {
    expect(error.message).toBe(message);
    expect(error.exitCode).toBe(exitCode);
  });

  it('canceled and start errors carry their cause', () => {
    const reason = new Error('app deleted');
    expect(new CommandCanceledError('kapp', true, reason).cause).toBe(reason);
    const enoent = Object.assign(new Error('spawn /x ENOENT'), { code: 'ENOENT' });
    const start = new CommandStartError('kapp', enoent);
    expect(start.message).toBe('failed to start kapp: ENOENT');
    expect(start.cause).toBe(enoent);
  });
});

describe('stage allow-lists', () => {
  it('only deploy and index-repo (kapp as kapp-lambda-pkgr) run kapp; only index-repo (the source poll) runs git; install runs no tool', () => {
    expect(STAGE_TOOLS).toEqual({
      fetch: ['vendir', 'imgpkg', 'helm'],
      template: ['ytt', 'kbld', 'helm', 'sops', 'age', 'cue', 'kustomize'],
      deploy: ['kapp'],
      'index-repo': ['vendir', 'imgpkg', 'ytt', 'kbld', 'kapp', 'git'],
      install: [],
    });
  });
});

describe('minimalEnv', () => {
  it('has PATH (tool dirs first), HOME, TMPDIR and the temp root as git ceiling only', () => {
    const env = minimalEnv({
      allow: ['vendir', 'imgpkg', 'kapp'],
      resolveBin: (n) => (n === 'kapp' ? `/opt/deploy/${n}` : `/opt/fetch/${n}`),
      home: '/home/fn',
      tmpDir: '/scratch',
    });
    expect(env).toEqual({
      PATH: `/opt/fetch:/opt/deploy:${DEFAULT_SYSTEM_PATH}`,
      HOME: '/home/fn',
      TMPDIR: '/scratch',
      GIT_CEILING_DIRECTORIES: '/scratch',
    });
  });

  it('skips tools that do not resolve and defaults HOME to TMPDIR', () => {
    const env = minimalEnv({
      allow: ['ytt', 'nope'],
      resolveBin: (n) => {
        if (n === 'nope') throw new Error('unknown tool nope');
        return `/opt/bin/${n}`;
      },
      tmpDir: '/scratch',
    });
    expect(env).toEqual({
      PATH: `/opt/bin:${DEFAULT_SYSTEM_PATH}`,
      HOME: '/scratch',
      TMPDIR: '/scratch',
      GIT_CEILING_DIRECTORIES: '/scratch',
    });
  });
});

describe('resolvers', () => {
  it('dirBinResolver joins names and rejects paths', () => {
    const r = dirBinResolver('/opt/bin');
    expect(r('kapp')).toBe('/opt/bin/kapp');
    expect(() => r('../etc/passwd')).toThrow('invalid tool name ../etc/passwd');
    expect(() => r('..')).toThrow('invalid tool name ..');
  });

  it('cacheBinResolver maps to the pinned Go build cache', () => {
    const r = cacheBinResolver('/cache');
    expect(r('ytt')).toBe(binPath(component('ytt'), 'ytt', '/cache'));
    expect(r('age-keygen')).toBe(binPath(component('age'), 'age-keygen', '/cache'));
    expect(path.dirname(r('kapp')).startsWith('/cache/bin/kapp-')).toBe(true);
    expect(() => r('bash')).toThrow('unknown tool bash');
  });
});

describe('createCommandRunner without spawning', () => {
  it('rejects a command outside the allow-list, or a path', async () => {
    const runner = createCommandRunner({ allow: ['ytt'], resolveBin: dirBinResolver('/opt/bin'), tmpDir: '/tmp' });
    await expect(runner.run({ cmd: 'bash', args: ['-c', 'id'] })).rejects.toThrow(CommandNotAllowedError);
    await expect(runner.run({ cmd: 'bash', args: [] })).rejects.toThrow('command "bash" is not allowed (allowed: ytt)');
    await expect(runner.run({ cmd: '/opt/bin/ytt', args: [] })).rejects.toThrow(CommandNotAllowedError);
  });

  it('an aborted signal runs nothing: Already canceled, exit code -1, one metrics sample', async () => {
    const metrics = createToolMetrics();
    const runner = createCommandRunner({
      allow: ['kapp'],
      resolveBin: () => {
        throw new Error('must not resolve');
      },
      metrics,
      tmpDir: '/tmp',
    });
    const ac = new AbortController();
    ac.abort(new Error('app deleted'));
    const r = await runner.run({ cmd: 'kapp', args: ['deploy'], signal: ac.signal });
    expect(r).toMatchObject({ stdout: '', stderr: '', exitCode: -1, durationMs: 0 });
    expect(r.error).toBeInstanceOf(CommandCanceledError);
    expect(attachError(KAPP_ERROR_PREFIX.deploy, r).error).toBe('Deploying: Already canceled');
    expect(metrics.snapshot()).toEqual({ kapp: { count: 1, failures: 1, totalMs: 0, maxMs: 0 } });
  });

  it('an unresolvable binary is a start failure, not a rejection', async () => {
    const runner = createCommandRunner({
      allow: ['cue'],
      resolveBin: () => {
        throw new Error('unknown tool cue');
      },
      tmpDir: '/tmp',
    });
    const r = await runner.run({ cmd: 'cue', args: ['export'] });
    expect(r.exitCode).toBe(-1);
    expect(r.error).toBeInstanceOf(CommandStartError);
    expect(r.error?.message).toBe('failed to start cue: unknown tool cue');
  });
});

describe('tool metrics', () => {
  it('aggregates count, failures, total and max per tool', () => {
    const m = createToolMetrics();
    const samples: ToolRunSample[] = [
      { tool: 'ytt', durationMs: 10, exitCode: 0, outcome: 'ok' },
      { tool: 'ytt', durationMs: 30, exitCode: 1, outcome: 'exit' },
      { tool: 'kapp', durationMs: 5, exitCode: -1, outcome: 'timeout' },
    ];
    const seen: ToolRunSample[] = [];
    const tee = teeToolMetrics(m, { record: (s) => seen.push(s) });
    for (const s of samples) tee.record(s);
    expect(m.snapshot()).toEqual({
      kapp: { count: 1, failures: 1, totalMs: 5, maxMs: 5 },
      ytt: { count: 2, failures: 1, totalMs: 40, maxMs: 30 },
    });
    expect(Object.keys(m.snapshot())).toEqual(['kapp', 'ytt']);
    expect(seen).toEqual(samples);
    m.reset();
    expect(m.snapshot()).toEqual({});
  });
});

describe('FakeCommandRunner', () => {
  it('records exact argv, stdin, cwd, env and timeout', async () => {
    const fake = new FakeCommandRunner({ fallback: {} });
    await fake.run({
      cmd: 'kapp',
      args: ['deploy', '-a', 'simple-app.app', '-f', '-'],
      stdin: Buffer.from('kind: ConfigMap\n'),
      cwd: '/work',
      env: { KUBECONFIG: '/tmp/kc' },
      timeoutMs: 1000,
    });
    await fake.run({ cmd: 'ytt', args: ['-f', '.'] });
    expect(fake.calls).toEqual([
      {
        cmd: 'kapp',
        args: ['deploy', '-a', 'simple-app.app', '-f', '-'],
        stdin: 'kind: ConfigMap\n',
        cwd: '/work',
        env: { KUBECONFIG: '/tmp/kc' },
        timeoutMs: 1000,
      },
      { cmd: 'ytt', args: ['-f', '.'] },
    ]);
    expect(fake.argv()).toEqual([
      ['kapp', 'deploy', '-a', 'simple-app.app', '-f', '-'],
      ['ytt', '-f', '.'],
    ]);
  });

  it('answers from rules: newest first, matchers, once, functions', async () => {
    const fake = new FakeCommandRunner()
      .on('ytt', { stdout: 'generic' })
      .on('ytt', { stdout: 'with values' }, (args) => args.includes('--data-values-file'))
      .once('ytt', (req) => ({ stdout: `first:${req.args.join(',')}` }));
    expect((await fake.run({ cmd: 'ytt', args: ['-f', 'a'] })).stdout).toBe('first:-f,a');
    expect((await fake.run({ cmd: 'ytt', args: ['--data-values-file', 'v'] })).stdout).toBe('with values');
    expect((await fake.run({ cmd: 'ytt', args: ['-f', 'b'] })).stdout).toBe('generic');
  });

  it('turns a non-zero exit into exit status <n>, as the real runner does', async () => {
    const fake = new FakeCommandRunner().on('vendir', exitWith(1, 'vendir: Error: boom\n'));
    const r = await fake.run({ cmd: 'vendir', args: ['sync'] });
    expect(r).toMatchObject({ stdout: '', stderr: 'vendir: Error: boom\n', exitCode: 1 });
    expect(r.error).toBeInstanceOf(CommandExitError);
    expect(r.error?.message).toBe('exit status 1');
    expect(r.error?.cmd).toBe('vendir');
    expect(attachError(FETCH_RUN_ERROR_PREFIX, r)).toEqual({
      stdout: '',
      stderr: 'vendir: Error: boom\n',
      exitCode: 1,
      error: 'Fetching resources: Error (see .status.usefulErrorMessage for details)',
      finished: true,
    });
  });

  it('takes the exit code from a scripted error', async () => {
    const fake = new FakeCommandRunner().on('kapp', { error: new CommandCanceledError('kapp', true, undefined) });
    const r = await fake.run({ cmd: 'kapp', args: ['deploy'] });
    expect(r.exitCode).toBe(-1);
    expect(attachError(KAPP_ERROR_PREFIX.deploy, r).error).toBe('Deploying: Process was canceled');
  });

  it('streams scripted output through onOutput', async () => {
    const fake = new FakeCommandRunner().on('kapp', { stdout: ' ---- applying 1 changes', stderr: 'warn' });
    const chunks: [string, OutputStream][] = [];
    await fake.run({ cmd: 'kapp', args: [], onOutput: (c, s) => chunks.push([c, s]) });
    expect(chunks).toEqual([
      [' ---- applying 1 changes', 'stdout'],
      ['warn', 'stderr'],
    ]);
  });

  it('honours an aborted signal, an allow-list, and rejects unscripted calls', async () => {
    const fake = new FakeCommandRunner({ allow: ['kapp', 'ytt'] }).on('kapp', { stdout: 'never' });
    const ac = new AbortController();
    ac.abort();
    const r = await fake.run({ cmd: 'kapp', args: ['deploy'], signal: ac.signal });
    expect(r.error?.message).toBe('Already canceled');
    expect(fake.calls).toHaveLength(1);
    await expect(fake.run({ cmd: 'helm', args: [] })).rejects.toThrow(CommandNotAllowedError);
    await expect(fake.run({ cmd: 'ytt', args: ['-f', 'x'] })).rejects.toThrow('unscripted command: ytt -f x');
  });
});
