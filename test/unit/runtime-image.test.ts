/**
 * The in-cluster runtime's image recipe (`infra/runtime/Containerfile`) cannot drift from the
 * pinned manifest: it builds the tools with `scripts/build-runtime-tools.ts` (the components of
 * `layers/manifest.ts`, by `layers/gobuild.ts`), names no tool version of its own, takes Go at
 * `GO_LANGUAGE_VERSION`, and matches the Deployment of the runtime release (uid, cache directory,
 * metrics port). No container engine here: the recipe is read, not built.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { TOOL_NAMES } from '../../functions/lib/exec/runner.js';
import { GO_LANGUAGE_VERSION } from '../../layers/gobuild.js';
import { COMPONENTS } from '../../layers/manifest.js';
import { runtimeComponents } from '../../scripts/build-runtime-tools.js';
import {
  RUNTIME_CACHE_DIR,
  RUNTIME_METRICS_PORT,
  releaseDocuments,
  runtimeReleaseDocuments,
} from '../../scripts/release.js';

const ROOT = path.resolve(import.meta.dirname, '../..');
const recipe = readFileSync(path.join(ROOT, 'infra/runtime/Containerfile'), 'utf8');
const lines = recipe.split('\n').filter((l) => !l.startsWith('#'));

describe('runtime image recipe', () => {
  it('takes Go at the version the wrapper modules declare', () => {
    expect(lines).toContain(`ARG GO_VERSION=${GO_LANGUAGE_VERSION}`);
  });

  it('builds the tools with the setup code and names no version of its own', () => {
    expect(recipe).toContain('RUN npx tsx scripts/build-runtime-tools.ts');
    for (const c of COMPONENTS) expect(lines.join('\n')).not.toContain(c.version);
  });

  it('builds a component for every tool the functions run but git, which the image installs', () => {
    const built = new Set(runtimeComponents().flatMap((c) => c.binaries.map((b) => b.bin)));
    expect(TOOL_NAMES.filter((t) => !built.has(t))).toEqual(['git']);
    expect(recipe).toMatch(/apt-get install -y --no-install-recommends git /);
    expect(runtimeComponents(['ytt']).map((c) => c.name)).toEqual(['ytt']);
  });

  it('copies only what exists and runs start.ts as the Deployment’s user (root: tools get uids of their own)', async () => {
    for (const l of lines.filter((x) => /^COPY (?!--from)/.test(x))) {
      const sources = l.split(/\s+/).slice(1, -1);
      for (const s of sources) expect(existsSync(path.join(ROOT, s)), s).toBe(true);
    }
    const docs = runtimeReleaseDocuments({ version: '0.0.0' }, await releaseDocuments({ version: '0.0.0' }));
    const dep = docs.find((d) => d.kind === 'Deployment') as unknown as {
      spec: { template: { spec: { securityContext: { runAsUser: number; runAsGroup: number } } } };
    };
    const { runAsUser, runAsGroup } = dep.spec.template.spec.securityContext;
    expect(lines).toContain(`USER ${runAsUser}:${runAsGroup}`);
    expect(recipe).toContain(`KAPP_LAMBDA_CACHE=${RUNTIME_CACHE_DIR}`);
    expect(lines).toContain(`EXPOSE ${RUNTIME_METRICS_PORT}`);
    expect(lines.at(-2)).toBe('ENTRYPOINT ["node", "--import", "tsx", "scripts/start.ts"]');
    expect(readFileSync(path.join(ROOT, 'infra/runtime/Containerfile.dockerignore'), 'utf8')).toContain('node_modules');
  });
});
