import { defineConfig } from 'vitest/config';

// Three kinds of tests (style.md §15): unit (no network, fakes only at ports), integration
// (real servers), e2e (whole flow). Integration and e2e share one control plane and one set
// of servers started by test/harness/global-setup.ts.
export default defineConfig({
  test: {
    pool: 'forks',
    // The pinned AWS SDK works on Node 20; its notice about future releases is noise here.
    env: { AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' },
    maxWorkers: 2,
    projects: [
      { extends: true, test: { name: 'unit', include: ['test/unit/**/*.test.ts'] } },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts', 'test/e2e/**/*.test.ts'],
          globalSetup: ['test/harness/global-setup.ts'],
          testTimeout: 180_000,
          hookTimeout: 300_000,
          maxWorkers: 1,
        },
      },
    ],
  },
});
