/**
 * vitest's file order with the e2e files first: they are the long ones (most of their time is
 * spent waiting on reconciles, backoffs and Lease expiry), so with several workers they start
 * at once instead of last. Otherwise vitest's own order: longest first from its results cache,
 * larger files first without it (a fresh clone, a new file).
 */
import { BaseSequencer, type TestSpecification } from 'vitest/node';

const E2E = /[/\\]test[/\\]e2e[/\\]/;

export class E2EFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    return [...sorted.filter((f) => E2E.test(f.moduleId)), ...sorted.filter((f) => !E2E.test(f.moduleId))];
  }
}
