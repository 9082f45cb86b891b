import { describe, expect, it } from 'vitest';
import { binDir, verifyVersions } from '../../layers/gobuild.js';
import { COMPONENTS } from '../../layers/manifest.js';

// Each built binary reports exactly the version pinned in layers/manifest.ts.
describe('pinned tool versions', () => {
  // components not always needed (kapp-controller: the migration e2e, the benchmark) may not be built
  for (const c of COMPONENTS.filter((x) => (x.need ?? 'always') === 'always')) {
    it(`${c.name} ${c.version}`, async () => {
      const seen = await verifyVersions(c, binDir(c));
      expect(Object.keys(seen)).toEqual(c.binaries.map((b) => b.bin));
    });
  }
});
