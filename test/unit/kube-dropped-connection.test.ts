/**
 * Which transport failures count as a dropped connection, which requests are safe to send again
 * after one, and the bounded repeat itself (`functions/lib/kube/http.ts`). The real transports
 * against a real server: `test/integration/kube-dropped-connection.test.ts`.
 */
import { describe, expect, it } from 'vitest';
import {
  DROPPED_CONNECTION_ATTEMPTS,
  DroppedConnectionError,
  isDroppedConnection,
  isReplaySafe,
  type RestRequest,
  type RestResponse,
  RestTimeoutError,
  sendRepeatingDrops,
  WatchHttpError,
} from '../../functions/lib/kube/http.js';

const coded = (message: string, code: string, cause?: unknown) =>
  Object.assign(new Error(message, cause === undefined ? undefined : { cause }), { code });

describe('isDroppedConnection', () => {
  it('is true for a reset, a broken pipe, a premature close and undici socket errors, also as a cause', () => {
    expect(isDroppedConnection(coded('socket hang up', 'ECONNRESET'))).toBe(true);
    expect(isDroppedConnection(coded('aborted', 'ECONNRESET'))).toBe(true);
    expect(isDroppedConnection(coded('write EPIPE', 'EPIPE'))).toBe(true);
    // node-fetch 2's FetchError copies the code of the error it wraps
    expect(isDroppedConnection(coded('Invalid response body: Premature close', 'ERR_STREAM_PREMATURE_CLOSE'))).toBe(
      true,
    );
    // undici: TypeError('fetch failed') with the socket error as its cause
    expect(
      isDroppedConnection(new TypeError('fetch failed', { cause: coded('other side closed', 'UND_ERR_SOCKET') })),
    ).toBe(true);
    expect(isDroppedConnection(new Error('wrapped', { cause: coded('closed', 'UND_ERR_CLOSED') }))).toBe(true);
  });

  it('is false for a refused connection, TLS, a timeout, an answer with a status, and non-errors', () => {
    expect(isDroppedConnection(coded('connect ECONNREFUSED 127.0.0.1:1', 'ECONNREFUSED'))).toBe(false);
    expect(isDroppedConnection(coded('self-signed certificate', 'DEPTH_ZERO_SELF_SIGNED_CERT'))).toBe(false);
    expect(isDroppedConnection(new RestTimeoutError({ method: 'GET', path: '/x' }, 5))).toBe(false);
    expect(isDroppedConnection(new WatchHttpError(503, 'unavailable', { cause: coded('reset', 'ECONNRESET') }))).toBe(
      false,
    );
    expect(isDroppedConnection(new Error('Premature close'))).toBe(false);
    expect(isDroppedConnection('ECONNRESET')).toBe(false);
    expect(isDroppedConnection(undefined)).toBe(false);
  });

  it('looks five errors deep at most (a cause cycle ends)', () => {
    const five = new Error('a', {
      cause: new Error('b', { cause: new Error('c', { cause: new Error('d', { cause: coded('e', 'EPIPE') }) }) }),
    });
    expect(isDroppedConnection(five)).toBe(true);
    const six = new Error('z', { cause: five });
    expect(isDroppedConnection(six)).toBe(false);
    const cycle: Error & { cause?: unknown } = new Error('cycle');
    cycle.cause = cycle;
    expect(isDroppedConnection(cycle)).toBe(false);
  });
});

describe('isReplaySafe', () => {
  it('a GET always; a PUT or PATCH only with a resourceVersion in its body; never a POST or a DELETE', () => {
    expect(isReplaySafe({ method: 'GET' })).toBe(true);
    expect(isReplaySafe({ method: 'PUT', body: { metadata: { resourceVersion: '7' } } })).toBe(true);
    expect(isReplaySafe({ method: 'PATCH', body: { metadata: { resourceVersion: '7', finalizers: [] } } })).toBe(true);
    expect(isReplaySafe({ method: 'PUT', body: { metadata: { name: 'a' } } })).toBe(false);
    expect(isReplaySafe({ method: 'PATCH', body: { metadata: { resourceVersion: '' } } })).toBe(false);
    // "0" is no precondition to the API server (an unconditional update): not replayed.
    expect(isReplaySafe({ method: 'PUT', body: { metadata: { resourceVersion: '0' } } })).toBe(false);
    expect(isReplaySafe({ method: 'PATCH', body: [{ op: 'add', path: '/metadata/finalizers/-', value: 'f' }] })).toBe(
      false,
    );
    expect(isReplaySafe({ method: 'PATCH' })).toBe(false);
    expect(isReplaySafe({ method: 'POST', body: { metadata: { resourceVersion: '7' } } })).toBe(false);
    expect(isReplaySafe({ method: 'DELETE', body: { preconditions: { uid: 'u' } } })).toBe(false);
  });
});

describe('sendRepeatingDrops', () => {
  const GET: RestRequest = { method: 'GET', path: '/api/v1/namespaces/n/configmaps/c' };
  const OK: RestResponse = { statusCode: 200, body: {} };

  /** An exchange answering with `answers` in order (an Error rejects), counting its calls. */
  function scripted(answers: Array<RestResponse | Error>) {
    const calls = { n: 0 };
    const exchange = async (): Promise<RestResponse> => {
      calls.n++;
      const answer = answers.shift();
      if (answer === undefined) throw new Error('no more answers');
      if (answer instanceof Error) throw answer;
      return answer;
    };
    return { exchange, calls };
  }

  it('repeats a dropped replay-safe request after jittered, doubling waits, and returns its answer', async () => {
    const waits: number[] = [];
    const { exchange, calls } = scripted([coded('socket hang up', 'ECONNRESET'), coded('aborted', 'ECONNRESET'), OK]);
    const answer = await sendRepeatingDrops(GET, exchange, {
      sleep: async (ms) => void waits.push(ms),
      random: () => 0,
    });
    expect(answer).toBe(OK);
    expect(calls.n).toBe(3);
    expect(waits).toEqual([50, 100]);
    const highs: number[] = [];
    await sendRepeatingDrops(GET, scripted([coded('x', 'EPIPE'), coded('x', 'EPIPE'), OK]).exchange, {
      sleep: async (ms) => void highs.push(ms),
      random: () => 0.999_999,
    });
    expect(highs).toEqual([100, 200]);
  });

  it('gives up after the bound with an error naming the attempts, the request and the last drop', async () => {
    const last = coded('Premature close', 'ERR_STREAM_PREMATURE_CLOSE');
    const { exchange, calls } = scripted([coded('a', 'ECONNRESET'), coded('b', 'ECONNRESET'), last, OK]);
    const failing = sendRepeatingDrops(GET, exchange, { sleep: async () => {} });
    await expect(failing).rejects.toThrow(new DroppedConnectionError(GET, DROPPED_CONNECTION_ATTEMPTS, last));
    await expect(failing).rejects.toMatchObject({
      message: 'the API server dropped the connection 3 times (GET /api/v1/namespaces/n/configmaps/c): Premature close',
      cause: last,
    });
    expect(calls.n).toBe(3);
  });

  it('does not repeat a request that is not replay-safe, an error that is not a drop, or any answer (a 503 too)', async () => {
    const reset = coded('socket hang up', 'ECONNRESET');
    const post = scripted([reset, OK]);
    await expect(sendRepeatingDrops({ method: 'POST', path: '/x', body: {} }, post.exchange)).rejects.toBe(reset);
    expect(post.calls.n).toBe(1);
    const refused = coded('connect ECONNREFUSED', 'ECONNREFUSED');
    const get = scripted([refused, OK]);
    await expect(sendRepeatingDrops(GET, get.exchange)).rejects.toBe(refused);
    expect(get.calls.n).toBe(1);
    const unavailable: RestResponse = { statusCode: 503, body: 'busy' };
    const busy = scripted([unavailable, OK]);
    expect(await sendRepeatingDrops(GET, busy.exchange)).toBe(unavailable);
    expect(busy.calls.n).toBe(1);
  });

  it('stops repeating once its signal aborts (the request bound passed), with the drop as it came', async () => {
    const expired = new AbortController();
    const reset = coded('socket hang up', 'ECONNRESET');
    const { exchange, calls } = scripted([reset, OK]);
    const failing = sendRepeatingDrops(GET, exchange, {
      signal: expired.signal,
      sleep: async () => expired.abort(),
    });
    await expect(failing).rejects.toBe(reset);
    expect(calls.n).toBe(1);
  });
});
