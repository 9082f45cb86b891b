/**
 * `npx tsx bench/profile-repositories.ts [sizes...]`: where kapp-lambda's index-repo spends its
 * time for the inline repositories of the repositories scenario, without kapp-controller. Starts
 * the local control plane and the embedded runtime, creates `repo-<n>` for each size (default 50
 * and 500), and prints a timeline relative to the create request: the event reaching the
 * pipeline, each tool run (start, end), each API request of the pipeline and each object-store
 * call (start, duration), the stage records, and the watch seeing `ReconcileSucceeded`.
 *
 * A diagnostic, not a benchmark: no figure of it goes into results.
 *
 * @module
 */

import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { startEmbedded } from '../functions/embedded/runtime.js';
import type { RunRequest } from '../functions/lib/exec/runner.js';
import { PACKAGING_API_VERSION } from '../functions/lib/kube/port.js';
import type { RestTransport } from '../functions/lib/kube/transport.js';
import type { Logger } from '../functions/lib/log.js';
import { cacheRoot } from '../layers/gobuild.js';
import { applyCrds } from '../scripts/local-env.js';
import { startCluster } from '../test/harness/cluster.js';
import { AppWatch, collectionPath, createAll, createTenants, restFor } from './lib/kube.js';
import { timedStore, wrappedRegistry } from './lib/ours.js';
import { REPOSITORY_SIZES, repositorySet } from './scenarios/repositories.js';

const sizes = process.argv
  .slice(2)
  .filter((a) => a !== '--')
  .map(Number);
const chosen = REPOSITORY_SIZES.filter((s) => (sizes.length ? sizes : [50, 500]).includes(s.packages));
const say = (m: string) => process.stderr.write(`${m}\n`);

interface Mark {
  at: number;
  end?: number;
  what: string;
}
let marks: Mark[] = [];
const mark = (what: string, at = performance.now(), end?: number) => {
  marks.push({ at, what, ...(end === undefined ? {} : { end }) });
};

function logger(bindings: Record<string, unknown> = {}): Logger {
  const at =
    (level: string) =>
    (obj: Record<string, unknown>, msg?: string): void => {
      if (msg === 'stage run') {
        const o = obj as { stage?: string; outcome?: string; durationMs?: number };
        mark(`stage ${o.stage} ${o.outcome} (${Math.round(o.durationMs ?? 0)} ms)`);
      } else if (level === 'warn' || level === 'error')
        say(`[${level}] ${msg} ${JSON.stringify({ ...bindings, ...obj })}`);
    };
  return {
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    debug: () => {},
    child: (b) => logger({ ...bindings, ...b }),
  };
}

function timedRest(inner: RestTransport): RestTransport {
  return {
    async send(req) {
      const t0 = performance.now();
      try {
        return await inner.send(req);
      } finally {
        const body = req.body === undefined ? 0 : JSON.stringify(req.body).length;
        mark(`api ${req.method} ${req.path.replace(/\?.*/, '')}${body ? ` (${body} B)` : ''}`, t0, performance.now());
      }
    },
  };
}

const workRoot = await mkdtemp(path.join(os.tmpdir(), 'kapp-lambda-profile-'));
say('starting the local control plane');
const cluster = await startCluster({ log: () => {} });
try {
  await applyCrds(cluster.kubeconfigPath);
  const rest = restFor(cluster.kubeconfigPath);
  const ns = 'profile-repos';
  await createTenants(rest, [ns]);
  const runtime = startEmbedded({
    kubeconfigPath: cluster.kubeconfigPath,
    namespaces: [ns],
    storeDir: path.join(workRoot, 'store'),
    tmpRoot: path.join(workRoot, 'work'),
    cacheRoot: cacheRoot(),
    concurrency: 4,
    log: logger(),
    sourcePoll: false,
    wrapDeps: (deps) => {
      const clusters = wrappedRegistry(cluster.kubeconfigPath, deps.clusters.clusterIds(), timedRest);
      const runner = {
        run: async (req: RunRequest) => {
          const t0 = performance.now();
          const r = await deps.runner.run(req);
          mark(
            `tool ${req.cmd} ${req.args.slice(0, 3).join(' ')} (exit ${r.exitCode}, ${Math.round(r.durationMs)} ms)`,
            t0,
            performance.now(),
          );
          return r;
        },
      };
      return {
        ...deps,
        runner,
        clusters,
        store: timedStore(deps.store, { calls: 0, ms: 0 }, (method, key, t0, t1) =>
          mark(`store ${method} ${String(key).slice(0, 60)}`, t0, t1),
        ),
      };
    },
  });
  const send = runtime.pipeline.send.bind(runtime.pipeline);
  runtime.pipeline.send = async (events) => {
    for (const e of events)
      mark(`event ${(e.data as { reason?: string }).reason ?? e.type} ${(e.data as { name?: string }).name}`);
    return await send(events);
  };
  // wait for the forwarder
  for (let i = 0; i < 600 && (runtime.forwarders[0]?.stats().watches ?? 0) < 5; i++)
    await new Promise((r) => setTimeout(r, 50));
  await new Promise((r) => setTimeout(r, 2000));
  say(
    `load ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  for (const size of chosen) {
    const set = repositorySet(ns, size);
    const keys = set.manifests.map((m) => `${ns}/${m.metadata.name}`);
    const watch = new AppWatch(cluster.kubeconfigPath, ns, undefined, {
      apiVersion: PACKAGING_API_VERSION,
      kind: 'PackageRepository',
    });
    await watch.start();
    marks = [];
    const t0 = performance.now();
    await createAll(rest, set.manifests);
    mark('create request done');
    const seen = await watch.waitAll(keys, 300_000);
    for (const [k, s] of seen) mark(`watch ${k} ${s.final} ${s.message ?? ''}`, s.at);
    await runtime.pipeline.idle();
    say(`\n=== ${size.packages} Packages (${set.bytes.join('+')} B), load ${os.loadavg()[0]!.toFixed(2)}`);
    for (const m of marks.sort((a, b) => a.at - b.at)) {
      const s = ((m.at - t0) / 1000).toFixed(3).padStart(7);
      const d = m.end === undefined ? '' : ` +${Math.round(m.end - m.at)} ms`;
      say(`${s}  ${m.what}${d}`);
    }
    const byKind: Record<string, { n: number; ms: number }> = {};
    for (const m of marks) {
      if (m.end === undefined) continue;
      const k = m.what.split(' ').slice(0, 2).join(' ');
      byKind[k] = { n: (byKind[k]?.n ?? 0) + 1, ms: (byKind[k]?.ms ?? 0) + (m.end - m.at) };
    }
    for (const [k, v] of Object.entries(byKind)) say(`  Σ ${k}: ${v.n}× ${Math.round(v.ms)} ms`);
    // delete and wait, so the next size starts clean
    for (const m of set.manifests) {
      await rest.send({ method: 'DELETE', path: `${collectionPath('PackageRepository', ns)}/${m.metadata.name}` });
    }
    await watch.waitGone(keys, 300_000);
    await watch.stop();
    await runtime.pipeline.idle();
  }
  await runtime.stop();
} finally {
  await cluster.stop();
  await rm(workRoot, { recursive: true, force: true });
}
