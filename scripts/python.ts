/**
 * Installs the Python package the tests need when it is missing: moto's server (`moto[server]`,
 * the SQS-compatible queue service of `test/harness/servers/sqs.ts`), at the pinned
 * {@link MOTO_VERSION}, with `pip install --user` (no root, nothing outside the user's site).
 */

import { run } from '../layers/gobuild.js';
import { MOTO_VERSION } from '../test/harness/servers/sqs.js';

/**
 * argv that succeeds only when moto is installed at the pinned version with its server extras
 * (flask, flask_cors). Looks the modules up without importing them (importing moto's server
 * takes seconds). Pure.
 */
export function motoCheckArgv(): string[] {
  return [
    'python3',
    '-c',
    'import importlib.metadata as m, importlib.util as u, sys; ' +
      `sys.exit(0 if m.version("moto") == "${MOTO_VERSION}" and all(u.find_spec(x) for x in ("moto", "flask", "flask_cors")) else 1)`,
  ];
}

/**
 * Checks that `python3` has moto's server at {@link MOTO_VERSION}; otherwise runs
 * `python3 -m pip install --user 'moto[server]==<version>'`, with pip's progress (its stderr
 * lines) on `log`.
 * @throws Error when python3 is missing or pip fails (its output's tail in the message), or
 *   moto still does not import afterwards.
 */
export async function ensurePythonPackages(log: (m: string) => void): Promise<void> {
  const imports = () =>
    run(motoCheckArgv(), { env: process.env }).then(
      () => true,
      () => false,
    );
  if (await imports()) return;
  const spec = `moto[server]==${MOTO_VERSION}`;
  log(`pip install --user ${spec} (for the SQS-compatible test server)`);
  const env = { ...process.env, PIP_DISABLE_PIP_VERSION_CHECK: '1' };
  // run() rejects with the tail of pip's output when it fails.
  await run(['python3', '-m', 'pip', 'install', '--user', spec], { env, onLine: log });
  if (!(await imports())) throw new Error(`moto ${MOTO_VERSION} does not import after pip install --user ${spec}`);
  log(`moto ${MOTO_VERSION} installed`);
}
