/**
 * What `npm run setup` (`tsx scripts/setup.ts`) installs and builds for each profile, from the
 * data of the component manifest (`GoComponent.demo`) and the Debian table (`DebianPackage.demo`),
 * so the demo's set is written in one place, and its command line ({@link setupCommandLine}).
 * Pure but for the command line's output.
 *
 * - `full` (`npm run setup`, `npm test`, `npm run bench`, `npm start`): every Go component but
 *   those only built when named (`need: 'named'`; kapp-controller, `need: 'tests'`, is built for
 *   the migration e2e), every Debian package, moto in the project's Python venv, the native addons.
 * - `demo` (`npm run demo`): only what the demo runs: the tools its Apps and package use, the
 *   local control plane, the registry, git and the native addons of the embedded runtime; no
 *   Python, no S3 server (versitygw), no Lambda Runtime Interface Emulator.
 */
import { parseArgs } from 'node:util';
import { COMPONENTS, type GoComponent } from '../layers/manifest.js';
import { DEBIAN_PACKAGES } from './apt.js';
import { EXIT, exitCodesHelp, isUsageError, UsageError, usageFailure } from './cli.js';

/** A setup profile, `--for <profile>` (default `full`). */
export type SetupProfile = 'full' | 'demo' | 'start';

/** Every {@link SetupProfile}, for parsing and help. */
export const SETUP_PROFILES: readonly SetupProfile[] = ['full', 'demo', 'start'];

/** What one profile of setup does. */
export interface SetupPlan {
  /** Go components to build (or find cached), in manifest order. */
  readonly components: readonly GoComponent[];
  /** Debian packages to install when missing (keys of `DEBIAN_PACKAGES`). */
  readonly debianPackages: readonly string[];
  /** Install moto's server into the project's venv (`scripts/python.ts`). */
  readonly python: boolean;
  /** Build the runtime's native addons (`layers/native.ts`): the embedded runtime loads them. */
  readonly native: boolean;
}

/** The plan of a profile. */
export function setupPlan(profile: SetupProfile): SetupPlan {
  const full = profile === 'full';
  // `start`: what the embedded runtime runs for any App (every tool a function's layer carries)
  // and the local control plane it falls back to; none of the tests' servers.
  const wanted = ({ need = 'always', demo, layers }: GoComponent) =>
    full ? need !== 'named' : need === 'always' && (demo === true || (profile === 'start' && layers.length > 0));
  return {
    components: COMPONENTS.filter(wanted),
    debianPackages: Object.entries(DEBIAN_PACKAGES)
      .filter(([, p]) => full || p.demo)
      .map(([name]) => name),
    python: full,
    native: true,
  };
}

/** What `scripts/setup.ts` was asked for. */
export interface SetupArgs {
  /** `--for <profile>`; default `full`. */
  profile: SetupProfile;
  /** `-h`/`--help`: print the usage and do nothing else. */
  help?: boolean;
  /** Components named on the command line (none: the profile's set). */
  names: string[];
  /** `registry/repo` of the shared tool cache, if any (`--push-cache`, `--pull-cache`, then the environment). */
  cacheRepo?: string;
  /** Whether built components are pushed (`--push-cache` only; pulling needs no write access). */
  push: boolean;
  /**
   * The tool cache lock file (`KAPP_LAMBDA_TOOL_CACHE_LOCK`); unset: the committed
   * `layers/toolcache.lock.json`.
   */
  lockFile?: string;
}

/** `npm run setup -- --help`. */
export const SETUP_USAGE = `usage: npm run setup -- [--for full|demo|start] [component...] [--pull-cache <registry/repo>] [--push-cache <registry/repo>]
  --for full    (default; npm test, npm run bench) every component the tests use, Debian packages, moto in ~/.cache/kapp-lambda/venv
  --for demo    (npm run demo) only what the demo runs
  --for start   (npm start) every tool the runtime runs and the local control plane; no test server
  component...  build only these (names in layers/manifest.ts)
  --pull-cache  pull each component the OCI repository holds and layers/toolcache.lock.json lists before building it
                (also KAPP_LAMBDA_TOOL_CACHE_REGISTRY; KAPP_LAMBDA_TOOL_CACHE_LOCK names another lock file)
  --push-cache  the same, then push each component it or the lock lacks and record it in the lock (commit it)
${exitCodesHelp('a build or an install failed')}`;

/**
 * Parses setup's argv: `--for <profile>`, component names (a named list builds only those, and
 * nothing else), `--pull-cache <repo>` (pull what the shared tool cache holds before building,
 * `layers/toolcache.ts`), `--push-cache <repo>` (the same, then push what it lacks) and, when
 * neither is given, `KAPP_LAMBDA_TOOL_CACHE_REGISTRY` (pull only); `KAPP_LAMBDA_TOOL_CACHE_LOCK`
 * names another lock file than the committed one. `--flag=value` works too. Pure.
 * @throws {UsageError} (or `parseArgs`'s `ERR_PARSE_ARGS_*` error; both {@link isUsageError}) on
 *   an unknown option, profile or component, or an option without its value.
 */
export function parseSetupArgs(argv: readonly string[], env: NodeJS.ProcessEnv): SetupArgs {
  const { values, positionals: names } = parseArgs({
    args: [...argv],
    allowPositionals: true,
    strict: true,
    options: {
      for: { type: 'string' },
      'pull-cache': { type: 'string' },
      'push-cache': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  const profile = (values.for ?? 'full') as SetupProfile;
  if (values.help) return { profile, names: [], push: false, help: true };
  if (!SETUP_PROFILES.includes(profile)) {
    throw new UsageError(`--for: expected ${SETUP_PROFILES.join(', ')}, got ${JSON.stringify(profile)}`);
  }
  for (const flag of ['pull-cache', 'push-cache'] as const) {
    if (values[flag] === '') throw new UsageError(`--${flag} needs a registry/repository`);
  }
  const unknown = names.filter((n) => !COMPONENTS.some((c) => c.name === n));
  if (unknown.length > 0) {
    throw new UsageError(
      `unknown component ${unknown.join(', ')} (known: ${COMPONENTS.map((c) => c.name).join(', ')})`,
    );
  }
  const pull = values['pull-cache'];
  const push = values['push-cache'];
  const cacheRepo = push ?? pull ?? (env.KAPP_LAMBDA_TOOL_CACHE_REGISTRY || undefined);
  const lockFile = env.KAPP_LAMBDA_TOOL_CACHE_LOCK || undefined;
  return {
    profile,
    names,
    ...(cacheRepo ? { cacheRepo } : {}),
    push: push !== undefined,
    ...(cacheRepo && lockFile ? { lockFile } : {}),
  };
}

/**
 * Reads setup's command line as the project's other commands do (`./cli.ts`).
 *
 * @returns the exit code to stop with (`--help`: {@link SETUP_USAGE} on stdout, 0; a usage error:
 *   `setup: <message>` and the usage on stderr, 2), or what to set up
 */
export function setupCommandLine(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  io: { out: (t: string) => void; err: (t: string) => void },
): SetupArgs | number {
  let args: SetupArgs;
  try {
    args = parseSetupArgs(argv, env);
  } catch (e) {
    if (!isUsageError(e)) throw e;
    return usageFailure('setup', SETUP_USAGE, e.message, io.err);
  }
  if (!args.help) return args;
  io.out(SETUP_USAGE);
  return EXIT.ok;
}
