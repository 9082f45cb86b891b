/**
 * vitest's file order with the e2e files first: they are the long ones (most of their time is
 * spent waiting on reconciles, backoffs and Lease expiry), so with several workers they start
 * at once instead of last. Otherwise vitest's own order: longest first from its results cache,
 * larger files first without it (a fresh clone, a new file).
 */
import { BaseSequencer, type TestSpecification } from 'vitest/node';

const E2E = /[/\\]test[/\\]e2e[/\\]/;

/**
 * e2e files known to be the longest, started before all others whatever the cache says, longest
 * first: on a fresh clone (CI) there is no results cache, and the 200-App burst of
 * `faults-burst` (about 3–6 minutes on 2 cores) would otherwise start after the larger files and
 * end last; the others wait out sync and safety periods (1–2.5 minutes each).
 */
const LONGEST = [
  'faults-burst.test.ts',
  'package-install.test.ts',
  'reconcile-by-exception.test.ts',
  'reconcile-by-exception-recovery.test.ts',
  'resync-noop.test.ts',
];
const rank = (f: TestSpecification) => {
  const i = LONGEST.findIndex((name) => f.moduleId.endsWith(name));
  return i < 0 ? LONGEST.length : i;
};

export class E2EFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const e2e = sorted.filter((f) => E2E.test(f.moduleId));
    // Array.prototype.sort is stable: among equal ranks vitest's order is kept.
    e2e.sort((a, b) => rank(a) - rank(b));
    return [...e2e, ...sorted.filter((f) => !E2E.test(f.moduleId))];
  }
}
