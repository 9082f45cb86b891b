/**
 * The direction of imports in the functions' core (issue 8, review R5): the stage files in
 * `functions/lib/pipeline/` orchestrate the modules below them, never the other way round. No
 * module below the pipeline imports the pipeline, the entry files or a composition root
 * (`functions/embedded/`, `functions/<stage>/`), not even for a type; and the three planners
 * (`fetch/`, `template/`, `deploy/`) do not import each other: what they share lives lower down
 * (`api/`, `reconcile/`). Across the whole of `functions/lib/` there is no import cycle (type
 * imports included) and nothing imports the embedded runtime (`functions/embedded/`: its
 * in-process driver and keyed queue stay out of the Lambda bundles).
 *
 * Inside the pipeline, the products (`app/`, `repo/`, `install/`, as kapp-controller keeps
 * `pkg/app`, `pkg/pkgrepository`, `pkg/packageinstall`) stand on the frame at the pipeline's
 * root: a product imports the frame and another product's public entry (`<product>/index.ts`),
 * never another product's internals; the frame imports no product; code outside the pipeline
 * reaches a product through its public entry. Only the function routes (`pipeline/routes/`,
 * the top of the pipeline) name a product's stage module itself, so that each function's bundle
 * holds its own stage and none of the others'.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The folders of `functions/lib/` below the pipeline. */
const LOWER = [
  'fetch',
  'template',
  'deploy',
  'reconcile',
  'exec',
  'api',
  'artifact',
  'kube',
  'store',
  'packaging',
  'lease',
  'observe',
  'receipt',
  'transport',
];

/** The stage planners, which must not import each other. */
const PLANNERS = new Set(['fetch', 'template', 'deploy']);

/** A repository-relative path with `/` separators. */
const rel = (file: string) => path.relative(ROOT, file).split(path.sep).join('/');

/**
 * Every relative module a file names: `import`/`export ... from` (type-only included, which
 * the runtime graph erases but the layering does not allow either), side-effect imports and
 * `import('...')` types or calls.
 *
 * @throws Error when a specifier does not resolve to a file (so a changed layout cannot make
 *   the scan silently find nothing).
 */
function importsOf(file: string): string[] {
  const src = readFileSync(file, 'utf8');
  const statements = /^\s*(?:import|export)\s+(?:type\s+)?(?:[^;'"]*?\sfrom\s+)?['"](\.{1,2}\/[^'"]+)['"]/gm;
  const dynamic = /\bimport\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g;
  return [...src.matchAll(statements), ...src.matchAll(dynamic)].map((m) => {
    const target = path.resolve(path.dirname(file), (m[1] ?? '').replace(/\.js$/, '.ts'));
    if (!existsSync(target)) throw new Error(`${rel(file)}: cannot resolve ${m[1]}`);
    return rel(target);
  });
}

/** The TypeScript files of a folder, recursively. */
function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    if (e.isDirectory()) return tsFiles(full);
    return e.name.endsWith('.ts') ? [full] : [];
  });
}

/** Every import of every module below the pipeline, as `importer -> imported`. */
function lowerEdges(): { from: string; to: string }[] {
  return LOWER.flatMap((dir) => tsFiles(path.join(ROOT, 'functions/lib', dir))).flatMap((file) =>
    importsOf(file).map((to) => ({ from: rel(file), to })),
  );
}

/** The folder of `functions/lib/` a path is in (`fetch`, `pipeline`, ...), if any. */
function libFolder(file: string): string | undefined {
  return /^functions\/lib\/([^/]+)\//.exec(file)?.[1];
}

/**
 * Why an import breaks the layering, or `undefined` when it does not.
 *
 * @param from - the importer, repository-relative.
 * @param to - the imported module, repository-relative.
 */
function violation(from: string, to: string): string | undefined {
  const [a, b] = [libFolder(from), libFolder(to)];
  if (b === 'pipeline' || b === 'entry') return 'imports upward';
  if (to.startsWith('functions/') && !to.startsWith('functions/lib/')) return 'imports a composition root';
  if (a !== b && a !== undefined && b !== undefined && PLANNERS.has(a) && PLANNERS.has(b)) {
    return 'imports a sibling planner';
  }
  return undefined;
}

describe('import direction below the pipeline', () => {
  const edges = lowerEdges();
  const offending = edges
    .map(({ from, to }) => ({ edge: `${from} -> ${to}`, why: violation(from, to) }))
    .filter((e) => e.why !== undefined);

  it('no module below the pipeline imports the pipeline, the entry files or a planner sibling', () => {
    expect(offending.map((e) => `${e.edge} (${e.why})`)).toEqual([]);
  });

  it('reads runtime, type-only and re-export imports (the scan can fail)', () => {
    const has = (from: string, to: string) => edges.some((e) => e.from === from && e.to === to);
    // A runtime import of a module moved down for this rule.
    expect(has('functions/lib/deploy/run.ts', 'functions/lib/reconcile/abort-watch.ts')).toBe(true);
    // `import type { ... } from ...`.
    expect(has('functions/lib/deploy/kubeconfig.ts', 'functions/lib/api/refs.ts')).toBe(true);
    // `export * from ...` in a barrel.
    expect(has('functions/lib/template/index.ts', 'functions/lib/template/sops.ts')).toBe(true);
  });

  it('tells each kind of upward or sideways import apart', () => {
    expect(violation('functions/lib/deploy/run.ts', 'functions/lib/pipeline/deps.ts')).toBe('imports upward');
    expect(violation('functions/lib/kube/client.ts', 'functions/lib/entry/config.ts')).toBe('imports upward');
    expect(violation('functions/lib/store/s3.ts', 'functions/embedded/runtime.ts')).toBe('imports a composition root');
    expect(violation('functions/lib/template/plan.ts', 'functions/lib/fetch/vendir.ts')).toBe(
      'imports a sibling planner',
    );
    expect(violation('functions/lib/template/execute.ts', 'functions/lib/template/sops.ts')).toBeUndefined();
    expect(violation('functions/lib/deploy/run.ts', 'functions/lib/reconcile/result.ts')).toBeUndefined();
    expect(violation('functions/lib/reconcile/status.ts', 'events/schema.ts')).toBeUndefined();
  });
});

/**
 * Every import of every module of `functions/lib/` and of what they reach outside it (the event
 * contract), as a map from importer to what it imports: a cycle through a module outside the
 * folder counts too.
 */
function libGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const todo = tsFiles(path.join(ROOT, 'functions/lib')).map(rel);
  for (let file = todo.pop(); file !== undefined; file = todo.pop()) {
    if (graph.has(file)) continue;
    const imports = importsOf(path.join(ROOT, file));
    graph.set(file, imports);
    todo.push(...imports.filter((to) => !graph.has(to)));
  }
  return graph;
}

/**
 * The import cycles of a graph: its strongly connected components with more than one module,
 * or one module that imports itself (Tarjan's algorithm), each sorted.
 */
function cyclesOf(graph: ReadonlyMap<string, readonly string[]>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const cycles: string[][] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v) ?? 0);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) ?? 0, low.get(w) ?? 0));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v) ?? 0, index.get(w) ?? 0));
      }
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    let w: string | undefined;
    do {
      w = stack.pop();
      if (w === undefined) break;
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1 || (graph.get(v) ?? []).includes(v)) cycles.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return cycles;
}

describe('the import graph of functions/lib', () => {
  const graph = libGraph();

  it('has no import cycle, type-only imports included', () => {
    expect(cyclesOf(graph)).toEqual([]);
  });

  it('never imports the embedded runtime', () => {
    const offending = [...graph].flatMap(([from, tos]) =>
      tos.filter((to) => to.startsWith('functions/embedded/')).map((to) => `${from} -> ${to}`),
    );
    expect(offending).toEqual([]);
  });

  it('covers the pipeline, the entry files and the folders below them (the scan can fail)', () => {
    expect(graph.get('functions/lib/pipeline/routes/template.ts')).toContain('functions/lib/pipeline/app/template.ts');
    expect(graph.get('functions/lib/entry/handler.ts')).toContain('functions/lib/pipeline/dispatch.ts');
    expect(graph.has('functions/lib/log.ts')).toBe(true);
    expect(graph.has('events/schema.ts')).toBe(true);
  });

  it('finds a cycle, a self-import, and none in a chain', () => {
    const g = (edges: Record<string, string[]>) => new Map(Object.entries(edges));
    expect(cyclesOf(g({ a: ['b'], b: ['c'], c: ['a'], d: ['a'] }))).toEqual([['a', 'b', 'c']]);
    expect(cyclesOf(g({ a: ['a'], b: [] }))).toEqual([['a']]);
    expect(cyclesOf(g({ a: ['b'], b: ['c'], c: [] }))).toEqual([]);
  });
});

/** The product folders of the pipeline. */
const PRODUCTS = ['app', 'repo', 'install'];

/** Which product folder of the pipeline a path is in, if any. */
function productOf(file: string): string | undefined {
  const m = /^functions\/lib\/pipeline\/([^/]+)\//.exec(file);
  return m?.[1] !== undefined && PRODUCTS.includes(m[1]) ? m[1] : undefined;
}

/** The pipeline's top: the function routes, the embedded dispatch over them, and the composition of the dependencies. */
function isPipelineTop(file: string): boolean {
  return (
    file.startsWith('functions/lib/pipeline/routes/') ||
    file === 'functions/lib/pipeline/dispatch.ts' ||
    file === 'functions/lib/pipeline/compose.ts'
  );
}

/**
 * Why an import breaks the product layout of the pipeline, or `undefined` when it does not.
 *
 * @param from - the importer, repository-relative.
 * @param to - the imported module, repository-relative.
 */
function productViolation(from: string, to: string): string | undefined {
  const [a, b] = [productOf(from), productOf(to)];
  const inPipeline = from.startsWith('functions/lib/pipeline/');
  if (a !== undefined && to.startsWith('functions/lib/pipeline/') && b === undefined && isPipelineTop(to)) {
    return 'a product imports the top of the pipeline';
  }
  if (b === undefined || a === b) return undefined;
  const entry = to === `functions/lib/pipeline/${b}/index.ts`;
  if (a !== undefined) return entry ? undefined : "imports another product's internals";
  if (inPipeline && !isPipelineTop(from)) return 'the frame imports a product';
  if (inPipeline || entry) return undefined;
  return "imports a product's internals from outside the pipeline";
}

/** Every TypeScript file that may import the pipeline: the functions, the forwarder, scripts, bench and infra. */
function importers(): string[] {
  return ['functions', 'events', 'scripts', 'bench', 'infra', 'layers']
    .flatMap((dir) => tsFiles(path.join(ROOT, dir)))
    .filter((f) => !f.includes(`${path.sep}node_modules${path.sep}`));
}

describe('the pipeline laid out by product', () => {
  const offending = importers()
    .flatMap((file) => importsOf(file).map((to) => ({ from: rel(file), to })))
    .map(({ from, to }) => ({ edge: `${from} -> ${to}`, why: productViolation(from, to) }))
    .filter((e) => e.why !== undefined);

  it("products import the frame and each other's public entry; the frame imports no product", () => {
    expect(offending.map((e) => `${e.edge} (${e.why})`)).toEqual([]);
  });

  it('has the three products, each with a public entry (the scan can fail)', () => {
    for (const p of PRODUCTS) expect(existsSync(path.join(ROOT, `functions/lib/pipeline/${p}/index.ts`))).toBe(true);
  });

  it('tells each kind of crossing apart', () => {
    const P = 'functions/lib/pipeline';
    expect(productViolation(`${P}/repo/index-repo.ts`, `${P}/app/deploy.ts`)).toBe(
      "imports another product's internals",
    );
    expect(productViolation(`${P}/repo/index-repo.ts`, `${P}/app/index.ts`)).toBeUndefined();
    expect(productViolation(`${P}/app/fetch.ts`, `${P}/stage.ts`)).toBeUndefined();
    expect(productViolation(`${P}/app/fetch.ts`, `${P}/app/receipts.ts`)).toBeUndefined();
    expect(productViolation(`${P}/app/fetch.ts`, `${P}/dispatch.ts`)).toBe('a product imports the top of the pipeline');
    expect(productViolation(`${P}/stage.ts`, `${P}/app/receipts.ts`)).toBe('the frame imports a product');
    expect(productViolation(`${P}/stage.ts`, `${P}/app/index.ts`)).toBe('the frame imports a product');
    expect(productViolation(`${P}/routes/fetch.ts`, `${P}/app/reconcile.ts`)).toBeUndefined();
    expect(productViolation('functions/lib/entry/handler.ts', `${P}/repo/index-repo.ts`)).toBe(
      "imports a product's internals from outside the pipeline",
    );
    expect(productViolation('scripts/receipts.ts', `${P}/app/index.ts`)).toBeUndefined();
  });
});
