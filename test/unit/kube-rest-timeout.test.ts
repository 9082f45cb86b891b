/**
 * The bound of one API request (`REST_REQUEST_TIMEOUT_MS`): a request that never gets an answer
 * (a stalled connection) rejects, so the stage waiting on it fails and is retried instead of
 * holding its object forever. Faked at client-node's HTTP layer (the `Configuration` that
 * `makeApiClient` hands the transport).
 */
import { type Configuration, RequestContext } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { ClientNodeRestTransport, RestTimeoutError } from '../../functions/lib/kube/transport.js';

/** A client-node configuration whose HTTP layer answers with `answer` (or never). */
function configuration(answer: () => Promise<unknown>): Configuration {
  return {
    baseServer: { makeRequestContext: (path: string, method: never) => new RequestContext(`https://k${path}`, method) },
    authMethods: {},
    httpApi: { send: () => ({ toPromise: answer }) },
  } as unknown as Configuration;
}

const ok = async () => ({ httpStatusCode: 200, body: { text: async () => '{"kind":"App"}' } });

describe('ClientNodeRestTransport request bound', () => {
  it('rejects a request that gets no answer, naming method and path', async () => {
    const rest = new ClientNodeRestTransport(
      configuration(() => new Promise(() => {})),
      undefined,
      5,
    );
    const sent = rest.send({ method: 'GET', path: '/apis/kappctrl.k14s.io/v1alpha1/namespaces/ns/apps/a' });
    await expect(sent).rejects.toBeInstanceOf(RestTimeoutError);
    await expect(sent).rejects.toThrow(
      'no answer from the API server within 5 ms (GET /apis/kappctrl.k14s.io/v1alpha1/namespaces/ns/apps/a)',
    );
  });

  it('rejects when the answer starts but its body never ends', async () => {
    const stalledBody = async () => ({ httpStatusCode: 200, body: { text: () => new Promise(() => {}) } });
    const rest = new ClientNodeRestTransport(configuration(stalledBody), undefined, 5);
    await expect(rest.send({ method: 'PUT', path: '/x', body: {} })).rejects.toBeInstanceOf(RestTimeoutError);
  });

  it('passes an answer within the bound through', async () => {
    const rest = new ClientNodeRestTransport(configuration(ok), undefined, 60_000);
    expect(await rest.send({ method: 'GET', path: '/x' })).toEqual({ statusCode: 200, body: { kind: 'App' } });
  });
});
