/**
 * The orphan sweeper's choices (`functions/lib/exec/orphans.ts`) against a scripted process
 * table: which children it kills, which it leaves alone, and that it follows re-parenting.
 * The real processes are in `test/integration/exec.test.ts`.
 */
import { describe, expect, it } from 'vitest';
import { createOrphanSweeper, type ProcStat, parseProcStat } from '../../functions/lib/exec/orphans.js';

describe('parseProcStat', () => {
  it('reads state, ppid and session after the last parenthesis of the command name', () => {
    const line = '4242 (evil) (x y) S 100 4242 4242 0 -1 4194560 96 0 0 0 0 0 0 0 20 0 1 0 1234 5';
    expect(parseProcStat(line)).toEqual({ pid: 4242, state: 'S', ppid: 100, session: 4242 });
  });

  it('refuses text that is not a stat line', () => {
    expect(parseProcStat('garbage')).toBeUndefined();
    expect(parseProcStat('12 (x)')).toBeUndefined();
  });
});

/** A process table the sweeper reads; killing a process re-parents its children to `self`. */
function table(self: number, procs: ProcStat[]) {
  let live = [...procs];
  const killed: number[] = [];
  const reaped: number[] = [];
  return {
    killed,
    reaped,
    list: () => live.map((p) => ({ ...p })),
    kill: (pid: number) => {
      killed.push(pid);
      live = live.map((p) => (p.pid === pid ? { ...p, state: 'Z' } : p.ppid === pid ? { ...p, ppid: self } : p));
    },
    reap: (pid: number) => {
      const p = live.find((q) => q.pid === pid);
      if (p?.state !== 'Z') return 0;
      live = live.filter((q) => q.pid !== pid);
      reaped.push(pid);
      return pid;
    },
  };
}

describe('createOrphanSweeper', () => {
  const self = 100;
  const base: ProcStat[] = [
    { pid: 1, state: 'S', ppid: 0, session: 1 },
    { pid: self, state: 'S', ppid: 1, session: 50 },
    // An exec credential plugin the runtime started itself: same session.
    { pid: 101, state: 'S', ppid: self, session: 50 },
    // Left behind by a finished run: its own session (setsid), with a child of its own.
    { pid: 300, state: 'S', ppid: self, session: 300 },
    { pid: 301, state: 'S', ppid: 300, session: 300 },
    // Not ours at all.
    { pid: 400, state: 'S', ppid: 1, session: 400 },
  ];

  it('kills and reaps what runs left behind, following re-parented children, and nothing else', async () => {
    const t = table(self, base);
    const sweeper = createOrphanSweeper({ self, list: t.list, kill: t.kill, reap: t.reap, pauseMs: 0 });
    const done = await sweeper.sweep();
    expect([...new Set(t.killed)].sort()).toEqual([300, 301]);
    expect(t.reaped.sort()).toEqual([300, 301]);
    expect(done.sort()).toEqual([300, 301]);
    expect(t.list().map((p) => p.pid)).toEqual([1, self, 101, 400]);
  });

  it('does nothing while a run is in flight, and spares runs started meanwhile', async () => {
    const t = table(self, [...base, { pid: 500, state: 'S', ppid: self, session: 500 }]);
    const sweeper = createOrphanSweeper({ self, list: t.list, kill: t.kill, reap: t.reap, pauseMs: 0 });
    sweeper.started(500);
    expect(await sweeper.sweep()).toEqual([]);
    expect(t.killed).toEqual([]);
    sweeper.ended(500);
    // Node has waited for that run's launcher (500) by now. The sweep's first pass finds what
    // was left behind; during its pause a new run (600, with a child 601) starts, and the sweep
    // kills only what is left behind (301, re-parented) and stops, never taking the new run for it.
    const t2 = table(self, base);
    let calls = 0;
    const later = createOrphanSweeper({
      self,
      list: () => {
        calls += 1;
        if (calls === 2) {
          later.started(600);
          return [
            ...t2.list(),
            { pid: 600, state: 'S', ppid: self, session: 600 },
            { pid: 601, state: 'S', ppid: self, session: 600 },
          ];
        }
        return t2.list();
      },
      kill: t2.kill,
      reap: t2.reap,
      pauseMs: 0,
    });
    await later.sweep();
    expect([...new Set(t2.killed)].sort()).toEqual([300, 301]);
    expect(t2.killed).not.toContain(600);
    expect(t2.killed).not.toContain(601);
  });

  it('kills a chain of any depth in one pass', async () => {
    const chain: ProcStat[] = Array.from({ length: 100 }, (_, i) => ({
      pid: 1000 + i,
      state: 'S',
      ppid: i === 0 ? self : 1000 + i - 1,
      session: 1000,
    }));
    const t = table(self, [...base.slice(0, 3), ...chain]);
    let passes = 0;
    const sweeper = createOrphanSweeper({
      self,
      list: () => {
        passes += 1;
        return t.list();
      },
      kill: t.kill,
      reap: t.reap,
      pauseMs: 0,
    });
    await sweeper.sweep();
    expect(new Set(t.killed).size).toBe(100);
    // The first pass killed the whole chain; the next ones only reap what was re-parented.
    expect(t.killed.slice(0, 100).sort()).toEqual(chain.map((p) => p.pid).sort());
    expect(passes).toBeLessThan(10);
  });

  it('kills a zombie too: a process whose main thread exited shows Z while its threads run', async () => {
    const killed: number[] = [];
    let leaderAlive = true;
    const sweeper = createOrphanSweeper({
      self,
      list: () => [
        { pid: self, state: 'S', ppid: 1, session: 50 },
        ...(leaderAlive ? [{ pid: 700, state: 'Z', ppid: self, session: 700 }] : []),
      ],
      kill: (pid) => {
        killed.push(pid);
      },
      // Not reapable while a thread of it runs; reapable once killed.
      reap: (pid) => {
        if (!killed.includes(pid)) return 0;
        leaderAlive = false;
        return pid;
      },
      pauseMs: 0,
    });
    expect(await sweeper.sweep()).toEqual([700]);
    expect(killed).toEqual([700]);
  });

  it('gives up when its time budget is spent while processes keep appearing, and says which are left', async () => {
    let next = 1000;
    let clock = 0;
    const killed: number[] = [];
    let left: number[] | undefined;
    const sweeper = createOrphanSweeper({
      self,
      // A fork loop: every pass shows a new child.
      list: () => [
        { pid: self, state: 'S', ppid: 1, session: 50 },
        { pid: next++, state: 'S', ppid: self, session: 999 },
      ],
      kill: (pid) => killed.push(pid),
      reap: () => 0,
      now: () => (clock += 1_000),
      budgetMs: 5_000,
      pauseMs: 0,
      onGiveUp: (pids) => {
        left = pids;
      },
    });
    await sweeper.sweep();
    expect(killed.length).toBeGreaterThanOrEqual(3);
    expect(killed.length).toBeLessThanOrEqual(5);
    expect(left).toEqual([next - 1]);
  });

  it('a failing process listing ends the sweep quietly', async () => {
    const sweeper = createOrphanSweeper({
      self,
      list: () => {
        throw new Error('EACCES');
      },
      kill: () => {},
      reap: () => 0,
    });
    expect(await sweeper.sweep()).toEqual([]);
  });
});
