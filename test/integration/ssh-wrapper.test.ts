/**
 * The egress connector's `ssh` wrapper (`layers/native/connect.c`) with its passwd shim
 * (`layers/native/passwd.c`, `kl-passwd.so`) and the real OpenSSH client, against the test SSH
 * server (`../harness/servers/ssh-git.ts`), without an egress proxy in the environment (the
 * wrapper then runs ssh directly):
 *
 * - ssh's home is `$HOME`, not the passwd entry's: the default identity `$HOME/.ssh/id_ed25519`
 *   is the one offered, and the host key accepted without strict checking is written to
 *   `$HOME/.ssh/known_hosts` (the runner gives each run a private `HOME`; without the shim ssh
 *   used the runtime user's `~/.ssh`, shared by every App);
 * - as a uid `/etc/passwd` does not list (the root runtime's tool uids, `DEFAULT_UID_POOL`), ssh
 *   runs instead of exiting with `No user exists for uid <n>`.
 *
 * And the test server's own rule: only `git-upload-pack '<served repo>'` runs.
 */
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmod, chown, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canSwitchUid, DEFAULT_UID_POOL, stageBinaries } from '../../functions/lib/exec/sandbox.js';
import { buildConnector, CONNECTOR_NAME, SSH_PASSWD_NAME } from '../../layers/native.js';
import { createRepo } from '../harness/fixtures.js';
import { generateSshKey, type SshGitServer, type SshKeyPair, startSshGitServer } from '../harness/servers/ssh-git.js';

const run = promisify(execFile);

let scratch: string;
let server: SshGitServer;
let key: SshKeyPair;
let wrapper: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'ssh-wrapper-'));
  await chmod(scratch, 0o755);
  const root = path.join(scratch, 'repos');
  await createRepo({ baseUrl: 'unused', root }, 'repo', { 'config.yml': 'a: 1\n' });
  key = generateSshKey();
  server = await startSshGitServer({ root, authorizedKey: key.publicKey });
  // Staged as the root runtime stages it, where other uids can run it (root's cache is private).
  const built = path.dirname(buildConnector(() => {}));
  const names = [CONNECTOR_NAME, 'ssh', SSH_PASSWD_NAME];
  wrapper = stageBinaries(names, (name) => path.join(built, name), path.join(scratch, 'bin'))('ssh');
}, 60_000);

afterAll(async () => {
  await server?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

/** A HOME holding the authorized key as the default identity, owned by `uid`. */
async function homeWithKey(name: string, uid: number): Promise<string> {
  const home = path.join(scratch, name);
  await mkdir(path.join(home, '.ssh'), { recursive: true, mode: 0o700 });
  await writeFile(path.join(home, '.ssh', 'id_ed25519'), key.privateKey, { mode: 0o600 });
  for (const p of [home, path.join(home, '.ssh'), path.join(home, '.ssh', 'id_ed25519')]) await chown(p, uid, uid);
  return home;
}

/** `ssh ... git@127.0.0.1 <command>` through the wrapper. */
async function uploadPack(home: string, prefix: string[] = [], command = "git-upload-pack '/repo.git'") {
  const args = [
    ...prefix,
    wrapper,
    '-F',
    '/dev/null',
    '-o',
    'BatchMode=yes',
    '-o',
    'StrictHostKeyChecking=no',
    '-p',
    String(server.port),
    'git@127.0.0.1',
    command,
  ];
  const [cmd, ...rest] = args as [string, ...string[]];
  // git-upload-pack sends its refs; a flush packet (no wants) ends the conversation cleanly.
  const child = spawn(cmd, rest, { env: { PATH: '/usr/bin:/bin', HOME: home }, stdio: ['pipe', 'pipe', 'pipe'] });
  child.stdin.end('0000');
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (b: Buffer) => {
    stdout += b.toString();
  });
  child.stderr.on('data', (b: Buffer) => {
    stderr += b.toString();
  });
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, stdout, stderr };
}

describe("the ssh wrapper's passwd shim", () => {
  it('ssh takes $HOME as its home: the default identity there is offered, the host key recorded there', async () => {
    const uid = process.getuid?.() ?? 0;
    const home = await homeWithKey('home-own-uid', uid);
    const before = server.accepted.length;
    const out = await uploadPack(home);
    expect(out, out.stderr).toMatchObject({ code: 0, stdout: expect.stringContaining('refs/heads/main') });
    expect(server.accepted.slice(before)).toEqual([key.publicKey]);
    expect(await readFile(path.join(home, '.ssh', 'known_hosts'), 'utf8')).toContain(
      `[127.0.0.1]:${server.port} ${server.hostKey.publicKey.split(' ').slice(0, 2).join(' ')}`,
    );
  });

  it('as a uid /etc/passwd does not list: ssh connects and authenticates', async () => {
    expect(canSwitchUid()).toBe(true); // this suite runs as root, as CI does
    const uid = DEFAULT_UID_POOL.first + DEFAULT_UID_POOL.size - 1;
    await expect(run('getent', ['passwd', String(uid)])).rejects.toThrow();
    const home = await homeWithKey('home-pool-uid', uid);
    const before = server.accepted.length;
    const out = await uploadPack(home, ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', '--']);
    expect(out, out.stderr).toMatchObject({ code: 0, stdout: expect.stringContaining('refs/heads/main') });
    expect(server.accepted.slice(before)).toEqual([key.publicKey]);
  });
});

describe('the test SSH server (a forced command)', () => {
  it.each([
    "git-receive-pack '/repo.git'",
    "git-upload-pack '/../repos/repo.git'",
    "git-upload-pack '/missing.git'",
    "git-upload-pack '/repo.git'; id",
    'git-upload-pack /repo.git',
  ])('refuses %s', async (command) => {
    const home = await homeWithKey(`home-refused-${server.execs.length}`, process.getuid?.() ?? 0);
    const out = await uploadPack(home, [], command);
    expect(out.code).toBe(1);
    expect(out.stderr).toContain('only git-upload-pack of a served repository is allowed');
    expect(server.execs.at(-1)).toEqual({ command, repo: undefined });
  });
});
