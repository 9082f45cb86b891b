import { defineConfig } from 'vitest/config';
import { E2EFirstSequencer } from './test/harness/sequencer.js';

// Three kinds of tests (`reference/style.md` §15, kept in the team's shared folder beside the checkout: docs/CONVENTIONS.md): unit (no network, fakes only at ports), integration
// (real servers), e2e (whole flow). Integration and e2e share one control plane and one set
// of servers started by test/harness/global-setup.ts.
export default defineConfig({
  test: {
    pool: 'forks',
    // The pinned AWS SDK works on Node 20; its notice about future releases is noise here.
    env: { AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' },
    maxWorkers: 2,
    sequence: { sequencer: E2EFirstSequencer },
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          // A worker runs several unit files, importing the shared modules (the kube client, the
          // AWS SDK) once instead of once per file: import was most of the unit time. The unit
          // tests keep no state across files (no module mocks, fake timers restored after each).
          isolate: false,
          // Some unit tests are CPU-bound by design (a megabyte constraint, a large tarball, every
          // CRD schema): about a second alone, several while the two cores are shared, so vitest's
          // 5 s default failed now and then on a loaded machine. A hang still fails.
          testTimeout: 20_000,
        },
      },
      {
        extends: true,
        test: {
          // The CDK app, synthesized offline (no credentials, no servers). Its own project
          // because it bundles every function first (tens of seconds on a busy machine), which
          // the unit project, run before every commit, should not pay.
          name: 'infra',
          include: ['test/infra/**/*.test.ts'],
          hookTimeout: 300_000,
          testTimeout: 60_000,
        },
      },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts', 'test/e2e/**/*.test.ts'],
          // A worker runs file after file on one module graph, as the unit project does: importing
          // it afresh for each file (the kube client, the AWS SDK, the whole pipeline) was about
          // 2 s of CPU per file, a fifth of the suite's CPU on the 2-core machine (621 s → 489 s
          // of vitest for the 70 files). The files share no state through modules: every file
          // has its own namespaces, runtime and servers' buckets, and disposes them in afterAll.
          isolate: false,
          globalSetup: ['test/harness/global-setup.ts'],
          testTimeout: 180_000,
          hookTimeout: 300_000,
          // Files run in parallel: most of their time is spent waiting (reconciles, backoffs,
          // Lease expiry, quiet windows), not on the CPU. They share the control plane but not
          // its objects: every file has its own random namespaces, and a runtime's Lease is
          // named by the namespaces it watches. The one fault that would disturb the others
          // (pausing the API server) runs on its own control plane (faults-pause.test.ts).
          // KAPP_LAMBDA_TEST_WORKERS overrides it (e.g. 1 on a machine busy with other work).
          // 5 on 2 cores: the files mostly wait (the suite keeps about one core busy); two suites
          // at once (6 files at a time) passed five fresh-clone runs in a row, so 5 keeps a margin.
          maxWorkers: Number(process.env.KAPP_LAMBDA_TEST_WORKERS) || 5,
          // After the unit tests (a group of its own: another maxWorkers).
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
