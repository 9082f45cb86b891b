/**
 * The event contract as the rest of the tree uses it: one reason rank for the forwarder's
 * outbox and the embedded coalescer, and an in-cluster forwarder whose module graph stays out
 * of the functions' core (only the API types, the event contract, the timer and the ports).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { mergeEvents } from '../../events/forwarder/outbox.js';
import { type ObjectRef, objectEvent, REASONS } from '../../events/schema.js';
import { coalesceEvents } from '../../functions/embedded/pipeline.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

describe('one reason rank', () => {
  const app: ObjectRef = {
    clusterId: 'c1',
    kind: 'App',
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    namespace: 'ns',
    name: 'x',
    uid: 'u-x',
    generation: 2,
    resourceVersion: '2',
  };
  const time = '2025-01-02T03:04:05.000Z';

  it('the outbox and the embedded coalescer keep the same reason for every pair', () => {
    for (const a of REASONS) {
      for (const b of REASONS) {
        const outbox = mergeEvents({ ...app, resourceVersion: '1', reason: a }, { ...app, reason: b }).reason;
        const merged = coalesceEvents(objectEvent(app, a, { time }), objectEvent(app, b, { time }));
        expect(merged.type === 'dev.kapp-lambda.object.v1' && merged.data.reason).toBe(outbox);
      }
    }
  });
});

/** Runtime imports of a module (type-only imports and exports are erased, so not followed). */
function runtimeImports(file: string): string[] {
  const src = readFileSync(file, 'utf8');
  const out: string[] = [];
  const re = /^\s*(import|export)\s+(type\s+)?(?:[^;'"]*?\sfrom\s+)?['"](\.{1,2}\/[^'"]+)['"]/gm;
  for (const m of src.matchAll(re)) {
    if (m[2]) continue;
    const target = path.resolve(path.dirname(file), (m[3] ?? '').replace(/\.js$/, '.ts'));
    if (!existsSync(target)) throw new Error(`${path.relative(ROOT, file)}: cannot resolve ${m[3]}`);
    out.push(target);
  }
  return out;
}

/** Every module reached from `entry`, with the module that first imported it. */
function moduleGraph(entry: string): Map<string, string | undefined> {
  const reached = new Map<string, string | undefined>([[entry, undefined]]);
  const todo = [entry];
  for (let file = todo.pop(); file !== undefined; file = todo.pop()) {
    for (const dep of runtimeImports(file)) {
      if (reached.has(dep)) continue;
      reached.set(dep, file);
      todo.push(dep);
    }
  }
  return reached;
}

/** The functions' core the in-cluster forwarder must never load. */
const FORBIDDEN = /^functions\/lib\/(pipeline|entry|exec|store|deploy|fetch|template)\//;

describe('the in-cluster forwarder module graph', () => {
  const graph = moduleGraph(path.join(ROOT, 'events/forwarder/index.ts'));
  const rel = (f: string | undefined) =>
    f === undefined ? '(entry)' : path.relative(ROOT, f).split(path.sep).join('/');

  it('does not reach the pipeline, the entry files, exec, store or the stage planners', () => {
    const offending = [...graph]
      .map(([file, from]) => [rel(file), rel(from)] as const)
      .filter(([file]) => FORBIDDEN.test(file))
      .map(([file, from]) => `${file} (imported by ${from})`);
    expect(offending).toEqual([]);
  });

  it('loads the artifact key patterns, not the sealing code', () => {
    const files = new Set([...graph.keys()].map(rel));
    expect(files.has('functions/lib/artifact/keys.ts')).toBe(true);
    expect(files.has('functions/lib/artifact/sealed.ts')).toBe(false);
  });

  it('follows imports (the walk can fail)', () => {
    const files = new Set([...graph.keys()].map(rel));
    expect(files.has('events/schema.ts')).toBe(true);
    expect(files.has('functions/lib/api/functions.ts')).toBe(true);
    expect(files.has('functions/lib/reconcile/timer.ts')).toBe(true);
    // The same walk from the embedded runtime does reach the pipeline.
    const embedded = [...moduleGraph(path.join(ROOT, 'functions/embedded/runtime.ts')).keys()].map(rel);
    expect(embedded.filter((f) => FORBIDDEN.test(f))).toContain('functions/lib/pipeline/dispatch.ts');
  });
});
