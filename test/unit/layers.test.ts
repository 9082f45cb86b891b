import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { PIPELINE_STAGES } from '../../functions/lib/api/functions.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { layerBins, layerTools, STAGES } from '../../layers/build.js';
import { bundleFunction, FUNCTION_BUNDLE_MAX_BYTES, functionBundleFacts, functionEntry } from '../../layers/bundle.js';
import { lddLibraries } from '../../layers/git.js';
import { componentKey, patchImgpkgLayerPaths, patchProxyLoopback, wrapperDirectives } from '../../layers/gobuild.js';
import { COMPONENTS, component } from '../../layers/manifest.js';
import { TOOLS } from '../../layers/tools.js';

describe('wrapperDirectives', () => {
  it('maps k8s staging replaces to the staging version and keeps godebug', () => {
    const gomod = [
      'module k8s.io/kubernetes',
      'go 1.24.0',
      'godebug default=go1.24',
      'require (',
      '\tk8s.io/api v0.0.0',
      ')',
      'replace (',
      '\tk8s.io/api => ./staging/src/k8s.io/api',
      '\tgithub.com/x/y => github.com/x/y v1.2.3 // pinned',
      ')',
      'replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY',
    ].join('\n');
    expect(wrapperDirectives(gomod, 'v0.34.4')).toEqual([
      'godebug default=go1.24',
      'replace k8s.io/api => k8s.io/api v0.34.4',
      'replace github.com/x/y => github.com/x/y v1.2.3',
    ]);
  });

  it('drops local replaces when no version is given', () => {
    expect(wrapperDirectives('replace go.etcd.io/etcd/api/v3 => ../api\n')).toEqual([]);
  });

  it('reads godebug blocks', () => {
    expect(wrapperDirectives('godebug (\n\tx509negativeserial=1\n\tdefault=go1.23\n)\n')).toEqual([
      'godebug x509negativeserial=1',
      'godebug default=go1.23',
    ]);
  });
});

describe('patchProxyLoopback', () => {
  const goroot = spawnSync('go', ['env', 'GOROOT'], {
    encoding: 'utf8',
    env: { ...process.env, GOTOOLCHAIN: 'local' },
  }).stdout.trim();
  const source = readFileSync(path.join(goroot, 'src/vendor/golang.org/x/net/http/httpproxy/proxy.go'), 'utf8');

  it("gates both of the toolchain's loopback exemptions on KL_PROXY_LOOPBACK", () => {
    const out = patchProxyLoopback(source);
    expect(out).toContain('if host == "localhost" && !klProxyLoopback {');
    expect(out).toContain('if ip.IsLoopback() && !klProxyLoopback {');
    expect(out).not.toMatch(/if host == "localhost" \{|if ip\.IsLoopback\(\) \{/);
    expect(out).toContain('var klProxyLoopback = os.Getenv("KL_PROXY_LOOPBACK") == "1"');
  });

  it('refuses a source whose exemptions moved, rather than building unpatched', () => {
    expect(() => patchProxyLoopback(source.replace('if ip.IsLoopback() {', 'if ip.IsLoopback() || x {'))).toThrow(
      /IsLoopback\(\) \{" not found exactly once/,
    );
    expect(() => patchProxyLoopback(source.replace('\t"os"\n', ''))).toThrow(/no longer imports "os"/);
  });

  it('rebuilds exactly the tools that request under the egress proxy (and sops and kustomize, under their dead proxy)', () => {
    expect(COMPONENTS.filter((c) => c.proxyLoopback).map((c) => c.name)).toEqual([
      'kbld',
      'vendir',
      'imgpkg',
      'helm',
      'sops',
      'kustomize',
    ]);
  });
});

describe('patchImgpkgLayerPaths', () => {
  // The lines of imgpkg v0.46.1 `pkg/imgpkg/image/dir_image.go` the patch touches.
  const upstream = [
    'package image',
    '',
    'import (',
    '\t"archive/tar"',
    '\t"fmt"',
    '\t"io"',
    '\t"os"',
    '\t"path/filepath"',
    '\t"runtime"',
    '\t"strings"',
    ')',
    '',
    'func (i *DirImage) writeLayer(fileMap map[string]bool, stream io.Reader) error {',
    '\ttarReader := tar.NewReader(stream)',
    '\tfor {',
    '\t\thdr, err := tarReader.Next()',
    '\t\tif err != nil {',
    '\t\t\treturn err',
    '\t\t}',
    '',
    '\t\tpath := i.hydrateFilepath(hdr.Name)',
    '\t\tbase := filepath.Base(path)',
    '',
  ].join('\n');

  it('checks each entry path against the output directory before anything of it is written', () => {
    const out = patchImgpkgLayerPaths(upstream);
    expect(out).toContain(
      [
        '\t\tpath := i.hydrateFilepath(hdr.Name)',
        '\t\t// kapp-lambda: refuse an entry that leaves the output directory (layers/gobuild.ts).',
        '\t\tif rel, relErr := filepath.Rel(i.dirPath, path); relErr != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {',
        '\t\t\treturn fmt.Errorf("Refusing layer entry %q: its path leaves the output directory", hdr.Name)',
        '\t\t}',
        '\t\tbase := filepath.Base(path)',
      ].join('\n'),
    );
  });

  it('refuses a source that changed, rather than building unpatched', () => {
    expect(() => patchImgpkgLayerPaths(upstream.replace('hydrateFilepath(hdr.Name)', 'hydrate(hdr.Name)'))).toThrow(
      /no longer hydrates/,
    );
    expect(() => patchImgpkgLayerPaths(upstream.replace('\t"strings"\n', ''))).toThrow(/no longer imports/);
  });

  it('the real imgpkg module, when the build fetched it, still has the lines patched', () => {
    const real = path.join(
      spawnSync('go', ['env', 'GOMODCACHE'], { encoding: 'utf8' }).stdout.trim(),
      'carvel.dev/imgpkg@v0.46.1/pkg/imgpkg/image/dir_image.go',
    );
    if (existsSync(real)) expect(patchImgpkgLayerPaths(readFileSync(real, 'utf8'))).toContain('Refusing layer entry');
  });

  it('patches imgpkg and vendir, which links its extraction', () => {
    expect(COMPONENTS.filter((c) => c.imgpkgLayerPaths).map((c) => c.name)).toEqual(['vendir', 'imgpkg']);
    expect(component('imgpkg').version).toBe('v0.46.1');
  });
});

describe('manifest', () => {
  it('gives each layer only what its stage runs', () => {
    expect(layerTools('fetch').map((t) => t.bin)).toEqual(['vendir', 'imgpkg', 'helm']);
    expect(layerTools('template').map((t) => t.bin)).toEqual([
      'ytt',
      'kbld',
      'helm',
      'sops',
      'age',
      'age-keygen',
      'cue',
      'kustomize',
    ]);
    expect(layerTools('deploy').map((t) => t.bin)).toEqual(['kapp']);
    expect(layerTools('index-repo').map((t) => t.bin)).toEqual(['ytt', 'kbld', 'kapp', 'vendir', 'imgpkg']);
    expect(layerTools('install')).toEqual([]);
  });

  it.each(PIPELINE_STAGES)('the %s layer carries every tool the function may run', (stage) => {
    const bins = layerBins(stage);
    expect(STAGE_TOOLS[stage].filter((tool) => !bins.includes(tool))).toEqual([]);
  });

  it('carries git in the layers of the functions that run vendir', () => {
    const withVendir = PIPELINE_STAGES.filter((s) => layerBins(s).includes('vendir'));
    expect(withVendir).toEqual(['fetch', 'index-repo']);
    for (const s of PIPELINE_STAGES) expect(layerBins(s).includes('git')).toBe(withVendir.includes(s));
  });

  it('builds each pinned tool of the table at its version, with its binaries, into its layers', () => {
    for (const t of TOOLS.filter((x) => x.version !== undefined)) {
      const c = component(t.name);
      expect([c.version, c.binaries.map((b) => b.bin), c.layers]).toEqual([t.version, t.bins, t.stages]);
    }
    // git is the machine's, relocated into the layers of the functions that run vendir (`layers/git.ts`)
    expect(TOOLS.filter((x) => x.version === undefined).map((x) => x.name)).toEqual(['git']);
    expect(COMPONENTS.filter((c) => c.layers.length > 0).map((c) => c.name)).toEqual(
      expect.arrayContaining(TOOLS.filter((x) => x.version !== undefined).map((x) => x.name)),
    );
    expect(COMPONENTS.filter((c) => c.layers.length > 0).length).toBe(TOOLS.length - 1);
  });

  it('keys caches by name, version and recipe', () => {
    const ytt = component('ytt');
    expect(componentKey(ytt)).toMatch(/^ytt-v0\.55\.3-[0-9a-f]{10}$/);
    expect(componentKey({ ...ytt, stamps: [] })).not.toEqual(componentKey(ytt));
    expect(new Set(COMPONENTS.map(componentKey)).size).toBe(COMPONENTS.length);
  });
});

describe('function bundles', () => {
  it('every function with a queue has a layer and an entry file', () => {
    expect(STAGES).toEqual(['fetch', 'template', 'deploy', 'index-repo', 'install']);
    expect(PIPELINE_STAGES.filter((s) => !existsSync(functionEntry(s)))).toEqual([]);
  });

  it.each(['index-repo', 'install'] as const)(
    'the %s bundle builds and starts as that function',
    async (stage) => {
      const dir = await mkdtemp(path.join(tmpdir(), 'layers-bundle-'));
      try {
        const outfile = path.join(dir, `${stage}.mjs`);
        expect(await bundleFunction(stage, outfile)).toBeGreaterThan(0);
        // Its own bootstrap, with no configuration: init ends with one fatal JSON line on stderr
        // naming the function whose configuration is missing (not the fetch or deploy function).
        const run = spawnSync(process.execPath, [outfile], { env: { PATH: process.env.PATH }, encoding: 'utf8' });
        expect(run.status).toBe(1);
        expect(JSON.parse(run.stderr.trim().split('\n')[0] ?? '{}')).toEqual({
          level: 'fatal',
          msg: 'function failed',
          error: {
            errorType: 'ConfigError',
            errorMessage:
              `invalid configuration of the ${stage} function: AWS_REGION: required; KAPP_LAMBDA_BUCKET: required; ` +
              'KAPP_LAMBDA_KUBECONFIG: required (path of a kubeconfig file); ' +
              // install runs no tool: it needs no tool versions
              (stage === 'install' ? '' : 'KAPP_LAMBDA_TOOL_VERSIONS: required (JSON object of tool versions); ') +
              // both send to the install queue (repo.indexed, the ref-changed fan-out); index-repo
              // also to its own and to fetch's (the source poll's fan-out to repositories and Apps)
              `KAPP_LAMBDA_QUEUE_URL_INSTALL: required (the ${stage} function sends to it)` +
              (stage === 'index-repo'
                ? `; KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: required (the ${stage} function sends to it)` +
                  `; KAPP_LAMBDA_QUEUE_URL_FETCH: required (the ${stage} function sends to it)`
                : ''),
          },
        });
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
    60_000,
  );
});

describe('function bundle contents', () => {
  /** Each function's route: the stage it runs (`functions/lib/pipeline/routes/<stage>.ts`). */
  const routeOf = (stage: string) => `functions/lib/pipeline/routes/${stage}.ts`;

  it.each(PIPELINE_STAGES)(
    'the %s bundle holds its own route only, none of the AWS SDK or client-node, in at most 1,000,000 bytes',
    async (stage) => {
      const { inputs, bytes } = await functionBundleFacts(stage);
      expect(bytes).toBeLessThanOrEqual(FUNCTION_BUNDLE_MAX_BYTES);
      // The functions read kubeconfigs over the plain transports (`functions/lib/kube/kubeconfig-plain.ts`):
      // client-node (its generated APIs, node-fetch, openid-client) is the embedded runtime's only.
      expect(
        inputs.filter((f) => /^node_modules\/(@kubernetes\/client-node|node-fetch|openid-client)\//.test(f)),
      ).toEqual([]);
      expect(PIPELINE_STAGES.filter((s) => inputs.includes(routeOf(s)))).toEqual([stage]);
      expect(inputs.filter((f) => f.startsWith('node_modules/@aws-sdk/'))).toEqual([]);
      // Loaded from the runtime's NODE_PATH instead (`RUNTIME_PROVIDED`).
      expect(inputs).toContain('lambda-runtime:@aws-sdk/client-s3');
      expect(inputs).not.toContain('functions/lib/pipeline/dispatch.ts');
      // No whatwg-url and its tr46 tables, no WebSocket stack; prom-client is the embedded runtime's only.
      expect(inputs.filter((f) => /^node_modules\/(whatwg-url|tr46|ws|@smithy|prom-client)\//.test(f))).toEqual([]);
      // zod's 40+ locale files (~370 KB) stay out: only `import * as z from 'zod'` lets esbuild
      // drop them (a named `{ z }` import keeps the whole namespace, `z.locales` included).
      expect(
        inputs.filter((f) => f.startsWith('node_modules/zod/v4/locales/') && !/\/(en|index)\.js$/.test(f)),
      ).toEqual([]);
    },
    60_000,
  );

  it.each(['deploy', 'install'] as const)(
    'the %s bundle, which packs and unpacks no tarball, carries no tar (issue 24 item 7: cold start)',
    async (stage) => {
      const { inputs } = await functionBundleFacts(stage);
      // The reconcile results classify ArtifactError from `artifact/errors.ts`, not `artifact/tarball.ts`.
      expect(
        inputs.filter((f) => f.startsWith('node_modules/tar/') || f === 'functions/lib/artifact/tarball.ts'),
      ).toEqual([]);
    },
    60_000,
  );
});

describe('lddLibraries', () => {
  it('lists each library by its name and the loader as ld.so, skipping the vDSO', () => {
    const out = [
      '\tlinux-vdso.so.1 (0x00007ffd)',
      '\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f8b98bc4000)',
      '\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f8b98584000)',
      '\t/lib64/ld-linux-x86-64.so.2 (0x00007f8b98bf6000)',
    ].join('\n');
    expect(lddLibraries(out)).toEqual([
      ['libz.so.1', '/lib/x86_64-linux-gnu/libz.so.1'],
      ['libc.so.6', '/lib/x86_64-linux-gnu/libc.so.6'],
      ['ld.so', '/lib64/ld-linux-x86-64.so.2'],
    ]);
  });

  it('refuses a library ldd could not find (the layer would not start)', () => {
    expect(() => lddLibraries('\tlibcurl-gnutls.so.4 => not found\n')).toThrow(
      'git layer: ldd: libcurl-gnutls.so.4 => not found',
    );
  });
});
