/**
 * A stand-in Lambda runtime for `test/integration/exec.test.ts`: one process that starts a tool
 * through the real runner and launcher, where the tool leaves a process behind outside its
 * process group and session (`setsid -f`, so the process is re-parented), then reports whether
 * that process still runs after the run resolved. With `sweep` the process first becomes the
 * child subreaper and the runner gets the orphan sweeper, as `lambdaEntry` sets them up.
 *
 * Usage: `node --import tsx orphan-runtime.ts <sweep|none> <launcher> <addon> <dir> <hold|quiet>`;
 * prints one JSON line `{ "pid": <left-behind pid>, "alive": <bool>, "exitCode": <n>, "ms": <n> }`.
 * `hold` leaves the process holding the tool's stdout (the run cannot end until it is gone).
 */
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { becomeSubreaper } from '../../functions/lib/exec/harden.js';
import { createOrphanSweeper, parseProcStat } from '../../functions/lib/exec/orphans.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';

const [mode, launcher, addon, dir, hold] = process.argv.slice(2);
if (!mode || !launcher || !addon || !dir || !hold)
  throw new Error('usage: <sweep|none> <launcher> <addon> <dir> <hold|quiet>');

const orphans = mode === 'sweep' ? createOrphanSweeper({ reap: becomeSubreaper(addon) }) : undefined;
const runner = createCommandRunner({
  allow: ['sh'],
  resolveBin: () => '/bin/sh',
  tmpDir: dir,
  launcher,
  ...(orphans ? { orphans } : {}),
});

const pidFile = path.join(dir, 'left-behind.pid');
const redirect = hold === 'hold' ? '' : ' </dev/null >/dev/null 2>&1';
// The left-behind process writes its pid, then sleeps; the tool waits for the pid and exits.
const script = [
  `/usr/bin/setsid -f /bin/sh -c 'echo $$ > "$1"; exec /bin/sleep 60' sh "$1"${redirect}`,
  'while [ ! -s "$1" ]; do /bin/sleep 0.05; done',
].join('\n');

const started = performance.now();
const result = await runner.run({ cmd: 'sh', args: ['-c', script, 'sh', pidFile] });
const ms = Math.round(performance.now() - started);
const pid = Number.parseInt(await readFile(pidFile, 'utf8'), 10);
let alive = false;
try {
  alive = parseProcStat(readFileSync(`/proc/${pid}/stat`, 'utf8'))?.state !== 'Z';
} catch {
  alive = false;
}
process.stdout.write(`${JSON.stringify({ pid, alive, exitCode: result.exitCode, ms })}\n`);
