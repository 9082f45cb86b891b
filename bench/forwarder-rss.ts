/**
 * Child process of the forwarder-memory scenario: a forwarder alone (no pipeline; its
 * transport only counts events) watching every App, the Secrets, ConfigMaps and
 * ServiceAccounts they reference, and the metadata of what they deployed, of one cluster. The benchmark bundles this file (`layers/bundle.ts`) and runs it with
 * plain `node`, so the figure is a forwarder process's RSS, not tsx's.
 *
 * Usage: `node forwarder-rss.mjs <kubeconfig> <context> <expectedApps> <expectedRefs> [<deployedKinds>]`.
 * Prints one JSON line on stdout once the initial lists are processed (every App and ref known,
 * every deployed kind's drift watch through its first list, nothing pending) and again after `SETTLE_MS` of idling: `{ phase, rss, heapUsed, heapTotal,
 * external, arrayBuffers, peakRss, syncMs, stats }` (bytes, milliseconds), then exits 0. Exits 1
 * with a message on stderr after `TIMEOUT_MS`.
 *
 * @module
 */
import { Forwarder } from '../events/forwarder/forwarder.js';
import { watchedKinds } from '../events/forwarder/kinds.js';
import { forwarderKube } from '../events/forwarder/kube.js';
import { watchViewOf } from '../functions/lib/kube/views.js';

const SETTLE_MS = 5_000;
const TIMEOUT_MS = 10 * 60_000;

const [kubeconfig, context, appsArg, refsArg, kindsArg] = process.argv.slice(2);
if (!kubeconfig || !context || !appsArg || !refsArg) {
  process.stderr.write('usage: forwarder-rss <kubeconfig> <context> <expectedApps> <expectedRefs> [<deployedKinds>]\n');
  process.exit(2);
}
const expectedApps = Number(appsArg);
const expectedRefs = Number(refsArg);
const expectedKinds = Number(kindsArg ?? 0);
const t0 = performance.now();
// The cluster client as the forwarder program makes it (events/forwarder/main.ts).
const client = await forwarderKube({ kubeconfig, context });
let events = 0;
const forwarder = new Forwarder({
  clusterId: context,
  watcher: watchViewOf(client),
  transport: {
    async send(batch) {
      events += batch.length;
    },
  },
  kinds: watchedKinds(['App']),
});
let peakRss = 0;
const sample = () => {
  peakRss = Math.max(peakRss, process.memoryUsage.rss());
};
const sampler = setInterval(sample, 50);
forwarder.start();

const report = (phase: string, syncMs: number) => {
  sample();
  const m = process.memoryUsage();
  process.stdout.write(
    `${JSON.stringify({
      phase,
      rss: m.rss,
      heapUsed: m.heapUsed,
      heapTotal: m.heapTotal,
      external: m.external,
      arrayBuffers: m.arrayBuffers,
      peakRss,
      syncMs,
      events,
      stats: forwarder.stats(),
    })}\n`,
  );
};

for (;;) {
  const s = forwarder.stats();
  const listed = s.objects >= expectedApps && s.refs >= expectedRefs && s.lists >= 3;
  if (listed && s.driftListed >= expectedKinds && s.pending === 0) break;
  if (performance.now() - t0 > TIMEOUT_MS) {
    process.stderr.write(`forwarder-rss: initial sync not done after ${TIMEOUT_MS} ms: ${JSON.stringify(s)}\n`);
    process.exit(1);
  }
  await new Promise((r) => setTimeout(r, 20));
}
const syncMs = performance.now() - t0;
report('synced', syncMs);
await new Promise((r) => setTimeout(r, SETTLE_MS));
report('settled', syncMs);
clearInterval(sampler);
await forwarder.stop({ drain: false, timeoutMs: 2000 });
process.exit(0);
