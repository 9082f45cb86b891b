/**
 * The release manifest (`release/kapp-lambda-<version>.yml`, `scripts/release.ts`) against the
 * shared control plane: `kubectl apply -f` of the whole file, as the README tells an operator,
 * is accepted by the API server in a server-side dry run (schemas of the CRDs, the admission
 * policy's CEL, RBAC objects, the Deployment), nothing changed. The release holds no custom
 * resource, so its CRDs need not be established first. Only the `kapp-lambda` namespace must
 * exist for a dry run of the objects in it (a real apply creates it first, from the same file);
 * other files of the run share and create it too. The in-cluster runtime release binds roles the
 * first file creates; a server dry run accepts a binding to a role that does not exist yet.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, inject, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import {
  packageVersion,
  RELEASE_DIR,
  RELEASE_NAMESPACE,
  releaseFileName,
  runtimeReleaseFileName,
} from '../../scripts/release.js';
import { apply } from '../e2e/support.js';
import { kubectl } from '../harness/kube.js';

const kubeconfigPath = inject('kubeconfigPath');
const cluster = inject('cluster');

/** `text` matched literally in a RegExp. */
const literal = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('release manifest on the control plane', () => {
  it.each([
    ['the release', releaseFileName],
    ['the in-cluster runtime release', runtimeReleaseFileName],
  ])(
    'kubectl apply --dry-run=server -f accepts every document of %s',
    async (_what, fileName) => {
      const file = path.join(RELEASE_DIR, fileName(await packageVersion()));
      const docs = parseAllDocuments(await readFile(file, 'utf8')).map(
        (d) => d.toJS() as { kind: string; metadata: { name: string } },
      );
      await apply({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: RELEASE_NAMESPACE } });
      const r = await kubectl(kubeconfigPath, ['apply', '--dry-run=server', '-f', file], {
        kubectl: cluster.kubectlPath,
        check: false,
      });
      // Objects the shared control plane already has (the CRDs, applied by the test setup without
      // kubectl) draw kubectl's warning that it adds its last-applied annotation: nothing else.
      const warnings = r.stderr
        .split('\n')
        .filter(
          (l) => l !== '' && !/is missing the kubectl\.kubernetes\.io\/last-applied-configuration annotation/.test(l),
        );
      expect(warnings).toEqual([]);
      expect(r.code).toBe(0);
      const lines = r.stdout.trim().split('\n');
      expect(lines).toHaveLength(docs.length);
      for (const [i, d] of docs.entries()) {
        expect(lines[i]).toMatch(
          new RegExp(
            `^${d.kind.toLowerCase()}[^/]*/${literal(d.metadata.name)} (created|configured|unchanged) \\(server dry run\\)$`,
          ),
        );
      }
    },
    // Forty documents through server dry run: seconds alone, a minute on a machine loaded many
    // times over (a second suite beside this one); a hang still fails.
    120_000,
  );
});
