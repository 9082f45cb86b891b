/**
 * Binary resolution for the embedded runtime: tools built by `npm run setup` into the
 * machine-wide cache (`<cacheRoot>/bin/<component-key>/<bin>`, see `layers/gobuild.ts`).
 * It lives with the embedded runtime, its only user, not in `functions/lib/exec/`: Lambda bundles,
 * which resolve from `/opt/bin` with `dirBinResolver`, do not pull in the build manifest, and
 * `exec/` stays below `layers/`.
 *
 * @module
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { binPath } from '../../layers/gobuild.js';
import { COMPONENTS } from '../../layers/manifest.js';
import { DEFAULT_SYSTEM_PATH } from '../lib/exec/runner.js';

/** Tools taken from the system rather than built: `git` (the source poll's `git ls-remote`). */
const SYSTEM_TOOLS = new Set(['git']);

/**
 * A resolver that maps a binary name to its path in the Go build cache, per the pinned manifest
 * (`binPath(component(<name>), <bin>, root)`).
 *
 * @param cacheRoot - kapp-lambda's cache root (e.g. `~/.cache/kapp-lambda`), read from the
 *   environment by the entry file, not here.
 * @returns `name => absolute path`.
 * @throws {Error} (from the resolver) `unknown tool <name>` for a name no pinned component builds.
 */
export function cacheBinResolver(cacheRoot: string): (name: string) => string {
  const index = new Map<string, string>();
  for (const c of COMPONENTS) {
    for (const b of c.binaries) {
      if (!index.has(b.bin)) index.set(b.bin, binPath(c, b.bin, cacheRoot));
    }
  }
  return (name) => {
    const p = index.get(name) ?? systemTool(name);
    if (p === undefined) throw new Error(`unknown tool ${name}`);
    return p;
  };
}

/** The first `<dir>/<name>` of {@link DEFAULT_SYSTEM_PATH} for a system tool, or `undefined`. */
function systemTool(name: string): string | undefined {
  if (!SYSTEM_TOOLS.has(name)) return undefined;
  return DEFAULT_SYSTEM_PATH.split(':')
    .map((dir) => path.join(dir, name))
    .find((p) => existsSync(p));
}
