/**
 * `tsx bench/api-sampler.ts <kubeconfig> <intervalMs>`: reads the API server's request counter
 * (Σ `apiserver_request_total` of `GET /metrics`) every `intervalMs` and writes one line
 * `<epoch ms> <total>` per reading to stdout; on SIGTERM one last reading, then exit. Not a
 * scenario: `lib/api-sampler.ts` runs it as a child process so that parsing the server's
 * metrics text each second is not in the CPU-seconds of the benchmark process (kapp-lambda's
 * side); the parent stops and reaps it after its own CPU reading.
 *
 * @module
 */
import { plainConnectionOf } from '../functions/lib/kube/kubeconfig-auth.js';
import { PlainRestTransport } from '../functions/lib/kube/plain.js';
import { requestTotal } from './lib/steady.js';

const [kubeconfig, intervalText] = process.argv.slice(2);
if (!kubeconfig) throw new Error('usage: api-sampler.ts <kubeconfig> <intervalMs>');
const intervalMs = Number(intervalText ?? 1000);
const plain = await plainConnectionOf(kubeconfig);
if ('unsupported' in plain) throw new Error(`kubeconfig ${kubeconfig}: ${plain.unsupported} not supported`);
// The limit is not for this reader: no cluster id, so no client-side limit.
const rest = new PlainRestTransport(plain.connection);

async function read(): Promise<void> {
  const res = await rest.send({ method: 'GET', path: '/metrics', accept: 'text/plain' });
  if (res.statusCode !== 200 || typeof res.body !== 'string') throw new Error(`GET /metrics: HTTP ${res.statusCode}`);
  process.stdout.write(`${Date.now()} ${requestTotal(res.body)}\n`);
}

function fail(err: Error): never {
  process.stderr.write(`api-sampler: ${err.message}\n`);
  process.exit(1);
}

let stopping = false;
// One reading at a time: a slow one delays the next rather than overlapping it.
let reading: Promise<void> = read().catch(fail);
const timer = setInterval(() => {
  if (!stopping) reading = reading.then(read).catch(fail);
}, intervalMs);
process.on('SIGTERM', () => {
  stopping = true;
  clearInterval(timer);
  reading
    .then(read)
    .then(() => process.exit(0))
    .catch(fail);
});
