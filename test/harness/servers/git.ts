/**
 * Git server for tests: Git's smart HTTP protocol, as GitHub serves it, by running
 * `git http-backend` (Debian `git`) as a CGI program behind a small Node HTTP server on
 * 127.0.0.1. Read-only: every bare repo under the root dir is exported for fetch/clone, and
 * pushes are refused (http-backend refuses `git-receive-pack` to anonymous users).
 *
 * Repos are bare dirs `<root>/<name>.git`, served at `<baseUrl>/<name>` and
 * `<baseUrl>/<name>.git` (http-backend tries the `.git` suffix). Because the server reads the
 * file system on every request, any process can add repos (see `createRepo` in
 * `test/harness/fixtures.ts`) while it runs.
 */
import { spawn } from 'node:child_process';
import type http from 'node:http';
import path from 'node:path';
import { LOOPBACK, makeTempDir, startLoopbackHttp } from './process.js';

/** JSON-serializable description of a running git server. */
export interface GitServerInfo {
  /** `http://127.0.0.1:<port>`, no trailing slash; a repo's URL is `${baseUrl}/<name>`. */
  readonly baseUrl: string;
  /** Directory holding the bare repos (`<root>/<name>.git`). */
  readonly root: string;
}

/** A running git server: {@link GitServerInfo} plus `stop()`. */
export interface GitServer extends GitServerInfo {
  /** Closes the HTTP server (and its open connections) and removes the repos dir. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Environment for git commands that must not read the machine's or user's git config
 * (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`) and never prompt.
 */
export function isolatedGitEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? '/nonexistent',
    LANG: 'C',
    GIT_CONFIG_NOSYSTEM: '1',
    GIT_CONFIG_GLOBAL: '/dev/null',
    GIT_TERMINAL_PROMPT: '0',
    ...extra,
  };
}

/**
 * Builds the CGI/1.1 environment `git http-backend` reads for one request.
 * Pure; exported for tests.
 */
export function cgiEnv(root: string, req: http.IncomingMessage, url: URL): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = isolatedGitEnv({
    GIT_PROJECT_ROOT: root,
    GIT_HTTP_EXPORT_ALL: '1',
    GATEWAY_INTERFACE: 'CGI/1.1',
    SERVER_PROTOCOL: `HTTP/${req.httpVersion}`,
    SERVER_SOFTWARE: 'kapp-lambda-test-git',
    REQUEST_METHOD: req.method ?? 'GET',
    PATH_INFO: decodeURIComponent(url.pathname),
    QUERY_STRING: url.search.replace(/^\?/, ''),
    REMOTE_ADDR: req.socket.remoteAddress ?? LOOPBACK,
  });
  const h = req.headers;
  if (h['content-type']) env.CONTENT_TYPE = h['content-type'];
  if (h['content-length']) env.CONTENT_LENGTH = h['content-length'];
  if (typeof h['content-encoding'] === 'string') env.HTTP_CONTENT_ENCODING = h['content-encoding'];
  if (typeof h['git-protocol'] === 'string') {
    env.HTTP_GIT_PROTOCOL = h['git-protocol'];
    env.GIT_PROTOCOL = h['git-protocol'];
  }
  return env;
}

/**
 * Splits CGI output into status, headers and the start of the body. Returns undefined while
 * the blank line ending the headers has not arrived yet. Pure; exported for tests.
 */
export function parseCgiHead(buf: Buffer): { status: number; headers: [string, string][]; body: Buffer } | undefined {
  const crlf = buf.indexOf('\r\n\r\n');
  const lf = buf.indexOf('\n\n');
  let end: number;
  let sep: number;
  if (crlf >= 0 && (lf < 0 || crlf < lf)) {
    end = crlf;
    sep = 4;
  } else if (lf >= 0) {
    end = lf;
    sep = 2;
  } else return undefined;
  let status = 200;
  const headers: [string, string][] = [];
  for (const line of buf.subarray(0, end).toString('latin1').split(/\r?\n/)) {
    const i = line.indexOf(':');
    if (i <= 0) continue;
    const name = line.slice(0, i).trim();
    const value = line.slice(i + 1).trim();
    if (name.toLowerCase() === 'status') status = Number.parseInt(value, 10) || 500;
    else headers.push([name, value]);
  }
  return { status, headers, body: buf.subarray(end + sep) };
}

/**
 * The request handler of {@link startGitServer}: `git http-backend` over the bare repos under
 * `root`. Exported so a test can put its own front before it (TLS, an auth gate).
 */
export function gitHttpBackend(root: string): http.RequestListener {
  return (req, res) => serveCgi(root, req, res);
}

function serveCgi(root: string, req: http.IncomingMessage, res: http.ServerResponse): void {
  let env: NodeJS.ProcessEnv;
  try {
    const url = new URL(req.url ?? '/', 'http://localhost');
    env = cgiEnv(root, req, url);
    if (env.PATH_INFO?.split('/').includes('..')) throw new Error('path leaves the repos dir');
  } catch {
    res.writeHead(400).end('bad path\n');
    return;
  }
  const child = spawn('git', ['http-backend'], { env, stdio: ['pipe', 'pipe', 'pipe'] });
  let head = Buffer.alloc(0);
  let headersSent = false;
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4096);
  });
  child.stdout.on('data', (d: Buffer) => {
    if (headersSent) {
      res.write(d);
      return;
    }
    head = Buffer.concat([head, d]);
    const parsed = parseCgiHead(head);
    if (!parsed) return;
    headersSent = true;
    res.statusCode = parsed.status;
    for (const [k, v] of parsed.headers) res.appendHeader(k, v);
    if (parsed.body.length) res.write(parsed.body);
  });
  child.on('error', (e) => {
    if (!headersSent) res.writeHead(500).end(`git http-backend: ${e.message}\n`);
    else res.destroy(e);
  });
  child.on('close', (code) => {
    if (!headersSent) {
      res.writeHead(500).end(`git http-backend exited ${code}: ${stderr}\n`);
      return;
    }
    res.end();
  });
  child.stdin.on('error', () => {});
  req.pipe(child.stdin);
}

/**
 * Starts the smart-HTTP git server on a free 127.0.0.1 port, with a fresh empty repos dir.
 * @throws Error when the HTTP server cannot listen.
 */
export async function startGitServer(): Promise<GitServer> {
  const root = await makeTempDir('git');
  return await startLoopbackHttp('git server', root, gitHttpBackend(root));
}

/** Absolute path of the bare repo dir for `name` under a git server's root. */
export function repoDir(git: GitServerInfo, name: string): string {
  return path.join(git.root, `${name}.git`);
}
