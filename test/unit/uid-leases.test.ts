/**
 * The tool uid pool's leases (`functions/lib/exec/uid-leases.ts`) against a scripted process
 * table and lock: a uid goes back only once nothing runs under it, leftovers are killed, a uid
 * that cannot be cleared is quarantined, and a uid held by another runtime is skipped. The real
 * processes are in `test/integration/exec.test.ts`.
 */
import { describe, expect, it } from 'vitest';
import {
  type ProcCreds,
  parseProcStatus,
  runsUnder,
  UidLeases,
  type UidLock,
} from '../../functions/lib/exec/uid-leases.js';

const STATUS = [
  'Name:\tx\\nUid:\t0\t0\t0\t0',
  'Umask:\t0022',
  'State:\tS (sleeping)',
  'Tgid:\t4242',
  'Uid:\t910000\t910000\t910000\t910000',
  'Gid:\t910000\t910000\t910000\t910000',
  'Threads:\t1',
  '',
].join('\n');

describe('parseProcStatus', () => {
  it('reads state, threads and the four uids; an escaped name cannot forge a Uid line', () => {
    expect(parseProcStatus(4242, STATUS)).toEqual({
      pid: 4242,
      state: 'S',
      threads: 1,
      uids: [910000, 910000, 910000, 910000],
    });
  });

  it('refuses text that is not a status file', () => {
    expect(parseProcStatus(1, 'garbage')).toBeUndefined();
    expect(parseProcStatus(1, 'State:\tS (sleeping)\nThreads:\t1\nUid:\tx\n')).toBeUndefined();
  });
});

describe('runsUnder', () => {
  const p = (state: string, threads: number, uids: number[]): ProcCreds => ({ pid: 7, state, threads, uids });

  it('counts any of the four uids (a setuid binary keeps the real one)', () => {
    expect(runsUnder(p('S', 1, [910000, 0, 0, 0]), 910000)).toBe(true);
    expect(runsUnder(p('S', 1, [910001, 910001, 910001, 910001]), 910000)).toBe(false);
  });

  it('skips a dead zombie but not a zombie leader whose other threads run', () => {
    expect(runsUnder(p('Z', 1, [910000, 910000, 910000, 910000]), 910000)).toBe(false);
    expect(runsUnder(p('Z', 2, [910000, 910000, 910000, 910000]), 910000)).toBe(true);
  });
});

/** A process table: a killed process is gone from the next scan unless it is `unkillable`. */
function table(procs: { pid: number; uid: number }[], unkillable: number[] = []) {
  let live = procs.map((p) => ({ pid: p.pid, state: 'S', threads: 1, uids: [p.uid, p.uid, p.uid, p.uid] }));
  const killed: number[] = [];
  const events: string[] = [];
  let scans = 0;
  return {
    killed,
    events,
    scans: () => scans,
    add: (pid: number, uid: number) => live.push({ pid, state: 'S', threads: 1, uids: [uid, uid, uid, uid] }),
    list: async () => {
      scans++;
      events.push('scan');
      return live.map((p) => ({ ...p }));
    },
    kill: (pid: number) => {
      killed.push(pid);
      events.push(`kill ${pid}`);
      if (!unkillable.includes(pid)) live = live.filter((p) => p.pid !== pid);
    },
  };
}

/** A host-wide lock where `elsewhere` uids are held by another process. */
function locks(elsewhere = new Set<number>()) {
  const held = new Set<number>();
  const lock: UidLock = {
    tryLock: async (uid) => {
      if (held.has(uid) || elsewhere.has(uid)) return undefined;
      held.add(uid);
      return () => held.delete(uid);
    },
  };
  return { lock, held, elsewhere };
}

const POOL = { first: 910000, size: 2 };

describe('UidLeases', () => {
  it('returns a uid after one scan when nothing runs under it, and holds it host-wide meanwhile', async () => {
    const t = table([{ pid: 1, uid: 0 }]);
    const l = locks();
    const leases = new UidLeases(POOL, { list: t.list, kill: t.kill, lock: l.lock, pauseMs: 0 });
    const uid = await leases.acquire();
    expect(uid).toBe(910000);
    expect([...l.held]).toEqual([910000]);
    const before = t.scans();
    expect(await leases.release(uid)).toBe(true);
    expect(t.scans() - before).toBe(1);
    expect(t.killed).toEqual([]);
    expect([...l.held]).toEqual([]);
  });

  it('kills every process left under the uid before the cleanup and before the uid goes back', async () => {
    const t = table([
      { pid: 1, uid: 0 },
      { pid: 50, uid: 910001 },
    ]);
    const l = locks();
    const leases = new UidLeases(POOL, { list: t.list, kill: t.kill, lock: l.lock, pauseMs: 0 });
    const uid = await leases.acquire();
    // The run's tool leaves a daemon and a setsid escapee behind.
    t.add(300, uid);
    t.add(301, uid);
    t.events.length = 0;
    const released = await leases.release(uid, async () => {
      t.events.push('cleanup');
    });
    expect(released).toBe(true);
    expect(t.events).toEqual(['scan', 'kill 300', 'kill 301', 'scan', 'cleanup']);
    // The other uid's process and root's are never touched.
    expect(t.killed).toEqual([300, 301]);
    expect(await leases.acquire()).toBe(910001);
    expect(await leases.acquire()).toBe(uid);
  });

  it('quarantines a uid that still has processes after the budget, reports them, and never leases it again', async () => {
    let clock = 0;
    const t = table([], [300]);
    const l = locks();
    const told: [number, readonly number[]][] = [];
    const leases = new UidLeases(POOL, {
      list: async () => {
        clock += 1_000;
        return await t.list();
      },
      kill: t.kill,
      lock: l.lock,
      pauseMs: 0,
      budgetMs: 5_000,
      now: () => clock,
      onQuarantine: (uid, left) => told.push([uid, left]),
    });
    const uid = await leases.acquire();
    t.add(300, uid);
    let cleaned = false;
    const released = await leases.release(uid, async () => {
      cleaned = true;
    });
    expect(released).toBe(false);
    expect(cleaned).toBe(true);
    expect(told).toEqual([[910000, [300]]]);
    expect(leases.quarantined).toEqual([910000]);
    // Kept held: no other runtime on the host leases it either.
    expect(l.held.has(910000)).toBe(true);
    expect(await leases.acquire()).toBe(910001);
    expect(await leases.release(910001)).toBe(true);
    expect(await leases.acquire()).toBe(910001);
  });

  it('quarantines a uid when /proc cannot be read', async () => {
    const l = locks();
    let fail = false;
    const leases = new UidLeases(POOL, {
      list: async () => {
        if (fail) throw new Error('EMFILE');
        return [];
      },
      kill: () => undefined,
      lock: l.lock,
    });
    const uid = await leases.acquire();
    fail = true;
    expect(await leases.release(uid)).toBe(false);
    expect(leases.quarantined).toEqual([uid]);
  });

  it('clears what a previous runtime left under a uid before leasing it the first time', async () => {
    const t = table([{ pid: 400, uid: 910000 }]);
    const leases = new UidLeases(POOL, { list: t.list, kill: t.kill, lock: locks().lock, pauseMs: 0 });
    expect(await leases.acquire()).toBe(910000);
    expect(t.killed).toEqual([400]);
  });

  it('skips a uid another process holds, and a waiting run takes one once it is free', async () => {
    const t = table([]);
    const l = locks(new Set([910000]));
    const leases = new UidLeases(POOL, { list: t.list, kill: t.kill, lock: l.lock, pauseMs: 0, retryMs: 1 });
    expect(await leases.acquire()).toBe(910001);
    const waiting = leases.acquire();
    l.elsewhere.delete(910000);
    expect(await waiting).toBe(910000);
  });

  it('hands a released uid to the oldest waiting run', async () => {
    const t = table([]);
    const leases = new UidLeases({ first: 910000, size: 1 }, { list: t.list, kill: t.kill, lock: locks().lock });
    const uid = await leases.acquire();
    const order: string[] = [];
    const a = leases.acquire().then((u) => order.push(`a ${u}`));
    const b = leases.acquire().then((u) => order.push(`b ${u}`));
    await leases.release(uid);
    await a;
    await leases.release(uid);
    await b;
    expect(order).toEqual(['a 910000', 'b 910000']);
  });
});
