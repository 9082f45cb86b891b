/**
 * `npm run fleet -- status` (issue 28 item 5): the fleet view (`functions/lib/fleet/view.ts`) as
 * a table of clusters × PackageInstalls, with each rollout's line above it. Pure: `scripts/fleet.ts`
 * reads the store and prints what this returns.
 *
 * @module
 */
import { type FleetInstall, type FleetView, MAX_INSTALLS_PER_CLUSTER } from '../functions/lib/fleet/view.js';
import { formatTable } from './cli.js';

/** What the page calls an install's health: `failed`, `unhealthy`, `reconciling`, `healthy` or `unknown`. */
export function installHealth(i: Pick<FleetInstall, 'reconcile' | 'healthy'>): string {
  if (i.reconcile === 'failed') return 'failed';
  if (i.healthy === false) return 'unhealthy';
  if (i.reconcile === 'reconciling') return 'reconciling';
  return i.reconcile === 'succeeded' ? 'healthy' : 'unknown';
}

/** `at` as an age from `now`: `42s`, `7m`, `3h`, `2d`. */
function age(at: string, now: number): string {
  const s = Math.max(0, Math.round((now - Date.parse(at)) / 1000));
  if (!Number.isFinite(s)) return '-';
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return s < 172_800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86_400)}d`;
}

/**
 * The status text: one line per rollout (`ROLLOUT <policy>/<refName> <from> -> <target>
 * <status> waves <released>/<all> [cause]`), then a table of every PackageInstall (CLUSTER,
 * PACKAGEINSTALL, PACKAGE, VERSION, HEALTH, WAVE, LAST RECONCILE: its age, duration and cost from
 * the newest receipt), then the clusters without one. `now` dates the ages (default the view's).
 */
export function formatFleetStatus(view: FleetView, now = Date.parse(view.generatedAt)): string {
  const rollouts = view.rollouts.map((r) => {
    const released = r.waves.filter((w) => w.releasedAt).length;
    return `ROLLOUT ${r.policy}/${r.refName} ${r.from ?? '?'} -> ${r.target} ${r.status} waves ${released}/${r.waves.length}${r.cause ? ` (${r.cause})` : ''}\n`;
  });
  const rows = view.installs.map((i) => {
    const last = i.lastReconcile;
    return [
      i.clusterId,
      `${i.namespace}/${i.name}`,
      i.refName ?? '-',
      i.version ?? '-',
      installHealth(i),
      i.wave ?? '-',
      last
        ? `${last.outcome} ${age(last.endedAt, now)} ago, ${(last.durationMs / 1000).toFixed(1)}s, $${last.costUsd.toFixed(6)}`
        : '-',
    ];
  });
  const idle = view.clusters.filter((c) => !view.installs.some((i) => i.clusterId === c));
  return [
    ...rollouts,
    rollouts.length ? '\n' : '',
    formatTable(['CLUSTER', 'PACKAGEINSTALL', 'PACKAGE', 'VERSION', 'HEALTH', 'WAVE', 'LAST RECONCILE'], rows),
    idle.length ? `\nclusters without a PackageInstall: ${idle.join(', ')}\n` : '',
    view.truncated?.length
      ? `\nclusters with more than ${MAX_INSTALLS_PER_CLUSTER} PackageInstalls, the first ${MAX_INSTALLS_PER_CLUSTER} shown: ${view.truncated.join(', ')}\n`
      : '',
    // A store read from outside a runtime knows a cluster by its PackageInstalls only.
    view.clusters.length === 0
      ? '\nno PackageInstall has reported yet: a cluster shows here once a PackageInstall of it has reconciled\n'
      : '',
  ].join('');
}
