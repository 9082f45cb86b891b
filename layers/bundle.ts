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
import type { Plugin } from 'esbuild';

/** The repository root (this file lives in `layers/`). */
const REPO_ROOT = path.join(import.meta.dirname, '..');

/**
 * Defines `require` in an ESM bundle (esbuild's CommonJS interop calls it for Node built-ins).
 */
const REQUIRE_SHIM = "import{createRequire as __cr}from'module';const require=__cr(import.meta.url);";

/** The esbuild namespace of {@link nodeUrlForWhatwgUrl}'s stand-in module. */
const NODE_URL_NS = 'node-url';

/**
 * Gives `node-fetch` (client-node's HTTP library) Node's own `URL` for its `whatwg-url` import,
 * dropping `whatwg-url` and its `tr46` Unicode tables (~290 KB minified) from a bundle that
 * holds client-node (none of the Lambda functions does since they read kubeconfigs over the
 * plain transports, `functions/lib/kube/kubeconfig-plain.ts`; kept for any other bundle).
 * Nothing changes at run time: node-fetch 2 takes `require('url').URL || whatwgUrl.URL`, and
 * Node (every version this project runs on) has `url.URL`, so `whatwg-url` was bundled but never
 * used. Scoped to node-fetch's import; any other importer gets the real package.
 */
const nodeUrlForWhatwgUrl: Plugin = {
  name: 'node-url-for-whatwg-url',
  setup(b) {
    b.onResolve({ filter: /^whatwg-url$/ }, (a) =>
      /[\\/]node_modules[\\/]node-fetch[\\/]/.test(a.importer)
        ? { path: 'whatwg-url', namespace: NODE_URL_NS }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: NODE_URL_NS }, () => ({
      contents:
        "module.exports = { URL: require('node:url').URL, URLSearchParams: require('node:url').URLSearchParams };",
      loader: 'js',
    }));
  },
};

/** A file of `@kubernetes/client-node` (its own modules, not its dependencies). */
const CLIENT_NODE_FILE = /[\\/]node_modules[\\/]@kubernetes[\\/]client-node[\\/]/;

/**
 * Declares `@kubernetes/client-node`'s modules free of import-time side effects (what its
 * `package.json` does not say), so esbuild leaves out the ones nothing uses: with the package
 * index imported for `KubeConfig` and `Watch`, the WebSocket exec/attach/port-forward stack (`ws`)
 * and the unused generated APIs (~85 KB minified per function). Its modules only declare classes
 * and functions and import others for their exports (none is imported for its effects), so what
 * is kept behaves as before.
 */
const clientNodeWithoutSideEffects: Plugin = {
  name: 'client-node-without-side-effects',
  setup(b) {
    b.onResolve({ filter: /.*/ }, async (a) => {
      if (
        a.pluginData === CLIENT_NODE_FILE ||
        (!CLIENT_NODE_FILE.test(a.importer) && !a.path.startsWith('@kubernetes/client-node'))
      ) {
        return undefined;
      }
      const r = await b.resolve(a.path, {
        kind: a.kind,
        importer: a.importer,
        resolveDir: a.resolveDir,
        pluginData: CLIENT_NODE_FILE,
      });
      if (r.errors.length > 0 || r.external || !CLIENT_NODE_FILE.test(r.path)) return r;
      return { ...r, sideEffects: false };
    });
  },
};

/** THE recipe's esbuild options (every bundle of the project is built with these). */
const RECIPE = {
  bundle: true,
  minify: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  logLevel: 'warning',
  banner: { js: REQUIRE_SHIM },
  plugins: [nodeUrlForWhatwgUrl, clientNodeWithoutSideEffects] as Plugin[],
} as const;

/**
 * The packages the Lambda Node.js managed runtime provides (the AWS SDK for JavaScript v3 in
 * `/var/runtime/node_modules`, on the runtime's `NODE_PATH`): AWS's documented practice for
 * Node.js 18+ runtimes is to not ship them (the CDK's `NodejsFunction` marks `@aws-sdk/*`
 * external by default, `bundleAwsSDK: false`). The function bundles load them with `require`
 * (CommonJS resolution honours `NODE_PATH` everywhere, also when the bundle is its own bootstrap
 * under the Runtime Interface Emulator, where no Lambda loader resolves ES imports through it).
 *
 * The trade-off: the SDK version is the runtime's (updated by AWS, not pinned by
 * package-lock.json); the functions need one with S3 conditional writes (`If-Match` on
 * `PutObject`, SDK releases since late November 2024), which the `nodejs24.x` runtime
 * (November 2025) has. The functions import no `@smithy/*` code of their own (the EKS token is
 * presigned with `node:crypto`, `functions/lib/kube/bearer.ts`), so none is bundled either.
 */
export const RUNTIME_PROVIDED = /^@aws-sdk\//;

/**
 * The `NODE_PATH` that gives a function bundle the {@link RUNTIME_PROVIDED} packages off Lambda
 * (the emulator harness, the bench): the project's own `node_modules`, as Lambda's runtime puts
 * its `/var/runtime/node_modules` on `NODE_PATH` (never the host's global modules).
 */
export function runtimeNodePath(): string {
  return path.join(REPO_ROOT, 'node_modules');
}

/** The esbuild namespace of the `require` stubs of {@link RUNTIME_PROVIDED} packages. */
const RUNTIME_NS = 'lambda-runtime';

/**
 * Replaces each import of a {@link RUNTIME_PROVIDED} package by a CommonJS stub
 * (`module.exports = require('<package>')`) whose `require` stays in the bundle: the package is
 * loaded from `NODE_PATH` when the module importing it is first evaluated.
 */
const runtimeProvided: Plugin = {
  name: 'lambda-runtime-provided',
  setup(b) {
    b.onResolve({ filter: RUNTIME_PROVIDED }, (a) =>
      a.namespace === RUNTIME_NS ? { path: a.path, external: true } : { path: a.path, namespace: RUNTIME_NS },
    );
    b.onLoad({ filter: /.*/, namespace: RUNTIME_NS }, (a) => ({
      contents: `module.exports = require(${JSON.stringify(a.path)});`,
      loader: 'js',
    }));
  },
};

/** THE recipe of the Lambda function bundles: {@link RECIPE} without the {@link RUNTIME_PROVIDED} packages. */
const FUNCTION_RECIPE = { ...RECIPE, plugins: [runtimeProvided, ...RECIPE.plugins] };

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
 * Bundles the Lambda function of `stage` ({@link functionEntry}) as {@link bundleEntry} does but
 * without the {@link RUNTIME_PROVIDED} packages: the file deployed as the function's code. It
 * runs where those packages are on `NODE_PATH` (the Lambda Node.js runtime; the emulator harness
 * and the bench give it the project's `node_modules`).
 *
 * @param stage - The function's folder name, e.g. `fetch`.
 * @param outfile - Where to write the bundle.
 * @returns The bundle's size in bytes.
 * @throws Error from esbuild when the function does not build.
 */
export async function bundleFunction(stage: string, outfile: string): Promise<number> {
  const { build } = await import('esbuild');
  await build({ ...FUNCTION_RECIPE, entryPoints: [functionEntry(stage)], outfile });
  return (await stat(outfile)).size;
}

/**
 * Bundles several Lambda functions ({@link functionEntry}) with the recipe of
 * {@link bundleFunction} in one esbuild run, to `<outDir>/<stage>/index.mjs` (the file name the Node managed runtime loads for the
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
    ...FUNCTION_RECIPE,
    entryPoints: stages.map((s) => ({ in: functionEntry(s), out: path.join(s, 'index') })),
    outdir: outDir,
    outExtension: { '.js': '.mjs' },
  });
  return Object.fromEntries(stages.map((s) => [s, path.join(outDir, s)])) as Record<S, string>;
}

/**
 * The most a function bundle may weigh, bytes: 1,000,000 (docs/decisions.md D12: small functions
 * load and start fast; the AWS SDK is the runtime's, client-node is not bundled).
 */
export const FUNCTION_BUNDLE_MAX_BYTES = 1_000_000;

/** What {@link functionBundleFacts} reports of one function's bundle. */
export interface FunctionBundleFacts {
  /** The source files in the bundle, sorted: repository-relative, dependencies as `node_modules/<package>/...`. */
  inputs: string[];
  /** The bundle's size in bytes, as {@link bundleFunction} writes it. */
  bytes: number;
}

/**
 * The source files that end up in the bundle of `stage` and its size (esbuild's metafile,
 * nothing written). What checks that a function carries its own stage only, none of the
 * runtime's packages, and stays under {@link FUNCTION_BUNDLE_MAX_BYTES}.
 *
 * @param stage - The function's folder name, e.g. `fetch`.
 * @throws Error from esbuild when the function does not build.
 */
export async function functionBundleFacts(stage: string): Promise<FunctionBundleFacts> {
  const { build } = await import('esbuild');
  const r = await build({
    ...FUNCTION_RECIPE,
    entryPoints: [functionEntry(stage)],
    outfile: path.join(REPO_ROOT, 'inputs.mjs'),
    write: false,
    metafile: true,
    logLevel: 'silent',
  });
  const outputs = Object.values(r.metafile.outputs);
  const inputs = outputs.flatMap((o) => Object.keys(o.inputs));
  return {
    inputs: inputs
      .map((f) => {
        const i = f.lastIndexOf('node_modules/');
        return i >= 0 ? f.slice(i) : path.relative(REPO_ROOT, path.resolve(process.cwd(), f));
      })
      .sort(),
    bytes: outputs.reduce((n, o) => n + o.bytes, 0),
  };
}
