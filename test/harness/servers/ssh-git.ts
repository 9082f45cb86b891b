/**
 * Git over ssh for tests: a small SSH server on 127.0.0.1 (the pure-JavaScript `ssh2` package;
 * no sshd on the test machines or CI) that authenticates one client public key and serves
 * `git-upload-pack '<repo>'` exec requests by running the real `git-upload-pack` on a bare repo
 * under its root. Read-only: every other exec, shell, subsystem or forwarding request is
 * refused.
 *
 * The exec command is parsed strictly, as a forced command would: exactly
 * `git-upload-pack '<path>'` (git's own quoting of a path without quotes), the path absolute,
 * of plain characters, without `..`, naming an existing directory under the root. The program
 * runs by argv (`git-upload-pack --strict <dir>`), never through a shell, with an isolated git
 * environment and, when the client sent it, `GIT_PROTOCOL` (protocol v2) if it is `version=<n>`.
 */
import { spawn } from 'node:child_process';
import { timingSafeEqual } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import ssh2, { type Connection, type ParsedKey } from 'ssh2';
import { isolatedGitEnv } from './git.js';
import { LOOPBACK } from './process.js';

// ssh2 is CommonJS: its named exports are read from the default export.
const { Server, utils } = ssh2;

/** A key pair in OpenSSH formats. */
export interface SshKeyPair {
  /** `-----BEGIN OPENSSH PRIVATE KEY-----...` (no passphrase): what `ssh-privatekey` holds. */
  readonly privateKey: string;
  /** `ssh-ed25519 AAAA...`: an `authorized_keys` / `known_hosts` key. */
  readonly publicKey: string;
}

/**
 * A fresh ed25519 key pair (no passphrase). ssh2's generator strips leading zero bytes of the
 * public key, so about 1 pair in 256 is one ssh2 itself cannot parse (mscdex/ssh2#1390, #1513;
 * a CI run failed on it: `Cannot parse privateKey: Malformed OpenSSH private key`): such a pair
 * is drawn again.
 *
 * @throws Error when 32 pairs in a row do not parse (never, short of a broken ssh2)
 */
export function generateSshKey(): SshKeyPair {
  for (let i = 0; i < 32; i++) {
    const pair = utils.generateKeyPairSync('ed25519');
    if (utils.parseKey(pair.private) instanceof Error || utils.parseKey(pair.public) instanceof Error) continue;
    return { privateKey: pair.private, publicKey: pair.public.trim() };
  }
  throw new Error('ssh2 generated 32 ed25519 key pairs it cannot parse');
}

/** What one exec request asked for and how it ended. */
export interface SshExecRecord {
  /** The command as the client sent it. */
  readonly command: string;
  /** The bare repo served, or undefined when the command was refused. */
  readonly repo: string | undefined;
}

/** A running git-over-ssh server. */
export interface SshGitServer {
  /** The port on {@link LOOPBACK}. */
  readonly port: number;
  /** `[127.0.0.1]:<port> ssh-ed25519 AAAA...`: the `ssh-knownhosts` line of the host key. */
  readonly knownHostsLine: string;
  /** The host key pair. */
  readonly hostKey: SshKeyPair;
  /** TCP connections accepted so far. */
  readonly connections: number;
  /**
   * Of {@link connections}, those whose client end this process holds: made by the egress proxy
   * of a runtime running in the test process (ssh through the egress connector), not by an ssh
   * process of its own (Linux: read from `/proc/net/tcp*` and `/proc/self/fd`).
   */
  readonly fromThisProcess: number;
  /** Public keys (`ssh-ed25519 AAAA...`) of the successful authentications, in order. */
  readonly accepted: string[];
  /** Public keys offered and refused, in order. */
  readonly refused: string[];
  /** Exec requests, in order. */
  readonly execs: SshExecRecord[];
  /** `ssh://git@127.0.0.1:<port>/<name>` for a repo `<root>/<name>`. */
  url(name: string): string;
  /** Stops listening and drops every connection. Idempotent. */
  stop(): Promise<void>;
}

/** Options of {@link startSshGitServer}. */
export interface SshGitServerOptions {
  /** Directory holding the bare repos served (`<root>/<name>.git`). */
  root: string;
  /** The only client public key accepted (`ssh-ed25519 AAAA...`). */
  authorizedKey: string;
}

const EXEC = /^git-upload-pack '(\/[A-Za-z0-9._/-]+)'$/;

/**
 * The bare repo an exec command names under `root`, or undefined when the command is anything
 * but `git-upload-pack '<absolute path inside root>'` of an existing directory. Exported for tests.
 */
export function servedRepo(root: string, command: string): string | undefined {
  const m = EXEC.exec(command);
  if (!m?.[1]) return undefined;
  if (m[1].split('/').some((part) => part === '..' || part === '.')) return undefined;
  const base = path.resolve(root);
  const dir = path.resolve(base, `.${m[1]}`);
  if (!dir.startsWith(`${base}${path.sep}`)) return undefined;
  if (!existsSync(dir) || !statSync(dir).isDirectory()) return undefined;
  return dir;
}

/**
 * Whether this process holds the client end (`127.0.0.1:<clientPort>` → `:<serverPort>`) of a
 * loopback TCP connection: the socket's inode from `/proc/net/tcp*` among `/proc/self/fd`.
 */
function clientEndIsOurs(clientPort: number, serverPort: number): boolean {
  const hex = (n: number) => n.toString(16).toUpperCase().padStart(4, '0');
  const inodes = new Set<string>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols[1]?.endsWith(`:${hex(clientPort)}`) && cols[2]?.endsWith(`:${hex(serverPort)}`) && cols[9]) {
        inodes.add(`socket:[${cols[9]}]`);
      }
    }
  }
  if (inodes.size === 0) return false;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (inodes.has(readlinkSync(`/proc/self/fd/${fd}`))) return true;
    } catch {
      // closed meanwhile
    }
  }
  return false;
}

function keyText(key: { algo: string; data: Buffer }): string {
  return `${key.algo} ${key.data.toString('base64')}`;
}

function handleClient(client: Connection, opts: SshGitServerOptions, allowed: ParsedKey, state: SshGitServer): void {
  const allowedBlob = allowed.getPublicSSH();
  client.on('authentication', (ctx) => {
    if (ctx.method !== 'publickey') {
      ctx.reject(['publickey']);
      return;
    }
    const offered = keyText(ctx.key);
    const same =
      ctx.key.algo === allowed.type &&
      ctx.key.data.length === allowedBlob.length &&
      timingSafeEqual(ctx.key.data, allowedBlob);
    if (!same) {
      state.refused.push(offered);
      ctx.reject(['publickey']);
      return;
    }
    // The client first asks whether the key would do (no signature), then signs.
    if (!ctx.signature || !ctx.blob) {
      ctx.accept();
      return;
    }
    if (allowed.verify(ctx.blob, ctx.signature, ctx.hashAlgo) === true) {
      state.accepted.push(offered);
      ctx.accept();
    } else {
      state.refused.push(offered);
      ctx.reject(['publickey']);
    }
  });
  client.on('ready', () => {
    client.on('session', (acceptSession) => {
      const session = acceptSession();
      let protocol: string | undefined;
      session.on('env', (accept, reject, info) => {
        if (info.key === 'GIT_PROTOCOL' && /^version=[0-9]$/.test(info.val)) {
          protocol = info.val;
          accept?.();
        } else reject?.();
      });
      session.on('pty', (_accept, reject) => reject?.());
      session.on('shell', (_accept, reject) => reject());
      session.on('subsystem', (_accept, reject) => reject());
      session.on('exec', (accept, _reject, info) => {
        const repo = servedRepo(opts.root, info.command);
        state.execs.push({ command: info.command, repo });
        const channel = accept();
        if (!repo) {
          channel.stderr.write('only git-upload-pack of a served repository is allowed\n');
          channel.exit(1);
          channel.end();
          return;
        }
        const child = spawn('git-upload-pack', ['--strict', repo], {
          env: isolatedGitEnv(protocol ? { GIT_PROTOCOL: protocol } : {}),
          stdio: ['pipe', 'pipe', 'pipe'],
        });
        channel.pipe(child.stdin);
        child.stdout.pipe(channel, { end: false });
        child.stderr.pipe(channel.stderr, { end: false });
        child.stdin.on('error', () => undefined);
        child.on('error', (err) => {
          channel.stderr.write(`git-upload-pack: ${err.message}\n`);
          channel.exit(127);
          channel.end();
        });
        child.on('close', (code) => {
          channel.exit(code ?? 1);
          channel.end();
        });
      });
    });
  });
  client.on('request', (_accept, reject) => reject?.());
  client.on('tcpip', (_accept, reject) => reject());
  client.on('error', () => undefined);
}

/**
 * Starts a git-over-ssh server on 127.0.0.1 (an ephemeral port) with a fresh ed25519 host key.
 *
 * @throws Error when the authorized key cannot be parsed or the server cannot listen.
 */
export async function startSshGitServer(opts: SshGitServerOptions): Promise<SshGitServer> {
  const parsed = utils.parseKey(opts.authorizedKey);
  if (parsed instanceof Error) throw new Error(`authorized key: ${parsed.message}`);
  const allowed = Array.isArray(parsed) ? (parsed[0] as ParsedKey) : parsed;
  const hostKey = generateSshKey();
  const connections = new Set<Connection>();
  let port = 0;
  let accepted = 0;
  let fromThisProcess = 0;
  const state: SshGitServer = {
    get port() {
      return port;
    },
    get connections() {
      return accepted;
    },
    get fromThisProcess() {
      return fromThisProcess;
    },
    get knownHostsLine() {
      return `[${LOOPBACK}]:${port} ${hostKey.publicKey}`;
    },
    hostKey,
    accepted: [],
    refused: [],
    execs: [],
    url: (name) => `ssh://git@${LOOPBACK}:${port}/${name}`,
    stop: async () => {
      for (const c of connections) c.end();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = new Server({ hostKeys: [hostKey.privateKey] }, (client, info) => {
    accepted++;
    if (clientEndIsOurs(info.port, port)) fromThisProcess++;
    connections.add(client);
    client.on('close', () => connections.delete(client));
    handleClient(client, opts, allowed, state);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, LOOPBACK, () => resolve());
  });
  port = (server.address() as AddressInfo).port;
  let stopped: Promise<void> | undefined;
  const stop = state.stop;
  (state as { stop: () => Promise<void> }).stop = () => {
    stopped ??= stop();
    return stopped;
  };
  return state;
}
