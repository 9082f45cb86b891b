/**
 * Relative links in the repository's Markdown: every `[text](target)` that is not a URL must
 * name a file or folder that exists, and a `#anchor` into a Markdown file must name one of its
 * headings (GitHub's slugs). The README is an index of `docs/` pages, so a page renamed or a
 * heading reworded would otherwise leave dead links behind unnoticed. Likewise every source file
 * the prose names in a code span from the repository root (`functions/lib/pipeline/stage.ts`):
 * the docs say where things live (`docs/extending.md`), and a moved module must not leave them
 * pointing at its old place.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Folders never scanned: dependencies, build output, test fixtures copied from elsewhere. */
const SKIP = new Set(['node_modules', '.git', 'dist', 'cdk.out', 'fixtures']);

/** Every `.md` file of the repository, repository-relative. */
function markdownFiles(dir = ROOT): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    if (SKIP.has(e.name)) return [];
    const full = path.join(dir, e.name);
    if (e.isDirectory()) return markdownFiles(full);
    return e.name.endsWith('.md') ? [path.relative(ROOT, full)] : [];
  });
}

/** The text outside fenced code blocks and inline code spans, where links are links. */
function prose(src: string): string {
  return src.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, '');
}

/** Link targets of inline Markdown links: `[text](target)` and `![alt](target)`. */
function linkTargets(src: string): string[] {
  return [...prose(src).matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1] ?? '');
}

/**
 * GitHub's heading anchor: the heading's text (code spans kept, emphasis and link syntax
 * dropped), lower case, every character but letters, digits, `_`, `-` and spaces removed,
 * spaces turned into `-`; a repeated slug gets `-1`, `-2`, ….
 */
function headingAnchors(src: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  const withoutFences = src.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
  for (const m of withoutFences.matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const text = (m[1] ?? '').replace(/\[([^\]]*)\]\([^)]*\)/g, '$1').replace(/[`*]/g, '');
    const base = text
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}_\- ]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

/** The dead links of one file, as `<file>: <target> (<why>)`. */
function deadLinks(file: string): string[] {
  const src = readFileSync(path.join(ROOT, file), 'utf8');
  const dead: string[] = [];
  for (const target of linkTargets(src)) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:, …
    const [rawPath = '', anchor] = target.split('#', 2);
    const pathPart = decodeURIComponent(rawPath);
    const resolved =
      pathPart === '' ? path.join(ROOT, file) : path.resolve(path.dirname(path.join(ROOT, file)), pathPart);
    // Links out of the repository (the team's shared folder beside a checkout) are not checked.
    if (path.relative(ROOT, resolved).startsWith('..')) continue;
    if (!existsSync(resolved)) {
      dead.push(`${file}: ${target} (no such file)`);
      continue;
    }
    if (anchor && resolved.endsWith('.md') && statSync(resolved).isFile()) {
      if (!headingAnchors(readFileSync(resolved, 'utf8')).has(anchor.toLowerCase())) {
        dead.push(`${file}: ${target} (no heading #${anchor})`);
      }
    }
  }
  return dead;
}

/** The top-level folders whose TypeScript files the prose names by their path from the root. */
const CODE_ROOTS = ['functions', 'events', 'infra', 'layers', 'scripts', 'test'];

/** `a/{b,c}.ts` as `a/b.ts`, `a/c.ts` (one level of braces, as the docs write them). */
function expandBraces(p: string): string[] {
  const m = /\{([^{}]*)\}/.exec(p);
  if (!m) return [p];
  return (m[1] ?? '').split(',').map((alt) => p.slice(0, m.index) + alt + p.slice(m.index + m[0].length));
}

/**
 * The repository paths of TypeScript files named in code spans outside fenced blocks
 * (`functions/lib/api/refs.ts`, `infra/aws/{stack,stages}.ts`); templates (`<tool>`) and
 * globs (`*`) are not paths and are skipped.
 */
function codePaths(src: string): string[] {
  const withoutFences = src.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
  const roots = CODE_ROOTS.join('|');
  const spans = withoutFences.matchAll(new RegExp(`\`((?:${roots})/[^\`\\s]*\\.ts)\``, 'g'));
  return [...spans]
    .map((m) => m[1] ?? '')
    .filter((p) => !/[<>*]/.test(p))
    .flatMap(expandBraces);
}

/** The source paths of one file that name no file, as `<file>: <path> (no such file)`. */
function missingCodePaths(file: string): string[] {
  const src = readFileSync(path.join(ROOT, file), 'utf8');
  return codePaths(src)
    .filter((p) => !existsSync(path.join(ROOT, p)))
    .map((p) => `${file}: ${p} (no such file)`);
}

describe('relative links in Markdown', () => {
  it('all resolve to an existing file and heading', () => {
    const files = markdownFiles();
    expect(files).toContain('README.md');
    expect(files).toContain(path.join('docs', 'configuration.md'));
    expect(files.flatMap(deadLinks)).toEqual([]);
  });

  it('finds links outside code only, and GitHub anchors', () => {
    const src = [
      '# The `npm start` runtime',
      '## Cells',
      '## Cells',
      'See [a](a.md#cells-1) and `[b](b.md)`.',
      '```',
      '[c](c.md)',
      '```',
      '![img](x.png "title")',
    ].join('\n');
    expect(linkTargets(src)).toEqual(['a.md#cells-1', 'x.png']);
    expect([...headingAnchors(src)]).toEqual(['the-npm-start-runtime', 'cells', 'cells-1']);
  });
});

describe('source paths named in Markdown', () => {
  it('all name an existing file', () => {
    // The scan reads the pages (it can fail): the extension guide names the stage frame.
    expect(codePaths(readFileSync(path.join(ROOT, 'docs', 'extending.md'), 'utf8'))).toContain(
      'functions/lib/pipeline/stage.ts',
    );
    expect(markdownFiles().flatMap(missingCodePaths)).toEqual([]);
  });

  it('finds root paths of .ts files in code spans, expands braces, skips templates and fences', () => {
    const src = [
      'See `functions/lib/pipeline/stage.ts`, `infra/aws/{stack,stages}.ts` and `lease/gate.ts`.',
      'Not `functions/<function>/index.ts`, `scripts/*.ts`, `docs/x.md` nor `test/unit/` alone.',
      '```',
      '`functions/lib/gone.ts`',
      '```',
    ].join('\n');
    expect(codePaths(src)).toEqual(['functions/lib/pipeline/stage.ts', 'infra/aws/stack.ts', 'infra/aws/stages.ts']);
  });
});
