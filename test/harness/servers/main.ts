/**
 * Command line: `tsx test/harness/servers/main.ts [all|s3|sqs|registry|git|http]` starts the named
 * server(s) (default `all`, with the standard fixtures), prints one JSON line describing them
 * on stdout (the S3 secret key redacted), and runs until SIGINT/SIGTERM, then stops them. Used by the cleanup tests (kill
 * this process with SIGKILL and check that nothing is left) and handy for poking at the
 * servers by hand.
 */
import { startGitServer } from './git.js';
import { startHttpServer } from './http.js';
import { startRegistry } from './registry.js';
import { startS3Server } from './s3.js';
import { startSqsServer } from './sqs.js';

const what = process.argv[2] ?? 'all';
const starters: Record<string, () => Promise<{ stop(): Promise<void> }>> = {
  s3: () => startS3Server({ bucket: 'kapp-lambda' }),
  sqs: startSqsServer,
  registry: startRegistry,
  git: startGitServer,
  http: startHttpServer,
  all: async () => (await import('../servers.js')).startAllServers(),
};
const start = starters[what];
if (!start) {
  process.stderr.write(`usage: main.ts [${Object.keys(starters).join('|')}]\n`);
  process.exit(2);
}
const servers = await start();
const { stop: _stop, ...info } = servers as { stop(): Promise<void> } & Record<string, unknown>;
// never print a secret, even a throw-away one
const redact = (k: string, v: unknown) => (k === 'secretAccessKey' ? '<redacted>' : v);
process.stdout.write(`${JSON.stringify({ pid: process.pid, ...info }, redact)}\n`);
const keepAlive = setInterval(() => {}, 1 << 30);
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => {
    clearInterval(keepAlive);
    void servers.stop().then(() => process.exit(0));
  });
}
