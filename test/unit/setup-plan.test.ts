/**
 * Setup's profiles (`scripts/setup-plan.ts`) and the Python installer's argv
 * (`scripts/python.ts`): `npm run demo` builds only what the demo runs, and moto goes into the
 * project's venv, never `pip install --user`.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { componentKey } from '../../layers/gobuild.js';
import { COMPONENTS, component } from '../../layers/manifest.js';
import { DEBIAN_PACKAGES } from '../../scripts/apt.js';
import { motoCheckArgv, motoInstallArgv, venvCreateArgv } from '../../scripts/python.js';
import { parseSetupArgs, SETUP_USAGE, setupCommandLine, setupPlan } from '../../scripts/setup-plan.js';
import { MOTO_VERSION, motoArgv, pythonVenv } from '../../test/harness/servers/sqs.js';

const names = (p: ReturnType<typeof setupPlan>) => p.components.map((c) => c.name);

describe('setupPlan', () => {
  it('demo: the tools of the demo, the local control plane, registry and git; no moto, versitygw or RIE', () => {
    const demo = setupPlan('demo');
    // what scripts/demo.ts starts and its examples run: ytt/kbld/kapp (Apps and the package),
    // vendir + imgpkg + helm (fetch; imgpkg and helm also publish the examples), kwok, etcd
    // and kubernetes (the local control plane)
    expect(names(demo).sort()).toEqual(
      ['etcd', 'helm', 'imgpkg', 'kapp', 'kbld', 'kubernetes', 'kwok', 'vendir', 'ytt'].sort(),
    );
    expect(names(demo)).not.toContain('versitygw');
    expect(names(demo)).not.toContain('aws-lambda-rie');
    expect(names(demo)).not.toContain('kapp-controller');
    expect(demo.python).toBe(false);
    expect(demo.native).toBe(true);
    expect([...demo.debianPackages].sort()).toEqual(['docker-registry', 'gcc', 'git']);
  });

  it('start: every tool a function runs and the local control plane; no test server, no Python', () => {
    const start = setupPlan('start');
    expect(names(start)).toEqual(
      expect.arrayContaining([
        'ytt',
        'kapp',
        'vendir',
        'sops',
        'age',
        'cue',
        'kustomize',
        'kubernetes',
        'etcd',
        'kwok',
      ]),
    );
    for (const n of ['versitygw', 'aws-lambda-rie', 'kapp-controller']) expect(names(start)).not.toContain(n);
    expect(start.python).toBe(false);
    expect(parseSetupArgs(['--help'], {}).help).toBe(true);
    expect(parseSetupArgs(['--for', 'start', '-h'], {}).help).toBe(true);
  });

  it('full: every component but those built only when named, every Debian package, moto', () => {
    const full = setupPlan('full');
    expect(names(full)).toEqual(COMPONENTS.filter((c) => c.need !== 'named').map((c) => c.name));
    // the migration e2e runs upstream kapp-controller: the tests' setup builds it
    expect(names(full)).toContain('kapp-controller');
    expect(names(full)).toEqual(expect.arrayContaining(['versitygw', 'aws-lambda-rie', 'sops', 'cue']));
    expect(full.python).toBe(true);
    expect(full.debianPackages).toEqual(Object.keys(DEBIAN_PACKAGES));
    expect(full.debianPackages).toContain('python3-venv');
  });

  it('the demo flag is not part of the build cache key (marking a component rebuilds nothing)', () => {
    const ytt = COMPONENTS.find((c) => c.name === 'ytt');
    if (!ytt) throw new Error('no ytt');
    expect(componentKey({ ...ytt, demo: false })).toBe(componentKey({ ...ytt, demo: true }));
  });

  it('need enters the cache key only as always or not, where the optional flag it replaced was', () => {
    const kc = component('kapp-controller');
    expect(componentKey(kc)).toBe('kapp-controller-v0.53.1-5760e99e7d');
    expect(componentKey({ ...kc, need: 'named' })).toBe(componentKey(kc));
    expect(componentKey({ ...kc, need: 'always' })).not.toBe(componentKey(kc));
    const ytt = component('ytt');
    expect(componentKey({ ...ytt, need: 'always' })).toBe(componentKey(ytt));
    expect(setupPlan('full').components).not.toContainEqual(expect.objectContaining({ need: 'named' }));
  });
});

describe('parseSetupArgs', () => {
  it('reads --for and component names', () => {
    expect(parseSetupArgs([], {})).toEqual({ profile: 'full', names: [], push: false });
    expect(parseSetupArgs(['--for', 'demo'], {})).toEqual({ profile: 'demo', names: [], push: false });
    expect(parseSetupArgs(['--for=demo', 'ytt'], {})).toEqual({ profile: 'demo', names: ['ytt'], push: false });
    expect(() => parseSetupArgs(['--for', 'tests'], {})).toThrow('--for: expected full, demo, start, got "tests"');
    expect(() => parseSetupArgs(['--for'], {})).toThrow("Option '--for <value>' argument missing");
  });

  it('reads the tool cache options, then the environment', () => {
    expect(parseSetupArgs(['--pull-cache', 'r.io/tools'], {})).toEqual({
      profile: 'full',
      names: [],
      cacheRepo: 'r.io/tools',
      push: false,
    });
    expect(parseSetupArgs(['--push-cache=r.io/tools', 'ytt'], { KAPP_LAMBDA_TOOL_CACHE_LOCK: '/l.json' })).toEqual({
      profile: 'full',
      names: ['ytt'],
      cacheRepo: 'r.io/tools',
      push: true,
      lockFile: '/l.json',
    });
    expect(parseSetupArgs([], { KAPP_LAMBDA_TOOL_CACHE_REGISTRY: 'r.io/env' })).toEqual({
      profile: 'full',
      names: [],
      cacheRepo: 'r.io/env',
      push: false,
    });
  });
});

describe('setupCommandLine', () => {
  const run = (argv: string[]) => {
    const out: string[] = [];
    const err: string[] = [];
    const result = setupCommandLine(argv, {}, { out: (t) => out.push(t), err: (t) => err.push(t) });
    return { result, out: out.join(''), err: err.join('') };
  };

  it('--help: the usage, as npm runs it, on stdout; exit 0', () => {
    const { result, out, err } = run(['--help']);
    expect(result).toBe(0);
    expect(out).toBe(SETUP_USAGE);
    expect(out.split('\n')[0]).toBe(
      'usage: npm run setup -- [--for full|demo|start] [component...] [--pull-cache <registry/repo>] [--push-cache <registry/repo>]',
    );
    expect(out).toContain('exit codes: 0 success; 1 failure (a build or an install failed); 2 usage error');
    expect(err).toBe('');
  });

  it('an unknown option, profile or component, or an option without its value: a usage error on stderr, exit 2', () => {
    const cases: [string[], string][] = [
      [['--bogus'], "Unknown option '--bogus'"],
      [['--bogus=x'], "Unknown option '--bogus'"],
      [['-x'], "Unknown option '-x'"],
      [['--for', 'tests'], '--for: expected full, demo, start, got "tests"'],
      [['--pull-cache'], "Option '--pull-cache <value>' argument missing"],
      [['--push-cache='], '--push-cache needs a registry/repository'],
      [['ytt', 'nosuch'], 'unknown component nosuch (known: '],
    ];
    for (const [argv, message] of cases) {
      const { result, out, err } = run(argv);
      expect(result, argv.join(' ')).toBe(2);
      expect(out, argv.join(' ')).toBe('');
      expect(err.startsWith(`setup: ${message}`), `${argv.join(' ')}: ${err}`).toBe(true);
      expect(err.endsWith(SETUP_USAGE), argv.join(' ')).toBe(true);
    }
  });

  it('otherwise what to set up', () => {
    expect(run(['--for', 'demo']).result).toEqual({ profile: 'demo', names: [], push: false });
  });
});

describe('the project Python venv', () => {
  const root = '/cache';
  const venv = path.join(root, 'venv');

  it('lives in the cache; moto runs with its python', () => {
    expect(pythonVenv(root)).toEqual({
      dir: venv,
      python: `${venv}/bin/python`,
      pip: `${venv}/bin/pip`,
    });
    expect(motoArgv(4566, root).slice(0, 1)).toEqual([`${venv}/bin/python`]);
    expect(motoArgv(4566, root).slice(2)).toEqual(['--host', '127.0.0.1', '--port', '4566']);
  });

  it('is made with python3 -m venv and filled with its own pip, never --user', () => {
    expect(venvCreateArgv(root)).toEqual(['python3', '-m', 'venv', venv]);
    expect(motoInstallArgv(root)).toEqual([`${venv}/bin/pip`, 'install', '--quiet', `moto[server]==${MOTO_VERSION}`]);
    const check = motoCheckArgv(root);
    expect(check[0]).toBe(`${venv}/bin/python`);
    expect(check[2]).toContain(`m.version("moto") == "${MOTO_VERSION}"`);
    for (const argv of [venvCreateArgv(root), motoInstallArgv(root), check]) expect(argv).not.toContain('--user');
  });
});
