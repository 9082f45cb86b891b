/**
 * The render-cache key takes its tool versions from the tool table (`layers/tools.ts`, review
 * M6): every tool the template function may run keys the render, except the ones the table
 * marks `renderKey: false`, so a template tool added to the table cannot be left out of the key
 * (an upgrade of it would not re-render). Checked on the key function and on the template stage.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { templateEvent } from '../../events/schema.js';
import { renderInputHash, renderToolVersions } from '../../functions/lib/artifact/keys.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { RENDER_TOOLS, runBins, TOOLS } from '../../layers/tools.js';
import { appObject, appWorld, NOW, putFetchArtifact, REF, RUN, SUCCEEDED_BEFORE } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('render-tools-');

/** The pinned versions of the table, without `v`, keyed by binary (as `KAPP_LAMBDA_TOOL_VERSIONS`). */
const PINNED: Record<string, string> = Object.fromEntries(
  TOOLS.flatMap((t) =>
    t.version === undefined ? [] : t.bins.map((bin) => [bin, (t.version ?? '').replace(/^v/, '')]),
  ),
);

/** The template tools the table keeps out of the key on purpose. */
const NOT_KEYED = TOOLS.filter((t) => t.renderKey === false).flatMap(runBins);

/** Every tool the template function may run that must key its render. */
const KEYED = STAGE_TOOLS.template.filter((bin) => !NOT_KEYED.includes(bin));

const bumped = (bin: string) => ({ ...PINNED, [bin]: `${PINNED[bin]}-next` });

describe('the render key and the tool table', () => {
  it('keys every template tool but age, whose binary no render runs (sops links its library)', () => {
    expect(NOT_KEYED).toEqual(['age']);
    expect(KEYED).toEqual(['ytt', 'kbld', 'helm', 'sops', 'cue', 'kustomize']);
    expect(RENDER_TOOLS).toEqual(KEYED);
    expect(Object.keys(renderToolVersions(PINNED))).toEqual(KEYED);
  });

  it.each(KEYED)('a new %s version changes the render-input hash', (bin) => {
    const hash = (versions: Record<string, string>) =>
      renderInputHash({
        inputs: { fetch: 'f' },
        template: [{ ytt: {} }],
        values: {},
        tools: renderToolVersions(versions),
      });
    expect(hash(bumped(bin))).not.toBe(hash(PINNED));
  });

  /** Runs the template stage of the table App (ytt prints a manifest); its logged outcome and tools run. */
  async function templateOnce(store: MemoryStore, fetchKey: string, toolVersions: Record<string, string>) {
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE }),
      store,
      tmpRoot: path.join(tempDir(), 'scratch'),
      config: { toolVersions },
    });
    w.runner.on('ytt', { stdout: 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n' });
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: { exitCode: 0, updatedAt: NOW } };
    await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
    return { outcome: w.outcomes(), tools: w.tools() };
  }

  it.each(KEYED)('the template stage renders again after a %s upgrade, not from the cache', async (bin) => {
    const store = new MemoryStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    expect(await templateOnce(store, fetchKey, PINNED)).toEqual({
      outcome: [['template', 'succeeded']],
      tools: ['ytt'],
    });
    expect(await templateOnce(store, fetchKey, PINNED)).toEqual({ outcome: [['template', 'cached']], tools: [] });
    expect(await templateOnce(store, fetchKey, bumped(bin))).toEqual({
      outcome: [['template', 'succeeded']],
      tools: ['ytt'],
    });
  });
});
