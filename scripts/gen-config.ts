/**
 * Generates the reference tables of `docs/configuration.md` from the rows kept next to the code
 * that reads each variable ({@link SettingDoc} tables: `LAMBDA_ENV_DOCS` in
 * `functions/lib/entry/config.ts`, the forwarder's in `events/forwarder/config.ts`, the
 * `kapp-controller-config` keys in `functions/lib/reconcile/controller-config.ts`, the scripts'
 * in `./env-docs.ts`, the bench's in `bench/env-docs.ts`), so the reference cannot drift from
 * the code. Only the tables are generated: each sits between
 * `<!-- begin generated: <id> … -->` and `<!-- end generated: <id> -->`, and the prose around
 * them is the document's own.
 *
 * Run: `npm run gen:config` (= `npx tsx scripts/gen-config.ts`); `--check` only compares and
 * exits 1 when the document is stale (as `npm run gen:crds --check`).
 * `test/unit/config-reference.test.ts` fails on a stale document and on a variable read in
 * the code without a row.
 *
 * @module
 */
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { BENCH_ENV_DOCS } from '../bench/env-docs.js';
import { FORWARDER_ENV_DOCS, FORWARDER_PROGRAM_ENV_DOCS } from '../events/forwarder/config.js';
import type { SettingDoc } from '../functions/lib/api/env.js';
import { LAMBDA_ENV_DOCS } from '../functions/lib/entry/config.js';
import { CONTROLLER_CONFIG_KEY_DOCS } from '../functions/lib/reconcile/controller-config.js';
import {
  AMBIENT_ENV_DOCS,
  BUILD_ENV_DOCS,
  CDK_ENV_DOCS,
  SCRIPTS_ENV_DOCS,
  START_ENV_DOCS,
  TEST_ENV_DOCS,
} from './env-docs.js';

/** The document the tables are generated into. */
export const CONFIG_DOC = join(dirname(fileURLToPath(import.meta.url)), '..', 'docs', 'configuration.md');

/** One generated table: its marker id, where its rows live, the rows and the first column's header. */
export interface GeneratedTable {
  /** Marker id, `[a-z-]+`. */
  readonly id: string;
  /** The constant the rows come from, as the marker names it (`path` `NAME`). */
  readonly source: string;
  /** The rows, in document order. */
  readonly rows: readonly SettingDoc[];
  /** Header of the first column: `name` for variables, `key` for `kapp-controller-config`. */
  readonly nameHeader: 'name' | 'key';
}

/** Every generated table, each appearing exactly once in {@link CONFIG_DOC}. */
export const GENERATED_TABLES: readonly GeneratedTable[] = [
  {
    id: 'lambda',
    source: '`functions/lib/entry/config.ts` `LAMBDA_ENV_DOCS`',
    rows: LAMBDA_ENV_DOCS,
    nameHeader: 'name',
  },
  {
    id: 'forwarder',
    source: '`events/forwarder/config.ts` `FORWARDER_ENV_DOCS`',
    rows: FORWARDER_ENV_DOCS,
    nameHeader: 'name',
  },
  {
    id: 'forwarder-program',
    source: '`events/forwarder/config.ts` `FORWARDER_PROGRAM_ENV_DOCS`',
    rows: FORWARDER_PROGRAM_ENV_DOCS,
    nameHeader: 'name',
  },
  { id: 'start', source: '`scripts/env-docs.ts` `START_ENV_DOCS`', rows: START_ENV_DOCS, nameHeader: 'name' },
  {
    id: 'controller-config',
    source: '`functions/lib/reconcile/controller-config.ts` `CONTROLLER_CONFIG_KEY_DOCS`',
    rows: CONTROLLER_CONFIG_KEY_DOCS,
    nameHeader: 'key',
  },
  { id: 'scripts', source: '`scripts/env-docs.ts` `SCRIPTS_ENV_DOCS`', rows: SCRIPTS_ENV_DOCS, nameHeader: 'name' },
  { id: 'cdk', source: '`scripts/env-docs.ts` `CDK_ENV_DOCS`', rows: CDK_ENV_DOCS, nameHeader: 'name' },
  { id: 'build', source: '`scripts/env-docs.ts` `BUILD_ENV_DOCS`', rows: BUILD_ENV_DOCS, nameHeader: 'name' },
  { id: 'tests', source: '`scripts/env-docs.ts` `TEST_ENV_DOCS`', rows: TEST_ENV_DOCS, nameHeader: 'name' },
  { id: 'bench', source: '`bench/env-docs.ts` `BENCH_ENV_DOCS`', rows: BENCH_ENV_DOCS, nameHeader: 'name' },
  { id: 'ambient', source: '`scripts/env-docs.ts` `AMBIENT_ENV_DOCS`', rows: AMBIENT_ENV_DOCS, nameHeader: 'name' },
];

/** The names of a row, one or several. */
export function rowNames(row: SettingDoc): readonly string[] {
  return typeof row.name === 'string' ? [row.name] : row.name;
}

/** A table cell: a `|` outside code would end the cell, so it is escaped; newlines are folded. */
function cell(text: string): string {
  return text.replace(/\s*\n\s*/g, ' ').replace(/\|/g, '\\|');
}

/** The Markdown table of `table`, header and rows, each line ending in `\n`. */
export function renderTable(table: GeneratedTable): string {
  const lines = [`| ${table.nameHeader} | default | what it does | read by |`, '|---|---|---|---|'];
  for (const row of table.rows) {
    const name = rowNames(row)
      .map((n) => `\`${n}\``)
      .join(', ');
    lines.push(
      `| ${name}${row.ours ? ' (ours)' : ''} | ${cell(row.default)} | ${cell(row.meaning)} | ${cell(row.readBy)} |`,
    );
  }
  return `${lines.join('\n')}\n`;
}

const BLOCK = /<!-- begin generated: ([a-z-]+)[^>]*-->\n[\s\S]*?<!-- end generated: \1 -->/g;

/**
 * `text` (the document) with every generated block replaced by its table; the prose outside the
 * blocks is kept byte for byte.
 *
 * @throws Error naming the ids that are missing, repeated or unknown (a marker removed by hand
 *   must not silently drop a table).
 */
export function renderConfigDoc(text: string): string {
  const byId = new Map(GENERATED_TABLES.map((t) => [t.id, t]));
  const seen: string[] = [];
  const out = text.replace(BLOCK, (_block, id: string) => {
    seen.push(id);
    const table = byId.get(id);
    if (!table) return _block;
    return [
      `<!-- begin generated: ${id} (from ${table.source}; edit there, then npm run gen:config) -->`,
      renderTable(table).trimEnd(),
      `<!-- end generated: ${id} -->`,
    ].join('\n');
  });
  const unknown = seen.filter((id) => !byId.has(id));
  const repeated = seen.filter((id, i) => seen.indexOf(id) !== i);
  const missing = GENERATED_TABLES.map((t) => t.id).filter((id) => !seen.includes(id));
  if (unknown.length + repeated.length + missing.length > 0) {
    throw new Error(
      `docs/configuration.md: generated blocks unknown [${unknown.join(', ')}], repeated [${repeated.join(', ')}], missing [${missing.join(', ')}]`,
    );
  }
  return out;
}

async function main(argv: readonly string[]): Promise<number> {
  const text = await readFile(CONFIG_DOC, 'utf8');
  const generated = renderConfigDoc(text);
  if (argv.includes('--check')) {
    if (generated !== text) {
      process.stderr.write('stale docs/configuration.md; run npm run gen:config\n');
      return 1;
    }
    return 0;
  }
  if (generated !== text) await writeFile(CONFIG_DOC, generated);
  process.stdout.write(`${generated === text ? 'up to date' : 'wrote'}: docs/configuration.md\n`);
  return 0;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await main(process.argv.slice(2));
}
