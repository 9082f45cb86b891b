/**
 * What every benchmark scenario gets: the local control plane, paths, progress output, the
 * results table rows, and start/stop helpers for kapp-lambda's embedded runtime in one
 * namespace.
 *
 * @module
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { RestTransport } from '../../functions/lib/kube/transport.js';
import type { Cluster } from '../../test/harness/cluster.js';
import type { Row } from './stats.js';

/** Shared state of one `npm run bench` run. */
export interface BenchContext {
  /** Cluster A: the shared local control plane (undefined when no selected scenario needs it). */
  cluster?: Cluster;
  /** REST transport to cluster A (admin). */
  rest?: RestTransport;
  /** kapp-lambda's tool cache root. */
  cacheRoot: string;
  /** Scratch root of this run (stores, tool scratch dirs); removed at the end. */
  workRoot: string;
  /** Progress line on stderr. */
  say: (m: string) => void;
  /** Rows of the printed table, in scenario order. */
  rows: Row[];
  /** Figures that could not be measured, with the exact reason. */
  unmeasured: { scenario: string; figure: string; why: string }[];
  /** Scenario results, by scenario name, as written to the JSON file. */
  results: Record<string, unknown>;
}

/** A fresh directory under the run's scratch root. */
export async function scratchDir(ctx: BenchContext, name: string): Promise<string> {
  const dir = path.join(ctx.workRoot, name);
  await mkdir(dir, { recursive: true });
  return dir;
}

/** Cluster A, or an error naming the scenario that needs it. */
export function clusterOf(ctx: BenchContext): { cluster: Cluster; rest: RestTransport } {
  if (!ctx.cluster || !ctx.rest) throw new Error('bench: this scenario needs the local control plane');
  return { cluster: ctx.cluster, rest: ctx.rest };
}

/** Cluster id of cluster A in the embedded runtime (its kubeconfig context name). */
export function contextOf(cluster: Cluster): string {
  return `kwok-${cluster.name}`;
}
