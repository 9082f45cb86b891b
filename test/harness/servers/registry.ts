/**
 * OCI registry for tests: Debian's `docker-registry` (CNCF distribution 2.8) with its own
 * config file: filesystem storage in a temp dir, plain HTTP on 127.0.0.1, no auth unless asked
 * for ({@link startRegistry} with `auth`: distribution's own htpasswd basic auth).
 *
 * Clients built on go-containerregistry (imgpkg, vendir's imgpkg calls, kbld) use plain HTTP
 * for `127.0.0.1:<port>` without any insecure flag.
 */
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { httpAnswers, LOOPBACK, makeTempDir, removeTempDir, startProcess, withFreePort } from './process.js';

/** Path of Debian's registry binary (package `docker-registry`). */
export const DOCKER_REGISTRY_BIN = '/usr/bin/docker-registry';

/** JSON-serializable description of a running registry. */
export interface RegistryInfo {
  /** `127.0.0.1:<port>`; image refs are `${host}/<repo>:<tag>`. */
  readonly host: string;
  /** Temp dir holding the config file and the storage root. */
  readonly dir: string;
  /** The only account of a registry started with auth (pull and push need it). */
  readonly auth?: RegistryAuth;
}

/** A registry account. */
export interface RegistryAuth {
  readonly username: string;
  readonly password: string;
}

/**
 * The account of {@link startRegistry}'s `auth: true` and its htpasswd line. distribution reads
 * bcrypt entries only, and neither Node nor the machine has a bcrypt tool, so the hash (cost 4)
 * was made once, offline, for exactly this password: test credentials of a loopback registry.
 */
export const TEST_REGISTRY_AUTH: RegistryAuth & { htpasswd: string } = {
  username: 'e2e-puller',
  password: 'kapp-lambda-e2e-pull',
  htpasswd: 'e2e-puller:$2b$04$4Z1mPGsbk./qzzm73Vmh..oC7qgihq1MJl/8m45H3CaCfyZJ2W3nC',
};

/** A running registry: {@link RegistryInfo} plus `stop()`. */
export interface RegistryServer extends RegistryInfo {
  /** Kills the registry process and removes its temp dir. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Renders the registry config: filesystem storage under `storageDir`, deletes enabled, HTTP on
 * `127.0.0.1:<port>`, access log off; no auth section (anonymous push and pull) unless
 * `htpasswdPath` is given (basic auth against that file, realm `kapp-lambda-e2e`).
 */
export function registryConfig(storageDir: string, port: number, htpasswdPath?: string): string {
  return [
    'version: 0.1',
    'log:',
    '  level: warn',
    '  accesslog:',
    '    disabled: true',
    'storage:',
    '  filesystem:',
    `    rootdirectory: ${JSON.stringify(storageDir)}`,
    '  delete:',
    '    enabled: true',
    '  maintenance:',
    '    uploadpurging:',
    '      enabled: false',
    'http:',
    `  addr: ${LOOPBACK}:${port}`,
    `  secret: ${randomBytes(16).toString('hex')}`,
    '  headers:',
    '    X-Content-Type-Options: [nosniff]',
    ...(htpasswdPath
      ? ['auth:', '  htpasswd:', '    realm: kapp-lambda-e2e', `    path: ${JSON.stringify(htpasswdPath)}`]
      : []),
    '',
  ].join('\n');
}

/**
 * Starts `docker-registry serve <cfg>` on a free 127.0.0.1 port and waits until `GET /v2/`
 * answers (200; 401 with `auth`: every request then needs {@link TEST_REGISTRY_AUTH}).
 * @throws Error with the registry's output when it does not start (e.g. the Debian package
 *   `docker-registry` is missing: `npx tsx scripts/apt.ts` or `apt-get install docker-registry`).
 */
export async function startRegistry(opts: { auth?: boolean } = {}): Promise<RegistryServer> {
  const dir = await makeTempDir('registry');
  const storage = path.join(dir, 'storage');
  try {
    return await withFreePort(async (port) => {
      const cfg = path.join(dir, 'config.yml');
      const htpasswd = opts.auth ? path.join(dir, 'htpasswd') : undefined;
      if (htpasswd) await writeFile(htpasswd, `${TEST_REGISTRY_AUTH.htpasswd}\n`);
      await writeFile(cfg, registryConfig(storage, port, htpasswd));
      const host = `${LOOPBACK}:${port}`;
      const proc = await startProcess('docker-registry', [DOCKER_REGISTRY_BIN, 'serve', cfg], {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, OTEL_TRACES_EXPORTER: 'none' },
        ready: () => httpAnswers(`http://${host}/v2/`, (s) => s === (opts.auth ? 401 : 200)),
      });
      let stopped: Promise<void> | undefined;
      return {
        host,
        dir,
        ...(opts.auth
          ? { auth: { username: TEST_REGISTRY_AUTH.username, password: TEST_REGISTRY_AUTH.password } }
          : {}),
        stop() {
          stopped ??= proc.stop().then(() => removeTempDir(dir));
          return stopped;
        },
      };
    });
  } catch (e) {
    await removeTempDir(dir);
    throw e;
  }
}
