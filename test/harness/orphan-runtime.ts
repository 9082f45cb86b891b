/**
 * A stand-in Lambda runtime for `test/integration/exec.test.ts`: one process that starts a tool
 * through the real runner and launcher, where the tool leaves a process behind outside its
 * process group and session (`setsid -f`, so the process is re-parented), then reports whether
 * that process still runs after the run resolved. With `sweep` the process first becomes the
 * child subreaper and the runner gets the orphan sweeper, as `lambdaEntry` sets them up.
 *
 * With `pool` (the embedded runtime as root: no sweeper) the runner leases uids from a pool of
 * one, the tool runs under it, and a second run, under the same uid, looks for the left-behind
 * process (`kill -0`, which a process may send to any process of its own uid; a zombie, killed
 * but not yet reaped by init, does not count).
 *
 * Usage: `node --import tsx orphan-runtime.ts <sweep|none|pool> <launcher> <addon> <dir> <hold|quiet>`;
 * prints one JSON line `{ "pid": <left-behind pid>, "alive": <bool>, "exitCode": <n>, "ms": <n> }`,
 * with `pool` also `"uid"` (the first run's), `"underUid"` (pids running under it after the first
 * run) and `"next"` (the second run's uid and whether it saw the process). `hold` leaves the
 * process holding the tool's stdout (the run cannot end until it is gone).
 */
import { readFileSync } from 'node:fs';
import { mkdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { becomeSubreaper } from '../../functions/lib/exec/harden.js';
import { createOrphanSweeper, parseProcStat } from '../../functions/lib/exec/orphans.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { ensureTraversable, stageBinaries } from '../../functions/lib/exec/sandbox.js';
import { listProcessCreds, runsUnder } from '../../functions/lib/exec/uid-leases.js';

const [mode, launcher, addon, dir, hold] = process.argv.slice(2);
if (!mode || !launcher || !addon || !dir || !hold)
  throw new Error('usage: <sweep|none|pool> <launcher> <addon> <dir> <hold|quiet>');

/** The pool's one uid (above the other tests' uids). */
const POOL_UID = 910_300;
const pooled = mode === 'pool';
// Runs under the pool's uid reach their directories (and write the pid) through this one.
const work = path.join(dir, 'work');
if (pooled) {
  ensureTraversable(work);
  await mkdir(path.join(work, 'out'), { recursive: true });
}
// The launcher sits in root's private cache: a run under the pool's uid executes a staged copy.
const launch = pooled ? stageBinaries(['kl-launch'], () => launcher, path.join(work, 'bin'))('kl-launch') : launcher;

const orphans = mode === 'sweep' ? createOrphanSweeper({ reap: becomeSubreaper(addon) }) : undefined;
const runner = createCommandRunner({
  allow: ['sh'],
  resolveBin: () => '/bin/sh',
  tmpDir: pooled ? work : dir,
  launcher: launch,
  ...(orphans ? { orphans } : {}),
  ...(pooled ? { uidPool: { first: POOL_UID, size: 1 } } : {}),
});

const pidFile = pooled ? path.join(work, 'out', 'left-behind.pid') : path.join(dir, 'left-behind.pid');
const redirect = hold === 'hold' ? '' : ' </dev/null >/dev/null 2>&1';
// The left-behind process writes its pid, then sleeps; the tool waits for the pid and exits.
const script = [
  `/usr/bin/setsid -f /bin/sh -c 'echo $$ > "$1"; exec /bin/sleep ${pooled ? 600 : 60}' sh "$1"${redirect}`,
  'while [ ! -s "$1" ]; do /bin/sleep 0.05; done',
].join('\n');

const started = performance.now();
const result = await runner.run({
  cmd: 'sh',
  args: ['-c', `id -u; ${script}`, 'sh', pidFile],
  ...(pooled ? { writable: [path.join(work, 'out')] } : {}),
});
const ms = Math.round(performance.now() - started);
const pid = Number.parseInt(await readFile(pidFile, 'utf8'), 10);
let alive = false;
try {
  alive = parseProcStat(readFileSync(`/proc/${pid}/stat`, 'utf8'))?.state !== 'Z';
} catch {
  alive = false;
}
const report: Record<string, unknown> = { pid, alive, exitCode: result.exitCode, ms };
if (pooled) {
  const uid = Number.parseInt(result.stdout, 10);
  const underUid = (await listProcessCreds()).filter((p) => runsUnder(p, uid)).map((p) => p.pid);
  const next = await runner.run({
    cmd: 'sh',
    args: [
      '-c',
      // A zombie (killed, not yet reaped by init) runs nothing and holds nothing.
      `id -u; if kill -0 "$1" 2>/dev/null && ! grep -q '^State:.Z' "/proc/$1/status"; then echo seen; else echo unseen; fi`,
      'sh',
      String(pid),
    ],
  });
  const [nextUid, seen] = next.stdout.trim().split('\n');
  Object.assign(report, { uid, underUid, next: { uid: Number(nextUid), seen } });
}
process.stdout.write(`${JSON.stringify(report)}\n`);
