/**
 * A moto server of its own that enforces IAM once asked ({@link IamMotoServer.enforceIam}), for
 * the tests that show what a role or session may reach (`test/integration/run-confinement.test.ts`):
 * S3, STS, IAM and Secrets Manager on one port, run through `moto_iam.py`, which makes moto match
 * policy resources as IAM does (`?`, literal `.`) and check Secrets Manager against the secret's
 * ARN (see its module comment). Never the shared server of the other files: once enforced, every
 * request must be signed by an IAM user's key or an assumed role's session.
 */
import { fileURLToPath } from 'node:url';
import { cacheRoot } from '../../../layers/gobuild.js';
import { httpAnswers, LOOPBACK, startProcess, withFreePort } from './process.js';
import { pythonVenv, type SqsInfo } from './sqs.js';

/** The wrapper that runs moto's server with IAM's resource matching (see the module comment). */
const MOTO_IAM_PY = fileURLToPath(new URL('./moto_iam.py', import.meta.url));

/** A running moto server whose IAM is not yet enforced. */
export interface IamMotoServer extends SqsInfo {
  /**
   * From now on every request is authenticated and checked against the caller's IAM policies
   * (moto's `/moto-api/reset-auth` with 0 actions left unchecked). Until then, none is: the test
   * creates its buckets, secrets, roles and users first, with the throw-away pair of {@link SqsInfo}.
   * @throws Error when moto does not take it.
   */
  enforceIam(): Promise<void>;
  /** Kills moto. Idempotent. */
  stop(): Promise<void>;
}

/**
 * argv of the server (the venv's python, {@link pythonVenv}) on `127.0.0.1:<port>`. Pure.
 */
export function motoIamArgv(port: number, root = cacheRoot()): string[] {
  return [pythonVenv(root).python, MOTO_IAM_PY, '--host', LOOPBACK, '--port', String(port)];
}

/**
 * Starts the server on a free 127.0.0.1 port and waits until it answers; state in memory only.
 * @throws Error with moto's output when it does not start (not installed: `npm run setup`).
 */
export async function startIamMotoServer(): Promise<IamMotoServer> {
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME, PYTHONUNBUFFERED: '1' };
  return await withFreePort(async (port) => {
    const endpoint = `http://${LOOPBACK}:${port}`;
    const proc = await startProcess('moto-iam', motoIamArgv(port), {
      env,
      ready: () => httpAnswers(`${endpoint}/moto-api/`, (s) => s === 200),
    });
    return {
      endpoint,
      region: 'us-east-1',
      accessKeyId: 'moto-test',
      secretAccessKey: 'moto-test',
      async enforceIam() {
        const res = await fetch(`${endpoint}/moto-api/reset-auth`, { method: 'POST', body: '0' });
        if (!res.ok) throw new Error(`moto reset-auth: HTTP ${res.status}`);
      },
      stop: () => proc.stop(),
    };
  });
}
