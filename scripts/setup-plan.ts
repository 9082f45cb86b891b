/**
 * What `tsx scripts/setup.ts` installs and builds for each profile, from the data of the
 * component manifest (`GoComponent.demo`) and the Debian table (`DebianPackage.demo`), so the
 * demo's set is written in one place. Pure.
 *
 * - `full` (`npm run setup`, `npm test`, `npm run bench`, `npm start`): every Go component but
 *   those only built when named (`need: 'named'`; kapp-controller, `need: 'tests'`, is built for
 *   the migration e2e), every Debian package, moto in the project's Python venv, the native addons.
 * - `demo` (`npm run demo`): only what the demo runs: the tools its Apps and package use, the
 *   local control plane, the registry, git and the native addons of the embedded runtime; no
 *   Python, no S3 server (versitygw), no Lambda Runtime Interface Emulator.
 */
import { COMPONENTS, type GoComponent } from '../layers/manifest.js';
import { DEBIAN_PACKAGES } from './apt.js';

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

/**
 * Parses setup's argv: `--for <profile>`, component names (a named list builds only those, and
 * nothing else), `--pull-cache <repo>` (pull what the shared tool cache holds before building,
 * `layers/toolcache.ts`), `--push-cache <repo>` (the same, then push what it lacks) and, when
 * neither is given, `KAPP_LAMBDA_TOOL_CACHE_REGISTRY` (pull only); `KAPP_LAMBDA_TOOL_CACHE_LOCK`
 * names another lock file than the committed one. `--flag=value` works too. Pure.
 * @throws Error on an unknown flag or profile, or a flag without its value.
 */
export function parseSetupArgs(argv: readonly string[], env: NodeJS.ProcessEnv): SetupArgs {
  const names: string[] = [];
  let profile: SetupProfile = 'full';
  let pull: string | undefined;
  let push: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? '';
    if (a === '-h' || a === '--help') return { profile, names: [], push: false, help: true };
    if (!a.startsWith('--')) {
      names.push(a);
      continue;
    }
    const [flag, inline] = a.split(/=(.*)/s, 2);
    const value = inline ?? argv[++i];
    if (flag === '--for') {
      if (!SETUP_PROFILES.includes(value as SetupProfile)) {
        throw new Error(`setup --for: expected ${SETUP_PROFILES.join(', ')}, got ${value ?? 'nothing'}`);
      }
      profile = value as SetupProfile;
      continue;
    }
    if (!value || value.startsWith('--')) throw new Error(`${flag} needs a registry/repository`);
    if (flag === '--pull-cache') pull = value;
    else if (flag === '--push-cache') push = value;
    else
      throw new Error(
        `unknown option ${flag} (known: --for full|demo|start, --pull-cache <repo>, --push-cache <repo>, --help)`,
      );
  }
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
