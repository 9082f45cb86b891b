/**
 * Installs the Debian packages setup needs when they are missing: `docker-registry` (OCI
 * registry), `git` (git server and vendir's git fetch), `gcc` (the runtime's native addons,
 * `layers/native.ts`) and, for the tests only, `python3-venv` (Debian's `python3` cannot make the
 * project's virtual environment without it, `scripts/python.ts`).
 */
import { existsSync } from 'node:fs';
import { run } from '../layers/gobuild.js';

/** A Debian package setup installs when missing. */
export interface DebianPackage {
  /** A file it installs, used to tell whether it is present. */
  readonly file: string;
  /** `npm run demo` needs it (`scripts/setup-plan.ts`); otherwise only the tests and the benchmark. */
  readonly demo: boolean;
}

/** Debian package name → how to tell it is present and who needs it. */
export const DEBIAN_PACKAGES: Readonly<Record<string, DebianPackage>> = {
  'docker-registry': { file: '/usr/bin/docker-registry', demo: true },
  git: { file: '/usr/bin/git', demo: true },
  gcc: { file: '/usr/bin/gcc', demo: true },
  // every Debian package ships its copyright file; python3-venv has no binary of its own
  'python3-venv': { file: '/usr/share/doc/python3-venv/copyright', demo: false },
  // The fleet page's browser test drives Debian's headless Chromium (playwright-core, no download).
  chromium: { file: '/usr/bin/chromium', demo: false },
};

/**
 * Runs `apt-get install` for those of `names` that are missing (as root, as on this project's
 * machines).
 * @param names - keys of {@link DEBIAN_PACKAGES} (default all of them)
 * @throws Error when apt-get fails or the process is not root and something is missing.
 */
export async function ensureDebianPackages(
  log: (m: string) => void,
  names: readonly string[] = Object.keys(DEBIAN_PACKAGES),
): Promise<void> {
  const missing = names.filter((pkg) => {
    const p = DEBIAN_PACKAGES[pkg];
    if (!p) throw new Error(`unknown Debian package ${pkg}`);
    return !existsSync(p.file);
  });
  if (!missing.length) return;
  if (process.getuid?.() !== 0) {
    throw new Error(`missing Debian packages ${missing.join(', ')}: run apt-get install -y ${missing.join(' ')}`);
  }
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  log(`apt-get install ${missing.join(' ')}`);
  await run(['apt-get', 'update', '-q'], { env });
  await run(['apt-get', 'install', '-y', '-q', '--no-install-recommends', ...missing], { env, onLine: log });
}
