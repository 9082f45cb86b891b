/**
 * Local Kubernetes cluster for the demo and for poking around (kwokctl binary runtime, locally
 * built control plane, kwok fake nodes; see `test/harness/cluster.ts`).
 *
 * Usage:
 *   tsx scripts/cluster.ts up [--name NAME] [--nodes N]   start (stays up after this exits)
 *   tsx scripts/cluster.ts down [--name NAME]             stop and remove
 *   tsx scripts/cluster.ts status [--name NAME]           print kubeconfig path and server
 *
 * The default name is `kapp-lambda`; the work directory is `$TMPDIR/kapp-lambda-cluster-NAME`.
 * `up` prints `export KUBECONFIG=…` on stdout (progress goes to stderr).
 * (`reap WORKDIR` is internal: the harness's reaper process.)
 */
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { readClusterState, reapWhenOwnerGoes, startCluster, stopClusterAt } from '../test/harness/cluster.js';

const [cmd, ...rest] = process.argv.slice(2);

function flag(name: string, dflt: string): string {
  const i = rest.indexOf(`--${name}`);
  const v = i >= 0 ? rest[i + 1] : undefined;
  return v ?? dflt;
}

const name = flag('name', 'kapp-lambda');
const workdir = path.join(tmpdir(), `kapp-lambda-cluster-${name}`);
const log = (m: string) => process.stderr.write(`[cluster] ${m}\n`);

switch (cmd) {
  case 'up': {
    const existing = readClusterState(workdir);
    if (existing) {
      log(`already up: ${existing.server}`);
      process.stdout.write(`export KUBECONFIG=${existing.kubeconfigPath}\n`);
      break;
    }
    const c = await startCluster({
      name,
      workdir,
      nodes: Number.parseInt(flag('nodes', '1'), 10),
      detached: true,
      log,
    });
    log(`up: ${c.server}, nodes ${c.nodeNames.join(',')}, ${c.timings.totalMs}ms`);
    log(`kubectl: ${c.kubectlPath}`);
    process.stdout.write(`export KUBECONFIG=${c.kubeconfigPath}\n`);
    break;
  }
  case 'down': {
    const stopped = await stopClusterAt(workdir);
    log(stopped ? `down: ${name}` : `no cluster ${name} (${workdir})`);
    break;
  }
  case 'status': {
    const s = readClusterState(workdir);
    if (!s) {
      log(`no cluster ${name}`);
      process.exitCode = 1;
      break;
    }
    process.stdout.write(`name: ${s.name}\nserver: ${s.server}\nkubeconfig: ${s.kubeconfigPath}\n`);
    break;
  }
  case 'reap': {
    const dir = rest[0];
    if (!dir || !existsSync(dir)) break;
    await reapWhenOwnerGoes(path.resolve(dir), process.stdin);
    break;
  }
  default:
    process.stderr.write('usage: tsx scripts/cluster.ts up|down|status [--name NAME] [--nodes N]\n');
    process.exitCode = 2;
}
