/**
 * S3-compatible object storage for tests: versitygw's `posix` backend (pinned in
 * `layers/manifest.ts`) serving a temp dir on 127.0.0.1, with a random root key pair.
 *
 * The key pair is passed through versitygw's environment (`ROOT_ACCESS_KEY`,
 * `ROOT_SECRET_KEY`), not argv, so it does not show in process listings. Object metadata
 * goes to extended attributes; when the temp dir's file system has no user xattrs, a
 * `--sidecar` metadata dir is used instead.
 */
import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';
import { binPath } from '../../../layers/gobuild.js';
import { component } from '../../../layers/manifest.js';
import { httpAnswers, LOOPBACK, makeTempDir, removeTempDir, startProcess, withFreePort } from './process.js';

/** JSON-serializable description of a running S3 server and its credentials. */
export interface S3Info {
  /** `http://127.0.0.1:<port>`; clients must use path-style addressing. */
  readonly endpoint: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  /** Signing region, `us-east-1`. */
  readonly region: string;
  /** A bucket created at start, when one was asked for. */
  readonly bucket?: string;
  /** Temp dir holding the buckets (`<dir>/data`) and, if used, the sidecar metadata. */
  readonly dir: string;
}

/** A running S3 server: {@link S3Info} plus `stop()`. */
export interface S3Server extends S3Info {
  /** Kills versitygw and removes its temp dir. Idempotent. */
  stop(): Promise<void>;
}

/** Path of the pinned versitygw binary in the tool cache. */
export function versitygwBin(): string {
  return binPath(component('versitygw'), 'versitygw');
}

/** Region every test S3 server signs for. */
export const S3_REGION = 'us-east-1';

/**
 * Makes an S3 client for a test server: path-style addressing, static credentials, no retries
 * beyond the SDK default of 3.
 */
export function s3Client(s3: S3Info): S3Client {
  return new S3Client({
    endpoint: s3.endpoint,
    region: s3.region,
    forcePathStyle: true,
    credentials: { accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey },
  });
}

/**
 * Creates a bucket on a test server.
 * @throws the SDK error when the name is invalid or the bucket already exists.
 */
export async function createBucket(s3: S3Info, bucket: string): Promise<void> {
  const client = s3Client(s3);
  try {
    await client.send(new CreateBucketCommand({ Bucket: bucket }));
  } finally {
    client.destroy();
  }
}

/**
 * argv for versitygw's posix backend on `127.0.0.1:<port>` with a `/healthz` probe path and
 * request logging off (`--quiet`).
 * Credentials are not in argv (see {@link startS3Server}). Pure; exported for tests.
 */
export function versitygwArgv(bin: string, port: number, dataDir: string, sidecarDir?: string): string[] {
  return [
    bin,
    '--port',
    `${LOOPBACK}:${port}`,
    '--region',
    S3_REGION,
    '--health',
    '/healthz',
    '--quiet',
    'posix',
    ...(sidecarDir ? ['--sidecar', sidecarDir] : []),
    dataDir,
  ];
}

/**
 * Starts versitygw on a free 127.0.0.1 port over a fresh temp dir, with a random key pair,
 * and waits until it answers HTTP. Retries once with `--sidecar` when it refuses to start
 * because the file system lacks xattrs.
 * @param opts.bucket bucket to create once it runs.
 * @throws Error with versitygw's output when it does not start (e.g. not built yet:
 *   `npm run setup`).
 */
export async function startS3Server(opts: { bucket?: string } = {}): Promise<S3Server> {
  const dir = await makeTempDir('s3');
  const dataDir = path.join(dir, 'data');
  await mkdir(dataDir);
  const accessKeyId = `test${randomBytes(8).toString('hex')}`;
  const secretAccessKey = randomBytes(24).toString('base64url');
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: dir,
    ROOT_ACCESS_KEY: accessKeyId,
    ROOT_SECRET_KEY: secretAccessKey,
  };
  const start = (sidecar?: string) =>
    withFreePort(async (port) => {
      const proc = await startProcess('versitygw', versitygwArgv(versitygwBin(), port, dataDir, sidecar), {
        env,
        ready: () => httpAnswers(`http://${LOOPBACK}:${port}/healthz`, (s) => s === 200),
      });
      return { proc, port };
    });
  try {
    let started: Awaited<ReturnType<typeof start>>;
    try {
      started = await start();
    } catch (e) {
      if (!/xattr|extended attribute/i.test(String((e as Error).message))) throw e;
      const sidecar = path.join(dir, 'meta');
      await mkdir(sidecar);
      started = await start(sidecar);
    }
    const { proc, port } = started;
    let stopped: Promise<void> | undefined;
    const server: S3Server = {
      endpoint: `http://${LOOPBACK}:${port}`,
      accessKeyId,
      secretAccessKey,
      region: S3_REGION,
      ...(opts.bucket ? { bucket: opts.bucket } : {}),
      dir,
      stop() {
        stopped ??= proc.stop().then(() => removeTempDir(dir));
        return stopped;
      },
    };
    if (opts.bucket) {
      await createBucket(server, opts.bucket).catch(async (e: unknown) => {
        await server.stop();
        throw new Error(`start s3: create bucket ${opts.bucket}`, { cause: e });
      });
    }
    return server;
  } catch (e) {
    await removeTempDir(dir);
    throw e;
  }
}
