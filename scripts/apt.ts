/**
 * Installs the Debian packages the integration tests need when they are missing:
 * `docker-registry` (OCI registry), `git` (git server and vendir's git fetch) and `gcc` (the
 * runtime's hardening addon, `layers/native.ts`).
 */
import { existsSync } from 'node:fs';
import { run } from '../layers/gobuild.js';

/** Debian package → a file it installs, used to tell whether it is present. */
export const DEBIAN_PACKAGES: Readonly<Record<string, string>> = {
  'docker-registry': '/usr/bin/docker-registry',
  git: '/usr/bin/git',
  gcc: '/usr/bin/gcc',
};

/**
 * Runs `apt-get install` for the missing packages (as root, as on this project's machines).
 * @throws Error when apt-get fails or the process is not root and something is missing.
 */
export async function ensureDebianPackages(log: (m: string) => void): Promise<void> {
  const missing = Object.entries(DEBIAN_PACKAGES)
    .filter(([, file]) => !existsSync(file))
    .map(([pkg]) => pkg);
  if (!missing.length) return;
  if (process.getuid?.() !== 0) {
    throw new Error(`missing Debian packages ${missing.join(', ')}: run apt-get install -y ${missing.join(' ')}`);
  }
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  log(`apt-get install ${missing.join(' ')}`);
  await run(['apt-get', 'update', '-q'], { env });
  await run(['apt-get', 'install', '-y', '-q', '--no-install-recommends', ...missing], { env, onLine: log });
}
