// Installs npm dependencies on first use (fresh clone) or when package-lock.json changed.
// Plain JavaScript with no dependencies: it runs before node_modules exists.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';

const lock = readFileSync('package-lock.json');
const want = createHash('sha256').update(lock).digest('hex');
const stamp = 'node_modules/.kapp-lambda-lock-sha256';
if (existsSync(stamp) && readFileSync(stamp, 'utf8').trim() === want) process.exit(0);
process.stderr.write('[deps] installing npm dependencies (npm ci)...\n');
// npm's http log is the only progress it gives without a TTY (one line per registry request,
// about two per package; npm's own summary counts packages):
// count those lines and print a progress line every 50; pass everything else through.
const child = spawn('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=http'], {
  stdio: ['inherit', 'inherit', 'pipe'],
});
let fetched = 0;
let pending = '';
child.stderr.setEncoding('utf8');
child.stderr.on('data', (chunk) => {
  const lines = (pending + chunk).split('\n');
  pending = lines.pop() ?? '';
  for (const line of lines) {
    if (/^npm http fetch /.test(line)) {
      fetched++;
      if (fetched % 50 === 0) process.stderr.write(`[deps] ${fetched} registry requests...\n`);
    } else if (line.trim() !== '') {
      process.stderr.write(`${line}\n`);
    }
  }
});
const status = await new Promise((resolve) => child.on('close', (code) => resolve(code)));
if (pending.trim() !== '' && !/^npm http fetch /.test(pending)) process.stderr.write(`${pending}\n`);
if (status !== 0) process.exit(status ?? 1);
process.stderr.write(`[deps] installed (${fetched} registry requests)\n`);
writeFileSync(stamp, `${want}\n`);
