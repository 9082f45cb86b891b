/**
 * e2e: sources with credentials. Git over ssh with a `secretRef` (reference §3.6; vendir's git auth keys
 * `ssh-privatekey` and `ssh-knownhosts`), through the whole flow with the real vendir, git and
 * OpenSSH client against a local SSH server (`../harness/servers/ssh-git.ts`: ssh2, serving the
 * real `git-upload-pack` on a bare repo built here).
 *
 * vendir (`pkg/vendir/fetch/git/git.go`) runs git with
 * `GIT_SSH_COMMAND=ssh -o ServerAliveInterval=30 -o ForwardAgent=no -F /dev/null -i <key>
 * -o IdentitiesOnly=yes` and either `-o StrictHostKeyChecking=yes -o UserKnownHostsFile=<known
 * hosts>` or, without `ssh-knownhosts`, `-o StrictHostKeyChecking=no` (the App CRD: "if
 * ssh-knownhosts is not specified, git will not perform strict host checking"). Cases:
 *
 * - key and known hosts: ReconcileSucceeded, the ConfigMap of the repo deployed, vendir's lock
 *   output (the commit) in `status.fetch.stdout`, the server saw the key;
 * - a key the server does not know: `Fetching resources: Error (...)` with vendir's and ssh's
 *   `Permission denied (publickey)` in `usefulErrorMessage`;
 * - no `ssh-knownhosts`: succeeds (no strict host checking);
 * - `ssh-knownhosts` holding another host key: `Host key verification failed.`;
 * - the URL policy enforced (a second runtime), the server on the allow-list: succeeds, ssh
 *   going through the egress connector and proxy; a server not on it: refused before any tool
 *   runs with the policy's message, and that server never saw a connection.
 *
 * And an http source whose basic-auth Secret holds a wrong password: the server answers 401 and
 * the App fails as vendir's http fetch does (`Expected 200 OK, but was '401 Unauthorized'`),
 * without the password in status. (The right password is run in `app-features.test.ts`.)
 */
import type http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRepo, type GitRepo } from '../harness/fixtures.js';
import { type LoopbackHttpService, makeTempDir, startLoopbackHttp } from '../harness/servers/process.js';
import { generateSshKey, type SshGitServer, type SshKeyPair, startSshGitServer } from '../harness/servers/ssh-git.js';
import {
  type AppObject,
  apply,
  appManifest,
  type E2ERuntime,
  expectFailed,
  expectSucceeded,
  getObject,
  SEE_USEFUL,
  suffix,
  useE2ERuntime,
} from './support.js';

const id = suffix();
const NS = { main: `e2e-ssh-${id}`, policy: `e2e-ssh-policy-${id}` };
const N = {
  ok: `ssh-ok-${id}`,
  wrongKey: `ssh-wrong-key-${id}`,
  noKnownHosts: `ssh-no-known-hosts-${id}`,
  otherHost: `ssh-other-host-${id}`,
  proxied: `ssh-proxied-${id}`,
  refused: `ssh-refused-${id}`,
  httpWrong: `http-wrong-password-${id}`,
};
const HTTP_USER = 'e2e-user';
const HTTP_PASSWORD = `right-${id}`;
const WRONG_PASSWORD = `wrong-${id}`;
/** The Authorization header of each request the basic-auth server saw. */
const authSeen: (string | undefined)[] = [];
let authServer: LoopbackHttpService;

let server: SshGitServer;
/** The server on the policy runtime's allow-list. */
let listed: SshGitServer;
/** A second server on another port, left off the policy runtime's allow-list. */
let unlisted: SshGitServer;
let repo: GitRepo;
let clientKey: SshKeyPair;

/** A ConfigMap manifest `<app>-config` recording where it came from. */
function configMap(app: string): string {
  return `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${app}-config\ndata:\n  source: git over ssh\n`;
}

beforeAll(async () => {
  const root = await makeTempDir('ssh-git');
  // One file per App, so each App deploys only its own ConfigMap (ytt `paths`).
  repo = await createRepo({ baseUrl: 'unused', root }, 'repo', {
    ...Object.fromEntries(Object.values(N).map((app) => [`${app}/cm.yml`, configMap(app)])),
  });
  clientKey = generateSshKey();
  const expected = `Basic ${Buffer.from(`${HTTP_USER}:${HTTP_PASSWORD}`).toString('base64')}`;
  authServer = await startLoopbackHttp(
    'basic auth server',
    await makeTempDir('basic-auth'),
    (req: http.IncomingMessage, res) => {
      authSeen.push(req.headers.authorization);
      if (req.headers.authorization !== expected) {
        res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="e2e"' }).end('401 unauthorized\n');
        return;
      }
      res.writeHead(200, { 'Content-Type': 'application/x-yaml' }).end(configMap(N.httpWrong));
    },
  );
  [server, listed, unlisted] = (await Promise.all(
    [1, 2, 3].map(() => startSshGitServer({ root, authorizedKey: clientKey.publicKey })),
  )) as [SshGitServer, SshGitServer, SshGitServer];
});

afterAll(async () => {
  await Promise.all([server?.stop(), listed?.stop(), unlisted?.stop(), authServer?.stop()]);
});

const rt = useE2ERuntime([NS.main]);
const policyRt = useE2ERuntime([NS.policy], {
  overrides: () => ({ config: { urlPolicy: { mode: 'enforce', allow: [`127.0.0.1:${listed.port}`] } } }),
});

function secret(ns: string, name: string, data: Record<string, string>): object {
  return { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: ns }, stringData: data };
}

function sshApp(ns: string, name: string, url: string, secretName: string): object {
  return appManifest(ns, name, {
    fetch: [{ git: { url, ref: 'origin/main', secretRef: { name: secretName } } }],
    template: [{ ytt: { paths: [name] } }],
    deploy: [{ kapp: {} }],
  });
}

beforeAll(async () => {
  const url = server.url('repo.git');
  const keyAndHosts = { 'ssh-privatekey': clientKey.privateKey, 'ssh-knownhosts': `${server.knownHostsLine}\n` };
  await apply(
    secret(NS.main, 'ssh-auth', keyAndHosts),
    secret(NS.main, 'ssh-wrong-key', { ...keyAndHosts, 'ssh-privatekey': generateSshKey().privateKey }),
    secret(NS.main, 'ssh-key-only', { 'ssh-privatekey': clientKey.privateKey }),
    secret(NS.main, 'ssh-other-host', {
      ...keyAndHosts,
      'ssh-knownhosts': `[127.0.0.1]:${server.port} ${generateSshKey().publicKey}\n`,
    }),
    sshApp(NS.main, N.ok, url, 'ssh-auth'),
    sshApp(NS.main, N.wrongKey, url, 'ssh-wrong-key'),
    sshApp(NS.main, N.noKnownHosts, url, 'ssh-key-only'),
    sshApp(NS.main, N.otherHost, url, 'ssh-other-host'),
    secret(NS.policy, 'ssh-listed', {
      'ssh-privatekey': clientKey.privateKey,
      'ssh-knownhosts': `${listed.knownHostsLine}\n`,
    }),
    secret(NS.policy, 'ssh-unlisted', {
      'ssh-privatekey': clientKey.privateKey,
      'ssh-knownhosts': `${unlisted.knownHostsLine}\n`,
    }),
    sshApp(NS.policy, N.proxied, listed.url('repo.git'), 'ssh-listed'),
    sshApp(NS.policy, N.refused, unlisted.url('repo.git'), 'ssh-unlisted'),
    secret(NS.main, 'http-wrong', { username: HTTP_USER, password: WRONG_PASSWORD }),
    appManifest(NS.main, N.httpWrong, {
      fetch: [{ http: { url: `${authServer.baseUrl}/private/config.yml`, secretRef: { name: 'http-wrong' } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
  );
});

/** The App's ConfigMap was deployed and vendir's lock output names the repo's commit. */
async function expectDeployed(r: E2ERuntime, ns: string, name: string): Promise<AppObject> {
  const app = await r.waitReconciled(ns, name, 170_000);
  await expectSucceeded(app);
  const s = app.status!;
  expect(s.fetch?.stdout).toContain('kind: LockConfig');
  expect(s.fetch?.stdout).toContain(`sha: ${repo.commitSha}`);
  expect(s.fetch?.stdout).toContain(`commitTitle: 'fixture: repo'`);
  const cm = await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`);
  expect(cm?.data).toEqual({ source: 'git over ssh' });
  return app;
}

/** A failed fetch: upstream's `Fetching resources` condition, vendir's stderr as the useful message. */
async function expectFetchFailed(r: E2ERuntime, ns: string, name: string): Promise<string> {
  const app = await r.waitReconciled(ns, name, 170_000);
  const message = `Fetching resources: ${SEE_USEFUL}`;
  expectFailed(app, message);
  const s = app.status!;
  expect(s.fetch?.exitCode).toBe(1);
  expect(s.fetch?.error).toBe(message);
  expect(s.usefulErrorMessage).toMatch(/^vendir: Error: Syncing directory '0':/);
  expect(s.fetch?.stderr).toBe(s.usefulErrorMessage);
  // vendir names the key file it wrote, never the key
  expect(JSON.stringify(s)).not.toContain(clientKey.privateKey.split('\n')[1]);
  expect(s.template).toBeUndefined();
  expect(s.deploy).toBeUndefined();
  expect(await getObject('configmap', ns, `${name}-config`)).toBeUndefined();
  return s.usefulErrorMessage ?? '';
}

describe.concurrent('git over ssh with a secretRef (ssh-privatekey, ssh-knownhosts)', () => {
  it('key and known hosts: ReconcileSucceeded, the repo deployed, the server saw the key', async () => {
    await expectDeployed(rt, NS.main, N.ok);
    expect(server.accepted).toContain(clientKey.publicKey);
    expect(server.execs).toContainEqual({ command: "git-upload-pack '/repo.git'", repo: repo.gitDir });
    // Without the URL policy, ssh connects by itself (no egress proxy).
    expect(server.connections).toBeGreaterThanOrEqual(1);
    expect(server.fromThisProcess).toBe(0);
  });

  it('a key the server does not know: Fetching resources, Permission denied (publickey) from ssh', async () => {
    const text = await expectFetchFailed(rt, NS.main, N.wrongKey);
    expect(text).toContain('Permission denied (publickey)');
    expect(text).toContain('fatal: Could not read from remote repository.');
    expect(server.refused.length).toBeGreaterThanOrEqual(1);
    expect(server.refused).not.toContain(clientKey.publicKey);
  });

  it('no ssh-knownhosts: no strict host checking, as upstream, so it succeeds', async () => {
    await expectDeployed(rt, NS.main, N.noKnownHosts);
  });

  it('ssh-knownhosts naming another key for the host: Host key verification failed', async () => {
    const text = await expectFetchFailed(rt, NS.main, N.otherHost);
    expect(text).toContain('Host key verification failed.');
    expect(text).toContain(`[127.0.0.1]:${server.port}`);
  });

  it('URL policy enforced, the server allow-listed: succeeds through the egress proxy', async () => {
    await expectDeployed(policyRt, NS.policy, N.proxied);
    // Every connection came from the runtime's egress proxy (in this process), none from ssh.
    expect(listed.accepted).toContain(clientKey.publicKey);
    expect(listed.connections).toBeGreaterThanOrEqual(1);
    expect(listed.fromThisProcess).toBe(listed.connections);
  });

  it('URL policy enforced, a server not allow-listed: refused before any tool runs, no connection', async () => {
    const app = await policyRt.waitReconciled(NS.policy, N.refused, 170_000);
    // The URL's user is masked in status as every URL's userinfo (it may hold a token).
    const target = unlisted.url('repo.git').replace('//git@', '//***@');
    const refused = `Fetching resources: URL policy refused ${target}: 127.0.0.1, a loopback address, which this deployment does not allow`;
    expectFailed(app, refused);
    expect(app.status?.fetch?.error).toBe(refused);
    expect(app.status?.template).toBeUndefined();
    expect(unlisted.connections).toBe(0);
    expect(unlisted.execs).toEqual([]);
  });
});

describe('http with a basic-auth secretRef', () => {
  it("a wrong password: the server saw it and answered 401, Fetching resources with vendir's http error", async () => {
    const app = await rt.waitReconciled(NS.main, N.httpWrong, 170_000);
    const message = `Fetching resources: ${SEE_USEFUL}`;
    expectFailed(app, message);
    const s = app.status!;
    expect(s.usefulErrorMessage).toBe(
      "vendir: Error: Syncing directory '0':\n  Syncing directory '.' with HTTP contents:\n    Downloading URL:\n      Expected 200 OK, but was '401 Unauthorized'\n",
    );
    expect(s.fetch?.stderr).toBe(s.usefulErrorMessage);
    expect(s.fetch?.exitCode).toBe(1);
    expect(authSeen).toContain(`Basic ${Buffer.from(`${HTTP_USER}:${WRONG_PASSWORD}`).toString('base64')}`);
    expect(JSON.stringify(s)).not.toContain(WRONG_PASSWORD);
    expect(s.template).toBeUndefined();
    expect(await getObject('configmap', NS.main, `${N.httpWrong}-config`)).toBeUndefined();
  });
});
