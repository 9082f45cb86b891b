/**
 * A benchmark fleet: cluster ids that are kubeconfig contexts on two real local control planes
 * (A and B), the simulated ones pointing at cluster A, as the dedup and upgrade scenarios use.
 *
 * @module
 */
import { writeFile } from 'node:fs/promises';
import { stringify } from 'yaml';
import type { Cluster } from '../../test/harness/cluster.js';
import { loadKubeConfig } from './kube.js';

/** One cluster id of a benchmark fleet: its context name, the control plane it is on, its namespace. */
export interface FleetId {
  id: string;
  cluster: 'a' | 'b';
  ns: string;
}

/**
 * The fleet's ids: `real-a`, `real-b` (namespace `ns` on both) and `sim-01`… (namespace
 * `<ns>-s01`… on cluster A: they share its control plane, so each needs its own namespace).
 */
export function fleetIds(ns: string, simulated: number): FleetId[] {
  return [
    { id: 'real-a', cluster: 'a', ns },
    { id: 'real-b', cluster: 'b', ns },
    ...Array.from({ length: simulated }, (_, i) => {
      const n = String(i + 1).padStart(2, '0');
      return { id: `sim-${n}`, cluster: 'a' as const, ns: `${ns}-s${n}` };
    }),
  ];
}

/** Writes a kubeconfig with one context per cluster id (A's and B's admin users; simulated ids use A's). */
export async function fleetKubeconfig(a: Cluster, b: Cluster, ids: readonly FleetId[], file: string): Promise<void> {
  const ka = loadKubeConfig(a.kubeconfigPath);
  const kb = loadKubeConfig(b.kubeconfigPath);
  const entry = (kc: ReturnType<typeof loadKubeConfig>, n: string) => {
    const c = kc.getCurrentCluster()!;
    const u = kc.getCurrentUser()!;
    return {
      cluster: { name: n, cluster: { server: c.server, 'certificate-authority-data': c.caData } },
      user: { name: n, user: { 'client-certificate-data': u.certData, 'client-key-data': u.keyData } },
    };
  };
  const ea = entry(ka, 'a');
  const eb = entry(kb, 'b');
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [ea.cluster, eb.cluster],
    users: [ea.user, eb.user],
    contexts: ids.map((i) => ({ name: i.id, context: { cluster: i.cluster, user: i.cluster } })),
    'current-context': ids[0]!.id,
  };
  await writeFile(file, stringify(doc), { mode: 0o600 });
}
