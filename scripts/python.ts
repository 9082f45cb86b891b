/**
 * Installs the Python package the tests need when it is missing: moto's server (`moto[server]`,
 * the SQS-compatible queue service of `test/harness/servers/sqs.ts`), at the pinned
 * {@link MOTO_VERSION}, into the project's own virtual environment (`<cache>/venv`,
 * {@link pythonVenv}): `python3 -m venv`, then the venv's `pip install`. Never `pip install
 * --user`, which Debian 12's Python refuses (PEP 668: the system site is externally managed), and
 * nothing outside the cache. The demo does not need it (`scripts/setup-plan.ts`).
 */

import { existsSync } from 'node:fs';
import { cacheRoot, run } from '../layers/gobuild.js';
import { MOTO_VERSION, pythonVenv } from '../test/harness/servers/sqs.js';

/**
 * argv that succeeds only when the venv's python has moto at the pinned version with its server
 * extras (flask, flask_cors). Looks the modules up without importing them (importing moto's
 * server takes seconds). Pure.
 * @param root - cache root holding the venv
 */
export function motoCheckArgv(root = cacheRoot()): string[] {
  return [
    pythonVenv(root).python,
    '-c',
    'import importlib.metadata as m, importlib.util as u, sys; ' +
      `sys.exit(0 if m.version("moto") == "${MOTO_VERSION}" and all(u.find_spec(x) for x in ("moto", "flask", "flask_cors")) else 1)`,
  ];
}

/** argv that creates (or repairs, keeping what is installed) the venv with the machine's `python3`. Pure. */
export function venvCreateArgv(root = cacheRoot()): string[] {
  return ['python3', '-m', 'venv', pythonVenv(root).dir];
}

/** argv of the venv's pip installing moto's server at {@link MOTO_VERSION}. Pure. */
export function motoInstallArgv(root = cacheRoot()): string[] {
  return [pythonVenv(root).pip, 'install', '--quiet', `moto[server]==${MOTO_VERSION}`];
}

/**
 * Checks that the venv has moto's server at {@link MOTO_VERSION} (no pip run when it has);
 * otherwise creates the venv when it has no pip (Debian's `python3` needs `python3-venv` for
 * that, which `scripts/apt.ts` installs first) and runs its pip, with pip's progress (its stderr
 * lines) on `log`.
 * @param root - cache root (default {@link cacheRoot})
 * @throws Error when python3 is missing, the venv cannot be made (no `ensurepip`), pip fails (its output's tail in
 *   the message), or moto still does not import afterwards.
 */
export async function ensurePythonPackages(log: (m: string) => void, root = cacheRoot()): Promise<void> {
  const ok = (argv: string[]) =>
    run(argv, { env: process.env }).then(
      () => true,
      () => false,
    );
  if (await ok(motoCheckArgv(root))) return;
  const venv = pythonVenv(root);
  if (!existsSync(venv.pip)) {
    log(`python3 -m venv ${venv.dir}`);
    await run(venvCreateArgv(root), { env: process.env, onLine: log });
  }
  const argv = motoInstallArgv(root);
  log(`${argv.join(' ')} (for the SQS-compatible test server)`);
  const env = { ...process.env, PIP_DISABLE_PIP_VERSION_CHECK: '1' };
  // run() rejects with the tail of pip's output when it fails.
  await run(argv, { env, onLine: log });
  if (!(await ok(motoCheckArgv(root)))) throw new Error(`moto ${MOTO_VERSION} does not import after ${argv.join(' ')}`);
  log(`moto ${MOTO_VERSION} installed in ${venv.dir}`);
}
