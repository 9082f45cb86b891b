/**
 * OCI registry for tests: Debian's `docker-registry` (CNCF distribution 2.8) with its own
 * config file: filesystem storage in a temp dir, no auth, plain HTTP on 127.0.0.1.
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
}

/** A running registry: {@link RegistryInfo} plus `stop()`. */
export interface RegistryServer extends RegistryInfo {
  /** Kills the registry process and removes its temp dir. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Renders the registry config: filesystem storage under `storageDir`, deletes enabled, no
 * auth section (anonymous push and pull), HTTP on `127.0.0.1:<port>`, access log off.
 */
export function registryConfig(storageDir: string, port: number): string {
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
    '',
  ].join('\n');
}

/**
 * Starts `docker-registry serve <cfg>` on a free 127.0.0.1 port and waits until `GET /v2/`
 * answers 200.
 * @throws Error with the registry's output when it does not start (e.g. the Debian package
 *   `docker-registry` is missing: `npx tsx scripts/apt.ts` or `apt-get install docker-registry`).
 */
export async function startRegistry(): Promise<RegistryServer> {
  const dir = await makeTempDir('registry');
  const storage = path.join(dir, 'storage');
  try {
    return await withFreePort(async (port) => {
      const cfg = path.join(dir, 'config.yml');
      await writeFile(cfg, registryConfig(storage, port));
      const host = `${LOOPBACK}:${port}`;
      const proc = await startProcess('docker-registry', [DOCKER_REGISTRY_BIN, 'serve', cfg], {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, OTEL_TRACES_EXPORTER: 'none' },
        ready: () => httpAnswers(`http://${host}/v2/`, (s) => s === 200),
      });
      let stopped: Promise<void> | undefined;
      return {
        host,
        dir,
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
