/**
 * What `tsx scripts/setup.ts` installs and builds for each profile, from the data of the
 * component manifest (`GoComponent.demo`) and the Debian table (`DebianPackage.demo`), so the
 * demo's set is written in one place. Pure.
 *
 * - `full` (`npm run setup`, `npm test`, `npm run bench`, `npm start`): every non-optional Go
 *   component, every Debian package, moto in the project's Python venv, the native addons.
 * - `demo` (`npm run demo`): only what the demo runs: the tools its Apps and package use, the
 *   local control plane, the registry, git and the native addons of the embedded runtime; no
 *   Python, no S3 server (versitygw), no Lambda Runtime Interface Emulator.
 */
import { COMPONENTS, type GoComponent } from '../layers/manifest.js';
import { DEBIAN_PACKAGES } from './apt.js';

/** A setup profile, `--for <profile>` (default `full`). */
export type SetupProfile = 'full' | 'demo';

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
  const demo = profile === 'demo';
  return {
    components: COMPONENTS.filter((c) => !c.optional && (!demo || c.demo === true)),
    debianPackages: Object.entries(DEBIAN_PACKAGES)
      .filter(([, p]) => !demo || p.demo)
      .map(([name]) => name),
    python: !demo,
    native: true,
  };
}

/**
 * Parses setup's argv: `--for <profile>` and component names (a named list builds only those,
 * and nothing else).
 * @throws Error for an unknown profile or a `--for` without one.
 */
export function parseSetupArgs(argv: readonly string[]): { profile: SetupProfile; names: string[] } {
  const names: string[] = [];
  let profile: SetupProfile = 'full';
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--for' || a.startsWith('--for=')) {
      const v = a === '--for' ? argv[++i] : a.slice('--for='.length);
      if (v !== 'full' && v !== 'demo') throw new Error(`setup --for: expected full or demo, got ${v ?? 'nothing'}`);
      profile = v;
    } else names.push(a);
  }
  return { profile, names };
}
