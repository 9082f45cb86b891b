/**
 * vitest's file order with the longest files first ({@link LONGEST}), then the other e2e files: they are the long ones (most of their time is
 * spent waiting on reconciles, backoffs and Lease expiry), so with several workers they start
 * at once instead of last. Otherwise vitest's own order: longest first from its results cache,
 * larger files first without it (a fresh clone, a new file).
 */
import { BaseSequencer, type TestSpecification } from 'vitest/node';

const E2E = /[/\\]test[/\\]e2e[/\\]/;

/**
 * Files known to be the longest (e2e and integration: about a minute or more each in a
 * fresh-clone run), started before all others whatever the cache says, longest first: on a fresh
 * clone (CI) there is no results cache, and the 200-App burst of `faults-burst` (2–6 minutes on 2
 * cores) would otherwise start after the larger files and end last; the others wait out sync and
 * safety periods or start a control plane of their own. An integration file left to the end (the
 * join test's own control plane) made a minute-long tail.
 */
const LONGEST = [
  'faults-burst.test.ts',
  'resync-noop.test.ts',
  'cloud.test.ts',
  'hostile.test.ts',
  'reconcile-by-exception-recovery.test.ts',
  'app-features.test.ts',
  'reconcile-by-exception.test.ts',
  'package-install.test.ts',
  'release-install.test.ts',
  'cluster-join.test.ts',
  'app-parity.test.ts',
  'faults.test.ts',
  'delete-terminating.test.ts',
  'sources.test.ts',
  'forwarder.test.ts',
  'faults-kill.test.ts',
  'cluster-registry.test.ts',
];
const rank = (f: TestSpecification) => {
  const i = LONGEST.findIndex((name) => f.moduleId.endsWith(name));
  return i < 0 ? LONGEST.length : i;
};

export class E2EFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const longest = sorted.filter((f) => rank(f) < LONGEST.length).sort((a, b) => rank(a) - rank(b));
    const rest = sorted.filter((f) => rank(f) === LONGEST.length);
    // Array.prototype.sort is stable: among the rest vitest's order is kept.
    return [...longest, ...rest.filter((f) => E2E.test(f.moduleId)), ...rest.filter((f) => !E2E.test(f.moduleId))];
  }
}
