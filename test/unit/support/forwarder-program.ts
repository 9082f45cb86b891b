/** Settings of a forwarder program started in a unit test (`events/forwarder/program.ts`). */
import { type ForwarderProgramSettings, parseForwarderProgramEnv } from '../../../events/forwarder/config.js';

/** Cluster `c1`, one queue nobody listens on (a fake transport sends), `/metrics` on a free loopback port. */
export function testProgramSettings(): ForwarderProgramSettings {
  return parseForwarderProgramEnv({
    FORWARDER_CLUSTER_ID: 'c1',
    AWS_REGION: 'eu-west-1',
    KAPP_LAMBDA_QUEUE_URL_FETCH: 'http://127.0.0.1:1/fetch.fifo',
    FORWARDER_HTTP_HOST: '127.0.0.1',
    FORWARDER_HTTP_PORT: '0',
  });
}
