// The configuration reference (docs/configuration.md) is generated from the SettingDoc tables kept
// next to the code (scripts/gen-config.ts). These tests fail when the document is stale, when the
// code reads an environment variable (or a kapp-controller-config key) that no table documents,
// and when a table documents a variable nothing reads.
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { PIPELINE_STAGES, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { CONTROLLER_CONFIG_KEY_DOCS } from '../../functions/lib/reconcile/controller-config.js';
import { CONFIG_DOC, GENERATED_TABLES, renderConfigDoc, rowNames } from '../../scripts/gen-config.js';

const ROOT = path.resolve(import.meta.dirname, '../..');
/** Where the programs, functions and tools live; `test/` sets variables for its servers rather than reading settings. */
const SOURCE_DIRS = ['functions', 'events', 'scripts', 'infra', 'layers', 'bench'];

function sourceFiles(): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    for (const e of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = path.join(dir, e.name);
      if (e.isDirectory()) {
        if (e.name !== 'node_modules' && e.name !== 'cdk.out') walk(rel);
      } else if (/\.(ts|mts|mjs|js)$/.test(e.name)) out.push(rel);
    }
  };
  for (const d of SOURCE_DIRS) walk(d);
  for (const e of readdirSync(ROOT)) if (/\.(ts|mjs)$/.test(e)) out.push(e);
  return out;
}

/** Variable name → the files reading it. */
function envReads(files: readonly string[]): Map<string, Set<string>> {
  const reads = new Map<string, Set<string>>();
  const add = (name: string, file: string) => reads.set(name, (reads.get(name) ?? new Set()).add(file));
  const texts = new Map(files.map((f) => [f, readFileSync(path.join(ROOT, f), 'utf8')]));
  // `const X_ENV = 'NAME'`: constants naming a variable, for `env[X_ENV]` reads.
  const constants = new Map<string, string>();
  for (const text of texts.values()) {
    for (const m of text.matchAll(/\b([A-Z][A-Z0-9_]*)\s*=\s*'([A-Z][A-Z0-9_]*)'/g)) constants.set(m[1]!, m[2]!);
  }
  for (const [file, text] of texts) {
    for (const m of text.matchAll(/process\.env(?:\.|\[['"`])([A-Z][A-Z0-9_]*)/g)) add(m[1]!, file);
    // An environment map passed in (`env.X`, `env['X']`), not a child's environment being written (`env.X = …`).
    for (const m of text.matchAll(/(?<![.\w])env\??\.([A-Z][A-Z0-9_]*)\b(?!\s*=[^=])/g)) add(m[1]!, file);
    for (const m of text.matchAll(/(?<![.\w])env\[['"`]([A-Z][A-Z0-9_]*)['"`]\](?!\s*=[^=])/g)) add(m[1]!, file);
    for (const m of text.matchAll(/(?<![.\w])env\[([A-Z][A-Z0-9_]*)\](?!\s*=[^=])/g)) {
      const name = constants.get(m[1]!);
      if (name) add(name, file);
    }
    // zod schemas of an environment: the top-level keys of `… = z.object({ … });` blocks.
    for (const block of text.matchAll(/=\s*z\.object\(\{\n([\s\S]*?)\n\}\);/g)) {
      for (const m of block[1]!.matchAll(/^ {2}([A-Z][A-Z0-9_]*):/gm)) add(m[1]!, file);
    }
    // The queue URLs are named by a function, one per pipeline stage.
    if (/\bqueueUrlEnv\(/.test(text) && !file.endsWith('api/functions.ts')) {
      for (const s of PIPELINE_STAGES) add(queueUrlEnv(s), file);
    }
  }
  return reads;
}

/**
 * Documented, but not read by kapp-lambda's code: set by the test harness for the Lambda emulator,
 * or read by aws-cdk-lib's `App`.
 */
const DOCUMENTED_NOT_READ = new Set([
  'AWS_LAMBDA_FUNCTION_TIMEOUT',
  'AWS_LAMBDA_FUNCTION_MEMORY_SIZE',
  'CDK_OUTDIR',
  'CDK_CONTEXT_JSON',
]);

describe('configuration reference', () => {
  it('docs/configuration.md is generated from the tables (run npm run gen:config)', () => {
    const text = readFileSync(CONFIG_DOC, 'utf8');
    expect(renderConfigDoc(text) === text, 'stale docs/configuration.md: run npm run gen:config').toBe(true);
  });

  it('refuses a document whose generated block is missing', () => {
    const text = readFileSync(CONFIG_DOC, 'utf8').replace(
      /<!-- begin generated: bench[\s\S]*?end generated: bench -->/,
      '',
    );
    expect(() => renderConfigDoc(text)).toThrow(/missing \[bench\]/);
  });

  it('documents every environment variable the code reads', () => {
    const documented = new Set(
      GENERATED_TABLES.filter((t) => t.nameHeader === 'name').flatMap((t) => t.rows.flatMap(rowNames)),
    );
    const reads = envReads(sourceFiles());
    expect(reads.size).toBeGreaterThan(60);
    const missing = [...reads]
      .filter(([name]) => !documented.has(name))
      .map(([name, files]) => `${name} (${[...files].sort().join(', ')})`)
      .sort();
    expect(missing, 'add a row next to where the variable is read, then npm run gen:config').toEqual([]);
  });

  it('documents no variable that nothing reads', () => {
    const reads = envReads(sourceFiles());
    const stale = GENERATED_TABLES.filter((t) => t.nameHeader === 'name')
      .flatMap((t) => t.rows.flatMap(rowNames))
      .filter((name) => !reads.has(name) && !DOCUMENTED_NOT_READ.has(name));
    expect(stale).toEqual([]);
  });

  it('documents exactly the kapp-controller-config keys the parser reads', () => {
    const text = readFileSync(path.join(ROOT, 'functions/lib/reconcile/controller-config.ts'), 'utf8');
    const read = [...new Set([...text.matchAll(/\bset\('([A-Za-z]+)'\)/g)].map((m) => m[1]!))].sort();
    expect(read.length).toBeGreaterThan(8);
    expect([...CONTROLLER_CONFIG_KEY_DOCS.flatMap(rowNames)].sort()).toEqual(read);
  });
});
