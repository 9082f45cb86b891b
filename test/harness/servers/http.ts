/**
 * Static HTTP file server for tests (helm chart repos, archives for `http` fetches), a plain
 * Node `http` server on 127.0.0.1 serving a temp dir. It reads the file system on each
 * request, so any process may add files under `root` while it runs.
 */
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import type http from 'node:http';
import path from 'node:path';
import { makeTempDir, startLoopbackHttp } from './process.js';

/** JSON-serializable description of a running static server. */
export interface HttpServerInfo {
  /** `http://127.0.0.1:<port>`, no trailing slash; `<root>/a/b` is served at `${baseUrl}/a/b`. */
  readonly baseUrl: string;
  /** Directory being served. */
  readonly root: string;
}

/** A running static server: {@link HttpServerInfo} plus `stop()`. */
export interface HttpServer extends HttpServerInfo {
  /** Closes the server and its connections and removes the served dir. Idempotent. */
  stop(): Promise<void>;
}

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  '.yaml': 'application/x-yaml',
  '.yml': 'application/x-yaml',
  '.json': 'application/json',
  '.tgz': 'application/gzip',
  '.gz': 'application/gzip',
  '.zip': 'application/zip',
  '.tar': 'application/x-tar',
  '.txt': 'text/plain; charset=utf-8',
};

/**
 * Maps a request path to a file under `root`, or undefined when it would leave `root`.
 * Pure; exported for tests.
 */
export function resolveUnder(root: string, urlPath: string): string | undefined {
  let decoded: string;
  try {
    decoded = decodeURIComponent(urlPath);
  } catch {
    return undefined;
  }
  if (decoded.includes('\0') || decoded.split('/').includes('..')) return undefined;
  const file = path.resolve(root, `.${path.posix.normalize(`/${decoded}`)}`);
  return file === root || file.startsWith(`${root}${path.sep}`) ? file : undefined;
}

async function serveFile(root: string, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { Allow: 'GET, HEAD' }).end();
    return;
  }
  const file = resolveUnder(root, new URL(req.url ?? '/', 'http://localhost').pathname);
  const st = file ? await stat(file).catch(() => undefined) : undefined;
  if (!file || !st?.isFile()) {
    res.writeHead(404, { 'Content-Type': 'text/plain' }).end('404 not found\n');
    return;
  }
  res.writeHead(200, {
    'Content-Type': CONTENT_TYPES[path.extname(file)] ?? 'application/octet-stream',
    'Content-Length': st.size,
    'Last-Modified': st.mtime.toUTCString(),
  });
  if (req.method === 'HEAD') {
    res.end();
    return;
  }
  createReadStream(file)
    .on('error', (e) => res.destroy(e))
    .pipe(res);
}

/**
 * Starts the static server on a free 127.0.0.1 port, serving a fresh empty temp dir.
 * @throws Error when the server cannot listen.
 */
export async function startHttpServer(): Promise<HttpServer> {
  const root = await makeTempDir('http');
  return await startLoopbackHttp('http server', root, (req, res) => {
    serveFile(root, req, res).catch((e: Error) => {
      if (!res.headersSent) res.writeHead(500).end(`${e.message}\n`);
      else res.destroy(e);
    });
  });
}
