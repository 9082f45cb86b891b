/**
 * `ensureTraversable` of the tool sandbox (`functions/lib/exec/sandbox.ts`): what it changes of
 * the directories above a runner's temp directory, on a temp directory like a Pod's emptyDir
 * (0777, not sticky) and like `/tmp` (1777).
 */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ensureTraversable } from '../../functions/lib/exec/sandbox.js';

const mode = (p: string) => statSync(p).mode & 0o7777;

describe('ensureTraversable', () => {
  let shared: string;
  beforeEach(() => {
    shared = mkdtempSync(path.join(tmpdir(), 'sandbox-unit-'));
  });
  afterEach(() => rmSync(shared, { recursive: true, force: true }));

  it('takes group and other write from a shared directory without the sticky bit (an emptyDir)', () => {
    chmodSync(shared, 0o777);
    const runs = path.join(shared, 'kapp-lambda-x');
    mkdirSync(runs, { mode: 0o700 });
    ensureTraversable(runs);
    // Another uid could otherwise rename the staged tools' directory and put its own there.
    expect(mode(shared)).toBe(0o755);
    expect(mode(runs)).toBe(0o701);
  });

  it('leaves a sticky shared directory (/tmp) as it is', () => {
    chmodSync(shared, 0o1777);
    ensureTraversable(path.join(shared, 'runs'));
    expect(mode(shared)).toBe(0o1777);
  });
});
