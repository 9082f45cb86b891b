// Installs npm dependencies on first use (fresh clone) or when package-lock.json changed.
// Plain JavaScript with no dependencies: it runs before node_modules exists.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';

const lock = readFileSync('package-lock.json');
const want = createHash('sha256').update(lock).digest('hex');
const stamp = 'node_modules/.kapp-lambda-lock-sha256';
if (existsSync(stamp) && readFileSync(stamp, 'utf8').trim() === want) process.exit(0);
process.stderr.write('[deps] installing npm dependencies (npm ci)...\n');
const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=http'], { stdio: 'inherit' });
if (r.status !== 0) process.exit(r.status ?? 1);
writeFileSync(stamp, `${want}\n`);
