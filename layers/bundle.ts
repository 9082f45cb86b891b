/**
 * The one esbuild recipe for everything that runs as plain `node` outside tsx: the Lambda
 * functions (`functions/<stage>/index.ts`, bundled by `layers/build.ts`, the bench and the Lambda
 * integration test) and the bench's forwarder child. One ESM file for Node 20, minified, with a
 * `require` shim so bundled CommonJS dependencies that call `require` for Node built-ins still
 * load.
 *
 * @module
 */
import { stat } from 'node:fs/promises';
import path from 'node:path';

/** The repository root (this file lives in `layers/`). */
const REPO_ROOT = path.join(import.meta.dirname, '..');

/**
 * Defines `require` in an ESM bundle (esbuild's CommonJS interop calls it for Node built-ins).
 */
const REQUIRE_SHIM = "import{createRequire as __cr}from'module';const require=__cr(import.meta.url);";

/** THE recipe's esbuild options (every bundle of the project is built with these). */
const RECIPE = {
  bundle: true,
  minify: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  logLevel: 'warning',
  banner: { js: REQUIRE_SHIM },
} as const;

/**
 * The entry file of a Lambda function: `<repo>/functions/<stage>/index.ts`.
 *
 * @param stage - The function's folder name, e.g. `fetch`.
 * @returns The absolute path (the file may not exist yet for a planned stage).
 */
export function functionEntry(stage: string): string {
  return path.join(REPO_ROOT, 'functions', stage, 'index.ts');
}

/**
 * Bundles one TypeScript entry into a single minified ESM file for Node 20 (esbuild `bundle`,
 * `platform: 'node'`, `target: 'node20'`, the `require` shim as banner, warnings logged).
 * esbuild is imported on first use, so importing this module stays cheap.
 *
 * @param entry - The entry file.
 * @param outfile - Where to write the bundle (folders are created).
 * @returns The bundle's size in bytes.
 * @throws Error from esbuild when the entry does not build.
 */
export async function bundleEntry(entry: string, outfile: string): Promise<number> {
  const { build } = await import('esbuild');
  await build({ ...RECIPE, entryPoints: [entry], outfile });
  return (await stat(outfile)).size;
}

/**
 * Bundles the Lambda function of `stage` ({@link functionEntry}) with {@link bundleEntry}: the
 * file deployed as the function's code.
 *
 * @param stage - The function's folder name, e.g. `fetch`.
 * @param outfile - Where to write the bundle.
 * @returns The bundle's size in bytes.
 * @throws Error from esbuild when the function does not build.
 */
export function bundleFunction(stage: string, outfile: string): Promise<number> {
  return bundleEntry(functionEntry(stage), outfile);
}

/**
 * Bundles several Lambda functions ({@link functionEntry}) with the same recipe in one esbuild
 * run, to `<outDir>/<stage>/index.mjs` (the file name the Node managed runtime loads for the
 * handler `index.handler`). One run parses the shared core once instead of once per function.
 *
 * @param stages - The functions' folder names.
 * @param outDir - The parent of one directory per function (created).
 * @returns The directory of each function's bundle.
 * @throws Error from esbuild when a function does not build.
 */
export async function bundleFunctions<S extends string>(
  stages: readonly S[],
  outDir: string,
): Promise<Record<S, string>> {
  const { build } = await import('esbuild');
  await build({
    ...RECIPE,
    entryPoints: stages.map((s) => ({ in: functionEntry(s), out: path.join(s, 'index') })),
    outdir: outDir,
    outExtension: { '.js': '.mjs' },
  });
  return Object.fromEntries(stages.map((s) => [s, path.join(outDir, s)])) as Record<S, string>;
}
