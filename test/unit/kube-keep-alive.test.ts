/**
 * One keep-alive agent per API server and identity (`KeepAliveAgents`, `ClientNodeRestTransport`):
 * client-node makes a new agent (keep-alive off) per request; the transport sends every request
 * with one kept agent for the same TLS material instead. Faked at client-node's HTTP layer.
 */
import http from 'node:http';
import https from 'node:https';
import { type Configuration, RequestContext } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import {
  ClientNodeRestTransport,
  KEEP_ALIVE_IDLE_MS,
  KEEP_ALIVE_MAX_SOCKETS,
  KeepAliveAgents,
} from '../../functions/lib/kube/transport.js';

const CA = '-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n';

/**
 * A client-node configuration whose authentication sets a fresh agent per request (as
 * `KubeConfig.applySecurityAuthentication` does) made by `agent`, and whose HTTP layer records
 * the agent each request went out with and answers with `answers` in order (an Error: a
 * transport failure).
 */
function configuration(agent: () => http.Agent | undefined, answers: Array<number | Error> = []) {
  const sentWith: Array<http.Agent | undefined> = [];
  const config = {
    baseServer: { makeRequestContext: (path: string, method: never) => new RequestContext(`https://k${path}`, method) },
    authMethods: {
      default: {
        applySecurityAuthentication: async (context: RequestContext) => {
          const made = agent();
          if (made) context.setAgent(made);
        },
      },
    },
    httpApi: {
      send: (context: RequestContext) => ({
        toPromise: async () => {
          sentWith.push(context.getAgent());
          const answer = answers.shift() ?? 200;
          if (answer instanceof Error) throw answer;
          return { httpStatusCode: answer, body: { text: async () => '{}' } };
        },
      }),
    },
  } as unknown as Configuration;
  return { config, sentWith };
}

const reset = () => Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });

describe('ClientNodeRestTransport keep-alive', () => {
  it('sends every request of one identity over one kept agent with keep-alive, bounded sockets and idle time', async () => {
    const { config, sentWith } = configuration(() => new https.Agent({ ca: CA, rejectUnauthorized: true }));
    const rest = new ClientNodeRestTransport(config);
    for (let i = 0; i < 3; i++) await rest.send({ method: 'GET', path: '/api/v1' });
    await rest.send({ method: 'PUT', path: '/x', body: {} });
    const [first, ...rest3] = sentWith;
    expect(first).toBeInstanceOf(https.Agent);
    for (const agent of rest3) expect(agent).toBe(first);
    const options = (first as https.Agent & { options: https.AgentOptions }).options;
    expect(options).toMatchObject({
      keepAlive: true,
      maxSockets: KEEP_ALIVE_MAX_SOCKETS,
      timeout: KEEP_ALIVE_IDLE_MS,
      ca: CA,
      rejectUnauthorized: true,
    });
    rest.close();
  });

  it('two transports (clusters or identities) never share an agent', async () => {
    const a = configuration(() => new https.Agent({ ca: CA }));
    const b = configuration(() => new https.Agent({ ca: CA }));
    await new ClientNodeRestTransport(a.config).send({ method: 'GET', path: '/' });
    await new ClientNodeRestTransport(b.config).send({ method: 'GET', path: '/' });
    expect(a.sentWith[0]).not.toBe(b.sentWith[0]);
  });

  it('retries a GET once on a reset kept connection; other methods are not repeated', async () => {
    const { config, sentWith } = configuration(() => new https.Agent({ ca: CA }), [reset(), 200, reset()]);
    const rest = new ClientNodeRestTransport(config);
    expect((await rest.send({ method: 'GET', path: '/a' })).statusCode).toBe(200);
    expect(sentWith).toHaveLength(2);
    await expect(rest.send({ method: 'POST', path: '/b', body: {} })).rejects.toThrow('socket hang up');
    expect(sentWith).toHaveLength(3);
  });
});

describe('KeepAliveAgents', () => {
  it('replaces (and destroys) the kept agent when the TLS material changes: a rotated client certificate', () => {
    const agents = new KeepAliveAgents();
    const first = agents.agentFor(new https.Agent({ ca: CA, cert: 'c1', key: 'k1' })) as https.Agent;
    expect(agents.agentFor(new https.Agent({ ca: CA, cert: 'c1', key: 'k1' }))).toBe(first);
    const destroyed: boolean[] = [];
    const destroy = first.destroy.bind(first);
    first.destroy = () => {
      destroyed.push(true);
      destroy();
    };
    const second = agents.agentFor(new https.Agent({ ca: CA, cert: 'c2', key: 'k1' }));
    expect(second).not.toBe(first);
    expect(destroyed).toEqual([true]);
    agents.close();
  });

  it('keeps a plain http agent (an http server with skip-TLS-verify) as http; leaves proxy agents and none as made', () => {
    const agents = new KeepAliveAgents();
    const kept = agents.agentFor(new http.Agent({}));
    expect(kept).toBeInstanceOf(http.Agent);
    expect(kept).not.toBeInstanceOf(https.Agent);
    expect((kept as http.Agent & { options: http.AgentOptions }).options.keepAlive).toBe(true);
    class ProxyAgent extends https.Agent {}
    const proxy = new ProxyAgent({});
    expect(agents.agentFor(proxy)).toBe(proxy);
    expect(agents.agentFor(undefined)).toBeUndefined();
    agents.close();
  });
});
