/**
 * e2e: the cap on an App's inline fetch content (`functions/lib/fetch/inline-limit.ts`) against
 * the real control plane, with the cap lowered to 200 000 bytes: an App whose `pathsFrom` names
 * two Secrets of 150 000 bytes each (`kubectl apply` keeps a copy in an annotation, itself capped
 * at 256 KiB, so the Secrets stay small) fails its fetch with the `Fetching` text naming the second
 * Secret, and its status shows none of their bytes.
 */
import { describe, expect, it } from 'vitest';
import { apply, appManifest, expectFailed, failedAt, RFC3339, suffix, useE2ERuntime } from './support.js';

const id = suffix();
const NS = `e2e-inline-limit-${id}`;
const MAX = 200_000;

const rt = useE2ERuntime([NS], { overrides: { config: { maxInlineBytes: MAX } } });

/** A Secret of one key `k` holding 150 000 bytes that start with `mark`. */
const bigSecret = (name: string, mark: string) => ({
  apiVersion: 'v1',
  kind: 'Secret',
  metadata: { name, namespace: NS },
  data: { k: Buffer.from(mark + 'x'.repeat(150_000 - mark.length)).toString('base64') },
});

describe('inline fetch content cap', () => {
  it('two pathsFrom Secrets over the cap: Fetching (0) names the second, no vendir run, no content shown', async () => {
    const name = `inline-${id}`;
    const mark = `do-not-show-${id}-`;
    await apply(
      bigSecret('s1', mark),
      bigSecret('s2', mark),
      appManifest(NS, name, {
        fetch: [{ inline: { pathsFrom: [{ secretRef: { name: 's1' } }, { secretRef: { name: 's2' } }] } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await rt.waitForApp(NS, name, failedAt(1), 'ReconcileFailed');
    const message = `Fetching (0): inline pathsFrom secret "s2" brings the App's inline content to 300002 bytes, over the limit of ${MAX} bytes`;
    expectFailed(app, message);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.status?.fetch).toEqual({
      exitCode: -1,
      error: message,
      startedAt: expect.stringMatching(RFC3339),
      updatedAt: expect.stringMatching(RFC3339),
    });
    expect(JSON.stringify(app.status)).not.toContain(mark);
    // vendir never ran: every fetch run of the App ran no tool.
    const fetches = rt.stageRuns(NS, name).filter((r) => r.stage === 'fetch');
    expect(fetches.length).toBeGreaterThan(0);
    expect(fetches.map((r) => (r.tools as { runs: number } | undefined)?.runs ?? 0)).toEqual(fetches.map(() => 0));
  });
});
