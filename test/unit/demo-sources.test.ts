/**
 * `npm run demo` runs from a clone alone (issue 26 item 4): no module the demo loads reads the
 * third-party fixtures of `../shared` (`fixturePath`, `requireFixtures`, `FIXTURES_DIR`, the
 * fixture-serving `test/harness/servers.ts`, the kadras relocation), it starts no S3 or SQS
 * server, and every example it applies and every source it publishes is a file of the
 * repository.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { exampleSource } from '../../scripts/demo-examples.js';
import { APP_EXAMPLES, EXAMPLES, INSTALL_EXAMPLE, REPO_ROOT } from '../../scripts/local-env.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const rel = (file: string) => path.relative(ROOT, file).split(path.sep).join('/');

/** The relative modules a file imports (static, re-exports, dynamic), as repository paths. */
function importsOf(file: string): string[] {
  const src = readFileSync(path.join(ROOT, file), 'utf8');
  const statements = /^\s*(?:import|export)\s+(?:type\s+)?(?:[^;'"]*?\sfrom\s+)?['"](\.{1,2}\/[^'"]+)['"]/gm;
  const dynamic = /\bimport\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g;
  return [...src.matchAll(statements), ...src.matchAll(dynamic)].map((m) => {
    const target = path.resolve(path.dirname(path.join(ROOT, file)), (m[1] ?? '').replace(/\.js$/, '.ts'));
    if (!existsSync(target)) throw new Error(`${file}: cannot resolve ${m[1]}`);
    return rel(target);
  });
}

/** Every repository module reachable from `entry` through relative imports. */
function graph(entry: string): Set<string> {
  const seen = new Set<string>();
  const queue = [entry];
  for (let f = queue.pop(); f !== undefined; f = queue.pop()) {
    if (seen.has(f)) continue;
    seen.add(f);
    queue.push(...importsOf(f));
  }
  return seen;
}

/** What reads (or names the place of) the shared third-party fixtures. */
const SHARED = /\bfixturePath\(|\brequireFixtures\(|\bFIXTURES_DIR\b|\.\.\/shared\b|['"]shared['"]/;

/** Every file under a directory, recursively. */
function filesUnder(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(path.join(dir, e.name)) : [path.join(dir, e.name)],
  );
}

describe('the demo runs from a clone alone', () => {
  const modules = graph('scripts/demo.ts');

  it('loads none of the modules that serve ../shared or start the test-only servers', () => {
    expect(modules.has('scripts/demo-examples.ts')).toBe(true);
    for (const m of [
      'test/harness/servers.ts',
      'test/harness/kadras.ts',
      'test/harness/servers/s3.ts',
      'test/harness/servers/sqs.ts',
    ]) {
      expect(modules.has(m), m).toBe(false);
    }
  });

  it('no module it loads reads ../shared (fixtures.ts only defines the resolver)', () => {
    const readers = [...modules]
      .filter((m) => m !== 'test/harness/fixtures.ts')
      .filter((m) => SHARED.test(readFileSync(path.join(ROOT, m), 'utf8')));
    expect(readers).toEqual([]);
  });

  it('applies and publishes only files of the repository, none naming ../shared', () => {
    expect(EXAMPLES).toEqual(['rbac.yml', ...APP_EXAMPLES, 'package-repository.yml']);
    const files = [
      ...[...EXAMPLES, INSTALL_EXAMPLE].map((f) => path.join(REPO_ROOT, 'examples', f)),
      ...['hello-app', 'hello-chart', 'package-repository'].flatMap((s) => filesUnder(exampleSource(s))),
    ];
    for (const f of files) {
      expect(existsSync(f), rel(f)).toBe(true);
      expect(readFileSync(f, 'utf8'), rel(f)).not.toMatch(/\.\.\/shared|shared\/fixtures/);
    }
  });
});
