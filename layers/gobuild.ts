/**
 * Builds pinned Go components from the Go module proxy into a cache outside the checkout.
 *
 * Each component gets a throw-away wrapper module (`<cache>/gosrc/<key>`) that requires the
 * pinned module, copies its `replace` and `godebug` directives (a `go install mod@v` ignores
 * them and fails for k8s.io/kubernetes and etcd), then `go build`s each binary with
 * version stamps. Results live in `<cache>/bin/<key>/`, where `key` is name, version and a
 * hash of the build recipe, so a changed recipe rebuilds and an unchanged one is reused by
 * a fresh clone.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { appendFile, cp, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import path from 'node:path';
import type { GoComponent } from './manifest.js';

/**
 * Root of kapp-lambda's machine-wide cache: `$KAPP_LAMBDA_CACHE`, else
 * `$XDG_CACHE_HOME/kapp-lambda`, else `~/.cache/kapp-lambda`.
 */
export function cacheRoot(env: NodeJS.ProcessEnv = process.env): string {
  if (env.KAPP_LAMBDA_CACHE) return env.KAPP_LAMBDA_CACHE;
  return path.join(env.XDG_CACHE_HOME ?? path.join(homedir(), '.cache'), 'kapp-lambda');
}

/**
 * Cache key of a component: `<name>-<version>-<first 10 hex of sha256(recipe)>`. Its `need` enters
 * the recipe as the flag it replaced (`optional: true` unless `always`, at the field's place), so
 * keys stay those of the builds made before (`GoComponent.need`).
 */
export function componentKey(c: GoComponent): string {
  const asBuilt = Object.fromEntries(
    Object.entries(c).map(([k, v]) => (k === 'need' ? ['optional', v === 'always' ? undefined : true] : [k, v])),
  );
  const recipe = JSON.stringify({
    ...asBuilt,
    purpose: undefined,
    layers: undefined,
    demo: undefined,
    go: GO_RECIPE_VERSION,
    proxyLoopback: c.proxyLoopback ? PROXY_LOOPBACK_PATCH : undefined,
    imgpkgLayerPaths: c.imgpkgLayerPaths ? IMGPKG_LAYER_PATHS_PATCH : undefined,
  });
  return `${c.name}-${c.version}-${createHash('sha256').update(recipe).digest('hex').slice(0, 10)}`;
}

/**
 * The Go language version of the wrapper module every component is built in (its `go` line):
 * the toolchain must be at least this (the runtime image's `GO_VERSION`, `infra/runtime/Containerfile`).
 */
export const GO_LANGUAGE_VERSION = '1.26';

/** Bumped when the way binaries are built changes, so caches rebuild. */
const GO_RECIPE_VERSION = 1;

/** Directory holding a component's built binaries. */
export function binDir(c: GoComponent, root = cacheRoot()): string {
  return path.join(root, 'bin', componentKey(c));
}

/** Absolute path of one built binary of a component. */
export function binPath(c: GoComponent, bin: string, root = cacheRoot()): string {
  return path.join(binDir(c, root), bin);
}

/** Result of a child process run by {@link run}. */
interface RunResult {
  stdout: string;
  stderr: string;
  code: number;
}

/**
 * Runs argv without a shell. Streams stderr lines through `onLine` when given.
 * @throws Error with the last stderr lines when the exit code is not 0.
 */
export async function run(
  argv: readonly string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; onLine?: (line: string) => void } = {},
): Promise<RunResult> {
  const [cmd, ...args] = argv;
  if (!cmd) throw new Error('empty argv');
  return await new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let partial = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      const s = d.toString();
      stderr = (stderr + s).slice(-64 * 1024);
      if (opts.onLine) {
        const lines = (partial + s).split('\n');
        partial = lines.pop() ?? '';
        for (const l of lines) opts.onLine(l);
      }
    });
    child.on('error', reject);
    child.on('close', (code) => {
      const res = { stdout, stderr, code: code ?? -1 };
      if (res.code !== 0) {
        reject(
          new Error(`${argv.slice(0, 3).join(' ')} exited ${res.code}: ${stderr.split('\n').slice(-15).join('\n')}`),
        );
      } else resolve(res);
    });
  });
}

/** Environment for every `go` call: local toolchain, static binaries, no VCS stamping. */
export function goEnv(base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  return { ...base, GOTOOLCHAIN: 'local', CGO_ENABLED: '0', GOFLAGS: '-mod=mod -buildvcs=false' };
}

/**
 * Rewrites an upstream go.mod into the directives a wrapper module must carry: `replace`
 * lines (local-path targets become `<module> <localReplaceVersion>` or are dropped) and
 * `godebug` lines. Pure; exported for tests.
 */
export function wrapperDirectives(upstreamGoMod: string, localReplaceVersion?: string): string[] {
  const out: string[] = [];
  let block: 'replace' | 'godebug' | undefined;
  for (const raw of upstreamGoMod.split('\n')) {
    const line = raw.replace(/\/\/.*$/, '').trim();
    if (!line) continue;
    if (block) {
      if (line === ')') {
        block = undefined;
        continue;
      }
      const d = block === 'replace' ? replaceLine(line, localReplaceVersion) : `godebug ${line}`;
      if (d) out.push(d);
      continue;
    }
    const m = /^(replace|godebug)\s*(\()?\s*(.*)$/.exec(line);
    if (!m) continue;
    const kind = m[1] as 'replace' | 'godebug';
    if (m[2]) {
      block = kind;
      continue;
    }
    const rest = m[3] ?? '';
    const d = kind === 'replace' ? replaceLine(rest, localReplaceVersion) : `godebug ${rest}`;
    if (d) out.push(d);
  }
  return out;
}

function replaceLine(spec: string, localReplaceVersion?: string): string | undefined {
  const [lhs, rhs] = spec.split('=>').map((s) => s.trim());
  if (!lhs || !rhs) return undefined;
  const target = rhs.split(/\s+/);
  const isLocal = target[0]?.startsWith('./') || target[0]?.startsWith('../');
  if (!isLocal) return `replace ${lhs} => ${rhs}`;
  if (!localReplaceVersion || rhs.includes('FORBIDDEN')) return undefined;
  const mod = lhs.split(/\s+/)[0];
  return `replace ${mod} => ${mod} ${localReplaceVersion}`;
}

/** Callback for progress lines. */
export type Progress = (msg: string) => void;

/**
 * Builds a component unless its binaries are already cached, and checks each `--version`.
 * @returns directory holding the binaries.
 * @throws Error when a go command fails or a version check does not match the manifest.
 */
export async function buildComponent(c: GoComponent, progress: Progress, root = cacheRoot()): Promise<string> {
  const out = binDir(c, root);
  const done = path.join(out, '.complete');
  if (existsSync(done) && c.binaries.every((b) => existsSync(path.join(out, b.bin)))) {
    progress(`${c.name} ${c.version}: cached (${out})`);
    return out;
  }
  const started = Date.now();
  // noSumDb: the sum database has no entry for this module version; trust the proxy for it alone
  const env = c.noSumDb ? { ...goEnv(), GONOSUMDB: c.module } : goEnv();
  const src = path.join(root, 'gosrc', componentKey(c));
  await mkdir(src, { recursive: true });
  progress(`${c.name} ${c.version}: resolving module`);
  const dl = await run(['go', 'mod', 'download', '-json', `${c.module}@${c.version}`], { cwd: src, env });
  const info = JSON.parse(dl.stdout) as { GoMod?: string; Error?: string };
  if (info.Error || !info.GoMod) throw new Error(`go mod download ${c.module}@${c.version}: ${info.Error}`);
  const directives = wrapperDirectives(await readFile(info.GoMod, 'utf8'), c.localReplaceVersion);
  await writeFile(
    path.join(src, 'go.mod'),
    ['module kapp-lambda.local/build', '', `go ${GO_LANGUAGE_VERSION}`, '', ...directives, ''].join('\n'),
  );
  const tick = setInterval(
    () => progress(`${c.name}: still building (${Math.round((Date.now() - started) / 1000)}s)`),
    30_000,
  );
  let downloads = 0;
  const onLine = (l: string) => {
    if (/^go: (downloading|added|upgraded|finding)/.test(l)) {
      downloads++;
      if (downloads % 25 === 0) progress(`${c.name}: downloaded ${downloads} modules`);
    } else if (l.trim()) progress(`${c.name}: ${l}`);
  };
  try {
    progress(`${c.name} ${c.version}: go get (${directives.length} directives from upstream go.mod)`);
    await run(['go', 'get', ...c.binaries.map((b) => `${b.pkg}@${c.version}`)], { cwd: src, env, onLine });
    const tmpOut = `${out}.tmp-${process.pid}`;
    await rm(tmpOut, { recursive: true, force: true });
    await mkdir(tmpOut, { recursive: true });
    const ldflags = ['-s', '-w', ...(c.stamps ?? []).flatMap((s) => ['-X', s])].join(' ');
    if (c.imgpkgLayerPaths) await usePatchedImgpkg(src, env);
    const overlay = c.proxyLoopback ? await proxyLoopbackOverlay(src, env) : undefined;
    for (const b of c.binaries) {
      progress(`${c.name}: go build ${b.bin}`);
      const argv = ['go', 'build', '-trimpath', '-ldflags', ldflags, '-o', path.join(tmpOut, b.bin)];
      if (c.tags?.length) argv.push('-tags', c.tags.join(','));
      if (overlay) argv.push(`-overlay=${overlay}`);
      await run([...argv, b.pkg], { cwd: src, env, onLine });
    }
    await verifyVersions(c, tmpOut);
    await rm(out, { recursive: true, force: true });
    await rename(tmpOut, out);
    await writeFile(done, `${new Date().toISOString()}\n`);
  } finally {
    clearInterval(tick);
  }
  progress(`${c.name} ${c.version}: built in ${Math.round((Date.now() - started) / 1000)}s`);
  return out;
}

/** Bumped when {@link patchProxyLoopback} changes, so the patched tools rebuild. */
const PROXY_LOOPBACK_PATCH = 1;

/** Go's vendored httpproxy, relative to GOROOT (net/http's `ProxyFromEnvironment` calls it). */
const HTTPPROXY_SOURCE = 'src/vendor/golang.org/x/net/http/httpproxy/proxy.go';

/** The two early returns of httpproxy's `useProxy` that keep loopback targets off the proxy. */
const LOOPBACK_EXEMPTIONS: readonly [string, string][] = [
  ['if host == "localhost" {', 'if host == "localhost" && !klProxyLoopback {'],
  ['if ip.IsLoopback() {', 'if ip.IsLoopback() && !klProxyLoopback {'],
];

/**
 * Patches the source of Go's `httpproxy` so that `KL_PROXY_LOOPBACK=1` (read once, at start)
 * turns off its hard-coded exemption of `localhost` and loopback IP literals: stock Go sends
 * those direct whatever `NO_PROXY` says, so under the URL policy a redirect, an `index.yaml`
 * chart URL or a token realm naming `http://127.0.0.1:9001/` (the Lambda Runtime API) would
 * bypass the egress proxy. Without the variable the binary behaves as upstream's. Pure;
 * exported for tests.
 * @param source - the text of GOROOT's `httpproxy/proxy.go`
 * @returns the patched text
 * @throws Error when an exemption is not found exactly once (a Go release changed the file:
 *   the patch must be revisited rather than silently not applied)
 */
export function patchProxyLoopback(source: string): string {
  let out = source;
  for (const [from, to] of LOOPBACK_EXEMPTIONS) {
    if (out.split(from).length !== 2) throw new Error(`httpproxy patch: "${from}" not found exactly once`);
    out = out.replace(from, to);
  }
  if (!/^import \($[^)]*^\s+"os"$/ms.test(out)) throw new Error('httpproxy patch: proxy.go no longer imports "os"');
  return `${out}\n// kapp-lambda: proxy loopback targets too (layers/gobuild.ts).\nvar klProxyLoopback = os.Getenv("KL_PROXY_LOOPBACK") == "1"\n`;
}

/** Bumped when {@link patchImgpkgLayerPaths} changes, so the patched tools rebuild. */
const IMGPKG_LAYER_PATHS_PATCH = 1;

/** imgpkg's layer extraction, relative to its module's directory. */
const IMGPKG_DIR_IMAGE_SOURCE = 'pkg/imgpkg/image/dir_image.go';

/** The lines of imgpkg's `writeLayer` the check goes between. */
const IMGPKG_HYDRATE = '\t\tpath := i.hydrateFilepath(hdr.Name)\n\t\tbase := filepath.Base(path)\n';

/**
 * Patches imgpkg's `DirImage.writeLayer` (`pkg/imgpkg/image/dir_image.go`, which vendir links
 * too) to refuse a layer entry whose path, as imgpkg builds it, is not inside the output
 * directory. imgpkg's `hydrateFilepath` splits a name holding `\` on `\` (images made on
 * Windows by old imgpkg versions), so on Linux `..\x` is written to `<output>/../x` and
 * `..\..\..\home\u\.bashrc` anywhere the tool's uid may write; a `.wh.` entry so named removes
 * a file there. Go's `GODEBUG=tarinsecurepath=0` does not see it (`filepath.IsLocal` treats `\`
 * as an ordinary character on Linux). Names with `/` leave the same way (`../x` is written to
 * `<output>/../x`): Go's tar reader refuses them only under `GODEBUG=tarinsecurepath=0`, which
 * imgpkg does not set, so upstream imgpkg (v0.46.1) writes them outside too. The pull then fails
 * with `Refusing layer entry "..\\x": its path leaves the output directory` (or `"../x"`) before
 * anything of that entry is written. Pure; exported for tests.
 * @param source - the text of imgpkg's `dir_image.go`
 * @returns the patched text
 * @throws Error when the lines patched are not found exactly once (a new imgpkg changed the
 *   file: the patch must be revisited rather than silently not applied)
 */
export function patchImgpkgLayerPaths(source: string): string {
  if (source.split(IMGPKG_HYDRATE).length !== 2) {
    throw new Error('imgpkg patch: writeLayer no longer hydrates the entry path as expected');
  }
  if (!/^\s+"strings"$/m.test(source) || !/^\s+"fmt"$/m.test(source)) {
    throw new Error('imgpkg patch: dir_image.go no longer imports "fmt" and "strings"');
  }
  const check = [
    '\t\tpath := i.hydrateFilepath(hdr.Name)',
    '\t\t// kapp-lambda: refuse an entry that leaves the output directory (layers/gobuild.ts).',
    '\t\tif rel, relErr := filepath.Rel(i.dirPath, path); relErr != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {',
    '\t\t\treturn fmt.Errorf("Refusing layer entry %q: its path leaves the output directory", hdr.Name)',
    '\t\t}',
    '\t\tbase := filepath.Base(path)',
    '',
  ].join('\n');
  return source.replace(IMGPKG_HYDRATE, check);
}

/**
 * Writes the `-overlay` file that builds a component with {@link patchProxyLoopback}'s
 * httpproxy (the toolchain's own file is left untouched; only this build sees the patch).
 * @returns the overlay JSON's path
 */
async function proxyLoopbackOverlay(src: string, env: NodeJS.ProcessEnv): Promise<string> {
  const goroot = (await run(['go', 'env', 'GOROOT'], { env })).stdout.trim();
  const original = path.join(goroot, HTTPPROXY_SOURCE);
  // Beside the wrapper module, not in it: a .go file there would be read as one of its packages.
  const dir = `${src}.overlay`;
  const patched = path.join(dir, 'httpproxy-proxy.go');
  await mkdir(dir, { recursive: true });
  await writeFile(patched, patchProxyLoopback(await readFile(original, 'utf8')));
  const json = path.join(dir, 'overlay.json');
  await writeFile(json, JSON.stringify({ Replace: { [original]: patched } }));
  return json;
}

/**
 * Makes the wrapper module at `src` build imgpkg's packages from a copy of the imgpkg module it
 * resolved, patched by {@link patchImgpkgLayerPaths}, through a `replace` directive (Go refuses
 * an `-overlay` of a file in the module cache). The copy sits beside the wrapper module.
 * @throws Error when the module cannot be found or the patch does not apply
 */
async function usePatchedImgpkg(src: string, env: NodeJS.ProcessEnv): Promise<void> {
  const listed = await run(['go', 'list', '-m', '-f', '{{.Dir}}\t{{.Version}}', 'carvel.dev/imgpkg'], {
    cwd: src,
    env,
  });
  const [modDir, version] = listed.stdout.trim().split('\t');
  if (!modDir || !version) throw new Error('imgpkg patch: carvel.dev/imgpkg is not in the build');
  const copy = path.join(`${src}.overlay`, `imgpkg-${version}`);
  await rm(copy, { recursive: true, force: true });
  await mkdir(path.dirname(copy), { recursive: true });
  await cp(modDir, copy, { recursive: true });
  // The module cache is read-only; the copy must be writable (and removable on a rebuild).
  await run(['chmod', '-R', 'u+w', copy], { env });
  const file = path.join(copy, IMGPKG_DIR_IMAGE_SOURCE);
  await writeFile(file, patchImgpkgLayerPaths(await readFile(file, 'utf8')));
  await appendFile(path.join(src, 'go.mod'), `\nreplace carvel.dev/imgpkg => ${copy}\n`);
}

/**
 * Runs each binary's version command and checks it reports the pinned version.
 * @returns map of binary name to the first line of its version output.
 * @throws Error naming the binary and its output on a mismatch.
 */
export async function verifyVersions(c: GoComponent, dir: string): Promise<Record<string, string>> {
  const seen: Record<string, string> = {};
  for (const b of c.binaries) {
    const expect = b.versionFromBuildInfo
      ? `${c.module}\t${c.version}`
      : (b.expectVersion ?? c.version.replace(/^v/, ''));
    const argv = b.versionFromBuildInfo
      ? ['go', 'version', '-m', path.join(dir, b.bin)]
      : [path.join(dir, b.bin), ...b.versionArgs];
    const r = await run(argv, {
      env: { ...process.env, SOPS_DISABLE_VERSION_CHECK: '1' },
    }).catch((e: Error) => ({ stdout: '', stderr: e.message, code: 1 }));
    const text = `${r.stdout}\n${r.stderr}`;
    if (!text.includes(expect)) {
      throw new Error(`${b.bin} ${b.versionArgs.join(' ')} does not report ${expect}: ${text.trim().slice(0, 400)}`);
    }
    seen[b.bin] = text.trim().split('\n')[0] ?? '';
  }
  return seen;
}
